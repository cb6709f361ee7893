//! mlx-lm's `tuner/lora.py` and `tuner/dora.py`: LoRA and DoRA layers wrapping a dense or
//! quantized linear, `LoRASwitchLinear` wrapping a (quantized) switch linear (MoE experts),
//! `linear_to_lora_layers` (which layers, which keys, the random init in mlx-lm's order),
//! and `fuse`.

use std::collections::BTreeSet;

use mlx_core::prelude::*;
use mlx_core::quantized::{self as q};
use mlx_models::layers::{
    Embedding, EmbeddingAdapter, Linear, LinearAdapter, LinearMut, QuantizedWeight, SwitchAdapter,
    SwitchLinear,
};
use mlx_models::models::TopModuleMut;
use mlx_models::LanguageModel;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::params::Params;

/// `lora_parameters` of mlx-lm's config: rank, scale (mlx-lm's name for alpha), dropout and
/// the optional module keys (paths inside a decoder layer, e.g. `self_attn.q_proj`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    pub rank: i32,
    pub scale: f64,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
}

impl Default for LoraConfig {
    /// mlx_lm.lora's defaults: rank 8, dropout 0, scale 20.
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            scale: 20.0,
            dropout: 0.0,
            keys: None,
        }
    }
}

impl LoraConfig {
    pub fn validate(&self) -> Result<()> {
        if self.rank <= 0 {
            return Err(TrainError::option(
                "lora_parameters.rank",
                format!("must be positive, got {}", self.rank),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(TrainError::option(
                "lora_parameters.dropout",
                format!("must be in [0, 1), got {}", self.dropout),
            ));
        }
        if !self.scale.is_finite() {
            return Err(TrainError::option(
                "lora_parameters.scale",
                "must be finite",
            ));
        }
        Ok(())
    }
}

/// `LoRALinear` (`dora: false`) or `DoRALinear` (`dora: true`) around `base`. Its arrays
/// (`<path>.lora_a`, `<path>.lora_b`, and DoRA's `<path>.m`) live in [`Params`].
#[derive(Debug)]
pub struct LoraLinear {
    base: Linear,
    params: Params,
    /// `model.layers.<i>.<key>`: the module path in mlx-lm's naming.
    path: String,
    scale: f64,
    dropout: f64,
    dora: bool,
}

/// `nn.Dropout` in training mode: `(bernoulli(1 - p) * x) * (1 / (1 - p))`.
fn dropout(x: &Array, p: f64, training: bool) -> Result<Array> {
    if p == 0.0 || !training {
        return Ok(x.clone());
    }
    let p1 = 1.0 - p;
    let mask = random::bernoulli(p1 as f32, Some(&x.shape()), None, None)?;
    Ok(((&mask * x)? * (1.0 / p1) as f32)?)
}

/// The base weight, dequantized as mlx-lm's `_dequantized_weight` / `fuse` do.
/// A quantized weight as a dense matrix (`mx.dequantize` with its own parameters).
fn dequantized(weight: &QuantizedWeight) -> Result<Array> {
    Ok(q::dequantize(
        &weight.weight,
        &weight.scales,
        weight.biases.as_ref(),
        weight.group_size,
        weight.bits,
        weight.mode,
        None,
        None,
    )?)
}

fn dense_weight(base: &Linear) -> Result<Array> {
    match base {
        Linear::Dense { weight, .. } => Ok(weight.clone()),
        Linear::Quantized { weight, .. } => dequantized(weight),
        Linear::Trellis { weight, .. } => Ok(weight.dequantize()?),
        Linear::Ggml { weight, .. } => Ok(weight.dequantize()?),
        Linear::Adapted(_) => Err(TrainError::Config(
            "an adapter cannot wrap another adapter".into(),
        )),
    }
}

fn base_bias(base: &Linear) -> Option<&Array> {
    match base {
        Linear::Dense { bias, .. }
        | Linear::Quantized { bias, .. }
        | Linear::Trellis { bias, .. }
        | Linear::Ggml { bias, .. } => bias.as_ref(),
        Linear::Adapted(_) => None,
    }
}

/// `mx.linalg.norm(w, axis=-1)`: the 2-norm along the last axis (of each row of a matrix,
/// where it is mlx-lm's `axis=1`).
pub(crate) fn row_norm(w: &Array) -> Result<Array> {
    Ok(w.square()?.sum(&[-1], false)?.sqrt()?)
}

impl LoraLinear {
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn base(&self) -> &Linear {
        &self.base
    }

    pub fn is_dora(&self) -> bool {
        self.dora
    }

    fn leaves(&self) -> &'static [&'static str] {
        if self.dora {
            &["lora_a", "lora_b", "m"]
        } else {
            &["lora_a", "lora_b"]
        }
    }

    fn key(&self, leaf: &str) -> String {
        format!("{}.{leaf}", self.path)
    }

    /// `(scale * lora_b.T) @ lora_a.T`, the low-rank update of the weight.
    fn delta(&self) -> Result<Array> {
        let a = self.params.get(&self.key("lora_a"))?;
        let b = self.params.get(&self.key("lora_b"))?;
        let sb = ops::multiply_scalar(&b.t()?, self.scale, None)?;
        Ok(sb.matmul(&a.t()?)?)
    }

    fn lora_forward(&self, x: &Array) -> Result<Array> {
        let a = self.params.get(&self.key("lora_a"))?;
        let b = self.params.get(&self.key("lora_b"))?;
        let y = self.base.forward(x)?;
        let z = dropout(x, self.dropout, self.params.training())?
            .matmul(&a)?
            .matmul(&b)?;
        let z = ops::multiply_scalar(&z, self.scale, None)?.astype(x.dtype())?;
        Ok((&y + &z)?)
    }

    fn dora_forward(&self, x: &Array) -> Result<Array> {
        let a = self.params.get(&self.key("lora_a"))?;
        let b = self.params.get(&self.key("lora_b"))?;
        let m = self.params.get(&self.key("m"))?;
        let w = dense_weight(&self.base)?;
        let y = x.matmul(&w.t()?)?;
        let z = dropout(x, self.dropout, self.params.training())?
            .matmul(&a)?
            .matmul(&b)?;
        let out = (&y + &ops::multiply_scalar(&z, self.scale, None)?.astype(x.dtype())?)?;
        let adapted = (&w + &self.delta()?)?;
        let denom = row_norm(&adapted)?.stop_gradient()?;
        let out = ((&m / &denom)?.astype(x.dtype())? * &out)?;
        match base_bias(&self.base) {
            Some(bias) => Ok((&out + bias)?),
            None => Ok(out),
        }
    }

    /// `fuse(dequantize)`: the plain (or re-quantized) linear with the update folded in.
    pub fn fuse(&self, dequantize: bool) -> Result<Linear> {
        let weight = dense_weight(&self.base)?;
        let wdt = weight.dtype();
        let fused = if self.dora {
            let w = (&weight + &self.delta()?.astype(wdt)?)?;
            let m = self.params.get(&self.key("m"))?;
            let norm_scale = (&m / &row_norm(&w)?)?;
            (&norm_scale.expand_dims(&[1])? * &w)?
        } else {
            (&weight + &self.delta()?.astype(wdt)?)?
        };
        let bias = base_bias(&self.base).cloned();
        match &self.base {
            Linear::Quantized { weight: qw, .. } if !dequantize => Ok(Linear::Quantized {
                weight: requantized_like(&fused, qw)?,
                bias,
            }),
            _ => Ok(Linear::Dense {
                weight: fused,
                bias,
            }),
        }
    }
}

/// A fused weight quantized as `like` is (group size, bits, mode), as mlx-lm's `fuse`
/// re-quantizes a quantized base.
fn requantized_like(fused: &Array, like: &QuantizedWeight) -> Result<QuantizedWeight> {
    let (weight, scales, biases) = q::quantize(fused, like.group_size, like.bits, like.mode, None)?;
    Ok(QuantizedWeight {
        weight,
        scales,
        biases,
        group_size: like.group_size,
        bits: like.bits,
        mode: like.mode,
        lookup_dtype: None,
        symmetric: false,
    })
}

impl LinearAdapter for LoraLinear {
    fn forward(&self, x: &Array) -> mlx_models::Result<Array> {
        if !self.params.enabled() {
            return self.base.forward(x);
        }
        let r = if self.dora {
            self.dora_forward(x)
        } else {
            self.lora_forward(x)
        };
        r.map_err(model_err)
    }

