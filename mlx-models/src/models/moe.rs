//! The sparse mixture-of-experts decoders of mlx-lm 0.32.2 that differ only in knobs:
//! `models/mixtral.py`, `qwen2_moe.py`, `qwen3_moe.py` and `olmoe.py`. Each row reads its
//! `ModelArgs` with mlx-lm's names and defaults and becomes a [`MoeSpec`] (the rows are in
//! `moe/rows.rs`); the attention and the model are written once here, the router, experts
//! (one `SwitchGlu`) and optional shared expert once in the block the ports share
//! (`moe_block.rs`), in each file's op order.

use mlx_cache::{AttentionMask, Cache, KVCache, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{
    join, Embedding, LayerParam, Linear, LinearMut, Mlp, MlpKind, Norm, NormKind, RmsNorm, Rope,
    RopeScaling, SwitchActivation, Walk, Walkable,
};
use crate::models::checkpoint::{layer_stack, LayerArrays};
pub(crate) use crate::models::kit::{Attention, AttentionSpec};
use crate::models::moe_block::Ffn;
pub use crate::models::moe_block::{BlockExtras, Router, SparseMoe, SparseMoeParams};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

mod rows;

/// Where the attention's q/k RMS norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over each head (`head_dim`), after the reshape (qwen3_moe).
    PerHead,
    /// Over all heads (`n_heads * head_dim`), before the reshape (olmoe).
    Full,
    /// Over each head, after the rope (hunyuan).
    AfterRope,
    /// Over each head, after the heads move before the positions (bailing_moe_linear's
    /// global layers; a norm of the transposed layout).
    PerHeadTransposed,
}

