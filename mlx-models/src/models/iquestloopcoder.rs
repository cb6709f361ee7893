//! mlx-lm 0.32.2 `models/iquestloopcoder.py`: a Llama decoder run twice over the same layers
//! (`loop_num` 2). The first loop is plain causal attention over a `KVCache` per layer; the
//! second attends each query both to the first loop's keys and values (causal, "global") and
//! to its own within a sliding window (a `RotatingKVCache` of `loop_window_size` per layer),
//! mixing the two per head with a sigmoid gate computed from the query (`_compute_gate`,
//! `_mix_attention`, compiled shapeless as there). Caches: the layers' `KVCache`s, then their
//! `RotatingKVCache`s. Inference only (no adapters or full fine-tuning).

use mlx_cache::{Cache, KVCache, Kv, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::activations::{compiled, one};
use crate::layers::{
    scaled_dot_product_attention, Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope,
    RopeScaling,
};
use crate::models::{kit, LanguageModel, OutputHead};
use crate::weights::Weights;

serde_defaults! {
    d_max_pos: i64 = 131072;
    d_theta: f64 = 500000.0;
    d_loop_num: i32 = 2;
    d_window: i32 = 64;
}

/// iquestloopcoder.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub head_dim: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "d_loop_num")]
    pub loop_num: i32,
    #[serde(default = "d_window")]
    pub loop_window_size: i32,
}

struct Layer {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    /// `LoopGateProjection`: `(heads, head_dim)` weight and `(heads,)` bias.
    gate_weight: Array,
    gate_bias: Array,
}

pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    head: OutputHead,
    rope: Rope,
    scale: f32,
}

/// `_compute_gate`: `sigmoid(query @ weight[:, None, :].swapaxes(-1, -2) + bias[..., None,
/// None])`, one gate per head and position.
fn compute_gate(query: &Array, weight: &Array, bias: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let w = ops::swapaxes(&ops::expand_dims(&xs[1], &[1], None)?, -1, -2, None)?;
        let logits = ops::matmul(&xs[0], &w, None)?;
        let logits = (&logits + &ops::expand_dims(&xs[2], &[-1, -2], None)?)?;
        Ok(vec![ops::sigmoid(&logits, None)?])
    })?;
    Ok(one(
        f.call(&[query.clone(), weight.clone(), bias.clone()])?,
        "compute_gate",
    )?)
}

