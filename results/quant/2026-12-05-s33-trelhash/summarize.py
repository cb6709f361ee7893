#!/usr/bin/env python3
"""Medians of speed.sh's output: tok/s per BIN:MODEL, and each model's ratio to A4 on the same
binary, per round (same round = same minute of load) and of the medians."""
import re, statistics as st, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"round (\d+) (\w+) (\w+) threads \d+: ([\d.]+) tok/s", line)
    if m:
        runs.setdefault((m[2], m[3]), {})[int(m[1])] = float(m[4])
for (b, mdl), r in sorted(runs.items()):
    line = f"{b} {mdl}: median {st.median(r.values()):.1f} tok/s over {len(r)}"
    a4 = runs.get((b, "A4"))
    if a4 and mdl != "A4":
        per = [r[k] / a4[k] for k in sorted(r) if k in a4]
        line += f"; /{b} A4 per round {[round(x, 2) for x in per]}, median {st.median(per):.2f}"
    print(line)
