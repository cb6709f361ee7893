"""s35 trelq: medians of wall_speed.sh's tok/s per model, and per round each model / affine-4 (A4).
usage: python3 wall_summary.py wall_raw*.txt"""
import re
import statistics
import sys

for f in sys.argv[1:]:
    v, rounds = {}, {}
    for line in open(f):
        m = re.match(r"round (\d+) \S+ (\S+) threads \d+: ([0-9.]+) tok/s", line)
        if m:
            v.setdefault(m.group(2), []).append(float(m.group(3)))
            rounds.setdefault(int(m.group(1)), {})[m.group(2)] = float(m.group(3))
    a4 = statistics.median(v["A4"])
    print(f"{f}: mlx generate --decoder cpu --threads 2, 128 greedy tokens, {len(rounds)} interleaved rounds")
    for k, x in v.items():
        per = [r[k] / r["A4"] for r in rounds.values() if k in r and "A4" in r]
        print(f"  {k}: median {statistics.median(x):.1f} tok/s (min {min(x):.1f}, max {max(x):.1f}); "
              f"vs affine-4 by medians {statistics.median(x) / a4:.3f}x, per-round ratio median {statistics.median(per):.3f}x "
              f"({', '.join(f'{p:.2f}' for p in per)})")
