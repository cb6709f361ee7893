"""GGUF name maps: tiny seeded models written as llama.cpp would write them
(its tensor names, Gemma norms stored as 1 + w, its metadata keys), and mlx-lm 0.32.2's
logits on the same weights.

For each case: build `mlx_lm.models.<model_type>.Model`, seed it (normal * 0.3), write
mlx-models/tests/models/gguf/<name>.gguf with `mx.save_gguf`; then read that file back with
`mx.load` (as our loader does through MLX), map the names back to mlx-lm's (Gemma norms
`- 1`), load them strictly into a fresh mlx-lm model and record prefill, cached decode steps
and a cache-less forward into mlx-models/tests/goldens/gguf/<name>.safetensors.
Granite's and Ministral 3's Q / K rows are permuted as llama.cpp's converter does (and un-permuted when read
back). Case names after the script regenerate only those.
Run with `cargo xtask goldens gguf_dense`.
"""

import os

import mlx.core as mx
from mlx.utils import tree_flatten

from gguf_golden import Meta, only, permute, record, seeded_model, unpermute

COMMON = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 96,
    "max_position_embeddings": 256,
}

# name: (gguf architecture, model_type, config overrides); each config is what the GGUF
# metadata can express (llama.cpp's conventions, e.g. Gemma 3's pattern of 6).
CASES = {
    "qwen2": ("qwen2", "qwen2", {"rope_theta": 1000000.0, "tie_word_embeddings": False}),
    "qwen3": ("qwen3", "qwen3", {"head_dim": 16, "rope_theta": 1000000.0, "tie_word_embeddings": True}),
    "phi3": ("phi3", "phi3", {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "gemma": ("gemma", "gemma", {"head_dim": 8, "rope_theta": 10000.0}),
    "gemma2": (
        "gemma2",
        "gemma2",
        {
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "rope_theta": 10000.0,
        },
    ),
    "gemma3": (
        "gemma3",
        "gemma3_text",
        {
            "num_hidden_layers": 7,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "sliding_window_pattern": 6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
        },
    ),
    "qwen3moe": (
        "qwen3moe",
        "qwen3_moe",
        {
            "head_dim": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": 16,
            "norm_topk_prob": True,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
        },
    ),
    "qwen2moe": (
        "qwen2moe",
        "qwen2_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 24,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
        },
    ),
    "olmo2": ("olmo2", "olmo2", {"rope_theta": 500000.0, "tie_word_embeddings": False}),
    "granite": (
        "granite",
        "granite",
        {
            "attention_bias": False,
            "mlp_bias": False,
            "attention_multiplier": 0.25,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "logits_scaling": 8.0,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
        },
    ),
    "glm4": (
        "glm4",
        "glm4",
        {
            "head_dim": 8,
            "attention_bias": True,
            "partial_rotary_factor": 0.5,
            "rope_theta": 10000.0,
        },
    ),
    # Ministral 3 (llama.cpp's Ministral3Model: a llama, Q / K permuted, YaRN and Llama 4's
    # query scale in metadata). The positions run past original_max_position_embeddings = 8,
    # so the query scale changes inside the prompt.
    "mistral3": (
        "mistral3",
        "ministral3",
        {
            "head_dim": 16,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "yarn",
                "type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 16.0,
                "original_max_position_embeddings": 8,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.1,
            },
        },
    ),
}

