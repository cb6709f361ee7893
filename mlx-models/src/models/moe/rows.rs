//! The rows of the mixture-of-experts family (`moe.rs`): each mlx-lm `ModelArgs` read with
//! its names and defaults (`serde`), and [`MoeSpec::from_config`], which turns it into the
//! family's one table row, setting only what differs from `MoeSpec::defaults()`. The model
//! that runs a row (attention, layers, the shared MoE block) is `moe.rs`'s.

use super::*;
fn default_true() -> bool {
    true
}

/// A router's score function as the row's config names it: `true` for `sigmoid`, `false` for
/// `softmax`, else an error naming the model, the field and the value.
fn sigmoid_scores(model: &str, field: &str, value: &str) -> Result<bool> {
    match value {
        "sigmoid" => Ok(true),
        "softmax" => Ok(false),
        other => Err(ModelError::Config(format!(
            "{model}: {field} `{other}` is not supported"
        ))),
    }
}

/// Group-limited routing's shape: `n_group` groups that split the experts evenly, of which
/// `topk_group` (1..=n_group) are kept.
fn check_expert_groups(model: &str, n_group: i32, topk_group: i32, num_experts: i32) -> Result<()> {
    if n_group <= 0 || topk_group <= 0 || topk_group > n_group || num_experts % n_group != 0 {
        return Err(ModelError::Config(format!(
            "{model}: n_group {n_group} / topk_group {topk_group} do not fit {num_experts} experts"
        )));
    }
    Ok(())
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
                check_expert_groups("exaone_moe", a.n_group, a.topk_group, a.num_experts)?;
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
                let sigmoid = sigmoid_scores("bailing_moe", "score_function", &a.score_function)?;
                if a.n_group > 1 {
                    check_expert_groups("bailing_moe", a.n_group, a.topk_group, a.num_experts)?;
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
                let sigmoid = sigmoid_scores("afmoe", "score_func", &a.score_func)?;
                if a.n_group > 1 {
                    check_expert_groups("afmoe", a.n_group, a.topk_group, a.num_experts)?;
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
                let sigmoid = sigmoid_scores("ernie4_5_moe", "moe_gate_act", &a.moe_gate_act)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(ModelError::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn router_scores_and_groups_are_checked_with_the_model_and_field_named() {
        assert!(sigmoid_scores("afmoe", "score_func", "sigmoid").unwrap());
        assert!(!sigmoid_scores("afmoe", "score_func", "softmax").unwrap());
        assert_eq!(
            message(sigmoid_scores("afmoe", "score_func", "relu")),
            "afmoe: score_func `relu` is not supported"
        );
        check_expert_groups("exaone_moe", 8, 4, 64).unwrap();
        check_expert_groups("exaone_moe", 1, 1, 3).unwrap();
        for (n_group, topk_group, experts) in
            [(0, 1, 8), (4, 0, 8), (4, 5, 8), (3, 1, 8), (-2, 1, 8)]
        {
            assert_eq!(
                message(check_expert_groups(
                    "bailing_moe",
                    n_group,
                    topk_group,
                    experts
                )),
                format!(
                    "bailing_moe: n_group {n_group} / topk_group {topk_group} do not fit \
                     {experts} experts"
                )
            );
        }
    }
}
