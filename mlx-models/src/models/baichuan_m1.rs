//! mlx-lm 0.32.2 `models/baichuan_m1.py`: a llama-like decoder whose keys and values pass
//! through a two-tap causal convolution over time (per KV head) before rope, with sliding-window
//! layers (`sliding_window_layers`, optionally their own head counts) and a `lm_head` whose
//! rows `sanitize` normalises. Each layer's cache is a [`CacheList`] of an [`ArraysCache`]
//! (the last pre-convolution key and value) and a [`KVCache`] ([`RotatingKVCache`] on the
//! sliding layers).

use mlx_cache::{ArraysCache, AttentionMask, Cache, CacheList, KVCache, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{scaled_dot_product_attention, swiglu, Embedding, Linear, RmsNorm, Rope};
use crate::models::checkpoint::layer_loop;
use crate::models::mamba::positive;
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    default_model_type: String = "baichuan_m1".into();
}

/// baichuan_m1.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    rope_theta: f64,
    sliding_window: i32,
    sliding_window_layers: Vec<i32>,
    conv_window: i32,
    rms_norm_eps: f64,
    #[serde(default = "default_model_type")]
    model_type: String,
    #[serde(default)]
    num_swa_attention_heads: Option<i32>,
    #[serde(default)]
    num_swa_key_value_heads: Option<i32>,
    #[serde(default)]
    tie_word_embeddings: bool,
}

fn bad(m: String) -> ModelError {
    ModelError::Config(format!("baichuan_m1: {m}"))
}

impl ModelArgs {
    fn check(&self) -> Result<()> {
        positive(
            "baichuan_m1",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
                ("sliding_window", self.sliding_window),
            ],
        )?;
        if self.conv_window != 2 {
            return Err(bad(format!(
                "`conv_window` must be 2 (mlx-lm asserts it), got {}",
                self.conv_window
            )));
        }
        for i in 0..self.num_hidden_layers {
            let (h, kv) = self.heads(i);
            if h <= 0 || kv <= 0 || self.hidden_size % h != 0 || h % kv != 0 {
                return Err(bad(format!(
                    "layer {i}: hidden_size {} / {h} heads / {kv} KV heads do not divide",
                    self.hidden_size
                )));
            }
        }
        Ok(())
    }

    fn is_swa(&self, i: i32) -> bool {
        self.sliding_window_layers.contains(&i)
    }

    /// The layer's (query heads, KV heads).
    fn heads(&self, i: i32) -> (i32, i32) {
        let swa = self.is_swa(i);
        let pick = |o: Option<i32>, d: i32| match o {
            Some(v) if swa && v != 0 => v,
            _ => d,
        };
        (
            pick(self.num_swa_attention_heads, self.num_attention_heads),
            pick(self.num_swa_key_value_heads, self.num_key_value_heads),
        )
    }
}

#[derive(Clone)]
struct Attention {
    w_pack: Linear,
    o_proj: Linear,
    rope: Rope,
    /// `conv_k` / `conv_v` as `(1, H, 2, 1, 1)`, then their two taps `(1, H, 1, 1)`.
    conv_k: [Array; 2],
    conv_v: [Array; 2],
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
}

/// `_custom_convolution`: `u` `(B, H, L, D)`, `state` the previous step `(B, H, 1, D)`.
fn custom_convolution(u: &Array, w: &[Array; 2], state: Option<&Array>) -> Result<Array> {
    let sh = u.shape();
    let state = match state {
        Some(s) => s.clone(),
        None => ops::zeros(&[sh[0], sh[1], 1, sh[3]], u.dtype(), None)?,
    };
    let l = sh[2];
    let prev = if l > 1 {
        ops::concatenate(&[&state, &u.slice_axis(2, 0, l - 1)?], 2, None)?
    } else {
        state
    };
    Ok((&(&prev * &w[0])? + &(u * &w[1])?)?)
}