# Per-architecture names that differ from LAYER_PARTS (llama.cpp's tensor_mapping.py).
ARCH_PARTS = {
    "qwen3moe": {
        "mlp.gate": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
    },
    "qwen2moe": {
        "mlp.gate": "ffn_gate_inp",
        "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
        "mlp.switch_mlp.up_proj": "ffn_up_exps",
        "mlp.switch_mlp.down_proj": "ffn_down_exps",
        "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
        "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
        "mlp.shared_expert.up_proj": "ffn_up_shexp",
        "mlp.shared_expert.down_proj": "ffn_down_shexp",
    },
    "olmo2": {
        "post_attention_layernorm": "post_attention_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
    "glm4": {
        "post_self_attn_layernorm": "post_attention_norm",
        "post_attention_layernorm": "ffn_norm",
        "post_mlp_layernorm": "post_ffw_norm",
        "mlp.gate_up_proj": "ffn_up",
    },
}

# llama.cpp's converter permutes Q / K rows for these (its LlamaModel.permute).
PERMUTE_QK = ("granite", "mistral3")



LAYER_PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def to_gguf_name(name, arch):
    module, suffix = name.rsplit(".", 1)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if module in top:
        return f"{top[module]}.{suffix}"
    _, _, layer, part = module.split(".", 3)
    if part in ARCH_PARTS.get(arch, {}):
        g = ARCH_PARTS[arch][part]
    elif part == "post_attention_layernorm":
        g = "post_attention_norm" if arch in ("gemma2", "gemma3") else "ffn_norm"
    elif part == "pre_feedforward_layernorm":
        g = "ffn_norm"
    else:
        g = LAYER_PARTS[part]
    return f"blk.{layer}.{g}.{suffix}"


def from_gguf_name(name, arch):
    back = {}
    for k, v in LAYER_PARTS.items():
        back.setdefault(v, k)
    if arch == "phi3":
        back["ffn_up"] = "mlp.gate_up_proj"
    back["attn_norm"] = "input_layernorm"
    if arch in ("gemma2", "gemma3"):
        back["post_attention_norm"] = "post_attention_layernorm"
        back["ffn_norm"] = "pre_feedforward_layernorm"
    else:
        back["ffn_norm"] = "post_attention_layernorm"
    module, suffix = name.rsplit(".", 1)
    top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    if module in top:
        return f"{top[module]}.{suffix}"
    _, layer, part = module.split(".", 2)
    return f"model.layers.{layer}.{back[part]}.{suffix}"


def metadata(arch, c):
    meta = Meta(arch)
    m, num = meta.m, meta.num

    num("embedding_length", c["hidden_size"])
    num("block_count", c["num_hidden_layers"])
    num("feed_forward_length", c["intermediate_size"])
    num("attention.head_count", c["num_attention_heads"])
    num("attention.head_count_kv", c["num_key_value_heads"])
    num("attention.layer_norm_rms_epsilon", c["rms_norm_eps"], mx.float32)
    num("rope.freq_base", c["rope_theta"], mx.float32)
    num("context_length", c["max_position_embeddings"])
    num("vocab_size", c["vocab_size"])
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    num("attention.key_length", hd)
    num("attention.value_length", hd)
    if arch in ("phi3", "glm4"):
        num("rope.dimension_count", int(hd * c["partial_rotary_factor"]))
    if arch in ("qwen3moe", "qwen2moe"):
        num("expert_count", c["num_experts"])
        num("expert_used_count", c["num_experts_per_tok"])
        num("expert_feed_forward_length", c["moe_intermediate_size"])
    if arch == "qwen2moe":
        num("expert_shared_feed_forward_length", c["shared_expert_intermediate_size"])
    if arch == "granite":
        num("attention.scale", c["attention_multiplier"], mx.float32)
        num("embedding_scale", c["embedding_multiplier"], mx.float32)
        num("residual_scale", c["residual_multiplier"], mx.float32)
        num("logit_scale", c["logits_scaling"], mx.float32)
    if arch == "mistral3":
        # convert_hf_to_gguf's Ministral3Model: the rope dims (LlamaModel), YaRN from
        # rope_parameters, yarn_log_multiplier = mscale_all_dim, temperature_scale = the beta.
        rp = c["rope_parameters"]
        num("rope.dimension_count", hd)
        m[f"{arch}.rope.scaling.type"] = "yarn"
        num("rope.scaling.factor", rp["factor"], mx.float32)
        num("rope.scaling.original_context_length", rp["original_max_position_embeddings"])
        num("rope.scaling.yarn_beta_fast", rp["beta_fast"], mx.float32)
        num("rope.scaling.yarn_beta_slow", rp["beta_slow"], mx.float32)
        num("rope.scaling.yarn_log_multiplier", rp["mscale_all_dim"], mx.float32)
        num("attention.temperature_scale", rp["llama_4_scaling_beta"], mx.float32)
    if arch in ("gemma2", "gemma3") and "sliding_window" in c:
        num("attention.sliding_window", c["sliding_window"])
    if arch == "gemma2":
        num("attn_logit_softcapping", c["attn_logit_softcapping"], mx.float32)
        num("final_logit_softcapping", c["final_logit_softcapping"], mx.float32)
    return m


# The first cases read back through from_gguf_name (their goldens were made that way); later
# ones through the inverse of to_gguf_name recorded while writing.
CASES_BEFORE_MOE = ("qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3")

os.makedirs("mlx-models/tests/models/gguf", exist_ok=True)
ONLY = only()
for i, (name, (arch, model_type, overrides)) in enumerate(CASES.items()):
    if ONLY and name not in ONLY:
        continue
    config = {**COMMON, "model_type": model_type, **overrides}
    module, model = seeded_model(model_type, config, 2000 + i)
    weights = dict(tree_flatten(model.parameters()))
    if model_type == "gemma3_text":
        weights.pop("lm_head.weight")  # tied, as the real GGUF stores it
    gemma = arch.startswith("gemma")
    gguf = {}
    back_names = {}
    for k, v in weights.items():
        if gemma and k.endswith("norm.weight"):
            v = v + 1  # llama.cpp's convert_hf_to_gguf norm shift
        if arch in PERMUTE_QK and ".q_proj." in k:
            v = permute(v, config["num_attention_heads"])
        if arch in PERMUTE_QK and ".k_proj." in k:
            v = permute(v, config["num_key_value_heads"])
        gguf[to_gguf_name(k, arch)] = v
        back_names[to_gguf_name(k, arch)] = k
    path = f"mlx-models/tests/models/gguf/{name}.gguf"
    mx.save_gguf(path, gguf, metadata(arch, config))

    loaded = mx.load(path)
    back = {}
    for k, v in loaded.items():
        if gemma and k.endswith("norm.weight"):
            v = v - 1
        if arch in CASES_BEFORE_MOE:
            back[from_gguf_name(k, arch)] = v
            continue
        hf = back_names[k]
        if arch in PERMUTE_QK and ".q_proj." in hf:
            v = unpermute(v, config["num_attention_heads"])
        if arch in PERMUTE_QK and ".k_proj." in hf:
            v = unpermute(v, config["num_key_value_heads"])
        back[hf] = v
    model = module.Model(module.ModelArgs.from_dict(config))
    if hasattr(model, "sanitize"):
        back = model.sanitize(back)
    model.load_weights(list(back.items()), strict=True)
    mx.eval(model.parameters())

    record(model, name, __file__)