/// What a row fixes about the family.
#[derive(Clone, Debug)]
pub struct MoeSpec {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub vocab_size: i32,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    // attention
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: QkNorm,
    pub rope_theta: f64,
    pub rope_traditional: bool,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: Option<i64>,
    // experts
    pub num_experts: i32,
    pub top_k: i32,
    pub moe_intermediate_size: i32,
    pub expert_bias: bool,
    pub router: Router,
    /// Shared expert width (qwen2_moe), gated by `sigmoid(shared_expert_gate(x))`.
    pub shared_expert_intermediate_size: Option<i32>,
    /// Layers with a dense MLP of this width instead of experts (qwen3_moe's
    /// `mlp_only_layers` and `decoder_sparse_step`).
    pub dense_layers: Vec<bool>,
    pub intermediate_size: i32,
    /// Module name of the expert block: `mlp` or mixtral's `block_sparse_moe`.
    pub moe_module: &'static str,
    /// `sanitize` drops `lm_head.weight` when tied (qwen3_moe, mixtral; olmoe does not).
    pub drops_tied_head: bool,
    /// gpt_oss: attention sinks, biased router `router`, experts `experts` with biases and
    /// the clamped SwiGLU.
    pub attn_sinks: bool,
    pub moe_names: [&'static str; 2],
    pub router_bias: bool,
    pub activation: SwitchActivation,
    /// Per layer: sliding-window attention (a `RotatingKVCache` of `sliding_window`).
    pub sliding: Vec<bool>,
    pub sliding_window: Option<usize>,
    /// What only the later rows use (granitemoe's multipliers, minimax's partial rope, ernie's
    /// biases and plain shared experts).
    pub extras: MoeExtras,
}

/// The knobs of the later rows (`goldens_moe2.py`'s types); the defaults are the first rows'.
#[derive(Clone, Debug, Default)]
pub struct MoeExtras {
    /// granitemoe: `embed_tokens(x) * embedding_multiplier`.
    pub embedding_multiplier: Option<f32>,
    /// granitemoe: `x + r * residual_multiplier` around attention and experts.
    pub residual_multiplier: Option<f32>,
    /// granitemoe: `logits / logits_scaling`.
    pub logits_scaling: Option<f32>,
    /// granitemoe: the attention scale is `attention_multiplier`.
    pub attention_scale: Option<f32>,
    /// minimax: rope over the first `rotary_dim` dimensions of each head.
    pub rope_dims: Option<i32>,
    /// ernie4_5_moe: biases on the dense MLP layers.
    pub dense_bias: bool,
    /// phimoe: `nn.LayerNorm` (with bias) for every norm instead of `nn.RMSNorm`.
    pub layer_norm: bool,
    /// phimoe: the `lm_head` has a bias.
    pub lm_head_bias: bool,
    /// phimoe: the rotary embedding, built by the row (`SuScaledRoPE` with its mscale).
    pub rope: Option<Rope>,
    /// hunyuan: the attention's module names (output projection, q norm, k norm).
    pub attn_names: Option<[&'static str; 3]>,
    /// hunyuan's cross-layer attention (`use_cla`): only layers `i % factor == 0` project
    /// keys and values; the others take the last ones projected.
    pub cla_share_factor: Option<i32>,
    /// hunyuan: per layer (when its config lists them), the experts' `top_k`, their width and
    /// the shared MLP's width.
    pub layer_moe: Vec<(i32, i32, Option<i32>)>,
    /// mellum: each layer's rotary embedding (by its layer type's `rope_parameters`).
    pub layer_ropes: Vec<Rope>,
    /// mellum defines `make_cache` whatever its layer types.
    pub defines_make_cache: bool,
    /// exaone_moe: layers whose attention skips the rope.
    pub no_rope: Vec<bool>,
    /// bailing_moe: the fused query/key/value projection's name (`query_key_value`).
    pub fused_qkv: Option<&'static str>,
    /// bailing_moe: the attention module's name (`attention`; `self_attn` when `None`).
    pub attn_module: Option<&'static str>,
    /// bailing_moe: the embedding's path (`model.word_embeddings`; `model.embed_tokens`).
    pub embed_name: Option<&'static str>,
    /// afmoe: the attention's sigmoid output gate (`gate_proj`).
    pub attn_gate: bool,
    /// laguna: the attention's per-head softplus gate (`g_proj`).
    pub head_gate: bool,
    /// laguna: each layer's number of query heads.
    pub layer_heads: Vec<i32>,
    /// afmoe: `post_attention_layernorm` normalizes the attention's output, and
    /// `pre_mlp_layernorm` / `post_mlp_layernorm` surround the feed-forward block.
    pub sandwich_norms: bool,
    /// bailing_moe's `norm_head`: `sanitize` divides the head's columns by their float32 L2
    /// norm + 1e-7.
    pub norm_head: bool,
    /// The block's extras (see [`BlockExtras`]).
    pub block: BlockExtras,
}

fn head_dim_of(hidden: i32, heads: i32) -> Result<i32> {
    if heads <= 0 || hidden % heads != 0 {
        return Err(ModelError::Config(format!(
            "hidden_size {hidden} must divide by num_attention_heads {heads}"
        )));
    }
    Ok(hidden / heads)
}

/// A row's attention ([`kit::Attention`] from the row's [`MoeSpec`]).
impl Attention {
    fn from_row(s: &MoeSpec, w: &mut Weights, path: &str, kv_proj: bool) -> Result<Attention> {
        let spec = AttentionSpec {
            hidden_size: s.hidden_size,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
            qkv_bias: s.qkv_bias,
            o_bias: s.o_bias,
            qk_norm: s.qk_norm,
            eps: s.rms_norm_eps,
            rope: Rope::initialize(
                s.extras.rope_dims.unwrap_or(s.head_dim),
                s.rope_theta,
                s.rope_traditional,
                s.rope_scaling.as_ref(),
                s.max_position_embeddings,
            )?,
            names: s
                .extras
                .attn_names
                .unwrap_or(["o_proj", "q_norm", "k_norm"]),
            sinks: s.attn_sinks,
            inv_sqrt_scale: s.attn_sinks,
        };
        let mut a = Attention::new_with(spec, w, path, kv_proj, s.extras.fused_qkv)?;
        if let Some(scale) = s.extras.attention_scale {
            a = a.with_scale(scale);
        }
        if let Some(rope) = &s.extras.rope {
            a.rope = Some(rope.clone());
        }
        Ok(a)
    }
}

/// The expert block of a row (`moe_block::SparseMoe`, from the row's [`MoeSpec`]).
impl SparseMoe {
    fn load(s: &MoeSpec, w: &mut Weights, path: &str) -> Result<SparseMoe> {
        SparseMoe::load_with(
            w,
            path,
            &s.extras.block,
            &SparseMoeParams {
                hidden_size: s.hidden_size,
                num_experts: s.num_experts,
                top_k: s.top_k,
                moe_intermediate_size: s.moe_intermediate_size,
                expert_bias: s.expert_bias,
                router: s.router,
                shared_expert_intermediate_size: s.shared_expert_intermediate_size,
                names: s.moe_names,
                router_bias: s.router_bias,
                activation: s.activation,
            },
        )
    }
}

pub(crate) use super::kit::check_inputs;

#[derive(Clone)]
struct DecoderLayer {
    self_attn: Attention,
    ffn: Ffn,
    input_layernorm: Norm,
    post_attention_layernorm: Norm,
    /// granitemoe's `residual_multiplier` ([`MoeExtras::residual_multiplier`]).
    residual_multiplier: Option<f32>,
    /// The attention's module name ([`MoeExtras::attn_module`]).
    attn_module: &'static str,
    /// afmoe's `pre_mlp_layernorm` and `post_mlp_layernorm` ([`MoeExtras::sandwich_norms`]).
    mlp_norms: Option<(Norm, Norm)>,
}

impl DecoderLayer {
    /// Walks the attention, the feed-forward block (module name `ffn`) and the norms.
    fn walk<'a>(&'a mut self, path: &str, ffn: &str, w: &mut Walk<'a>) {
        let DecoderLayer {
            self_attn,
            ffn: block,
            input_layernorm,
            post_attention_layernorm,
            attn_module,
            mlp_norms,
            ..
        } = self;
        self_attn.walk(&join(path, attn_module), w);
        block.walk(&join(path, ffn), w);
        w.norm(&join(path, "input_layernorm"), input_layernorm);
        w.norm(
            &join(path, "post_attention_layernorm"),
            post_attention_layernorm,
        );
        if let Some((pre, post)) = mlp_norms {
            w.norm(&join(path, "pre_mlp_layernorm"), pre);
            w.norm(&join(path, "post_mlp_layernorm"), post);
        }
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        Ok(self.forward_shared(x, mask, cache, None)?.0)
    }

    /// [`DecoderLayer::forward`] with hunyuan's shared keys and values (taken when the
    /// attention has no projections of its own; the ones used are returned).
    fn forward_shared(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
        shared: Option<&(Array, Array)>,
    ) -> Result<(Array, (Array, Array))> {
        let scaled = |r: Array| -> Result<Array> {
            match self.residual_multiplier {
                Some(m) => Ok((&r * m)?),
                None => Ok(r),
            }
        };
        let shared = if self.self_attn.k_proj.is_some() {
            None
        } else {
            shared
        };
        let (r, kv) = self.self_attn.forward_shared(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            shared,
        )?;
        if let Some((pre, post)) = &self.mlp_norms {
            let r = self.post_attention_layernorm.forward(&r)?;
            let h = (x + &r)?;
            let r = post.forward(&self.ffn.forward(&pre.forward(&h)?)?)?;
            return Ok(((&h + &r)?, kv));
        }
        let h = (x + &scaled(r)?)?;
        let n = self.post_attention_layernorm.forward(&h)?;
        let r = self.ffn.forward(&n)?;
        Ok(((&h + &scaled(r)?)?, kv))
    }
}

impl Walkable for DecoderLayer {
    /// The checkpoints' walk (the names are not used there).
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        DecoderLayer::walk(self, path, "ffn", w);
    }
}

