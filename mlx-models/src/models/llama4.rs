//! mlx-lm 0.32.2 `models/llama4.py` (the text model under `language_model`): three of every
//! four layers use rope (traditional), weightless q/k norms after it and chunked attention
//! over a `ChunkedKVCache`; the fourth attends globally without rope, its queries scaled by
//! position (`attn_temperature_tuning`). Every `interleave_moe_layer_step`-th layer has the
//! shared MoE block (`moe_block.rs`) with [`Router::SigmoidScaledInput`]: a top-1
//! sigmoid-routed `SwitchGLU` (input pre-scaled by the score) plus a plain shared expert.

use mlx_cache::{AttentionMask, Cache, ChunkedKVCache, KVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{
    Embedding, Linear, Mlp, MlpKind, MlpNames, Norm, RmsNorm, Rope, RopeScaling, SwitchActivation,
    SwitchGlu,
};
use crate::models::moe::QkNorm;
use crate::models::moe_block::{Ffn, MoeParts, Router, SparseMoe};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// llama4.py `TextArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct TextArgs {
    pub attention_bias: bool,
    pub attention_chunk_size: i64,
    pub head_dim: Option<i32>,
    pub hidden_size: i32,
    pub interleave_moe_layer_step: i32,
    pub intermediate_size: i32,
    pub intermediate_size_mlp: i32,
    pub max_position_embeddings: i64,
    pub model_type: String,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub num_local_experts: i32,
    pub rms_norm_eps: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub rope_theta: f64,
    pub use_qk_norm: bool,
    pub vocab_size: i32,
    #[serde(default = "four")]
    pub attn_temperature_tuning: i64,
    #[serde(default = "floor_scale")]
    pub floor_scale: i64,
    #[serde(default = "attn_scale")]
    pub attn_scale: f64,
}

fn four() -> i64 {
    4
}
fn floor_scale() -> i64 {
    8192
}
fn attn_scale() -> f64 {
    0.1
}

/// llama4.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    text_config: TextArgs,
    model_type: String,
}

