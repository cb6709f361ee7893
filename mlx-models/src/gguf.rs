//! GGUF model files, read through MLX's loader: llama.cpp tensor names mapped to mlx-lm's per
//! architecture ([`supported_gguf_architectures`]: one `GgufArch` row each in `ARCHS`), the Q/K
//! rows of the architectures llama.cpp's converter writes through its llama class un-permuted
//! (stored interleaved for its rope), Gemma's `1 + w` norms turned back into mlx-lm's `w`,
//! tensors the converter reshaped or fused put back (fused expert gate/up, Qwen3-Next's
//! regrouped `in_proj_qkvz` and `-exp(A_log)`), rope tensors turned back into the
//! `rope_scaling` they were computed from, hyper-parameters from metadata, and the tokenizer
//! data.
//!
//! Tensors come one of two ways ([`GgufTensors`]). MLX's reader returns Q4_0 / Q4_1 / Q8_0
//! tensors as affine-quantized triples (`<name>.weight`, `.scales`, `.biases`, group size 32),
//! whose quantization is then inferred from the shapes exactly as mlx-lm infers it for a
//! checkpoint without a `quantization` block; F32 and F16 keep their dtype. Files holding any
//! other type (k-quants, Q5_0, Q5_1, BF16: MLX 0.32.4 fails on some and turns the others into
//! f16) are read in Rust instead ([`mlx_core::io::read_gguf_header`]) and every tensor is
//! dequantized to f32 by [`crate::gguf_dequant`], bit for bit as gguf-py dequantizes it.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::io::{load_gguf, read_gguf_header, GgufMetadata, GgufValue};
use mlx_core::prelude::*;
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::load::LoadOptions;
use crate::models::{build, LanguageModel};
use crate::weights::Weights;

/// What a GGUF file holds, mapped for this crate.
pub struct GgufModel {
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, Array>,
    pub metadata: GgufMetadata,
    /// Weights kept as GGML blocks ([`GgufTensors::Blocks`]; else empty), by mlx-lm name
    /// (`<path>.weight`).
    pub blocks: BTreeMap<String, crate::layers::GgmlWeight>,
}

fn gguf_err(path: &Path, m: impl std::fmt::Display) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        message: m.to_string(),
    }
}

/// A positive integer hyper-parameter `key`, as a 32-bit value.
fn meta_count(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Option<i32>> {
    let Some(v) = meta_f64(meta, key) else {
        return match meta.get(key) {
            None => Ok(None),
            Some(_) => Err(gguf_err(path, format!("metadata `{key}` is not a number"))),
        };
    };
    if v.fract() != 0.0 || !(1.0..=f64::from(i32::MAX)).contains(&v) {
        return Err(gguf_err(
            path,
            format!("metadata `{key}` is {v}; it must be a positive 32-bit integer"),
        ));
    }
    Ok(Some(v as i32))
}

/// A float metadata value that must be finite and positive when present (rope bases,
/// routing scales): `None` when absent, an error naming the key otherwise.
fn positive_f64(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Option<f64>> {
    match meta_f64(meta, key) {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(gguf_err(
            path,
            format!("metadata `{key}` is {v}; it must be a finite number > 0"),
        )),
        v => Ok(v),
    }
}

/// A metadata number (scalar array) as f64.
pub fn meta_f64(meta: &GgufMetadata, key: &str) -> Option<f64> {
    match meta.get(key) {
        Some(GgufValue::Array(a)) if a.size() == 1 => {
            a.astype(Dtype::Float64).ok()?.item::<f64>().ok()
        }
        _ => None,
    }
}

/// A metadata string.
pub fn meta_str<'a>(meta: &'a GgufMetadata, key: &str) -> Option<&'a str> {
    match meta.get(key) {
        Some(GgufValue::String(s)) => Some(s),
        _ => None,
    }
}

/// One GGUF architecture: the `model_type` that serves it and how its tensors map.
struct GgufArch {
    arch: &'static str,
    model_type: &'static str,
    /// llama.cpp stores Q / K rows permuted for its interleaved rope (llama only).
    permute_qk: bool,
    /// llama.cpp stores Gemma norm weights as `1 + w`: every `*_norm` tensor gets `- 1`.
    norm_plus_one: bool,
    /// Per-layer names that differ from llama's.
    parts: &'static [(&'static str, &'static str)],
    /// The prefix of mlx-lm's per-layer names (`model.layers`).
    layers: &'static str,
    /// Top-level names that differ from llama's (`token_embd`, `output_norm`, `output`).
    top: &'static [(&'static str, &'static str)],
    /// Names tried after `parts` (an architecture written by another's converter class).
    base_parts: &'static [(&'static str, &'static str)],
    /// Reads the rope factor tensors ([`ROPE_TENSORS`]: Phi-3's long rope, Llama 3's
    /// `rope_freqs`) into `rope_scaling`.
    rope_tensors: bool,
    /// `attention.head_count_kv` is a per-layer list, 0 on the layers without attention.
    per_layer_kv: bool,
    /// mlx-lm serves the file as the text model of a multimodal checkpoint: its weights
    /// renamed (a leading `.1` replaced by `.0`), its config as `text_config` of `.2`.
    text_of: Option<(&'static str, &'static str, &'static str)>,
}

/// Tensors llama.cpp writes for rope scaling, which mlx-lm's configs hold as numbers.
const ROPE_TENSORS: &[&str] = &[
    "rope_factors_long.weight",
    "rope_factors_short.weight",
    "rope_freqs.weight",
];

/// The fields most architectures share (llama's names, nothing permuted or shifted).
const PLAIN: GgufArch = GgufArch {
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
const QWEN35_PARTS: &[(&str, &str)] = &[
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

const ARCHS: &[GgufArch] = &[
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
        permute_qk: false,
        norm_plus_one: true,
        parts: GEMMA2_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "gemma3",
        model_type: "gemma3_text",
        permute_qk: false,
        norm_plus_one: true,
        parts: GEMMA2_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "qwen3moe",
        model_type: "qwen3_moe",
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
        permute_qk: false,
        norm_plus_one: false,
        parts: DEEPSEEK2_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "glm4",
        model_type: "glm4",
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
        norm_plus_one: true,
        ..PLAIN
    },
    // Hunyuan dense: per-head q / k norms; the NTK-alpha rope comes already scaled.
    GgufArch {
        arch: "hunyuan-dense",
        model_type: "hunyuan_v1_dense",
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
        permute_qk: true,
        ..PLAIN
    },
    // DeepSeek MoE (v1): Q/K permuted, routed experts stacked, shared experts.
    GgufArch {
        arch: "deepseek",
        model_type: "deepseek",
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
        rope_tensors: true,
        ..PLAIN
    },
    // BitNet b1.58: llama's names plus the sub-norms; the projections, written as ternary
    // values times one scale, packed back into mlx-lm's BitLinear (`bitnet_config`).
    GgufArch {
        arch: "bitnet",
        model_type: "bitnet",
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
        parts: &[("attn_norm", "norm")],
        layers: "model.layers.layers",
        ..PLAIN
    },
    // PLaMo 3: sandwich norms stored with mlx-lm's runtime offsets added (`plamo3_config`
    // takes them off), fused qkv and gate-up, sliding layers with their own rope base.
    GgufArch {
        arch: "plamo3",
        model_type: "plamo3",
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
        parts: MLA_PARTS,
        rope_tensors: true,
        ..PLAIN
    },
    // GLM-4.5 (glm4_moe): DeepSeek V3's router, q/k norms, partial rope; its MTP layer skipped.
    GgufArch {
        arch: "glm4moe",
        model_type: "glm4_moe",
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
        parts: QWEN35_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "qwen35moe",
        model_type: "qwen3_5_moe",
        parts: QWEN35_PARTS,
        ..PLAIN
    },
    GgufArch {
        arch: "seed_oss",
        model_type: "seed_oss",
        ..PLAIN
    },
    // ERNIE 4.5 (dense): interleaved rope on both sides, nothing permuted.
    GgufArch {
        arch: "ernie4_5",
        model_type: "ernie4_5",
        ..PLAIN
    },
    // Command R: one LayerNorm per block (parallel attention and MLP), per-head q/k norms.
    GgufArch {
        arch: "command-r",
        model_type: "cohere",
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
        ..PLAIN
    },
    // gpt-oss: attention sinks (`attn_sinks.weight`, mlx-lm's bare `sinks`), a biased router,
    // biased experts (gate and up written apart by the converter), post-attention norm as
    // llama.cpp's `post_attention_norm`; every other layer sliding, as both default.
    GgufArch {
        arch: "gpt-oss",
        model_type: "gpt_oss",
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
        permute_qk: true,
        rope_tensors: true,
        ..PLAIN
    },
    // EXAONE 4.0: post-norms only, q/k norms, sliding layers, Llama 3's rope as `rope_freqs`.
    GgufArch {
        arch: "exaone4",
        model_type: "exaone4",
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
fn map_name(a: &GgufArch, name: &str) -> Option<String> {
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
fn is_proj(mapped: &str, proj: &str) -> bool {
    mapped.contains(&format!(".self_attn.{proj}.")) || mapped.contains(&format!(".mixer.{proj}."))
}

/// Undoes llama.cpp's row permutation of Q / K: rows viewed as
/// `(heads, head_dim / 2, 2)` -> swap the last two -> flatten. Scales and biases of a
/// quantized tensor move with their rows. `name`/`key` name the tensor and the head count for
/// the message when the shape does not allow it.
fn unpermute(a: &Array, heads: i32, name: &str, key: &str) -> Result<Array> {
    let shape = a.shape();
    let &[rows, cols] = shape.as_slice() else {
        return Err(ModelError::Weights(vec![format!(
            "GGUF tensor {name}: shape {shape:?}, expected 2 dimensions"
        )]));
    };
    if heads <= 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
        return Err(ModelError::Weights(vec![format!(
            "GGUF tensor {name}: {rows} rows cannot be split into {key} = {heads} heads of an \
             even head dimension"
        )]));
    }
    let hd = rows / heads;
    let v = ops::reshape(a, &[heads, hd / 2, 2, cols], None)?;
    let v = ops::swapaxes(&v, 1, 2, None)?;
    Ok(ops::reshape(&v, &[rows, cols], None)?)
}

/// How [`read_gguf_with`] obtains the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufTensors {
    /// MLX's reader when every tensor is of a type it loads as stored (F32, F16, Q4_0, Q4_1,
    /// Q8_0), else [`GgufTensors::Dequantize`].
    #[default]
    Auto,
    /// MLX's reader (`mx.load`).
    Mlx,
    /// Every tensor dequantized to f32 in Rust, as gguf-py's `dequantize` does.
    Dequantize,
    /// For the CPU decoder: as [`GgufTensors::Auto`] where MLX's reader takes every tensor as
    /// stored; else the linear and embedding weights stored in a GGML block type
    /// (`mlx_core::cpu::kquant::GgmlType`) kept as their blocks, read in place by its int8
    /// kernels ([`GgufModel::blocks`]; about the file's size in memory, where dequantizing
    /// takes 4 bytes a weight); every other tensor as [`GgufTensors::Dequantize`] gives it.
    /// The MLX forward over kept weights dequantizes them on use (the same bits, slowly).
    Blocks,
}

/// The mlx-lm names whose GGML blocks [`GgufTensors::Blocks`] keeps: plain linear and
/// embedding weights (not experts, fused or reshaped tensors).
fn keeps_blocks(mapped: &str) -> bool {
    const ENDS: &[&str] = &[
        ".q_proj.weight",
        ".k_proj.weight",
        ".v_proj.weight",
        ".o_proj.weight",
        ".gate_proj.weight",
        ".up_proj.weight",
        ".down_proj.weight",
    ];
    let top = matches!(mapped, "model.embed_tokens.weight" | "lm_head.weight");
    top || (mapped.starts_with("model.layers.")
        && !mapped.contains("expert")
        && !mapped.contains("switch_mlp")
        && ENDS.iter().any(|e| mapped.ends_with(e)))
}

/// The tensors of `header`: those `keep` picks (2-dimensional, of a GGML block type) as
/// their bytes, `(name, type, rows, cols, uint8 (rows, row_bytes))`, the others dequantized.
#[allow(clippy::type_complexity)]
fn blocks_with(
    path: &Path,
    header: mlx_core::io::GgufHeader,
    keep: impl Fn(&str) -> bool,
) -> Result<(
    BTreeMap<String, Array>,
    GgufMetadata,
    Vec<(String, mlx_core::cpu::kquant::GgmlType, i32, i32, Array)>,
)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut kept = Vec::new();
    let mut rest = header.clone();
    rest.tensors.clear();
    let mut file = std::fs::File::open(path).map_err(|e| gguf_err(path, e))?;
    for t in &header.tensors {
        let ty = mlx_core::cpu::kquant::GgmlType::from_id(t.ggml_type);
        let (Some(ty), &[cols, rows]) = (ty, t.dims.as_slice()) else {
            rest.tensors.push(t.clone());
            continue;
        };
        let (Ok(rows), Ok(cols)) = (i32::try_from(rows), i32::try_from(cols)) else {
            rest.tensors.push(t.clone());
            continue;
        };
        if !keep(&t.name) || cols as usize % ty.block() != 0 {
            rest.tensors.push(t.clone());
            continue;
        }
        let rb = ty.row_bytes(cols as usize);
        let len = (rows as usize)
            .checked_mul(rb)
            .filter(|&n| n as u64 == t.bytes && i32::try_from(rb).is_ok())
            .ok_or_else(|| gguf_err(path, format!("tensor {}: size does not match", t.name)))?;
        let mut bytes = vec![0u8; len];
        file.seek(SeekFrom::Start(t.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| gguf_err(path, format!("tensor {}: {e}", t.name)))?;
        let a = Array::from_slice(&bytes, &[rows, rb as i32])?;
        kept.push((t.name.clone(), ty, rows, cols, a));
    }
    let (raw, metadata) = dequantized_with(path, rest)?;
    Ok((raw, metadata, kept))
}

/// GGML types MLX's GGUF reader loads without converting them (F32, F16, Q4_0, Q4_1, Q8_0).
const MLX_NATIVE_TYPES: &[u32] = &[0, 1, 2, 3, 8];

/// The tensors of a GGUF file whose types are all F32, F16, Q4_0, Q4_1 or Q8_0, bit for bit as
/// MLX's `load_gguf` gives them, read one tensor at a time (the path [`read_gguf`] takes for
/// such files), with the file's metadata.
pub fn read_gguf_native(path: &Path) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
    native_streamed(path, header)
}

/// The tensors of a GGUF file whose types are all [`MLX_NATIVE_TYPES`], as MLX's `load_gguf`
/// gives them (bit for bit: F32/F16 as stored; Q4_0, Q4_1, Q8_0 as MLX's affine triples
/// `NAME.weight` uint32, `NAME.scales` / `NAME.biases` f16), read one tensor at a time. MLX's
/// reader maps the whole file and keeps every page of it resident until the last tensor is
/// converted, which doubles the load's peak memory (results/bench/2026-12-05-s26-memory); here
/// only one tensor's bytes are held beside the converted arrays. The block layouts follow MLX
/// 0.32.4's `extract_q4_0_data` / `extract_q4_1_data` / `extract_q8_0_data`; the test
/// `gguf_dense::native_streamed_matches_mlx_loader` checks them against [`load_gguf`].
fn native_streamed(
    path: &Path,
    header: mlx_core::io::GgufHeader,
) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| gguf_err(path, e))?;
    let mut tensors = BTreeMap::new();
    for t in &header.tensors {
        let bad = |what: &str| gguf_err(path, format!("tensor {}: {what}", t.name));
        let mut shape = t
            .dims
            .iter()
            .rev()
            .map(|&d| i32::try_from(d))
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map_err(|_| bad("dimension too large"))?;
        let elements = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| bad("too many elements"))?;
        // (bytes per element or per 32-element block, bytes of a block's header)
        let (unit, block_bytes) = match t.ggml_type {
            0 => (4, 0),
            1 => (2, 0),
            2 => (18, 2),
            3 => (20, 4),
            8 => (34, 2),
            _ => return Err(bad("not a type MLX reads natively")),
        };
        let quantized = block_bytes > 0;
        let last = shape.last().copied().unwrap_or(1);
        if quantized && (last % 32 != 0 || shape.is_empty()) {
            return Err(bad("last dimension is not a multiple of 32"));
        }
        let len = if quantized {
            elements / 32 * unit
        } else {
            elements * unit
        };
        if len as u64 != t.bytes {
            return Err(bad("size does not match its type and shape"));
        }
        let mut bytes = vec![0u8; len];
        file.seek(SeekFrom::Start(t.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| bad(&e.to_string()))?;
        if !quantized {
            let dtype = if t.ggml_type == 0 {
                mlx_core::Dtype::Float32
            } else {
                mlx_core::Dtype::Float16
            };
            let mut byte_shape = shape.clone();
            match byte_shape.last_mut() {
                Some(d) => *d *= unit as i32,
                None => byte_shape.push(unit as i32),
            }
            let a = Array::from_slice(&bytes, &byte_shape)?.view(dtype)?;
            let a = if shape.is_empty() { a.reshape(&[])? } else { a };
            a.eval()?;
            tensors.insert(t.name.clone(), a);
            continue;
        }
        let blocks = elements / 32;
        let per_block = if t.ggml_type == 8 { 32 } else { 16 };
        let mut scale = Vec::with_capacity(blocks * 2);
        let mut bias = Vec::with_capacity(if t.ggml_type == 3 { blocks * 2 } else { 0 });
        let mut weights = Vec::with_capacity(blocks * per_block);
        for b in bytes.chunks_exact(unit) {
            scale.extend_from_slice(&b[..2]);
            let qs = &b[block_bytes..];
            match t.ggml_type {
                3 | 2 => {
                    if t.ggml_type == 3 {
                        bias.extend_from_slice(&b[2..4]);
                    }
                    // MLX's unpack_32_4: element j < 16 is the low nibble of qs[j], element
                    // 16 + j the high one; packed two per byte, the even element low.
                    for half in [0u8, 4] {
                        for j in (0..16).step_by(2) {
                            weights.push(
                                ((qs[j] >> half) & 0x0F) | (((qs[j + 1] >> half) & 0x0F) << 4),
                            );
                        }
                    }
                }
                _ => weights.extend(qs.iter().map(|&x| x ^ 0x80)),
            }
        }
        drop(bytes);
        let rows = &shape[..shape.len() - 1];
        let groups = last / 32;
        let mut s_shape = rows.to_vec();
        s_shape.push(groups * 2);
        let scales = Array::from_slice(&scale, &s_shape)?.view(mlx_core::Dtype::Float16)?;
        let biases = if t.ggml_type == 3 {
            Array::from_slice(&bias, &s_shape)?.view(mlx_core::Dtype::Float16)?
        } else {
            scales.multiply_scalar(if t.ggml_type == 2 { -8 } else { -128 })?
        };
        *shape.last_mut().expect("non-empty") = groups * per_block as i32;
        let w = Array::from_slice(&weights, &shape)?.view(mlx_core::Dtype::Uint32)?;
        mlx_core::eval([&w, &scales, &biases])?;
        // MLX cuts the name's last 7 bytes (`.weight`) whatever they are.
        let base = t
            .name
            .get(..t.name.len().saturating_sub(7))
            .unwrap_or(&t.name);
        tensors.insert(format!("{base}.scales"), scales);
        tensors.insert(format!("{base}.biases"), biases);
        tensors.insert(t.name.clone(), w);
    }
    Ok((tensors, header.metadata))
}

/// Every tensor of the GGUF file at `path` dequantized to f32 (shapes row-major, as MLX and
/// numpy give them), with the file's metadata; both read in Rust.
pub fn read_gguf_dequantized(path: &Path) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
    dequantized_with(path, header)
}

/// [`read_gguf_dequantized`] with the header already read.
fn dequantized_with(
    path: &Path,
    header: mlx_core::io::GgufHeader,
) -> Result<(BTreeMap<String, Array>, GgufMetadata)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| gguf_err(path, e))?;
    let mut tensors = BTreeMap::new();
    for t in &header.tensors {
        let elements = t
            .dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| gguf_err(path, format!("tensor {}: too many elements", t.name)))?;
        let shape = t
            .dims
            .iter()
            .rev()
            .map(|&d| i32::try_from(d))
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map_err(|_| gguf_err(path, format!("tensor {}: dimension too large", t.name)))?;
        let len = usize::try_from(t.bytes)
            .map_err(|_| gguf_err(path, format!("tensor {}: too large", t.name)))?;
        let mut bytes = vec![0u8; len];
        file.seek(SeekFrom::Start(t.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| gguf_err(path, format!("tensor {}: {e}", t.name)))?;
        let values = crate::gguf_dequant::dequantize(t.ggml_type, &bytes, elements)
            .map_err(|e| gguf_err(path, format!("tensor {}: {e}", t.name)))?;
        drop(bytes);
        tensors.insert(t.name.clone(), Array::from_slice(&values, &shape)?);
    }
    Ok((tensors, header.metadata))
}

/// llama.cpp's encoder architectures (BERT-style embedding models), which [`read_gguf`] refuses
/// by name: mlx-lm has no encoder model type. Their tokenizers (`bert`, `whitespace`, `gpt2`
/// with `mmbert`, ...) are read.
const GGUF_ENCODERS: &[(&str, &str)] = &[
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

/// The GGUF architectures [`read_gguf`] maps (`general.architecture` values).
pub fn supported_gguf_architectures() -> Vec<&'static str> {
    ARCHS.iter().map(|a| a.arch).collect()
}

/// Reads a GGUF file of a supported architecture (see [`supported_gguf_architectures`]),
/// its tensors as [`GgufTensors::Auto`] chooses.
pub fn read_gguf(path: &Path) -> Result<GgufModel> {
    read_gguf_with(path, GgufTensors::Auto)
}

