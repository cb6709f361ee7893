"""What the graph decoder allocates beyond the loaded model (issue #30's peak memory), from the
shapes and `GraphDecoder::with_options`' allocations, before and after session 30's change
(plain-layout weights read in MLX's own buffers). Run: python3 accounting.py"""

MODELS = {
    # name: hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied, moe (experts, moe_i) or None, bits, bf16
    "Qwen3-8B 4-bit": (4096, 36, 32, 8, 128, 12288, 151936, False, None, 4),
    "Llama-3.1-8B 4-bit": (4096, 32, 32, 8, 128, 14336, 128256, False, None, 4),
    "Qwen3-30B-A3B-shaped 4-bit": (2048, 48, 32, 4, 128, 0, 151936, False, (128, 768), 4),
    "SmolLM2-135M bf16": (576, 30, 9, 3, 64, 1536, 49152, True, None, 16),
}
PROMPT, GEN = 512, 128


def lin(n, k, bits, gs=64):
    """(words bytes, packed scales+biases bytes) of an n x k linear."""
    if bits == 16:
        return n * k * 2, 0
    return n * k * bits // 8, n * (k // gs) * 4


for name, (h, L, nh, nkv, d, inter, vocab, tied, moe, bits) in MODELS.items():
    parts = {}  # kind: (bytes, borrowed after the change)

    def add(kind, nbytes, borrowed):
        b, s = parts.get(kind, (0, borrowed))
        parts[kind] = (b + nbytes, borrowed)

    w, sb = lin(vocab, h, bits)
    add("embed words", w, True)
    add("scales+biases (packed: a copy)", sb, False)
    if not tied:
        add("head words", w, True)
        add("scales+biases (packed: a copy)", sb, False)
    for _ in range(L):
        w, sb = lin((nh + 2 * nkv) * d, h, bits)
        add("q/k/v words (concatenated, RoPE-paired: a copy)", w, False)
        add("scales+biases (packed: a copy)", sb, False)
        w, sb = lin(h, nh * d, bits)
        add("o words", w, True)
        add("scales+biases (packed: a copy)", sb, False)
        if moe:
            e, mi = moe
            w, sb = lin(2 * e * mi, h, bits)
            add("gate/up words (interleaved: a copy)", w, False)
            add("scales+biases (packed: a copy)", sb, False)
            w, sb = lin(e * h, mi, bits)
            add("down words", w, True)
            add("scales+biases (packed: a copy)", sb, False)
            w, sb = lin(e, h, 8)
            add("router (8-bit)", w + sb, True)
        else:
            w, sb = lin(2 * inter, h, bits)
            add("gate/up words (interleaved: a copy)", w, False)
            add("scales+biases (packed: a copy)", sb, False)
            w, sb = lin(h, inter, bits)
            add("down words", w, True)
            add("scales+biases (packed: a copy)", sb, False)
    cap = -(-(PROMPT + GEN + 2) // 64) * 64
    add(f"KV cache ({cap} positions)", 2 * L * nkv * cap * d * 2, False)
    add("logits, logit bias (float32, vocab)", 2 * vocab * 4, False)
    before = sum(b for b, _ in parts.values())
    after = sum(b for b, bor in parts.values() if not bor)
    print(f"## {name}")
    for k, (b, bor) in sorted(parts.items(), key=lambda x: -x[1][0]):
        print(f"  {k:52s} {b / 1e9:7.3f} GB{'  -> read in place' if bor else ''}")
    print(f"  beyond the model before: {before / 1e9:.2f} GB; after: {after / 1e9:.2f} GB")
