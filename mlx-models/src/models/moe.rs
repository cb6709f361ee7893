//! The sparse mixture-of-experts decoders of mlx-lm 0.32.2 that differ only in knobs:
//! `models/mixtral.py`, `qwen2_moe.py`, `qwen3_moe.py` and `olmoe.py`. Each row reads its
//! `ModelArgs` with mlx-lm's names and defaults and becomes a [`MoeSpec`]; the attention is
//! written once here, the router, experts (one `SwitchGlu`) and optional shared expert once in
//! the block the ports share (`moe_block.rs`), in each file's op order.

use mlx_cache::{AttentionMask, Cache, KVCache, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{
    join, scaled_dot_product_attention, Embedding, LayerParam, Linear, LinearMut, Mlp, MlpKind,
    MlpNames, Norm, NormKind, RmsNorm, Rope, RopeScaling, SwitchActivation, Walk, Walkable,
};
use crate::models::checkpoint::{layer_stack, LayerArrays};
use crate::models::moe_block::Ffn;
pub use crate::models::moe_block::{BlockExtras, Router, SparseMoe, SparseMoeParams};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

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

fn default_true() -> bool {
    true
}

fn kv_heads(kv: Option<i32>, heads: i32) -> i32 {
    kv.unwrap_or(heads)
}

/// qwen3_moe.py `ModelArgs` (every field required there, except `rope_scaling`).
#[derive(Deserialize)]
struct Qwen3MoeArgs {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: i32,
    mlp_only_layers: Vec<i32>,
    moe_intermediate_size: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    num_key_value_heads: i32,
    head_dim: i32,
    rope_theta: f64,
    tie_word_embeddings: bool,
    max_position_embeddings: i64,
    norm_topk_prob: bool,
}

/// qwen2_moe.py `ModelArgs`.
#[derive(Deserialize)]
struct Qwen2MoeArgs {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    num_experts_per_tok: i32,
    num_experts: i32,
    moe_intermediate_size: i32,
    shared_expert_intermediate_size: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    #[serde(default)]
    num_key_value_heads: Option<i32>,
    #[serde(default = "qwen2_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
}
fn qwen2_rope_theta() -> f64 {
    1_000_000.0
}

/// mixtral.py `ModelArgs` (all defaulted there).
#[derive(Deserialize)]
struct MixtralArgs {
    model_type: String,
    #[serde(default = "mixtral_vocab")]
    vocab_size: i32,
    #[serde(default = "mixtral_hidden")]
    hidden_size: i32,
    #[serde(default = "mixtral_intermediate")]
    intermediate_size: i32,
    #[serde(default = "mixtral_layers")]
    num_hidden_layers: i32,
    #[serde(default = "mixtral_layers")]
    num_attention_heads: i32,
    #[serde(default = "mixtral_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "mixtral_kv_heads")]
    num_key_value_heads: Option<i32>,
    #[serde(default = "mixtral_experts")]
    num_local_experts: i32,
    #[serde(default = "mixtral_eps")]
    rms_norm_eps: f64,
    #[serde(default = "qwen2_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
}

serde_defaults! {
    mixtral_vocab: i32 = 32000;
    mixtral_hidden: i32 = 4096;
    mixtral_intermediate: i32 = 14336;
    mixtral_layers: i32 = 32;
    mixtral_top_k: i32 = 2;
    mixtral_kv_heads: Option<i32> = Some(8);
    mixtral_experts: i32 = 8;
    mixtral_eps: f64 = 1e-5;
}

/// olmoe.py `ModelArgs`.
#[derive(Deserialize)]
struct OlmoeArgs {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default)]
    head_dim: Option<i32>,
    #[serde(default)]
    max_position_embeddings: Option<i64>,
    #[serde(default)]
    num_key_value_heads: Option<i32>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "olmoe_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}
fn olmoe_rope_theta() -> f64 {
    10000.0
}

/// gpt_oss.py `ModelArgs` (all defaulted there).
#[derive(Deserialize)]
struct GptOssArgs {
    #[serde(default = "gpt_oss_type")]
    model_type: String,
    #[serde(default = "gpt_oss_layers")]
    num_hidden_layers: i32,
    #[serde(default = "gpt_oss_experts")]
    num_local_experts: i32,
    #[serde(default = "gpt_oss_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "gpt_oss_vocab")]
    vocab_size: i32,
    #[serde(default = "mixtral_eps")]
    rms_norm_eps: f64,
    #[serde(default = "gpt_oss_hidden")]
    hidden_size: i32,
    #[serde(default = "gpt_oss_hidden")]
    intermediate_size: i32,
    #[serde(default = "gpt_oss_head_dim")]
    head_dim: i32,
    #[serde(default = "gpt_oss_head_dim")]
    num_attention_heads: i32,
    #[serde(default = "mixtral_experts")]
    num_key_value_heads: i32,
    #[serde(default = "gpt_oss_window")]
    sliding_window: i64,
    #[serde(default = "gpt_oss_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
}

serde_defaults! {
    gpt_oss_type: String = "gpt_oss".into();
    gpt_oss_layers: i32 = 36;
    gpt_oss_experts: i32 = 128;
    gpt_oss_top_k: i32 = 4;
    gpt_oss_vocab: i32 = 201088;
    gpt_oss_hidden: i32 = 2880;
    gpt_oss_head_dim: i32 = 64;
    gpt_oss_window: i64 = 128;
    gpt_oss_theta: f64 = 150000.0;
}

/// granitemoe.py `ModelArgs`.
#[derive(Deserialize)]
struct GraniteMoeArgs {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    logits_scaling: f64,
    attention_multiplier: f64,
    embedding_multiplier: f64,
    residual_multiplier: f64,
    max_position_embeddings: i64,
    num_key_value_heads: i32,
    attention_bias: bool,
    rope_theta: f64,
    num_local_experts: i32,
    num_experts_per_tok: i32,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

/// minimax.py `ModelArgs` (`minimax_m2` is remapped to it).
#[derive(Deserialize)]
struct MiniMaxArgs {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    #[allow(dead_code)]
    max_position_embeddings: i64,
    num_experts_per_tok: i32,
    num_local_experts: i32,
    #[allow(dead_code)]
    shared_intermediate_size: i32,
    num_hidden_layers: i32,
    rms_norm_eps: f64,
    rope_theta: f64,
    rotary_dim: i32,
    vocab_size: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    head_dim: Option<i32>,
    #[serde(default = "default_true")]
    use_qk_norm: bool,
}

/// ernie4_5_moe.py `ModelArgs`.
#[derive(Deserialize)]
struct Ernie45MoeArgs {
    hidden_size: i32,
    intermediate_size: i32,
    model_type: String,
    max_position_embeddings: i64,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    num_hidden_layers: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    rope_theta: f64,
    use_bias: bool,
    tie_word_embeddings: bool,
    moe_num_experts: i32,
    #[serde(default)]
    moe_layer_start_index: IntOrList,
    #[serde(default)]
    moe_intermediate_size: i32,
    #[serde(default = "one")]
    moe_k: i32,
    #[serde(default = "one")]
    moe_layer_interval: i32,
    #[serde(default)]
    moe_num_shared_experts: i32,
    #[serde(default)]
    moe_layer_end_index: Option<IntOrList>,
    #[serde(default)]
    head_dim: Option<i32>,
    #[serde(default = "softmax_name")]
    moe_gate_act: String,
}

/// phimoe.py `ModelArgs` (all defaulted there).
#[derive(Deserialize)]
struct PhiMoeArgs {
    #[serde(default = "phimoe_type")]
    model_type: String,
    #[serde(default = "phimoe_vocab")]
    vocab_size: i32,
    #[serde(default = "gpt_oss_hidden_4096")]
    hidden_size: i32,
    #[serde(default = "phimoe_intermediate")]
    intermediate_size: i32,
    #[serde(default = "phimoe_heads")]
    num_hidden_layers: i32,
    #[serde(default = "phimoe_heads")]
    num_attention_heads: i32,
    #[serde(default = "phimoe_kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "phimoe_max_pos")]
    max_position_embeddings: i64,
    #[serde(default = "phimoe_original_max_pos")]
    original_max_position_embeddings: i64,
    #[serde(default = "phimoe_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default = "phimoe_experts")]
    num_local_experts: i32,
    #[serde(default = "phimoe_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "olmoe_rope_theta")]
    rope_theta: f64,
    #[serde(default = "phimoe_jitter")]
    router_jitter_noise: f64,
}

serde_defaults! {
    phimoe_type: String = "phimoe".into();
    phimoe_vocab: i32 = 32064;
    gpt_oss_hidden_4096: i32 = 4096;
    phimoe_intermediate: i32 = 6400;
    phimoe_heads: i32 = 32;
    phimoe_kv_heads: i32 = 8;
    phimoe_max_pos: i64 = 131072;
    phimoe_original_max_pos: i64 = 4096;
    phimoe_eps: f64 = 1e-6;
    phimoe_experts: i32 = 16;
    phimoe_top_k: i32 = 2;
    phimoe_jitter: f64 = 0.01;
}

/// phimoe's rope: `nn.RoPE(head_dim, base)` without `rope_scaling`, else `SuScaledRoPE` with
/// the config's factors and mscales (`short_mscale` / `long_mscale` required, as the
/// `KeyError` of mlx-lm; the input scale is `long_mscale or` the default one).
fn phimoe_rope(a: &PhiMoeArgs, head_dim: i32) -> Result<Rope> {
    let Some(cfg) = &a.rope_scaling else {
        return Rope::initialize(head_dim, a.rope_theta, false, None, None);
    };
    for key in ["short_factor", "long_factor", "short_mscale", "long_mscale"] {
        if cfg.get(key).is_none() {
            return Err(ModelError::Config(format!(
                "phimoe: rope_scaling needs `{key}`"
            )));
        }
    }
    let mut su = cfg.clone();
    su.insert("type".into(), "longrope".into());
    su.remove("rope_type");
    su.insert(
        "original_max_position_embeddings".into(),
        a.original_max_position_embeddings.into(),
    );
    let rope = Rope::initialize(
        head_dim,
        a.rope_theta,
        false,
        Some(&su),
        Some(a.max_position_embeddings),
    )?;
    // `long_mscale or default_scale`: a null or zero mscale keeps the default.
    let mscale = cfg.get("long_mscale").and_then(|v| v.as_f64());
    Ok(match (rope, mscale) {
        (
            Rope::Freqs {
                dims,
                traditional,
                freqs,
                ..
            },
            Some(m),
        ) if m != 0.0 => Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale: Some(m),
        },
        (rope, _) => rope,
    })
}