impl LayerArrays for DecoderLayer {}

/// A mixture-of-experts decoder (mixtral, qwen2_moe, qwen3_moe, olmoe).
pub struct Model {
    spec: MoeSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: Norm,
    lm_head: Option<Linear>,
    /// First full-attention and first sliding-window layer (whose caches make the masks).
    fa_idx: usize,
    swa_idx: Option<usize>,
    /// `--grad-checkpoint`: every layer under `mx.checkpoint` (training, no caches).
    grad_checkpoint: bool,
    /// The layers whose own arrays enter their checkpoints (full fine-tuning).
    checkpoint_own: std::ops::Range<usize>,
    /// This rank's pipeline stage `(rank, size)` after [`Model::shard_pipeline`].
    pipeline: Option<(i32, i32)>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let spec = MoeSpec::from_config(config)?;
        sanitize(&spec, w)?;
        let eps = spec.rms_norm_eps;
        let dim = spec.hidden_size;
        let kind = if spec.extras.layer_norm {
            NormKind::Layer { bias: true }
        } else {
            NormKind::Rms
        };
        let embed_name = spec.extras.embed_name.unwrap_or("model.embed_tokens");
        let attn_module = spec.extras.attn_module.unwrap_or("self_attn");
        let embed_tokens = Embedding::load(w, embed_name, spec.vocab_size, dim)?;
        let mut layers = Vec::with_capacity(spec.num_hidden_layers as usize);
        for (i, dense) in spec.dense_layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let ffn = if *dense {
                Ffn::Dense(Mlp::load(
                    w,
                    &format!("{p}.mlp"),
                    &crate::layers::MlpNames::LLAMA,
                    dim,
                    spec.intermediate_size,
                    spec.extras.dense_bias,
                    spec.extras.dense_bias,
                    MlpKind::SwiGlu,
                )?)
            } else if let Some(&(top_k, width, shared)) = spec.extras.layer_moe.get(i) {
                let mut layer_spec = spec.clone();
                layer_spec.top_k = top_k;
                layer_spec.moe_intermediate_size = width;
                layer_spec.extras.block.plain_shared = shared.map(|h| (h, false));
                Ffn::Sparse(Box::new(SparseMoe::load(
                    &layer_spec,
                    w,
                    &format!("{p}.{}", spec.moe_module),
                )?))
            } else {
                Ffn::Sparse(Box::new(SparseMoe::load(
                    &spec,
                    w,
                    &format!("{p}.{}", spec.moe_module),
                )?))
            };
            let kv_proj = spec
                .extras
                .cla_share_factor
                .is_none_or(|f| i as i32 % f == 0);
            let mut self_attn = match spec.extras.layer_heads.get(i) {
                Some(&heads) => {
                    let mut layer_spec = spec.clone();
                    layer_spec.n_heads = heads;
                    Attention::from_row(&layer_spec, w, &format!("{p}.{attn_module}"), kv_proj)?
                }
                None => Attention::from_row(&spec, w, &format!("{p}.{attn_module}"), kv_proj)?,
            };
            if spec.extras.head_gate {
                let at = format!("{p}.{attn_module}");
                self_attn = self_attn.with_head_gate(w, &at, dim, kit::HeadGate::Softplus)?;
            }
            if let Some(rope) = spec.extras.layer_ropes.get(i) {
                self_attn.rope = Some(rope.clone());
            }
            if spec.extras.no_rope.get(i).copied().unwrap_or(false) {
                self_attn.rope = None;
            }
            if spec.extras.attn_gate {
                self_attn.out_gate = Some(Linear::load(
                    w,
                    &format!("{p}.{attn_module}.gate_proj"),
                    dim,
                    spec.n_heads * spec.head_dim,
                    false,
                )?);
            }
            layers.push(DecoderLayer {
                self_attn,
                ffn,
                input_layernorm: Norm::load(w, &format!("{p}.input_layernorm"), kind, dim, eps)?,
                post_attention_layernorm: Norm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    kind,
                    dim,
                    eps,
                )?,
                residual_multiplier: spec.extras.residual_multiplier,
                attn_module,
                mlp_norms: if spec.extras.sandwich_norms {
                    Some((
                        Norm::load(w, &format!("{p}.pre_mlp_layernorm"), kind, dim, eps)?,
                        Norm::load(w, &format!("{p}.post_mlp_layernorm"), kind, dim, eps)?,
                    ))
                } else {
                    None
                },
            });
        }
        let norm = Norm::load(w, "model.norm", kind, dim, eps)?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(
                w,
                "lm_head",
                dim,
                spec.vocab_size,
                spec.extras.lm_head_bias,
            )?)
        };
        let sliding = |i: usize| spec.sliding.get(i).copied().unwrap_or(false);
        let fa_idx = (0..layers.len()).find(|&i| !sliding(i)).unwrap_or(0);
        let swa_idx = (0..layers.len()).find(|&i| sliding(i));
        Ok(Model {
            spec,
            embed_tokens,
            layers,
            norm,
            lm_head,
            fa_idx,
            swa_idx,
            grad_checkpoint: false,
            checkpoint_own: 0..0,
            pipeline: None,
        })
    }
}

impl Model {
    fn is_sliding(&self, i: usize) -> bool {
        self.spec.sliding.get(i).copied().unwrap_or(false)
    }
}

