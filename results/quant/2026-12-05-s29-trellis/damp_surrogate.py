"""Which LDLQ damping generalizes: a numpy surrogate of the trellis encoder (GPTQ-order LDLQ with
an 8-level uniform scalar quantizer at 3 bits instead of the trellis, in the same incoherent basis:
64-wide random-sign Hadamard blocks), coded against a calibration Hessian and scored on a held-out
one: tr(dW H dW^T) / tr(W H W^T).

    python damp_surrogate.py F32_DIR CALIB.safetensors HELDOUT.safetensors DAMP,DAMP,.. LAYER..."""
import sys

import numpy as np
from safetensors.numpy import load_file

src, cal, held, damps, layers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
damps = [float(d) for d in damps.split(",")]
ws, hc, hh = load_file(f"{src}/model.safetensors"), load_file(cal), load_file(held)
rng = np.random.default_rng(0)


def had(n):
    b = min(n & -n, 4096)
    h = np.array([[1.0]])
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    return np.kron(np.eye(n // b), h / np.sqrt(b))


def quant(x, step):
    return (np.clip(np.floor(x / step), -4, 3) + 0.5) * step


def ldlq(w, h, damp):
    w = w.copy()
    n = h.shape[0]
    h = h + damp * np.trace(h) / n * np.eye(n)
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: Hinv = U^T U
    step = 0.586 * np.sqrt((w * w).mean(axis=1, keepdims=True))[:, 0]
    q = np.zeros_like(w)
    for i in range(n):
        q[:, i] = quant(w[:, i], step)
        e = (w[:, i] - q[:, i]) / u[i, i]
        w[:, i + 1 :] -= np.outer(e, u[i, i + 1 :])
    return q


def rel(d, w, h):
    return ((d @ h) * d).sum() / ((w @ h) * w).sum()


print("layer", " ".join(f"cal@{d}/held@{d}" for d in damps), "plain(held)")
tot = np.zeros((len(damps), 2))
for p in layers:
    w = ws[p + ".weight"].astype(np.float64)
    r, c = w.shape
    su, sv = rng.choice([-1.0, 1.0], r), rng.choice([-1.0, 1.0], c)
    hr, hcl = had(r), had(c)
    wt = hr @ (su[:, None] * w * sv[None, :]) @ hcl.T
    tr = lambda h: hcl @ (sv[:, None] * h.astype(np.float64) * sv[None, :]) @ hcl.T
    h1, h2 = tr(hc[p + ".hessian"]), tr(hh[p + ".hessian"])
    out = []
    for j, d in enumerate(damps):
        q = ldlq(wt, h1, d)
        a, b = rel(q - wt, wt, h1), rel(q - wt, wt, h2)
        tot[j] += [a, b]
        out.append(f"{a:.5f}/{b:.5f}")
    step = 0.586 * np.sqrt((wt * wt).mean(axis=1, keepdims=True))
    out.append(f"{rel(quant(wt, step) - wt, wt, h2):.5f}")
    print(p, " ".join(out), flush=True)
print("mean", " ".join(f"{a / len(layers):.5f}/{b / len(layers):.5f}" for a, b in tot))
