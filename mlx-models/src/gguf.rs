//! GGUF model files, read through MLX's loader: llama.cpp tensor names mapped to mlx-lm's per
//! architecture (llama, qwen2, qwen3, phi3, gemma, gemma2, gemma3, qwen2moe, qwen3moe, olmo2,
//! granite, glm4), llama's and granite's Q/K rows un-permuted (llama.cpp stores them interleaved for its
//! rope), Gemma's `1 + w` norms
//! turned back into mlx-lm's `w`, hyper-parameters from metadata, and the tokenizer data.
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
}

const GEMMA2_PARTS: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
];

const ARCHS: &[GgufArch] = &[
    GgufArch {
        arch: "llama",
        model_type: "llama",
        permute_qk: true,
        norm_plus_one: false,
        parts: &[],
    },
    GgufArch {
        arch: "qwen2",
        model_type: "qwen2",
        permute_qk: false,
        norm_plus_one: false,
        parts: &[],
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
    },
    GgufArch {
        arch: "gemma",
        model_type: "gemma",
        permute_qk: false,
        norm_plus_one: true,
        parts: &[],
    },
    GgufArch {
        arch: "gemma2",
        model_type: "gemma2",
        permute_qk: false,
        norm_plus_one: true,
        parts: GEMMA2_PARTS,
    },
    GgufArch {
        arch: "gemma3",
        model_type: "gemma3_text",
        permute_qk: false,
        norm_plus_one: true,
        parts: GEMMA2_PARTS,
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
    },
    // llama.cpp's converter writes granite through its llama class: Q / K permuted.
    GgufArch {
        arch: "granite",
        model_type: "granite",
        permute_qk: true,
        norm_plus_one: false,
        parts: &[],
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
    },
];

/// `llama.cpp` tensor names to mlx-lm's, for `a`.
fn map_name(a: &GgufArch, name: &str) -> Option<String> {
    let (base, suffix) = name.rsplit_once('.')?;
    let mapped = match base {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let rest = base.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let part = match a.parts.iter().find(|(from, _)| *from == part) {
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
            format!("model.layers.{layer}.{part}")
        }
    };
    Some(format!("{mapped}.{suffix}"))
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
}

/// GGML types MLX's GGUF reader loads without converting them (F32, F16, Q4_0, Q4_1, Q8_0).
const MLX_NATIVE_TYPES: &[u32] = &[0, 1, 2, 3, 8];

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
    let (raw, metadata) = match how {
        GgufTensors::Auto => {
            let header = read_gguf_header(path).map_err(|e| gguf_err(path, e))?;
            if header
                .tensors
                .iter()
                .all(|t| MLX_NATIVE_TYPES.contains(&t.ggml_type))
            {
                load_gguf(path, None).map_err(|e| gguf_err(path, e))?
            } else {
                dequantized_with(path, header)?
            }
        }
        GgufTensors::Dequantize => read_gguf_dequantized(path)?,
        GgufTensors::Mlx => load_gguf(path, None).map_err(|e| gguf_err(path, e))?,
    };
    let arch_name = meta_str(&metadata, "general.architecture").unwrap_or("");
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
    let heads = count("attention.head_count")?;
    let kv_heads = meta_count(&metadata, path, &key("attention.head_count_kv"))?.unwrap_or(heads);
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
    let ffn = count("feed_forward_length")?;
    let mut tensors = BTreeMap::new();
    let mut unknown = Vec::new();
    for (name, a) in raw {
        match map_name(arch, &name) {
            Some(m) => {
                let a = if arch.permute_qk && m.contains(".self_attn.q_proj.") {
                    unpermute(&a, heads, &name, &key("attention.head_count"))?
                } else if arch.permute_qk && m.contains(".self_attn.k_proj.") {
                    unpermute(&a, kv_heads, &name, &key("attention.head_count_kv"))?
                } else if m.ends_with(".shared_expert_gate.weight") && a.ndim() == 1 {
                    // One gate row, which a converter may store as a vector.
                    let h = a.shape()[0];
                    a.reshape(&[1, h])?
                } else if arch.norm_plus_one && name.contains("_norm.") {
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
    let tied = !tensors.contains_key("lm_head.weight");
    let head_dim = match meta_count(&metadata, path, &key("attention.key_length"))? {
        Some(d) => Some(i64::from(d)),
        None => meta_count(&metadata, path, &key("rope.dimension_count"))?.map(i64::from),
    };
    let mut config = json!({
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": blocks,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": float("attention.layer_norm_rms_epsilon", true)?.ok_or_else(|| {
            gguf_err(
                path,
                format!("metadata `{}` is missing", key("attention.layer_norm_rms_epsilon")),
            )
        })?,
        "vocab_size": vocab,
        "rope_theta": float("rope.freq_base", false)?.unwrap_or(10000.0),
        "tie_word_embeddings": tied,
    });
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
        "phi3" => {
            if let Some(d) = float("rope.dimension_count", false)? {
                let hd = f64::from(hidden / heads);
                config["partial_rotary_factor"] = Value::from(d / hd);
            }
        }
        "qwen3moe" => {
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
        "granite" => {
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
        _ => {}
    }
    let config = ModelConfig::from_value(config).map_err(|e| match e {
        ModelError::Config(m) => gguf_err(path, format!("hyper-parameters: {m}")),
        other => other,
    })?;
    Ok(GgufModel {
        config,
        tensors,
        metadata,
    })
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
    let weights = Weights::new(g.tensors.clone(), None, opts.dtype);
    let model = build(&g.config, weights)?;
    Ok((model, g))
}
