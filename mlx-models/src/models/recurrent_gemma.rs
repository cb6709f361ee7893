//! mlx-lm 0.32.2 `models/recurrent_gemma.py` (Griffin): residual blocks whose temporal block is
//! either recurrent (a gelu-gated branch times a causal depthwise convolution then the RG-LRU,
//! the real-gated linear recurrence with block-diagonal gates, its state in an
//! [`ArraysCache`] of two slots: the convolution's last `K - 1` inputs and the recurrence's
//! state) or a local attention block (one shared key/value head, rope on half of each head,
//! a [`RotatingKVCache`] of the attention window), chosen by `block_types` in turn; Gemma's
//! `1 + weight` RMS norms (the blocks' at mlx-lm's default eps 1e-5), a gelu-gated MLP, embeddings
//! scaled by `sqrt(hidden_size)`, a tied or separate head and a tanh logit soft cap (plain ops,
//! as there). With history on, the cache records the state after each token, so `trim` is
//! exact. Inference only.

use mlx_cache::{ArraysCache, Cache, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{arrays_cache, softplus, DepthwiseConv};
use crate::layers::{gelu_approx, Embedding, Linear, Norm, NormKind, Rope};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_true: bool = true;
}

/// recurrent_gemma.py `ModelArgs` (the fields it reads; `attention_bias`,
/// `num_key_value_heads` and `rope_theta` are required there but unused, and `conv1d_width`
/// is required but the blocks take their default width, [`CONV_WIDTH`]).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub conv1d_width: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub logits_soft_cap: Option<f64>,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub rms_norm_eps: f64,
    pub attention_window_size: i32,
    pub vocab_size: i32,
    #[serde(default = "d_true")]
    pub embeddings_scale_by_sqrt_dim: bool,
    #[serde(default)]
    pub block_types: Option<Vec<String>>,
    #[serde(default)]
    pub _block_types: Option<Vec<String>>,
}

/// `RGLRU`'s parameters.
struct RgLru {
    recurrent_param: Array,
    input_gate_weight: Array,
    input_gate_bias: Array,
    recurrent_gate_weight: Array,
    recurrent_gate_bias: Array,
}

struct Recurrent {
    linear_y: Linear,
    linear_x: Linear,
    linear_out: Linear,
    conv_1d: DepthwiseConv,
    rg_lru: RgLru,
}

enum Temporal {
    Recurrent(Box<Recurrent>),
    /// `LocalAttentionBlock` ([`kit::Attention`]): one key-value head, a rope over half of
    /// each head, `o_proj` alone with a bias.
    Attention(Box<kit::Attention>),
}

struct Block {
    temporal_pre_norm: Norm,
    temporal: Temporal,
    channel_pre_norm: Norm,
    up_proj: Linear,
    gate_proj: Linear,
    down_proj: Linear,
}

pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<Block>,
    final_norm: Norm,
    lm_head: Option<Linear>,
    heads: i32,
    head_dim: i32,
    swa_idx: usize,
}

/// `RMSNorm(width)`'s default eps.
const BLOCK_EPS: f32 = 1e-5;

