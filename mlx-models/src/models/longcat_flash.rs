//! mlx-lm 0.32.2's `models/longcat_flash.py`: each layer runs two MLA attentions
//! ([`MlaAttention`], with the `mla_scale_q_lora` / `mla_scale_kv_lora` factors) and two dense
//! MLPs in sequence, plus one mixture of experts on the first half's normed state whose output
//! joins at the end ("shortcut"). The router picks among the routed experts and `zero_expert_num`
//! identity ("zero") experts, which add the input times their weight. A layer's cache is a
//! `CacheList` of the two attentions' caches.

use mlx_cache::{ArraysCache, AttentionMask, Cache, CacheList, KVCache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::mla::{MlaAttention, MlaSpec};
use crate::layers::{
    Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope, RopeScaling, SwitchActivation,
    SwitchGlu,
};
use crate::models::moe_block::{MoeParts, Router, SparseMoe};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// longcat_flash.py `ModelArgs` (most fields required there).
#[derive(Deserialize)]
struct Args {
    model_type: String,
    zero_expert_type: String,
    hidden_size: i32,
    ffn_hidden_size: i32,
    moe_topk: i32,
    expert_ffn_hidden_size: i32,
    n_routed_experts: i32,
    zero_expert_num: i32,
    num_layers: i32,
    vocab_size: i32,
    max_position_embeddings: i64,
    num_attention_heads: i32,
    kv_lora_rank: i32,
    q_lora_rank: Option<i32>,
    qk_rope_head_dim: i32,
    qk_nope_head_dim: i32,
    v_head_dim: i32,
    routed_scaling_factor: f64,
    rms_norm_eps: f64,
    rope_theta: f64,
    mla_scale_q_lora: bool,
    mla_scale_kv_lora: bool,
    attention_bias: bool,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default)]
    router_bias: bool,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    // longcat_flash_ngram
    #[serde(default = "d_ngram_ratio")]
    ngram_vocab_size_ratio: i64,
    #[serde(default = "d_ngram_k")]
    emb_neighbor_num: i64,
    #[serde(default = "d_ngram_k")]
    emb_split_num: i64,
}

fn d_ngram_ratio() -> i64 {
    78
}

fn d_ngram_k() -> i64 {
    4
}

#[derive(Clone)]
struct Layer {
    /// `LongcatFlashTopkRouter` + `LongcatFlashMoE`: the shared block with
    /// [`Router::SoftmaxCorrectedUpper`] and identity experts
    /// ([`SparseMoe::with_identity_experts`]).
    mlp: SparseMoe,
    self_attn: [MlaAttention; 2],
    mlps: [Mlp; 2],
    input_layernorm: [RmsNorm; 2],
    post_attention_layernorm: [RmsNorm; 2],
}

impl Layer {
    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let mut subs: Option<&mut [Box<dyn Cache>]> = match cache {
            Some(c) => Some(
                c.as_mut()
                    .as_any_mut()
                    .downcast_mut::<CacheList>()
                    .ok_or_else(|| ModelError::Cache {
                        what: "longcat_flash layers".into(),
                        problem: "need a CacheList cache".into(),
                    })?
                    .caches_mut(),
            ),
            None => None,
        };
        let mut h = x.clone();
        let mut shortcut = None;
        for i in 0..2 {
            let residual = h.clone();
            let n = self.input_layernorm[i].forward(&h)?;
            let c = subs.as_deref_mut().and_then(|s| s.get_mut(i));
            let a = self.self_attn[i].forward(&n, mask, c)?;
            h = (&residual + &a)?;
            let residual = h.clone();
            let n = self.post_attention_layernorm[i].forward(&h)?;
            if i == 0 {
                shortcut = Some(self.mlp.forward(&n)?);
            }
            h = (&residual + &self.mlps[i].forward(&n)?)?;
            if i == 1 {
                if let Some(s) = &shortcut {
                    h = (&h + s)?;
                }
            }
        }
        Ok(h)
    }
}

