"""What mma_cost.py's model of the wide tensor-core tiles misses (issue #30, serve at 16 rows):
its fit to the H100's s37 data, and the shared-memory passes an item takes. No GPU needed:

    python3 xtask/gpu/mma_gap.py [results/gpu/2026-12-06-s37-h100/call1/throughput.log]

1. The fit. `batched_throughput`'s part times (each part's kernels replayed alone) at 4 and 16
   rows, with and without the cp.async ring (MMA_ASYNC). A launch of a product of N rows and K
   inputs costs F + items x T: a block takes ceil(N / 16 / blocks) rows blocks (one wave: 132
   blocks at 16 rows, 264 at 4), each warp K / 64 / 8 items a rows block, T a warp's item. F and
   T by least squares over Qkv, Output, GateUp and Head (Down stages its K in chunks: shown, not
   fitted). Then the step less its parts: the time between kernels.
2. The passes. Each shared-memory instruction of an item (16 rows x 64 inputs, one warp) and of
   a rows block's epilogue, as graph_decode.cu's mv_run_mma addresses it, through a bank model:
   a 4-, 8- or 16-byte access is taken by 1, 2 or 4 phases of 32, 16 or 8 lanes; a phase costs
   as many passes as the most distinct 4-byte words any one of the 32 banks holds. Without and
   with MMA_BANKS (MLX_GRAPH_MMA_BANKS=1).
"""
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "results/gpu/2026-12-06-s37-h100/call1/throughput.log"
SMS, CLOCK_GHZ = 132, 1.755
LAYERS, VOCAB = 32, 128256
# (name, N, K, launches a step, the K the tile stages at once at 16 rows with the ring)
PRODUCTS = [("Qkv", 6144, 4096, LAYERS), ("Output", 4096, 4096, LAYERS),
            ("GateUp", 28672, 4096, LAYERS), ("Down", 4096, 14336, LAYERS),
            ("Head", VOCAB, 4096, 1)]
FIT = ("Qkv", "Output", "GateUp", "Head")


def parse(path):
    """{(side, rows): (steps/s, {part: us a step})} from a throughput.log of `thru` sides."""
    out, side = {}, None
    for line in Path(path).read_text().splitlines():
        if line.startswith("== "):
            side = line[3:].strip()
        m = re.search(r": (\d+) rows \(.*\), ([\d.]+) steps/s", line)
        if m:
            out[(side, int(m.group(1)))] = (float(m.group(2)), {})
        m = re.search(r": (\d+) rows, part (\w+): \d+ kernels, ([\d.]+) us a step", line)
        if m and (side, int(m.group(1))) in out:
            out[(side, int(m.group(1)))][1][m.group(2)] = float(m.group(3))
    return out