impl Attention {
    fn load(a: &ModelArgs, i: i32, w: &mut Weights, p: &str) -> Result<Attention> {
        let (h, kv) = a.heads(i);
        let d = a.hidden_size;
        let hd = d / h;
        let taps = |w: &mut Weights, n: &str| -> Result<[Array; 2]> {
            let c = w.take(&format!("{p}.{n}"), &[1, 1, kv, 1, 2])?;
            let c = c.reshape(&[1, kv, 2, 1, 1])?;
            Ok([
                c.slice_axis(2, 0, 1)?.squeeze(&[2])?,
                c.slice_axis(2, 1, 2)?.squeeze(&[2])?,
            ])
        };
        Ok(Attention {
            w_pack: Linear::load(w, &format!("{p}.W_pack"), d, d + 2 * kv * hd, false)?,
            o_proj: Linear::load(w, &format!("{p}.o_proj"), h * hd, d, false)?,
            rope: Rope::initialize(hd, a.rope_theta, false, None, None)?,
            conv_k: taps(w, "conv_k")?,
            conv_v: taps(w, "conv_v")?,
            n_heads: h,
            n_kv_heads: kv,
            head_dim: hd,
            scale: f64::from(hd).powf(-0.5) as f32,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        conv: Option<&mut ArraysCache>,
        kv_cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let sh = x.shape();
        let (b, l, d) = (sh[0], sh[1], sh[2]);
        let proj = self.w_pack.forward(x)?;
        let parts = ops::split_at(&proj, &[d, d + self.n_kv_heads * self.head_dim], -1, None)?;
        let heads = |y: &Array, n: i32| {
            y.reshape(&[b, l, n, self.head_dim])?
                .transpose(&[0, 2, 1, 3])
        };
        let q = heads(&parts[0], self.n_heads)?;
        let k_init = heads(&parts[1], self.n_kv_heads)?;
        let v_init = heads(&parts[2], self.n_kv_heads)?;
        let offset = kv_cache.as_ref().map_or(0, |c| c.offset());
        let (last_k, last_v) = match &conv {
            Some(c) => (c.get(0).cloned(), c.get(1).cloned()),
            None => (None, None),
        };
        let k = custom_convolution(&k_init, &self.conv_k, last_k.as_ref())?;
        let v = custom_convolution(&v_init, &self.conv_v, last_v.as_ref())?;
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        let kv = match kv_cache {
            Some(c) => {
                let kv = c.update_and_fetch(&k, &v)?;
                if let Some(conv) = conv {
                    let at = |a: &Array, s: i32| a.slice_axis(2, s - 1, s);
                    if conv.keeps_history() {
                        let steps = (1..=l)
                            .map(|s| Ok(vec![Some(at(&k_init, s)?), Some(at(&v_init, s)?)]))
                            .collect::<Result<Vec<_>>>()?;
                        conv.checkpoint_steps(steps)?;
                    }
                    if l > 0 {
                        conv.set(0, at(&k_init, l)?)?;
                        conv.set(1, at(&v_init, l)?)?;
                    }
                    conv.advance(l as usize)?;
                }
                kv
            }
            None => mlx_cache::Kv::Dense { keys: k, values: v },
        };
        let out = scaled_dot_product_attention(&q, &kv, self.scale, mask, None)?;
        let out = out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out)
    }
}

#[derive(Clone)]
struct Layer {
    self_attn: Attention,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    swa: bool,
}

/// The Baichuan-M1 model.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    sliding_window: usize,
    first_swa_idx: Option<usize>,
    first_global_idx: Option<usize>,
}

