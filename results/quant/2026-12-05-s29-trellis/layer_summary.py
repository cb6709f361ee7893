"""Summarizes layer_error.py's output (layer_error_*.json, Genesis Hessians): per linear kind the
median and max of each trellis model's output error over affine-4's, seed 1 over seed 0, and the
worst layers. /work/oracle-venv/bin/python layer_summary.py > layer_summary.txt"""
import collections
import json

import numpy as np

a = list(json.load(open("layer_error_affine4.json")).values())[0]
t = json.load(open("layer_error_trellis_seed0_seed1.json"))
t0, t1 = [t[k] for k in sorted(t)]
print("mean over the 210 linears: [output error tr(dW H dW^T)/tr(W H W^T), weight error |dW|^2/|W|^2]")
for name, r in (("affine-4 g64", a), ("trellis-3 1mad seed 0", t0), ("trellis-3 1mad seed 1", t1)):
    print(f"  {name}: {np.mean(list(r.values()), axis=0)}")
by = collections.defaultdict(list)
for p in a:
    by[p.split(".")[-1]].append((t0[p][0] / a[p][0], t1[p][0] / a[p][0], t1[p][0] / t0[p][0]))
print("per kind: trellis/affine-4 output error (median, max) for seed 0 and seed 1; seed1/seed0 (median, min, max)")
for k, v in sorted(by.items()):
    v = np.array(v)
    print(f"  {k:10s} s0 {np.median(v[:, 0]):.2f} {v[:, 0].max():.2f} | s1 {np.median(v[:, 1]):.2f} {v[:, 1].max():.2f}"
          f" | s1/s0 {np.median(v[:, 2]):.3f} {v[:, 2].min():.3f} {v[:, 2].max():.3f}")
print("largest seed1/seed0 output-error ratios:")
for r, p in sorted(((t1[p][0] / t0[p][0], p) for p in a), reverse=True)[:6]:
    print(f"  {p}: {r:.3f} ({t0[p][0]:.5f} -> {t1[p][0]:.5f})")
print("largest output errors (seed 1):")
for e, p in sorted(((t1[p][0], p) for p in a), reverse=True)[:6]:
    print(f"  {p}: {e:.5f} (affine-4 {a[p][0]:.5f})")