    fn clone_box(&self) -> Box<dyn LinearAdapter> {
        Box::new(LoraLinear {
            base: self.base.clone(),
            params: self.params.clone(),
            path: self.path.clone(),
            scale: self.scale,
            dropout: self.dropout,
            dora: self.dora,
        })
    }

    fn base(&self) -> &Linear {
        &self.base
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn parameters(&self) -> mlx_models::Result<Vec<Array>> {
        leaf_arrays(&self.params, &self.path, self.leaves())
    }

    fn set_parameters(&self, values: &[Array]) -> mlx_models::Result<()> {
        set_leaf_arrays(&self.params, &self.path, self.leaves(), values)
    }
}

/// mlx-lm's `LoRASwitchLinear` around a (quantized) switch linear: per-expert `lora_a`
/// `(experts, rank, in)` and `lora_b` `(experts, out, rank)` in [`Params`], applied with
/// `gather_mm` on the experts the router picked.
#[derive(Clone, Debug)]
pub struct LoraSwitchLinear {
    base: SwitchLinear,
    params: Params,
    /// `model.layers.<i>.<key>`: the module path in mlx-lm's naming.
    path: String,
    scale: f64,
    dropout: f64,
}

const LORA_LEAVES: &[&str] = &["lora_a", "lora_b"];

impl LoraSwitchLinear {
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `__call__`: `y + (scale * z).astype(x.dtype)` with `z` the two gathered low-rank
    /// products.
    fn lora_forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let a = self.params.get(&format!("{}.lora_a", self.path))?;
        let b = self.params.get(&format!("{}.lora_b", self.path))?;
        let y = self.base.forward(x, indices, sorted)?;
        let xd = dropout(x, self.dropout, self.params.training())?;
        let z = q::gather_mm(&xd, &a.swapaxes(-1, -2)?, None, Some(indices), sorted, None)?;
        let z = q::gather_mm(&z, &b.swapaxes(-1, -2)?, None, Some(indices), sorted, None)?;
        let z = ops::multiply_scalar(&z, self.scale, None)?.astype(x.dtype())?;
        Ok((&y + &z)?)
    }
}

impl LoraSwitchLinear {
    /// `fuse(dequantize)`: `weight + (scale * lora_b @ lora_a).astype(weight.dtype)` per
    /// expert, re-quantized as the base was unless `dequantize`.
    pub fn fuse(&self, dequantize: bool) -> Result<SwitchLinear> {
        let (weight, bias) = match &self.base {
            SwitchLinear::Dense { weight, bias } => (weight.clone(), bias),
            SwitchLinear::Quantized { weight, bias } => (dequantized(weight)?, bias),
            SwitchLinear::Adapted(_) => {
                return Err(TrainError::Config(
                    "an adapter cannot wrap another adapter".into(),
                ))
            }
        };
        let (experts, _, input_dims) = self.base.dims();
        let a = self.params.get(&format!("{}.lora_a", self.path))?;
        let b = self.params.get(&format!("{}.lora_b", self.path))?;
        let b = ops::multiply_scalar(&b, self.scale, None)?;
        let a = a.reshape(&[experts, -1, input_dims])?;
        let fused = (&weight + &b.matmul(&a)?.astype(weight.dtype())?)?;
        let bias = bias.clone();
        match &self.base {
            SwitchLinear::Quantized { weight: qw, .. } if !dequantize => {
                Ok(SwitchLinear::Quantized {
                    weight: requantized_like(&fused, qw)?,
                    bias,
                })
            }
            _ => Ok(SwitchLinear::Dense {
                weight: fused,
                bias,
            }),
        }
    }
}

impl SwitchAdapter for LoraSwitchLinear {
    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> mlx_models::Result<Array> {
        if !self.params.enabled() {
            return self.base.forward(x, indices, sorted);
        }
        self.lora_forward(x, indices, sorted).map_err(model_err)
    }

