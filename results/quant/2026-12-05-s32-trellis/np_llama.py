"""A numpy float32 forward of mlx-lm's llama (models/llama.py: RMSNorm, non-traditional RoPE,
GQA causal attention, SwiGLU, tied head) for scoring whole-model losses (s32). MLX's float32
CPU matmul ran at ~4.6 GFLOP per CPU-second on this loaded machine against numpy/OpenBLAS's
~86, so the greedy choice's forwards run here; `check` compares its logits with mlx-lm's."""
import json

import numpy as np

LIN = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


class Llama:
    def __init__(self, cfg, tensors):
        self.c = cfg
        self.nl = cfg["num_hidden_layers"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg["hidden_size"] // self.nh
        self.eps = np.float32(cfg["rms_norm_eps"])
        f = lambda k: np.ascontiguousarray(tensors[k].astype(np.float32))
        self.norm = f("model.norm.weight")
        self.ln1 = [f(f"model.layers.{l}.input_layernorm.weight") for l in range(self.nl)]
        self.ln2 = [f(f"model.layers.{l}.post_attention_layernorm.weight") for l in range(self.nl)]
        # linear weights transposed (in, out) for x @ W
        self.w = [{n: f(f"model.layers.{l}.{n}.weight").T.copy() for n in LIN} for l in range(self.nl)]
        self.embed = None

    def set_linear(self, l, n, w):
        self.w[l][n] = np.ascontiguousarray(np.asarray(w, dtype=np.float32).T)

    def rms(self, x, w):
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps)) * w

    def rope(self, x):  # x (B, H, T, D), non-traditional
        t = x.shape[2]
        d = self.hd
        inv = (self.c["rope_theta"] ** (-np.arange(0, d, 2, dtype=np.float32) / d)).astype(np.float32)
        ang = np.arange(t, dtype=np.float32)[:, None] * inv[None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def block(self, l, h):
        b, t, _ = h.shape
        w = self.w[l]
        x = self.rms(h, self.ln1[l])
        q = (x @ w["self_attn.q_proj"]).reshape(b, t, self.nh, self.hd).transpose(0, 2, 1, 3)
        k = (x @ w["self_attn.k_proj"]).reshape(b, t, self.nkv, self.hd).transpose(0, 2, 1, 3)
        v = (x @ w["self_attn.v_proj"]).reshape(b, t, self.nkv, self.hd).transpose(0, 2, 1, 3)
        q, k = self.rope(q), self.rope(k)
        rep = self.nh // self.nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = (q @ k.transpose(0, 1, 3, 2)) * np.float32(self.hd ** -0.5)
        s = s + np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        p = s / s.sum(-1, keepdims=True)
        o = (p @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        h = h + o @ w["self_attn.o_proj"]
        x = self.rms(h, self.ln2[l])
        g = x @ w["mlp.gate_proj"]
        g = g / (1 + np.exp(-g))
        return h + (g * (x @ w["mlp.up_proj"])) @ w["mlp.down_proj"]

    def embed_ids(self, ids):
        return self.embed[ids]

    def logits(self, h):
        return self.rms(h, self.norm) @ self.embed.T

    def loss_from(self, l, h, targets):
        for j in range(l, self.nl):
            h = self.block(j, h)
        tot = 0.0
        for i in range(h.shape[0]):  # a row at a time: (T, vocab) logits
            z = self.logits(h[i])
            m = z.max(-1, keepdims=True)
            lse = (m[:, 0] + np.log(np.exp(z - m).sum(-1)))
            tot += float((lse - z[np.arange(z.shape[0]), targets[i]]).astype(np.float64).sum())
        return tot / targets.size


def check(src):
    """numpy forward vs mlx-lm's on 48 tokens of the float source: max |logit diff|."""
    import mlx.core as mx
    from mlx_lm.utils import load
    from safetensors.numpy import load_file
    cfg = json.load(open(f"{src}/config.json"))
    m = Llama(cfg, load_file(f"{src}/model.safetensors"))
    m.embed = load_file(f"{src}/model.safetensors")["model.embed_tokens.weight"].astype(np.float32)
    ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], (2, 48))
    h = m.embed_ids(ids)
    for l in range(m.nl):
        h = m.block(l, h)
    a = m.logits(h)
    model, _ = load(src)
    model.set_dtype(mx.float32)
    b = np.array(model(mx.array(ids)))
    print("max |numpy - mlx-lm| logits", float(np.abs(a - b).max()), "max |logit|", float(np.abs(b).max()))


if __name__ == "__main__":
    import sys
    check(sys.argv[1])
