//! The MLA / DeepSeek V3 family of mlx-lm 0.32.2: `models/deepseek_v3.py`, `kimi_k25.py` (a
//! DeepSeek V3 text model under `language_model.`, vision weights dropped) and
//! `glm4_moe_lite.py` (DeepSeek V3 with its own defaults, `rms_norm_eps` in the latent norms and
//! `1e-20` added to the routing denominator), and `dots1.py` (the same router and experts
//! under standard attention with per-head q/k norms, the experts named `experts`) and
//! `deepseek.py` (DeepSeek V1: standard attention, a softmax router, no MLA) and
//! `deepseek_v2.py` (the latent projections expanded through `kv_b_proj` into a plain cache,
//! its own YaRN rope, a softmax router, optionally group-limited) and `minicpm3.py` (that
//! expanded MLA with SuScaled rope in a dense MiniCPM decoder: scaled embeddings, residuals
//! and head input) and `mistral4.py` (absorbed MLA whose prompt branch concatenates the rope
//! part into the keys, Llama 4's per-position query scale, a softmax `mistral4_expert_select`
//! behind a linear gate) and `deepseek_v32.py` / `glm_moe_dsa.py` (deepseek_v3 with DeepSeek
//! Sparse Attention: an indexer with its own cache picks the attended positions). Each row reads its `ModelArgs` with mlx-lm's
//! names and defaults into a [`DeepseekSpec`]; the attention is [`MlaAttention`], the experts
//! the shared MoE block (`moe_block.rs`): one [`SwitchGlu`] routed by
//! [`Router::DeepseekGroup`] (`group_expert_select`, compiled as mlx-lm compiles it) or
//! [`Router::DeepseekSoftmax`], with the un-gated shared experts.

use mlx_cache::{AttentionMask, Cache, CacheList, KVCache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::mla::{Indexer, IndexerSpec, MlaAttention, MlaSpec};
use crate::layers::{
    Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope, RopeScaling, SwitchActivation,
    SwitchGlu,
};
use crate::models::moe_block::{Ffn, GroupSelect, MoeParts, Router, SparseMoe};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// What a row fixes about the family.
#[derive(Clone, Debug)]
pub struct DeepseekSpec {
    pub model_type: String,
    /// Where the text model's weights live (`""`, or kimi_k25's `language_model.`).
    pub prefix: &'static str,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub n_shared_experts: Option<i32>,
    pub n_routed_experts: Option<i32>,
    pub routed_scaling_factor: f64,
    pub kv_lora_rank: i32,
    pub q_lora_rank: Option<i32>,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    pub qk_nope_head_dim: i32,
    pub norm_topk_prob: bool,
    pub n_group: i32,
    pub topk_group: i32,
    pub num_experts_per_tok: i32,
    pub moe_layer_freq: i32,
    pub first_k_dense_replace: i32,
    pub max_position_embeddings: i64,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub attention_bias: bool,
    /// glm4_moe_lite: the latent norms use `rms_norm_eps` (deepseek_v3: 1e-6).
    pub lora_norm_eps: f32,
    /// glm4_moe_lite: `scores / (denominator + 1e-20)`.
    pub denominator_eps: bool,
    /// dots1: standard attention (q/k RMS norms per head) instead of MLA.
    pub standard_attention: Option<StandardAttention>,
    /// Module name of the routed experts: `switch_mlp`, dots1's `experts`.
    pub experts_name: &'static str,
    /// dots1's `mlp_bias` on the dense MLPs and the shared experts.
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    pub sanitize: Sanitize,
    /// deepseek_v2's `topk_method == "group_limited_greedy"`.
    pub group_limited: bool,
    /// minicpm3: `embed_tokens(x) * scale_emb`.
    pub scale_emb: Option<f32>,
    /// minicpm3: each residual branch times `scale_depth / num_hidden_layers ** 0.5`.
    pub residual_scale: Option<f32>,
    /// minicpm3 (untied head): the head's input divided by `hidden_size / dim_model_base`.
    pub head_div: Option<f32>,
    /// mistral4: Llama 4's query scale `(llama_4_scaling_beta, original_max_position_embeddings)`.
    pub query_scale: Option<(f64, i64)>,
    /// The MLA rope's `traditional` (mistral4: `rope_interleave`, default true).
    pub rope_traditional: bool,
    /// deepseek_v32 / glm_moe_dsa: `(index_n_heads, index_head_dim, index_topk,
    /// indexer_rope_interleave)`.
    pub indexer: Option<(i32, i32, i32, bool)>,
}

/// The knobs of a standard attention (dots1, deepseek).
#[derive(Clone, Copy, Debug)]
pub struct StandardAttention {
    pub n_kv_heads: i32,
    pub head_dim: i32,
    /// dots1: RMS norms over each head of q and k.
    pub qk_norm: bool,
    /// deepseek: `attention_bias` on all four projections (glm4_moe: on q, k and v only).
    pub bias: bool,
    /// Whether `o_proj` has a bias.
    pub o_bias: bool,
    /// The rotated dimensions of each head (glm4_moe: `head_dim * partial_rotary_factor`).
    pub rope_dims: i32,
}

/// Which `sanitize` a row runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sanitize {
    /// deepseek_v3 / kimi_k25: drop `model.layers.61*` and `rotary_emb.inv_freq`.
    DeepseekV3,
    /// glm4_moe_lite: drop the layers past `num_hidden_layers`.
    Glm4MoeLite,
    /// dots1: drop a tied `lm_head` and `rotary_emb.inv_freq`; stack only the MoE layers.
    Dots1,
    /// deepseek: stack the experts only.
    Deepseek,
    /// deepseek_v2: stack the experts only (w1/w2/w3 names are not mapped there either).
    DeepseekV2,
    /// minicpm3: no sanitize.
    MiniCpm3,
    /// mistral4: fused `experts.gate_up_proj` / `experts.down_proj` renamed, experts stacked,
    /// `kv_b_proj` absorbed.
    Mistral4,
    /// deepseek_v32 / glm_moe_dsa: drop the layers past `num_hidden_layers`, as glm4_moe_lite.
    DeepseekV32,
    /// glm4_moe: stack the experts; drop the multi-token-prediction layer (every name starting
    /// `model.layers.<num_hidden_layers>`).
    Glm4Moe,
    /// kimi_vl: drop every name containing `vision_tower`, `rotary_emb` or
    /// `multi_modal_projector`; stack the experts.
    KimiVl,
    /// youtu_llm: drop a tied `lm_head` only (expanded MLA, as deepseek_v2's).
    Youtu,
}

/// deepseek_v3.py / glm4_moe_lite.py `ModelArgs`; absent fields take the row's defaults.
#[derive(Deserialize)]
struct Args {
    vocab_size: Option<i32>,
    hidden_size: Option<i32>,
    intermediate_size: Option<i32>,
    moe_intermediate_size: Option<i32>,
    num_hidden_layers: Option<i32>,
    num_attention_heads: Option<i32>,
    #[serde(default, deserialize_with = "present")]
    n_shared_experts: Option<Option<i32>>,
    #[serde(default, deserialize_with = "present")]
    n_routed_experts: Option<Option<i32>>,
    routed_scaling_factor: Option<f64>,
    kv_lora_rank: Option<i32>,
    #[serde(default, deserialize_with = "present")]
    q_lora_rank: Option<Option<i32>>,
    qk_rope_head_dim: Option<i32>,
    v_head_dim: Option<i32>,
    qk_nope_head_dim: Option<i32>,
    topk_method: Option<String>,
    norm_topk_prob: Option<bool>,
    n_group: Option<i32>,
    topk_group: Option<i32>,
    num_experts_per_tok: Option<i32>,
    moe_layer_freq: Option<i32>,
    first_k_dense_replace: Option<i32>,
    max_position_embeddings: Option<i64>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    attention_bias: Option<bool>,
    // dots1
    num_key_value_heads: Option<i32>,
    #[serde(default)]
    head_dim: Option<i32>,
    mlp_bias: Option<bool>,
    tie_word_embeddings: Option<bool>,
    // glm4_moe
    partial_rotary_factor: Option<f64>,
    use_qk_norm: Option<bool>,
    // youtu_llm
    rope_traditional: Option<bool>,
}

/// A field that may be given as `null` (`Some(None)`), as opposed to absent (`None`).
fn present<'de, D, T>(d: D) -> std::result::Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The defaults of one `ModelArgs` dataclass.
struct Defaults {
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    moe_intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    n_shared_experts: Option<i32>,
    n_routed_experts: Option<i32>,
    routed_scaling_factor: f64,
    q_lora_rank: Option<i32>,
    v_head_dim: i32,
    qk_nope_head_dim: i32,
    num_experts_per_tok: i32,
    first_k_dense_replace: i32,
    max_position_embeddings: i64,
    rms_norm_eps: f64,
    rope_theta: f64,
}

const DEEPSEEK_V3: Defaults = Defaults {
    vocab_size: 102400,
    hidden_size: 4096,
    intermediate_size: 11008,
    moe_intermediate_size: 1407,
    num_hidden_layers: 30,
    num_attention_heads: 32,
    n_shared_experts: None,
    n_routed_experts: None,
    routed_scaling_factor: 1.0,
    q_lora_rank: Some(1536),
    v_head_dim: 128,
    qk_nope_head_dim: 128,
    num_experts_per_tok: 1,
    first_k_dense_replace: 0,
    max_position_embeddings: 2048,
    rms_norm_eps: 1e-6,
    rope_theta: 10000.0,
};