/// [`read_gguf`] with the tensors obtained as `how` says.
pub fn read_gguf_with(path: &Path, how: GgufTensors) -> Result<GgufModel> {
    // The header is read once here; MLX's own reader parses the file for its tensors.
    let mut kept = Vec::new();
    let (raw, metadata) = match how {
        GgufTensors::Blocks => {
            let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
            if header
                .tensors
                .iter()
                .all(|t| MLX_NATIVE_TYPES.contains(&t.ggml_type))
            {
                // As `Auto`: MLX's affine triples, which the CPU decoder reads.
                return read_gguf_with(path, GgufTensors::Auto);
            }
            let arch_name = meta_str(&header.metadata, "general.architecture").unwrap_or("");
            let arch = ARCHS.iter().find(|a| a.arch == arch_name);
            let keep = |name: &str| {
                arch.and_then(|a| map_name(a, name))
                    .is_some_and(|m| keeps_blocks(&m))
            };
            let (raw, metadata, k) = blocks_with(path, header, keep)?;
            kept = k;
            (raw, metadata)
        }
        GgufTensors::Auto => {
            let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
            if header
                .tensors
                .iter()
                .all(|t| MLX_NATIVE_TYPES.contains(&t.ggml_type))
            {
                native_streamed(path, header)?
            } else {
                dequantized_with(path, header)?
            }
        }
        GgufTensors::Dequantize => read_gguf_dequantized(path)?,
        GgufTensors::Mlx => load_gguf(path, None).map_err(|e| gguf_err(path, e))?,
    };
    let arch_name = meta_str(&metadata, "general.architecture").unwrap_or("");
    if let Some((_, why)) = GGUF_ENCODERS.iter().find(|(a, _)| *a == arch_name) {
        return Err(gguf_err(
            path,
            format!(
                "GGUF architecture `{arch_name}` ({why}) is not served: it is an encoder (masked \
                 language model / embeddings) and mlx-lm 0.32.2, whose model types this crate \
                 serves, has none; its tokenizer can still be read \
                 (mlx_tokenizers::tokenizer_gguf)"
            ),
        ));
    }
    let Some(arch) = ARCHS.iter().find(|a| a.arch == arch_name) else {
        return Err(ModelError::UnsupportedModelType {
            model_type: format!("gguf:{arch_name}"),
            remapped_to: None,
            supported: ARCHS.iter().map(|a| format!("gguf:{}", a.arch)).collect(),
        });
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    // A float hyper-parameter that is present must be finite and within what it means: a NaN
    // `rope.freq_base` became JSON null (serde_json's NaN) and the default replaced it.
    let float = |k: &str, zero_ok: bool| -> Result<Option<f64>> {
        let Some(v) = meta_f64(&metadata, &key(k)) else {
            if metadata.contains_key(&key(k)) {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is not a number", key(k)),
                ));
            }
            return Ok(None);
        };
        let ok = v.is_finite() && v <= f64::from(f32::MAX) && (v > 0.0 || (zero_ok && v == 0.0));
        if !ok {
            let want = if zero_ok {
                "a finite number >= 0"
            } else {
                "a finite number > 0"
            };
            return Err(gguf_err(
                path,
                format!("metadata `{}` is {v}; it must be {want}", key(k)),
            ));
        }
        Ok(Some(v))
    };
    let count = |k: &str| -> Result<i32> {
        meta_count(&metadata, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    // Pure state-space stacks: no attention heads, no feed-forward width (both written as 0).
    let attention_free = matches!(arch.arch, "mamba" | "mamba2");
    // OpenELM writes its query / KV head counts per layer; the first layer's stand for the
    // shared reads below, `openelm_config` takes the lists.
    let openelm_heads = if arch.arch == "openelm" {
        Some((
            per_layer_counts(&metadata, path, &key("attention.head_count"))?,
            per_layer_counts(&metadata, path, &key("attention.head_count_kv"))?,
        ))
    } else {
        None
    };
    // Deci (Nemotron-NAS) writes them per layer too, 0 where a layer has no attention (KV 0
    // also for a linear stand-in); `deci_config` reads the lists.
    let deci_heads = if arch.arch == "deci" {
        Some((
            layer_counts(&metadata, path, &key("attention.head_count"), 0)?,
            layer_counts(&metadata, path, &key("attention.head_count_kv"), 0)?,
        ))
    } else {
        None
    };
    let heads = if let Some((q, _)) = &openelm_heads {
        q[0]
    } else if let Some((q, _)) = &deci_heads {
        // The model's head count: that of its attention layers (`deci_config` checks them),
        // else the width over the head size.
        match q.iter().copied().find(|&n| n > 0) {
            Some(n) => n,
            None => {
                let d = count("attention.key_length")?.max(1);
                count("embedding_length")? / d
            }
        }
    } else if arch.arch == "rwkv7" {
        // RWKV-7 writes a head count of 0 (unused); its heads are the width over the head size.
        let (h, d) = (count("embedding_length")?, count("wkv.head_size")?);
        if h % d != 0 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {d} does not divide `{}` = {h}",
                    key("wkv.head_size"),
                    key("embedding_length")
                ),
            ));
        }
        h / d
    } else if attention_free {
        // Mamba writes a head count of 0 (unused).
        1
    } else if let (true, Some(GgufValue::Array(a))) = (
        matches!(arch.arch, "step35" | "laguna"),
        metadata.get(&key("attention.head_count")),
    ) {
        // Step 3.5 writes one per layer, the sliding layers' their own (`step35_config`):
        // layer 0's here.
        first_count(a, path, &key("attention.head_count"))?
    } else if let (true, Some(GgufValue::Array(a))) = (
        arch.per_layer_kv,
        metadata.get(&key("attention.head_count")),
    ) {
        // PLaMo 2 writes it per layer too, 0 on its Mamba layers: the attention layers' count.
        let per = a
            .astype(Dtype::Int64)
            .and_then(|b| b.to_vec::<i64>())
            .map_err(|e| gguf_err(path, format!("metadata `attention.head_count`: {e}")))?;
        let mut nonzero = per.iter().copied().filter(|&n| n != 0);
        match nonzero.next() {
            Some(n) if n > 0 && n <= i64::from(i32::MAX) && nonzero.all(|m| m == n) => n as i32,
            _ => {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` is {per:?}: {arch_name} needs one positive head count on \
                         its attention layers, 0 on the others",
                        key("attention.head_count")
                    ),
                ))
            }
        }
    } else {
        count("attention.head_count")?
    };
    // LFM2 and Granite 4.0 H write `head_count_kv` per layer, 0 for their convolution /
    // Mamba layers.
    let kv_per_layer = match metadata.get(&key("attention.head_count_kv")) {
        Some(GgufValue::Array(a)) if arch.per_layer_kv && a.ndim() == 1 => Some(
            a.astype(Dtype::Int64)
                .and_then(|b| b.to_vec::<i64>())
                .map_err(|e| gguf_err(path, format!("metadata `attention.head_count_kv`: {e}")))?,
        ),
        _ => None,
    };
    let kv_heads = match &kv_per_layer {
        Some(per) => {
            let mut nonzero = per.iter().copied().filter(|&n| n != 0);
            let first = nonzero.next();
            match first {
                Some(n) if n > 0 && n <= i64::from(heads) && nonzero.all(|m| m == n) => n as i32,
                _ => {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is {per:?}: {arch_name} needs one positive head \
                             count (at most {heads}) on its attention layers, 0 on the others",
                            key("attention.head_count_kv")
                        ),
                    ))
                }
            }
        }
        None => match (&openelm_heads, &deci_heads) {
            (Some((_, kv)), _) => kv[0],
            (_, Some((_, kv))) => kv.iter().copied().find(|&n| n > 0).unwrap_or(heads),
            _ => match metadata.get(&key("attention.head_count_kv")) {
                Some(GgufValue::Array(a)) if matches!(arch.arch, "step35" | "mimo2") => {
                    first_count(a, path, &key("attention.head_count_kv"))?
                }
                _ => meta_count(&metadata, path, &key("attention.head_count_kv"))?.unwrap_or(heads),
            },
        },
    };
    let hidden = count("embedding_length")?;
    let vocab = match meta_count(&metadata, path, &key("vocab_size"))? {
        Some(v) => v,
        None => match metadata.get("tokenizer.ggml.tokens") {
            Some(GgufValue::Strings(t)) => i32::try_from(t.len()).map_err(|_| {
                gguf_err(
                    path,
                    "metadata `tokenizer.ggml.tokens` has too many entries",
                )
            })?,
            _ => {
                return Err(gguf_err(
                    path,
                    format!(
                        "no vocabulary size (metadata `{}` or `tokenizer.ggml.tokens`)",
                        key("vocab_size")
                    ),
                ))
            }
        },
    };
    let blocks = count("block_count")?;
    // Multi-token-prediction layers (GLM-4.5, DeepSeek V3) come after the main ones and are
    // counted in `block_count`; mlx-lm's sanitize drops them, so they are not read.
    // 0 is what converters write for a checkpoint without MTP layers (EXAONE MoE's).
    let nextn = if meta_f64(&metadata, &key("nextn_predict_layers")) == Some(0.0) {
        0
    } else {
        meta_count(&metadata, path, &key("nextn_predict_layers"))?.unwrap_or(0)
    };
    if nextn >= blocks {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {nextn} leaves no layer of `{}` = {blocks}",
                key("nextn_predict_layers"),
                key("block_count")
            ),
        ));
    }
    let blocks = blocks - nextn;
    let is_mtp = |name: &str| -> bool {
        name.strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, _)| l.parse::<i32>().ok())
            .is_some_and(|l| l >= blocks)
            && nextn > 0
    };
    // Gemma 4 writes the width per layer when its shared-KV layers' MLPs are double wide
    // (`gemma4_config` checks the list); the first is the base width.
    let ffn_per_layer = match metadata.get(&key("feed_forward_length")) {
        Some(GgufValue::Array(a))
            if matches!(
                arch.arch,
                "gemma4" | "gemma3n" | "nemotron_h" | "nemotron_h_moe" | "openelm" | "deci"
            ) && a.ndim() == 1
                && a.size() > 1 =>
        {
            Some(
                a.astype(Dtype::Int64)
                    .and_then(|b| b.to_vec::<i64>())
                    .map_err(|e| gguf_err(path, format!("metadata `feed_forward_length`: {e}")))?,
            )
        }
        _ => None,
    };
    let ffn = match &ffn_per_layer {
        // Nemotron-H: 0 on its Mamba-2 and attention layers (`nemotron_h_config` reads the list).
        Some(_) if matches!(arch.arch, "nemotron_h" | "nemotron_h_moe") => 0,
        Some(per) => i32::try_from(per[0])
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is {per:?}", key("feed_forward_length")),
                )
            })?,
        None if attention_free => 0,
        None => count("feed_forward_length")?,
    };
    let mut tensors = BTreeMap::new();
    let mut unknown = Vec::new();
    // Rope tensors that become hyper-parameters (long-rope factors).
    let mut rope_tensors: BTreeMap<String, Array> = BTreeMap::new();
    let mut ggml = BTreeMap::new();
    for (name, ty, rows, cols, a) in kept {
        let Some(m) = map_name(arch, &name) else {
            unknown.push(name);
            continue;
        };
        // Rows carry their blocks: llama.cpp's Q/K row permutation is undone on the bytes.
        // Deci's Q / K rows are permuted with the layer's own head counts.
        let deci_layer = |list: &[i32]| {
            let l = name.split('.').nth(1).and_then(|l| l.parse::<usize>().ok());
            l.and_then(|l| list.get(l.min(list.len().saturating_sub(1))).copied())
        };
        let a = if arch.permute_qk && is_proj(&m, "q_proj") {
            unpermute(&a, heads, &name, &key("attention.head_count"))?
        } else if arch.permute_qk && is_proj(&m, "k_proj") {
            unpermute(&a, kv_heads, &name, &key("attention.head_count_kv"))?
        } else if let (Some((q, kv)), true) = (&deci_heads, m.contains(".self_attn.")) {
            if m.contains(".q_proj.") {
                let n = deci_layer(q).unwrap_or(heads);
                unpermute(&a, n, &name, &key("attention.head_count"))?
            } else if m.contains(".k_proj.") {
                let n = deci_layer(kv).unwrap_or(kv_heads);
                unpermute(&a, n, &name, &key("attention.head_count_kv"))?
            } else {
                a
            }
        } else {
            a
        };
        if ggml.contains_key(&m) {
            return Err(gguf_err(
                path,
                format!("GGUF tensor {name} maps to {m}, which another tensor already gave"),
            ));
        }
        let g = crate::layers::GgmlWeight::new(a, ty, rows, cols)
            .map_err(|e| gguf_err(path, format!("tensor {name}: {e}")))?;
        ggml.insert(m, g);
    }
    for (name, a) in raw {
        if is_mtp(&name) {
            continue;
        }
        if ROPE_TENSORS.contains(&name.as_str()) && arch.rope_tensors {
            rope_tensors.insert(name, a);
            continue;
        }
        if matches!(
            arch.arch,
            "qwen3next"
                | "qwen35"
                | "qwen35moe"
                | "granitehybrid"
                | "mamba"
                | "mamba2"
                | "nemotron_h"
                | "nemotron_h_moe"
                | "falcon-h1"
                | "jamba"
                | "plamo2"
                | "kimi-linear"
        ) {
            let layer_of = |suffix: &str| {
                name.strip_prefix("blk.")
                    .and_then(|r| r.strip_suffix(suffix))
                    .filter(|l| l.parse::<u32>().is_ok())
                    .map(str::to_string)
            };
            // `blk.N.ssm_a` (no suffix): -exp(A_log), read back as mlx-lm's A_log; Mamba-2's
            // `ssm_a` and `ssm_d` are (heads, 1), mlx-lm's A_log and D (heads,).
            // Mamba (1) and Jamba keep A as (inner, state).
            let module = |layer: &str| match arch.arch {
                "granitehybrid" | "falcon-h1" | "jamba" => format!("model.layers.{layer}.mamba"),
                "kimi-linear" => format!("model.layers.{layer}.self_attn"),
                "mamba" | "mamba2" | "nemotron_h" | "nemotron_h_moe" | "plamo2" => {
                    format!("{}.{layer}.mixer", arch.layers)
                }
                _ => format!("model.layers.{layer}.linear_attn"),
            };
            if let Some(layer) = layer_of(".ssm_a") {
                let a_log = ops::log(&ops::negative(&a, None)?, None)?;
                // Kimi Linear keeps (1, 1, heads, 1).
                let a_log = if !matches!(arch.arch, "mamba" | "jamba" | "plamo2" | "kimi-linear") {
                    a_log.reshape(&[-1])?
                } else {
                    a_log
                };
                tensors.insert(format!("{}.A_log", module(&layer)), a_log);
                continue;
            }
            if let Some(layer) = layer_of(".ssm_d").filter(|_| {
                matches!(
                    arch.arch,
                    "granitehybrid"
                        | "mamba"
                        | "mamba2"
                        | "nemotron_h"
                        | "nemotron_h_moe"
                        | "falcon-h1"
                        | "jamba"
                        | "plamo2"
                )
            }) {
                tensors.insert(format!("{}.D", module(&layer)), a.reshape(&[-1])?);
                continue;
            }
        }
        match map_name(arch, &name) {
            Some(m) => {
                let a = if arch.permute_qk && is_proj(&m, "q_proj") {
                    unpermute(&a, heads, &name, &key("attention.head_count"))?
                } else if arch.permute_qk && is_proj(&m, "k_proj") {
                    unpermute(&a, kv_heads, &name, &key("attention.head_count_kv"))?
                } else if m.ends_with(".shared_expert_gate.weight") && a.ndim() == 1 {
                    // One gate row, which a converter may store as a vector.
                    let h = a.shape()[0];
                    a.reshape(&[1, h])?
                } else if (m.ends_with(".conv.conv.weight")
                    || m.ends_with(".mamba.conv1d.weight")
                    || m.ends_with(".mixer.conv1d.weight"))
                    && a.ndim() == 2
                {
                    // Stored squeezed, (channels, kernel): mlx-lm's Conv1d weight is
                    // (channels, kernel, 1).
                    a.expand_dims(&[2])?
                } else if arch.arch == "kimi-linear" && m.ends_with("_conv.conv.weight") {
                    // KDA's short convolutions, written (1, channels, 1, kernel) (or without
                    // the trailing axes): mlx-lm's Conv1d weight is (channels, kernel, 1).
                    let sh = a.shape();
                    match sh.as_slice() {
                        [1, c, 1, k] | [c, 1, k] | [c, k] => a.reshape(&[*c, *k, 1])?,
                        _ => {
                            return Err(gguf_err(
                                path,
                                format!("tensor {name}: shape {sh:?} is not a short convolution"),
                            ))
                        }
                    }
                } else if (m.ends_with(".mamba.norm.weight") || m.ends_with(".mixer.norm.weight"))
                    && a.ndim() == 2
                {
                    // Mamba-2's gated norm, stored per group.
                    a.reshape(&[-1])?
                } else if arch.norm_plus_one && name.contains("_norm.") && name.ends_with(".weight")
                {
                    // Stored as `1 + w` (a weak Python int in mlx-lm terms: the tensor's dtype).
                    (&a - 1)?
                } else {
                    a
                };
                if tensors.insert(m.clone(), a).is_some() {
                    return Err(gguf_err(
                        path,
                        format!(
                            "GGUF tensor {name} maps to {m}, which another tensor already gave"
                        ),
                    ));
                }
            }
            None => unknown.push(name),
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ModelError::Weights(crate::weights::cap_listing(
            unknown
                .into_iter()
                .map(|n| format!("unexpected GGUF tensor: {n}"))
                .collect(),
        )));
    }
    split_gate_up(&mut tensors)?;
    let tied = !tensors.contains_key("lm_head.weight");
    let head_dim = match meta_count(&metadata, path, &key("attention.key_length"))? {
        Some(d) => Some(i64::from(d)),
        None => meta_count(&metadata, path, &key("rope.dimension_count"))?.map(i64::from),
    };
    // The norm epsilon: RMS norms' key, or LayerNorm's (starcoder2); EXAONE's converter has
    // written either. mlx-lm's field name per type.
    const RMS_EPS: &str = "attention.layer_norm_rms_epsilon";
    const LN_EPS: &str = "attention.layer_norm_epsilon";
    let (eps, eps_field) = match arch.arch {
        "starcoder2" => (float(LN_EPS, true)?, "norm_epsilon"),
        "stablelm" | "olmo" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "gpt2" => (float(LN_EPS, true)?, "layer_norm_epsilon"),
        "gptneox" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "starcoder" => (float(LN_EPS, true)?, "layer_norm_epsilon"),
        "phi2" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "nemotron" => (float(LN_EPS, true)?, "norm_eps"),
        "command-r" | "cohere2" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "lfm2" | "lfm2moe" => (float(RMS_EPS, true)?, "norm_eps"),
        "rwkv7" => (float(LN_EPS, true)?, "norm_eps"),
        "dbrx" => (float(LN_EPS, true)?, "layer_norm_eps"),
        "mimo2" => (float(RMS_EPS, true)?, "layernorm_epsilon"),
        // llama.cpp reads the RMS key, else the LayerNorm one (what the converter writes).
        "nemotron_h" | "nemotron_h_moe" => (
            match float(RMS_EPS, true)? {
                Some(e) => Some(e),
                None => float(LN_EPS, true)?,
            },
            "layer_norm_epsilon",
        ),
        // llama.cpp reads Qwen's RMS key; its converter writes Qwen's `layer_norm_epsilon`
        // under the LayerNorm one.
        "exaone" | "qwen" => (
            match float(RMS_EPS, true)? {
                Some(e) => Some(e),
                None => float(LN_EPS, true)?,
            },
            "layer_norm_epsilon",
        ),
        _ => (float(RMS_EPS, true)?, "rms_norm_eps"),
    };
    let eps = eps.ok_or_else(|| {
        let k = if matches!(
            eps_field,
            "norm_epsilon" | "layer_norm_eps" | "layer_norm_epsilon"
        ) && arch.arch != "qwen"
            || matches!(arch.arch, "rwkv7" | "nemotron" | "dbrx")
        {
            LN_EPS
        } else {
            RMS_EPS
        };
        gguf_err(path, format!("metadata `{}` is missing", key(k)))
    })?;
    let mut config = json!({
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": blocks,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "rope_theta": float("rope.freq_base", false)?.unwrap_or(10000.0),
        "tie_word_embeddings": tied,
    });
    config[eps_field] = Value::from(eps);
    if let Some(ctx) = meta_count(&metadata, path, &key("context_length"))? {
        config["max_position_embeddings"] = Value::from(ctx);
    }
    match head_dim {
        Some(d) if d != i64::from(hidden / heads) || arch.arch != "llama" => {
            config["head_dim"] = Value::from(d);
        }
        _ => {}
    }
    match arch.arch {
        "gemma2" | "gemma3" => {
            if let Some(d) = head_dim {
                // llama.cpp's Gemma 2 / 3 scale queries by head_dim ** -0.5.
                config["query_pre_attn_scalar"] = Value::from(d);
            }
            if let Some(w) = float("attention.sliding_window", false)? {
                config["sliding_window"] = Value::from(w as i64);
            }
            for (k, name) in [
                ("attn_logit_softcapping", "attn_logit_softcapping"),
                ("final_logit_softcapping", "final_logit_softcapping"),
            ] {
                if let Some(v) = float(k, false)? {
                    config[name] = Value::from(v);
                }
            }
        }
        "phi3" | "phimoe" => {
            if let Some(d) = float("rope.dimension_count", false)? {
                let hd = f64::from(hidden / heads);
                if arch.arch == "phi3" {
                    config["partial_rotary_factor"] = Value::from(d / hd);
                } else if d != hd {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is {d}: a partial rope, which mlx-lm's phimoe lacks",
                            key("rope.dimension_count")
                        ),
                    ));
                }
            }
            if arch.arch == "phimoe" {
                config["num_local_experts"] = Value::from(count("expert_count")?);
                config["num_experts_per_tok"] = Value::from(count("expert_used_count")?);
            }
            long_rope(&mut config, &mut rope_tensors, path, &metadata, arch.arch)?;
        }
        "qwen3moe" | "qwen3vlmoe" => {
            // llama.cpp's qwen3moe renormalizes the top-k weights and has no dense layers.
            config["num_experts"] = Value::from(count("expert_count")?);
            config["num_experts_per_tok"] = Value::from(count("expert_used_count")?);
            config["moe_intermediate_size"] = Value::from(count("expert_feed_forward_length")?);
            config["decoder_sparse_step"] = Value::from(1);
            config["mlp_only_layers"] = json!([]);
            config["norm_topk_prob"] = Value::from(true);
            if config.get("head_dim").is_none() {
                config["head_dim"] = Value::from(hidden / heads);
            }
        }
        "qwen2moe" => {
            // llama.cpp's qwen2moe, like mlx-lm's, does not renormalize the top-k weights.
            config["num_experts"] = Value::from(count("expert_count")?);
            config["num_experts_per_tok"] = Value::from(count("expert_used_count")?);
            config["moe_intermediate_size"] = Value::from(count("expert_feed_forward_length")?);
            config["shared_expert_intermediate_size"] =
                Value::from(count("expert_shared_feed_forward_length")?);
        }
        "granite" | "granitemoe" => {
            if arch.arch == "granitemoe" {
                config["num_local_experts"] = Value::from(count("expert_count")?);
                config["num_experts_per_tok"] = Value::from(count("expert_used_count")?);
            }
            let has_bias = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}.bias"));
            config["attention_bias"] = Value::from(has_bias("self_attn.q_proj"));
            config["mlp_bias"] = Value::from(has_bias("mlp.down_proj"));
            for (k, name) in [
                ("attention.scale", "attention_multiplier"),
                ("embedding_scale", "embedding_multiplier"),
                ("residual_scale", "residual_multiplier"),
                ("logit_scale", "logits_scaling"),
            ] {
                let v = float(k, false)?
                    .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))?;
                config[name] = Value::from(v);
            }
            if config.get("max_position_embeddings").is_none() {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("context_length")),
                ));
            }
        }
        "glm4" => {
            // `rope.dimension_count` is the rotated part of a head here, not its size.
            let hd = meta_count(&metadata, path, &key("attention.key_length"))?
                .map_or(i64::from(hidden / heads), i64::from);
            config["head_dim"] = Value::from(hd);
            config["attention_bias"] =
                Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
            // llama.cpp rotates `rope.dimension_count` dims of each head (HF's default: half).
            let rot = float("rope.dimension_count", false)?.unwrap_or(hd as f64 / 2.0);
            config["partial_rotary_factor"] = Value::from(rot / hd as f64);
        }
        "mistral3" => {
            // rope_parameters from YaRN's keys; `yarn_log_multiplier` is mscale_all_dim here
            // (Ministral3Model writes it as is) and `temperature_scale` Llama 4's beta.
            let need = |k: &str| -> Result<f64> {
                float(k, false)?
                    .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
            };
            match meta_str(&metadata, &key("rope.scaling.type")) {
                Some("yarn") => {}
                other => {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is {other:?}; Ministral 3 needs yarn",
                            key("rope.scaling.type")
                        ),
                    ))
                }
            }
            let m = need("rope.scaling.yarn_log_multiplier")?;
            config["rope_parameters"] = json!({
                "rope_type": "yarn",
                "type": "yarn",
                "rope_theta": config["rope_theta"].clone(),
                "factor": need("rope.scaling.factor")?,
                "original_max_position_embeddings":
                    count("rope.scaling.original_context_length")?,
                "beta_fast": float("rope.scaling.yarn_beta_fast", false)?.unwrap_or(32.0),
                "beta_slow": float("rope.scaling.yarn_beta_slow", false)?.unwrap_or(1.0),
                "mscale": m,
                "mscale_all_dim": m,
                "llama_4_scaling_beta": float("attention.temperature_scale", true)?
                    .ok_or_else(|| gguf_err(
                        path,
                        format!("metadata `{}` is missing", key("attention.temperature_scale")),
                    ))?,
            });
        }
        "minicpm3" => {
            // llama.cpp fixes MiniCPM3-4B's scales (none are in the file).
            let rope = count("rope.dimension_count")?;
            let qk = count("attention.key_length")?;
            if qk <= rope {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata: `{}` = {qk} is not larger than `{}` = {rope}",
                        key("attention.key_length"),
                        key("rope.dimension_count")
                    ),
                ));
            }
            if let Some(c) = config.as_object_mut() {
                c.remove("head_dim");
            }
            config["qk_rope_head_dim"] = Value::from(rope);
            config["qk_nope_head_dim"] = Value::from(qk - rope);
            config["q_lora_rank"] = Value::from(count("attention.q_lora_rank")?);
            config["kv_lora_rank"] = Value::from(count("attention.kv_lora_rank")?);
            config["scale_emb"] = Value::from(12.0);
            config["scale_depth"] = Value::from(1.4);
            config["dim_model_base"] = Value::from(256);
            config["attention_bias"] =
                Value::from(tensors.contains_key("model.layers.0.self_attn.q_a_proj.bias"));
            if config.get("max_position_embeddings").is_none() {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("context_length")),
                ));
            }
            long_rope(&mut config, &mut rope_tensors, path, &metadata, arch.arch)?;
            if config.get("rope_scaling").is_none() {
                // minicpm3.py needs a rope_scaling: factors of 1 over the whole context (no
                // scale), llama.cpp's plain rope.
                config["rope_scaling"] = json!({
                    "type": "longrope",
                    "original_max_position_embeddings": config["max_position_embeddings"].clone(),
                });
            }
        }
        "glm4moe" | "dots1" => grouped_moe_config(
            &mut config,
            &tensors,
            path,
            &metadata,
            arch.arch,
            hidden / heads,
        )?,
        "qwen3next" | "qwen35" | "qwen35moe" => qwen3next_config(
            &mut config,
            &mut tensors,
            path,
            &metadata,
            blocks,
            arch.arch,
        )?,
        "olmo2" => {
            // OLMo 3 is written as `olmo2` with a sliding window (and its per-layer pattern).
            if let Some(w) = meta_count(&metadata, path, &key("attention.sliding_window"))? {
                config["model_type"] = Value::from("olmo3");
                config["sliding_window"] = Value::from(w);
                if let Some(GgufValue::Array(a)) =
                    metadata.get(&key("attention.sliding_window_pattern"))
                {
                    let flags = a
                        .astype(Dtype::Bool)
                        .and_then(|b| b.to_vec::<bool>())
                        .map_err(|e| {
                            gguf_err(
                                path,
                                format!("metadata `attention.sliding_window_pattern`: {e}"),
                            )
                        })?;
                    if flags.len() != blocks as usize
                        || !flags.contains(&false)
                        || !flags.contains(&true)
                    {
                        return Err(gguf_err(
                            path,
                            format!(
                                "metadata `{}` has {} entries for {blocks} layers; mlx-lm's olmo3 \
                                 needs both sliding and full-attention layers",
                                key("attention.sliding_window_pattern"),
                                flags.len()
                            ),
                        ));
                    }
                    let types: Vec<&str> = flags
                        .iter()
                        .map(|&s| {
                            if s {
                                "sliding_attention"
                            } else {
                                "full_attention"
                            }
                        })
                        .collect();
                    config["layer_types"] = json!(types);
                }
                if meta_str(&metadata, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}`: rope scaling is not mapped for OLMo 3",
                            key("rope.scaling.type")
                        ),
                    ));
                }
            }
        }
        "exaone4" => {
            // mlx-lm's `sliding_window_pattern` is a period of "L" (sliding) / "G" (global)
            // letters: the shortest that repeats the file's per-layer pattern (llama.cpp's
            // default, "LLLG", when the file has a window and no pattern).
            config["rope_scaling"] = Value::Null;
            if config.get("head_dim").is_none() {
                config["head_dim"] = Value::from(hidden / heads);
            }
            match meta_count(&metadata, path, &key("attention.sliding_window"))? {
                None => {
                    config["sliding_window"] = Value::Null;
                    config["sliding_window_pattern"] = Value::Null;
                }
                Some(w) => {
                    config["sliding_window"] = Value::from(w);
                    let flags = match metadata.get(&key("attention.sliding_window_pattern")) {
                        Some(GgufValue::Array(a)) => a
                            .astype(Dtype::Bool)
                            .and_then(|b| b.to_vec::<bool>())
                            .map_err(|e| {
                                gguf_err(path, format!("metadata `sliding_window_pattern`: {e}"))
                            })?,
                        _ => (0..blocks).map(|i| (i + 1) % 4 != 0).collect(),
                    };
                    let n = flags.len();
                    let period = (1..=n)
                        .find(|&p| (0..n).all(|i| flags[i] == flags[i % p]))
                        .unwrap_or(n);
                    let pattern: String = flags[..period]
                        .iter()
                        .map(|&l| if l { 'L' } else { 'G' })
                        .collect();
                    if n != blocks as usize || !pattern.contains('L') || !pattern.contains('G') {
                        return Err(gguf_err(
                            path,
                            format!(
                                "metadata `{}` ({n} entries for {blocks} layers) needs both \
                                 sliding and global layers for mlx-lm's exaone4",
                                key("attention.sliding_window_pattern")
                            ),
                        ));
                    }
                    config["sliding_window_pattern"] = Value::from(pattern);
                }
            }
            if config.get("max_position_embeddings").is_none() {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("context_length")),
                ));
            }
        }
        "cohere2" => {
            let hd = config["head_dim"]
                .as_i64()
                .unwrap_or(i64::from(hidden / heads));
            config["head_dim"] = Value::from(hd);
            if let Some(d) = meta_count(&metadata, path, &key("rope.dimension_count"))? {
                if i64::from(d) != hd {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is {d}: a partial rope, which mlx-lm's cohere2 lacks",
                            key("rope.dimension_count")
                        ),
                    ));
                }
            }
            if meta_f64(&metadata, &key("rope.freq_base_swa"))
                .is_some_and(|b| Some(b) != config["rope_theta"].as_f64())
            {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` differs from the global base; mlx-lm's cohere2 has one",
                        key("rope.freq_base_swa")
                    ),
                ));
            }
            config["logit_scale"] = Value::from(float("logit_scale", false)?.ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("logit_scale")),
                )
            })?);
            config["sliding_window"] = Value::from(count("attention.sliding_window")?);
            // llama.cpp's default pattern (every 4th layer global); a stored one must agree.
            let pattern = 4;
            if let Some(GgufValue::Array(a)) =
                metadata.get(&key("attention.sliding_window_pattern"))
            {
                let flags = a
                    .astype(Dtype::Bool)
                    .and_then(|b| b.to_vec::<bool>())
                    .map_err(|e| {
                        gguf_err(path, format!("metadata `sliding_window_pattern`: {e}"))
                    })?;
                if !(0..flags.len()).all(|i| flags[i] == ((i + 1) % pattern != 0)) {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is not every 4th layer global, the pattern this map \
                             reads",
                            key("attention.sliding_window_pattern")
                        ),
                    ));
                }
            }
            config["sliding_window_pattern"] = Value::from(pattern as i64);
            let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
            config["layer_norm_bias"] = Value::from(has("input_layernorm.bias"));
            config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
        }
        "seed_oss" | "ernie4_5" | "command-r" => {
            let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
            match arch.arch {
                "seed_oss" => {
                    config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
                    config["attention_out_bias"] = Value::from(has("self_attn.o_proj.bias"));
                    config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
                }
                "ernie4_5" => {
                    config["use_bias"] = Value::from(has("self_attn.q_proj.bias"));
                }
                _ => {
                    config["logit_scale"] =
                        Value::from(float("logit_scale", false)?.ok_or_else(|| {
                            gguf_err(
                                path,
                                format!("metadata `{}` is missing", key("logit_scale")),
                            )
                        })?);
                    config["use_qk_norm"] = Value::from(has("self_attn.q_norm.weight"));
                    config["layer_norm_bias"] = Value::from(has("input_layernorm.bias"));
                    config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
                }
            }
            // seed_oss and ernie4_5 need a head size; HF's default when the file has none.
            if config.get("head_dim").is_none() {
                config["head_dim"] = Value::from(hidden / heads);
            }
            if config.get("max_position_embeddings").is_none() {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("context_length")),
                ));
            }
        }
        "olmoe" => {
            // llama.cpp's olmoe does not renormalize the top-k weights (OLMoE's own config).
            config["num_experts"] = Value::from(count("expert_count")?);
            config["num_experts_per_tok"] = Value::from(count("expert_used_count")?);
            config["norm_topk_prob"] = Value::from(false);
        }
        "exaone" => {
            // mlx-lm's EXAONE names and full-width rope.
            let hd = i64::from(hidden / heads);
            if let Some(d) = meta_count(&metadata, path, &key("rope.dimension_count"))? {
                if i64::from(d) != config["head_dim"].as_i64().unwrap_or(hd) {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is {d}: a partial rope, which mlx-lm's exaone lacks",
                            key("rope.dimension_count")
                        ),
                    ));
                }
            }
            config["num_layers"] = Value::from(blocks);
            config["attention_bias"] =
                Value::from(tensors.contains_key("transformer.h.0.attn.attention.q_proj.bias"));
            config["mlp_bias"] =
                Value::from(tensors.contains_key("transformer.h.0.mlp.c_proj.bias"));
        }
        "deepseek2" | "mistral4" => {
            deepseek2_config(&mut config, &mut tensors, path, &metadata, heads, arch.arch)?
        }
        "gpt-oss" => {
            // GptOssModel: the experts' width as `expert_feed_forward_length`, the window;
            // llama.cpp fixes the pattern (even layers sliding), mlx-lm's default too.
            config["num_local_experts"] = Value::from(count("expert_count")?);
            config["num_experts_per_tok"] = Value::from(count("expert_used_count")?);
            config["intermediate_size"] = Value::from(count("expert_feed_forward_length")?);
            config["sliding_window"] = Value::from(count("attention.sliding_window")?);
            if config.get("head_dim").is_none() {
                config["head_dim"] = Value::from(hidden / heads);
            }
            if blocks % 2 != 0 {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` is {blocks}: gpt-oss alternates sliding and full layers",
                        key("block_count")
                    ),
                ));
            }
            config["rope_scaling"] = match meta_str(&metadata, &key("rope.scaling.type")) {
                Some("yarn") => {
                    let need = |k: &str| -> Result<f64> {
                        float(k, false)?.ok_or_else(|| {
                            gguf_err(path, format!("metadata `{}` is missing", key(k)))
                        })
                    };
                    json!({
                        "rope_type": "yarn",
                        "factor": need("rope.scaling.factor")?,
                        "original_max_position_embeddings":
                            count("rope.scaling.original_context_length")?,
                        "beta_fast": float("rope.scaling.yarn_beta_fast", false)?.unwrap_or(32.0),
                        "beta_slow": float("rope.scaling.yarn_beta_slow", false)?.unwrap_or(1.0),
                    })
                }
                None | Some("none") => Value::Null,
                Some(t) => {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is `{t}`; gpt-oss maps only yarn",
                            key("rope.scaling.type")
                        ),
                    ))
                }
            };
        }
        "lfm2" | "lfm2moe" => {
            let Some(per) = &kv_per_layer else {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` is not a per-layer list; LFM2 needs one",
                        key("attention.head_count_kv")
                    ),
                ));
            };
            if per.len() != blocks as usize {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` has {} entries for {blocks} layers",
                        key("attention.head_count_kv"),
                        per.len()
                    ),
                ));
            }
            let types: Vec<&str> = per
                .iter()
                .map(|&n| if n == 0 { "conv" } else { "full_attention" })
                .collect();
            config["layer_types"] = json!(types);
            config["conv_L_cache"] = Value::from(count("shortconv.l_cache")?);
            config["conv_bias"] =
                Value::from(tensors.keys().any(|k| k.ends_with(".conv.in_proj.bias")));
            if arch.arch == "lfm2" {
                // The width is stored already adjusted (LFM2Model._add_feed_forward_length).
                config["block_ff_dim"] = Value::from(ffn);
                config["block_dim"] = Value::from(hidden);
                config["block_auto_adjust_ff_dim"] = Value::from(false);
                config["block_multiple_of"] = Value::from(1);
                config["block_ffn_dim_multiplier"] = Value::Null;
            } else {
                // llama.cpp's LFM2-MoE always renormalizes the top-k weights and scales them
                // by `expert_weights_scale` (1 when absent, as the converter writes none).
                config["num_experts"] = Value::from(count("expert_count")?);
                config["num_experts_per_tok"] = Value::from(count("expert_used_count")?);
                config["moe_intermediate_size"] = Value::from(count("expert_feed_forward_length")?);
                let dense =
                    meta_layer_count(&metadata, path, &key("leading_dense_block_count"), blocks)?;
                config["num_dense_layers"] = Value::from(dense.unwrap_or(0));
                config["norm_topk_prob"] = Value::from(true);
                config["use_expert_bias"] = Value::from(
                    tensors
                        .keys()
                        .any(|k| k.ends_with(".feed_forward.expert_bias")),
                );
                config["routed_scaling_factor"] = Value::from(
                    float("expert_weights_scale", true)?
                        .filter(|&v| v != 0.0)
                        .unwrap_or(1.0),
                );
                if meta_count(&metadata, path, &key("expert_gating_func"))?.is_some_and(|g| g != 2)
                {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` is not sigmoid (2), the router mlx-lm's lfm2_moe has",
                            key("expert_gating_func")
                        ),
                    ));
                }
            }
            if config.get("max_position_embeddings").is_none() {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("context_length")),
                ));
            }
        }
        "ernie4_5-moe" => ernie45_moe_config(&mut config, &tensors, path, &metadata, blocks)?,
        "rwkv7" => rwkv7_config(&mut config, &mut tensors, path, &metadata, blocks, heads)?,
        "internlm2" => internlm2_config(&mut config, &mut tensors, path, blocks, heads, kv_heads)?,
        "apertus" => apertus_config(&mut config, &mut tensors, path, &metadata, blocks)?,
        "nemotron" => nemotron_config(&mut config, &tensors, path, &metadata, hidden, heads)?,
        "hunyuan-dense" => {
            hunyuan_dense_config(&mut config, &tensors, path, &metadata, hidden, heads)?
        }
        "phi2" => phi2_config(
            &mut config,
            &mut tensors,
            path,
            &metadata,
            blocks,
            hidden,
            heads,
        )?,
        "gpt2" => gpt2_config(&mut config, &tensors, path, blocks, hidden, heads)?,
        "qwen" => qwen_config(&mut config, &tensors, path, &key, hidden, heads, kv_heads)?,
        "plamo3" => plamo3_config(&mut config, &mut tensors, path, &metadata, &key)?,
        "olmo" => {
            if let Some(k) = ggml
                .keys()
                .find(|k| k.contains("_proj.") || k.contains(".gguf_"))
            {
                return Err(gguf_err(
                    path,
                    format!("{k}: OLMo's fused projections are read dequantized only"),
                ));
            }
            olmo_config(
                &mut config,
                &mut tensors,
                path,
                &metadata,
                &key,
                (blocks, heads, kv_heads, ffn),
            )?
        }
        "spark2_5" => spark2_5_config(&mut config, &tensors, path, &metadata, &key, blocks)?,
        "mellum" => mellum_config(&mut config, path, &metadata, &key, blocks)?,
        "deci" => {
            let (q, kv) = deci_heads.clone().unwrap_or_default();
            let ffn = ffn_per_layer
                .clone()
                .unwrap_or_else(|| vec![i64::from(ffn)]);
            deci_config(
                &mut config,
                &mut tensors,
                &mut ggml,
                path,
                &key,
                (blocks, hidden, heads),
                (q, kv, ffn),
            )?
        }
        "bitnet" => {
            if let Some(k) = ggml
                .keys()
                .find(|k| BITNET_LINEARS.iter().any(|(_, p)| k.contains(p)))
            {
                return Err(gguf_err(
                    path,
                    format!("{k}: BitNet's ternary weights are read dequantized only"),
                ));
            }
            bitnet_config(&mut config, &mut tensors, path, &metadata, &key, blocks)?
        }
        "openelm" => {
            if let Some(k) = ggml.keys().find(|k| k.contains(".ffn.gguf_")) {
                return Err(gguf_err(
                    path,
                    format!("{k}: OpenELM's split gate / up are read dequantized only"),
                ));
            }
            let (q, kv) = openelm_heads.clone().unwrap_or_default();
            let ffn = ffn_per_layer
                .clone()
                .unwrap_or_else(|| vec![i64::from(ffn)]);
            openelm_config(
                &mut config,
                &mut tensors,
                path,
                &key,
                blocks,
                hidden,
                (q, kv, ffn),
            )?
        }
        "muse-glimmer" => {
            muse_glimmer_config(&mut config, &mut tensors, path, &metadata, &key, blocks)?
        }
        "exaone-moe" => {
            exaone_moe_config(&mut config, &mut tensors, path, &metadata, &key, blocks)?
        }
        "talkie" => {
            if let Some(k) = ggml.keys().find(|k| k.contains(".attn.attn_")) {
                return Err(gguf_err(
                    path,
                    format!("{k}: Talkie's sign-flipped attention is read dequantized only"),
                ));
            }
            talkie_config(&mut config, &mut tensors, path, &metadata, &key)?
        }
        "plamo" => {
            if let Some(k) = ggml.keys().find(|k| k.contains(".self_attn.")) {
                return Err(gguf_err(
                    path,
                    format!("{k}: PLaMo's shuffled attention is read dequantized only"),
                ));
            }
            plamo_config(
                &mut config,
                &mut tensors,
                path,
                &key,
                hidden,
                heads,
                kv_heads,
            )?
        }
        "minicpm" => minicpm_config(&mut config, path, &metadata, blocks, hidden)?,
        "deepseek" => deepseek_config(&mut config, path, &metadata, blocks)?,
        "gptneox" => gptneox_config(
            &mut config,
            &mut tensors,
            path,
            &metadata,
            blocks,
            hidden,
            heads,
        )?,
        "starcoder" => starcoder_config(
            &mut config,
            &tensors,
            path,
            blocks,
            hidden,
            heads,
            kv_heads,
            ffn,
        )?,
        "stablelm" => stablelm_config(&mut config, &mut tensors, path, &metadata, heads, kv_heads)?,
        "gemma3n" => gemma3n_config(
            &mut config,
            &mut tensors,
            path,
            &metadata,
            blocks,
            ffn_per_layer.as_deref(),
        )?,
        "gemma4" => gemma4_config(
            &mut config,
            &tensors,
            &mut rope_tensors,
            path,
            &metadata,
            blocks,
            ffn_per_layer.as_deref(),
        )?,
        "granitehybrid" => {
            let per = kv_per_layer.as_deref().unwrap_or(&[]);
            granitehybrid_config(&mut config, &mut tensors, path, &metadata, blocks, per)?
        }
        "llama4" => llama4_config(&mut config, &tensors, path, &metadata)?,
        "nanbeige" => {
            // NanbeigeModel: the loop count and whether the loops between skip the final norm.
            if let Some(n) = meta_count(&metadata, path, &key("num_loops"))? {
                config["num_loops"] = Value::from(n);
            }
            match metadata.get(&key("skip_loop_final_norm")) {
                None => {}
                Some(GgufValue::Array(a)) if a.size() == 1 => {
                    let b = a
                        .astype(Dtype::Bool)
                        .and_then(|b| b.item::<bool>())
                        .map_err(|e| {
                            gguf_err(path, format!("metadata `skip_loop_final_norm`: {e}"))
                        })?;
                    config["skip_loop_final_norm"] = Value::from(b);
                }
                Some(_) => {
                    return Err(gguf_err(
                        path,
                        format!("metadata `{}` is not a flag", key("skip_loop_final_norm")),
                    ))
                }
            }
            let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
            config["attention_bias"] = Value::from(has("self_attn.q_proj.bias"));
            config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
        }
        "mamba" | "mamba2" => mamba_config(&mut config, &tensors, path, &metadata, arch.arch)?,
        "minimax-m2" => minimax_m2_config(&mut config, &tensors, path, &metadata)?,
        "bailingmoe2" | "bailingmoe" => bailing_config(
            &mut config,
            &mut tensors,
            path,
            &metadata,
            blocks,
            arch.arch,
        )?,
        "falcon-h1" => falcon_h1_config(&mut config, &tensors, path, &metadata)?,
        "dbrx" => dbrx_config(&mut config, &mut tensors, path, &metadata)?,
        "hunyuan-moe" => hunyuan_moe_config(&mut config, &tensors, path, &metadata)?,
        "afmoe" => afmoe_config(&mut config, &tensors, path, &metadata, blocks)?,
        "plamo2" => plamo2_config(
            &mut config,
            &mut tensors,
            path,
            &metadata,
            kv_per_layer.as_deref(),
        )?,
        "deepseek32" | "glm-dsa" => {
            deepseek2_config(&mut config, &mut tensors, path, &metadata, heads, arch.arch)?;
            deepseek32_config(&mut config, path, &metadata, arch.arch)?
        }
        "jamba" => jamba_config(
            &mut config,
            &tensors,
            path,
            &metadata,
            kv_per_layer.as_deref(),
        )?,
        "step35" => step35_config(&mut config, &tensors, path, &metadata, &rope_tensors)?,
        "mimo2" => mimo2_config(&mut config, &tensors, path, &metadata, heads)?,
        "laguna" => laguna_config(&mut config, &tensors, path, &metadata)?,
        "kimi-linear" => kimi_linear_config(&mut config, path, &metadata, heads)?,
        "nemotron_h" | "nemotron_h_moe" => nemotron_h_config(
            &mut config,
            &mut tensors,
            path,
            &metadata,
            arch.arch,
            kv_per_layer.as_deref(),
            ffn_per_layer.as_deref(),
        )?,
        _ => {}
    }
    if let Some(f) = rope_tensors.remove("rope_freqs.weight") {
        llama3_rope(&mut config, &f, path, hidden / heads)?;
    }
    if let Some(name) = rope_tensors.keys().next() {
        return Err(ModelError::Weights(vec![format!(
            "unexpected GGUF tensor: {name}"
        )]));
    }
    if let Some((prefix, strip, text_type)) = arch.text_of {
        // mlx-lm's model is the text model of the multimodal checkpoint.
        config = json!({"model_type": arch.model_type, "text_config": config});
        config["text_config"]["model_type"] = Value::from(text_type);
        let rename = |k: String| format!("{prefix}{}", k.strip_prefix(strip).unwrap_or(&k));
        tensors = std::mem::take(&mut tensors)
            .into_iter()
            .map(|(k, v)| (rename(k), v))
            .collect();
        ggml = std::mem::take(&mut ggml)
            .into_iter()
            .map(|(k, v)| (rename(k), v))
            .collect();
    }
    let config = ModelConfig::from_value(config).map_err(|e| match e {
        ModelError::Config(m) => gguf_err(path, format!("hyper-parameters: {m}")),
        other => other,
    })?;
    Ok(GgufModel {
        config,
        tensors,
        metadata,
        blocks: ggml,
    })
}

/// `max_position_embeddings` must have come from `key` (`<arch>.context_length`).
fn require_context(config: &Value, path: &Path, key: &str) -> Result<()> {
    match config.get("max_position_embeddings") {
        Some(_) => Ok(()),
        None => Err(gguf_err(path, format!("metadata `{key}` is missing"))),
    }
}

/// `<arch>.<k>`, a positive count, or an error naming the key when it is absent.
fn need_count(meta: &GgufMetadata, path: &Path, arch: &str, k: &str) -> Result<i32> {
    let key = format!("{arch}.{k}");
    meta_count(meta, path, &key)?
        .ok_or_else(|| gguf_err(path, format!("metadata `{key}` is missing")))
}

/// Gemma 3n / 4 `layer_types` from the per-layer sliding flags `key` (one per layer).
fn gemma_layer_types(meta: &GgufMetadata, path: &Path, key: &str, blocks: i32) -> Result<Value> {
    let flags = match meta.get(key) {
        Some(GgufValue::Array(a)) if a.ndim() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?,
        _ => vec![],
    };
    if flags.len() != blocks as usize {
        return Err(gguf_err(
            path,
            format!("metadata `{key}` must flag each of the {blocks} layers sliding or not"),
        ));
    }
    let kind = |s: bool| {
        if s {
            "sliding_attention"
        } else {
            "full_attention"
        }
    };
    Ok(json!(flags.into_iter().map(kind).collect::<Vec<_>>()))
}

/// A count of layers `key` (0 allowed, unlike [`meta_count`]) of at most `blocks`.
fn meta_layer_count(
    meta: &GgufMetadata,
    path: &Path,
    key: &str,
    blocks: i32,
) -> Result<Option<i32>> {
    match meta_f64(meta, key) {
        None if meta.contains_key(key) => {
            Err(gguf_err(path, format!("metadata `{key}` is not a number")))
        }
        None => Ok(None),
        Some(v) if v.fract() == 0.0 && (0.0..=f64::from(blocks)).contains(&v) => Ok(Some(v as i32)),
        Some(v) => Err(gguf_err(
            path,
            format!("metadata `{key}` is {v}; it must be a layer count of at most {blocks}"),
        )),
    }
}

/// ERNIE 4.5 MoE (`Ernie4_5MoeModel`'s keys) as mlx-lm's `ernie4_5_moe` args: the expert
/// counts, the interleave step, the leading dense layers (llama.cpp: a layer has experts from
/// `leading_dense_block_count` on where `(layer + 1) % step == 0`, mlx-lm's rule with no
/// end index), the experts' width and the shared expert count (its width is
/// `moe_intermediate_size * moe_num_shared_experts` in mlx-lm, which the tensors' shapes
/// must match; the converter's `expert_shared_feed_forward_length` is not read).
fn ernie45_moe_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
) -> Result<()> {
    let key = |k: &str| format!("ernie4_5-moe.{k}");
    let need = |k: &str| need_count(meta, path, "ernie4_5-moe", k);
    config["moe_num_experts"] = Value::from(need("expert_count")?);
    config["moe_k"] = Value::from(need("expert_used_count")?);
    config["moe_layer_interval"] = Value::from(need("interleave_moe_layer_step")?);
    config["moe_layer_start_index"] = Value::from(
        meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?.unwrap_or(0),
    );
    if let Some(n) = meta_count(meta, path, &key("expert_feed_forward_length"))? {
        config["moe_intermediate_size"] = Value::from(n);
    }
    config["moe_num_shared_experts"] = Value::from(
        meta_layer_count(meta, path, &key("expert_shared_count"), i32::MAX)?.unwrap_or(0),
    );
    config["use_bias"] = Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    if config.get("head_dim").is_none() {
        let (h, n) = (&config["hidden_size"], &config["num_attention_heads"]);
        config["head_dim"] = Value::from(h.as_i64().unwrap_or(0) / n.as_i64().unwrap_or(1));
    }
    require_context(config, path, &key("context_length"))?;
    Ok(())
}

/// RWKV-7 (`Rwkv7Model`'s keys) as mlx-lm's rwkv7 args: the head size, the four LoRA ranks,
/// the LayerNorm epsilon; the fused token-shift mixes (r, w, k, v, a, g) split back into
/// `x_r` .. `x_g` of shape (1, 1, hidden), the LoRAs' biases (`*0`) back under `lora.2.bias`,
/// `r_k` per head, and the first layer's value LoRA dropped (the converter writes copies of
/// its `a` LoRA there; mlx-lm's first layer has none).
/// Nemotron (`nemotron`): relu2, the rotated share of the head from `rope.dimension_count`
/// (the converter's int(factor * hidden) // heads), biases from the tensors, linear rope
/// scaling from `rope.scaling.type` / `rope.scaling.factor` (another kind is refused).
fn nemotron_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    hidden: i32,
    heads: i32,
) -> Result<()> {
    let key = |k: &str| format!("nemotron.{k}");
    config["hidden_act"] = Value::from("relu2");
    // The head size is `attention.key_length` where written (TextModel writes it from the
    // config's `head_dim`), else hidden / heads; `rope.dimension_count` is the rotated part.
    let hd = meta_count(meta, path, &key("attention.key_length"))?.unwrap_or(hidden / heads.max(1));
    config["head_dim"] = Value::from(hd);
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd / 2, hd)?;
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    let has = |k: &str| tensors.contains_key(k);
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has("model.layers.0.mlp.up_proj.bias"));
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("linear") => {
            let f = meta_f64(meta, &key("rope.scaling.factor")).ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            config["rope_scaling"] = json!({"type": "linear", "factor": f});
        }
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: mlx-lm's nemotron takes linear scaling only",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    Ok(())
}

/// The head size `hidden / heads`, where `embedding_length` is a multiple of
/// `attention.head_count` (`key` spells an architecture's metadata keys).
fn head_size(path: &Path, key: &dyn Fn(&str) -> String, hidden: i32, heads: i32) -> Result<i32> {
    if heads <= 0 || hidden % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {hidden} is not a multiple of `{}` = {heads}",
                key("embedding_length"),
                key("attention.head_count")
            ),
        ));
    }
    Ok(hidden / heads)
}

/// The rotated share of a head of `hd`: the metadata `rot_key` (else `default`), in 1..=hd.
fn rotary_dims(
    meta: &GgufMetadata,
    path: &Path,
    rot_key: &str,
    default: i32,
    hd: i32,
) -> Result<i32> {
    let rot = meta_count(meta, path, rot_key)?.unwrap_or(default);
    if rot <= 0 || rot > hd {
        return Err(gguf_err(
            path,
            format!("metadata `{rot_key}` = {rot} must be in 1..={hd} (the head size)"),
        ));
    }
    Ok(rot)
}

/// Phi-2 (`phi2`): mlx-lm's phi arguments; the rotated share of the head from
/// `rope.dimension_count` (the whole head when absent); a fused `attn_qkv` (q, k, v rows in
/// turn, as older converters wrote Phi-2's `Wqkv`) split into mlx-lm's three projections.
fn phi2_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    hidden: i32,
    heads: i32,
) -> Result<()> {
    let key = |k: &str| format!("phi2.{k}");
    let hd = head_size(path, &key, hidden, heads)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd, hd)?;
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    let kv = config["num_key_value_heads"].as_i64().unwrap_or(0) as i32;
    for l in 0..blocks {
        for suffix in ["weight", "bias", "scales", "biases"] {
            let name = format!("model.layers.{l}.self_attn.gguf_qkv.{suffix}");
            let Some(qkv) = tensors.remove(&name) else {
                continue;
            };
            let rows = qkv.shape()[0];
            let (q, k) = (heads * hd, kv * hd);
            if rows != q + 2 * k {
                return Err(gguf_err(
                    path,
                    format!(
                        "GGUF tensor blk.{l}.attn_qkv.{suffix} has {rows} rows, not {} (q, k, v)",
                        q + 2 * k
                    ),
                ));
            }
            let cols = qkv.shape().get(1).copied();
            for (part, start, len) in [("q", 0, q), ("k", q, k), ("v", q + k, k)] {
                let a = match cols {
                    Some(c) => qkv.slice(&[start, 0], &[start + len, c], &[1, 1])?,
                    None => qkv.slice(&[start], &[start + len], &[1])?,
                };
                tensors.insert(
                    format!("model.layers.{l}.self_attn.{part}_proj.{suffix}"),
                    a,
                );
            }
        }
    }
    Ok(())
}

/// GPT-2 (`gpt2`): mlx-lm's `n_*` arguments; the positions from `position_embd`'s rows. The
/// head is the embedding in mlx-lm's gpt2: a file with its own `output` is refused.
fn gpt2_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    blocks: i32,
    hidden: i32,
    heads: i32,
) -> Result<()> {
    if tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight: mlx-lm's gpt2 ties its head to the embedding",
        ));
    }
    let positions = tensors
        .get("model.wpe.weight")
        .map(|w| w.shape()[0])
        .ok_or_else(|| gguf_err(path, "GGUF tensor position_embd.weight is missing"))?;
    config["n_embd"] = Value::from(hidden);
    config["n_head"] = Value::from(heads);
    config["n_layer"] = Value::from(blocks);
    config["n_positions"] = Value::from(positions);
    config["n_ctx"] = config
        .get("max_position_embeddings")
        .cloned()
        .unwrap_or(Value::from(positions));
    Ok(())
}

/// Qwen (`qwen`): mlx-lm's qwen arguments (its rope base is fixed at 10000, its heads all
/// have keys and values, its head untied); biases beyond the qkv one from the tensors.
fn qwen_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    key: &dyn Fn(&str) -> String,
    hidden: i32,
    heads: i32,
    kv_heads: i32,
) -> Result<()> {
    let hd = head_size(path, key, hidden, heads)?;
    if kv_heads != heads {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads}: mlx-lm's qwen gives every one of the {heads} heads \
                 its keys and values",
                key("attention.head_count_kv")
            ),
        ));
    }
    if config["rope_theta"].as_f64() != Some(10000.0) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {}: mlx-lm's qwen fixes the rope base at 10000",
                key("rope.freq_base"),
                config["rope_theta"]
            ),
        ));
    }
    if !tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight is missing: mlx-lm's qwen has its own head",
        ));
    }
    config["kv_channels"] = Value::from(hd);
    config["no_bias"] = Value::from(!tensors.contains_key("transformer.h.0.attn.c_proj.bias"));
    Ok(())
}

/// PLaMo (`plamo`): the query heads shared `n_shared_head` ways over the KV heads, the
/// converter's shuffle of `attn_q`'s rows and `attn_output`'s columns, (kv, shared, head_dim),
/// put back to mlx-lm's (shared, kv, head_dim).
fn plamo_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    key: &dyn Fn(&str) -> String,
    hidden: i32,
    heads: i32,
    kv_heads: i32,
) -> Result<()> {
    let hd = head_size(path, key, hidden, heads)?;
    if heads % kv_heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads} does not divide `{}` = {heads}",
                key("attention.head_count_kv"),
                key("attention.head_count")
            ),
        ));
    }
    let shared = heads / kv_heads;
    for (name, a) in tensors.iter_mut() {
        let fixed = if name.ends_with(".self_attn.q_proj.weight") {
            let cols = a.shape()[1];
            a.reshape(&[kv_heads, shared, hd, cols])?
                .transpose(&[1, 0, 2, 3])?
                .reshape(&[heads * hd, cols])?
        } else if name.ends_with(".self_attn.o_proj.weight") {
            let rows = a.shape()[0];
            a.reshape(&[rows, kv_heads, shared, hd])?
                .transpose(&[0, 2, 1, 3])?
                .reshape(&[rows, heads * hd])?
        } else {
            continue;
        };
        *a = fixed;
    }
    config["n_shared_head"] = Value::from(shared);
    config.as_object_mut().map(|m| m.remove("head_dim"));
    Ok(())
}

/// PLaMo 3 (`plamo3`): the norms' offsets (added by the converter, added again at run time by
/// mlx-lm) taken off, in f32 as mlx-lm's `weight + offset` is computed; the window, its period
/// (every n-th layer full) and the local rope base from metadata.
fn plamo3_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
) -> Result<()> {
    let after_mlp = (1.0f64 / 5f64.powf(1.5)) as f32;
    for (name, a) in tensors.iter_mut() {
        let offset = if name.ends_with(".post_mixer_norm.weight") {
            (1.0f64 / 5.0) as f32
        } else if name.ends_with(".post_mlp_norm.weight") {
            after_mlp
        } else if name.ends_with("norm.weight") {
            1.0
        } else {
            continue;
        };
        *a = (&*a - offset)?;
    }
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    config["window_size"] = Value::from(need("attention.sliding_window")?);
    config["sliding_window_pattern"] = Value::from(need("attention.sliding_window_pattern")?);
    if let Some(theta) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        config["rope_local_theta"] = Value::from(theta);
    }
    Ok(())
}

/// Talkie (`talkie`): the converter's negation of the second half of every query and key
/// head's rows undone (exact), its renames put back (`attn_output.scale` -> `attn_gain.a_g`,
/// `ffn_down.scale` -> `mlp_gain.a_g`, `output.weight` -> the bare `lm_head`, the head gain
/// flattened) and `logit_scale` made the head's gain `lm_head_gain.w_g`.
fn talkie_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
) -> Result<()> {
    let hd = config["head_dim"]
        .as_i64()
        .map(|d| d as i32)
        .filter(|&d| d > 0 && d % 2 == 0)
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}` is missing or odd: Talkie's heads need an even size",
                    key("attention.key_length")
                ),
            )
        })?;
    let half = hd / 2;
    let signs: Vec<f32> = (0..hd).map(|i| if i < half { 1.0 } else { -1.0 }).collect();
    let signs = Array::from_slice(&signs, &[1, hd, 1])?;
    let renames = [
        (".attn.attn_resid.scale", ".attn_gain.a_g"),
        (".mlp.mlp_resid.scale", ".mlp_gain.a_g"),
    ];
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let Some(a) = tensors.remove(&name) else {
            continue;
        };
        let (name, a) = if name.ends_with(".attn.attn_query.weight")
            || name.ends_with(".attn.attn_key.weight")
        {
            let shape = a.shape().to_vec();
            let flipped = (&a.reshape(&[-1, hd, shape[1]])? * &signs.astype(a.dtype())?)?;
            (name, flipped.reshape(&shape)?)
        } else if name.ends_with(".attn.head_gain.head_g") {
            (name, a.reshape(&[-1])?)
        } else if name == "lm_head.weight" {
            ("lm_head".to_string(), a)
        } else if let Some((from, to)) = renames.iter().find(|(f, _)| name.ends_with(f)) {
            (format!("{}{to}", &name[..name.len() - from.len()]), a)
        } else {
            (name, a)
        };
        tensors.insert(name, a);
    }
    if !tensors.contains_key("lm_head") {
        return Err(gguf_err(
            path,
            "GGUF tensor output.weight is missing: Talkie's head is its own",
        ));
    }
    let gain = meta_f64(meta, &key("logit_scale")).ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("logit_scale")),
        )
    })?;
    tensors.insert(
        "lm_head_gain.w_g".into(),
        Array::from_slice(&[gain as f32], &[1])?,
    );
    Ok(())
}

