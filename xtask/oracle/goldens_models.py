"""Tiny seeded models of the mixture-of-experts and hybrid rows, and mlx-lm 0.32.2's logits.

For each row below: build mlx-lm's own model class (`mlx_lm.models.<module>.Model`), seed its
random init, cast / quantize it, save it as an HF-style directory under
mlx-models/tests/models/<name>/ (config.json + model.safetensors), load it back with
mlx_lm.utils.load_model (so sanitize and the quantization predicate run exactly as for a
user), then record into mlx-models/tests/goldens/models_<name>.safetensors:
- `prefill`: logits for the prompt with fresh caches (`make_prompt_cache`); the prompt is
  long enough (40 tokens, top-2 routing = 80 pairs) for SwitchGLU's sorted path;
- `step<i>`: logits for each greedy token fed one at a time through the caches (the
  unsorted path);
- `full`: logits of one cache-less forward over prompt + generated tokens;
param `greedy` = the ids.
Run with `cargo xtask goldens models`.
"""

import importlib
import json
import os
import shutil
import zlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from golden import Golden

ATTN = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "rope_theta": 10000.0,
}

ROWS = {
    # name: (module, config overrides, dtype, (group_size, bits) or None)
    "qwen3_moe": (
        "qwen3_moe",
        {
            "num_hidden_layers": 3,
            "intermediate_size": 96,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
            "moe_intermediate_size": 32,
            "head_dim": 16,
            "tie_word_embeddings": False,
            "max_position_embeddings": 512,
            "norm_topk_prob": True,
        },
        "float32",
        None,
    ),
    "qwen3_moe_q4": (
        "qwen3_moe",
        {
            "intermediate_size": 96,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": 32,
            "head_dim": 16,
            "tie_word_embeddings": True,
            "max_position_embeddings": 512,
            "norm_topk_prob": False,
        },
        "float32",
        (32, 4),
    ),
    # Quantized experts under bf16 activations (gather_mm itself is float32-only on CPU).
    "qwen3_moe_q8_bf16": (
        "qwen3_moe",
        {
            "intermediate_size": 96,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": 32,
            "head_dim": 16,
            "tie_word_embeddings": False,
            "max_position_embeddings": 512,
            "norm_topk_prob": True,
        },
        "bfloat16",
        (32, 8),
    ),
    "qwen2_moe": (
        "qwen2_moe",
        {
            "intermediate_size": 96,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
        },
        "float32",
        None,
    ),
    "mixtral": (
        "mixtral",
        {"intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2},
        "float32",
        None,
    ),
    "olmoe": (
        "olmoe",
        {
            "intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "mlp_bias": True,
        },
        "float32",
        None,
    ),
    "olmoe_q8": (
        "olmoe",
        {
            "intermediate_size": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "tie_word_embeddings": False,
        },
        "float32",
        (64, 8),
    ),
    "gpt_oss": (
        "gpt_oss",
        {
            "num_hidden_layers": 4,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 32,
            "head_dim": 16,
            "sliding_window": 8,
        },
        "float32",
        None,
    ),
    "gpt_oss_q4": (
        "gpt_oss",
        {
            "num_hidden_layers": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "head_dim": 16,
            "sliding_window": 16,
        },
        "float32",
        (32, 4),
    ),
    "gpt_oss_q8_bf16": (
        "gpt_oss",
        {
            "num_hidden_layers": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "head_dim": 16,
            "sliding_window": 16,
        },
        "bfloat16",
        (64, 8),
    ),
}

HYBRID = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "intermediate_size": 64,
    "head_dim": 8,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}

ROWS.update(
    {
        "qwen3_next": (
            "qwen3_next",
            {
                **HYBRID,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [1],
                "shared_expert_intermediate_size": 16,
                "moe_intermediate_size": 16,
                "partial_rotary_factor": 0.5,
                "norm_topk_prob": True,
            },
            "float32",
            None,
        ),
        "qwen3_5": (
            "qwen3_5",
            {
                **HYBRID,
                "tie_word_embeddings": True,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [1, 1, 0],
                },
            },
            "float32",
            None,
        ),
        "qwen3_5_bf16": (
            "qwen3_5",
            {**HYBRID, "linear_num_key_heads": 4},
            "bfloat16",
            None,
        ),
        "qwen3_5_q4": ("qwen3_5", {**HYBRID}, "float32", (32, 4)),
        "qwen3_5_moe": (
            "qwen3_5_moe",
            {
                **HYBRID,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "shared_expert_intermediate_size": 16,
                "moe_intermediate_size": 16,
            },
            "float32",
            None,
        ),
        "lfm2": (
            "lfm2",
            {
                "hidden_size": 32,
                "num_hidden_layers": 4,
                "max_position_embeddings": 512,
                "norm_eps": 1e-5,
                "conv_bias": True,
                "conv_L_cache": 3,
                "block_dim": 32,
                "block_multiple_of": 16,
                "block_ffn_dim_multiplier": 1.0,
                "block_auto_adjust_ff_dim": True,
                "block_ff_dim": 96,
                "layer_types": ["conv", "full_attention", "conv", "full_attention"],
            },
            "float32",
            None,
        ),
        "lfm2_bf16": (
            "lfm2",
            {
                "hidden_size": 32,
                "num_hidden_layers": 3,
                "max_position_embeddings": 512,
                "norm_eps": 1e-5,
                "conv_bias": False,
                "conv_L_cache": 4,
                "block_dim": 32,
                "block_multiple_of": 16,
                "block_ffn_dim_multiplier": None,
                "block_auto_adjust_ff_dim": False,
                "intermediate_size": 48,
                "full_attn_idxs": [2],
            },
            "bfloat16",
            None,
        ),
        "gemma4_text": (
            "gemma4_text",
            {
                "hidden_size": 32,
                "num_hidden_layers": 4,
                "intermediate_size": 32,
                "num_attention_heads": 2,
                "head_dim": 8,
                "global_head_dim": 16,
                "num_key_value_heads": 1,
                "num_kv_shared_layers": 2,
                "hidden_size_per_layer_input": 8,
                "vocab_size_per_layer_input": 128,
                "sliding_window": 8,
                "sliding_window_pattern": 2,
                "max_position_embeddings": 512,
                "enable_moe_block": True,
                "num_experts": 4,
                "top_k_experts": 2,
                "moe_intermediate_size": 16,
            },
            "float32",
            None,
        ),
        "gemma4_text_bf16": (
            "gemma4_text",
            {
                "hidden_size": 32,
                "num_hidden_layers": 4,
                "intermediate_size": 32,
                "num_attention_heads": 2,
                "head_dim": 8,
                "global_head_dim": 16,
                "num_key_value_heads": 1,
                "num_kv_shared_layers": 2,
                "hidden_size_per_layer_input": 8,
                "vocab_size_per_layer_input": 128,
                "sliding_window": 8,
                "sliding_window_pattern": 2,
                "max_position_embeddings": 512,
            },
            "bfloat16",
            None,
        ),
        "gemma4_text_kv_eq": (
            "gemma4_text",
            {
                "hidden_size": 32,
                "num_hidden_layers": 4,
                "intermediate_size": 32,
                "num_attention_heads": 2,
                "head_dim": 8,
                "global_head_dim": 16,
                "num_key_value_heads": 1,
                "num_global_key_value_heads": 2,
                "attention_k_eq_v": True,
                "num_kv_shared_layers": 1,
                "hidden_size_per_layer_input": 0,
                "sliding_window": 8,
                "sliding_window_pattern": 2,
                "max_position_embeddings": 512,
                "final_logit_softcapping": 10.0,
                "tie_word_embeddings": False,
            },
            "float32",
            None,
        ),
    }
)