    fn clone_box(&self) -> Box<dyn SwitchAdapter> {
        Box::new(self.clone())
    }

    fn base(&self) -> &SwitchLinear {
        &self.base
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn parameters(&self) -> mlx_models::Result<Vec<Array>> {
        leaf_arrays(&self.params, &self.path, LORA_LEAVES)
    }

    fn set_parameters(&self, values: &[Array]) -> mlx_models::Result<()> {
        set_leaf_arrays(&self.params, &self.path, LORA_LEAVES, values)
    }
}

/// The arrays `<path>.<leaf>` in `params`, in `leaves` order (an adapter's trainable arrays).
fn leaf_arrays(params: &Params, path: &str, leaves: &[&str]) -> mlx_models::Result<Vec<Array>> {
    leaves
        .iter()
        .map(|l| params.get(&format!("{path}.{l}")).map_err(model_err))
        .collect()
}

/// Replaces the arrays [`leaf_arrays`] returned (same order).
fn set_leaf_arrays(
    params: &Params,
    path: &str,
    leaves: &[&str],
    values: &[Array],
) -> mlx_models::Result<()> {
    if values.len() != leaves.len() {
        return Err(mlx_models::ModelError::Parameters {
            path: path.to_string(),
            problem: format!("{} values for {} parameters", values.len(), leaves.len()),
        });
    }
    let map: ParamMap = leaves
        .iter()
        .map(|l| format!("{path}.{l}"))
        .zip(values.iter().cloned())
        .collect();
    params.update(&map).map_err(model_err)
}

pub(crate) fn model_err(e: TrainError) -> mlx_models::ModelError {
    match e {
        TrainError::Mlx(e) => mlx_models::ModelError::Mlx(e),
        TrainError::Model(e) => e,
        other => mlx_models::ModelError::Adapter(Box::new(other)),
    }
}

/// The adapter inside an adapted linear, if it is one of ours.
pub fn as_lora(linear: &Linear) -> Option<&LoraLinear> {
    match linear {
        Linear::Adapted(a) => a.as_any().downcast_ref::<LoraLinear>(),
        _ => None,
    }
}

/// Which layers `num_layers` selects, as `model.layers[-max(num_layers, 0):]` does (so 0 and
/// negative values mean all layers).
pub fn selected_layers(n_layers: usize, num_layers: i32) -> std::ops::Range<usize> {
    let k = num_layers.max(0) as usize;
    if k == 0 || k >= n_layers {
        0..n_layers
    } else {
        n_layers - k..n_layers
    }
}

/// `linear_to_lora_layers(model, num_layers, config, use_dora)`: wraps the linears named by
/// `config.keys` (default: every linear of a decoder layer) in the last `num_layers` layers,
/// adding their arrays to `params`. Draws from the global PRNG exactly as mlx-lm does: per
/// wrapped module, in mlx-lm's module order (`named_modules`: reverse declaration order),
/// one key for the discarded `nn.Linear` init, then `lora_a ~ U(-1/sqrt(in), 1/sqrt(in))`.
pub fn linear_to_lora_layers(
    model: &mut dyn LanguageModel,
    num_layers: i32,
    config: &LoraConfig,
    use_dora: bool,
    params: &Params,
) -> Result<()> {
    config.validate()?;
    let model_type = model.model_type().to_string();
    let unsupported =
        || TrainError::Config(format!("model_type {model_type} does not support adapters"));
    let model = model.as_trainable_mut().ok_or_else(unsupported)?;
    let layers_path = model.layers_path();
    let mut layers = model.layer_adaptables_mut();
    if layers.is_empty() {
        return Err(unsupported());
    }
    let keys: BTreeSet<String> = match &config.keys {
        Some(k) => k.iter().cloned().collect(),
        None => layers
            .iter()
            .flat_map(|l| l.iter().map(|(n, _)| n.to_string()))
            .collect(),
    };
    let range = selected_layers(layers.len(), num_layers);
    for (i, layer) in layers.iter_mut().enumerate() {
        if !range.contains(&i) {
            continue;
        }
        for (name, lin) in layer.iter_mut().rev() {
            if !keys.contains(name.as_str()) {
                continue;
            }
            let path = format!("{layers_path}.{i}.{name}");
            match lin {
                LinearMut::Linear(lin) => {
                    let adapter = from_base(lin, &path, config, use_dora, params)?;
                    **lin = Linear::Adapted(Box::new(adapter));
                }
                LinearMut::Switch(lin) => {
                    let adapter = switch_from_base(lin, &path, config, use_dora, params)?;
                    **lin = SwitchLinear::Adapted(Box::new(adapter));
                }
            }
        }
    }
    drop(layers);
    // Then, as mlx-lm, the modules outside the layers whose full path is a key (`lm_head`,
    // `model.embed_tokens`), in `named_modules` order: only explicit keys can name them.
    if config.keys.is_some() {
        for (path, module) in model.top_modules_mut() {
            if !keys.contains(&path) {
                continue;
            }
            match module {
                TopModuleMut::Linear(lin) => {
                    let adapter = from_base(lin, &path, config, use_dora, params)?;
                    *lin = Linear::Adapted(Box::new(adapter));
                }
                TopModuleMut::Embedding(e) => {
                    let adapter = embedding_from_base(e, &path, config, use_dora, params)?;
                    *e = Embedding::Adapted(Box::new(adapter));
                }
            }
        }
    }
    Ok(())
}

/// One key for the discarded base layer's init (drawn inside the adapter's `__init__`),
/// then `lora_a ~ U(-1/sqrt(fan), 1/sqrt(fan))` of `shape`, float32.
fn lora_a_init(fan: i32, shape: &[i32]) -> Result<Array> {
    random::next_key()?;
    let s = 1.0 / f64::from(fan).sqrt();
    Ok(random::uniform(
        -s as f32,
        s as f32,
        shape,
        Dtype::Float32,
        None,
        None,
    )?)
}

/// `LoRASwitchLinear.from_base`: one key for the discarded `SwitchLinear` init, then
/// `lora_a ~ U(-1/sqrt(in), 1/sqrt(in))` of shape `(experts, rank, in)`; DoRA is refused
/// as mlx-lm refuses it.
fn switch_from_base(
    linear: &SwitchLinear,
    path: &str,
    config: &LoraConfig,
    dora: bool,
    params: &Params,
) -> Result<LoraSwitchLinear> {
    let kind = match linear {
        SwitchLinear::Dense { .. } => "SwitchLinear",
        SwitchLinear::Quantized { .. } => "QuantizedSwitchLinear",
        SwitchLinear::Adapted(_) => {
            return Err(TrainError::AlreadyAdapted {
                path: path.to_string(),
            })
        }
    };
    if dora {
        return Err(TrainError::Config(format!(
            "{path}: {kind} doesn't support DoRA yet (mlx-lm refuses it too); \
             pass lora_parameters.keys without the experts' switch layers, or use LoRA"
        )));
    }
    let (experts, output_dims, input_dims) = linear.dims();
    let lora_a = lora_a_init(input_dims, &[experts, config.rank, input_dims])?;
    let lora_b = ops::zeros(&[experts, output_dims, config.rank], Dtype::Float32, None)?;
    params.insert(&format!("{path}.lora_a"), lora_a)?;
    params.insert(&format!("{path}.lora_b"), lora_b)?;
    Ok(LoraSwitchLinear {
        base: linear.clone(),
        params: params.clone(),
        path: path.to_string(),
        scale: config.scale,
        dropout: config.dropout,
    })
}

/// `LoRALinear.from_base` / `DoRALinear.from_base`.
fn from_base(
    linear: &Linear,
    path: &str,
    config: &LoraConfig,
    dora: bool,
    params: &Params,
) -> Result<LoraLinear> {
    if matches!(linear, Linear::Adapted(_)) {
        return Err(TrainError::AlreadyAdapted {
            path: path.to_string(),
        });
    }
    let (output_dims, input_dims) = linear.dims()?;
    // `nn.Linear(input_dims, output_dims)` inside __init__: its weight draw uses one key.
    let lora_a = lora_a_init(input_dims, &[input_dims, config.rank])?;
    let lora_b = ops::zeros(&[config.rank, output_dims], Dtype::Float32, None)?;
    params.insert(&format!("{path}.lora_a"), lora_a)?;
    params.insert(&format!("{path}.lora_b"), lora_b)?;
    if dora {
        let m = row_norm(&dense_weight(linear)?.astype(Dtype::Float32)?)?;
        params.insert(&format!("{path}.m"), m)?;
    }
    Ok(LoraLinear {
        base: linear.clone(),
        params: params.clone(),
        path: path.to_string(),
        scale: config.scale,
        dropout: config.dropout,
        dora,
    })
}

/// mlx-lm's `LoRAEmbedding` (`dora: false`) or `DoRAEmbedding` (`dora: true`) around a
/// table: `lora_a` `(num_embeddings, rank)`, `lora_b` `(rank, dims)` (and DoRA's `m`, the
/// table's row norms) in [`Params`], for the lookups and for a tied head's `as_linear`.
#[derive(Clone, Debug)]
pub struct LoraEmbedding {
    base: Embedding,
    params: Params,
    /// `model.embed_tokens`: the module path in mlx-lm's naming.
    path: String,
    scale: f64,
    dropout: f64,
    dora: bool,
}

impl LoraEmbedding {
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn is_dora(&self) -> bool {
        self.dora
    }

