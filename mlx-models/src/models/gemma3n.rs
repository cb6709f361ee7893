//! mlx-lm 0.32.2 `models/gemma3n.py`: Gemma 3n's text model, built from the checkpoint's
//! `text_config` (vision and audio towers dropped by `sanitize`). The hidden state runs as
//! `altup_num_inputs` streams (AltUp: each layer predicts every stream from the active one
//! with routed coefficients, runs the block on the active one, then corrects the others);
//! beside attention a low-rank Laurel residual; per-layer inputs (a second embedding table of
//! `num_hidden_layers * hidden_size_per_layer_input` columns plus a projection of the
//! embeddings) gate each layer's output into the non-active streams; MLPs of per-layer widths
//! with a gaussian top-k (`gelu_topk`) on the layers `activation_sparsity_pattern` marks; the
//! trailing `num_kv_shared_layers` layers read the cache of the last earlier layer of their
//! type (`keys_and_values`) and write none (without caches they compute their own keys and
//! values, as mlx-lm does); the tied head and the compiled logit soft-cap. Caches: a
//! `KVCache` or `RotatingKVCache(sliding_window)` per layer that owns keys and values.
//! Inference only (no adapters or full fine-tuning).

use mlx_cache::{AttentionMask, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::{parse_args, ModelConfig};
use crate::error::{ModelError, Result};
use crate::layers::{finfo_min, gelu_approx, gelu_topk, Embedding, Linear, Norm, RmsNorm, Rope};
use crate::models::{kit, LanguageModel, LogitTransform, OutputHead};
use crate::weights::Weights;

/// `intermediate_size`: one width, or one per layer.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Widths {
    One(i32),
    PerLayer(Vec<i32>),
}

/// gemma3n.py `TextConfig` (every field but `rope_scaling` required there; `rope_scaling` is
/// read but unused, the rope is plain).
#[derive(Clone, Debug, Deserialize)]
pub struct TextConfig {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: Widths,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub num_kv_shared_layers: i32,
    pub vocab_size_per_layer_input: i32,
    pub sliding_window: i64,
    pub rope_local_base_freq: f64,
    pub rope_theta: f64,
    pub final_logit_softcapping: Option<f64>,
    pub layer_types: Vec<String>,
    pub activation_sparsity_pattern: Option<Vec<f64>>,
    pub hidden_size_per_layer_input: i32,
    pub altup_num_inputs: i32,
    pub altup_coef_clip: Option<f64>,
    pub altup_correct_scale: bool,
    pub altup_active_idx: i32,
    pub laurel_rank: i32,
}

const SLIDING: &str = "sliding_attention";
const FULL: &str = "full_attention";

