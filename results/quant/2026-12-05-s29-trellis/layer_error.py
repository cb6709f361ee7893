"""Per-linear output error of trellis models against their float source, for finding which
layer a seed's loss comes from. Decodes the trellis weights in numpy (the layout of
mlx_core::cpu::trellis: windows of a tail-biting bit stream, 1MAD / 1mad8 codes, row scales,
W = diag(su) H_r Wt H_c diag(sv)) and reports, for each linear and each Hessian file,
tr(dW H dW^T) / tr(W H W^T):

    python layer_error.py SRC_DIR HESS1[,HESS2..] OUT.json MODEL_DIR...
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file

M64 = (1 << 64) - 1
MAD_A, MAD_B, MAD_SCALE = 34038481, 76625530, np.float32(147.80054)
MAD8_SCALE = np.float32(MAD_SCALE * np.float32(127.0) / np.float32(510.0))


def signs(seed, n):
    z, out, bits = seed, [], 0
    for i in range(n):
        if i % 64 == 0:
            z = (z + 0x9E3779B97F4A7C15) & M64
            x = z
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
            bits = x ^ (x >> 31)
        out.append(-1.0 if (bits >> (i % 64)) & 1 else 1.0)
    return np.array(out)


def layer_seed(seed, path):
    h = 0xCBF29CE484222325
    for b in path.encode():
        h ^= b
        h = (h * 0x100000001B3) & M64
    return seed ^ h


def had_block(n):
    return min(n & -n, 4096)


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def codes(l, code):
    s = np.arange(1 << l, dtype=np.uint64)
    x = (s * MAD_A + MAD_B) & 0xFFFFFFFF
    c = sum(((x >> (8 * j)) & 0xFF) for j in range(4)).astype(np.int64) - 510
    if code == "1mad8":
        r = np.sign(c) * np.floor(np.abs(c) * 127 / 510 + 0.5)
        return (r.astype(np.float32) / MAD8_SCALE).astype(np.float64)
    return (c.astype(np.float32) / MAD_SCALE).astype(np.float64)


def decode(words, scales, k, l, block, code):
    rows, wpr = words.shape
    bw = block * k // 32
    bits = block * k
    w = words.reshape(rows, -1, bw).astype(np.uint64)
    t = np.arange(block)
    start = ((t + 1) * k + bits - l) % bits
    a, off = start // 32, start % 32
    hi = w[:, :, a]
    lo = w[:, :, (a + 1) % bw]
    v = (((hi << np.uint64(32)) | lo) >> (np.uint64(64) - off.astype(np.uint64) - np.uint64(l))) & np.uint64((1 << l) - 1)
    tab = codes(l, code)
    return tab[v.astype(np.int64)].reshape(rows, -1) * scales.astype(np.float64).reshape(rows, 1)


def affine(t, path, q):
    bits, g = q["bits"], q["group_size"]
    w = t[path + ".weight"]
    per = 32 // bits
    v = (w[:, :, None] >> (np.arange(per, dtype=np.uint32) * bits)) & ((1 << bits) - 1)
    v = v.reshape(w.shape[0], -1).astype(np.float64)
    s = np.repeat(t[path + ".scales"].astype(np.float64), g, axis=1)
    b = np.repeat(t[path + ".biases"].astype(np.float64), g, axis=1)
    return v * s + b


def dequant(words, scales, path, q):
    k, l, block = q["bits"], q["trellis_l"], q["group_size"]
    wt = decode(words, scales, k, l, block, q.get("trellis_code", "1mad"))
    rows, cols = wt.shape
    seed = layer_seed(q.get("seed", 0), path)
    su, sv = signs(seed, rows), signs(seed ^ 0x5555555555555555, cols)
    br, bc = had_block(rows), had_block(cols)
    hr, hc = hadamard(br), hadamard(bc)
    x = (wt.reshape(rows, cols // bc, bc) @ hc).reshape(rows, cols)
    x = (hr @ x.reshape(rows // br, br, cols)).reshape(rows, cols)
    return x * sv[None, :] * su[:, None]


def main():
    src, hfiles, out, models = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4:]
    ws = load_file(f"{src}/model.safetensors")
    hs = [load_file(h) for h in hfiles]
    res = {}
    for m in models:
        q = json.load(open(f"{m}/config.json"))["quantization"]
        t = load_file(f"{m}/model.safetensors")
        rows = {}
        for key in sorted(k for k in hs[0] if k.endswith(".hessian")):
            path = key[: -len(".hessian")]
            w = ws[path + ".weight"].astype(np.float64)
            if q.get("mode", "affine") == "affine":
                d = affine(t, path, q) - w
            else:
                d = dequant(t[path + ".weight"], t[path + ".scales"], path, q) - w
            rows[path] = []
            for h in hs:
                hh = h[key].astype(np.float64)
                rows[path].append(float(((d @ hh) * d).sum() / ((w @ hh) * w).sum()))
            rows[path].append(float((d * d).sum() / (w * w).sum()))
        res[m] = rows
        print(m, "mean", np.mean([v for v in rows.values()], axis=0), flush=True)
    json.dump(res, open(out, "w"), indent=1)


main()
