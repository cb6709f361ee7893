//! mlx-lm 0.32.2 `models/granitemoehybrid.py` (Granite 4.0 hybrids): each layer is a Mamba 2
//! mixer or a rope attention (`layer_types`), then a dense SwiGLU MLP or a mixture of experts
//! (`num_local_experts`) beside a shared SwiGLU MLP, with Granite's embedding, residual,
//! attention and logit multipliers. Mamba layers hold an [`ArraysCache`] of two slots,
//! attention layers a [`KVCache`].

use mlx_cache::Cache;
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{arrays_cache, GatedNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::{swiglu, Embedding, Linear, RmsNorm, Rope, SwitchActivation};
use crate::models::checkpoint::layer_loop;
use crate::models::kit::{self, Attention};
use crate::models::mamba::{conv_kernel_ok, positive, sanitize};
use crate::models::moe_block::{Router, SparseMoe, SparseMoeParams};
use crate::models::LanguageModel;
use crate::weights::Weights;

serde_defaults! {
    default_true: bool = true;
    default_rope_theta: f64 = 10000.0;
    default_limit: (f64, f64) = (0.001, 100.0);
    default_pe: String = "rope".into();
}

/// granitemoehybrid.py `ModelArgs` (the fields this port reads).
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    max_position_embeddings: i64,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    attention_bias: bool,
    embedding_multiplier: f32,
    attention_multiplier: f32,
    logits_scaling: f32,
    residual_multiplier: f32,
    layer_types: Vec<String>,
    rms_norm_eps: f64,
    #[serde(default)]
    num_local_experts: Option<i32>,
    #[serde(default)]
    num_experts_per_tok: Option<i32>,
    #[serde(default)]
    shared_intermediate_size: Option<i32>,
    #[serde(default)]
    mamba_n_heads: Option<i32>,
    #[serde(default)]
    mamba_d_head: Option<i32>,
    #[serde(default)]
    mamba_proj_bias: Option<bool>,
    #[serde(default)]
    mamba_d_state: Option<i32>,
    #[serde(default)]
    mamba_d_conv: Option<i32>,
    #[serde(default)]
    mamba_n_groups: Option<i32>,
    #[serde(default)]
    mamba_conv_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "default_pe")]
    position_embedding_type: String,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    #[serde(default = "default_limit")]
    time_step_limit: (f64, f64),
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_parameters: Option<Value>,
}

fn bad(m: String) -> ModelError {
    ModelError::Config(format!("granitemoehybrid: {m}"))
}

