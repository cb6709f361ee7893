"""s35 trelq: each linear's error along its input's dominant direction (u1, the Exodus Hessian's top
eigenvector: for the normed residual stream mostly the mean input, which attention's average over
tokens keeps while it averages random errors away): e_top = |dW u1|^2 / |W u1|^2, with lambda_1 / tr H.
    python topdir.py SRC_DIR HESS OUT.json MODEL_DIR..."""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "diag.py")).read()
exec(src[: src.index("\ndef main")])

srcd, hf, out, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ws = load_file(f"{srcd}/model.safetensors")
hs = load_file(hf)
keys = sorted(k for k in hs if k.endswith(".hessian"))
top = {}
res = {}
for m in models:
    q = json.load(open(f"{m}/config.json"))["quantization"]
    t = load_file(f"{m}/model.safetensors")
    rows = {}
    for key in keys:
        path = key[: -len(".hessian")]
        if key not in top:
            h = hs[key].astype(np.float64)
            ev, V = np.linalg.eigh(h)
            top[key] = (V[:, -1], float(ev[-1] / ev.sum()))
        u, share = top[key]
        w = ws[path + ".weight"].astype(np.float64)
        qp = q.get(path, q)
        qp = {**{k: v for k, v in q.items() if not isinstance(v, dict)}, **(qp if isinstance(qp, dict) else {})}
        d = dequant(t[path + ".weight"], t[path + ".scales"], path, qp) - w
        rows[path] = {"e_top": float((d @ u) @ (d @ u) / ((w @ u) @ (w @ u))), "lambda1_share": share}
    res[os.path.basename(m.rstrip("/"))] = rows
json.dump(res, open(out, "w"), indent=1)
a, b = (res[os.path.basename(x.rstrip("/"))] for x in models[:2])
for k in ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]:
    ps = [p for p in a if p.endswith(k)]
    r = np.array([a[p]["e_top"] / b[p]["e_top"] for p in ps])
    print(f"| {k} | {np.mean([a[p]['lambda1_share'] for p in ps]):.3f} | {np.mean([a[p]['e_top'] for p in ps]):.5f} | {np.mean([b[p]['e_top'] for p in ps]):.5f} | {r.mean():.3f} | {np.median(r):.3f} | {int((r > 1).sum())} |")