const GLM4_MOE_LITE: Defaults = Defaults {
    vocab_size: 154880,
    hidden_size: 2048,
    intermediate_size: 10240,
    moe_intermediate_size: 1536,
    num_hidden_layers: 47,
    num_attention_heads: 20,
    n_shared_experts: Some(1),
    n_routed_experts: Some(64),
    routed_scaling_factor: 1.8,
    q_lora_rank: Some(768),
    v_head_dim: 256,
    qk_nope_head_dim: 192,
    num_experts_per_tok: 4,
    first_k_dense_replace: 1,
    max_position_embeddings: 202752,
    rms_norm_eps: 1e-5,
    rope_theta: 1_000_000.0,
};

impl DeepseekSpec {
    /// The row for `config.architecture`.
    pub fn from_config(config: &ModelConfig) -> Result<DeepseekSpec> {
        let t = config.architecture.as_str();
        let (raw, prefix, d, lite) = match t {
            "deepseek_v3" | "dots1" | "deepseek" | "deepseek_v2" | "minicpm3" | "mistral4"
            | "deepseek_v32" | "glm_moe_dsa" => (config.raw.clone(), "", &DEEPSEEK_V3, false),
            "glm4_moe_lite" => (config.raw.clone(), "", &GLM4_MOE_LITE, true),
            // kimi_vl's `TextArgs` has deepseek_v3's defaults.
            "kimi_k25" | "kimi_vl" => {
                let text = config
                    .raw
                    .get("text_config")
                    .filter(|v| v.is_object())
                    .cloned()
                    .ok_or_else(|| {
                        ModelError::Config(format!("{t}: `text_config` must be an object"))
                    })?;
                (text, "language_model.", &DEEPSEEK_V3, false)
            }
            "glm4_moe" | "solar_open" | "youtu_llm" => {
                (config.raw.clone(), "", &DEEPSEEK_V3, false)
            }
            other => {
                return Err(ModelError::Config(format!(
                    "`{other}` is not an MLA / DeepSeek V3 row"
                )))
            }
        };
        let mut a: Args = crate::config::parse_args(&raw, t)?;
        let v32 = matches!(t, "deepseek_v32" | "glm_moe_dsa");
        if t == "glm_moe_dsa" {
            // `__post_init__`: rope_scaling and rope_theta come from `rope_parameters`.
            let rp = raw
                .get("rope_parameters")
                .and_then(Value::as_object)
                .cloned()
                .ok_or_else(|| {
                    ModelError::Config("glm_moe_dsa: config.json needs `rope_parameters`".into())
                })?;
            a.rope_theta = Some(
                rp.get("rope_theta")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| {
                        ModelError::Config(
                            "glm_moe_dsa: rope_parameters needs a number `rope_theta`".into(),
                        )
                    })?,
            );
            a.rope_scaling = Some(rp);
        }
        let indexer = if v32 {
            let int = |k: &str, d: i64| -> Result<i32> {
                match raw.get(k) {
                    None if t == "deepseek_v32" => Ok(d as i32),
                    v => v
                        .and_then(Value::as_i64)
                        .and_then(|v| i32::try_from(v).ok())
                        .filter(|v| *v > 0)
                        .ok_or_else(|| {
                            ModelError::Config(format!("{t}: `{k}` must be a positive integer"))
                        }),
                }
            };
            Some((
                int("index_n_heads", 64)?,
                int("index_head_dim", 128)?,
                int("index_topk", 2048)?,
                raw.get("indexer_rope_interleave")
                    .and_then(Value::as_bool)
                    .unwrap_or(t == "glm_moe_dsa"),
            ))
        } else {
            None
        };
        match t {
            "minicpm3" => return Self::minicpm3(config),
            "mistral4" => return Self::mistral4(config),
            "dots1" => return Self::dots1(config, a),
            "deepseek" => return Self::deepseek(config, a),
            "glm4_moe" | "solar_open" => return Self::glm4_moe(config, a),
            "youtu_llm" => return Self::youtu_llm(config, a),
            _ => {}
        }
        let v2 = t == "deepseek_v2";
        let rope_scaling = if v2 {
            // `DeepseekV2YarnRotaryEmbedding` whatever the type; mlx-lm fails without one.
            let mut rs = a.rope_scaling.clone().ok_or_else(|| {
                ModelError::Config("deepseek_v2: config.json needs `rope_scaling`".into())
            })?;
            if !rs.get("factor").is_some_and(Value::is_number) {
                return Err(ModelError::Config(
                    "deepseek_v2: rope_scaling needs a numeric `factor`".into(),
                ));
            }
            rs.remove("rope_type");
            rs.insert("type".into(), Value::from("yarn"));
            Some(rs)
        } else {
            a.rope_scaling.clone()
        };
        let group_limited = v2 && a.topk_method.as_deref() == Some("group_limited_greedy");
        if let Some(m) = a.topk_method.as_ref().filter(|_| !v2) {
            if m != "noaux_tc" {
                return Err(ModelError::Config(format!(
                    "{t}: topk_method `{m}` is not supported (mlx-lm's MoEGate asserts \
                     \"noaux_tc\")"
                )));
            }
        }
        let rms_norm_eps = a.rms_norm_eps.unwrap_or(d.rms_norm_eps) as f32;
        let spec = DeepseekSpec {
            model_type: config.model_type.clone(),
            prefix,
            vocab_size: a.vocab_size.unwrap_or(d.vocab_size),
            hidden_size: a.hidden_size.unwrap_or(d.hidden_size),
            intermediate_size: a.intermediate_size.unwrap_or(d.intermediate_size),
            moe_intermediate_size: a.moe_intermediate_size.unwrap_or(d.moe_intermediate_size),
            num_hidden_layers: a.num_hidden_layers.unwrap_or(d.num_hidden_layers),
            num_attention_heads: a.num_attention_heads.unwrap_or(d.num_attention_heads),
            n_shared_experts: a.n_shared_experts.unwrap_or(d.n_shared_experts),
            n_routed_experts: a.n_routed_experts.unwrap_or(d.n_routed_experts),
            routed_scaling_factor: a.routed_scaling_factor.unwrap_or(d.routed_scaling_factor),
            kv_lora_rank: a.kv_lora_rank.unwrap_or(512),
            q_lora_rank: a.q_lora_rank.unwrap_or(d.q_lora_rank),
            qk_rope_head_dim: a.qk_rope_head_dim.unwrap_or(64),
            v_head_dim: a.v_head_dim.unwrap_or(d.v_head_dim),
            qk_nope_head_dim: a.qk_nope_head_dim.unwrap_or(d.qk_nope_head_dim),
            norm_topk_prob: a.norm_topk_prob.unwrap_or(true),
            n_group: a.n_group.unwrap_or(1),
            topk_group: a.topk_group.unwrap_or(1),
            num_experts_per_tok: a.num_experts_per_tok.unwrap_or(d.num_experts_per_tok),
            moe_layer_freq: a.moe_layer_freq.unwrap_or(1),
            first_k_dense_replace: a.first_k_dense_replace.unwrap_or(d.first_k_dense_replace),
            max_position_embeddings: a
                .max_position_embeddings
                .unwrap_or(d.max_position_embeddings),
            rms_norm_eps,
            rope_theta: a.rope_theta.unwrap_or(d.rope_theta),
            rope_scaling,
            attention_bias: a.attention_bias.unwrap_or(false),
            lora_norm_eps: if lite { rms_norm_eps } else { 1e-6 },
            denominator_eps: lite,
            standard_attention: None,
            experts_name: "switch_mlp",
            mlp_bias: false,
            tie_word_embeddings: false,
            sanitize: if lite {
                Sanitize::Glm4MoeLite
            } else if v2 {
                Sanitize::DeepseekV2
            } else if v32 {
                Sanitize::DeepseekV32
            } else if t == "kimi_vl" {
                Sanitize::KimiVl
            } else {
                Sanitize::DeepseekV3
            },
            group_limited,
            scale_emb: None,
            residual_scale: None,
            head_div: None,
            query_scale: None,
            rope_traditional: true,
            indexer,
        };
        if v32 && spec.q_lora_rank.is_none() {
            return Err(ModelError::Config(format!(
                "{t}: q_lora_rank is required (the indexer reads the query latent)"
            )));
        }
        if v2 && spec.n_routed_experts.is_some() && a.num_experts_per_tok.is_none() {
            return Err(ModelError::Config(
                "deepseek_v2: routed experts need `num_experts_per_tok`".into(),
            ));
        }
        if group_limited && (a.n_group.is_none() || a.topk_group.is_none()) {
            return Err(ModelError::Config(
                "deepseek_v2: group_limited_greedy needs `n_group` and `topk_group`".into(),
            ));
        }
        spec.validate()
    }

    /// mistral4.py's `ModelArgs` (most fields required there; `rope_parameters` is read for
    /// the query scale, so it is required too).
    fn mistral4(config: &ModelConfig) -> Result<DeepseekSpec> {
        #[derive(Deserialize)]
        struct A {
            vocab_size: i32,
            hidden_size: i32,
            intermediate_size: i32,
            moe_intermediate_size: i32,
            num_hidden_layers: i32,
            num_attention_heads: i32,
            n_shared_experts: Option<i32>,
            n_routed_experts: Option<i32>,
            routed_scaling_factor: f64,
            kv_lora_rank: i32,
            q_lora_rank: Option<i32>,
            norm_topk_prob: bool,
            max_position_embeddings: i64,
            rms_norm_eps: f64,
            topk_group: i32,
            num_experts_per_tok: i32,
            first_k_dense_replace: i32,
            n_group: i32,
            qk_rope_head_dim: i32,
            qk_nope_head_dim: i32,
            v_head_dim: i32,
            #[serde(default)]
            tie_word_embeddings: bool,
            #[serde(default)]
            rope_interleave: Option<bool>,
            #[serde(default)]
            attention_bias: bool,
            #[serde(default)]
            rope_parameters: Option<RopeScaling>,
        }
        let a: A = config.args()?;
        let rp = a.rope_parameters.ok_or_else(|| {
            ModelError::Config("mistral4: config.json needs `rope_parameters`".into())
        })?;
        let num = |k: &str| {
            rp.get(k).and_then(Value::as_f64).ok_or_else(|| {
                ModelError::Config(format!("mistral4: rope_parameters needs a number `{k}`"))
            })
        };
        let query_scale = (
            num("llama_4_scaling_beta")?,
            num("original_max_position_embeddings")? as i64,
        );
        let rope_theta = rp
            .get("rope_theta")
            .map(|v| {
                v.as_f64().ok_or_else(|| {
                    ModelError::Config(
                        "mistral4: rope_parameters.rope_theta must be a number".into(),
                    )
                })
            })
            .transpose()?
            .unwrap_or(100000.0);
        let spec = DeepseekSpec {
            model_type: config.model_type.clone(),
            prefix: "",
            vocab_size: a.vocab_size,
            hidden_size: a.hidden_size,
            intermediate_size: a.intermediate_size,
            moe_intermediate_size: a.moe_intermediate_size,
            num_hidden_layers: a.num_hidden_layers,
            num_attention_heads: a.num_attention_heads,
            n_shared_experts: a.n_shared_experts,
            n_routed_experts: a.n_routed_experts,
            routed_scaling_factor: a.routed_scaling_factor,
            kv_lora_rank: a.kv_lora_rank,
            q_lora_rank: a.q_lora_rank,
            qk_rope_head_dim: a.qk_rope_head_dim,
            v_head_dim: a.v_head_dim,
            qk_nope_head_dim: a.qk_nope_head_dim,
            norm_topk_prob: a.norm_topk_prob,
            n_group: a.n_group,
            topk_group: a.topk_group,
            num_experts_per_tok: a.num_experts_per_tok,
            moe_layer_freq: 1,
            first_k_dense_replace: a.first_k_dense_replace,
            max_position_embeddings: a.max_position_embeddings,
            rms_norm_eps: a.rms_norm_eps as f32,
            rope_theta,
            rope_scaling: Some(rp),
            attention_bias: a.attention_bias,
            lora_norm_eps: 1e-6,
            denominator_eps: true,
            standard_attention: None,
            experts_name: "switch_mlp",
            mlp_bias: false,
            tie_word_embeddings: a.tie_word_embeddings,
            sanitize: Sanitize::Mistral4,
            group_limited: false,
            scale_emb: None,
            residual_scale: None,
            head_div: None,
            query_scale: Some(query_scale),
            rope_traditional: a.rope_interleave.unwrap_or(true),
            indexer: None,
        };
        spec.validate()
    }

    /// minicpm3.py's `ModelArgs` (most fields required there).
    fn minicpm3(config: &ModelConfig) -> Result<DeepseekSpec> {
        #[derive(Deserialize)]
        struct A {
            hidden_size: i32,
            dim_model_base: f64,
            num_hidden_layers: i32,
            intermediate_size: i32,
            num_attention_heads: i32,
            rms_norm_eps: f64,
            vocab_size: i32,
            q_lora_rank: i32,
            qk_nope_head_dim: i32,
            qk_rope_head_dim: i32,
            kv_lora_rank: i32,
            scale_depth: f64,
            scale_emb: f64,
            max_position_embeddings: i64,
            #[serde(default)]
            attention_bias: bool,
            #[serde(default = "minicpm3_theta")]
            rope_theta: f64,
            #[serde(default)]
            rope_scaling: Option<RopeScaling>,
            #[serde(default)]
            tie_word_embeddings: bool,
        }
        fn minicpm3_theta() -> f64 {
            1_000_000.0
        }
        let a: A = config.args()?;
        if a.num_attention_heads <= 0 || a.num_hidden_layers <= 0 || a.dim_model_base == 0.0 {
            return Err(ModelError::Config(
                "minicpm3: num_attention_heads, num_hidden_layers and dim_model_base must be \
                 non-zero"
                    .into(),
            ));
        }
        // `SuScaledRoPE` with the `.get` defaults of minicpm3.py (mlx-lm fails without a
        // rope_scaling).
        let mut rs = a.rope_scaling.ok_or_else(|| {
            ModelError::Config("minicpm3: config.json needs `rope_scaling`".into())
        })?;
        for (k, v) in [
            ("original_max_position_embeddings", Value::from(4096)),
            ("short_factor", Value::from(1.0)),
            ("long_factor", Value::from(1.0)),
        ] {
            rs.entry(k.to_string()).or_insert(v);
        }
        rs.remove("rope_type");
        rs.insert("type".into(), Value::from("longrope"));
        let spec = DeepseekSpec {
            model_type: config.model_type.clone(),
            prefix: "",
            vocab_size: a.vocab_size,
            hidden_size: a.hidden_size,
            intermediate_size: a.intermediate_size,
            moe_intermediate_size: 1,
            num_hidden_layers: a.num_hidden_layers,
            num_attention_heads: a.num_attention_heads,
            n_shared_experts: None,
            n_routed_experts: None,
            routed_scaling_factor: 1.0,
            kv_lora_rank: a.kv_lora_rank,
            q_lora_rank: Some(a.q_lora_rank),
            qk_rope_head_dim: a.qk_rope_head_dim,
            v_head_dim: a.hidden_size / a.num_attention_heads,
            qk_nope_head_dim: a.qk_nope_head_dim,
            norm_topk_prob: false,
            n_group: 1,
            topk_group: 1,
            num_experts_per_tok: 1,
            moe_layer_freq: 1,
            first_k_dense_replace: 0,
            max_position_embeddings: a.max_position_embeddings,
            rms_norm_eps: a.rms_norm_eps as f32,
            rope_theta: a.rope_theta,
            rope_scaling: Some(rs),
            attention_bias: a.attention_bias,
            // `nn.RMSNorm(dims)`'s default.
            lora_norm_eps: 1e-5,
            denominator_eps: false,
            standard_attention: None,
            experts_name: "switch_mlp",
            mlp_bias: false,
            tie_word_embeddings: a.tie_word_embeddings,
            sanitize: Sanitize::MiniCpm3,
            group_limited: false,
            scale_emb: Some(a.scale_emb as f32),
            residual_scale: Some((a.scale_depth / f64::from(a.num_hidden_layers).powf(0.5)) as f32),
            head_div: (!a.tie_word_embeddings)
                .then_some((f64::from(a.hidden_size) / a.dim_model_base) as f32),
            query_scale: None,
            rope_traditional: true,
            indexer: None,
        };
        spec.validate()
    }

    /// deepseek.py's `ModelArgs` (all defaulted there).
    fn deepseek(config: &ModelConfig, a: Args) -> Result<DeepseekSpec> {
        let hidden_size = a.hidden_size.unwrap_or(4096);
        let heads = a.num_attention_heads.unwrap_or(32);
        if heads <= 0 {
            return Err(ModelError::Config(format!(
                "deepseek: `num_attention_heads` must be positive, got {heads}"
            )));
        }
        // `nn.RoPE(head_dim, base, scale)`: only a linear `rope_scaling` changes the scale.
        let rope_scaling = match a.rope_scaling {
            Some(rs) => match rs.get("type").and_then(Value::as_str) {
                Some("linear") => {
                    if !rs.get("factor").is_some_and(Value::is_f64) {
                        return Err(ModelError::Config(
                            "deepseek: a linear rope_scaling needs a float `factor`".into(),
                        ));
                    }
                    Some(rs)
                }
                Some(_) => None,
                None => {
                    return Err(ModelError::Config(
                        "deepseek: rope_scaling lacks `type`".into(),
                    ))
                }
            },
            None => None,
        };
        let spec = DeepseekSpec {
            model_type: config.model_type.clone(),
            prefix: "",
            vocab_size: a.vocab_size.unwrap_or(102400),
            hidden_size,
            intermediate_size: a.intermediate_size.unwrap_or(11008),
            moe_intermediate_size: a.moe_intermediate_size.unwrap_or(1407),
            num_hidden_layers: a.num_hidden_layers.unwrap_or(30),
            num_attention_heads: heads,
            n_shared_experts: a.n_shared_experts.flatten(),
            n_routed_experts: a.n_routed_experts.flatten(),
            routed_scaling_factor: 1.0,
            kv_lora_rank: 1,
            q_lora_rank: None,
            qk_rope_head_dim: 1,
            v_head_dim: 1,
            qk_nope_head_dim: 1,
            norm_topk_prob: false,
            n_group: 1,
            topk_group: 1,
            num_experts_per_tok: match a.num_experts_per_tok {
                Some(k) => k,
                None if a.n_routed_experts.flatten().is_some() => {
                    return Err(ModelError::Config(
                        "deepseek: routed experts need `num_experts_per_tok`".into(),
                    ))
                }
                None => 1,
            },
            moe_layer_freq: a.moe_layer_freq.unwrap_or(1),
            first_k_dense_replace: a.first_k_dense_replace.unwrap_or(0),
            max_position_embeddings: a.max_position_embeddings.unwrap_or(2048),
            rms_norm_eps: a.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta: a.rope_theta.unwrap_or(10000.0),
            rope_scaling,
            attention_bias: a.attention_bias.unwrap_or(false),
            lora_norm_eps: 1e-6,
            denominator_eps: false,
            standard_attention: Some(StandardAttention {
                n_kv_heads: a.num_key_value_heads.unwrap_or(32),
                head_dim: hidden_size / heads,
                qk_norm: false,
                bias: a.attention_bias.unwrap_or(false),
                o_bias: a.attention_bias.unwrap_or(false),
                rope_dims: hidden_size / heads,
            }),
            experts_name: "switch_mlp",
            mlp_bias: false,
            tie_word_embeddings: false,
            sanitize: Sanitize::Deepseek,
            group_limited: false,
            scale_emb: None,
            residual_scale: None,
            head_div: None,
            query_scale: None,
            rope_traditional: true,
            indexer: None,
        };
        spec.validate()
    }

    /// dots1.py's `ModelArgs` (most fields required there).
    fn dots1(config: &ModelConfig, a: Args) -> Result<DeepseekSpec> {
        fn need<T>(v: Option<T>, name: &str) -> Result<T> {
            v.ok_or_else(|| ModelError::Config(format!("dots1: config.json lacks `{name}`")))
        }
        let hidden_size = need(a.hidden_size, "hidden_size")?;
        let heads = need(a.num_attention_heads, "num_attention_heads")?;
        let head_dim = match a.head_dim {
            Some(d) if d > 0 => d,
            _ if heads > 0 => hidden_size / heads,
            _ => {
                return Err(ModelError::Config(format!(
                    "dots1: `num_attention_heads` must be positive, got {heads}"
                )))
            }
        };
        let spec = DeepseekSpec {
            model_type: config.model_type.clone(),
            prefix: "",
            vocab_size: need(a.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(a.intermediate_size, "intermediate_size")?,
            moe_intermediate_size: need(a.moe_intermediate_size, "moe_intermediate_size")?,
            num_hidden_layers: need(a.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads: heads,
            n_shared_experts: Some(need(a.n_shared_experts.flatten(), "n_shared_experts")?),
            n_routed_experts: Some(need(a.n_routed_experts.flatten(), "n_routed_experts")?),
            routed_scaling_factor: need(a.routed_scaling_factor, "routed_scaling_factor")?,
            // Unused by standard attention.
            kv_lora_rank: 1,
            q_lora_rank: None,
            qk_rope_head_dim: 1,
            v_head_dim: 1,
            qk_nope_head_dim: 1,
            norm_topk_prob: need(a.norm_topk_prob, "norm_topk_prob")?,
            n_group: a.n_group.unwrap_or(1),
            topk_group: a.topk_group.unwrap_or(1),
            num_experts_per_tok: need(a.num_experts_per_tok, "num_experts_per_tok")?,
            moe_layer_freq: 1,
            first_k_dense_replace: need(a.first_k_dense_replace, "first_k_dense_replace")?,
            max_position_embeddings: a.max_position_embeddings.unwrap_or(0),
            rms_norm_eps: need(a.rms_norm_eps, "rms_norm_eps")? as f32,
            rope_theta: need(a.rope_theta, "rope_theta")?,
            rope_scaling: a.rope_scaling,
            attention_bias: false,
            lora_norm_eps: 1e-6,
            denominator_eps: false,
            standard_attention: Some(StandardAttention {
                n_kv_heads: need(a.num_key_value_heads, "num_key_value_heads")?,
                head_dim,
                qk_norm: true,
                bias: false,
                o_bias: false,
                rope_dims: head_dim,
            }),
            experts_name: "experts",
            mlp_bias: a.mlp_bias.unwrap_or(false),
            tie_word_embeddings: a.tie_word_embeddings.unwrap_or(false),
            sanitize: Sanitize::Dots1,
            group_limited: false,
            scale_emb: None,
            residual_scale: None,
            head_div: None,
            query_scale: None,
            rope_traditional: true,
            indexer: None,
        };
        spec.validate()
    }

    /// glm4_moe.py's `ModelArgs` (all but `scoring_func` and `topk_method` required there):
    /// dots1's shape with a GQA attention whose q/k/v carry `attention_bias`, optional per-head
    /// q/k norms, `nn.RoPE(head_dim * partial_rotary_factor)` (no scaling), deepseek_v3's router.
    /// glm4_moe.py's `ModelArgs`, or solar_open.py's: glm4_moe's `Model` under its own
    /// arguments, in which `attention_bias` and `use_qk_norm` default to false, `n_group` and
    /// `topk_group` to 1 and `rope_scaling` to none.
    fn glm4_moe(config: &ModelConfig, mut a: Args) -> Result<DeepseekSpec> {
        let t = config.model_type.as_str();
        fn need<T>(t: &str, v: Option<T>, name: &str) -> Result<T> {
            v.ok_or_else(|| ModelError::Config(format!("{t}: config.json lacks `{name}`")))
        }
        let solar = t == "solar_open";
        if solar {
            a.attention_bias.get_or_insert(false);
            a.use_qk_norm.get_or_insert(false);
            a.n_group.get_or_insert(1);
            a.topk_group.get_or_insert(1);
        }
        if let Some(m) = a.topk_method.as_ref().filter(|m| *m != "noaux_tc") {
            return Err(ModelError::Config(format!(
                "glm4_moe: topk_method `{m}` is not supported (mlx-lm's MoEGate asserts \
                 \"noaux_tc\")"
            )));
        }
        let head_dim = need(t, a.head_dim, "head_dim")?;
        let partial = need(t, a.partial_rotary_factor, "partial_rotary_factor")?;
        let rope_dims = (f64::from(head_dim) * partial) as i32;
        if head_dim <= 0 || rope_dims <= 0 || rope_dims > head_dim {
            return Err(ModelError::Config(format!(
                "glm4_moe: head_dim {head_dim} and partial_rotary_factor {partial} give no \
                 rotated dimensions in a head"
            )));
        }
        let bias = need(t, a.attention_bias, "attention_bias")?;
        // Required by glm4_moe (it may be null); unused by its `nn.RoPE`.
        if !solar && config.raw.get("rope_scaling").is_none() {
            return Err(ModelError::Config(
                "glm4_moe: config.json lacks `rope_scaling`".into(),
            ));
        }
        need(t, a.tie_word_embeddings, "tie_word_embeddings")?;
        let spec = DeepseekSpec {
            model_type: config.model_type.clone(),
            prefix: "",
            vocab_size: need(t, a.vocab_size, "vocab_size")?,
            hidden_size: need(t, a.hidden_size, "hidden_size")?,
            intermediate_size: need(t, a.intermediate_size, "intermediate_size")?,
            moe_intermediate_size: need(t, a.moe_intermediate_size, "moe_intermediate_size")?,
            num_hidden_layers: need(t, a.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads: need(t, a.num_attention_heads, "num_attention_heads")?,
            n_shared_experts: need(t, a.n_shared_experts, "n_shared_experts")?,
            n_routed_experts: need(t, a.n_routed_experts, "n_routed_experts")?,
            routed_scaling_factor: need(t, a.routed_scaling_factor, "routed_scaling_factor")?,
            // Unused by standard attention.
            kv_lora_rank: 1,
            q_lora_rank: None,
            qk_rope_head_dim: 1,
            v_head_dim: 1,
            qk_nope_head_dim: 1,
            norm_topk_prob: need(t, a.norm_topk_prob, "norm_topk_prob")?,
            n_group: need(t, a.n_group, "n_group")?,
            topk_group: need(t, a.topk_group, "topk_group")?,
            num_experts_per_tok: need(t, a.num_experts_per_tok, "num_experts_per_tok")?,
            moe_layer_freq: 1,
            first_k_dense_replace: need(t, a.first_k_dense_replace, "first_k_dense_replace")?,
            max_position_embeddings: need(t, a.max_position_embeddings, "max_position_embeddings")?,
            rms_norm_eps: need(t, a.rms_norm_eps, "rms_norm_eps")? as f32,
            rope_theta: need(t, a.rope_theta, "rope_theta")?,
            rope_scaling: None,
            attention_bias: bias,
            lora_norm_eps: 1e-6,
            denominator_eps: false,
            standard_attention: Some(StandardAttention {
                n_kv_heads: need(t, a.num_key_value_heads, "num_key_value_heads")?,
                head_dim,
                qk_norm: need(t, a.use_qk_norm, "use_qk_norm")?,
                bias,
                o_bias: false,
                rope_dims,
            }),
            experts_name: "switch_mlp",
            mlp_bias: false,
            tie_word_embeddings: false,
            sanitize: Sanitize::Glm4Moe,
            group_limited: false,
            scale_emb: None,
            residual_scale: None,
            head_div: None,
            query_scale: None,
            rope_traditional: false,
            indexer: None,
        };
        spec.validate()
    }

    /// youtu_llm.py's `ModelArgs` (all defaulted there): deepseek_v2's expanded MLA (latent
    /// norms at `rms_norm_eps`, `initialize_rope` with `rope_traditional`, the plain
    /// `q_head_dim ** -0.5` scale) in a dense decoder with tied embeddings by default.
    fn youtu_llm(config: &ModelConfig, a: Args) -> Result<DeepseekSpec> {
        let rms_norm_eps = a.rms_norm_eps.unwrap_or(1e-6) as f32;
        let spec = DeepseekSpec {
            model_type: config.model_type.clone(),
            prefix: "",
            vocab_size: a.vocab_size.unwrap_or(128256),
            hidden_size: a.hidden_size.unwrap_or(2048),
            intermediate_size: a.intermediate_size.unwrap_or(6144),
            moe_intermediate_size: 1,
            num_hidden_layers: a.num_hidden_layers.unwrap_or(32),
            num_attention_heads: a.num_attention_heads.unwrap_or(16),
            n_shared_experts: None,
            n_routed_experts: None,
            routed_scaling_factor: 1.0,
            kv_lora_rank: a.kv_lora_rank.unwrap_or(512),
            q_lora_rank: a.q_lora_rank.unwrap_or(Some(1536)),
            qk_rope_head_dim: a.qk_rope_head_dim.unwrap_or(64),
            v_head_dim: a.v_head_dim.unwrap_or(128),
            qk_nope_head_dim: a.qk_nope_head_dim.unwrap_or(128),
            norm_topk_prob: false,
            n_group: 1,
            topk_group: 1,
            num_experts_per_tok: 1,
            moe_layer_freq: 1,
            first_k_dense_replace: 0,
            max_position_embeddings: a.max_position_embeddings.unwrap_or(131072),
            rms_norm_eps,
            rope_theta: a.rope_theta.unwrap_or(1_600_000.0),
            rope_scaling: a.rope_scaling,
            attention_bias: a.attention_bias.unwrap_or(false),
            lora_norm_eps: rms_norm_eps,
            denominator_eps: false,
            standard_attention: None,
            experts_name: "switch_mlp",
            mlp_bias: a.mlp_bias.unwrap_or(false),
            tie_word_embeddings: a.tie_word_embeddings.unwrap_or(true),
            sanitize: Sanitize::Youtu,
            group_limited: false,
            scale_emb: None,
            residual_scale: None,
            head_div: None,
            query_scale: None,
            rope_traditional: a.rope_traditional.unwrap_or(true),
            indexer: None,
        };
        spec.validate()
    }

    fn validate(self) -> Result<DeepseekSpec> {
        let t = &self.model_type;
        let mut positive = vec![
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("moe_layer_freq", self.moe_layer_freq),
        ];
        if let Some(r) = self.q_lora_rank {
            positive.push(("q_lora_rank", r));
        }
        if let Some(n) = self.n_routed_experts {
            positive.extend([
                ("n_routed_experts", n),
                ("num_experts_per_tok", self.num_experts_per_tok),
                ("moe_intermediate_size", self.moe_intermediate_size),
                ("n_group", self.n_group),
            ]);
        }
        if let Some(n) = self.n_shared_experts {
            positive.push(("n_shared_experts", n));
        }
        for (name, v) in positive {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "{t}: `{name}` must be positive, got {v}"
                )));
            }
        }
        if let Some(n) = self.n_routed_experts {
            if self.num_experts_per_tok > n {
                return Err(ModelError::Config(format!(
                    "{t}: num_experts_per_tok {} exceeds the {n} routed experts",
                    self.num_experts_per_tok
                )));
            }
            if n % self.n_group != 0 {
                return Err(ModelError::Config(format!(
                    "{t}: n_routed_experts {n} must divide into n_group {} groups",
                    self.n_group
                )));
            }
            if self.grouped() {
                let per_group = n / self.n_group;
                let k = self.n_group - self.topk_group;
                if per_group < 2 || k < 1 || self.topk_group < 1 {
                    return Err(ModelError::Config(format!(
                        "{t}: group routing needs at least 2 experts per group and 0 < \
                         topk_group ({}) < n_group ({})",
                        self.topk_group, self.n_group
                    )));
                }
            }
        }
        Ok(self)
    }

    /// Whether routing masks groups: deepseek_v3 `n_group > 1`, dots1 `n_group - topk_group
    /// != 0`.
    fn grouped(&self) -> bool {
        match self.sanitize {
            Sanitize::Dots1 => self.n_group - self.topk_group != 0,
            Sanitize::DeepseekV2 => self.group_limited,
            Sanitize::MiniCpm3 => false,
            _ => self.n_group > 1,
        }
    }

    /// deepseek_v2 / minicpm3: keys and values expanded through `kv_b_proj` before the cache.
    fn expanded_mla(&self) -> bool {
        matches!(
            self.sanitize,
            Sanitize::DeepseekV2 | Sanitize::MiniCpm3 | Sanitize::Youtu
        )
    }

    fn is_moe(&self, layer: i32) -> bool {
        self.n_routed_experts.is_some()
            && layer >= self.first_k_dense_replace
            && layer % self.moe_layer_freq == 0
    }

    /// `q_head_dim ** -0.5`, times `mscale ** 2` under YaRN scaling with `mscale_all_dim`.
    fn scale(&self) -> Result<f32> {
        let q_head_dim = f64::from(self.qk_nope_head_dim + self.qk_rope_head_dim);
        let mut scale = q_head_dim.powf(-0.5);
        // youtu_llm keeps the plain scale whatever its rope.
        if let Some(rs) = self
            .rope_scaling
            .as_ref()
            .filter(|_| self.sanitize != Sanitize::Youtu)
        {
            // mistral4's `apply_yarn_mscale`: nothing for a default rope, `factor` 1 if absent.
            if self.sanitize == Sanitize::Mistral4 {
                let rope_type = rs
                    .get("type")
                    .filter(|v| !v.is_null() && v.as_str() != Some(""))
                    .or_else(|| rs.get("rope_type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if rope_type == "default" {
                    return Ok(scale as f32);
                }
                if !rs.contains_key("factor") {
                    return Ok(scale as f32);
                }
            }
            let mscale_all_dim = rs.get("mscale_all_dim").and_then(Value::as_f64);
            if let Some(m) = mscale_all_dim.filter(|m| *m != 0.0) {
                let factor = rs.get("factor").and_then(Value::as_f64).ok_or_else(|| {
                    ModelError::Config(format!(
                        "{}: rope_scaling with mscale_all_dim needs a numeric `factor`",
                        self.model_type
                    ))
                })?;
                if factor > 1.0 {
                    let s = 0.1 * m * factor.ln() + 1.0;
                    scale = scale * s * s;
                }
            }
        }
        Ok(scale as f32)
    }
}

