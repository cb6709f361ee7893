"""GGUF name maps, the later architectures (issue #32): tiny seeded mlx-lm models written as
llama.cpp's `convert_hf_to_gguf.py` writes them, and mlx-lm 0.32.2's logits on the same
weights.

For each case: build `mlx_lm.models.<model_type>.Model`, seed it (normal * 0.3), rename its
tensors to llama.cpp's (gguf-py's tensor_mapping.py: experts stacked as `ffn_*_exps`, Q / K
rows permuted where the converter's class is LlamaModel's), write the metadata keys that
converter class writes (and only those: no `vocab_size` where it writes none, the
vocabulary's size is then the length of `tokenizer.ggml.tokens`), save the file with
`mx.save_gguf` (f32, checked lossless) under mlx-models/tests/models/gguf/<name>.gguf and
record the model's prefill, cached decode steps and a cache-less forward in
mlx-models/tests/goldens/gguf/<name>.safetensors. Case names after the script regenerate only
those. Run with `cargo xtask goldens gguf_more`.
"""

import math
import zlib

import mlx.core as mx
from mlx.utils import tree_flatten

from gguf_golden import Meta, only, permute, record, seeded_model, write_gguf

BASE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 96,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
}

# mlx-lm names -> llama.cpp's, shared by the llama-like layers.
LLAMA = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

EXPERTS = {
    "mlp.gate": "ffn_gate_inp",
    "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
    "mlp.switch_mlp.up_proj": "ffn_up_exps",
    "mlp.switch_mlp.down_proj": "ffn_down_exps",
}


def meta_common(arch, c, eps="rms", vocab_size=False, rope_dims=None, head_dim=None):
    """TextModel.set_gguf_parameters' keys (plus LlamaModel's vocab_size and rope dims)."""
    m = Meta(arch)
    m.num("block_count", c.get("num_hidden_layers", c.get("num_layers")))
    m.num("context_length", c["max_position_embeddings"])
    m.num("embedding_length", c["hidden_size"])
    m.num("feed_forward_length", c["intermediate_size"])
    m.num("attention.head_count", c["num_attention_heads"])
    m.num("attention.head_count_kv", c["num_key_value_heads"])
    m.f32("rope.freq_base", c["rope_theta"])
    if eps == "rms":
        m.f32("attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    else:
        m.f32("attention.layer_norm_epsilon", c[eps])
    if head_dim is not None:
        m.num("attention.key_length", head_dim)
        m.num("attention.value_length", head_dim)
    if vocab_size:
        m.num("vocab_size", c["vocab_size"])
    if rope_dims is not None:
        m.num("rope.dimension_count", rope_dims)
    m.m["tokenizer.ggml.model"] = "gpt2"
    m.m["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(c["vocab_size"])]
    return m


def llama3_rope_freqs(c, gguf):
    """LlamaModel.generate_extra_tensors for a llama3 rope (torch float32 there, numpy's
    here): the per-frequency factors llama.cpp divides its frequencies by."""
    import numpy as np

    rp = c["rope_scaling"]
    base = c["rope_theta"]
    dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    freqs = np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor, low, high, old = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth))
    gguf["rope_freqs.weight"] = mx.array(np.array(out, dtype=np.float32))


def llama3(c, gguf):
    llama3_rope_freqs(c, gguf)
    return meta_common("llama", c, vocab_size=True, rope_dims=c.get("head_dim"), head_dim=c.get("head_dim"))


def olmo3(c):
    """Olmo2Model (OLMo 3 is written as `olmo2`): the sliding window and its per-layer
    pattern (every 4th layer full attention when the config has no layer_types)."""
    m = meta_common("olmo2", c)
    m.num("attention.sliding_window", c["sliding_window"])
    pattern = [(i + 1) % 4 != 0 for i in range(c["num_hidden_layers"])]
    m.m["olmo2.attention.sliding_window_pattern"] = mx.array(pattern)
    return m


def seed_oss(c):
    return meta_common("seed_oss", c, head_dim=c["head_dim"])


def ernie4_5(c):
    return meta_common("ernie4_5", c, head_dim=c["head_dim"])


def command_r(c):
    """CommandR2Model: LayerNorm epsilon, logit scale, no rope scaling."""
    m = meta_common("command-r", c, eps="layer_norm_eps")
    m.f32("logit_scale", c["logit_scale"])
    m.str("rope.scaling.type", "none")
    return m


def cohere2(c):
    """Cohere2Model: LayerNorm epsilon, logit scale, sliding window, vocab size, rope dims
    (rotary_pct 1); llama.cpp's pattern is every 4th layer global, as mlx-lm's default."""
    m = meta_common("cohere2", c, eps="layer_norm_eps", vocab_size=True, rope_dims=c["head_dim"],
                    head_dim=c["head_dim"])
    m.f32("logit_scale", c["logit_scale"])
    m.num("attention.sliding_window", c["sliding_window"])
    m.str("rope.scaling.type", "none")
    return m


def exaone4(c, gguf):
    """Exaone4Model: vocab size, the sliding window and its per-layer pattern (from the
    config's "LLLG" string), Llama 3's rope as `rope_freqs`."""
    llama3_rope_freqs(c, gguf)
    m = meta_common("exaone4", c, vocab_size=True, head_dim=c["head_dim"])
    m.num("attention.sliding_window", c["sliding_window"])
    p = c["sliding_window_pattern"]
    m.m["exaone4.attention.sliding_window_pattern"] = mx.array(
        [p[i % len(p)] == "L" for i in range(c["num_hidden_layers"])]
    )
    return m