impl TextConfig {
    /// The checks that keep MLX from seeing bad shapes, and mlx-lm's own failures (an unknown
    /// layer type, a layer type without an owning layer) as errors naming the field.
    fn check(&self) -> Result<()> {
        let bad =
            |m: String| ModelError::Config(format!("config.json (`gemma3n`): text_config: {m}"));
        kit::check_positive(
            "gemma3n",
            &[
                ("text_config.hidden_size", self.hidden_size),
                ("text_config.num_hidden_layers", self.num_hidden_layers),
                ("text_config.num_attention_heads", self.num_attention_heads),
                ("text_config.num_key_value_heads", self.num_key_value_heads),
                ("text_config.head_dim", self.head_dim),
                ("text_config.vocab_size", self.vocab_size),
                (
                    "text_config.vocab_size_per_layer_input",
                    self.vocab_size_per_layer_input,
                ),
                (
                    "text_config.hidden_size_per_layer_input",
                    self.hidden_size_per_layer_input,
                ),
                ("text_config.altup_num_inputs", self.altup_num_inputs),
                ("text_config.laurel_rank", self.laurel_rank),
            ],
        )?;
        let n = self.num_hidden_layers as usize;
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(bad(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.sliding_window <= 0 || self.sliding_window > i64::from(i32::MAX) {
            return Err(bad(format!(
                "sliding_window must be a positive 32-bit integer, got {}",
                self.sliding_window
            )));
        }
        if self.layer_types.len() != n {
            return Err(bad(format!(
                "layer_types has {} entries for {n} layers",
                self.layer_types.len()
            )));
        }
        if let Some(t) = self
            .layer_types
            .iter()
            .find(|t| *t != SLIDING && *t != FULL)
        {
            return Err(bad(format!("unknown layer type `{t}` in layer_types")));
        }
        if self.num_kv_shared_layers < 0 || self.num_kv_shared_layers >= self.num_hidden_layers {
            return Err(bad(format!(
                "num_kv_shared_layers {} must be at least 0 and below num_hidden_layers {}",
                self.num_kv_shared_layers, self.num_hidden_layers
            )));
        }
        let concrete = &self.layer_types[..self.first_shared()];
        for t in [FULL, SLIDING] {
            if !concrete.iter().any(|x| x == t) {
                return Err(bad(format!(
                    "layer_types needs a `{t}` layer among the first {} (the layers that own \
                     keys and values)",
                    concrete.len()
                )));
            }
        }
        if self.altup_active_idx < 0 || self.altup_active_idx >= self.altup_num_inputs {
            return Err(bad(format!(
                "altup_active_idx {} must index one of altup_num_inputs {}",
                self.altup_active_idx, self.altup_num_inputs
            )));
        }
        if let Widths::PerLayer(w) = &self.intermediate_size {
            if w.len() < n {
                return Err(bad(format!(
                    "intermediate_size has {} entries for {n} layers",
                    w.len()
                )));
            }
        }
        for i in 0..n {
            if self.width(i) <= 0 {
                return Err(bad(format!(
                    "intermediate_size of layer {i} must be positive, got {}",
                    self.width(i)
                )));
            }
        }
        if let Some(p) = &self.activation_sparsity_pattern {
            if p.len() < n {
                return Err(bad(format!(
                    "activation_sparsity_pattern has {} entries for {n} layers",
                    p.len()
                )));
            }
            if let Some(s) = p.iter().find(|s| !(0.0..1.0).contains(*s)) {
                return Err(bad(format!(
                    "activation_sparsity_pattern entry {s} must be at least 0 and below 1"
                )));
            }
        }
        for (name, v) in [
            ("altup_coef_clip", self.altup_coef_clip),
            ("final_logit_softcapping", self.final_logit_softcapping),
        ] {
            if let Some(v) = v {
                if !v.is_finite() || v.abs() > f64::from(f32::MAX) {
                    return Err(bad(format!("{name} must be a finite float32, got {v}")));
                }
            }
        }
        Ok(())
    }

    fn first_shared(&self) -> usize {
        (self.num_hidden_layers - self.num_kv_shared_layers) as usize
    }

    fn width(&self, i: usize) -> i32 {
        match &self.intermediate_size {
            Widths::One(w) => *w,
            Widths::PerLayer(w) => w.get(i).copied().unwrap_or(0),
        }
    }

    fn sliding(&self, i: usize) -> bool {
        self.layer_types.get(i).is_some_and(|t| t == SLIDING)
    }

    /// `layer_idx_to_cache_idx`: the owning layers map to themselves, the KV-shared ones to
    /// the last owning layer of their type.
    fn cache_index(&self) -> Vec<usize> {
        let first = self.first_shared();
        (0..self.layer_types.len())
            .map(|i| {
                if i < first {
                    i
                } else {
                    (0..first)
                        .rev()
                        .find(|&j| self.layer_types[j] == self.layer_types[i])
                        .unwrap_or(0)
                }
            })
            .collect()
    }
}

/// The `text_config` of a gemma3n config, parsed and checked.
fn text_config(config: &ModelConfig) -> Result<TextConfig> {
    let field = |what: String| {
        ModelError::Config(format!(
            "config.json (`{}`): field `text_config` {what}",
            config.model_type
        ))
    };
    let raw = match config.raw.get("text_config") {
        Some(v @ Value::Object(_)) => v,
        Some(Value::Null) | None => return Err(field("is required but missing".into())),
        Some(v) => return Err(field(format!("must be an object, got {v}"))),
    };
    let a: TextConfig = parse_args(raw, "gemma3n text_config")?;
    a.check()?;
    Ok(a)
}

/// `x[i]` on the first axis (the AltUp stream `i`).
fn stream(x: &Array, i: i32) -> Result<Array> {
    Ok(ops::squeeze(
        &ops::slice_axis(x, 0, i, i + 1, None)?,
        &[0],
        None,
    )?)
}

/// `x[start:]` on the first axis.
fn streams_from(x: &Array, start: i32) -> Result<Array> {
    let n = x.shape()[0];
    Ok(ops::slice_axis(x, 0, start, n, None)?)
}

/// `x[start:] = update` on the first axis (mlx's `slice_update`).
fn set_streams_from(x: &Array, start: i32, update: &Array) -> Result<Array> {
    let shape = x.shape();
    let mut lo = vec![0; shape.len()];
    lo[0] = start;
    let strides = vec![1; shape.len()];
    Ok(ops::slice_update(x, update, &lo, &shape, &strides, None)?)
}

/// `x[i] = update` on the first axis.
fn set_stream(x: &Array, i: i32, update: &Array) -> Result<Array> {
    let mut hi = x.shape();
    let mut lo = vec![0; hi.len()];
    lo[0] = i;
    hi[0] = i + 1;
    let strides = vec![1; hi.len()];
    let update = ops::expand_dims(update, &[0], None)?;
    Ok(ops::slice_update(x, &update, &lo, &hi, &strides, None)?)
}

/// `mean(x ** 2, axis=-1, keepdims=True) ** 0.5`, the powers weak scalars of `x`'s dtype.
fn magnitude(x: &Array) -> Result<Array> {
    let sq = ops::power(x, &Scalar::Int(2).to_array_like(x.dtype())?, None)?;
    let m = ops::mean(&sq, &[-1], true, None)?;
    Ok(ops::power(
        &m,
        &Scalar::Float(0.5).to_array_like(m.dtype())?,
        None,
    )?)
}

/// `h[1:] = h[1:] * (target / mx.maximum(mags, finfo(dtype).min))`, `mags` the magnitudes
/// of `h[1:]`.
fn rescale_streams(h: &Array, target: &Array, dtype: Dtype) -> Result<Array> {
    if h.shape()[0] < 2 {
        return Ok(h.clone());
    }
    let tail = streams_from(h, 1)?;
    let mags = magnitude(&tail)?;
    let floor = Scalar::Float(finfo_min(dtype)).to_array_like(mags.dtype())?;
    let ratio = (target / &ops::maximum(&mags, &floor, None)?)?;
    set_streams_from(h, 1, &(&tail * &ratio)?)
}

/// `Gemma3nAttention` ([`kit::Attention`]): per-head q/k norms, weightless-normed values,
/// scale 1, the rope of the layer's kind; a KV-shared layer (from `num_kv_shared_layers` on)
/// reads its owner's cache instead of writing one.
fn attention(a: &TextConfig, w: &mut Weights, p: &str, i: usize) -> Result<kit::Attention> {
    let (d, hd) = (a.hidden_size, a.head_dim);
    let (h, kvh) = (a.num_attention_heads, a.num_key_value_heads);
    let eps = a.rms_norm_eps as f32;
    let base = if a.sliding(i) {
        a.rope_local_base_freq
    } else {
        a.rope_theta
    };
    let mut at =
        kit::Attention::load(w, p, (d, h, kvh, hd), false, 1.0)?.with_head_norms(w, p, eps)?;
    at.value_norm = Some(Norm::RmsNoWeight { eps });
    at.kv_from_cache = i >= a.first_shared();
    Ok(at.with_rope(Some(Rope::initialize(hd, base, false, None, None)?)))
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// `_std_multiplier` (`sqrt(2) * erfinv(2 * sparsity - 1)`, float32) where the layer's
    /// activation sparsity is positive.
    std_multiplier: Option<Array>,
}

impl Mlp {
    fn load(a: &TextConfig, w: &mut Weights, p: &str, i: usize) -> Result<Mlp> {
        let (d, m) = (a.hidden_size, a.width(i));
        let sparsity = a
            .activation_sparsity_pattern
            .as_ref()
            .and_then(|s| s.get(i).copied())
            .unwrap_or(0.0);
        let std_multiplier = if sparsity > 0.0 {
            let x = Array::from_f32((2.0 * sparsity - 1.0) as f32, Dtype::Float32)?;
            Some(ops::scalar_multiply(
                std::f64::consts::SQRT_2,
                &ops::erfinv(&x, None)?,
                None,
            )?)
        } else {
            None
        };
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{p}.gate_proj"), d, m, false)?,
            up_proj: Linear::load(w, &format!("{p}.up_proj"), d, m, false)?,
            down_proj: Linear::load(w, &format!("{p}.down_proj"), m, d, false)?,
            std_multiplier,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate_proj.forward(x)?;
        let act = match &self.std_multiplier {
            Some(m) => gelu_topk(&gate, m)?,
            None => gelu_approx(&gate)?,
        };
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&(&act * &up)?)
    }
}

/// `Gemma3nAltUp`, its coefficient weights kept as `predict` / `correct` leave them: cast to
/// float32 and clipped (the same values every call).
struct AltUp {
    correct_output_scale: Array,
    correction_coefs: Array,
    prediction_coefs: Array,
    modality_router: Linear,
    router_norm: RmsNorm,
    n: i32,
    active: i32,
    /// `hidden_size ** -1.0`.
    router_scale: f64,
}

impl AltUp {
    fn load(a: &TextConfig, w: &mut Weights, p: &str) -> Result<AltUp> {
        let (d, n) = (a.hidden_size, a.altup_num_inputs);
        let coefs = |w: &mut Weights, name: &str, rows: i32| -> Result<Array> {
            let x = w
                .take(&format!("{p}.{name}.weight"), &[rows, n])?
                .astype(Dtype::Float32)?;
            Ok(match a.altup_coef_clip {
                Some(c) => ops::clip_scalar(&x, Some((-c).into()), Some(c.into()), None)?,
                None => x,
            })
        };
        Ok(AltUp {
            correct_output_scale: w.take(&format!("{p}.correct_output_scale"), &[d])?,
            correction_coefs: coefs(w, "correction_coefs", n)?,
            prediction_coefs: coefs(w, "prediction_coefs", n * n)?,
            modality_router: Linear::load(w, &format!("{p}.modality_router"), d, n, false)?,
            router_norm: RmsNorm::load(w, &format!("{p}.router_norm"), d, a.rms_norm_eps as f32)?,
            n,
            active: a.altup_active_idx,
            router_scale: f64::from(d).powf(-1.0),
        })
    }