#[derive(Clone)]
struct Layer {
    /// [`kit::Attention`]: the rope `None` on the global layers; the weightless q/k norms
    /// after the rope on the others (`use_qk_norm`); the global layers' temperature tuning
    /// cast back to the queries' dtype.
    self_attn: kit::Attention,
    /// A dense MLP, or the MoE block ([`Router::SigmoidScaledInput`]'s top-1 experts and the
    /// plain `shared_expert`).
    feed_forward: Ffn,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

/// The Llama 4 text model.
pub struct Model {
    model_type: String,
    args: TextArgs,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
}

fn uses_rope(i: usize) -> bool {
    (i + 1) % 4 != 0
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let top: ModelArgs = config.args()?;
        let a = top.text_config;
        let t = &a.model_type;
        for (name, v) in [
            ("hidden_size", a.hidden_size),
            ("num_hidden_layers", a.num_hidden_layers),
            ("num_attention_heads", a.num_attention_heads),
            ("num_key_value_heads", a.num_key_value_heads),
            ("num_local_experts", a.num_local_experts),
            ("interleave_moe_layer_step", a.interleave_moe_layer_step),
            ("vocab_size", a.vocab_size),
        ] {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "llama4 ({t}): text_config.{name} must be positive, got {v}"
                )));
            }
        }
        if a.num_experts_per_tok != 1 {
            return Err(ModelError::Config(format!(
                "llama4: only 1 expert per token is supported, got {}",
                a.num_experts_per_tok
            )));
        }
        if a.num_hidden_layers < 4 {
            return Err(ModelError::Config(format!(
                "llama4: needs at least 4 layers (layer 3's cache makes the global mask), got {}",
                a.num_hidden_layers
            )));
        }
        if a.attention_chunk_size <= 0 || a.floor_scale <= 0 {
            return Err(ModelError::Config(
                "llama4: attention_chunk_size and floor_scale must be positive".into(),
            ));
        }
        if a.num_attention_heads % a.num_key_value_heads != 0 {
            return Err(ModelError::Config(format!(
                "llama4: num_attention_heads {} must be a multiple of num_key_value_heads {}",
                a.num_attention_heads, a.num_key_value_heads
            )));
        }
        let head_dim = match a.head_dim {
            Some(d) if d > 0 => d,
            _ => {
                if a.hidden_size % a.num_attention_heads != 0 {
                    return Err(ModelError::Config(
                        "llama4: hidden_size must divide by num_attention_heads".into(),
                    ));
                }
                a.hidden_size / a.num_attention_heads
            }
        };
        sanitize(w, a.num_hidden_layers)?;
        let (d, eps) = (a.hidden_size, a.rms_norm_eps as f32);
        let bias = a.attention_bias;
        let root = "language_model.model";
        let mut layers = Vec::with_capacity(a.num_hidden_layers as usize);
        for i in 0..a.num_hidden_layers as usize {
            let p = format!("{root}.layers.{i}");
            let rope = if uses_rope(i) {
                Some(Rope::initialize(
                    head_dim,
                    a.rope_theta,
                    true,
                    a.rope_scaling.as_ref(),
                    Some(a.max_position_embeddings),
                )?)
            } else {
                None
            };
            let heads = (d, a.num_attention_heads, a.num_key_value_heads, head_dim);
            let scale = f64::from(head_dim).powf(-0.5) as f32;
            let mut self_attn =
                kit::Attention::load(w, &format!("{p}.self_attn"), heads, bias, scale)?;
            if a.use_qk_norm && rope.is_some() {
                // llama4.py's `L2Norm`: `rms_norm(x, None, 1e-6)` after the rope.
                self_attn.qk_norm = QkNorm::AfterRope;
                self_attn.q_norm = Some(Norm::RmsNoWeight { eps: 1e-6 });
                self_attn.k_norm = Some(Norm::RmsNoWeight { eps: 1e-6 });
            }
            self_attn.query_scale_cast = true;
            let self_attn = self_attn.with_rope(rope);
            let step = a.interleave_moe_layer_step as usize;
            let f = format!("{p}.feed_forward");
            let mlp = |w: &mut Weights, path: &str, hidden: i32| {
                Mlp::load(
                    w,
                    path,
                    &MlpNames::LLAMA,
                    d,
                    hidden,
                    false,
                    false,
                    MlpKind::SwiGlu,
                )
            };
            let feed_forward = if i % step == step - 1 {
                // llama4.py's `MoE` declares experts, router, shared_expert.
                let experts = SwitchGlu::load(
                    w,
                    &format!("{f}.experts"),
                    d,
                    a.intermediate_size,
                    a.num_local_experts,
                    false,
                    SwitchActivation::SwiGlu,
                )?;
                let gate = Linear::load(w, &format!("{f}.router"), d, a.num_local_experts, false)?;
                let shared = mlp(w, &format!("{f}.shared_expert"), a.intermediate_size)?;
                Ffn::Sparse(Box::new(SparseMoe::from_parts(MoeParts {
                    top_k: a.num_experts_per_tok,
                    router: Router::SigmoidScaledInput,
                    gate,
                    experts,
                    names: ["router", "experts"],
                    correction_bias: None,
                    plain_shared: Some(("shared_expert", shared)),
                    flatten: false,
                })))
            } else {
                Ffn::Dense(mlp(w, &f, a.intermediate_size_mlp)?)
            };
            layers.push(Layer {
                self_attn,
                feed_forward,
                input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    d,
                    eps,
                )?,
            });
        }
        Ok(Model {
            model_type: top.model_type,
            embed_tokens: Embedding::load(w, &format!("{root}.embed_tokens"), a.vocab_size, d)?,
            layers,
            norm: RmsNorm::load(w, &format!("{root}.norm"), d, eps)?,
            lm_head: Linear::load(w, "language_model.lm_head", d, a.vocab_size, false)?,
            args: a,
        })
    }
}

/// llama4.py `sanitize`: the vision tower and projector dropped; HF's fused expert
/// `gate_up_proj` `(E, D, 2F)` split in two along the last axis and transposed, `down_proj`
/// transposed.
fn sanitize(w: &mut Weights, layers: i32) -> Result<()> {
    for k in w.names() {
        if k.contains("vision_model") || k.contains("multi_modal_projector") {
            w.discard(&k);
        }
    }
    for l in 0..layers {
        let prefix = format!("language_model.model.layers.{l}.feed_forward.experts");
        if let Some(v) = w.remove(&format!("{prefix}.gate_up_proj")) {
            let parts = ops::split_equal(&v, 2, -1, None)?;
            for (name, part) in ["gate_proj", "up_proj"].iter().zip(parts) {
                w.insert(
                    format!("{prefix}.{name}.weight"),
                    ops::swapaxes(&part, 1, 2, None)?,
                );
            }
        }
        if let Some(v) = w.remove(&format!("{prefix}.down_proj")) {
            w.insert(
                format!("{prefix}.down_proj.weight"),
                ops::swapaxes(&v, 1, 2, None)?,
            );
        }
    }
    Ok(())
}

