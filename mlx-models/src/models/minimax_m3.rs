//! mlx-lm 0.32.2 `models/minimax_m3_vl.py`, its text model (the vision tower and projectors are
//! dropped, as mlx-lm drops them): GQA attention with (Gemma-style) q/k norms and a partial
//! rope, on the sparse layers a block indexer that keeps the `index_topk_blocks` best key
//! blocks per query (plus the local ones) as a boolean mask; MoE blocks with a sigmoid router
//! over a correction bias and GPT-OSS SwiGLU experts beside a shared expert (the shared MoE
//! block, `moe_block.rs`, with [`Router::SigmoidCorrectedScaled`]), or dense MLPs.
//! Each layer holds a `CacheList`: its `KVCache`, and on sparse layers a second one of the
//! index keys (values of width zero).
//! Tensor parallelism as mlx-lm's `shard()` ([`Model::shard_tensor_parallel`]) and pipeline
//! parallelism as its `TextModel.pipeline` ([`Model::shard_pipeline`]).

use mlx_cache::{AttentionMask, Cache, CacheList, KVCache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::{parse_args, ModelConfig};
use crate::error::{ModelError, Result};
use crate::layers::{
    scaled_dot_product_attention, Embedding, Linear, Mlp, MlpKind, Norm, NormKind, Rope,
    SwitchActivation, SwitchGlu,
};
use crate::models::moe_block::{lower_top_k, Ffn, MoeParts, Router, SparseMoe};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_hidden: i32 = 6144;
    d_inter: i32 = 3072;
    d_dense_inter: i32 = 12288;
    d_heads: i32 = 64;
    d_kv_heads: i32 = 4;
    d_layers: i32 = 60;
    d_experts: i32 = 128;
    d_top_k: i32 = 4;
    d_max_pos: i64 = 1048576;
    d_eps: f64 = 1e-6;
    d_rope_theta: f64 = 5000000.0;
    d_head_dim: i32 = 128;
    d_partial: f64 = 0.5;
    d_vocab: i32 = 200064;
    d_scaling: f64 = 2.0;
    d_true: bool = true;
    d_alpha: f64 = 1.702;
    d_limit: f64 = 7.0;
    d_one: i32 = 1;
}

/// minimax_m3_vl.py `TextArgs` (every field has a default there).
#[derive(Clone, Debug, Deserialize)]
struct TextArgs {
    #[serde(default = "d_hidden")]
    hidden_size: i32,
    #[serde(default = "d_inter")]
    intermediate_size: i32,
    #[serde(default = "d_dense_inter")]
    dense_intermediate_size: i32,
    #[serde(default = "d_inter")]
    shared_intermediate_size: i32,
    #[serde(default = "d_heads")]
    num_attention_heads: i32,
    #[serde(default = "d_kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "d_layers")]
    num_hidden_layers: i32,
    #[serde(default = "d_experts")]
    num_local_experts: i32,
    #[serde(default = "d_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "d_max_pos")]
    max_position_embeddings: i64,
    #[serde(default = "d_eps")]
    rms_norm_eps: f64,
    #[serde(default = "d_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_parameters: Option<Map<String, Value>>,
    #[serde(default = "d_head_dim")]
    head_dim: i32,
    #[serde(default)]
    rotary_dim: Option<i32>,
    #[serde(default = "d_partial")]
    partial_rotary_factor: f64,
    #[serde(default = "d_vocab")]
    vocab_size: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "d_scaling")]
    routed_scaling_factor: f64,
    #[serde(default = "d_true")]
    use_qk_norm: bool,
    #[serde(default = "d_true")]
    use_gemma_norm: bool,
    #[serde(default = "d_alpha")]
    swiglu_alpha: f64,
    #[serde(default = "d_limit")]
    swiglu_limit: f64,
    #[serde(default)]
    mlp_layer_types: Option<Vec<String>>,
    #[serde(default)]
    moe_layer_freq: Option<Vec<i64>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    sparse_attention_config: Option<Map<String, Value>>,
    #[serde(default)]
    sparse_attention_freq: Option<Vec<i64>>,
    #[serde(default)]
    index_n_heads: Option<i32>,
    #[serde(default)]
    index_head_dim: Option<i32>,
    #[serde(default)]
    index_block_size: Option<i32>,
    #[serde(default)]
    index_topk_blocks: Option<i32>,
    #[serde(default = "d_one")]
    index_local_blocks: i32,
}

