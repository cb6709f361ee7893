//! The sparse mixture-of-experts decoders of mlx-lm 0.32.2 that differ only in knobs:
//! `models/mixtral.py`, `qwen2_moe.py`, `qwen3_moe.py` and `olmoe.py`. Each row reads its
//! `ModelArgs` with mlx-lm's names and defaults and becomes a [`MoeSpec`]; attention, router,
//! experts (one [`SwitchGlu`]) and the optional shared expert are written once here, in each
//! file's op order.

use mlx_cache::{AttentionMask, Cache, KVCache, RotatingKVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{
    scaled_dot_product_attention, Embedding, LayerParam, Linear, LinearMut, Mlp, MlpKind, MlpNames,
    RmsNorm, Rope, RopeScaling, SwitchActivation, SwitchGlu,
};
use crate::models::checkpoint::{layer_step, LayerArrays};
use crate::models::LanguageModel;
use crate::weights::Weights;

/// Where the attention's q/k RMS norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over each head (`head_dim`), after the reshape (qwen3_moe).
    PerHead,
    /// Over all heads (`n_heads * head_dim`), before the reshape (olmoe).
    Full,
}

/// How a router turns gate logits into `k` experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Router {
    /// qwen3_moe / qwen3_next: `softmax`, `argpartition(gates, -k)[..., -k:]`, optional
    /// renormalization; qwen3_moe casts the weighted sum back to the experts' dtype.
    SoftmaxUpperPartition {
        norm_topk_prob: bool,
        cast_back: bool,
    },
    /// qwen2_moe / olmoe: `softmax`, `argpartition(-gates, k - 1)[..., :k]`, optional
    /// renormalization; olmoe flattens tokens to `(B * L, D)` first.
    SoftmaxLowerPartition { norm_topk_prob: bool, flatten: bool },
    /// mixtral: `argpartition(-gates, k - 1)[..., :k]` on the logits, softmax over the `k`.
    TopKThenSoftmax,
    /// gpt_oss (`mlx_topk`): `argpartition(gates, -k)[..., -k:]` on the logits, softmax over
    /// the `k`.
    UpperTopKThenSoftmax,
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

