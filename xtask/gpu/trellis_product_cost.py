"""The trellis product's cost a weight, and what it predicts for a trellis-3 decode step against
affine-4's (#34's GPU target), for the device A/B of MLX_GRAPH_TRELLIS_STATES and _PAIR:

    python3 xtask/gpu/trellis_product_cost.py [KERNELS_TEST_LOG]

1. The loop's bound a warp-weight (32 weights, one a lane), from the unrolled loop's instruction
   mix (NVRTC sm_90, `sass.py --trellis` then the loop counter, results/gpu/2026-12-06-s37-trelprod
   `loops-*.txt`): the issue bound is the instructions a weight over the SM's 4 schedulers; the
   shared-memory bound its wavefronts (128 bytes a clock an SM): a table load of 32 distinct
   words is one, the input's `LDS.64` of 32 distinct pairs two (one a weight).
2. The measured marginal cost of `trellis_matvec` (KERNELS_TEST_LOG, default the s36 H100 call
   1): a line through each code's two 8B shapes of 4,096 inputs ((4096, 4096) and (14336,
   4096)), t = a + b W; b in clocks a warp-weight at the H100 SXM's clock (1.755 GHz sustained,
   1.98 boost), against the bound: the loop's efficiency.
3. The 8B step: the s36 measured t3g7 step (11.88 ms) and the s37 t3hy step under main's new
   defaults (132.8 tok/s, 7.53 ms) less what STATES saves in the products
   at the same efficiency (every gauss7s weight: b scaled by the bounds' ratio), and the
   floors: every product at its bound with nothing around it, against affine-4's whole step
   (3.29 ms; 304 steps/s, s36 call 2).

A model, not a measurement: the device call in the README measures it.
"""
import re
import sys

SMS = 132
CLOCKS = (1.755e9, 1.98e9)
# (instructions a weight, shared-memory wavefronts a warp-weight) of the product loop at 3 bits,
# blocks of 64, L 12, 32 lanes a row (the 8B's choice), from the SASS loop counts.
LOOPS = {
    # (the decoder's fused kernels, trellis_qkv / _linear / _gate_up, `loops-*.txt`)
    "1mad (computed)": (6.66, 1.0),  # LDS 33 a 64 weights: the input's LDS.64, 2 wavefronts each
    "1mad8h (one table)": (5.73, 2.0),
    "S-box (gauss7s, main)": (7.85, 3.0),  # LDS 161: 128 table (S-box, code) + 33 input
    "S-box, STATES": (9.70, 2.0),  # LDS 97: 64 states' table + 33 input; PRMT, FADD a weight
    "1mad, blocks of 32 (L 8)": (7.25, 1.0),  # the s36 kernel test's 1mad rows at 8B shapes
}
# The 8B layer's weights by launch: q/k/v (q 4096 + k 1024 + v 1024 rows), o, gate/up, down.
LAYER_8B = {"qkv": 6144 * 4096, "o": 4096 * 4096, "gate_up": 2 * 14336 * 4096, "down": 4096 * 14336}
V_8B = 1024 * 4096  # value projections (1mad in the default hybrid)
LAYERS_8B = 32
STEP_T3G7_8B = 11.88e-3  # s36 call 1: 84.2 tok/s
STEP_T3HY_WIDE_8B = 1.0 / 132.8  # s37 call 2: t3hy with THREADS=1024, ALIAS, PIPE (the defaults since)
STEP_AFFINE4_8B = 3.29e-3  # s36 call 2: 304 steps/s at one row
LAYER_135M = {"qkv": 960 * 576, "o": 576 * 576, "gate_up": 2 * 1536 * 576, "down": 576 * 1536}
LAYERS_135M = 30
STEP_T3G7_135M = 1.0 / 619.3
STEP_AFFINE4_135M = 1.0 / 1198.7


def bound(path):
    ins, wf = LOOPS[path]
    return max(ins / 4.0, wf)


def matvec_times(log):
    """{(code, L, block, rows, cols): trellis_matvec us} from a kernel test log."""
    out = {}
    pat = re.compile(r"trellis (\S+) k 3 L (\d+) block (\d+) \((\d+), (\d+)\):.*?trellis_matvec ([\d.]+) us")
    for line in open(log):
        m = pat.search(line)
        if m:
            out[(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)))] = float(m.group(6))
    return out


def fit(t, code, l, block):
    a_shape, b_shape = (code, l, block, 4096, 4096), (code, l, block, 14336, 4096)
    if a_shape not in t or b_shape not in t:
        return None
    w1, w2 = 4096 * 4096, 14336 * 4096
    b = (t[b_shape] - t[a_shape]) * 1e-6 / (w2 - w1)  # seconds a weight
    a = t[a_shape] * 1e-6 - b * w1
    return a, b


