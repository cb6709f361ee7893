"""s35 trelq: is a model's output error concentrated in a few directions? For each linear,
M = dW L (dW = decoded - f16 source, L L^T = the Exodus Hessian, so |M|_F^2 = tr(dW H dW^T)); the
share of |M|_F^2 in M's top 1 and top 8 singular directions, and the error's mean over rows
(|mean_r dW_r H^1/2|^2 / |M|_F^2 * rows: 1 = as for independent rows). Decoder: diag.py's.
    python spec.py SRC_DIR HESS OUT.json MODEL_DIR..."""
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
chol = {}
res = {}
for m in models:
    q = json.load(open(f"{m}/config.json"))["quantization"]
    t = load_file(f"{m}/model.safetensors")
    rows = {}
    for key in keys:
        path = key[: -len(".hessian")]
        if key not in chol:
            h = hs[key].astype(np.float64)
            h += np.eye(len(h)) * 1e-6 * np.trace(h) / len(h)
            chol[key] = np.linalg.cholesky(h)
        w = ws[path + ".weight"].astype(np.float64)
        qp = q.get(path, q)
        qp = {**{k: v for k, v in q.items() if not isinstance(v, dict)}, **(qp if isinstance(qp, dict) else {})}
        d = dequant(t[path + ".weight"], t[path + ".scales"], path, qp) - w
        M = d @ chol[key]
        s2 = np.linalg.svd(M, compute_uv=False) ** 2
        tot = s2.sum()
        mu = M.mean(axis=0)
        rows[path] = {"top1": float(s2[0] / tot), "top8": float(s2[:8].sum() / tot),
                      "rowmean": float((mu @ mu) * M.shape[0] / tot)}
    res[os.path.basename(m.rstrip("/"))] = rows
    print(m, {k: float(np.mean([r[k] for r in rows.values()])) for k in ("top1", "top8", "rowmean")}, flush=True)
json.dump(res, open(out, "w"), indent=1)