/// `layer_types` ("sliding_attention" / "full_attention") from the per-layer flags of
/// `attention.sliding_window_pattern`, one per layer.
fn sliding_kinds(
    meta: &GgufMetadata,
    path: &Path,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
) -> Result<Vec<&'static str>> {
    let missing = |k: &str| gguf_err(path, format!("metadata `{}` is missing", key(k)));
    let flags = match meta.get(&key("attention.sliding_window_pattern")) {
        Some(GgufValue::Array(a)) if a.ndim() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| {
                gguf_err(
                    path,
                    format!(
                        "metadata `{}`: {e}",
                        key("attention.sliding_window_pattern")
                    ),
                )
            })?,
        Some(_) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not a per-layer list of flags",
                    key("attention.sliding_window_pattern")
                ),
            ))
        }
        None => return Err(missing("attention.sliding_window_pattern")),
    };
    if flags.len() != blocks as usize {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` has {} entries for {blocks} layers",
                key("attention.sliding_window_pattern"),
                flags.len()
            ),
        ));
    }
    let kinds: Vec<&str> = flags
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    Ok(kinds)
}

/// Mellum (`mellum`): the experts (llama.cpp renormalizes the top-k softmax weights and scales
/// them only by an `expert_weights_scale` other than 0 or 1, which mlx-lm's mellum lacks), the
/// layer kinds from the sliding flags (all full without a window) and each kind's rope base.
fn mellum_config(
    config: &mut Value,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
) -> Result<()> {
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    config["num_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["norm_topk_prob"] = Value::from(true);
    if let Some(s) = meta_f64(meta, &key("expert_weights_scale")).filter(|&s| s != 0.0 && s != 1.0)
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {s}: mlx-lm's mellum does not scale its experts",
                key("expert_weights_scale")
            ),
        ));
    }
    if let Some(t) = meta_str(meta, &key("rope.scaling.type")).filter(|t| *t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is `{t}`; the mellum map reads unscaled rope only",
                key("rope.scaling.type")
            ),
        ));
    }
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let kinds = match window {
        Some(_) => sliding_kinds(meta, path, key, blocks)?,
        None => vec!["full_attention"; blocks as usize],
    };
    config["layer_types"] = json!(kinds);
    config["sliding_window"] = Value::from(window.unwrap_or(0));
    let theta = config["rope_theta"].clone();
    let swa = match positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        Some(t) => Value::from(t),
        None => theta.clone(),
    };
    config["rope_parameters"] = json!({
        "full_attention": {"rope_theta": theta},
        "sliding_attention": {"rope_theta": swa},
    });
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    Ok(())
}

/// EXAONE MoE (`exaone-moe`): llama.cpp's router (sigmoid, the required gating function 2,
/// groups, the correction bias, top-k renormalized as `expert_weights_norm` says, scaled by
/// `expert_weights_scale`, 1 when absent or 0) as mlx-lm's exaone_moe arguments; MoE layers
/// from `leading_dense_block_count` on; layer kinds from the sliding flags (llama.cpp's "LLLG"
/// without them); the local rope base (`rope.freq_base_swa`, else the base) for mlx-lm's one,
/// since only the sliding layers rotate; a layer without `exp_probs_b` gets a zero bias.
fn exaone_moe_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
) -> Result<()> {
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let experts = need("expert_count")?;
    if need("expert_gating_func")? != 2 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is not sigmoid (2), the router mlx-lm's exaone_moe has",
                key("expert_gating_func")
            ),
        ));
    }
    let moe = need("expert_feed_forward_length")?;
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    if let Some(w) = meta_count(meta, path, &key("expert_shared_feed_forward_length"))? {
        if shared > 0 && w != moe * shared {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {w} is not {shared} shared experts of {moe} (mlx-lm's \
                     exaone_moe)",
                    key("expert_shared_feed_forward_length")
                ),
            ));
        }
    }
    if let Some(t) = meta_str(meta, &key("rope.scaling.type")).filter(|t| *t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is `{t}`; the exaone-moe map reads unscaled rope only",
                key("rope.scaling.type")
            ),
        ));
    }
    let dense = meta_count(meta, path, &key("leading_dense_block_count"))?.unwrap_or(0);
    let kinds = if meta.contains_key(&key("attention.sliding_window_pattern")) {
        sliding_kinds(meta, path, key, blocks)?
    } else {
        (0..blocks)
            .map(|i| {
                if (i + 1) % 4 != 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect()
    };
    if kinds.contains(&"sliding_attention") {
        if let Some(t) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
            config["rope_theta"] = Value::from(t);
        }
    }
    config["layer_types"] = json!(kinds);
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    config["is_moe_layer"] = json!((0..blocks).map(|i| i >= dense).collect::<Vec<_>>());
    config["num_experts"] = Value::from(experts);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["num_shared_experts"] = Value::from(shared);
    config["moe_intermediate_size"] = Value::from(moe);
    config["n_group"] =
        Value::from(meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1));
    config["topk_group"] =
        Value::from(meta_count(meta, path, &key("expert_group_used_count"))?.unwrap_or(1));
    config["routed_scaling_factor"] = Value::from(
        meta_f64(meta, &key("expert_weights_scale"))
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0),
    );
    config["norm_topk_prob"] = Value::from(match meta.get(&key("expert_weights_norm")) {
        None => false,
        Some(GgufValue::Array(a)) if a.size() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.item::<bool>())
            .map_err(|e| {
                gguf_err(
                    path,
                    format!("metadata `{}`: {e}", key("expert_weights_norm")),
                )
            })?,
        Some(_) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is not a flag", key("expert_weights_norm")),
            ))
        }
    });
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    for l in dense..blocks {
        let bias = format!("model.layers.{l}.mlp.gate.e_score_correction_bias");
        if let std::collections::btree_map::Entry::Vacant(e) = tensors.entry(bias) {
            e.insert(ops::zeros(&[experts], Dtype::Float32, None)?);
        }
    }
    Ok(())
}

/// Deci / Nemotron-NAS (`deci` -> mlx-lm's `nemotron-nas`): each layer's `block_configs`
/// entry from the per-layer lists DeciModel writes: query heads 0 (no attention), or the
/// model's count with KV heads 0 (the linear stand-in: `attn_output` is mlx-lm's
/// `self_attn.linear`) or a divisor of it (`n_heads_in_group`, Q / K rows un-permuted per
/// layer); an MLP width of 0 (none) or the converter's `_ffn_mult_to_intermediate_size` of a
/// multiplier, which is recovered (`3 w / 2 hidden`, checked to give `w` back in mlx-lm's
/// arithmetic). A width no multiplier gives is refused.
fn deci_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    ggml: &mut BTreeMap<String, crate::layers::GgmlWeight>,
    path: &Path,
    key: &dyn Fn(&str) -> String,
    (blocks, hidden, heads): (i32, i32, i32),
    (q, kv, ffn): (Vec<i32>, Vec<i32>, Vec<i64>),
) -> Result<()> {
    let n = blocks as usize;
    let expand = |v: Vec<i64>, k: &str| -> Result<Vec<i64>> {
        match v.len() {
            1 => Ok(vec![v[0]; n]),
            l if l == n => Ok(v),
            l => Err(gguf_err(
                path,
                format!("metadata `{}` has {l} entries for {blocks} layers", key(k)),
            )),
        }
    };
    let (qk, kvk, fk) = (
        "attention.head_count",
        "attention.head_count_kv",
        "feed_forward_length",
    );
    let q = expand(q.into_iter().map(i64::from).collect(), qk)?;
    let kv = expand(kv.into_iter().map(i64::from).collect(), kvk)?;
    let ffn = expand(ffn, fk)?;
    let h = i64::from(heads);
    if heads <= 0 || hidden % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` ({heads}) does not divide `{}` ({hidden})",
                key(qk),
                key("embedding_length")
            ),
        ));
    }
    if let Some(d) = config["head_dim"]
        .as_i64()
        .filter(|&d| d != i64::from(hidden / heads))
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {d}; nemotron-nas's heads are {} wide",
                key("attention.key_length"),
                hidden / heads
            ),
        ));
    }
    let d = f64::from(hidden);
    let mut blocks_cfg = Vec::with_capacity(n);
    for l in 0..n {
        let bad = |k: &str, why: String| {
            gguf_err(path, format!("layer {l}: metadata `{}` {why}", key(k)))
        };
        let p = format!("model.layers.{l}.self_attn");
        let attention = match (q[l], kv[l]) {
            (0, 0) => json!({"no_op": true}),
            (a, _) if a != h => {
                return Err(bad(
                    qk,
                    format!("is {a}; the attention layers have {h} heads"),
                ))
            }
            (_, 0) => {
                // Every part (a quantized weight's scales and biases too).
                let parts: Vec<String> = tensors
                    .keys()
                    .filter(|k| k.starts_with(&format!("{p}.o_proj.")))
                    .cloned()
                    .collect();
                for k in parts {
                    if let Some(w) = tensors.remove(&k) {
                        tensors.insert(k.replacen(".o_proj.", ".linear.", 1), w);
                    }
                }
                if let Some(g) = ggml.remove(&format!("{p}.o_proj.weight")) {
                    ggml.insert(format!("{p}.linear.weight"), g);
                }
                json!({"replace_with_linear": true})
            }
            (_, k) if k < 0 || h % k != 0 => {
                return Err(bad(kvk, format!("is {k}, which does not divide {h} heads")))
            }
            (_, k) => {
                // Rows of every part (a quantized weight's scales and biases too); weights kept
                // as GGML blocks were un-permuted as they were read.
                for (proj, count, name) in [("q_proj", h, qk), ("k_proj", k, kvk)] {
                    let parts: Vec<String> = tensors
                        .keys()
                        .filter(|t| t.starts_with(&format!("{p}.{proj}.")))
                        .cloned()
                        .collect();
                    for t in parts {
                        let Some(w) = tensors.remove(&t) else {
                            continue;
                        };
                        let w = if w.ndim() == 1 {
                            let r = w.shape()[0];
                            unpermute(&w.reshape(&[r, 1])?, count as i32, &t, &key(name))?
                                .reshape(&[r])?
                        } else {
                            unpermute(&w, count as i32, &t, &key(name))?
                        };
                        tensors.insert(t, w);
                    }
                }
                json!({"n_heads_in_group": h / k})
            }
        };
        let mlp = match ffn[l] {
            0 => json!({"no_op": true}),
            w if w > 0 => {
                // mlx-lm: round(mult, 6), then find_multiple(int(2 * mult * d / 3), 256).
                let mult = (1.5 * w as f64 / d * 1e6).round() / 1e6;
                let i = (2.0 * mult * d / 3.0) as i64;
                let back = if i % 256 == 0 { i } else { i + 256 - i % 256 };
                if back != w {
                    return Err(bad(
                        fk,
                        format!("is {w}, which no `ffn_mult` gives (a multiple of 256)"),
                    ));
                }
                json!({"ffn_mult": mult})
            }
            w => return Err(bad(fk, format!("is {w}"))),
        };
        blocks_cfg.push(json!({"attention": attention, "ffn": mlp}));
    }
    config["model_type"] = Value::from("nemotron-nas");
    config["num_attention_heads"] = Value::from(heads);
    config["block_configs"] = Value::from(blocks_cfg);
    let has = |t: &str| {
        tensors
            .keys()
            .any(|k| k.starts_with("model.layers.") && k.ends_with(t))
    };
    config["attention_bias"] = Value::from(has(".self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".mlp.up_proj.bias"));
    for k in ["head_dim", "num_key_value_heads", "intermediate_size"] {
        if let Value::Object(m) = config {
            m.remove(k);
        }
    }
    Ok(())
}

/// BitNet's projections: llama.cpp's part, mlx-lm's module.
const BITNET_LINEARS: &[(&str, &str)] = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// BitNet b1.58 (`bitnet`): BitnetModel writes each projection as ternary values times one
/// scale (its `weight_quant`); mlx-lm's BitLinear holds the codes packed four output rows a
/// byte plus `weight_scale`, which [`bitnet_pack`] recovers exactly. The rope scaling the
/// converter writes (linear, factor 1) is no scaling; another linear factor is kept.
fn bitnet_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
) -> Result<()> {
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("linear") => {
            let f = meta_f64(meta, &key("rope.scaling.factor")).ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            if f != 1.0 {
                config["rope_scaling"] = json!({"type": "linear", "factor": f});
            }
        }
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: mlx-lm's bitnet takes linear scaling only",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let bias = |p: &str| tensors.contains_key(&format!("model.layers.0.{p}.bias"));
    config["attention_bias"] = Value::from(bias("self_attn.q_proj"));
    config["mlp_bias"] = Value::from(bias("mlp.up_proj"));
    for l in 0..blocks {
        for (part, module) in BITNET_LINEARS {
            let gguf = format!("blk.{l}.{part}.weight");
            let name = format!("model.layers.{l}.{module}");
            let w = tensors
                .remove(&format!("{name}.weight"))
                .ok_or_else(|| gguf_err(path, format!("GGUF tensor {gguf} is missing")))?;
            let (packed, scale) =
                bitnet_pack(&w).map_err(|e| gguf_err(path, format!("GGUF tensor {gguf}: {e}")))?;
            tensors.insert(format!("{name}.weight"), packed);
            tensors.insert(format!("{name}.weight_scale"), scale);
        }
    }
    Ok(())
}

