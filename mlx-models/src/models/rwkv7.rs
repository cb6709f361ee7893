//! mlx-lm 0.32.2 `models/rwkv7.py` (RWKV-7 "Goose"): every layer a time-mixing block (token
//! shift, six `addcmul` mixes, low-rank LoRA gates for decay, in-context learning rate, value
//! residual from layer 0 and output gate, the WKV-7 state recurrence run token by token as
//! mlx-lm's `_wkv7_step_ops` off Metal, compiled as there, a per-head LayerNorm) and a
//! channel-mixing block (token shift, `relu2`), both pre-LayerNorm; layer 0 normalises the
//! embeddings first. Each layer's cache is an [`ArraysCache`] of three slots: the time
//! mixing's last input, its WKV state, the channel mixing's last input. With history on, the
//! cache records the slots after each token, so `trim` is exact. Inference only.

use mlx_cache::{ArraysCache, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::activations::{compiled, one};
use crate::layers::ssm::arrays_cache;
use crate::layers::{relu2, Embedding, LayerNorm, Linear};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// rwkv7.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub norm_eps: f64,
    pub head_dim: i32,
    pub num_hidden_layers: i32,
    pub a_low_rank_dim: i32,
    pub v_low_rank_dim: i32,
    pub gate_low_rank_dim: i32,
    pub decay_low_rank_dim: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

/// `LoRA`'s activation between its two linears.
#[derive(Clone, Copy)]
enum Act {
    Identity,
    Sigmoid,
    Tanh,
}

struct Lora {
    down: Linear,
    act: Act,
    up: Linear,
}

impl Lora {
    fn load(w: &mut Weights, p: &str, d: i32, rank: i32, act: Act, bias: bool) -> Result<Lora> {
        Ok(Lora {
            down: Linear::load(w, &format!("{p}.lora.0"), d, rank, false)?,
            act,
            up: Linear::load(w, &format!("{p}.lora.2"), rank, d, bias)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let h = self.down.forward(x)?;
        let h = match self.act {
            Act::Identity => h,
            Act::Sigmoid => ops::sigmoid(&h, None)?,
            Act::Tanh => ops::tanh(&h, None)?,
        };
        self.up.forward(&h)
    }
}

struct TimeMix {
    x_r: Array,
    x_w: Array,
    x_k: Array,
    x_v: Array,
    x_a: Array,
    x_g: Array,
    k_k: Array,
    k_a: Array,
    r_k: Array,
    r_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    g_norm_weight: Array,
    g_norm_bias: Array,
    w_lora: Lora,
    v_lora: Option<Lora>,
    a_lora: Lora,
    g_lora: Lora,
}

struct Layer {
    pre_norm: Option<LayerNorm>,
    attn: TimeMix,
    attn_norm: LayerNorm,
    ffn_norm: LayerNorm,
    ffn_key: Linear,
    ffn_value: Linear,
    ffn_x_k: Array,
}

pub struct Model {
    args: ModelArgs,
    embeddings: Embedding,
    layers: Vec<Layer>,
    norm: LayerNorm,
    lm_head: Option<Linear>,
    heads: i32,
}

/// `addcmul(x, y, z)`: `x + y * z`, compiled shapeless as mlx-lm compiles it.
fn addcmul(x: &Array, y: &Array, z: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| Ok(vec![(&xs[0] + &(&xs[1] * &xs[2])?)?]))?;
    Ok(one(f.call(&[x.clone(), y.clone(), z.clone()])?, "addcmul")?)
}

/// `l2_norm(x)`: `x / maximum(linalg.norm(x, axis=-1, keepdims=True), 1e-7)`, compiled
/// shapeless as mlx-lm compiles it (MLX's vector 2-norm is `sqrt(sum(square(x)))`).
fn l2_norm(x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let x = &xs[0];
        let n = ops::sqrt(&ops::sum(&ops::square(x, None)?, &[-1], true, None)?, None)?;
        Ok(vec![ops::divide(
            x,
            &ops::maximum_scalar(&n, 1e-7f32, None)?,
            None,
        )?])
    })?;
    Ok(one(f.call(std::slice::from_ref(x))?, "l2_norm")?)
}

