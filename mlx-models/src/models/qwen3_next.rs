//! mlx-lm 0.32.2 `models/qwen3_next.py` and `models/qwen3_5.py` (text; `qwen3_5_moe` is the
//! same model with experts): Gated DeltaNet linear-attention layers interleaved with gated full
//! attention every `full_attention_interval` layers. The two differ only in the DeltaNet's
//! input projections (qwen3_next: fused `in_proj_qkvz` / `in_proj_ba` grouped per key head;
//! qwen3_5: separate `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) and in where the
//! weights live (`model.*` vs `language_model.model.*`).
//!
//! Recurrent state (conv state, DeltaNet state) lives in an [`ArraysCache`] of two slots per
//! linear layer; a cache made by [`LanguageModel::make_cache_with_rollback`] also keeps the state
//! after each recent token, so `trim(n)` restores it exactly (see `mlx_cache::ArraysCache`).

use mlx_cache::{ArraysCache, AttentionMask, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::gated_delta::{
    gated_delta_update, gated_delta_update_fast, normalize_qk, RmsNormGated,
};
use crate::layers::{join, Walk, Walkable};
use crate::layers::{
    silu, Embedding, Linear, Mlp, MlpKind, RmsNorm, Rope, RopeScaling, SwitchActivation,
};
use crate::models::checkpoint::{layer_stack, LayerArrays};
use crate::models::moe_block::{Ffn, Router, SparseMoe, SparseMoeParams};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// The arguments both files read (qwen3_next `ModelArgs`, qwen3_5 `TextModelArgs` after
/// `__post_init__`), with mlx-lm's names.
#[derive(Clone, Debug)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub linear_num_value_heads: i32,
    pub linear_num_key_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    pub linear_conv_kernel_dim: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub shared_expert_intermediate_size: i32,
    pub mlp_only_layers: Vec<i32>,
    pub moe_intermediate_size: i32,
    pub norm_topk_prob: bool,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: Option<i64>,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub full_attention_interval: i32,
    /// qwen3_5's separate projections (vs qwen3_next's fused ones).
    pub split_projections: bool,
    /// Every layer with experts when `num_experts > 0` (qwen3_5) rather than qwen3_next's
    /// `decoder_sparse_step` / `mlp_only_layers` rule.
    pub all_layers_sparse: bool,
    /// `language_model.` (qwen3_5) or empty.
    pub prefix: &'static str,
}

#[derive(Deserialize)]
struct NextArgs {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    linear_num_value_heads: i32,
    linear_num_key_heads: i32,
    linear_key_head_dim: i32,
    linear_value_head_dim: i32,
    linear_conv_kernel_dim: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: i32,
    shared_expert_intermediate_size: i32,
    mlp_only_layers: Vec<i32>,
    moe_intermediate_size: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    num_key_value_heads: i32,
    rope_theta: f64,
    partial_rotary_factor: f64,
    max_position_embeddings: i64,
    head_dim: i32,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default = "four")]
    full_attention_interval: i32,
}

fn four() -> i32 {
    4
}

serde_defaults! {
    d_hidden: i32 = 4096;
    d_intermediate: i32 = 14336;
    d_layers: i32 = 32;
    d_eps: f64 = 1e-6;
    d_vocab: i32 = 151936;
    d_kv_heads: i32 = 8;
    d_max_pos: i64 = 131072;
    d_lin_v_heads: i32 = 64;
    d_lin_k_heads: i32 = 16;
    d_lin_k_dim: i32 = 192;
    d_lin_v_dim: i32 = 128;
    d_one: i32 = 1;
    d_true: bool = true;
}

/// qwen3_5.py `TextModelArgs` (all defaulted there).
#[derive(Deserialize)]
struct Qwen35Args {
    #[serde(default = "d_hidden")]
    hidden_size: i32,
    #[serde(default = "d_intermediate")]
    intermediate_size: i32,
    #[serde(default = "d_layers")]
    num_hidden_layers: i32,
    #[serde(default = "d_layers")]
    num_attention_heads: i32,
    #[serde(default = "d_eps")]
    rms_norm_eps: f64,
    #[serde(default = "d_vocab")]
    vocab_size: i32,
    #[serde(default = "d_kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "d_max_pos")]
    max_position_embeddings: i64,
    #[serde(default = "d_lin_v_heads")]
    linear_num_value_heads: i32,
    #[serde(default = "d_lin_k_heads")]
    linear_num_key_heads: i32,
    #[serde(default = "d_lin_k_dim")]
    linear_key_head_dim: i32,
    #[serde(default = "d_lin_v_dim")]
    linear_value_head_dim: i32,
    #[serde(default = "four")]
    linear_conv_kernel_dim: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    head_dim: Option<i32>,
    #[serde(default = "four")]
    full_attention_interval: i32,
    #[serde(default)]
    num_experts: i32,
    #[serde(default)]
    num_experts_per_tok: i32,
    #[serde(default = "d_one")]
    decoder_sparse_step: i32,
    #[serde(default)]
    shared_expert_intermediate_size: i32,
    #[serde(default)]
    moe_intermediate_size: i32,
    #[serde(default = "d_true")]
    norm_topk_prob: bool,
    #[serde(default)]
    rope_parameters: Option<Value>,
}