/// A weight of ternary values times one scale (`(out, in)`, `out` a multiple of 4) as mlx-lm's
/// BitLinear holds it: uint8 `(out / 4, in)` whose bits `2i..2i + 2` of row `r` are row
/// `r + i * out / 4`'s code (value / scale + 1), and the scale (the non-zero magnitude, 1 when
/// every value is 0) in the weight's dtype, shape (1,). Values that are not 0 or plus / minus
/// one magnitude are refused.
fn bitnet_pack(w: &Array) -> std::result::Result<(Array, Array), String> {
    let shape = w.shape();
    let &[out, cols] = shape.as_slice() else {
        return Err(format!("must be 2-d, got shape {shape:?}"));
    };
    if out % 4 != 0 {
        return Err(format!(
            "has {out} rows; mlx-lm's BitLinear packs four output rows a byte"
        ));
    }
    let v = w
        .astype(Dtype::Float32)
        .and_then(|a| a.to_vec::<f32>())
        .map_err(|e| e.to_string())?;
    let s = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if let Some(i) = v.iter().position(|&x| !(x == 0.0 || x == s || x == -s)) {
        let c = cols as usize;
        return Err(format!(
            "value {} at ({}, {}) is not 0 or +/-{s}: not ternary values times one scale",
            v[i],
            i / c,
            i % c
        ));
    }
    let (q, c) = (out as usize / 4, cols as usize);
    let mut packed = vec![0u8; q * c];
    for i in 0..4 {
        for (j, p) in packed.iter_mut().enumerate() {
            let x = v[i * q * c + j];
            let code: u8 = if x > 0.0 {
                2
            } else if x < 0.0 {
                0
            } else {
                1
            };
            *p |= code << (2 * i);
        }
    }
    let s = if s == 0.0 { 1.0 } else { s };
    let err = |e: mlx_core::Error| e.to_string();
    Ok((
        Array::from_slice(&packed, &[out / 4, cols]).map_err(err)?,
        Array::from_slice(&[s], &[1])
            .and_then(|a| a.astype(w.dtype()))
            .map_err(err)?,
    ))
}

/// A positive count per layer (a list, or one number for every layer), as 32-bit values.
fn per_layer_counts(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Vec<i32>> {
    layer_counts(meta, path, key, 1)
}

/// [`per_layer_counts`] with counts of at least `min` (0 for layers without attention).
fn layer_counts(meta: &GgufMetadata, path: &Path, key: &str, min: i32) -> Result<Vec<i32>> {
    let bad = || {
        let what = if min > 0 { "positive" } else { "non-negative" };
        gguf_err(
            path,
            format!("metadata `{key}` must be {what} 32-bit counts, one per layer"),
        )
    };
    match meta.get(key) {
        None => Err(gguf_err(path, format!("metadata `{key}` is missing"))),
        Some(GgufValue::Array(a)) if a.ndim() <= 1 && a.size() >= 1 => {
            let v = a
                .astype(Dtype::Int64)
                .and_then(|b| b.reshape(&[-1]))
                .and_then(|b| b.to_vec::<i64>())
                .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?;
            v.iter()
                .map(|&n| i32::try_from(n).ok().filter(|&n| n >= min).ok_or_else(bad))
                .collect()
        }
        Some(_) => Err(bad()),
    }
}

/// OpenELM (`openelm`): mlx-lm's arguments from the per-layer lists (each MLP width as a
/// multiplier of the width with a divisor of 1, which gives the width back through mlx-lm's
/// `make_divisible`); gate and up joined into `proj_1`.
fn openelm_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
    hidden: i32,
    (q, kv, ffn): (Vec<i32>, Vec<i32>, Vec<i64>),
) -> Result<()> {
    let n = blocks as usize;
    let expand = |v: Vec<i64>, k: &str| -> Result<Vec<i64>> {
        match v.len() {
            1 => Ok(vec![v[0]; n]),
            l if l == n => Ok(v),
            l => Err(gguf_err(
                path,
                format!("metadata `{}` has {l} entries for {blocks} layers", key(k)),
            )),
        }
    };
    let q = expand(
        q.into_iter().map(i64::from).collect(),
        "attention.head_count",
    )?;
    let kv = expand(
        kv.into_iter().map(i64::from).collect(),
        "attention.head_count_kv",
    )?;
    let ffn = expand(ffn, "feed_forward_length")?;
    if let Some(l) = (0..n).find(|&l| q[l] % kv[l] != 0) {
        return Err(gguf_err(
            path,
            format!(
                "layer {l}: metadata `{}` ({}) does not divide `{}` ({})",
                key("attention.head_count_kv"),
                kv[l],
                key("attention.head_count"),
                q[l]
            ),
        ));
    }
    let hd = config["head_dim"].as_i64().ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        )
    })?;
    for l in 0..blocks {
        let p = format!("transformer.layers.{l}.ffn");
        let (Some(gate), Some(up)) = (
            tensors.remove(&format!("{p}.gguf_gate.weight")),
            tensors.remove(&format!("{p}.gguf_up.weight")),
        ) else {
            return Err(gguf_err(
                path,
                format!("GGUF tensors blk.{l}.ffn_gate / ffn_up: OpenELM needs both"),
            ));
        };
        tensors.insert(
            format!("{p}.proj_1.weight"),
            ops::concatenate(&[&gate, &up], 0, None)?,
        );
    }
    let eps = config["rms_norm_eps"].clone();
    let theta = config["rope_theta"].clone();
    let vocab = config["vocab_size"].clone();
    let tied = !tensors.contains_key("lm_head.weight");
    let norms = tensors.contains_key("transformer.layers.0.attn.q_norm.weight");
    *config = json!({
        "model_type": "openelm",
        "head_dim": hd,
        "num_transformer_layers": blocks,
        "model_dim": hidden,
        "vocab_size": vocab,
        "ffn_dim_divisor": 1,
        "num_query_heads": q,
        "num_kv_heads": kv,
        "ffn_multipliers": ffn.iter().map(|&f| f as f64 / f64::from(hidden)).collect::<Vec<_>>(),
        "ffn_with_glu": true,
        "normalize_qk_projections": norms,
        "share_input_output_layers": tied,
        "rms_norm_eps": eps,
        "rope_freq_constant": theta,
    });
    Ok(())
}

/// Muse Glimmer (`muse-glimmer`): the four centred layer norms' `1 +` taken off (f32, as
/// mlx-lm adds it back); the synthesized q / k norms read back into `qk_scale_factor` (every
/// `attn_q_norm` one value, every `attn_k_norm` ones) and dropped; `logit_scale` as
/// `output_multiplier`, the soft-capping, the window and layer kinds; the sliding layers' rope
/// base (`rope.freq_base_swa`, else the base) as mlx-lm's one, the full layers without rope;
/// llama.cpp's fixed post-norm eps (1e-8).
fn muse_glimmer_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
) -> Result<()> {
    let need = |k: &str| -> Result<f64> {
        meta_f64(meta, &key(k))
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing or not a number > 0", key(k)),
                )
            })
    };
    let mut qk_scale: Option<f32> = None;
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        if name.contains(".self_attn.gguf_q_norm.") || name.contains(".self_attn.gguf_k_norm.") {
            let Some(a) = tensors.remove(&name) else {
                continue;
            };
            let v = a
                .astype(Dtype::Float32)
                .and_then(|b| b.reshape(&[-1]))
                .and_then(|b| b.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("{name}: {e}")))?;
            let first = v.first().copied().unwrap_or(f32::NAN);
            let uniform = v.iter().all(|&x| x == first);
            let ok = if name.contains("gguf_k_norm") {
                uniform && first == 1.0
            } else {
                let same = qk_scale.is_none_or(|s| s == first);
                qk_scale = Some(first);
                uniform && same && first.is_finite()
            };
            if !ok {
                return Err(gguf_err(
                    path,
                    format!(
                        "{name}: Muse Glimmer's q / k norms are weightless (`attn_k_norm` all ones, \
                         every `attn_q_norm` one qk_scale_factor), which mlx-lm's muse_glimmer \
                         assumes"
                    ),
                ));
            }
            continue;
        }
        if [
            ".input_layernorm.weight",
            ".post_attention_layernorm.weight",
            ".pre_feedforward_layernorm.weight",
            ".post_feedforward_layernorm.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
        {
            if let Some(a) = tensors.get_mut(&name) {
                *a = (&*a - 1.0f32)?;
            }
        }
    }
    let qk_scale = qk_scale.ok_or_else(|| {
        gguf_err(
            path,
            "GGUF tensor blk.0.attn_q_norm.weight is missing (it carries qk_scale_factor)",
        )
    })?;
    config["qk_scale_factor"] = Value::from(f64::from(qk_scale));
    config["output_multiplier"] = Value::from(need("logit_scale")?);
    config["final_logit_softcapping"] = Value::from(need("final_logit_softcapping")?);
    config["sliding_window"] = Value::from(
        meta_count(meta, path, &key("attention.sliding_window"))?.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("attention.sliding_window")),
            )
        })?,
    );
    config["layer_types"] = json!(sliding_kinds(meta, path, key, blocks)?);
    if let Some(t) = positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        config["rope_theta"] = Value::from(t);
    }
    config["post_norm_eps"] = Value::from(1e-8);
    if config.get("head_dim").is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    Ok(())
}

/// Spark 2.5 (`spark2_5`): the layer kinds from the per-layer sliding flags, the window, and
/// each kind's `rope_parameters` (base, rotated share of the head); biases from the tensors.
fn spark2_5_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
    blocks: i32,
) -> Result<()> {
    let missing = |k: &str| gguf_err(path, format!("metadata `{}` is missing", key(k)));
    config["layer_types"] = json!(sliding_kinds(meta, path, key, blocks)?);
    config["sliding_window"] = Value::from(
        meta_count(meta, path, &key("attention.sliding_window"))?
            .ok_or_else(|| missing("attention.sliding_window"))?,
    );
    let hd = config["head_dim"]
        .as_f64()
        .ok_or_else(|| missing("attention.key_length"))?;
    let theta = config["rope_theta"].clone();
    let swa_theta = match positive_f64(meta, path, &key("rope.freq_base_swa"))? {
        Some(t) => Value::from(t),
        None => theta.clone(),
    };
    let share = |k: &str| -> Result<f64> {
        Ok(meta_count(meta, path, &key(k))?.map_or(1.0, |d| f64::from(d) / hd))
    };
    config["rope_parameters"] = json!({
        "full_attention": {"rope_theta": theta, "partial_rotary_factor": share("rope.dimension_count")?},
        "sliding_attention": {"rope_theta": swa_theta, "partial_rotary_factor": share("rope.dimension_count_swa")?},
    });
    let has = |t: &str| tensors.contains_key(&format!("model.layers.0.{t}"));
    config["attention_bias"] = Value::from(has("self_attn.q_k_v_proj.bias"));
    config["mlp_bias"] = Value::from(has("mlp.down_proj.bias"));
    Ok(())
}

/// OLMo (`olmo`): mlx-lm's AI2 arguments and fused projections (`att_proj` = [q | k | v],
/// `ff_proj` = [up | gate]); mlx-lm's fixed LayerNorm eps (1e-5), full heads and no clamp are
/// checked.
fn olmo_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    key: &dyn Fn(&str) -> String,
    (blocks, heads, kv_heads, ffn): (i32, i32, i32, i32),
) -> Result<()> {
    if meta.contains_key(&key("attention.clamp_kqv")) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's olmo does not clamp q, k and v",
                key("attention.clamp_kqv")
            ),
        ));
    }
    if kv_heads != heads {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {kv_heads}: mlx-lm's olmo gives each of the {heads} heads its \
                 keys and values",
                key("attention.head_count_kv")
            ),
        ));
    }
    if config["layer_norm_eps"].as_f64().map(|e| e as f32) != Some(1e-5) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {}: mlx-lm's olmo fixes it at 1e-5",
                key("attention.layer_norm_epsilon"),
                config["layer_norm_eps"]
            ),
        ));
    }
    for l in 0..blocks {
        let p = format!("model.transformer.blocks.{l}");
        for (fused, parts) in [
            (
                "att_proj",
                ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"].as_slice(),
            ),
            ("ff_proj", ["gguf_up", "gguf_gate"].as_slice()),
        ] {
            let mut got = Vec::with_capacity(parts.len());
            for part in parts {
                let name = format!("{p}.{part}.weight");
                got.push(tensors.remove(&name).ok_or_else(|| {
                    gguf_err(
                        path,
                        format!("layer {l}: `{part}` is missing (OLMo's {fused} needs it)"),
                    )
                })?);
            }
            let refs: Vec<&Array> = got.iter().collect();
            let joined = ops::concatenate(&refs, 0, None)
                .map_err(|e| gguf_err(path, format!("layer {l}: joining {fused}: {e}")))?;
            tensors.insert(format!("{p}.{fused}.weight"), joined);
        }
    }
    if let Some(k) = tensors.keys().find(|k| k.ends_with(".bias")) {
        return Err(gguf_err(path, format!("{k}: mlx-lm's olmo has no biases")));
    }
    let tied = !tensors.contains_key("model.transformer.ff_out.weight");
    let vocab = config["vocab_size"].clone();
    *config = json!({
        "model_type": "olmo",
        "d_model": config["hidden_size"],
        "n_layers": blocks,
        "mlp_hidden_size": 2 * ffn,
        "n_heads": heads,
        "vocab_size": vocab,
        "embedding_size": vocab,
        "rope_theta": config["rope_theta"],
        "weight_tying": tied,
    });
    Ok(())
}

/// StarCoder (`starcoder`): mlx-lm's gpt_bigcode arguments; multi-query where the file has one
/// KV head (else every head has its own, `multi_query` false); positions from
/// `position_embd`'s rows; biases from the tensors.
#[allow(clippy::too_many_arguments)]
fn starcoder_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    blocks: i32,
    hidden: i32,
    heads: i32,
    kv_heads: i32,
    ffn: i32,
) -> Result<()> {
    let multi_query = match kv_heads {
        1 => true,
        k if k == heads => false,
        k => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `starcoder.attention.head_count_kv` = {k}: mlx-lm's gpt_bigcode \
                     takes 1 (multi-query) or the head count ({heads})"
                ),
            ))
        }
    };
    let positions = tensors
        .get("transformer.wpe.weight")
        .map(|w| w.shape()[0])
        .ok_or_else(|| gguf_err(path, "GGUF tensor position_embd.weight is missing"))?;
    let has = |k: &str| tensors.contains_key(k);
    config["n_embd"] = Value::from(hidden);
    config["n_head"] = Value::from(heads);
    config["n_layer"] = Value::from(blocks);
    config["n_inner"] = Value::from(ffn);
    config["n_positions"] = Value::from(positions);
    config["multi_query"] = Value::from(multi_query);
    config["attention_bias"] = Value::from(has("transformer.h.0.attn.c_attn.bias"));
    config["mlp_bias"] = Value::from(has("transformer.h.0.mlp.c_fc.bias"));
    Ok(())
}

/// GPT-NeoX (`gptneox`): mlx-lm's gpt_neox arguments (`rotary_pct` from `rope.dimension_count`,
/// the base from `rope.freq_base` or 10000, `use_parallel_residual` as the file says, else
/// true); the converter's `attn_qkv` (q rows, then k, then v) interleaved per head again
/// (per head: q, k, v), weight, bias and a quantized tensor's scales and biases alike.
fn gptneox_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    hidden: i32,
    heads: i32,
) -> Result<()> {
    let key = |k: &str| format!("gptneox.{k}");
    let hd = head_size(path, &key, hidden, heads)?;
    let rot = rotary_dims(meta, path, &key("rope.dimension_count"), hd, hd)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    config["rotary_pct"] = Value::from(f64::from(rot) / f64::from(hd));
    config["rotary_emb_base"] = config["rope_theta"].clone();
    config["use_parallel_residual"] =
        Value::from(meta_bool(meta, path, &key("use_parallel_residual"))?.unwrap_or(true));
    for l in 0..blocks {
        for suffix in ["weight", "bias", "scales", "biases"] {
            let name = format!("model.h.{l}.attention.gguf_qkv.{suffix}");
            let Some(qkv) = tensors.remove(&name) else {
                continue;
            };
            let shape = qkv.shape();
            if shape[0] != 3 * hidden {
                return Err(gguf_err(
                    path,
                    format!(
                        "GGUF tensor blk.{l}.attn_qkv.{suffix} has {} rows, not 3 x {hidden}",
                        shape[0]
                    ),
                ));
            }
            let mut grouped = vec![3, heads, hd];
            grouped.extend_from_slice(&shape[1..]);
            let a = qkv.reshape(&grouped)?;
            let a = ops::swapaxes(&a, 0, 1, None)?.reshape(&shape)?;
            tensors.insert(format!("model.h.{l}.attention.query_key_value.{suffix}"), a);
        }
    }
    Ok(())
}

/// DeepSeek MoE (`deepseek`): mlx-lm's deepseek arguments from the expert keys (every layer
/// from `leading_dense_block_count` on has experts, `moe_layer_freq` 1, as llama.cpp's graph);
/// an `expert_weights_scale` other than 1 (which mlx-lm's deepseek lacks) is refused.
fn deepseek_config(
    config: &mut Value,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
) -> Result<()> {
    let need = |k: &str| need_count(meta, path, "deepseek", k);
    let dense = meta_count(meta, path, "deepseek.leading_dense_block_count")?.unwrap_or(0);
    if dense > blocks {
        return Err(gguf_err(
            path,
            format!(
                "metadata `deepseek.leading_dense_block_count` = {dense} is more than the \
                 {blocks} layers"
            ),
        ));
    }
    if let Some(s) = meta_f64(meta, "deepseek.expert_weights_scale") {
        if s != 1.0 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `deepseek.expert_weights_scale` is {s}: mlx-lm's deepseek \
                     scales by 1"
                ),
            ));
        }
    }
    config["n_routed_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["n_shared_experts"] =
        Value::from(meta_count(meta, path, "deepseek.expert_shared_count")?.unwrap_or(0));
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["first_k_dense_replace"] = Value::from(dense);
    config["moe_layer_freq"] = Value::from(1);
    Ok(())
}

/// MiniCPM (`minicpm`): mlx-lm's `scale_emb` (`embedding_scale`), `scale_depth`
/// (`residual_scale` times the square root of the layer count) and `dim_model_base` (hidden /
/// `logit_scale`, an integer where it is one): mlx-lm recomputes the residual and logit scales
/// from them in Python floats, which come back to the file's f32 values.
fn minicpm_config(
    config: &mut Value,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    hidden: i32,
) -> Result<()> {
    let need = |k: &str| -> Result<f64> {
        let key = format!("minicpm.{k}");
        match meta_f64(meta, &key) {
            Some(v) if v.is_finite() && v != 0.0 => Ok(v),
            Some(v) => Err(gguf_err(path, format!("metadata `{key}` is {v}"))),
            None => Err(gguf_err(path, format!("metadata `{key}` is missing"))),
        }
    };
    config["scale_emb"] = Value::from(need("embedding_scale")?);
    config["scale_depth"] = Value::from(need("residual_scale")? * f64::from(blocks).sqrt());
    let base = f64::from(hidden) / need("logit_scale")?;
    config["dim_model_base"] = if base.fract() == 0.0 && base.abs() < 1e9 {
        Value::from(base as i64)
    } else {
        Value::from(base)
    };
    Ok(())
}

/// Hunyuan dense (`hunyuan-dense`): mlx-lm's hunyuan_v1_dense with the file's rope base, which
/// HunYuanModel wrote already scaled by its NTK alpha (so no `rope_scaling`: alpha 1 keeps the
/// base); a scaling other than "none" is refused. The head size from `attention.key_length`,
/// q / k norms and biases from the tensors.
fn hunyuan_dense_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    hidden: i32,
    heads: i32,
) -> Result<()> {
    let key = |k: &str| format!("hunyuan-dense.{k}");
    let hd = meta_count(meta, path, &key("attention.key_length"))?.unwrap_or(hidden / heads.max(1));
    config["head_dim"] = Value::from(hd);
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: Hunyuan's files carry the NTK-alpha base \
                     already scaled, with scaling \"none\"",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let has = |k: &str| tensors.contains_key(k);
    config["use_qk_norm"] = Value::from(has("model.layers.0.self_attn.query_layernorm.weight"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    Ok(())
}

/// Apertus (`apertus`): each layer's xIELU parameters from the per-layer `xielu.alpha_n`,
/// `xielu.alpha_p`, `xielu.beta` and `xielu.eps` arrays (the converter's `.item()` of each
/// parameter) back into mlx-lm's `mlp.act_fn.*` scalars; biases and q / k norms from the tensors.
fn apertus_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
) -> Result<()> {
    for name in ["alpha_n", "alpha_p", "beta", "eps"] {
        let key = format!("apertus.xielu.{name}");
        let values: Vec<f32> = match meta.get(&key) {
            Some(GgufValue::Array(a)) if a.ndim() == 1 && a.size() == blocks as usize => a
                .astype(Dtype::Float32)
                .and_then(|b| b.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?,
            None => return Err(gguf_err(path, format!("metadata `{key}` is missing"))),
            Some(_) => {
                return Err(gguf_err(
                    path,
                    format!("metadata `{key}` must give one value for each of the {blocks} layers"),
                ))
            }
        };
        for (l, v) in values.into_iter().enumerate() {
            tensors.insert(
                format!("model.layers.{l}.mlp.act_fn.{name}"),
                Array::scalar(v)?,
            );
        }
    }
    let has = |k: &str| tensors.contains_key(k);
    config["mlp_bias"] = Value::from(has("model.layers.0.mlp.up_proj.bias"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["qk_norm"] = Value::from(has("model.layers.0.self_attn.q_norm.weight"));
    config["post_norm"] = Value::from(false);
    Ok(())
}

/// InternLM2 (`internlm2`): llama.cpp's q, k and v (Q / K rows permuted) back into mlx-lm's
/// fused `attention.wqkv`, per KV group its queries, then its key and value head (the rows of
/// a quantized tensor's scales and biases with them). llama.cpp writes no biases (`bias` false).
fn internlm2_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    blocks: i32,
    heads: i32,
    kv_heads: i32,
) -> Result<()> {
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `internlm2.attention.head_count` = {heads} is not a multiple of \
                 `internlm2.attention.head_count_kv` = {kv_heads}"
            ),
        ));
    }
    config["bias"] = Value::from(false);
    // mlx-lm's head is `output`, not `lm_head`: tied when the file has none.
    config["tie_word_embeddings"] = Value::from(!tensors.keys().any(|k| k.starts_with("output.")));
    for l in 0..blocks {
        let p = format!("model.layers.{l}.attention");
        for suffix in ["weight", "scales", "biases", "bias"] {
            let names = ["q", "k", "v"].map(|w| format!("{p}.gguf_{w}.{suffix}"));
            if names.iter().all(|n| !tensors.contains_key(n)) {
                continue;
            }
            if suffix == "bias" {
                return Err(gguf_err(
                    path,
                    format!("GGUF tensor blk.{l}.attn_q.bias: InternLM2 files have no biases"),
                ));
            }
            let mut parts = Vec::with_capacity(3);
            for (n, w) in names.iter().zip(["q", "k", "v"]) {
                let Some(a) = tensors.remove(n) else {
                    return Err(gguf_err(
                        path,
                        format!(
                            "GGUF tensor blk.{l}.attn_{w}.{suffix} is missing (InternLM2's q, k \
                             and v come together)"
                        ),
                    ));
                };
                parts.push(a);
            }
            let key = |k: &str| format!("internlm2.attention.{k}");
            let q = unpermute(&parts[0], heads, &names[0], &key("head_count"))?;
            let k = unpermute(&parts[1], kv_heads, &names[1], &key("head_count_kv"))?;
            let v = &parts[2];
            let cols = q.shape()[1];
            let hd = q.shape()[0] / heads;
            if k.shape() != [kv_heads * hd, cols] || v.shape() != [kv_heads * hd, cols] {
                return Err(gguf_err(
                    path,
                    format!(
                        "layer {l}: k {:?} and v {:?} do not match q {:?} for {kv_heads} key \
                         heads",
                        k.shape(),
                        v.shape(),
                        q.shape()
                    ),
                ));
            }
            let g = kv_heads;
            let q = q.reshape(&[g, heads / g, hd, cols])?;
            let k = k.reshape(&[g, 1, hd, cols])?;
            let v = v.reshape(&[g, 1, hd, cols])?;
            let qkv =
                ops::concatenate(&[&q, &k, &v], 1, None)?.reshape(&[(heads + 2 * g) * hd, cols])?;
            tensors.insert(format!("{p}.wqkv.{suffix}"), qkv);
        }
    }
    Ok(())
}

