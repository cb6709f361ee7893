//! mlx-lm 0.32.2 `models/prism_hadamard_qwen35.py`: a Hadamard pack of Qwen 3.5. The text
//! model is qwen3_5 (`qwen3_next.rs`); the modules the config's `modules` manifest names are
//! 2-bit affine (group 128) with a signed, normalised blockwise Walsh-Hadamard rotation folded
//! into their input axis. A packed linear rotates its input (`x * signs`, then
//! `hadamard_transform` over blocks of `block`, in float32) before the quantized product; the
//! packed embedding dequantizes its rows to float16 and rotates them back (`* signs` after the
//! transform). Each stands in for the loaded quantized module as an adapter ([`Linear::Adapted`],
//! [`Embedding::Adapted`]), so the qwen3_5 port is unchanged.

use std::collections::HashMap;

use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use super::{qwen3_next, LanguageModel, TopModuleMut, Trainable};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, EmbeddingAdapter, Linear, LinearAdapter, LinearMut};
use crate::weights::Weights;

const BLOCKS: [i32; 6] = [0, 512, 1024, 2048, 4096, 8192];

/// One entry of the pack's `modules` manifest.
#[derive(Clone, Debug, Deserialize)]
struct Record {
    path: String,
    embedding: bool,
    dtype: String,
    block: i32,
}

fn config_error(m: String) -> ModelError {
    ModelError::Config(format!("config.json (`prism_hadamard_qwen35`): {m}"))
}

/// `hadamard_rotate(x, block, signs, inverse)`: in float32, cast back to `x`'s dtype.
fn rotate(x: &Array, block: i32, signs: &Array, inverse: bool) -> Result<Array> {
    let shape = x.shape();
    let dtype = x.dtype();
    let mut x = x.astype(Dtype::Float32)?;
    if !inverse {
        x = (&x * signs)?;
    }
    let scale = (1.0 / f64::from(block).sqrt()) as f32;
    x = ops::hadamard_transform(&x.reshape(&[-1, block])?, Some(scale), None)?.reshape(&shape)?;
    if inverse {
        x = (&x * signs)?;
    }
    Ok(x.astype(dtype)?)
}

/// `HadamardQuantizedLinear`: the loaded 2-bit linear, its input rotated first.
#[derive(Clone, Debug)]
struct HadamardLinear {
    base: Linear,
    block: i32,
    signs: Option<Array>,
}

