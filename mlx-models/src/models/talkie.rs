//! mlx-lm 0.32.2 `models/talkie.py`: weightless RMS norms everywhere (embeddings, blocks,
//! q/k after rope, the output), a learned per-head gain on the queries, learned scalar gains
//! on the attention and MLP branches, a skip from the normed embeddings into every block, a
//! rope with negated frequencies, and a bare `lm_head` matrix times a learned gain.

use mlx_cache::Cache;
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{scaled_dot_product_attention, silu, Embedding, Linear, Rope};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_hidden: i32 = 5120;
    d_layers: i32 = 40;
    d_heads: i32 = 40;
    d_head_dim: i32 = 128;
    d_inter: i32 = 13696;
    d_vocab: i32 = 65540;
    d_theta: f64 = 1_000_000.0;
    d_eps: f64 = 1.192_092_895_507_812_5e-7;
}

/// talkie.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_head_dim")]
    pub head_dim: i32,
    #[serde(default = "d_inter")]
    pub intermediate_size: i32,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
}

/// `x * gain.astype(x.dtype)` (`ActGain`, `WeightGain`).
fn gain(x: &Array, g: &Array) -> Result<Array> {
    Ok((x * &g.astype(x.dtype())?)?)
}

fn rms(x: &Array, eps: f32) -> Result<Array> {
    Ok(fast::rms_norm(x, None, eps, None)?)
}

struct Block {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    head_g: Array,
    gate: Linear,
    linear: Linear,
    resid: Linear,
    attn_gain: Array,
    mlp_gain: Array,
    embed_skip: Array,
}

pub struct Model {
    args: ModelArgs,
    eps: f32,
    embed: Embedding,
    blocks: Vec<Block>,
    rope: Rope,
    lm_head: Array,
    lm_head_gain: Array,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let (d, h, hd) = (args.hidden_size, args.num_attention_heads, args.head_dim);
        kit::check_positive(
            "talkie",
            &[
                ("hidden_size", d),
                ("num_hidden_layers", args.num_hidden_layers),
                ("num_attention_heads", h),
                ("head_dim", hd),
                ("intermediate_size", args.intermediate_size),
                ("vocab_size", args.vocab_size),
            ],
        )?;
        let proj = h.checked_mul(hd).ok_or_else(|| {
            ModelError::Config("config.json (`talkie`): heads x head_dim overflows".into())
        })?;
        // sanitize: precomputed rotary buffers go.
        for k in w.names() {
            if k.contains("rotary") || k.ends_with("cos") || k.ends_with("sin") {
                w.discard(&k);
            }
        }
        let embed = Embedding::load(w, "model.embed", args.vocab_size, d)?;
        let inter = args.intermediate_size;
        let mut blocks = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = |s: &str| format!("model.blocks.{i}.{s}");
            blocks.push(Block {
                q: Linear::load(w, &p("attn.attn_query"), d, proj, false)?,
                k: Linear::load(w, &p("attn.attn_key"), d, proj, false)?,
                v: Linear::load(w, &p("attn.attn_value"), d, proj, false)?,
                o: Linear::load(w, &p("attn.attn_resid"), proj, d, false)?,
                head_g: w.take(&p("attn.head_gain.head_g"), &[h])?,
                gate: Linear::load(w, &p("mlp.mlp_gate"), d, inter, false)?,
                linear: Linear::load(w, &p("mlp.mlp_linear"), d, inter, false)?,
                resid: Linear::load(w, &p("mlp.mlp_resid"), inter, d, false)?,
                attn_gain: w.take(&p("attn_gain.a_g"), &[1])?,
                mlp_gain: w.take(&p("mlp_gain.a_g"), &[1])?,
                embed_skip: w.take(&p("embed_skip.a_g"), &[1])?,
            });
        }
        let lm_head = w.take("lm_head", &[args.vocab_size, d])?;
        let lm_head_gain = w.take("lm_head_gain.w_g", &[1])?;
        Ok(Model {
            eps: args.rms_norm_eps as f32,
            rope: Rope::neg_pow(hd, args.rope_theta)?,
            args,
            embed,
            blocks,
            lm_head,
            lm_head_gain,
        })
    }

    fn attention(
        &self,
        b: &Block,
        x: &Array,
        mask: &mlx_cache::AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let (h, hd) = (self.args.num_attention_heads, self.args.head_dim);
        let queries = kit::split_heads(&b.q.forward(x)?, h)?;
        let keys = kit::split_heads(&b.k.forward(x)?, h)?;
        let values = kit::split_heads(&b.v.forward(x)?, h)?;
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        let queries = rms(&self.rope.forward(&queries, offset)?, self.eps)?;
        let keys = rms(&self.rope.forward(&keys, offset)?, self.eps)?;
        let g = ops::reshape(&b.head_g.astype(queries.dtype())?, &[1, -1, 1, 1], None)?;
        let queries = (&queries * &g)?;
        let kv = kit::cached_kv(cache, keys, values)?;
        let scale = (f64::from(hd)).powf(-0.5) as f32;
        let out = scaled_dot_product_attention(&queries, &kv, scale, mask, None)?;
        b.o.forward(&kit::merge_heads(&out)?)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        if inputs.ndim() != 2 {
            return Err(ModelError::Input {
                what: "inputs".into(),
                problem: format!(
                    "must be token ids of shape (batch, seq), got shape {:?}",
                    inputs.shape()
                ),
            });
        }
        let n = inputs.shape()[1] as usize;
        let mut h = rms(&self.embed.forward(inputs)?, self.eps)?;
        let e_x = h.clone();
        let mut caches = caches;
        kit::check_caches(caches.as_deref(), self.blocks.len(), "layers")?;
        let mask = kit::cache_mask(caches.as_deref(), 0, n, None, false)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let a = self.attention(b, &rms(&h, self.eps)?, &mask, cache)?;
            h = (&h + &gain(&a, &b.attn_gain)?)?;
            let x = rms(&h, self.eps)?;
            let m = b
                .resid
                .forward(&(&silu(&b.gate.forward(&x)?)? * &b.linear.forward(&x)?)?)?;
            h = (&h + &gain(&m, &b.mlp_gain)?)?;
            h = (&h + &gain(&e_x, &b.embed_skip)?)?;
        }
        rms(&h, self.eps)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        let logits = ops::matmul(h, &ops::transpose_all(&self.lm_head, None)?, None)?;
        gain(&logits, &self.lm_head_gain)
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.blocks.len())
    }

    fn defines_make_cache(&self) -> bool {
        false
    }

    fn num_layers(&self) -> usize {
        self.blocks.len()
    }
}