/// llama4.py's attention temperature tuning on the global layers: per-position query
/// scales `log(floor((offset + 1 + i) / floor_scale) + 1) * attn_scale + 1`, float32, shaped
/// `(L, 1)`.
fn temperature_scales(args: &TextArgs, offset: usize, l: i32) -> Result<Array> {
    let start = offset as f64 + 1.0;
    let pos = ops::arange(start, start + f64::from(l), 1.0, Dtype::Int32, None)?;
    let pos = ops::divide(
        &pos,
        &Array::from_int(args.floor_scale, Dtype::Int32)?,
        None,
    )?;
    let scales =
        (&ops::log(&(&ops::floor(&pos, None)? + 1.0f32)?, None)? * args.attn_scale as f32)?;
    Ok(ops::expand_dims(&(&scales + 1.0f32)?, &[1], None)?)
}

impl Model {
    /// `LlamaModel.__call__`'s chunk mask: `linds` from the chunked caches' start position,
    /// `rinds` from the offset, true where both fall in the same chunk and causal.
    fn chunk_mask(&self, start: usize, offset: usize, n: usize) -> Result<Array> {
        let chunk = Array::from_int(self.args.attention_chunk_size, Dtype::Int32)?;
        let end = (offset + n) as f64;
        let linds = ops::arange(start as f64, end, 1.0, Dtype::Int32, None)?;
        let rinds = ops::expand_dims(
            &ops::arange(offset as f64, end, 1.0, Dtype::Int32, None)?,
            &[1],
            None,
        )?;
        let block = ops::abs(
            &(&ops::floor_divide(&linds, &chunk, None)?
                - &ops::floor_divide(&rinds, &chunk, None)?)?,
            None,
        )?;
        let token = ops::less_equal(&linds, &rinds, None)?;
        let same = ops::equal(&block, &Array::from_int(0, Dtype::Int32)?, None)?;
        Ok(ops::logical_and(&same, &token, None)?)
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (mut h, n) = kit::embed_inputs(inputs, &self.embed_tokens)?;
        let mut caches = caches;
        let (start, offset, global) = match caches.as_deref_mut() {
            Some(c) => {
                kit::check_caches(Some(&*c), self.layers.len(), "layers")?;
                for (i, cache) in c.iter_mut().enumerate() {
                    if uses_rope(i) {
                        let chunked = cache
                            .as_any_mut()
                            .downcast_mut::<ChunkedKVCache>()
                            .ok_or_else(|| ModelError::Cache {
                                what: "llama4".into(),
                                problem: format!("layer {i} needs a ChunkedKVCache"),
                            })?;
                        chunked.maybe_trim_front()?;
                    }
                }
                let start = c[0]
                    .as_any()
                    .downcast_ref::<ChunkedKVCache>()
                    .map_or(0, ChunkedKVCache::start_position);
                (start, c[0].offset(), c[3].make_mask(n, None, false)?)
            }
            None => (0, 0, mlx_cache::mask::fallback_mask(n, None, false)?),
        };
        let chunk = AttentionMask::Array(self.chunk_mask(start, offset, n)?);
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = if uses_rope(i) { &chunk } else { &global };
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let scales = match self.args.attn_temperature_tuning != 0 && !uses_rope(i) {
                true => {
                    let offset = cache.as_ref().map_or(0, |c| c.offset());
                    Some(temperature_scales(&self.args, offset, n as i32)?)
                }
                false => None,
            };
            let r = layer.self_attn.forward_scaled(
                &layer.input_layernorm.forward(&h)?,
                mask,
                scales.as_ref(),
                cache,
            )?;
            let hh = (&h + &r)?;
            let r = layer
                .feed_forward
                .forward(&layer.post_attention_layernorm.forward(&hh)?)?;
            h = (&hh + &r)?;
        }
        self.norm.forward(&h)
    }
}

impl LanguageModel for Model {
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        self.lm_head.forward(&self.hidden_states(inputs, caches)?)
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, None))
    }

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::Linear(self.lm_head.clone()))
    }

    kit::layer_caches! {
        fn make_cache(&self) {
            let chunk = self.args.attention_chunk_size.max(1) as usize;
            (0..self.layers.len())
                .map(|i| -> Box<dyn Cache> {
                    if uses_rope(i) {
                        Box::new(ChunkedKVCache::new(chunk))
                    } else {
                        Box::new(KVCache::new())
                    }
                })
                .collect()
        }
    }

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.args.vocab_size
    }

    fn as_trainable_mut(&mut self) -> Option<&mut dyn super::Trainable> {
        Some(self)
    }
}

impl super::Trainable for Model {
    fn layers_path(&self) -> String {
        "language_model.model.layers".into()
    }
}
