"""s35 trelq: diag.py's JSON files side by side: per kind and per layer group, the ratio of model A's
error to model B's (mean of per-linear ratios; e_H0 = calibration Hessian, e_H1 = Exodus 4,096).
    python diag_table.py A.json B.json"""
import json
import sys

import numpy as np

a = next(iter(json.load(open(sys.argv[1])).items()))
b = next(iter(json.load(open(sys.argv[2])).items()))
print(f"A = {a[0]}, B = {b[0]}: mean over linears of A/B (and A, B means)")
kinds = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ms = ["e_W", "e_H0", "e_H1", "gain1"]
def row(name, paths):
    cells = []
    for m in ms:
        r = np.array([a[1][p][m] / b[1][p][m] for p in paths])
        cells.append(f"{r.mean():.4f}")
    worse = sum(a[1][p]["e_H1"] > b[1][p]["e_H1"] for p in paths)
    print(f"| {name} | {len(paths)} | " + " | ".join(cells) + f" | {worse} |")
print("| linears | n | " + " | ".join(f"{m} A/B" for m in ms) + " | A worse (e_H1) |")
print("|---|---|" + "---|" * (len(ms) + 1))
P = sorted(a[1])
row("all", P)
for k in kinds:
    row(k, [p for p in P if p.endswith(k)])
for lo, hi in [(0, 4), (5, 9), (10, 14), (15, 19), (20, 24), (25, 28), (29, 29)]:
    row(f"layers {lo}-{hi}", [p for p in P if lo <= int(p.split(".")[2]) <= hi])
print()
print("worst 12 linears by e_H1 A/B:")
for p in sorted(P, key=lambda p: -a[1][p]["e_H1"] / b[1][p]["e_H1"])[:12]:
    print(f"  {p}: e_H1 {a[1][p]['e_H1']:.5f} / {b[1][p]['e_H1']:.5f} = {a[1][p]['e_H1'] / b[1][p]['e_H1']:.3f}; e_H0 ratio {a[1][p]['e_H0'] / b[1][p]['e_H0']:.3f}")