    fn get(&self, leaf: &str) -> Result<Array> {
        self.params.get(&format!("{}.{leaf}", self.path))
    }

    /// The table as a dense matrix (a quantized one dequantized, as `fuse` does).
    fn dense_table(&self) -> Result<Array> {
        match &self.base {
            Embedding::Dense(w) => Ok(w.clone()),
            Embedding::Quantized(q) => dequantized(q),
            Embedding::Ggml(g) => Ok(g.dequantize()?),
            Embedding::Adapted(_) => Err(TrainError::Config(
                "an adapter cannot wrap another adapter".into(),
            )),
        }
    }

    /// `__call__`. LoRA: `y + (scale * dropout(lora_a[x] @ lora_b)).astype(y.dtype)`. DoRA:
    /// `z = (scale * lora_a[x]) @ lora_b`, `y + dropout(z).astype(y.dtype)` rescaled by
    /// `m[x] / stop_gradient(norm(y + z))`.
    fn lookup(&self, ids: &Array) -> Result<Array> {
        let (a, b) = (self.get("lora_a")?, self.get("lora_b")?);
        let y = self.base.forward(ids)?;
        let rows = ops::take(&a, ids, 0, None)?;
        let training = self.params.training();
        if !self.dora {
            let z = dropout(&rows.matmul(&b)?, self.dropout, training)?;
            let z = ops::multiply_scalar(&z, self.scale, None)?.astype(y.dtype())?;
            return Ok((&y + &z)?);
        }
        let z = ops::multiply_scalar(&rows, self.scale, None)?.matmul(&b)?;
        let out = (&y + &dropout(&z, self.dropout, training)?.astype(y.dtype())?)?;
        let denom = row_norm(&(&y + &z)?)?.stop_gradient()?;
        let m = ops::take(&self.get("m")?, ids, 0, None)?;
        Ok((&(&m / &denom)?.expand_dims(&[-1])? * &out)?)
    }