/// One layer of a [`Model`] as read-only parts, for decoders that run the model's own arrays
/// (mlx-engine's graph decoder): [`Model::layer_view`].
pub struct MoeLayerView<'a> {
    pub input_norm: &'a Norm,
    pub post_attention_norm: &'a Norm,
    pub q: &'a Linear,
    /// `None` on a layer that takes another layer's keys and values, or fuses them into `q`.
    pub k: Option<&'a Linear>,
    pub v: Option<&'a Linear>,
    pub o: &'a Linear,
    /// Per-head q/k norms ([`QkNorm::PerHead`]); other placements are named in `other`.
    pub q_norm: Option<&'a RmsNorm>,
    pub k_norm: Option<&'a RmsNorm>,
    /// The rotary embedding (`None`: the layer skips it).
    pub rope: Option<&'a Rope>,
    /// The attention's softmax scale.
    pub scale: f32,
    /// The attention sinks' logits, a head each (gpt_oss; also named in `other`, for
    /// decoders that do not take them).
    pub sinks: Option<&'a Array>,
    /// What the layer has beyond pre-norm attention with separate projections and the
    /// feed-forward block (for messages: attention sinks, a fused projection, gates, sandwich
    /// norms, a residual multiplier, sharded norms, full-width or after-rope q/k norms).
    pub other: Vec<&'static str>,
    pub ffn: MoeFfnView<'a>,
}

/// A layer's feed-forward block ([`MoeLayerView::ffn`]).
pub enum MoeFfnView<'a> {
    /// A dense SwiGLU MLP (qwen3_moe's `mlp_only_layers`).
    Dense(&'a Mlp),
    /// The router, the experts and what the block may add ([`SparseMoe::extras_present`]).
    Sparse(&'a SparseMoe),
}

impl Model {
    /// The row's knobs.
    pub fn spec(&self) -> &MoeSpec {
        &self.spec
    }

    pub fn embed_tokens(&self) -> &Embedding {
        &self.embed_tokens
    }

    /// The untied head (`None`: tied to the embedding).
    pub fn lm_head(&self) -> Option<&Linear> {
        self.lm_head.as_ref()
    }

    pub fn final_norm(&self) -> &Norm {
        &self.norm
    }

    /// Whether this rank holds a pipeline stage or tensor-parallel shards (then its arrays are
    /// not the whole model's).
    pub fn is_sharded(&self) -> bool {
        self.pipeline.is_some()
            || self.layers.iter().any(|l| {
                l.self_attn.sharded_norms.is_some() || matches!(&l.ffn, Ffn::Sparse(m) if m.sharded)
            })
    }

    /// Layer `i`'s parts (`None` past the last layer).
    pub fn layer_view(&self, i: usize) -> Option<MoeLayerView<'_>> {
        let l = self.layers.get(i)?;
        let a = &l.self_attn;
        let mut other = Vec::new();
        for (present, what) in [
            (a.sinks.is_some(), "attention sinks"),
            (a.fused.is_some(), "a fused q/k/v projection"),
            (a.out_gate.is_some(), "an attention output gate"),
            (a.head_gate.is_some(), "a head-wise attention gate"),
            (a.sharded_norms.is_some(), "sharded q/k norms"),
            (l.mlp_norms.is_some(), "sandwich norms"),
            (l.residual_multiplier.is_some(), "a residual multiplier"),
            (a.qk_norm == QkNorm::Full, "q/k norms over all heads"),
            (a.qk_norm == QkNorm::AfterRope, "q/k norms after the rope"),
            (
                a.qk_norm == QkNorm::PerHeadTransposed,
                "per-head q/k norms on the transposed heads",
            ),
        ] {
            if present {
                other.push(what);
            }
        }
        other.extend(a.unusual());
        let per_head = a.qk_norm == QkNorm::PerHead;
        Some(MoeLayerView {
            input_norm: &l.input_layernorm,
            post_attention_norm: &l.post_attention_layernorm,
            q: &a.q_proj,
            k: a.k_proj.as_ref(),
            v: a.v_proj.as_ref(),
            o: &a.o_proj,
            q_norm: a
                .q_norm
                .as_ref()
                .and_then(Norm::as_rms)
                .filter(|_| per_head),
            k_norm: a
                .k_norm
                .as_ref()
                .and_then(Norm::as_rms)
                .filter(|_| per_head),
            rope: a.rope.as_ref(),
            scale: a.scale(),
            sinks: a.sinks.as_ref(),
            other,
            ffn: match &l.ffn {
                Ffn::Dense(m) => MoeFfnView::Dense(m),
                Ffn::Sparse(m) => MoeFfnView::Sparse(m),
            },
        })
    }
}