/// `_mix_attention`: `gate * attn_global + (1 - gate) * attn_local`.
fn mix_attention(gate: &Array, global: &Array, local: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let one_ = Scalar::Int(1).to_array_like(xs[0].dtype())?;
        let a = (&xs[0] * &xs[1])?;
        let b = (&(&one_ - &xs[0])? * &xs[2])?;
        Ok(vec![(&a + &b)?])
    })?;
    Ok(one(
        f.call(&[gate.clone(), global.clone(), local.clone()])?,
        "mix_attention",
    )?)
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`iquestloopcoder`): {m}"));
        if args.loop_num != 2 {
            return Err(bad(format!(
                "Only loop_num=2 is supported, got {}",
                args.loop_num
            )));
        }
        let (d, h, kvh, hd) = (
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        );
        kit::check_positive(
            "iquestloopcoder",
            &[
                ("hidden_size", d),
                ("num_hidden_layers", args.num_hidden_layers),
                ("intermediate_size", args.intermediate_size),
                ("num_attention_heads", h),
                ("num_key_value_heads", kvh),
                ("head_dim", hd),
                ("vocab_size", args.vocab_size),
                ("loop_window_size", args.loop_window_size),
            ],
        )?;
        if h % kvh != 0 {
            return Err(bad(format!(
                "num_attention_heads {h} must be a multiple of num_key_value_heads {kvh}"
            )));
        }
        let eps = args.rms_norm_eps as f32;
        let bias = args.attention_bias;
        let mut layers = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let g = |s: &str| format!("model.gate_projections.{i}.{s}");
            layers.push(Layer {
                q_proj: Linear::load(w, &p("self_attn.q_proj"), d, h * hd, bias)?,
                k_proj: Linear::load(w, &p("self_attn.k_proj"), d, kvh * hd, bias)?,
                v_proj: Linear::load(w, &p("self_attn.v_proj"), d, kvh * hd, bias)?,
                o_proj: Linear::load(w, &p("self_attn.o_proj"), h * hd, d, bias)?,
                mlp: Mlp::load(
                    w,
                    &p("mlp"),
                    &MlpNames::LLAMA,
                    d,
                    args.intermediate_size,
                    args.mlp_bias,
                    args.mlp_bias,
                    MlpKind::SwiGlu,
                )?,
                input_layernorm: RmsNorm::load(w, &p("input_layernorm"), d, eps)?,
                post_attention_layernorm: RmsNorm::load(w, &p("post_attention_layernorm"), d, eps)?,
                gate_weight: w.take(&g("weight"), &[h, hd])?,
                gate_bias: w.take(&g("bias"), &[h])?,
            });
        }
        let embed_tokens = Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?;
        let lm_head = crate::models::load_lm_head(w, args.tie_word_embeddings, d, args.vocab_size)?;
        Ok(Model {
            head: OutputHead::of(lm_head.as_ref(), &embed_tokens),
            norm: RmsNorm::load(w, "model.norm", d, eps)?,
            rope: Rope::initialize(
                hd,
                args.rope_theta,
                false,
                args.rope_scaling.as_ref(),
                Some(args.max_position_embeddings),
            )?,
            scale: f64::from(hd).powf(-0.5) as f32,
            embed_tokens,
            layers,
            args,
        })
    }

    /// `Attention.get_qkv`: projected, split into heads, roped at `offset`.
    fn qkv(&self, l: &Layer, x: &Array, offset: usize) -> Result<(Array, Array, Array)> {
        let (h, kvh) = (self.args.num_attention_heads, self.args.num_key_value_heads);
        let q = kit::split_heads(&l.q_proj.forward(x)?, h)?;
        let k = kit::split_heads(&l.k_proj.forward(x)?, kvh)?;
        let v = kit::split_heads(&l.v_proj.forward(x)?, kvh)?;
        Ok((
            self.rope.forward(&q, offset)?,
            self.rope.forward(&k, offset)?,
            v,
        ))
    }

    /// `o_proj` of the heads joined back, then the residual, then the MLP block.
    fn finish(&self, l: &Layer, h: &Array, out: &Array) -> Result<Array> {
        let out = kit::merge_heads(out)?;
        let h = (h + &l.o_proj.forward(&out)?)?;
        let r = l.mlp.forward(&l.post_attention_layernorm.forward(&h)?)?;
        Ok((&h + &r)?)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        crate::models::moe::check_inputs(inputs)?;
        let n = inputs.shape()[1] as usize;
        let layers = self.layers.len();
        let window = self.args.loop_window_size as usize;
        let mut caches = caches;
        kit::check_caches(
            caches.as_deref(),
            2 * layers,
            "slots (a KVCache per layer, then a RotatingKVCache per layer)",
        )?;
        let mask = kit::cache_mask(caches.as_deref(), 0, n, None, false)?;
        let window_mask = kit::cache_mask(caches.as_deref(), layers, n, Some(window), false)?;
        let mut h = self.embed_tokens.forward(inputs)?;
        let mut loop1: Vec<Kv> = Vec::with_capacity(layers);
        for (i, l) in self.layers.iter().enumerate() {
            let x = l.input_layernorm.forward(&h)?;
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let offset = cache.as_ref().map_or(0, |c| c.offset());
            let (q, k, v) = self.qkv(l, &x, offset)?;
            let kv = kit::cached_kv(cache, k, v)?;
            let out = scaled_dot_product_attention(&q, &kv, self.scale, &mask, None)?;
            loop1.push(kv);
            h = self.finish(l, &h, &out)?;
        }
        for (i, (l, kv1)) in self.layers.iter().zip(&loop1).enumerate() {
            let x = l.input_layernorm.forward(&h)?;
            let cache = caches.as_deref_mut().map(|c| &mut c[layers + i]);
            let offset = cache.as_ref().map_or(0, |c| c.offset());
            let (q, k, v) = self.qkv(l, &x, offset)?;
            let gate = compute_gate(&q, &l.gate_weight, &l.gate_bias)?;
            let global = scaled_dot_product_attention(&q, kv1, self.scale, &mask, None)?;
            let kv2 = kit::cached_kv(cache, k, v)?;
            let local = scaled_dot_product_attention(&q, &kv2, self.scale, &window_mask, None)?;
            let mixed = mix_attention(&gate, &global, &local)?;
            h = self.finish(l, &h, &mixed)?;
        }
        self.norm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.head.forward(h)
    }

    /// iquestloopcoder.py's `shard()`: q, k, v and the MLP's gate and up all-to-sharded, o
    /// and down sharded-to-all (summed over the group), heads and KV heads / N, and each
    /// layer's loop gate keeping this rank's heads (weight rows and bias).
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all, take_heads};
        crate::shard::check_tensor_rank(size, rank)?;
        let (h, kvh) = (self.args.num_attention_heads, self.args.num_key_value_heads);
        if h % size != 0 || kvh % size != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: format!("{h} heads and {kvh} KV heads"),
                problem: format!("do not split over {size} ranks"),
            });
        }
        let per = h / size;
        for (i, l) in self.layers.iter_mut().enumerate() {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            all_to_sharded(&mut l.q_proj, size, rank, &p("self_attn.q_proj"))?;
            all_to_sharded(&mut l.k_proj, size, rank, &p("self_attn.k_proj"))?;
            all_to_sharded(&mut l.v_proj, size, rank, &p("self_attn.v_proj"))?;
            sharded_to_all(&mut l.o_proj, size, rank, &p("self_attn.o_proj"))?;
            crate::shard::shard_mlp(&mut l.mlp, size, rank, &p("mlp"), false)?;
            let g = format!("model.gate_projections.{i}");
            l.gate_weight = take_heads(&l.gate_weight, per, rank, &format!("{g}.weight"))?;
            l.gate_bias = take_heads(&l.gate_bias, per, rank, &format!("{g}.bias"))?;
        }
        self.args.num_attention_heads = per;
        self.args.num_key_value_heads = kvh / size;
        Ok(())
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    /// `make_cache`: a `KVCache` per layer, then a `RotatingKVCache(loop_window_size)` per
    /// layer.
    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        let window = self.args.loop_window_size as usize;
        let mut out = kit::kv_caches(self.layers.len());
        for _ in &self.layers {
            match RotatingKVCache::new(window, 0) {
                Ok(c) => out.push(Box::new(c)),
                // `loop_window_size` is checked positive at load.
                Err(_) => out.push(Box::new(KVCache::new())),
            }
        }
        out
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The number of caches (two per layer), as mlx-lm's `make_cache` returns them.
    fn num_layers(&self) -> usize {
        2 * self.layers.len()
    }
}