impl ModelArgs {
    fn post_init(&mut self) -> Result<()> {
        if let Some(t) = self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
        {
            self.rope_theta = t;
        }
        if let Some(t) = self
            .layer_types
            .iter()
            .find(|t| *t != "mamba" && *t != "attention")
        {
            return Err(bad(format!("unknown layer type `{t}` in `layer_types`")));
        }
        if self.layer_types.is_empty() {
            return Err(bad("`layer_types` is empty".into()));
        }
        positive(
            "granitemoehybrid",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
            ],
        )?;
        if self.hidden_size % self.num_attention_heads != 0
            || self.num_attention_heads % self.num_key_value_heads != 0
        {
            return Err(bad(format!(
                "hidden_size {} / num_attention_heads {} / num_key_value_heads {} do not divide",
                self.hidden_size, self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.layer_types.iter().any(|t| t == "mamba") {
            let need = |name: &str, v: Option<i32>| {
                v.ok_or_else(|| bad(format!("mamba layers need `{name}`")))
            };
            let fields = [
                ("mamba_n_heads", need("mamba_n_heads", self.mamba_n_heads)?),
                ("mamba_d_head", need("mamba_d_head", self.mamba_d_head)?),
                ("mamba_d_state", need("mamba_d_state", self.mamba_d_state)?),
                (
                    "mamba_n_groups",
                    need("mamba_n_groups", self.mamba_n_groups)?,
                ),
            ];
            positive("granitemoehybrid", &fields)?;
            conv_kernel_ok("granitemoehybrid", need("mamba_d_conv", self.mamba_d_conv)?)?;
            if fields[0].1 % fields[3].1 != 0 {
                return Err(bad(format!(
                    "`mamba_n_heads` {} is not a multiple of `mamba_n_groups` {}",
                    fields[0].1, fields[3].1
                )));
            }
        }
        if self.use_moe() {
            let k = self.num_experts_per_tok.unwrap_or(0);
            let n = self.num_local_experts.unwrap_or(0);
            if k <= 0 || k > n {
                return Err(bad(format!(
                    "`num_experts_per_tok` must be in 1..={n}, got {k}"
                )));
            }
            positive(
                "granitemoehybrid",
                &[(
                    "shared_intermediate_size",
                    self.shared_intermediate_size.unwrap_or(0),
                )],
            )?;
        }
        Ok(())
    }

    fn use_moe(&self) -> bool {
        self.num_local_experts.is_some_and(|n| n != 0)
    }

    fn mamba_dims(&self) -> Mamba2Dims {
        let (lo, hi) = self.time_step_limit;
        Mamba2Dims {
            hidden_size: self.hidden_size,
            num_heads: self.mamba_n_heads.unwrap_or(1),
            head_dim: self.mamba_d_head.unwrap_or(1),
            n_groups: self.mamba_n_groups.unwrap_or(1),
            state_size: self.mamba_d_state.unwrap_or(1),
            conv_kernel: self.mamba_d_conv.unwrap_or(2),
            use_conv_bias: self.mamba_conv_bias.unwrap_or(false),
            proj_bias: self.mamba_proj_bias.unwrap_or(false),
            out_bias: self.mamba_proj_bias.unwrap_or(false),
            eps: self.rms_norm_eps as f32,
            time_step_limit: (lo as f32, hi as f32),
            norm: GatedNorm::Plain,
            cast_d: true,
        }
    }
}

/// `GraniteMoeHybridAttention` ([`kit::Attention`]): rope unless `position_embedding_type` is
/// `"nope"`, scale `attention_multiplier`.
fn attention(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<Attention> {
    let (h, d, kv) = (a.num_attention_heads, a.hidden_size, a.num_key_value_heads);
    let hd = d / h;
    let attn = Attention::load(
        w,
        p,
        (d, h, kv, hd),
        a.attention_bias,
        a.attention_multiplier,
    )?;
    if a.position_embedding_type == "nope" {
        return Ok(attn);
    }
    Ok(attn.with_rope(Some(Rope::initialize(
        hd,
        a.rope_theta,
        false,
        None,
        Some(a.max_position_embeddings),
    )?)))
}

#[derive(Clone)]
enum Mixer {
    Mamba(Box<Mamba2Mixer>),
    Attention(Box<Attention>),
}

#[derive(Clone)]
enum Ffn {
    /// `GraniteMoeHybridMLP`.
    Dense {
        gate_proj: Linear,
        up_proj: Linear,
        down_proj: Linear,
    },
    /// `GraniteMoeHybridMoE` plus `GraniteMoeHybridSharedMLP`.
    Moe {
        moe: Box<SparseMoe>,
        input_linear: Linear,
        output_linear: Linear,
    },
}

#[derive(Clone)]
struct Layer {
    input_layernorm: RmsNorm,
    mixer: Mixer,
    post_attention_layernorm: RmsNorm,
    ffn: Ffn,
}

/// The Granite 4.0 hybrid model.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    embedding_multiplier: f32,
    residual_multiplier: f32,
    logits_scaling: f32,
    fa_idx: Option<usize>,
    ssm_idx: Option<usize>,
}

/// `sanitize`'s MoE and dense-MLP renames (HF's fused `input_linear` / `output_linear`).
fn sanitize_ffn(a: &ModelArgs, w: &mut Weights) -> Result<()> {
    let n = a.layer_types.len();
    if a.use_moe() && w.contains("model.layers.0.block_sparse_moe.input_linear.weight") {
        for l in 0..n {
            let p = format!("model.layers.{l}.block_sparse_moe");
            let Some(input) = w.remove(&format!("{p}.input_linear.weight")) else {
                continue;
            };
            let half = input.shape().get(1).copied().unwrap_or(0) / 2;
            w.insert(
                format!("{p}.switch_mlp.gate_proj.weight"),
                input.slice_axis(1, 0, half)?,
            );
            w.insert(
                format!("{p}.switch_mlp.up_proj.weight"),
                input.slice_axis(1, half, 2 * half)?,
            );
            if let Some(out) = w.remove(&format!("{p}.output_linear.weight")) {
                w.insert(format!("{p}.switch_mlp.down_proj.weight"), out);
            }
        }
    } else if !a.use_moe() && w.contains("model.layers.0.shared_mlp.input_linear.weight") {
        for l in 0..n {
            let p = format!("model.layers.{l}.shared_mlp");
            let Some(input) = w.remove(&format!("{p}.input_linear.weight")) else {
                continue;
            };
            let parts = ops::split_equal(&input, 2, 0, None)?;
            w.insert(
                format!("model.layers.{l}.mlp.gate_proj.weight"),
                parts[0].clone(),
            );
            w.insert(
                format!("model.layers.{l}.mlp.up_proj.weight"),
                parts[1].clone(),
            );
            if let Some(out) = w.remove(&format!("{p}.output_linear.weight")) {
                w.insert(format!("model.layers.{l}.mlp.down_proj.weight"), out);
            }
        }
    }
    if a.tie_word_embeddings {
        w.discard("lm_head.weight");
    }
    Ok(())
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let mut a: ModelArgs = config.args()?;
        a.post_init()?;
        sanitize(w)?;
        sanitize_ffn(&a, w)?;
        let d = a.hidden_size;
        let eps = a.rms_norm_eps as f32;
        let embed_tokens = Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?;
        let mut layers = Vec::with_capacity(a.layer_types.len());
        for (i, t) in a.layer_types.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mixer = if t == "mamba" {
                Mixer::Mamba(Box::new(Mamba2Mixer::load(
                    &a.mamba_dims(),
                    w,
                    &format!("{p}.mamba"),
                )?))
            } else {
                Mixer::Attention(Box::new(attention(&a, w, &format!("{p}.self_attn"))?))
            };
            let ffn = if a.use_moe() {
                let shared = a.shared_intermediate_size.unwrap_or(0);
                let moe = SparseMoe::load_parts(
                    w,
                    &format!("{p}.block_sparse_moe"),
                    &SparseMoeParams {
                        hidden_size: d,
                        num_experts: a.num_local_experts.unwrap_or(0),
                        top_k: a.num_experts_per_tok.unwrap_or(0),
                        moe_intermediate_size: a.intermediate_size,
                        expert_bias: false,
                        router: Router::UpperTopKThenSoftmax,
                        shared_expert_intermediate_size: None,
                        names: ["router.layer", "switch_mlp"],
                        router_bias: false,
                        activation: SwitchActivation::SwiGlu,
                    },
                )?;
                Ffn::Moe {
                    moe: Box::new(moe),
                    input_linear: Linear::load(
                        w,
                        &format!("{p}.shared_mlp.input_linear"),
                        d,
                        2 * shared,
                        false,
                    )?,
                    output_linear: Linear::load(
                        w,
                        &format!("{p}.shared_mlp.output_linear"),
                        shared,
                        d,
                        false,
                    )?,
                }
            } else {
                let m = |n: &str| format!("{p}.mlp.{n}");
                let h = a.intermediate_size;
                Ffn::Dense {
                    gate_proj: Linear::load(w, &m("gate_proj"), d, h, a.mlp_bias)?,
                    down_proj: Linear::load(w, &m("down_proj"), h, d, a.mlp_bias)?,
                    up_proj: Linear::load(w, &m("up_proj"), d, h, a.mlp_bias)?,
                }
            };
            layers.push(Layer {
                input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                mixer,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    d,
                    eps,
                )?,
                ffn,
            });
        }
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = crate::models::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        Ok(Model {
            fa_idx: a.layer_types.iter().position(|t| t == "attention"),
            ssm_idx: a.layer_types.iter().position(|t| t == "mamba"),
            model_type: a.model_type,
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            norm,
            lm_head,
            embedding_multiplier: a.embedding_multiplier,
            residual_multiplier: a.residual_multiplier,
            logits_scaling: a.logits_scaling,
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (h, n) = kit::embed_inputs(inputs, &self.embed_tokens)?;
        let h = (&h * self.embedding_multiplier)?;
        let (attn_mask, ssm_mask) = kit::hybrid_masks(
            caches.as_deref(),
            self.layers.len(),
            self.fa_idx,
            self.ssm_idx,
            n,
        )?;
        let r = self.residual_multiplier;
        let h = layer_loop(&self.layers, h, caches, |i, layer, h, cache| {
            let x = layer.input_layernorm.forward(h)?;
            let out = match &layer.mixer {
                Mixer::Mamba(m) => m.forward(&x, ssm_mask.as_ref(), arrays_cache(cache, i)?)?,
                Mixer::Attention(a) => a.forward(&x, &attn_mask, cache)?,
            };
            let h = (h + &(&out * r)?)?;
            let normed = layer.post_attention_layernorm.forward(&h)?;
            let mlp_out = match &layer.ffn {
                Ffn::Dense {
                    gate_proj,
                    up_proj,
                    down_proj,
                } => down_proj.forward(&swiglu(
                    &gate_proj.forward(&normed)?,
                    &up_proj.forward(&normed)?,
                )?)?,
                Ffn::Moe {
                    moe,
                    input_linear,
                    output_linear,
                } => {
                    let moe_out = moe.forward(&normed)?;
                    let gu = ops::split_equal(&input_linear.forward(&normed)?, 2, -1, None)?;
                    let shared = output_linear.forward(&swiglu(&gu[0], &gu[1])?)?;
                    (&moe_out + &shared)?
                }
            };
            Ok((&h + &(&mlp_out * r)?)?)
        })?;
        self.norm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        let out = crate::models::project(self.lm_head.as_ref(), &self.embed_tokens, h)?;
        Ok((&out / self.logits_scaling)?)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!();

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::Shaped {
            inner: Box::new(crate::models::OutputHead::of(
                self.lm_head.as_ref(),
                &self.embed_tokens,
            )),
            pre_div: None,
            post: vec![crate::models::LogitTransform::Div(self.logits_scaling)],
        })
    }

    kit::layer_caches! {
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers.iter().map(|l| matches!(l.mixer, Mixer::Attention(_))),
                2,
            )
        }
    }

    kit::own_type_and_vocab!();
}