/// The rows' `sanitize`: drop a tied `lm_head`, and stack per-expert checkpoints
/// (`experts.<e>.<proj>.{weight,scales,biases}`, mixtral's `w1`/`w2`/`w3`) into `switch_mlp`.
fn sanitize(s: &MoeSpec, w: &mut Weights) -> Result<()> {
    if s.attn_sinks {
        return sanitize_gpt_oss(w);
    }
    match s.model_type.as_str() {
        "granitemoe" => return sanitize_granitemoe(s, w),
        "hunyuan" => sanitize_hunyuan(s, w)?,
        "bailing_moe" => sanitize_bailing(s, w)?,
        "laguna" => sanitize_laguna(s, w)?,
        "afmoe" => {
            for k in w.names() {
                if k.contains("rotary_emb.inv_freq") {
                    w.discard(&k);
                }
            }
        }
        "exaone_moe" => {
            for k in w.names() {
                if k.starts_with("mtp.") {
                    w.discard(&k);
                }
            }
            for (l, dense) in s.dense_layers.iter().enumerate() {
                let from = format!("model.layers.{l}.mlp.e_score_correction_bias");
                if *dense {
                    continue;
                }
                if let Some(b) = w.remove(&from) {
                    w.insert(
                        format!("model.layers.{l}.mlp.gate.e_score_correction_bias"),
                        b,
                    );
                }
            }
        }
        "ernie4_5_moe" => {
            const DROPPED: [&str; 5] = [
                "mtp_block.",
                "mtp_linear_proj.",
                "mtp_hidden_norm.",
                "mtp_emb_norm.",
                "e_score_correction_bias",
            ];
            for k in w.names() {
                if DROPPED.iter().any(|p| k.contains(p)) {
                    w.discard(&k);
                }
            }
        }
        _ => {}
    }
    if s.model_type == "minimax" && w.names().iter().any(|k| k.contains("weight_scale_inv")) {
        return Err(ModelError::Weights(vec![
            "minimax: FP8 checkpoints (`weight_scale_inv`) are not supported yet; convert the \
             model with mlx_lm.convert first"
                .into(),
        ]));
    }
    if s.tie_word_embeddings && s.drops_tied_head {
        w.discard("lm_head.weight");
    }
    let names: &[(&str, &str)] = if s.moe_module == "block_sparse_moe" {
        &[("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")]
    } else {
        &[
            ("up_proj", "up_proj"),
            ("down_proj", "down_proj"),
            ("gate_proj", "gate_proj"),
        ]
    };
    for l in 0..s.num_hidden_layers {
        let prefix = format!("model.layers.{l}.{}", s.moe_module);
        kit::stack_experts(
            w,
            &format!("{prefix}.experts"),
            &format!("{prefix}.{}", s.moe_names[1]),
            s.num_experts,
            names,
            &kit::LINEAR_KEYS,
        )?;
    }
    Ok(())
}

/// granitemoe.py `sanitize`: `input_linear` split in two along axis 1 (gate, then up) and
/// `output_linear` renamed to the switch MLP's down projection; a tied `lm_head` dropped. A
/// checkpoint without `model.layers.0.block_sparse_moe.input_linear.weight` is taken as is.
fn sanitize_granitemoe(s: &MoeSpec, w: &mut Weights) -> Result<()> {
    if !w.contains("model.layers.0.block_sparse_moe.input_linear.weight") {
        return Ok(());
    }
    for l in 0..s.num_hidden_layers {
        let prefix = format!("model.layers.{l}.block_sparse_moe");
        let key = format!("{prefix}.input_linear.weight");
        let value = w
            .remove(&key)
            .ok_or_else(|| ModelError::Weights(vec![format!("missing: {key}")]))?;
        let mut parts = ops::split_equal(&value, 2, 1, None)?.into_iter();
        let (Some(gate), Some(up)) = (parts.next(), parts.next()) else {
            return Err(ModelError::Weights(vec![format!(
                "{key}: cannot split in two"
            )]));
        };
        w.insert(format!("{prefix}.switch_mlp.gate_proj.weight"), gate);
        w.insert(format!("{prefix}.switch_mlp.up_proj.weight"), up);
        let key = format!("{prefix}.output_linear.weight");
        let down = w
            .remove(&key)
            .ok_or_else(|| ModelError::Weights(vec![format!("missing: {key}")]))?;
        w.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
    }
    if s.tie_word_embeddings {
        w.discard("lm_head.weight");
    }
    Ok(())
}

/// hunyuan.py `sanitize`'s first part: HF's fused `qkv_proj` (rows grouped per KV head:
/// its query heads, then its key, then its value) and `gate_and_up_proj` (up first) split into
/// the separate projections. Only when `model.layers.0.mlp.gate_and_up_proj.weight` exists.
fn sanitize_hunyuan(s: &MoeSpec, w: &mut Weights) -> Result<()> {
    if !w.contains("model.layers.0.mlp.gate_and_up_proj.weight") {
        return Ok(());
    }
    let groups = s.n_heads / s.n_kv_heads;
    for k in w.names() {
        if k.contains("qkv_proj") {
            let Some(v) = w.remove(&k) else { continue };
            let v = ops::reshape(&v, &[s.n_kv_heads, groups + 2, s.head_dim, -1], None)?;
            let parts = ops::split_at(&v, &[groups, groups + 1], 1, None)?;
            for (name, part) in ["q_proj", "k_proj", "v_proj"].iter().zip(parts) {
                w.insert(
                    k.replace("qkv_proj", name),
                    ops::flatten(&part, 0, 2, None)?,
                );
            }
        } else if k.contains("gate_and_up_proj") {
            let Some(v) = w.remove(&k) else { continue };
            let parts = ops::split_equal(&v, 2, 0, None)?;
            for (name, part) in ["up_proj", "gate_proj"].iter().zip(parts) {
                w.insert(k.replace("gate_and_up_proj", name), part);
            }
        }
    }
    Ok(())
}

/// bailing_moe.py `sanitize`, but the expert stacking (shared): a tied head dropped,
/// `norm_head`'s column normalization, `mlp.gate.{weight,bias}` moved under `gate_proj`.
fn sanitize_bailing(s: &MoeSpec, w: &mut Weights) -> Result<()> {
    if s.tie_word_embeddings {
        w.discard("lm_head.weight");
    }
    if s.extras.norm_head {
        let head = w.remove("lm_head.weight").ok_or_else(|| {
            ModelError::Weights(vec!["bailing_moe: norm_head needs lm_head.weight".into()])
        })?;
        let dtype = head.dtype();
        let f = head.astype(Dtype::Float32)?;
        let norm = ops::sqrt(&ops::sum(&ops::square(&f, None)?, &[0], true, None)?, None)?;
        let norm = (&norm + 1e-7f32)?;
        w.insert("lm_head.weight".into(), (&head / &norm)?.astype(dtype)?);
    }
    for (l, dense) in s.dense_layers.iter().enumerate() {
        if *dense {
            continue;
        }
        let prefix = format!("model.layers.{l}.mlp.gate");
        for k in ["weight", "bias"] {
            if let Some(v) = w.remove(&format!("{prefix}.{k}")) {
                w.insert(format!("{prefix}.gate_proj.{k}"), v);
            }
        }
    }
    Ok(())
}

