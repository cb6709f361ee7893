"""Issue #32's types (the dense rest and the text towers of multimodal wrappers): tiny seeded
models built by mlx-lm 0.32.2's own model classes, and what mlx-lm computes on them.

For each row of CASES: build `mlx_lm.models.<module>.Model(ModelArgs.from_dict(config))`,
seed its random init (normal * 0.3), cast / quantize it (`nn.quantize` with the model's own
`quant_predicate` where it has one, as `mlx_lm.convert` does), save it as an HF-style
directory under mlx-models/tests/models/dense2/<name>/ (config.json + model.safetensors), load
it back with mlx_lm.utils.load_model (sanitize and the quantization predicate run as for a
user), then record:
- mlx-models/tests/goldens/dense2/<name>.safetensors: `prefill` logits with a fresh
  `make_prompt_cache` cache, `step<i>` logits of each greedy token fed through the cache,
  `full` logits of one cache-less forward over prompt + generated (metadata `greedy`);
- mlx-cli/tests/goldens/cli_dense2.json: `generate_step`'s greedy ids, chosen
  log-probabilities and per-step top-5 `[id, logprob, f32 bits]` on a 40-token prompt
  (the format of goldens_cli_models.py, which `mlx-cli/tests/dense2_cli.rs` reads).

deepseek_v41's float32 fixture is also written under the published checkpoint's names
(mlx-models/tests/models/deepseek_v41_published/, checked to load to the same logits in mlx-lm)
and, with random fp8/fp4 codes in the published packing, as dense2/deepseek_v41_fp8 (goldens
as for the cases).

Run with `cargo xtask goldens dense2` (pass case names to regenerate only those; the CLI
golden keeps the other cases it already holds).
"""

import importlib
import json
import os
import pathlib
import shutil
import struct
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from golden import Golden

BASE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 96,
}

TEXT = dict(BASE)

