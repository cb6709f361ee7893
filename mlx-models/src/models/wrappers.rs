//! Multimodal wrappers whose text tower is a dedicated port (issue #32): only the text model
//! is built (vision comes later), from the wrapper's `text_config`, with the wrapper's weight
//! names mapped back to the port's as mlx-lm's `sanitize` does.

use serde_json::{Map, Value};

use super::{lfm2, moe, LanguageModel};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::Weights;

/// The wrapper's `text_config` as the port's own config (`model_type` set to the port's:
/// mlx-lm builds the port's `ModelArgs` from it whatever type it names).
fn text_config(c: &ModelConfig, port: &str) -> Result<(ModelConfig, Map<String, Value>)> {
    let field = |what: &str| {
        ModelError::Config(format!(
            "config.json (`{}`): field `text_config` {what}",
            c.model_type
        ))
    };
    let mut t = match c.raw.get("text_config") {
        Some(Value::Object(m)) => m.clone(),
        Some(Value::Null) | None => return Err(field("is required but missing")),
        Some(v) => return Err(field(&format!("must be an object, got {v}"))),
    };
    t.insert("model_type".into(), port.into());
    // The wrapper's quantization block applies to the text model's modules.
    if let Some(q) = c.raw.get("quantization") {
        t.entry("quantization").or_insert_with(|| q.clone());
    }
    let inner = ModelConfig::from_value(Value::Object(t.clone()))?;
    Ok((inner, t))
}

/// `models/lfm2-vl.py`: `lfm2` on `text_config` with `tie_word_embeddings` forced off;
/// `vision_tower` and `multi_modal_projector` dropped, `language_model.` taken off.
pub(super) fn lfm2_vl(c: &ModelConfig, w: &mut Weights) -> Result<Box<dyn LanguageModel>> {
    let (_, mut t) = text_config(c, "lfm2")?;
    t.insert("tie_word_embeddings".into(), false.into());
    let inner = ModelConfig::from_value(Value::Object(t))?;
    w.discard_prefix("vision_tower.");
    w.discard_prefix("multi_modal_projector.");
    w.strip_prefix("language_model.");
    Ok(Box::new(lfm2::Model::load(&inner, w)?))
}

/// `models/qwen3_vl_moe.py`: `qwen3_moe` on `text_config`; `sanitize` keeps the language model
/// (`model.language_model.*` with a top-level `lm_head`, or `language_model.*`) and drops
/// `visual`.
pub(super) fn qwen3_vl_moe(c: &ModelConfig, w: &mut Weights) -> Result<Box<dyn LanguageModel>> {
    let (inner, _) = text_config(c, "qwen3_moe")?;
    let nested = w
        .names()
        .iter()
        .any(|k| k.starts_with("model.language_model."));
    if nested {
        w.rename_all(|k| {
            if let Some(rest) = k.strip_prefix("model.language_model.") {
                Some(format!("model.{rest}"))
            } else if k.starts_with("lm_head.") {
                Some(k.to_string())
            } else {
                None
            }
        })?;
    } else {
        w.rename_all(|k| {
            let rest = k.strip_prefix("language_model.")?;
            (rest.starts_with("model.") || rest.starts_with("lm_head.")).then(|| rest.to_string())
        })?;
    }
    Ok(Box::new(moe::Model::load(&inner, w)?))
}

/// `models/gemma4.py`: `gemma4_text` on `text_config` (`vocab_size` from the wrapper, 8 heads
/// and 1 KV head unless given). `sanitize`: a leading `model.` comes off, vision and audio
/// modules go, a prefixed `language_model.` becomes `language_model.model.`; then the text
/// model's own `sanitize` (in the port).
pub(super) fn gemma4(c: &ModelConfig, w: &mut Weights) -> Result<Box<dyn LanguageModel>> {
    let mut t = match c.raw.get("text_config") {
        Some(Value::Object(m)) => m.clone(),
        Some(Value::Null) | None => Map::new(),
        Some(v) => {
            return Err(ModelError::Config(format!(
                "config.json (`{}`): field `text_config` must be an object, got {v}",
                c.model_type
            )))
        }
    };
    let vocab = match c.raw.get("vocab_size") {
        None | Some(Value::Null) => Value::from(262144),
        Some(v) => v.clone(),
    };
    t.insert("vocab_size".into(), vocab);
    t.entry("num_attention_heads").or_insert(8.into());
    t.entry("num_key_value_heads").or_insert(1.into());
    t.insert("model_type".into(), "gemma4_text".into());
    if let Some(q) = c.raw.get("quantization") {
        t.entry("quantization").or_insert_with(|| q.clone());
    }
    let inner = ModelConfig::from_value(Value::Object(t))?;
    const DROPPED: [&str; 6] = [
        "vision_tower",
        "multi_modal_projector",
        "audio_tower",
        "embed_audio",
        "embed_vision",
        "vision_embedder",
    ];
    w.rename_all(|k| {
        let (with_model, k) = match k.strip_prefix("model.") {
            Some(r) => (true, r),
            None => (false, k),
        };
        if DROPPED.iter().any(|p| k.starts_with(p)) {
            return None;
        }
        let k = if with_model && k.starts_with("language_model") {
            k.replace("language_model.", "language_model.model.")
        } else {
            k.to_string()
        };
        Some(k.strip_prefix("language_model.").unwrap_or(&k).to_string())
    })?;
    Ok(Box::new(super::gemma4_text::Model::load(&inner, w)?))
}