/// `DeepseekV3MoE` on the shared MoE block: `MoEGate` (a plain weight, never quantized, or
/// mistral4's `nn.Linear`; the score correction bias), the routed experts, and the shared
/// experts added un-gated. The router is [`Router::DeepseekSoftmax`] (deepseek,
/// deepseek_v2) or [`Router::DeepseekGroup`] (the compiled `group_expert_select`).
fn load_moe(s: &DeepseekSpec, w: &mut Weights, path: &str, n_routed: i32) -> Result<SparseMoe> {
    let p = |n: &str| format!("{path}.{n}");
    let switch_mlp = SwitchGlu::load(
        w,
        &p(s.experts_name),
        s.hidden_size,
        s.moe_intermediate_size,
        n_routed,
        false,
        SwitchActivation::SwiGlu,
    )?;
    let gate = if s.sanitize == Sanitize::Mistral4 {
        Linear::load(w, &p("gate"), s.hidden_size, n_routed, false)?
    } else {
        // `x @ weight.T`: a bias-free dense linear, taken without asking to be quantized.
        Linear::Dense {
            weight: w.take(&p("gate.weight"), &[n_routed, s.hidden_size])?,
            bias: None,
        }
    };
    let correction_bias = if matches!(
        s.sanitize,
        Sanitize::Deepseek | Sanitize::DeepseekV2 | Sanitize::Mistral4
    ) {
        None
    } else {
        Some((
            "gate.e_score_correction_bias",
            w.take(&p("gate.e_score_correction_bias"), &[n_routed])?,
        ))
    };
    let shared_experts = match s.n_shared_experts {
        Some(n) => Some((
            "shared_experts",
            Mlp::load(
                w,
                &p("shared_experts"),
                &MlpNames::LLAMA,
                s.hidden_size,
                s.moe_intermediate_size * n,
                s.mlp_bias,
                s.mlp_bias,
                MlpKind::SwiGlu,
            )?,
        )),
        None => None,
    };
    let router = if s.sanitize == Sanitize::Deepseek {
        Router::DeepseekSoftmax {
            groups: None,
            scale: None,
        }
    } else if s.sanitize == Sanitize::DeepseekV2 {
        Router::DeepseekSoftmax {
            groups: s.group_limited.then_some((s.n_group, s.topk_group)),
            scale: Some(s.routed_scaling_factor),
        }
    } else {
        Router::DeepseekGroup(GroupSelect::deepseek(
            s.num_experts_per_tok,
            s.grouped(),
            s.n_group,
            s.topk_group,
            s.routed_scaling_factor,
            s.norm_topk_prob,
            s.denominator_eps,
            s.sanitize == Sanitize::Mistral4,
            correction_bias.is_some(),
        ))
    };
    Ok(SparseMoe::from_parts(MoeParts {
        top_k: s.num_experts_per_tok,
        router,
        gate,
        experts: switch_mlp,
        names: ["gate", s.experts_name],
        correction_bias,
        plain_shared: shared_experts,
        flatten: false,
    }))
}