impl ModelArgs {
    pub fn from_config(config: &ModelConfig) -> Result<ModelArgs> {
        let args = match config.architecture.as_str() {
            "qwen3_next" => {
                let a: NextArgs = config.args()?;
                ModelArgs {
                    model_type: a.model_type,
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    intermediate_size: a.intermediate_size,
                    num_attention_heads: a.num_attention_heads,
                    num_key_value_heads: a.num_key_value_heads,
                    head_dim: a.head_dim,
                    rms_norm_eps: a.rms_norm_eps,
                    vocab_size: a.vocab_size,
                    linear_num_value_heads: a.linear_num_value_heads,
                    linear_num_key_heads: a.linear_num_key_heads,
                    linear_key_head_dim: a.linear_key_head_dim,
                    linear_value_head_dim: a.linear_value_head_dim,
                    linear_conv_kernel_dim: a.linear_conv_kernel_dim,
                    num_experts: a.num_experts,
                    num_experts_per_tok: a.num_experts_per_tok,
                    decoder_sparse_step: a.decoder_sparse_step,
                    shared_expert_intermediate_size: a.shared_expert_intermediate_size,
                    mlp_only_layers: a.mlp_only_layers,
                    moe_intermediate_size: a.moe_intermediate_size,
                    norm_topk_prob: a.norm_topk_prob,
                    rope_theta: a.rope_theta,
                    partial_rotary_factor: a.partial_rotary_factor,
                    rope_scaling: a.rope_scaling,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    tie_word_embeddings: a.tie_word_embeddings,
                    attention_bias: a.attention_bias,
                    full_attention_interval: a.full_attention_interval,
                    split_projections: false,
                    all_layers_sparse: false,
                    prefix: "",
                }
            }
            "qwen3_5" | "qwen3_5_moe" => {
                // `ModelArgs.from_dict`: the text arguments are `text_config`, or the whole
                // config when there is none.
                let text = config
                    .raw
                    .get("text_config")
                    .cloned()
                    .unwrap_or_else(|| config.raw.clone());
                let a: Qwen35Args = crate::config::parse_args(&text, &config.architecture)?;
                let head_dim = match a.head_dim {
                    Some(d) => d,
                    None if a.num_attention_heads > 0 => a.hidden_size / a.num_attention_heads,
                    None => 0,
                };
                // `__post_init__`: rope settings come from `rope_parameters` (`rope_type`
                // renamed `type`), which also becomes `rope_scaling`.
                let default_params = serde_json::json!({
                    "type": "default",
                    "mrope_section": [11, 11, 10],
                    "rope_theta": 100000,
                    "partial_rotary_factor": 0.25,
                });
                let params = match a.rope_parameters {
                    Some(Value::Null) => None,
                    Some(p) => Some(p),
                    None => Some(default_params),
                };
                let (mut prf, mut theta, mut scaling) = (0.25, 100000.0, None);
                if let Some(p) = params {
                    let mut obj = p.as_object().cloned().ok_or_else(|| {
                        ModelError::Config("rope_parameters must be an object".into())
                    })?;
                    if !obj.is_empty() {
                        if !obj.contains_key("type") {
                            if let Some(t) = obj.remove("rope_type") {
                                obj.insert("type".into(), t);
                            }
                        }
                        prf = obj
                            .get("partial_rotary_factor")
                            .and_then(Value::as_f64)
                            .unwrap_or(0.25);
                        theta = obj
                            .get("rope_theta")
                            .and_then(Value::as_f64)
                            .unwrap_or(100000.0);
                        scaling = Some(obj);
                    }
                }
                ModelArgs {
                    model_type: config.model_type.clone(),
                    hidden_size: a.hidden_size,
                    num_hidden_layers: a.num_hidden_layers,
                    intermediate_size: a.intermediate_size,
                    num_attention_heads: a.num_attention_heads,
                    num_key_value_heads: a.num_key_value_heads,
                    head_dim,
                    rms_norm_eps: a.rms_norm_eps,
                    vocab_size: a.vocab_size,
                    linear_num_value_heads: a.linear_num_value_heads,
                    linear_num_key_heads: a.linear_num_key_heads,
                    linear_key_head_dim: a.linear_key_head_dim,
                    linear_value_head_dim: a.linear_value_head_dim,
                    linear_conv_kernel_dim: a.linear_conv_kernel_dim,
                    num_experts: a.num_experts,
                    num_experts_per_tok: a.num_experts_per_tok,
                    decoder_sparse_step: a.decoder_sparse_step,
                    shared_expert_intermediate_size: a.shared_expert_intermediate_size,
                    mlp_only_layers: Vec::new(),
                    moe_intermediate_size: a.moe_intermediate_size,
                    norm_topk_prob: a.norm_topk_prob,
                    rope_theta: theta,
                    partial_rotary_factor: prf,
                    rope_scaling: scaling,
                    max_position_embeddings: Some(a.max_position_embeddings),
                    tie_word_embeddings: a.tie_word_embeddings,
                    attention_bias: a.attention_bias,
                    full_attention_interval: a.full_attention_interval,
                    split_projections: true,
                    all_layers_sparse: true,
                    prefix: "language_model.",
                }
            }
            other => {
                return Err(ModelError::Config(format!(
                    "`{other}` is not a Gated DeltaNet hybrid"
                )))
            }
        };
        args.validate()
    }

