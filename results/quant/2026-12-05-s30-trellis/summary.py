"""Summarizes puzzle.py's JSON: per model the mean errors, and trellis against affine-4 linear by
linear under the calibration Hessian (H, Genesis) and the held-out one (X0, Exodus 1-16's first
4,096 tokens): python3 summary.py puzzle_exodus.json > puzzle_summary.txt"""
import json
import sys

import numpy as np

d = json.load(open(sys.argv[1]))
a4 = next(k for k in d if k.endswith("smol-a4"))
print("mean over the 210 linears (e_H: output error under Genesis, the calibration text; e_X0: under Exodus, the eval text)")
for m, rows in d.items():
    ks = next(iter(rows.values())).keys()
    print(f"  {m}: " + ", ".join(f"{k} {np.mean([r[k] for r in rows.values()]):.5f}" for k in ks))
for m, rows in d.items():
    if m == a4:
        continue
    print(f"{m} against affine-4:")
    for e in ("e_H", "e_X0"):
        r = {p: rows[p][e] / d[a4][p][e] for p in rows}
        print(f"  {e}: trellis lower in {sum(v < 1 for v in r.values())} of {len(r)} linears; "
              f"ratio median {np.median(list(r.values())):.2f}")
    for kind in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        ps = [p for p in rows if p.endswith(kind)]
        h = np.median([rows[p]["e_H"] / d[a4][p]["e_H"] for p in ps])
        x = np.median([rows[p]["e_X0"] / d[a4][p]["e_X0"] for p in ps])
        g = np.median([rows[p]["e_X0"] / rows[p]["e_H"] for p in ps])
        ga = np.median([d[a4][p]["e_X0"] / d[a4][p]["e_H"] for p in ps])
        print(f"    {kind:9s} trellis/affine median: Genesis {h:.2f}, Exodus {x:.2f}; "
              f"Exodus/Genesis error: trellis {g:.2f}, affine {ga:.2f}")