/// `shard()`'s MoE branch: the shared and routed experts sharded in place (gate, up
/// all-to-sharded; down sharded-to-all), the sum over ranks done by the block.
fn shard_moe(m: &mut SparseMoe, n: i32, r: i32, path: &str) -> Result<()> {
    use crate::shard::switch_inplace;
    if let Some(shared) = &mut m.plain_shared {
        let sp = format!("{path}.shared_experts");
        if shared.gate_up_down().is_none() {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: sp,
                problem: "a fused gate/up projection cannot be sharded".into(),
            });
        }
        crate::shard::shard_mlp(shared, n, r, &sp, true)?;
    }
    let e = &mut m.switch_mlp;
    let what = |m: &str| format!("{path}.switch_mlp.{m}");
    switch_inplace(&mut e.gate_proj, true, n, r, &what("gate_proj"))?;
    switch_inplace(&mut e.down_proj, false, n, r, &what("down_proj"))?;
    switch_inplace(&mut e.up_proj, true, n, r, &what("up_proj"))?;
    m.sharded = true;
    Ok(())
}

#[derive(Clone)]
enum SelfAttn {
    Mla(Box<MlaAttention>),
    Sparse(Box<(MlaAttention, Indexer)>),
    Mistral4(Box<MlaAttention>),
    MlaExpanded(Box<MlaAttention>),
    Standard(Box<crate::models::moe::Attention>),
}