    fn validate(self) -> Result<ModelArgs> {
        let t = &self.model_type;
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("vocab_size", self.vocab_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("full_attention_interval", self.full_attention_interval),
        ] {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "{t}: `{name}` must be positive, got {v}"
                )));
            }
        }
        if self.linear_num_value_heads % self.linear_num_key_heads != 0 {
            return Err(ModelError::Config(format!(
                "{t}: num_v_heads ({}) must be divisible by num_k_heads ({})",
                self.linear_num_value_heads, self.linear_num_key_heads
            )));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(ModelError::Config(format!(
                "{t}: num_attention_heads {} must be a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.num_experts > 0
            && (self.num_experts_per_tok <= 0 || self.num_experts_per_tok > self.num_experts)
        {
            return Err(ModelError::Config(format!(
                "{t}: num_experts_per_tok {} must be in 1..={}",
                self.num_experts_per_tok, self.num_experts
            )));
        }
        Ok(self)
    }

    fn is_linear(&self, layer: i32) -> bool {
        (layer + 1) % self.full_attention_interval != 0
    }

    fn is_sparse(&self, layer: i32) -> bool {
        if self.all_layers_sparse {
            return self.num_experts > 0;
        }
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && self.decoder_sparse_step > 0
            && (layer + 1) % self.decoder_sparse_step == 0
    }
}

/// `Qwen3NextAttention` ([`kit::Attention`]): queries emit a sigmoid gate on the output;
/// per-head q/k norms; partial rotary embedding.
fn attention(a: &ModelArgs, w: &mut Weights, path: &str) -> Result<kit::Attention> {
    let hd = a.head_dim;
    let dims = (
        a.hidden_size,
        a.num_attention_heads,
        a.num_key_value_heads,
        hd,
    );
    let scale = f64::from(hd).powf(-0.5) as f32;
    let rope = Rope::initialize(
        (f64::from(hd) * a.partial_rotary_factor) as i32,
        a.rope_theta,
        false,
        a.rope_scaling.as_ref(),
        a.max_position_embeddings,
    )?;
    Ok(
        kit::Attention::load_query_gated(w, path, dims, a.attention_bias, scale)?
            .with_head_norms(w, path, a.rms_norm_eps as f32)?
            .with_rope(Some(rope)),
    )
}

impl kit::Attention {
    /// qwen3_5's `shard()` of a gated attention: q (with its gate rows, whole heads) all-to-
    /// sharded; k and v repeated per head when there are more ranks than KV heads
    /// (`repeat_kv_layer_inplace`), then all-to-sharded; o sharded-to-all; heads / N and KV
    /// heads `max(1, kv / N)`.
    fn shard_repeating_kv(&mut self, n: i32, r: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, repeat_heads, sharded_to_all};
        let p = |m: &str| format!("{path}.{m}");
        if self.n_heads % n != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: format!("{} heads do not split over {n} ranks", self.n_heads),
            });
        }
        let (Some(k_proj), Some(v_proj)) = (self.k_proj.as_mut(), self.v_proj.as_mut()) else {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: "a layer reusing another's keys and values cannot be sharded".into(),
            });
        };
        sharded_to_all(&mut self.o_proj, n, r, &p("o_proj"))?;
        all_to_sharded(&mut self.q_proj, n, r, &p("q_proj"))?;
        repeat_heads(k_proj, self.n_kv_heads, n, &p("k_proj"))?;
        repeat_heads(v_proj, self.n_kv_heads, n, &p("v_proj"))?;
        all_to_sharded(k_proj, n, r, &p("k_proj"))?;
        all_to_sharded(v_proj, n, r, &p("v_proj"))?;
        self.n_heads /= n;
        self.n_kv_heads = (self.n_kv_heads / n).max(1);
        Ok(())
    }
}

#[derive(Clone)]
enum Projections {
    /// qwen3_next: `in_proj_qkvz`, `in_proj_ba`, grouped per key head.
    Fused { qkvz: Linear, ba: Linear },
    /// qwen3_5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split {
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    },
}

/// `Qwen3NextGatedDeltaNet` / qwen3_5 `GatedDeltaNet`.
#[derive(Clone)]
struct GatedDeltaNet {
    num_k_heads: i32,
    num_v_heads: i32,
    head_k_dim: i32,
    head_v_dim: i32,
    key_dim: i32,
    conv_dim: i32,
    conv_kernel_size: i32,
    conv1d_weight: Array,
    proj: Projections,
    dt_bias: Array,
    a_log: Array,
    norm: RmsNormGated,
    out_proj: Linear,
    /// MLX's fused `fast::gated_delta_update` instead of the plain-ops loop (never while a
    /// cache records per-token states, which only the loop yields).
    use_kernel: bool,
    /// mlx-lm's `sharding_group` (qwen3_5's `shard()`): the output summed over the group.
    sharded: bool,
}

impl Walkable for GatedDeltaNet {
    /// The input projections and `out_proj`, then the block's own arrays under mlx-lm's
    /// names (`conv1d.weight`, `dt_bias`, `A_log`, `norm.weight`).
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let p = |n: &str| join(path, n);
        match &mut self.proj {
            Projections::Fused { qkvz, ba } => {
                w.linear(&p("in_proj_qkvz"), qkvz);
                w.linear(&p("in_proj_ba"), ba);
            }
            Projections::Split { qkv, z, b, a } => {
                w.linear(&p("in_proj_qkv"), qkv);
                w.linear(&p("in_proj_z"), z);
                w.linear(&p("in_proj_b"), b);
                w.linear(&p("in_proj_a"), a);
            }
        }
        w.linear(&p("out_proj"), &mut self.out_proj);
        w.array(&p("conv1d"), "weight", &mut self.conv1d_weight);
        w.array(path, "dt_bias", &mut self.dt_bias);
        w.array(path, "A_log", &mut self.a_log);
        w.array(&p("norm"), "weight", &mut self.norm.weight);
    }
}

impl GatedDeltaNet {
    fn load(a: &ModelArgs, w: &mut Weights, path: &str) -> Result<GatedDeltaNet> {
        let p = |n: &str| format!("{path}.{n}");
        let (nk, nv, dk, dv) = (
            a.linear_num_key_heads,
            a.linear_num_value_heads,
            a.linear_key_head_dim,
            a.linear_value_head_dim,
        );
        let (key_dim, value_dim) = (dk * nk, dv * nv);
        let conv_dim = key_dim * 2 + value_dim;
        let dim = a.hidden_size;
        let proj = if a.split_projections {
            Projections::Split {
                qkv: Linear::load(w, &p("in_proj_qkv"), dim, conv_dim, false)?,
                z: Linear::load(w, &p("in_proj_z"), dim, value_dim, false)?,
                b: Linear::load(w, &p("in_proj_b"), dim, nv, false)?,
                a: Linear::load(w, &p("in_proj_a"), dim, nv, false)?,
            }
        } else {
            Projections::Fused {
                qkvz: Linear::load(
                    w,
                    &p("in_proj_qkvz"),
                    dim,
                    key_dim * 2 + value_dim * 2,
                    false,
                )?,
                ba: Linear::load(w, &p("in_proj_ba"), dim, nv * 2, false)?,
            }
        };
        Ok(GatedDeltaNet {
            num_k_heads: nk,
            num_v_heads: nv,
            head_k_dim: dk,
            head_v_dim: dv,
            key_dim,
            conv_dim,
            conv_kernel_size: a.linear_conv_kernel_dim,
            conv1d_weight: w.take(
                &p("conv1d.weight"),
                &[conv_dim, a.linear_conv_kernel_dim, 1],
            )?,
            proj,
            dt_bias: w.take(&p("dt_bias"), &[nv])?,
            a_log: w.take(&p("A_log"), &[nv])?,
            norm: RmsNormGated::load(w, &p("norm"), dv, a.rms_norm_eps as f32)?,
            out_proj: Linear::load(w, &p("out_proj"), value_dim, dim, false)?,
            use_kernel: false,
            sharded: false,
        })
    }