/// laguna.py `sanitize`, but the expert stacking (shared): a `language_model.` prefix
/// dropped, a tied head dropped, a bare router and `experts.e_score_correction_bias` moved
/// under `gate`.
fn sanitize_laguna(s: &MoeSpec, w: &mut Weights) -> Result<()> {
    let names = w.names();
    if names.iter().any(|k| k.starts_with("language_model.")) {
        for k in names {
            if let Some(rest) = k.strip_prefix("language_model.") {
                if let Some(v) = w.remove(&k) {
                    w.insert(rest.to_string(), v);
                }
            }
        }
    }
    if s.tie_word_embeddings {
        w.discard("lm_head.weight");
    }
    for l in 0..s.num_hidden_layers {
        let prefix = format!("model.layers.{l}.mlp");
        if let Some(v) = w.remove(&format!("{prefix}.gate.weight")) {
            w.insert(format!("{prefix}.gate.proj.weight"), v);
        }
        if let Some(v) = w.remove(&format!("{prefix}.experts.e_score_correction_bias")) {
            w.insert(format!("{prefix}.gate.e_score_correction_bias"), v);
        }
    }
    Ok(())
}

/// gpt_oss.py `sanitize`: HF's interleaved `gate_up_proj` (rows alternate gate, up) split
/// into `gate_proj` / `up_proj`, `*_blocks` (mxfp4 bytes) viewed as uint32 weights,
/// `*_scales` renamed, biases split the same way. A checkpoint with `gate_proj.weight` is
/// already sanitized.
fn sanitize_gpt_oss(w: &mut Weights) -> Result<()> {
    let names = w.names();
    if names.iter().any(|k| k.contains("gate_proj.weight")) {
        return Ok(());
    }
    // `v[..., start::2, :]` (or `v[..., start::2]` for biases) along `axis`.
    let every_other = |v: &Array, axis: i32, start: i32| -> Result<Array> {
        let nd = v.ndim();
        let ax = if axis < 0 { nd as i32 + axis } else { axis } as usize;
        let sh = v.shape();
        let mut lo = vec![0; nd];
        let hi = sh.clone();
        let mut st = vec![1; nd];
        lo[ax] = start;
        st[ax] = 2;
        Ok(ops::contiguous(
            &ops::slice(v, &lo, &hi, &st, None)?,
            false,
            None,
        )?)
    };
    let blocks = |k: &str, v: Array| -> Result<(String, Array)> {
        let mut k = k.to_string();
        let mut v = v;
        if k.contains("_blocks") {
            v = ops::flatten(&ops::view(&v, Dtype::Uint32, None)?, -2, -1, None)?;
            k = k.replace("_blocks", ".weight");
        }
        if k.contains("_scales") {
            k = k.replace("_scales", ".scales");
        }
        Ok((k, v))
    };
    for k in names {
        let Some(v) = w.remove(&k) else { continue };
        if k.contains("gate_up_proj") && !k.contains("bias") {
            let (k, v) = blocks(&k, v)?;
            w.insert(
                k.replace("gate_up_proj", "gate_proj"),
                every_other(&v, -2, 0)?,
            );
            w.insert(
                k.replace("gate_up_proj", "up_proj"),
                every_other(&v, -2, 1)?,
            );
        } else if k.contains("down_proj") && !k.contains("bias") {
            let (k, v) = blocks(&k, v)?;
            w.insert(k, v);
        } else if k.contains("gate_up_proj_bias") {
            w.insert(
                k.replace("gate_up_proj_bias", "gate_proj.bias"),
                every_other(&v, -1, 0)?,
            );
            w.insert(
                k.replace("gate_up_proj_bias", "up_proj.bias"),
                every_other(&v, -1, 1)?,
            );
        } else if k.contains("down_proj_bias") {
            w.insert(k.replace("down_proj_bias", "down_proj.bias"), v);
        } else {
            w.insert(k, v);
        }
    }
    Ok(())
}