/// StableLM (`stablelm`): mlx-lm's stablelm arguments. The rotated share of the head from
/// `rope.dimension_count` (the whole head when absent, as llama.cpp); qkv bias and the
/// per-head q / k LayerNorms from the tensors, those norms unstacked into mlx-lm's
/// `norms.<head>`; the parallel residual block where the layers have no `ffn_norm` (what
/// llama.cpp's graph goes by; `use_parallel_residual` must agree). llama.cpp computes the
/// output from the embedding when a file has no `output`, which mlx-lm's stablelm always has.
fn stablelm_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    heads: i32,
    kv_heads: i32,
) -> Result<()> {
    let key = |k: &str| format!("stablelm.{k}");
    let hidden = config["hidden_size"].as_i64().unwrap_or(0) as i32;
    let hd = head_size(path, &key, hidden, heads)?;
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    let rot = meta_count(meta, path, &key("rope.dimension_count"))?.unwrap_or(hd);
    if rot <= 0 || rot > hd || rot % 2 != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {rot} must be even and in 2..={hd} (the head size)",
                key("rope.dimension_count")
            ),
        ));
    }
    config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(hd));
    config["use_qkv_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    let parallel = !tensors.contains_key("model.layers.0.post_attention_layernorm.weight");
    if let Some(p) = meta_bool(meta, path, &key("use_parallel_residual"))? {
        if p != parallel {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {p}, but the layers {} `ffn_norm`",
                    key("use_parallel_residual"),
                    if parallel { "have no" } else { "have an" }
                ),
            ));
        }
    }
    config["use_parallel_residual"] = Value::from(parallel);
    let mut qk = false;
    for (which, n) in [("q", heads), ("k", kv_heads)] {
        let layers: Vec<String> = tensors
            .keys()
            .filter(|k| k.ends_with(&format!(".self_attn.{which}_layernorm.weight")))
            .cloned()
            .collect();
        for name in layers {
            let Some(w) = tensors.remove(&name) else {
                continue;
            };
            if w.shape() != [n, hd] {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor for {name} has shape {:?}, not ({n}, {hd}) (heads, head size)",
                        w.shape()
                    ),
                ));
            }
            let stem = name.trim_end_matches(".weight");
            for h in 0..n {
                let row = w.slice(&[h, 0], &[h + 1, hd], &[1, 1])?.reshape(&[hd])?;
                tensors.insert(format!("{stem}.norms.{h}.weight"), row);
            }
            qk = true;
        }
    }
    config["qk_layernorm"] = Value::from(qk);
    if !tensors.contains_key("lm_head.weight") {
        if let Some(e) = tensors.get("model.embed_tokens.weight") {
            let e = e.clone();
            tensors.insert("lm_head.weight".into(), e);
        }
    }
    Ok(())
}

fn rwkv7_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    heads: i32,
) -> Result<()> {
    let need = |k: &str| need_count(meta, path, "rwkv7", k);
    let head = need("wkv.head_size")?;
    config["head_dim"] = Value::from(head);
    config["decay_low_rank_dim"] = Value::from(need("attention.decay_lora_rank")?);
    config["a_low_rank_dim"] = Value::from(need("attention.iclr_lora_rank")?);
    config["v_low_rank_dim"] = Value::from(need("attention.value_residual_mix_lora_rank")?);
    config["gate_low_rank_dim"] = Value::from(need("attention.gate_lora_rank")?);
    tensors.retain(|k, _| !k.starts_with("model.layers.0.attn.v_lora."));
    let names: Vec<String> = tensors.keys().cloned().collect();
    for name in names {
        let Some(t) = tensors.remove(&name) else {
            continue;
        };
        if let Some(p) = name.strip_suffix(".gguf0.weight") {
            tensors.insert(format!("{p}.lora.2.bias"), t);
        } else if let Some(p) = name.strip_suffix(".attn.gguf_lerp.weight") {
            let hidden = t.shape().last().copied().unwrap_or(0);
            if t.size() != 6 * hidden as usize {
                return Err(ModelError::Weights(vec![format!(
                    "GGUF tensor blk.{}.time_mix_lerp_fused.weight: shape {:?}, expected the six \
                     token-shift mixes (r, w, k, v, a, g) of the width",
                    p.trim_start_matches("model.layers."),
                    t.shape()
                )]));
            }
            let t = t.reshape(&[6, 1, 1, hidden])?;
            for (i, x) in ["r", "w", "k", "v", "a", "g"].iter().enumerate() {
                let one = ops::take(&t, &Array::from_slice(&[i as i32], &[1])?, 0, None)?;
                tensors.insert(format!("{p}.attn.x_{x}"), one.reshape(&[1, 1, hidden])?);
            }
        } else if name.ends_with(".attn.r_k") {
            tensors.insert(name, t.reshape(&[heads, head])?);
        } else {
            tensors.insert(name, t);
        }
    }
    if !tensors.contains_key("model.layers.0.pre_norm.weight") && blocks > 0 {
        return Err(ModelError::Weights(vec![
            "GGUF tensor token_embd_norm.weight is missing (RWKV-7's first pre-norm)".into(),
        ]));
    }
    Ok(())
}

/// The standard normal's CDF, `(1 + erf(t / sqrt 2)) / 2`, by erf's Taylor series (|x| < 4;
/// saturated beyond, where it is 1 within f64).
fn normal_cdf(t: f64) -> f64 {
    if t.is_nan() {
        return f64::NAN;
    }
    let x = t / std::f64::consts::SQRT_2;
    if x.abs() >= 4.0 {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    // erf(x) = 2 / sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    0.5 * (1.0 + sum * 2.0 / std::f64::consts::PI.sqrt())
}

/// Gemma 3n (`Gemma3NModel`'s keys) as mlx-lm's gemma3n `text_config`: layer types from the
/// per-layer flags, the head size, the sliding window and both rope bases, AltUp's stream
/// count and active stream (and `altup_correct_scale` where the file has its tensors), the
/// Laurel rank from `laurel_l`'s rows, the per-layer input width and its embedding's rows,
/// the shared-KV layer count, the widths (one, or one per layer), the softcap, and
/// `activation_sparsity_pattern` from `activation_sparsity_scale` (the converter's f32
/// standard normal quantile of each value: the value is its CDF, given to 6 decimals as the
/// released ones are; -inf is 0). llama.cpp does not clip AltUp's coefficients and the file
/// does not carry `altup_coef_clip`: none here. The stacked AltUp projections are split back
/// into mlx-lm's three of each.
fn gemma3n_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    ffn_per_layer: Option<&[i64]>,
) -> Result<()> {
    let key = |k: &str| format!("gemma3n.{k}");
    let need = |k: &str| need_count(meta, path, "gemma3n", k);
    config["layer_types"] =
        gemma_layer_types(meta, path, &key("attention.sliding_window_pattern"), blocks)?;
    config["head_dim"] = Value::from(need("attention.key_length")?);
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    config["rope_local_base_freq"] = meta_f64(meta, &key("rope.freq_base_swa"))
        .map_or(config["rope_theta"].clone(), Value::from);
    let inputs = need("altup.num_inputs")?;
    let active = meta_layer_count(meta, path, &key("altup.active_idx"), inputs - 1)?.unwrap_or(0);
    config["altup_num_inputs"] = Value::from(inputs);
    config["altup_active_idx"] = Value::from(active);
    config["altup_coef_clip"] = Value::Null;
    let layer0 = |t: &str| tensors.get(&format!("model.layers.0.{t}"));
    config["altup_correct_scale"] = Value::from(layer0("altup.correct_output_scale").is_some());
    config["laurel_rank"] = match layer0("laurel.linear_left.weight") {
        Some(t) => Value::from(t.shape()[0]),
        None => {
            return Err(ModelError::Weights(vec![
                "GGUF tensor blk.0.laurel_l.weight is missing".into(),
            ]))
        }
    };
    config["hidden_size_per_layer_input"] = Value::from(need("embedding_length_per_layer_input")?);
    config["vocab_size_per_layer_input"] = match tensors.get("model.embed_tokens_per_layer.weight")
    {
        Some(t) => Value::from(t.shape()[0]),
        None => {
            return Err(ModelError::Weights(vec![
                "GGUF tensor per_layer_token_embd.weight is missing".into(),
            ]))
        }
    };
    config["num_kv_shared_layers"] = Value::from(
        meta_layer_count(meta, path, &key("attention.shared_kv_layers"), blocks)?.unwrap_or(0),
    );
    if let Some(per) = ffn_per_layer {
        if per.len() != blocks as usize {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` has {} widths for {blocks} layers",
                    key("feed_forward_length"),
                    per.len()
                ),
            ));
        }
        config["intermediate_size"] = json!(per);
    }
    config["final_logit_softcapping"] =
        meta_f64(meta, &key("final_logit_softcapping")).map_or(Value::Null, Value::from);
    let scales: Vec<f32> = match meta.get(&key("activation_sparsity_scale")) {
        Some(GgufValue::Array(a)) if a.ndim() == 1 && a.size() == blocks as usize => a
            .astype(Dtype::Float32)
            .and_then(|b| b.to_vec::<f32>())
            .map_err(|e| gguf_err(path, format!("metadata `activation_sparsity_scale`: {e}")))?,
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must give one value for each of the {blocks} layers",
                    key("activation_sparsity_scale")
                ),
            ))
        }
    };
    let pattern: Vec<f64> = scales
        .iter()
        .map(|&t| (normal_cdf(f64::from(t)) * 1e6).round() / 1e6)
        .collect();
    if pattern.iter().any(|p| !(0.0..1.0).contains(p)) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {scales:?}: not quantiles of a sparsity in [0, 1)",
                key("activation_sparsity_scale")
            ),
        ));
    }
    config["activation_sparsity_pattern"] = json!(pattern);
    // The converter's stacks (3, hidden, hidden), and their quantization, back into three.
    for (stacked, name) in [
        ("model.gguf_altup_proj", "model.altup_projections"),
        (
            "model.gguf_altup_unembd_proj",
            "model.altup_unembed_projections",
        ),
    ] {
        for suffix in ["weight", "scales", "biases"] {
            let Some(t) = tensors.remove(&format!("{stacked}.{suffix}")) else {
                continue;
            };
            let n = t.shape().first().copied().unwrap_or(0);
            if n != inputs - 1 {
                return Err(ModelError::Weights(vec![format!(
                    "GGUF tensor {}.{suffix}: {n} projections stacked, expected `{}` - 1 = {}",
                    stacked.trim_start_matches("model.gguf_"),
                    key("altup.num_inputs"),
                    inputs - 1
                )]));
            }
            for i in 0..n {
                let one = ops::take(&t, &Array::scalar(i)?, 0, None)?;
                tensors.insert(format!("{name}.{i}.{suffix}"), one);
            }
        }
    }
    require_context(config, path, &key("context_length"))?;
    Ok(())
}

/// Gemma 4 (`Gemma4Model`'s keys) as mlx-lm's gemma4_text args, for the dense models: layer
/// types from `attention.sliding_window_pattern`, the sliding and full layers' head sizes
/// (`key_length_swa`, `key_length`), the shared-KV layer count, the per-layer input width (and
/// its embedding's rows), double-wide MLPs from the per-layer `feed_forward_length`, the
/// softcap (none when absent, as llama.cpp), and `rope_parameters`: the full layers'
/// proportional rope with the rotated fraction `rope_freqs` gives (1 per rotated frequency,
/// 1e30 per other), the sliding layers' default rope over the whole head. Refused, naming
/// the key or tensor: experts (26B), K = V layers (a KV layer without `attn_v`), different KV
/// head counts per kind, sliding layers rotating part of a head (mlx-lm rotates it whole).
fn gemma4_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    rope_tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    ffn_per_layer: Option<&[i64]>,
) -> Result<()> {
    let key = |k: &str| format!("gemma4.{k}");
    let need = |k: &str| need_count(meta, path, "gemma4", k);
    if meta.contains_key(&key("expert_count")) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: Gemma 4's mixture of experts (26B) is not mapped",
                key("expert_count")
            ),
        ));
    }
    config["layer_types"] =
        gemma_layer_types(meta, path, &key("attention.sliding_window_pattern"), blocks)?;
    let (head, global) = (
        need("attention.key_length_swa")?,
        need("attention.key_length")?,
    );
    config["head_dim"] = Value::from(head);
    config["global_head_dim"] = Value::from(global);
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    let shared =
        meta_layer_count(meta, path, &key("attention.shared_kv_layers"), blocks)?.unwrap_or(0);
    config["num_kv_shared_layers"] = Value::from(shared);
    let per_layer = meta_layer_count(
        meta,
        path,
        &key("embedding_length_per_layer_input"),
        i32::MAX,
    )?
    .unwrap_or(0);
    config["hidden_size_per_layer_input"] = Value::from(per_layer);
    config["vocab_size_per_layer_input"] = match tensors.get("model.embed_tokens_per_layer.weight")
    {
        Some(t) => Value::from(t.shape()[0]),
        None => config["vocab_size"].clone(),
    };
    let first_shared = i64::from(blocks - shared);
    let base = config["intermediate_size"].as_i64().unwrap_or(0);
    config["use_double_wide_mlp"] = Value::from(match ffn_per_layer {
        None => false,
        Some(per) => {
            let wide =
                (0..per.len() as i64).any(|l| l >= first_shared && per[l as usize] == 2 * base);
            let ok = per.len() == blocks as usize
                && per.iter().enumerate().all(|(l, &n)| {
                    n == if wide && l as i64 >= first_shared {
                        2 * base
                    } else {
                        base
                    }
                });
            if !ok {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` is {per:?}: mlx-lm's gemma4_text has one width, doubled \
                         on the {shared} shared-KV layers or not",
                        key("feed_forward_length")
                    ),
                ));
            }
            wide
        }
    });
    for l in 0..first_shared {
        let p = format!("model.layers.{l}.self_attn");
        if tensors.contains_key(&format!("{p}.k_proj.weight"))
            && !tensors.contains_key(&format!("{p}.v_proj.weight"))
        {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor blk.{l}.attn_v.weight is missing: K = V attention (Gemma 4 31B) is \
                 not mapped"
            )]));
        }
    }
    if let Some(d) = meta_count(meta, path, &key("rope.dimension_count_swa"))? {
        if d != head {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {d}: a sliding layer rotating part of its {head}-wide \
                     heads, which mlx-lm's gemma4_text rotates whole",
                    key("rope.dimension_count_swa")
                ),
            ));
        }
    }
    let full_theta = config["rope_theta"].clone();
    let swa_theta =
        meta_f64(meta, &key("rope.freq_base_swa")).map_or(full_theta.clone(), Value::from);
    let rotated = match rope_tensors.remove("rope_freqs.weight") {
        None => 1.0,
        Some(f) => {
            let v = f
                .astype(Dtype::Float32)
                .and_then(|a| a.to_vec::<f32>())
                .map_err(|e| gguf_err(path, format!("tensor rope_freqs: {e}")))?;
            let n = v.iter().take_while(|&&x| x == 1.0).count();
            if v.len() as i64 * 2 != i64::from(global) || v[n..].iter().any(|&x| x < 1e30) {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor rope_freqs: expected {} factors, 1 for each rotated frequency \
                         then 1e30, as Gemma 4's converter writes them",
                        global / 2
                    ),
                ));
            }
            2.0 * n as f64 / f64::from(global)
        }
    };
    config["rope_parameters"] = json!({
        "full_attention": {
            "rope_type": "proportional",
            "rope_theta": full_theta,
            "partial_rotary_factor": rotated,
        },
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": swa_theta,
            "partial_rotary_factor": 1.0,
        },
    });
    config["final_logit_softcapping"] =
        meta_f64(meta, &key("final_logit_softcapping")).map_or(Value::Null, Value::from);
    config["attention_k_eq_v"] = Value::from(false);
    config["enable_moe_block"] = Value::from(false);
    require_context(config, path, &key("context_length"))?;
    Ok(())
}

/// Granite 4.0 H (`GraniteHybridModel`'s keys) as mlx-lm's granitemoehybrid args: layer
/// types from the per-layer `head_count_kv` (0: Mamba), the Mamba-2 sizes from `ssm.*`
/// (heads = `time_step_rank`, head size = `inner_size / heads`), Granite's multipliers from
/// its scales, experts and the shared expert's width where there are experts (the converter's
/// split `ffn_gate_shexp` / `ffn_up_shexp` joined back into `input_linear`, gate first, rows
/// with their quantization), rope only where `rope.scaling.finetuned` says (llama.cpp's flag;
/// absent: none, Granite 4.0 H's `nope`).
fn granitehybrid_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    per: &[i64],
) -> Result<()> {
    let key = |k: &str| format!("granitehybrid.{k}");
    let need = |k: &str| need_count(meta, path, "granitehybrid", k);
    if per.len() != blocks as usize {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` must list a head count for each of the {blocks} layers (0 for a \
                 Mamba layer)",
                key("attention.head_count_kv")
            ),
        ));
    }
    let types: Vec<&str> = per
        .iter()
        .map(|&n| if n == 0 { "mamba" } else { "attention" })
        .collect();
    config["layer_types"] = json!(types);
    let (heads, inner) = (need("ssm.time_step_rank")?, need("ssm.inner_size")?);
    if inner % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} does not divide into `{}` = {heads} heads",
                key("ssm.inner_size"),
                key("ssm.time_step_rank")
            ),
        ));
    }
    config["mamba_n_heads"] = Value::from(heads);
    config["mamba_d_head"] = Value::from(inner / heads);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    config["mamba_n_groups"] = Value::from(need("ssm.group_count")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_conv_bias"] = Value::from(has(".mamba.conv1d.bias"));
    config["mamba_proj_bias"] = Value::from(has(".mamba.in_proj.bias"));
    config["attention_bias"] = Value::from(has(".self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".mlp.down_proj.bias"));
    for (k, name) in [
        ("attention.scale", "attention_multiplier"),
        ("embedding_scale", "embedding_multiplier"),
        ("residual_scale", "residual_multiplier"),
        ("logit_scale", "logits_scaling"),
    ] {
        let v = meta_f64(meta, &key(k))
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing or not a positive number", key(k)),
                )
            })?;
        config[name] = Value::from(v);
    }
    let rope = match meta.get(&key("rope.scaling.finetuned")) {
        None => false,
        Some(GgufValue::Array(a)) if a.size() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.item::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `rope.scaling.finetuned`: {e}")))?,
        Some(_) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is not a flag", key("rope.scaling.finetuned")),
            ))
        }
    };
    config["position_embedding_type"] = Value::from(if rope { "rope" } else { "nope" });
    if has(".block_sparse_moe.router.layer.weight") {
        config["num_local_experts"] = Value::from(need("expert_count")?);
        config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
        config["shared_intermediate_size"] =
            Value::from(need("expert_shared_feed_forward_length")?);
        for l in 0..blocks {
            let p = format!("model.layers.{l}.shared_mlp");
            for suffix in ["weight", "scales", "biases"] {
                let (g, u) = (
                    tensors.remove(&format!("{p}.gguf_gate.{suffix}")),
                    tensors.remove(&format!("{p}.gguf_up.{suffix}")),
                );
                match (g, u) {
                    (None, None) => {}
                    (Some(g), Some(u)) => {
                        let joined = ops::concatenate(&[&g, &u], 0, None)?;
                        tensors.insert(format!("{p}.input_linear.{suffix}"), joined);
                    }
                    _ => {
                        return Err(ModelError::Weights(vec![format!(
                            "GGUF tensors blk.{l}.ffn_gate_shexp.{suffix} and \
                             blk.{l}.ffn_up_shexp.{suffix}: one without the other"
                        )]))
                    }
                }
            }
        }
    }
    Ok(())
}

/// Llama 4 (`Llama4Model`'s keys) as mlx-lm's llama4 `text_config`: the dense layers' width
/// is `feed_forward_length` (`intermediate_size_mlp`), the experts' is
/// `expert_feed_forward_length` (`intermediate_size`). What llama.cpp fixes rather than reads
/// is set as it fixes it: chunks of 8192 tokens on three of every four layers, the fourth
/// global without rope (mlx-lm's fixed pattern), the attention temperature (mlx-lm's
/// defaults, llama.cpp's values), and q/k norms unless there are 128 experts (Maverick). A
/// file whose `attention.sliding_window` is 0 (every layer global with rope: MobileLLM) is
/// refused: mlx-lm's llama4 has no such layout.
fn llama4_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
) -> Result<()> {
    let key = |k: &str| format!("llama4.{k}");
    let need = |k: &str| need_count(meta, path, "llama4", k);
    if meta_f64(meta, &key("attention.sliding_window")) == Some(0.0) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is 0 (every layer global, with rope): mlx-lm's llama4 makes \
                 every 4th layer global without rope and chunks the others",
                key("attention.sliding_window")
            ),
        ));
    }
    // llama.cpp's pattern (every 4th layer global) and one rope base: mlx-lm's fixed layout.
    if let Some(GgufValue::Array(a)) = meta.get(&key("attention.sliding_window_pattern")) {
        let flags = a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `sliding_window_pattern`: {e}")))?;
        if !(0..flags.len()).all(|i| flags[i] == ((i + 1) % 4 != 0)) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not every 4th layer global, mlx-lm's llama4 layout",
                    key("attention.sliding_window_pattern")
                ),
            ));
        }
    }
    if meta_f64(meta, &key("rope.freq_base_swa"))
        .is_some_and(|b| Some(b) != config["rope_theta"].as_f64())
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` differs from the global base; mlx-lm's llama4 has one",
                key("rope.freq_base_swa")
            ),
        ));
    }
    let experts = need("expert_count")?;
    config["intermediate_size_mlp"] = config["intermediate_size"].clone();
    config["intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["interleave_moe_layer_step"] = Value::from(need("interleave_moe_layer_step")?);
    config["num_local_experts"] = Value::from(experts);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["attention_chunk_size"] = Value::from(8192);
    config["use_qk_norm"] = Value::from(experts != 128);
    config["attention_bias"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_proj.bias"));
    require_context(config, path, &key("context_length"))?;
    if config.get("rope_scaling").is_none() {
        config["rope_scaling"] = Value::Null;
    }
    Ok(())
}

/// llama.cpp's fused `ffn_gate_up_exps` `(experts, 2 * ffn, hidden)` (and its quantization
/// scales and biases, row by row alike) split in halves along the rows into mlx-lm's
/// `switch_mlp.gate_proj` and `switch_mlp.up_proj`, gate first (mistral4.py's sanitize).
fn split_gate_up(tensors: &mut BTreeMap<String, Array>) -> Result<()> {
    let fused: Vec<String> = tensors
        .keys()
        .filter(|k| k.contains(".switch_mlp.gate_up_proj."))
        .cloned()
        .collect();
    for k in fused {
        let Some(a) = tensors.remove(&k) else {
            continue;
        };
        let rows = if a.ndim() == 3 { a.shape()[1] } else { -1 };
        if rows <= 0 || rows % 2 != 0 {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor {k}: shape {:?} is not (experts, 2 * ffn, hidden)",
                a.shape()
            )]));
        }
        let parts = ops::split_equal(&a, 2, 1, None)?;
        let [gate, up] = <[Array; 2]>::try_from(parts)
            .map_err(|_| ModelError::Weights(vec![format!("GGUF tensor {k}: split failed")]))?;
        tensors.insert(k.replace(".gate_up_proj.", ".gate_proj."), gate);
        tensors.insert(k.replace(".gate_up_proj.", ".up_proj."), up);
    }
    Ok(())
}

/// Llama 3's rope scaling from llama.cpp's `rope_freqs` tensor. The converter stores only the
/// per-frequency factors (1 above the high-frequency wavelength, `factor` below the
/// low-frequency one, a smooth blend between) that mlx-lm's `Llama3RoPE` computes from
/// `factor`, `low_freq_factor`, `high_freq_factor` and `original_max_position_embeddings`: the
/// parameters are recovered (low_freq_factor 1, as every Llama 3 has; the other two solved
/// from the blended factors, `high_freq_factor` 4 when fewer than two are blended) and
/// checked by recomputing every factor; factors no such parameters give are refused.
fn llama3_rope(config: &mut Value, f: &Array, path: &Path, default_head: i32) -> Result<()> {
    let bad = |why: String| gguf_err(path, format!("tensor rope_freqs: {why}"));
    let got: Vec<f64> = f
        .astype(Dtype::Float32)
        .and_then(|a| a.to_vec::<f32>())
        .map_err(|e| bad(e.to_string()))?
        .into_iter()
        .map(f64::from)
        .collect();
    let dim = config["head_dim"]
        .as_i64()
        .unwrap_or(i64::from(default_head));
    if f.ndim() != 1 || got.len() as i64 * 2 != dim {
        return Err(bad(format!(
            "shape {:?}, expected ({},) for head size {dim}",
            f.shape(),
            dim / 2
        )));
    }
    if got.iter().any(|x| !x.is_finite() || *x < 1.0) {
        return Err(bad("a factor below 1 or not finite".into()));
    }
    let factor = got.iter().cloned().fold(1.0, f64::max);
    if factor == 1.0 {
        return Ok(()); // no scaling
    }
    let base = config["rope_theta"].as_f64().unwrap_or(10000.0);
    let wavelen: Vec<f64> = (0..got.len())
        .map(|i| 2.0 * std::f64::consts::PI * base.powf(2.0 * i as f64 / dim as f64))
        .collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
    // smooth = (old / wavelen - low) / (high - low), from a blended factor r.
    let smooth = |r: f64| (1.0 / r - 1.0 / factor) / (1.0 - 1.0 / factor);
    let blended: Vec<usize> = (0..got.len())
        .filter(|&i| !close(got[i], 1.0) && !close(got[i], factor))
        .collect();
    let low = 1.0;
    let (old, high) = match blended.as_slice() {
        [] => {
            // No blended band: a step at the original context, which low = high gives (Llama 4
            // Scout's 1 and 1; mlx-lm's Llama3RoPE then blends nothing). Any context between
            // the two classes gives the same factors.
            let lo = (0..got.len())
                .filter(|&i| close(got[i], 1.0))
                .map(|i| wavelen[i])
                .fold(0.0, f64::max);
            let hi = (0..got.len())
                .filter(|&i| close(got[i], factor))
                .map(|i| wavelen[i])
                .fold(f64::INFINITY, f64::min);
            let old = if lo < 8192.0 && 8192.0 < hi {
                8192.0
            } else {
                ((lo + hi.min(lo * 2.0)) / 2.0).round()
            };
            (old, low)
        }
        [i] => {
            let high = 4.0;
            (((3.0 * smooth(got[*i]) + 1.0) * wavelen[*i]).round(), high)
        }
        [.., _] => {
            // s = a / wavelen - b with a = old / (high - low), b = low / (high - low).
            let (i, j) = (blended[0], blended[blended.len() - 1]);
            let (si, sj) = (smooth(got[i]), smooth(got[j]));
            let a = (si - sj) / (1.0 / wavelen[i] - 1.0 / wavelen[j]);
            let b = a / wavelen[i] - si;
            if !(b > 0.0 && a > 0.0) {
                return Err(bad("the blended factors are not Llama 3's".into()));
            }
            let high = low + 1.0 / b;
            let high = format!("{high:.6e}").parse::<f64>().unwrap_or(high);
            ((a / b).round(), high)
        }
    };
    let expect = |w: f64| -> f64 {
        if w < old / high {
            1.0
        } else if w > old / low {
            factor
        } else {
            let s = (old / w - low) / (high - low);
            1.0 / ((1.0 - s) / factor + s)
        }
    };
    if let Some(i) = (0..got.len()).find(|&i| !close(expect(wavelen[i]), got[i])) {
        return Err(bad(format!(
            "factor {i} is {}, which no Llama 3 rope scaling gives (recovered factor {factor}, \
             low 1, high {high}, original context {old})",
            got[i]
        )));
    }
    config["rope_scaling"] = json!({
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": old as i64,
    });
    Ok(())
}

