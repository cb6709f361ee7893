#!/usr/bin/env python3
"""Median per-part extra-row costs over the plain/lookup pairs of profile_ab.sh logs (s38's
profile_table.py parses them): per part the one-row step ms, the pass ms, the extra row in ms,
its share of the part's one-row cost and its part of c (extra row ms / whole one-row step ms),
each the median over the pairs; and the median c and modelled ratio.
usage: parts_median.py LOG [LOG ...] (the pairs of all logs pooled)"""
import statistics, sys, importlib.util, os
here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("pt", os.path.join(here, "../2026-12-06-s38-specpolicy/profile_table.py"))
pt = importlib.util.module_from_spec(spec); spec.loader.exec_module(pt)
pairs = [pr for path in sys.argv[1:] for pr in pt.pairs(path)]
med = statistics.median
print(f"{len(pairs)} pairs; c median {med((s['step']/p['step']-1)/(s['rows']-1) for p,s in pairs):.3f}; "
      f"modelled ratio median {med(p['n']*p['step']/(s['n']*s['step']) for p,s in pairs):.2f}x; "
      f"tps ratio median {med(s['tps']/p['tps'] for p,s in pairs):.2f}x; plain ms/step median {med(p['step'] for p,s in pairs):.2f}, "
      f"lookup ms/pass median {med(s['step'] for p,s in pairs):.2f}")
print("| part | one-row step ms | pass ms | extra row ms | share of its one-row cost | its part of c |")
print("|---|---|---|---|---|---|")
for part in pt.PARTS + ["all"]:
    one = [p["parts"].get(part, 0) if part != "all" else p["step"] for p, s in pairs]
    pas = [s["parts"].get(part, 0) if part != "all" else s["step"] for p, s in pairs]
    ex = [(b - a) / (s["rows"] - 1) for a, b, (p, s) in zip(one, pas, pairs)]
    sh = [e / a for e, a in zip(ex, one) if a > 0]
    cp = [e / p["step"] for e, (p, s) in zip(ex, pairs)]
    print(f"| {part} | {med(one):.3f} | {med(pas):.3f} | {med(ex):.3f} | {med(sh) if sh else 0:.2f} | {med(cp):.3f} |")
