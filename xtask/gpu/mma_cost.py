"""A cost model of the wide tensor-core tiles' step (Llama-3.1-8B-shaped, 4-bit g64, an H100),
before and after the cp.async ring (MMA_ASYNC, MLX_GRAPH_MMA_ASYNC=1). No GPU needed:

    python3 xtask/gpu/mma_cost.py

An item is 16 weight rows x 64 inputs (one warp, 512 bytes of codes + 64 of scales/biases).
A block (8 warps) takes rows blocks of 16 rows; the grid is one wave (132 SMs; 1 block an SM at
16 rows, 2 at 8), so a product costs F + ceil(rows blocks / blocks) rows-block times.

- Register loads (main): sm_90's SASS waits for the item's scale/bias loads right after issuing
  them and for all weight loads in flight (one scoreboard) at each item, so an item costs a warp
  one loaded memory round trip T (fit here from the measured 16-row parts, with F).
- Ring: an item waits for its own cp.async group only; a rows block costs
  max(its bytes at the SM's share of the copy bandwidth, its instructions at 4 schedulers x
  ETA) + E (two barriers and the epilogue, the block's warps idle).

Measured inputs: results/gpu/2026-12-06-s36-h100/call2/throughput.log (main, H100).
Instruction counts: this session's NVRTC sm_90 SASS (results/gpu/2026-12-06-s36-mmatile).
"""
import math

SMS, CLOCK_GHZ, COPY_BW = 132, 1.755, 2555.0  # SMs, GHz, GB/s (s35's copy bandwidth)
LAYERS, VOCAB = 32, 128256
# (name, N, K, launches a step)
PRODUCTS = [("Qkv", 6144, 4096, LAYERS), ("Output", 4096, 4096, LAYERS),
            ("GateUp", 28672, 4096, LAYERS), ("Down", 4096, 14336, LAYERS),
            ("Head", VOCAB, 4096, 1)]
# main, 16 rows: each part's time a step (us)
MEASURED_16 = {"Qkv": 1298.3, "Output": 847.6, "GateUp": 3931.8, "Down": 2538.4, "Head": 521.4}
OTHER_16 = 287.7 + 10.2 + 13.9  # attention, embed, argmax
STEP_16 = 1e6 / 92.8
# instructions an item's common path (SASS, NVRTC 13.5 sm_90): main 16 rows 206, ring 16
# rows 237, ring 8 rows 209
INSTR = {16: 237, 8: 209}
ITEM_BYTES = 576
E_US = 0.4  # a rows block's barriers and epilogue (estimate)


def blocks_per_rb(n, blocks_per_sm):
    return math.ceil(math.ceil(n / 16) / (SMS * blocks_per_sm))


def fit_main():
    """T (a warp's item) and F (a launch's fixed cost) from Output and GateUp at 16 rows."""
    def items(name):
        _, n, k, launches = next(p for p in PRODUCTS if p[0] == name)
        return blocks_per_rb(n, 1) * (k // 64 // 8)
    o, g = MEASURED_16["Output"] / LAYERS, MEASURED_16["GateUp"] / LAYERS
    t = (g - o) / (items("GateUp") - items("Output"))
    return t, o - t * items("Output")


def main():
    t, f = fit_main()
    print(f"main's tiles, 16 rows (fit): a warp's item T = {t:.3f} us (one loaded round trip), "
          f"a launch's fixed cost F = {f:.1f} us")
    print(f"  16 rows x 64 inputs a warp per T: 8 warps x {ITEM_BYTES} B / T = "
          f"{8 * ITEM_BYTES / t / 1e3 * SMS:.0f} GB/s over {SMS} SMs (GateUp measured: "
          f"{2113929216 / MEASURED_16['GateUp'] / 1e3:.0f} GB/s)")
    for name, n, k, launches in PRODUCTS:
        pred = launches * (f + blocks_per_rb(n, 1) * (k // 64 // 8) * t)
        print(f"  {name:7} predicted {pred:7.0f} us, measured {MEASURED_16[name]:7.0f}")
    gap = STEP_16 - sum(MEASURED_16.values()) - OTHER_16
    print(f"  step {STEP_16:.0f} us = parts {sum(MEASURED_16.values()):.0f} + attention/embed/argmax "
          f"{OTHER_16:.0f} + between kernels {gap:.0f}")
    print()
    per_sm_bw = COPY_BW / SMS  # bytes a ns an SM
    for rows, bps, f_launch, other, between in ((16, 1, f, OTHER_16, gap),
                                                (8, 2, 8.0, 173.2 + 20.6, 750.0)):
        for eta in (1.0, 0.75, 0.6):
            total = 0.0
            parts = []
            for name, n, k, launches in PRODUCTS:
                items = k // 64
                mem = 16 * k / 2 * 1.125 / per_sm_bw / 1e3 * bps  # us, bps blocks share the SM
                issue = items * INSTR[rows] / (4 * eta * CLOCK_GHZ * 1e3) * bps
                rb = max(mem, issue) + E_US
                chunks = math.ceil(k / (5120 if rows == 16 else 4096)) if k > 4096 else 1
                cost = launches * (f_launch * (1 + 0.3 * (chunks - 1)) + blocks_per_rb(n, bps) * rb)
                parts.append(f"{name} {cost:.0f}")
                total += cost
            step = total + other + between
            print(f"ring, {rows} rows, issue efficiency {eta}: step {step / 1e3:.2f} ms "
                  f"({', '.join(parts)}; attention etc. {other:.0f}, between kernels {between:.0f} us)")


if __name__ == "__main__":
    main()