/// Klear.py `ModelArgs` (every field required).
#[derive(Deserialize)]
struct KlearArgs {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    attention_bias: bool,
    mlp_only_layers: Vec<i32>,
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: i32,
    n_shared_experts: i32,
    moe_intermediate_size: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    num_key_value_heads: i32,
    rope_theta: f64,
    #[allow(dead_code)]
    max_position_embeddings: i64,
    norm_topk_prob: bool,
}

/// hunyuan.py `ModelArgs`.
#[derive(Deserialize)]
struct HunyuanArgs {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    attention_bias: bool,
    moe_topk: IntOrList,
    num_experts: i32,
    num_shared_expert: IntOrList,
    use_mixed_mlp_moe: bool,
    use_qk_norm: bool,
    rms_norm_eps: f64,
    rope_theta: f64,
    use_cla: bool,
    cla_share_factor: i32,
    #[serde(default)]
    moe_intermediate_size: Option<IntOrList>,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
}

/// hunyuan.py's `DynamicNTKAlphaRoPE(head_dim, base, rope_scaling["alpha"])`: the base
/// becomes `base * alpha ** (dims / (dims - 2))`, the frequencies
/// `base ** (mx.arange(0, dims, 2) / dims)`.
fn hunyuan_rope(a: &HunyuanArgs, dims: i32) -> Result<Rope> {
    let alpha = a
        .rope_scaling
        .as_ref()
        .and_then(|c| c.get("alpha"))
        .and_then(|v| v.as_f64())
        .ok_or_else(|| {
            ModelError::Config("hunyuan: rope_scaling needs a numeric `alpha`".into())
        })?;
    if let Some(c) = &a.rope_scaling {
        if c.get("factor").is_none() || c.get("type").is_none() {
            return Err(ModelError::Config(
                "hunyuan: rope_scaling must contain keys factor and type".into(),
            ));
        }
    }
    if dims <= 2 {
        return Err(ModelError::Config(format!(
            "hunyuan: head_dim must exceed 2, got {dims}"
        )));
    }
    let base = a.rope_theta * alpha.powf(f64::from(dims) / f64::from(dims - 2));
    Ok(Rope::Freqs {
        dims,
        traditional: false,
        freqs: crate::layers::base_pow(base, dims, Dtype::Int32)?,
        input_scale: None,
    })
}

/// mellum.py `ModelArgs`.
#[derive(Deserialize)]
struct MellumArgs {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    moe_intermediate_size: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    num_key_value_heads: i32,
    head_dim: i32,
    tie_word_embeddings: bool,
    max_position_embeddings: i64,
    norm_topk_prob: bool,
    sliding_window: i64,
    layer_types: Vec<String>,
    #[serde(default)]
    rope_parameters: serde_json::Map<String, serde_json::Value>,
}

/// mellum.py `_rope_for(layer_type, args)`: `rope_parameters[layer_type]`'s `rope_theta`,
/// plain rope for `default` / `linear` (no scaling passed), else `initialize_rope` with the
/// parameters as the scaling config.
fn mellum_rope(a: &MellumArgs, layer_type: &str) -> Result<Rope> {
    let params = a
        .rope_parameters
        .get(layer_type)
        .and_then(|v| v.as_object())
        .ok_or_else(|| {
            ModelError::Config(format!(
                "mellum: rope_parameters has no `{layer_type}` entry"
            ))
        })?;
    let base = params
        .get("rope_theta")
        .and_then(|v| v.as_f64())
        .ok_or_else(|| {
            ModelError::Config(format!("mellum: rope_parameters.{layer_type}.rope_theta"))
        })?;
    let rope_type = params
        .get("rope_type")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    if rope_type == "default" || rope_type == "linear" {
        return Rope::initialize(a.head_dim, base, false, None, None);
    }
    let mut scaling = params.clone();
    scaling.insert("type".into(), rope_type.into());
    Rope::initialize(
        a.head_dim,
        base,
        false,
        Some(&scaling),
        Some(a.max_position_embeddings),
    )
}

/// exaone_moe.py `ModelArgs`.
#[derive(Deserialize)]
struct ExaoneMoeArgs {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    moe_intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    head_dim: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    num_shared_experts: Option<i32>,
    rms_norm_eps: f64,
    max_position_embeddings: i64,
    sliding_window: i64,
    layer_types: Vec<String>,
    is_moe_layer: Vec<bool>,
    #[serde(default = "one")]
    n_group: i32,
    #[serde(default = "one")]
    topk_group: i32,
    #[serde(default = "exaone_scaling")]
    routed_scaling_factor: f64,
    #[serde(default = "default_true")]
    norm_topk_prob: bool,
    #[serde(default = "noaux_tc")]
    topk_method: String,
    #[serde(default = "qwen2_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    tie_word_embeddings: bool,
}

serde_defaults! {
    exaone_scaling: f64 = 2.5;
    noaux_tc: String = "noaux_tc".into();
}

/// bailing_moe.py `ModelArgs`.
#[derive(Deserialize)]
struct BailingMoeArgs {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    max_position_embeddings: i64,
    moe_intermediate_size: i32,
    num_experts: i32,
    num_shared_experts: i32,
    norm_topk_prob: bool,
    num_attention_heads: i32,
    num_experts_per_tok: i32,
    num_hidden_layers: i32,
    num_key_value_heads: i32,
    rms_norm_eps: f64,
    rope_theta: f64,
    vocab_size: i32,
    first_k_dense_replace: i32,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    use_bias: bool,
    #[serde(default)]
    use_qkv_bias: bool,
    #[serde(default)]
    norm_head: bool,
    #[serde(default)]
    use_qk_norm: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "one_f64")]
    partial_rotary_factor: f64,
    #[serde(default)]
    rotary_dim: Option<i32>,
    #[serde(default)]
    moe_router_enable_expert_bias: bool,
    #[serde(default = "one_f64")]
    routed_scaling_factor: f64,
    #[serde(default = "softmax_name")]
    score_function: String,
    #[serde(default = "one")]
    n_group: i32,
    #[serde(default = "four")]
    topk_group: i32,
    #[serde(default)]
    moe_shared_expert_intermediate_size: Option<i32>,
    #[serde(default = "default_true")]
    moe_router_enable_shared_expert: bool,
}

serde_defaults! {
    one_f64: f64 = 1.0;
    four: i32 = 4;
}