# name: (model_type, overrides, dtype, (group_size, bits) or None)
CASES = {
    "qwen": (
        "qwen",
        {"kv_channels": 8, "layer_norm_epsilon": 1e-6, "max_position_embeddings": 512},
        "float32",
        None,
    ),
    "qwen_bias_q4": (
        "qwen",
        {"kv_channels": 8, "no_bias": False, "intermediate_size": 128},
        "float32",
        (32, 4),
    ),
    "lille_130m": (
        "lille-130m",
        {"vocab_size": 96, "n_embd": 64, "n_head": 4, "n_kv_heads": 2, "n_layer": 2, "block_size": 64,
         "layer_norm_eps": 1e-5, "rope_theta": 10000.0},
        "float32",
        None,
    ),
    "lille_130m_bf16": (
        "lille-130m",
        {"vocab_size": 96, "n_embd": 64, "n_head": 4, "n_kv_heads": 4, "n_layer": 2, "block_size": 64,
         "layer_norm_eps": 1e-5, "rope_theta": 500000.0},
        "bfloat16",
        None,
    ),
    # Qwen2-VL's flat config (no text_config: the whole config is the text model's).
    "qwen2_vl": ("qwen2_vl", {"tie_word_embeddings": False, "rope_theta": 10000.0}, "float32", None),
    "qwen2_vl_q4": (
        "qwen2_vl",
        {"text_config": {**TEXT, "model_type": "qwen2", "tie_word_embeddings": True}},
        "float32",
        (32, 4),
    ),
    "qwen3_vl": (
        "qwen3_vl",
        {"text_config": {**TEXT, "model_type": "qwen3", "head_dim": 8, "max_position_embeddings": 512,
                         "tie_word_embeddings": False, "rope_theta": 10000.0}},
        "bfloat16",
        None,
    ),
    "qwen3_vl_q4": (
        "qwen3_vl",
        {"text_config": {**TEXT, "model_type": "qwen3", "head_dim": 16, "max_position_embeddings": 512,
                         "tie_word_embeddings": True, "rope_theta": 1000000.0}},
        "float32",
        (32, 4),
    ),
    "pixtral": (
        "pixtral",
        {"text_config": {**TEXT, "model_type": "mistral", "head_dim": 8, "rope_theta": 1000000000.0}},
        "float32",
        None,
    ),
    "pixtral_q4": (
        "pixtral",
        {"text_config": {k: v for k, v in TEXT.items() if k != "num_attention_heads"} | {"model_type": "llama", "num_key_value_heads": 8, "hidden_size": 256, "head_dim": 8}},
        "float32",
        (32, 4),
    ),
    "plamo": ("plamo", {"n_shared_head": 2, "rope_theta": 10000.0}, "float32", None),
    "plamo_q4": ("plamo", {"n_shared_head": 4, "num_attention_heads": 4}, "float32", (32, 4)),
    "plamo_bf16": ("plamo", {"n_shared_head": 2, "rope_traditional": True}, "bfloat16", None),
    "openelm": (
        "openelm",
        {"head_dim": 8, "num_transformer_layers": 3, "model_dim": 32, "vocab_size": 96,
         "ffn_dim_divisor": 16, "num_query_heads": [2, 4, 4], "num_kv_heads": [1, 2, 4],
         "ffn_multipliers": [0.5, 1.0, 2.3]},
        "float32",
        None,
    ),
    "openelm_q4": (
        "openelm",
        {"head_dim": 16, "num_transformer_layers": 2, "model_dim": 64, "vocab_size": 96,
         "ffn_dim_divisor": 32, "num_query_heads": [4, 2], "num_kv_heads": [2, 2],
         "ffn_multipliers": [1.0, 1.5], "share_input_output_layers": False,
         "normalize_qk_projections": False, "rope_freq_constant": 500000},
        "float32",
        (32, 4),
    ),
    "lfm2_vl": (
        "lfm2-vl",
        {"text_config": {"model_type": "lfm2", "vocab_size": 96, "hidden_size": 32,
                         "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "max_position_embeddings": 512, "norm_eps": 1e-5, "conv_bias": True,
                         "conv_L_cache": 3, "block_dim": 32, "block_multiple_of": 16,
                         "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
                         "block_ff_dim": 96, "layer_types": ["conv", "full_attention", "conv"]}},
        "float32",
        None,
    ),
    "qwen3_vl_moe": (
        "qwen3_vl_moe",
        {"text_config": {**TEXT, "model_type": "qwen3_vl_moe_text", "intermediate_size": 96,
                         "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                         "mlp_only_layers": [1], "moe_intermediate_size": 32, "head_dim": 8,
                         "tie_word_embeddings": False, "max_position_embeddings": 512,
                         "norm_topk_prob": True, "rope_theta": 10000.0}},
        "float32",
        None,
    ),
    "qwen3_vl_moe_q4": (
        "qwen3_vl_moe",
        {"text_config": {**TEXT, "model_type": "qwen3_vl_moe_text", "intermediate_size": 96,
                         "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                         "mlp_only_layers": [], "moe_intermediate_size": 32, "head_dim": 16,
                         "tie_word_embeddings": False, "max_position_embeddings": 512,
                         "norm_topk_prob": False, "rope_theta": 1000000.0, "hidden_size": 64}},
        "float32",
        (32, 4),
    ),
    "nanbeige": ("nanbeige", {"num_loops": 2, "tie_word_embeddings": True}, "float32", None),
    "nanbeige_skip_bf16": (
        "nanbeige",
        {"loop_loss_weights": [0.5, 0.5], "skip_loop_final_norm": True, "head_dim": 16,
         "attention_bias": True},
        "bfloat16",
        None,
    ),
    "nanbeige_q4": ("nanbeige", {"max_position_embeddings": 512, "rope_theta": 500000.0}, "float32", (32, 4)),
    "plamo3": (
        "plamo3",
        {"num_hidden_layers": 3, "head_dim": 8, "window_size": 4, "sliding_window_pattern": 2,
         "max_position_embeddings": 512, "tie_word_embeddings": False},
        "float32",
        None,
    ),
    "plamo3_bf16": (
        "plamo3",
        {"head_dim": 16, "sliding_window": 3, "sliding_window_pattern": 2, "rope_local_theta": 500.0},
        "bfloat16",
        None,
    ),
    "plamo3_q4": ("plamo3", {"head_dim": 8, "window_size": 6, "sliding_window_pattern": 1}, "float32", (32, 4)),
    "talkie": (
        "talkie",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
         "intermediate_size": 64, "vocab_size": 96, "rope_theta": 10000.0},
        "float32",
        None,
    ),
    "talkie_bf16": (
        "talkie",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 16,
         "intermediate_size": 48, "vocab_size": 96, "max_position_embeddings": 64},
        "bfloat16",
        None,
    ),
    "talkie_q4": (
        "talkie",
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
         "intermediate_size": 64, "vocab_size": 96},
        "float32",
        (32, 4),
    ),
    "muse_glimmer": (
        "muse_glimmer",
        {"hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 96, "sliding_window": 4,
         "rope_theta": 10000.0, "final_logit_softcapping": 5.0},
        "float32",
        None,
    ),
    "muse_glimmer_bf16": (
        "muse_glimmer",
        {"text_config": {"hidden_size": 32, "num_hidden_layers": 3, "intermediate_size": 48,
                         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                         "vocab_size": 96, "sliding_window": 3,
                         "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                         "layer_rope_theta": [10000.0, 1000.0, 0],
                         "rope_parameters": {"rope_theta": 20000.0}, "tie_word_embeddings": True}},
        "bfloat16",
        None,
    ),
    "muse_glimmer_q4": (
        "muse_glimmer",
        {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 96, "sliding_window": 6,
         "layer_types": ["full_attention", "sliding_attention"]},
        "float32",
        (32, 4),
    ),
    "gemma4": (
        "gemma4",
        {"vocab_size": 96,
         "text_config": {"hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 32,
                         "num_attention_heads": 2, "head_dim": 8, "global_head_dim": 16,
                         "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 8,
                         "vocab_size_per_layer_input": 128, "sliding_window": 8,
                         "sliding_window_pattern": 2, "max_position_embeddings": 512}},
        "float32",
        None,
    ),
    "gemma4_bf16": (
        "gemma4",
        {"vocab_size": 96,
         "text_config": {"hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 32,
                         "num_attention_heads": 2, "head_dim": 8, "global_head_dim": 16,
                         "num_key_value_heads": 1, "num_kv_shared_layers": 1,
                         "hidden_size_per_layer_input": 0, "sliding_window": 8,
                         "sliding_window_pattern": 2, "max_position_embeddings": 512}},
        "bfloat16",
        None,
    ),
    "gemma4_moe": (
        "gemma4",
        {"vocab_size": 96,
         "text_config": {"hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 32,
                         "num_attention_heads": 2, "head_dim": 8, "global_head_dim": 16,
                         "num_key_value_heads": 1, "num_kv_shared_layers": 2,
                         "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 128,
                         "sliding_window": 4, "sliding_window_pattern": 2,
                         "max_position_embeddings": 512, "enable_moe_block": True,
                         "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16}},
        "float32",
        None,
    ),
    # BitNet: L2 (mlx-lm runs BitLinear only in a Metal kernel): its model on the unpacked
    # weights is the reference (`unpack_bitlinear`).
    "bitnet": ("bitnet", {"head_dim": 8}, "float32", None),
    "bitnet_untied_bf16": (
        "bitnet",
        {"tie_word_embeddings": False, "attention_bias": True,
         "quantization_config": {"quant_method": "bitnet", "linear_class": "bitlinear"}},
        "bfloat16",
        None,
    ),
    # Per-layer blocks: full attention (GQA by n_heads_in_group), no-op and linear sub-blocks.
    "nemotron_nas": (
        "nemotron-nas",
        {"num_hidden_layers": 4, "rope_theta": 10000.0, "block_configs": [
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
            {"attention": {"no_op": True}, "ffn": {"replace_with_linear": True}},
            {"attention": {"replace_with_linear": True}, "ffn": {"no_op": True}},
            {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 0.5}},
        ]},
        "float32",
        None,
    ),
    "nemotron_nas_bf16": (
        "nemotron-nas",
        {"num_hidden_layers": 2, "hidden_act": "gelu_new", "tie_word_embeddings": True,
         "attention_bias": True, "mlp_bias": True, "block_configs": [
            {"attention": {"n_heads_in_group": 1}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"n_heads_in_group": 2}, "ffn": {"no_op": True}},
        ]},
        "bfloat16",
        None,
    ),
    "nemotron_nas_q4": (
        "nemotron-nas",
        {"num_hidden_layers": 2, "hidden_size": 64, "hidden_act": "relu",
         "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "block_configs": [
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.3}},
            {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 1.0}},
        ]},
        "float32",
        (32, 4),
    ),
    # Two loops over the same layers: the second mixes global attention over the first loop's
    # keys with its own sliding window (a RotatingKVCache that wraps on the 40-token prompt).
    "iquestloopcoder": (
        "iquestloopcoder",
        {"head_dim": 8, "loop_window_size": 6, "rope_theta": 10000.0},
        "float32",
        None,
    ),
    "iquestloopcoder_bf16": (
        "iquestloopcoder",
        {"head_dim": 16, "loop_window_size": 64, "tie_word_embeddings": True,
         "attention_bias": True, "mlp_bias": True},
        "bfloat16",
        None,
    ),
    "iquestloopcoder_q4": (
        "iquestloopcoder",
        {"head_dim": 8, "loop_window_size": 4, "hidden_size": 64},
        "float32",
        (32, 4),
    ),
    # Regular layers (fused qkv, traditional rope then q/k norms, fake 8-bit keys and values)
    # and KV-reuse layers attending over the last regular layer's keys and values. No 4-bit
    # case: mlx-lm's FusedLinear.to_quantized takes no `mode`, so nn.quantize fails on it
    # under mlx 0.32.4.
    "afm7": (
        "afm7",
        {"hidden_dim": 32, "num_layers": 4, "num_kv_reuse_layers": 2, "num_heads": 4,
         "num_kv_heads": 2, "rope_theta": 10000.0},
        "float32",
        None,
    ),
    "afm7_bf16": (
        "afm7",
        {"hidden_dim": 32, "num_layers": 3, "num_kv_reuse_layers": 1, "num_heads": 2,
         "num_kv_heads": 2, "hidden_dim_scale_factor": 2.0},
        "bfloat16",
        None,
    ),
    # Sliding / full layers (other head counts on the sliding ones), per-layer rope bases and
    # partial rotary factors, head-wise output gates, MoE layers with router_bias and a shared
    # expert, clamped SwiGLUs.
    "step3p5": (
        "step3p5",
        {"num_hidden_layers": 3, "num_attention_groups": 2, "head_dim": 8, "sliding_window": 6,
         "rope_theta": [10000.0, 5000.0, 10000.0], "partial_rotary_factors": [0.5, 1.0, 0.5],
         "attention_other_setting": {"num_attention_heads": 2, "num_attention_groups": 1},
         "moe_num_experts": 4, "moe_top_k": 2, "moe_intermediate_size": 16,
         "share_expert_dim": 32, "moe_router_scaling_factor": 2.0,
         "swiglu_limits": [None, 0.5, None], "swiglu_limits_shared": [0.7, None, 0.4]},
        "float32",
        None,
    ),
    "step3p5_q4": (
        "step3p5",
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_groups": 2, "head_dim": 16,
         "sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"],
         "use_head_wise_attn_gate": False, "moe_num_experts": 4, "moe_top_k": 2,
         "moe_intermediate_size": 32, "share_expert_dim": 32, "norm_expert_weight": False,
         "moe_layers_enum": "0,1"},
        "float32",
        (32, 4),
    ),
    # Griffin: recurrent blocks (gelu branch, causal conv, RG-LRU) and local attention over a
    # 6-token window (the 10-token prompt wraps it), Gemma norms, a tanh soft cap.
    "recurrent_gemma": (
        "recurrent_gemma",
        {"num_hidden_layers": 3, "attention_bias": False, "conv1d_width": 4,
         "logits_soft_cap": 3.0, "rope_theta": 10000.0, "attention_window_size": 6,
         "block_types": ["recurrent", "recurrent", "attention"]},
        "float32",
        None,
    ),
    "recurrent_gemma_bf16": (
        "recurrent_gemma",
        {"num_hidden_layers": 4, "attention_bias": False, "conv1d_width": 3,
         "logits_soft_cap": 0.0, "rope_theta": 10000.0, "attention_window_size": 4,
         "embeddings_scale_by_sqrt_dim": False, "_block_types": ["attention", "recurrent"]},
        "bfloat16",
        None,
    ),
    "recurrent_gemma_q4": (
        "recurrent_gemma",
        {"num_hidden_layers": 2, "attention_bias": False, "conv1d_width": 4,
         "logits_soft_cap": 30.0, "rope_theta": 10000.0, "attention_window_size": 8,
         "block_types": ["recurrent", "attention"]},
        "float32",
        (32, 4),
    ),
    # RWKV-7: token shifts, LoRA gates, the value residual of layer 0, the WKV-7 recurrence
    # (mlx-lm's plain-ops step off Metal), per-head LayerNorm, relu2 channel mixing.
    "rwkv7": (
        "rwkv7",
        {"num_hidden_layers": 3, "norm_eps": 1e-5, "head_dim": 8, "a_low_rank_dim": 8,
         "v_low_rank_dim": 4, "gate_low_rank_dim": 8, "decay_low_rank_dim": 4},
        "float32",
        None,
    ),
    "rwkv7_bf16": (
        "rwkv7",
        {"num_hidden_layers": 2, "norm_eps": 1e-5, "head_dim": 16, "a_low_rank_dim": 8,
         "v_low_rank_dim": 8, "gate_low_rank_dim": 8, "decay_low_rank_dim": 8,
         "tie_word_embeddings": True},
        "bfloat16",
        None,
    ),
    "rwkv7_q4": (
        "rwkv7",
        {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "norm_eps": 1e-5,
         "head_dim": 16, "a_low_rank_dim": 64, "v_low_rank_dim": 64, "gate_low_rank_dim": 64,
         "decay_low_rank_dim": 64},
        "float32",
        (32, 4),
    ),
    # Gear: full, sliding and conv-mixer layers (gated mixer over convolved keys and values),
    # Gemma sandwich norms, soft-capped attention in plain ops, a final soft cap.
    "gear": (
        "gear",
        {"num_hidden_layers": 4, "head_dim": 8, "sliding_window": 4, "conv_L_cache": 3,
         "layer_types": ["conv_mixer", "sliding_attention", "full_attention", "conv_mixer"],
         "attn_logit_softcapping": 5.0, "final_logit_softcapping": 4.0,
         "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_local_base_freq": 500.0},
        "float32",
        None,
    ),
    "gear_bf16": (
        "gear",
        {"num_hidden_layers": 3, "head_dim": 16, "num_key_value_heads": 1, "sliding_window": 6,
         "conv_L_cache": 4, "attention_bias": True, "hidden_activation": "silu",
         "query_pre_attn_scalar": 32.0,
         "layer_types": ["sliding_attention", "conv_mixer", "full_attention"]},
        "bfloat16",
        None,
    ),
    "gear_q4": (
        "gear",
        {"num_hidden_layers": 3, "head_dim": 8, "sliding_window": 8,
         "layer_types": ["full_attention", "conv_mixer", "sliding_attention"]},
        "float32",
        (32, 4),
    ),
    # PLaMo 2: Mamba layers (gate/input per head, causal conv, RMS-normed B/C/dt, ssm_attn with
    # one group) between attention layers (per-head q/k weights), offset RMS norms.
    "plamo2": (
        "plamo2",
        {"num_hidden_layers": 4, "hidden_size_per_head": 8, "mamba_d_state": 8,
         "mamba_d_conv": 4, "mamba_num_heads": 4, "mamba_step": 2, "intermediate_size": 32,
         "rms_norm_eps": 1e-6},
        "float32",
        None,
    ),
    "plamo2_bf16": (
        "plamo2",
        {"num_hidden_layers": 3, "hidden_size_per_head": 8, "mamba_d_state": 16,
         "mamba_d_conv": 3, "mamba_num_heads": 2, "mamba_step": 3, "intermediate_size": 32,
         "num_key_value_heads": 1, "tie_word_embeddings": False},
        "bfloat16",
        None,
    ),
    "plamo2_q4": (
        "plamo2",
        {"num_hidden_layers": 2, "hidden_size_per_head": 8, "mamba_d_state": 8,
         "mamba_d_conv": 4, "mamba_num_heads": 4, "mamba_step": 2, "intermediate_size": 32},
        "float32",
        (32, 4),
    ),
    # bfloat16 only without experts: MLX's CPU GatherMM (the experts) takes float32 only.
    # Kimi Linear: KDA layers (q/k/v short convolutions, per-channel gated delta rule, low-rank
    # forget and output gates) around an MLA layer without rope (mla_use_nope), DeepSeek-style
    # grouped sigmoid router with a correction bias and a shared expert.
    "kimi_linear": (
        "kimi_linear",
        {"num_hidden_layers": 3, "num_key_value_heads": 4, "head_dim": 8, "rope_theta": 10000.0,
         "model_max_length": 512, "num_experts": 4, "moe_intermediate_size": 16,
         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
         "mla_use_nope": True, "num_experts_per_token": 2, "num_shared_experts": 1,
         "first_k_dense_replace": 1, "num_expert_group": 2, "topk_group": 1,
         "routed_scaling_factor": 2.5,
         "linear_attn_config": {"num_heads": 4, "head_dim": 8, "kda_layers": [1, 3],
                                "short_conv_kernel_size": 4}},
        "float32",
        None,
    ),
    "kimi_linear_tied": (
        "kimi_linear",
        {"num_hidden_layers": 2, "num_key_value_heads": 4, "head_dim": 8, "rope_theta": 10000.0,
         "model_max_length": 512, "num_experts": 4, "moe_intermediate_size": 16,
         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 16,
         "num_experts_per_token": 2, "tie_word_embeddings": True,
         "linear_attn_config": {"num_heads": 2, "head_dim": 16, "kda_layers": [2],
                                "short_conv_kernel_size": 3}},
        "float32",
        None,
    ),
    "kimi_linear_bf16": (
        "kimi_linear",
        {"num_hidden_layers": 2, "num_key_value_heads": 4, "head_dim": 8, "rope_theta": 10000.0,
         "model_max_length": 512, "num_experts": 0, "moe_intermediate_size": 16,
         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
         "linear_attn_config": {"num_heads": 4, "head_dim": 8, "kda_layers": [1],
                                "short_conv_kernel_size": 2}},
        "bfloat16",
        None,
    ),
    "kimi_linear_q4": (
        "kimi_linear",
        {"hidden_size": 64, "num_hidden_layers": 2, "num_key_value_heads": 4, "head_dim": 32,
         "rope_theta": 10000.0, "model_max_length": 512, "num_experts": 4,
         "moe_intermediate_size": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
         "qk_rope_head_dim": 8, "v_head_dim": 32, "num_experts_per_token": 2,
         "num_shared_experts": 1,
         "linear_attn_config": {"num_heads": 2, "head_dim": 32, "kda_layers": [1],
                                "short_conv_kernel_size": 4}},
        "float32",
        (32, 4),
    ),
    # Bailing V3 (Ling 2.5 hybrid): KDA layers with a lower-bounded forget gate and MLA layers
    # (interleaved rope, sigmoid head gate) in groups of layer_group_size, a dense first layer,
    # then grouped sigmoid routing (-inf masked groups) with a shared expert.
    "bailing_moe_v3": (
        "bailing_moe_v3",
        {"num_hidden_layers": 3, "layer_group_size": 2, "head_dim": 8, "q_lora_rank": 16,
         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
         "num_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
         "moe_intermediate_size": 16, "moe_shared_expert_intermediate_size": 16,
         "rope_theta": 10000.0, "max_position_embeddings": 512},
        "float32",
        None,
    ),
    "bailing_moe_v3_tied": (
        "bailing_moe_v3",
        {"num_hidden_layers": 3, "layer_group_size": 3, "head_dim": 8, "q_lora_rank": None,
         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 16,
         "num_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
         "first_k_dense_replace": 0, "moe_intermediate_size": 16,
         "moe_shared_expert_intermediate_size": 8, "num_shared_experts": 2,
         "short_conv_kernel_size": 3, "kda_lower_bound": -3.0, "tie_word_embeddings": True,
         "rope_theta": 10000.0, "max_position_embeddings": 512},
        "float32",
        None,
    ),
    "bailing_moe_v3_bf16": (
        "bailing_moe_v3",
        {"num_hidden_layers": 2, "layer_group_size": 2, "head_dim": 8, "q_lora_rank": 16,
         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
         "first_k_dense_replace": 2, "rope_theta": 10000.0, "max_position_embeddings": 512},
        "bfloat16",
        None,
    ),
    "bailing_moe_v3_q4": (
        "bailing_moe_v3",
        {"hidden_size": 64, "num_hidden_layers": 3, "layer_group_size": 2, "head_dim": 32,
         "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
         "v_head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "n_group": 2,
         "topk_group": 1, "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32,
         "rope_theta": 10000.0, "max_position_embeddings": 512},
        "float32",
        (32, 4),
    ),
    # Bailing linear (Ling linear): gated linear attention layers (ALiBi-slope decay, grouped
    # RMS norm, sigmoid gate) with a softmax attention layer closing each group, bailing_moe's
    # routing (plain ops) and shared experts. bfloat16 only without experts (GatherMM).
    "bailing_moe_linear": (
        "bailing_moe_linear",
        {"num_hidden_layers": 3, "layer_group_size": 2, "head_dim": 8, "max_position_embeddings": 512,
         "rope_theta": 10000.0, "moe_intermediate_size": 16, "num_experts": 4,
         "num_shared_experts": 1, "norm_topk_prob": True, "num_experts_per_tok": 2,
         "first_k_dense_replace": 1, "group_norm_size": 2, "use_qk_norm": True,
         "partial_rotary_factor": 0.5, "score_function": "sigmoid",
         "moe_router_enable_expert_bias": True, "n_group": 2, "topk_group": 1,
         "routed_scaling_factor": 2.0},
        "float32",
        None,
    ),
    "bailing_moe_linear_bf16": (
        "bailing_moe_linear",
        {"num_hidden_layers": 3, "layer_group_size": 3, "max_position_embeddings": 512,
         "rope_theta": 10000.0, "moe_intermediate_size": 16, "num_experts": 4,
         "num_shared_experts": 0, "norm_topk_prob": False, "num_experts_per_tok": 2,
         "first_k_dense_replace": 3, "group_norm_size": 4, "use_bias": True,
         "use_qkv_bias": True, "rope_traditional": True, "tie_word_embeddings": True},
        "bfloat16",
        None,
    ),
    "bailing_moe_linear_q4": (
        "bailing_moe_linear",
        {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 2,
         "layer_group_size": 2, "max_position_embeddings": 512, "rope_theta": 10000.0,
         "moe_intermediate_size": 32, "num_experts": 4, "num_shared_experts": 1,
         "norm_topk_prob": True, "num_experts_per_tok": 2, "first_k_dense_replace": 0,
         "group_norm_size": 2, "norm_head": True},
        "float32",
        (32, 4),
    ),
    # Bailing hybrid: the same linear layers run chunked (one compiled step per token, a float32
    # state), MLA layers with biased latent projections closing each group, -inf group masking.
    "bailing_hybrid": (
        "bailing_hybrid",
        {"num_hidden_layers": 3, "num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
         "num_shared_experts": 1, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
         "layer_group_size": 2, "group_norm_size": 2, "rope_theta": 10000.0,
         "max_position_embeddings": 512, "routed_scaling_factor": 2.0, "head_dim": 8,
         "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
         "q_lora_rank": 16, "moe_intermediate_size": 16, "use_qkv_bias": True},
        "float32",
        None,
    ),
    "bailing_hybrid_bf16": (
        "bailing_hybrid",
        {"num_hidden_layers": 3, "num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
         "num_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 3,
         "layer_group_size": 3, "group_norm_size": 4, "rope_theta": 10000.0,
         "max_position_embeddings": 512, "routed_scaling_factor": 1.0, "head_dim": 16,
         "kv_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 16,
         "moe_intermediate_size": 16, "partial_rotary_factor": 1.0, "use_bias": True,
         "use_qk_norm": False, "tie_word_embeddings": True},
        "bfloat16",
        None,
    ),
    "bailing_hybrid_q4": (
        "bailing_hybrid",
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
         "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "n_group": 1,
         "topk_group": 1, "first_k_dense_replace": 0, "layer_group_size": 2, "group_norm_size": 2,
         "rope_theta": 10000.0, "max_position_embeddings": 512, "routed_scaling_factor": 2.5,
         "head_dim": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 32,
         "v_head_dim": 32, "moe_intermediate_size": 32, "score_function": "softmax",
         "moe_shared_expert_intermediate_size": 32},
        "float32",
        (32, 4),
    ),
    # MiniMax M3 (its text model): Gemma-normed q/k, partial rope, block-sparse attention
    # layers (the indexer keeps the best key block per query plus the local one: 3 blocks of 4
    # over the 10-token prompt), sigmoid routing over a correction bias with GPT-OSS SwiGLU
    # experts and a shared expert, a dense first layer.
    "minimax_m3_vl": (
        "minimax_m3_vl",
        {"text_config": {"hidden_size": 32, "intermediate_size": 16, "dense_intermediate_size": 64,
                         "shared_intermediate_size": 16, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "num_hidden_layers": 3, "num_local_experts": 4,
                         "num_experts_per_tok": 2, "max_position_embeddings": 512,
                         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "head_dim": 8,
                         "vocab_size": 96, "mlp_layer_types": ["dense", "sparse", "sparse"],
                         "sparse_attention_config": {"sparse_num_index_heads": 2,
                                                     "sparse_index_dim": 8, "sparse_block_size": 4,
                                                     "sparse_topk_blocks": 1, "sparse_local_block": 1,
                                                     "sparse_attention_freq": [0, 1, 1]}}},
        "float32",
        None,
    ),
    "minimax_m3_vl_bf16": (
        "minimax_m3_vl",
        {"text_config": {"hidden_size": 32, "dense_intermediate_size": 48, "num_attention_heads": 4,
                         "num_key_value_heads": 1, "num_hidden_layers": 2, "num_local_experts": 4,
                         "max_position_embeddings": 512, "rope_theta": 10000.0, "head_dim": 8,
                         "partial_rotary_factor": 1.0, "vocab_size": 96,
                         "moe_layer_freq": [0, 0], "use_gemma_norm": False, "tie_word_embeddings": True,
                         "index_n_heads": 1, "index_head_dim": 4, "index_block_size": 3,
                         "index_topk_blocks": 2, "index_local_blocks": 0}},
        "bfloat16",
        None,
    ),
    "minimax_m3_vl_q4": (
        "minimax_m3_vl",
        {"text_config": {"hidden_size": 64, "intermediate_size": 32, "dense_intermediate_size": 64,
                         "shared_intermediate_size": 32, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "num_hidden_layers": 2, "num_local_experts": 4,
                         "num_experts_per_tok": 2, "max_position_embeddings": 512,
                         "rope_theta": 10000.0, "head_dim": 16, "vocab_size": 96,
                         "layer_types": ["full_attention", "sparse"], "index_n_heads": 2,
                         "index_head_dim": 16, "index_block_size": 4, "index_topk_blocks": 2}},
        "float32",
        (32, 4),
    ),
    # Kimi K3: KDA layers with one fused qkv projection and convolution (lower-bounded or
    # plain forget gate, low-rank or full-rank output gate), NoPE MLA layers (q LoRA, sigmoid
    # output gate), SiTU MLPs and experts, a latent MoE (down, experts, norm, up) under the
    # compiled grouped sigmoid router, and attention residuals (blocks of attn_res_block_size
    # layers mixed by a compiled precise softmax).
    "kimi_k3": (
        "kimi_k3",
        {"text_config": {"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 4,
                         "intermediate_size": 64, "rms_norm_eps": 1e-5,
                         "activation_situ_beta": 2.0, "activation_situ_linear_beta": 3.0,
                         "attn_res_block_size": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
                         "mla_use_output_gate": True, "num_experts": 4,
                         "num_experts_per_token": 2, "num_shared_experts": 1,
                         "moe_intermediate_size": 16, "routed_scaling_factor": 2.5,
                         "first_k_dense_replace": 1, "num_expert_group": 2, "topk_group": 1,
                         "routed_expert_hidden_size": 16, "latent_moe_use_norm": True,
                         "linear_attn_config": {"num_heads": 4, "head_dim": 8,
                                                "kda_layers": [1, 3, 4],
                                                "short_conv_kernel_size": 4,
                                                "gate_lower_bound": -5.0}}},
        "float32",
        None,
    ),
    # The flat config (no text_config), tied embeddings, no attention residuals, q_proj
    # without LoRA, a full-rank KDA output gate without a lower bound, experts on the hidden
    # width, plain SiTU (beta 1, no linear clamp).
    "kimi_k3_flat": (
        "kimi_k3",
        {"num_hidden_layers": 3, "num_key_value_heads": 4, "kv_lora_rank": 16,
         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 16, "num_experts": 4,
         "num_experts_per_token": 2, "moe_intermediate_size": 16, "moe_layer_freq": 2,
         "tie_word_embeddings": True,
         "linear_attn_config": {"num_heads": 2, "head_dim": 16, "kda_layers": [2],
                                "short_conv_kernel_size": 3, "use_full_rank_gate": True}},
        "float32",
        None,
    ),
    # bfloat16 without experts (MLX's CPU GatherMM takes float32 only).
    "kimi_k3_bf16": (
        "kimi_k3",
        {"text_config": {"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 3,
                         "num_attention_heads": 4, "intermediate_size": 64,
                         "rms_norm_eps": 1e-5, "activation_situ_beta": 1.5,
                         "attn_res_block_size": 1, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                         "qk_rope_head_dim": 8, "v_head_dim": 8,
                         "linear_attn_config": {"num_heads": 4, "head_dim": 8,
                                                "kda_layers": [1, 2],
                                                "short_conv_kernel_size": 2,
                                                "gate_lower_bound": -3.0}}},
        "bfloat16",
        None,
    ),
    "kimi_k3_q4": (
        "kimi_k3",
        {"text_config": {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 3,
                         "num_attention_heads": 2, "intermediate_size": 64,
                         "rms_norm_eps": 1e-5, "activation_situ_linear_beta": 4.0,
                         "attn_res_block_size": 2, "q_lora_rank": 32, "kv_lora_rank": 32,
                         "qk_nope_head_dim": 32, "qk_rope_head_dim": 8, "v_head_dim": 32,
                         "mla_use_output_gate": True, "num_experts": 4,
                         "num_experts_per_token": 2, "num_shared_experts": 1,
                         "moe_intermediate_size": 32, "routed_expert_hidden_size": 32,
                         "linear_attn_config": {"num_heads": 2, "head_dim": 32,
                                                "kda_layers": [1, 3],
                                                "short_conv_kernel_size": 4,
                                                "gate_lower_bound": -5.0}}},
        "float32",
        (32, 4),
    ),
    # A Hadamard pack of Qwen 3.5 (prism_hadamard_qwen35): every linear and the embedding
    # 2-bit affine (group 128) with a signed blockwise Walsh-Hadamard rotation folded into the
    # input axis (blocks of 512 on the 512-wide inputs, none on the 128-wide ones), float16
    # activations; random packed weights, float16 scales and biases, random signs.
    "prism_hadamard_qwen35": (
        "prism_hadamard_qwen35",
        {"schema_version": 1, "tensor_namespace": "mlx-lm-text",
         "gdn_activation_layout": "grouped",
         "text_config": {"model_type": "qwen3_5", "vocab_size": 96, "hidden_size": 512,
                         "num_hidden_layers": 2, "full_attention_interval": 2,
                         "intermediate_size": 128, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
                         "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                         "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                         "linear_conv_kernel_dim": 4, "max_position_embeddings": 512,
                         "tie_word_embeddings": True,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25}}},
        "float16",
        "prism",
    ),
    # Gemma 3n's text model (`text_config`): AltUp over 4 streams (prediction and correction
    # coefficients clipped in float32), Laurel, per-layer inputs (ids past
    # vocab_size_per_layer_input read row 0), the trailing num_kv_shared_layers layers reading
    # the last earlier layer of their type's cache (their own K/V without a cache), a sliding
    # window shorter than the prompts, gaussian top-k sparsity on the first layers, per-layer
    # MLP widths, the compiled logit soft-cap.
    "gemma3n": (
        "gemma3n",
        {"text_config": {"model_type": "gemma3n_text", "hidden_size": 32, "num_hidden_layers": 5,
                         "intermediate_size": [64, 48, 64, 64, 32], "num_attention_heads": 4,
                         "head_dim": 8, "rms_norm_eps": 1e-6, "vocab_size": 96,
                         "num_key_value_heads": 2, "num_kv_shared_layers": 2,
                         "vocab_size_per_layer_input": 64, "sliding_window": 4,
                         "max_position_embeddings": 512, "rope_local_base_freq": 10000.0,
                         "rope_theta": 1000000.0, "final_logit_softcapping": 30.0,
                         "layer_types": ["sliding_attention", "full_attention",
                                         "sliding_attention", "sliding_attention",
                                         "full_attention"],
                         "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0],
                         "hidden_size_per_layer_input": 8, "altup_num_inputs": 4,
                         "altup_coef_clip": 120.0, "altup_correct_scale": True,
                         "altup_active_idx": 0, "laurel_rank": 8, "rope_scaling": None}},
        "float32",
        None,
    ),
    # bfloat16, 3 AltUp streams with the active one second, coefficients clipped at 0.2, no
    # soft-cap, no output scale, no sparsity pattern, one KV-shared layer, one MLP width.
    "gemma3n_bf16": (
        "gemma3n",
        {"text_config": {"model_type": "gemma3n_text", "hidden_size": 32, "num_hidden_layers": 4,
                         "intermediate_size": 64, "num_attention_heads": 2, "head_dim": 16,
                         "rms_norm_eps": 1e-6, "vocab_size": 96, "num_key_value_heads": 1,
                         "num_kv_shared_layers": 1, "vocab_size_per_layer_input": 96,
                         "sliding_window": 6, "max_position_embeddings": 512,
                         "rope_local_base_freq": 10000.0, "rope_theta": 500000.0,
                         "final_logit_softcapping": None,
                         "layer_types": ["full_attention", "sliding_attention",
                                         "sliding_attention", "sliding_attention"],
                         "activation_sparsity_pattern": None,
                         "hidden_size_per_layer_input": 8, "altup_num_inputs": 3,
                         "altup_coef_clip": 0.2, "altup_correct_scale": False,
                         "altup_active_idx": 1, "laurel_rank": 4}},
        "bfloat16",
        None,
    ),
    # 4-bit (group 32): the per-layer embedding, projections and experts quantized; the
    # 4-input AltUp coefficients and 8-wide Laurel / per-layer projections stay float (their
    # inputs do not divide by the group, as mlx_lm.convert skips them).
    "gemma3n_q4": (
        "gemma3n",
        {"text_config": {"model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 4,
                         "intermediate_size": [64, 96, 64, 64], "num_attention_heads": 2,
                         "head_dim": 32, "rms_norm_eps": 1e-6, "vocab_size": 96,
                         "num_key_value_heads": 1, "num_kv_shared_layers": 2,
                         "vocab_size_per_layer_input": 80, "sliding_window": 5,
                         "max_position_embeddings": 512, "rope_local_base_freq": 10000.0,
                         "rope_theta": 1000000.0, "final_logit_softcapping": 30.0,
                         "layer_types": ["sliding_attention", "full_attention",
                                         "sliding_attention", "full_attention"],
                         "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0],
                         "hidden_size_per_layer_input": 8, "altup_num_inputs": 4,
                         "altup_coef_clip": 120.0, "altup_correct_scale": True,
                         "altup_active_idx": 0, "laurel_rank": 32}},
        "float32",
        (32, 4),
    ),
    # DeepSeek V4.1 (deepseek_v41): hyper-connection streams mixed by Sinkhorn-normalized
    # matrices, a sliding window per layer plus compressed KV (gated pooling of `ratio` tokens,
    # or every token with ratio 1) read through an indexer's top-k (the first index layer also
    # picks candidate blocks for the later ones), FP8/FP4 fake quantization as plain ops,
    # sparse attention with sinks in float32, an inverse rope on the output, grouped low-rank
    # output projections, sqrt-softplus routing over clamped-SwiGLU experts and a shared MLP.
    # float32 and 4-bit (MLX's CPU GatherMM takes float32 only).
    "deepseek_v41": (
        "deepseek_v41",
        {"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
         "head_dim": 32, "q_lora_rank": 16, "qk_rope_head_dim": 8, "o_groups": 2,
         "o_lora_rank": 16, "moe_intermediate_size": 16, "n_routed_experts": 4,
         "num_experts_per_tok": 2, "sliding_window": 4, "compress_ratios": [0, 4, 1, 4],
         "kv_source_layer_ids": [1, 2, 3], "index_source_layer_ids": [1, 3],
         "candidate_source_layer_id": 1, "candidate_topk_blocks": 2, "candidate_block_size": 2,
         "index_n_heads": 2, "index_head_dim": 32, "index_topk": 3, "hc_mult": 2,
         "hc_sinkhorn_iters": 3, "rms_norm_eps": 1e-6, "swiglu_limit": 1.0,
         "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 64,
                          "beta_fast": 32, "beta_slow": 1}, "max_position_embeddings": 256},
        "float32",
        None,
    ),
    "deepseek_v41_q4": (
        "deepseek_v41",
        {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
         "head_dim": 64, "q_lora_rank": 32, "qk_rope_head_dim": 16, "o_groups": 2,
         "o_lora_rank": 32, "moe_intermediate_size": 32, "n_routed_experts": 4,
         "num_experts_per_tok": 2, "sliding_window": 5, "compress_ratios": [4, 0, 2],
         "kv_source_layer_ids": [0, 2], "index_source_layer_ids": [0, 2],
         "candidate_source_layer_id": -1, "index_n_heads": 2, "index_head_dim": 32,
         "index_topk": 2, "hc_mult": 3, "hc_sinkhorn_iters": 4, "scoring_func": "sigmoid",
         "routed_scaling_factor": 2.0, "gate_temp": 0.5, "rms_norm_eps": 1e-6},
        "float32",
        (32, 4),
    ),
}