/// llama.cpp's `qwen3next` as mlx-lm's qwen3_next, and `qwen35` / `qwen35moe` as qwen3_5 /
/// qwen3_5_moe: the gated-delta sizes from the `ssm.*` keys (`state_size` the key head size,
/// `group_count` the key heads, `time_step_rank` the value heads, `inner_size` their width),
/// the layer pattern from `full_attention_interval` (an `attention.recurrent_layers` list must
/// follow it), experts renormalized as llama.cpp does; and the tensors back in mlx-lm's form:
/// the conv kernel given its trailing axis, `ssm_dt.bias` as `dt_bias`; for qwen3next
/// `attn_qkv` / `attn_gate` regrouped per key head into `in_proj_qkvz`; for Qwen 3.5 they are
/// `in_proj_qkv` / `in_proj_z`, and the value heads, which the converter reorders from grouped
/// by key head to tiled ([`untile_v_heads`]), are put back in every tensor it reorders.
fn qwen3next_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    arch: &str,
) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| -> Result<i32> {
        meta_count(meta, path, &key(k))?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let (nk, dk, nv, inner) = (
        need("ssm.group_count")?,
        need("ssm.state_size")?,
        need("ssm.time_step_rank")?,
        need("ssm.inner_size")?,
    );
    if nk <= 0 || dk <= 0 || nv <= 0 || inner <= 0 || inner % nv != 0 || nv % nk != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata: `ssm.inner_size` {inner}, `ssm.time_step_rank` {nv}, \
                 `ssm.state_size` {dk} and `ssm.group_count` {nk} do not divide into heads"
            ),
        ));
    }
    let dv = inner / nv;
    let interval = meta_count(meta, path, &key("full_attention_interval"))?.unwrap_or(4);
    if interval <= 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is {interval}",
                key("full_attention_interval")
            ),
        ));
    }
    if let Some(GgufValue::Array(a)) = meta.get(&key("attention.recurrent_layers")) {
        let flags: Vec<bool> = a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| gguf_err(path, format!("metadata `attention.recurrent_layers`: {e}")))?;
        let ok =
            (0..blocks as usize).all(|i| flags.get(i) == Some(&((i as i32 + 1) % interval != 0)));
        if !ok {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not every {interval}th layer full attention, the only \
                     pattern mlx-lm's {} has",
                    key("attention.recurrent_layers"),
                    config["model_type"].as_str().unwrap_or(arch)
                ),
            ));
        }
    }
    let head_dim = config["head_dim"].as_i64().unwrap_or(0);
    let rot = need("rope.dimension_count")?;
    if head_dim <= 0 {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("attention.key_length")),
        ));
    }
    let partial = f64::from(rot) / head_dim as f64;
    let qwen35 = arch != "qwen3next";
    config["linear_num_key_heads"] = Value::from(nk);
    config["linear_key_head_dim"] = Value::from(dk);
    config["linear_num_value_heads"] = Value::from(nv);
    config["linear_value_head_dim"] = Value::from(dv);
    config["linear_conv_kernel_dim"] = Value::from(need("ssm.conv_kernel")?);
    config["full_attention_interval"] = Value::from(interval);
    config["attention_bias"] = Value::from(
        (0..blocks)
            .any(|l| tensors.contains_key(&format!("model.layers.{l}.self_attn.q_proj.bias"))),
    );
    if qwen35 {
        // qwen3_5's rope settings are `rope_parameters` (its defaults otherwise: theta 1e5,
        // a quarter rotated). Text positions make the interleaved MRoPE of
        // `rope.dimension_sections` plain rope, which is what mlx-lm's text model applies.
        let mut rope = json!({
            "type": "default",
            "rope_theta": config["rope_theta"].clone(),
            "partial_rotary_factor": partial,
        });
        if let Some(GgufValue::Array(a)) = meta.get(&key("rope.dimension_sections")) {
            let s = a
                .astype(Dtype::Int64)
                .and_then(|b| b.to_vec::<i64>())
                .map_err(|e| gguf_err(path, format!("metadata `rope.dimension_sections`: {e}")))?;
            rope["mrope_section"] = json!(s.iter().take(3).collect::<Vec<_>>());
        }
        config["rope_parameters"] = rope;
    } else {
        config["partial_rotary_factor"] = Value::from(partial);
    }
    if arch != "qwen35" {
        config["num_experts"] = Value::from(need("expert_count")?);
        config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
        config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
        config["shared_expert_intermediate_size"] =
            Value::from(need("expert_shared_feed_forward_length")?);
        config["decoder_sparse_step"] = Value::from(1);
        config["norm_topk_prob"] = Value::from(true);
    }
    if arch == "qwen3next" {
        let dense: Vec<i32> = (0..blocks)
            .filter(|l| tensors.contains_key(&format!("model.layers.{l}.mlp.gate_proj.weight")))
            .collect();
        config["mlp_only_layers"] = json!(dense);
    }

    let bad = |what: String| gguf_err(path, what);
    let r = nv / nk;
    let qk_rows = 2 * nk * dk;
    // Value heads tiled -> grouped along `axis`, each head `len / nv` wide (whole quantization
    // groups of a packed tensor's columns, or the error says so).
    let untile = |a: &Array, axis: usize, name: &str| -> Result<Array> {
        if r == 1 {
            return Ok(a.clone());
        }
        let len = a.shape().get(axis).copied().unwrap_or(0);
        if len <= 0 || len % nv != 0 {
            return Err(bad(format!(
                "GGUF tensor {name}: shape {:?} does not split into {nv} value heads along axis {axis}",
                a.shape()
            )));
        }
        untile_v_heads(a, axis, nk, r, len / nv)
    };
    // The V part (after q and k, `2 * nk * dk` rows) of a (rows, ..) tensor, put back in order.
    let untile_v_rows = |a: &Array, name: &str| -> Result<Array> {
        let rows = a.shape().first().copied().unwrap_or(0);
        if rows != qk_rows + nv * dv {
            return Err(bad(format!(
                "GGUF tensor {name}: shape {:?}, expected {} rows (2 x {nk} x {dk} + {nv} x {dv})",
                a.shape(),
                qk_rows + nv * dv
            )));
        }
        if r == 1 {
            return Ok(a.clone());
        }
        let parts = ops::split_at(a, &[qk_rows], 0, None)?;
        let [qk, v] = <[Array; 2]>::try_from(parts)
            .map_err(|_| bad(format!("GGUF tensor {name}: split failed")))?;
        let v = untile(&v, 0, name)?;
        Ok(ops::concatenate(&[&qk, &v], 0, None)?)
    };
    let names: Vec<String> = tensors.keys().cloned().collect();
    for k in names {
        let take = |t: &mut BTreeMap<String, Array>| t.remove(&k).ok_or_else(|| bad(k.clone()));
        let g = gguf_linear_attn_name(&k);
        if let Some(p) = k.strip_suffix(".linear_attn.gguf_dt.bias") {
            let a = take(tensors)?;
            let a = if qwen35 { untile(&a, 0, &g)? } else { a };
            tensors.insert(format!("{p}.linear_attn.dt_bias"), a);
        } else if qwen35 && k.ends_with(".linear_attn.A_log") {
            let a = untile(&take(tensors)?, 0, &g)?;
            tensors.insert(k, a);
        } else if k.ends_with(".linear_attn.conv1d.weight") {
            let a = take(tensors)?;
            let a = match a.shape().as_slice() {
                &[c, w] => {
                    let a = if qwen35 { untile_v_rows(&a, &g)? } else { a };
                    a.reshape(&[c, w, 1])?
                }
                s => {
                    return Err(bad(format!(
                        "GGUF tensor {g}: shape {s:?}, expected (channels, kernel)"
                    )))
                }
            };
            tensors.insert(k, a);
        } else if qwen35 {
            let Some((p, rest)) = k.split_once(".linear_attn.") else {
                continue;
            };
            let Some((part, suffix)) = rest.split_once('.') else {
                continue;
            };
            let (to, a) = match part {
                "gguf_qkv" => ("in_proj_qkv", untile_v_rows(&take(tensors)?, &g)?),
                "gguf_z" => ("in_proj_z", untile(&take(tensors)?, 0, &g)?),
                "in_proj_b" | "in_proj_a" => (part, untile(&take(tensors)?, 0, &g)?),
                "out_proj" => {
                    let a = take(tensors)?;
                    let last = a.ndim().saturating_sub(1);
                    ("out_proj", untile(&a, last, &g)?)
                }
                _ => continue,
            };
            tensors.insert(format!("{p}.linear_attn.{to}.{suffix}"), a);
        } else if let Some(rest) = k.split_once(".linear_attn.gguf_qkv.") {
            let (p, suffix) = rest;
            let qkv = tensors.remove(&k).ok_or_else(|| bad(k.clone()))?;
            let zk = format!("{p}.linear_attn.gguf_z.{suffix}");
            let z = tensors
                .remove(&zk)
                .ok_or_else(|| bad(format!("GGUF tensor {g} without its attn_gate")))?;
            let cols = qkv.shape().last().copied().unwrap_or(0);
            let rows = qkv.shape().first().copied().unwrap_or(0);
            if qkv.ndim() != 2
                || z.ndim() != 2
                || rows != nk * (2 * dk + r * dv)
                || z.shape()[0] != nk * r * dv
                || z.shape()[1] != cols
            {
                return Err(bad(format!(
                    "GGUF tensor {g} {:?} / attn_gate {:?} are not ({nk} key heads x (2 x {dk} + {} ), \
                     columns) / ({nk} x {}, columns)",
                    qkv.shape(),
                    z.shape(),
                    r * dv,
                    r * dv
                )));
            }
            let parts = ops::split_at(&qkv, &[nk * dk, 2 * nk * dk], 0, None)?;
            let [q, kk, v] = <[Array; 3]>::try_from(parts)
                .map_err(|_| bad(format!("GGUF tensor {g}: split failed")))?;
            let q = q.reshape(&[nk, dk, cols])?;
            let kk = kk.reshape(&[nk, dk, cols])?;
            let v = v.reshape(&[nk, r * dv, cols])?;
            let z = z.reshape(&[nk, r * dv, cols])?;
            let joined = ops::concatenate(&[&q, &kk, &v, &z], 1, None)?;
            let joined = joined.reshape(&[nk * (2 * dk + 2 * r * dv), cols])?;
            tensors.insert(format!("{p}.linear_attn.in_proj_qkvz.{suffix}"), joined);
        }
    }
    if let Some(k) = tensors.keys().find(|k| k.contains(".gguf_")) {
        return Err(bad(format!("GGUF tensor for {k} without its partner")));
    }
    Ok(())
}

/// The GGUF name (`blk.N.attn_qkv.weight`) of an mlx-lm gated-delta tensor name, for messages.
fn gguf_linear_attn_name(mapped: &str) -> String {
    let Some((layer, rest)) = mapped
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
    else {
        return mapped.to_string();
    };
    let (part, suffix) = match rest.rsplit_once('.') {
        Some((p, s)) if !rest.ends_with("A_log") && !rest.ends_with("dt_bias") => (p, s),
        _ => (rest, ""),
    };
    let gguf = match part {
        "linear_attn.A_log" => Some("ssm_a"),
        "linear_attn.dt_bias" => Some("ssm_dt.bias"),
        "linear_attn.in_proj_ba" => Some("ssm_ba"),
        _ => QWEN35_PARTS
            .iter()
            .find(|(_, to)| *to == part)
            .map(|(from, _)| *from),
    };
    match (gguf, suffix) {
        (Some(g), "") => format!("blk.{layer}.{g}"),
        (Some(g), s) => format!("blk.{layer}.{g}.{s}"),
        (None, _) => mapped.to_string(),
    }
}

/// Undoes llama.cpp's value-head reorder for Qwen 3.5 (`_LinearAttentionVReorderBase`): along
/// `axis`, heads stored tiled `(per_key, key_heads, width)` go back to mlx-lm's grouped order
/// `(key_heads, per_key, width)`.
fn untile_v_heads(
    a: &Array,
    axis: usize,
    key_heads: i32,
    per_key: i32,
    width: i32,
) -> Result<Array> {
    let shape = a.shape();
    let mut split = shape[..axis].to_vec();
    split.extend([per_key, key_heads, width]);
    split.extend_from_slice(&shape[axis + 1..]);
    let v = ops::reshape(a, &split, None)?;
    let v = ops::swapaxes(&v, axis as i32, axis as i32 + 1, None)?;
    Ok(ops::reshape(&v, &shape, None)?)
}

/// A boolean metadata value (`None` when absent).
fn meta_bool(meta: &GgufMetadata, path: &Path, key: &str) -> Result<Option<bool>> {
    match meta.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) if a.size() == 1 => a
            .astype(Dtype::Bool)
            .and_then(|b| b.item::<bool>())
            .map(Some)
            .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}"))),
        Some(_) => Err(gguf_err(path, format!("metadata `{key}` is not a boolean"))),
    }
}

/// GLM-4.5 (`glm4moe`) and dots.llm1 (`dots1`): mlx-lm's glm4_moe / dots1 arguments from the
/// keys their converters write; both route with DeepSeek V3's sigmoid and correction bias
/// (a softmax `expert_gating_func` is refused), group-limited, with shared experts after
/// `leading_dense_block_count` dense layers. GLM-4.5's head size is `key_length` (its
/// `rope.dimension_count` is the rotated part).
fn grouped_moe_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    arch: &str,
    default_head: i32,
) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let opt = |k: &str| meta_count(meta, path, &key(k));
    let need = |k: &str| -> Result<i32> {
        opt(k)?.ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    match opt("expert_gating_func")? {
        None | Some(2) => {}
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {g}; mlx-lm's {arch} routes with sigmoid (2)",
                    key("expert_gating_func")
                ),
            ))
        }
    }
    let scale = match meta_f64(meta, &key("expert_weights_scale")) {
        None if meta.contains_key(&key("expert_weights_scale")) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is not a number", key("expert_weights_scale")),
            ))
        }
        None => 1.0,
        Some(v) if v.is_finite() => v,
        Some(v) => {
            return Err(gguf_err(
                path,
                format!("metadata `{}` is {v}", key("expert_weights_scale")),
            ))
        }
    };
    let head_dim = opt("attention.key_length")?.unwrap_or(default_head);
    config["head_dim"] = Value::from(head_dim);
    config["n_routed_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["n_shared_experts"] = Value::from(opt("expert_shared_count")?.unwrap_or(0));
    config["first_k_dense_replace"] = Value::from(opt("leading_dense_block_count")?.unwrap_or(0));
    config["n_group"] = Value::from(opt("expert_group_count")?.unwrap_or(1));
    config["topk_group"] = Value::from(opt("expert_group_used_count")?.unwrap_or(1));
    config["routed_scaling_factor"] = Value::from(scale);
    config["norm_topk_prob"] =
        Value::from(meta_bool(meta, path, &key("expert_weights_norm"))?.unwrap_or(false));
    config["rope_scaling"] = Value::Null;
    let has = |t: &str| tensors.contains_key(t);
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    if arch == "glm4moe" {
        config["use_qk_norm"] = Value::from(has("model.layers.0.self_attn.q_norm.weight"));
        let rot = opt("rope.dimension_count")?.unwrap_or(head_dim / 2);
        config["partial_rotary_factor"] = Value::from(f64::from(rot) / f64::from(head_dim));
    } else {
        config["scoring_func"] = Value::from("noaux_tc");
    }
    Ok(())
}

/// Phi-3's long rope as llama.cpp writes it (`rope_factors_long` / `rope_factors_short`
/// tensors, `rope.scaling.original_context_length`, `rope.scaling.attn_factor`) back into
/// mlx-lm's `rope_scaling` (type `longrope`) and `original_max_position_embeddings`. mlx-lm's
/// phimoe reads the scale from `long_mscale`: the file's attention factor (what llama.cpp
/// multiplies by; a checkpoint's own mscale, when it differs, is not in the file). Both
/// factor tensors or neither.
fn long_rope(
    config: &mut Value,
    rope: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    arch: &str,
) -> Result<()> {
    let long = rope.remove("rope_factors_long.weight");
    let short = rope.remove("rope_factors_short.weight");
    let (long, short) = match (long, short) {
        (None, None) => return Ok(()),
        (Some(l), Some(s)) => (l, s),
        _ => {
            return Err(gguf_err(
                path,
                "rope_factors_long and rope_factors_short come together",
            ))
        }
    };
    let list = |a: &Array, name: &str| -> Result<Value> {
        let v = a
            .astype(Dtype::Float32)
            .and_then(|a| a.to_vec::<f32>())
            .map_err(|e| gguf_err(path, format!("tensor {name}: {e}")))?;
        if a.ndim() != 1 || v.iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return Err(gguf_err(
                path,
                format!("tensor {name}: expected a vector of positive factors"),
            ));
        }
        Ok(Value::from(
            v.into_iter().map(f64::from).collect::<Vec<_>>(),
        ))
    };
    let key = |k: &str| format!("{arch}.{k}");
    // MiniCPM3's converter writes no original context: llama.cpp's is the context length.
    let orig_key = if arch == "minicpm3" {
        "context_length"
    } else {
        "rope.scaling.original_context_length"
    };
    let orig = meta_count(meta, path, &key(orig_key))?.ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing (long rope)", key(orig_key)),
        )
    })?;
    let mut rs = json!({
        "type": "longrope",
        "long_factor": list(&long, "rope_factors_long")?,
        "short_factor": list(&short, "rope_factors_short")?,
    });
    if arch == "phimoe" {
        let m = match meta_f64(meta, &key("rope.scaling.attn_factor")) {
            Some(v) if v.is_finite() && v > 0.0 => Value::from(v),
            Some(v) => {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is {v}", key("rope.scaling.attn_factor")),
                ))
            }
            None => Value::Null,
        };
        rs["short_mscale"] = m.clone();
        rs["long_mscale"] = m;
    }
    if arch == "minicpm3" {
        rs["original_max_position_embeddings"] = Value::from(orig);
    } else {
        config["original_max_position_embeddings"] = Value::from(orig);
    }
    config["rope_scaling"] = rs;
    Ok(())
}

/// llama.cpp's `deepseek2` hyper-parameters as mlx-lm's `deepseek_v2` (softmax router) or
/// `deepseek_v3` (sigmoid router with its correction bias) arguments, as
/// `convert_hf_to_gguf.py`'s `DeepseekV2Model` wrote them: MLA written as MQA
/// (`head_count_kv` = 1: the heads are `head_count`), the head sizes from `key_length_mla` /
/// `value_length_mla` (files converted before those keys: `key_length` / `value_length`),
/// YaRN's `mscale_all_dim` from `yarn_log_multiplier` (= 0.1 * mscale_all_dim). For
/// deepseek_v2, split `attn_k_b` / `attn_v_b` tensors are joined back into `kv_b_proj`.
fn deepseek2_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    heads: i32,
    arch: &str,
) -> Result<()> {
    let mistral4 = arch == "mistral4";
    let key = |k: &str| format!("{arch}.{k}");
    let opt = |k: &str| meta_count(meta, path, &key(k));
    let need = |k: &str| -> Result<i32> {
        opt(k)?.ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let num = |k: &str| -> Result<Option<f64>> {
        match meta_f64(meta, &key(k)) {
            Some(v) if v.is_finite() => Ok(Some(v)),
            Some(v) => Err(gguf_err(path, format!("metadata `{}` is {v}", key(k)))),
            None if meta.contains_key(&key(k)) => Err(gguf_err(
                path,
                format!("metadata `{}` is not a number", key(k)),
            )),
            None => Ok(None),
        }
    };
    let rope = need("rope.dimension_count")?;
    let (qk, v) = match (
        opt("attention.key_length_mla")?,
        opt("attention.value_length_mla")?,
    ) {
        (Some(k), Some(v)) => (k, v),
        (None, None) => (
            need("attention.key_length")?,
            need("attention.value_length")?,
        ),
        _ => {
            return Err(gguf_err(
                path,
                "metadata: `deepseek2.attention.key_length_mla` and `value_length_mla` come \
                 together",
            ))
        }
    };
    if qk <= rope {
        return Err(gguf_err(
            path,
            format!(
                "metadata: the query/key head size {qk} is not larger than \
                 `deepseek2.rope.dimension_count` = {rope}"
            ),
        ));
    }
    let nope = qk - rope;
    let kv_lora = need("attention.kv_lora_rank")?;
    // `expert_gating_func`: 1 softmax, 2 sigmoid; files without it are DeepSeek V2's
    // (llama.cpp reads them with softmax).
    let gating = opt("expert_gating_func")?;
    let v3 = match gating {
        None | Some(1) => false,
        Some(2) if !mistral4 => true,
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {g}; mlx-lm's {} routes with {}",
                    key("expert_gating_func"),
                    if mistral4 {
                        "mistral4"
                    } else {
                        "deepseek_v2 / v3"
                    },
                    if mistral4 {
                        "softmax (1)"
                    } else {
                        "softmax (1) or sigmoid (2)"
                    }
                ),
            ))
        }
    };
    let c = config
        .as_object_mut()
        .ok_or_else(|| gguf_err(path, "internal: the config is not a map"))?;
    c.remove("head_dim");
    let model_type = match (mistral4, v3) {
        (true, _) => "mistral4",
        (false, true) => "deepseek_v3",
        (false, false) => "deepseek_v2",
    };
    c.insert("model_type".into(), Value::from(model_type));
    c.insert("num_key_value_heads".into(), Value::from(heads));
    c.insert(
        "q_lora_rank".into(),
        opt("attention.q_lora_rank")?.map_or(Value::Null, Value::from),
    );
    c.insert("kv_lora_rank".into(), Value::from(kv_lora));
    c.insert("qk_rope_head_dim".into(), Value::from(rope));
    c.insert("qk_nope_head_dim".into(), Value::from(nope));
    c.insert("v_head_dim".into(), Value::from(v));
    c.insert(
        "first_k_dense_replace".into(),
        Value::from(opt("leading_dense_block_count")?.unwrap_or(0)),
    );
    c.insert("moe_layer_freq".into(), Value::from(1));
    c.insert(
        "attention_bias".into(),
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_a_proj.bias")),
    );
    if let Some(n) = opt("expert_count")? {
        c.insert("n_routed_experts".into(), Value::from(n));
        c.insert(
            "num_experts_per_tok".into(),
            Value::from(need("expert_used_count")?),
        );
        c.insert(
            "moe_intermediate_size".into(),
            Value::from(need("expert_feed_forward_length")?),
        );
        c.insert(
            "n_shared_experts".into(),
            Value::from(opt("expert_shared_count")?.unwrap_or(0)),
        );
        c.insert(
            "routed_scaling_factor".into(),
            Value::from(num("expert_weights_scale")?.unwrap_or(1.0)),
        );
        let groups = opt("expert_group_count")?.unwrap_or(1);
        let used = opt("expert_group_used_count")?.unwrap_or(1);
        c.insert("n_group".into(), Value::from(groups));
        c.insert("topk_group".into(), Value::from(used));
        let norm = match meta.get(&key("expert_weights_norm")) {
            None => false,
            Some(GgufValue::Array(a)) if a.size() == 1 => a
                .astype(Dtype::Bool)
                .ok()
                .and_then(|b| b.item::<bool>().ok())
                .unwrap_or(false),
            Some(_) => {
                return Err(gguf_err(
                    path,
                    format!("metadata `{}` is not a boolean", key("expert_weights_norm")),
                ))
            }
        };
        c.insert("norm_topk_prob".into(), Value::from(norm));
        if mistral4 {
            // mistral4.py's router: softmax, group-limited when n_group > 1.
        } else if v3 {
            c.insert("topk_method".into(), Value::from("noaux_tc"));
            c.insert("scoring_func".into(), Value::from("sigmoid"));
        } else {
            let method = if groups > 1 {
                "group_limited_greedy"
            } else {
                "greedy"
            };
            c.insert("topk_method".into(), Value::from(method));
        }
    }
    // YaRN: mlx-lm's deepseek_v2 needs a `rope_scaling` (a factor of 1 when the file has none).
    let scaling = match meta_str(meta, &key("rope.scaling.type")) {
        Some("yarn") => {
            let factor = num("rope.scaling.factor")?.ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            let orig = need("rope.scaling.original_context_length")?;
            // Stored as 0.1 * mscale_all_dim in f32; configs write a few decimals.
            let m = num("rope.scaling.yarn_log_multiplier")?
                .map(|x| x / 0.1)
                .map(|x| format!("{x:.6e}").parse::<f64>().unwrap_or(x));
            let mut rs = json!({
                "type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": orig,
                "beta_fast": num("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                "beta_slow": num("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
            });
            if let Some(m) = m {
                rs["mscale"] = Value::from(m);
                rs["mscale_all_dim"] = Value::from(m);
            }
            Some(rs)
        }
        None | Some("none") => None,
        Some(t) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is `{t}`; only yarn is mapped",
                    key("rope.scaling.type")
                ),
            ))
        }
    };
    if mistral4 {
        // mistral4.py reads `rope_parameters` (YaRN plus Llama 4's query scale, whose beta
        // the HF converter does not write: llama.cpp then scales by 1, as beta 0 does).
        let Some(mut rp) = scaling else {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is not yarn; Mistral 4 needs it",
                    key("rope.scaling.type")
                ),
            ));
        };
        if rp.get("mscale_all_dim").is_none() {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is missing",
                    key("rope.scaling.yarn_log_multiplier")
                ),
            ));
        }
        rp["rope_type"] = Value::from("yarn");
        rp["rope_theta"] = c.get("rope_theta").cloned().unwrap_or(Value::from(10000.0));
        rp["llama_4_scaling_beta"] =
            Value::from(num("attention.temperature_scale")?.unwrap_or(0.0));
        c.insert("rope_parameters".into(), rp);
        return Ok(());
    }
    match scaling {
        Some(rs) => {
            c.insert("rope_scaling".into(), rs);
        }
        None if !v3 => {
            let ctx = c
                .get("max_position_embeddings")
                .cloned()
                .unwrap_or(Value::from(2048));
            c.insert(
                "rope_scaling".into(),
                json!({"type": "yarn", "factor": 1.0, "original_max_position_embeddings": ctx}),
            );
        }
        None => {}
    }
    if !v3 {
        join_kv_b(tensors, heads, nope, v)?;
    }
    Ok(())
}

/// deepseek_v2 reads `kv_b_proj` `(heads * (nope + v), kv_lora_rank)`: llama.cpp's
/// `attn_k_b` `(heads, kv_lora_rank, nope)` transposed back and `attn_v_b`
/// `(heads, v, kv_lora_rank)`, joined per head (quantized halves are dequantized first).
fn join_kv_b(tensors: &mut BTreeMap<String, Array>, heads: i32, nope: i32, v: i32) -> Result<()> {
    let prefixes: Vec<String> = tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".embed_q.weight").map(str::to_string))
        .collect();
    for p in prefixes {
        let mut take = |part: &str| -> Result<Array> {
            let w = tensors
                .remove(&format!("{p}.{part}.weight"))
                .ok_or_else(|| {
                    ModelError::Weights(vec![format!(
                        "{p}.{part}: missing (attn_k_b without attn_v_b)"
                    )])
                })?;
            let scales = tensors.remove(&format!("{p}.{part}.scales"));
            let biases = tensors.remove(&format!("{p}.{part}.biases"));
            match (scales, biases) {
                (None, None) => Ok(w),
                (Some(s), b) => {
                    // MLX's GGUF reader: groups of 32 along the last axis.
                    let cols = s.shape().last().copied().unwrap_or(0) * 32;
                    let packed = w.shape().last().copied().unwrap_or(0);
                    if cols <= 0 || (packed * 32) % cols != 0 {
                        return Err(ModelError::Weights(vec![format!(
                            "{p}.{part}: quantized shapes {:?} / {:?} do not agree",
                            w.shape(),
                            s.shape()
                        )]));
                    }
                    let bits = packed * 32 / cols;
                    Ok(mlx_core::quantized::dequantize(
                        &w,
                        &s,
                        b.as_ref(),
                        32,
                        bits,
                        mlx_core::quantized::QuantMode::Affine,
                        None,
                        None,
                    )?)
                }
                (None, Some(_)) => Err(ModelError::Weights(vec![format!(
                    "{p}.{part}: biases without scales"
                )])),
            }
        };
        let k_b = take("embed_q")?;
        let v_b = take("unembed_out")?;
        let ok = k_b.ndim() == 3
            && v_b.ndim() == 3
            && k_b.shape()[0] == heads
            && v_b.shape()[0] == heads
            && k_b.shape()[2] == nope
            && v_b.shape()[1] == v
            && k_b.shape()[1] == v_b.shape()[2];
        if !ok {
            return Err(ModelError::Weights(vec![format!(
                "{p}: attn_k_b {:?} / attn_v_b {:?} are not (heads, kv_lora_rank, nope) / \
                 (heads, v_head_dim, kv_lora_rank) for {heads} heads, nope {nope}, v {v}",
                k_b.shape(),
                v_b.shape()
            )]));
        }
        let rank = k_b.shape()[1];
        let k = ops::swapaxes(&k_b, 1, 2, None)?;
        let kv = ops::concatenate(&[&k, &v_b], 1, None)?;
        let kv = ops::reshape(&kv, &[heads * (nope + v), rank], None)?;
        tensors.insert(format!("{p}.kv_b_proj.weight"), kv);
    }
    Ok(())
}

/// Mamba / Mamba-2 (`MambaModel` / `Mamba2Model`'s keys) as mlx-lm's `mamba` / `mamba2`
/// arguments, replacing the transformer fields: the SSM sizes, biases from the tensors,
/// Falcon Mamba (`falcon_mamba`) where `ssm.dt_b_c_rms` is set. Mamba-2's head count is
/// `ssm.time_step_rank`, its time step unclamped (llama.cpp clamps none: mlx-lm's `(0, inf)`).
/// mlx-lm's Mamba block norms use RMSNorm's default epsilon and Falcon Mamba's B/C/dt norms
/// `mixer_rms_eps` (default 1e-6), which no key carries: mlx-lm's defaults, as it reads the
/// checkpoints.
fn mamba_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    arch: &str,
) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let (inner, rank) = (need("ssm.inner_size")?, need("ssm.time_step_rank")?);
    let has = |t: &str| tensors.contains_key(&format!("backbone.layers.0.mixer.{t}"));
    let mut c = json!({
        "model_type": arch,
        "vocab_size": config["vocab_size"].clone(),
        "hidden_size": config["hidden_size"].clone(),
        "num_hidden_layers": config["num_hidden_layers"].clone(),
        "intermediate_size": inner,
        "state_size": need("ssm.state_size")?,
        "conv_kernel": need("ssm.conv_kernel")?,
        "use_bias": has("in_proj.bias"),
        "use_conv_bias": has("conv1d.bias"),
        "tie_word_embeddings": config["tie_word_embeddings"].clone(),
    });
    if arch == "mamba" {
        c["time_step_rank"] = Value::from(rank);
        if meta_bool(meta, path, &key("ssm.dt_b_c_rms"))? == Some(true) {
            c["model_type"] = Value::from("falcon_mamba");
        }
    } else {
        if inner % rank != 0 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {inner} does not divide into `{}` = {rank} heads",
                    key("ssm.inner_size"),
                    key("ssm.time_step_rank")
                ),
            ));
        }
        c["num_heads"] = Value::from(rank);
        c["head_dim"] = Value::from(inner / rank);
        c["n_groups"] = Value::from(need("ssm.group_count")?);
        c["layer_norm_epsilon"] = config["rms_norm_eps"].clone();
        c["time_step_limit"] = json!([0.0, "Infinity"]);
        c["time_step_rank"] = Value::from("auto");
    }
    *config = c;
    Ok(())
}

/// MiniMax-M2 (`MiniMaxM2Model`'s keys) as mlx-lm's `minimax`: the experts' width
/// (`expert_feed_forward_length`), the rotated width (`rope.dimension_count`), the head size;
/// mlx-lm routes by sigmoid with a selection bias and renormalizes the top-k weights, so a
/// file with another `expert_gating_func` is refused.
fn minimax_m2_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
) -> Result<()> {
    let arch = "minimax-m2";
    let need = |k: &str| need_count(meta, path, arch, k);
    let gating = format!("{arch}.expert_gating_func");
    if meta_count(meta, path, &gating)?.is_some_and(|g| g != 2) {
        return Err(gguf_err(
            path,
            format!("metadata `{gating}` is not sigmoid (2), the router mlx-lm's minimax has"),
        ));
    }
    config["num_local_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["shared_intermediate_size"] = Value::from(0);
    config["rotary_dim"] = Value::from(need("rope.dimension_count")?);
    config["scoring_func"] = Value::from("sigmoid");
    config["use_qk_norm"] =
        Value::from(tensors.contains_key("model.layers.0.self_attn.q_norm.weight"));
    require_context(config, path, &format!("{arch}.context_length"))
}

/// Ling 1.0 (`BailingMoeModel`, `bailingmoe`) and 2.0 (`BailingMoeV2Model`, `bailingmoe2`)
/// as mlx-lm's `bailing_moe`; Ling 1.0's split, permuted q / k / v are joined back into
/// `query_key_value` (its head, which the converter normalized, is read as stored). Experts after
/// `leading_dense_block_count` dense layers, the router's gating (`expert_gating_func`: 1
/// softmax, 2 sigmoid), groups, routed scale and renormalization, the rotated width, the
/// shared experts' width per expert from the tensors (mlx-lm multiplies
/// `moe_shared_expert_intermediate_size` by their count). mlx-lm's head size is the width over
/// the heads and its lm_head is not re-normalized (`norm_head` false, as this converter class
/// writes it): a file saying otherwise is refused.
fn bailing_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
    arch: &str,
) -> Result<()> {
    if arch == "bailingmoe" {
        let heads = config["num_attention_heads"].as_i64().unwrap_or(0) as i32;
        let kv = config["num_key_value_heads"].as_i64().unwrap_or(0) as i32;
        join_bailing_qkv(tensors, blocks, heads, kv)?;
    }
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let (hidden, heads) = (
        config["hidden_size"].as_i64().unwrap_or(0),
        config["num_attention_heads"].as_i64().unwrap_or(1),
    );
    if let Some(d) = meta_count(meta, path, &key("attention.key_length"))? {
        if i64::from(d) * heads != hidden {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {d} is not the width over the heads, the only head size \
                     mlx-lm's bailing_moe has",
                    key("attention.key_length")
                ),
            ));
        }
    }
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    config["score_function"] = Value::from(match meta_count(meta, path, &key("expert_gating_func"))? {
        None | Some(1) => "softmax",
        Some(2) => "sigmoid",
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {g}; mlx-lm's bailing_moe routes by softmax (1) or sigmoid (2)",
                    key("expert_gating_func")
                ),
            ))
        }
    });
    config["num_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    let dense = meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?;
    config["first_k_dense_replace"] = Value::from(dense.unwrap_or(0));
    config["n_group"] =
        Value::from(meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1));
    config["topk_group"] =
        Value::from(meta_count(meta, path, &key("expert_group_used_count"))?.unwrap_or(1));
    config["norm_topk_prob"] =
        Value::from(meta_bool(meta, path, &key("expert_weights_norm"))?.unwrap_or(false));
    let scale = positive_f64(meta, path, &key("expert_weights_scale"))?.unwrap_or(1.0);
    config["routed_scaling_factor"] = Value::from(scale);
    config["rotary_dim"] = Value::from(need("rope.dimension_count")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["use_qk_norm"] = Value::from(has(".attention.query_layernorm.weight"));
    config["use_qkv_bias"] = Value::from(has(".attention.query_key_value.bias"));
    config["use_bias"] = Value::from(has(".attention.dense.bias"));
    config["moe_router_enable_expert_bias"] = Value::from(has(".mlp.gate.expert_bias"));
    config["norm_head"] = Value::from(false);
    // The shared experts' width: mlx-lm's is `moe_shared_expert_intermediate_size` times their
    // count.
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    config["num_shared_experts"] = Value::from(shared);
    let width = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_experts.up_proj.weight"))
        .map(|(_, a)| a.shape()[0]);
    match width {
        Some(w) if shared > 0 && w % shared == 0 => {
            config["moe_shared_expert_intermediate_size"] = Value::from(w / shared)
        }
        None if shared == 0 => {}
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {shared} does not fit the shared experts' tensors \
                     (`ffn_up_shexp` with {width:?} rows)",
                    key("expert_shared_count")
                ),
            ))
        }
    }
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: rope scaling is not mapped for {arch}",
                key("rope.scaling.type")
            ),
        ));
    }
    require_context(config, path, &key("context_length"))
}