impl MoeSpec {
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
                    qkv_bias: false,
                    o_bias: false,
                    qk_norm: QkNorm::PerHead,
                    rope_theta: a.rope_theta,
                    rope_traditional: false,
                    rope_scaling: None,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    expert_bias: false,
                    router: Router::SoftmaxUpperPartition {
                        norm_topk_prob: a.norm_topk_prob,
                        cast_back: true,
                    },
                    shared_expert_intermediate_size: None,
                    dense_layers,
                    intermediate_size: a.intermediate_size,
                    moe_module: "mlp",
                    drops_tied_head: true,
                    attn_sinks: false,
                    moe_names: ["gate", "switch_mlp"],
                    router_bias: false,
                    activation: SwitchActivation::SwiGlu,
                    sliding: Vec::new(),
                    sliding_window: None,
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
                    o_bias: false,
                    qk_norm: QkNorm::None,
                    rope_theta: a.rope_theta,
                    rope_traditional: a.rope_traditional,
                    rope_scaling: None,
                    max_position_embeddings: None,
                    num_experts: a.num_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.moe_intermediate_size,
                    expert_bias: false,
                    router: Router::SoftmaxLowerPartition {
                        norm_topk_prob: false,
                        flatten: false,
                    },
                    shared_expert_intermediate_size: Some(a.shared_expert_intermediate_size),
                    dense_layers: vec![false; a.num_hidden_layers.max(0) as usize],
                    intermediate_size: a.intermediate_size,
                    moe_module: "mlp",
                    drops_tied_head: false,
                    attn_sinks: false,
                    moe_names: ["gate", "switch_mlp"],
                    router_bias: false,
                    activation: SwitchActivation::SwiGlu,
                    sliding: Vec::new(),
                    sliding_window: None,
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
                    qkv_bias: false,
                    o_bias: false,
                    qk_norm: QkNorm::None,
                    rope_theta: a.rope_theta,
                    rope_traditional: a.rope_traditional,
                    rope_scaling: None,
                    max_position_embeddings: None,
                    num_experts: a.num_local_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    expert_bias: false,
                    router: Router::TopKThenSoftmax,
                    shared_expert_intermediate_size: None,
                    dense_layers: vec![false; a.num_hidden_layers.max(0) as usize],
                    intermediate_size: a.intermediate_size,
                    moe_module: "block_sparse_moe",
                    drops_tied_head: true,
                    attn_sinks: false,
                    moe_names: ["gate", "switch_mlp"],
                    router_bias: false,
                    activation: SwitchActivation::SwiGlu,
                    sliding: Vec::new(),
                    sliding_window: None,
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
                    shared_expert_intermediate_size: None,
                    dense_layers: vec![false; a.num_hidden_layers.max(0) as usize],
                    intermediate_size: a.intermediate_size,
                    moe_module: "mlp",
                    drops_tied_head: false,
                    attn_sinks: false,
                    moe_names: ["gate", "switch_mlp"],
                    router_bias: false,
                    activation: SwitchActivation::SwiGlu,
                    sliding: Vec::new(),
                    sliding_window: None,
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
                    qk_norm: QkNorm::None,
                    rope_theta: a.rope_theta,
                    rope_traditional: false,
                    rope_scaling: a.rope_scaling,
                    max_position_embeddings: None,
                    num_experts: a.num_local_experts,
                    top_k: a.num_experts_per_tok,
                    moe_intermediate_size: a.intermediate_size,
                    expert_bias: true,
                    router: Router::UpperTopKThenSoftmax,
                    shared_expert_intermediate_size: None,
                    dense_layers: vec![false; n],
                    intermediate_size: a.intermediate_size,
                    moe_module: "mlp",
                    drops_tied_head: false,
                    attn_sinks: true,
                    moe_names: ["router", "experts"],
                    router_bias: true,
                    activation: SwitchActivation::SwiGluOai,
                    sliding: types.iter().map(|t| t == "sliding_attention").collect(),
                    sliding_window: Some(window),
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
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    sinks: Option<Array>,
    rope: Rope,
    /// Module names: output projection, q norm, k norm ([`AttentionSpec::names`]).
    names: [&'static str; 3],
}

impl Attention {
    fn load(s: &MoeSpec, w: &mut Weights, path: &str) -> Result<Attention> {
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
                s.head_dim,
                s.rope_theta,
                s.rope_traditional,
                s.rope_scaling.as_ref(),
                s.max_position_embeddings,
            )?,
            names: ["o_proj", "q_norm", "k_norm"],
            sinks: s.attn_sinks,
            inv_sqrt_scale: s.attn_sinks,
        };
        Attention::new(spec, w, path)
    }

    pub(crate) fn new(s: AttentionSpec, w: &mut Weights, path: &str) -> Result<Attention> {
        let (dim, hd) = (s.hidden_size, s.head_dim);
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
            q_proj: Linear::load(w, &p("q_proj"), dim, s.n_heads * hd, s.qkv_bias)?,
            k_proj: Linear::load(w, &p("k_proj"), dim, s.n_kv_heads * hd, s.qkv_bias)?,
            v_proj: Linear::load(w, &p("v_proj"), dim, s.n_kv_heads * hd, s.qkv_bias)?,
            o_proj: Linear::load(w, &p(o_name), s.n_heads * hd, dim, s.o_bias)?,
            q_norm,
            k_norm,
            sinks: if s.sinks {
                Some(w.take(&p("sinks"), &[s.n_heads])?)
            } else {
                None
            },
            rope: s.rope,
            names: s.names,
        })
    }

    /// Every array of the attention under `path` (`...self_attn`), for full fine-tuning.
    /// The projections under their names (`q_proj`, `k_proj`, `v_proj`, then the output
    /// projection under this model's name), the order every mlx-lm attention here declares
    /// them in.
    pub(crate) fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            names: [o_name, ..],
            ..
        } = self;
        vec![
            ("q_proj".into(), q_proj),
            ("k_proj".into(), k_proj),
            ("v_proj".into(), v_proj),
            (o_name.to_string(), o_proj),
        ]
    }

    pub(crate) fn parameters_mut<'a>(
        &'a mut self,
        path: &str,
        out: &mut Vec<LayerParam<'a>>,
    ) -> Result<()> {
        let Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            sinks,
            names: [o_name, q_name, k_name],
            ..
        } = self;
        let p = |n: &str| format!("{path}.{n}");
        for (name, l) in [
            ("q_proj", q_proj),
            ("k_proj", k_proj),
            ("v_proj", v_proj),
            (*o_name, o_proj),
        ] {
            l.parameters_mut(&p(name), out)?;
        }
        for (name, n) in [(*q_name, q_norm), (*k_name, k_norm)] {
            if let Some(n) = n {
                n.parameters_mut(&p(name), out);
            }
        }
        if let Some(sinks) = sinks {
            LayerParam::push(out, path, "sinks", sinks, false);
        }
        Ok(())
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let norm = |n: &Option<RmsNorm>, y: Array| -> Result<Array> {
            match n {
                Some(n) => n.forward(&y),
                None => Ok(y),
            }
        };
        let mut queries = self.q_proj.forward(x)?;
        let mut keys = self.k_proj.forward(x)?;
        let values = self.v_proj.forward(x)?;
        if self.qk_norm == QkNorm::Full {
            queries = norm(&self.q_norm, queries)?;
            keys = norm(&self.k_norm, keys)?;
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
        let (queries, kv) = match cache {
            Some(c) => {
                let offset = c.offset();
                let q = self.rope.forward(&queries, offset)?;
                let k = self.rope.forward(&keys, offset)?;
                (q, c.update_and_fetch(&k, &values)?)
            }
            None => (
                self.rope.forward(&queries, 0)?,
                mlx_cache::Kv::Dense {
                    keys: self.rope.forward(&keys, 0)?,
                    values,
                },
            ),
        };
        let out =
            scaled_dot_product_attention(&queries, &kv, self.scale, mask, self.sinks.as_ref())?;
        let out = ops::reshape(&heads(&out)?, &[b, l, -1], None)?;
        self.o_proj.forward(&out)
    }
}

