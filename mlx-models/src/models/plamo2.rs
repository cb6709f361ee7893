//! mlx-lm 0.32.2 `models/plamo2.py`: a Mamba / attention hybrid (`is_mamba`: every layer but
//! `i % mamba_step == mamba_step // 2`) under offset RMS norms (`weight + offset`: 1 before the
//! mixer and the MLP, 1/5 after the mixer, 1/5^1.5 after the MLP). The Mamba mixer splits each
//! head's projection into gate and input, convolves the input causally (its last `d_conv - 1`
//! steps and the SSM state in an [`ArraysCache`] of two slots), RMS-normalises `B`, `C` and `dt`
//! and runs mlx-lm's `ssm_update` (off Metal: `ssm_attn`, [`crate::layers::ssm::ssm_attn`]) with
//! one group; the attention has a fused `qkv_proj`, weightless RMS-normed q/k times learned
//! per-head weights, and MLX's SDPA; the MLP a fused `gate_up_proj` into `swiglu`. Inference
//! only.

use mlx_cache::{ArraysCache, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{arrays_cache, ssm_attn, DepthwiseConv, SsmParams};
use crate::layers::{silu, swiglu, Embedding, Linear, Norm, Rope};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_type: String = "plamo2".into();
    d_hidden: i32 = 4096;
    d_layers: i32 = 32;
    d_eps: f64 = 1e-6;
    d_true: bool = true;
    d_heads: i32 = 32;
    d_kv: i32 = 4;
    d_head: i32 = 128;
    d_state: i32 = 64;
    d_conv: i32 = 4;
    d_mamba_heads: i32 = 64;
    d_step: i32 = 2;
    d_inter: i32 = 13312;
    d_vocab: i32 = 32000;
}

/// plamo2.py `ModelArgs` (the fields it reads).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    #[serde(default = "d_type")]
    pub model_type: String,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d_true")]
    pub tie_word_embeddings: bool,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_kv")]
    pub num_key_value_heads: i32,
    #[serde(default = "d_head")]
    pub hidden_size_per_head: i32,
    #[serde(default = "d_state")]
    pub mamba_d_state: i32,
    #[serde(default = "d_conv")]
    pub mamba_d_conv: i32,
    #[serde(default = "d_mamba_heads")]
    pub mamba_num_heads: i32,
    #[serde(default = "d_step")]
    pub mamba_step: i32,
    #[serde(default = "d_true")]
    pub mamba_enabled: bool,
    #[serde(default = "d_inter")]
    pub intermediate_size: i32,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
}

/// `ssm_update`'s default `time_step_limit`.
const TIME_STEP_LIMIT: (f32, f32) = (0.001, 100.0);

struct Mamba {
    in_proj: Linear,
    conv1d: DepthwiseConv,
    bcdt_proj: Linear,
    dt_proj: Linear,
    dt_bias: Array,
    a_log: Array,
    d: Array,
    dt_norm_weight: Array,
    b_norm_weight: Array,
    c_norm_weight: Array,
    out_proj: Linear,
}

enum Mixer {
    Mamba(Box<Mamba>),
    /// plamo2.py's `Attention` ([`kit::Attention`]): the fused `qkv_proj`, each head normed
    /// without weight then times its `q_weight` / `k_weight` row, full rope, no biases.
    Attention(Box<kit::Attention>),
}

struct Layer {
    mixer: Mixer,
    gate_up_proj: Linear,
    down_proj: Linear,
    pre_mixer_norm: Norm,
    post_mixer_norm: Norm,
    pre_mlp_norm: Norm,
    post_mlp_norm: Norm,
}

pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: Norm,
    lm_head: Option<Linear>,
    fa_idx: usize,
}

