//! The GGUF architectures this crate maps: one [`GgufArch`] row each in [`ARCHS`] (its
//! `model_type`, how its tensor names map, and the function that reads its hyper-parameters),
//! and [`map_name`], llama.cpp's tensor names to mlx-lm's.

/// One GGUF architecture: the `model_type` that serves it and how its tensors map.
pub(super) struct GgufArch {
    pub(super) arch: &'static str,
    pub(super) model_type: &'static str,
    /// llama.cpp stores Q / K rows permuted for its interleaved rope (llama only).
    pub(super) permute_qk: bool,
    /// llama.cpp stores Gemma norm weights as `1 + w`: every `*_norm` tensor gets `- 1`.
    pub(super) norm_plus_one: bool,
    /// Per-layer names that differ from llama's.
    pub(super) parts: &'static [(&'static str, &'static str)],
    /// The prefix of mlx-lm's per-layer names (`model.layers`).
    pub(super) layers: &'static str,
    /// Top-level names that differ from llama's (`token_embd`, `output_norm`, `output`).
    pub(super) top: &'static [(&'static str, &'static str)],
    /// Names tried after `parts` (an architecture written by another's converter class).
    pub(super) base_parts: &'static [(&'static str, &'static str)],
    /// Reads the rope factor tensors ([`ROPE_TENSORS`](super::ROPE_TENSORS): Phi-3's long rope, Llama 3's
    /// `rope_freqs`) into `rope_scaling`.
    pub(super) rope_tensors: bool,
    /// `attention.head_count_kv` is a per-layer list, 0 on the layers without attention.
    pub(super) per_layer_kv: bool,
    /// mlx-lm serves the file as the text model of a multimodal checkpoint: its weights
    /// renamed (a leading `.1` replaced by `.0`), its config as `text_config` of `.2`.
    pub(super) text_of: Option<(&'static str, &'static str, &'static str)>,
    /// Reads what the keys every map shares leave out (`None`: nothing more).
    pub(super) config: Option<super::ConfigFn>,
}

/// The fields most architectures share (llama's names, nothing permuted or shifted).
pub(super) const PLAIN: GgufArch = GgufArch {
    arch: "",
    model_type: "",
    permute_qk: false,
    norm_plus_one: false,
    parts: &[],
    layers: "model.layers",
    top: &[],
    base_parts: &[],
    rope_tensors: false,
    per_layer_kv: false,
    text_of: None,
    config: None,
};

const DEEPSEEK2_PARTS: &[(&str, &str)] = &[
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
    ("attn_k_b", "self_attn.embed_q"),
    ("attn_v_b", "self_attn.unembed_out"),
    ("ffn_gate_inp", "mlp.gate"),
    // `exp_probs_b.bias` -> `mlp.gate.e_score_correction_bias` (see `map_name`).
    ("exp_probs_b", "mlp.gate.e_score_correction"),
    ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
    ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
    ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
    ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
    ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
];

const SHARED_EXPERT_PARTS: [(&str, &str); 3] = [
    ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
    ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
];

const MLA_PARTS: &[(&str, &str)] = &[
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
];

const EXPERT_PARTS: [(&str, &str); 4] = [
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
    ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
    ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
];

/// Qwen 3.5's names (`qwen35`, `qwen35moe`): Qwen3-Next's with the projections separate.
pub(super) const QWEN35_PARTS: &[(&str, &str)] = &[
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("post_attention_norm", "post_attention_layernorm"),
    EXPERT_PARTS[0],
    EXPERT_PARTS[1],
    EXPERT_PARTS[2],
    EXPERT_PARTS[3],
    ("ffn_gate_up_exps", "mlp.switch_mlp.gate_up_proj"),
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
    ("ssm_beta", "linear_attn.in_proj_b"),
    ("ssm_alpha", "linear_attn.in_proj_a"),
    ("ssm_norm", "linear_attn.norm"),
    ("ssm_out", "linear_attn.out_proj"),
    ("ssm_conv1d", "linear_attn.conv1d"),
    // Renamed (and their value heads put back in order) by `qwen3next_config`.
    ("attn_qkv", "linear_attn.gguf_qkv"),
    ("attn_gate", "linear_attn.gguf_z"),
    ("ssm_dt", "linear_attn.gguf_dt"),
];

const GEMMA2_PARTS: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
];

/// Nemotron-H's per-layer names (`backbone.layers.N.mixer`), dense and MoE.
const NEMOTRON_H_PARTS: &[(&str, &str)] = &[
    ("attn_norm", "norm"),
    ("ssm_in", "mixer.in_proj"),
    ("ssm_conv1d", "mixer.conv1d"),
    // `ssm_dt.bias` -> `mixer.dt_bias` (see `map_name`).
    ("ssm_dt", "mixer.dt"),
    ("ssm_norm", "mixer.norm"),
    ("ssm_out", "mixer.out_proj"),
    ("attn_q", "mixer.q_proj"),
    ("attn_k", "mixer.k_proj"),
    ("attn_v", "mixer.v_proj"),
    ("attn_output", "mixer.o_proj"),
    ("ffn_up", "mixer.up_proj"),
    ("ffn_down", "mixer.down_proj"),
];