    /// `(mixed_qkv (B, S, conv_dim), z (B, S, nv, dv), b (B, S, nv), a (B, S, nv))`.
    fn project(&self, x: &Array, bsz: i32, s: i32) -> Result<(Array, Array, Array, Array)> {
        let (nk, dn, nv, dv) = (
            self.num_k_heads,
            self.head_k_dim,
            self.num_v_heads,
            self.head_v_dim,
        );
        match &self.proj {
            Projections::Split { qkv, z, b, a } => Ok((
                qkv.forward(x)?,
                ops::reshape(&z.forward(x)?, &[bsz, s, nv, dv], None)?,
                b.forward(x)?,
                a.forward(x)?,
            )),
            Projections::Fused { qkvz, ba } => {
                // `fix_query_key_value_ordering`.
                let mixed_qkvz = ops::reshape(&qkvz.forward(x)?, &[bsz, s, nk, -1], None)?;
                let mixed_ba = ops::reshape(&ba.forward(x)?, &[bsz, s, nk, -1], None)?;
                let parts =
                    ops::split_at(&mixed_qkvz, &[dn, 2 * dn, 2 * dn + nv / nk * dv], -1, None)?;
                let ba_parts = ops::split_at(&mixed_ba, &[nv / nk], -1, None)?;
                let flat = |t: &Array| ops::reshape(t, &[bsz, s, -1], None);
                let v = ops::reshape(&parts[2], &[bsz, s, -1, dv], None)?;
                let mixed_qkv = ops::concatenate(
                    &[&flat(&parts[0])?, &flat(&parts[1])?, &flat(&v)?],
                    -1,
                    None,
                )?;
                Ok((
                    mixed_qkv,
                    ops::reshape(&parts[3], &[bsz, s, -1, dv], None)?,
                    ops::reshape(&ba_parts[0], &[bsz, s, nv], None)?,
                    ops::reshape(&ba_parts[1], &[bsz, s, nv], None)?,
                ))
            }
        }
    }

    fn forward(
        &self,
        inputs: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let sh = inputs.shape();
        let (bsz, s) = (sh[0], sh[1]);
        let (mut mixed_qkv, z, b, a) = self.project(inputs, bsz, s)?;
        let n_keep = self.conv_kernel_size - 1;
        let conv_state = match cache.as_ref().and_then(|c| c.get(0)) {
            Some(c) => c.clone(),
            None => ops::zeros(&[bsz, n_keep, self.conv_dim], inputs.dtype(), None)?,
        };
        if let Some(m) = mask {
            mixed_qkv =
                ops::where_scalar(&ops::expand_dims(m, &[-1], None)?, &mixed_qkv, 0i32, None)?;
        }
        let conv_input = ops::concatenate(&[&conv_state, &mixed_qkv], 1, None)?;
        let keep_states = cache.as_ref().is_some_and(|c| c.keeps_history());
        let conv_out = silu(&ops::conv1d(
            &conv_input,
            &self.conv1d_weight,
            1,
            0,
            1,
            self.conv_dim,
            None,
        )?)?;
        let qkv = ops::split_at(&conv_out, &[self.key_dim, 2 * self.key_dim], -1, None)?;
        let q = ops::reshape(&qkv[0], &[bsz, s, self.num_k_heads, self.head_k_dim], None)?;
        let k = ops::reshape(&qkv[1], &[bsz, s, self.num_k_heads, self.head_k_dim], None)?;
        let v = ops::reshape(&qkv[2], &[bsz, s, self.num_v_heads, self.head_v_dim], None)?;
        let state = cache.as_ref().and_then(|c| c.get(1)).cloned();
        let (q, k) = normalize_qk(&q, &k, f64::from(self.head_k_dim).powf(-0.5), 1e-6)?;
        let (out, state, steps) = if self.use_kernel && !keep_states {
            let (y, s) = gated_delta_update_fast(
                &q,
                &k,
                &v,
                &a,
                &b,
                &self.a_log,
                &self.dt_bias,
                state.as_ref(),
                mask,
            )?;
            (y, s, Vec::new())
        } else {
            gated_delta_update(
                &q,
                &k,
                &v,
                &a,
                &b,
                &self.a_log,
                &self.dt_bias,
                state.as_ref(),
                mask,
                keep_states,
            )?
        };
        if let Some(c) = cache {
            let conv_at = |t: i32| -> Result<Array> {
                Ok(ops::contiguous(
                    &ops::slice_axis(&conv_input, 1, t, t + n_keep, None)?,
                    false,
                    None,
                )?)
            };
            if keep_states {
                let mut recorded = Vec::with_capacity(steps.len());
                for (t, st) in steps.into_iter().enumerate() {
                    recorded.push(vec![Some(conv_at(t as i32 + 1)?), Some(st)]);
                }
                c.checkpoint_steps(recorded)?;
            }
            c.set(0, conv_at(s)?)?;
            c.set(1, state)?;
            c.advance(s as usize)?;
        }
        let out = self.norm.forward(&out, Some(&z))?;
        let out = self
            .out_proj
            .forward(&ops::reshape(&out, &[bsz, s, -1], None)?)?;
        if self.sharded {
            return Ok(mlx_core::distributed::all_sum(&out, None, None)?);
        }
        Ok(out)
    }