/// What a [`SparseMoe`] block is made of.
#[derive(Clone, Debug)]
pub struct SparseMoeParams {
    pub hidden_size: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub moe_intermediate_size: i32,
    pub expert_bias: bool,
    pub router: Router,
    pub shared_expert_intermediate_size: Option<i32>,
    /// Module names of the router and the experts (`gate`/`switch_mlp`; gpt_oss
    /// `router`/`experts`).
    pub names: [&'static str; 2],
    pub router_bias: bool,
    pub activation: SwitchActivation,
}

/// The expert block: router, experts, optional gated shared expert.
#[derive(Clone)]
pub struct SparseMoe {
    top_k: i32,
    router: Router,
    gate: Linear,
    switch_mlp: SwitchGlu,
    shared_expert: Option<(Mlp, Linear)>,
    /// Module names of the router and the experts ([`SparseMoeParams::names`]).
    names: [&'static str; 2],
    /// mlx-lm's `sharding_group` (qwen3_moe's `shard()`): the output summed over the group.
    sharded: bool,
}

impl SparseMoe {
    fn load(s: &MoeSpec, w: &mut Weights, path: &str) -> Result<SparseMoe> {
        SparseMoe::load_parts(
            w,
            path,
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

    /// The block at `path` (`gate`, `switch_mlp`, optional `shared_expert` and
    /// `shared_expert_gate`).
    pub fn load_parts(w: &mut Weights, path: &str, s: &SparseMoeParams) -> Result<SparseMoe> {
        let p = |n: &str| format!("{path}.{n}");
        let shared_expert = match s.shared_expert_intermediate_size {
            Some(h) => Some((
                Mlp::load(
                    w,
                    &p("shared_expert"),
                    &crate::layers::MlpNames::LLAMA,
                    s.hidden_size,
                    h,
                    false,
                    false,
                    MlpKind::SwiGlu,
                )?,
                Linear::load(w, &p("shared_expert_gate"), s.hidden_size, 1, false)?,
            )),
            None => None,
        };
        Ok(SparseMoe {
            top_k: s.top_k,
            router: s.router,
            gate: Linear::load(
                w,
                &p(s.names[0]),
                s.hidden_size,
                s.num_experts,
                s.router_bias,
            )?,
            switch_mlp: SwitchGlu::load(
                w,
                &p(s.names[1]),
                s.hidden_size,
                s.moe_intermediate_size,
                s.num_experts,
                s.expert_bias,
                s.activation,
            )?,
            shared_expert,
            names: s.names,
            sharded: false,
        })
    }

    /// Every array of the block under `path`, for full fine-tuning: router, experts, shared
    /// expert and its gate.
    /// The router, the experts' switch linears and the shared expert's linears under their
    /// paths inside the block, in the order mlx-lm's blocks declare them (gpt_oss: experts,
    /// router; the others: gate, switch_mlp, shared_expert, shared_expert_gate).
    pub fn linears_mut(&mut self) -> Vec<(String, LinearMut<'_>)> {
        let SparseMoe {
            gate,
            switch_mlp,
            shared_expert,
            names: [router, experts],
            ..
        } = self;
        let router_name = router.to_string();
        let mut out: Vec<(String, LinearMut<'_>)> = switch_mlp
            .linears_mut()
            .into_iter()
            .map(|(n, l)| (format!("{experts}.{n}"), LinearMut::Switch(l)))
            .collect();
        // gpt_oss's `MLPBlock` declares `experts` before `router`; the others' blocks
        // declare `gate` first.
        let pos = if router_name == "router" {
            out.len()
        } else {
            0
        };
        out.insert(pos, (router_name, LinearMut::Linear(gate)));
        if let Some((mlp, shared_gate)) = shared_expert {
            for (n, l) in mlp.linears_mut(&MlpNames::LLAMA) {
                out.push((format!("shared_expert.{n}"), LinearMut::Linear(l)));
            }
            out.push(("shared_expert_gate".into(), LinearMut::Linear(shared_gate)));
        }
        out
    }

    pub fn parameters_mut<'a>(
        &'a mut self,
        path: &str,
        out: &mut Vec<LayerParam<'a>>,
    ) -> Result<()> {
        let SparseMoe {
            gate,
            switch_mlp,
            shared_expert,
            names: [router, experts],
            ..
        } = self;
        let p = |n: &str| format!("{path}.{n}");
        gate.parameters_mut(&p(router), out)?;
        switch_mlp.parameters_mut(&p(experts), out);
        if let Some((mlp, shared_gate)) = shared_expert {
            mlp.parameters_mut(&p("shared_expert"), &MlpNames::LLAMA, out)?;
            shared_gate.parameters_mut(&p("shared_expert_gate"), out)?;
        }
        Ok(())
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let k = self.top_k;
        let shape = x.shape();
        let d = shape.last().copied().unwrap_or(0);
        let flatten = matches!(
            self.router,
            Router::SoftmaxLowerPartition { flatten: true, .. }
        );
        let x_in = if flatten {
            ops::reshape(x, &[-1, d], None)?
        } else {
            x.clone()
        };
        let last = |a: &Array, from: i32, to: i32| -> Result<Array> {
            Ok(ops::slice_axis(a, -1, from, to, None)?)
        };
        let gates = self.gate.forward(&x_in)?;
        let (inds, scores, cast_back) = match self.router {
            Router::SoftmaxUpperPartition {
                norm_topk_prob,
                cast_back,
            } => {
                let gates = ops::softmax(&gates, &[-1], true, None)?;
                let n = gates.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&gates, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let mut scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                if norm_topk_prob {
                    scores = (&scores / &ops::sum(&scores, &[-1], true, None)?)?;
                }
                (inds, scores, cast_back)
            }
            Router::SoftmaxLowerPartition { norm_topk_prob, .. } => {
                let axis = if flatten { 1 } else { -1 };
                let gates = ops::softmax(&gates, &[axis], true, None)?;
                let inds = lower_top_k(&gates, k)?;
                let mut scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                if norm_topk_prob {
                    scores = (&scores / &ops::sum(&scores, &[-1], true, None)?)?;
                }
                (inds, scores, false)
            }
            Router::UpperTopKThenSoftmax => {
                let n = gates.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&gates, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let values = ops::take_along_axis(&gates, &inds, -1, None)?;
                (inds, ops::softmax(&values, &[-1], true, None)?, false)
            }
            Router::TopKThenSoftmax => {
                let inds = lower_top_k(&gates, k)?;
                let scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                let scores = ops::softmax(&scores, &[-1], true, None)?;
                (inds, scores, false)
            }
        };
        let y = self.switch_mlp.forward(&x_in, &inds)?;
        let weighted = (&y * &ops::expand_dims(&scores, &[-1], None)?)?;
        let mut out = ops::sum(&weighted, &[-2], false, None)?;
        if cast_back {
            out = out.astype(y.dtype())?;
        }
        if let Some((mlp, gate)) = &self.shared_expert {
            let shared = mlp.forward(x)?;
            let shared = (&ops::sigmoid(&gate.forward(x)?, None)? * &shared)?;
            out = (&out + &shared)?;
        }
        if flatten {
            out = ops::reshape(&out, &shape, None)?;
        }
        if self.sharded {
            out = mlx_core::distributed::all_sum(&out, None, None)?;
        }
        Ok(out)
    }
}

/// The token ids a model's `forward` accepts: `(batch, seq)` of an integer type.
pub(crate) fn check_inputs(inputs: &Array) -> Result<()> {
    if inputs.ndim() != 2 || !inputs.dtype().is_integer() {
        return Err(ModelError::Other(format!(
            "inputs must be (batch, seq) integer token ids, got shape {:?} of {:?}",
            inputs.shape(),
            inputs.dtype()
        )));
    }
    Ok(())
}

/// `stop_gradient(argpartition(-gates, kth=k - 1, axis=-1)[..., :k])`.
fn lower_top_k(gates: &Array, k: i32) -> Result<Array> {
    let neg = ops::negative(gates, None)?;
    let inds = ops::slice_axis(&ops::argpartition(&neg, k - 1, -1, None)?, -1, 0, k, None)?;
    Ok(ops::stop_gradient(&inds, None)?)
}

/// A layer's feed-forward block: a dense MLP or the experts.
#[derive(Clone)]
pub(crate) enum Ffn {
    Dense(Mlp),
    Sparse(Box<SparseMoe>),
}

impl Ffn {
    /// The block's arrays under `path` (full fine-tuning).
    pub(crate) fn parameters_mut<'a>(
        &'a mut self,
        path: &str,
        out: &mut Vec<LayerParam<'a>>,
    ) -> Result<()> {
        match self {
            Ffn::Dense(m) => m.parameters_mut(path, &MlpNames::LLAMA, out),
            Ffn::Sparse(m) => m.parameters_mut(path, out),
        }
    }

    /// The block's linears and switch linears under their paths inside it, in mlx-lm's
    /// declaration order (a dense MLP: gate, down, up).
    pub(crate) fn linears_mut(&mut self) -> Vec<(String, LinearMut<'_>)> {
        match self {
            Ffn::Dense(m) => m
                .linears_mut(&MlpNames::LLAMA)
                .into_iter()
                .map(|(n, l)| (n.to_string(), LinearMut::Linear(l)))
                .collect(),
            Ffn::Sparse(m) => m.linears_mut(),
        }
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Sparse(m) => m.forward(x),
        }
    }
}

#[derive(Clone)]
struct DecoderLayer {
    self_attn: Attention,
    ffn: Ffn,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    /// The layer's linears and switch linears under their paths inside it (`ffn` is the
    /// feed-forward block's module name), attention first.
    fn linears_mut(&mut self, ffn: &str) -> Vec<(String, LinearMut<'_>)> {
        let DecoderLayer {
            self_attn,
            ffn: block,
            ..
        } = self;
        let mut out: Vec<(String, LinearMut<'_>)> = self_attn
            .linears_mut()
            .into_iter()
            .map(|(n, l)| (format!("self_attn.{n}"), LinearMut::Linear(l)))
            .collect();
        for (n, l) in block.linears_mut() {
            out.push((format!("{ffn}.{n}"), l));
        }
        out
    }

    /// Every array of the layer under `path` (`model.layers.<i>`); `ffn` is the feed-forward
    /// block's module name.
    fn parameters_mut(&mut self, path: &str, ffn: &str) -> Result<Vec<LayerParam<'_>>> {
        let DecoderLayer {
            self_attn,
            ffn: block,
            input_layernorm,
            post_attention_layernorm,
        } = self;
        let mut out = Vec::new();
        self_attn.parameters_mut(&format!("{path}.self_attn"), &mut out)?;
        block.parameters_mut(&format!("{path}.{ffn}"), &mut out)?;
        for (name, n) in [
            ("input_layernorm", input_layernorm),
            ("post_attention_layernorm", post_attention_layernorm),
        ] {
            n.parameters_mut(&format!("{path}.{name}"), &mut out);
        }
        Ok(out)
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = (x + &r)?;
        let n = self.post_attention_layernorm.forward(&h)?;
        let r = self.ffn.forward(&n)?;
        Ok((&h + &r)?)
    }
}

impl LayerArrays for DecoderLayer {
    fn arrays_mut(&mut self) -> Result<Vec<LayerParam<'_>>> {
        self.parameters_mut("", "ffn")
    }