/// Nemotron-H (dense; `NemotronHModel`'s keys) as mlx-lm's `nemotron_h`: the layer pattern
/// from the per-layer lists (`head_count_kv` > 0: attention `*`, `feed_forward_length` > 0:
/// MLP `-`, both 0: Mamba-2 `M`), the Mamba-2 sizes as `granitehybrid` writes them, biases from
/// the tensors. mlx-lm's model always has its own head: a file without `output.weight` gets
/// the embedding's (llama.cpp's duplicate). `nemotron_h_moe` (`arch`): the MLP layers are
/// mixture-of-experts blocks `E` ([`nemotron_h_moe_config`]); the per-layer lists may also
/// cover the multi-token-prediction block the converter appends (not read).
fn nemotron_h_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    arch: &str,
    kv: Option<&[i64]>,
    ffn: Option<&[i64]>,
) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let moe = arch == "nemotron_h_moe";
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let nextn = meta_count(meta, path, &key("nextn_predict_layers"))?.unwrap_or(0) as usize;
    let list = |k: &str, per: Option<&[i64]>| -> Result<Vec<i64>> {
        match per {
            Some(p)
                if (p.len() == blocks || p.len() == blocks + nextn)
                    && p.iter().all(|&n| n >= 0) =>
            {
                Ok(p[..blocks].to_vec())
            }
            _ => Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must list a non-negative value for each of the {blocks} \
                     layers (0 for a Mamba-2 layer)",
                    key(k)
                ),
            )),
        }
    };
    let (kv, ffn) = (
        list("attention.head_count_kv", kv)?,
        list("feed_forward_length", ffn)?,
    );
    let mut pattern = String::new();
    let mut width = None;
    for (l, (&k, &f)) in kv.iter().zip(&ffn).enumerate() {
        pattern.push(match (k, f) {
            (0, 0) => 'M',
            (_, 0) => '*',
            (0, f) if width.is_none_or(|w| w == f) => {
                width = Some(f);
                if moe {
                    'E'
                } else {
                    '-'
                }
            }
            _ => {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` / `{}`: layer {l} has both or an MLP width other than the \
                         others'",
                        key("attention.head_count_kv"),
                        key("feed_forward_length")
                    ),
                ))
            }
        });
    }
    let (heads, inner) = (need("ssm.time_step_rank")?, need("ssm.inner_size")?);
    if inner % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} does not divide into `{}` = {heads} heads",
                key("ssm.inner_size"),
                key("ssm.time_step_rank")
            ),
        ));
    }
    if meta_bool(meta, path, &key("rope.scaling.finetuned"))? == Some(true) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is true: rope, which mlx-lm's nemotron_h attention lacks",
                key("rope.scaling.finetuned")
            ),
        ));
    }
    config["hybrid_override_pattern"] = Value::from(pattern);
    config["intermediate_size"] = Value::from(width.unwrap_or(0).max(1));
    if moe {
        nemotron_h_moe_config(config, tensors, path, meta, width)?;
    }
    config["mamba_num_heads"] = Value::from(heads);
    config["mamba_head_dim"] = Value::from(inner / heads);
    config["ssm_state_size"] = Value::from(need("ssm.state_size")?);
    config["conv_kernel"] = Value::from(need("ssm.conv_kernel")?);
    config["n_groups"] = Value::from(need("ssm.group_count")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_proj_bias"] = Value::from(has(".mixer.in_proj.bias"));
    config["use_conv_bias"] = Value::from(has(".mixer.conv1d.bias"));
    config["attention_bias"] = Value::from(has(".mixer.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".mixer.up_proj.bias"));
    config["use_bias"] = Value::from(false);
    if !tensors.contains_key("lm_head.weight") {
        for suffix in ["weight", "scales", "biases"] {
            if let Some(e) = tensors.get(&format!("backbone.embeddings.{suffix}")) {
                let e = e.clone();
                tensors.insert(format!("lm_head.{suffix}"), e);
            }
        }
    }
    Ok(())
}

/// `nemotron_h_moe`'s expert keys as NemotronHModel writes them: `expert_count`,
/// `expert_used_count`, `expert_feed_forward_length` (the per-layer `feed_forward_length` of
/// the `E` layers, `width`), `expert_weights_scale`, `expert_weights_norm` (false when absent,
/// as llama.cpp reads it), `expert_group_count` (1 when absent) and, for more than one group,
/// `expert_group_used_count` (which the converter does not write: llama.cpp refuses such a file
/// too); the shared experts and the latent projections from their tensors and keys. The router
/// is sigmoid with the correction bias in both.
fn nemotron_h_moe_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    width: Option<i64>,
) -> Result<()> {
    let arch = "nemotron_h_moe";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let experts = need("expert_count")?;
    let used = need("expert_used_count")?;
    let inner = need("expert_feed_forward_length")?;
    if width.is_some_and(|w| w != i64::from(inner)) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} differs from the expert layers' `{}` {width:?}",
                key("expert_feed_forward_length"),
                key("feed_forward_length")
            ),
        ));
    }
    let scale = meta_f64(meta, &key("expert_weights_scale")).ok_or_else(|| {
        gguf_err(
            path,
            format!("metadata `{}` is missing", key("expert_weights_scale")),
        )
    })?;
    let groups = meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1);
    let groups_used = if groups > 1 {
        Some(need("expert_group_used_count")?)
    } else {
        None
    };
    let rows = |t: &str| {
        tensors
            .iter()
            .find(|(k, _)| k.ends_with(t))
            .and_then(|(_, a)| a.shape().first().copied())
    };
    let shared_rows = rows(".mixer.shared_experts.up_proj.weight");
    let shared_count = meta_count(meta, path, &key("expert_shared_count"))?;
    match (shared_rows, shared_count) {
        (Some(h), _) => {
            if let Some(k) = meta_count(meta, path, &key("expert_shared_feed_forward_length"))? {
                if k != h {
                    return Err(gguf_err(
                        path,
                        format!(
                            "metadata `{}` = {k} differs from `ffn_up_shexp`'s {h} rows",
                            key("expert_shared_feed_forward_length")
                        ),
                    ));
                }
            }
            config["n_shared_experts"] = Value::from(shared_count.unwrap_or(1));
            config["moe_shared_expert_intermediate_size"] = Value::from(h);
        }
        (None, Some(n)) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {n} but the file has no shared experts (`ffn_up_shexp`)",
                    key("expert_shared_count")
                ),
            ))
        }
        (None, None) => {}
    }
    let latent = meta_count(meta, path, &key("moe_latent_size"))?;
    if latent.is_none() && rows(".mixer.fc1_latent_proj.weight").is_some() {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is missing but the file has latent projections (`ffn_latent_down`)",
                key("moe_latent_size")
            ),
        ));
    }
    config["n_routed_experts"] = Value::from(experts);
    config["num_experts_per_tok"] = Value::from(used);
    config["moe_intermediate_size"] = Value::from(inner);
    config["routed_scaling_factor"] = Value::from(scale);
    config["norm_topk_prob"] =
        Value::from(meta_bool(meta, path, &key("expert_weights_norm"))?.unwrap_or(false));
    config["n_group"] = Value::from(groups);
    config["topk_group"] = groups_used.map_or(Value::Null, Value::from);
    config["moe_latent_size"] = latent.map_or(Value::Null, Value::from);
    Ok(())
}

/// MiMo V2 Flash as MimoV2Model writes it, for mlx-lm's `mimo_v2_flash`: the per-layer pattern
/// (`attention.sliding_window_pattern`, 1 = sliding) as `hybrid_layer_pattern`, the per-layer KV
/// heads (one count per kind of layer), the head count and sizes (`key_length`,
/// `value_length`), which the converter requires the sliding layers to share, the rope width
/// as `partial_rotary_factor`, the rope bases, the window, the value scale, the MoE layers and
/// each kind's sinks from the tensors, and the router llama.cpp runs: sigmoid with the
/// correction bias, the groups, weights always normalized, scaled only by
/// `expert_weights_scale` (unscaled when absent). The lists' MTP entries are skipped.
fn mimo2_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    heads: i32,
) -> Result<()> {
    let arch = "mimo2";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let list = |k: &str| -> Result<Vec<f64>> {
        layer_list(meta, path, &key(k), blocks)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let swa: Vec<bool> = list("attention.sliding_window_pattern")?
        .iter()
        .map(|&v| v != 0.0)
        .collect();
    if !swa.contains(&true) || !swa.contains(&false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's mimo_v2_flash needs both sliding and full layers",
                key("attention.sliding_window_pattern")
            ),
        ));
    }
    let kvs = list("attention.head_count_kv")?;
    let mut kv: [Option<f64>; 2] = [None, None];
    for (l, (&k, &s)) in kvs.iter().zip(&swa).enumerate() {
        let slot = &mut kv[usize::from(s)];
        if k < 1.0 || f64::from(heads) % k != 0.0 || slot.is_some_and(|v| v != k) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}`: layer {l} has {k} KV heads; mlx-lm's mimo_v2_flash needs one \
                    divisor of the {heads} heads per kind of layer (full, sliding)",
                    key("attention.head_count_kv")
                ),
            ));
        }
        *slot = Some(k);
    }
    let head_dim = need("attention.key_length")?;
    let v_head_dim = need("attention.value_length")?;
    let rope = need("rope.dimension_count")?;
    if rope > head_dim {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {rope} exceeds the head size {head_dim}",
                key("rope.dimension_count")
            ),
        ));
    }
    // mlx-lm rotates int(partial_rotary_factor * head_dim) dimensions.
    let mut factor = f64::from(rope) / f64::from(head_dim);
    if (factor * f64::from(head_dim)) as i32 != rope {
        factor = (f64::from(rope) + 0.5) / f64::from(head_dim);
    }
    if let Some(g) = meta_count(meta, path, &key("expert_gating_func"))? {
        if g != 2 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: llama.cpp's mimo2 routes by sigmoid (2)",
                    key("expert_gating_func")
                ),
            ));
        }
    }
    if meta_bool(meta, path, &key("expert_weights_norm"))? == Some(false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is false: llama.cpp's mimo2 always normalizes the routed weights",
                key("expert_weights_norm")
            ),
        ));
    }
    let groups = meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1);
    let groups_used = if groups > 1 {
        need("expert_group_used_count")?
    } else {
        meta_count(meta, path, &key("expert_group_used_count"))?.unwrap_or(1)
    };
    let has = |l: usize, t: &str| tensors.contains_key(&format!("model.layers.{l}.{t}"));
    let sinks = |sliding: bool| {
        (0..blocks).any(|l| swa[l] == sliding && has(l, "self_attn.attention_sink_bias"))
    };
    let base = meta_f64(meta, &key("rope.freq_base")).unwrap_or(10000.0);
    let moe_layers: Vec<i32> = (0..blocks)
        .map(|l| i32::from(has(l, "mlp.gate.weight")))
        .collect();
    let o = json!({
        "num_key_value_heads": kv[0].unwrap_or(1.0) as i64,
        "swa_num_key_value_heads": kv[1].unwrap_or(1.0) as i64,
        "num_attention_heads": heads,
        "swa_num_attention_heads": heads,
        "head_dim": head_dim,
        "swa_head_dim": head_dim,
        "v_head_dim": v_head_dim,
        "swa_v_head_dim": v_head_dim,
        "partial_rotary_factor": factor,
        "rope_theta": base,
        "swa_rope_theta": meta_f64(meta, &key("rope.freq_base_swa")).unwrap_or(base),
        "sliding_window_size": need("attention.sliding_window")?,
        "hybrid_layer_pattern": swa.iter().map(|&s| i32::from(s)).collect::<Vec<_>>(),
        "moe_layer_freq": moe_layers,
        "add_swa_attention_sink_bias": sinks(true),
        "add_full_attention_sink_bias": sinks(false),
        "attention_value_scale": meta_f64(meta, &key("attention.value_scale")),
        "n_routed_experts": need("expert_count")?,
        "num_experts_per_tok": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "n_shared_experts": null,
        "routed_scaling_factor": meta_f64(meta, &key("expert_weights_scale")),
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": true,
        "n_group": groups,
        "topk_group": groups_used,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// Laguna as LagunaModel writes it, for mlx-lm's `laguna`: the per-layer head counts, the
/// layer kinds (`attention.sliding_window_pattern`, else llama.cpp's full layer every 4th from
/// the first; all full without a window), `rope_parameters` per kind (the full layers' base,
/// rope width and YaRN from `rope.scaling.*`; the sliding layers' `freq_base_swa` and
/// `dimension_count_swa`, plain), the dense first blocks as `mlp_layer_types`, the expert keys
/// and the router llama.cpp runs (sigmoid or sqrt-softplus, no soft cap, weights always
/// normalized, scaled by `expert_weights_scale`), the per-head gate and biases from the
/// tensors. Refused: a per-element gate (mlx-lm's laguna gates per head), YaRN's attention /
/// extrapolation factors (mlx-lm's YaRN has neither), other rope scaling, another gating,
/// a shared-expert count other than 1.
fn laguna_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
) -> Result<()> {
    let arch = "laguna";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let float = |k: &str| meta_f64(meta, &key(k));
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let heads: Vec<i64> = match float("attention.head_count") {
        Some(_) => vec![i64::from(need("attention.head_count")?); blocks],
        None => layer_list(meta, path, &key("attention.head_count"), blocks)?
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("attention.head_count")),
                )
            })?
            .into_iter()
            .map(|h| h as i64)
            .collect(),
    };
    let head_dim = need("attention.key_length")?;
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let sliding: Vec<bool> = match (
        window,
        layer_list(meta, path, &key("attention.sliding_window_pattern"), blocks)?,
    ) {
        (None, _) => vec![false; blocks],
        (Some(_), Some(p)) => p.iter().map(|&v| v != 0.0).collect(),
        (Some(_), None) => (0..blocks).map(|l| l % 4 != 0).collect(),
    };
    // mlx-lm rotates int(head_dim * partial_rotary_factor) dimensions.
    let factor = |dims: i32, k: &str| -> Result<f64> {
        if dims < 1 || dims > head_dim {
            return Err(gguf_err(
                path,
                format!("metadata `{}` = {dims} is not in 1..={head_dim}", key(k)),
            ));
        }
        let f = f64::from(dims) / f64::from(head_dim);
        Ok(if (f * f64::from(head_dim)) as i32 == dims {
            f
        } else {
            (f64::from(dims) + 0.5) / f64::from(head_dim)
        })
    };
    let full_dims = meta_count(meta, path, &key("rope.dimension_count"))?.unwrap_or(head_dim);
    let swa_dims = meta_count(meta, path, &key("rope.dimension_count_swa"))?.unwrap_or(full_dims);
    let base = float("rope.freq_base").unwrap_or(10000.0);
    let mut full = json!({
        "rope_theta": base,
        "partial_rotary_factor": factor(full_dims, "rope.dimension_count")?,
    });
    for k in [
        "rope.scaling.yarn_attn_factor",
        "rope.scaling.yarn_ext_factor",
    ] {
        if let Some(v) = float(k) {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {v}: mlx-lm's YaRN rope has no such factor",
                    key(k)
                ),
            ));
        }
    }
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some("yarn") => {
            let f = float("rope.scaling.factor").ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `{}` is missing", key("rope.scaling.factor")),
                )
            })?;
            full["rope_type"] = Value::from("yarn");
            full["factor"] = Value::from(f);
            full["original_max_position_embeddings"] =
                Value::from(need("rope.scaling.original_context_length")?);
            for (k, field) in [
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(v) = float(k) {
                    full[field] = Value::from(v);
                }
            }
        }
        Some(t) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is `{t}`; laguna maps only yarn",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    let swa = json!({
        "rope_theta": float("rope.freq_base_swa").unwrap_or(base),
        "partial_rotary_factor": factor(swa_dims, "rope.dimension_count_swa")?,
    });
    let score = match meta_count(meta, path, &key("expert_gating_func"))? {
        None | Some(2) => "sigmoid",
        Some(4) => "sqrtsoftplus",
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's laguna routes by sigmoid (2) \
                or sqrt-softplus (4)",
                    key("expert_gating_func")
                ),
            ))
        }
    };
    if meta_bool(meta, path, &key("expert_weights_norm"))? == Some(false) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is false: mlx-lm's laguna always normalizes the routed weights",
                key("expert_weights_norm")
            ),
        ));
    }
    if let Some(n) = meta_count(meta, path, &key("expert_shared_count"))? {
        if n != 1 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {n}: laguna has one shared expert",
                    key("expert_shared_count")
                ),
            ));
        }
    }
    let dense = meta_count(meta, path, &key("leading_dense_block_count")).and_then(|v| {
        v.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("leading_dense_block_count")),
            )
        })
    })? as usize;
    for (l, &h) in heads.iter().enumerate() {
        if let Some(g) = tensors.get(&format!("model.layers.{l}.self_attn.g_proj.weight")) {
            let rows = g.shape().first().copied().unwrap_or(0);
            if i64::from(rows) != h {
                return Err(gguf_err(
                    path,
                    format!(
                        "tensor `blk.{l}.attn_gate.weight` has {rows} rows for {} heads: a \
                        per-element gate, which mlx-lm's laguna (one gate per head) lacks",
                        h
                    ),
                ));
            }
        }
    }
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    let layer_types: Vec<&str> = sliding
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let mlp_types: Vec<&str> = (0..blocks)
        .map(|l| if l < dense { "dense" } else { "sparse" })
        .collect();
    let o = json!({
        "num_attention_heads": heads.first().copied().unwrap_or(1),
        "num_attention_heads_per_layer": heads,
        "head_dim": head_dim,
        "sliding_window": window,
        "layer_types": layer_types,
        "mlp_layer_types": mlp_types,
        "rope_parameters": {"full_attention": full, "sliding_attention": swa},
        "gating": has(".self_attn.g_proj.weight"),
        "qkv_bias": has(".self_attn.q_proj.bias"),
        "attention_bias": has(".self_attn.o_proj.bias"),
        "num_experts": need("expert_count")?,
        "num_experts_per_tok": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "shared_expert_intermediate_size": need("expert_shared_feed_forward_length")?,
        "moe_routed_scaling_factor": float("expert_weights_scale").unwrap_or(1.0),
        "moe_router_score_func": score,
        "moe_router_logit_softcapping": 0.0,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// Kimi Linear as KimiLinearModel writes it, for mlx-lm's `kimi_linear`: the KDA layers are
/// those with `head_count_kv` 0 (`linear_attn_config.kda_layers`, 1-based), KDA's heads the
/// attention heads and its head size `kda.head_dim`, the short-conv kernel, MLA's sizes
/// (`kv_lora_rank`, the rope width, `key_length_mla` / `value_length_mla`), the expert keys and
/// llama.cpp's router (sigmoid or softmax, always renormalized, grouped only where
/// `expert_group_count` says so, scaled by `expert_weights_scale`). Refused: a Q LoRA rank
/// (mlx-lm's kimi_linear projects Q directly).
fn kimi_linear_config(
    config: &mut Value,
    path: &Path,
    meta: &GgufMetadata,
    heads: i32,
) -> Result<()> {
    let arch = "kimi-linear";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let kv = layer_list(meta, path, &key("attention.head_count_kv"), blocks)?.ok_or_else(|| {
        gguf_err(
            path,
            format!(
                "metadata `{}` must list the KV heads per layer (0 on KDA layers)",
                key("attention.head_count_kv")
            ),
        )
    })?;
    let kda: Vec<usize> = (0..blocks)
        .filter(|&l| kv[l] == 0.0)
        .map(|l| l + 1)
        .collect();
    let full: Vec<usize> = (0..blocks)
        .filter(|&l| kv[l] != 0.0)
        .map(|l| l + 1)
        .collect();
    if kda.is_empty() || full.is_empty() {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: mlx-lm's kimi_linear needs both KDA (0) and MLA layers",
                key("attention.head_count_kv")
            ),
        ));
    }
    if let Some(r) = meta_count(meta, path, &key("attention.q_lora_rank"))? {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {r}: mlx-lm's kimi_linear projects Q without a LoRA",
                key("attention.q_lora_rank")
            ),
        ));
    }
    let rope = need("rope.dimension_count")?;
    let k_mla = need("attention.key_length_mla")?;
    if k_mla <= rope {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {k_mla} leaves no room beside the rope width {rope}",
                key("attention.key_length_mla")
            ),
        ));
    }
    let router = match meta_count(meta, path, &key("expert_gating_func"))? {
        None | Some(2) => "sigmoid",
        Some(1) => "softmax",
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's kimi_linear routes by softmax (1) or \
                     sigmoid (2)",
                    key("expert_gating_func")
                ),
            ))
        }
    };
    let groups = meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1);
    let groups_used = if groups > 1 {
        need("expert_group_used_count")?
    } else {
        1
    };
    let kda_dim = need("kda.head_dim")?;
    let o = json!({
        "num_key_value_heads": heads,
        "head_dim": kda_dim,
        "linear_attn_config": {
            "num_heads": heads,
            "head_dim": kda_dim,
            "kda_layers": kda,
            "full_attn_layers": full,
            "short_conv_kernel_size": need("ssm.conv_kernel")?,
        },
        "model_max_length": need("context_length")?,
        "kv_lora_rank": need("attention.kv_lora_rank")?,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": k_mla - rope,
        "v_head_dim": need("attention.value_length_mla")?,
        "num_experts": need("expert_count")?,
        "num_experts_per_token": need("expert_used_count")?,
        "moe_intermediate_size": need("expert_feed_forward_length")?,
        "num_shared_experts": need("expert_shared_count")?,
        "first_k_dense_replace":
            meta_count(meta, path, &key("leading_dense_block_count"))?.unwrap_or(0),
        "routed_scaling_factor": meta_f64(meta, &key("expert_weights_scale")).unwrap_or(1.0),
        "moe_router_activation_func": router,
        "moe_renormalize": true,
        "moe_layer_freq": 1,
        "num_expert_group": groups,
        "topk_group": groups_used,
    });
    if let (Some(c), Some(o)) = (config.as_object_mut(), o.as_object()) {
        c.extend(o.clone());
    }
    Ok(())
}

/// The first entry of a per-layer count list `key`, which must be positive.
fn first_count(a: &Array, path: &Path, key: &str) -> Result<i32> {
    let per = int_list(a, path, key)?;
    match per.first() {
        Some(&n) if n > 0 && n <= i64::from(i32::MAX) => Ok(n as i32),
        _ => Err(gguf_err(
            path,
            format!("metadata `{key}` is {per:?}: its first layer needs a positive count"),
        )),
    }
}

fn int_list(a: &Array, path: &Path, key: &str) -> Result<Vec<i64>> {
    a.astype(Dtype::Int64)
        .and_then(|b| b.to_vec::<i64>())
        .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))
}

/// A per-layer metadata list `key` (numbers or bools, as f64) of the `blocks` main layers:
/// `None` when absent; the entries past them (multi-token-prediction blocks) dropped.
fn layer_list(
    meta: &GgufMetadata,
    path: &Path,
    key: &str,
    blocks: usize,
) -> Result<Option<Vec<f64>>> {
    match meta.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) if a.ndim() == 1 && a.size() >= blocks => {
            let v = a
                .astype(Dtype::Float64)
                .and_then(|b| b.to_vec::<f64>())
                .map_err(|e| gguf_err(path, format!("metadata `{key}`: {e}")))?;
            Ok(Some(v[..blocks].to_vec()))
        }
        Some(_) => Err(gguf_err(
            path,
            format!("metadata `{key}` must list a value for each of the {blocks} layers"),
        )),
    }
}

/// Step 3.5 as Step35Model writes it, for mlx-lm's `step3p5`: the per-layer head / KV counts
/// (one pair on the full layers, `num_attention_heads` / `num_attention_groups`, one on the
/// sliding ones, `attention_other_setting`), `layer_types` from
/// `attention.sliding_window_pattern`, the window, the head size (`attention.key_length`), the
/// partial rope the converter requires (half the head on full layers, all of it on sliding
/// ones), per-layer rope bases (`rope.freq_base`, `rope.freq_base_swa`), the expert keys
/// (mlx-lm's defaults differ from llama.cpp's where a key is absent, so scale and norm are
/// required), the MoE layers from the router tensors, the per-layer SwiGLU clamps (0 = none)
/// and the head-wise gate from its tensors. Refused: Llama 3 rope factors (`rope_freqs`) and
/// other rope scaling, another gating function, a file without expert layers.
fn step35_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    rope_tensors: &BTreeMap<String, Array>,
) -> Result<()> {
    let arch = "step35";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0) as usize;
    let list = |k: &str| -> Result<Vec<f64>> {
        layer_list(meta, path, &key(k), blocks)?
            .ok_or_else(|| gguf_err(path, format!("metadata `{}` is missing", key(k))))
    };
    let swa: Vec<bool> = list("attention.sliding_window_pattern")?
        .iter()
        .map(|&v| v != 0.0)
        .collect();
    let (heads, kvs) = (
        list("attention.head_count")?,
        list("attention.head_count_kv")?,
    );
    // One (heads, kv) pair per kind of layer.
    let mut pairs: [Option<(f64, f64)>; 2] = [None, None];
    for l in 0..blocks {
        let pair = (heads[l], kvs[l]);
        let slot = &mut pairs[usize::from(swa[l])];
        if pair.0 < 1.0 || pair.1 < 1.0 || pair.0 % pair.1 != 0.0 || slot.is_some_and(|p| p != pair)
        {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` / `{}`: layer {l} has {} heads over {} KV heads; mlx-lm's \
                    step3p5 needs one positive multiple per kind of layer (full, sliding)",
                    key("attention.head_count"),
                    key("attention.head_count_kv"),
                    pair.0,
                    pair.1
                ),
            ));
        }
        *slot = Some(pair);
    }
    let Some((full_heads, full_kv)) = pairs[0] else {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` marks every layer sliding; the full layers set mlx-lm's head counts",
                key("attention.sliding_window_pattern")
            ),
        ));
    };
    config["num_attention_heads"] = Value::from(full_heads as i64);
    config["num_attention_groups"] = Value::from(full_kv as i64);
    config["attention_other_setting"] = match pairs[1] {
        Some((h, kv)) => {
            json!({"num_attention_heads": h as i64, "num_attention_groups": kv as i64})
        }
        None => Value::Null,
    };
    config["layer_types"] = swa
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    config["sliding_window"] = Value::from(need("attention.sliding_window")?);
    let head_dim = need("attention.key_length")?;
    config["head_dim"] = Value::from(head_dim);
    if let Some(r) = meta_count(meta, path, &key("rope.dimension_count"))? {
        if r != head_dim {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {r}: llama.cpp's step35 rotates the whole head ({head_dim}) \
                    on sliding layers and half of it on full ones",
                    key("rope.dimension_count")
                ),
            ));
        }
    }
    config["partial_rotary_factors"] = swa.iter().map(|&s| if s { 1.0 } else { 0.5 }).collect();
    if rope_tensors.contains_key("rope_freqs.weight") {
        return Err(gguf_err(
            path,
            "tensor `rope_freqs.weight`: Llama 3 rope factors are not mapped for step35",
        ));
    }
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: rope scaling is not mapped for step35",
                key("rope.scaling.type")
            ),
        ));
    }
    let base = meta_f64(meta, &key("rope.freq_base")).unwrap_or(10000.0);
    if let Some(local) = meta_f64(meta, &key("rope.freq_base_swa")) {
        config["rope_theta"] = swa.iter().map(|&s| if s { local } else { base }).collect();
    }
    if let Some(g) = meta_count(meta, path, &key("expert_gating_func"))? {
        if g != 2 {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {g}: mlx-lm's step3p5 routes by sigmoid (2)",
                    key("expert_gating_func")
                ),
            ));
        }
    }
    config["moe_num_experts"] = Value::from(need("expert_count")?);
    config["moe_top_k"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    config["share_expert_dim"] = Value::from(need("expert_shared_feed_forward_length")?);
    config["moe_router_scaling_factor"] =
        Value::from(meta_f64(meta, &key("expert_weights_scale")).ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("expert_weights_scale")),
            )
        })?);
    config["norm_expert_weight"] = Value::from(
        meta_bool(meta, path, &key("expert_weights_norm"))?.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("expert_weights_norm")),
            )
        })?,
    );
    let moe: Vec<String> = (0..blocks)
        .filter(|l| tensors.contains_key(&format!("model.layers.{l}.mlp.gate.gate.weight")))
        .map(|l| l.to_string())
        .collect();
    if moe.is_empty() {
        return Err(gguf_err(
            path,
            "no expert layer (`ffn_gate_inp`): mlx-lm's step3p5 puts experts on every layer but \
            the first when it is told none",
        ));
    }
    config["moe_layers_enum"] = Value::from(moe.join(","));
    for (k, field) in [
        ("swiglu_clamp_exp", "swiglu_limits"),
        ("swiglu_clamp_shexp", "swiglu_limits_shared"),
    ] {
        if let Some(v) = layer_list(meta, path, &key(k), blocks)? {
            config[field] = v.into_iter().collect();
        }
    }
    config["use_head_wise_attn_gate"] = Value::from(
        tensors
            .keys()
            .any(|k| k.ends_with(".self_attn.g_proj.weight")),
    );
    if let Some(o) = config.as_object_mut() {
        o.remove("num_key_value_heads");
    }
    Ok(())
}

/// Falcon-H1 (`FalconH1Model`'s keys: Mamba2Model's, then the attention's) as mlx-lm's
/// `falcon_h1`. The converter folds every multiplier into the weights (mlx-lm's sanitize does
/// the same on a checkpoint), so they are all 1 here. A tied head is refused: mlx-lm scales
/// tied logits by `lm_head_multiplier / embedding_multiplier`, which the file does not keep.
fn falcon_h1_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
) -> Result<()> {
    let arch = "falcon-h1";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    if !tensors.contains_key("lm_head.weight") {
        return Err(gguf_err(
            path,
            "no `output.weight`: a tied Falcon-H1 head needs `lm_head_multiplier` and \
             `embedding_multiplier`, which the file does not keep",
        ));
    }
    let (heads, inner) = (need("ssm.time_step_rank")?, need("ssm.inner_size")?);
    if inner % heads != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} does not divide into `{}` = {heads} heads",
                key("ssm.inner_size"),
                key("ssm.time_step_rank")
            ),
        ));
    }
    config["head_dim"] = Value::from(need("attention.key_length")?);
    config["mamba_d_ssm"] = Value::from(inner);
    config["mamba_n_heads"] = Value::from(heads);
    config["mamba_d_head"] = Value::from(inner / heads);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_n_groups"] = Value::from(need("ssm.group_count")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_rms_norm"] = Value::from(has(".mamba.norm.weight"));
    // llama.cpp gates before the norm.
    config["mamba_norm_before_gate"] = Value::from(false);
    config["mamba_conv_bias"] = Value::from(has(".mamba.conv1d.bias"));
    config["mamba_proj_bias"] = Value::from(has(".mamba.in_proj.bias"));
    config["projectors_bias"] = Value::from(has(".mamba.out_proj.bias"));
    config["attention_bias"] = Value::from(has(".self_attn.q_proj.bias"));
    config["mlp_bias"] = Value::from(has(".feed_forward.up_proj.bias"));
    for m in [
        "attention_in_multiplier",
        "attention_out_multiplier",
        "embedding_multiplier",
        "key_multiplier",
        "lm_head_multiplier",
        "ssm_in_multiplier",
        "ssm_out_multiplier",
    ] {
        config[m] = Value::from(1.0);
    }
    config["mlp_multipliers"] = json!([1.0, 1.0]);
    config["ssm_multipliers"] = json!([1.0, 1.0, 1.0, 1.0, 1.0]);
    require_context(config, path, &key("context_length"))
}

