"""Where a trellis decode step's time goes beyond the product: a cost model of the graph decoder's
fused trellis launches (`trellis_qkv`, `trellis_linear`, `trellis_gate_up`) from the code and
the H100's measured kernel timings, for the device A/B of the switches (graph_trellis.rs
`TrellisSwitches::source`):

    python3 xtask/gpu/trellis_cost.py [KERNELS_TEST_LOG]

1. Occupancy and grid per launch of an 8B and a 135M layer (and, for the choice by width, a
   Llama-3.2-1B and 3B layer), for each twin (t3g7: gauss7s, L 12,
   blocks of 64; t3l12: 1mad, L 12, blocks of 64) and each configuration: `base` (main: 256
   threads, a static 16 KiB Hadamard buffer), `alias` (MLX_GRAPH_TRELLIS_ALIAS=1), `wide`
   (MLX_GRAPH_TRELLIS_THREADS=1024 with ALIAS; trellis_qkv on the flat grid). Per launch:
   shared memory a block, blocks and warps an SM, the grid, the most rows a warp sums (the
   quantization of rows over warps), the input's bytes every block's prologue reads from L2
   (x twice where normed, the norm's weights, sv: every block stages the whole input), the
   table stores an SM makes, and the output transform's elements a thread in the completing
   block (the serial tail).
2. The step's time split by the kernel test's timings (KERNELS_TEST_LOG, default the s36 H100
   call): each linear's `trellis_matvec` (the product alone, input already transformed) and
   `trellis_linear` (the whole fused linear), summed over a layer, against the measured step.

The limits are the H100's (132 SMs, 228 KiB of shared memory an SM, 1 KiB reserved a block,
65,536 registers, 2,048 threads); the kernels' registers (64) are NVRTC sm_90's (sass.py).
"""
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMS, SMEM_SM, RESERVED, REGS, THREADS_SM = 132, 233472, 1024, 65536, 2048
KREGS = 64
LUT_FLOATS = 8192
STATIC_BASE = 4 * 4096 + 4 * 8 + 4 * 128 + 16  # Hadamard buffer, reductions, list, flag
STATIC_ALIAS = 4 * 8 + 4 * 128 + 16

MODELS = {  # hidden, intermediate, heads * head_dim, kv_heads * head_dim, layers
    "8B": (4096, 14336, 4096, 1024, 32),
    "135M": (576, 1536, 576, 192, 30),
    # Llama-3.2-1B's and 3B's shapes: the widths between (not measured; the choice by width,
    # graph_trellis.rs WIDE_HIDDEN).
    "1B": (2048, 8192, 2048, 512, 16),
    "3B": (3072, 8192, 3072, 1024, 28),
}
TWINS = {  # code's table floats, block (L 12 both)
    "t3g7": (LUT_FLOATS + 128 * 32, 64),
    "t3l12": (0, 64),
}
CONFIGS = {  # threads, alias, flat qkv
    "base": (256, False, False),
    "alias": (256, True, False),
    "wide": (1024, True, True),
}


def hb(n):
    return min(n & -n, 4096)