# Cases whose config is only the overrides (no BASE keys at the top level).
NO_BASE = {"gemma4", "gemma4_bf16", "gemma4_moe", "muse_glimmer", "muse_glimmer_bf16", "muse_glimmer_q4", "talkie", "talkie_bf16", "talkie_q4", "lfm2_vl", "qwen3_vl_moe", "qwen3_vl_moe_q4", "openelm", "openelm_q4", "lille_130m", "lille_130m_bf16", "qwen3_vl", "qwen3_vl_q4", "pixtral", "pixtral_q4",
           "qwen2_vl_q4", "kimi_k3", "kimi_k3_bf16", "kimi_k3_q4",
           "prism_hadamard_qwen35", "gemma3n", "gemma3n_bf16", "gemma3n_q4",
           "deepseek_v41", "deepseek_v41_q4"}

PROMPT = [1, 17, 90, 5, 42, 42, 7, 88, 3, 64]
STEPS = 5
CLI_PROMPT = [(7 * i + 3) % 96 for i in range(40)]
CLI_MAX_TOKENS = 8
TOP = 5
MODELS = pathlib.Path("mlx-models/tests/models/dense2")
GOLDENS = pathlib.Path("mlx-models/tests/goldens/dense2")
CLI_GOLDEN = pathlib.Path("mlx-cli/tests/goldens/cli_dense2.json")


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def fill_bitlinear(model, dtype):
    """Random packed ternary weights (codes 0..2, four output rows a byte) and scales."""
    from mlx_lm.models.bitlinear_layers import BitLinear

    for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if isinstance(m, BitLinear):
            rows, cols = m.weight.shape
            codes = mx.random.randint(0, 3, (4, rows, cols)).astype(mx.uint8)
            m.weight = sum(codes[i] << (2 * i) for i in range(4)).astype(mx.uint8)
            m.weight_scale = mx.random.uniform(0.5, 2.0, (1,)).astype(getattr(mx, dtype))