/// A LongCat-Flash decoder.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embed_tokens: Embedding,
    /// longcat_flash_ngram: the n-gram embeddings added to `embed_tokens`'s (which it names
    /// `ngram_embeddings.word_embeddings`); its caches start with one `ArraysCache` holding
    /// the last `emb_neighbor_num - 1` token ids.
    ngram: Option<NgramEmbedding>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: Args = config.args()?;
        let t = &a.model_type;
        if a.zero_expert_type != "identity" {
            return Err(ModelError::Config(format!(
                "{t}: zero_expert_type `{}` is not supported (mlx-lm asserts \"identity\")",
                a.zero_expert_type
            )));
        }
        if !a.mla_scale_q_lora || !a.mla_scale_kv_lora {
            // mlx-lm reads both attributes in every call; without them it fails.
            return Err(ModelError::Config(format!(
                "{t}: mla_scale_q_lora and mla_scale_kv_lora must be true (mlx-lm's attention \
                 reads both factors)"
            )));
        }
        let q_lora = a.q_lora_rank.ok_or_else(|| {
            ModelError::Config(format!(
                "{t}: q_lora_rank is required (mla_scale_q_lora divides by it)"
            ))
        })?;
        for (name, v) in [
            ("hidden_size", a.hidden_size),
            ("num_layers", a.num_layers),
            ("num_attention_heads", a.num_attention_heads),
            ("kv_lora_rank", a.kv_lora_rank),
            ("q_lora_rank", q_lora),
            ("n_routed_experts", a.n_routed_experts),
            ("moe_topk", a.moe_topk),
            ("vocab_size", a.vocab_size),
        ] {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "{t}: `{name}` must be positive, got {v}"
                )));
            }
        }
        if a.zero_expert_num < 0 || a.moe_topk > a.n_routed_experts + a.zero_expert_num {
            return Err(ModelError::Config(format!(
                "{t}: moe_topk {} exceeds the {} routed and {} zero experts",
                a.moe_topk, a.n_routed_experts, a.zero_expert_num
            )));
        }
        sanitize(&a, w)?;
        let dim = a.hidden_size;
        let eps = a.rms_norm_eps as f32;
        let qk_head_dim = f64::from(a.qk_nope_head_dim + a.qk_rope_head_dim);
        let mut scale = qk_head_dim.powf(-0.5);
        if let Some(rs) = &a.rope_scaling {
            if let Some(m) = rs
                .get("mscale_all_dim")
                .and_then(Value::as_f64)
                .filter(|m| *m != 0.0)
            {
                let factor = rs.get("factor").and_then(Value::as_f64).ok_or_else(|| {
                    ModelError::Config(format!("{t}: rope_scaling needs a numeric `factor`"))
                })?;
                if factor > 1.0 {
                    let s = 0.1 * m * factor.ln() + 1.0;
                    scale = scale * s * s;
                }
            }
        }
        let q_scale = (f64::from(dim) / f64::from(q_lora)).powf(0.5) as f32;
        let kv_scale = (f64::from(dim) / f64::from(a.kv_lora_rank)).powf(0.5) as f32;
        let ngram = if t == "longcat_flash_ngram" {
            // Its `sanitize`: `model.embed_tokens.weight` becomes the n-gram module's
            // `word_embeddings`.
            if let Some(v) = w.remove("model.embed_tokens.weight") {
                w.insert("model.ngram_embeddings.word_embeddings.weight".into(), v);
            }
            Some(NgramEmbedding::load(&a, w)?)
        } else {
            None
        };
        let embed_tokens = Embedding::load(
            w,
            if ngram.is_some() {
                "model.ngram_embeddings.word_embeddings"
            } else {
                "model.embed_tokens"
            },
            a.vocab_size,
            dim,
        )?;
        let n_total = a.n_routed_experts + a.zero_expert_num;
        let mut layers = Vec::with_capacity(a.num_layers as usize);
        for l in 0..a.num_layers {
            let p = format!("model.layers.{l}");
            // The weights load in the port's order (switch_mlp, router.classifier,
            // router.e_score_correction_bias).
            let experts = SwitchGlu::load(
                w,
                &format!("{p}.mlp.switch_mlp"),
                dim,
                a.expert_ffn_hidden_size,
                a.n_routed_experts,
                false,
                SwitchActivation::SwiGlu,
            )?;
            let gate = Linear::load(
                w,
                &format!("{p}.mlp.router.classifier"),
                dim,
                n_total,
                a.router_bias,
            )?;
            let bias = w.take(
                &format!("{p}.mlp.router.e_score_correction_bias"),
                &[n_total],
            )?;
            let mlp = SparseMoe::from_parts(MoeParts {
                top_k: a.moe_topk,
                router: Router::SoftmaxCorrectedUpper {
                    norm_topk_prob: a.norm_topk_prob,
                    routed_scaling_factor: a.routed_scaling_factor,
                },
                gate,
                experts,
                names: ["router.classifier", "switch_mlp"],
                correction_bias: Some(("router.e_score_correction_bias", bias)),
                plain_shared: None,
                flatten: false,
            })
            .with_identity_experts(a.n_routed_experts);
            let attn = |w: &mut Weights, i: usize| -> Result<MlaAttention> {
                MlaAttention::load(
                    false,
                    MlaSpec {
                        hidden_size: dim,
                        num_heads: a.num_attention_heads,
                        q_lora_rank: Some(q_lora),
                        kv_lora_rank: a.kv_lora_rank,
                        qk_nope_head_dim: a.qk_nope_head_dim,
                        qk_rope_head_dim: a.qk_rope_head_dim,
                        v_head_dim: a.v_head_dim,
                        attention_bias: a.attention_bias,
                        // `nn.RMSNorm(dims)`'s default.
                        lora_norm_eps: 1e-5,
                        scale: scale as f32,
                        rope: Rope::initialize(
                            a.qk_rope_head_dim,
                            a.rope_theta,
                            true,
                            a.rope_scaling.as_ref(),
                            Some(a.max_position_embeddings),
                        )?,
                        q_scale: Some(q_scale),
                        kv_scale: Some(kv_scale),
                    },
                    w,
                    &format!("{p}.self_attn.{i}"),
                )
            };
            let self_attn = [attn(w, 0)?, attn(w, 1)?];
            let dense = |w: &mut Weights, i: usize| -> Result<Mlp> {
                Mlp::load(
                    w,
                    &format!("{p}.mlps.{i}"),
                    &MlpNames::LLAMA,
                    dim,
                    a.ffn_hidden_size,
                    false,
                    false,
                    MlpKind::SwiGlu,
                )
            };
            let mlps = [dense(w, 0)?, dense(w, 1)?];
            let norm = |w: &mut Weights, n: &str, i: usize| {
                RmsNorm::load(w, &format!("{p}.{n}.{i}"), dim, eps)
            };
            let input_layernorm = [
                norm(w, "input_layernorm", 0)?,
                norm(w, "input_layernorm", 1)?,
            ];
            let post_attention_layernorm = [
                norm(w, "post_attention_layernorm", 0)?,
                norm(w, "post_attention_layernorm", 1)?,
            ];
            layers.push(Layer {
                mlp,
                self_attn,
                mlps,
                input_layernorm,
                post_attention_layernorm,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", dim, eps)?;
        let lm_head = Linear::load(w, "lm_head", dim, a.vocab_size, false)?;
        Ok(Model {
            model_type: config.model_type.clone(),
            vocab_size: a.vocab_size,
            embed_tokens,
            ngram,
            layers,
            norm,
            lm_head,
        })
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.lm_head.forward(h)
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        crate::models::moe::check_inputs(inputs)?;
        let mut caches = caches;
        let mut h = match &self.ngram {
            Some(ng) => {
                let (first, rest) = match caches.take() {
                    Some(c) if !c.is_empty() => {
                        let (first, rest) = c.split_at_mut(1);
                        (Some(&mut first[0]), Some(rest))
                    }
                    Some(_) => {
                        return Err(ModelError::Cache {
                            what: "longcat_flash_ngram".into(),
                            problem: "no caches (the first holds the n-gram context)".into(),
                        })
                    }
                    None => (None, None),
                };
                caches = rest;
                let ctx = match first {
                    Some(c) => Some(c.as_any_mut().downcast_mut::<ArraysCache>().ok_or_else(
                        || ModelError::Cache {
                            what: "longcat_flash_ngram".into(),
                            problem: "the first cache must be an ArraysCache".into(),
                        },
                    )?),
                    None => None,
                };
                ng.forward(&self.embed_tokens.forward(inputs)?, inputs, ctx)?
            }
            None => self.embed_tokens.forward(inputs)?,
        };
        let n = h.shape().get(1).copied().unwrap_or(0) as usize;
        let mask = match caches.as_deref_mut() {
            Some(caches) => {
                kit::check_caches(Some(&*caches), self.layers.len(), "layers")?;
                // `create_attention_mask(h, cache[0][0], return_array=True)`.
                match caches.first() {
                    Some(c) => match c.as_any().downcast_ref::<CacheList>() {
                        Some(list) => match list.caches().first() {
                            Some(first) => first.make_mask(n, None, true)?,
                            None => mlx_cache::mask::fallback_mask(n, None, true)?,
                        },
                        None => {
                            return Err(ModelError::Cache {
                                what: "longcat_flash layers".into(),
                                problem: "need a CacheList cache".into(),
                            })
                        }
                    },
                    None => mlx_cache::mask::fallback_mask(n, None, true)?,
                }
            }
            None => mlx_cache::mask::fallback_mask(n, None, true)?,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            h = layer.forward(&h, &mask, cache)?;
        }
        self.norm.forward(&h)
    }
}

/// longcat_flash.py `sanitize`: experts stacked into `switch_mlp`, each attention's HF
/// `kv_b_proj` split into `embed_q` / `unembed_out`, `model.mtp*` dropped.
fn sanitize(a: &Args, w: &mut Weights) -> Result<()> {
    for l in 0..a.num_layers {
        let prefix = format!("model.layers.{l}");
        kit::stack_experts(
            w,
            &format!("{prefix}.mlp.experts"),
            &format!("{prefix}.mlp.switch_mlp"),
            a.n_routed_experts,
            &kit::GLU_PROJECTIONS,
            &kit::LINEAR_KEYS,
        )?;
        for i in 0..2 {
            crate::models::deepseek::split_kv_b_proj_dims(
                w,
                &format!("{prefix}.self_attn.{i}"),
                a.num_attention_heads,
                a.qk_nope_head_dim,
                a.v_head_dim,
                a.kv_lora_rank,
            )?;
        }
    }
    w.discard_prefix("model.mtp");
    Ok(())
}

impl Model {
    /// Tensor parallelism as longcat_flash's `shard()`: both MLA attentions of a layer split
    /// by heads ([`MlaAttention::shard_tensor_parallel`]), both dense MLPs as llama's, the
    /// routed experts sharded in place with their sum taken over the group.
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::switch_inplace;
        // longcat_flash_ngram.py's shard() is LongcatFlashLM.shard (the n-gram embeddings
        // stay whole on every rank).
        if !matches!(
            self.model_type.as_str(),
            "longcat_flash" | "longcat_flash_ngram"
        ) {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: format!("model_type `{}`", self.model_type),
                problem: "not supported yet (longcat_flash, longcat_flash_ngram)".into(),
            });
        }
        crate::shard::check_tensor_rank(size, rank)?;
        for (i, l) in self.layers.iter_mut().enumerate() {
            let p = format!("model.layers.{i}");
            for (j, a) in l.self_attn.iter_mut().enumerate() {
                a.shard_tensor_parallel(size, rank, &format!("{p}.self_attn.{j}"))?;
            }
            for (j, m) in l.mlps.iter_mut().enumerate() {
                crate::shard::shard_mlp(m, size, rank, &format!("{p}.mlps.{j}"), false)?;
            }
            let e = &mut l.mlp.switch_mlp;
            let w = |n: &str| format!("{p}.mlp.switch_mlp.{n}");
            switch_inplace(&mut e.gate_proj, true, size, rank, &w("gate_proj"))?;
            switch_inplace(&mut e.up_proj, true, size, rank, &w("up_proj"))?;
            switch_inplace(&mut e.down_proj, false, size, rank, &w("down_proj"))?;
            l.mlp.sharded = true;
        }
        Ok(())
    }
}

