"""Weight error |W_q - W|^2 / |W|^2 of every matrix of dequantized rows (`mlx convert -d`)
against f32/, run in the directory rerun_rows.sh fills: python weight_errors.py ROW..."""
import glob, sys, json
import mlx.core as mx, numpy as np
def t(d):
    o = {}
    for f in sorted(glob.glob(d + "/*.safetensors")): o.update(mx.load(f))
    return o
ref = t("f32"); rows = sys.argv[1:]
qs = {r: t(r) for r in rows}
res = {}
for k in sorted(ref):
    if not k.endswith(".weight") or ref[k].ndim != 2: continue
    w = np.array(ref[k], dtype=np.float64); n = (w*w).sum()
    res[k] = [float(((np.array(qs[r][k].astype(mx.float32), dtype=np.float64) - w)**2).sum() / n) for r in rows]
json.dump(res, open("werr_" + "_".join(rows) + ".json", "w"), indent=0)
a = np.array(list(res.values()))
print("rows", rows, "mean", a.mean(0), "median", np.median(a, 0))
for k, v in res.items():
    if v[0] > v[1] or "embed" in k or "layers.0." in k: print(k, ["%.4f" % x for x in v])
