"""Writes `<path>.weight` (float32, from the float32 model) and `<path>.hessian` pairs for the
named linears, the input of `trellis_mse --hessians` (the output-error proxy).
usage: python proxy_pairs.py F32_DIR HESSIANS.safetensors OUT.safetensors PATH..."""
import sys

import mlx.core as mx

model_dir, hess, out, *paths = sys.argv[1:]
w = mx.load(f"{model_dir}/model.safetensors")
h = mx.load(hess)
res = {}
for p in paths:
    res[p + ".weight"] = w[p + ".weight"].astype(mx.float32)
    res[p + ".hessian"] = h[p + ".hessian"]
mx.save_safetensors(out, res)
print(f"{len(paths)} pairs -> {out}")
