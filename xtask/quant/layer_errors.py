"""Per-linear error of quantized models against their float32 source, from dequantized
(`mlx convert -d`) copies: the weight error ||dW||^2 / ||W||^2 and, with a Hessians file
(`trellis_hessians.py`), the output error tr(dW H dW^T) / tr(W H W^T).

    python layer_errors.py F32_DIR HESSIANS.safetensors OUT.json NAME=DEQUANT_DIR ...

Writes one object per row: {"row", "layers": {path: [weight_err, output_err]}, "mean": [...]}."""
import glob
import json
import sys

import mlx.core as mx
import numpy as np


def tensors(d):
    out = {}
    for f in sorted(glob.glob(d + "/*.safetensors")):
        out.update(mx.load(f))
    return out


f32_dir, hess_path, out_path = sys.argv[1:4]
ref = tensors(f32_dir)
hess = mx.load(hess_path)
rows = []
for arg in sys.argv[4:]:
    name, d = arg.split("=", 1)
    q = tensors(d)
    layers = {}
    for k in sorted(hess):
        path = k[: -len(".hessian")]
        w = np.array(ref[path + ".weight"].astype(mx.float32), dtype=np.float64)
        wq = np.array(q[path + ".weight"].astype(mx.float32), dtype=np.float64)
        h = np.array(hess[k], dtype=np.float64)
        dw = wq - w
        werr = float((dw * dw).sum() / (w * w).sum())
        oerr = float(np.einsum("ij,jk,ik->", dw, h, dw) / np.einsum("ij,jk,ik->", w, h, w))
        layers[path] = [werr, oerr]
    vals = np.array(list(layers.values()))
    rows.append({"row": name, "layers": layers, "mean": vals.mean(0).tolist(),
                 "max": vals.max(0).tolist()})
    print(name, "mean weight err %.4f output err %.4f; max %.4f %.4f" % (*vals.mean(0), *vals.max(0)),
          flush=True)
json.dump(rows, open(out_path, "w"), indent=1)
