"""Tiny seeded models of every model_type the dense descriptor table serves, and mlx-lm
0.32.2's logits on them, through mlx-lm's own model classes.

For each row of CASES: build `mlx_lm.models.<module>.Model(ModelArgs.from_dict(config))`,
seed its random init (normal * 0.3), cast / quantize it, save it as an HF-style directory
under mlx-models/tests/models/dense/<name>/ (config.json + model.safetensors), load it back
with mlx_lm.utils.load_model (so sanitize and the quantization predicate run as for a user),
then record into mlx-models/tests/goldens/dense/<name>.safetensors:
- `prefill`: logits for the prompt with a fresh `make_prompt_cache` cache;
- `step<i>`: logits for each greedy token fed one at a time through the cache;
- `full`: logits of one cache-less forward over prompt + generated tokens;
(metadata `greedy` = the ids). Run with `cargo xtask goldens dense`.
"""

import importlib
import json
import sys
import types
import os
import pathlib
import shutil

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from golden import Golden

# mlx_lm/models/olmo.py exits unless `hf_olmo` imports; it is only an availability probe (the
# model is mlx-lm's own), so an empty module stands in for it.
sys.modules.setdefault("hf_olmo", types.ModuleType("hf_olmo"))

# Shared tiny shape: hidden 32, 4 heads of 8 (2 KV heads), 2 layers, vocab 96.
BASE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 96,
}

