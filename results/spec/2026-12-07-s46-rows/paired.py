#!/usr/bin/env python3
"""Paired per-round differences between configs of one profile_cfgs.sh series: per round (the
configs ran back to back after one idle gate), each config's lookup pass ms per part and its c;
prints per config the medians over rounds of (config - base) for the pass's parts and for c,
and the share of rounds where the config is cheaper. usage: paired.py DIR BASE_INDEX [DIR ...]"""
import importlib.util, os, statistics, sys, glob
here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("pt", os.path.join(here, "../2026-12-06-s38-specpolicy/profile_table.py"))
pt = importlib.util.module_from_spec(spec); spec.loader.exec_module(pt)


base = int(sys.argv[2])
dirs = [sys.argv[1]] + sys.argv[3:]
series = {}
for d in dirs:
    for f in sorted(glob.glob(os.path.join(d, "c*.log"))):
        i = int(os.path.basename(f)[1:-4])
        series.setdefault(i, []).extend(pt.pairs(f))
cfg = {}
for d in dirs:
    for line in open(os.path.join(d, "configs.txt")):
        k, v = line.split(":", 1); cfg[int(k[1:])] = v.strip()
med = statistics.median
parts = pt.PARTS
b = series[base]
print(f"base c{base} ({cfg[base]}): {len(b)} rounds; medians of per-round differences (config - base)")
print("| config | rounds | d lookup pass ms | d c | rounds cheaper (pass) | " + " | ".join(f"d {p} pass ms" for p in parts) + " |")
print("|---|---|---|---|---|" + "---|" * len(parts))
for i in sorted(series):
    if i == base:
        continue
    s = series[i]; n = min(len(s), len(b))
    c = lambda p, l: (l["step"] / p["step"] - 1) / (l["rows"] - 1)
    dpass = [s[k][1]["step"] - b[k][1]["step"] for k in range(n)]
    dc = [c(*s[k]) - c(*b[k]) for k in range(n)]
    dp = [med([s[k][1]["parts"].get(p, 0) - b[k][1]["parts"].get(p, 0) for k in range(n)]) for p in parts]
    cheaper = sum(1 for x in dpass if x < 0)
    print(f"| c{i} {cfg[i]} | {n} | {med(dpass):+.3f} | {med(dc):+.3f} | {cheaper}/{n} | " + " | ".join(f"{x:+.3f}" for x in dp) + " |")