def main():
    log = sys.argv[1] if len(sys.argv) > 1 else "results/gpu/2026-12-06-s36-h100/call1/kernels_test.log"
    print("## 1. The loop's bound (clocks a warp-weight an SM)\n")
    print("| path | instructions a weight | issue bound | wavefronts | bound | Gweights/s at the bound (1.755 / 1.98 GHz) |")
    print("|---|---|---|---|---|---|")
    for p, (ins, wf) in LOOPS.items():
        rates = " / ".join(f"{SMS * f * 32 / bound(p) / 1e9:,.0f}" for f in CLOCKS)
        print(f"| {p} | {ins:.2f} | {ins / 4:.3f} | {wf:.1f} | **{bound(p):.3f}** | {rates} |")
    t = matvec_times(log)
    print(f"\n## 2. Measured `trellis_matvec` (L2-resident weights; {log})\n")
    print("| code | a (us, fixed) | b (ps a weight) | Gweights/s marginal | clocks a warp-weight (1.755 / 1.98 GHz) | bound | efficiency |")
    print("|---|---|---|---|---|---|---|")
    fits = {}
    for code, l, block, path in (("gauss7s", 12, 64, "S-box (gauss7s, main)"), ("1mad8h", 12, 64, "1mad8h (one table)"),
                                 ("1mad", 8, 32, "1mad, blocks of 32 (L 8)")):
        f = fit(t, code, l, block)
        if f is None:
            continue
        a, b = f
        fits[code] = (a, b, path)
        clk = [b * SMS * c * 32 for c in CLOCKS]
        eff = bound(path) / clk[0]
        print(f"| {code} L {l} b{block} | {a * 1e6:.2f} | {b * 1e12:.3f} | {1 / b / 1e9:,.0f} | {clk[0]:.2f} / {clk[1]:.2f} | {bound(path):.3f} | {eff:.0%} (at 1.755) |")
    # 1mad L 12 b64 has no (14336, 4096) row: its marginal from (4096, 4096) and (4096, 14336)
    # would mix in the down shape's occupancy; the 1mad line above is L 8 b32's.
    print("\n## 3. The 8B step (a model)\n")
    a7, b7, _ = fits["gauss7s"]
    ratio = bound("S-box, STATES") / bound("S-box (gauss7s, main)")
    w_g7 = sum(LAYER_8B.values()) - V_8B
    saved = LAYERS_8B * w_g7 * b7 * (1 - ratio)
    print(f"- gauss7s weights a step: {LAYERS_8B * w_g7 / 1e9:.2f} G (v_proj's {LAYERS_8B * V_8B / 1e9:.2f} G in 1mad); "
          f"products at the measured marginal {LAYERS_8B * w_g7 * b7 * 1e3:.2f} ms")
    print(f"- STATES: the bound {bound('S-box, STATES'):.3f} against {bound('S-box (gauss7s, main)'):.3f} "
          f"(x{ratio:.3f}); at the same efficiency the products save {saved * 1e3:.2f} ms a step")
    s1 = STEP_T3G7_8B - saved
    print(f"- t3g7 / t3hy step: measured {STEP_T3G7_8B * 1e3:.2f} ms ({1 / STEP_T3G7_8B:.1f} tok/s) -> "
          f"STATES {s1 * 1e3:.2f} ms ({1 / s1:.1f} tok/s)")
    w = STEP_T3HY_WIDE_8B
    print(f"- t3hy under main's defaults since s37 (THREADS=1024, ALIAS, PIPE): measured {w * 1e3:.2f} ms "
          f"({1 / w:.1f} tok/s) -> STATES {(w - saved) * 1e3:.2f} ms ({1 / (w - saved):.1f} tok/s, "
          f"{(w / (w - saved) - 1) * 100:+.1f}%); around the products: {(w - LAYERS_8B * w_g7 * b7) * 1e3:.2f} ms")
    print("\nFloors: every product of the 8B step at its loop's bound (100% efficiency), nothing around it:\n")
    print("| path | products a step (1.755 / 1.98 GHz) | against affine-4's whole step (3.29 ms) |")
    print("|---|---|---|")
    w_all = LAYERS_8B * sum(LAYER_8B.values())
    for p in list(LOOPS)[:4]:
        ms = [w_all / 32 * bound(p) / (SMS * c) * 1e3 for c in CLOCKS]
        print(f"| {p} | {ms[0]:.2f} / {ms[1]:.2f} ms | {ms[0] / (STEP_AFFINE4_8B * 1e3):.2f}x / {ms[1] / (STEP_AFFINE4_8B * 1e3):.2f}x |")
    print(f"\nAffine-4's kernels move {w_all / STEP_AFFINE4_8B / 1e9:,.0f} Gweights/s over the whole step "
          f"(s36 call 2: GateUp {2 * 14336 * 4096 * 32 / 1227e-6 / 1e9:,.0f} Gweights/s).")
    print("\n## 4. The 135M step (a model)\n")
    w135 = LAYERS_135M * sum(LAYER_135M.values())
    saved135 = w135 * b7 * (1 - ratio)
    print(f"- weights a step {w135 / 1e6:.0f} M: STATES saves {saved135 * 1e6:.0f} us of {STEP_T3G7_135M * 1e6:.0f} us "
          f"at the 8B's marginal rate; the launches' fixed costs dominate (trellis_matvec at (576, 1536): "
          f"gauss7s {t.get(('gauss7s', 12, 64, 576, 1536), float('nan')):.2f} us, 1mad L 12 "
          f"{t.get(('1mad', 12, 64, 576, 1536), float('nan')):.2f} us: the S-box tables' fill). STATES's "
          f"fill stores 32,768 words a block against 12,288: at 135M it can cost more than it saves.")


if __name__ == "__main__":
    main()