def unpack_bitlinear(model):
    """BitLinear -> nn.Linear on the unpacked weights (mlx-lm multiplies packed weights only
    in a Metal kernel): ternary values in float32 times the scale (divided by it when
    inverted), cast to the scale's dtype, as the kernel scales its float32 sums."""
    from mlx_lm.models.bitlinear_layers import BitLinear

    swaps = []
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if isinstance(m, BitLinear):
            planes = [((m.weight >> (2 * i)) & 3).astype(mx.float32) - 1 for i in range(4)]
            s = m.weight_scale.astype(mx.float32)
            if m.invert_weight_scales:
                s = 1 / s
            w = (mx.concatenate(planes, axis=0) * s).astype(m.weight_scale.dtype)
            lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            lin.weight = w
            if m.bias is not None:
                lin.bias = m.bias
            swaps.append((path, lin))
    model.update_modules(tree_unflatten(swaps))
    return model


def prism_records(config):
    """The pack's manifest: every linear of the text model and its embedding, float16, a
    Hadamard block of 512 where the input is 512 wide, else none; its quantization block."""
    from mlx_lm.models import qwen3_5

    text = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(
        {"model_type": "qwen3_5", "text_config": config["text_config"]})).language_model
    records = []
    for path, m in text.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            width = m.weight.shape[1]
            records.append({"path": path, "embedding": isinstance(m, nn.Embedding),
                            "dtype": "float16", "block": 512 if width % 512 == 0 else 0})
    config["modules"] = sorted(records, key=lambda r: r["path"])
    config["quantization"] = {"bits": 2, "group_size": 128, "mode": "affine"}