#[derive(Clone)]
struct DecoderLayer {
    residual_scale: Option<f32>,
    self_attn: SelfAttn,
    mlp: Ffn,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn forward(
        &self,
        x: &Array,
        attn_scale: Option<&Array>,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let n = self.input_layernorm.forward(x)?;
        let r = match &self.self_attn {
            SelfAttn::Mla(a) => a.forward(&n, mask, cache)?,
            SelfAttn::Sparse(ai) => {
                let subs = match cache {
                    Some(c) => Some(
                        c.as_mut()
                            .as_any_mut()
                            .downcast_mut::<CacheList>()
                            .ok_or_else(|| ModelError::Cache {
                                what: "sparse-attention layers".into(),
                                problem: "need a CacheList cache".into(),
                            })?
                            .caches_mut(),
                    ),
                    None => None,
                };
                ai.0.forward_sparse(&ai.1, &n, mask, subs)?
            }
            SelfAttn::Mistral4(a) => {
                let s = attn_scale.ok_or_else(|| ModelError::Internal {
                    what: "mistral4 attention".into(),
                    problem: "without its query scale".into(),
                })?;
                a.forward_mistral4(&n, s, mask, cache)?
            }
            SelfAttn::MlaExpanded(a) => a.forward_expanded(&n, mask, cache)?,
            SelfAttn::Standard(a) => a.forward(&n, mask, cache)?,
        };
        let scaled = |r: Array| -> Result<Array> {
            Ok(match self.residual_scale {
                Some(s) => ops::multiply_scalar(&r, s, None)?,
                None => r,
            })
        };
        let h = (x + &scaled(r)?)?;
        let n = self.post_attention_layernorm.forward(&h)?;
        let r = self.mlp.forward(&n)?;
        Ok((&h + &scaled(r)?)?)
    }
}

