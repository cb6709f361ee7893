//! GGUF model files, read through MLX's loader: llama-architecture tensor names mapped to
//! mlx-lm's, the Q/K rows un-permuted (llama.cpp stores them interleaved for its rope),
//! hyper-parameters from metadata, and the tokenizer data.
//!
//! MLX returns Q4_0 / Q4_1 / Q8_0 tensors as affine-quantized triples (`<name>.weight`,
//! `.scales`, `.biases`, group size 32) and every other GGUF type as f16; quantization is then
//! inferred from the shapes exactly as mlx-lm infers it for a checkpoint without a
//! `quantization` block.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::io::{load_gguf, GgufMetadata, GgufValue};
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

/// `llama.cpp` tensor names to mlx-lm's.
fn map_name(name: &str) -> Option<String> {
    let (base, suffix) = name.rsplit_once('.')?;
    let mapped = match base {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let rest = base.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let part = match part {
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

/// Reads a llama-architecture GGUF file.
pub fn read_gguf(path: &Path) -> Result<GgufModel> {
    let (raw, metadata) = load_gguf(path, None)?;
    let arch = meta_str(&metadata, "general.architecture").unwrap_or("");
    if arch != "llama" {
        return Err(ModelError::UnsupportedModelType {
            model_type: format!("gguf:{arch}"),
            supported: vec!["gguf:llama".into()],
        });
    }
    let num = |key: &str| -> Result<f64> {
        meta_f64(&metadata, &format!("llama.{key}"))
            .filter(|v| v.is_finite())
            .ok_or_else(|| {
                gguf_err(
                    path,
                    format!("metadata `llama.{key}` is missing or not a finite number"),
                )
            })
    };
    let count = |key: &str| -> Result<i32> {
        meta_count(&metadata, path, &format!("llama.{key}"))?
            .ok_or_else(|| gguf_err(path, format!("metadata `llama.{key}` is missing")))
    };
    let heads = count("attention.head_count")?;
    let kv_heads = meta_count(&metadata, path, "llama.attention.head_count_kv")?.unwrap_or(heads);
    let hidden = count("embedding_length")?;
    let vocab =
        match meta_count(&metadata, path, "llama.vocab_size")? {
            Some(v) => v,
            None => match metadata.get("tokenizer.ggml.tokens") {
                Some(GgufValue::Strings(t)) => i32::try_from(t.len()).map_err(|_| {
                    gguf_err(
                        path,
                        "metadata `tokenizer.ggml.tokens` has too many entries",
                    )
                })?,
                _ => return Err(gguf_err(
                    path,
                    "no vocabulary size (metadata `llama.vocab_size` or `tokenizer.ggml.tokens`)",
                )),
            },
        };
    let blocks = count("block_count")?;
    let ffn = count("feed_forward_length")?;
    let mut tensors = BTreeMap::new();
    let mut unknown = Vec::new();
    for (name, a) in raw {
        match map_name(&name) {
            Some(m) => {
                let a = if m.contains(".self_attn.q_proj.") {
                    unpermute(&a, heads, &name, "llama.attention.head_count")?
                } else if m.contains(".self_attn.k_proj.") {
                    unpermute(&a, kv_heads, &name, "llama.attention.head_count_kv")?
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
    let mut config = json!({
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": blocks,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": num("attention.layer_norm_rms_epsilon")?,
        "vocab_size": vocab,
        "rope_theta": meta_f64(&metadata, "llama.rope.freq_base").unwrap_or(10000.0),
        "tie_word_embeddings": tied,
    });
    if let Some(ctx) = meta_count(&metadata, path, "llama.context_length")? {
        config["max_position_embeddings"] = Value::from(ctx);
    }
    if let Some(d) = meta_count(&metadata, path, "llama.rope.dimension_count")? {
        if d != hidden / heads {
            config["head_dim"] = Value::from(d);
        }
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

/// Loads a llama-architecture GGUF file as a model.
pub fn load_gguf_model(
    path: &Path,
    opts: &LoadOptions,
) -> Result<(Box<dyn LanguageModel>, GgufModel)> {
    let g = read_gguf(path)?;
    let weights = Weights::new(g.tensors.clone(), None, opts.dtype);
    let model = build(&g.config, weights)?;
    Ok((model, g))
}