    fn router_modalities(&self, x: &Array) -> Result<Array> {
        let inputs = ops::multiply_scalar(&self.router_norm.forward(x)?, self.router_scale, None)?;
        let routed = self
            .modality_router
            .forward(&inputs)?
            .astype(Dtype::Float32)?;
        Ok(ops::tanh(&routed, None)?)
    }

    /// `predict(x)`, `x` the `(n, B, L, D)` streams.
    fn predict(&self, x: &Array) -> Result<Array> {
        let modalities = self.router_modalities(&stream(x, self.active)?)?;
        let coefs = ops::matmul(
            &modalities,
            &ops::transpose_all(&self.prediction_coefs, None)?,
            None,
        )?;
        let mut shape = modalities.shape();
        shape.pop();
        shape.extend([self.n, self.n]);
        let coefs = ops::transpose(&ops::reshape(&coefs, &shape, None)?, &[0, 1, 3, 2], None)?;
        let x_up = x.astype(Dtype::Float32)?;
        let permuted = ops::transpose(&x_up, &[1, 2, 3, 0], None)?;
        let predictions =
            ops::transpose(&ops::matmul(&permuted, &coefs, None)?, &[3, 0, 1, 2], None)?;
        Ok((&predictions + &x_up)?.astype(x.dtype())?)
    }