/// plamo2.py `is_mamba(config, i)`.
fn is_mamba(a: &ModelArgs, i: i32) -> bool {
    if !a.mamba_enabled {
        return false;
    }
    if a.num_hidden_layers <= a.mamba_step / 2 {
        return i != a.num_hidden_layers - 1;
    }
    i % a.mamba_step != a.mamba_step / 2
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`plamo2`): {m}"));
        kit::check_positive(
            "plamo2",
            &[
                ("hidden_size", args.hidden_size),
                ("num_hidden_layers", args.num_hidden_layers),
                ("num_attention_heads", args.num_attention_heads),
                ("num_key_value_heads", args.num_key_value_heads),
                ("hidden_size_per_head", args.hidden_size_per_head),
                ("mamba_d_state", args.mamba_d_state),
                ("mamba_d_conv", args.mamba_d_conv),
                ("mamba_num_heads", args.mamba_num_heads),
                ("intermediate_size", args.intermediate_size),
                ("vocab_size", args.vocab_size),
            ],
        )?;
        if args.mamba_enabled && args.mamba_step <= 1 {
            return Err(bad(format!(
                "field `mamba_step` must be above 1, got {}",
                args.mamba_step
            )));
        }
        let fa_idx = (args.mamba_step / 2).max(0) as usize;
        if fa_idx >= args.num_hidden_layers as usize {
            return Err(bad(format!(
                "field `mamba_step` {}: mlx-lm takes the attention mask from layer {fa_idx} of {}",
                args.mamba_step, args.num_hidden_layers
            )));
        }
        let (h, kv, hd) = (
            args.num_attention_heads,
            args.num_key_value_heads,
            args.hidden_size_per_head,
        );
        if h % kv != 0 {
            return Err(bad(format!(
                "field `num_attention_heads` {h} must divide by `num_key_value_heads` {kv}"
            )));
        }
        // `sanitize`: HF's `(C, 1, K)` convolution weights to MLX's `(C, K, 1)`.
        for k in w.names() {
            if k.contains("conv1d.weight")
                && w.shape_of(&k).and_then(|s| s.last().copied()) != Some(1)
            {
                w.map_tensor(&k, |v| Ok(ops::moveaxis(v, 2, 1, None)?))?;
            }
        }
        let (d, eps) = (args.hidden_size, args.rms_norm_eps as f32);
        let mh = args.mamba_num_heads;
        let inter = mh * hd;
        let ds = args.mamba_d_state;
        let dt_dim = (d / 16).max(64);
        let mut layers = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = |s: &str| format!("model.layers.layers.{i}.{s}");
            let m = |s: &str| p(&format!("mixer.{s}"));
            let mixer = if is_mamba(&args, i) {
                Mixer::Mamba(Box::new(Mamba {
                    in_proj: Linear::load(w, &m("in_proj"), d, 2 * inter, false)?,
                    conv1d: DepthwiseConv::load(w, &m("conv1d"), inter, args.mamba_d_conv, false)?,
                    bcdt_proj: Linear::load(w, &m("bcdt_proj"), inter, dt_dim + 2 * ds, false)?,
                    dt_proj: Linear::load(w, &m("dt_proj"), dt_dim, mh, false)?,
                    dt_bias: w.take(&m("dt_bias"), &[mh])?,
                    a_log: w.take(&m("A_log"), &[mh])?,
                    d: w.take(&m("D"), &[mh])?,
                    dt_norm_weight: w.take(&m("dt_norm_weight"), &[dt_dim])?,
                    b_norm_weight: w.take(&m("B_norm_weight"), &[ds])?,
                    c_norm_weight: w.take(&m("C_norm_weight"), &[ds])?,
                    out_proj: Linear::load(w, &m("out_proj"), inter, d, false)?,
                }))
            } else {
                let at = p("mixer");
                let rope = Rope::Base {
                    dims: hd,
                    traditional: false,
                    base: 10000.0,
                    scale: 1.0,
                };
                // `head_dim ** -0.5`.
                let scale = f64::from(hd).powf(-0.5) as f32;
                let names = ("qkv_proj", "o_proj");
                Mixer::Attention(Box::new(
                    kit::Attention::load_fused(w, &at, names, (d, h, kv, hd), scale)?
                        .with_head_weights(w, &at, 1e-6)?
                        .with_rope(Some(rope)),
                ))
            };
            let norm = |w: &mut Weights, s: &str, offset: f64| {
                Norm::load_rms_plus(w, &p(s), d, eps, offset as f32)
            };
            layers.push(Layer {
                mixer,
                gate_up_proj: Linear::load(
                    w,
                    &p("mlp.gate_up_proj"),
                    d,
                    2 * args.intermediate_size,
                    false,
                )?,
                down_proj: Linear::load(w, &p("mlp.down_proj"), args.intermediate_size, d, false)?,
                pre_mixer_norm: norm(w, "pre_mixer_norm", 1.0)?,
                post_mixer_norm: norm(w, "post_mixer_norm", 1.0 / 5.0)?,
                pre_mlp_norm: norm(w, "pre_mlp_norm", 1.0)?,
                post_mlp_norm: norm(w, "post_mlp_norm", 1.0 / 5f64.powf(1.5))?,
            });
        }
        let lm_head = crate::models::load_lm_head(w, args.tie_word_embeddings, d, args.vocab_size)?;
        Ok(Model {
            embed_tokens: Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?,
            layers,
            norm: Norm::load_rms_plus(w, "model.norm", d, eps, 1.0)?,
            lm_head,
            fa_idx,
            args,
        })
    }

    /// `Mamba.__call__`.
    fn mamba(
        &self,
        m: &Mamba,
        x: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let (mh, hd, ds) = (
            self.args.mamba_num_heads,
            self.args.hidden_size_per_head,
            self.args.mamba_d_state,
        );
        let eps = self.args.rms_norm_eps as f32;
        let zx = ops::reshape(&m.in_proj.forward(x)?, &[b, l, mh, -1], None)?;
        let parts = ops::split_at(&zx, &[hd], -1, None)?;
        let (z, xin) = (&parts[0], &parts[1]);
        let mut conv_input = ops::reshape(xin, &[b, -1, mh * hd], None)?;
        if let Some(mk) = mask {
            conv_input = ops::where_scalar(&mk.expand_dims(&[-1])?, &conv_input, 0i32, None)?;
        }
        let padded = m.conv1d.padded(
            &conv_input,
            cache.as_ref().and_then(|c| c.get(0)),
            cache.is_some(),
        )?;
        let xc = silu(&m.conv1d.forward(&padded)?)?;
        let bcdt = m.bcdt_proj.forward(&xc)?;
        let parts = ops::split_at(&bcdt, &[ds, 2 * ds], -1, None)?;
        let dt = fast::rms_norm(&parts[2], Some(&m.dt_norm_weight), eps, None)?;
        let bm = fast::rms_norm(&parts[0], Some(&m.b_norm_weight), eps, None)?;
        let cm = fast::rms_norm(&parts[1], Some(&m.c_norm_weight), eps, None)?;
        let dt = m.dt_proj.forward(&dt)?;
        // `_ssm`.
        let xs = ops::reshape(&xc, &[b, l, mh, hd], None)?;
        let bm = ops::reshape(&bm, &[b, l, 1, ds], None)?;
        let cm = ops::reshape(&cm, &[b, l, 1, ds], None)?;
        let params = SsmParams {
            a_log: &m.a_log,
            d: &m.d,
            dt_bias: &m.dt_bias,
            time_step_limit: TIME_STEP_LIMIT,
        };
        let state0 = cache.as_ref().and_then(|c| c.get(1)).cloned();
        let (y, state) = ssm_attn(&xs, &bm, &cm, &dt, &params, state0.as_ref(), mask)?;
        if let Some(c) = cache {
            if c.keeps_history() {
                // The state after each kept token: the same scan over each prefix.
                let first_kept = (l as usize).saturating_sub(c.max_rollback() + 1);
                let mut steps = Vec::with_capacity(l as usize);
                for t in 1..=l {
                    let st = if t == l {
                        Some(state.clone())
                    } else if (t as usize) > first_kept {
                        let pre = |a: &Array| a.slice_axis(1, 0, t);
                        let mk = mask
                            .map(|mk| mk.slice_axis(mk.ndim() as i32 - 1, 0, t))
                            .transpose()?;
                        Some(
                            ssm_attn(
                                &pre(&xs)?,
                                &pre(&bm)?,
                                &pre(&cm)?,
                                &pre(&dt)?,
                                &params,
                                state0.as_ref(),
                                mk.as_ref(),
                            )?
                            .1,
                        )
                    } else {
                        None
                    };
                    steps.push(vec![Some(m.conv1d.state_after(&padded, t)?), st]);
                }
                c.checkpoint_steps(steps)?;
            }
            c.set(0, m.conv1d.state_after(&padded, l)?)?;
            c.set(1, state)?;
            c.advance(l as usize)?;
        }
        let y = ops::reshape(&y, &[b, l, mh * hd], None)?;
        let out = swiglu(&ops::flatten(z, -2, -1, None)?, &y)?;
        m.out_proj.forward(&out)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut caches = caches;
        let mut x = self.embed_tokens.forward(inputs)?;
        let attn_mask = kit::cache_mask(caches.as_deref(), self.fa_idx, n, None, false)?;
        let mamba_mask = match caches.as_deref() {
            Some(c) if self.args.mamba_enabled => {
                match c[0].as_any().downcast_ref::<ArraysCache>() {
                    Some(a) => a.ssm_mask(n)?,
                    None => None,
                }
            }
            _ => None,
        };
        for (i, l) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let hs = l.pre_mixer_norm.forward(&x)?;
            let hs = match &l.mixer {
                Mixer::Mamba(m) => {
                    self.mamba(m, &hs, mamba_mask.as_ref(), arrays_cache(cache, i)?)?
                }
                Mixer::Attention(a) => a.forward(&hs, &attn_mask, cache)?,
            };
            let x1 = (&x + &l.post_mixer_norm.forward(&hs)?)?;
            let hs = l.pre_mlp_norm.forward(&x1)?;
            let gu = ops::split_equal(&l.gate_up_proj.forward(&hs)?, 2, -1, None)?;
            let mlp = l.down_proj.forward(&swiglu(&gu[0], &gu[1])?)?;
            x = (&x1 + &l.post_mlp_norm.forward(&mlp)?)?;
        }
        self.norm.forward(&x)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        crate::models::project(self.lm_head.as_ref(), &self.embed_tokens, h)
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    kit::layer_caches! {
        /// `make_cache`: an `ArraysCache(2)` per Mamba layer, a `KVCache` per attention layer.
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers.iter().map(|l| matches!(l.mixer, Mixer::Attention(_))),
                2,
            )
        }
    }
}
