"""GGUF name maps for llama.cpp's `deepseek2` architecture (MLA, DeepSeek V2 and V3): tiny
seeded mlx-lm models written as llama.cpp's converter (`DeepseekV2Model`) writes them, and
mlx-lm 0.32.2's logits on the same weights.

For each case: build `mlx_lm.models.<model_type>.Model` and seed it (normal * 0.3); take the
Hugging Face weights it stands for (deepseek_v3's `embed_q` / `unembed_out` are the two halves
of an HF `kv_b_proj`); convert them as `convert_hf_to_gguf.py` does: experts already stacked
(`ffn_{gate,up,down}_exps`), `kv_b_proj` split per head into `attn_k_b` (transposed) and
`attn_v_b` (or kept whole as `attn_kv_b`, as converters before that split did),
`e_score_correction_bias` as `exp_probs_b.bias`, `num_key_value_heads` written as 1, the
MLA lengths (`key_length` = kv_lora_rank + rope dims, `key_length_mla` = nope + rope dims; the
older files' `key_length` = nope + rope dims), `expert_gating_func` from `scoring_func`, YaRN as
`rope.scaling.*` (beta_fast / beta_slow included) with `yarn_log_multiplier` = 0.1 * mscale_all_dim. The file is written with
`mx.save_gguf` (f32, lossless: the tensors read back with `mx.load` are checked equal to those
written) to mlx-models/tests/models/gguf/<name>.gguf; the model's prefill, cached decode steps
and a cache-less forward go to mlx-models/tests/goldens/gguf/<golden>.safetensors.
Case names after the script regenerate only those.
Run with `cargo xtask goldens gguf_mla`.
"""

import mlx.core as mx
from mlx.utils import tree_flatten

from gguf_golden import Meta, only, record, seeded_model, write_gguf

COMMON = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 12,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
}

# name: (model_type, config overrides, kv_b layout ("split" | "whole"), golden name)
CASES = {
    # DeepSeek V2 (-Lite's shape): softmax router, q_lora_rank None (attn_q), YaRN.
    "deepseek2_v2": (
        "deepseek_v2",
        {
            "q_lora_rank": None,
            "scoring_func": "softmax",
            "topk_method": "greedy",
            "routed_scaling_factor": 1.0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
            },
        },
        "split",
        "deepseek2_v2",
    ),
    # The same weights as a converter before the k_b / v_b split wrote them.
    "deepseek2_v2_kvb": (None, None, "whole", "deepseek2_v2"),
    # DeepSeek V3: q_lora_rank, sigmoid router with the correction bias, groups, top-k
    # renormalized and scaled; no rope scaling.
    "deepseek2_v3": (
        "deepseek_v3",
        {
            "q_lora_rank": 24,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "norm_topk_prob": True,
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
            "rope_scaling": None,
        },
        "split",
        "deepseek2_v3",
    ),
    # Mistral Small 4 (llama.cpp's `mistral4`: its DeepseekV2Model under another name):
    # softmax router without a gating key, q_lora_rank, the experts' gate and up fused
    # (`ffn_gate_up_exps`), YaRN from rope_parameters; no Llama 4 query scale in the file
    # (the HF converter writes none), so its beta is 0.
    "mistral4": (
        "mistral4",
        {
            "q_lora_rank": 24,
            "norm_topk_prob": True,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.5,
            "rope_parameters": {
                "type": "yarn",
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.0,
            },
        },
        "split",
        "mistral4",
    ),
    # DeepSeek V3.2 (llama.cpp's `deepseek32`: DeepseekV2Model plus the sparse-attention
    # indexer's tensors and its head count, head size and top-k). Its top-k (8) is below the
    # recorded sequence (15), so the indexer selects keys in the later steps.
    "deepseek32": (
        "deepseek_v32",
        {
            "q_lora_rank": 24,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "norm_topk_prob": True,
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
            "rope_scaling": None,
            "index_n_heads": 2,
            "index_head_dim": 16,
            "index_topk": 8,
        },
        "split",
        "deepseek32",
    ),
    # GLM-5 (llama.cpp's `glm-dsa`, mlx-lm's `glm_moe_dsa`: deepseek_v32 with rope_parameters and
    # an interleaved indexer rope): DeepseekV2Model's keys, the rope width
    # (qk_rope_head_dim * partial_rotary_factor, 1 here), the indexer's keys; its MTP layer
    # count is written only where the checkpoint has one (none here).
    "glm_dsa": (
        "glm_moe_dsa",
        {
            "q_lora_rank": 24,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "norm_topk_prob": True,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "index_n_heads": 2,
            "index_head_dim": 16,
            "index_topk": 8,
        },
        "split",
        "glm_dsa",
    ),
}

# mlx-lm names (HF's, experts stacked) -> llama.cpp's (gguf-py's tensor_mapping.py).
PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
    "self_attn.o_proj": "attn_output",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
    "mlp.switch_mlp.up_proj": "ffn_up_exps",
    "mlp.switch_mlp.down_proj": "ffn_down_exps",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
    "self_attn.indexer.wq_b": "indexer.attn_q_b",
    "self_attn.indexer.wk": "indexer.attn_k",
    "self_attn.indexer.k_norm": "indexer.k_norm",
    "self_attn.indexer.weights_proj": "indexer.proj",
}


def to_gguf_name(name):
    if name.endswith("mlp.gate.e_score_correction_bias"):
        layer = name.split(".")[2]
        return f"blk.{layer}.exp_probs_b.bias"
    module, suffix = name.rsplit(".", 1)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if module in top:
        return f"{top[module]}.{suffix}"
    _, _, layer, part = module.split(".", 3)
    return f"blk.{layer}.{PARTS[part]}.{suffix}"


