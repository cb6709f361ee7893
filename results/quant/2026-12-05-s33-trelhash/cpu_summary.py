"""Medians of cpu_ab.sh's CPU ms a decoded token per label, and per-round ratios (ms of REF /
ms of the label: > 1 = faster than REF). usage: python cpu_summary.py RAW [REF]"""
import re
import statistics
import sys

raw, ref = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "NA4")
ms = {}
for line in open(raw):
    m = re.match(r"round (\d+) (\S+): .*per decoded token ([\d.]+) ms", line)
    if m:
        ms.setdefault(m[2], {})[int(m[1])] = float(m[3])
print(f"{'label':8} {'rounds':>6} {'median ms':>10} {'speed vs ' + ref + ' (median of rounds)':>32}")
for label, r in ms.items():
    ratios = [ms[ref][k] / v for k, v in r.items() if k in ms.get(ref, {})]
    med = statistics.median(r.values())
    rat = f"{statistics.median(ratios):.3f} ({', '.join(f'{x:.2f}' for x in ratios)})" if ratios else ""
    print(f"{label:8} {len(r):>6} {med:>10.2f} {rat:>32}")
