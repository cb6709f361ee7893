"""A fluid model of MLX_GRAPH_MV_STEAL=1 on a measured one-row step's timeline (no GPU).

    python3 results/gpu/2026-12-06-s38-steal/steal_cost.py TRACE [--rows-8b]

TRACE: a graph decoder timeline (MLX_GRAPH_TRACE; ../2026-12-06-s38-h100/call3/traces.tgz's
off-1065.txt, the Llama-3.1-8B-shaped 4-bit model, one row, H100). For each row kernel (q/k/v,
o, gate/up, down, head) each block's static share of row groups (MV_ROWS 2, MV_WARPS 8: warp
lp0 = 8 block + warp takes lp0, lp0 + 8 blocks, ...) and its measured stream (its prologue's
end to its end) give the block's rate (groups a ns, at the memory share it got). Under the
switch a warp's first 1 + floor(MV_EARLY / per_lane) groups stay static and the rest go to
whichever warp asks first: with each block keeping its measured rate, the pool runs dry at T,
where the blocks' groups done by T add up to the kernel's (blocks whose static groups run
past T end as measured-in-rate). A warp then ends within one of its groups past T: the
predicted last end (model A) is T + the longest group time at the measured rates (8 / rate of
the slowest block): the rates stay as measured while most warps are done, a bound on the late
side. Model B: past T the few warps still summing have the memory system to themselves, a group
taking per_lane / MV_SLOTS unloaded round trips (0.8 us each, assumed): the early side. Printed per kind: the measured and
predicted last ends (us from the kernel's first block past its wait), medians over the layers,
and the sums over the step of (measured - predicted). The atomics: one a dynamic group, issued
a load ahead of its use; their count a step is printed against an L2 same-address rate.
"""
import statistics
import sys
from pathlib import Path

# The trace's kernel kinds and instances: trace_summary.py's own.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "xtask" / "gpu"))
from trace_summary import instances, kind  # noqa: E402



# Llama-3.1-8B: rows and K of each kind (4-bit, groups of 64: 32 inputs a 16-byte chunk).
SHAPES = {"qkv": (6144, 4096), "res_k4096": (4096, 4096), "gate_up": (28672, 4096),
          "res_k14336": (4096, 14336), "head": (128256, 4096)}
MV_ROWS, MV_WARPS, MV_EARLY, VALS = 2, 8, 4, 32
# A warp's group once most warps are done (model B): its loads, MV_SLOTS items in flight, at an
# unloaded round trip of ~0.8 us (an assumption): per_lane / MV_SLOTS round trips.
UNLOADED_NS = 800.0
MV_SLOTS = 4
# Same-address atomics an L2 slice serves: ~1 a clock at ~1.7 GHz (an assumption, not measured).
ATOMICS_PER_NS = 1.7


def model(recs, rows, K):
    groups = (rows + MV_ROWS - 1) // MV_ROWS
    B = len(recs)
    stride = B * MV_WARPS
    per_lane = -(-(K // VALS) // 32)
    static_n = 1 + MV_EARLY // per_lane
    t0 = min(r[5] for r in recs)
    blocks = []
    for r in recs:
        b = r[1] & 0xFFFFFFFF
        cnt = stat = 0
        for w in range(MV_WARPS):
            lp0 = MV_WARPS * b + w
            n = max(0, -(-(groups - lp0) // stride))
            cnt += n
            stat += min(n, static_n)
        s, e = r[6] - t0, r[7] - t0
        blocks.append((s, e, cnt, stat, cnt / max(e - s, 1.0)))
    # The pool runs dry at T: sum over blocks of min(their static, or all they do by T) = groups.
    def done(T):
        return sum(max(stat, rate * max(T - s, 0.0)) for s, e, cnt, stat, rate in blocks)
    lo, hi = 0.0, max(e for _, e, *_ in blocks) * 4
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if done(mid) < groups else (lo, mid)
    T = hi
    ends = [max(s + stat / rate, T + MV_WARPS / rate) if s + stat / rate > T else T + MV_WARPS / rate
            for s, e, cnt, stat, rate in blocks]
    measured = max(e for _, e, *_ in blocks)
    med = statistics.median(e for _, e, *_ in blocks)
    dyn = max(0, groups - sum(stat for *_, stat, _ in blocks))
    # Model B: past T the warps still summing run at an unloaded memory system's pace.
    fast = T + UNLOADED_NS * max(1.0, per_lane / MV_SLOTS)
    late_static = max((s + stat / rate for s, e, cnt, stat, rate in blocks), default=0.0)
    return measured, med, max(ends), T, dyn, per_lane, static_n, max(fast, late_static) if dyn else measured


def main():
    path = sys.argv[1]
    per = {}
    for ins in instances(path):
        k = kind(ins["what"])
        if k not in SHAPES:
            continue
        per.setdefault(k, []).append(model(ins["recs"], *SHAPES[k]))
    print(f"{path}: per kind, medians over the layers (us from the first block past its wait)")
    print(f"{'kind':>11} {'n':>3} {'per_lane':>8} {'static':>6} {'dyn grp':>7} {'last end':>9} "
          f"{'median end':>10} {'T dry':>7} {'A: last':>8} {'A: saved/step':>13} {'B: last':>8} "
          f"{'B: saved/step':>13}")
    tot_a = tot_b = tot_atom = 0.0
    for k, ms in per.items():
        sa = sum((m[0] - m[2]) / 1e3 for m in ms)
        sb = sum((m[0] - m[7]) / 1e3 for m in ms)
        tot_a += sa
        tot_b += sb
        tot_atom += sum(m[4] for m in ms)
        md = lambda i: statistics.median(m[i] for m in ms) / 1e3
        print(f"{k:>11} {len(ms):>3} {ms[0][5]:>8} {ms[0][6]:>6} {ms[0][4]:>7} {md(0):>9.2f} "
              f"{md(1):>10.2f} {md(3):>7.2f} {md(2):>8.2f} {sa:>13.1f} {md(7):>8.2f} {sb:>13.1f}")
    print(f"sum over the step: last ends earlier by {tot_a:.1f} us (A) to {tot_b:.1f} us (B); "
          f"{tot_atom:.0f} atomics a step (one a dynamic group), "
          f"{tot_atom / ATOMICS_PER_NS / 1e3:.1f} us of one L2 slice's same-address rate "
          f"({ATOMICS_PER_NS} a ns, assumed) spread over the step's kernels")


if __name__ == "__main__":
    main()