impl LinearAdapter for HadamardLinear {
    fn forward(&self, x: &Array) -> Result<Array> {
        match &self.signs {
            Some(s) => self.base.forward(&rotate(x, self.block, s, false)?),
            None => self.base.forward(x),
        }
    }
    fn clone_box(&self) -> Box<dyn LinearAdapter> {
        Box::new(self.clone())
    }
    fn base(&self) -> &Linear {
        &self.base
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `HadamardQuantizedEmbedding`: dequantized rows as float16, rotated back; as a tied head the
/// linear's rotation and product.
#[derive(Clone, Debug)]
struct HadamardEmbedding {
    base: Embedding,
    block: i32,
    signs: Option<Array>,
}

impl EmbeddingAdapter for HadamardEmbedding {
    fn forward(&self, ids: &Array) -> Result<Array> {
        let out = self.base.forward(ids)?.astype(Dtype::Float16)?;
        match &self.signs {
            Some(s) => rotate(&out, self.block, s, true),
            None => Ok(out),
        }
    }
    fn as_linear(&self, x: &Array) -> Result<Array> {
        match &self.signs {
            Some(s) => self.base.as_linear(&rotate(x, self.block, s, false)?),
            None => self.base.as_linear(x),
        }
    }
    fn clone_box(&self) -> Box<dyn EmbeddingAdapter> {
        Box::new(self.clone())
    }
    fn base(&self) -> &Embedding {
        &self.base
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Checks the pack's fields as `ModelArgs.__post_init__` and `Model.__init__` do, builds
/// qwen3_5 on the same config, and puts the packed modules in place.
pub(super) fn load(c: &ModelConfig, w: &mut Weights) -> Result<Box<dyn LanguageModel>> {
    let raw = &c.raw;
    let schema = raw
        .get("schema_version")
        .and_then(Value::as_i64)
        .unwrap_or(2);
    let namespace = raw
        .get("tensor_namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let expected = match schema {
        1 => Some("mlx-lm-text"),
        2 => Some("mlx-vlm-qwen3_5"),
        _ => None,
    };
    if expected != Some(namespace) {
        return Err(config_error(format!(
            "unsupported Hadamard pack: schema {schema}, namespace {namespace:?} \
             (`schema_version`, `tensor_namespace`)"
        )));
    }
    let layout = raw
        .get("gdn_activation_layout")
        .and_then(Value::as_str)
        .unwrap_or("grouped");
    if layout != "grouped" {
        return Err(config_error(
            "Hadamard packs require grouped GDN activations (`gdn_activation_layout`)".into(),
        ));
    }
    let quant_ok = raw
        .get("quantization")
        .and_then(Value::as_object)
        .is_some_and(|q| {
            q.len() == 3
                && q.get("bits").and_then(Value::as_i64) == Some(2)
                && q.get("group_size").and_then(Value::as_i64) == Some(128)
                && q.get("mode").and_then(Value::as_str) == Some("affine")
        });
    if !quant_ok {
        return Err(config_error(
            "Hadamard packs require 2-bit affine weights, group size 128 (`quantization`)".into(),
        ));
    }
    let records: Vec<Record> = match raw.get("modules") {
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| config_error(format!("field `modules`: {e}")))?,
        None => Vec::new(),
    };
    if records.is_empty() {
        return Err(config_error(
            "Hadamard pack is missing its packed module manifest (`modules`)".into(),
        ));
    }
    let mut by_path: HashMap<String, Record> = HashMap::new();
    for r in records {
        if r.dtype != "float16" {
            return Err(config_error(format!(
                "unsupported packed activation dtype {:?}: {}",
                r.dtype, r.path
            )));
        }
        if !BLOCKS.contains(&r.block) {
            return Err(config_error(format!(
                "invalid Hadamard block {} for {}",
                r.block, r.path
            )));
        }
        if by_path.contains_key(&r.path) {
            return Err(config_error(format!("duplicate packed module: {}", r.path)));
        }
        by_path.insert(r.path.clone(), r);
    }
    // The sign vectors (sanitize checks them: -1 and +1 only), taken out before qwen3_5 loads.
    let prefix = "language_model.";
    let mut signs: HashMap<String, Array> = HashMap::new();
    for r in by_path.values().filter(|r| r.block != 0) {
        let key = format!("{prefix}{}.signs", r.path);
        let Some(s) = w.remove(&key) else {
            return Err(ModelError::Weights(vec![format!(
                "{key}: missing Hadamard sign vector"
            )]));
        };
        let bad = ops::logical_and(
            &ops::not_equal(&s, &Array::from_f32(1.0, s.dtype())?, None)?,
            &ops::not_equal(&s, &Array::from_f32(-1.0, s.dtype())?, None)?,
            None,
        )?;
        if ops::any_all(&bad, false, None)?.item::<bool>()? {
            return Err(ModelError::Weights(vec![format!(
                "{key}: Hadamard signs must contain only -1 and +1"
            )]));
        }
        signs.insert(r.path.clone(), s);
    }
    let mut inner = raw.clone();
    if let Some(o) = inner.as_object_mut() {
        o.insert("model_type".into(), "qwen3_5".into());
    }
    let inner = ModelConfig::from_value(inner)?;
    let mut model = qwen3_next::Model::load(&inner, w)?;

    let packed = |r: &Record, width: i32| -> Result<()> {
        if width % 128 != 0 || (r.block != 0 && width % r.block != 0) {
            return Err(config_error(format!(
                "invalid Hadamard block {} for width {width} ({})",
                r.block, r.path
            )));
        }
        Ok(())
    };
    let mut done = 0usize;
    for (i, layer) in model.layer_adaptables_mut().into_iter().enumerate() {
        for (name, m) in layer {
            let path = format!("model.layers.{i}.{name}");
            let Some(r) = by_path.get(&path) else {
                continue;
            };
            let LinearMut::Linear(l) = m else {
                return Err(config_error(format!(
                    "unknown or unsupported packed module: {path}"
                )));
            };
            if r.embedding {
                return Err(config_error(format!("packed module kind mismatch: {path}")));
            }
            let (_, width) = l.dims()?;
            packed(r, width)?;
            let base = l.clone();
            *l = Linear::Adapted(Box::new(HadamardLinear {
                base,
                block: r.block,
                signs: signs.get(&path).cloned(),
            }));
            done += 1;
        }
    }
    for (name, m) in model.top_modules_mut() {
        let path = name.strip_prefix(prefix).unwrap_or(&name).to_string();
        let Some(r) = by_path.get(&path) else {
            continue;
        };
        match m {
            TopModuleMut::Linear(l) if !r.embedding => {
                let (_, width) = l.dims()?;
                packed(r, width)?;
                let base = l.clone();
                *l = Linear::Adapted(Box::new(HadamardLinear {
                    base,
                    block: r.block,
                    signs: signs.get(&path).cloned(),
                }));
            }
            TopModuleMut::Embedding(e) if r.embedding => {
                let width = e.shape().1;
                packed(r, width)?;
                let base = e.clone();
                *e = Embedding::Adapted(Box::new(HadamardEmbedding {
                    base,
                    block: r.block,
                    signs: signs.get(&path).cloned(),
                }));
            }
            _ => return Err(config_error(format!("packed module kind mismatch: {path}"))),
        }
        done += 1;
    }
    if done != by_path.len() {
        return Err(config_error(format!(
            "{} of the {} packed modules are unknown or unsupported",
            by_path.len() - done,
            by_path.len()
        )));
    }
    Ok(Box::new(model))
}
