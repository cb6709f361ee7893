#!/usr/bin/env python3
"""Medians of ab.sh's output: tok/s per label over the rounds, and each label's ratio to the
A4 label of its binary (NA4 for N*, BA4 for B*) per round (the same minute of load) and its
median."""
import re, statistics as st, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"round (\d+) (\w+) threads \d+: ([\d.]+) tok/s", line)
    if m:
        runs.setdefault(m[2], {})[int(m[1])] = float(m[3])
for lab, r in sorted(runs.items()):
    line = f"{lab}: median {st.median(r.values()):.1f} tok/s over {len(r)}"
    ref = lab[0] + "A4"
    a4 = runs.get(ref)
    if a4 and lab != ref:
        per = [r[k] / a4[k] for k in sorted(r) if k in a4]
        line += f"; /{ref} per round {[round(x, 2) for x in per]}, median {st.median(per):.3f}"
    print(line)