    /// `as_linear`: `y + (scale * ((dropout(x) @ lora_b.T) @ lora_a.T)).astype(x.dtype)`,
    /// DoRA's rescaled by `m / stop_gradient(norm(weight + (scale * lora_a) @ lora_b))`.
    fn projection(&self, x: &Array) -> Result<Array> {
        let (a, b) = (self.get("lora_a")?, self.get("lora_b")?);
        let y = self.base.as_linear(x)?;
        let z = dropout(x, self.dropout, self.params.training())?
            .matmul(&b.t()?)?
            .matmul(&a.t()?)?;
        let out = (&y + &ops::multiply_scalar(&z, self.scale, None)?.astype(x.dtype())?)?;
        if !self.dora {
            return Ok(out);
        }
        let adapted = (&self.dense_table()? + &self.delta()?)?;
        let denom = row_norm(&adapted)?.stop_gradient()?;
        Ok((&(&self.get("m")? / &denom)? * &out)?)
    }

    /// `(scale * lora_a) @ lora_b`, the low-rank update of the table.
    fn delta(&self) -> Result<Array> {
        let a = ops::multiply_scalar(&self.get("lora_a")?, self.scale, None)?;
        Ok(a.matmul(&self.get("lora_b")?)?)
    }

    /// `fuse(dequantize)`: the plain (or, for LoRA on a quantized table, re-quantized)
    /// table with the update folded in.
    pub fn fuse(&self, dequantize: bool) -> Result<Embedding> {
        let weight = self.dense_table()?;
        let w = (&weight + &self.delta()?.astype(weight.dtype())?)?;
        if self.dora {
            let norm_scale = (&self.get("m")? / &row_norm(&w)?)?;
            return Ok(Embedding::Dense((&norm_scale.expand_dims(&[1])? * &w)?));
        }
        match &self.base {
            Embedding::Quantized(qw) if !dequantize => {
                Ok(Embedding::Quantized(requantized_like(&w, qw)?))
            }
            _ => Ok(Embedding::Dense(w)),
        }
    }
}

impl EmbeddingAdapter for LoraEmbedding {
    fn forward(&self, ids: &Array) -> mlx_models::Result<Array> {
        if !self.params.enabled() {
            return self.base.forward(ids);
        }
        self.lookup(ids).map_err(model_err)
    }