    /// qwen3_5's `shard()` of a linear-attention block: the depthwise convolution and
    /// `in_proj_qkv` split by segments (q | k | v, each by rank), `in_proj_z`, `in_proj_b`,
    /// `in_proj_a`, `dt_bias` and `A_log` by heads, `out_proj` by input columns in place, the
    /// head counts and widths / N, and the block's output summed.
    fn shard_tensor_parallel(&mut self, n: i32, r: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, all_to_sharded_segments, sharded_to_all_inplace};
        let p = |m: &str| format!("{path}.{m}");
        if self.num_k_heads % n != 0 || self.num_v_heads % n != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: format!(
                    "{} key heads and {} value heads do not split over {n} ranks",
                    self.num_k_heads, self.num_v_heads
                ),
            });
        }
        let kd = self.key_dim;
        let seg = [kd, 2 * kd];
        let Projections::Split { qkv, z, b, a } = &mut self.proj else {
            return Err(ModelError::Parallel { kind: crate::Parallelism::Tensor, what: path.to_string(), problem: "fused in_proj_qkvz / in_proj_ba (qwen3_next) have no tensor parallelism in mlx-lm".into() });
        };
        self.conv1d_weight =
            crate::shard::split_rows(&self.conv1d_weight, &seg, n, r, &p("conv1d.weight"))?;
        all_to_sharded_segments(qkv, &seg, n, r, &p("in_proj_qkv"))?;
        all_to_sharded(z, n, r, &p("in_proj_z"))?;
        all_to_sharded(b, n, r, &p("in_proj_b"))?;
        all_to_sharded(a, n, r, &p("in_proj_a"))?;
        self.dt_bias = crate::shard::split_rows(&self.dt_bias, &[], n, r, &p("dt_bias"))?;
        self.a_log = crate::shard::split_rows(&self.a_log, &[], n, r, &p("A_log"))?;
        sharded_to_all_inplace(&mut self.out_proj, n, r, &p("out_proj"))?;
        self.num_k_heads /= n;
        self.num_v_heads /= n;
        self.key_dim /= n;
        self.conv_dim /= n;
        self.sharded = true;
        Ok(())
    }
}

#[derive(Clone)]
enum Mixer {
    Linear(Box<GatedDeltaNet>),
    Attention(Box<kit::Attention>),
}

#[derive(Clone)]
struct DecoderLayer {
    mixer: Mixer,
    mlp: Ffn,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl Walkable for DecoderLayer {
    /// The mixer (`linear_attn` or `self_attn`), `mlp`, then the norms.
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let DecoderLayer {
            mixer,
            mlp,
            input_layernorm,
            post_attention_layernorm,
        } = self;
        match mixer {
            Mixer::Linear(m) => w.module(&join(path, "linear_attn"), m.as_mut()),
            Mixer::Attention(a) => w.module(&join(path, "self_attn"), a.as_mut()),
        }
        mlp.walk(&join(path, "mlp"), w);
        w.rms_norm(&join(path, "input_layernorm"), input_layernorm);
        w.rms_norm(
            &join(path, "post_attention_layernorm"),
            post_attention_layernorm,
        );
    }
}

impl DecoderLayer {
    /// One layer at index `i` (for its error message) over `h`.
    fn forward(
        &self,
        h: &Array,
        i: usize,
        fa_mask: &AttentionMask,
        ssm_mask: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let x = self.input_layernorm.forward(h)?;
        let r = match &self.mixer {
            Mixer::Linear(m) => {
                let c = match cache {
                    Some(c) => Some(c.as_any_mut().downcast_mut::<ArraysCache>().ok_or_else(
                        || ModelError::Cache {
                            what: format!("layer {i}"),
                            problem: "a Gated DeltaNet layer and needs an ArraysCache".into(),
                        },
                    )?),
                    None => None,
                };
                m.forward(&x, ssm_mask, c)?
            }
            Mixer::Attention(m) => m.forward(&x, fa_mask, cache)?,
        };
        let hh = (h + &r)?;
        let n2 = self.post_attention_layernorm.forward(&hh)?;
        let f = self.mlp.forward(&n2)?;
        Ok((&hh + &f)?)
    }
}

impl LayerArrays for DecoderLayer {}