def hf_weights(model, c):
    """The HF checkpoint the mlx-lm model stands for (deepseek_v3's sanitize, inverted)."""
    w = dict(tree_flatten(model.parameters()))
    h, nope, v, r = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}.self_attn"
        if f"{p}.embed_q.weight" in w:
            wk = w.pop(f"{p}.embed_q.weight").swapaxes(-1, -2)  # (h, nope, r)
            wv = w.pop(f"{p}.unembed_out.weight")  # (h, v, r)
            w[f"{p}.kv_b_proj.weight"] = mx.concatenate([wk, wv], axis=1).reshape(h * (nope + v), r)
    return w


def convert(hf, c, layout):
    """convert_hf_to_gguf's DeepseekV2Model.modify_tensors on stacked experts (Mistral 4's
    gate and up experts fused, as its checkpoint stores them)."""
    h, nope, v = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    out = {}
    if c["model_type"] == "mistral4":
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}.mlp.switch_mlp"
            if f"{p}.gate_proj.weight" in hf:
                gate, up = hf.pop(f"{p}.gate_proj.weight"), hf.pop(f"{p}.up_proj.weight")
                out[f"blk.{l}.ffn_gate_up_exps.weight"] = mx.concatenate([gate, up], axis=1)
    for k, a in hf.items():
        if k.endswith("kv_b_proj.weight") and layout == "split":
            kv_b = a.reshape(h, nope + v, a.shape[-1])
            k_b, v_b = kv_b[:, :nope, :], kv_b[:, nope:, :]
            layer = k.split(".")[2]
            out[f"blk.{layer}.attn_k_b.weight"] = k_b.swapaxes(1, 2)
            out[f"blk.{layer}.attn_v_b.weight"] = v_b
            continue
        out[to_gguf_name(k)] = a
    return {k: mx.contiguous(a) for k, a in out.items()}


def metadata(c, layout):
    arch = {"mistral4": "mistral4", "deepseek_v32": "deepseek32", "glm_moe_dsa": "glm-dsa"}.get(
        c["model_type"], "deepseek2")
    meta = Meta(arch)
    m, num = meta.m, meta.num

    num("context_length", c["max_position_embeddings"])
    num("embedding_length", c["hidden_size"])
    num("block_count", c["num_hidden_layers"])
    num("feed_forward_length", c["intermediate_size"])
    num("attention.head_count", c["num_attention_heads"])
    num("attention.head_count_kv", 1)  # MLA written as MQA
    num("rope.freq_base", c["rope_theta"], mx.float32)
    num("attention.layer_norm_rms_epsilon", c["rms_norm_eps"], mx.float32)
    num("expert_used_count", c["num_experts_per_tok"])
    if "scoring_func" in c:
        num("expert_gating_func", {"softmax": 1, "sigmoid": 2}[c["scoring_func"]])
    if c.get("n_group") is not None:
        num("expert_group_count", c["n_group"])
        num("expert_group_used_count", c["topk_group"])
    num("leading_dense_block_count", c["first_k_dense_replace"])
    num("vocab_size", c["vocab_size"])
    if c.get("q_lora_rank") is not None:
        num("attention.q_lora_rank", c["q_lora_rank"])
    num("attention.kv_lora_rank", c["kv_lora_rank"])
    if layout == "split":
        num("attention.key_length", c["kv_lora_rank"] + c["qk_rope_head_dim"])
        num("attention.value_length", c["kv_lora_rank"])
        num("attention.key_length_mla", c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
        num("attention.value_length_mla", c["v_head_dim"])
    else:
        num("attention.key_length", c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
        num("attention.value_length", c["v_head_dim"])
    num("expert_feed_forward_length", c["moe_intermediate_size"])
    num("expert_count", c["n_routed_experts"])
    num("expert_shared_count", c["n_shared_experts"])
    num("expert_weights_scale", c["routed_scaling_factor"], mx.float32)
    if c.get("norm_topk_prob"):
        m[f"{arch}.expert_weights_norm"] = mx.array(True)
    num("rope.dimension_count", c["qk_rope_head_dim"])
    rs = c.get("rope_parameters") or c.get("rope_scaling")
    if rs and rs.get("rope_type") != "default":
        m[f"{arch}.rope.scaling.type"] = "yarn"
        num("rope.scaling.factor", rs["factor"], mx.float32)
        num("rope.scaling.original_context_length", rs["original_max_position_embeddings"])
        num("rope.scaling.yarn_beta_fast", rs["beta_fast"], mx.float32)
        num("rope.scaling.yarn_beta_slow", rs["beta_slow"], mx.float32)
        num("rope.scaling.yarn_log_multiplier", 0.1 * rs["mscale_all_dim"], mx.float32)
    if arch in ("deepseek32", "glm-dsa"):
        num("attention.indexer.head_count", c["index_n_heads"])
        num("attention.indexer.key_length", c["index_head_dim"])
        num("attention.indexer.top_k", c["index_topk"])
    return m


ONLY = only()
built = {}
for i, (name, (model_type, overrides, layout, golden)) in enumerate(CASES.items()):
    if model_type is None:  # the weights of the case its golden names
        model_type, overrides, _, _ = CASES[golden]
        seed_index = list(CASES).index(golden)
    else:
        seed_index = i
    config = {**COMMON, "model_type": model_type, **overrides}
    _, model = seeded_model(model_type, config, 3000 + seed_index)
    if ONLY and name not in ONLY:
        continue
    write_gguf(name, convert(hf_weights(model, config), config, layout), metadata(config, layout))
    if golden != name:
        continue

    record(model, golden, __file__)
