//! mlx-lm 0.32.2 `models/phi3small.py`: pre-LayerNorm blocks (biases everywhere) with a fused
//! `query_key_value` laid out per KV group (`n_q_per_kv` queries, then the key, then the
//! value), muP scaling (attention scale `mup_attn_multiplier / head_dim` or `1 / sqrt(head_dim)`,
//! embeddings times `mup_embedding_multiplier`, logits over `mup_width_multiplier`), the
//! `gegelu` MLP (interleaved gelu/linear halves clipped at `gegelu_limit`, compiled shapeless
//! as there), tied embeddings, and `_dummy_tokenizer_ids` (columns 100256..100351) set to -inf.
//!
//! Every `dense_attention_every_n_layers`-th layer (from layer 0) runs mlx-lm's
//! `_block_sparse_attention`: plain ops over the whole key range, the block mask (local blocks
//! plus every `vert_stride`-th block per head) made dense, added as `0` / `-inf` after the
//! model's mask, which that function *adds* to the scores (a boolean causal mask adds 1 where
//! attention is allowed: mlx-lm's numerics, kept). The mask is computed here on the host; it
//! is integer logic, the same booleans as mlx-lm's `_block_sparse_mask`.
//!
//! mlx-lm writes the dummy columns whatever the vocabulary (and crashes below 100,352 rows);
//! this port refuses such a config instead. Inference only.

use mlx_cache::{AttentionMask, Cache, Kv};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::activations::{compiled, one};
use crate::layers::{scaled_dot_product_attention, Embedding, LayerNorm, Linear, Rope};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_attn_mult: f64 = 1.0;
    d_true: bool = true;
    d_emb_mult: f64 = 10.0;
    d_width_mult: f64 = 8.0;
    d_rope_base: f64 = 1_000_000.0;
    d_rope_scale: f64 = 1.0;
    d_block: i32 = 64;
    d_local: i32 = 16;
    d_vert: i32 = 8;
}

/// phi3small.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub dense_attention_every_n_layers: i32,
    pub ff_intermediate_size: i32,
    pub gegelu_limit: f64,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub layer_norm_epsilon: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "d_attn_mult")]
    pub mup_attn_multiplier: f64,
    #[serde(default = "d_true")]
    pub mup_use_scaling: bool,
    #[serde(default = "d_emb_mult")]
    pub mup_embedding_multiplier: f64,
    #[serde(default = "d_width_mult")]
    pub mup_width_multiplier: f64,
    #[serde(default = "d_rope_base")]
    pub rope_embedding_base: f64,
    #[serde(default = "d_rope_scale")]
    pub rope_position_scale: f64,
    #[serde(default = "d_block")]
    pub blocksparse_block_size: i32,
    #[serde(default = "d_local")]
    pub blocksparse_num_local_blocks: i32,
    #[serde(default = "d_vert")]
    pub blocksparse_vert_stride: i32,
}

/// `Model._dummy_tokenizer_ids`.
fn dummy_ids() -> impl Iterator<Item = i32> {
    [100256, 100258, 100259, 100260, 100264, 100265]
        .into_iter()
        .chain(100267..100352)
}

/// The block-sparse settings of one layer.
#[derive(Clone, Copy)]
struct Sparse {
    block: i32,
    local: i32,
    vert: i32,
}

struct Layer {
    input_layernorm: LayerNorm,
    query_key_value: Linear,
    dense: Linear,
    sparse: Option<Sparse>,
    post_attention_layernorm: LayerNorm,
    up_proj: Linear,
    down_proj: Linear,
}

pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    final_layernorm: LayerNorm,
    rope: Rope,
    scale: f32,
    head_dim: i32,
    /// `true` at the dummy ids (length `vocab_size`).
    dummy: Array,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`phi3small`): {m}"));
        kit::check_positive(
            "phi3small",
            &[
                ("hidden_size", args.hidden_size),
                (
                    "dense_attention_every_n_layers",
                    args.dense_attention_every_n_layers,
                ),
                ("ff_intermediate_size", args.ff_intermediate_size),
                ("num_hidden_layers", args.num_hidden_layers),
                ("num_attention_heads", args.num_attention_heads),
                ("num_key_value_heads", args.num_key_value_heads),
                ("vocab_size", args.vocab_size),
                ("blocksparse_vert_stride", args.blocksparse_vert_stride),
            ],
        )?;
        let (d, h, kv) = (
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
        );
        if d % h != 0 || (d / h) % 2 != 0 {
            return Err(bad(format!(
                "field `hidden_size` {d} must divide by `num_attention_heads` {h} into an even head size"
            )));
        }
        if h % kv != 0 {
            return Err(bad(format!(
                "field `num_attention_heads` {h} must divide by `num_key_value_heads` {kv}"
            )));
        }
        let last_dummy = dummy_ids().last().unwrap_or(0);
        if args.vocab_size <= last_dummy {
            return Err(bad(format!(
                "field `vocab_size` {} is below {}: mlx-lm masks the logits of ids up to {last_dummy}",
                args.vocab_size,
                last_dummy + 1
            )));
        }
        let sparse = Sparse {
            block: args.blocksparse_block_size,
            local: args.blocksparse_num_local_blocks,
            vert: args.blocksparse_vert_stride,
        };
        if ![32, 64].contains(&sparse.block) {
            return Err(bad(format!(
                "field `blocksparse_block_size` {}: unsupported block size (32 or 64)",
                sparse.block
            )));
        }
        for k in w.names() {
            if k.contains("self_attn.rotary_emb.inv_freq") {
                w.discard(&k);
            }
        }
        let head_dim = d / h;
        let eps = args.layer_norm_epsilon as f32;
        let mut layers = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let ln = |w: &mut Weights, s: &str| LayerNorm::load(w, &p(s), d, eps, true, true);
            let f = args.ff_intermediate_size;
            layers.push(Layer {
                input_layernorm: ln(w, "input_layernorm")?,
                query_key_value: Linear::load(
                    w,
                    &p("self_attn.query_key_value"),
                    d,
                    (h + 2 * kv) * head_dim,
                    true,
                )?,
                dense: Linear::load(w, &p("self_attn.dense"), d, d, true)?,
                sparse: (i % args.dense_attention_every_n_layers == 0).then_some(sparse),
                post_attention_layernorm: ln(w, "post_attention_layernorm")?,
                up_proj: Linear::load(w, &p("mlp.up_proj"), d, 2 * f, true)?,
                down_proj: Linear::load(w, &p("mlp.down_proj"), f, d, true)?,
            });
        }
        let scale = if args.mup_use_scaling {
            1.0 / (f64::from(head_dim) / args.mup_attn_multiplier)
        } else {
            1.0 / f64::from(head_dim).sqrt()
        } as f32;
        let mut dummy = vec![false; args.vocab_size as usize];
        for id in dummy_ids() {
            dummy[id as usize] = true;
        }
        Ok(Model {
            embed_tokens: Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?,
            layers,
            final_layernorm: LayerNorm::load(w, "model.final_layernorm", d, eps, true, true)?,
            rope: Rope::Base {
                dims: head_dim,
                traditional: false,
                base: args.rope_embedding_base as f32,
                scale: args.rope_position_scale as f32,
            },
            scale,
            head_dim,
            dummy: Array::from_slice(&dummy, &[args.vocab_size])?,
            args,
        })
    }

    fn attention(
        &self,
        l: &Layer,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, n) = (s[0], s[1]);
        let (h, kv) = (self.args.num_attention_heads, self.args.num_key_value_heads);
        let per = h / kv;
        let qkv = l.query_key_value.forward(x)?;
        let qkv = ops::reshape(&qkv, &[b, n, -1, per + 2, self.head_dim], None)?;
        let sh = qkv.shape();
        let cut = |start: i32, stop: i32| -> Result<Array> {
            let mut lo = vec![0; sh.len()];
            let mut hi = sh.to_vec();
            lo[3] = start;
            hi[3] = stop;
            Ok(ops::slice(&qkv, &lo, &hi, &vec![1; sh.len()], None)?)
        };
        let queries = ops::flatten(&cut(0, per)?, -3, -2, None)?;
        let keys = ops::squeeze(&cut(per, per + 1)?, &[3], None)?;
        let values = ops::squeeze(&cut(per + 1, per + 2)?, &[3], None)?;
        let t = |a: &Array| ops::transpose(a, &[0, 2, 1, 3], None);
        let (queries, keys, values) = (t(&queries)?, t(&keys)?, t(&values)?);
        let offset = cache.as_ref().map_or(0, |c| c.offset());
        let queries = self.rope.forward(&queries, offset)?;
        let keys = self.rope.forward(&keys, offset)?;
        let kv_all = kit::cached_kv(cache, keys, values)?;
        let out = match l.sparse {
            Some(sp) => self.block_sparse_attention(&queries, &kv_all, sp, mask)?,
            None => scaled_dot_product_attention(&queries, &kv_all, self.scale, mask, None)?,
        };
        l.dense.forward(&kit::merge_heads(&out)?)
    }

    /// `_block_sparse_mask(q_len, kv_len)`'s dense mask, `(n_kv, n_q_per_kv, q_len, kv_len)`.
    fn block_sparse_mask(&self, sp: Sparse, q_len: i32, kv_len: i32) -> Result<Array> {
        let (h, kv) = (self.args.num_attention_heads, self.args.num_key_value_heads);
        let bs = sp.block;
        let kv_blocks = (kv_len + bs - 1) / bs;
        let q_blocks = (q_len + bs - 1) / bs;
        let rows_total = q_blocks * bs;
        let mut m = Vec::with_capacity((h * q_len * kv_len) as usize);
        for head in 0..h {
            for r in 0..q_len {
                let q_pos = kv_blocks - q_blocks + (rows_total - q_len + r) / bs;
                for c in 0..kv_len {
                    let k_pos = c / bs;
                    let vert = (k_pos + head + 1) % sp.vert == 0;
                    m.push(q_pos >= k_pos && (q_pos - k_pos < sp.local || vert));
                }
            }
        }
        Ok(Array::from_slice(&m, &[kv, h / kv, q_len, kv_len])?)
    }

    /// `_block_sparse_attention(queries, keys, values, scale, mask)`.
    fn block_sparse_attention(
        &self,
        queries: &Array,
        kv_all: &Kv,
        sp: Sparse,
        mask: &AttentionMask,
    ) -> Result<Array> {
        let Kv::Dense { keys, values } = kv_all else {
            return Err(ModelError::Cache { what: "phi3small".into(), problem: "block-sparse attention needs a dense KV cache (mlx-lm's runs on plain keys and values)".into() });
        };
        let (h, kv) = (self.args.num_attention_heads, self.args.num_key_value_heads);
        let queries = ops::scalar_multiply(self.scale, queries, None)?;
        let qs = queries.shape();
        let (b, l) = (qs[0], qs[2]);
        let queries = ops::reshape(&queries, &[b, kv, h / kv, l, -1], None)?;
        let keys = ops::expand_dims(keys, &[2], None)?;
        let values = ops::expand_dims(values, &[2], None)?;
        let kv_len = keys.shape()[3];
        let dense_mask = self.block_sparse_mask(sp, l, kv_len)?;
        let mut scores = ops::matmul(&queries, &ops::swapaxes(&keys, -1, -2, None)?, None)?;
        match mask {
            AttentionMask::None => {}
            AttentionMask::Array(m) => scores = (&scores + m)?,
            AttentionMask::Causal => {
                return Err(ModelError::Input {
                    what: "phi3small".into(),
                    problem: "the block-sparse layers take an array mask".into(),
                })
            }
        }
        let dt = scores.dtype();
        let zero = Scalar::Int(0).to_array_like(dt)?;
        let ninf = Scalar::Float(f32::NEG_INFINITY).to_array_like(dt)?;
        scores = (&scores + &ops::where_(&dense_mask, &zero, &ninf, None)?)?;
        let scores = ops::softmax(&scores, &[-1], true, None)?;
        let out = ops::matmul(&scores, &values, None)?;
        Ok(ops::reshape(&out, &[b, h, l, -1], None)?)
    }

    /// `MLP.__call__`: `up_proj`, `gegelu` on its interleaved halves, `down_proj`.
    fn mlp(&self, l: &Layer, x: &Array) -> Result<Array> {
        let x = l.up_proj.forward(x)?;
        let s = x.shape();
        let last = s.len() - 1;
        let half = |start: i32| -> Result<Array> {
            let mut lo = vec![0; s.len()];
            lo[last] = start;
            let mut st = vec![1; s.len()];
            st[last] = 2;
            Ok(ops::slice(&x, &lo, &s, &st, None)?)
        };
        let (a_gelu, a_linear) = (half(0)?, half(1)?);
        let limit = self.args.gegelu_limit as f32;
        let dt = x.dtype();
        let hi = Scalar::Float(limit).to_array_like(dt)?;
        let lo = Scalar::Float(-limit).to_array_like(dt)?;
        l.down_proj.forward(&gegelu(&a_gelu, &a_linear, &lo, &hi)?)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut caches = caches;
        let mut x = self.embed_tokens.forward(inputs)?;
        let em = self.args.mup_embedding_multiplier;
        if em != 0.0 {
            x = ops::scalar_multiply(em as f32, &x, None)?;
        }
        let mask = kit::cache_mask(caches.as_deref(), 0, n, None, true)?;
        for (i, l) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let r = self.attention(l, &l.input_layernorm.forward(&x)?, &mask, cache)?;
            let hh = (&x + &r)?;
            let r = self.mlp(l, &l.post_attention_layernorm.forward(&hh)?)?;
            x = (&hh + &r)?;
        }
        self.final_layernorm.forward(&x)
    }

    /// The tied head, over `mup_width_multiplier`, the dummy ids at -inf.
    fn head(&self, h: &Array) -> Result<Array> {
        let mut out = self.embed_tokens.as_linear(h)?;
        let wm = self.args.mup_width_multiplier;
        if wm != 0.0 {
            out = ops::divide_scalar(&out, wm as f32, None)?;
        }
        let ninf = Scalar::Float(f32::NEG_INFINITY).to_array_like(out.dtype())?;
        Ok(ops::where_(&self.dummy, &ninf, &out, None)?)
    }
}

