#!/usr/bin/env python3
"""Medians of ab.sh's output: tok/s per label over the rounds, and each label's ratio to the
A4 label of its binary (NA4 for N*, BA4 for B*) per round (the same minute of load) and its
median; then each T8 label against the mean of the round's A4 labels (the affine code is the
same in both binaries, so both are the round's affine-4), pooled over every file given."""
import re, statistics as st, sys
runs = {}
base = 0
for f in sys.argv[1:]:
    top = 0
    for line in open(f):
        m = re.match(r"round (\d+) (\w+) threads \d+: ([\d.]+) tok/s", line)
        if m:
            runs.setdefault(m[2], {})[base + int(m[1])] = float(m[3])
            top = max(top, int(m[1]))
    base += top
for lab, r in sorted(runs.items()):
    line = f"{lab}: median {st.median(r.values()):.1f} tok/s over {len(r)}"
    ref = lab[0] + "A4"
    a4 = runs.get(ref)
    if a4 and lab != ref:
        per = [r[k] / a4[k] for k in sorted(r) if k in a4]
        line += f"; /{ref} per round {[round(x, 2) for x in per]}, median {st.median(per):.3f}"
    print(line)
a4s = [runs[k] for k in runs if k.endswith("A4")]
for lab, r in sorted(runs.items()):
    if "T8" in lab and a4s:
        per = [r[k] / st.mean(a[k] for a in a4s) for k in sorted(r) if all(k in a for a in a4s)]
        print(f"{lab} / the round's mean A4: median {st.median(per):.3f} over {len(per)} rounds, "
              f">= 1 in {sum(x >= 1 for x in per)}")