/// An MLA / DeepSeek V3 decoder (deepseek_v3, kimi_k25, glm4_moe_lite, dots1).
pub struct Model {
    spec: DeepseekSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// This rank's pipeline stage `(rank, size)` after [`Model::shard_pipeline`].
    pipeline: Option<(i32, i32)>,
    /// The multi-token-prediction layers, loaded only when asked ([`Weights::with_mtp`]).
    mtp: Vec<MtpLayer>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let spec = DeepseekSpec::from_config(config)?;
        let mtp_layers = if w.mtp() {
            mtp_layer_count(&spec, &config.raw)?
        } else {
            0
        };
        sanitize(&spec, w, mtp_layers)?;
        let pre = spec.prefix;
        let (dim, eps) = (spec.hidden_size, spec.rms_norm_eps);
        let embed_tokens =
            Embedding::load(w, &format!("{pre}model.embed_tokens"), spec.vocab_size, dim)?;
        let scale = spec.scale()?;
        let mut layers = Vec::with_capacity(spec.num_hidden_layers as usize);
        for i in 0..spec.num_hidden_layers {
            layers.push(Self::load_layer(&spec, w, i, scale)?);
        }
        let mut mtp = Vec::with_capacity(mtp_layers as usize);
        for i in spec.num_hidden_layers..spec.num_hidden_layers + mtp_layers {
            mtp.push(MtpLayer::load(&spec, w, i, scale)?);
        }
        let norm = RmsNorm::load(w, &format!("{pre}model.norm"), dim, eps)?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(
                w,
                &format!("{pre}lm_head"),
                dim,
                spec.vocab_size,
                false,
            )?)
        };
        Ok(Model {
            spec,
            embed_tokens,
            layers,
            norm,
            lm_head,
            pipeline: None,
            mtp,
        })
    }

    /// Decoder layer `i` (its arrays under `{pre}model.layers.{i}`): a main layer, or a
    /// multi-token-prediction layer's block.
    fn load_layer(
        spec: &DeepseekSpec,
        w: &mut Weights,
        i: i32,
        scale: f32,
    ) -> Result<DecoderLayer> {
        let pre = spec.prefix;
        let (dim, eps) = (spec.hidden_size, spec.rms_norm_eps);
        let p = format!("{pre}model.layers.{i}");
        let self_attn = match spec.standard_attention {
            Some(sa) => SelfAttn::Standard(Box::new(crate::models::moe::Attention::new(
                crate::models::moe::AttentionSpec {
                    hidden_size: dim,
                    n_heads: spec.num_attention_heads,
                    n_kv_heads: sa.n_kv_heads,
                    head_dim: sa.head_dim,
                    qkv_bias: sa.bias,
                    o_bias: sa.o_bias,
                    qk_norm: if sa.qk_norm {
                        crate::models::moe::QkNorm::PerHead
                    } else {
                        crate::models::moe::QkNorm::None
                    },
                    eps,
                    rope: Rope::initialize(
                        sa.rope_dims,
                        spec.rope_theta,
                        false,
                        spec.rope_scaling.as_ref(),
                        Some(spec.max_position_embeddings).filter(|m| *m > 0),
                    )?,
                    names: ["o_proj", "q_norm", "k_norm"],
                    sinks: false,
                    inv_sqrt_scale: false,
                },
                w,
                &format!("{p}.self_attn"),
            )?)),
            None if spec.expanded_mla() => {
                SelfAttn::MlaExpanded(Box::new(Self::load_mla(spec, w, &p, scale)?))
            }
            None if spec.indexer.is_some() => {
                let attn = Self::load_mla(spec, w, &p, scale)?;
                let (n_heads, head_dim, index_topk, interleave) =
                    spec.indexer.unwrap_or((1, 1, 1, false));
                let indexer = Indexer::load(
                    IndexerSpec {
                        hidden_size: dim,
                        q_lora_rank: spec.q_lora_rank.unwrap_or(0),
                        n_heads,
                        head_dim,
                        index_topk,
                        rope: Rope::initialize(
                            spec.qk_rope_head_dim,
                            spec.rope_theta,
                            interleave,
                            spec.rope_scaling.as_ref(),
                            Some(spec.max_position_embeddings),
                        )?,
                    },
                    w,
                    &format!("{p}.self_attn.indexer"),
                )?;
                SelfAttn::Sparse(Box::new((attn, indexer)))
            }
            None if spec.sanitize == Sanitize::Mistral4 => {
                SelfAttn::Mistral4(Box::new(Self::load_mla(spec, w, &p, scale)?))
            }
            None => SelfAttn::Mla(Box::new(Self::load_mla(spec, w, &p, scale)?)),
        };
        let mlp = match spec.n_routed_experts.filter(|_| spec.is_moe(i)) {
            Some(n) => Ffn::Sparse(Box::new(load_moe(spec, w, &format!("{p}.mlp"), n)?)),
            None => Ffn::Dense(Mlp::load(
                w,
                &format!("{p}.mlp"),
                &MlpNames::LLAMA,
                dim,
                spec.intermediate_size,
                spec.mlp_bias,
                spec.mlp_bias,
                MlpKind::SwiGlu,
            )?),
        };
        Ok(DecoderLayer {
            residual_scale: spec.residual_scale,
            self_attn,
            mlp,
            input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), dim, eps)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                dim,
                eps,
            )?,
        })
    }

    fn load_mla(spec: &DeepseekSpec, w: &mut Weights, p: &str, scale: f32) -> Result<MlaAttention> {
        let rope = Rope::initialize(
            spec.qk_rope_head_dim,
            spec.rope_theta,
            spec.rope_traditional,
            spec.rope_scaling.as_ref(),
            Some(spec.max_position_embeddings),
        )?;
        let rope = if spec.sanitize == Sanitize::MiniCpm3 {
            Rope::initialize(
                spec.qk_rope_head_dim,
                spec.rope_theta,
                false,
                spec.rope_scaling.as_ref(),
                Some(spec.max_position_embeddings),
            )?
        } else {
            rope
        };
        MlaAttention::load(
            spec.expanded_mla(),
            MlaSpec {
                hidden_size: spec.hidden_size,
                num_heads: spec.num_attention_heads,
                q_lora_rank: spec.q_lora_rank,
                kv_lora_rank: spec.kv_lora_rank,
                qk_nope_head_dim: spec.qk_nope_head_dim,
                qk_rope_head_dim: spec.qk_rope_head_dim,
                v_head_dim: spec.v_head_dim,
                attention_bias: spec.attention_bias,
                lora_norm_eps: spec.lora_norm_eps,
                scale,
                rope,
                q_scale: None,
                kv_scale: None,
            },
            w,
            &format!("{p}.self_attn"),
        )
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        crate::models::moe::check_inputs(inputs)?;
        let mut h = self.embed_tokens.forward(inputs)?;
        if let Some(s) = self.spec.scale_emb {
            h = ops::multiply_scalar(&h, s, None)?;
        }
        let n = h.shape().get(1).copied().unwrap_or(0) as usize;
        let mut caches = caches;
        // MLA turns the mask into its rope scores: `return_array=True` there.
        let array_mask = self.spec.standard_attention.is_none()
            && !self.spec.expanded_mla()
            && self.spec.sanitize != Sanitize::Mistral4;
        // Only mistral4 reads it (its caches are plain).
        let offset = caches
            .as_deref()
            .and_then(|c| c.first())
            .map_or(0, |c| c.offset());
        let attn_scale = match self.spec.query_scale {
            Some((beta, original)) => Some(crate::models::dense::llama4_attn_scale(
                n,
                offset,
                beta,
                original,
                h.dtype(),
            )?),
            None => None,
        };
        let mask = match caches.as_deref_mut() {
            Some(caches) => {
                kit::check_caches(Some(&*caches), self.layers.len(), "layers")?;
                let first: Option<&dyn Cache> = match caches.first() {
                    Some(c) if self.spec.indexer.is_some() => c
                        .as_any()
                        .downcast_ref::<CacheList>()
                        .and_then(|l| l.caches().first())
                        .map(|c| c.as_ref()),
                    Some(c) => Some(c.as_ref()),
                    None => None,
                };
                match first {
                    Some(c) => c.make_mask(n, None, array_mask)?,
                    None => mlx_cache::mask::fallback_mask(n, None, array_mask)?,
                }
            }
            None => mlx_cache::mask::fallback_mask(n, None, array_mask)?,
        };
        h = crate::shard::pipeline_recv(h, self.pipeline)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            h = layer.forward(&h, attn_scale.as_ref(), &mask, cache)?;
        }
        h = crate::shard::pipeline_send(h, self.pipeline, caches.and_then(|c| c.last_mut()))?;
        self.norm.forward(&h)
    }

    /// Pipeline parallelism as these rows' `PipelineMixin.pipeline()` (see
    /// [`crate::shard::pipeline_range`]): this model keeps its stage's layers; the stage's
    /// send is tied to its last cache (deepseek_v32's: the first cache of its `CacheList`).
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        let t = self.spec.model_type.as_str();
        crate::shard::check_pipeline(t, &PIPELINED, self.pipeline.is_some())?;
        crate::shard::keep_stage(&mut self.layers, size, rank)?;
        self.pipeline = Some((rank, size));
        Ok(())
    }
}

