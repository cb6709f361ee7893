#!/usr/bin/env python3
"""Pools the rounds of the `cargo xtask bench spec --cli` tables here (spec-cli-<config>[-N].md)
by configuration: rounds, median plain and lookup tok/s, the ratio of those medians, the median
of the rounds' ratios and its spread, and whether every round gave plain decoding's tokens.
usage: pool_bench.py [FILES...] (default: spec-cli-*.md here)"""
import glob, re, statistics, sys
from collections import defaultdict

files = sys.argv[1:] or sorted(glob.glob("spec-cli-*.md"))
pool = defaultdict(list)
for f in files:
    cfg = re.sub(r"-\d+$", "", f[len("spec-cli-"):-3].split("/")[-1])
    for line in open(f):
        m = re.match(r"\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \| (\d+) \| [^|]+\| \d+ \| (\w+) \|", line)
        if m:
            pool[cfg].append((float(m.group(2)), float(m.group(3)), float(m.group(4)), m.group(6)))
print("| configuration | runs x rounds | plain tok/s (median) | lookup tok/s (median) | ratio of medians | median of rounds' ratios | rounds' ratios (quartiles) | same tokens |")
print("|---|---|---|---|---|---|---|---|")
for cfg, rs in pool.items():
    p = statistics.median(r[0] for r in rs)
    s = statistics.median(r[1] for r in rs)
    rat = sorted(r[2] for r in rs)
    q = statistics.quantiles(rat, n=4)
    same = all(r[3] == "yes" for r in rs)
    runs = len([f for f in files if re.sub(r"-\d+$", "", f[len("spec-cli-"):-3].split("/")[-1]) == cfg])
    print(f"| {cfg} | {runs} x 7 = {len(rs)} | {p:.1f} | {s:.1f} | {s / p:.2f}x | {statistics.median(rat):.2f}x | {q[0]:.2f}-{q[2]:.2f}x (all {rat[0]:.2f}-{rat[-1]:.2f}x) | {'yes' if same else 'NO'} |")