pub(super) const ARCHS: &[GgufArch] = &[
    GgufArch {
        arch: "llama",
        model_type: "llama",
        permute_qk: true,
        norm_plus_one: false,
        parts: &[],
        rope_tensors: true,
        ..PLAIN
    },
    GgufArch {
        arch: "qwen2",
        model_type: "qwen2",
        permute_qk: false,
        norm_plus_one: false,
        parts: &[],
        ..PLAIN
    },
    GgufArch {
        arch: "qwen3",
        model_type: "qwen3",
        permute_qk: false,
        norm_plus_one: false,
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
        ],
        ..PLAIN
    },
    GgufArch {
        arch: "phi3",
        model_type: "phi3",
        config: Some(super::dense::phi3_config),
        permute_qk: false,
        norm_plus_one: false,
        parts: &[
            ("attn_qkv", "self_attn.qkv_proj"),
            ("ffn_up", "mlp.gate_up_proj"),
        ],
        rope_tensors: true,
        ..PLAIN
    },
    GgufArch {
        arch: "gemma",
        model_type: "gemma",
        permute_qk: false,
        norm_plus_one: true,
        parts: &[],
        ..PLAIN
    },
    GgufArch {
        arch: "gemma2",
        model_type: "gemma2",
        config: Some(super::gemma::gemma2_config),
        permute_qk: false,
        norm_plus_one: true,
        parts: GEMMA2_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "gemma3",
        model_type: "gemma3_text",
        config: Some(super::gemma::gemma2_config),
        permute_qk: false,
        norm_plus_one: true,
        parts: GEMMA2_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "qwen3moe",
        model_type: "qwen3_moe",
        config: Some(super::moe::qwen3moe_config),
        permute_qk: false,
        norm_plus_one: false,
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("ffn_gate_inp", "mlp.gate"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
        ],
        ..PLAIN
    },
    GgufArch {
        arch: "qwen2moe",
        model_type: "qwen2_moe",
        config: Some(super::moe::qwen2moe_config),
        permute_qk: false,
        norm_plus_one: false,
        parts: &[
            ("ffn_gate_inp", "mlp.gate"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
            ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
            ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
            ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
        ],
        ..PLAIN
    },
    GgufArch {
        arch: "olmo2",
        model_type: "olmo2",
        config: Some(super::dense::olmo2_config),
        permute_qk: false,
        norm_plus_one: false,
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
        ],
        ..PLAIN
    },
    // llama.cpp's converter writes granite through its llama class: Q / K permuted.
    GgufArch {
        arch: "granite",
        model_type: "granite",
        config: Some(super::dense::granite_config),
        permute_qk: true,
        norm_plus_one: false,
        parts: &[],
        rope_tensors: true,
        ..PLAIN
    },
    // Ministral 3 (llama.cpp's converter writes it through its llama class: Q / K permuted).
    GgufArch {
        arch: "mistral3",
        model_type: "ministral3",
        config: Some(super::dense::mistral3_config),
        permute_qk: true,
        norm_plus_one: false,
        parts: &[],
        ..PLAIN
    },
    // MLA (DeepSeek V2 and V3, one llama.cpp architecture): the model type is chosen from the
    // router's gating function; `attn_k_b` / `attn_v_b` are mlx-lm deepseek_v3's `embed_q` /
    // `unembed_out` as they are (deepseek_v2 gets them joined back into `kv_b_proj`).
    GgufArch {
        arch: "deepseek2",
        model_type: "deepseek_v2",
        config: Some(super::mla::deepseek2_config),
        permute_qk: false,
        norm_plus_one: false,
        parts: DEEPSEEK2_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "glm4",
        model_type: "glm4",
        config: Some(super::dense::glm4_config),
        permute_qk: false,
        norm_plus_one: false,
        parts: &[
            ("post_attention_norm", "post_self_attn_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
            ("post_ffw_norm", "post_mlp_layernorm"),
            ("ffn_up", "mlp.gate_up_proj"),
        ],
        ..PLAIN
    },
    // SmolLM3 (llama.cpp's SmolLM3Model is its llama class: Q / K permuted); every 4th layer
    // without rope in both (llama.cpp fixes the step at 4, mlx-lm's default interval).
    GgufArch {
        arch: "smollm3",
        model_type: "smollm3",
        permute_qk: true,
        rope_tensors: true,
        ..PLAIN
    },
    GgufArch {
        arch: "starcoder2",
        model_type: "starcoder2",
        parts: &[("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj")],
        ..PLAIN
    },
    // InternLM2: q, k, v split from its fused `wqkv` (`internlm2_config` fuses them back).
    GgufArch {
        arch: "internlm2",
        model_type: "internlm2",
        config: Some(super::fused::internlm2_config),
        parts: &[
            ("attn_q", "attention.gguf_q"),
            ("attn_k", "attention.gguf_k"),
            ("attn_v", "attention.gguf_v"),
            ("attn_output", "attention.wo"),
            ("attn_norm", "attention_norm"),
            ("ffn_norm", "ffn_norm"),
            ("ffn_gate", "feed_forward.w1"),
            ("ffn_up", "feed_forward.w3"),
            ("ffn_down", "feed_forward.w2"),
        ],
        top: &[("token_embd", "model.tok_embeddings"), ("output", "output")],
        ..PLAIN
    },
    // Apertus: Q / K as stored; the xIELU parameters come from metadata (`apertus_config`).
    GgufArch {
        arch: "apertus",
        model_type: "apertus",
        config: Some(super::dense::apertus_config),
        parts: &[
            ("attn_norm", "attention_layernorm"),
            ("ffn_norm", "feedforward_layernorm"),
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
        ],
        ..PLAIN
    },
    // Nemotron: LayerNorm1P weights stored as `1 + w`; the relu2 MLP's up / down.
    GgufArch {
        arch: "nemotron",
        model_type: "nemotron",
        config: Some(super::dense::nemotron_config),
        norm_plus_one: true,
        ..PLAIN
    },
    // Hunyuan dense: per-head q / k norms; the NTK-alpha rope comes already scaled.
    GgufArch {
        arch: "hunyuan-dense",
        model_type: "hunyuan_v1_dense",
        config: Some(super::dense::hunyuan_dense_config),
        parts: &[
            ("attn_q_norm", "self_attn.query_layernorm"),
            ("attn_k_norm", "self_attn.key_layernorm"),
        ],
        ..PLAIN
    },
    // Phi-2 (mlx-lm's `phi`): LayerNorms and linear layers with bias; an older converter's
    // fused `attn_qkv` is split by `phi2_config`.
    GgufArch {
        arch: "phi2",
        model_type: "phi",
        config: Some(super::fused::phi2_config),
        parts: &[
            ("attn_qkv", "self_attn.gguf_qkv"),
            ("attn_output", "self_attn.dense"),
            ("ffn_up", "mlp.fc1"),
            ("ffn_down", "mlp.fc2"),
        ],
        top: &[("output_norm", "model.final_layernorm")],
        ..PLAIN
    },
    // GPT-2: fused `c_attn`, learned positions, the head tied to the embedding.
    GgufArch {
        arch: "gpt2",
        model_type: "gpt2",
        config: Some(super::fused::gpt2_config),
        parts: &[
            ("attn_norm", "ln_1"),
            ("attn_qkv", "attn.c_attn"),
            ("attn_output", "attn.c_proj"),
            ("ffn_norm", "ln_2"),
            ("ffn_up", "mlp.c_fc"),
            ("ffn_down", "mlp.c_proj"),
        ],
        layers: "model.h",
        top: &[
            ("token_embd", "model.wte"),
            ("position_embd", "model.wpe"),
            ("output_norm", "model.ln_f"),
        ],
        ..PLAIN
    },
    // StarCoder (mlx-lm's gpt_bigcode): GPT-2's layout under `transformer.`, multi-query.
    GgufArch {
        arch: "starcoder",
        model_type: "gpt_bigcode",
        config: Some(super::fused::starcoder_config),
        parts: &[
            ("attn_norm", "ln_1"),
            ("attn_qkv", "attn.c_attn"),
            ("attn_output", "attn.c_proj"),
            ("ffn_norm", "ln_2"),
            ("ffn_up", "mlp.c_fc"),
            ("ffn_down", "mlp.c_proj"),
        ],
        layers: "transformer.h",
        top: &[
            ("token_embd", "transformer.wte"),
            ("position_embd", "transformer.wpe"),
            ("output_norm", "transformer.ln_f"),
        ],
        ..PLAIN
    },
    // GPT-NeoX (Pythia): the regrouped `attn_qkv` interleaved per head again
    // (`gptneox_config`).
    GgufArch {
        arch: "gptneox",
        model_type: "gpt_neox",
        config: Some(super::fused::gptneox_config),
        parts: &[
            ("attn_qkv", "attention.gguf_qkv"),
            ("attn_output", "attention.dense"),
            ("ffn_up", "mlp.dense_h_to_4h"),
            ("ffn_down", "mlp.dense_4h_to_h"),
        ],
        layers: "model.h",
        top: &[
            ("token_embd", "model.embed_in"),
            ("output", "model.embed_out"),
            ("output_norm", "model.final_layer_norm"),
        ],
        ..PLAIN
    },
    // MiniCPM 1 / 2: Q/K permuted; its three scales from metadata (`minicpm_config`).
    GgufArch {
        arch: "minicpm",
        model_type: "minicpm",
        config: Some(super::dense::minicpm_config),
        permute_qk: true,
        ..PLAIN
    },
    // DeepSeek MoE (v1): Q/K permuted, routed experts stacked, shared experts.
    GgufArch {
        arch: "deepseek",
        model_type: "deepseek",
        config: Some(super::moe::deepseek_config),
        permute_qk: true,
        parts: &[
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
            ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
            ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
        ],
        ..PLAIN
    },
    // StableLM 2: LayerNorms with bias, partial rope; the per-head q / k LayerNorms stacked
    // (`stablelm_config` splits them back).
    GgufArch {
        arch: "stablelm",
        model_type: "stablelm",
        config: Some(super::fused::stablelm_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_layernorm"),
            ("attn_k_norm", "self_attn.k_layernorm"),
        ],
        ..PLAIN
    },
    // Deci / Nemotron-NAS (`deci_config`): llama's names, per-layer blocks, Llama 3's
    // `rope_freqs`; Q / K un-permuted per layer there.
    GgufArch {
        arch: "deci",
        model_type: "nemotron-nas",
        config: Some(super::layerwise::deci_config),
        rope_tensors: true,
        ..PLAIN
    },
    // BitNet b1.58: llama's names plus the sub-norms; the projections, written as ternary
    // values times one scale, packed back into mlx-lm's BitLinear (`bitnet_config`).
    GgufArch {
        arch: "bitnet",
        model_type: "bitnet",
        config: Some(super::fused::bitnet_config),
        parts: &[
            ("attn_sub_norm", "self_attn.attn_sub_norm"),
            ("ffn_sub_norm", "mlp.ffn_sub_norm"),
        ],
        ..PLAIN
    },
    // Qwen2-VL / Qwen2.5-VL's text tower: qwen2's names; its M-RoPE is plain rope on text
    // (mlx-lm's too), so `rope.dimension_sections` is not read.
    GgufArch {
        arch: "qwen2vl",
        model_type: "qwen2_vl",
        ..PLAIN
    },
    // Qwen3-VL's text tower: qwen3's names (the deepstack count concerns images).
    GgufArch {
        arch: "qwen3vl",
        model_type: "qwen3_vl",
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
        ],
        ..PLAIN
    },
    // Qwen (1): GPT-2-like names under `transformer.`, fused qkv with bias, `w1` up and `w2`
    // gate (`qwen_config`).
    GgufArch {
        arch: "qwen",
        model_type: "qwen",
        config: Some(super::fused::qwen_config),
        parts: &[
            ("attn_norm", "ln_1"),
            ("attn_qkv", "attn.c_attn"),
            ("attn_output", "attn.c_proj"),
            ("ffn_norm", "ln_2"),
            ("ffn_up", "mlp.w1"),
            ("ffn_gate", "mlp.w2"),
            ("ffn_down", "mlp.c_proj"),
        ],
        layers: "transformer.h",
        top: &[
            ("token_embd", "transformer.wte"),
            ("output_norm", "transformer.ln_f"),
        ],
        ..PLAIN
    },
    // PLaMo (1): one norm per layer (parallel attention and MLP); `attn_q` / `attn_output`
    // shuffled for ggml's GQA broadcast (`plamo_config` puts them back).
    GgufArch {
        arch: "plamo",
        model_type: "plamo",
        config: Some(super::fused::plamo_config),
        parts: &[("attn_norm", "norm")],
        layers: "model.layers.layers",
        ..PLAIN
    },
    // PLaMo 3: sandwich norms stored with mlx-lm's runtime offsets added (`plamo3_config`
    // takes them off), fused qkv and gate-up, sliding layers with their own rope base.
    GgufArch {
        arch: "plamo3",
        model_type: "plamo3",
        config: Some(super::fused::plamo3_config),
        parts: &[
            ("attn_norm", "pre_mixer_norm"),
            ("attn_qkv", "mixer.qkv_proj"),
            ("attn_output", "mixer.o_proj"),
            ("attn_q_norm", "mixer.q_norm"),
            ("attn_k_norm", "mixer.k_norm"),
            ("attn_post_norm", "post_mixer_norm"),
            ("ffn_norm", "pre_mlp_norm"),
            ("ffn_up", "mlp.gate_up_proj"),
            ("ffn_down", "mlp.down_proj"),
            ("ffn_post_norm", "post_mlp_norm"),
        ],
        layers: "model.layers.layers",
        ..PLAIN
    },
    // Talkie: weightless norms; gains as `*.scale` / `layer_output_scale` / `attn_q_norm`, the
    // head's gain as `logit_scale`, the query / key rows' second halves negated for llama.cpp's
    // rope (`talkie_config` puts all of it back).
    GgufArch {
        arch: "talkie",
        model_type: "talkie",
        config: Some(super::fused::talkie_config),
        parts: &[
            ("attn_q", "attn.attn_query"),
            ("attn_k", "attn.attn_key"),
            ("attn_v", "attn.attn_value"),
            ("attn_output", "attn.attn_resid"),
            ("attn_q_norm", "attn.head_gain.head_g"),
            ("ffn_gate", "mlp.mlp_gate"),
            ("ffn_up", "mlp.mlp_linear"),
            ("ffn_down", "mlp.mlp_resid"),
            ("layer_output_scale", "embed_skip.a_g"),
        ],
        layers: "model.blocks",
        top: &[("token_embd", "model.embed")],
        ..PLAIN
    },
    // Spark 2.5: fused `q_k_v_proj`, the head-wise gate `g_proj`, sliding and full layers each
    // with their rope base and width (`spark2_5_config`).
    GgufArch {
        arch: "spark2_5",
        model_type: "spark2_5",
        config: Some(super::dense::spark2_5_config),
        parts: &[
            ("attn_qkv", "self_attn.q_k_v_proj"),
            ("attn_gate", "self_attn.g_proj"),
            ("attn_output", "self_attn.out_proj"),
        ],
        top: &[("token_embd", "model.embedding")],
        ..PLAIN
    },
    // OLMo (1): transformers' layout (Q / K permuted) read into mlx-lm's AI2 one: q, k, v fused
    // into `att_proj`, up and gate into `ff_proj` (`olmo_config`); no norm weights.
    GgufArch {
        arch: "olmo",
        model_type: "olmo",
        config: Some(super::fused::olmo_config),
        permute_qk: true,
        parts: &[
            ("attn_output", "attn_out"),
            ("ffn_gate", "gguf_gate"),
            ("ffn_up", "gguf_up"),
            ("ffn_down", "ff_out"),
        ],
        layers: "model.transformer.blocks",
        top: &[
            ("token_embd", "model.transformer.wte"),
            ("output", "model.transformer.ff_out"),
        ],
        ..PLAIN
    },
    // Mellum (JetBrains Mellum 2): experts stacked (softmax router, top-k renormalized), q / k
    // norms, sliding and full layers with their rope bases (`mellum_config`).
    GgufArch {
        arch: "mellum",
        model_type: "mellum",
        config: Some(super::dense::mellum_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
        ],
        ..PLAIN
    },
    // EXAONE MoE (K-EXAONE): EXAONE 4's attention (q / k norms, rope on the sliding layers
    // only) with pre-norm layers, a sigmoid grouped router with its correction bias, shared
    // experts, dense first blocks (`exaone_moe_config`).
    GgufArch {
        arch: "exaone-moe",
        model_type: "exaone_moe",
        config: Some(super::moe::exaone_moe_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("exp_probs_b", "mlp.gate.e_score_correction"),
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        ..PLAIN
    },
    // OpenELM: per-layer head counts and MLP widths (`openelm_config`), fused qkv, gate and up
    // joined back into `proj_1`.
    GgufArch {
        arch: "openelm",
        model_type: "openelm",
        config: Some(super::layerwise::openelm_config),
        parts: &[
            ("attn_qkv", "attn.qkv_proj"),
            ("attn_output", "attn.out_proj"),
            ("attn_q_norm", "attn.q_norm"),
            ("attn_k_norm", "attn.k_norm"),
            ("ffn_gate", "ffn.gguf_gate"),
            ("ffn_up", "ffn.gguf_up"),
            ("ffn_down", "ffn.proj_2"),
            ("attn_norm", "attn_norm"),
            ("ffn_norm", "ffn_norm"),
        ],
        layers: "transformer.layers",
        top: &[
            ("token_embd", "transformer.token_embeddings"),
            ("output_norm", "transformer.norm"),
        ],
        ..PLAIN
    },
    // Muse Glimmer's text tower: centred sandwich norms stored `1 + w`, Q / K permuted for
    // llama.cpp's rope, the output gate, the q / k norms synthesized from `qk_scale_factor`
    // (`muse_glimmer_config` reads them back into it).
    GgufArch {
        arch: "muse-glimmer",
        model_type: "muse_glimmer",
        config: Some(super::layerwise::muse_glimmer_config),
        permute_qk: true,
        parts: &[
            ("attn_gate", "self_attn.gate_proj"),
            ("attn_post_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("ffn_post_norm", "post_feedforward_layernorm"),
            ("attn_q_norm", "self_attn.gguf_q_norm"),
            ("attn_k_norm", "self_attn.gguf_k_norm"),
        ],
        ..PLAIN
    },
    // EXAONE 3 / 3.5: GPT-2-like module names in mlx-lm.
    GgufArch {
        arch: "exaone",
        model_type: "exaone",
        config: Some(super::dense::exaone_config),
        parts: &[
            ("attn_norm", "ln_1"),
            ("ffn_norm", "ln_2"),
            ("attn_q", "attn.attention.q_proj"),
            ("attn_k", "attn.attention.k_proj"),
            ("attn_v", "attn.attention.v_proj"),
            ("attn_output", "attn.attention.out_proj"),
            ("ffn_gate", "mlp.c_fc_0"),
            ("ffn_up", "mlp.c_fc_1"),
            ("ffn_down", "mlp.c_proj"),
        ],
        layers: "transformer.h",
        top: &[
            ("token_embd", "transformer.wte"),
            ("output_norm", "transformer.ln_f"),
        ],
        rope_tensors: true,
        ..PLAIN
    },
    GgufArch {
        arch: "olmoe",
        model_type: "olmoe",
        config: Some(super::moe::olmoe_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
        ],
        ..PLAIN
    },
    // Granite MoE (llama.cpp's converter: its granite class, so Q / K permuted; JetMoE's
    // fused `input_linear` split into gate / up experts).
    GgufArch {
        arch: "granitemoe",
        model_type: "granitemoe",
        config: Some(super::dense::granite_config),
        permute_qk: true,
        parts: &[
            ("ffn_gate_inp", "block_sparse_moe.router.layer"),
            ("ffn_gate_exps", "block_sparse_moe.switch_mlp.gate_proj"),
            ("ffn_up_exps", "block_sparse_moe.switch_mlp.up_proj"),
            ("ffn_down_exps", "block_sparse_moe.switch_mlp.down_proj"),
        ],
        ..PLAIN
    },
    GgufArch {
        arch: "phimoe",
        model_type: "phimoe",
        config: Some(super::dense::phi3_config),
        parts: &[
            ("ffn_gate_inp", "block_sparse_moe.gate"),
            ("ffn_gate_exps", "block_sparse_moe.switch_mlp.gate_proj"),
            ("ffn_up_exps", "block_sparse_moe.switch_mlp.up_proj"),
            ("ffn_down_exps", "block_sparse_moe.switch_mlp.down_proj"),
        ],
        rope_tensors: true,
        ..PLAIN
    },
    // MiniCPM3 (MLA, dense; long-rope factors as tensors).
    GgufArch {
        arch: "minicpm3",
        model_type: "minicpm3",
        config: Some(super::mla::minicpm3_config),
        parts: MLA_PARTS,
        rope_tensors: true,
        ..PLAIN
    },
    // GLM-4.5 (glm4_moe): DeepSeek V3's router, q/k norms, partial rope; its MTP layer skipped.
    GgufArch {
        arch: "glm4moe",
        model_type: "glm4_moe",
        config: Some(super::moe::grouped_moe_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("exp_probs_b", "mlp.gate.e_score_correction"),
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        ..PLAIN
    },
    // dots.llm1: DeepSeek V3's router; experts under `mlp.experts` in mlx-lm.
    GgufArch {
        arch: "dots1",
        model_type: "dots1",
        config: Some(super::moe::grouped_moe_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("exp_probs_b", "mlp.gate.e_score_correction"),
            ("ffn_gate_inp", "mlp.gate"),
            ("ffn_gate_exps", "mlp.experts.gate_proj"),
            ("ffn_up_exps", "mlp.experts.up_proj"),
            ("ffn_down_exps", "mlp.experts.down_proj"),
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        ..PLAIN
    },
    // Mistral Small 4 (llama.cpp's converter: its deepseek2 class under `mistral4`): MLA as
    // deepseek_v3 reads it, a softmax router, gate and up experts fused.
    GgufArch {
        arch: "mistral4",
        model_type: "mistral4",
        config: Some(super::mla::deepseek2_config),
        parts: &[("ffn_gate_up_exps", "mlp.switch_mlp.gate_up_proj")],
        base_parts: DEEPSEEK2_PARTS,
        ..PLAIN
    },
    // Qwen3-Next: gated-delta layers (`ssm_*`; `attn_qkv` + `attn_gate` are the regrouped
    // `in_proj_qkvz`, `ssm_a` is -exp(A_log)) between gated full-attention layers, experts
    // with a gated shared expert; norms stored as 1 + w, mlx-lm's own parameter.
    GgufArch {
        arch: "qwen3next",
        model_type: "qwen3_next",
        config: Some(super::linear::qwen3next_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("post_attention_norm", "post_attention_layernorm"),
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
            ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
            ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
            ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
            ("ssm_ba", "linear_attn.in_proj_ba"),
            ("ssm_norm", "linear_attn.norm"),
            ("ssm_out", "linear_attn.out_proj"),
            ("ssm_conv1d", "linear_attn.conv1d"),
            // Joined into `in_proj_qkvz` and renamed by `qwen3next_config`.
            ("attn_qkv", "linear_attn.gguf_qkv"),
            ("attn_gate", "linear_attn.gguf_z"),
            ("ssm_dt", "linear_attn.gguf_dt"),
        ],
        ..PLAIN
    },
    // Qwen 3.5 (dense and MoE): Qwen3-Next's layers with separate projections (`attn_qkv`,
    // `attn_gate`, `ssm_beta`, `ssm_alpha`), value heads reordered by the converter (undone in
    // `qwen3next_config`).
    GgufArch {
        arch: "qwen35",
        model_type: "qwen3_5",
        config: Some(super::linear::qwen3next_config),
        parts: QWEN35_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "qwen35moe",
        model_type: "qwen3_5_moe",
        config: Some(super::linear::qwen3next_config),
        parts: QWEN35_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "seed_oss",
        model_type: "seed_oss",
        config: Some(super::dense::seed_oss_config),
        ..PLAIN
    },
    // ERNIE 4.5 (dense): interleaved rope on both sides, nothing permuted.
    GgufArch {
        arch: "ernie4_5",
        model_type: "ernie4_5",
        config: Some(super::dense::seed_oss_config),
        ..PLAIN
    },
    // Command R: one LayerNorm per block (parallel attention and MLP), per-head q/k norms.
    GgufArch {
        arch: "command-r",
        model_type: "cohere",
        config: Some(super::dense::seed_oss_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
        ],
        ..PLAIN
    },
    // Command R7B: Command R's block with sliding-window layers (every 4th global, no rope).
    GgufArch {
        arch: "cohere2",
        model_type: "cohere2",
        config: Some(super::dense::cohere2_config),
        ..PLAIN
    },
    // gpt-oss: attention sinks (`attn_sinks.weight`, mlx-lm's bare `sinks`), a biased router,
    // biased experts (gate and up written apart by the converter), post-attention norm as
    // llama.cpp's `post_attention_norm`; every other layer sliding, as both default.
    GgufArch {
        arch: "gpt-oss",
        model_type: "gpt_oss",
        config: Some(super::moe::gpt_oss_config),
        parts: &[
            ("post_attention_norm", "post_attention_layernorm"),
            ("attn_sinks", "self_attn.sinks"),
            ("ffn_gate_inp", "mlp.router"),
            ("ffn_gate_exps", "mlp.experts.gate_proj"),
            ("ffn_up_exps", "mlp.experts.up_proj"),
            ("ffn_down_exps", "mlp.experts.down_proj"),
        ],
        ..PLAIN
    },
    // LFM2: short-convolution layers (`shortconv.*`, the depthwise kernel stored as
    // (channels, kernel)) between attention layers, told apart by a per-layer
    // `head_count_kv` (0 for a convolution); its final norm is llama.cpp's `token_embd_norm`.
    GgufArch {
        arch: "lfm2",
        model_type: "lfm2",
        config: Some(super::linear::lfm2_config),
        parts: &[
            ("attn_norm", "operator_norm"),
            ("ffn_norm", "ffn_norm"),
            ("ffn_gate", "feed_forward.w1"),
            ("ffn_up", "feed_forward.w3"),
            ("ffn_down", "feed_forward.w2"),
            ("attn_q_norm", "self_attn.q_layernorm"),
            ("attn_k_norm", "self_attn.k_layernorm"),
            ("attn_output", "self_attn.out_proj"),
            ("shortconv.conv", "conv.conv"),
            ("shortconv.in_proj", "conv.in_proj"),
            ("shortconv.out_proj", "conv.out_proj"),
        ],
        top: &[("token_embd_norm", "model.embedding_norm")],
        per_layer_kv: true,
        ..PLAIN
    },
    // LFM2-MoE: LFM2's layers, dense feed-forward blocks first (`leading_dense_block_count`),
    // then sigmoid-routed experts with a selection bias (`exp_probs_b`).
    GgufArch {
        arch: "lfm2moe",
        model_type: "lfm2_moe",
        config: Some(super::linear::lfm2_config),
        parts: &[
            ("attn_norm", "operator_norm"),
            ("ffn_norm", "ffn_norm"),
            ("ffn_gate", "feed_forward.gate_proj"),
            ("ffn_up", "feed_forward.up_proj"),
            ("ffn_down", "feed_forward.down_proj"),
            ("ffn_gate_inp", "feed_forward.gate"),
            ("ffn_gate_exps", "feed_forward.switch_mlp.gate_proj"),
            ("ffn_up_exps", "feed_forward.switch_mlp.up_proj"),
            ("ffn_down_exps", "feed_forward.switch_mlp.down_proj"),
            ("exp_probs_b", "feed_forward.expert_bias"),
            ("attn_q_norm", "self_attn.q_layernorm"),
            ("attn_k_norm", "self_attn.k_layernorm"),
            ("attn_output", "self_attn.out_proj"),
            ("shortconv.conv", "conv.conv"),
            ("shortconv.in_proj", "conv.in_proj"),
            ("shortconv.out_proj", "conv.out_proj"),
        ],
        top: &[("token_embd_norm", "model.embedding_norm")],
        per_layer_kv: true,
        ..PLAIN
    },
    // Nanbeige (llama.cpp's llama class: Q / K permuted), its stack run `num_loops` times.
    GgufArch {
        arch: "nanbeige",
        model_type: "nanbeige",
        config: Some(super::dense::nanbeige_config),
        permute_qk: true,
        rope_tensors: true,
        ..PLAIN
    },
    // EXAONE 4.0: post-norms only, q/k norms, sliding layers, Llama 3's rope as `rope_freqs`.
    GgufArch {
        arch: "exaone4",
        model_type: "exaone4",
        config: Some(super::dense::exaone4_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
        ],
        rope_tensors: true,
        ..PLAIN
    },
    // ERNIE 4.5 MoE: ERNIE 4.5's layers (interleaved rope, nothing permuted), experts from
    // `leading_dense_block_count` on every `interleave_moe_layer_step`-th layer, a shared
    // expert; `exp_probs_b` (the checkpoints' `e_score_correction_bias`) is read and dropped,
    // as mlx-lm's sanitize drops it.
    GgufArch {
        arch: "ernie4_5-moe",
        model_type: "ernie4_5_moe",
        config: Some(super::moe::ernie45_moe_config),
        parts: &[
            ("exp_probs_b", "mlp.moe_statics.e_score_correction"),
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        ..PLAIN
    },
    // Granite 4.0 H: Mamba-2 layers (`ssm_*`; `ssm_a` is -exp(A_log), `ssm_d` D, both
    // (heads, 1); the gated norm as (groups, inner / groups); the conv kernel squeezed) told
    // apart from attention layers by the per-layer `head_count_kv`; Q / K permuted (the
    // converter's llama class); experts with a shared expert whose fused `input_linear` the
    // converter split (`granitehybrid_config` joins it), or a dense MLP.
    GgufArch {
        arch: "granitehybrid",
        model_type: "granitemoehybrid",
        config: Some(super::ssm::granitehybrid_config),
        permute_qk: true,
        parts: &[
            ("ssm_in", "mamba.in_proj"),
            ("ssm_out", "mamba.out_proj"),
            ("ssm_conv1d", "mamba.conv1d"),
            ("ssm_norm", "mamba.norm"),
            // `ssm_dt.bias` -> `mamba.dt_bias` (see `map_name`).
            ("ssm_dt", "mamba.dt"),
            ("ffn_gate_inp", "block_sparse_moe.router.layer"),
            ("ffn_gate_exps", "block_sparse_moe.switch_mlp.gate_proj"),
            ("ffn_up_exps", "block_sparse_moe.switch_mlp.up_proj"),
            ("ffn_down_exps", "block_sparse_moe.switch_mlp.down_proj"),
            ("ffn_gate_shexp", "shared_mlp.gguf_gate"),
            ("ffn_up_shexp", "shared_mlp.gguf_up"),
            ("ffn_down_shexp", "shared_mlp.output_linear"),
        ],
        per_layer_kv: true,
        ..PLAIN
    },
    // RWKV-7 (fla-hub's names, as mlx-lm reads them): time mixing (`time_mix_*`: the
    // projections, the LoRAs as `*1` / `*2` / `*0` (bias), the fused token-shift mixes, the
    // per-head group norm `time_mix_ln`), channel mixing (`channel_mix_*`), the first
    // layer's pre-norm as `token_embd_norm` (`rwkv7_config` undoes the rest).
    GgufArch {
        arch: "rwkv7",
        model_type: "rwkv7",
        config: Some(super::linear::rwkv7_config),
        parts: &[
            ("attn_norm", "attn_norm"),
            ("attn_norm_2", "ffn_norm"),
            ("time_mix_receptance", "attn.r_proj"),
            ("time_mix_key", "attn.k_proj"),
            ("time_mix_value", "attn.v_proj"),
            ("time_mix_output", "attn.o_proj"),
            ("time_mix_ln", "attn.g_norm"),
            ("time_mix_k_k", "attn.k_k"),
            ("time_mix_k_a", "attn.k_a"),
            ("time_mix_r_k", "attn.r_k"),
            ("time_mix_lerp_fused", "attn.gguf_lerp"),
            ("time_mix_w0", "attn.w_lora.gguf0"),
            ("time_mix_w1", "attn.w_lora.lora.0"),
            ("time_mix_w2", "attn.w_lora.lora.2"),
            ("time_mix_a0", "attn.a_lora.gguf0"),
            ("time_mix_a1", "attn.a_lora.lora.0"),
            ("time_mix_a2", "attn.a_lora.lora.2"),
            ("time_mix_v0", "attn.v_lora.gguf0"),
            ("time_mix_v1", "attn.v_lora.lora.0"),
            ("time_mix_v2", "attn.v_lora.lora.2"),
            ("time_mix_g1", "attn.g_lora.lora.0"),
            ("time_mix_g2", "attn.g_lora.lora.2"),
            ("channel_mix_key", "ffn.key"),
            ("channel_mix_value", "ffn.value"),
            ("channel_mix_lerp_k", "ffn.x_k"),
        ],
        top: &[
            ("token_embd", "model.embeddings"),
            ("token_embd_norm", "model.layers.0.pre_norm"),
        ],
        ..PLAIN
    },
    // Gemma 3n (the text model): Gemma 3's names (norms as stored), AltUp (`altup_*`; the
    // converter's stacked `altup_proj` / `altup_unembd_proj` unstacked by `gemma3n_config`),
    // Laurel, per-layer inputs; names under mlx-lm's `model.language_model.`.
    GgufArch {
        arch: "gemma3n",
        model_type: "gemma3n",
        config: Some(super::gemma::gemma3n_config),
        parts: &[
            ("post_attention_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("inp_gate", "per_layer_input_gate"),
            ("proj", "per_layer_projection"),
            ("post_norm", "post_per_layer_input_norm"),
            ("altup_correct_coef", "altup.correction_coefs"),
            // `altup_correct_scale.weight` -> the bare `altup.correct_output_scale`.
            ("altup_correct_scale", "altup.correct_output_scale"),
            ("altup_predict_coef", "altup.prediction_coefs"),
            ("altup_router", "altup.modality_router"),
            ("altup_router_norm", "altup.router_norm"),
            ("laurel_l", "laurel.linear_left"),
            ("laurel_r", "laurel.linear_right"),
            ("laurel_post_norm", "laurel.post_laurel_norm"),
        ],
        top: &[
            ("per_layer_token_embd", "model.embed_tokens_per_layer"),
            ("per_layer_model_proj", "model.per_layer_model_projection"),
            ("per_layer_proj_norm", "model.per_layer_projection_norm"),
            ("altup_proj", "model.gguf_altup_proj"),
            ("altup_unembd_proj", "model.gguf_altup_unembd_proj"),
        ],
        text_of: Some(("model.language_model.", "model.", "gemma3n_text")),
        ..PLAIN
    },
    // Gemma 4 (dense): Gemma 3's names (norms as stored: no `1 + w`), per-layer inputs
    // (`per_layer_*`, `inp_gate`, `proj`, `post_norm`), `layer_output_scale` as the bare
    // `layer_scalar`; `rope_freqs` is the full layers' proportional rope (`gemma4_config`).
    GgufArch {
        arch: "gemma4",
        model_type: "gemma4_text",
        config: Some(super::gemma::gemma4_config),
        parts: &[
            ("post_attention_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("inp_gate", "per_layer_input_gate"),
            ("proj", "per_layer_projection"),
            ("post_norm", "post_per_layer_input_norm"),
            ("layer_output_scale", "layer_scalar"),
        ],
        top: &[
            ("per_layer_token_embd", "model.embed_tokens_per_layer"),
            ("per_layer_model_proj", "model.per_layer_model_projection"),
            ("per_layer_proj_norm", "model.per_layer_projection_norm"),
        ],
        rope_tensors: true,
        per_layer_kv: true,
        ..PLAIN
    },
    // Llama 4 (text): Q / K as stored (llama.cpp's llama4 rope is interleaved, as mlx-lm's),
    // dense and MoE layers under `feed_forward`, Scout's rope as `rope_freqs`; the names get
    // mlx-lm's `language_model.` and the config its `text_config` (`llama4_config`).
    GgufArch {
        arch: "llama4",
        model_type: "llama4",
        config: Some(super::moe::llama4_config),
        parts: &[
            ("ffn_gate", "feed_forward.gate_proj"),
            ("ffn_up", "feed_forward.up_proj"),
            ("ffn_down", "feed_forward.down_proj"),
            ("ffn_gate_inp", "feed_forward.router"),
            ("ffn_gate_exps", "feed_forward.experts.gate_proj"),
            ("ffn_up_exps", "feed_forward.experts.up_proj"),
            ("ffn_down_exps", "feed_forward.experts.down_proj"),
            ("ffn_gate_shexp", "feed_forward.shared_expert.gate_proj"),
            ("ffn_up_shexp", "feed_forward.shared_expert.up_proj"),
            ("ffn_down_shexp", "feed_forward.shared_expert.down_proj"),
        ],
        rope_tensors: true,
        text_of: Some(("language_model.", "", "llama4_text")),
        ..PLAIN
    },
    // Mamba (Falcon Mamba too, written as `mamba` with `ssm.dt_b_c_rms`): `backbone.` names,
    // `ssm_a` is -exp(A_log), `ssm_d` D, the conv kernel squeezed (`mamba_config`).
    GgufArch {
        arch: "mamba",
        model_type: "mamba",
        config: Some(super::ssm::mamba_config),
        parts: &[
            ("attn_norm", "norm"),
            ("ssm_in", "mixer.in_proj"),
            ("ssm_conv1d", "mixer.conv1d"),
            ("ssm_x", "mixer.x_proj"),
            ("ssm_dt", "mixer.dt_proj"),
            ("ssm_out", "mixer.out_proj"),
        ],
        layers: "backbone.layers",
        top: &[
            ("token_embd", "backbone.embeddings"),
            ("output_norm", "backbone.norm_f"),
        ],
        ..PLAIN
    },
    // Mamba-2: Mamba's names, `ssm_dt.bias` is `dt_bias`, A and D (heads, 1), the gated norm
    // per group (`mamba_config`).
    GgufArch {
        arch: "mamba2",
        model_type: "mamba2",
        config: Some(super::ssm::mamba_config),
        parts: &[
            ("attn_norm", "norm"),
            ("ssm_in", "mixer.in_proj"),
            ("ssm_conv1d", "mixer.conv1d"),
            // `ssm_dt.bias` -> `mixer.dt_bias` (see `map_name`).
            ("ssm_dt", "mixer.dt"),
            ("ssm_norm", "mixer.norm"),
            ("ssm_out", "mixer.out_proj"),
        ],
        layers: "backbone.layers",
        top: &[
            ("token_embd", "backbone.embeddings"),
            ("output_norm", "backbone.norm_f"),
        ],
        ..PLAIN
    },
    // MiniMax-M2 (mlx-lm's `minimax`): q / k norms over all heads, a partial rope, sigmoid-
    // routed experts with a selection bias (`exp_probs_b`), no shared expert.
    GgufArch {
        arch: "minimax-m2",
        model_type: "minimax",
        config: Some(super::moe::minimax_m2_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            // `exp_probs_b.bias` -> `e_score_correction_bias` (see `map_name`).
            ("exp_probs_b", "block_sparse_moe.e_score_correction"),
            ("ffn_gate_inp", "block_sparse_moe.gate"),
            ("ffn_gate_exps", "block_sparse_moe.switch_mlp.gate_proj"),
            ("ffn_up_exps", "block_sparse_moe.switch_mlp.up_proj"),
            ("ffn_down_exps", "block_sparse_moe.switch_mlp.down_proj"),
        ],
        ..PLAIN
    },
    // Ling 2.0 (mlx-lm's `bailing_moe`): the fused `attn_qkv` as stored (nothing permuted),
    // per-head q / k norms, group-limited routing with an expert bias (`exp_probs_b`), shared
    // experts, dense first layers; its MTP layers skipped (`bailing_config`).
    GgufArch {
        arch: "bailingmoe2",
        model_type: "bailing_moe",
        config: Some(super::moe::bailing_config),
        parts: &[
            ("attn_qkv", "attention.query_key_value"),
            ("attn_output", "attention.dense"),
            ("attn_q_norm", "attention.query_layernorm"),
            ("attn_k_norm", "attention.key_layernorm"),
            ("ffn_gate_inp", "mlp.gate.gate_proj"),
            // `exp_probs_b.bias` -> the bare `mlp.gate.expert_bias` (see `map_name`).
            ("exp_probs_b", "mlp.gate.expert_bias"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        top: &[("token_embd", "model.word_embeddings")],
        ..PLAIN
    },
    // Nemotron-H (dense): Mamba-2, attention (Q / K permuted: the converter's llama class) and
    // MLP-only layers under `backbone.layers.N.mixer`, told apart by the per-layer
    // `head_count_kv` and `feed_forward_length` (`nemotron_h_config`).
    GgufArch {
        arch: "nemotron_h",
        model_type: "nemotron_h",
        config: Some(super::ssm::nemotron_h_config),
        permute_qk: true,
        parts: NEMOTRON_H_PARTS,
        layers: "backbone.layers",
        top: &[
            ("token_embd", "backbone.embeddings"),
            ("output_norm", "backbone.norm_f"),
        ],
        per_layer_kv: true,
        ..PLAIN
    },
    // Falcon-H1: attention and Mamba-2 side by side in every layer, then an MLP; the
    // converter folds every multiplier into the weights (`falcon_h1_config`).
    GgufArch {
        arch: "falcon-h1",
        model_type: "falcon_h1",
        config: Some(super::ssm::falcon_h1_config),
        parts: &[
            ("ffn_norm", "pre_ff_layernorm"),
            ("ffn_gate", "feed_forward.gate_proj"),
            ("ffn_up", "feed_forward.up_proj"),
            ("ffn_down", "feed_forward.down_proj"),
            ("ssm_in", "mamba.in_proj"),
            ("ssm_conv1d", "mamba.conv1d"),
            // `ssm_dt.bias` -> `mamba.dt_bias` (see `map_name`).
            ("ssm_dt", "mamba.dt"),
            ("ssm_norm", "mamba.norm"),
            ("ssm_out", "mamba.out_proj"),
        ],
        top: &[("output_norm", "model.final_layernorm")],
        ..PLAIN
    },
    // Jamba: Mamba (1) layers with dt / B / C norms and attention layers (told apart by the
    // per-layer `head_count_kv`), each followed by an MLP or, where the file has them, stacked
    // experts (`jamba_config` places both).
    GgufArch {
        arch: "jamba",
        model_type: "jamba",
        config: Some(super::ssm::jamba_config),
        parts: &[
            ("ffn_norm", "pre_ff_layernorm"),
            ("ffn_gate", "feed_forward.gate_proj"),
            ("ffn_up", "feed_forward.up_proj"),
            ("ffn_down", "feed_forward.down_proj"),
            ("ffn_gate_inp", "feed_forward.router"),
            ("ffn_gate_exps", "feed_forward.switch_mlp.gate_proj"),
            ("ffn_up_exps", "feed_forward.switch_mlp.up_proj"),
            ("ffn_down_exps", "feed_forward.switch_mlp.down_proj"),
            ("ssm_in", "mamba.in_proj"),
            ("ssm_conv1d", "mamba.conv1d"),
            ("ssm_x", "mamba.x_proj"),
            ("ssm_dt", "mamba.dt_proj"),
            ("ssm_out", "mamba.out_proj"),
            ("ssm_dt_norm", "mamba.dt_layernorm"),
            ("ssm_b_norm", "mamba.b_layernorm"),
            ("ssm_c_norm", "mamba.c_layernorm"),
        ],
        top: &[("output_norm", "model.final_layernorm")],
        per_layer_kv: true,
        ..PLAIN
    },
    // DBRX: bias-free LayerNorms around a fused, clipped `Wqkv`; the stacked experts are
    // mlx-lm's list of experts (`dbrx_config` unstacks them).
    GgufArch {
        arch: "dbrx",
        model_type: "dbrx",
        config: Some(super::moe::dbrx_config),
        parts: &[
            ("attn_norm", "norm_attn_norm.norm_1"),
            ("attn_output_norm", "norm_attn_norm.norm_2"),
            ("attn_qkv", "norm_attn_norm.attn.Wqkv"),
            ("attn_output", "norm_attn_norm.attn.out_proj"),
            ("ffn_gate_inp", "ffn.router.layer"),
            ("ffn_gate_exps", "ffn.gguf_w1"),
            ("ffn_up_exps", "ffn.gguf_v1"),
            ("ffn_down_exps", "ffn.gguf_w2"),
        ],
        layers: "transformer.blocks",
        top: &[
            ("token_embd", "transformer.wte"),
            ("output_norm", "transformer.norm_f"),
        ],
        ..PLAIN
    },
    // Hunyuan MoE (Hunyuan-A13B; mlx-lm's `hunyuan`): per-head q / k norms, softmax-routed
    // experts beside a shared MLP, the NTK-alpha rope base stored already scaled
    // (`hunyuan_moe_config`).
    GgufArch {
        arch: "hunyuan-moe",
        model_type: "hunyuan",
        config: Some(super::moe::hunyuan_moe_config),
        parts: &[
            ("attn_q_norm", "self_attn.query_layernorm"),
            ("attn_k_norm", "self_attn.key_layernorm"),
            ("ffn_gate_inp", "mlp.gate.wg"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
            ("ffn_gate_shexp", "mlp.shared_mlp.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_mlp.up_proj"),
            ("ffn_down_shexp", "mlp.shared_mlp.down_proj"),
        ],
        ..PLAIN
    },
    // Qwen3-VL MoE's text tower: qwen3moe's names and keys (its interleaved-MRoPE sections
    // are plain rope on text positions, as mlx-lm runs it), under mlx-lm's `language_model.`.
    GgufArch {
        arch: "qwen3vlmoe",
        model_type: "qwen3_vl_moe",
        config: Some(super::moe::qwen3moe_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            EXPERT_PARTS[0],
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
        ],
        text_of: Some(("language_model.", "", "qwen3_moe")),
        ..PLAIN
    },
    // AFMoE (Arcee Trinity): gated attention (`attn_gate`) with q / k norms, sandwich norms,
    // sigmoid-routed experts with a selection bias (`exp_probs_b`) and shared experts after
    // dense first layers; sliding layers in llama.cpp's fixed pattern (`afmoe_config`).
    GgufArch {
        arch: "afmoe",
        model_type: "afmoe",
        config: Some(super::moe::afmoe_config),
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("attn_gate", "self_attn.gate_proj"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_mlp_layernorm"),
            ("post_ffw_norm", "post_mlp_layernorm"),
            ("ffn_gate_inp", "mlp.router.gate"),
            // `exp_probs_b.bias` -> the bare `mlp.expert_bias` (see `map_name`).
            ("exp_probs_b", "mlp.expert_bias"),
            ("ffn_gate_exps", "mlp.experts.gate_proj"),
            ("ffn_up_exps", "mlp.experts.up_proj"),
            ("ffn_down_exps", "mlp.experts.down_proj"),
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        ..PLAIN
    },
    // DeepSeek V3.2 (llama.cpp's `deepseek32`, its deepseek2 class plus the sparse-attention
    // indexer): deepseek2's names and MLA as deepseek_v3 reads it, the indexer's tensors.
    GgufArch {
        arch: "deepseek32",
        model_type: "deepseek_v32",
        config: Some(super::mla::deepseek32_config),
        parts: &[
            ("indexer.attn_q_b", "self_attn.indexer.wq_b"),
            ("indexer.attn_k", "self_attn.indexer.wk"),
            ("indexer.k_norm", "self_attn.indexer.k_norm"),
            ("indexer.proj", "self_attn.indexer.weights_proj"),
        ],
        base_parts: DEEPSEEK2_PARTS,
        ..PLAIN
    },
    // Ling 1.0 (mlx-lm's `bailing_moe`): q / k / v split from the fused projection, Q / K
    // permuted (`bailing_config` joins them back), softmax-routed experts with shared ones.
    GgufArch {
        arch: "bailingmoe",
        model_type: "bailing_moe",
        config: Some(super::moe::bailing_config),
        parts: &[
            ("attn_q", "attention.gguf_q"),
            ("attn_k", "attention.gguf_k"),
            ("attn_v", "attention.gguf_v"),
            ("attn_qkv", "attention.query_key_value"),
            ("attn_output", "attention.dense"),
            ("ffn_gate_inp", "mlp.gate.gate_proj"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        top: &[("token_embd", "model.word_embeddings")],
        ..PLAIN
    },
    // PLaMo 2: Mamba and attention layers (per-layer `head_count` / `head_count_kv`, 0 on
    // Mamba layers) under `model.layers.layers`, each with an MLP; the RMSNorms' offsets
    // stored added (`plamo2_config` subtracts them).
    GgufArch {
        arch: "plamo2",
        model_type: "plamo2",
        config: Some(super::ssm::plamo2_config),
        parts: &[
            ("attn_norm", "pre_mixer_norm"),
            ("post_attention_norm", "post_mixer_norm"),
            ("ffn_norm", "pre_mlp_norm"),
            ("post_ffw_norm", "post_mlp_norm"),
            ("attn_qkv", "mixer.qkv_proj"),
            ("attn_output", "mixer.o_proj"),
            // `.weight` of these five -> mlx-lm's bare parameters (see `map_name`).
            ("attn_q_norm", "mixer.q_weight"),
            ("attn_k_norm", "mixer.k_weight"),
            ("ssm_dt_norm", "mixer.dt_norm_weight"),
            ("ssm_b_norm", "mixer.B_norm_weight"),
            ("ssm_c_norm", "mixer.C_norm_weight"),
            ("ssm_in", "mixer.in_proj"),
            ("ssm_conv1d", "mixer.conv1d"),
            ("ssm_x", "mixer.bcdt_proj"),
            // `ssm_dt.bias` is the bare `dt_bias` (`plamo2_config`).
            ("ssm_dt", "mixer.dt_proj"),
            ("ssm_out", "mixer.out_proj"),
            ("ffn_up", "mlp.gate_up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ],
        layers: "model.layers.layers",
        per_layer_kv: true,
        ..PLAIN
    },
    // GLM-5 (llama.cpp's `glm-dsa`, mlx-lm's `glm_moe_dsa`): DeepSeek V3.2's layout.
    GgufArch {
        arch: "glm-dsa",
        model_type: "glm_moe_dsa",
        config: Some(super::mla::deepseek32_config),
        parts: &[
            ("indexer.attn_q_b", "self_attn.indexer.wq_b"),
            ("indexer.attn_k", "self_attn.indexer.wk"),
            ("indexer.k_norm", "self_attn.indexer.k_norm"),
            ("indexer.proj", "self_attn.indexer.weights_proj"),
        ],
        base_parts: DEEPSEEK2_PARTS,
        ..PLAIN
    },
    // Nemotron-H with mixture-of-experts layers (Nemotron 3 Nano / Super): the dense map's
    // names, the router, its correction bias, the stacked squared-ReLU experts, the latent
    // projections and the shared experts (`nemotron_h_config`).
    GgufArch {
        arch: "nemotron_h_moe",
        model_type: "nemotron_h",
        config: Some(super::ssm::nemotron_h_config),
        permute_qk: true,
        parts: &[
            ("ffn_gate_inp", "mixer.gate"),
            // `exp_probs_b.bias` -> `mixer.gate.e_score_correction_bias` (see `map_name`).
            ("exp_probs_b", "mixer.gate.e_score_correction"),
            ("ffn_up_exps", "mixer.switch_mlp.fc1"),
            ("ffn_down_exps", "mixer.switch_mlp.fc2"),
            ("ffn_latent_down", "mixer.fc1_latent_proj"),
            ("ffn_latent_up", "mixer.fc2_latent_proj"),
            ("ffn_up_shexp", "mixer.shared_experts.up_proj"),
            ("ffn_down_shexp", "mixer.shared_experts.down_proj"),
        ],
        base_parts: NEMOTRON_H_PARTS,
        layers: "backbone.layers",
        top: &[
            ("token_embd", "backbone.embeddings"),
            ("output_norm", "backbone.norm_f"),
        ],
        per_layer_kv: true,
        ..PLAIN
    }, // Step 3.5 (mlx-lm's `step3p5`): head-wise attention gate, router bias, stacked experts, an
    // un-gated shared expert; norms as stored (the converter's + 1 is mlx-lm's sanitize's).
    GgufArch {
        arch: "step35",
        model_type: "step3p5",
        config: Some(super::moe_swa::step35_config),
        parts: &[
            ("attn_gate", "self_attn.g_proj"),
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("ffn_gate_inp", "mlp.gate.gate"),
            // `exp_probs_b.bias` -> the bare `mlp.gate.router_bias` (see `map_name`).
            ("exp_probs_b", "mlp.gate.router_bias"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
            ("ffn_gate_shexp", "mlp.share_expert.gate_proj"),
            ("ffn_up_shexp", "mlp.share_expert.up_proj"),
            ("ffn_down_shexp", "mlp.share_expert.down_proj"),
        ],
        // `rope_freqs` is refused by name (`step35_config`).
        rope_tensors: true,
        ..PLAIN
    },
    // MiMo V2 Flash (mlx-lm's `mimo_v2_flash`): attention sinks, the DeepSeek V3 router,
    // stacked experts (`mimo2_config`).
    GgufArch {
        arch: "mimo2",
        model_type: "mimo_v2_flash",
        config: Some(super::moe_swa::mimo2_config),
        parts: &[
            // `.weight` -> the bare `attention_sink_bias` (see `map_name`).
            ("attn_sinks", "self_attn.attention_sink_bias"),
            ("ffn_gate_inp", "mlp.gate"),
            // `exp_probs_b.bias` -> `mlp.gate.e_score_correction_bias` (see `map_name`).
            ("exp_probs_b", "mlp.gate.e_score_correction"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
        ],
        ..PLAIN
    },
    // Laguna (poolside): per-head softplus gate, sigmoid router with a correction bias,
    // stacked experts, one shared expert (`laguna_config`).
    GgufArch {
        arch: "laguna",
        model_type: "laguna",
        config: Some(super::moe_swa::laguna_config),
        parts: &[
            ("attn_gate", "self_attn.g_proj"),
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("ffn_gate_inp", "mlp.gate.proj"),
            // `exp_probs_b.bias` -> `mlp.gate.e_score_correction_bias` (see `map_name`).
            ("exp_probs_b", "mlp.gate.e_score_correction"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
            ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
            ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
        ],
        ..PLAIN
    },
    // Kimi Linear: KDA layers (short convolutions, low-rank forget / output gates, beta, A,
    // dt bias, gated norm under `ssm_*`) and MLA layers without rope (`k_b` / `v_b` as mlx-lm's
    // `embed_q` / `unembed_out`), a sigmoid router with a correction bias (`kimi_linear_config`).
    GgufArch {
        arch: "kimi-linear",
        model_type: "kimi_linear",
        config: Some(super::linear::kimi_linear_config),
        parts: &[
            ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
            ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
            ("attn_k_b", "self_attn.embed_q"),
            ("attn_v_b", "self_attn.unembed_out"),
            ("ssm_conv1d_q", "self_attn.q_conv.conv"),
            ("ssm_conv1d_k", "self_attn.k_conv.conv"),
            ("ssm_conv1d_v", "self_attn.v_conv.conv"),
            ("ssm_f_a", "self_attn.f_a_proj"),
            ("ssm_f_b", "self_attn.f_b_proj"),
            ("ssm_beta", "self_attn.b_proj"),
            ("ssm_g_a", "self_attn.g_a_proj"),
            ("ssm_g_b", "self_attn.g_b_proj"),
            ("ssm_norm", "self_attn.o_norm"),
            // `ssm_dt.bias` -> `self_attn.dt_bias` (see `map_name`).
            ("ssm_dt", "self_attn.dt"),
            ("ffn_gate_inp", "mlp.gate"),
            // `exp_probs_b.bias` -> `mlp.e_score_correction_bias` (see `map_name`).
            ("exp_probs_b", "mlp.e_score_correction"),
            ("ffn_gate_exps", "mlp.switch_mlp.gate_proj"),
            ("ffn_up_exps", "mlp.switch_mlp.up_proj"),
            ("ffn_down_exps", "mlp.switch_mlp.down_proj"),
            ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
            ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
            ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
        ],
        per_layer_kv: true,
        ..PLAIN
    },
    // Ling 3.0 (mlx-lm's `bailing_moe_v3`): KDA layers (`ssm_*`, `ssm_a` as exp(A_log)) between
    // MLA layers (`attn_k_b` / `attn_v_b` as `embed_q` / `unembed_out`, the head-wise
    // `attn_gate`), grouped sigmoid routing with an expert bias, shared experts
    // (`gguf/bailingmoe3.rs`).
    GgufArch {
        arch: "bailingmoe3",
        model_type: "bailing_moe_v3",
        config: Some(super::bailingmoe3::config),
        parts: &[
            ("attn_q", "attention.q_proj"),
            ("attn_k", "attention.k_proj"),
            ("attn_v", "attention.v_proj"),
            // `o_proj` on KDA layers (`bailingmoe3::config`).
            ("attn_output", "attention.dense"),
            ("attn_gate", "attention.g_proj"),
            ("ssm_g_a", "attention.g_proj"),
            ("ssm_conv1d_q", "attention.q_conv1d"),
            ("ssm_conv1d_k", "attention.k_conv1d"),
            ("ssm_conv1d_v", "attention.v_conv1d"),
            ("ssm_f_a", "attention.f_proj"),
            ("ssm_beta", "attention.b_proj"),
            ("ssm_norm", "attention.o_norm"),
            // `ssm_dt.bias` -> `attention.dt_bias` (`bailingmoe3::config`).
            ("ssm_dt", "attention.dt_proj"),
            ("attn_q_a", "attention.q_a_proj"),
            ("attn_q_a_norm", "attention.q_a_layernorm"),
            ("attn_q_b", "attention.q_b_proj"),
            ("attn_kv_a_mqa", "attention.kv_a_proj_with_mqa"),
            ("attn_kv_a_norm", "attention.kv_a_layernorm"),
            ("attn_k_b", "attention.embed_q"),
            ("attn_v_b", "attention.unembed_out"),
            ("ffn_gate_inp", "mlp.gate"),
            // `exp_probs_b.bias` -> the bare `mlp.gate.expert_bias` (see `map_name`).
            ("exp_probs_b", "mlp.gate.expert_bias"),
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        top: &[("token_embd", "model.word_embeddings")],
        per_layer_kv: true,
        ..PLAIN
    },
    // MiniMax M3's text tower (mlx-lm's `minimax_m3_vl`): per-head Q / K norms, the MSA
    // indexer (`indexer.*`), sigmoid routing with `exp_probs_b`, a shared expert; norms stored
    // `1 + w` (`gguf/minimax_m3.rs`).
    GgufArch {
        arch: "minimax-m3",
        model_type: "minimax_m3_vl",
        config: Some(super::minimax_m3::config),
        norm_plus_one: true,
        parts: &[
            ("attn_q_norm", "self_attn.q_norm"),
            ("attn_k_norm", "self_attn.k_norm"),
            ("indexer.q_proj", "self_attn.index_q_proj"),
            ("indexer.k_proj", "self_attn.index_k_proj"),
            ("indexer.q_norm", "self_attn.index_q_norm"),
            ("indexer.k_norm", "self_attn.index_k_norm"),
            ("ffn_gate_inp", "block_sparse_moe.gate"),
            // `exp_probs_b.bias` -> `block_sparse_moe.e_score_correction_bias` (see `map_name`).
            ("exp_probs_b", "block_sparse_moe.e_score_correction"),
            ("ffn_gate_exps", "block_sparse_moe.switch_mlp.gate_proj"),
            ("ffn_up_exps", "block_sparse_moe.switch_mlp.up_proj"),
            ("ffn_down_exps", "block_sparse_moe.switch_mlp.down_proj"),
            (
                "ffn_gate_shexp",
                "block_sparse_moe.shared_experts.gate_proj",
            ),
            ("ffn_up_shexp", "block_sparse_moe.shared_experts.up_proj"),
            (
                "ffn_down_shexp",
                "block_sparse_moe.shared_experts.down_proj",
            ),
        ],
        text_of: Some(("language_model.", "", "minimax_m3")),
        ..PLAIN
    },
    // Kimi K3 (mlx-lm's `kimi_k3`): KDA layers (`ssm_*`, the full-rank `ssm_g`, q / k / v and
    // their convolutions joined back), NoPE MLA layers with an output gate (`attn_gate`), the
    // fused attention-residual scores, a latent MoE (`ffn_routed_*`) (`gguf/kimi_k3.rs`).
    GgufArch {
        arch: "kimi-k3",
        model_type: "kimi_k3",
        config: Some(super::kimi_k3::config),
        parts: &[
            ("attn_q_a", "self_attn.q_a_proj"),
            ("attn_q_a_norm", "self_attn.q_a_layernorm"),
            ("attn_q_b", "self_attn.q_b_proj"),
            ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
            ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
            ("attn_k_b", "self_attn.embed_q"),
            ("attn_v_b", "self_attn.unembed_out"),
            ("attn_gate", "self_attn.g_proj"),
            ("ssm_g", "self_attn.g_proj"),
            // Joined into `qkv_conv` by `kimi_k3::config`.
            ("ssm_conv1d_q", "self_attn.gguf_conv_q"),
            ("ssm_conv1d_k", "self_attn.gguf_conv_k"),
            ("ssm_conv1d_v", "self_attn.gguf_conv_v"),
            ("ssm_f_a", "self_attn.f_a_proj"),
            ("ssm_f_b", "self_attn.f_b_proj"),
            ("ssm_beta", "self_attn.b_proj"),
            ("ssm_norm", "self_attn.o_norm"),
            // `ssm_dt.bias` -> `self_attn.dt_bias` (see `map_name`).
            ("ssm_dt", "self_attn.dt"),
            // Each a norm weight and a projection of ones (`kimi_k3::config`).
            ("attn_res_score", "gguf_attn_res_score"),
            ("ffn_res_score", "gguf_ffn_res_score"),
            ("ffn_gate_inp", "mlp.gate"),
            // `exp_probs_b.bias` -> `mlp.e_score_correction_bias` (see `map_name`).
            ("exp_probs_b", "mlp.e_score_correction"),
            EXPERT_PARTS[1],
            EXPERT_PARTS[2],
            EXPERT_PARTS[3],
            ("ffn_routed_down", "mlp.routed_expert_down_proj"),
            ("ffn_routed_up", "mlp.routed_expert_up_proj"),
            ("ffn_routed_norm", "mlp.routed_expert_norm"),
            SHARED_EXPERT_PARTS[0],
            SHARED_EXPERT_PARTS[1],
            SHARED_EXPERT_PARTS[2],
        ],
        top: &[("output_res_score", "model.gguf_output_res_score")],
        per_layer_kv: true,
        text_of: Some(("language_model.", "", "kimi_linear")),
        ..PLAIN
    },
    // XVERSE (mlx-lm remaps `xverse` to `llama`): llama's names, Q / K rows permuted
    // (`gguf/xverse.rs`).
    GgufArch {
        arch: "xverse",
        model_type: "llama",
        config: Some(|cx| super::xverse::config(cx.config, cx.path, cx.heads, cx.kv_heads)),
        permute_qk: true,
        ..PLAIN
    },
];

/// mlx-lm parameters without a `.weight`, to which the converters add one.
const BARE_PARAMS: &[&str] = &[
    ".self_attn.sinks",
    ".self_attn.attention_sink_bias",
    ".layer_scalar",
    ".altup.correct_output_scale",
    ".attn.k_k",
    ".attn.k_a",
    ".attn.r_k",
    ".ffn.x_k",
    ".embed_skip.a_g",
    ".attn.head_gain.head_g",
    ".mixer.q_weight",
    ".mixer.k_weight",
    ".mixer.dt_norm_weight",
    ".mixer.B_norm_weight",
    ".mixer.C_norm_weight",
];

/// `llama.cpp` tensor names to mlx-lm's, for `a`.
pub(super) fn map_name(a: &GgufArch, name: &str) -> Option<String> {
    let (base, suffix) = name.rsplit_once('.')?;
    let top = a
        .top
        .iter()
        .find(|(from, _)| *from == base)
        .map(|(_, to)| *to);
    let mapped = match (top, base) {
        (Some(to), _) => to.to_string(),
        (None, "token_embd") => "model.embed_tokens".to_string(),
        (None, "output_norm") => "model.norm".to_string(),
        (None, "output") => "lm_head".to_string(),
        _ => {
            let rest = base.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let found = a
                .parts
                .iter()
                .chain(a.base_parts)
                .find(|(from, _)| *from == part);
            let part = match found {
                Some((_, to)) => *to,
                None => match part {
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_output" => "self_attn.o_proj",
                    "attn_norm" => "input_layernorm",
                    "ffn_norm" => "post_attention_layernorm",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_down" => "mlp.down_proj",
                    "attn_rot_embd" => "self_attn.rotary_emb.inv_freq",
                    _ => return None,
                },
            };
            format!("{}.{layer}.{part}", a.layers)
        }
    };
    if (BARE_PARAMS.iter().any(|b| mapped.ends_with(b)) && suffix == "weight")
        || ((mapped.ends_with(".feed_forward.expert_bias")
            || mapped.ends_with(".mlp.gate.expert_bias")
            || mapped.ends_with(".mlp.gate.router_bias")
            || mapped.ends_with(".mlp.expert_bias"))
            && suffix == "bias")
    {
        // gpt-oss's `sinks` and LFM2-MoE's `expert_bias` are bare parameters in mlx-lm; the
        // converters add a `.weight` / `.bias`.
        return Some(mapped);
    }
    if (mapped.ends_with(".e_score_correction")
        || mapped.ends_with(".self_attn.dt")
        || mapped.ends_with(".mamba.dt")
        || mapped.ends_with(".mixer.dt"))
        && suffix == "bias"
    {
        return Some(format!("{mapped}_bias"));
    }
    Some(format!("{mapped}.{suffix}"))
}

/// Whether `mapped` is an attention layer's `proj` (`q_proj` / `k_proj`): under `self_attn`,
/// or Nemotron-H's `mixer`.
pub(super) fn is_proj(mapped: &str, proj: &str) -> bool {
    mapped.contains(&format!(".self_attn.{proj}.")) || mapped.contains(&format!(".mixer.{proj}."))
}

/// llama.cpp's encoder architectures (BERT-style embedding models), which [`read_gguf`] refuses
/// by name: mlx-lm has no encoder model type. Their tokenizers (`bert`, `whitespace`, `gpt2`
/// with `mmbert`, ...) are read.
pub(super) const GGUF_ENCODERS: &[(&str, &str)] = &[
    ("bert", "BERT"),
    ("modern-bert", "ModernBERT, mmBERT"),
    ("nomic-bert", "Nomic BERT"),
    ("nomic-bert-moe", "Nomic BERT MoE"),
    ("neo-bert", "NeoBERT"),
    ("jina-bert-v2", "Jina BERT v2"),
    ("jina-bert-v3", "Jina BERT v3"),
    ("eurobert", "EuroBERT"),
    ("t5encoder", "T5's encoder"),
];
