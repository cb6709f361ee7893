//! mlx-lm 0.32.2 `models/afm7.py`: `num_layers - num_kv_reuse_layers` Llama-style layers (a
//! fused `qkv_proj`, traditional rope then per-head RMS norms on q and k, keys and values
//! passed through `fake_8bit_quant` with learned scales) and then `num_kv_reuse_layers` layers
//! that have only a query projection and attend over the last regular layer's keys and values
//! (roped at `S - L`). Only the regular layers have caches; the head is the tied embedding.
//! Inference only (no adapters or full fine-tuning).

use mlx_cache::{AttentionMask, Cache, Kv};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::activations::{compiled, one};
use crate::layers::{
    scaled_dot_product_attention, Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope,
};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_scale_factor: f64 = 3.25;
    d_theta: f64 = 50000.0;
    d_eps: f64 = 1e-5;
}

/// afm7.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_dim: i32,
    pub num_layers: i32,
    pub num_kv_reuse_layers: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    #[serde(default = "d_scale_factor")]
    pub hidden_dim_scale_factor: f64,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
}

/// `fake_8bit_quant`: `clip(round(x / scale), -128, 127) * scale` in float32, cast back.
fn fake_8bit_quant(x: &Array, scale: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let dt = xs[0].dtype();
        let x = xs[0].astype(Dtype::Float32)?;
        let x = ops::round(&(&x / &xs[1])?, 0, None)?;
        let lo = Scalar::Int(-128).to_array_like(x.dtype())?;
        let hi = Scalar::Int(127).to_array_like(x.dtype())?;
        let x = ops::clip(&x, Some(&lo), Some(&hi), None)?;
        Ok(vec![(&x * &xs[1])?.astype(dt)?])
    })?;
    Ok(one(
        f.call(&[x.clone(), scale.clone()])?,
        "fake_8bit_quant",
    )?)
}