/// `_wkv7_step_ops(r, w, k, v, a, b, state)`, compiled (not shapeless) as mlx-lm compiles it:
/// returns `(y, state)`.
fn wkv7_step(xs: &[Array]) -> Result<(Array, Array)> {
    let f = compiled!(
        |xs: &[Array]| {
            let (r, w, k, v, a, b, state) =
                (&xs[0], &xs[1], &xs[2], &xs[3], &xs[4], &xs[5], &xs[6]);
            let last = |t: &Array| ops::expand_dims(t, &[-1], None);
            let row = |t: &Array| ops::expand_dims(t, &[-2], None);
            let sab = ops::matmul(&ops::matmul(state, &last(a)?, None)?, &row(b)?, None)?;
            let decayed = (state * &ops::expand_dims(w, &[2], None)?)?;
            let vk = ops::matmul(&last(v)?, &row(k)?, None)?;
            let state = (&(&decayed + &vk)? + &sab)?;
            let y = ops::matmul(&state, &last(r)?, None)?;
            Ok(vec![y, state])
        },
        shapeless = false
    )?;
    let mut out = f.call(xs)?.into_iter();
    match (out.next(), out.next()) {
        (Some(y), Some(s)) => Ok((y, s)),
        _ => Err(ModelError::Internal {
            what: "compiled wkv7 step".into(),
            problem: "returned too little".into(),
        }),
    }
}

