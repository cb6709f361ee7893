"""A cost model of the one-row FFMA step (Llama-3.1-8B-shaped, 4-bit g64, an H100), before and
after the deferred scale/bias reads (MV_ASYNC, MLX_GRAPH_MV_ASYNC=1), and of the one-row step
and speculation's verify rows (5 rows at K 4; 9 rows at K 8, two tiles of 5) with the cp.async
ring (MV_RING, MLX_GRAPH_MV_RING=1: measured slower on an H100 and removed, the 8B's one-row step
340.4 -> 250.6 steps/s, results/gpu/2026-12-06-s37-h100 call 4; the model's `ring` section is
kept as the prediction it made). No GPU needed:

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

- MV_RING 1 (section `ring` of the output): an item waits for its own cp.async group only,
  issued D = 3 items earlier on its warp, so a warp's item costs max(c_w, (L + c_w) / D), c_w =
  its share of the scheduler's issue (warps a scheduler x I / (ETA x clock)). One row: 4 warps a
  scheduler, I = 370 (the ring's one-map 4-bit loop; gate/up 352; main 366/345). Verify rows
  (NB 5): one block an SM (their inputs fill the shared memory), 2 warps a scheduler, I = 860
  (the ring's NB 5 4-bit item path, 857; main's 862: sass_ctrl_nb5_*.txt of s37-mvring), 1,056
  warps a wave. Main's NB 5 waits a round trip an item (L5 + c); L5 is fit from the measured
  8,240 us verify two ways: (a) all of main's time past the model's is latency (L5 = 1.59 us),
  (b) L5 = the one-row L and the rest a fixed cost a step (the 5 inputs' prologues: the ring
  does not touch it). A verify of 9 rows runs two tiles of 5 (max_sequences is 7 at 8B), so
  twice the 5-row mat-vecs. The speculative cost is (K drafts + verify) / (K drafts + one plain
  step), the drafts as measured (call 3: 828 us a step at K 4, 844 at K 8).

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


# The ring (MV_RING 1): depth, the one-row and 5-row item paths (SASS instructions).
RING_D, ITEM_INSTR_RING, ITEM_INSTR_5 = 3, 370, 860
WARPS5 = SMS * 1 * 8  # NB 5: one block an SM
DRAFTS = {4: 3311.0, 8: 6608.0}  # us a round (call 3)
VERIFY9 = 15602.0  # us, the 9-row verify (two tiles of 5; call 3, K 8)
ATTENTION5 = 175.0  # us a step, attention of 5 rows (4 rows on the tensor-core side: 173)


def items5(n, k):
    return math.ceil(math.ceil(n / 2) / WARPS5) * (k // 1024)


def ring(lf):
    """The ring's predictions: the one-row step, the 5- and 9-row verify, speculation."""
    c1 = ITEM_INSTR_RING / (CLOCK_GHZ * 1e3)
    c5 = ITEM_INSTR_5 / (CLOCK_GHZ * 1e3)
    L1 = (lf["GateUp"][0] + lf["Down"][0]) / 2
    fsum = sum(lf[p][1] for p in ("Qkv", "Output")) * LAYERS  # the one-row F's, a step
    n5 = sum(items5(n, k) * launches for _, n, k, launches, _, _ in PARTS)
    gap = STEP - sum(p[5] for p in PARTS) - ATTENTION
    rest5 = ATTENTION5 + gap + fsum
    # main's 5-row verify: a round trip an item, L5 + c5 (2 warps a scheduler: the other's issue
    # hides under the wait).
    t5 = (VERIFY5 - rest5) / n5
    la = t5 - c5  # (a): L5 takes it all
    fixed_b = (t5 - (L1 + c5)) * n5  # (b): L5 = L1, the rest fixed
    print(f"\nring (MV_RING 1, depth {RING_D}): one-row item c = {c1:.3f} us ({ITEM_INSTR_RING} "
          f"instructions), 5-row item c = {c5:.3f} us ({ITEM_INSTR_5}); {n5} items a warp a step "
          f"at 5 rows ({WARPS5} warps); main's 5-row verify fits {t5:.2f} us an item: "
          f"(a) L5 = {la:.2f} us, (b) L5 = L1 = {L1:.2f} us + {fixed_b:,.0f} us a step fixed")
    print("| ETA | one-row step (us; tok/s; % copy bw) | 5-row verify (a) / (b) | 9-row verify (a) / (b) "
          "| K 4: measured/ideal (a) / (b) | K 8 (a) / (b) |")
    print("|---|---|---|---|---|---|")
    for eta in (1.0, 0.85, 0.7):
        # one row: each part max(latency, issue, bytes), never past main's measured time
        tot = 0.0
        for name, n, k, launches, gb, us in PARTS:
            it = items(n, k)
            L, F = lf[name]
            cw = 4 * c1 / eta
            per = max(cw, (L + cw) / RING_D)
            bw = gb / launches / COPY_BW * 1e6
            tot += min((F + max(it * per, bw)) * launches, us)
        step = tot + ATTENTION + gap
        cw5 = 2 * c5 / eta
        v = {}
        for fit, L5, fixed in (("a", la, 0.0), ("b", L1, fixed_b)):
            per5 = max(cw5, (L5 + cw5) / RING_D)
            v[fit] = (n5 * per5 + rest5 + fixed, 2 * (n5 * per5 + fsum + fixed) + 2 * ATTENTION5 + gap)
        spec = {K: [(DRAFTS[K] + v[f][0 if K == 4 else 1]) / (DRAFTS[K] + step) for f in "ab"]
                for K in (4, 8)}
        print(f"| {eta} | {step:,.0f}; {1e6 / step:.0f}; {STEP_BYTES / step * 1e6 / COPY_BW:.0%} | "
              f"{v['a'][0]:,.0f} / {v['b'][0]:,.0f} | {v['a'][1]:,.0f} / {v['b'][1]:,.0f} | "
              f"{spec[4][0]:.2f} / {spec[4][1]:.2f} | {spec[8][0]:.2f} / {spec[8][1]:.2f} |")
    print(f"main measured: step {STEP:,.0f} us, 5-row verify {VERIFY5:,.0f}, 9-row {VERIFY9:,.0f}; "
          f"K 4 {(DRAFTS[4] + VERIFY5) / (DRAFTS[4] + STEP):.2f}, K 8 "
          f"{(DRAFTS[8] + VERIFY9) / (DRAFTS[8] + STEP):.2f} (round time over the ideal round; "
          "#33's bound 1.15)")
    for K in (4, 8):
        print(f"#33's 1.15 at K {K} with the plain step at {STEP:,.0f} us: a verify of <= "
              f"{1.15 * (DRAFTS[K] + STEP) - DRAFTS[K]:,.0f} us")


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
    ring(lf)


if __name__ == "__main__":
    main()