/// `RecurrentBlock`'s `conv1d_temporal_width`: mlx-lm's `Griffin` never passes the config's
/// `conv1d_width`, so its default, 4, is what runs.
const CONV_WIDTH: i32 = 4;

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`recurrent_gemma`): {m}"));
        kit::check_positive(
            "recurrent_gemma",
            &[
                ("hidden_size", args.hidden_size),
                ("intermediate_size", args.intermediate_size),
                ("num_attention_heads", args.num_attention_heads),
                ("num_hidden_layers", args.num_hidden_layers),
                ("attention_window_size", args.attention_window_size),
                ("vocab_size", args.vocab_size),
            ],
        )?;
        let types = args
            .block_types
            .clone()
            .or_else(|| args._block_types.clone())
            .ok_or_else(|| bad("field `block_types` (or `_block_types`) is missing".into()))?;
        if types.is_empty() {
            return Err(bad("field `block_types` is empty".into()));
        }
        let swa_idx = types
            .iter()
            .position(|t| t == "attention")
            .ok_or_else(|| bad("field `block_types` has no \"attention\" block".into()))?;
        let (d, h) = (args.hidden_size, args.num_attention_heads);
        let hd = d / h;
        if d % h != 0 || hd % 4 != 0 {
            return Err(bad(format!(
                "field `hidden_size` {d} must divide by `num_attention_heads` {h} into a head \
                 size divisible by 4 (rope covers half of it)"
            )));
        }
        // `sanitize`: HF's `(C, 1, K)` convolution weights to MLX's `(C, K, 1)`.
        for k in w.names() {
            if k.contains("conv_1d.weight")
                && w.shape_of(&k).and_then(|s| s.last().copied()) != Some(1)
            {
                w.map_tensor(&k, |v| Ok(ops::moveaxis(v, 2, 1, None)?))?;
            }
        }
        let ffn = args.intermediate_size / 2;
        let mut layers = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let tb = |s: &str| p(&format!("temporal_block.{s}"));
            let kind = &types[i as usize % types.len()];
            let temporal = if kind == "recurrent" {
                let take = |w: &mut Weights, s: &str, shape: &[i32]| {
                    w.take(&tb(&format!("rg_lru.{s}")), shape)
                };
                Temporal::Recurrent(Box::new(Recurrent {
                    linear_y: Linear::load(w, &tb("linear_y"), d, d, true)?,
                    linear_x: Linear::load(w, &tb("linear_x"), d, d, true)?,
                    linear_out: Linear::load(w, &tb("linear_out"), d, d, true)?,
                    conv_1d: DepthwiseConv::load(w, &tb("conv_1d"), d, CONV_WIDTH, true)?,
                    rg_lru: RgLru {
                        recurrent_param: take(w, "recurrent_param", &[d])?,
                        input_gate_weight: take(w, "input_gate_weight", &[h, hd, hd])?,
                        input_gate_bias: take(w, "input_gate_bias", &[h, hd])?,
                        recurrent_gate_weight: take(w, "recurrent_gate_weight", &[h, hd, hd])?,
                        recurrent_gate_bias: take(w, "recurrent_gate_bias", &[h, hd])?,
                    },
                }))
            } else {
                // `(width // num_heads) ** (-0.5)`.
                let scale = f64::from(hd).powf(-0.5) as f32;
                let rope = Rope::Base {
                    dims: hd / 2,
                    traditional: false,
                    base: 10000.0,
                    scale: 1.0,
                };
                Temporal::Attention(Box::new(
                    kit::Attention::load_v(
                        w,
                        &p("temporal_block"),
                        (d, h, 1, hd, hd),
                        (false, true),
                        scale,
                    )?
                    .with_rope(Some(rope)),
                ))
            };
            let norm =
                |w: &mut Weights, s: &str| Norm::load(w, &p(s), NormKind::RmsOffset, d, BLOCK_EPS);
            layers.push(Block {
                temporal_pre_norm: norm(w, "temporal_pre_norm")?,
                temporal,
                channel_pre_norm: norm(w, "channel_pre_norm")?,
                up_proj: Linear::load(w, &p("mlp_block.up_proj"), d, ffn, true)?,
                gate_proj: Linear::load(w, &p("mlp_block.gate_proj"), d, ffn, true)?,
                down_proj: Linear::load(w, &p("mlp_block.down_proj"), ffn, d, true)?,
            });
        }
        let lm_head = if w.contains("lm_head.weight") {
            Some(Linear::load(w, "lm_head", d, args.vocab_size, false)?)
        } else {
            None
        };
        Ok(Model {
            embed_tokens: Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?,
            layers,
            final_norm: Norm::load(
                w,
                "model.final_norm",
                NormKind::RmsOffset,
                d,
                args.rms_norm_eps as f32,
            )?,
            lm_head,
            heads: h,
            head_dim: hd,
            swa_idx,
            args,
        })
    }

    /// `apply_block_linear(h, w, b)`: the per-head gate, sigmoid.
    fn block_linear(&self, x: &Array, w: &Array, b: &Array) -> Result<Array> {
        let s = x.shape();
        let h = ops::reshape(x, &[s[0], s[1], self.heads, self.head_dim], None)?;
        let h = ops::matmul(&ops::swapaxes(&h, 1, 2, None)?, w, None)?;
        let h = (&ops::swapaxes(&h, 1, 2, None)? + b)?;
        Ok(ops::sigmoid(&ops::flatten(&h, 2, 3, None)?, None)?)
    }

    /// `RecurrentBlock.__call__` with its `Conv1d`, `RGLRU` and `rnn_scan`.
    fn recurrent(
        &self,
        r: &Recurrent,
        x: &Array,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let y_branch = gelu_approx(&r.linear_y.forward(x)?)?;
        let x = r.linear_x.forward(x)?;
        let padded =
            r.conv_1d
                .padded(&x, cache.as_ref().and_then(|c| c.get(0)), cache.is_some())?;
        let x = r.conv_1d.forward(&padded)?;
        let h0 = cache.as_ref().and_then(|c| c.get(1)).cloned();
        let g = &r.rg_lru;
        let gate_x = self.block_linear(&x, &g.input_gate_weight, &g.input_gate_bias)?;
        let gate_a = self.block_linear(&x, &g.recurrent_gate_weight, &g.recurrent_gate_bias)?;
        let log_a =
            (&ops::scalar_multiply(-8.0f32, &gate_a, None)? * &softplus(&g.recurrent_param)?)?;
        let a = ops::exp(&log_a, None)?;
        let a_square = ops::exp(&ops::scalar_multiply(2i32, &log_a, None)?, None)?;
        let gated_x = (&x * &gate_x)?;
        let mut multiplier = ops::sqrt(&ops::scalar_subtract(1i32, &a_square, None)?, None)?;
        let s = multiplier.shape();
        let (b, l, width) = (s[0], s[1], s[2]);
        if h0.is_none() {
            // `multiplier[:, 0, :] = 1.0`.
            let one = ops::ones(&[b, 1, width], multiplier.dtype(), None)?;
            multiplier = ops::slice_update(
                &multiplier,
                &one,
                &[0, 0, 0],
                &[b, 1, width],
                &[1, 1, 1],
                None,
            )?;
        }
        let nx = (&gated_x * &multiplier.astype(x.dtype())?)?;
        let keep = cache.as_ref().is_some_and(|c| c.keeps_history());
        let mut states = Vec::new();
        let (y, last) = if l == 1 {
            match &h0 {
                None => (nx.clone(), nx.slice_axis(1, 0, 1)?.squeeze(&[1])?),
                Some(h) => {
                    let y = (&(&a * &ops::expand_dims(h, &[1], None)?)? + &nx)?;
                    let last = y.slice_axis(1, l - 1, l)?.squeeze(&[1])?;
                    (y, last)
                }
            }
        } else {
            let mut h_t = match &h0 {
                Some(h) => h.clone(),
                None => ops::zeros(&[b, width], nx.dtype(), None)?,
            };
            let mut ys = Vec::with_capacity(l as usize);
            for t in 0..l {
                let at = a.slice_axis(1, t, t + 1)?.squeeze(&[1])?;
                let xt = nx.slice_axis(1, t, t + 1)?.squeeze(&[1])?;
                h_t = (&(&at * &h_t)? + &xt)?;
                ys.push(h_t.clone());
            }
            let refs: Vec<&Array> = ys.iter().collect();
            (ops::stack(&refs, 1, None)?.astype(nx.dtype())?, h_t)
        };
        if let Some(c) = cache {
            if keep {
                for t in 0..l {
                    states.push(vec![
                        Some(r.conv_1d.state_after(&padded, t + 1)?),
                        Some(y.slice_axis(1, t, t + 1)?.squeeze(&[1])?),
                    ]);
                }
                c.checkpoint_steps(states)?;
            }
            c.set(0, r.conv_1d.state_after(&padded, l)?)?;
            c.set(1, last)?;
            c.advance(l as usize)?;
        }
        r.linear_out.forward(&(&y * &y_branch)?)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut caches = caches;
        let mut x = self.embed_tokens.forward(inputs)?;
        if self.args.embeddings_scale_by_sqrt_dim {
            let d = f64::from(self.args.hidden_size).sqrt() as f32;
            x = ops::multiply_scalar(&x, d, None)?;
        }
        let window = self.args.attention_window_size as usize;
        let mask = kit::cache_mask(caches.as_deref(), self.swa_idx, n, Some(window), false)?;
        for (i, l) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let normed = l.temporal_pre_norm.forward(&x)?;
            let t = match &l.temporal {
                Temporal::Recurrent(r) => self.recurrent(r, &normed, arrays_cache(cache, i)?)?,
                Temporal::Attention(a) => a.forward(&normed, &mask, cache)?,
            };
            let residual = (&t + &x)?;
            let m = l.channel_pre_norm.forward(&residual)?;
            let m = l
                .down_proj
                .forward(&(&gelu_approx(&l.gate_proj.forward(&m)?)? * &l.up_proj.forward(&m)?)?)?;
            x = (&m + &residual)?;
        }
        self.final_norm.forward(&x)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        let logits = crate::models::project(self.lm_head.as_ref(), &self.embed_tokens, h)?;
        match self.args.logits_soft_cap {
            Some(c) if c != 0.0 => Ok(crate::layers::softcap(&logits, c as f32)?),
            _ => Ok(logits),
        }
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    kit::layer_caches! {
        /// `make_cache`: an `ArraysCache(2)` per recurrent block, a
        /// `RotatingKVCache(attention_window_size)` per attention block.
        fn make_cache(&self) {
            let window = self.args.attention_window_size as usize;
            self.layers
                .iter()
                .map(|l| -> Box<dyn Cache> {
                    match (&l.temporal, RotatingKVCache::new(window, 0)) {
                        (Temporal::Attention(_), Ok(c)) => Box::new(c),
                        _ => Box::new(ArraysCache::new(2)),
                    }
                })
                .collect()
        }
    }
}