/// A decoder layer under `p`: a Gated DeltaNet or gated attention mixer, a sparse or dense MLP.
fn load_layer(
    args: &ModelArgs,
    w: &mut Weights,
    p: &str,
    linear: bool,
    sparse: bool,
) -> Result<DecoderLayer> {
    let eps = args.rms_norm_eps as f32;
    let dim = args.hidden_size;
    let mixer = if linear {
        Mixer::Linear(Box::new(GatedDeltaNet::load(
            args,
            w,
            &format!("{p}.linear_attn"),
        )?))
    } else {
        Mixer::Attention(Box::new(attention(args, w, &format!("{p}.self_attn"))?))
    };
    let mlp = if sparse {
        Ffn::Sparse(Box::new(SparseMoe::load_parts(
            w,
            &format!("{p}.mlp"),
            &SparseMoeParams {
                hidden_size: dim,
                num_experts: args.num_experts,
                top_k: args.num_experts_per_tok,
                moe_intermediate_size: args.moe_intermediate_size,
                expert_bias: false,
                router: Router::SoftmaxUpperPartition {
                    norm_topk_prob: args.norm_topk_prob,
                    cast_back: false,
                },
                shared_expert_intermediate_size: Some(args.shared_expert_intermediate_size),
                names: ["gate", "switch_mlp"],
                router_bias: false,
                activation: SwitchActivation::SwiGlu,
            },
        )?))
    } else {
        Ffn::Dense(Mlp::load(
            w,
            &format!("{p}.mlp"),
            &crate::layers::MlpNames::LLAMA,
            dim,
            args.intermediate_size,
            false,
            false,
            MlpKind::SwiGlu,
        )?)
    };
    Ok(DecoderLayer {
        mixer,
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

/// The qwen3_next / qwen3_5 model.
pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    ssm_idx: Option<usize>,
    fa_idx: Option<usize>,
    /// `--grad-checkpoint`: every layer under `mx.checkpoint` (training, no caches).
    grad_checkpoint: bool,
    /// The layers whose own arrays enter their checkpoints (full fine-tuning).
    checkpoint_own: std::ops::Range<usize>,
    /// This rank's pipeline stage `(rank, size)` after [`Model::shard_pipeline`].
    pipeline: Option<(i32, i32)>,
    /// The group size when the untied head is split by vocabulary
    /// ([`Model::shard_tensor_parallel`]): its logits are gathered along the last axis.
    sharded_head: Option<i32>,
    /// The `mtp.*` layers, loaded only when asked ([`Weights::with_mtp`]).
    mtp: Option<Mtp>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args = ModelArgs::from_config(config)?;
        sanitize(&args, w)?;
        let pre = format!("{}model", args.prefix);
        let eps = args.rms_norm_eps as f32;
        let dim = args.hidden_size;
        let embed_tokens =
            Embedding::load(w, &format!("{pre}.embed_tokens"), args.vocab_size, dim)?;
        let mut layers = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = format!("{pre}.layers.{i}");
            layers.push(load_layer(
                &args,
                w,
                &p,
                args.is_linear(i),
                args.is_sparse(i),
            )?);
        }
        let mtp = if w.mtp() {
            Some(Mtp::load(&args, w, config)?)
        } else {
            None
        };
        let norm = RmsNorm::load(w, &format!("{pre}.norm"), dim, eps)?;
        let lm_head = if args.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(
                w,
                &format!("{}lm_head", args.prefix),
                dim,
                args.vocab_size,
                false,
            )?)
        };
        let ssm_idx = (0..args.num_hidden_layers).position(|i| args.is_linear(i));
        let fa_idx = (0..args.num_hidden_layers).position(|i| !args.is_linear(i));
        Ok(Model {
            args,
            embed_tokens,
            layers,
            norm,
            lm_head,
            ssm_idx,
            fa_idx,
            grad_checkpoint: false,
            checkpoint_own: 0..0,
            pipeline: None,
            sharded_head: None,
            mtp,
        })
    }

    /// Runs the DeltaNet layers through MLX's fused `fast::gated_delta_update` (the kernel
    /// path) instead of mlx-lm's plain-ops loop (the default, the L1 reference off Apple
    /// GPUs). On the CPU backend both give the same bits.
    pub fn use_fast_gated_delta(&mut self, on: bool) {
        for l in &mut self.layers {
            if let Mixer::Linear(m) = &mut l.mixer {
                m.use_kernel = on;
            }
        }
    }
}

/// How many `mtp.layers.<i>` the tensors hold.
fn mtp_count(w: &Weights) -> i32 {
    w.names()
        .iter()
        .filter_map(|n| {
            n.strip_prefix("mtp.layers.")?
                .split('.')
                .next()?
                .parse::<i32>()
                .ok()
        })
        .map(|i| i + 1)
        .max()
        .unwrap_or(0)
}

/// Qwen3-Next's multi-token-prediction head (`mtp.*`, as vLLM's `Qwen3NextMultiTokenPredictor`
/// runs it): `fc([pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)])` through
/// gated-attention decoder layers, then `norm`; the main model's head gives the logits.
#[derive(Clone)]
struct Mtp {
    fc: Linear,
    norm_embedding: RmsNorm,
    norm_hidden: RmsNorm,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}

impl Mtp {
    fn load(a: &ModelArgs, w: &mut Weights, config: &ModelConfig) -> Result<Mtp> {
        if a.split_projections || !a.prefix.is_empty() {
            return Err(ModelError::Config(format!(
                "--mtp: `{}` multi-token prediction is not supported here (qwen3_next is)",
                config.model_type
            )));
        }
        let n = mtp_count(w);
        let declared = config
            .raw
            .get("num_nextn_predict_layers")
            .and_then(Value::as_i64);
        if n == 0 || declared.is_some_and(|d| d != i64::from(n)) {
            return Err(ModelError::Config(format!(
                "--mtp: the weights hold {n} `mtp.layers.*` layers, config.json \
                 `num_nextn_predict_layers` says {}",
                declared.map_or("nothing".into(), |d| d.to_string())
            )));
        }
        let (dim, eps) = (a.hidden_size, a.rms_norm_eps as f32);
        let mut layers = Vec::with_capacity(n as usize);
        for i in 0..n {
            let p = format!("mtp.layers.{i}");
            let sparse = w.contains(&format!("{p}.mlp.switch_mlp.up_proj.weight"));
            layers.push(load_layer(a, w, &p, false, sparse)?);
        }
        Ok(Mtp {
            fc: Linear::load(w, "mtp.fc", 2 * dim, dim, false)?,
            norm_embedding: RmsNorm::load(w, "mtp.pre_fc_norm_embedding", dim, eps)?,
            norm_hidden: RmsNorm::load(w, "mtp.pre_fc_norm_hidden", dim, eps)?,
            layers,
            norm: RmsNorm::load(w, "mtp.norm", dim, eps)?,
        })
    }
}

impl crate::models::MtpHead for Model {
    fn depth(&self) -> usize {
        self.mtp.as_ref().map_or(0, |m| m.layers.len())
    }