impl LanguageModel for Model {
    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    kit::hidden_state_entry_points!();

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::Linear(self.lm_head.clone()))
    }

    kit::own_type_and_vocab!();

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        let lists = (0..self.layers.len()).map(|_| -> Box<dyn Cache> {
            Box::new(CacheList::new(vec![
                Box::new(KVCache::new()),
                Box::new(KVCache::new()),
            ]))
        });
        match self.ngram {
            Some(_) => std::iter::once(Box::new(ArraysCache::new(1)) as Box<dyn Cache>)
                .chain(lists)
                .collect(),
            None => lists.collect(),
        }
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    fn num_layers(&self) -> usize {
        self.layers.len() + usize::from(self.ngram.is_some())
    }
}

/// longcat_flash_ngram.py `NgramEmbedding`: `k * (n - 1)` hashed n-gram embeddings (n-grams of
/// 2..=n tokens, `k` hashes each: the ids of the n-gram weighted by powers of the vocabulary
/// modulo the embedder's size), each projected to the hidden size and added to the word
/// embedding, the sum divided by `1 + k * (n - 1)`. Ids are int64 as there.
struct NgramEmbedding {
    /// `(vocab size, module, projection)` of each embedder, in order.
    embedders: Vec<(i64, Embedding, Linear)>,
    /// `vocab_mods[(i, j)]` for n-gram size `i` and hash `j`, flattened in that order.
    vocab_mods: Vec<Vec<i64>>,
    n: i64,
    k: i64,
}