    fn as_linear(&self, x: &Array) -> mlx_models::Result<Array> {
        if !self.params.enabled() {
            return self.base.as_linear(x);
        }
        self.projection(x).map_err(model_err)
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

/// `LoRAEmbedding.from_base` / `DoRAEmbedding.from_base`: one key for the discarded
/// `nn.Embedding` init (a normal draw), then `lora_a ~ U(-1/sqrt(num), 1/sqrt(num))` of shape
/// `(num_embeddings, rank)`; DoRA's `m` is the table's row norms in its own dtype. DoRA on a
/// quantized table is refused (mlx-lm's check looks for a quantized *linear* and lets a
/// quantized embedding through, to take norms of its packed integers).
fn embedding_from_base(
    embedding: &Embedding,
    path: &str,
    config: &LoraConfig,
    dora: bool,
    params: &Params,
) -> Result<LoraEmbedding> {
    match embedding {
        Embedding::Adapted(_) => {
            return Err(TrainError::AlreadyAdapted {
                path: path.to_string(),
            })
        }
        Embedding::Quantized(_) if dora => {
            return Err(TrainError::Config(format!(
                "{path}: DoRA on a quantized embedding is not supported; use LoRA"
            )))
        }
        _ => {}
    }
    let (num, dims) = embedding.shape();
    // `nn.Embedding(num, dims)` inside __init__: its weight draw uses one key.
    let lora_a = lora_a_init(num, &[num, config.rank])?;
    let lora_b = ops::zeros(&[config.rank, dims], Dtype::Float32, None)?;
    params.insert(&format!("{path}.lora_a"), lora_a)?;
    params.insert(&format!("{path}.lora_b"), lora_b)?;
    if let (true, Embedding::Dense(w)) = (dora, embedding) {
        params.insert(&format!("{path}.m"), row_norm(w)?)?;
    }
    Ok(LoraEmbedding {
        base: embedding.clone(),
        params: params.clone(),
        path: path.to_string(),
        scale: config.scale,
        dropout: config.dropout,
        dora,
    })
}

/// The adapter inside an adapted embedding, if it is one of ours.
pub fn as_lora_embedding(embedding: &Embedding) -> Option<&LoraEmbedding> {
    match embedding {
        Embedding::Adapted(a) => a.as_any().downcast_ref::<LoraEmbedding>(),
        _ => None,
    }
}