    fn make_mtp_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.depth())
    }

    /// One layer `k` of the head: vLLM runs all of its layers in one step (`mtp.layers` with
    /// `num_nextn_predict_layers` = 1 in Qwen3-Next's checkpoints); here layer `k` alone,
    /// with the norms around it.
    fn mtp_forward(
        &self,
        k: usize,
        hidden: &Array,
        tokens: &Array,
        cache: &mut Box<dyn Cache>,
    ) -> Result<(Array, Array)> {
        let m = self.mtp.as_ref().ok_or_else(|| ModelError::Unsupported {
            what: "qwen3_next".into(),
            problem: "no multi-token-prediction layers loaded".into(),
        })?;
        let l = kit::mtp_layer(&m.layers, k)?;
        crate::models::moe::check_inputs(tokens)?;
        let e = m
            .norm_embedding
            .forward(&self.embed_tokens.forward(tokens)?)?;
        let x = ops::concatenate(&[&e, &m.norm_hidden.forward(hidden)?], -1, None)?;
        let x = m.fc.forward(&x)?;
        let n = x.shape().get(1).copied().unwrap_or(0) as usize;
        let mask = cache.make_mask(n, None, false)?;
        let h = l.forward(&x, k, &mask, None, Some(cache))?;
        let h = m.norm.forward(&h)?;
        Ok((self.head(&h)?, h))
    }
}