# Rows whose prompt is also prefilled in chunks, evaluating the cache state after each chunk
# as mlx-lm's generate_step does (`chunk<i>` cases, then the same decode steps).
CHUNKED = {
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_bf16",
    "qwen3_5_q4",
    "qwen3_5_moe",
    "lfm2",
    "lfm2_bf16",
}
CHUNKS = [16, 16, 8]

# Rows that also record sentence embeddings (`embed` case: inputs are the token sequences,
# the output their float32 L2-normalised last-token hidden states, stacked): the hidden states
# from mlx-lm's inner model (`model.model`), pooled and normalised as sentence-transformers
# does for Qwen3-Embedding (`F.normalize`: x / max(||x||, 1e-12)).
EMBED = {"qwen3_moe", "qwen3_5", "lfm2", "gemma4_text"}
EMBED_TEXTS = [[5, 17, 33, 2, 90], [1, 2, 3, 4, 5, 6, 7, 8, 127]]

PROMPT = [(7 * i + 3) % 128 for i in range(40)]
STEPS = 6

for name, (module, overrides, dtype, quant) in ROWS.items():
    config = {"model_type": module, **ATTN, **overrides}
    arch = importlib.import_module(f"mlx_lm.models.{module}")
    mx.random.seed(zlib.crc32(name.encode()))  # stable per row, whatever the row order
    model = arch.Model(arch.ModelArgs.from_dict(config))
    # A wider init than the default so logits and routing are not all near zero.
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    if quant is not None:
        gs, bits = quant
        nn.quantize(model, group_size=gs, bits=bits)
        config["quantization"] = {"group_size": gs, "bits": bits}
    mx.eval(model.parameters())
    out_dir = f"mlx-models/tests/models/{name}"
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    mx.save_safetensors(f"{out_dir}/model.safetensors", dict(tree_flatten(model.parameters())))
    with open(f"{out_dir}/config.json", "w") as f:
        json.dump(config, f, indent=2)

    model, _ = load_model(Path(out_dir))
    g = Golden(f"mlx-models/tests/goldens/models_{name}.safetensors", __file__)
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT], dtype=mx.int32)
    logits = model(ids, cache=cache)
    g.case("prefill", "forward", [ids], logits)
    greedy = []
    for s in range(STEPS):
        nxt = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)
        greedy.append(nxt.item())
        ids = nxt[:, None]
        logits = model(ids, cache=cache)
        g.case(f"step{s}", "forward", [ids], logits)
    if name in CHUNKED:
        cache = make_prompt_cache(model)
        start = 0
        for c, n in enumerate(CHUNKS):
            ids = mx.array([PROMPT[start : start + n]], dtype=mx.int32)
            logits = model(ids, cache=cache)
            mx.eval([c.state for c in cache])
            g.case(f"chunk{c}", "forward", [ids], logits)
            start += n
        assert start == len(PROMPT)
        for s, t in enumerate(greedy):
            ids = mx.array([[t]], dtype=mx.int32)
            g.case(f"chunkstep{s}", "forward", [ids], model(ids, cache=cache))
    if name in EMBED:
        rows, inputs = [], []
        for text in EMBED_TEXTS:
            ids = mx.array([text], dtype=mx.int32)
            x = model.model(ids)[:, -1, :].astype(mx.float32)
            norm = mx.sqrt(mx.sum(x * x, axis=-1, keepdims=True))
            rows.append(x / mx.maximum(norm, 1e-12))
            inputs.append(ids)
        g.case("embed", "embed", inputs, mx.concatenate(rows, axis=0))
    full_ids = mx.array([PROMPT + greedy], dtype=mx.int32)
    g.case("full", "forward_nocache", [full_ids], model(full_ids))
    g.meta["greedy"] = ",".join(map(str, greedy))
    g.save()