# name: (model_type, overrides, dtype, (group_size, bits) or None)
CASES = {
    "qwen2": ("qwen2", {"tie_word_embeddings": False}, "float32", None),
    "qwen2_q4": ("qwen2", {}, "float32", (32, 4)),
    "qwen3": (
        "qwen3",
        {"head_dim": 16, "max_position_embeddings": 512, "tie_word_embeddings": True, "rope_theta": 1000000},
        "float32",
        None,
    ),
    "qwen3_bf16": (
        "qwen3",
        {"head_dim": 8, "max_position_embeddings": 512, "tie_word_embeddings": False, "rope_theta": 10000},
        "bfloat16",
        None,
    ),
    "gemma": ("gemma", {"head_dim": 8}, "float32", None),
    "gemma2": (
        "gemma2",
        {"head_dim": 8, "query_pre_attn_scalar": 8, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0},
        "float32",
        None,
    ),
    "gemma2_bf16": ("gemma2", {"head_dim": 16, "num_key_value_heads": 4}, "bfloat16", None),
    "gemma3_text": (
        "gemma3_text",
        {
            "num_hidden_layers": 3,
            "head_dim": 8,
            "sliding_window": 4,
            "sliding_window_pattern": 2,
            "query_pre_attn_scalar": 8,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        "float32",
        None,
    ),
    "gemma3_text_q4": (
        "gemma3_text",
        {"num_hidden_layers": 3, "head_dim": 8, "sliding_window": 4, "sliding_window_pattern": 3},
        "float32",
        (32, 4),
    ),
    "phi3": ("phi3", {"num_key_value_heads": 2}, "float32", None),
    "phi3_partial": ("phi3", {"partial_rotary_factor": 0.5, "tie_word_embeddings": True}, "float32", None),
    "phi3_q4": ("phi3", {}, "float32", (32, 4)),
    "olmo2": ("olmo2", {}, "float32", None),
    "olmo2_bf16": ("olmo2", {"attention_bias": True, "tie_word_embeddings": False}, "bfloat16", None),
    "granite": (
        "granite",
        {
            "logits_scaling": 4.0,
            "attention_multiplier": 0.25,
            "embedding_multiplier": 6.0,
            "residual_multiplier": 0.5,
            "max_position_embeddings": 512,
            "attention_bias": False,
            "mlp_bias": True,
            "rope_theta": 10000.0,
        },
        "float32",
        None,
    ),
    "cohere": ("cohere", {"layer_norm_eps": 1e-5, "logit_scale": 0.5, "use_qk_norm": True}, "float32", None),
    "cohere_bias": (
        "cohere",
        {"layer_norm_bias": True, "attention_bias": True, "num_key_value_heads": 4},
        "float32",
        None,
    ),
    "starcoder2": ("starcoder2", {"norm_epsilon": 1e-5}, "float32", None),
    "starcoder2_bf16": ("starcoder2", {"tie_word_embeddings": False}, "bfloat16", None),
    "mimo": ("mimo", {}, "float32", None),
    "seed_oss": (
        "seed_oss",
        {"head_dim": 16, "attention_bias": True, "attention_out_bias": True, "mlp_bias": True},
        "float32",
        None,
    ),
    "helium": (
        "helium",
        {
            "attention_bias": False,
            "head_dim": 8,
            "max_position_embeddings": 512,
            "mlp_bias": False,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
        },
        "float32",
        None,
    ),
    "smollm3": ("smollm3", {"num_hidden_layers": 3, "no_rope_layer_interval": 2}, "float32", None),
    "smollm3_q4": ("smollm3", {"no_rope_layers": [0, 1], "tie_word_embeddings": False}, "float32", (32, 4)),
    "internlm3": (
        "internlm3",
        {"qkv_bias": True, "max_position_embeddings": 12, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        "float32",
        None,
    ),
    "ernie4_5": (
        "ernie4_5",
        {"head_dim": 16, "use_bias": True, "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False},
        "float32",
        None,
    ),
    "exaone": ("exaone", {"num_layers": 2, "layer_norm_epsilon": 1e-5, "rope_theta": 10000.0}, "float32", None),
    "glm4": (
        "glm4",
        {"attention_bias": True, "head_dim": 8, "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
        "float32",
        None,
    ),
    "glm4_bf16": (
        "glm4",
        {"attention_bias": False, "head_dim": 16, "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
        "bfloat16",
        None,
    ),
    "olmo3": (
        "olmo3",
        {
            "num_hidden_layers": 4,
            "max_position_embeddings": 512,
            "sliding_window": 4,
            "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        "float32",
        None,
    ),
    "minicpm": (
        "minicpm",
        {"dim_model_base": 16, "scale_depth": 1.4, "scale_emb": 12.0, "tie_word_embeddings": False},
        "float32",
        None,
    ),
    "exaone4": (
        "exaone4",
        {
            "num_hidden_layers": 4,
            "head_dim": 8,
            "max_position_embeddings": 512,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "rope_scaling": None,
            "sliding_window": 4,
            "sliding_window_pattern": "LLLG",
        },
        "float32",
        None,
    ),
    "exaone4_plain": (
        "exaone4",
        {
            "head_dim": 16,
            "max_position_embeddings": 512,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "rope_scaling": None,
            "sliding_window": None,
            "sliding_window_pattern": None,
        },
        "bfloat16",
        None,
    ),
    "internlm2": ("internlm2", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "float32", None),
    "internlm2_q4": ("internlm2", {"bias": False, "tie_word_embeddings": True}, "float32", (32, 4)),
    "hunyuan_v1_dense": (
        "hunyuan_v1_dense",
        {"rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}, "attention_bias": True},
        "float32",
        None,
    ),
    "hunyuan_v1_dense_plain": ("hunyuan_v1_dense", {"tie_word_embeddings": True}, "float32", None),
    "glm": ("glm", {"head_dim": 8, "attention_bias": True}, "float32", None),
    "phi": ("phi", {"partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5, "num_key_value_heads": 4}, "float32", None),
    "phi_bf16": ("phi", {"partial_rotary_factor": 0.75, "num_key_value_heads": 2}, "bfloat16", None),
    "stablelm": (
        "stablelm",
        {"rope_theta": 10000.0, "use_qkv_bias": True, "partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5},
        "float32",
        None,
    ),
    "stablelm_parallel_qknorm": (
        "stablelm",
        {
            "rope_theta": 10000.0,
            "use_qkv_bias": False,
            "partial_rotary_factor": 0.25,
            "layer_norm_eps": 1e-5,
            "use_parallel_residual": True,
            "qk_layernorm": True,
        },
        "bfloat16",
        None,
    ),
    "gpt_neox": (
        "gpt_neox",
        {
            "num_key_value_heads": None,
            "max_position_embeddings": 512,
            "layer_norm_eps": 1e-5,
            "rotary_emb_base": 10000,
            "rotary_pct": 0.25,
        },
        "float32",
        None,
    ),
    "gpt_neox_sequential_q4": (
        "gpt_neox",
        {
            "num_key_value_heads": None,
            "max_position_embeddings": 512,
            "layer_norm_eps": 1e-5,
            "rotary_emb_base": 10000,
            "rotary_pct": 1.0,
            "use_parallel_residual": False,
        },
        "float32",
        (32, 4),
    ),
    "gpt2": (
        "gpt2",
        {"n_ctx": 64, "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64, "layer_norm_epsilon": 1e-5},
        "float32",
        None,
    ),
    "gpt_bigcode": (
        "gpt_bigcode",
        {"n_embd": 32, "n_layer": 2, "n_inner": 64, "n_head": 4, "n_positions": 64, "layer_norm_epsilon": 1e-5},
        "float32",
        None,
    ),
    "gpt_bigcode_mha_bf16": (
        "gpt_bigcode",
        {
            "n_embd": 32,
            "n_layer": 2,
            "n_inner": 64,
            "n_head": 4,
            "n_positions": 64,
            "layer_norm_epsilon": 1e-5,
            "multi_query": False,
            "tie_word_embeddings": False,
        },
        "bfloat16",
        None,
    ),
    "gptj": (
        "gptj",
        {"n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64, "rotary_dim": 4, "layer_norm_epsilon": 1e-5},
        "float32",
        None,
    ),
    "cohere2": (
        "cohere2",
        {
            "num_hidden_layers": 3,
            "head_dim": 8,
            "sliding_window": 4,
            "sliding_window_pattern": 2,
            "logit_scale": 0.5,
            "layer_norm_bias": True,
        },
        "float32",
        None,
    ),
    "cohere2_f16": (
        "cohere2",
        {"num_hidden_layers": 2, "head_dim": 8, "sliding_window": 4, "sliding_window_pattern": 2},
        "float16",
        None,
    ),
    "nemotron": (
        "nemotron",
        {
            "hidden_act": "relu2",
            "norm_eps": 1e-5,
            "partial_rotary_factor": 0.5,
            "mlp_bias": True,
            "rope_scaling": {"type": "linear", "factor": 2.0},
        },
        "float32",
        None,
    ),
    "apertus": (
        "apertus",
        {
            "mlp_bias": False,
            "attention_bias": False,
            "max_position_embeddings": 512,
            "rope_theta": 10000.0,
            "post_norm": False,
            "qk_norm": True,
            "tie_word_embeddings": False,
        },
        "float32",
        None,
    ),
    "telechat3": (
        "telechat3",
        {"max_position_embeddings": 512, "rope_theta": 10000.0, "attention_bias": True, "head_dim": 16},
        "float32",
        None,
    ),
    "nanochat": ("nanochat", {"num_key_value_heads": 4}, "float32", None),
    "nanochat_gqa_bf16": ("nanochat", {}, "bfloat16", None),
    "llama4_text": (
        "llama4_text",
        {
            "num_hidden_layers": 3,
            "intermediate_size_mlp": 64,
            "rope_theta": 10000.0,
            "head_dim": 8,
            "tie_word_embeddings": False,
            "no_rope_layers": [1, 1, 0],
            "use_qk_norm": True,
        },
        "float32",
        None,
    ),
    "llama4_text_q4": (
        "llama4_text",
        {
            "intermediate_size_mlp": 64,
            "rope_theta": 10000.0,
            "head_dim": 8,
            "tie_word_embeddings": False,
            "no_rope_layers": [1, 0],
            "use_qk_norm": False,
        },
        "float32",
        (32, 4),
    ),
    "ministral3": (
        "ministral3",
        {
            "head_dim": 8,
            "max_position_embeddings": 512,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "llama_4_scaling_beta": 0.1,
                "original_max_position_embeddings": 4,
            },
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 4,
        },
        "float32",
        None,
    ),
    "ministral3_bf16": (
        "ministral3",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "rope_theta": 10000.0,
                "llama_4_scaling_beta": 0.5,
            },
            "max_position_embeddings": 64,
            "tie_word_embeddings": False,
        },
        "bfloat16",
        None,
    ),
    # Multimodal wrappers: only their text model (BASE keys sit unused at the top level).
    "gemma3_wrapper": (
        "gemma3",
        {
            "vocab_size": 96,
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "intermediate_size": 64,
                "head_dim": 8,
                "sliding_window": 4,
                "sliding_window_pattern": 2,
                "query_pre_attn_scalar": 8,
            },
        },
        "float32",
        None,
    ),
    "mistral3_wrapper": (
        "mistral3",
        {
            "text_config": {
                "model_type": "ministral3",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "intermediate_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "rms_norm_eps": 1e-5,
                "vocab_size": 96,
                "head_dim": 8,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "llama_4_scaling_beta": 0.1,
                    "original_max_position_embeddings": 4,
                },
            },
        },
        "float32",
        None,
    ),
}

# Cases saved with a Hugging Face checkpoint's names (mlx-lm's `sanitize` maps them back):
# name -> function from mlx-lm's (name, array) to the checkpoint's.
def _gpt2_hf(k, v):
    k = k.removeprefix("model.")
    if k.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")):
        v = v.T  # Conv1D stores (in, out)
    return k, v


def _neox_hf(k, v):
    if k == "model.embed_out.weight":
        return "embed_out.weight", v
    k = k.replace("model.h.", "gpt_neox.layers.").replace("model.", "gpt_neox.")
    return k, v


def _gptj_hf(k, v):
    return k.replace("model.", "transformer."), v


HF_NAMES = {"gpt2_hf": _gpt2_hf, "gpt_neox_hf": _neox_hf, "gptj_hf": _gptj_hf}
CASES["gpt2_hf"] = ("gpt2", dict(CASES["gpt2"][1]), "float32", None)
CASES["gpt_neox_hf"] = ("gpt_neox", dict(CASES["gpt_neox"][1]), "float32", None)
CASES["gptj_hf"] = ("gptj", dict(CASES["gptj"][1]), "float32", None)

# Sliding layers in a class without `make_cache`: mlx-lm gives every layer a plain KVCache.
CASES["smollm3_sliding"] = (
    "smollm3",
    {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4},
    "float32",
    None,
)

# OLMo 1: mlx-lm 0.32.2 adds the "causal" mask string to its scores, so it runs only one
# token at a time: a one-token prefill, cached decode steps, no cache-less forward.
CASES["olmo"] = (
    "olmo",
    {
        "d_model": 32,
        "n_layers": 2,
        "mlp_hidden_size": 128,
        "n_heads": 4,
        "embedding_size": 96,
        "rope_theta": 10000.0,
    },
    "float32",
    None,
)
ONE_TOKEN = {"olmo"}

# Spark 2.5: fused q_k_v_proj, the head-wise sigmoid output gate (`g_proj`), GeGLU (erf), a
# sliding and a full layer with their own rope (`rope_parameters`: partial rotary on the
# sliding one), rotating caches (window 4: the prompt wraps them).
CASES["spark2_5"] = (
    "spark2_5",
    {
        "head_dim": 8,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            "full_attention": {"rope_theta": 1000000.0},
        },
        "attention_bias": True,
        "tie_word_embeddings": False,
    },
    "float32",
    None,
)

PROMPT = [1, 17, 90, 5, 42, 42, 7, 88, 3, 64]
STEPS = 5

import sys

ONLY = set(sys.argv[1:])  # regenerate only these cases (all when empty)

for i, (name, (model_type, overrides, dtype, quant)) in enumerate(CASES.items()):
    if ONLY and name not in ONLY:
        continue
    config = {**BASE, "model_type": model_type, **overrides}
    arch = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(1000 + i)
    model = arch.Model(arch.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    if quant is not None:
        gs, bits = quant
        nn.quantize(model, group_size=gs, bits=bits)
        config["quantization"] = {"group_size": gs, "bits": bits}
    mx.eval(model.parameters())
    out_dir = f"mlx-models/tests/models/dense/{name}"
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    params = dict(tree_flatten(model.parameters()))
    if name in HF_NAMES:
        params = dict(HF_NAMES[name](k, v) for k, v in params.items())
    mx.save_safetensors(f"{out_dir}/model.safetensors", params)
    with open(f"{out_dir}/config.json", "w") as f:
        json.dump(config, f, indent=2)

    model, _ = load_model(pathlib.Path(out_dir))
    g = Golden(f"mlx-models/tests/goldens/dense/{name}.safetensors", __file__)
    cache = make_prompt_cache(model)
    prompt = PROMPT[:1] if name in ONE_TOKEN else PROMPT
    ids = mx.array([prompt], dtype=mx.int32)
    logits = model(ids, cache=cache)
    g.case("prefill", "forward", [ids], logits)
    greedy = []
    for s in range(STEPS):
        nxt = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)
        greedy.append(nxt.item())
        ids = nxt[:, None]
        logits = model(ids, cache=cache)
        g.case(f"step{s}", "forward", [ids], logits)
    if name not in ONE_TOKEN:
        full_ids = mx.array([PROMPT + greedy], dtype=mx.int32)
        g.case("full", "forward_nocache", [full_ids], model(full_ids))
    g.meta["greedy"] = ",".join(map(str, greedy))
    g.meta["model_type"] = model_type
    g.save()