impl Model {
    /// The final normed hidden states `(batch, seq, hidden)` (the inner model's output, before
    /// the output head).
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        crate::models::moe::check_inputs(inputs)?;
        let mut h = self.embed_tokens.forward(inputs)?;
        if let Some(m) = self.spec.extras.embedding_multiplier {
            h = (&h * m)?;
        }
        let n = h.shape().get(1).copied().unwrap_or(0) as usize;
        let mut caches = caches;
        let (mask, swa_mask) = match caches.as_deref_mut() {
            Some(caches) => {
                kit::check_caches(Some(&*caches), self.layers.len(), "layers")?;
                let mask = caches[self.fa_idx].make_mask(n, None, false)?;
                let swa_mask = match self.swa_idx {
                    Some(i) => Some(caches[i].make_mask(n, self.spec.sliding_window, false)?),
                    None => None,
                };
                (mask, swa_mask)
            }
            None => (
                mlx_cache::mask::fallback_mask(n, None, false)?,
                Some(mlx_cache::mask::fallback_mask(
                    n,
                    self.spec.sliding_window,
                    false,
                )?),
            ),
        };
        let cla = self.spec.extras.cla_share_factor.is_some();
        if cla && self.grad_checkpoint {
            return Err(ModelError::Unsupported {
                what: self.spec.model_type.to_string(),
                problem:
                    "gradient checkpointing is not supported with cross-layer attention (use_cla)"
                        .into(),
            });
        }
        // Layer `i`'s mask: the sliding-window one on sliding layers.
        let mask_of = |i: usize| {
            if self.is_sliding(i) {
                swa_mask.as_ref().unwrap_or(&mask)
            } else {
                &mask
            }
            .clone()
        };
        h = crate::shard::pipeline_recv(h, self.pipeline)?;
        if cla {
            let mut shared: Option<(Array, Array)> = None;
            for (i, layer) in self.layers.iter().enumerate() {
                let cache = caches.as_deref_mut().map(|c| &mut c[i]);
                let (out, kv) = layer.forward_shared(&h, &mask_of(i), cache, shared.as_ref())?;
                h = out;
                shared = Some(kv);
            }
        } else {
            h = layer_stack(
                &self.layers,
                h,
                caches.as_deref_mut(),
                self.grad_checkpoint,
                &self.checkpoint_own,
                |i| {
                    let m = mask_of(i);
                    move |l: &DecoderLayer, x: &Array, c: Option<&mut Box<dyn Cache>>| {
                        l.forward(x, &m, c)
                    }
                },
            )?;
        }
        h = crate::shard::pipeline_send(h, self.pipeline, caches.and_then(|c| c.last_mut()))?;
        self.norm.forward(&h)
    }

    /// Pipeline parallelism as qwen3_moe's `PipelineMixin.pipeline()` (see
    /// [`crate::shard::pipeline_range`]): this model keeps its stage's layers.
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        let t = self.spec.model_type.as_str();
        crate::shard::check_pipeline(t, &["qwen3_moe"], self.pipeline.is_some())?;
        if self.spec.sliding.iter().any(|s| *s) {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Pipeline,
                what: "sliding-window layers".into(),
                problem: "not supported here".into(),
            });
        }
        crate::shard::keep_stage(&mut self.layers, size, rank)?;
        self.fa_idx = 0;
        self.swa_idx = None;
        self.pipeline = Some((rank, size));
        Ok(())
    }

    /// The output head over normed hidden states.
    fn head(&self, out: &Array) -> Result<Array> {
        self.output_head_shaped().forward(out)
    }

    /// The projection, then granitemoe's `/ logits_scaling`.
    fn output_head_shaped(&self) -> crate::models::OutputHead {
        let plain = crate::models::OutputHead::of(self.lm_head.as_ref(), &self.embed_tokens);
        match self.spec.extras.logits_scaling {
            Some(s) => crate::models::OutputHead::Shaped {
                inner: Box::new(plain),
                pre_div: None,
                post: vec![crate::models::LogitTransform::Div(s)],
            },
            None => plain,
        }
    }
}

impl Attention {
    /// llama's `shard()` of a plain attention (glm4_moe's, through deepseek's model): q, k, v
    /// all-to-sharded, o sharded-to-all, heads and KV heads / N. Fused, gated, shared-KV,
    /// full-width-norm and sink attentions are refused (their rows shard them themselves).
    pub(crate) fn shard_plain(&mut self, size: i32, rank: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all};
        if self.n_heads % size != 0 || self.n_kv_heads % size != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: format!(
                    "{} heads and {} KV heads do not split over {size} ranks",
                    self.n_heads, self.n_kv_heads
                ),
            });
        }
        if self.fused.is_some()
            || self.out_gate.is_some()
            || self.head_gate.is_some()
            || self.sinks.is_some()
            || matches!(self.qk_norm, QkNorm::Full)
        {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: "a fused, gated, sink or full-width-norm attention cannot be sharded here"
                    .into(),
            });
        }
        let (Some(k_proj), Some(v_proj)) = (self.k_proj.as_mut(), self.v_proj.as_mut()) else {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: "a layer reusing another's keys and values cannot be sharded".into(),
            });
        };
        all_to_sharded(&mut self.q_proj, size, rank, &format!("{path}.q_proj"))?;
        all_to_sharded(k_proj, size, rank, &format!("{path}.k_proj"))?;
        all_to_sharded(v_proj, size, rank, &format!("{path}.v_proj"))?;
        let o = format!("{path}.{}", self.names[0]);
        sharded_to_all(&mut self.o_proj, size, rank, &o)?;
        self.n_heads /= size;
        self.n_kv_heads /= size;
        Ok(())
    }
}