const MT: &str = "minimax_m3_vl";

fn config_error(m: String) -> ModelError {
    ModelError::Config(format!("config.json (`{MT}`): {m}"))
}

impl TextArgs {
    /// `__post_init__`: the nested sparse-attention and rope settings.
    fn post_init(&mut self) -> Result<()> {
        let int = |v: &Value| v.as_i64().and_then(|x| i32::try_from(x).ok());
        if let Some(sac) = self.sparse_attention_config.clone() {
            let get = |k: &str| sac.get(k);
            if let Some(v) = get("sparse_num_index_heads") {
                self.index_n_heads = int(v);
            }
            if let Some(v) = get("sparse_index_dim") {
                self.index_head_dim = int(v);
            }
            if let Some(v) = get("sparse_block_size") {
                self.index_block_size = int(v);
            }
            if let Some(v) = get("sparse_topk_blocks") {
                self.index_topk_blocks = int(v);
            }
            if let Some(v) = get("sparse_local_block") {
                self.index_local_blocks = int(v).ok_or_else(|| {
                    config_error(
                        "`sparse_attention_config.sparse_local_block` must be an integer".into(),
                    )
                })?;
            }
            if let Some(v) = get("sparse_attention_freq") {
                self.sparse_attention_freq = serde_json::from_value(v.clone()).map_err(|e| {
                    config_error(format!(
                        "`sparse_attention_config.sparse_attention_freq`: {e}"
                    ))
                })?;
            }
        }
        if let Some(r) = &self.rope_parameters {
            if let Some(t) = r.get("rope_theta").and_then(Value::as_f64) {
                self.rope_theta = t;
            }
            if let Some(p) = r.get("partial_rotary_factor").and_then(Value::as_f64) {
                self.partial_rotary_factor = p;
            }
        }
        if self.rotary_dim.is_none() {
            self.rotary_dim = Some((f64::from(self.head_dim) * self.partial_rotary_factor) as i32);
        }
        Ok(())
    }

    fn is_moe(&self, i: usize) -> Result<bool> {
        let n = self.num_hidden_layers;
        let missing = |f: &str| config_error(format!("`{f}` has no entry for layer {i} of {n}"));
        if let Some(t) = &self.mlp_layer_types {
            return Ok(t.get(i).ok_or_else(|| missing("mlp_layer_types"))? == "sparse");
        }
        if let Some(f) = &self.moe_layer_freq {
            return Ok(*f.get(i).ok_or_else(|| missing("moe_layer_freq"))? != 0);
        }
        Ok(true)
    }

    fn is_sparse_attn(&self, i: usize) -> Result<bool> {
        let n = self.num_hidden_layers;
        let missing = |f: &str| config_error(format!("`{f}` has no entry for layer {i} of {n}"));
        if self.index_block_size.is_none() {
            return Ok(false);
        }
        if let Some(t) = &self.layer_types {
            return Ok(t.get(i).ok_or_else(|| missing("layer_types"))? != "full_attention");
        }
        if let Some(f) = &self.sparse_attention_freq {
            return Ok(*f.get(i).ok_or_else(|| missing("sparse_attention_freq"))? != 0);
        }
        Ok(true)
    }
}

/// The block indexer of a sparse layer.
#[derive(Clone)]
struct Indexer {
    q_proj: Linear,
    k_proj: Linear,
    q_norm: Norm,
    k_norm: Norm,
    rope: Rope,
    n_heads: i32,
    head_dim: i32,
    block_size: i32,
    topk_blocks: i32,
    local_blocks: i32,
}

#[derive(Clone)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    qk_norm: Option<(Norm, Norm)>,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
    indexer: Option<Indexer>,
}