    /// `correct(predictions, activated)`.
    fn correct(&self, predictions: &Array, activated: &Array) -> Result<Array> {
        let modalities = self.router_modalities(activated)?;
        let coefs = ops::matmul(
            &modalities,
            &ops::transpose_all(&self.correction_coefs, None)?,
            None,
        )?;
        let coefs = ops::add_scalar(&coefs, 1.0f32, None)?;
        let innovation = (activated - &stream(predictions, self.active)?)?;
        let coefs = ops::moveaxis(&coefs, 2, 0, None)?;
        let corrected = (&ops::expand_dims(&innovation, &[0], None)?
            * &ops::expand_dims(&coefs, &[-1], None)?)?;
        Ok((&corrected + predictions)?.astype(activated.dtype())?)
    }
}

struct Layer {
    self_attn: kit::Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    altup: AltUp,
    /// `Gemma3nLaurelBlock`.
    laurel_left: Linear,
    laurel_right: Linear,
    post_laurel_norm: RmsNorm,
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
    correct_scale: bool,
}

impl Layer {
    fn load(a: &TextConfig, w: &mut Weights, i: usize) -> Result<Layer> {
        let p = format!("model.language_model.layers.{i}");
        let (d, hpl, r) = (a.hidden_size, a.hidden_size_per_layer_input, a.laurel_rank);
        let eps = a.rms_norm_eps as f32;
        let norm =
            |w: &mut Weights, n: &str, dims: i32| RmsNorm::load(w, &format!("{p}.{n}"), dims, eps);
        let linear = |w: &mut Weights, n: &str, i: i32, o: i32| {
            Linear::load(w, &format!("{p}.{n}"), i, o, false)
        };
        Ok(Layer {
            self_attn: attention(a, w, &format!("{p}.self_attn"), i)?,
            mlp: Mlp::load(a, w, &format!("{p}.mlp"), i)?,
            input_layernorm: norm(w, "input_layernorm", d)?,
            post_attention_layernorm: norm(w, "post_attention_layernorm", d)?,
            pre_feedforward_layernorm: norm(w, "pre_feedforward_layernorm", d)?,
            post_feedforward_layernorm: norm(w, "post_feedforward_layernorm", d)?,
            altup: AltUp::load(a, w, &format!("{p}.altup"))?,
            laurel_left: linear(w, "laurel.linear_left", d, r)?,
            laurel_right: linear(w, "laurel.linear_right", r, d)?,
            post_laurel_norm: norm(w, "laurel.post_laurel_norm", d)?,
            per_layer_input_gate: linear(w, "per_layer_input_gate", d, hpl)?,
            per_layer_projection: linear(w, "per_layer_projection", hpl, d)?,
            post_per_layer_input_norm: norm(w, "post_per_layer_input_norm", d)?,
            correct_scale: a.altup_correct_scale,
        })
    }