impl NgramEmbedding {
    fn load(a: &Args, w: &mut Weights) -> Result<NgramEmbedding> {
        let (n, k) = (a.emb_neighbor_num, a.emb_split_num);
        let bad = |m: String| ModelError::Config(format!("longcat_flash_ngram: {m}"));
        if !(2..=64).contains(&n) || !(1..=64).contains(&k) || a.ngram_vocab_size_ratio < 1 {
            return Err(bad(format!(
                "emb_neighbor_num {n} (2..=64), emb_split_num {k} (1..=64) and \
                 ngram_vocab_size_ratio {} (>= 1) are out of range",
                a.ngram_vocab_size_ratio
            )));
        }
        let count = k * (n - 1);
        let emb_dim = i64::from(a.hidden_size) / count;
        if emb_dim < 1 {
            return Err(bad(format!(
                "hidden_size {} is smaller than the {count} n-gram embedders",
                a.hidden_size
            )));
        }
        let vocab = i64::from(a.vocab_size);
        let m = a
            .ngram_vocab_size_ratio
            .checked_mul(vocab)
            .filter(|m| *m < i64::from(i32::MAX) / 2)
            .ok_or_else(|| bad("ngram_vocab_size_ratio * vocab_size is too large".into()))?;
        let mut embedders = Vec::with_capacity(count as usize);
        for i in 0..count {
            let size = m + i * 2 + 1;
            embedders.push((
                size,
                Embedding::load(
                    w,
                    &format!("model.ngram_embeddings.embedders.{i}"),
                    size as i32,
                    emb_dim as i32,
                )?,
                Linear::load(
                    w,
                    &format!("model.ngram_embeddings.post_projs.{i}"),
                    emb_dim as i32,
                    a.hidden_size,
                    false,
                )?,
            ));
        }
        let mut vocab_mods = Vec::with_capacity(count as usize);
        for i in 2..=n {
            for j in 0..k {
                let dim = m + ((i - 2) * k + j) * 2 + 1;
                let mut power = 1i64;
                let mut mods = Vec::new();
                for _ in 0..i - 1 {
                    power = (power * vocab) % dim;
                    mods.push(power);
                }
                vocab_mods.push(mods);
            }
        }
        Ok(NgramEmbedding {
            embedders,
            vocab_mods,
            n,
            k,
        })
    }