def lanes_per_row(rows, cols, block):
    nb = max(cols // block, 1)
    want = 4.0 * SMS
    best = (32, -1.0)
    for g in (32, 16, 8, 4, 2, 1):
        eff = nb / (math.ceil(nb / g) * g)
        fill = min(rows * g / 32.0 / want, 1.0)
        if eff * fill > best[1] + 1e-12:
            best = (g, eff * fill)
    return best[0]


def per_sm(threads, smem):
    return min(THREADS_SM // threads, REGS // (KREGS * threads), SMEM_SM // (smem + RESERVED), 32)


def launch(cfg, twin, K, parts, norm):
    """parts: [(rows, lanes)] of the launch's slices (qkv: q, k, v; gate_up: gate, up)."""
    threads, alias, flat = CONFIGS[cfg]
    lut, block = TWINS[twin]
    pad = 2 if block == 32 else 1
    dyn = 4 * lut + 4 * (K + pad * math.ceil(K / 32))
    widest_hb = max(hb(r) for r, _ in parts)
    if alias:
        dyn = max(dyn, 4 * widest_hb)
    smem = dyn + (STATIC_ALIAS if alias else STATIC_BASE)
    bsm = per_sm(threads, smem)
    resident = bsm * SMS
    warps = threads // 32
    rpb = [warps * (32 // lanes) for _, lanes in parts]
    need = [math.ceil(r / p) for (r, _), p in zip(parts, rpb)]
    if len(parts) == 3 and flat:
        total = max(3, min(sum(need), resident))
        bk = max(1, total * parts[1][0] // (parts[0][0] + 2 * parts[1][0]))
        grid = [total - 2 * bk, bk, bk]
    else:
        grid = [min(n, max(1, resident // len(parts))) for n in need]
    rows_warp = max(math.ceil(r / (g * warps * (32 // lanes))) * 1 for (r, lanes), g in zip(parts, grid))
    blocks = sum(grid)
    # Every block's prologue: x (bf16) twice where normed (the norm's sum, then the stage), the
    # norm's weights (bf16), sv (float32).
    pro = blocks * K * ((2 + 2 + 2) if norm else 2) + blocks * 4 * K
    tail = widest_hb / threads
    return dict(smem=smem, bsm=bsm, warps_sm=bsm * warps, grid=grid, rows_warp=rows_warp,
                pro_mb=pro / 1e6, lut_sm=min(bsm, math.ceil(blocks / SMS)) * lut, tail=tail)


def layer(model):
    H, I, Q, KV, _ = MODELS[model]
    lq, lk = lanes_per_row(Q, H, 64), lanes_per_row(KV, H, 64)
    return [
        ("qkv", H, [(Q, lq), (KV, lk), (KV, lk)], True),
        ("o", Q, [(H, lanes_per_row(H, Q, 64))], False),
        ("gate_up", H, [(I, lanes_per_row(I, H, 64))] * 2, True),
        ("down", I, [(H, lanes_per_row(H, I, 64))], False),
    ]


def kernel_times(log):
    """(code, L, block, rows, cols) -> (matvec us, linear us) from the kernel test's log."""
    out = {}
    pat = re.compile(r"trellis (\S+) k 3 L (\d+) block (\d+) \((\d+), (\d+)\).*?trellis_matvec ([\d.]+) us.*?"
                     r"trellis_linear ([\d.]+) us")
    for line in Path(log).read_text().splitlines():
        m = pat.search(line)
        if m:
            c, L, b, r, k, mv, lin = m.groups()
            out[(c, int(L), int(b), int(r), int(k))] = (float(mv), float(lin))
    return out


def main():
    log = sys.argv[1] if len(sys.argv) > 1 else "/work/main/results/gpu/2026-12-06-s36-h100/call1/kernels_test.log"
    print("## 1. Occupancy, grid and redundant work per launch (H100 limits, 64 registers)\n")
    print("| model | twin | launch | config | smem/block KiB | blocks/SM | warps/SM | grid (per slice) "
          "| most rows a warp | prologue L2 reads MB | table stores an SM (floats) | tail elements a thread |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        for twin in TWINS:
            for name, K, parts, norm in layer(model):
                for cfg in CONFIGS:
                    r = launch(cfg, twin, K, parts, norm)
                    print(f"| {model} | {twin} | {name} | {cfg} | {r['smem'] / 1024:.1f} | {r['bsm']} | {r['warps_sm']} "
                          f"| {'/'.join(map(str, r['grid']))} | {r['rows_warp']} | {r['pro_mb']:.1f} | {r['lut_sm']} "
                          f"| {r['tail']:.0f} |")
    if not Path(log).exists():
        return
    t = kernel_times(log)
    print("\n## 2. An 8B layer from the kernel test's timings (H100, L2-resident weights, us)\n")
    print("| twin | linear | shape (rows, cols) | trellis_matvec | trellis_linear | gap |")
    print("|---|---|---|---|---|---|")
    rows = {  # twin -> [(linear, scale, key)]: qkv as 1.5 (4096, 4096), gate_up as 2 (14336, 4096)
        "t3g7": [("qkv", 1.5, ("gauss7s", 12, 64, 4096, 4096)), ("o", 1, ("gauss7s", 12, 64, 4096, 4096)),
                 ("gate_up", 2, ("gauss7s", 12, 64, 14336, 4096)), ("down", 1, ("gauss7s", 12, 64, 4096, 14336))],
        "t3l12": [("qkv", 1.5, ("1mad", 12, 64, 4096, 4096)), ("o", 1, ("1mad", 12, 64, 4096, 4096)),
                  ("gate_up", 2, ("1mad", 8, 32, 14336, 4096)), ("down", 1, ("1mad", 12, 64, 4096, 14336))],
    }
    measured = {"t3g7": 1e6 / 84.2, "t3l12": 1e6 / 91.9}
    for twin, lins in rows.items():
        sm = sl = 0.0
        for name, scale, key in lins:
            if key not in t:
                continue
            mv, lin = t[key]
            # qkv: one prologue and one tail for 1.5 the rows; gate_up: one prologue for both.
            gap = lin - mv
            mvs = mv * scale
            lins_ = mvs + gap * (1 if name in ("qkv", "gate_up") else 1)
            sm += mvs
            sl += lins_
            print(f"| {twin} | {name} | {key[3:]} x{scale} | {mvs:.1f} | {lins_:.1f} | {lins_ - mvs:.1f} |")
        L = MODELS["8B"][4]
        print(f"| {twin} | **layer** | | **{sm:.1f}** | **{sl:.1f}** | **{sl - sm:.1f}** |")
        print(f"| {twin} | **step (x{L})** | | **{sm * L / 1000:.2f} ms** | **{sl * L / 1000:.2f} ms** | measured step "
              f"{measured[twin] / 1000:.2f} ms: {measured[twin] / 1000 - sl * L / 1000:.2f} ms beyond the linears |")


if __name__ == "__main__":
    main()