/// `sanitize`: a dense `lm_head`'s rows scaled to unit L2 norm (in float32, `+ 1e-7`).
fn sanitize(w: &mut Weights) -> Result<()> {
    if w.contains("lm_head.scales") {
        return Ok(());
    }
    if let Some(head) = w.remove("lm_head.weight") {
        let dtype = head.dtype();
        let x = head.astype(Dtype::Float32)?;
        let norm = ops::sqrt(&ops::square(&x, None)?.sum(&[-1], true)?, None)?;
        let x = (&x / &(&norm + 1e-7f32)?)?.astype(dtype)?;
        w.insert("lm_head.weight".into(), x);
    }
    Ok(())
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = config.args()?;
        a.check()?;
        sanitize(w)?;
        let d = a.hidden_size;
        let eps = a.rms_norm_eps as f32;
        let embed_tokens = Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?;
        let mut layers = Vec::with_capacity(a.num_hidden_layers as usize);
        for i in 0..a.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let m = |n: &str| format!("{p}.mlp.{n}");
            let h = a.intermediate_size;
            layers.push(Layer {
                self_attn: Attention::load(&a, i, w, &format!("{p}.self_attn"))?,
                gate_proj: Linear::load(w, &m("gate_proj"), d, h, false)?,
                up_proj: Linear::load(w, &m("up_proj"), d, h, false)?,
                down_proj: Linear::load(w, &m("down_proj"), h, d, false)?,
                input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    d,
                    eps,
                )?,
                swa: a.is_swa(i),
            });
        }
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = crate::models::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        let first_swa_idx = a
            .sliding_window_layers
            .first()
            .and_then(|i| usize::try_from(*i).ok())
            .filter(|i| *i < layers.len());
        let first_global_idx = layers.iter().position(|l| !l.swa);
        Ok(Model {
            model_type: a.model_type,
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            norm,
            lm_head,
            sliding_window: a.sliding_window as usize,
            first_swa_idx,
            first_global_idx,
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (h, n) = kit::embed_inputs(inputs, &self.embed_tokens)?;
        let mut caches = caches;
        let window = Some(self.sliding_window);
        let (global_mask, swa_mask) = match caches.as_deref_mut() {
            Some(c) => {
                kit::check_caches(Some(&*c), self.layers.len(), "layers")?;
                let mut mask = |idx: Option<usize>, win: Option<usize>| -> Result<AttentionMask> {
                    match idx {
                        Some(i) => match kit::split_recurrent_cache(c.get_mut(i), i)? {
                            (_, Some(kv)) => Ok(kv.make_mask(n, win, false)?),
                            _ => Ok(mlx_cache::mask::fallback_mask(n, win, false)?),
                        },
                        None => Ok(mlx_cache::mask::fallback_mask(n, win, false)?),
                    }
                };
                (
                    mask(self.first_global_idx, None)?,
                    mask(self.first_swa_idx, window)?,
                )
            }
            None => (
                mlx_cache::mask::fallback_mask(n, None, false)?,
                mlx_cache::mask::fallback_mask(n, window, false)?,
            ),
        };
        let h = layer_loop(&self.layers, h, caches, |i, layer, h, cache| {
            let (conv, kv) = kit::split_recurrent_cache(cache, i)?;
            let mask = if layer.swa { &swa_mask } else { &global_mask };
            let r = layer
                .self_attn
                .forward(&layer.input_layernorm.forward(h)?, mask, conv, kv)?;
            let h = (h + &r)?;
            let y = layer.post_attention_layernorm.forward(&h)?;
            let r = layer.down_proj.forward(&swiglu(
                &layer.gate_proj.forward(&y)?,
                &layer.up_proj.forward(&y)?,
            )?)?;
            Ok((&h + &r)?)
        })?;
        self.norm.forward(&h)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!(tied lm_head, embed_tokens);

    kit::layer_caches! {
        fn make_cache(&self) {
            self.layers
                .iter()
                .map(|l| -> Box<dyn Cache> {
                    let kv: Box<dyn Cache> = if l.swa {
                        match RotatingKVCache::new(self.sliding_window, 0) {
                            Ok(c) => Box::new(c),
                            Err(_) => Box::new(KVCache::new()),
                        }
                    } else {
                        Box::new(KVCache::new())
                    };
                    Box::new(CacheList::new(vec![Box::new(ArraysCache::new(2)), kv]))
                })
                .collect()
        }
    }

    kit::own_type_and_vocab!();
}