/// afmoe.py `ModelArgs` (all but `layer_types` defaulted there).
#[derive(Deserialize)]
struct AfmoeArgs {
    model_type: String,
    layer_types: Vec<String>,
    #[serde(default = "afmoe_vocab")]
    vocab_size: i32,
    #[serde(default = "afmoe_hidden")]
    hidden_size: i32,
    #[serde(default = "afmoe_intermediate")]
    intermediate_size: i32,
    #[serde(default = "afmoe_moe_intermediate")]
    moe_intermediate_size: i32,
    #[serde(default = "afmoe_layers")]
    num_hidden_layers: i32,
    #[serde(default = "afmoe_layers")]
    num_attention_heads: i32,
    #[serde(default = "four")]
    num_key_value_heads: i32,
    #[serde(default = "afmoe_head_dim")]
    head_dim: i32,
    #[serde(default = "phimoe_max_pos")]
    max_position_embeddings: i64,
    #[serde(default = "afmoe_eps")]
    rms_norm_eps: f64,
    #[serde(default = "olmoe_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "afmoe_experts")]
    num_experts: i32,
    #[serde(default = "afmoe_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "one")]
    num_shared_experts: i32,
    #[serde(default = "afmoe_dense")]
    num_dense_layers: i32,
    #[serde(default = "default_true")]
    route_norm: bool,
    #[serde(default = "afmoe_route_scale")]
    route_scale: f64,
    #[serde(default = "sigmoid_name")]
    score_func: String,
    #[serde(default = "one")]
    n_group: i32,
    #[serde(default = "one")]
    topk_group: i32,
    #[serde(default = "afmoe_window")]
    sliding_window: i64,
    #[serde(default = "default_true")]
    mup_enabled: bool,
}

serde_defaults! {
    afmoe_vocab: i32 = 200192;
    afmoe_hidden: i32 = 2048;
    afmoe_intermediate: i32 = 6144;
    afmoe_moe_intermediate: i32 = 1024;
    afmoe_layers: i32 = 32;
    afmoe_head_dim: i32 = 64;
    afmoe_eps: f64 = 1e-5;
    afmoe_experts: i32 = 128;
    afmoe_top_k: i32 = 8;
    afmoe_dense: i32 = 2;
    afmoe_route_scale: f64 = 2.826;
    sigmoid_name: String = "sigmoid".into();
    afmoe_window: i64 = 2048;
}

/// laguna.py `ModelArgs` (all defaulted there).
#[derive(Deserialize)]
struct LagunaArgs {
    #[serde(default = "laguna_type")]
    model_type: String,
    #[serde(default = "laguna_vocab")]
    vocab_size: i32,
    #[serde(default = "afmoe_hidden")]
    hidden_size: i32,
    #[serde(default = "laguna_intermediate")]
    intermediate_size: i32,
    #[serde(default = "laguna_layers")]
    num_hidden_layers: i32,
    #[serde(default = "laguna_heads")]
    num_attention_heads: i32,
    #[serde(default = "laguna_kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "laguna_head_dim")]
    head_dim: i32,
    #[serde(default = "laguna_max_pos")]
    max_position_embeddings: i64,
    #[serde(default = "phimoe_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    qkv_bias: bool,
    #[serde(default = "default_true")]
    gating: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "laguna_window")]
    sliding_window: Option<i64>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    rope_parameters: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    num_attention_heads_per_layer: Option<Vec<i32>>,
    #[serde(default)]
    mlp_layer_types: Option<Vec<String>>,
    #[serde(default = "laguna_experts")]
    num_experts: i32,
    #[serde(default = "afmoe_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "laguna_moe_width")]
    moe_intermediate_size: i32,
    #[serde(default = "laguna_moe_width")]
    shared_expert_intermediate_size: i32,
    #[serde(default = "one_f64")]
    moe_routed_scaling_factor: f64,
    #[serde(default)]
    moe_router_logit_softcapping: f64,
    #[serde(default = "sigmoid_name")]
    moe_router_score_func: String,
}

serde_defaults! {
    laguna_type: String = "laguna".into();
    laguna_vocab: i32 = 100352;
    laguna_intermediate: i32 = 8192;
    laguna_layers: i32 = 40;
    laguna_heads: i32 = 48;
    laguna_kv_heads: i32 = 8;
    laguna_head_dim: i32 = 128;
    laguna_max_pos: i64 = 262144;
    laguna_window: Option<i64> = Some(512);
    laguna_experts: i32 = 256;
    laguna_moe_width: i32 = 512;
}

/// laguna.py `_layer_rope(args, layer_type)`: `rope_parameters[layer_type]` (or nothing)
/// gives the base (default 10000), the rotary fraction of `head_dim` and the scaling
/// (`rope_type` default when unnamed).
fn laguna_rope(a: &LagunaArgs, layer_type: &str) -> Result<Rope> {
    let params = a
        .rope_parameters
        .as_ref()
        .and_then(|p| p.get(layer_type))
        .and_then(|v| v.as_object())
        .cloned()
        .unwrap_or_default();
    let base = match params.get("rope_theta") {
        Some(v) => v.as_f64().ok_or_else(|| {
            ModelError::Config(format!("laguna: rope_parameters.{layer_type}.rope_theta"))
        })?,
        None => 10000.0,
    };
    let partial = match params.get("partial_rotary_factor") {
        Some(v) => v.as_f64().ok_or_else(|| {
            ModelError::Config(format!(
                "laguna: rope_parameters.{layer_type}.partial_rotary_factor"
            ))
        })?,
        None => a.partial_rotary_factor.unwrap_or(1.0),
    };
    let dims = (f64::from(a.head_dim) * partial) as i32;
    if dims <= 0 || dims > a.head_dim {
        return Err(ModelError::Config(format!(
            "laguna: {layer_type} rotary dimensions {dims} must be within head_dim {}",
            a.head_dim
        )));
    }
    let mut scaling: RopeScaling = params
        .into_iter()
        .filter(|(k, _)| k != "rope_theta")
        .collect();
    if !scaling.contains_key("rope_type") && !scaling.contains_key("type") {
        scaling.insert("rope_type".into(), "default".into());
    }
    Rope::initialize(
        dims,
        base,
        false,
        Some(&scaling),
        Some(a.max_position_embeddings),
    )
}

/// An int, or a list whose min (start) or max (end) ernie4_5_moe takes.
#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrList {
    Int(i32),
    List(Vec<i32>),
}

impl Default for IntOrList {
    fn default() -> Self {
        IntOrList::Int(0)
    }
}

impl IntOrList {
    /// `_int_or_list(arg, idx)`.
    fn at(&self, idx: usize) -> Option<i32> {
        match self {
            IntOrList::Int(i) => Some(*i),
            IntOrList::List(v) => v.get(idx).copied(),
        }
    }

    fn min(&self) -> Option<i32> {
        match self {
            IntOrList::Int(i) => Some(*i),
            IntOrList::List(v) => v.iter().copied().min(),
        }
    }
    fn max(&self) -> Option<i32> {
        match self {
            IntOrList::Int(i) => Some(*i),
            IntOrList::List(v) => v.iter().copied().max(),
        }
    }
}

serde_defaults! {
    one: i32 = 1;
    softmax_name: String = "softmax".into();
}

impl MoeSpec {
    /// The values most rows share; each row sets its shape and what differs (the goldens
    /// check every row). The shape fields here are placeholders a row always overrides.
    fn defaults() -> MoeSpec {
        MoeSpec {
            model_type: String::new(),
            hidden_size: 0,
            num_hidden_layers: 0,
            vocab_size: 0,
            rms_norm_eps: 0.0,
            tie_word_embeddings: false,
            n_heads: 0,
            n_kv_heads: 0,
            head_dim: 0,
            rope_theta: 0.0,
            num_experts: 0,
            top_k: 0,
            moe_intermediate_size: 0,
            router: Router::TopKThenSoftmax,
            dense_layers: Vec::new(),
            intermediate_size: 0,
            qkv_bias: false,
            o_bias: false,
            qk_norm: QkNorm::None,
            rope_traditional: false,
            rope_scaling: None,
            max_position_embeddings: None,
            expert_bias: false,
            shared_expert_intermediate_size: None,
            moe_module: "mlp",
            drops_tied_head: false,
            attn_sinks: false,
            moe_names: ["gate", "switch_mlp"],
            router_bias: false,
            activation: SwitchActivation::SwiGlu,
            sliding: Vec::new(),
            sliding_window: None,
            extras: MoeExtras::default(),
        }
    }