impl Model {
    /// Tensor parallelism as the `shard()` of qwen3_moe, gpt_oss, minimax and exaone_moe:
    /// q/k/v all-to-sharded, o sharded-to-all, heads and KV heads / N; dense MLPs as
    /// llama's; the experts sharded in place (gate, up by output rows, down by input
    /// columns) with the block's output summed (`all_sum`). gpt_oss also keeps its heads'
    /// sinks and divides the experts' down bias by N; minimax's full-width q/k norms become
    /// `ShardedRMSNorm`s; exaone_moe's shared experts are sharded in place inside the sum.
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::{
            all_to_sharded, divide_switch_bias, sharded_to_all, split_last, switch_inplace,
        };
        const SHARDED: [&str; 4] = ["qwen3_moe", "gpt_oss", "minimax", "exaone_moe"];
        let t = self.spec.model_type.clone();
        let moe_module = self.spec.moe_module;
        if !SHARDED.contains(&t.as_str()) {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: format!("model_type `{t}`"),
                problem: format!("not supported yet ({})", SHARDED.join(", ")),
            });
        }
        crate::shard::check_tensor_rank(size, rank)?;
        for (i, l) in self.layers.iter_mut().enumerate() {
            let what = |m: &str| format!("model.layers.{i}.{m}");
            let a = &mut l.self_attn;
            if a.n_heads % size != 0 || a.n_kv_heads % size != 0 {
                return Err(ModelError::Parallel {
                    kind: crate::Parallelism::Tensor,
                    what: what("self_attn").to_string(),
                    problem: format!(
                        "{} heads and {} KV heads do not split over {size} ranks",
                        a.n_heads, a.n_kv_heads
                    ),
                });
            }
            if a.fused.is_some() || a.out_gate.is_some() || a.head_gate.is_some() {
                return Err(ModelError::Parallel {
                    kind: crate::Parallelism::Tensor,
                    what: what("self_attn").to_string(),
                    problem: "a fused or gated attention cannot be sharded".into(),
                });
            }
            let (Some(k_proj), Some(v_proj)) = (a.k_proj.as_mut(), a.v_proj.as_mut()) else {
                return Err(ModelError::Parallel {
                    kind: crate::Parallelism::Tensor,
                    what: what("self_attn").to_string(),
                    problem: "a layer reusing another's keys and values cannot be sharded".into(),
                });
            };
            all_to_sharded(&mut a.q_proj, size, rank, &what("self_attn.q_proj"))?;
            all_to_sharded(k_proj, size, rank, &what("self_attn.k_proj"))?;
            all_to_sharded(v_proj, size, rank, &what("self_attn.v_proj"))?;
            sharded_to_all(&mut a.o_proj, size, rank, &what("self_attn.o_proj"))?;
            if a.qk_norm == QkNorm::Full {
                if t != "minimax" {
                    return Err(ModelError::Parallel {
                        kind: crate::Parallelism::Tensor,
                        what: what("self_attn").to_string(),
                        problem: "full-width q/k norms are sharded only for minimax".into(),
                    });
                }
                for (n, name) in [(&mut a.q_norm, "q_norm"), (&mut a.k_norm, "k_norm")] {
                    if let Some(Norm::Rms(n)) = n.as_mut() {
                        n.weight =
                            split_last(&n.weight, size, rank, &what(&format!("self_attn.{name}")))?;
                    }
                }
                a.sharded_norms = Some(size);
            }
            a.n_heads /= size;
            a.n_kv_heads /= size;
            if let Some(sinks) = a.sinks.as_mut() {
                *sinks =
                    crate::shard::take_heads(sinks, a.n_heads, rank, &what("self_attn.sinks"))?;
            }
            match &mut l.ffn {
                Ffn::Dense(m) => crate::shard::shard_mlp(m, size, rank, &what("mlp"), false)?,
                Ffn::Sparse(m) => {
                    let block = what(moe_module);
                    if m.shared_expert.is_some() || m.coefficient.is_some() {
                        return Err(ModelError::Parallel {
                            kind: crate::Parallelism::Tensor,
                            what: block.to_string(),
                            problem: "a gated or mixed shared expert cannot be sharded".into(),
                        });
                    }
                    if let Some(shared) = m.plain_shared.as_mut() {
                        let sp = m.plain_shared_name;
                        crate::shard::shard_mlp(
                            shared,
                            size,
                            rank,
                            &format!("{block}.{sp}"),
                            true,
                        )?;
                    }
                    let e = &mut m.switch_mlp;
                    let w = |n: &str| format!("{block}.{}.{n}", m.names[1]);
                    switch_inplace(&mut e.gate_proj, true, size, rank, &w("gate_proj"))?;
                    switch_inplace(&mut e.down_proj, false, size, rank, &w("down_proj"))?;
                    if t == "gpt_oss" {
                        divide_switch_bias(&mut e.down_proj, size)?;
                    }
                    switch_inplace(&mut e.up_proj, true, size, rank, &w("up_proj"))?;
                    m.sharded = true;
                }
            }
        }
        Ok(())
    }
}

impl LanguageModel for Model {
    port_entry_points!(spec);

    fn as_moe(&self) -> Option<&Model> {
        Some(self)
    }

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    /// The projection `head` applies (for the chunked cross-entropy of training).
    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(self.output_head_shaped())
    }

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        (0..self.layers.len())
            .map(|i| -> Box<dyn Cache> {
                match (self.is_sliding(i), self.spec.sliding_window) {
                    (true, Some(w)) => match RotatingKVCache::new(w, 0) {
                        Ok(c) => Box::new(c),
                        Err(_) => Box::new(KVCache::new()),
                    },
                    _ => Box::new(KVCache::new()),
                }
            })
            .collect()
    }

    /// Only gpt_oss defines `make_cache` (rotating caches on its sliding layers).
    fn defines_make_cache(&self) -> bool {
        self.swa_idx.is_some() || self.spec.extras.defines_make_cache
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

impl super::Trainable for Model {
    checkpoint_switches!();

    fn top_modules_mut(&mut self) -> Vec<(String, super::TopModuleMut<'_>)> {
        super::head_and_embedding(
            "",
            self.lm_head.as_mut(),
            "lm_head",
            &mut self.embed_tokens,
            self.spec.extras.embed_name.unwrap_or("model.embed_tokens"),
        )
    }

    fn layer_adaptables_mut(&mut self) -> Vec<Vec<(String, LinearMut<'_>)>> {
        let Model { spec, layers, .. } = self;
        layers
            .iter_mut()
            .zip(&spec.dense_layers)
            .map(|(l, dense)| {
                let ffn = if *dense { "mlp" } else { spec.moe_module };
                Walk::linears(move |w| l.walk("", ffn, w))
            })
            .collect()
    }

    fn layer_parameters_mut(&mut self) -> Result<Vec<Vec<LayerParam<'_>>>> {
        let Model { spec, layers, .. } = self;
        layers
            .iter_mut()
            .zip(&spec.dense_layers)
            .enumerate()
            .map(|(i, (l, dense))| {
                let ffn = if *dense { "mlp" } else { spec.moe_module };
                Walk::params(&format!("model.layers.{i}"), move |w| l.walk("", ffn, w))
            })
            .collect()
    }
}
