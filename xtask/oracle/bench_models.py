"""Seeded random checkpoints for `cargo xtask bench`, written once as HF-style directories
(config.json + model.safetensors) by mlx-lm 0.32.2's own model classes (llama; gemma3_text for
Gemma 3 270M's shape).

    python bench_models.py OUT_DIR NAME [NAME ...]

Each NAME is one of MODELS below. A directory that already holds a complete model (its
`config.json` is written last) is left alone, so this is cheap to call before every bench run.
The shapes are those of a ~0.5B llama (Qwen2.5-0.5B-like widths with a 32k vocabulary): big
enough that the matmuls dominate, small enough for a 2-core CPU.
"""

import importlib
import json
import os
import shutil
import sys
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

BASE_0_5B = {
    "model_type": "llama",
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-05,
    "vocab_size": 32000,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

# SmolLM2-135M's shape (its config.json), for machines where the GGUF cannot be fetched.
BASE_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "vocab_size": 49152,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}

# A small llama for `cargo xtask bench train` on a 2-core CPU (16 layers, so LoRA on 16 layers
# as on the GPU).
BASE_SMALL = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 16,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "vocab_size": 32000,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

# Llama-3-8B's shape (the QLoRA figures of issue 16), for the GPU.
BASE_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}

# Llama-3.1-8B's shape: Llama 3's with its llama3 RoPE scaling (the graph decoder's target).
BASE_8B_31 = dict(
    BASE_8B,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)

# Gemma 3 270M's shape (gemma3_text: 18 layers, head_dim 256, one KV head, sliding window 512
# every layer but each sixth, a 262k vocabulary, tied embeddings), for full fine-tuning on the
# CPU.
BASE_GEMMA3_270M = {
    "model_type": "gemma3_text",
    "hidden_size": 640,
    "num_hidden_layers": 18,
    "intermediate_size": 2048,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "vocab_size": 262144,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 32768,
}

# Gemma 3 1B's widths (26 layers, hidden 1,152, one KV head, window 512 on five layers of six,
# a 262k vocabulary, tied) with heads of 128 instead of 256 (4 x 128 = 512 query rows, not
# 1,024): a gemma3_text row the GPU graph decoder takes (its heads are at most 128).
BASE_GEMMA3_1B_H128 = dict(
    BASE_GEMMA3_270M,
    hidden_size=1152,
    num_hidden_layers=26,
    intermediate_size=6912,
    head_dim=128,
    query_pre_attn_scalar=256,
)

# Qwen3-8B's shape (36 layers, hidden 4,096, 32 heads of 128 over 8 KV heads, per-head q/k
# norms, intermediate 12,288, a 151,936-token vocabulary, untied), for the GPU.
BASE_QWEN3_8B = {
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-06,
    "vocab_size": 151936,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
}

# Qwen3-30B-A3B's shape (qwen3_moe: 48 layers, hidden 2,048, 32 heads of 128 over 4 KV heads,
# 128 experts of intermediate 768, 8 a token, a 151,936-token vocabulary, untied), for the GPU's
# MoE row.
BASE_QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "intermediate_size": 6144,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-06,
    "vocab_size": 151936,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
}
# SmolLM2-135M's shape with Llama 3's 128,256-token vocabulary: a draft model for the 8B-shaped
# targets (draft and target share a vocabulary).
BASE_135M_V128K = dict(BASE_135M, vocab_size=128256)

# name -> (config, dtype, (group_size, bits) or None, direct)
# `direct`: the quantized tensors are drawn as they are stored (uniform 4-bit codes, scales and
# biases giving weights of mean 0 and standard deviation 0.02), never as float weights that
# are then quantized: the 8B model is written in seconds (the float path took minutes).
MODELS = {
    "llama-0.5b-f32": (BASE_0_5B, "float32", None, False),
    "llama-0.5b-q4": (BASE_0_5B, "float32", (64, 4), False),
    "llama-0.5b-bf16": (BASE_0_5B, "bfloat16", None, False),
    "llama-135m-bf16": (BASE_135M, "bfloat16", None, False),
    "llama-135m-q4": (BASE_135M, "bfloat16", (64, 4), False),
    "llama-small-f32": (BASE_SMALL, "float32", None, False),
    "gemma3-270m-f32": (BASE_GEMMA3_270M, "float32", None, False),
    "gemma3-1b-h128-bf16": (BASE_GEMMA3_1B_H128, "bfloat16", None, False),
    "llama-8b-q4": (BASE_8B, "bfloat16", (64, 4), True),
    "llama31-8b-q4": (BASE_8B_31, "bfloat16", (64, 4), True),
    "qwen3-8b-q4": (BASE_QWEN3_8B, "bfloat16", (64, 4), True),
    "gemma3-1b-h128-q4": (BASE_GEMMA3_1B_H128, "bfloat16", (64, 4), False),
    "llama-8b-q8": (BASE_8B, "bfloat16", (64, 8), False),
    "llama-8b-bf16": (BASE_8B, "bfloat16", None, False),
    "qwen3-30b-a3b-q4": (BASE_QWEN3_30B_A3B, "bfloat16", (64, 4), True),
    "llama-135m-v128k-bf16": (BASE_135M_V128K, "bfloat16", None, False),
    # Echo models: every attention and MLP output projection zero, every norm one and the head
    # equal to the embedding, so the residual stream is the token's embedding and greedy decoding
    # repeats the last prompt token. A target and a draft of this kind agree on every token: the
    # forced acceptance pattern of the draft-model speculation bench (weights are random; the
    # step costs what the plain model's does, the projections are still read and multiplied).
    "echo-llama31-8b-q4": (BASE_8B_31, "bfloat16", (64, 4), True),
    "echo-llama-135m-v128k-bf16": (BASE_135M_V128K, "bfloat16", None, False),
    # Successor models: as echo, with the head row of token j the embedding of j - 1, so greedy
    # decoding counts up from the last prompt token. The draft `succ5-` has the head rows of the
    # tokens divisible by 5 negated: it never proposes those, so each run of accepted drafts
    # ends before the next multiple of 5 (a fixed acceptance pattern between all and none).
    "succ-llama31-8b-q4": (BASE_8B_31, "bfloat16", (64, 4), True),
    "succ5-llama-135m-v128k-bf16": (
        dict(BASE_135M_V128K, tie_word_embeddings=False),
        "bfloat16",
        None,
        False,
    ),
}