impl Attention {
    fn load(a: &TextArgs, w: &mut Weights, p: &str, sparse: bool) -> Result<Attention> {
        let (h, kv, hd, d) = (
            a.num_attention_heads,
            a.num_key_value_heads,
            a.head_dim,
            a.hidden_size,
        );
        let kind = if a.use_gemma_norm {
            NormKind::RmsOffset
        } else {
            NormKind::Rms
        };
        let eps = a.rms_norm_eps as f32;
        let mut l = |n: &str, i: i32, o: i32| Linear::load(w, &format!("{p}.{n}"), i, o, false);
        let (q_proj, k_proj, v_proj, o_proj) = (
            l("q_proj", d, h * hd)?,
            l("k_proj", d, kv * hd)?,
            l("v_proj", d, kv * hd)?,
            l("o_proj", h * hd, d)?,
        );
        let qk_norm = if a.use_qk_norm {
            Some((
                Norm::load(w, &format!("{p}.q_norm"), kind, hd, eps)?,
                Norm::load(w, &format!("{p}.k_norm"), kind, hd, eps)?,
            ))
        } else {
            None
        };
        let rotary = a.rotary_dim.unwrap_or(hd);
        let rope = Rope::initialize(
            rotary,
            a.rope_theta,
            false,
            a.rope_parameters.as_ref(),
            Some(a.max_position_embeddings),
        )?;
        let indexer = if sparse {
            let need = |v: Option<i32>, f: &str| {
                v.filter(|x| *x > 0)
                    .ok_or_else(|| config_error(format!("sparse layers need a positive `{f}`")))
            };
            let (ih, id) = (
                need(a.index_n_heads, "index_n_heads")?,
                need(a.index_head_dim, "index_head_dim")?,
            );
            let block_size = need(a.index_block_size, "index_block_size")?;
            let topk_blocks = need(a.index_topk_blocks, "index_topk_blocks")?;
            if h % ih != 0 {
                return Err(config_error(format!(
                    "`index_n_heads` {ih} does not divide `num_attention_heads` {h}"
                )));
            }
            Some(Indexer {
                q_proj: Linear::load(w, &format!("{p}.index_q_proj"), d, ih * id, false)?,
                k_proj: Linear::load(w, &format!("{p}.index_k_proj"), d, id, false)?,
                q_norm: Norm::load(w, &format!("{p}.index_q_norm"), kind, id, eps)?,
                k_norm: Norm::load(w, &format!("{p}.index_k_norm"), kind, id, eps)?,
                rope: Rope::initialize(
                    rotary.min(id),
                    a.rope_theta,
                    false,
                    a.rope_parameters.as_ref(),
                    Some(a.max_position_embeddings),
                )?,
                n_heads: ih,
                head_dim: id,
                block_size,
                topk_blocks,
                local_blocks: a.index_local_blocks,
            })
        } else {
            None
        };
        Ok(Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            qk_norm,
            rope,
            heads: h,
            kv_heads: kv,
            head_dim: hd,
            scale: f64::from(hd).powf(-0.5) as f32,
            indexer,
        })
    }

    /// `_block_mask`: the boolean mask keeping each query's top-k key blocks (and its local
    /// ones), or `mask` unchanged when every block fits the budget.
    fn block_mask(
        &self,
        ix: &Indexer,
        x: &Array,
        mask: &AttentionMask,
        offset: usize,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<AttentionMask> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let (h, d) = (ix.n_heads, ix.head_dim);
        let k = ix.k_proj.forward(x)?.reshape(&[b, l, 1, d])?;
        let k = ix.k_norm.forward(&k)?.transpose(&[0, 2, 1, 3])?;
        let mut k = ix.rope.forward(&k, offset)?;
        if let Some(c) = cache {
            let empty = ops::zeros(&[b, 1, l, 0], k.dtype(), None)?;
            k = match c.update_and_fetch(&k, &empty)? {
                mlx_cache::Kv::Dense { keys, .. } => keys,
                mlx_cache::Kv::Quantized { .. } => {
                    return Err(ModelError::Cache {
                        what: "minimax_m3_vl block indexer".into(),
                        problem: "does not support a quantized cache".into(),
                    })
                }
            };
        }
        let bs = ix.block_size;
        let s = k.shape()[2];
        let (full_blocks, tail) = (s / bs, s % bs);
        let n_blocks = full_blocks + i32::from(tail > 0);
        if ix.topk_blocks >= n_blocks {
            return Ok(mask.clone());
        }
        let q = ix.q_proj.forward(x)?.reshape(&[b, l, h, d])?;
        let q = ix.q_norm.forward(&q)?.transpose(&[0, 2, 1, 3])?;
        let q = ix.rope.forward(&q, offset)?;
        let qpos = ops::arange(f64::from(s - l), f64::from(s), 1.0, Dtype::Int32, None)?;
        let causal = ops::less_equal(
            &ops::arange(0.0, f64::from(s), 1.0, Dtype::Int32, None)?.expand_dims(&[0])?,
            &qpos.expand_dims(&[1])?,
            None,
        )?;
        let scores = ops::matmul(
            &q.astype(Dtype::Float32)?,
            &ops::swapaxes(&k.astype(Dtype::Float32)?, -1, -2, None)?,
            None,
        )?;
        let per_key = match mask {
            AttentionMask::Array(m) => m.clone(),
            _ => causal,
        };
        let scores = ops::where_scalar(&per_key, &scores, f32::NEG_INFINITY, None)?;
        let split = full_blocks * bs;
        let mut block_scores = ops::max(
            &ops::slice_axis(&scores, -1, 0, split, None)?.reshape(&[b, h, l, full_blocks, bs])?,
            &[-1],
            false,
            None,
        )?;
        if tail > 0 {
            let t = ops::max(
                &ops::slice_axis(&scores, -1, split, s, None)?,
                &[-1],
                true,
                None,
            )?;
            block_scores = ops::concatenate(&[&block_scores, &t], -1, None)?;
        }
        if ix.local_blocks > 0 {
            let q_block = ops::floor_divide_scalar(&qpos, bs, None)?.expand_dims(&[1])?;
            let ids = ops::arange(0.0, f64::from(n_blocks), 1.0, Dtype::Int32, None)?;
            let is_local = ops::logical_and(
                &ops::less_equal(&ids, &q_block, None)?,
                &ops::greater(
                    &ids,
                    &ops::subtract_scalar(&q_block, ix.local_blocks, None)?,
                    None,
                )?,
                None,
            )?;
            block_scores = ops::where_(
                &is_local,
                &Scalar::Float(f32::INFINITY).to_array_like(block_scores.dtype())?,
                &block_scores,
                None,
            )?;
        }
        let inds = lower_top_k(&block_scores, ix.topk_blocks)?;
        let keep = ops::put_along_axis(
            &ops::zeros(&block_scores.shape(), Dtype::Bool, None)?,
            &inds,
            &Array::from_int(1, Dtype::Bool)?,
            -1,
            None,
        )?;
        let keep = ops::slice_axis(&ops::repeat(&keep, bs, -1, None)?, -1, 0, s, None)?;
        let keep = ops::logical_and(&keep, &per_key, None)?;
        Ok(AttentionMask::Array(ops::repeat(
            &keep,
            self.heads / h,
            1,
            None,
        )?))
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let mut subs: Option<&mut [Box<dyn Cache>]> = match cache {
            Some(c) => Some(
                c.as_any_mut()
                    .downcast_mut::<CacheList>()
                    .ok_or_else(|| ModelError::Cache {
                        what: "minimax_m3_vl layers".into(),
                        problem: "need a CacheList cache".into(),
                    })?
                    .caches_mut(),
            ),
            None => None,
        };
        let offset = subs
            .as_deref()
            .and_then(|s| s.first())
            .map_or(0, |c| c.offset());
        let heads = |y: &Array, n: i32| -> Result<Array> {
            Ok(y.reshape(&[b, l, n, self.head_dim])?
                .transpose(&[0, 2, 1, 3])?)
        };
        let mut q = heads(&self.q_proj.forward(x)?, self.heads)?;
        let mut k = heads(&self.k_proj.forward(x)?, self.kv_heads)?;
        let v = heads(&self.v_proj.forward(x)?, self.kv_heads)?;
        if let Some((qn, kn)) = &self.qk_norm {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        let mask = match &self.indexer {
            Some(ix) => {
                let index_cache = subs.as_deref_mut().and_then(|s| s.get_mut(1));
                self.block_mask(ix, x, mask, offset, index_cache)?
            }
            None => mask.clone(),
        };
        let kv = kit::cached_kv(subs.and_then(|s| s.get_mut(0)), k, v)?;
        let out = scaled_dot_product_attention(&q, &kv, self.scale, &mask, None)?;
        self.o_proj.forward(&kit::merge_heads(&out)?)
    }
}

