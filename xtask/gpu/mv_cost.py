"""A cost model of the one-row FFMA step (Llama-3.1-8B-shaped, 4-bit g64, an H100), before and
after the deferred scale/bias reads (MV_ASYNC, MLX_GRAPH_MV_ASYNC=1). No GPU needed:

    python3 xtask/gpu/mv_cost.py

An item is one warp's 2 rows x 32 lanes x 16 bytes of codes (2 rows x 1,024 inputs) with their
scales and biases (1,152 bytes from memory). The grid is one wave: 132 SMs x 2 blocks x 8 warps
= 2,112 warps; a warp takes row groups of 2 rows, K / 1,024 items each, so a launch costs its
busiest warp's items: n = ceil(groups / 2,112) x K / 1,024.

- Main (MV_ASYNC 0): the SASS (results/gpu/2026-12-06-s36-mvload, sass_ctrl_nb1_main.txt) packs
  each refill's scale and bias (PRMT) right after issuing their loads, so an item costs its warp
  one loaded memory round trip L plus its own issue time c: T = F + n (L + c). L is fit here
  from the measured parts (F 0 for GateUp, Down and Head; Qkv's and Output's F is what is left
  with GateUp's and Down's mean L: their prologue, the norm or the attention's partials).
- MV_ASYNC 1: no wait at the refill; every weight load of the loop still shares one scoreboard,
  and the loop's head (or the row group's epilogue) waits for all of them, including the trip's
  last refill, just issued. So a trip of 4 items costs one round trip: T = F + max(n / 4 (L + 4c),
  issue, bytes), issue = n x 4 warps a scheduler x I / (ETA x clock), bytes = the launch's bytes
  at the copy bandwidth; never more than main's measured time (the same instructions, fewer
  waits). ETA (a scheduler's issue efficiency) is bounded below by main itself: its Head issues
  the same instructions in 146 us, ETA >= 0.68 (printed); 1.0, 0.85 and 0.7 are shown.
- The 5-row verify (NB 5, one item a trip, the slots rotated): its loop head waits for the load
  issued at the end of the previous trip with either build (sass_ctrl_nb5_*.txt), so one round
  trip an item either way: predicted unchanged.

Measured inputs: results/gpu/2026-12-06-s36-h100 call 2 (`call2/throughput.log`, main, H100,
MLX_GRAPH_BATCH_BREAKDOWN=20: each part's time a step, 32 layers) and call 3 (the 5-row verify).
Instruction counts: NVRTC 13.5 sm_90 SASS of this tree (an item's path from the loop head to the
epilogue's branch: 366 in the one-map 4-bit loop, 345 in gate/up's; 350 used).
"""
import math

SMS, CLOCK_GHZ, COPY_BW = 132, 1.755, 2555.0  # SMs, GHz, GB/s (s35's copy bandwidth)
WARPS = SMS * 2 * 8  # one wave: 2 blocks an SM (<= 128 registers), 8 warps a block
LAYERS, VOCAB = 32, 128256
ITEM_INSTR = 350  # an item's instructions (2 rows x 1,024 4-bit inputs; SASS)
# (name, N rows, K, launches a step, bytes a step (GB), measured us a step (main, 1 row))
PARTS = [("Qkv", 6144, 4096, LAYERS, 0.453, 399.0),
         ("Output", 4096, 4096, LAYERS, 0.302, 230.0),
         ("GateUp", 28672, 4096, LAYERS, 2.11, 1227.0),
         ("Down", 4096, 14336, LAYERS, 1.06, 589.0),
         ("Head", VOCAB, 4096, 1, VOCAB * 4096 / 2 / 1e9 + VOCAB * 64 * 4 / 1e9, 146.0)]
ATTENTION, STEP = 170.0, 3290.0  # us a step (measured: attention part; the whole step)
VERIFY5 = 8240.0  # us, the 5-row verify (call 3, K 4)
STEP_BYTES = 3.29e-3 * 1384.0  # GB a step (s35: 1,384 GB/s at a 3.29 ms step)


def items(n, k):
    return math.ceil(math.ceil(n / 2) / WARPS) * (k // 1024)


def fit():
    """Each part's L (us, a loaded round trip) and F (us a launch)."""
    c = ITEM_INSTR / (CLOCK_GHZ * 1e3)
    out = {}
    for name, n, k, launches, _, us in PARTS:
        out[name] = (us / launches / items(n, k) - c, 0.0)
    common = (out["GateUp"][0] + out["Down"][0]) / 2
    for name, n, k, launches, _, us in PARTS:
        if name in ("Qkv", "Output"):
            out[name] = (common, us / launches - items(n, k) * (common + c))
    return c, out


def main():
    c, lf = fit()
    print(f"an item's own issue time c = {ITEM_INSTR} instructions / {CLOCK_GHZ} GHz = {c:.3f} us; "
          f"{WARPS} warps (one wave)")
    print("| part | items a warp | main measured (us a step) | L fit (us) | F (us a launch) "
          "| bytes at copy bw | MV_ASYNC, ETA 1.0 | ETA 0.85 | ETA 0.7 |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals = {1.0: 0.0, 0.85: 0.0, 0.7: 0.0}
    for name, n, k, launches, gb, us in PARTS:
        it = items(n, k)
        L, F = lf[name]
        bw = gb / launches / COPY_BW * 1e6
        lat = it / 4 * (L + 4 * c)
        row = []
        for eta in (1.0, 0.85, 0.7):
            issue = it * 4 * ITEM_INSTR / (eta * CLOCK_GHZ * 1e3)
            t = min((F + max(lat, issue, bw)) * launches, us)
            totals[eta] += t
            row.append(f"{t:,.0f} ({gb / t * 1e3:.2f} TB/s)")
        print(f"| {name} | {it} | {us:,.0f} ({gb / us * 1e3:.2f} TB/s) | {L:.3f} | {F:.2f} | "
              f"{bw * launches:,.0f} | " + " | ".join(row) + " |")
    etas = {name: items(n, k) * 4 * ITEM_INSTR * launches / (CLOCK_GHZ * 1e3 * us)
            for name, n, k, launches, _, us in PARTS}
    print("\nmain's own issue efficiency (ETA at least): "
          + ", ".join(f"{name} {e:.2f}" for name, e in etas.items()))
    parts = sum(p[5] for p in PARTS)
    gap = STEP - parts - ATTENTION
    print(f"\nmeasured: parts {parts + ATTENTION:,.0f} us (attention {ATTENTION:.0f}), step "
          f"{STEP:,.0f} us: {gap:,.0f} us between the parts' sum and the step (kept as is below)")
    for eta, t in totals.items():
        step = t + ATTENTION + gap
        print(f"MV_ASYNC, ETA {eta}: mat-vecs {t:,.0f} us, step {step:,.0f} us = "
              f"{1e6 / step:.0f} tok/s, {STEP_BYTES / step * 1e6 / COPY_BW / 1e3 * 1e3:.0%} "
              f"of the copy bandwidth ({STEP_BYTES:.2f} GB a step; main: "
              f"{1e6 / STEP:.0f} tok/s, {STEP_BYTES / STEP * 1e6 / COPY_BW:.0%})")
    need = STEP_BYTES / (0.7 * COPY_BW) * 1e6
    print(f"#30's 70% of the copy bandwidth: a step of <= {need:,.0f} us")
    print(f"5-row verify: {VERIFY5:,.0f} us measured; predicted unchanged (one round trip an item "
          "either way, see the docstring)")


if __name__ == "__main__":
    main()