ZERO_OUT = (".self_attn.o_proj.", ".mlp.down_proj.")


def echo(params, shift=0, break_mod=0):
    """The echo model's tensors (see MODELS): zero output projections (codes kept, scales and
    biases zero when quantized), norms one, the head (its codes, scales and biases) the
    embedding's, its rows moved down by `shift` (row j the embedding's row j - shift) and, with
    `break_mod`, the rows of the tokens divisible by it negated (bfloat16 heads only)."""
    out = {}
    for k, v in params.items():
        if any(z in k for z in ZERO_OUT) and v.dtype != mx.uint32:
            v = mx.zeros(v.shape, dtype=v.dtype)
        elif k.endswith("norm.weight"):
            v = mx.ones(v.shape, dtype=v.dtype)
        out[k] = v
    for k in list(out):
        if k.startswith("lm_head."):
            v = out["model.embed_tokens." + k[len("lm_head."):]]
            if shift:
                v = mx.roll(v, shift, axis=0)
            if break_mod:
                rows = (mx.arange(v.shape[0]) % break_mod == 0)[:, None]
                v = mx.where(rows, -v, v)
            out[k] = v
    return out


def head_pattern(name):
    """echo() arguments for a model name: echo- (repeat), succ- (count up), succN- (count up,
    never proposing multiples of N)."""
    kind = name.split("-")[0]
    if kind == "echo":
        return {}
    n = kind[len("succ"):]
    return {"shift": 1, "break_mod": int(n) if n else 0}


def direct_params(model, dtype, gs, bits):
    """The quantized model's tensors drawn directly: uniform codes q in [0, 2^bits), weight =
    scale * q + bias with scale = 0.02 / std(q) and bias = -scale * mean(q); other tensors
    normal * 0.02. Only the shapes of `model`'s (lazy) parameters are used."""
    levels = 2**bits
    scale = 0.02 / (((levels**2 - 1) / 12) ** 0.5)
    out = {}
    for k, v in tree_flatten(model.parameters()):
        if v.dtype == mx.uint32:
            lo, hi = (mx.random.randint(0, 2**16, v.shape).astype(mx.uint32) for _ in "lh")
            out[k] = lo | (hi << 16)
        elif k.endswith(".scales"):
            out[k] = mx.full(v.shape, scale, dtype=dtype)
        elif k.endswith(".biases"):
            out[k] = mx.full(v.shape, -scale * (levels - 1) / 2, dtype=dtype)
        else:
            out[k] = (mx.random.normal(v.shape) * 0.02).astype(dtype)
    return out


def write(out_root, name):
    config, dtype, quant, direct = MODELS[name]
    config = dict(config)
    out_dir = os.path.join(out_root, name)
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        print(f"bench model {out_dir}: present", file=sys.stderr)
        return
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    t0 = time.perf_counter()
    mx.random.seed(7)
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    if direct:
        gs, bits = quant
        nn.quantize(model, group_size=gs, bits=bits)
        config["quantization"] = {"group_size": gs, "bits": bits}
        params = direct_params(model, getattr(mx, dtype), gs, bits)
        if name.split("-")[0].startswith(("echo", "succ")):
            params = echo(params, **head_pattern(name))
        n = sum(v.size * (32 // bits if v.dtype == mx.uint32 else 1) for v in params.values())
        mx.eval(params)
        mx.save_safetensors(os.path.join(out_dir, "model.safetensors"), params)
        finish(out_dir, config, n, t0)
        return
    # Small normal weights (norms included) keep activations and logits in a sane range.
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.02, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    n = sum(v.size for _, v in tree_flatten(model.parameters()))
    if quant is not None:
        gs, bits = quant
        nn.quantize(model, group_size=gs, bits=bits)
        config["quantization"] = {"group_size": gs, "bits": bits}
    mx.eval(model.parameters())
    params = dict(tree_flatten(model.parameters()))
    if config["model_type"] == "gemma3_text":
        # Tied, as Gemma 3's checkpoints (quantized: its scales and biases too).
        params = {k: v for k, v in params.items() if not k.startswith("lm_head.")}
    if name.split("-")[0].startswith(("echo", "succ")):
        params = echo(params, **head_pattern(name))
    mx.save_safetensors(os.path.join(out_dir, "model.safetensors"), params)
    finish(out_dir, config, n, t0)


def finish(out_dir, config, n, t0):
    # config.json last: its presence marks a complete model.
    with open(os.path.join(out_dir, "config.json.part"), "w") as f:
        json.dump(config, f, indent=2)
    os.replace(os.path.join(out_dir, "config.json.part"), os.path.join(out_dir, "config.json"))
    print(
        f"bench model {out_dir}: written ({n / 1e6:.0f}M parameters) in "
        f"{time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )


def main():
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR NAME [NAME ...]; names: {list(MODELS)}")
    for name in sys.argv[2:]:
        if name not in MODELS:
            sys.exit(f"unknown bench model {name!r}; names: {list(MODELS)}")
        write(sys.argv[1], name)


main()