/// `DenseMLP` with the GPT-OSS SwiGLU, `down(swiglu_oai(gate(x), up(x)))`, its projections
/// loaded in its declaration order (gate, up, down).
fn dense_mlp(w: &mut Weights, p: &str, d: i32, h: i32) -> Result<Mlp> {
    let mut l = |n: &str, i: i32, o: i32| Linear::load(w, &format!("{p}.{n}"), i, o, false);
    let gate = l("gate_proj", d, h)?;
    let up = l("up_proj", d, h)?;
    let down = l("down_proj", h, d)?;
    Ok(Mlp::from_linears(MlpKind::SwiGluOai, gate, up, down, 0.0))
}

#[derive(Clone)]
struct Layer {
    self_attn: Attention,
    ffn: Ffn,
    input_layernorm: Norm,
    post_attention_layernorm: Norm,
}

/// The MiniMax M3 text model.
pub struct Model {
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: Norm,
    lm_head: Option<Linear>,
    /// Pipeline stage `(rank, size)` after [`Model::shard_pipeline`].
    pipeline: Option<(i32, i32)>,
}

/// mlx-lm's `sanitize` of the text weights (`language_model.` prefixed).
fn sanitize(a: &TextArgs, w: &mut Weights) -> Result<()> {
    for prefix in [
        "vision_tower.",
        "multi_modal_projector.",
        "patch_merge_mlp.",
    ] {
        w.discard_prefix(prefix);
    }
    if a.tie_word_embeddings {
        w.discard("language_model.lm_head.weight");
    }
    if let Some(k) = w
        .names()
        .into_iter()
        .find(|k| k.ends_with(".weight_scale_inv"))
    {
        return Err(ModelError::Weights(vec![format!(
            "{k}: MXFP8 checkpoints are not read yet; convert the model with mlx_lm.convert first"
        )]));
    }
    let n = a.num_local_experts;
    let parts = ["weight", "scales", "biases"];
    for i in 0..a.num_hidden_layers {
        let moe = format!("language_model.model.layers.{i}.block_sparse_moe");
        // A dense layer's MLP kept under block_sparse_moe.
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            if !w.contains(&format!("{moe}.{proj}.weight")) {
                continue;
            }
            for part in parts {
                if let Some(v) = w.remove(&format!("{moe}.{proj}.{part}")) {
                    w.insert(
                        format!("language_model.model.layers.{i}.mlp.{proj}.{part}"),
                        v,
                    );
                }
            }
        }
        // The shared expert folded in as expert n.
        for proj in ["gate_up_proj", "gate_proj", "up_proj", "down_proj"] {
            let key = format!("{moe}.switch_mlp.{proj}.weight");
            if w.shape_of(&key).and_then(|s| s.first().copied()) != Some(n + 1) {
                continue;
            }
            for part in parts {
                if let Some(v) = w.remove(&format!("{moe}.switch_mlp.{proj}.{part}")) {
                    let experts =
                        ops::contiguous(&ops::slice_axis(&v, 0, 0, n, None)?, false, None)?;
                    let shared = ops::contiguous(
                        &ops::squeeze(&ops::slice_axis(&v, 0, n, n + 1, None)?, &[0], None)?,
                        false,
                        None,
                    )?;
                    w.insert(format!("{moe}.switch_mlp.{proj}.{part}"), experts);
                    w.insert(format!("{moe}.shared_experts.{proj}.{part}"), shared);
                }
            }
        }
        for owner in [format!("{moe}.switch_mlp"), format!("{moe}.shared_experts")] {
            for part in parts {
                if let Some(fused) = w.remove(&format!("{owner}.gate_up_proj.{part}")) {
                    let halves = ops::split_equal(&fused, 2, -2, None)?;
                    if let [gate, up] = halves.as_slice() {
                        w.insert(
                            format!("{owner}.gate_proj.{part}"),
                            ops::contiguous(gate, false, None)?,
                        );
                        w.insert(
                            format!("{owner}.up_proj.{part}"),
                            ops::contiguous(up, false, None)?,
                        );
                    }
                }
            }
        }
        if w.contains(&format!("{moe}.experts.0.w1.weight")) {
            kit::stack_experts(
                w,
                &format!("{moe}.experts"),
                &format!("{moe}.switch_mlp"),
                n,
                &[("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")],
                &parts,
            )?;
        }
    }
    Ok(())
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let text = match config.raw.get("text_config") {
            Some(t @ Value::Object(_)) => t,
            Some(_) => return Err(config_error("field `text_config` must be an object".into())),
            None => return Err(config_error("field `text_config` is missing".into())),
        };
        let mut a: TextArgs = parse_args(text, MT)?;
        a.post_init()?;
        kit::check_positive(
            MT,
            &[
                ("text_config.vocab_size", a.vocab_size),
                ("text_config.hidden_size", a.hidden_size),
                ("text_config.num_hidden_layers", a.num_hidden_layers),
                ("text_config.num_attention_heads", a.num_attention_heads),
                ("text_config.num_key_value_heads", a.num_key_value_heads),
                ("text_config.head_dim", a.head_dim),
            ],
        )?;
        if a.num_attention_heads % a.num_key_value_heads != 0 {
            return Err(config_error(
                "`num_key_value_heads` does not divide `num_attention_heads`".into(),
            ));
        }
        if (a.swiglu_alpha - 1.702).abs() > 0.0 || (a.swiglu_limit - 7.0).abs() > 0.0 {
            return Err(config_error(format!(
                "only the GPT-OSS SwiGLU constants (alpha 1.702, limit 7) are supported, got \
                 alpha {} and limit {}",
                a.swiglu_alpha, a.swiglu_limit
            )));
        }
        sanitize(&a, w)?;
        let kind = if a.use_gemma_norm {
            NormKind::RmsOffset
        } else {
            NormKind::Rms
        };
        let eps = a.rms_norm_eps as f32;
        let d = a.hidden_size;
        let mut layers = Vec::with_capacity(a.num_hidden_layers as usize);
        for i in 0..a.num_hidden_layers as usize {
            let p = format!("language_model.model.layers.{i}");
            let self_attn =
                Attention::load(&a, w, &format!("{p}.self_attn"), a.is_sparse_attn(i)?)?;
            let ffn = if a.is_moe(i)? {
                kit::check_positive(
                    MT,
                    &[
                        ("text_config.num_local_experts", a.num_local_experts),
                        ("text_config.num_experts_per_tok", a.num_experts_per_tok),
                    ],
                )?;
                if a.num_experts_per_tok > a.num_local_experts {
                    return Err(config_error(format!(
                        "`num_experts_per_tok` {} exceeds `num_local_experts` {}",
                        a.num_experts_per_tok, a.num_local_experts
                    )));
                }
                let m = format!("{p}.block_sparse_moe");
                // `SparseMoeBlock` declares gate, e_score_correction_bias, switch_mlp,
                // shared_experts.
                let gate = Linear::load(w, &format!("{m}.gate"), d, a.num_local_experts, false)?;
                let bias = w.take(
                    &format!("{m}.e_score_correction_bias"),
                    &[a.num_local_experts],
                )?;
                let experts = SwitchGlu::load(
                    w,
                    &format!("{m}.switch_mlp"),
                    d,
                    a.intermediate_size,
                    a.num_local_experts,
                    false,
                    SwitchActivation::SwiGluOai,
                )?;
                let shared = dense_mlp(
                    w,
                    &format!("{m}.shared_experts"),
                    d,
                    a.shared_intermediate_size,
                )?;
                Ffn::Sparse(Box::new(SparseMoe::from_parts(MoeParts {
                    top_k: a.num_experts_per_tok,
                    router: Router::SigmoidCorrectedScaled {
                        norm_topk_prob: true,
                        routed_scaling_factor: a.routed_scaling_factor,
                        cast_weights: true,
                    },
                    gate,
                    experts,
                    names: ["gate", "switch_mlp"],
                    correction_bias: Some(("e_score_correction_bias", bias)),
                    plain_shared: Some(("shared_experts", shared)),
                    flatten: true,
                })))
            } else {
                Ffn::Dense(dense_mlp(
                    w,
                    &format!("{p}.mlp"),
                    d,
                    a.dense_intermediate_size,
                )?)
            };
            layers.push(Layer {
                self_attn,
                ffn,
                input_layernorm: Norm::load(w, &format!("{p}.input_layernorm"), kind, d, eps)?,
                post_attention_layernorm: Norm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    kind,
                    d,
                    eps,
                )?,
            });
        }
        let embed_tokens =
            Embedding::load(w, "language_model.model.embed_tokens", a.vocab_size, d)?;
        let norm = Norm::load(w, "language_model.model.norm", kind, d, eps)?;
        let lm_head = if a.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(
                w,
                "language_model.lm_head",
                d,
                a.vocab_size,
                false,
            )?)
        };
        Ok(Model {
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            norm,
            lm_head,
            pipeline: None,
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut h = self.embed_tokens.forward(inputs)?;
        let mut caches = caches;
        // create_attention_mask(h, cache[0][0]).
        let mask = match caches.as_deref().and_then(|c| c.first()) {
            Some(c) => match c.as_any().downcast_ref::<CacheList>() {
                Some(list) => match list.caches().first() {
                    Some(first) => first.make_mask(n, None, false)?,
                    None => mlx_cache::mask::fallback_mask(n, None, false)?,
                },
                None => {
                    return Err(ModelError::Cache {
                        what: "minimax_m3_vl layers".into(),
                        problem: "need a CacheList cache".into(),
                    })
                }
            },
            None => mlx_cache::mask::fallback_mask(n, None, false)?,
        };
        h = crate::shard::pipeline_recv(h, self.pipeline)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let r = layer
                .self_attn
                .forward(&layer.input_layernorm.forward(&h)?, &mask, cache)?;
            let r = (&h + &r)?;
            let x = layer.post_attention_layernorm.forward(&r)?;
            let f = layer.ffn.forward(&x)?;
            h = (&r + &f)?;
        }
        h = crate::shard::pipeline_send(h, self.pipeline, caches.and_then(|c| c.last_mut()))?;
        self.norm.forward(&h)
    }

    /// Tensor parallelism as minimax_m3_vl.py's `shard()`: q, k, v all-to-sharded, o
    /// sharded-to-all, heads and KV heads / N; on sparse layers the index queries
    /// all-to-sharded and the index heads / N (each serves one KV group); MoE blocks with the
    /// experts and the shared experts split in place and one sum; dense MLPs as llama's.
    /// Every layer's head counts are checked before the first split, as mlx-lm checks each
    /// layer's before touching it.
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all, switch_inplace};
        let par = |what: String, problem: String| ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what,
            problem,
        };
        if size < 1 || rank < 0 || rank >= size {
            return Err(par(
                format!("rank {rank}"),
                format!("not a rank of a group of {size}"),
            ));
        }
        for (i, l) in self.layers.iter().enumerate() {
            let a = &l.self_attn;
            let mut heads = vec![a.heads, a.kv_heads];
            heads.extend(a.indexer.as_ref().map(|ix| ix.n_heads));
            if heads.iter().any(|h| h % size != 0) {
                return Err(par(
                    format!("language_model.model.layers.{i}.self_attn"),
                    format!(
                        "head counts {heads:?} are not all divisible by {size} ranks (is the \
                         model already sharded?)"
                    ),
                ));
            }
        }
        // gate and up all-to-sharded, down sharded-to-all (in place under a block's sum).
        let shard_mlp = |m: &mut Mlp, path: &str, in_place: bool| -> Result<()> {
            crate::shard::shard_mlp(m, size, rank, path, in_place)
        };
        for (i, l) in self.layers.iter_mut().enumerate() {
            let p = |s: &str| format!("language_model.model.layers.{i}.{s}");
            let a = &mut l.self_attn;
            all_to_sharded(&mut a.q_proj, size, rank, &p("self_attn.q_proj"))?;
            all_to_sharded(&mut a.k_proj, size, rank, &p("self_attn.k_proj"))?;
            all_to_sharded(&mut a.v_proj, size, rank, &p("self_attn.v_proj"))?;
            sharded_to_all(&mut a.o_proj, size, rank, &p("self_attn.o_proj"))?;
            a.heads /= size;
            a.kv_heads /= size;
            if let Some(ix) = a.indexer.as_mut() {
                all_to_sharded(&mut ix.q_proj, size, rank, &p("self_attn.index_q_proj"))?;
                ix.n_heads /= size;
            }
            match &mut l.ffn {
                Ffn::Sparse(m) => {
                    let e = &mut m.switch_mlp;
                    let w = |n: &str| p(&format!("block_sparse_moe.switch_mlp.{n}"));
                    switch_inplace(&mut e.gate_proj, true, size, rank, &w("gate_proj"))?;
                    switch_inplace(&mut e.up_proj, true, size, rank, &w("up_proj"))?;
                    switch_inplace(&mut e.down_proj, false, size, rank, &w("down_proj"))?;
                    if let Some(s) = m.plain_shared.as_mut() {
                        shard_mlp(s, &p("block_sparse_moe.shared_experts"), true)?;
                    }
                    m.sharded = true;
                }
                Ffn::Dense(m) => shard_mlp(m, &p("mlp"), false)?,
            }
        }
        Ok(())
    }

    /// Pipeline parallelism as `TextModel.pipeline` (`PipelineMixin`'s even split, see
    /// [`crate::shard::pipeline_range`]): this model keeps its stage's layers; the mask comes
    /// from the stage's first cache, and a stage's send is tied to its last layer's `KVCache`.
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        crate::shard::check_pipeline(MT, &[MT], self.pipeline.is_some())?;
        crate::shard::keep_stage(&mut self.layers, size, rank)?;
        self.pipeline = Some((rank, size));
        Ok(())
    }

    fn head(&self, h: &Array) -> Result<Array> {
        crate::models::project(self.lm_head.as_ref(), &self.embed_tokens, h)
    }
}

impl LanguageModel for Model {
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        let h = self.hidden_states(inputs, caches)?;
        self.head(&h)
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, None))
    }

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::of(
            self.lm_head.as_ref(),
            &self.embed_tokens,
        ))
    }

    fn model_type(&self) -> &str {
        MT
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    kit::layer_caches! {
        /// mlx-lm's `make_cache`: a `CacheList` of a `KVCache`, and on sparse layers a second
        /// one for the index keys.
        fn make_cache(&self) {
            self.layers
                .iter()
                .map(|l| -> Box<dyn Cache> {
                    let mut caches: Vec<Box<dyn Cache>> = vec![Box::new(KVCache::new())];
                    if l.self_attn.indexer.is_some() {
                        caches.push(Box::new(KVCache::new()));
                    }
                    Box::new(CacheList::new(caches))
                })
                .collect()
        }
    }

    fn as_trainable_mut(&mut self) -> Option<&mut dyn super::Trainable> {
        Some(self)
    }
}

impl super::Trainable for Model {
    fn layers_path(&self) -> String {
        "language_model.model.layers".into()
    }
}