/// Both files' `sanitize`: qwen3_5 moves `model.language_model.*` to `language_model.model.*`
/// (dropping the vision tower) and prefixes the rest with `language_model.`; both drop `mtp.*`
/// and a tied `lm_head`, stack per-expert weights, move HF conv weights `(C, 1, K)` to
/// `(C, K, 1)`, and add 1 to the RMS norm weights of HF checkpoints (the `(C, 1, K)` conv is
/// the sign of one; qwen3_next applies both only when it stacked experts).
fn sanitize(a: &ModelArgs, w: &mut Weights) -> Result<()> {
    if a.split_projections {
        for name in w.names() {
            if name.starts_with("vision_tower") || name.starts_with("model.visual") {
                w.remove(&name);
                continue;
            }
            let new = if let Some(rest) = name.strip_prefix("model.language_model") {
                format!("language_model.model{rest}")
            } else if name.starts_with("language_model.") {
                continue;
            } else {
                format!("language_model.{name}")
            };
            if let Some(t) = w.remove(&name) {
                w.insert(new, t);
            }
        }
    }
    let pre = format!("{}model", a.prefix);
    let mut stacked = false;
    // `--mtp`: the `mtp.layers.*` experts are stacked as the model's.
    let mtp_layers = if w.mtp() { mtp_count(w) } else { 0 };
    let layer_prefixes = (0..a.num_hidden_layers)
        .map(|l| format!("{pre}.layers.{l}.mlp"))
        .chain((0..mtp_layers).map(|l| format!("mtp.layers.{l}.mlp")));
    for prefix in layer_prefixes {
        if a.split_projections {
            // qwen3_5_moe: fused `experts.gate_up_proj` (E, 2H, D) and `experts.down_proj`.
            if let Some(gate_up) = w.remove(&format!("{prefix}.experts.gate_up_proj")) {
                let mid = gate_up.shape().get(1).copied().unwrap_or(0) / 2;
                let halves = ops::split_at(&gate_up, &[mid], -2, None)?;
                w.insert(
                    format!("{prefix}.switch_mlp.gate_proj.weight"),
                    halves[0].clone(),
                );
                w.insert(
                    format!("{prefix}.switch_mlp.up_proj.weight"),
                    halves[1].clone(),
                );
                if let Some(down) = w.remove(&format!("{prefix}.experts.down_proj")) {
                    w.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
                }
            }
            continue;
        }
        if !w.contains(&format!("{prefix}.experts.0.up_proj.weight")) {
            continue;
        }
        stacked = true;
        kit::stack_experts(
            w,
            &format!("{prefix}.experts"),
            &format!("{prefix}.switch_mlp"),
            a.num_experts,
            &[
                ("up_proj", "up_proj"),
                ("down_proj", "down_proj"),
                ("gate_proj", "gate_proj"),
            ],
            &["weight"],
        )?;
    }
    let hf_checkpoint = if a.split_projections {
        w.names().iter().any(|k| {
            k.contains("conv1d.weight") && w.shape_of(k).and_then(|s| s.last().copied()) != Some(1)
        })
    } else {
        stacked
    };
    if !a.split_projections && !stacked {
        return Ok(());
    }
    for name in w.names() {
        if name.contains("mtp.") && !w.mtp() {
            w.remove(&name);
        }
    }
    if a.tie_word_embeddings {
        w.discard(&format!("{}lm_head.weight", a.prefix));
    }
    let norm_keys = [
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        "model.norm.weight",
        ".q_norm.weight",
        ".k_norm.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
    ];
    for name in w.names() {
        let shape = w.shape_of(&name).unwrap_or_default();
        if name.contains("conv1d.weight") && shape.last().copied() != Some(1) {
            if let Some(t) = w.remove(&name) {
                w.insert(name.clone(), ops::moveaxis(&t, 2, 1, None)?);
            }
        }
        if hf_checkpoint && shape.len() == 1 && norm_keys.iter().any(|k| name.ends_with(k)) {
            if let Some(t) = w.remove(&name) {
                w.insert(name.clone(), ops::add_scalar(&t, 1.0f32, None)?);
            }
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
        let (mut h, n) = kit::embed_inputs(inputs, &self.embed_tokens)?;
        let mut caches = caches;
        let (fa_mask, ssm_mask) = kit::hybrid_masks(
            caches.as_deref(),
            self.layers.len(),
            self.fa_idx,
            self.ssm_idx,
            n,
        )?;
        h = crate::shard::pipeline_recv(h, self.pipeline)?;
        h = layer_stack(
            &self.layers,
            h,
            caches.as_deref_mut(),
            self.grad_checkpoint,
            &self.checkpoint_own,
            |i| {
                let (fm, sm) = (fa_mask.clone(), ssm_mask.clone());
                move |l: &DecoderLayer, x: &Array, c: Option<&mut Box<dyn Cache>>| {
                    l.forward(x, i, &fm, sm.as_ref(), c)
                }
            },
        )?;
        h = crate::shard::pipeline_send(h, self.pipeline, caches.and_then(|c| c.last_mut()))?;
        self.norm.forward(&h)
    }

    /// Pipeline parallelism as `Qwen3NextModel.pipeline` / `Qwen3_5TextModel.pipeline`
    /// ([`crate::shard::pipeline_range`]): this model keeps its stage's layers and takes its
    /// masks from the stage's first recurrent and first attention layer; a stage ending on a
    /// recurrent layer ties its send to that cache's first array.
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        let t = self.args.model_type.as_str();
        // qwen3_5_moe inherits `pipeline`, but mlx-lm 0.32.2's own pipelined run of it fails
        // (a rank is lost in generate_step): refused until there is a reference.
        const PIPELINED: [&str; 2] = ["qwen3_next", "qwen3_5"];
        crate::shard::check_pipeline(t, &PIPELINED, self.pipeline.is_some())?;
        crate::shard::keep_stage(&mut self.layers, size, rank)?;
        let linear = |l: &DecoderLayer| matches!(l.mixer, Mixer::Linear(_));
        self.ssm_idx = self.layers.iter().position(linear);
        self.fa_idx = self.layers.iter().position(|l| !linear(l));
        self.pipeline = Some((rank, size));
        Ok(())
    }

    /// The output head over normed hidden states.
    fn head(&self, out: &Array) -> Result<Array> {
        let logits = super::project(self.lm_head.as_ref(), &self.embed_tokens, out)?;
        match self.sharded_head {
            Some(n) => crate::shard::gather_last_axis(&logits, n),
            None => Ok(logits),
        }
    }

    /// Tensor parallelism as qwen3_5's `shard()` (qwen3_5_moe's Model inherits it): an
    /// untied head split by vocabulary and gathered; linear-attention blocks as
    /// [`GatedDeltaNet::shard_tensor_parallel`], gated attention as
    /// [`Attention::shard_tensor_parallel`]; dense MLPs as llama's; MoE blocks with the
    /// experts and the gated shared expert split in place (its gate whole) and the block
    /// summed. qwen3_next has no `shard()` in mlx-lm and is refused.
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::all_to_sharded;
        const SHARDED: [&str; 2] = ["qwen3_5", "qwen3_5_moe"];
        let t = self.args.model_type.as_str();
        if !SHARDED.contains(&t) {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: format!("model_type `{t}`"),
                problem: format!(
                    "not supported ({}; mlx-lm's {t} has no shard())",
                    SHARDED.join(", ")
                ),
            });
        }
        crate::shard::check_tensor_rank(size, rank)?;
        if self.pipeline.is_some() || self.sharded_head.is_some() {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: "the model".into(),
                problem: "already split".into(),
            });
        }
        if self.mtp.is_some() {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: "the multi-token prediction head".into(),
                problem: "not sharded (load without it)".into(),
            });
        }
        let pre = format!("{}model", self.args.prefix);
        // Split copies (the arrays are shared, not copied) and keep them only when every part
        // splits: a refusal (an adapted linear, say) leaves the model whole.
        let mut lm_head = self.lm_head.clone();
        let mut layers = self.layers.clone();
        if let Some(head) = lm_head.as_mut() {
            let vocab = self.args.vocab_size;
            if vocab % size != 0 {
                return Err(ModelError::Tensor {
                    name: "lm_head".into(),
                    problem: format!("group size {size} must divide vocab_size {vocab}"),
                });
            }
            all_to_sharded(head, size, rank, &format!("{}lm_head", self.args.prefix))?;
        }
        for (i, l) in layers.iter_mut().enumerate() {
            let p = format!("{pre}.layers.{i}");
            match &mut l.mixer {
                Mixer::Linear(m) => {
                    m.shard_tensor_parallel(size, rank, &format!("{p}.linear_attn"))?
                }
                Mixer::Attention(a) => {
                    a.shard_repeating_kv(size, rank, &format!("{p}.self_attn"))?
                }
            }
            match &mut l.mlp {
                Ffn::Dense(m) => {
                    crate::shard::shard_mlp(m, size, rank, &format!("{p}.mlp"), false)?
                }
                Ffn::Sparse(m) => m.shard_gated_shared_in_place(size, rank, &format!("{p}.mlp"))?,
            }
        }
        if lm_head.is_some() {
            self.sharded_head = Some(size);
        }
        self.lm_head = lm_head;
        self.layers = layers;
        Ok(())
    }
}

impl LanguageModel for Model {
    port_entry_points!(args);

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    /// The projection `head` applies (for the chunked cross-entropy of training).
    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::of(
            self.lm_head.as_ref(),
            &self.embed_tokens,
        ))
    }

    kit::layer_caches! {
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers.iter().map(|l| matches!(l.mixer, Mixer::Attention(_))),
                2,
            )
        }
    }

    fn mtp(&self) -> Option<&dyn crate::models::MtpHead> {
        self.mtp
            .is_some()
            .then_some(self as &dyn crate::models::MtpHead)
    }
}

impl super::Trainable for Model {
    checkpoint_switches!();

    fn layers_path(&self) -> String {
        format!("{}model.layers", self.args.prefix)
    }

    fn top_modules_mut(&mut self) -> Vec<(String, super::TopModuleMut<'_>)> {
        super::head_and_embedding(
            self.args.prefix,
            self.lm_head.as_mut(),
            "lm_head",
            &mut self.embed_tokens,
            "model.embed_tokens",
        )
    }

    kit::walked_layers!(layers);
}