    /// `Gemma3nDecoderLayer.__call__` over the `(n, B, L, D)` streams.
    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
        per_layer_input: &Array,
        offset: usize,
    ) -> Result<Array> {
        let active = self.altup.active;
        let predictions = self.altup.predict(x)?;
        let active_prediction = stream(&predictions, active)?;
        let normed = self.input_layernorm.forward(&active_prediction)?;
        let laurel = self
            .laurel_right
            .forward(&self.laurel_left.forward(&normed)?)?;
        let laurel = (&normed + &self.post_laurel_norm.forward(&laurel)?)?;
        let attn = self.self_attn.forward_at(&normed, mask, cache, offset)?;
        let attn = self.post_attention_layernorm.forward(&attn)?;
        let attn_gated = (&active_prediction + &attn)?;
        let attn_laurel = ops::multiply_scalar(&(&attn_gated + &laurel)?, 2.0f64.powf(-0.5), None)?;
        let ffw = self
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&attn_laurel)?)?;
        let ffw = self.post_feedforward_layernorm.forward(&ffw)?;
        let gated = (&attn_laurel + &ffw)?;
        let corrected = self.altup.correct(&predictions, &gated)?;
        let mut first = stream(&corrected, active)?;
        if self.correct_scale {
            first = (&first * &self.altup.correct_output_scale)?;
        }
        let first = gelu_approx(&self.per_layer_input_gate.forward(&first)?)?;
        let first = (&first * per_layer_input)?;
        let first = self.per_layer_projection.forward(&first)?;
        let first = self.post_per_layer_input_norm.forward(&first)?;
        if corrected.shape()[0] < 2 {
            return Ok(corrected);
        }
        set_streams_from(&corrected, 1, &(&streams_from(&corrected, 1)? + &first)?)
    }
}