def smollm3(c):
    # SmolLM3Model(LlamaModel): Q / K permuted, no-rope layers fixed at every 4th in llama.cpp.
    return meta_common("smollm3", c, vocab_size=True, rope_dims=c["hidden_size"] // c["num_attention_heads"])


def starcoder2(c):
    return meta_common("starcoder2", c, eps="norm_epsilon")


def exaone(c):
    # ExaoneModel: rope dims = partial_rotary_factor (1.0) * head size; the released files
    # carry the RMS epsilon key llama.cpp reads.
    c = {**c, "num_hidden_layers": c["num_layers"], "rms_norm_eps": c["layer_norm_epsilon"]}
    return meta_common("exaone", c, rope_dims=c["hidden_size"] // c["num_attention_heads"])


def olmoe(c):
    # OlmoeModel writes the RMS epsilon as 1e-5 whatever the config says (the config's is too).
    m = meta_common("olmoe", c)
    m.num("expert_count", c["num_experts"])
    m.num("expert_used_count", c["num_experts_per_tok"])
    return m


def granitemoe(c):
    m = meta_common("granitemoe", c, vocab_size=True, rope_dims=c["hidden_size"] // c["num_attention_heads"])
    m.num("expert_count", c["num_local_experts"])
    m.num("expert_used_count", c["num_experts_per_tok"])
    m.f32("attention.scale", c["attention_multiplier"])
    m.f32("embedding_scale", c["embedding_multiplier"])
    m.f32("residual_scale", c["residual_multiplier"])
    m.f32("logit_scale", c["logits_scaling"])
    return m


def phi3_rope(arch, c, gguf):
    """Phi3MiniModel.set_gguf_parameters and generate_extra_tensors (long-rope factors)."""
    m = Meta(arch)
    hd = c["hidden_size"] // c["num_attention_heads"]
    m.num("context_length", c["max_position_embeddings"])
    m.num("rope.scaling.original_context_length", c["original_max_position_embeddings"])
    m.num("embedding_length", c["hidden_size"])
    m.num("feed_forward_length", c["intermediate_size"])
    m.num("block_count", c["num_hidden_layers"])
    m.num("attention.head_count", c["num_attention_heads"])
    m.num("attention.head_count_kv", c["num_key_value_heads"])
    m.f32("attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    m.num("rope.dimension_count", int(c.get("partial_rotary_factor", 1.0) * c["hidden_size"]) // c["num_attention_heads"])
    m.f32("rope.freq_base", c["rope_theta"])
    m.num("attention.sliding_window", 0)
    rs = c["rope_scaling"]
    scale = c["max_position_embeddings"] / c["original_max_position_embeddings"]
    m.f32("rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(c["original_max_position_embeddings"])))
    gguf["rope_factors_long.weight"] = mx.array(rs["long_factor"], dtype=mx.float32)
    gguf["rope_factors_short.weight"] = mx.array(rs["short_factor"], dtype=mx.float32)
    m.m["tokenizer.ggml.model"] = "llama"
    m.m["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(c["vocab_size"])]
    assert len(rs["long_factor"]) == hd * c.get("partial_rotary_factor", 1.0) // 2
    return m


def phimoe(c, gguf):
    m = phi3_rope("phimoe", c, gguf)
    m.num("expert_used_count", c["num_experts_per_tok"])
    m.num("expert_count", c["num_local_experts"])
    return m


def minicpm3(c, gguf):
    """MiniCPM3Model.set_gguf_parameters (no scales: llama.cpp fixes scale_emb 12, scale_depth
    1.4 and dim_model_base 256, MiniCPM3-4B's) and its long-rope factor tensors."""
    m = Meta("minicpm3")
    m.num("context_length", c["max_position_embeddings"])
    m.num("embedding_length", c["hidden_size"])
    m.num("block_count", c["num_hidden_layers"])
    m.num("feed_forward_length", c["intermediate_size"])
    m.num("attention.head_count", c["num_attention_heads"])
    m.num("attention.head_count_kv", c["num_key_value_heads"])
    m.f32("attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    m.num("vocab_size", c["vocab_size"])
    m.num("attention.q_lora_rank", c["q_lora_rank"])
    m.num("attention.kv_lora_rank", c["kv_lora_rank"])
    m.num("attention.key_length", c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    m.num("rope.dimension_count", c["qk_rope_head_dim"])
    rs = c["rope_scaling"]
    gguf["rope_factors_long.weight"] = mx.array(rs["long_factor"], dtype=mx.float32)
    gguf["rope_factors_short.weight"] = mx.array(rs["short_factor"], dtype=mx.float32)
    m.m["tokenizer.ggml.model"] = "llama"
    m.m["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(c["vocab_size"])]
    return m


def gpt_oss(c):
    """GptOssModel: TextModel's keys (YaRN's as rope scaling, head_dim as key / value length,
    no vocab_size), the window and the experts' width."""
    m = meta_common("gpt-oss", c, head_dim=c["head_dim"])
    rs = c["rope_scaling"]
    m.str("rope.scaling.type", "yarn")
    m.f32("rope.scaling.factor", rs["factor"])
    m.num("rope.scaling.original_context_length", rs["original_max_position_embeddings"])
    m.f32("rope.scaling.yarn_beta_fast", rs["beta_fast"])
    m.f32("rope.scaling.yarn_beta_slow", rs["beta_slow"])
    m.num("expert_count", c["num_local_experts"])
    m.num("expert_used_count", c["num_experts_per_tok"])
    m.num("attention.sliding_window", c["sliding_window"])
    m.num("expert_feed_forward_length", c["intermediate_size"])
    return m


def nanbeige(c):
    """NanbeigeModel (LlamaModel: Q / K permuted, vocab size, rope dims) plus its loops."""
    m = meta_common("nanbeige", c, vocab_size=True, rope_dims=c["head_dim"])
    m.num("num_loops", c["num_loops"])
    m.flag("skip_loop_final_norm", c["skip_loop_final_norm"])
    return m


def moe_meta(arch, c, m):
    """The expert keys TextModel and the GLM-4.5 / dots.llm1 converter classes write."""
    m.num("expert_count", c["n_routed_experts"])
    m.num("expert_used_count", c["num_experts_per_tok"])
    m.num("expert_group_count", c["n_group"])
    m.num("expert_group_used_count", c["topk_group"])
    m.num("expert_feed_forward_length", c["moe_intermediate_size"])
    m.num("expert_shared_count", c["n_shared_experts"])
    m.num("leading_dense_block_count", c["first_k_dense_replace"])
    m.f32("expert_weights_scale", c["routed_scaling_factor"])
    m.flag("expert_weights_norm", c["norm_topk_prob"])
    return m


def glm4moe(c, gguf):
    """Glm4MoeModel: head_dim as key / value length, the rotated part as rope dims, sigmoid
    gating, and the MTP layer (block_count counts it) written after the main layers."""
    n = c["num_hidden_layers"]
    m = meta_common("glm4moe", {**c, "num_hidden_layers": n + 1}, head_dim=c["head_dim"],
                    rope_dims=int(c["head_dim"] * c["partial_rotary_factor"]))
    moe_meta("glm4moe", c, m)
    m.num("expert_gating_func", 2)
    m.num("nextn_predict_layers", 1)
    # The MTP layer: a decoder layer (layer n-1's tensors, renamed) plus its nextn.* parts.
    for k in [k for k in gguf if k.startswith(f"blk.{n - 1}.")]:
        gguf[f"blk.{n}." + k.split(".", 2)[2]] = gguf[k] + 1
    h = c["hidden_size"]
    gguf[f"blk.{n}.nextn.eh_proj.weight"] = mx.ones((h, 2 * h))
    for part in ("enorm", "hnorm", "shared_head_norm"):
        gguf[f"blk.{n}.nextn.{part}.weight"] = mx.ones((h,))
    return m


def dots1(c, gguf):
    """Dots1Model (Qwen2MoeModel's keys plus DeepSeek's); no gating function key (the
    converter rejects `noaux_tc`; llama.cpp's dots1 is sigmoid)."""
    m = meta_common("dots1", c)
    return moe_meta("dots1", c, m)


DEEPSEEK_MOE = {
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}

MOE_COMMON = {
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
    "rope_scaling": None,
}

MLA = {
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
}

# The attention factor llama.cpp's converter writes for long rope (its formula, which mlx-lm's
# SuScaledRoPE also uses without an mscale): PhiMoE's mscales are that, as the file holds it.
PHIMOE_MSCALE = math.sqrt(1 + math.log(8192 / 512) / math.log(512))
FACTORS = {
    "short_factor": [1.0, 1.1, 1.2, 1.3],
    "long_factor": [1.0, 1.5, 2.0, 2.5],
}

# name: (model_type, config overrides, metadata writer, extra name map, permute Q / K,
#        layer prefix of the mlx-lm names)
CASES = {
    # gpt-oss: sinks, biased router and experts, alternating sliding layers, YaRN.
    "gpt_oss": (
        "gpt_oss",
        {
            "head_dim": 8,
            "intermediate_size": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 4,
            "tie_word_embeddings": False,
            "rope_theta": 150000.0,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 64,
                "truncate": False,
            },
        },
        gpt_oss,
        {
            "post_attention_layernorm": "post_attention_norm",
            "mlp.router": "ffn_gate_inp",
            "mlp.experts.gate_proj": "ffn_gate_exps",
            "mlp.experts.up_proj": "ffn_up_exps",
            "mlp.experts.down_proj": "ffn_down_exps",
        },
        False,
        "model.layers",
    ),
    # Nanbeige: the llama stack run twice with shared weights, the final norm between loops
    # skipped.
    "nanbeige": (
        "nanbeige",
        {
            "head_dim": 16,
            "num_loops": 2,
            "skip_loop_final_norm": True,
            "tie_word_embeddings": False,
        },
        nanbeige,
        {},
        True,
        "model.layers",
    ),
    # Llama 3.1's rope (llama.cpp stores the factors as `rope_freqs`, not the parameters):
    # two frequencies in the smoothed band, one of each outside it.
    "llama3": (
        "llama",
        {
            "head_dim": 16,
            "tie_word_embeddings": False,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 2048,
            },
        },
        llama3,
        {},
        True,
        "model.layers",
    ),
    # OLMo 3 (sliding window 4 on layers 1-3, full attention on the 4th).
    "olmo3": (
        "olmo3",
        {"num_hidden_layers": 4, "sliding_window": 4, "rope_theta": 500000.0, "tie_word_embeddings": False},
        olmo3,
        {
            "post_attention_layernorm": "post_attention_norm",
            "post_feedforward_layernorm": "post_ffw_norm",
        },
        False,
        "model.layers",
    ),
    "seed_oss": (
        "seed_oss",
        {
            "head_dim": 16,
            "attention_bias": True,
            "attention_out_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        },
        seed_oss,
        {},
        False,
        "model.layers",
    ),
    # ERNIE 4.5 (dense): interleaved rope in both, so no permutation.
    "ernie4_5": (
        "ernie4_5",
        {"head_dim": 8, "use_bias": False, "tie_word_embeddings": True},
        ernie4_5,
        {},
        False,
        "model.layers",
    ),
    # Command R (cohere): parallel block with one LayerNorm, per-head q/k LayerNorms, tied
    # head scaled by logit_scale.
    "command_r": (
        "cohere",
        {
            "layer_norm_eps": 1e-5,
            "logit_scale": 0.0625,
            "use_qk_norm": True,
            "attention_bias": False,
            "layer_norm_bias": False,
            "tie_word_embeddings": True,
        },
        command_r,
        {},
        False,
        "model.layers",
    ),
    # Command R7B (cohere2): sliding window 4 on layers 1-3, the 4th global without rope.
    "cohere2": (
        "cohere2",
        {
            "num_hidden_layers": 4,
            "head_dim": 8,
            "layer_norm_eps": 1e-5,
            "logit_scale": 0.25,
            "sliding_window": 4,
            "sliding_window_pattern": 4,
            "tie_word_embeddings": True,
        },
        cohere2,
        {},
        False,
        "model.layers",
    ),
    # EXAONE 4.0: post-norms only, q/k norms, 3 sliding layers then a global one without
    # rope, Llama 3's rope scaling.
    "exaone4": (
        "exaone4",
        {
            "num_hidden_layers": 4,
            "head_dim": 8,
            "sliding_window": 4,
            "sliding_window_pattern": "LLLG",
            "tie_word_embeddings": False,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 16.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        exaone4,
        {
            "post_attention_layernorm": "post_attention_norm",
            "post_feedforward_layernorm": "post_ffw_norm",
        },
        False,
        "model.layers",
    ),
    # 4 layers: the 4th has no rope.
    "smollm3": (
        "smollm3",
        {"num_hidden_layers": 4, "tie_word_embeddings": False, "rope_theta": 5000000.0},
        smollm3,
        {},
        True,
        "model.layers",
    ),
    "starcoder2": (
        "starcoder2",
        {"norm_epsilon": 1e-5, "tie_word_embeddings": True, "rope_theta": 100000.0},
        starcoder2,
        {"mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"},
        False,
        "model.layers",
    ),
    "exaone": (
        "exaone",
        {
            "num_layers": 2,
            "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
        },
        exaone,
        {
            "transformer.wte": "token_embd",
            "transformer.ln_f": "output_norm",
            "ln_1": "attn_norm",
            "ln_2": "ffn_norm",
            "attn.attention.q_proj": "attn_q",
            "attn.attention.k_proj": "attn_k",
            "attn.attention.v_proj": "attn_v",
            "attn.attention.out_proj": "attn_output",
            "mlp.c_fc_0": "ffn_gate",
            "mlp.c_fc_1": "ffn_up",
            "mlp.c_proj": "ffn_down",
        },
        False,
        "transformer.h",
    ),
    "olmoe": (
        "olmoe",
        {
            "rms_norm_eps": 1e-5,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 16,
            "norm_topk_prob": False,
            "tie_word_embeddings": False,
        },
        olmoe,
        EXPERTS,
        False,
        "model.layers",
    ),
    "granitemoe": (
        "granitemoe",
        {
            "intermediate_size": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "attention_bias": False,
            "attention_multiplier": 0.25,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "logits_scaling": 8.0,
            "tie_word_embeddings": True,
        },
        granitemoe,
        {
            "block_sparse_moe.router.layer": "ffn_gate_inp",
            "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
            "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
            "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
        },
        True,
        "model.layers",
    ),
    # Phi-3 with long rope (the 128k models): the factors as tensors.
    "phi3_longrope": (
        "phi3",
        {
            "max_position_embeddings": 8192,
            "original_max_position_embeddings": 512,
            "rope_scaling": {"type": "longrope", **FACTORS},
            "tie_word_embeddings": False,
        },
        lambda c, g: phi3_rope("phi3", c, g),
        {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
        False,
        "model.layers",
    ),
    "phimoe": (
        "phimoe",
        {
            "intermediate_size": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 8192,
            "original_max_position_embeddings": 512,
            "rope_scaling": {
                "type": "longrope",
                **FACTORS,
                "short_mscale": PHIMOE_MSCALE,
                "long_mscale": PHIMOE_MSCALE,
            },
        },
        phimoe,
        {
            "block_sparse_moe.gate": "ffn_gate_inp",
            "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
            "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
            "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
        },
        False,
        "model.layers",
    ),
    # MiniCPM3 (MLA, dense): rope scaled by long factors over the whole context (the file
    # has no original context: llama.cpp's is the context length, as here).
    "minicpm3": (
        "minicpm3",
        {
            "num_key_value_heads": 4,
            "dim_model_base": 256,
            "scale_depth": 1.4,
            "scale_emb": 12.0,
            "q_lora_rank": 24,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 8,
            "rope_scaling": {
                "type": "longrope",
                "original_max_position_embeddings": 256,
                **FACTORS,
            },
            "tie_word_embeddings": False,
        },
        minicpm3,
        MLA,
        False,
        "model.layers",
    ),
    # GLM-4.5: head_dim wider than hidden / heads, half of it rotated, q/k norms, biases,
    # sigmoid router with groups, a leading dense layer, shared expert, one MTP layer.
    "glm4moe": (
        "glm4_moe",
        {
            **MOE_COMMON,
            "head_dim": 16,
            "partial_rotary_factor": 0.5,
            "attention_bias": True,
            "use_qk_norm": True,
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
        },
        glm4moe,
        {**DEEPSEEK_MOE, "post_attention_layernorm": "post_attention_norm", **EXPERTS},
        False,
        "model.layers",
    ),
    "dots1": (
        "dots1",
        {
            **MOE_COMMON,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 2.0,
            "scoring_func": "noaux_tc",
        },
        dots1,
        {
            **DEEPSEEK_MOE,
            "mlp.experts.gate_proj": "ffn_gate_exps",
            "mlp.experts.up_proj": "ffn_up_exps",
            "mlp.experts.down_proj": "ffn_down_exps",
        },
        False,
        "model.layers",
    ),
}


def to_gguf_name(name, parts, prefix):
    if name.endswith(".self_attn.sinks"):
        # gpt-oss: the converter adds `.weight` to the bare parameter.
        return f"blk.{name.split('.')[2]}.attn_sinks.weight"
    if name.endswith(".mlp.gate.e_score_correction_bias"):
        return f"blk.{name.split('.')[2]}.exp_probs_b.bias"
    module, suffix = name.rsplit(".", 1)
    if module in parts:
        return f"{parts[module]}.{suffix}"
    assert module.startswith(prefix + "."), name
    layer, part = module[len(prefix) + 1 :].split(".", 1)
    return f"blk.{layer}.{parts[part]}.{suffix}"


def seed_of(name):
    """A seed from the case name (adding a case changes no other case's weights)."""
    return zlib.crc32(name.encode()) % 100000


ONLY = only()
for name, (model_type, overrides, meta, extra, permute_qk, prefix) in CASES.items():
    if ONLY and name not in ONLY:
        continue
    config = {**BASE, "model_type": model_type, **overrides}
    if model_type == "exaone":
        config.pop("num_hidden_layers")
        config.pop("rms_norm_eps")
    _, model = seeded_model(model_type, config, seed_of(name))
    parts = {**LLAMA, **extra}
    gguf = {}
    for k, v in tree_flatten(model.parameters()):
        if config.get("tie_word_embeddings", model_type != "phimoe") and k == "lm_head.weight":
            continue
        if permute_qk and (".q_proj." in k or ".k_proj." in k):
            heads = config["num_attention_heads" if ".q_proj." in k else "num_key_value_heads"]
            v = permute(v, heads)
        gguf[to_gguf_name(k, parts, prefix)] = v
    m = meta(config, gguf) if meta.__code__.co_argcount == 2 else meta(config)
    write_gguf(name, gguf, m)
    record(model, name, __file__)


# Qwen3-Next (`qwen3next`): Qwen3NextModel.modify_tensors' conversions, which change values,
# so the golden is mlx-lm on the weights read back from the file (as the Gemma norms are in
# goldens_gguf_dense.py): `A_log` stored as `ssm_a = -exp(A_log)` (read back as
# `log(-ssm_a)`), `in_proj_qkvz` regrouped into `attn_qkv` (q, k, v of every head) and
# `attn_gate` (z), conv1d squeezed to (channels, kernel), `dt_bias` as `ssm_dt.bias`; the
# norms are stored as 1 + w, which is mlx-lm's own parameter. The file also holds one MTP
# layer (nextn_predict_layers), which is skipped.
QWEN3NEXT = {
    **BASE,
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "head_dim": 8,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "shared_expert_intermediate_size": 16,
    "moe_intermediate_size": 16,
    "partial_rotary_factor": 0.25,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
}

QWEN3NEXT_PARTS = {
    **LLAMA,
    **EXPERTS,
    "post_attention_layernorm": "post_attention_norm",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "linear_attn.in_proj_ba": "ssm_ba",
    "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
}


def qwen3next_case(seed):
    c = QWEN3NEXT
    _, model = seeded_model("qwen3_next", c, seed)
    nk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    nv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    r = nv // nk
    gguf = {}
    for k, v in tree_flatten(model.parameters()):
        layer = k.split(".")[2] if k.startswith("model.layers.") else None
        if k.endswith("linear_attn.A_log"):
            gguf[f"blk.{layer}.ssm_a"] = -mx.exp(v)
        elif k.endswith("linear_attn.dt_bias"):
            gguf[f"blk.{layer}.ssm_dt.bias"] = v
        elif k.endswith("linear_attn.conv1d.weight"):
            gguf[f"blk.{layer}.ssm_conv1d.weight"] = v.squeeze(-1)
        elif k.endswith("linear_attn.in_proj_qkvz.weight"):
            g = v.reshape(nk, 2 * dk + 2 * r * dv, -1)
            q, kk, vv, z = mx.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
            h = v.shape[-1]
            qkv = [q.reshape(-1, h), kk.reshape(-1, h), vv.reshape(-1, h)]
            gguf[f"blk.{layer}.attn_qkv.weight"] = mx.concatenate(qkv, axis=0)
            gguf[f"blk.{layer}.attn_gate.weight"] = z.reshape(-1, h)
        else:
            gguf[to_gguf_name(k, QWEN3NEXT_PARTS, "model.layers")] = v
    n = c["num_hidden_layers"]
    for k in [k for k in gguf if k.startswith(f"blk.{n - 1}.")]:
        gguf[f"blk.{n}." + k.split(".", 2)[2]] = gguf[k]
    h = c["hidden_size"]
    gguf[f"blk.{n}.nextn.eh_proj.weight"] = mx.ones((h, 2 * h))
    for part in ("enorm", "hnorm", "shared_head_norm"):
        gguf[f"blk.{n}.nextn.{part}.weight"] = mx.ones((h,))

    m = meta_common("qwen3next", {**c, "num_hidden_layers": n + 1}, head_dim=c["head_dim"],
                    rope_dims=int(c["head_dim"] * c["partial_rotary_factor"]))
    m.num("expert_count", c["num_experts"])
    m.num("expert_used_count", c["num_experts_per_tok"])
    m.num("expert_feed_forward_length", c["moe_intermediate_size"])
    m.num("expert_shared_feed_forward_length", c["shared_expert_intermediate_size"])
    m.num("ssm.conv_kernel", c["linear_conv_kernel_dim"])
    m.num("ssm.state_size", dk)
    m.num("ssm.group_count", nk)
    m.num("ssm.time_step_rank", nv)
    m.num("ssm.inner_size", dv * nv)
    m.num("full_attention_interval", c["full_attention_interval"])
    m.num("nextn_predict_layers", 1)
    write_gguf("qwen3next", gguf, m)

    # Read back as the Rust loader does, into a fresh mlx-lm model.
    loaded = mx.load(f"mlx-models/tests/models/gguf/qwen3next.gguf")
    back = {}
    inv = {v: k for k, v in QWEN3NEXT_PARTS.items()}
    for k, v in loaded.items():
        if k.startswith(f"blk.{n}."):
            continue
        if not k.startswith("blk."):
            module, suffix = k.rsplit(".", 1)
            back[f"{inv[module]}.{suffix}"] = v
            continue
        _, layer, rest = k.split(".", 2)
        p = f"model.layers.{layer}"
        if rest == "ssm_a":
            back[f"{p}.linear_attn.A_log"] = mx.log(-v)
        elif rest == "ssm_dt.bias":
            back[f"{p}.linear_attn.dt_bias"] = v
        elif rest == "ssm_conv1d.weight":
            back[f"{p}.linear_attn.conv1d.weight"] = v[..., None]
        elif rest == "attn_gate.weight":
            continue
        elif rest == "attn_qkv.weight":
            hh = v.shape[-1]
            q, kk, vv = mx.split(v, [nk * dk, 2 * nk * dk], axis=0)
            z = loaded[f"blk.{layer}.attn_gate.weight"]
            parts = [q.reshape(nk, dk, hh), kk.reshape(nk, dk, hh), vv.reshape(nk, r * dv, hh), z.reshape(nk, r * dv, hh)]
            back[f"{p}.linear_attn.in_proj_qkvz.weight"] = mx.concatenate(parts, axis=1).reshape(-1, hh)
        else:
            module, suffix = rest.rsplit(".", 1)
            back[f"{p}.{inv[module]}.{suffix}"] = v
    module = __import__("mlx_lm.models.qwen3_next", fromlist=["Model"])
    fresh = module.Model(module.ModelArgs.from_dict(c))
    fresh.load_weights(list(back.items()), strict=True)
    mx.eval(fresh.parameters())
    record(fresh, "qwen3next", __file__)


if not ONLY or "qwen3next" in ONLY:
    qwen3next_case(seed_of("qwen3next"))


# LFM2 (`lfm2`): short-convolution layers between attention layers. LFM2Model writes
# `head_count_kv` per layer (0 for a convolution layer), the feed-forward width already
# adjusted (block_auto_adjust_ff_dim: 64 -> 48 here), the convolution's cache length, and
# the depthwise kernel squeezed to (channels, kernel); the final norm is `token_embd_norm`.
LFM2 = {
    "model_type": "lfm2",
    "vocab_size": 96,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "norm_eps": 1e-5,
    "conv_bias": False,
    "conv_L_cache": 3,
    "block_dim": 32,
    "block_ff_dim": 64,
    "block_multiple_of": 16,
    "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True,
    "rope_theta": 1000000.0,
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
}

LFM2_PARTS = {
    "model.embed_tokens": "token_embd",
    "model.embedding_norm": "token_embd_norm",
    "operator_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    "feed_forward.w1": "ffn_gate",
    "feed_forward.w3": "ffn_up",
    "feed_forward.w2": "ffn_down",
    "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_output",
    "conv.conv": "shortconv.conv",
    "conv.in_proj": "shortconv.in_proj",
    "conv.out_proj": "shortconv.out_proj",
}


def lfm2_case(seed):
    c = LFM2
    _, model = seeded_model("lfm2", c, seed)
    gguf = {}
    for k, v in tree_flatten(model.parameters()):
        if k.endswith("conv.conv.weight"):
            v = v.squeeze(-1)
        gguf[to_gguf_name(k, LFM2_PARTS, "model.layers")] = v
    assert gguf["blk.0.ffn_gate.weight"].shape[0] == 48
    m = Meta("lfm2")
    m.num("block_count", c["num_hidden_layers"])
    m.num("context_length", c["max_position_embeddings"])
    m.num("embedding_length", c["hidden_size"])
    m.num("feed_forward_length", 48)
    m.num("attention.head_count", c["num_attention_heads"])
    m.num("attention.head_count_kv", [c["num_key_value_heads"] if t != "conv" else 0 for t in c["layer_types"]])
    m.f32("rope.freq_base", c["rope_theta"])
    m.f32("attention.layer_norm_rms_epsilon", c["norm_eps"])
    m.num("vocab_size", c["vocab_size"])
    m.num("shortconv.l_cache", c["conv_L_cache"])
    m.m["tokenizer.ggml.model"] = "gpt2"
    m.m["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(c["vocab_size"])]
    write_gguf("lfm2", gguf, m)
    record(model, "lfm2", __file__)


if not ONLY or "lfm2" in ONLY:
    lfm2_case(seed_of("lfm2"))


# LFM2-MoE (`lfm2moe`): LFM2's layers with a dense first block and sigmoid-routed experts
# with a selection bias. LFM2MoeModel writes the per-layer `head_count_kv`, the dense width
# as `feed_forward_length`, the experts' as `expert_feed_forward_length`, the dense block
# count, sigmoid gating (2) and `expert_bias` as `exp_probs_b.bias`; llama.cpp always
# renormalizes the top-k weights (norm_topk_prob) and scales them by 1.
LFM2MOE = {
    "model_type": "lfm2_moe",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "use_expert_bias": True,
    "num_dense_layers": 1,
    "norm_eps": 1e-5,
    "conv_bias": False,
    "conv_L_cache": 3,
    "rope_theta": 1000000.0,
    "routed_scaling_factor": 1.0,
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
}

LFM2MOE_PARTS = {
    **LFM2_PARTS,
    "feed_forward.gate_proj": "ffn_gate",
    "feed_forward.up_proj": "ffn_up",
    "feed_forward.down_proj": "ffn_down",
    "feed_forward.gate": "ffn_gate_inp",
    "feed_forward.switch_mlp.gate_proj": "ffn_gate_exps",
    "feed_forward.switch_mlp.up_proj": "ffn_up_exps",
    "feed_forward.switch_mlp.down_proj": "ffn_down_exps",
}


def lfm2moe_case(seed):
    c = LFM2MOE
    _, model = seeded_model("lfm2_moe", c, seed)
    gguf = {}
    for k, v in tree_flatten(model.parameters()):
        if k.endswith("conv.conv.weight"):
            v = v.squeeze(-1)
        if k.endswith(".feed_forward.expert_bias"):
            gguf[f"blk.{k.split('.')[2]}.exp_probs_b.bias"] = v
            continue
        gguf[to_gguf_name(k, LFM2MOE_PARTS, "model.layers")] = v
    m = Meta("lfm2moe")
    m.num("block_count", c["num_hidden_layers"])
    m.num("context_length", c["max_position_embeddings"])
    m.num("embedding_length", c["hidden_size"])
    m.num("feed_forward_length", c["intermediate_size"])
    m.num("attention.head_count", c["num_attention_heads"])
    m.num("attention.head_count_kv", [c["num_key_value_heads"] if t == "full_attention" else 0 for t in c["layer_types"]])
    m.f32("rope.freq_base", c["rope_theta"])
    m.f32("attention.layer_norm_rms_epsilon", c["norm_eps"])
    m.num("expert_count", c["num_experts"])
    m.num("expert_used_count", c["num_experts_per_tok"])
    m.num("expert_feed_forward_length", c["moe_intermediate_size"])
    m.num("leading_dense_block_count", c["num_dense_layers"])
    m.num("expert_gating_func", 2)
    m.num("vocab_size", c["vocab_size"])
    m.num("shortconv.l_cache", c["conv_L_cache"])
    m.m["tokenizer.ggml.model"] = "gpt2"
    m.m["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(c["vocab_size"])]
    write_gguf("lfm2moe", gguf, m)
    record(model, "lfm2moe", __file__)


if not ONLY or "lfm2moe" in ONLY:
    lfm2moe_case(seed_of("lfm2moe"))


# Qwen 3.5 (`qwen35`, `qwen35moe`): Qwen3-Next's layers with separate projections
# (`in_proj_qkv` -> attn_qkv, `in_proj_z` -> attn_gate, `in_proj_b` -> ssm_beta, `in_proj_a`
# -> ssm_alpha), every layer with experts in the MoE. Qwen3_5TextModel /
# Qwen3_5MoeTextModel (_LinearAttentionVReorderBase) first reorder the value heads from
# grouped by key head ([k0: v0..v{r-1}, k1: ...]) to tiled ([v0 of every k, v1 of every k,
# ...]) in the V rows of `in_proj_qkv`, the rows of `in_proj_z`, `in_proj_b`, `in_proj_a`,
# `A_log`, `dt_bias`, the V channels of the conv kernel and the columns of `out_proj`; then
# Qwen3NextModel's conversions (`ssm_a = -exp(A_log)`, conv squeezed, `dt_bias` as
# `ssm_dt.bias`). The metadata adds the interleaved-MRoPE sections (text positions make it
# plain rope) and `attention.recurrent_layers` from `layer_types`. The golden is mlx-lm on
# the weights read back from the file (A_log through -exp / log); every other tensor read
# back is checked equal to the seeded model's.
QWEN35 = {
    **BASE,
    "model_type": "qwen3_5",
    "num_hidden_layers": 4,
    "intermediate_size": 24,
    "full_attention_interval": 2,
    "layer_types": ["linear_attention", "full_attention"] * 2,
    "head_dim": 8,
    # Three value heads per key head: a reorder that swapped the two counts would fail.
    "linear_num_value_heads": 6,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.5,
    },
}

QWEN35MOE = {
    **QWEN35,
    "model_type": "qwen3_5_moe",
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "shared_expert_intermediate_size": 16,
    "moe_intermediate_size": 16,
}

QWEN35_PARTS = {
    **QWEN3NEXT_PARTS,
    "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.dt": "ssm_dt",
}


def tile_v(t, axis, nk, r, d):
    """_LinearAttentionVReorderBase._reorder_v_heads: (.., nk, r, d, ..) -> (.., r, nk, d, ..)."""
    s = list(t.shape)
    axis = axis % len(s)
    t = t.reshape(*s[:axis], nk, r, d, *s[axis + 1 :])
    return t.swapaxes(axis, axis + 1).reshape(s)


def untile_v(t, axis, nk, r, d):
    s = list(t.shape)
    axis = axis % len(s)
    t = t.reshape(*s[:axis], r, nk, d, *s[axis + 1 :])
    return t.swapaxes(axis, axis + 1).reshape(s)


def qwen35_case(name, c, arch, seed):
    model_type = c["model_type"]
    _, model = seeded_model(model_type, c, seed)
    nk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    nv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    r = nv // nk
    qk = 2 * nk * dk
    gguf = {}
    for k, v in tree_flatten(model.parameters()):
        k = k.removeprefix("language_model.")
        layer = k.split(".")[2] if k.startswith("model.layers.") else None
        if ".linear_attn." in k and r > 1:
            if k.endswith("in_proj_qkv.weight"):
                v = mx.concatenate([v[:qk], tile_v(v[qk:], 0, nk, r, dv)], axis=0)
            elif k.endswith("in_proj_z.weight"):
                v = tile_v(v, 0, nk, r, dv)
            elif k.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
                v = tile_v(v, 0, nk, r, 1)
            elif k.endswith("conv1d.weight"):
                v = mx.concatenate([v[:qk], tile_v(v[qk:], 0, nk, r, dv)], axis=0)
            elif k.endswith("out_proj.weight"):
                v = tile_v(v, 1, nk, r, dv)
        if k.endswith("linear_attn.A_log"):
            gguf[f"blk.{layer}.ssm_a"] = -mx.exp(v)
        elif k.endswith("linear_attn.dt_bias"):
            gguf[f"blk.{layer}.ssm_dt.bias"] = v
        elif k.endswith("linear_attn.conv1d.weight"):
            gguf[f"blk.{layer}.ssm_conv1d.weight"] = v.squeeze(-1)
        else:
            gguf[to_gguf_name(k, QWEN35_PARTS, "model.layers")] = v
    # One MTP layer (mtp_num_hidden_layers): a full-attention layer plus its nextn.* parts.
    n = c["num_hidden_layers"]
    for k in [k for k in gguf if k.startswith(f"blk.{n - 1}.")]:
        gguf[f"blk.{n}." + k.split(".", 2)[2]] = gguf[k]
    h = c["hidden_size"]
    gguf[f"blk.{n}.nextn.eh_proj.weight"] = mx.ones((h, 2 * h))
    for part in ("enorm", "hnorm", "shared_head_norm"):
        gguf[f"blk.{n}.nextn.{part}.weight"] = mx.ones((h,))

    rp = c["rope_parameters"]
    m = Meta(arch)
    m.num("block_count", n + 1)
    m.num("context_length", c["max_position_embeddings"])
    m.num("embedding_length", c["hidden_size"])
    m.num("feed_forward_length", c["intermediate_size"])
    m.num("attention.head_count", c["num_attention_heads"])
    m.num("attention.head_count_kv", c["num_key_value_heads"])
    m.m[f"{arch}.rope.dimension_sections"] = mx.array(rp["mrope_section"] + [0], dtype=mx.int32)
    m.f32("rope.freq_base", rp["rope_theta"])
    m.f32("attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    if c.get("num_experts"):
        m.num("expert_count", c["num_experts"])
        m.num("expert_used_count", c["num_experts_per_tok"])
        m.num("expert_feed_forward_length", c["moe_intermediate_size"])
        m.num("expert_shared_feed_forward_length", c["shared_expert_intermediate_size"])
    m.num("attention.key_length", c["head_dim"])
    m.num("attention.value_length", c["head_dim"])
    m.num("ssm.conv_kernel", c["linear_conv_kernel_dim"])
    m.num("ssm.state_size", dk)
    m.num("ssm.group_count", nk)
    m.num("ssm.time_step_rank", nv)
    m.num("ssm.inner_size", dv * nv)
    m.m[f"{arch}.attention.recurrent_layers"] = mx.array(
        [t == "linear_attention" for t in c["layer_types"]] + [False]
    )
    m.num("full_attention_interval", c["full_attention_interval"])
    m.num("rope.dimension_count", int(c["head_dim"] * rp["partial_rotary_factor"]))
    m.num("nextn_predict_layers", 1)
    m.m["tokenizer.ggml.model"] = "gpt2"
    m.m["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(c["vocab_size"])]
    path = write_gguf(name, gguf, m)

    # Read back into a fresh mlx-lm model, undoing each conversion.
    loaded = mx.load(path)
    inv = {v: k for k, v in QWEN35_PARTS.items()}
    back = {}
    for k, v in loaded.items():
        if k.startswith(f"blk.{n}."):
            continue
        if not k.startswith("blk."):
            module, suffix = k.rsplit(".", 1)
            back[f"language_model.{inv[module]}.{suffix}"] = v
            continue
        _, layer, rest = k.split(".", 2)
        p = f"model.layers.{layer}"
        if rest == "ssm_a":
            mk, v = f"{p}.linear_attn.A_log", mx.log(-v)
        elif rest == "ssm_dt.bias":
            mk = f"{p}.linear_attn.dt_bias"
        elif rest == "ssm_conv1d.weight":
            mk, v = f"{p}.linear_attn.conv1d.weight", v[..., None]
        else:
            module, suffix = rest.rsplit(".", 1)
            mk = f"{p}.{inv[module]}.{suffix}"
        if ".linear_attn." in mk and r > 1:
            if mk.endswith(("in_proj_qkv.weight", "conv1d.weight")):
                v = mx.concatenate([v[:qk], untile_v(v[qk:], 0, nk, r, dv)], axis=0)
            elif mk.endswith("in_proj_z.weight"):
                v = untile_v(v, 0, nk, r, dv)
            elif mk.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
                v = untile_v(v, 0, nk, r, 1)
            elif mk.endswith("out_proj.weight"):
                v = untile_v(v, 1, nk, r, dv)
        back["language_model." + mk] = v
    orig = dict(tree_flatten(model.parameters()))
    assert sorted(orig) == sorted(back), (sorted(orig), sorted(back))
    for k, v in back.items():
        if not k.endswith("A_log"):
            assert mx.array_equal(orig[k], v).item(), k
    module = __import__(f"mlx_lm.models.{model_type}", fromlist=["Model"])
    fresh = module.Model(module.ModelArgs.from_dict(c))
    fresh.load_weights(list(back.items()), strict=True)
    mx.eval(fresh.parameters())
    record(fresh, name, __file__)


for _name, _c, _arch in [("qwen35", QWEN35, "qwen35"), ("qwen35moe", QWEN35MOE, "qwen35moe")]:
    if not ONLY or _name in ONLY:
        qwen35_case(_name, _c, _arch, seed_of(_name))