    fn linears(&mut self) -> Vec<LinearMut<'_>> {
        self.linears_mut("ffn")
            .into_iter()
            .map(|(_, l)| l)
            .collect()
    }
}

/// A mixture-of-experts decoder (mixtral, qwen2_moe, qwen3_moe, olmoe).
pub struct Model {
    spec: MoeSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// First full-attention and first sliding-window layer (whose caches make the masks).
    fa_idx: usize,
    swa_idx: Option<usize>,
    /// `--grad-checkpoint`: every layer under `mx.checkpoint` (training, no caches).
    grad_checkpoint: bool,
    /// The layers whose own arrays enter their checkpoints (full fine-tuning).
    checkpoint_own: std::ops::Range<usize>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let spec = MoeSpec::from_config(config)?;
        sanitize(&spec, w)?;
        let eps = spec.rms_norm_eps;
        let dim = spec.hidden_size;
        let embed_tokens = Embedding::load(w, "model.embed_tokens", spec.vocab_size, dim)?;
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
                    false,
                    false,
                    MlpKind::SwiGlu,
                )?)
            } else {
                Ffn::Sparse(Box::new(SparseMoe::load(
                    &spec,
                    w,
                    &format!("{p}.{}", spec.moe_module),
                )?))
            };
            layers.push(DecoderLayer {
                self_attn: Attention::load(&spec, w, &format!("{p}.self_attn"))?,
                ffn,
                input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), dim, eps)?,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    dim,
                    eps,
                )?,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", dim, eps)?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(w, "lm_head", dim, spec.vocab_size, false)?)
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
        })
    }
}

