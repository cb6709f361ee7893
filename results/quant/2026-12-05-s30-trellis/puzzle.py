"""Session 30's look at the puzzle (trellis-3 has the lower Hessian-weighted error in 191 of 210
linears, yet the higher perplexity). For each model and linear, against the float32 source:
  e_H    tr(dW H dW^T) / tr(W H W^T)           (the s29 output error)
  e_W    |dW|^2 / |W|^2                        (weight error)
  gain_H tr(What H W^T) / tr(W H W^T)          (1 = outputs unbiased in W's direction; < 1 shrunk)
  e_bulk e_H with H's eigenvalues clipped at 10x their median (the few huge directions muted)
  e_X    e_H under each extra Hessian (e.g. the eval text's)
With --unbias OUT_DIR (trellis models only, one model): writes a copy of the model whose row scales
are multiplied by (wt_r H_t wt_r) / (what_r H_t wt_r) in the incoherent basis (H_t = the column
transform of H), i.e. the rows' outputs made unbiased under H instead of least-squares (shrunk).

    python puzzle.py SRC_DIR HESS[,EXTRA_HESS..] OUT.json MODEL_DIR... [--unbias OUT_DIR] [--no-bulk]
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

here = os.path.dirname(os.path.abspath(__file__))
src_le = open(os.path.join(here, "../2026-12-05-s29-trellis/layer_error.py")).read()
exec(src_le[: src_le.index("def main")])  # signs, layer_seed, had_block, hadamard, decode, affine, dequant

args = sys.argv[1:]
unbias = None
bulk = "--no-bulk" not in args
args = [x for x in args if x != "--no-bulk"]
if "--unbias" in args:
    i = args.index("--unbias")
    unbias = args[i + 1]
    args = args[:i] + args[i + 2 :]
src, hfiles, out, models = args[0], args[1].split(","), args[2], args[3:]
ws = load_file(f"{src}/model.safetensors")
hs = [load_file(h) for h in hfiles]
keys = sorted(k for k in hs[0] if k.endswith(".hessian"))
clipped = {}
res = {}
for m in models:
    q = json.load(open(f"{m}/config.json"))["quantization"]
    t = load_file(f"{m}/model.safetensors")
    rows = {}
    for key in keys:
        path = key[: -len(".hessian")]
        w = ws[path + ".weight"].astype(np.float64)
        h = hs[0][key].astype(np.float64)
        if bulk and key not in clipped:
            ev, V = np.linalg.eigh(h)
            clipped[key] = (V * np.minimum(ev, 10 * np.median(ev))) @ V.T
        if q.get("mode", "affine") == "affine":
            wh = affine(t, path, q)
        else:
            wh = dequant(t[path + ".weight"], t[path + ".scales"], path, q)
        d = wh - w
        whw = ((w @ h) * w).sum()
        r = dict(
            e_H=float(((d @ h) * d).sum() / whw),
            e_W=float((d * d).sum() / (w * w).sum()),
            gain_H=float(((wh @ h) * w).sum() / whw),
            gain_W=float((wh * w).sum() / (w * w).sum()),
        )
        if bulk:
            r["e_bulk"] = float(((d @ clipped[key]) * d).sum() / ((w @ clipped[key]) * w).sum())
        for j, hx in enumerate(hs[1:]):
            hh = hx[key].astype(np.float64)
            r[f"e_X{j}"] = float(((d @ hh) * d).sum() / ((w @ hh) * w).sum())
            r[f"gain_X{j}"] = float(((wh @ hh) * w).sum() / ((w @ hh) * w).sum())
        if unbias:
            rws, cols = w.shape
            seed = layer_seed(q.get("seed", 0), path)
            su, sv = signs(seed, rws), signs(seed ^ 0x5555555555555555, cols)
            br, bc = had_block(rws), had_block(cols)
            hr, hc = hadamard(br), hadamard(bc)
            def col_t(x):  # x diag(sv) H_c
                x = x * sv[None, :]
                return (x.reshape(x.shape[0], cols // bc, bc) @ hc).reshape(x.shape[0], cols)
            wt = col_t(w * su[:, None])
            wt = (hr @ wt.reshape(rws // br, br, cols)).reshape(rws, cols)
            ht = col_t(col_t(h).T)  # H_c diag(sv) H diag(sv) H_c
            k, l, blk = q["bits"], q["trellis_l"], q["group_size"]
            wht = decode(t[path + ".weight"], t[path + ".scales"], k, l, blk, q.get("trellis_code", "1mad"))
            num = ((wt @ ht) * wt).sum(1)
            den = ((wht @ ht) * wt).sum(1)
            f = np.where(den > 0, num / np.where(den > 0, den, 1), 1.0)
            t[path + ".scales"] = (t[path + ".scales"].astype(np.float64) * f[:, None]).astype(np.float16)
            r["unbias_factor_mean"] = float(f.mean())
        rows[path] = r
    res[m] = rows
    agg = {k: float(np.mean([v[k] for v in rows.values()])) for k in next(iter(rows.values()))}
    print(m, json.dumps({k: round(v, 5) for k, v in agg.items()}), flush=True)
    if unbias:
        os.makedirs(unbias, exist_ok=True)
        for f in os.listdir(m):
            if f != "model.safetensors":
                shutil.copy(os.path.join(m, f), unbias)
        save_file(t, os.path.join(unbias, "model.safetensors"), metadata={"format": "mlx"})
json.dump(res, open(out, "w"), indent=1)
