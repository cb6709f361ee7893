"""The same Hessians as trellis_hessians.py (H = X^T X / n of every decoder linear's input over
calibration text, keys `<linear path>.hessian`, float32 (in, in)), for llama-family float
models, with the forward and the X^T X products in numpy (OpenBLAS) instead of MLX's CPU
matmul, which runs at ~3 GFLOP/s on this CPU (36k tokens of SmolLM2-135M: >20 CPU-minutes
there). The weights and tokenizer still come from mlx-lm's `load`; the forward is mlx-lm's
llama (RMSNorm, non-traditional RoPE, GQA causal attention, SwiGLU) written in numpy float32,
so values differ from the MLX forward by float rounding only (`--check N` compares the
Hessians of the first N tokens with trellis_hessians.py's MLX forward).

    python trellis_hessians_np.py F32_DIR CALIB.txt[,MORE.txt...] OUT.safetensors [--seq 512]
        [--max-tokens N] [--check N]
"""
import argparse
import time

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("text")
p.add_argument("out")
p.add_argument("--seq", type=int, default=512)
p.add_argument("--max-tokens", type=int, default=0)
p.add_argument("--check", type=int, default=0)
a = p.parse_args()

model, tok = load(a.model)
args = model.args
rows, left = [], a.max_tokens or None
for path in a.text.split(","):
    ids = tok.encode(open(path).read())
    if left is not None:
        ids, left = ids[:left], left - len(ids[:left])
    rows += [ids[s : s + a.seq] for s in range(0, len(ids), a.seq)]
if a.check:
    rows = [rows[0][: a.check]]


def f32(x):
    return np.array(x.astype(mx.float32))


emb = f32(model.model.embed_tokens.weight)
eps = args.rms_norm_eps
nh, nkv = args.num_attention_heads, args.num_key_value_heads
hd = getattr(args, "head_dim", None) or args.hidden_size // nh
theta = args.rope_theta
L = []
for layer in model.model.layers:
    at, ml = layer.self_attn, layer.mlp
    L.append(
        dict(
            n1=f32(layer.input_layernorm.weight),
            n2=f32(layer.post_attention_layernorm.weight),
            q=f32(at.q_proj.weight).T.copy(),
            k=f32(at.k_proj.weight).T.copy(),
            v=f32(at.v_proj.weight).T.copy(),
            o=f32(at.o_proj.weight).T.copy(),
            g=f32(ml.gate_proj.weight).T.copy(),
            u=f32(ml.up_proj.weight).T.copy(),
            d=f32(ml.down_proj.weight).T.copy(),
        )
    )
assert not getattr(args, "attention_bias", False) and not getattr(args, "mlp_bias", False)
assert getattr(args, "rope_scaling", None) is None


def rms(x, w):
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def rope(x, n):
    half = hd // 2
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float32) / hd)
    ang = np.arange(n, dtype=np.float32)[:, None] * inv[None]
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


sums, counts = {}, {}


def tap(i, names, x):
    h = x.T @ x
    for nm in names:
        k = f"model.layers.{i}.{nm}"
        sums[k] = sums[k] + h.astype(np.float64) if k in sums else h.astype(np.float64)
        counts[k] = counts.get(k, 0) + x.shape[0]


t0 = time.time()
for r in rows:
    n = len(r)
    x = emb[np.array(r)]
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    for i, w in enumerate(L):
        h = rms(x, w["n1"])
        tap(i, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), h)
        q = rope((h @ w["q"]).reshape(n, nh, hd).transpose(1, 0, 2), n)
        k = rope((h @ w["k"]).reshape(n, nkv, hd).transpose(1, 0, 2), n)
        v = (h @ w["v"]).reshape(n, nkv, hd).transpose(1, 0, 2)
        k = np.repeat(k, nh // nkv, axis=0)
        v = np.repeat(v, nh // nkv, axis=0)
        s = q @ k.transpose(0, 2, 1) * hd**-0.5 + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        o = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, nh * hd)
        tap(i, ("self_attn.o_proj",), o)
        x = x + o @ w["o"]
        h = rms(x, w["n2"])
        tap(i, ("mlp.gate_proj", "mlp.up_proj"), h)
        g = h @ w["g"]
        m = (g / (1 + np.exp(-g))) * (h @ w["u"])
        tap(i, ("mlp.down_proj",), m)
        x = x + m @ w["d"]
res = {k + ".hessian": mx.array((v / counts[k]).astype(np.float32)) for k, v in sums.items()}
if a.check:
    import subprocess, sys, os, tempfile

    ref = os.path.join(tempfile.mkdtemp(), "ref.safetensors")
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "trellis_hessians.py"), a.model, a.text,
                    ref, "--max-tokens", str(a.check)], check=True)
    r = mx.load(ref)
    worst = max(float(mx.max(mx.abs(res[k] - r[k])) / mx.max(mx.abs(r[k]))) for k in r)
    print(f"largest difference against the MLX forward, relative to each Hessian's largest: {worst:.3g}")
mx.save_safetensors(a.out, res)
print(f"{sum(map(len, rows))} tokens in {len(rows)} rows, {len(res)} Hessians -> {a.out} "
      f"({time.time() - t0:.0f} s)")
