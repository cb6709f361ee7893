"""A cost model of the graph decoder's one-row step between its parts (issue #30), and what
MLX_GRAPH_EARLY_PROLOGUE=1 (MV_EARLY_NORM: the norm weights loaded before the PDL wait;
EMBED_BATCH 16: embed's loads at once) is predicted to take off it. No GPU needed; prints a
markdown table.

    python3 xtask/gpu/gap_cost.py

Inputs (measured, cited in results/gpu/2026-12-06-s37-stepgap/README.md):
- 8B (llama31-8b-q4, H100, results/gpu/2026-12-06-s37-h100 call1): step 2,935 us, parts replayed
  alone 2,419 us; 163 kernels a step; copy bandwidth 2,555 GB/s; 70% of it is a 2,525 us step.
- 135M (llama-135m-bf16, 30 layers): 0.77-0.83 ms a step on the H100 (1,200-1,300 tok/s);
  154 kernels a step (results/gpu/2026-12-05-s32-small, section 1).
- mvload's split of the 8B gap (results/gpu/2026-12-06-s36-mvload, section 5): releases
  163 x ~0.7 us, prologues past the wait ~1-2 us each, the attention's combine tail up to
  ~6 us a layer, embed and the two argmax kernels ~15-25 us.

The switch's saving a normed product (q/k/v, gate/up, the head: 2 a layer + 1) is the norm
weights' load moved off the path past the wait: that path waits for max(input, norm weights);
the input was written by the kernel just before (an L2 hit), the norm weights were last read a
step ago, 4.5 GB (8B) or 0.27 GB (135M bf16) of weights earlier, past a 50 MB L2 (a DRAM read).
The saving is the DRAM read's latency beyond the L2 hit's, under the load of the kernel's own
early weight loads: LAT_LO .. LAT_HI us a kernel (H100: L2 hit ~0.3-0.5 us, DRAM miss under
load ~0.6-1.1 us, so 0.2-0.6 us).

embed (one block of 256 threads a row): main's loop stores each value before the next one's
loads issue (the store may alias the scales for the compiler; SASS: LDG, LDG.U16 x2, STG a
value), so a thread's ceil(H / 256) values wait one cold-row round trip each (DRAM_LO ..
DRAM_HI us): 16 at 8B (H 4,096; the part replayed alone is 10.3 us), 3 at 135M (H 576). With
EMBED_BATCH 16 every load issues first: one round trip. Nothing else in the step changes.
"""

LAT_LO, LAT_HI = 0.2, 0.6  # us a normed product: DRAM latency past the L2 hit's
DRAM_LO, DRAM_HI = 0.45, 0.65  # us: one cold round trip of embed's (16 x 0.65 ~ its 10.3 us)

MODELS = [
    # name, layers, step_us (lo, hi), parts_us (None: not measured), kernels a step, hidden
    ("llama31-8b-q4 (H100)", 32, (2935.0, 2935.0), 2419.0, 163, 4096),
    ("llama-135m-bf16 (H100)", 30, (770.0, 830.0), None, 154, 576),
]
TARGET = {"llama31-8b-q4 (H100)": 2525.0, "llama-135m-bf16 (H100)": 1e6 / 1800}


def main():
    print("| model | normed products a step | norm weights early (us) | embed values a thread | "
          "embed at once (us) | step now (us) | gap now (us) | saved (us) | "
          "step with the switch (us) | target step (us) | still to go (us) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, layers, (s_lo, s_hi), parts, kernels, hidden in MODELS:
        normed = 2 * layers + 1
        per = -(-hidden // 256)
        e_lo, e_hi = (per - 1) * DRAM_LO, (per - 1) * DRAM_HI
        n_lo, n_hi = normed * LAT_LO, normed * LAT_HI
        save_lo, save_hi = n_lo + e_lo, n_hi + e_hi
        gap = f"{s_lo - parts:,.0f}" if parts else "-"
        step = (f"{s_lo - save_hi:,.0f}-{s_hi - save_lo:,.0f}")
        now = f"{s_lo:,.0f}" if s_lo == s_hi else f"{s_lo:,.0f}-{s_hi:,.0f}"
        t = TARGET[name]
        left = f"{s_lo - save_hi - t:,.0f}-{s_hi - save_lo - t:,.0f}"
        print(f"| {name} | {normed} | {n_lo:,.0f}-{n_hi:,.0f} | {per} | {e_lo:,.1f}-{e_hi:,.1f} | "
              f"{now} | {gap} | {save_lo:,.0f}-{save_hi:,.0f} | {step} | {t:,.0f} | {left} |")
    print()
    # The rest of the 8B gap, by mvload's items, after the switch.
    rel = 163 * 0.7
    pro_lo, pro_hi = 130 * 1.0, 130 * 2.0
    print("8B gap items (mvload's estimates) and the switch's share:")
    print(f"- releases: 163 x ~0.7 us = {rel:,.0f} us (unchanged)")
    print(f"- prologues past the wait: {pro_lo:,.0f}-{pro_hi:,.0f} us; the switch takes "
          f"{65 * LAT_LO:,.0f}-{65 * LAT_HI:,.0f} us of it (65 normed products)")
    print("- attention's combine tail: up to ~195 us (unchanged)")
    print(f"- embed, argmax_partial, argmax_pick: ~15-25 us; embed's part (10.3 us alone) loses "
          f"{15 * DRAM_LO:,.0f}-{15 * DRAM_HI:,.0f} us")


if __name__ == "__main__":
    main()
