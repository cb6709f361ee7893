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

fn cfg_err(path: &Path, m: impl std::fmt::Display) -> ModelError {
    ModelError::Config(format!("{}: {m}", path.display()))
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
/// quantized tensor move with their rows.
fn unpermute(a: &Array, heads: i32) -> Result<Array> {
    let shape = a.shape();
    let (rows, cols) = (shape[0], shape[1]);
    let hd = rows / heads;
    let v = ops::reshape(a, &[heads, hd / 2, 2, cols], None)?;
    let v = ops::swapaxes(&v, 1, 2, None)?;
    Ok(ops::reshape(&v, &[rows, cols], None)?)
}

/// Reads a llama-architecture GGUF file.
pub fn read_gguf(path: &Path) -> Result<GgufModel> {
    let (raw, metadata) = load_gguf(path, None).map_err(|e| cfg_err(path, e))?;
    let arch = meta_str(&metadata, "general.architecture").unwrap_or("");
    if arch != "llama" {
        return Err(ModelError::UnsupportedModelType {
            model_type: format!("gguf:{arch}"),
            remapped_to: None,
            supported: vec!["gguf:llama".into()],
        });
    }
    let num = |key: &str| -> Result<f64> {
        meta_f64(&metadata, &format!("llama.{key}"))
            .ok_or_else(|| cfg_err(path, format!("metadata `llama.{key}` missing")))
    };
    let heads = num("attention.head_count")? as i32;
    let kv_heads = meta_f64(&metadata, "llama.attention.head_count_kv").map_or(heads, |v| v as i32);
    let hidden = num("embedding_length")? as i32;
    let vocab = match meta_f64(&metadata, "llama.vocab_size") {
        Some(v) => v as i32,
        None => match metadata.get("tokenizer.ggml.tokens") {
            Some(GgufValue::Strings(t)) => t.len() as i32,
            _ => {
                return Err(cfg_err(
                    path,
                    "no vocabulary size (llama.vocab_size or tokenizer.ggml.tokens)",
                ))
            }
        },
    };
    let mut tensors = BTreeMap::new();
    let mut unknown = Vec::new();
    for (name, a) in raw {
        match map_name(&name) {
            Some(m) => {
                let a = if m.contains(".self_attn.q_proj.") {
                    unpermute(&a, heads)?
                } else if m.contains(".self_attn.k_proj.") {
                    unpermute(&a, kv_heads)?
                } else {
                    a
                };
                tensors.insert(m, a);
            }
            None => unknown.push(name),
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ModelError::Weights(
            unknown
                .into_iter()
                .map(|n| format!("unexpected GGUF tensor: {n}"))
                .collect(),
        ));
    }
    let tied = !tensors.contains_key("lm_head.weight");
    let mut config = json!({
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": num("block_count")? as i64,
        "intermediate_size": num("feed_forward_length")? as i64,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": num("attention.layer_norm_rms_epsilon")?,
        "vocab_size": vocab,
        "rope_theta": meta_f64(&metadata, "llama.rope.freq_base").unwrap_or(10000.0),
        "tie_word_embeddings": tied,
    });
    if let Some(ctx) = meta_f64(&metadata, "llama.context_length") {
        config["max_position_embeddings"] = Value::from(ctx as i64);
    }
    if let Some(d) = meta_f64(&metadata, "llama.rope.dimension_count") {
        if d as i32 != hidden / heads {
            config["head_dim"] = Value::from(d as i64);
        }
    }
    let config = ModelConfig::from_value(config)?;
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

/// The tokenizer part of GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).
pub fn tokenizer_data(meta: &GgufMetadata) -> Result<crate::GgufTokenizerData> {
    let strings = |k: &str| -> Option<Vec<String>> {
        match meta.get(k) {
            Some(GgufValue::Strings(v)) => Some(v.clone()),
            _ => None,
        }
    };
    let id = |k: &str| meta_f64(meta, k).map(|v| v as u32);
    let flag = |k: &str| meta.get_bool(k).ok();
    let token_types = match meta.get("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(a)) => Some(a.astype(Dtype::Int32)?.to_vec::<i32>()?),
        _ => None,
    };
    Ok(crate::GgufTokenizerData {
        model: meta_str(meta, "tokenizer.ggml.model")
            .ok_or_else(|| ModelError::Config("GGUF metadata has no tokenizer.ggml.model".into()))?
            .to_string(),
        pre: meta_str(meta, "tokenizer.ggml.pre").map(str::to_string),
        tokens: strings("tokenizer.ggml.tokens").ok_or_else(|| {
            ModelError::Config("GGUF metadata has no tokenizer.ggml.tokens".into())
        })?,
        token_types,
        merges: strings("tokenizer.ggml.merges").unwrap_or_default(),
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        unk_id: id("tokenizer.ggml.unknown_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: flag("tokenizer.ggml.add_bos_token"),
        add_eos: flag("tokenizer.ggml.add_eos_token"),
        chat_template: meta_str(meta, "tokenizer.chat_template").map(str::to_string),
    })
}