/// `gegelu_impl(a_gelu, a_linear, limit)`, compiled shapeless as mlx-lm compiles it (the limit
/// and its negation come in as scalars of the activations' dtype, the values mlx-lm's `clip`
/// makes of the Python float).
fn gegelu(a_gelu: &Array, a_linear: &Array, lo: &Array, hi: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let (g, lin, lo, hi) = (&xs[0], &xs[1], &xs[2], &xs[3]);
        let g = ops::where_(
            &ops::isinf(g, None)?,
            g,
            &ops::clip(g, None, Some(hi), None)?,
            None,
        )?;
        let clipped = ops::clip(lin, Some(lo), Some(hi), None)?;
        let lin = ops::where_(&ops::isinf(lin, None)?, lin, &clipped, None)?;
        let out_gelu = (&g * &ops::sigmoid(&ops::scalar_multiply(1.702f32, &g, None)?, None)?)?;
        Ok(vec![(&out_gelu * &ops::add_scalar(&lin, 1.0f32, None)?)?])
    })?;
    Ok(one(
        f.call(&[a_gelu.clone(), a_linear.clone(), lo.clone(), hi.clone()])?,
        "gegelu",
    )?)
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.layers.len())
    }

    fn defines_make_cache(&self) -> bool {
        false
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }
}
