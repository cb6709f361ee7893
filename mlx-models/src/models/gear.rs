//! mlx-lm 0.32.2 `models/gear.py`: Gemma-style sandwich-normed layers (`(1 + weight)` RMS
//! norms cast to the activations' dtype, pre/post attention and feed-forward norms, embeddings
//! scaled by `sqrt(hidden_size)`) of three kinds by `layer_types`: full attention (`KVCache`),
//! sliding attention (`RotatingKVCache(sliding_window)`, its own rope base, no rope scaling)
//! and `conv_mixer`, a gated mixer whose normed keys and values pass a causal depthwise
//! convolution over time (`conv_L_cache` taps, the last `L_cache - 1` inputs in an
//! [`ArraysCache`] of two slots) and gate the values by `sigmoid(query * key)`. Attention has
//! per-head q/k norms and optionally mlx-lm's plain-ops soft-capped attention; the head is tied
//! or separate with an optional final tanh soft cap. Inference only.

use mlx_cache::{ArraysCache, AttentionMask, Cache, KVCache, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{arrays_cache, DepthwiseConv};
use crate::layers::{gelu, gelu_approx, silu, Embedding, Linear, Norm, RmsNorm, Rope, RopeScaling};
use crate::models::descriptor::Upcast;
use crate::models::moe::QkNorm;
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_act: String = "gelu_pytorch_tanh".into();
    d_window: i32 = 512;
    d_conv: i32 = 3;
    d_theta: f64 = 1_000_000.0;
    d_local_theta: f64 = 10_000.0;
    d_true: bool = true;
}

/// gear.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: Option<i32>,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    #[serde(default = "d_act")]
    pub hidden_activation: String,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    #[serde(default = "d_window")]
    pub sliding_window: i32,
    #[serde(default = "d_conv")]
    #[serde(rename = "conv_L_cache")]
    pub conv_l_cache: i32,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default = "d_local_theta")]
    pub rope_local_base_freq: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default = "d_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub use_bidirectional_attention: bool,
}

/// `GearRMSNorm` ([`Norm::RmsOffsetCast`]).
fn gear_norm(w: &mut Weights, p: &str, dims: i32, eps: f32) -> Result<Norm> {
    Ok(Norm::RmsOffsetCast(RmsNorm::load(w, p, dims, eps)?))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Full,
    Sliding,
    Conv,
}

#[derive(Clone, Copy)]
enum Act {
    GeluApprox,
    Gelu,
    Silu,
}

struct Mixer {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Norm,
    k_norm: Norm,
    key_conv: DepthwiseConv,
    value_conv: DepthwiseConv,
}

enum Temporal {
    /// `Attention` ([`kit::Attention`]): per-head `GearRMSNorm` q/k norms, the rope, and
    /// `_softcap_attention` when `attn_logit_softcapping` is set.
    Attention(Box<kit::Attention>),
    Mixer(Box<Mixer>),
}

struct Layer {
    kind: Kind,
    temporal: Temporal,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    input_layernorm: Norm,
    post_attention_layernorm: Norm,
    pre_feedforward_layernorm: Norm,
    post_feedforward_layernorm: Norm,
}

pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: Norm,
    lm_head: Option<Linear>,
    act: Act,
    kv_heads: i32,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`gear`): {m}"));
        let kv = args.num_key_value_heads.unwrap_or(args.num_attention_heads);
        kit::check_positive(
            "gear",
            &[
                ("vocab_size", args.vocab_size),
                ("hidden_size", args.hidden_size),
                ("intermediate_size", args.intermediate_size),
                ("num_hidden_layers", args.num_hidden_layers),
                ("num_attention_heads", args.num_attention_heads),
                ("num_key_value_heads", kv),
                ("head_dim", args.head_dim),
                ("sliding_window", args.sliding_window),
                ("conv_L_cache", args.conv_l_cache),
            ],
        )?;
        let n = args.num_hidden_layers as usize;
        let types = args
            .layer_types
            .clone()
            .unwrap_or_else(|| vec!["full_attention".into(); n]);
        if types.len() != n {
            return Err(bad(format!(
                "field `layer_types`: expected {n} layer types, got {}",
                types.len()
            )));
        }
        if args.use_bidirectional_attention {
            return Err(bad(
                "field `use_bidirectional_attention`: Gear bidirectional attention is not supported"
                    .into(),
            ));
        }
        let (h, hd) = (args.num_attention_heads, args.head_dim);
        if h % kv != 0 {
            return Err(bad(format!(
                "field `num_attention_heads` {h} must divide by `num_key_value_heads` {kv}"
            )));
        }
        let act = match args.hidden_activation.as_str() {
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Act::GeluApprox,
            "gelu" => Act::Gelu,
            "silu" | "swish" => Act::Silu,
            other => {
                return Err(bad(format!(
                    "field `hidden_activation`: unsupported Gear activation {other:?}"
                )))
            }
        };
        // `sanitize`.
        for k in w.names() {
            if k.contains("rotary_emb.inv_freq")
                || k.ends_with("embed_scale")
                || (args.tie_word_embeddings && k == "lm_head.weight")
            {
                w.discard(&k);
            } else if (k.ends_with("key_conv.weight") || k.ends_with("value_conv.weight"))
                && w.shape_of(&k).is_some_and(|s| s.len() == 3 && s[1] == 1)
            {
                w.map_tensor(&k, |v| Ok(ops::transpose(v, &[0, 2, 1], None)?))?;
            }
        }
        let (d, bias, eps) = (
            args.hidden_size,
            args.attention_bias,
            args.rms_norm_eps as f32,
        );
        // `query_pre_attn_scalar ** -0.5`.
        let qpas = args.query_pre_attn_scalar.unwrap_or(f64::from(hd));
        let scale = qpas.powf(-0.5) as f32;
        let mut layers = Vec::with_capacity(n);
        for (i, t) in types.iter().enumerate() {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let kind = match t.as_str() {
                "full_attention" => Kind::Full,
                "sliding_attention" => Kind::Sliding,
                "conv_mixer" => Kind::Conv,
                // gear.py: any other attention type is an attention layer on the full mask
                // path's rope, with no mask of its own (its layer loop's `else` is the conv
                // mask); refused here rather than guessed.
                other => {
                    return Err(bad(format!(
                        "field `layer_types`: layer {i} has unknown type {other:?}"
                    )))
                }
            };
            let temporal = if kind == Kind::Conv {
                let m = |s: &str| p(&format!("local_mixer.{s}"));
                Temporal::Mixer(Box::new(Mixer {
                    q_proj: Linear::load(w, &m("q_proj"), d, h * hd, bias)?,
                    k_proj: Linear::load(w, &m("k_proj"), d, kv * hd, bias)?,
                    v_proj: Linear::load(w, &m("v_proj"), d, kv * hd, bias)?,
                    o_proj: Linear::load(w, &m("o_proj"), h * hd, d, bias)?,
                    q_norm: gear_norm(w, &m("q_norm"), hd, eps)?,
                    k_norm: gear_norm(w, &m("k_norm"), hd, eps)?,
                    key_conv: DepthwiseConv::load(
                        w,
                        &m("key_conv"),
                        kv * hd,
                        args.conv_l_cache,
                        bias,
                    )?,
                    value_conv: DepthwiseConv::load(
                        w,
                        &m("value_conv"),
                        kv * hd,
                        args.conv_l_cache,
                        bias,
                    )?,
                }))
            } else {
                let a = |s: &str| p(&format!("self_attn.{s}"));
                let sliding = kind == Kind::Sliding;
                let (theta, scaling) = if sliding {
                    (args.rope_local_base_freq, None)
                } else {
                    (args.rope_theta, args.rope_scaling.as_ref())
                };
                let at = p("self_attn");
                let mut attn = kit::Attention::load(w, &at, (d, h, kv, hd), bias, scale)?;
                attn.q_norm = Some(gear_norm(w, &a("q_norm"), hd, eps)?);
                attn.k_norm = Some(gear_norm(w, &a("k_norm"), hd, eps)?);
                attn.qk_norm = QkNorm::PerHead;
                attn.score = match args.attn_logit_softcapping {
                    Some(cap) if cap != 0.0 => kit::Score::SoftCappedRepeated(cap as f32),
                    _ => kit::Score::Sdpa(Upcast::None),
                };
                let rope =
                    Rope::initialize(hd, theta, false, scaling, args.max_position_embeddings)?;
                Temporal::Attention(Box::new(attn.with_rope(Some(rope))))
            };
            let ffn = args.intermediate_size;
            layers.push(Layer {
                kind,
                temporal,
                gate_proj: Linear::load(w, &p("mlp.gate_proj"), d, ffn, false)?,
                up_proj: Linear::load(w, &p("mlp.up_proj"), d, ffn, false)?,
                down_proj: Linear::load(w, &p("mlp.down_proj"), ffn, d, false)?,
                input_layernorm: gear_norm(w, &p("input_layernorm"), d, eps)?,
                post_attention_layernorm: gear_norm(w, &p("post_attention_layernorm"), d, eps)?,
                pre_feedforward_layernorm: gear_norm(w, &p("pre_feedforward_layernorm"), d, eps)?,
                post_feedforward_layernorm: gear_norm(w, &p("post_feedforward_layernorm"), d, eps)?,
            });
        }
        let lm_head = crate::models::load_lm_head(w, args.tie_word_embeddings, d, args.vocab_size)?;
        Ok(Model {
            embed_tokens: Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?,
            layers,
            norm: gear_norm(w, "model.norm", d, eps)?,
            lm_head,
            act,
            kv_heads: kv,
            args,
        })
    }

    /// `ConvKVGatedMixer.__call__`.
    fn mixer(
        &self,
        m: &Mixer,
        x: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let x = match mask {
            Some(mk) => ops::where_scalar(&ops::expand_dims(mk, &[-1], None)?, x, 0i32, None)?,
            None => x.clone(),
        };
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let (h, kv, hd) = (
            self.args.num_attention_heads,
            self.kv_heads,
            self.args.head_dim,
        );
        let q = ops::reshape(&m.q_proj.forward(&x)?, &[b, l, h, hd], None)?;
        let k = ops::reshape(&m.k_proj.forward(&x)?, &[b, l, kv, hd], None)?;
        let v = m.v_proj.forward(&x)?;
        let q = ops::reshape(&m.q_norm.forward(&q)?, &[b, l, -1], None)?;
        let k = ops::reshape(&m.k_norm.forward(&k)?, &[b, l, -1], None)?;
        let cached = cache.is_some();
        let kp = m
            .key_conv
            .padded(&k, cache.as_ref().and_then(|c| c.get(0)), cached)?;
        let vp = m
            .value_conv
            .padded(&v, cache.as_ref().and_then(|c| c.get(1)), cached)?;
        let key = m.key_conv.forward(&kp)?;
        let value = m.value_conv.forward(&vp)?;
        if let Some(c) = cache {
            if c.keeps_history() {
                let steps = (1..=l)
                    .map(|t| {
                        Ok(vec![
                            Some(m.key_conv.state_after(&kp, t)?),
                            Some(m.value_conv.state_after(&vp, t)?),
                        ])
                    })
                    .collect::<Result<Vec<_>>>()?;
                c.checkpoint_steps(steps)?;
            }
            c.set(0, m.key_conv.state_after(&kp, l)?)?;
            c.set(1, m.value_conv.state_after(&vp, l)?)?;
            c.advance(l as usize)?;
        }
        let expand = |y: &Array| -> Result<Array> {
            let y = ops::reshape(y, &[b, l, kv, hd], None)?;
            let y = ops::expand_dims(&y, &[3], None)?;
            let y = ops::broadcast_to(&y, &[b, l, kv, h / kv, hd], None)?;
            Ok(ops::reshape(&y, &[b, l, h * hd], None)?)
        };
        let (key, value) = (expand(&key)?, expand(&value)?);
        let gated = (&ops::sigmoid(&(&q * &key)?, None)? * &value)?;
        m.o_proj.forward(&gated)
    }

    fn first(&self, kind: Kind) -> Option<usize> {
        self.layers.iter().position(|l| l.kind == kind)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut caches = caches;
        let scale = f64::from(self.args.hidden_size).sqrt() as f32;
        let mut h = ops::multiply_scalar(&self.embed_tokens.forward(inputs)?, scale, None)?;
        let full_mask = match self.first(Kind::Full) {
            Some(i) => kit::cache_mask(caches.as_deref(), i, n, None, false)?,
            None => AttentionMask::None,
        };
        let window = self.args.sliding_window as usize;
        let sliding_mask = match self.first(Kind::Sliding) {
            Some(i) => kit::cache_mask(caches.as_deref(), i, n, Some(window), false)?,
            None => AttentionMask::None,
        };
        let conv_mask = match (self.first(Kind::Conv), caches.as_deref()) {
            (Some(i), Some(c)) => match c[i].as_any().downcast_ref::<ArraysCache>() {
                Some(a) => a.ssm_mask(n)?,
                None => None,
            },
            _ => None,
        };
        for (i, l) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let x = l.input_layernorm.forward(&h)?;
            let y = match &l.temporal {
                Temporal::Attention(a) => {
                    let mask = if l.kind == Kind::Sliding {
                        &sliding_mask
                    } else {
                        &full_mask
                    };
                    a.forward(&x, mask, cache)?
                }
                Temporal::Mixer(m) => {
                    self.mixer(m, &x, conv_mask.as_ref(), arrays_cache(cache, i)?)?
                }
            };
            let hh = (&h + &l.post_attention_layernorm.forward(&y)?)?;
            let f = l.pre_feedforward_layernorm.forward(&hh)?;
            let g = l.gate_proj.forward(&f)?;
            let g = match self.act {
                Act::GeluApprox => gelu_approx(&g)?,
                Act::Gelu => gelu(&g)?,
                Act::Silu => silu(&g)?,
            };
            let f = l.down_proj.forward(&(&g * &l.up_proj.forward(&f)?)?)?;
            h = (&hh + &l.post_feedforward_layernorm.forward(&f)?)?;
        }
        self.norm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        let out = crate::models::project(self.lm_head.as_ref(), &self.embed_tokens, h)?;
        match self.args.final_logit_softcapping {
            Some(cap) if cap != 0.0 => Ok(crate::layers::softcap(&out, cap as f32)?),
            _ => Ok(out),
        }
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    kit::layer_caches! {
        /// `make_cache`: `KVCache` on full attention, `RotatingKVCache(sliding_window)` on
        /// sliding attention, `ArraysCache(2)` on the conv mixers.
        fn make_cache(&self) {
            let window = self.args.sliding_window as usize;
            self.layers
                .iter()
                .map(|l| -> Box<dyn Cache> {
                    match (l.kind, RotatingKVCache::new(window, 0)) {
                        (Kind::Conv, _) => Box::new(ArraysCache::new(2)),
                        (Kind::Sliding, Ok(c)) => Box::new(c),
                        _ => Box::new(KVCache::new()),
                    }
                })
                .collect()
        }
    }
}