/// The rows whose mlx-lm class has `pipeline` (`PipelineMixin`); kimi_k25's wrapper has no
/// `model.pipeline`, so sharded_load does not pipeline it.
const PIPELINED: [&str; 8] = [
    "deepseek_v3",
    // glm4_moe.py's LanguageModel (PipelineMixin), the same stage loop as deepseek_v3's;
    // solar_open.py imports that Model.
    "glm4_moe",
    "solar_open",
    "deepseek_v32",
    "glm_moe_dsa",
    "deepseek_v2",
    "glm4_moe_lite",
    "mistral4",
];
/// How many multi-token-prediction layers `--mtp` loads: `num_nextn_predict_layers` of the
/// config (deepseek_v3, glm4_moe_lite, deepseek_v32 / glm_moe_dsa and kimi_k25 checkpoints
/// carry them as `model.layers.{num_hidden_layers + k}`).
fn mtp_layer_count(spec: &DeepseekSpec, raw: &Value) -> Result<i32> {
    if !matches!(
        spec.sanitize,
        Sanitize::DeepseekV3 | Sanitize::Glm4MoeLite | Sanitize::DeepseekV32
    ) {
        return Err(ModelError::Config(format!(
            "--mtp: `{}` checkpoints carry no multi-token-prediction layers this loader knows \
             (deepseek_v3, glm4_moe_lite, deepseek_v32, qwen3_next and mimo do)",
            spec.model_type
        )));
    }
    let text = raw.get("text_config").filter(|_| !spec.prefix.is_empty());
    let v = text
        .and_then(|t| t.get("num_nextn_predict_layers"))
        .or_else(|| raw.get("num_nextn_predict_layers"));
    match v.and_then(Value::as_i64) {
        Some(n) if (1..=16).contains(&n) => Ok(n as i32),
        Some(n) => Err(ModelError::Config(format!(
            "--mtp: config.json `num_nextn_predict_layers` is {n}; it must be 1 to 16"
        ))),
        None => Err(ModelError::Config(
            "--mtp: config.json has no positive integer `num_nextn_predict_layers`: the \
             checkpoint carries no multi-token-prediction layers"
                .into(),
        )),
    }
}

/// One multi-token-prediction layer (DeepSeek V3's MTP module, as vLLM and SGLang run it):
/// `eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)])` through a decoder block, then
/// `shared_head.norm` and the head, predicting the token after `t_{i+1}`.
#[derive(Clone)]
struct MtpLayer {
    enorm: RmsNorm,
    hnorm: RmsNorm,
    eh_proj: Linear,
    block: DecoderLayer,
    norm: RmsNorm,
    /// The layer's own copies of the embedding and head, when the checkpoint has them.
    embed: Option<Embedding>,
    head: Option<Linear>,
}

impl MtpLayer {
    fn load(spec: &DeepseekSpec, w: &mut Weights, i: i32, scale: f32) -> Result<MtpLayer> {
        let (dim, eps) = (spec.hidden_size, spec.rms_norm_eps);
        let p = format!("{}model.layers.{i}", spec.prefix);
        let block = Model::load_layer(spec, w, i, scale)?;
        let embed = if w.contains(&format!("{p}.embed_tokens.weight")) {
            Some(Embedding::load(
                w,
                &format!("{p}.embed_tokens"),
                spec.vocab_size,
                dim,
            )?)
        } else {
            None
        };
        let head = if w.contains(&format!("{p}.shared_head.head.weight")) {
            Some(Linear::load(
                w,
                &format!("{p}.shared_head.head"),
                dim,
                spec.vocab_size,
                false,
            )?)
        } else {
            None
        };
        Ok(MtpLayer {
            enorm: RmsNorm::load(w, &format!("{p}.enorm"), dim, eps)?,
            hnorm: RmsNorm::load(w, &format!("{p}.hnorm"), dim, eps)?,
            eh_proj: Linear::load(w, &format!("{p}.eh_proj"), 2 * dim, dim, false)?,
            block,
            norm: RmsNorm::load(w, &format!("{p}.shared_head.norm"), dim, eps)?,
            embed,
            head,
        })
    }
}

impl crate::models::MtpHead for Model {
    fn depth(&self) -> usize {
        self.mtp.len()
    }

    fn make_mtp_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.mtp.len())
    }

    fn mtp_forward(
        &self,
        k: usize,
        hidden: &Array,
        tokens: &Array,
        cache: &mut Box<dyn Cache>,
    ) -> Result<(Array, Array)> {
        let l = kit::mtp_layer(&self.mtp, k)?;
        if !matches!(l.block.self_attn, SelfAttn::Mla(_) | SelfAttn::Standard(_)) {
            return Err(ModelError::Unsupported {
                what: "multi-token prediction".into(),
                problem: "runs on plain MLA or standard attention layers".into(),
            });
        }
        crate::models::moe::check_inputs(tokens)?;
        let e = l
            .embed
            .as_ref()
            .unwrap_or(&self.embed_tokens)
            .forward(tokens)?;
        let x = ops::concatenate(
            &[&l.enorm.forward(&e)?, &l.hnorm.forward(hidden)?],
            -1,
            None,
        )?;
        let x = l.eh_proj.forward(&x)?;
        let n = x.shape().get(1).copied().unwrap_or(0) as usize;
        let array_mask = self.spec.standard_attention.is_none();
        let mask = cache.make_mask(n, None, array_mask)?;
        let h = l.block.forward(&x, None, &mask, Some(cache))?;
        let normed = l.norm.forward(&h)?;
        let logits = match &l.head {
            Some(head) => head.forward(&normed)?,
            None => super::project(self.lm_head.as_ref(), &self.embed_tokens, &normed)?,
        };
        Ok((logits, h))
    }
}

/// The rows' `sanitize`: kimi_k25 drops its vision weights; multi-token-prediction layers
/// (deepseek_v3: `model.layers.61`; glm4_moe_lite: every layer past `num_hidden_layers`) and
/// precomputed `rotary_emb.inv_freq` go; per-expert weights are stacked into `switch_mlp`;
/// an HF `kv_b_proj` is split into `embed_q` (transposed) and `unembed_out`, dequantized and
/// quantized again when it is quantized.
fn sanitize(s: &DeepseekSpec, w: &mut Weights, mtp_layers: i32) -> Result<()> {
    let pre = s.prefix;
    if !pre.is_empty() {
        for top in [
            "vision_tower.",
            "vision_model.",
            "multi_modal_projector.",
            "mm_projector.",
        ] {
            w.discard_prefix(top);
        }
    }
    let layers_pre = format!("{pre}model.layers.");
    if s.tie_word_embeddings {
        w.discard("lm_head.weight");
    }
    // `--mtp`: the multi-token-prediction layers stay (and are stacked and split below).
    let keep_mtp = s.num_hidden_layers + mtp_layers;
    for name in w.names() {
        let layer = name
            .strip_prefix(&layers_pre)
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<i64>().ok());
        if keep_mtp > s.num_hidden_layers {
            let drop = name.contains("rotary_emb.inv_freq")
                || layer.is_some_and(|i| i >= i64::from(keep_mtp));
            if drop {
                w.discard(&name);
            }
            continue;
        }
        let drop = match s.sanitize {
            Sanitize::Glm4MoeLite | Sanitize::DeepseekV32 => name
                .strip_prefix(&layers_pre)
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<i64>().ok())
                .is_some_and(|i| i >= i64::from(s.num_hidden_layers)),
            Sanitize::DeepseekV3 => {
                name.starts_with(&format!("{layers_pre}61")) || name.contains("rotary_emb.inv_freq")
            }
            Sanitize::Dots1 => name.contains("rotary_emb.inv_freq"),
            Sanitize::Glm4Moe => name.starts_with(&format!("{layers_pre}{}", s.num_hidden_layers)),
            Sanitize::KimiVl => ["vision_tower", "rotary_emb", "multi_modal_projector"]
                .iter()
                .any(|k| name.contains(k)),
            Sanitize::Deepseek | Sanitize::DeepseekV2 | Sanitize::MiniCpm3 | Sanitize::Youtu => {
                false
            }
            Sanitize::Mistral4 => name.ends_with("activation_scale"),
        };
        // deepseek_v3's filter is on the text model's own names (`model.layers.61...`), so
        // `model.layers.610` goes too, as there.
        if drop {
            w.discard(&name);
        }
    }
    for l in 0..keep_mtp {
        let prefix = format!("{layers_pre}{l}");
        if s.sanitize == Sanitize::Mistral4 {
            let gup = format!("{prefix}.mlp.experts.gate_up_proj");
            if let Some(gate_up) = w.remove(&gup) {
                let parts = ops::split_equal(&gate_up, 2, 1, None)?;
                let mut parts = parts.into_iter();
                if let (Some(g), Some(u)) = (parts.next(), parts.next()) {
                    w.insert(format!("{prefix}.mlp.switch_mlp.gate_proj.weight"), g);
                    w.insert(format!("{prefix}.mlp.switch_mlp.up_proj.weight"), u);
                }
            }
            if let Some(d) = w.remove(&format!("{prefix}.mlp.experts.down_proj")) {
                w.insert(format!("{prefix}.mlp.switch_mlp.down_proj.weight"), d);
            }
        }
        if let Some(n) = s.n_routed_experts.filter(|_| s.is_moe(l)) {
            kit::stack_experts(
                w,
                &format!("{prefix}.mlp.experts"),
                &format!("{prefix}.mlp.{}", s.experts_name),
                n,
                &kit::GLU_PROJECTIONS,
                &kit::LINEAR_KEYS,
            )?;
        }
        if s.standard_attention.is_none() && !s.expanded_mla() {
            split_kv_b_proj(s, w, &format!("{prefix}.self_attn"))?;
        }
    }
    Ok(())
}