/// Jamba (`JambaModel`'s keys) as mlx-lm's `jamba`: the layer kinds from the per-layer
/// `head_count_kv` (mlx-lm's `layers_block_type`; it needs both kinds), the Mamba sizes
/// (`mamba_expand` = inner / width), and the expert layers from the tensors (no key places
/// them): mlx-lm puts experts where `(layer + expert_layer_offset) % expert_layer_period == 0`,
/// so the file's must be such a set.
fn jamba_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    kv: Option<&[i64]>,
) -> Result<()> {
    let arch = "jamba";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0);
    let n = blocks as usize;
    let kv = match kv {
        Some(k) if k.len() == n && k.contains(&0) && k.iter().any(|&h| h > 0) => k,
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must list a head count for each of the {blocks} layers, 0 on \
                     the Mamba layers; mlx-lm's jamba needs both kinds",
                    key("attention.head_count_kv")
                ),
            ))
        }
    };
    let types: Vec<&str> = kv
        .iter()
        .map(|&h| if h > 0 { "attention" } else { "mamba" })
        .collect();
    let attn: Vec<i64> = (0..blocks).filter(|&i| kv[i as usize] > 0).collect();
    config["layers_block_type"] = json!(types);
    config["attn_layer_offset"] = Value::from(attn[0]);
    config["attn_layer_period"] = Value::from(attn.get(1).map_or(blocks, |b| b - attn[0]));
    let moe: Vec<i64> = (0..blocks)
        .filter(|i| tensors.contains_key(&format!("model.layers.{i}.feed_forward.router.weight")))
        .collect();
    let (offset, period) = match moe.as_slice() {
        [] => (1, blocks + 1),
        [first, rest @ ..] => {
            let p = rest.first().map_or(blocks + 1, |s| s - first);
            ((p - first % p) % p, p)
        }
    };
    if (0..blocks).any(|i| ((i + offset) % period == 0) != moe.contains(&i)) {
        return Err(ModelError::Weights(vec![format!(
            "GGUF jamba: the layers with experts ({moe:?}) are not every n-th layer from one \
             offset, the only placement mlx-lm's jamba has"
        )]));
    }
    config["expert_layer_offset"] = Value::from(offset);
    config["expert_layer_period"] = Value::from(period);
    config["num_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    let (inner, hidden) = (need("ssm.inner_size")?, need("embedding_length")?);
    if inner % hidden != 0 {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} is not a multiple of `{}` = {hidden} (mlx-lm's \
                 `mamba_expand`)",
                key("ssm.inner_size"),
                key("embedding_length")
            ),
        ));
    }
    config["mamba_expand"] = Value::from(inner / hidden);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    config["mamba_dt_rank"] = Value::from(need("ssm.time_step_rank")?);
    let has = |t: &str| tensors.keys().any(|k| k.ends_with(t));
    config["mamba_proj_bias"] = Value::from(has(".mamba.in_proj.bias"));
    config["mamba_conv_bias"] = Value::from(has(".mamba.conv1d.bias"));
    require_context(config, path, &key("context_length"))
}

/// DBRX (`DbrxModel`'s keys) as mlx-lm's `dbrx` arguments (`attn_config`, `ffn_config`),
/// replacing the transformer fields; each layer's stacked experts become mlx-lm's list
/// (`ffn.experts.<e>.{w1, v1, w2}`: the converter's `w2` is already each expert's Linear
/// weight). mlx-lm always clips the fused projection and has its own head: a file without
/// `attention.clamp_kqv` is refused (llama.cpp would not clip), one without `output.weight`
/// gets the embedding's (llama.cpp's duplicate). mlx-lm's LayerNorms use their default
/// epsilon (1e-5, the only one the converter writes) whatever the file says.
fn dbrx_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
) -> Result<()> {
    let arch = "dbrx";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let clip = meta_f64(meta, &key("attention.clamp_kqv"))
        .filter(|c| c.is_finite() && *c > 0.0)
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}` is missing or not a positive number (mlx-lm's dbrx clips \
                     the fused projection)",
                    key("attention.clamp_kqv")
                ),
            )
        })?;
    let experts = need("expert_count")?;
    let blocks = config["num_hidden_layers"].clone();
    *config = json!({
        "model_type": "dbrx",
        "vocab_size": config["vocab_size"].clone(),
        "d_model": config["hidden_size"].clone(),
        "n_layers": blocks,
        "n_heads": config["num_attention_heads"].clone(),
        "attn_config": {
            "kv_n_heads": config["num_key_value_heads"].clone(),
            "clip_qkv": clip,
            "rope_theta": config["rope_theta"].clone(),
        },
        "ffn_config": {
            "ffn_hidden_size": config["intermediate_size"].clone(),
            "moe_num_experts": experts,
            "moe_top_k": need("expert_used_count")?,
        },
    });
    let stacked: Vec<String> = tensors
        .keys()
        .filter(|k| k.contains(".ffn.gguf_"))
        .cloned()
        .collect();
    for k in stacked {
        let (Some(a), Some((layer, rest))) = (tensors.remove(&k), k.split_once(".ffn.gguf_"))
        else {
            continue;
        };
        let (w, suffix) = rest.split_once('.').unwrap_or((rest, "weight"));
        let shape = a.shape();
        let &[n, rows, cols] = shape.as_slice() else {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor for {k}: shape {shape:?}, expected {experts} stacked experts"
            )]));
        };
        if n != experts {
            return Err(ModelError::Weights(vec![format!(
                "GGUF tensor for {k}: {n} experts, metadata `{}` says {experts}",
                key("expert_count")
            )]));
        }
        for e in 0..experts {
            let one = ops::slice_axis(&a, 0, e, e + 1, None)?.reshape(&[rows, cols])?;
            tensors.insert(format!("{layer}.ffn.experts.{e}.{w}.{suffix}"), one);
        }
    }
    if !tensors.contains_key("lm_head.weight") {
        for suffix in ["weight", "scales", "biases"] {
            if let Some(e) = tensors.get(&format!("transformer.wte.{suffix}")) {
                let e = e.clone();
                tensors.insert(format!("lm_head.{suffix}"), e);
            }
        }
    }
    if meta_count(meta, path, &key("context_length"))?.is_none() {
        return Err(gguf_err(
            path,
            format!("metadata `{}` is missing", key("context_length")),
        ));
    }
    Ok(())
}

/// Hunyuan MoE (`HunYuanMoEModel`'s keys) as mlx-lm's `hunyuan`: the rope base comes
/// already scaled by the NTK alpha (scaling "none"), so alpha is 1 here; the experts' width
/// and count, the experts used (`moe_topk`), the shared MLP (`use_mixed_mlp_moe`, its width
/// `intermediate_size` times `num_shared_expert` in mlx-lm, which the tensors must match).
/// llama.cpp gives every layer its own K / V: no cross-layer sharing (`use_cla` false).
/// mlx-lm's head size is the width over the heads: another `attention.key_length` is refused.
fn hunyuan_moe_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
) -> Result<()> {
    let arch = "hunyuan-moe";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let (hidden, heads) = (
        config["hidden_size"].as_i64().unwrap_or(0),
        config["num_attention_heads"].as_i64().unwrap_or(1),
    );
    if let Some(d) = meta_count(meta, path, &key("attention.key_length"))? {
        if i64::from(d) * heads != hidden {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {d} is not the width over the heads, the only head size \
                     mlx-lm's hunyuan has",
                    key("attention.key_length")
                ),
            ));
        }
    }
    if let Some(c) = config.as_object_mut() {
        c.remove("head_dim");
    }
    match meta_str(meta, &key("rope.scaling.type")) {
        None | Some("none") => {}
        Some(other) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {other:?}: Hunyuan's files carry the NTK-alpha base \
                     already scaled, with scaling \"none\"",
                    key("rope.scaling.type")
                ),
            ))
        }
    }
    config["rope_scaling"] = json!({"alpha": 1.0, "factor": 1.0, "type": "dynamic"});
    config["num_experts"] = Value::from(need("expert_count")?);
    config["moe_topk"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    let width = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_mlp.up_proj.weight"))
        .map(|(_, a)| i64::from(a.shape()[0]));
    let ffn = config["intermediate_size"].as_i64().unwrap_or(0);
    match width {
        None => config["use_mixed_mlp_moe"] = Value::from(false),
        Some(w) if w == ffn * i64::from(shared) => config["use_mixed_mlp_moe"] = Value::from(true),
        Some(w) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` = {shared} times `{}` = {ffn} is not the shared MLP's width \
                     ({w} rows of `ffn_up_shexp`), as mlx-lm's hunyuan sizes it",
                    key("expert_shared_count"),
                    key("feed_forward_length")
                ),
            ))
        }
    }
    config["num_shared_expert"] = Value::from(shared);
    let has = |k: &str| tensors.contains_key(k);
    config["use_qk_norm"] = Value::from(has("model.layers.0.self_attn.query_layernorm.weight"));
    config["attention_bias"] = Value::from(has("model.layers.0.self_attn.q_proj.bias"));
    config["use_cla"] = Value::from(false);
    config["cla_share_factor"] = Value::from(2);
    Ok(())
}

/// AFMoE (`AfmoeModel`'s keys) as mlx-lm's `afmoe`: with `attention.sliding_window`, the
/// per-layer flags of `attention.sliding_window_pattern` or llama.cpp's fixed pattern (three
/// sliding layers, then a full one; mlx-lm needs at least one full layer), else every layer
/// full; routing as llama.cpp reads it (sigmoid unless `expert_gating_func` says softmax, no
/// renormalization and a scale of 1 unless the keys say otherwise); the shared experts' width
/// must be mlx-lm's (`moe_intermediate_size` times their count); the embedding scaled by
/// sqrt(width), which llama.cpp always does.
fn afmoe_config(
    config: &mut Value,
    tensors: &BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    blocks: i32,
) -> Result<()> {
    let arch = "afmoe";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let window = meta_count(meta, path, &key("attention.sliding_window"))?;
    let sliding: Vec<bool> = match (window, meta.get(&key("attention.sliding_window_pattern"))) {
        (None, _) => vec![false; blocks as usize],
        (Some(_), Some(GgufValue::Array(a))) => a
            .astype(Dtype::Bool)
            .and_then(|b| b.to_vec::<bool>())
            .map_err(|e| {
                gguf_err(
                    path,
                    format!("metadata `attention.sliding_window_pattern`: {e}"),
                )
            })?,
        (Some(_), _) => (0..blocks).map(|i| (i + 1) % 4 != 0).collect(),
    };
    if sliding.len() != blocks as usize || sliding.iter().all(|&s| s) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` ({} entries for {blocks} layers) needs a full-attention layer, \
                 which mlx-lm's afmoe needs",
                key("attention.sliding_window_pattern"),
                sliding.len()
            ),
        ));
    }
    let types: Vec<&str> = sliding
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    config["layer_types"] = json!(types);
    config["sliding_window"] = Value::from(window.unwrap_or(1));
    config["score_func"] = Value::from(match meta_count(meta, path, &key("expert_gating_func"))? {
        None | Some(2) => "sigmoid",
        Some(1) => "softmax",
        Some(g) => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` is {g}; mlx-lm's afmoe routes by sigmoid (2) or softmax (1)",
                    key("expert_gating_func")
                ),
            ))
        }
    });
    config["num_experts"] = Value::from(need("expert_count")?);
    config["num_experts_per_tok"] = Value::from(need("expert_used_count")?);
    config["moe_intermediate_size"] = Value::from(need("expert_feed_forward_length")?);
    let dense = meta_layer_count(meta, path, &key("leading_dense_block_count"), blocks)?;
    config["num_dense_layers"] = Value::from(dense.unwrap_or(0));
    config["n_group"] =
        Value::from(meta_count(meta, path, &key("expert_group_count"))?.unwrap_or(1));
    config["topk_group"] =
        Value::from(meta_count(meta, path, &key("expert_group_used_count"))?.unwrap_or(1));
    config["route_norm"] =
        Value::from(meta_bool(meta, path, &key("expert_weights_norm"))?.unwrap_or(false));
    let scale = positive_f64(meta, path, &key("expert_weights_scale"))?.unwrap_or(1.0);
    config["route_scale"] = Value::from(scale);
    config["mup_enabled"] = Value::from(true);
    let shared = meta_count(meta, path, &key("expert_shared_count"))?.unwrap_or(0);
    let moe = config["moe_intermediate_size"].as_i64().unwrap_or(0);
    let width = tensors
        .iter()
        .find(|(k, _)| k.ends_with(".mlp.shared_experts.up_proj.weight"))
        .map(|(_, a)| i64::from(a.shape()[0]));
    if width.unwrap_or(0) != moe * i64::from(shared) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {shared} times `{}` = {moe} is not the shared experts' width \
                 ({width:?} rows of `ffn_up_shexp`), as mlx-lm's afmoe sizes it",
                key("expert_shared_count"),
                key("expert_feed_forward_length")
            ),
        ));
    }
    config["num_shared_experts"] = Value::from(shared);
    if meta_str(meta, &key("rope.scaling.type")).is_some_and(|t| t != "none") {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}`: rope scaling is not mapped for afmoe",
                key("rope.scaling.type")
            ),
        ));
    }
    if meta_f64(meta, &key("rope.freq_base_swa"))
        .is_some_and(|b| Some(b) != config["rope_theta"].as_f64())
    {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` differs from the base; mlx-lm's afmoe has one",
                key("rope.freq_base_swa")
            ),
        ));
    }
    if config.get("head_dim").is_none() {
        let (h, n) = (
            config["hidden_size"].as_i64().unwrap_or(0),
            config["num_attention_heads"].as_i64().unwrap_or(1).max(1),
        );
        config["head_dim"] = Value::from(h / n);
    }
    require_context(config, path, &key("context_length"))
}

/// DeepSeek V3.2 (`DeepseekV32Model`'s keys) as mlx-lm's `deepseek_v32`, and GLM-5
/// (`GlmMoeDsaModel`'s, `glm-dsa`) as its `glm_moe_dsa`, after [`deepseek2_config`]: the
/// indexer's head count, head size and top-k; GLM-5's rope as `rope_parameters`. Their MLA
/// is deepseek_v3's (a sigmoid router: `expert_gating_func` 2). A GLM-5 file whose
/// `attention.indexer.types` skips the indexer on some layers is refused: mlx-lm's has one on
/// every layer.
fn deepseek32_config(
    config: &mut Value,
    path: &Path,
    meta: &GgufMetadata,
    arch: &str,
) -> Result<()> {
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    if config["model_type"] != "deepseek_v3" {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` is not sigmoid (2), the router of mlx-lm's {}",
                key("expert_gating_func"),
                if arch == "glm-dsa" {
                    "glm_moe_dsa"
                } else {
                    "deepseek_v32"
                }
            ),
        ));
    }
    if arch == "glm-dsa" {
        if let Some(GgufValue::Array(a)) = meta.get(&key("attention.indexer.types")) {
            let full = a
                .astype(Dtype::Bool)
                .and_then(|b| b.to_vec::<bool>())
                .map_err(|e| gguf_err(path, format!("metadata `attention.indexer.types`: {e}")))?;
            if full.contains(&false) {
                return Err(gguf_err(
                    path,
                    format!(
                        "metadata `{}` skips the indexer on some layers; mlx-lm's glm_moe_dsa \
                         has one on every layer",
                        key("attention.indexer.types")
                    ),
                ));
            }
        }
        let theta = config["rope_theta"].clone();
        let mut rp = match config.get("rope_scaling") {
            Some(rs @ Value::Object(_)) => rs.clone(),
            _ => json!({"rope_type": "default"}),
        };
        rp["rope_theta"] = theta;
        config["rope_parameters"] = rp;
        config["model_type"] = Value::from("glm_moe_dsa");
    } else {
        config["model_type"] = Value::from("deepseek_v32");
    }
    config["index_n_heads"] = Value::from(need("attention.indexer.head_count")?);
    config["index_head_dim"] = Value::from(need("attention.indexer.key_length")?);
    config["index_topk"] = Value::from(need("attention.indexer.top_k")?);
    Ok(())
}

/// Ling 1.0's `attn_q` / `attn_k` (rows permuted by the heads / KV heads, as the llama class
/// does) and `attn_v` joined back into mlx-lm's `query_key_value` (scales and biases with
/// their rows).
fn join_bailing_qkv(
    tensors: &mut BTreeMap<String, Array>,
    blocks: i32,
    heads: i32,
    kv: i32,
) -> Result<()> {
    for l in 0..blocks {
        let p = format!("model.layers.{l}.attention");
        for suffix in ["weight", "scales", "biases", "bias"] {
            let part = |t: &str| format!("{p}.gguf_{t}.{suffix}");
            let (q, k, v) = (
                tensors.remove(&part("q")),
                tensors.remove(&part("k")),
                tensors.remove(&part("v")),
            );
            match (q, k, v) {
                (None, None, None) => {}
                (Some(q), Some(k), Some(v)) if suffix != "bias" => {
                    let q = unpermute(
                        &q,
                        heads,
                        &format!("blk.{l}.attn_q.{suffix}"),
                        "attention.head_count",
                    )?;
                    let k = unpermute(
                        &k,
                        kv,
                        &format!("blk.{l}.attn_k.{suffix}"),
                        "attention.head_count_kv",
                    )?;
                    let joined = ops::concatenate(&[&q, &k, &v], 0, None)?;
                    tensors.insert(format!("{p}.query_key_value.{suffix}"), joined);
                }
                _ => {
                    return Err(ModelError::Weights(vec![format!(
                        "GGUF tensors blk.{l}.attn_q / attn_k / attn_v .{suffix}: not all three, \
                         or biases (which this map does not un-permute)"
                    )]))
                }
            }
        }
    }
    Ok(())
}

/// PLaMo 2 (`Plamo2Model`'s keys) as mlx-lm's `plamo2`: `mamba_step` from the per-layer
/// `head_count_kv` (mlx-lm places attention where `i % step == step / 2`, or on the last layer
/// alone when `step / 2` reaches the depth: the file's layers must be such a set), the head
/// size (`key_length`), the Mamba sizes (inner = Mamba heads * head size); each RMSNorm's
/// offset, which the converter added, subtracted in the tensor's dtype (mlx-lm adds it back
/// at run time); `ssm_dt.bias` as the bare `dt_bias`. mlx-lm's attention rotates with base
/// 10000 whatever the file says, as it does for the checkpoint.
fn plamo2_config(
    config: &mut Value,
    tensors: &mut BTreeMap<String, Array>,
    path: &Path,
    meta: &GgufMetadata,
    kv: Option<&[i64]>,
) -> Result<()> {
    let arch = "plamo2";
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| need_count(meta, path, arch, k);
    let blocks = config["num_hidden_layers"].as_i64().unwrap_or(0);
    let attn: Vec<bool> = match kv {
        Some(k) if k.len() == blocks as usize => k.iter().map(|&h| h > 0).collect(),
        _ => {
            return Err(gguf_err(
                path,
                format!(
                    "metadata `{}` must list a head count for each of the {blocks} layers (0 on \
                     the Mamba layers)",
                    key("attention.head_count_kv")
                ),
            ))
        }
    };
    let is_mamba = |step: i64, i: i64| {
        if blocks <= step / 2 {
            i != blocks - 1
        } else {
            i % step != step / 2
        }
    };
    let step = (1..=2 * blocks + 2)
        .find(|&s| (0..blocks).all(|i| is_mamba(s, i) != attn[i as usize]))
        .ok_or_else(|| {
            gguf_err(
                path,
                format!(
                    "metadata `{}`: the attention layers are not every `mamba_step`-th, the only \
                     placement mlx-lm's plamo2 has",
                    key("attention.head_count_kv")
                ),
            )
        })?;
    let (heads, inner, hd) = (
        need("ssm.time_step_rank")?,
        need("ssm.inner_size")?,
        need("attention.key_length")?,
    );
    if i64::from(heads) * i64::from(hd) != i64::from(inner) {
        return Err(gguf_err(
            path,
            format!(
                "metadata `{}` = {inner} is not `{}` = {heads} times `{}` = {hd}, as mlx-lm's \
                 plamo2 sizes the Mamba layers",
                key("ssm.inner_size"),
                key("ssm.time_step_rank"),
                key("attention.key_length")
            ),
        ));
    }
    config["mamba_step"] = Value::from(step);
    config["mamba_enabled"] = Value::from(true);
    config["mamba_num_heads"] = Value::from(heads);
    config["hidden_size_per_head"] = Value::from(hd);
    config["mamba_d_state"] = Value::from(need("ssm.state_size")?);
    config["mamba_d_conv"] = Value::from(need("ssm.conv_kernel")?);
    for l in 0..blocks {
        let p = format!("model.layers.layers.{l}");
        if let Some(b) = tensors.remove(&format!("{p}.mixer.dt_proj.bias")) {
            tensors.insert(format!("{p}.mixer.dt_bias"), b);
        }
    }
    let offsets = [
        ("pre_mixer_norm", 1.0),
        ("post_mixer_norm", 1.0 / 5.0),
        ("pre_mlp_norm", 1.0),
        ("post_mlp_norm", 1.0 / 5f64.powf(1.5)),
    ];
    let names: Vec<(String, f64)> = tensors
        .keys()
        .filter_map(|k| {
            if k == "model.norm.weight" {
                return Some((k.clone(), 1.0));
            }
            let module = k.strip_suffix(".weight")?.rsplit('.').next()?;
            offsets
                .iter()
                .find(|(m, _)| *m == module)
                .map(|(_, o)| (k.clone(), *o))
        })
        .collect();
    for (k, o) in names {
        if let Some(w) = tensors.remove(&k) {
            let off = Scalar::from(o).to_array_like(w.dtype())?;
            tensors.insert(k, ops::subtract(&w, &off, None)?);
        }
    }
    Ok(())
}

/// What `mlx info` prints about a GGUF file of a supported architecture, without building
/// the model: the mapped config's descriptor and the tensors as they would be loaded (MLX's
/// GGUF reader quantizes with group size 32).
pub fn gguf_model_info(path: &Path) -> Result<crate::load::ModelInfo> {
    let g = read_gguf(path)?;
    crate::load::info_of(g.config, &g.tensors, 32)
}

/// Loads a GGUF file of a supported architecture as a model.
pub fn load_gguf_model(
    path: &Path,
    opts: &LoadOptions,
) -> Result<(Box<dyn LanguageModel>, GgufModel)> {
    load_gguf_model_with(path, opts, GgufTensors::Auto)
}

/// [`load_gguf_model`] with the tensors obtained as `how` says.
pub fn load_gguf_model_with(
    path: &Path,
    opts: &LoadOptions,
    how: GgufTensors,
) -> Result<(Box<dyn LanguageModel>, GgufModel)> {
    let g = read_gguf_with(path, how)?;
    let weights = Weights::new(g.tensors.clone(), None, opts.dtype).with_ggml(g.blocks.clone());
    let model = build(&g.config, weights)?;
    Ok((model, g))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `LlamaModel.generate_extra_tensors`'s factors in f32, as llama.cpp's converter
    /// computes them (torch float32).
    fn converter_factors(
        base: f32,
        dim: i32,
        factor: f32,
        low: f32,
        high: f32,
        old: f32,
    ) -> Vec<f32> {
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0f32 / base.powf((2 * i) as f32 / dim as f32);
                let wavelen = (2.0 * std::f64::consts::PI) as f32 / freq;
                if wavelen < old / high {
                    1.0
                } else if wavelen > old / low {
                    factor
                } else {
                    let s = (old / wavelen - low) / (high - low);
                    1.0 / ((1.0 - s) / factor + s)
                }
            })
            .collect()
    }

    /// BitNet: ternary values times one scale pack into mlx-lm's codes (row `r + i * out / 4`
    /// in bits `2i..2i + 2` of row `r`) with the scale in the weight's dtype; all-zero weights
    /// take scale 1; a second magnitude or rows not a multiple of 4 are refused.
    #[test]
    fn bitnet_weights_pack_into_codes_and_one_scale() -> Result<()> {
        let h = |v: &[f32]| {
            v.iter()
                .map(|&x| half::f16::from_f32(x))
                .collect::<Vec<_>>()
        };
        let w = Array::from_slice(&h(&[0.5, 0.0, -0.5, 0.5, 0.0, 0.0, 0.5, -0.5]), &[4, 2])?;
        let (packed, scale) = bitnet_pack(&w).unwrap();
        assert_eq!(packed.dtype(), Dtype::Uint8);
        assert_eq!(packed.shape(), vec![1, 2]);
        assert_eq!(
            packed.to_vec::<u8>()?,
            vec![2 | 1 << 4 | 2 << 6, 1 | 2 << 2 | 1 << 4]
        );
        assert_eq!(scale.dtype(), Dtype::Float16);
        assert_eq!(scale.astype(Dtype::Float32)?.to_vec::<f32>()?, vec![0.5]);
        let zero = Array::from_slice(&[0.0f32; 8], &[4, 2])?;
        let (packed, scale) = bitnet_pack(&zero).unwrap();
        assert_eq!(packed.to_vec::<u8>()?, vec![0b0101_0101; 2]);
        assert_eq!(scale.to_vec::<f32>()?, vec![1.0]);
        let two = Array::from_slice(&[0.5f32, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], &[4, 2])?;
        assert!(bitnet_pack(&two).unwrap_err().contains("at (0, 1)"));
        let three = Array::from_slice(&[0.5f32; 6], &[3, 2])?;
        assert!(bitnet_pack(&three).unwrap_err().contains("3 rows"));
        Ok(())
    }

    /// Llama 3.1 (factor 8) and 3.2 (factor 32) as released (theta 500000, head 128, original
    /// context 8192, low 1, high 4): the parameters come back exactly.
    #[test]
    fn llama3_rope_parameters_are_recovered_from_rope_freqs() -> Result<()> {
        for factor in [8.0f32, 32.0] {
            let f = converter_factors(500_000.0, 128, factor, 1.0, 4.0, 8192.0);
            let a = Array::from_slice(&f, &[64])?;
            let mut config = json!({"head_dim": 128, "rope_theta": 500000.0});
            llama3_rope(&mut config, &a, Path::new("x.gguf"), 128)?;
            assert_eq!(
                config["rope_scaling"],
                json!({
                    "rope_type": "llama3",
                    "factor": f64::from(factor),
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                })
            );
        }
        // Llama 4 Scout (theta 500000, head 128, factor 16, low = high = 1, original context
        // 8192): no blended band; a step at 8192 between two adjacent frequencies.
        let f = converter_factors(500_000.0, 128, 16.0, 1.0, 1.0, 8192.0);
        let a = Array::from_slice(&f, &[64])?;
        let mut config = json!({"head_dim": 128, "rope_theta": 500000.0});
        llama3_rope(&mut config, &a, Path::new("x.gguf"), 128)?;
        assert_eq!(
            config["rope_scaling"],
            json!({
                "rope_type": "llama3",
                "factor": 16.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            })
        );
        // Factors no Llama 3 scaling gives are refused, naming the tensor.
        let mut f = converter_factors(500_000.0, 128, 8.0, 1.0, 4.0, 8192.0);
        f[40] = 3.0;
        f[10] = 5.0;
        let a = Array::from_slice(&f, &[64])?;
        let mut config = json!({"head_dim": 128, "rope_theta": 500000.0});
        let e = llama3_rope(&mut config, &a, Path::new("x.gguf"), 128).unwrap_err();
        assert!(e.to_string().contains("rope_freqs"), "{e}");
        Ok(())
    }

    /// Gemma 3n's sparsity values come back from the converter's f32 quantiles.
    #[test]
    fn normal_cdf_recovers_sparsity_values() {
        // torch.distributions.Normal(0, 1).icdf(s) in float32, for s = 0.95, 0.5, 0.99.
        for (t, s) in [(1.644_853_6f32, 0.95), (0.0, 0.5), (2.326_347_9, 0.99)] {
            let p = (normal_cdf(f64::from(t)) * 1e6).round() / 1e6;
            assert_eq!(p, s, "{t}");
        }
        assert_eq!(normal_cdf(f64::NEG_INFINITY), 0.0);
        assert!((normal_cdf(-1.0) - 0.158_655_253_931_457).abs() < 1e-14);
    }

    /// Qwen 3.5's value heads untiled on a quantized `ssm_out` (MLX's affine triple of a
    /// Q4_0 / Q8_0 file): whole groups of columns move with their head, so untiling the packed
    /// weight, scales and biases by heads dequantizes to the untiled weight.
    #[test]
    fn value_heads_untile_on_quantized_columns() -> Result<()> {
        use mlx_core::quantized::{dequantize, quantize, QuantMode};
        let (nk, r, dv) = (2, 3, 32);
        let nv = nk * r;
        let w = mlx_core::random::normal(&[8, nv * dv], Dtype::Float32, None, None, None, None)?;
        let (q, sc, b) = quantize(&w, 32, 4, QuantMode::Affine, None)?;
        let b = b.ok_or_else(|| ModelError::Weights(vec!["no biases".into()]))?;
        let by_heads = |a: &Array| untile_v_heads(a, 1, nk, r, a.shape()[1] / nv);
        let (uq, us, ub) = (by_heads(&q)?, by_heads(&sc)?, by_heads(&b)?);
        let deq = |q: &Array, s: &Array, b: &Array| {
            dequantize(q, s, Some(b), 32, 4, QuantMode::Affine, None, None)
        };
        let got = deq(&uq, &us, &ub)?;
        let want = untile_v_heads(&deq(&q, &sc, &b)?, 1, nk, r, dv)?;
        assert_eq!(got.to_vec::<f32>()?, want.to_vec::<f32>()?);
        // And untiling is the converter's tiling undone: tiled (r, nk) -> grouped (nk, r).
        let ids = Array::from_slice(&(0..nv).collect::<Vec<i32>>(), &[nv])?;
        let tiled = untile_v_heads(&ids, 0, r, nk, 1)?;
        assert_eq!(tiled.to_vec::<i32>()?, vec![0, 3, 1, 4, 2, 5]);
        let back = untile_v_heads(&tiled, 0, nk, r, 1)?;
        assert_eq!(back.to_vec::<i32>()?, (0..nv).collect::<Vec<i32>>());
        Ok(())
    }
}