/// `TokenShift(x, state)`: the previous step of each position (zeros, or the cached last
/// input, before the first).
fn token_shift(x: &Array, state: Option<&Array>) -> Result<Array> {
    let s = x.shape();
    let state = match state {
        Some(st) => st.clone(),
        None => ops::zeros(&[s[0], 1, s[2]], x.dtype(), None)?,
    };
    if s[1] == 1 {
        return Ok(state);
    }
    Ok(ops::concatenate(
        &[&state, &x.slice_axis(1, 0, s[1] - 1)?],
        1,
        None,
    )?)
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        kit::check_positive(
            "rwkv7",
            &[
                ("vocab_size", args.vocab_size),
                ("hidden_size", args.hidden_size),
                ("intermediate_size", args.intermediate_size),
                ("head_dim", args.head_dim),
                ("num_hidden_layers", args.num_hidden_layers),
                ("a_low_rank_dim", args.a_low_rank_dim),
                ("v_low_rank_dim", args.v_low_rank_dim),
                ("gate_low_rank_dim", args.gate_low_rank_dim),
                ("decay_low_rank_dim", args.decay_low_rank_dim),
            ],
        )?;
        let (d, hd) = (args.hidden_size, args.head_dim);
        if d % hd != 0 {
            return Err(ModelError::Config(format!(
                "config.json (`rwkv7`): field `hidden_size` {d} must divide by `head_dim` {hd}"
            )));
        }
        let h = d / hd;
        // `sanitize`: k_k, k_a and the g_norm arrays as (heads, head_dim).
        for k in w.names() {
            if k.contains("k_k") || k.contains("k_a") || k.contains("g_norm") {
                w.map_tensor(&k, |v| Ok(ops::reshape(v, &[h, hd], None)?))?;
            }
        }
        let eps = args.norm_eps as f32;
        let ln = |w: &mut Weights, p: &str| LayerNorm::load(w, p, d, eps, true, true);
        let mut layers = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let a = |s: &str| p(&format!("attn.{s}"));
            let mix = |w: &mut Weights, s: &str| w.take(&a(s), &[1, 1, d]);
            let head = |w: &mut Weights, s: &str| w.take(&a(s), &[h, hd]);
            let lin = |w: &mut Weights, s: &str| Linear::load(w, &a(s), d, d, false);
            let attn = TimeMix {
                x_r: mix(w, "x_r")?,
                x_w: mix(w, "x_w")?,
                x_k: mix(w, "x_k")?,
                x_v: mix(w, "x_v")?,
                x_a: mix(w, "x_a")?,
                x_g: mix(w, "x_g")?,
                k_k: head(w, "k_k")?,
                k_a: head(w, "k_a")?,
                r_k: head(w, "r_k")?,
                r_proj: lin(w, "r_proj")?,
                k_proj: lin(w, "k_proj")?,
                v_proj: lin(w, "v_proj")?,
                o_proj: lin(w, "o_proj")?,
                g_norm_weight: head(w, "g_norm.weight")?,
                g_norm_bias: head(w, "g_norm.bias")?,
                w_lora: Lora::load(w, &a("w_lora"), d, args.decay_low_rank_dim, Act::Tanh, true)?,
                v_lora: if i > 0 {
                    Some(Lora::load(
                        w,
                        &a("v_lora"),
                        d,
                        args.v_low_rank_dim,
                        Act::Identity,
                        true,
                    )?)
                } else {
                    None
                },
                a_lora: Lora::load(w, &a("a_lora"), d, args.a_low_rank_dim, Act::Identity, true)?,
                g_lora: Lora::load(
                    w,
                    &a("g_lora"),
                    d,
                    args.gate_low_rank_dim,
                    Act::Sigmoid,
                    false,
                )?,
            };
            layers.push(Layer {
                pre_norm: if i == 0 {
                    Some(ln(w, &p("pre_norm"))?)
                } else {
                    None
                },
                attn,
                attn_norm: ln(w, &p("attn_norm"))?,
                ffn_norm: ln(w, &p("ffn_norm"))?,
                ffn_key: Linear::load(w, &p("ffn.key"), d, args.intermediate_size, false)?,
                ffn_value: Linear::load(w, &p("ffn.value"), args.intermediate_size, d, false)?,
                ffn_x_k: w.take(&p("ffn.x_k"), &[d])?,
            });
        }
        let lm_head = crate::models::load_lm_head(w, args.tie_word_embeddings, d, args.vocab_size)?;
        Ok(Model {
            embeddings: Embedding::load(w, "model.embeddings", args.vocab_size, d)?,
            layers,
            norm: ln(w, "model.norm")?,
            lm_head,
            heads: h,
            args,
        })
    }

    /// `Rwkv7TimeMixing.__call__` reading the cache's slots 0 and 1: returns the output,
    /// `v_first`, the final WKV state and (for history) the state after each new token; the
    /// caller writes the slots.
    fn time_mix(
        &self,
        t: &TimeMix,
        x: &Array,
        v_first: Option<&Array>,
        cache: Option<&ArraysCache>,
        keep: bool,
    ) -> Result<(Array, Array, Array, Vec<Array>)> {
        let s = x.shape();
        let (b, l, d) = (s[0], s[1], s[2]);
        let (h, hd) = (self.heads, self.args.head_dim);
        let heads = |a: &Array| ops::reshape(a, &[b, l, h, hd], None);
        let x_prev = token_shift(x, cache.and_then(|c| c.get(0)))?;
        let xx = (&x_prev - x)?;
        let xr = addcmul(x, &xx, &t.x_r)?;
        let xw = addcmul(x, &xx, &t.x_w)?;
        let xk = addcmul(x, &xx, &t.x_k)?;
        let xv = addcmul(x, &xx, &t.x_v)?;
        let xa = addcmul(x, &xx, &t.x_a)?;
        let xg = addcmul(x, &xx, &t.x_g)?;
        let key = heads(&t.k_proj.forward(&xk)?)?;
        let mut value = heads(&t.v_proj.forward(&xv)?)?;
        let receptance = heads(&t.r_proj.forward(&xr)?)?;
        let iclr = heads(&ops::sigmoid(&t.a_lora.forward(&xa)?, None)?)?;
        let gate = t.g_lora.forward(&xg)?;
        let v_first = match (&t.v_lora, v_first) {
            (Some(vl), Some(vf)) => {
                let vv = heads(&ops::sigmoid(&vl.forward(&xv)?, None)?)?;
                value = addcmul(&value, &(vf - &value)?, &vv)?;
                vf.clone()
            }
            (None, _) => value.clone(),
            (Some(_), None) => {
                return Err(ModelError::Internal {
                    what: "rwkv7".into(),
                    problem: "a later layer ran without layer 0's values".into(),
                })
            }
        };
        let decay = ops::sigmoid(&heads(&t.w_lora.forward(&xw)?)?, None)?.astype(Dtype::Float32)?;
        let decay = ops::exp(&ops::scalar_multiply(-0.606531f32, &decay, None)?, None)?
            .astype(receptance.dtype())?;
        let kk = l2_norm(&(&key * &t.k_k)?)?;
        let scale = ops::scalar_add(
            1i32,
            &(&ops::subtract_scalar(&iclr, 1i32, None)? * &t.k_a)?,
            None,
        )?;
        let key = (&key * &scale)?;
        let a = ops::negative(&kk, None)?;
        let bb = (&kk * &iclr)?;
        // `_wkv7`.
        let mut state = match cache.and_then(|c| c.get(1)) {
            Some(st) => st.clone(),
            None => ops::zeros(&[b, h, hd, hd], receptance.dtype(), None)?,
        };
        let mut ys = Vec::with_capacity(l as usize);
        let mut states = Vec::new();
        let at = |t_: &Array, i: i32| -> Result<Array> {
            Ok(t_.slice_axis(1, i, i + 1)?.squeeze(&[1])?)
        };
        for i in 0..l {
            let (y, st) = wkv7_step(&[
                at(&receptance, i)?,
                at(&decay, i)?,
                at(&key, i)?,
                at(&value, i)?,
                at(&a, i)?,
                at(&bb, i)?,
                state,
            ])?;
            if keep {
                states.push(st.clone());
            }
            state = st;
            ys.push(y);
        }
        let refs: Vec<&Array> = ys.iter().collect();
        let out = ops::stack(&refs, 1, None)?.astype(receptance.dtype())?;
        let out = ops::reshape(&out, &[b, l, h, hd], None)?;
        // `LayerNormPerHead`.
        let out = (&(&t.g_norm_weight * &fast::layer_norm(&out, None, None, 64e-5, None)?)?
            + &t.g_norm_bias)?;
        let bonus = ops::sum(&(&(&receptance * &key)? * &t.r_k)?, &[-1], true, None)?;
        let out = ops::reshape(&(&out + &(&bonus * &value)?)?, &[b, l, d], None)?;
        Ok((t.o_proj.forward(&(&out * &gate)?)?, v_first, state, states))
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut caches = caches;
        let mut x = self.embeddings.forward(inputs)?;
        let mut v_first: Option<Array> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = arrays_cache(caches.as_deref_mut().map(|c| &mut c[i]), i)?;
            if let Some(n) = &layer.pre_norm {
                x = n.forward(&x)?;
            }
            let keep = cache.as_ref().is_some_and(|c| c.keeps_history());
            let normed = layer.attn_norm.forward(&x)?;
            let (hh, vf, state, states) = self.time_mix(
                &layer.attn,
                &normed,
                v_first.as_ref(),
                cache.as_deref(),
                keep,
            )?;
            v_first = Some(vf);
            let hh = (&x + &hh)?;
            // `Rwkv7ChannelMixing.__call__`.
            let f = layer.ffn_norm.forward(&hh)?;
            let f_prev = token_shift(&f, cache.as_deref().and_then(|c| c.get(2)))?;
            let xx = addcmul(&f, &(&f_prev - &f)?, &layer.ffn_x_k)?;
            let l = f.shape()[1];
            if let Some(c) = cache {
                if keep {
                    let steps = states
                        .into_iter()
                        .enumerate()
                        .map(|(t, st)| {
                            let t = t as i32;
                            Ok(vec![
                                Some(normed.slice_axis(1, t, t + 1)?),
                                Some(st),
                                Some(f.slice_axis(1, t, t + 1)?),
                            ])
                        })
                        .collect::<Result<Vec<_>>>()?;
                    c.checkpoint_steps(steps)?;
                }
                c.set(0, normed.slice_axis(1, l - 1, l)?)?;
                c.set(1, state)?;
                c.set(2, f.slice_axis(1, l - 1, l)?)?;
                c.advance(l as usize)?;
            }
            let ffn = layer
                .ffn_value
                .forward(&relu2(&layer.ffn_key.forward(&xx)?)?)?;
            x = (&hh + &ffn)?;
        }
        self.norm.forward(&x)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        crate::models::project(self.lm_head.as_ref(), &self.embeddings, h)
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    kit::layer_caches! {
        /// `make_cache`: an `ArraysCache(3)` per layer.
        fn make_cache(&self) {
            self.layers
                .iter()
                .map(|_| Box::new(ArraysCache::new(3)) as Box<dyn Cache>)
                .collect()
        }
    }
}