/// `kv_b_proj.weight` `(heads * (nope + v), kv_lora_rank)` into `embed_q.weight`
/// `(heads, kv_lora_rank, nope)` and `unembed_out.weight` `(heads, v, kv_lora_rank)`.
fn split_kv_b_proj(s: &DeepseekSpec, w: &mut Weights, prefix: &str) -> Result<()> {
    split_kv_b_proj_dims(
        w,
        prefix,
        s.num_attention_heads,
        s.qk_nope_head_dim,
        s.v_head_dim,
        s.kv_lora_rank,
    )
}

/// [`split_kv_b_proj`] for the given head count and dimensions (longcat_flash too).
pub(crate) fn split_kv_b_proj_dims(
    w: &mut Weights,
    prefix: &str,
    num_heads: i32,
    qk_nope_head_dim: i32,
    v_head_dim: i32,
    kv_lora_rank: i32,
) -> Result<()> {
    use mlx_core::quantized::{self, QuantMode};
    let Some(v) = w.remove(&format!("{prefix}.kv_b_proj.weight")) else {
        return Ok(());
    };
    let bad = |m: String| ModelError::Weights(vec![format!("{prefix}.kv_b_proj: {m}")]);
    let quant = match w.remove(&format!("{prefix}.kv_b_proj.scales")) {
        Some(scales) => {
            let biases = w
                .remove(&format!("{prefix}.kv_b_proj.biases"))
                .ok_or_else(|| bad("quantized without biases".into()))?;
            let dims = kv_lora_rank;
            let v_last = v.shape().last().copied().unwrap_or(0);
            let s_last = scales.shape().last().copied().unwrap_or(0);
            if s_last <= 0 || dims % s_last != 0 {
                return Err(bad(format!(
                    "scales' last dimension {s_last} does not divide kv_lora_rank {dims}"
                )));
            }
            let bits = (v_last * 32) / dims;
            let group_size = dims / s_last;
            Some((scales, biases, bits, group_size))
        }
        None => None,
    };
    let v = match &quant {
        Some((scales, biases, bits, gs)) => quantized::dequantize(
            &v,
            scales,
            Some(biases),
            *gs,
            *bits,
            QuantMode::Affine,
            None,
            None,
        )?,
        None => v,
    };
    let head_dim = qk_nope_head_dim + v_head_dim;
    let rows = v.shape().first().copied().unwrap_or(0);
    if v.ndim() != 2 || rows != num_heads * head_dim {
        return Err(bad(format!(
            "shape {:?} is not (num_attention_heads * (qk_nope_head_dim + v_head_dim), _)",
            v.shape()
        )));
    }
    let v = ops::reshape(&v, &[num_heads, head_dim, -1], None)?;
    let nope = qk_nope_head_dim;
    let wk = ops::contiguous(
        &ops::swapaxes(&ops::slice_axis(&v, 1, 0, nope, None)?, -1, -2, None)?,
        false,
        None,
    )?;
    let wv = ops::contiguous(&ops::slice_axis(&v, 1, nope, head_dim, None)?, false, None)?;
    for (name, m) in [("embed_q", wk), ("unembed_out", wv)] {
        match &quant {
            Some((_, _, bits, gs)) => {
                let (q, sc, b) = quantized::quantize(&m, *gs, *bits, QuantMode::Affine, None)?;
                w.insert(format!("{prefix}.{name}.weight"), q);
                w.insert(format!("{prefix}.{name}.scales"), sc);
                if let Some(b) = b {
                    w.insert(format!("{prefix}.{name}.biases"), b);
                }
            }
            None => w.insert(format!("{prefix}.{name}.weight"), m),
        }
    }
    Ok(())
}

/// The rows whose mlx-lm class has deepseek_v3's / deepseek_v2's `shard()`.
const SHARDED: [&str; 9] = [
    "deepseek_v3",
    // glm4_moe.py's shard(): llama's attention split, MoE blocks as deepseek_v3's (solar_open's
    // too).
    "glm4_moe",
    "solar_open",
    "kimi_k25",
    "deepseek_v32",
    // glm_moe_dsa.py's Model subclasses deepseek_v32's (its shard() and pipeline()).
    "glm_moe_dsa",
    "deepseek_v2",
    "glm4_moe_lite",
    "mistral4",
];

impl Model {
    /// Tensor parallelism over `size` ranks as mlx-lm's `shard()` of these rows: each MLA
    /// block's heads split ([`MlaAttention::shard_tensor_parallel`]), the dense MLPs as
    /// llama's (gate, up all-to-sharded; down sharded-to-all), the MoE blocks' shared and
    /// routed experts sharded in place and their output summed over the global group.
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        let t = self.spec.model_type.as_str();
        if !SHARDED.contains(&t) {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: format!("model_type `{t}`"),
                problem: format!("not supported yet ({})", SHARDED.join(", ")),
            });
        }
        crate::shard::check_tensor_rank(size, rank)?;
        let pre = self.spec.prefix;
        for (i, l) in self.layers.iter_mut().enumerate() {
            let path = format!("{pre}model.layers.{i}");
            let attn = format!("{path}.self_attn");
            match &mut l.self_attn {
                SelfAttn::Mla(a) | SelfAttn::Mistral4(a) | SelfAttn::MlaExpanded(a) => {
                    a.shard_tensor_parallel(size, rank, &attn)?
                }
                SelfAttn::Sparse(ai) => ai.0.shard_tensor_parallel(size, rank, &attn)?,
                SelfAttn::Standard(a) if matches!(t, "glm4_moe" | "solar_open") => {
                    a.shard_plain(size, rank, &attn)?
                }
                SelfAttn::Standard(_) => {
                    return Err(ModelError::Parallel {
                        kind: crate::Parallelism::Tensor,
                        what: attn.to_string(),
                        problem: "a standard attention cannot be sharded here".into(),
                    })
                }
            }
            match &mut l.mlp {
                Ffn::Dense(m) => {
                    let mp = format!("{path}.mlp");
                    if m.gate_up_down().is_none() {
                        return Err(ModelError::Parallel {
                            kind: crate::Parallelism::Tensor,
                            what: mp,
                            problem: "a fused gate/up projection cannot be sharded".into(),
                        });
                    }
                    crate::shard::shard_mlp(m, size, rank, &mp, false)?;
                }
                Ffn::Sparse(m) => shard_moe(m, size, rank, &format!("{path}.mlp"))?,
            }
        }
        Ok(())
    }
}

impl LanguageModel for Model {
    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        let out = self.hidden_states(inputs, caches)?;
        match self.spec.head_div {
            Some(d) => super::project(self.lm_head.as_ref(), &self.embed_tokens, &(&out / d)?),
            None => super::project(self.lm_head.as_ref(), &self.embed_tokens, &out),
        }
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, None))
    }

    fn forward_hidden_cached(
        &self,
        inputs: &Array,
        caches: &mut [Box<dyn Cache>],
    ) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, Some(caches)))
    }

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        let head = crate::models::OutputHead::of(self.lm_head.as_ref(), &self.embed_tokens);
        Some(match self.spec.head_div {
            Some(d) => crate::models::OutputHead::Shaped {
                inner: Box::new(head),
                pre_div: Some(d),
                post: Vec::new(),
            },
            None => head,
        })
    }

    kit::own_type_and_vocab!(spec);

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        let sparse = self.spec.indexer.is_some();
        (0..self.layers.len())
            .map(|_| -> Box<dyn Cache> {
                if sparse {
                    Box::new(CacheList::new(vec![
                        Box::new(KVCache::new()),
                        Box::new(KVCache::new()),
                    ]))
                } else {
                    Box::new(KVCache::new())
                }
            })
            .collect()
    }

    /// deepseek_v32 defines `make_cache` (a `CacheList` per layer).
    fn defines_make_cache(&self) -> bool {
        self.spec.indexer.is_some()
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn mtp(&self) -> Option<&dyn crate::models::MtpHead> {
        (!self.mtp.is_empty()).then_some(self as &dyn crate::models::MtpHead)
    }

    fn as_trainable_mut(&mut self) -> Option<&mut dyn super::Trainable> {
        Some(self)
    }
}

impl super::Trainable for Model {
    fn layers_path(&self) -> String {
        format!("{}model.layers", self.spec.prefix)
    }
}