struct Layer {
    /// Regular layers: the fused `qkv_proj`; reuse layers: `q_proj`.
    q_proj: Linear,
    out_proj: Linear,
    q_norm: RmsNorm,
    /// Regular layers only: `k_norm`, `quant_key_scale`, `quant_value_scale`.
    kv: Option<(RmsNorm, Array, Array)>,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

pub struct Model {
    args: ModelArgs,
    embedding: Embedding,
    layers: Vec<Layer>,
    kv_reuse_layers: Vec<Layer>,
    output_norm: RmsNorm,
    rope: Rope,
    head_dim: i32,
    scale: f32,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`afm7`): {m}"));
        kit::check_positive(
            "afm7",
            &[
                ("vocab_size", a.vocab_size),
                ("hidden_dim", a.hidden_dim),
                ("num_heads", a.num_heads),
                ("num_kv_heads", a.num_kv_heads),
            ],
        )?;
        let (d, h, kvh) = (a.hidden_dim, a.num_heads, a.num_kv_heads);
        let regular = a.num_layers - a.num_kv_reuse_layers;
        if regular < 1 || a.num_kv_reuse_layers < 0 {
            return Err(bad(format!(
                "num_layers {} must exceed num_kv_reuse_layers {} (the reused keys and values \
                 come from the last regular layer)",
                a.num_layers, a.num_kv_reuse_layers
            )));
        }
        if d % h != 0 || h % kvh != 0 {
            return Err(bad(format!(
                "hidden_dim {d} must divide by num_heads {h}, a multiple of num_kv_heads {kvh}"
            )));
        }
        let hd = d / h;
        let hidden = (f64::from(d) * a.hidden_dim_scale_factor) as i32;
        let eps = a.rms_norm_eps as f32;
        let load_layer = |w: &mut Weights, p: &str, reuse: bool| -> Result<Layer> {
            let p = |n: &str| format!("{p}.{n}");
            Ok(Layer {
                q_proj: if reuse {
                    Linear::load(w, &p("self_attn.q_proj"), d, d, false)?
                } else {
                    Linear::load(w, &p("self_attn.qkv_proj"), d, (h + 2 * kvh) * hd, false)?
                },
                out_proj: Linear::load(w, &p("self_attn.out_proj"), d, d, false)?,
                q_norm: RmsNorm::load(w, &p("self_attn.q_norm"), hd, 1e-5)?,
                kv: if reuse {
                    None
                } else {
                    Some((
                        RmsNorm::load(w, &p("self_attn.k_norm"), hd, 1e-5)?,
                        w.take(&p("self_attn.quant_key_scale"), &[])?,
                        w.take(&p("self_attn.quant_value_scale"), &[])?,
                    ))
                },
                mlp: Mlp::load(
                    w,
                    &p("mlp"),
                    &MlpNames::LLAMA,
                    d,
                    hidden,
                    false,
                    false,
                    MlpKind::SwiGlu,
                )?,
                input_layernorm: RmsNorm::load(w, &p("input_layernorm"), d, eps)?,
                post_attention_layernorm: RmsNorm::load(w, &p("post_attention_layernorm"), d, eps)?,
            })
        };
        let layers = (0..regular)
            .map(|i| load_layer(w, &format!("model.layers.{i}"), false))
            .collect::<Result<Vec<_>>>()?;
        let kv_reuse_layers = (0..a.num_kv_reuse_layers)
            .map(|i| load_layer(w, &format!("model.kv_reuse_layers.{i}"), true))
            .collect::<Result<Vec<_>>>()?;
        Ok(Model {
            embedding: Embedding::load(w, "model.embedding", a.vocab_size, d)?,
            output_norm: RmsNorm::load(w, "model.output_norm", d, eps)?,
            rope: Rope::initialize(hd, a.rope_theta, true, None, None)?,
            head_dim: hd,
            scale: f64::from(hd).powf(-0.5) as f32,
            layers,
            kv_reuse_layers,
            args: a,
        })
    }

    /// The block around an attention output `(B, H, L, D)`: `out_proj`, residual, MLP.
    fn finish(&self, l: &Layer, h: &Array, out: &Array) -> Result<Array> {
        let h = (h + &l.out_proj.forward(&kit::merge_heads(out)?)?)?;
        let r = l.mlp.forward(&l.post_attention_layernorm.forward(&h)?)?;
        Ok((&h + &r)?)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(
            inputs,
            caches.as_deref(),
            self.layers.len(),
            "regular layers",
        )?;
        let mut caches = caches;
        let mask: AttentionMask = kit::cache_mask(caches.as_deref(), 0, n, None, false)?;
        let (h_n, kv_n) = (self.args.num_heads, self.args.num_kv_heads);
        let hd = self.head_dim;
        let mut h = self.embedding.forward(inputs)?;
        let mut last: Option<Kv> = None;
        for (i, l) in self.layers.iter().enumerate() {
            let x = l.input_layernorm.forward(&h)?;
            let qkv = ops::split_at(
                &l.q_proj.forward(&x)?,
                &[h_n * hd, (h_n + kv_n) * hd],
                -1,
                None,
            )?;
            let (k_norm, key_scale, value_scale) =
                l.kv.as_ref().ok_or_else(|| ModelError::Internal {
                    what: "afm7".into(),
                    problem: "a regular layer without k_norm".into(),
                })?;
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let offset = cache.as_ref().map_or(0, |c| c.offset());
            let roped = |y: &Array, n: i32| self.rope.forward(&kit::split_heads(y, n)?, offset);
            let q = l.q_norm.forward(&roped(&qkv[0], h_n)?)?;
            let k = fake_8bit_quant(&k_norm.forward(&roped(&qkv[1], kv_n)?)?, key_scale)?;
            let v = fake_8bit_quant(&kit::split_heads(&qkv[2], kv_n)?, value_scale)?;
            let kv = kit::cached_kv(cache, k, v)?;
            let out = scaled_dot_product_attention(&q, &kv, self.scale, &mask, None)?;
            last = Some(kv);
            h = self.finish(l, &h, &out)?;
        }
        // `cache[-1].keys_and_values()`: what the last regular layer attended over.
        let (keys, values) = match last {
            Some(Kv::Dense { keys, values }) => (keys, values),
            Some(Kv::Quantized { .. }) => {
                return Err(ModelError::Cache { what: "afm7".into(), problem: "the KV-reuse layers need dense keys and values (a quantized KV cache is not supported)".into() })
            }
            None => return Err(ModelError::Internal { what: "afm7".into(), problem: "no regular layer".into() }),
        };
        let total = keys.shape()[2] as usize;
        let kv = Kv::Dense { keys, values };
        for l in &self.kv_reuse_layers {
            let x = l.input_layernorm.forward(&h)?;
            let q = kit::split_heads(&l.q_proj.forward(&x)?, h_n)?;
            let q = l
                .q_norm
                .forward(&self.rope.forward(&q, total.saturating_sub(n))?)?;
            let out = scaled_dot_product_attention(&q, &kv, self.scale, &mask, None)?;
            h = self.finish(l, &h, &out)?;
        }
        self.output_norm.forward(&h)
    }

    /// The tied embedding as the output projection.
    fn head(&self, h: &Array) -> Result<Array> {
        self.embedding.as_linear(h)
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    kit::layer_caches! {
        /// `make_cache`: a `KVCache` per regular layer (the reuse layers have none).
        fn make_cache(&self) {
            kit::kv_caches(self.layers.len())
        }
    }
}