impl Model {
    fn is_sliding(&self, i: usize) -> bool {
        self.spec.sliding.get(i).copied().unwrap_or(false)
    }
}

/// The rows' `sanitize`: drop a tied `lm_head`, and stack per-expert checkpoints
/// (`experts.<e>.<proj>.{weight,scales,biases}`, mixtral's `w1`/`w2`/`w3`) into `switch_mlp`.
fn sanitize(s: &MoeSpec, w: &mut Weights) -> Result<()> {
    if s.attn_sinks {
        return sanitize_gpt_oss(w);
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
        for (from, to) in names {
            for k in ["weight", "scales", "biases"] {
                if !w.contains(&format!("{prefix}.experts.0.{from}.{k}")) {
                    continue;
                }
                let mut parts = Vec::with_capacity(s.num_experts as usize);
                for e in 0..s.num_experts {
                    let name = format!("{prefix}.experts.{e}.{from}.{k}");
                    parts
                        .push(w.remove(&name).ok_or_else(|| {
                            ModelError::Weights(vec![format!("missing: {name}")])
                        })?);
                }
                let refs: Vec<&Array> = parts.iter().collect();
                w.insert(
                    format!("{prefix}.switch_mlp.{to}.{k}"),
                    ops::stack(&refs, 0, None)?,
                );
            }
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
        let n = h.shape().get(1).copied().unwrap_or(0) as usize;
        let mut caches = caches;
        let (mask, swa_mask) = match caches.as_deref_mut() {
            Some(caches) => {
                if caches.len() != self.layers.len() {
                    return Err(ModelError::Other(format!(
                        "{} caches for {} layers",
                        caches.len(),
                        self.layers.len()
                    )));
                }
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
        for (i, layer) in self.layers.iter().enumerate() {
            let m = if self.is_sliding(i) {
                swa_mask.as_ref().unwrap_or(&mask)
            } else {
                &mask
            }
            .clone();
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let ckpt = self
                .grad_checkpoint
                .then(|| self.checkpoint_own.contains(&i));
            h = layer_step(layer, &h, cache, ckpt, move |l, x, c| l.forward(x, &m, c))?;
        }
        self.norm.forward(&h)
    }

    /// The output head over normed hidden states.
    fn head(&self, out: &Array) -> Result<Array> {
        super::project(self.lm_head.as_ref(), &self.embed_tokens, out)
    }
}

impl Model {
    /// Tensor parallelism as qwen3_moe's `shard()`: q/k/v all-to-sharded, o sharded-to-all,
    /// heads and KV heads / N; dense MLPs as llama's; the experts sharded in place (gate, up
    /// by output rows, down by input columns) with the block's output summed (`all_sum`).
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all, switch_inplace};
        let t = self.spec.model_type.as_str();
        if t != "qwen3_moe" {
            return Err(ModelError::Other(format!(
                "tensor parallelism: model_type `{t}` is not supported yet (qwen3_moe)"
            )));
        }
        if size < 1 || rank < 0 || rank >= size {
            return Err(ModelError::Other(format!(
                "tensor parallelism: rank {rank} of {size}"
            )));
        }
        for (i, l) in self.layers.iter_mut().enumerate() {
            let what = |m: &str| format!("model.layers.{i}.{m}");
            let a = &mut l.self_attn;
            if a.n_heads % size != 0 || a.n_kv_heads % size != 0 || a.sinks.is_some() {
                return Err(ModelError::Other(format!(
                    "{}: {} heads and {} KV heads do not split over {size} ranks",
                    what("self_attn"),
                    a.n_heads,
                    a.n_kv_heads
                )));
            }
            all_to_sharded(&mut a.q_proj, size, rank, &what("self_attn.q_proj"))?;
            all_to_sharded(&mut a.k_proj, size, rank, &what("self_attn.k_proj"))?;
            all_to_sharded(&mut a.v_proj, size, rank, &what("self_attn.v_proj"))?;
            sharded_to_all(&mut a.o_proj, size, rank, &what("self_attn.o_proj"))?;
            a.n_heads /= size;
            a.n_kv_heads /= size;
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
                    if m.shared_expert.is_some() {
                        return Err(ModelError::Other(format!(
                            "{}: a shared expert cannot be sharded yet",
                            what("mlp")
                        )));
                    }
                    let e = &mut m.switch_mlp;
                    let w = |n: &str| what(&format!("mlp.switch_mlp.{n}"));
                    switch_inplace(&mut e.gate_proj, true, size, rank, &w("gate_proj"))?;
                    switch_inplace(&mut e.down_proj, false, size, rank, &w("down_proj"))?;
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

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    fn top_modules_mut(&mut self) -> Vec<(String, super::TopModuleMut<'_>)> {
        super::head_and_embedding(
            "",
            self.lm_head.as_mut(),
            "lm_head",
            &mut self.embed_tokens,
            "model.embed_tokens",
        )
    }

    /// The projection `head` applies (for the chunked cross-entropy of training).
    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::of(
            self.lm_head.as_ref(),
            &self.embed_tokens,
        ))
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
        self.swa_idx.is_some()
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn layer_adaptables_mut(&mut self) -> Vec<Vec<(String, LinearMut<'_>)>> {
        let Model { spec, layers, .. } = self;
        layers
            .iter_mut()
            .zip(&spec.dense_layers)
            .map(|(l, dense)| l.linears_mut(if *dense { "mlp" } else { spec.moe_module }))
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
                l.parameters_mut(&format!("model.layers.{i}"), ffn)
            })
            .collect()
    }
}
