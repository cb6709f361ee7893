#!/usr/bin/env python3
"""Medians of cpu_ab.sh's output (one or more files, rounds numbered on across them): CPU ms
a decoded token per label, and each label's speed relative to the A4 label of its binary (NA4
for N*, BA4 for B*: A4 ms / label ms, so > 1 is faster than affine-4) per round and its
median; then each other T8 label's speed relative to NT8 (the new default) in the same round."""
import re, statistics as st, sys
runs = {}
base = 0
for f in sys.argv[1:]:
    top = 0
    for line in open(f):
        m = re.match(r"round (\d+) (\w+): .* per decoded token ([\d.]+) ms", line)
        if m:
            runs.setdefault(m[2], {})[base + int(m[1])] = float(m[3])
            top = max(top, int(m[1]))
    base += top
for lab, r in sorted(runs.items()):
    line = f"{lab}: median {st.median(r.values()):.3f} ms over {len(r)}"
    ref = lab[0] + "A4"
    a4 = runs.get(ref)
    if a4 and lab != ref:
        per = [a4[k] / r[k] for k in sorted(r) if k in a4]
        line += f"; speed /{ref} per round {[round(x, 2) for x in per]}, median {st.median(per):.3f}"
    print(line)
ref = runs.get("NT8")
for lab, r in sorted(runs.items()):
    if ref and "T8" in lab and lab != "NT8":
        per = [ref[k] / r[k] for k in sorted(r) if k in ref]
        print(f"{lab} / NT8 speed: median {st.median(per):.3f} over {len(per)} rounds "
              f"(faster in {sum(x > 1 for x in per)})")