def items_per_warp(n, k, blocks):
    return math.ceil(math.ceil(n / 16) / blocks) * (k // 64 // 8)


def fit(parts, blocks):
    """Least squares of a launch's time = F + items x T over FIT."""
    xs, ys = [], []
    for name, n, k, launches in PRODUCTS:
        if name in FIT:
            xs.append(items_per_warp(n, k, blocks))
            ys.append(parts[name] / launches)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    t = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - t * mx, t


# --- the bank model ---------------------------------------------------------------------------


def passes(addrs, width):
    """Passes of one shared-memory instruction: addrs[lane] (None: inactive), width bytes."""
    per = {4: 32, 8: 16, 16: 8}[width]
    total = 0
    for p0 in range(0, 32, per):
        banks = {}
        for a in addrs[p0:p0 + per]:
            if a is None:
                continue
            for w in range(a // 4, (a + width) // 4):
                banks.setdefault(w % 32, set()).add(w)
        total += max((len(s) for s in banks.values()), default=0)
    return total


def xs_slot(t):
    return t ^ ((t >> 3) & 3)


def row_bytes(k):
    return (2 * ((k + 63) & ~63) + k // 32 * 4 + 15) & ~15


def item_passes(nb, kc, banks):
    """An item's shared-memory passes (one warp; averaged over the 4 swizzles of jl): the B
    fragments, the chunk sums, the ring's codes and scale/bias words, the ring's fills."""
    nt_n = (nb + 7) // 8
    xstride = row_bytes(kc)
    sum_x = (lambda t: 2 * t) if banks and kc % 256 == 0 else (lambda t: 0)
    out = {"B fragments": 0, "chunk sums": 0}
    for jl in range(4):
        for nt in range(nt_n):
            for x in (0, 1):
                addrs = []
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    sq = 8 * nt + g
                    slot = xs_slot(8 * jl + 2 * t + x) ^ ((sq & 1) if banks else 0)
                    addrs.append(sq * xstride + 16 * slot if sq < nb else None)
                out["B fragments"] += passes(addrs, 16) / 4
            for e1 in (0, 1):
                addrs = []
                for lane in range(32):
                    t = lane & 3
                    n = 8 * nt + 2 * t + e1
                    addrs.append(n * xstride + 2 * kc + 4 * ((2 * jl) ^ sum_x(t)) if n < nb else None)
                out["chunk sums"] += passes(addrs, 8) / 4
    codes = sum(passes([32 * (l >> 2) + 8 * (l & 3) + 256 * h for l in range(32)], 8) for h in (0, 1))
    words = sum(passes([512 + 4 * (r + (l >> 2)) for l in range(32)], 4) for r in (0, 8, 16, 24))
    out["ring reads"] = codes + words
    out["ring fills"] = passes([16 * l for l in range(32)], 16) + passes([512 + 4 * l for l in range(32)], 4)
    return out


def epilogue_passes(nb, banks):
    """A rows block's partial sums: each warp's writes (8 MMA_NT floats a lane) and the 16 NB
    threads' reads (8 warps' each), all warps together."""
    nt_n = (nb + 7) // 8
    row = 4 * nt_n + (1 if banks else 0)
    if banks:
        writes = 8 * 4 * nt_n * passes([4 * row * l for l in range(32)], 4)
    else:
        writes = 8 * nt_n * passes([4 * row * l for l in range(32)], 16)
    reads = 0
    for w0 in range(0, 16 * nb, 32):
        for w in range(8):
            addrs = []
            for tid in range(w0, w0 + 32):
                r, n = tid & 15, tid >> 4
                if n >= nb:
                    addrs.append(None)
                    continue
                nn = n & 7
                lane, e = 4 * (r & 7) + (nn >> 1), 4 * (n >> 3) + 2 * (r >> 3) + (nn & 1)
                addrs.append(4 * (w * 32 * row + lane * row + e))
            reads += passes(addrs, 4)
    return writes, reads


def main():
    data = parse(sys.argv[1] if len(sys.argv) > 1 else LOG)
    print("1. The fit: a launch = F + items a warp x T (least squares over "
          f"{', '.join(FIT)}); Down shown with its chunks")
    for (side, rows), (sps, parts) in data.items():
        if rows not in (4, 16) or not parts:
            continue
        blocks = SMS * (1 if rows == 16 else 2)
        f, t = fit(parts, blocks)
        warps = 8 * blocks // SMS
        res = []
        for name, n, k, launches in PRODUCTS:
            pred = launches * (f + items_per_warp(n, k, blocks) * t)
            res.append(f"{name} {parts[name]:.0f}/{pred:.0f}")
        step = 1e6 / sps
        between = step - sum(parts.values())
        per_sm = warps / t  # items a microsecond an SM
        print(f"  {side} | {rows} rows: T {t:.3f} us ({t * CLOCK_GHZ * 1e3:.0f} cycles at "
              f"{CLOCK_GHZ} GHz), F {f:.1f} us; {warps} warps an SM: {per_sm:.1f} items/us an SM = "
              f"{per_sm * 576 * SMS / 1e3:.0f} GB/s while streaming")
        print(f"      measured/fit us a step: {', '.join(res)}")
        print(f"      step {step:.0f} us = parts {sum(parts.values()):.0f} + between kernels {between:.0f}")
    print()
    print("2. Shared-memory passes (bank model), an item of one warp and a rows block's epilogue")
    for nb in (16, 8, 4):
        for kc in (4096, 5120):
            cells = []
            for banks in (False, True):
                it = item_passes(nb, kc, banks)
                w, r = epilogue_passes(nb, banks)
                cells.append(f"{'banks' if banks else 'main '}: item {sum(it.values()):5.1f} ("
                             + ", ".join(f"{k} {v:.1f}" for k, v in it.items())
                             + f"); epilogue writes {w}, reads {r}")
            print(f"  NB {nb:2}, K staged {kc} (a sequence {row_bytes(kc)} B, mod 128 = "
                  f"{row_bytes(kc) % 128}):")
            for c in cells:
                print(f"     {c}")


if __name__ == "__main__":
    main()
