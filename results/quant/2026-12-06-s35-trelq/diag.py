"""s35 trelq: per-linear errors of trellis models against their f16 source, under the
calibration Hessian and held-out Hessians (s30's puzzle.py measures, with s29's numpy decoder
extended to the table codes gauss7s / gauss8s / 1mad8s / 1mad8h):
  e_H  tr(dW H dW^T) / tr(W H W^T) under each Hessian file (the first: LDLQ's calibration)
  e_W  |dW|^2 / |W|^2
  gain tr(What H W^T) / tr(W H W^T) under each Hessian (1 = unbiased along W)
    python diag.py SRC_DIR HESS1[,HESS2..] OUT.json MODEL_DIR...
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

here = os.path.dirname(os.path.abspath(__file__))
src_le = open(os.path.join(here, "../2026-12-05-s29-trellis/layer_error.py")).read()
exec(src_le[: src_le.index("def main")])  # signs, layer_seed, hadamard, codes, decode, dequant


def gf_mul(a, b):
    p = 0
    while b:
        if b & 1:
            p ^= a
        hi = a & 0x80
        a = (a << 1) & 0xFF
        if hi:
            a ^= 0x1B
        b >>= 1
    return p


def sbox():
    t = []
    for x in range(256):
        inv = next((y for y in range(1, 256) if x and gf_mul(x, y) == 1), 0)
        b = inv
        r = lambda v, n: ((v << n) | (v >> (8 - n))) & 0xFF
        t.append(b ^ r(b, 1) ^ r(b, 2) ^ r(b, 3) ^ r(b, 4) ^ 0x63)
    return np.array(t, dtype=np.int64)


def rust_const(name):
    src = open(os.path.join(here, "../../../mlx-core/src/cpu/trellis.rs")).read()
    i = src.index(f"pub const {name}")
    if src[i : src.index("=", i)].rstrip().endswith("]"):
        body = src[src.index("= [", i) + 3 : src.index("];", i)]
        return np.array([int(v) for v in body.replace("\n", " ").split(",") if v.strip()])
    return np.float32(src[src.index("=", i) + 1 : src.index(";", i)].strip().replace("_", ""))


SB = sbox()
_codes = codes


def codes(l, code):  # noqa: F811 (the table codes added)
    if code in ("1mad", "1mad8"):
        return _codes(l, code)
    s = np.arange(1 << l, dtype=np.int64)
    top, low = (s >> (l - 8)) & 0xFF, s & 0xFF
    if code == "1mad8h":
        return _codes(8, "1mad8")[(top + low) & 0xFF]
    idx = (SB[top] + low) & 0xFF
    if code == "1mad8s":
        return _codes(8, "1mad8")[idx]
    if code == "gauss8s":
        return (rust_const("GAUSS8_TABLE")[idx].astype(np.float32) / rust_const("GAUSS8_SCALE")).astype(np.float64)
    if code == "gauss7s":
        return (rust_const("GAUSS7_TABLE")[idx & 0x7F].astype(np.float32) / rust_const("GAUSS7_SCALE")).astype(np.float64)
    raise ValueError(code)


def main():
    src, hfiles, out, models = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4:]
    ws = load_file(f"{src}/model.safetensors")
    hs = [load_file(h) for h in hfiles]
    keys = sorted(k for k in hs[0] if k.endswith(".hessian"))
    res = {}
    for m in models:
        q = json.load(open(f"{m}/config.json"))["quantization"]
        t = {}
        for f in os.listdir(m):
            if f.endswith(".safetensors"):
                t.update(load_file(os.path.join(m, f)))
        rows = {}
        for key in keys:
            path = key[: -len(".hessian")]
            w = ws[path + ".weight"].astype(np.float64)
            qp = q.get(path, q)
            qp = {**{k: v for k, v in q.items() if not isinstance(v, dict)}, **(qp if isinstance(qp, dict) else {})}
            wh = dequant(t[path + ".weight"], t[path + ".scales"], path, qp)
            d = wh - w
            r = {"e_W": float((d * d).sum() / (w * w).sum())}
            for i, h in enumerate(hs):
                hh = h[key].astype(np.float64)
                wH = w @ hh
                whw = float((wH * w).sum())
                r[f"e_H{i}"] = float(((d @ hh) * d).sum()) / whw
                r[f"gain{i}"] = float((wH * wh).sum()) / whw
            rows[path] = r
        res[os.path.basename(m.rstrip("/"))] = rows
        print(m, {k: float(np.mean([r[k] for r in rows.values()])) for k in next(iter(rows.values()))}, flush=True)
    json.dump(res, open(out, "w"), indent=1)


main()
