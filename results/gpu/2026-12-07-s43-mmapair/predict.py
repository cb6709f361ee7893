"""A PREDICTION (no device run) of the 16- and 5-row steps with the pair item (MMA_PAIR), from
session 37's fit (xtask/gpu/mma_gap.py over results/gpu/2026-12-06-s37-h100/call1/throughput.log:
a launch = F + items a warp x T) and this folder's item mixes (item_mix.py's logs).

    python3 results/gpu/2026-12-07-s43-mmapair/predict.py

Per product of the 8B (Llama-3.1-8B-shaped, 4-bit): a block's rows blocks nrb = ceil(N / 16 /
blocks) (132 blocks at 16 rows, 264 at 4-8), a warp's items nrb x K / 512 today and, with the
switch, floor(nrb / 2) x K / 512 pair items plus (nrb mod 2) x K / 512 items of one rows block
(a block's lone last rows block runs today's item, at T). Only the items' term changes; F, the time between
kernels and the rest are the measured step's. A pair item's time, three bounds:
  issue:   2 warps a scheduler (16 rows; 4 at 5 rows) x its instructions (the fastest it can be);
  latency: the compiler's stall cycles of a pair item, plus the rest of T (T less one item's
           stalls: the waits, mostly the shared-memory reads s37 found) scaled by the pair item's
           LDS against one item's (the middle estimate);
  no ILP:  2 T x (a rows block's instructions paired / unpaired) (the two chains gain nothing
           from each other: the slowest).
The 16-row baseline is session 38's `on` side (105.9 steps/s, 9.443 ms; the defaults: ring, no
banks); T is s37's ring fit at 16 rows (MV_ASYNC does not touch the tiles) and, for 5 rows, s37's
4-row ring fit (16 warps an SM: 2 blocks of the 5-row tile, as the 4-row one).
"""
import importlib.util
import math
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
_g = importlib.util.spec_from_file_location("mma_gap", ROOT / "xtask/gpu/mma_gap.py")
G = importlib.util.module_from_spec(_g)
_g.loader.exec_module(G)
CLOCK = G.CLOCK_GHZ * 1e3  # cycles a microsecond


def mixes(path):
    """{(nb, pair): (instructions, stalls, LDS) of an item} from an item_mix.py log."""
    out, key = {}, None
    for line in path.read_text().splitlines():
        m = re.match(r"== NB (\d+), .* pair (\d)", line)
        if m:
            key = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"an item \(.*\): (\d+) instructions, HMMA \d+, LDS (\d+) .* stalls (\d+) cycles", line)
        if m and key:
            out[key] = (int(m.group(1)), int(m.group(3)), int(m.group(2)))
    return out


def main():
    data = G.parse(G.LOG)
    mix = {}
    # The defaults' builds: the ring, no banks (16 rows; 8 and 5 rows).
    for f in ("item_mix_nb16_ring.log", "item_mix_nb8_nb5_ring.log"):
        if (HERE / f).exists():
            mix.update(mixes(HERE / f))
    ring16 = next(v for (s, r), v in data.items() if r == 16 and "MMA_ASYNC=1 MLX_GRAPH_MV_ASYNC=0" in s)
    ring4 = next(v for (s, r), v in data.items() if r == 4 and "MMA_ASYNC=1 MLX_GRAPH_MV_ASYNC=0" in s)
    for rows, nb, blocks, warps_sched, (sps, parts), base_ms in (
            (16, 16, 132, 2, ring16, 1e3 / 105.9), (5, 5, 264, 4, ring4, None)):
        if (nb, 0) not in mix or (nb, 1) not in mix:
            print(f"{rows} rows: no item mix of NB {nb} (item_mix.py) here")
            continue
        f, t = G.fit(parts, blocks)
        tc = t * CLOCK
        (i1, s1, l1), (i2, s2, l2) = mix[(nb, 0)], mix[(nb, 1)]
        bounds = {
            "issue": warps_sched * i2,
            "latency": s2 + (tc - s1) * l2 / l1,
            "no ILP": 2 * tc * (i2 / 2) / i1,
        }
        items1 = pairs = lone = 0
        for name, n, k, launches in G.PRODUCTS:
            nrb = math.ceil(math.ceil(n / 16) / blocks)
            items1 += launches * nrb * (k // 512)
            pairs += launches * (nrb // 2) * (k // 512)
            lone += launches * (nrb % 2) * (k // 512)
        print(f"{rows} rows (NB {nb}, {blocks} blocks, {warps_sched} warps a scheduler): T {t:.3f} us "
              f"({tc:.0f} cycles), F {f:.1f} us (s37's fit); items a warp a step {items1}, pair items "
              f"{pairs} and {lone} lone; an item {i1} instructions / {s1} stall cycles / {l1} LDS, a pair item "
              f"{i2} / {s2} / {l2}")
        items_ms = items1 * t / 1e3
        print(f"   the items today: {items_ms:.2f} ms a step")
        for k, tp in bounds.items():
            pair_ms = (pairs * tp / CLOCK + lone * t) / 1e3
            line = (f"   {k:8}: a pair item {tp:.0f} cycles ({tp / 2 / tc:.2f} T a rows block), the "
                    f"items {pair_ms:.2f} ms ({pair_ms - items_ms:+.2f})")
            if base_ms:
                step = base_ms - items_ms + pair_ms
                line += f"; the step {base_ms:.2f} -> {step:.2f} ms ({1e3 / step:.1f} steps/s)"
            print(line)


if __name__ == "__main__":
    main()