def fill_prism(model):
    """Random 2-bit codes, float16 scales and biases, and +-1 signs for the packed modules."""
    from mlx_lm.models.prism_hadamard_qwen35 import HadamardQuantizedLinear

    for _, m in model.named_modules():
        if isinstance(m, HadamardQuantizedLinear):
            m.weight = mx.random.randint(0, 2**31, m.weight.shape).astype(mx.uint32) * 2 + \
                mx.random.randint(0, 2, m.weight.shape).astype(mx.uint32)
            m.scales = (mx.random.uniform(0.02, 0.08, m.scales.shape)).astype(mx.float16)
            m.biases = (-1.5 * m.scales.astype(mx.float32)).astype(mx.float16)
            if m.block:
                m.signs = mx.where(mx.random.uniform(shape=m.signs.shape) < 0.5, -1.0, 1.0)


def load(out_dir, model_type):
    model, _ = load_model(out_dir)
    return unpack_bitlinear(model) if model_type == "bitnet" else model


def build(i, name, model_type, overrides, dtype, quant):
    config = dict(overrides) if name in NO_BASE else {**BASE, **overrides}
    config["model_type"] = model_type
    arch = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(2000 + i)
    if quant == "prism":
        prism_records(config)
    model = arch.Model(arch.ModelArgs.from_dict(json.loads(json.dumps(config))))
    if "quantization_config" in config:
        from mlx_lm.models.bitlinear_layers import bitnet_quantize

        bitnet_quantize(model, config["quantization_config"])
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    model.set_dtype(getattr(mx, dtype))
    if model_type == "bitnet":
        fill_bitlinear(model, dtype)
    if quant == "prism":
        fill_prism(model)
    elif quant is not None:
        gs, bits_ = quant
        pred = getattr(model, "quant_predicate", None)
        config["quantization"] = {"group_size": gs, "bits": bits_}

        # As mlx_lm.convert: the model's own predicate, its per-module settings recorded.
        def class_predicate(p, m):
            if not hasattr(m, "to_quantized"):
                return False
            if m.weight.shape[-1] % gs != 0:
                return False
            if pred is None:
                return True
            q = pred(p, m)
            if isinstance(q, dict):
                config["quantization"][p] = q
            return q

        nn.quantize(model, group_size=gs, bits=bits_, class_predicate=class_predicate)
    mx.eval(model.parameters())
    out_dir = MODELS / name
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    mx.save_safetensors(str(out_dir / "model.safetensors"), dict(tree_flatten(model.parameters())))
    with open(out_dir / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def logits_golden(name, model_type, out_dir):
    model = load(out_dir, model_type)
    g = Golden(str(GOLDENS / f"{name}.safetensors"), __file__)
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
    full_ids = mx.array([PROMPT + greedy], dtype=mx.int32)
    g.case("full", "forward_nocache", [full_ids], model(full_ids))
    g.meta["greedy"] = ",".join(map(str, greedy))
    g.meta["model_type"] = model_type
    g.save()


def cli_golden(out_dir, model_type):
    model = load(out_dir, model_type)
    tokens, logprobs, tops = [], [], []
    for (tok, lp), _ in zip(generate_step(mx.array(CLI_PROMPT), model, max_tokens=CLI_MAX_TOKENS),
                            range(CLI_MAX_TOKENS)):
        tok = int(tok)
        tokens.append(tok)
        chosen = lp[tok].item()
        logprobs.append([chosen, bits(chosen)])
        order = mx.argsort(-lp)[:TOP].tolist()
        tops.append([[i, lp[i].item(), bits(lp[i].item())] for i in order])
    return {"prompt_ids": CLI_PROMPT, "tokens": tokens, "logprobs": logprobs, "top_logprobs": tops}


# deepseek_v41's published names (DeepSeek's own), the inverse of its `_rename`.
V41_NAMES = [
    (".self_attn.", ".attn."), (".mlp.", ".ffn."), (".input_layernorm.", ".attn_norm."),
    (".post_attention_layernorm.", ".ffn_norm."), (".attn_hc.", ".hc_attn_"),
    (".ffn_hc.", ".hc_ffn_"), (".sinks", ".attn_sink"), (".q_a_proj.", ".wq_a."),
    (".q_b_proj.", ".wq_b."), (".kv_proj.", ".wkv."), (".compressor.gate_proj.", ".compressor.wgate."),
    (".o_a_proj.", ".wo_a."), (".o_b_proj.", ".wo_b."), (".q_a_norm.", ".q_norm."),
    (".compressor.kv_norm.", ".compressor.norm."), (".indexer.k_proj.", ".indexer.wk."),
    (".gate.e_score_correction_bias", ".gate.bias"), (".shared_experts.gate_proj.", ".shared_experts.w1."),
    (".shared_experts.down_proj.", ".shared_experts.w2."), (".shared_experts.up_proj.", ".shared_experts.w3."),
]
V41_PUBLISHED = pathlib.Path("mlx-models/tests/models/deepseek_v41_published")


def published_deepseek_v41(out_dir):
    """The float32 deepseek_v41 fixture under the published checkpoint's names (experts one
    tensor each, wo_a as one block-diagonal matrix, plus vision, MTP, engram and bias_vl
    tensors sanitize drops); mlx-lm's `load_model` must give the same logits from it."""
    config = json.loads((out_dir / "config.json").read_text())
    weights = mx.load(str(out_dir / "model.safetensors"))
    out = {}
    for k, v in weights.items():
        if k == "lm_head.weight":
            out["head.weight"] = v
            continue
        if k == "model.embed_tokens.weight":
            out["embed.weight"] = v
            continue
        name = k.removeprefix("model.")
        if ".experts.switch_mlp." in name:
            layer = name.split(".")[1]
            proj = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[name.split(".")[-2]]
            for e in range(v.shape[0]):
                out[f"layers.{layer}.ffn.experts.{e}.{proj}.weight"] = v[e]
            continue
        for a, b in V41_NAMES:
            name = name.replace(a, b)
        if name.endswith(".wo_a.weight"):
            v = v.reshape(-1, v.shape[-1])
        out[name] = v
    out["vision.patch_embed.weight"] = mx.zeros((2, 2))
    out["mtp.0.norm.weight"] = mx.zeros((2,))
    out["layers.0.ffn.gate.bias_vl"] = mx.zeros((2,))
    shutil.rmtree(V41_PUBLISHED, ignore_errors=True)
    os.makedirs(V41_PUBLISHED)
    mx.save_safetensors(str(V41_PUBLISHED / "model.safetensors"), out)
    (V41_PUBLISHED / "config.json").write_text(json.dumps(config, indent=2))
    ids = mx.array([PROMPT], dtype=mx.int32)
    ref, _ = load_model(out_dir)
    pub, _ = load_model(V41_PUBLISHED)
    assert mx.array_equal(ref(ids), pub(ids)).item(), "published names change the logits"


def packed_deepseek_v41():
    """The published-names fixture with the published checkpoint's packing: fp8 e4m3 codes
    with power-of-two (ue8m0, uint8) scales per 32x32 tile for the attention linears, fp4
    pairs with float32 power-of-two scales per 32 inputs for the experts, and the legacy
    `quantization_config` (fp8, ue8m0, 32x32 blocks) that mlx-lm reads as mxfp8 (fp4 modules
    inferred as mxfp4). Random codes (no NaN), seeded. Returns its directory."""
    w = mx.load(str(V41_PUBLISHED / "model.safetensors"))
    mx.random.seed(4141)
    out = {}
    for k in sorted(w):
        v = w[k]
        linear = k.endswith(".weight") and v.ndim == 2 and v.shape[-1] % 32 == 0
        if linear and ".ffn.experts." in k:
            rows, cols = v.shape
            out[k] = mx.random.randint(0, 256, (rows, cols // 2)).astype(mx.uint8)
            out[k[:-6] + "scale"] = mx.power(
                2.0, mx.random.randint(-8, -2, (rows, cols // 32)).astype(mx.float32))
        elif linear and v.shape[0] % 32 == 0 and not k.startswith(("embed", "head")) \
                and ".gate.weight" not in k:
            rows, cols = v.shape
            codes = mx.random.randint(0, 126, (rows, cols)).astype(mx.uint8)
            signs = mx.random.randint(0, 2, (rows, cols)).astype(mx.uint8) * 128
            out[k] = codes | signs
            out[k[:-6] + "scale"] = (
                mx.random.randint(-10, -4, (rows // 32, cols // 32)) + 127).astype(mx.uint8)
        else:
            out[k] = v
    out_dir = MODELS / "deepseek_v41_fp8"
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    mx.save_safetensors(str(out_dir / "model.safetensors"), out)
    config = json.loads((V41_PUBLISHED / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                     "weight_block_size": [32, 32], "activation_scheme": "dynamic"}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def main():
    only = set(sys.argv[1:])
    GOLDENS.mkdir(parents=True, exist_ok=True)
    cases = {}
    if only and CLI_GOLDEN.exists():
        cases = json.loads(CLI_GOLDEN.read_text())["cases"]
    for i, (name, (model_type, overrides, dtype, quant)) in enumerate(CASES.items()):
        if only and name not in only:
            continue
        out_dir = build(i, name, model_type, overrides, dtype, quant)
        logits_golden(name, model_type, out_dir)
        cases[f"dense2/{name}"] = cli_golden(out_dir, model_type)
        if name == "deepseek_v41":
            published_deepseek_v41(out_dir)
            packed = packed_deepseek_v41()
            logits_golden("deepseek_v41_fp8", model_type, packed)
            cases["dense2/deepseek_v41_fp8"] = cli_golden(packed, model_type)
        print(f"{name}: {cases[f'dense2/{name}']['tokens']}", file=sys.stderr)
    extra = {"deepseek_v41_fp8"}
    cases = {k: cases[k] for k in sorted(cases) if k.removeprefix("dense2/") in set(CASES) | extra}
    golden = {
        "generator": f"xtask/oracle/goldens_dense2.py mlx={mx.__version__} "
                     f"mlx_lm={__import__('mlx_lm').__version__}",
        "max_tokens": CLI_MAX_TOKENS,
        "top_logprobs": TOP,
        "cases": cases,
    }
    CLI_GOLDEN.write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {CLI_GOLDEN}: {len(cases)} fixtures", file=sys.stderr)


if __name__ == "__main__":
    main()