/// The Gemma 3n text model.
pub struct Model {
    args: TextConfig,
    model_type: String,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    altup_projections: Vec<Linear>,
    altup_unembed_projections: Vec<Linear>,
    norm: RmsNorm,
    /// `layer_idx_to_cache_idx`.
    cache_index: Vec<usize>,
    first_full: usize,
    first_sliding: usize,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a = text_config(config)?;
        // `sanitize`: the vision and audio towers and their embedders go.
        for k in ["vision_tower", "audio_tower", "embed_audio", "embed_vision"] {
            w.discard_prefix(&format!("model.{k}."));
        }
        let (d, nl, hpl) = (
            a.hidden_size,
            a.num_hidden_layers,
            a.hidden_size_per_layer_input,
        );
        let eps = a.rms_norm_eps as f32;
        let p = |n: &str| format!("model.language_model.{n}");
        let layers = (0..nl as usize)
            .map(|i| Layer::load(&a, w, i))
            .collect::<Result<Vec<_>>>()?;
        let projections = |w: &mut Weights, name: &str| {
            (1..a.altup_num_inputs)
                .map(|i| Linear::load(w, &p(&format!("{name}.{}", i - 1)), d, d, false))
                .collect::<Result<Vec<_>>>()
        };
        let first = |t: &str| a.layer_types.iter().position(|x| x == t).unwrap_or(0);
        Ok(Model {
            model_type: config.model_type.clone(),
            embed_tokens: Embedding::load(w, &p("embed_tokens"), a.vocab_size, d)?,
            layers,
            embed_tokens_per_layer: Embedding::load(
                w,
                &p("embed_tokens_per_layer"),
                a.vocab_size_per_layer_input,
                nl * hpl,
            )?,
            per_layer_model_projection: Linear::load(
                w,
                &p("per_layer_model_projection"),
                d,
                nl * hpl,
                false,
            )?,
            per_layer_projection_norm: RmsNorm::load(w, &p("per_layer_projection_norm"), hpl, eps)?,
            altup_projections: projections(w, "altup_projections")?,
            altup_unembed_projections: projections(w, "altup_unembed_projections")?,
            norm: RmsNorm::load(w, &p("norm"), d, eps)?,
            cache_index: a.cache_index(),
            first_full: first(FULL),
            first_sliding: first(SLIDING),
            args: a,
        })
    }

    /// `get_per_layer_inputs` then `project_per_layer_inputs`: `(B, L, layers, hpl)`.
    fn per_layer_inputs(&self, ids: &Array, h: &Array) -> Result<Array> {
        let a = &self.args;
        let mut shape = ids.shape();
        shape.extend([a.num_hidden_layers, a.hidden_size_per_layer_input]);
        let limit = Scalar::Int(a.vocab_size_per_layer_input.into()).to_array_like(ids.dtype())?;
        let tokens = ops::where_(
            &ops::less(ids, &limit, None)?,
            ids,
            &ops::zeros_like(ids, None)?,
            None,
        )?;
        let inputs = ops::multiply_scalar(
            &self.embed_tokens_per_layer.forward(&tokens)?,
            f64::from(a.hidden_size_per_layer_input).powf(0.5),
            None,
        )?;
        let inputs = ops::reshape(&inputs, &shape, None)?;
        let proj = ops::multiply_scalar(
            &self.per_layer_model_projection.forward(h)?,
            f64::from(a.hidden_size).powf(-0.5),
            None,
        )?;
        let proj = self
            .per_layer_projection_norm
            .forward(&ops::reshape(&proj, &shape, None)?)?;
        Ok(ops::multiply_scalar(
            &(&proj + &inputs)?,
            2.0f64.powf(-0.5),
            None,
        )?)
    }

    /// The final normed hidden states `(B, L, hidden)`.
    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(
            inputs,
            caches.as_deref(),
            self.args.first_shared(),
            "layers that own keys and values",
        )?;
        let mut caches = caches;
        let h = ops::multiply_scalar(
            &self.embed_tokens.forward(inputs)?,
            f64::from(self.args.hidden_size).powf(0.5),
            None,
        )?;
        let per_layer = self.per_layer_inputs(inputs, &h)?;
        let window = Some(self.args.sliding_window as usize);
        let global_mask = kit::cache_mask(caches.as_deref(), self.first_full, n, None, false)?;
        let sliding_mask =
            kit::cache_mask(caches.as_deref(), self.first_sliding, n, window, false)?;
        let dtype = h.dtype();
        let target = magnitude(&h)?;
        let mut streams = vec![h.clone()];
        for p in &self.altup_projections {
            streams.push(p.forward(&h)?);
        }
        let refs: Vec<&Array> = streams.iter().collect();
        let mut h = rescale_streams(&ops::stack(&refs, 0, None)?, &target, dtype)?;
        // One position offset for the whole forward pass (the KV-shared layers read a cache
        // their owner has already advanced).
        let offset = caches
            .as_deref()
            .and_then(|c| c.first())
            .map_or(0, |c| c.offset());
        for (i, layer) in self.layers.iter().enumerate() {
            let pli = ops::squeeze(
                &ops::slice_axis(&per_layer, 2, i as i32, i as i32 + 1, None)?,
                &[2],
                None,
            )?;
            let mask = if self.args.sliding(i) {
                &sliding_mask
            } else {
                &global_mask
            };
            let cache = caches
                .as_deref_mut()
                .and_then(|c| c.get_mut(self.cache_index[i]));
            h = layer.forward(&h, mask, cache, &pli, offset)?;
        }
        let target = magnitude(&stream(&h, 0)?)?;
        for (i, p) in self.altup_unembed_projections.iter().enumerate() {
            let k = i as i32 + 1;
            h = set_stream(&h, k, &p.forward(&stream(&h, k)?)?)?;
        }
        let h = rescale_streams(&h, &target, dtype)?;
        let h = ops::mean(&h, &[0], false, None)?;
        self.norm.forward(&h)
    }

    /// The tied head, then the compiled soft-cap.
    fn output(&self) -> OutputHead {
        let plain = OutputHead::Tied(self.embed_tokens.clone());
        match self.args.final_logit_softcapping {
            Some(cap) => OutputHead::Shaped {
                inner: Box::new(plain),
                pre_div: None,
                post: vec![LogitTransform::SoftcapCompiled(cap)],
            },
            None => plain,
        }
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.output().forward(h)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!();

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.args.vocab_size
    }

    fn output_head(&self) -> Option<OutputHead> {
        Some(self.output())
    }

    /// `make_cache`: a `KVCache` per full-attention layer and a
    /// `RotatingKVCache(sliding_window, keep=0)` per sliding one, for the layers that own
    /// keys and values.
    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::sliding_caches(
            (0..self.args.first_shared()).map(|i| self.args.sliding(i)),
            self.args.sliding_window as usize,
        )
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The layers that own caches (the KV-shared ones have none).
    fn num_layers(&self) -> usize {
        self.args.first_shared()
    }
}