    /// `_shift_right(x, s)`: `s` zero ids in front, the last `s` dropped (all zeros when the
    /// sequence is not longer than `s`).
    fn shift_right(x: &Array, s: i64) -> Result<Array> {
        let sh = x.shape();
        let len = i64::from(sh[1]);
        if s <= 0 {
            return Ok(x.clone());
        }
        if len <= s {
            return Ok(ops::zeros_like(x, None)?);
        }
        let zeros = ops::zeros(&[sh[0], s as i32], x.dtype(), None)?;
        let kept = ops::slice_axis(x, -1, 0, (len - s) as i32, None)?;
        Ok(ops::concatenate(&[&zeros, &kept], -1, None)?)
    }

    /// `x` the word embeddings of `ids` `(B, L)`; `ctx` the context cache (slot 0: the last
    /// `n - 1` ids seen).
    fn forward(&self, x: &Array, ids: &Array, ctx: Option<&mut ArraysCache>) -> Result<Array> {
        let seq = ids.shape()[1];
        let ids = ids.astype(Dtype::Int64)?;
        let context = match ctx {
            Some(c) => {
                let context = match c.get(0) {
                    Some(prev) => ops::concatenate(&[prev, &ids], -1, None)?,
                    None => ids.clone(),
                };
                let len = i64::from(context.shape()[1]);
                let start = (len - self.n + 1).max(0) as i32;
                c.set(0, ops::slice_axis(&context, -1, start, len as i32, None)?)?;
                context
            }
            None => ids.clone(),
        };
        let shifted: Vec<Array> = (2..=self.n)
            .map(|i| Self::shift_right(&context, i - 1))
            .collect::<Result<_>>()?;
        let len = context.shape()[1];
        let mut x = x.clone();
        for i in 2..=self.n {
            for j in 0..self.k {
                let index = ((i - 2) * self.k + j) as usize;
                let (size, embedder, proj) = &self.embedders[index];
                let mods = &self.vocab_mods[index];
                let mut ngram = context.clone();
                for kk in 2..=i {
                    let term = ops::multiply_scalar(
                        &shifted[(kk - 2) as usize],
                        mods[(kk - 2) as usize],
                        None,
                    )?;
                    ngram = (&ngram + &term)?;
                }
                let ngram = ops::remainder_scalar(&ngram, *size, None)?;
                let ngram = ops::slice_axis(&ngram, -1, len - seq, len, None)?;
                x = (&x + &proj.forward(&embedder.forward(&ngram)?)?)?;
            }
        }
        Ok(ops::divide_scalar(&x, 1 + self.k * (self.n - 1), None)?)
    }
}
