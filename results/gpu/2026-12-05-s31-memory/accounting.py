"""What the graph decoder holds beyond the loaded model (issue #30's peak memory), from the
shapes and `GraphDecoder::with_options`' allocations: on main before session 30 (every weight
copied and re-laid), after session 30 (plain-layout weights read in MLX's buffers) and after
session 31 (the kernels read MLX's own layouts: every weight read in MLX's buffers). Expected
peaks: mlx-lm's measured peak (results/gpu/2026-12-05-s30-h100, H100, 512-token prompt, 128
tokens) plus what the decoder adds. Run: python3 accounting.py"""

MODELS = {
    # name: hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied, moe (experts, moe_i) or None,
    #       bits, q/k norms, q/k/v bias, mlx-lm's peak (GB; None: not measured)
    "Qwen3-8B 4-bit": (4096, 36, 32, 8, 128, 12288, 151936, False, None, 4, True, False, 6.30),
    "Llama-3.1-8B 4-bit": (4096, 32, 32, 8, 128, 14336, 128256, False, None, 4, False, False, None),
    "Qwen3-30B-A3B-shaped 4-bit": (2048, 48, 32, 4, 128, 0, 151936, False, (128, 768), 4, True, False, 19.56),
    "SmolLM2-135M bf16": (576, 30, 9, 3, 64, 1536, 49152, True, None, 16, False, False, 0.333),
}
PROMPT, GEN = 512, 128


def lin(n, k, bits, gs=64):
    """(words bytes, scales + biases bytes) of an n x k linear."""
    if bits == 16:
        return n * k * 2, 0
    return n * k * bits // 8, n * (k // gs) * 4


# Where each kind of weight is read: "copy" (a copy beside MLX's), "mlx" (MLX's own buffer).
STAGES = ("main (s29)", "after s30", "after s31")
KINDS = {
    "embed words": ("copy", "mlx", "mlx"),
    "head words": ("copy", "mlx", "mlx"),
    "o words": ("copy", "mlx", "mlx"),
    "down words": ("copy", "mlx", "mlx"),
    "router": ("copy", "mlx", "mlx"),
    "gate/up words": ("copy", "copy", "mlx"),
    "q/k/v words": ("copy", "copy", "mlx"),
    "scales and biases": ("copy", "copy", "mlx"),
}

for name, (h, L, nh, nkv, d, inter, vocab, tied, moe, bits, qkn, qkb, mlxlm) in MODELS.items():
    w = {k: 0 for k in KINDS}

    def add(kind, words, sb):
        w[kind] += words
        w["scales and biases"] += sb

    add("embed words", *lin(vocab, h, bits))
    if not tied:
        add("head words", *lin(vocab, h, bits))
    for _ in range(L):
        add("q/k/v words", *lin((nh + 2 * nkv) * d, h, bits))
        add("o words", *lin(h, nh * d, bits))
        if moe:
            e, mi = moe
            add("gate/up words", *lin(2 * e * mi, h, bits))
            add("down words", *lin(e * h, mi, bits))
            words, sb = lin(e, h, 8)
            add("router", words + sb, 0)
        else:
            add("gate/up words", *lin(2 * inter, h, bits))
            add("down words", *lin(h, inter, bits))
    # Always the decoder's own: the KV cache (sized to the run), the norms' weights, the q/k/v
    # bias (paired as the rows), the step's buffers (logits and the logit bias, float32 vocab).
    cap = -(-(PROMPT + GEN + 2) // 64) * 64
    own = {
        f"KV cache ({cap} positions)": 2 * L * nkv * cap * d * 2,
        "norm weights": L * 2 * h * 2 + h * 2 + (L * 2 * d * 2 if qkn else 0),
        "q/k/v bias": L * (nh + 2 * nkv) * d * 2 if qkb else 0,
        "step buffers (logits, logit bias, activations)": 2 * vocab * 4 + 8 * max(h, 2 * inter) * 2,
    }
    print(f"## {name}")
    for k in sorted(w, key=lambda k: -w[k]):
        print(f"  {k:48s} {w[k] / 1e9:7.3f} GB  {' / '.join(KINDS[k])}")
    for k, v in own.items():
        print(f"  {k:48s} {v / 1e9:7.3f} GB  (the decoder's own)")
    extra = sum(own.values())
    for i, stage in enumerate(STAGES):
        copied = sum(v for k, v in w.items() if KINDS[k][i] == "copy")
        total = copied + extra
        peak = f"; expected peak {mlxlm + total / 1e9:.2f} GB against mlx-lm's {mlxlm:.2f} " \
               f"({(mlxlm + total / 1e9) / mlxlm:.3f}x)" if mlxlm else ""
        print(f"  {stage:12s} weights copied {copied / 1e9:6.2f} GB, beyond the model "
              f"{total / 1e9:6.2f} GB{peak}")