    /// The row for `config.architecture`.
    pub fn from_config(config: &ModelConfig) -> Result<MoeSpec> {
        let spec = match config.architecture.as_str() {
            "qwen3_moe" => {
                let a: Qwen3MoeArgs = config.args()?;
                let n = a.num_hidden_layers.max(0);
                let dense_layers = (0..n)
                    .map(|i| {
                        a.mlp_only_layers.contains(&i)
                            || a.num_experts <= 0
                            || a.decoder_sparse_step <= 0
                            || (i + 1) % a.decoder_sparse_step != 0
                    })
                    .collect();
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: a.head_dim,
                    qk_norm: QkNorm::PerHead,
                    rope_theta: a.rope_theta,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    router: Router::SoftmaxUpperPartition {
                        norm_topk_prob: a.norm_topk_prob,
                        cast_back: true,
                    },
                    dense_layers,
                    intermediate_size: a.intermediate_size,
                    drops_tied_head: true,
                    ..MoeSpec::defaults()
                }
            }
            "qwen2_moe" => {
                let a: Qwen2MoeArgs = config.args()?;
                if let Some(s) = &a.rope_scaling {
                    // `__post_init__` accepts only linear scaling, which nn.RoPE then ignores.
                    let ok = s.get("factor").is_some()
                        && s.get("type").and_then(|t| t.as_str()) == Some("linear");
                    if !ok {
                        return Err(ModelError::Config(
                            "qwen2_moe: rope_scaling must have `factor` and `type` = \"linear\""
                                .into(),
                        ));
                    }
                }
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    // qwen2_moe.py always has an lm_head.
                    tie_word_embeddings: false,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: kv_heads(a.num_key_value_heads, a.num_attention_heads),
                    head_dim: head_dim_of(a.hidden_size, a.num_attention_heads)?,
                    qkv_bias: true,
                    rope_theta: a.rope_theta,
                    rope_traditional: a.rope_traditional,
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    router: Router::SoftmaxLowerPartition {
                        norm_topk_prob: false,
                        flatten: false,
                    },
                    shared_expert_intermediate_size: Some(a.shared_expert_intermediate_size),
                    dense_layers: vec![false; a.num_hidden_layers.max(0) as usize],
                    intermediate_size: a.intermediate_size,
                    ..MoeSpec::defaults()
                }
            }
            "mixtral" => {
                let a: MixtralArgs = config.args()?;
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: kv_heads(a.num_key_value_heads, a.num_attention_heads),
                    head_dim: head_dim_of(a.hidden_size, a.num_attention_heads)?,
                    rope_theta: a.rope_theta,
                    rope_traditional: a.rope_traditional,
                    num_experts: a.num_local_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    router: Router::TopKThenSoftmax,
                    dense_layers: vec![false; a.num_hidden_layers.max(0) as usize],
                    intermediate_size: a.intermediate_size,
                    moe_module: "block_sparse_moe",
                    drops_tied_head: true,
                    ..MoeSpec::defaults()
                }
            }
            "olmoe" => {
                let a: OlmoeArgs = config.args()?;
                let head_dim = match a.head_dim {
                    Some(d) if d > 0 => d,
                    _ => head_dim_of(a.hidden_size, a.num_attention_heads)?,
                };
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: kv_heads(a.num_key_value_heads, a.num_attention_heads),
                    head_dim,
                    qkv_bias: a.attention_bias,
                    o_bias: a.attention_bias,
                    qk_norm: QkNorm::Full,
                    rope_theta: a.rope_theta,
                    rope_traditional: a.rope_traditional,
                    rope_scaling: a.rope_scaling,
                    max_position_embeddings: a.max_position_embeddings,
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    expert_bias: a.mlp_bias,
                    router: Router::SoftmaxLowerPartition {
                        norm_topk_prob: a.norm_topk_prob,
                        flatten: true,
                    },
                    dense_layers: vec![false; a.num_hidden_layers.max(0) as usize],
                    intermediate_size: a.intermediate_size,
                    ..MoeSpec::defaults()
                }
            }
            "gpt_oss" => {
                let a: GptOssArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                let types = a.layer_types.unwrap_or_else(|| {
                    ["sliding_attention", "full_attention"]
                        .iter()
                        .cycle()
                        .take(n / 2 * 2)
                        .map(|t| t.to_string())
                        .collect()
                });
                if types.len() != n {
                    return Err(ModelError::Config(format!(
                        "gpt_oss: layer_types has {} entries for {n} layers",
                        types.len()
                    )));
                }
                for t in &types {
                    if t != "sliding_attention" && t != "full_attention" {
                        return Err(ModelError::Config(format!(
                            "gpt_oss: unknown layer type `{t}`"
                        )));
                    }
                }
                let window = usize::try_from(a.sliding_window)
                    .ok()
                    .filter(|w| *w > 0)
                    .ok_or_else(|| {
                        ModelError::Config(format!(
                            "gpt_oss: sliding_window must be positive, got {}",
                            a.sliding_window
                        ))
                    })?;
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: false,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: a.head_dim,
                    qkv_bias: true,
                    o_bias: true,
                    rope_theta: a.rope_theta,
                    rope_scaling: a.rope_scaling,
                    num_experts: a.num_local_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    expert_bias: true,
                    router: Router::UpperTopKThenSoftmax,
                    dense_layers: vec![false; n],
                    intermediate_size: a.intermediate_size,
                    attn_sinks: true,
                    moe_names: ["router", "experts"],
                    router_bias: true,
                    activation: SwitchActivation::SwiGluOai,
                    sliding: types.iter().map(|t| t == "sliding_attention").collect(),
                    sliding_window: Some(window),
                    ..MoeSpec::defaults()
                }
            }
            "phimoe" => {
                let a: PhiMoeArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                let head_dim = head_dim_of(a.hidden_size, a.num_attention_heads)?;
                let rope = phimoe_rope(&a, head_dim)?;
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: false,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim,
                    qkv_bias: true,
                    o_bias: true,
                    rope_theta: a.rope_theta,
                    num_experts: a.num_local_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    router: Router::SparseMixer {
                        jitter_eps: a.router_jitter_noise,
                    },
                    dense_layers: vec![false; n],
                    intermediate_size: a.intermediate_size,
                    moe_module: "block_sparse_moe",
                    extras: MoeExtras {
                        layer_norm: true,
                        lm_head_bias: true,
                        rope: Some(rope),
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "Klear" => {
                let a: KlearArgs = config.args()?;
                let n = a.num_hidden_layers.max(0);
                if a.num_experts > 0 && a.decoder_sparse_step <= 0 {
                    return Err(ModelError::Config(format!(
                        "Klear: decoder_sparse_step must be positive, got {}",
                        a.decoder_sparse_step
                    )));
                }
                let dense_layers = (0..n)
                    .map(|i| {
                        a.mlp_only_layers.contains(&i)
                            || a.num_experts <= 0
                            || (i + 1) % a.decoder_sparse_step != 0
                    })
                    .collect();
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: false,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: head_dim_of(a.hidden_size, a.num_attention_heads)?,
                    qkv_bias: a.attention_bias,
                    o_bias: a.attention_bias,
                    qk_norm: QkNorm::PerHead,
                    rope_theta: a.rope_theta,
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    router: Router::SigmoidBiased {
                        norm_topk_prob: a.norm_topk_prob,
                    },
                    dense_layers,
                    intermediate_size: a.intermediate_size,
                    moe_names: ["gate", "experts"],
                    extras: MoeExtras {
                        block: BlockExtras {
                            correction_bias: Some("expert_bias"),
                            plain_shared: Some((
                                a.moe_intermediate_size * a.n_shared_experts,
                                false,
                            )),
                            coefficient: true,
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "hunyuan" => {
                let a: HunyuanArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                let head_dim = head_dim_of(a.hidden_size, a.num_attention_heads)?;
                let rope = hunyuan_rope(&a, head_dim)?;
                let at = |v: &IntOrList, name: &str, i: usize| {
                    v.at(i).ok_or_else(|| {
                        ModelError::Config(format!("hunyuan: `{name}` has no entry for layer {i}"))
                    })
                };
                let mut layer_moe = Vec::with_capacity(n);
                for i in 0..n {
                    let top_k = at(&a.moe_topk, "moe_topk", i)?;
                    let width = match &a.moe_intermediate_size {
                        Some(v) => at(v, "moe_intermediate_size", i)?,
                        None => a.intermediate_size,
                    };
                    let shared = if a.use_mixed_mlp_moe {
                        Some(
                            a.intermediate_size * at(&a.num_shared_expert, "num_shared_expert", i)?,
                        )
                    } else {
                        None
                    };
                    if top_k <= 0 || top_k > a.num_experts || width <= 0 {
                        return Err(ModelError::Config(format!(
                            "hunyuan: layer {i} has top_k {top_k} of {} experts of width {width}",
                            a.num_experts
                        )));
                    }
                    layer_moe.push((top_k, width, shared));
                }
                if a.use_cla && a.cla_share_factor <= 0 {
                    return Err(ModelError::Config(format!(
                        "hunyuan: cla_share_factor must be positive, got {}",
                        a.cla_share_factor
                    )));
                }
                let (top_k, width) = layer_moe.first().map_or((1, 1), |l| (l.0, l.1));
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    // The output is always `embed_tokens.as_linear`.
                    tie_word_embeddings: true,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim,
                    qkv_bias: a.attention_bias,
                    o_bias: a.attention_bias,
                    qk_norm: if a.use_qk_norm {
                        QkNorm::AfterRope
                    } else {
                        QkNorm::None
                    },
                    rope_theta: a.rope_theta,
                    num_experts: a.num_experts,
                    top_k,
                    moe_intermediate_size: width,
                    router: Router::SoftmaxLowerF32Weights,
                    dense_layers: vec![a.num_experts == 1; n],
                    intermediate_size: a.intermediate_size,
                    moe_names: ["gate.wg", "switch_mlp"],
                    extras: MoeExtras {
                        rope: Some(rope),
                        attn_names: Some(["o_proj", "query_layernorm", "key_layernorm"]),
                        cla_share_factor: a.use_cla.then_some(a.cla_share_factor),
                        layer_moe,
                        block: BlockExtras {
                            plain_shared_name: Some("shared_mlp"),
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "mellum" => {
                let a: MellumArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                if a.layer_types.len() != n {
                    return Err(ModelError::Config(format!(
                        "mellum: layer_types has {} entries for {n} layers",
                        a.layer_types.len()
                    )));
                }
                let mut layer_ropes = Vec::with_capacity(n);
                for t in &a.layer_types {
                    if t != "sliding_attention" && t != "full_attention" {
                        return Err(ModelError::Config(format!(
                            "mellum: unknown layer type `{t}`"
                        )));
                    }
                    layer_ropes.push(mellum_rope(&a, t)?);
                }
                if !a.layer_types.iter().any(|t| t == "full_attention") {
                    return Err(ModelError::Config(
                        "mellum: needs at least one full_attention layer".into(),
                    ));
                }
                let window = usize::try_from(a.sliding_window)
                    .ok()
                    .filter(|w| *w > 0)
                    .ok_or_else(|| {
                        ModelError::Config(format!(
                            "mellum: sliding_window must be positive, got {}",
                            a.sliding_window
                        ))
                    })?;
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: a.head_dim,
                    qk_norm: QkNorm::PerHead,
                    rope_theta: 10000.0,
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    router: Router::SoftmaxUpperPartition {
                        norm_topk_prob: a.norm_topk_prob,
                        cast_back: false,
                    },
                    dense_layers: vec![false; n],
                    intermediate_size: a.intermediate_size,
                    drops_tied_head: true,
                    sliding: a
                        .layer_types
                        .iter()
                        .map(|t| t == "sliding_attention")
                        .collect(),
                    sliding_window: Some(window),
                    extras: MoeExtras {
                        layer_ropes,
                        defines_make_cache: true,
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "exaone_moe" => {
                let a: ExaoneMoeArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                if a.topk_method != "noaux_tc" {
                    return Err(ModelError::Config(format!(
                        "exaone_moe: topk_method `{}` is not supported (only noaux_tc)",
                        a.topk_method
                    )));
                }
                if a.layer_types.len() != n || a.is_moe_layer.len() != n {
                    return Err(ModelError::Config(format!(
                        "exaone_moe: layer_types ({}) and is_moe_layer ({}) need {n} entries",
                        a.layer_types.len(),
                        a.is_moe_layer.len()
                    )));
                }
                if a.n_group <= 0
                    || a.topk_group <= 0
                    || a.topk_group > a.n_group
                    || a.num_experts % a.n_group != 0
                {
                    return Err(ModelError::Config(format!(
                        "exaone_moe: n_group {} / topk_group {} do not fit {} experts",
                        a.n_group, a.topk_group, a.num_experts
                    )));
                }
                let rope_theta = a
                    .rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(|v| v.as_f64())
                    .unwrap_or(a.rope_theta);
                let sliding: Vec<bool> = a
                    .layer_types
                    .iter()
                    .map(|t| t == "sliding_attention")
                    .collect();
                let any_sliding = sliding.iter().any(|s| *s);
                let window = usize::try_from(a.sliding_window)
                    .ok()
                    .filter(|w| *w > 0)
                    .ok_or_else(|| {
                        ModelError::Config(format!(
                            "exaone_moe: sliding_window must be positive, got {}",
                            a.sliding_window
                        ))
                    })?;
                let shared = a
                    .num_shared_experts
                    .filter(|s| *s > 0)
                    .map(|s| (a.moe_intermediate_size * s, false));
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: a.head_dim,
                    qk_norm: QkNorm::PerHead,
                    rope_theta,
                    rope_scaling: a.rope_scaling,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    router: Router::Grouped {
                        n_group: a.n_group,
                        topk_group: a.topk_group,
                        routed_scaling_factor: a.routed_scaling_factor,
                        norm_topk_prob: a.norm_topk_prob,
                    },
                    dense_layers: a.is_moe_layer.iter().map(|m| !m).collect(),
                    intermediate_size: a.intermediate_size,
                    drops_tied_head: true,
                    sliding: sliding.clone(),
                    sliding_window: Some(window),
                    extras: MoeExtras {
                        defines_make_cache: true,
                        no_rope: sliding.iter().map(|s| any_sliding && !s).collect(),
                        block: BlockExtras {
                            correction_bias: Some("gate.e_score_correction_bias"),
                            plain_shared: shared,
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "bailing_moe" => {
                let a: BailingMoeArgs = config.args()?;
                let n = a.num_hidden_layers.max(0);
                let head_dim = head_dim_of(a.hidden_size, a.num_attention_heads)?;
                let rope_dims = a
                    .rotary_dim
                    .unwrap_or((f64::from(head_dim) * a.partial_rotary_factor) as i32);
                if rope_dims <= 0 || rope_dims > head_dim {
                    return Err(ModelError::Config(format!(
                        "bailing_moe: the rotary dimensions {rope_dims} must be within \
                         head_dim {head_dim}"
                    )));
                }
                let sigmoid = match a.score_function.as_str() {
                    "softmax" => false,
                    "sigmoid" => true,
                    other => {
                        return Err(ModelError::Config(format!(
                            "bailing_moe: score_function `{other}` is not supported"
                        )))
                    }
                };
                if a.n_group > 1
                    && (a.topk_group <= 0
                        || a.topk_group > a.n_group
                        || a.num_experts % a.n_group != 0)
                {
                    return Err(ModelError::Config(format!(
                        "bailing_moe: n_group {} / topk_group {} do not fit {} experts",
                        a.n_group, a.topk_group, a.num_experts
                    )));
                }
                let shared =
                    (a.num_shared_experts > 0 && a.moe_router_enable_shared_expert).then(|| {
                        (
                            a.moe_shared_expert_intermediate_size
                                .unwrap_or(a.moe_intermediate_size)
                                * a.num_shared_experts,
                            a.use_bias,
                        )
                    });
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim,
                    qkv_bias: a.use_qkv_bias,
                    o_bias: a.use_bias,
                    qk_norm: if a.use_qk_norm {
                        QkNorm::PerHead
                    } else {
                        QkNorm::None
                    },
                    rope_theta: a.rope_theta,
                    rope_scaling: a.rope_scaling,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    expert_bias: a.use_bias,
                    router: Router::GroupedBailing {
                        n_group: a.n_group,
                        topk_group: a.topk_group,
                        routed_scaling_factor: a.routed_scaling_factor,
                        norm_topk_prob: a.norm_topk_prob,
                        sigmoid,
                    },
                    dense_layers: (0..n).map(|i| i < a.first_k_dense_replace).collect(),
                    intermediate_size: a.intermediate_size,
                    drops_tied_head: true,
                    moe_names: ["gate.gate_proj", "switch_mlp"],
                    extras: MoeExtras {
                        rope_dims: Some(rope_dims),
                        dense_bias: a.use_bias,
                        attn_names: Some(["dense", "query_layernorm", "key_layernorm"]),
                        fused_qkv: Some("query_key_value"),
                        attn_module: Some("attention"),
                        embed_name: Some("model.word_embeddings"),
                        norm_head: a.norm_head,
                        block: BlockExtras {
                            correction_bias: a
                                .moe_router_enable_expert_bias
                                .then_some("gate.expert_bias"),
                            plain_shared: shared,
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "afmoe" => {
                let a: AfmoeArgs = config.args()?;
                let n = a.layer_types.len();
                if n as i64 != i64::from(a.num_hidden_layers) {
                    return Err(ModelError::Config(format!(
                        "afmoe: layer_types has {n} entries for {} layers",
                        a.num_hidden_layers
                    )));
                }
                for t in &a.layer_types {
                    if t != "sliding_attention" && t != "full_attention" {
                        return Err(ModelError::Config(format!(
                            "afmoe: unknown layer type `{t}`"
                        )));
                    }
                }
                if !a.layer_types.iter().any(|t| t == "full_attention") {
                    return Err(ModelError::Config(
                        "afmoe: needs a full_attention layer".into(),
                    ));
                }
                let sigmoid = match a.score_func.as_str() {
                    "sigmoid" => true,
                    "softmax" => false,
                    other => {
                        return Err(ModelError::Config(format!(
                            "afmoe: score_func `{other}` is not supported"
                        )))
                    }
                };
                if a.n_group > 1
                    && (a.topk_group <= 0
                        || a.topk_group > a.n_group
                        || a.num_experts % a.n_group != 0)
                {
                    return Err(ModelError::Config(format!(
                        "afmoe: n_group {} / topk_group {} do not fit {} experts",
                        a.n_group, a.topk_group, a.num_experts
                    )));
                }
                let window = usize::try_from(a.sliding_window)
                    .ok()
                    .filter(|w| *w > 0)
                    .ok_or_else(|| {
                        ModelError::Config(format!(
                            "afmoe: sliding_window must be positive, got {}",
                            a.sliding_window
                        ))
                    })?;
                let sliding: Vec<bool> = a
                    .layer_types
                    .iter()
                    .map(|t| t == "sliding_attention")
                    .collect();
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: a.head_dim,
                    qk_norm: QkNorm::PerHead,
                    rope_theta: a.rope_theta,
                    rope_scaling: a.rope_scaling,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    router: Router::GroupedPlain {
                        n_group: a.n_group,
                        topk_group: a.topk_group,
                        route_scale: a.route_scale,
                        route_norm: a.route_norm,
                        sigmoid,
                    },
                    dense_layers: (0..n as i32).map(|i| i < a.num_dense_layers).collect(),
                    intermediate_size: a.intermediate_size,
                    drops_tied_head: true,
                    moe_names: ["router.gate", "experts"],
                    sliding: sliding.clone(),
                    sliding_window: Some(window),
                    extras: MoeExtras {
                        embedding_multiplier: a
                            .mup_enabled
                            .then(|| f64::from(a.hidden_size).sqrt() as f32),
                        defines_make_cache: true,
                        no_rope: sliding.iter().map(|s| !s).collect(),
                        attn_gate: true,
                        sandwich_norms: true,
                        block: BlockExtras {
                            correction_bias: Some("expert_bias"),
                            plain_shared: (a.num_shared_experts > 0)
                                .then(|| (a.moe_intermediate_size * a.num_shared_experts, false)),
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "laguna" => {
                let a: LagunaArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                let layer_types = a
                    .layer_types
                    .clone()
                    .unwrap_or_else(|| vec!["full_attention".into(); n]);
                let mlp_types = a.mlp_layer_types.clone().unwrap_or_else(|| {
                    std::iter::once("dense".to_string())
                        .chain(std::iter::repeat_n(
                            "sparse".to_string(),
                            n.saturating_sub(1),
                        ))
                        .collect()
                });
                let heads = a
                    .num_attention_heads_per_layer
                    .clone()
                    .unwrap_or_else(|| vec![a.num_attention_heads; n]);
                if layer_types.len() != n || mlp_types.len() != n || heads.len() != n {
                    return Err(ModelError::Config(format!(
                        "laguna: layer_types, mlp_layer_types and \
                         num_attention_heads_per_layer need {n} entries each"
                    )));
                }
                if !layer_types.iter().any(|t| t == "full_attention") {
                    return Err(ModelError::Config(
                        "laguna: needs a full_attention layer".into(),
                    ));
                }
                for &h in &heads {
                    if h <= 0 || a.num_key_value_heads <= 0 || h % a.num_key_value_heads != 0 {
                        return Err(ModelError::Config(format!(
                            "laguna: {h} query heads do not fit {} key/value heads",
                            a.num_key_value_heads
                        )));
                    }
                }
                let sqrt_softplus = match a.moe_router_score_func.as_str() {
                    "sigmoid" => false,
                    "sqrtsoftplus" => true,
                    other => {
                        return Err(ModelError::Config(format!(
                            "laguna: moe_router_score_func `{other}` is not supported"
                        )))
                    }
                };
                let sliding: Vec<bool> = layer_types
                    .iter()
                    .map(|t| t == "sliding_attention")
                    .collect();
                let window = match a.sliding_window {
                    Some(w) if w > 0 => Some(w as usize),
                    _ if sliding.iter().any(|s| *s) => {
                        return Err(ModelError::Config(
                            "laguna: sliding layers need a positive sliding_window".into(),
                        ))
                    }
                    _ => None,
                };
                let layer_ropes = layer_types
                    .iter()
                    .map(|t| laguna_rope(&a, t))
                    .collect::<Result<Vec<_>>>()?;
                MoeSpec {
                    model_type: a.model_type.clone(),
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: heads.first().copied().unwrap_or(a.num_attention_heads),
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: a.head_dim,
                    qkv_bias: a.qkv_bias,
                    o_bias: a.attention_bias,
                    qk_norm: QkNorm::PerHead,
                    rope_theta: 10000.0,
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    router: Router::Laguna {
                        softcap: a.moe_router_logit_softcapping,
                        sqrt_softplus,
                    },
                    dense_layers: mlp_types.iter().map(|t| t != "sparse").collect(),
                    intermediate_size: a.intermediate_size,
                    drops_tied_head: true,
                    moe_names: ["gate.proj", "switch_mlp"],
                    sliding,
                    sliding_window: window,
                    extras: MoeExtras {
                        layer_ropes,
                        defines_make_cache: true,
                        head_gate: a.gating,
                        layer_heads: heads,
                        block: BlockExtras {
                            correction_bias: Some("gate.e_score_correction_bias"),
                            plain_shared: Some((a.shared_expert_intermediate_size, false)),
                            plain_shared_name: Some("shared_expert"),
                            output_scale: Some(a.moe_routed_scaling_factor as f32),
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "granitemoe" => {
                let a: GraniteMoeArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim: head_dim_of(a.hidden_size, a.num_attention_heads)?,
                    qkv_bias: a.attention_bias,
                    o_bias: a.attention_bias,
                    rope_theta: a.rope_theta,
                    rope_scaling: a.rope_scaling,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    num_experts: a.num_local_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    router: Router::UpperTopKThenSoftmaxF32,
                    dense_layers: vec![false; n],
                    intermediate_size: a.intermediate_size,
                    moe_module: "block_sparse_moe",
                    // Its `sanitize` drops a tied head only when it splits `input_linear`.
                    moe_names: ["router.layer", "switch_mlp"],
                    extras: MoeExtras {
                        embedding_multiplier: Some(a.embedding_multiplier as f32),
                        residual_multiplier: Some(a.residual_multiplier as f32),
                        logits_scaling: Some(a.logits_scaling as f32),
                        attention_scale: Some(a.attention_multiplier as f32),
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "minimax" => {
                let a: MiniMaxArgs = config.args()?;
                let n = a.num_hidden_layers.max(0) as usize;
                let head_dim = match a.head_dim {
                    Some(d) if d != 0 => d,
                    _ => head_dim_of(a.hidden_size, a.num_attention_heads)?,
                };
                if a.rotary_dim <= 0 || a.rotary_dim > head_dim || a.rotary_dim % 2 != 0 {
                    return Err(ModelError::Config(format!(
                        "minimax: rotary_dim must be even and within head_dim {head_dim}, got {}",
                        a.rotary_dim
                    )));
                }
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim,
                    qk_norm: if a.use_qk_norm {
                        QkNorm::Full
                    } else {
                        QkNorm::None
                    },
                    rope_theta: a.rope_theta,
                    num_experts: a.num_local_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    router: Router::SigmoidCorrected,
                    dense_layers: vec![false; n],
                    intermediate_size: a.intermediate_size,
                    moe_module: "block_sparse_moe",
                    extras: MoeExtras {
                        rope_dims: Some(a.rotary_dim),
                        block: BlockExtras {
                            correction_bias: Some("e_score_correction_bias"),
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            "ernie4_5_moe" => {
                let a: Ernie45MoeArgs = config.args()?;
                let n = a.num_hidden_layers.max(0);
                let sigmoid = match a.moe_gate_act.as_str() {
                    "softmax" => false,
                    "sigmoid" => true,
                    other => {
                        return Err(ModelError::Config(format!(
                            "ernie4_5_moe: moe_gate_act `{other}` is not supported"
                        )))
                    }
                };
                let start = a.moe_layer_start_index.min().unwrap_or(0);
                let end = match &a.moe_layer_end_index {
                    None => n - 1,
                    Some(e) => e.max().unwrap_or(n - 1),
                };
                if a.moe_layer_interval <= 0 {
                    return Err(ModelError::Config(format!(
                        "ernie4_5_moe: moe_layer_interval must be positive, got {}",
                        a.moe_layer_interval
                    )));
                }
                let dense_layers = (0..n)
                    .map(|i| !((i + 1) % a.moe_layer_interval == 0 && i >= start && i <= end))
                    .collect();
                let moe_width = if a.moe_intermediate_size != 0 {
                    a.moe_intermediate_size
                } else {
                    a.intermediate_size
                };
                let plain_shared = (a.moe_num_shared_experts > 0)
                    .then(|| (moe_width * a.moe_num_shared_experts, a.use_bias));
                let head_dim = match a.head_dim {
                    Some(d) if d != 0 => d,
                    _ => head_dim_of(a.hidden_size, a.num_attention_heads)?,
                };
                MoeSpec {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    vocab_size: a.vocab_size,
                    rms_norm_eps: a.rms_norm_eps as f32,
                    tie_word_embeddings: a.tie_word_embeddings,
                    n_heads: a.num_attention_heads,
                    n_kv_heads: a.num_key_value_heads,
                    head_dim,
                    qkv_bias: a.use_bias,
                    o_bias: a.use_bias,
                    rope_theta: a.rope_theta,
                    rope_traditional: true,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    num_experts: a.moe_num_experts,
                    top_k: a.moe_k,
                    moe_intermediate_size: moe_width,
                    expert_bias: a.use_bias,
                    router: Router::NormalizedTopK { sigmoid },
                    dense_layers,
                    intermediate_size: a.intermediate_size,
                    extras: MoeExtras {
                        dense_bias: a.use_bias,
                        block: BlockExtras {
                            plain_shared,
                            ..BlockExtras::default()
                        },
                        ..MoeExtras::default()
                    },
                    ..MoeSpec::defaults()
                }
            }
            other => {
                return Err(ModelError::Config(format!(
                    "`{other}` is not a mixture-of-experts row"
                )))
            }
        };
        spec.validate()
    }

    fn validate(self) -> Result<MoeSpec> {
        let t = &self.model_type;
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("vocab_size", self.vocab_size),
            ("num_attention_heads", self.n_heads),
            ("num_key_value_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.top_k),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ];
        for (name, v) in positive {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "{t}: `{name}` must be positive, got {v}"
                )));
            }
        }
        if self.top_k > self.num_experts {
            return Err(ModelError::Config(format!(
                "{t}: num_experts_per_tok {} exceeds the {} experts",
                self.top_k, self.num_experts
            )));
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return Err(ModelError::Config(format!(
                "{t}: num_attention_heads {} must be a multiple of num_key_value_heads {}",
                self.n_heads, self.n_kv_heads
            )));
        }
        Ok(self)
    }
}

fn head_dim_of(hidden: i32, heads: i32) -> Result<i32> {
    if heads <= 0 || hidden % heads != 0 {
        return Err(ModelError::Config(format!(
            "hidden_size {hidden} must divide by num_attention_heads {heads}"
        )));
    }
    Ok(hidden / heads)
}

/// The knobs of the standard attention block these files share (lfm2 too).
pub(crate) struct AttentionSpec {
    pub hidden_size: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: QkNorm,
    pub eps: f32,
    pub rope: Rope,
    /// Module names: output projection, q norm, k norm.
    pub names: [&'static str; 3],
    /// Learned per-head attention sinks (`<path>.sinks`, gpt_oss).
    pub sinks: bool,
    /// gpt_oss writes `1 / sqrt(head_dim)`, the others `head_dim ** -0.5`.
    pub inv_sqrt_scale: bool,
}

#[derive(Clone)]
pub(crate) struct Attention {
    n_heads: i32,
    n_kv_heads: i32,
    scale: f32,
    qk_norm: QkNorm,
    q_proj: Linear,
    /// `None` on hunyuan's layers that reuse the previous layer's keys and values
    /// (cross-layer attention).
    k_proj: Option<Linear>,
    v_proj: Option<Linear>,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    sinks: Option<Array>,
    rope: Rope,
    /// exaone_moe's global layers (when it has sliding ones) skip the rope.
    use_rope: bool,
    /// bailing_moe: `q_proj` holds the fused query/key/value projection (named `q_name`),
    /// split after it.
    fused_qkv: bool,
    /// The name of `q_proj` (`query_key_value` when fused).
    q_name: &'static str,
    /// afmoe: `gate_proj`, whose sigmoid scales the attention output before `o_proj`.
    out_gate: Option<Linear>,
    /// laguna: `g_proj` to one value per head, whose float32 softplus scales each head's
    /// output before `o_proj`.
    head_gate: Option<Linear>,
    /// Module names: output projection, q norm, k norm ([`AttentionSpec::names`]).
    names: [&'static str; 3],
    /// minimax's `shard()`: the full-width q/k norms as `ShardedRMSNorm` over this many ranks.
    sharded_norms: Option<i32>,
}

impl Attention {
    fn load(s: &MoeSpec, w: &mut Weights, path: &str, kv_proj: bool) -> Result<Attention> {
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
            a.scale = scale;
        }
        if let Some(rope) = &s.extras.rope {
            a.rope = rope.clone();
        }
        Ok(a)
    }

    pub(crate) fn new(s: AttentionSpec, w: &mut Weights, path: &str) -> Result<Attention> {
        Attention::new_with(s, w, path, true, None)
    }

    /// [`Attention::new`]; without `k_proj` / `v_proj` when `kv_proj` is false (the layer
    /// takes another layer's keys and values).
    fn new_with(
        s: AttentionSpec,
        w: &mut Weights,
        path: &str,
        kv_proj: bool,
        fused: Option<&'static str>,
    ) -> Result<Attention> {
        let (dim, hd) = (s.hidden_size, s.head_dim);
        let kv_proj = kv_proj && fused.is_none();
        let p = |n: &str| format!("{path}.{n}");
        let [o_name, q_name, k_name] = s.names;
        let (q_dims, k_dims) = match s.qk_norm {
            QkNorm::Full => (s.n_heads * hd, s.n_kv_heads * hd),
            _ => (hd, hd),
        };
        let (q_norm, k_norm) = match s.qk_norm {
            QkNorm::None => (None, None),
            _ => (
                Some(RmsNorm::load(w, &p(q_name), q_dims, s.eps)?),
                Some(RmsNorm::load(w, &p(k_name), k_dims, s.eps)?),
            ),
        };
        Ok(Attention {
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            scale: if s.inv_sqrt_scale {
                (1.0 / f64::from(hd).sqrt()) as f32
            } else {
                f64::from(hd).powf(-0.5) as f32
            },
            qk_norm: s.qk_norm,
            q_proj: match fused {
                Some(name) => Linear::load(
                    w,
                    &p(name),
                    dim,
                    (s.n_heads + 2 * s.n_kv_heads) * hd,
                    s.qkv_bias,
                )?,
                None => Linear::load(w, &p("q_proj"), dim, s.n_heads * hd, s.qkv_bias)?,
            },
            k_proj: if kv_proj {
                Some(Linear::load(
                    w,
                    &p("k_proj"),
                    dim,
                    s.n_kv_heads * hd,
                    s.qkv_bias,
                )?)
            } else {
                None
            },
            v_proj: if kv_proj {
                Some(Linear::load(
                    w,
                    &p("v_proj"),
                    dim,
                    s.n_kv_heads * hd,
                    s.qkv_bias,
                )?)
            } else {
                None
            },
            o_proj: Linear::load(w, &p(o_name), s.n_heads * hd, dim, s.o_bias)?,
            q_norm,
            k_norm,
            sinks: if s.sinks {
                Some(w.take(&p("sinks"), &[s.n_heads])?)
            } else {
                None
            },
            rope: s.rope,
            use_rope: true,
            fused_qkv: fused.is_some(),
            q_name: fused.unwrap_or("q_proj"),
            out_gate: None,
            head_gate: None,
            names: s.names,
            sharded_norms: None,
        })
    }

    /// Walks the projections under their names (`q_proj`, `k_proj`, `v_proj`, then the
    /// output projection under this model's name, the order every mlx-lm attention here
    /// declares them in), the q/k norms, the output and head gates, and the sinks.
    pub(crate) fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            sinks,
            names: [o_name, q_name, k_name],
            q_name: q_proj_name,
            out_gate,
            head_gate,
            ..
        } = self;
        let p = |n: &str| join(path, n);
        w.linear(&p(q_proj_name), q_proj);
        w.linear_opt(&p("k_proj"), k_proj.as_mut());
        w.linear_opt(&p("v_proj"), v_proj.as_mut());
        w.linear(&p(o_name), o_proj);
        for (name, n) in [(*q_name, q_norm), (*k_name, k_norm)] {
            if let Some(n) = n {
                w.rms_norm(&p(name), n);
            }
        }
        w.linear_opt(&p("gate_proj"), out_gate.as_mut());
        w.linear_opt(&p("g_proj"), head_gate.as_mut());
        if let Some(sinks) = sinks {
            w.array(path, "sinks", sinks);
        }
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        Ok(self.forward_shared(x, mask, cache, None)?.0)
    }

    /// [`Attention::forward`], also returning the keys and values as projected (before the
    /// reshape), which a layer without its own projections takes as `shared` (hunyuan's
    /// cross-layer attention).
    fn forward_shared(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
        shared: Option<&(Array, Array)>,
    ) -> Result<(Array, (Array, Array))> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let norm = |n: &Option<RmsNorm>, y: Array| -> Result<Array> {
            match n {
                Some(n) => n.forward(&y),
                None => Ok(y),
            }
        };
        let mut queries = self.q_proj.forward(x)?;
        let fused = if self.fused_qkv {
            let (qs, ks) = (self.n_heads, self.n_kv_heads);
            let hd = queries.shape().last().copied().unwrap_or(0) / (qs + 2 * ks);
            let mut parts = ops::split_at(&queries, &[qs * hd, (qs + ks) * hd], -1, None)?;
            let v = parts.pop();
            let k = parts.pop();
            queries = parts.pop().ok_or_else(|| ModelError::Internal {
                what: "moe".into(),
                problem: "qkv split".into(),
            })?;
            k.zip(v)
        } else {
            None
        };
        let (mut keys, values) = match (fused, &self.k_proj, &self.v_proj, shared) {
            (Some(kv), ..) => kv,
            (None, Some(k), Some(v), None) => (k.forward(x)?, v.forward(x)?),
            (None, _, _, Some((k, v))) => (k.clone(), v.clone()),
            _ => {
                return Err(ModelError::Unsupported {
                    what: "a layer".into(),
                    problem: "without k_proj / v_proj needs an earlier layer's keys and values"
                        .into(),
                })
            }
        };
        let kv_states = (keys.clone(), values.clone());
        if self.qk_norm == QkNorm::Full {
            if let (Some(n), Some(qn), Some(kn)) = (self.sharded_norms, &self.q_norm, &self.k_norm)
            {
                queries = crate::shard::sharded_rms_norm(&queries, &qn.weight, qn.eps, n)?;
                keys = crate::shard::sharded_rms_norm(&keys, &kn.weight, kn.eps, n)?;
            } else {
                queries = norm(&self.q_norm, queries)?;
                keys = norm(&self.k_norm, keys)?;
            }
        }
        let split = |y: &Array, n: i32| ops::reshape(y, &[b, l, n, -1], None);
        let mut queries = split(&queries, self.n_heads)?;
        let mut keys = split(&keys, self.n_kv_heads)?;
        if self.qk_norm == QkNorm::PerHead {
            queries = norm(&self.q_norm, queries)?;
            keys = norm(&self.k_norm, keys)?;
        }
        let heads = |y: &Array| ops::transpose(y, &[0, 2, 1, 3], None);
        let queries = heads(&queries)?;
        let keys = heads(&keys)?;
        let values = heads(&split(&values, self.n_kv_heads)?)?;
        let rope = |y: &Array, offset: usize| -> Result<Array> {
            if self.use_rope {
                self.rope.forward(y, offset)
            } else {
                Ok(y.clone())
            }
        };
        let after_rope = |q: Array, k: Array| -> Result<(Array, Array)> {
            if self.qk_norm == QkNorm::AfterRope {
                Ok((norm(&self.q_norm, q)?, norm(&self.k_norm, k)?))
            } else {
                Ok((q, k))
            }
        };
        let (queries, kv) = match cache {
            Some(c) => {
                let offset = c.offset();
                let q = rope(&queries, offset)?;
                let k = rope(&keys, offset)?;
                let (q, k) = after_rope(q, k)?;
                (q, c.update_and_fetch(&k, &values)?)
            }
            None => {
                let (q, k) = after_rope(rope(&queries, 0)?, rope(&keys, 0)?)?;
                (q, mlx_cache::Kv::Dense { keys: k, values })
            }
        };
        let out =
            scaled_dot_product_attention(&queries, &kv, self.scale, mask, self.sinks.as_ref())?;
        let mut out = ops::reshape(&heads(&out)?, &[b, l, -1], None)?;
        if let Some(g) = &self.out_gate {
            out = (&out * &ops::sigmoid(&g.forward(x)?, None)?)?;
        }
        if let Some(g) = &self.head_gate {
            let z = g.forward(x)?.astype(Dtype::Float32)?;
            let zero = Scalar::Int(0).to_array_like(z.dtype())?;
            let gate = ops::logaddexp(&z, &zero, None)?.astype(out.dtype())?;
            let per_head = ops::reshape(&out, &[b, l, self.n_heads, -1], None)?;
            out = ops::reshape(
                &(&per_head * &ops::expand_dims(&gate, &[-1], None)?)?,
                &[b, l, -1],
                None,
            )?;
        }
        Ok((self.o_proj.forward(&out)?, kv_states))
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
                    Attention::load(&layer_spec, w, &format!("{p}.{attn_module}"), kv_proj)?
                }
                None => Attention::load(&spec, w, &format!("{p}.{attn_module}"), kv_proj)?,
            };
            if spec.extras.head_gate {
                self_attn.head_gate = Some(Linear::load(
                    w,
                    &format!("{p}.{attn_module}.g_proj"),
                    dim,
                    self_attn.n_heads,
                    false,
                )?);
            }
            if let Some(rope) = spec.extras.layer_ropes.get(i) {
                self_attn.rope = rope.clone();
            }
            if spec.extras.no_rope.get(i).copied().unwrap_or(false) {
                self_attn.use_rope = false;
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
            (a.fused_qkv, "a fused q/k/v projection"),
            (a.out_gate.is_some(), "an attention output gate"),
            (a.head_gate.is_some(), "a head-wise attention gate"),
            (a.sharded_norms.is_some(), "sharded q/k norms"),
            (l.mlp_norms.is_some(), "sandwich norms"),
            (l.residual_multiplier.is_some(), "a residual multiplier"),
            (a.qk_norm == QkNorm::Full, "q/k norms over all heads"),
            (a.qk_norm == QkNorm::AfterRope, "q/k norms after the rope"),
        ] {
            if present {
                other.push(what);
            }
        }
        let per_head = a.qk_norm == QkNorm::PerHead;
        Some(MoeLayerView {
            input_norm: &l.input_layernorm,
            post_attention_norm: &l.post_attention_layernorm,
            q: &a.q_proj,
            k: a.k_proj.as_ref(),
            v: a.v_proj.as_ref(),
            o: &a.o_proj,
            q_norm: a.q_norm.as_ref().filter(|_| per_head),
            k_norm: a.k_norm.as_ref().filter(|_| per_head),
            rope: a.use_rope.then_some(&a.rope),
            scale: a.scale,
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
        if self.fused_qkv
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
            all_to_sharded, divide_switch_bias, sharded_to_all, sharded_to_all_inplace, split_last,
            switch_inplace,
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
            if a.fused_qkv || a.out_gate.is_some() || a.head_gate.is_some() {
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
                    if let Some(n) = n.as_mut() {
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
                Ffn::Dense(m) => {
                    let names = MlpNames::LLAMA;
                    for (name, lin) in m.linears_mut(&names) {
                        let w = what(&format!("mlp.{name}"));
                        if name == names.down {
                            sharded_to_all(lin, size, rank, &w)?;
                        } else {
                            all_to_sharded(lin, size, rank, &w)?;
                        }
                    }
                }
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
                        let names = MlpNames::LLAMA;
                        let sp = m.plain_shared_name;
                        for (name, lin) in shared.linears_mut(&names) {
                            let w = format!("{block}.{sp}.{name}");
                            if name == names.down {
                                sharded_to_all_inplace(lin, size, rank, &w)?;
                            } else {
                                all_to_sharded(lin, size, rank, &w)?;
                            }
                        }
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
