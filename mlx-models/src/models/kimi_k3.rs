//! mlx-lm 0.32.2 `models/kimi_k3.py`: Kimi K3's text model. KDA layers (one fused `qkv_proj`
//! through one short convolution, `kda.rs`'s [`Kda`] with its fused inputs) between NoPE MLA
//! layers (`layers/mla.rs`, with an optional sigmoid output gate), SiTU MLPs and experts, a
//! latent MoE (the routed experts run on a narrower width between `routed_expert_down_proj` and
//! `routed_expert_up_proj`) under the compiled grouped sigmoid router, and attention residuals
//! (`attn_res_block_size`): every block of layers records its input, and each sub-layer reads
//! a softmax mix of those records and its running sum (`_attn_res_combine`, compiled; its
//! Metal kernel runs only on Apple GPUs).
//!
//! Caches: an `ArraysCache(size=2)` per KDA layer (conv state, recurrent state), a `KVCache`
//! per MLA layer, as mlx-lm's `make_cache`.

use mlx_cache::Cache;
use mlx_core::compile::{compile, Compiled};
use mlx_core::distributed;
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::activations::one;
use crate::layers::{Embedding, Linear, RmsNorm, SwitchActivation, SwitchGlu};
use crate::models::kda::{
    self, DenseMlp, Ffn, Gate, GateKind, Kda, KdaSpec, Mixer, MlaGate, NopeMla, Router, SituMlp,
    SparseMoe,
};
use crate::models::moe_block::{self, GroupSelect};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    default_one: i32 = 1;
    default_four: i32 = 4;
    default_sixteen: i32 = 16;
    default_true: bool = true;
    default_situ: String = "situ".into();
    default_sigmoid: String = "sigmoid".into();
    default_scaling: f64 = 1.0;
}

/// kimi_k3.py's `linear_attn_config`.
#[derive(Clone, Debug, Deserialize)]
struct LinearAttnConfig {
    num_heads: i32,
    head_dim: i32,
    /// 1-based indices of the KDA layers.
    kda_layers: Vec<i32>,
    #[serde(default = "default_four")]
    short_conv_kernel_size: i32,
    #[serde(default)]
    gate_lower_bound: Option<f64>,
    #[serde(default)]
    use_full_rank_gate: bool,
}

/// kimi_k3.py `TextArgs` (the fields the text model reads; the others' defaults are mlx-lm's).
#[derive(Clone, Debug, Deserialize)]
struct TextArgs {
    vocab_size: i32,
    hidden_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    intermediate_size: i32,
    rms_norm_eps: f64,
    linear_attn_config: LinearAttnConfig,
    #[serde(default = "default_situ")]
    hidden_act: String,
    #[serde(default)]
    activation_situ_beta: Option<f64>,
    #[serde(default)]
    activation_situ_linear_beta: Option<f64>,
    #[serde(default)]
    attn_res_block_size: Option<i32>,
    #[serde(default)]
    q_lora_rank: Option<i32>,
    kv_lora_rank: i32,
    qk_nope_head_dim: i32,
    #[serde(default)]
    qk_rope_head_dim: i32,
    v_head_dim: i32,
    #[serde(default = "default_true")]
    mla_use_nope: bool,
    #[serde(default)]
    mla_use_output_gate: bool,
    #[serde(default)]
    num_experts: Option<i32>,
    #[serde(default = "default_sixteen")]
    num_experts_per_token: i32,
    #[serde(default)]
    num_shared_experts: i32,
    #[serde(default)]
    moe_intermediate_size: Option<i32>,
    #[serde(default = "default_sigmoid")]
    moe_router_activation_func: String,
    #[serde(default = "default_true")]
    moe_renormalize: bool,
    #[serde(default = "default_scaling")]
    routed_scaling_factor: f64,
    #[serde(default)]
    first_k_dense_replace: i32,
    #[serde(default = "default_one")]
    moe_layer_freq: i32,
    #[serde(default = "default_one")]
    num_expert_group: i32,
    #[serde(default = "default_one")]
    topk_group: i32,
    #[serde(default)]
    routed_expert_hidden_size: Option<i32>,
    #[serde(default)]
    latent_moe_use_norm: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
}

fn config_error(m: String) -> ModelError {
    ModelError::Config(format!("config.json (`kimi_k3`): {m}"))
}

/// A layer's attention-residual weights: `norm.weight.astype(float32) * proj.weight` for the
/// attention and the MLP mixes, and whether the layer starts a block.
#[derive(Clone)]
struct AttnRes {
    block_start: bool,
    attn_w: Array,
    mlp_w: Array,
}

/// A KDA or MLA layer and, when the model uses attention residuals, its mixes' weights.
#[derive(Clone)]
struct Layer {
    block: kda::Layer,
    attn_res: Option<AttnRes>,
}

/// `ResidualBlocks`: each block's input and its inverse RMS, stacked on a first axis.
struct Blocks {
    raw: Option<Array>,
    inv_rms: Option<Array>,
    eps: f32,
}

impl Blocks {
    fn append(&mut self, x: &Array) -> Result<()> {
        let xf = x.astype(Dtype::Float32)?;
        let ms = ops::mean(&(&xf * &xf)?, &[-1], false, None)?;
        let n = ops::rsqrt(&(&ms + self.eps)?, None)?.expand_dims(&[0])?;
        let r = x.expand_dims(&[0])?;
        let (raw, inv) = match (self.raw.take(), self.inv_rms.take()) {
            (Some(raw), Some(inv)) => (
                ops::concatenate(&[&raw, &r], 0, None)?,
                ops::concatenate(&[&inv, &n], 0, None)?,
            ),
            _ => (r, n),
        };
        self.raw = Some(raw);
        self.inv_rms = Some(inv);
        Ok(())
    }

    /// `_attn_res_mix(blocks, partial_sum, w_eff, eps)` off Apple GPUs: `partial_sum` alone
    /// before the first block, else the compiled `_attn_res_combine`.
    fn mix(&self, partial: &Array, w_eff: &Array) -> Result<Array> {
        match (&self.raw, &self.inv_rms) {
            (Some(raw), Some(inv)) => attn_res_combine(raw, inv, partial, w_eff, self.eps),
            _ => Ok(partial.clone()),
        }
    }
}

/// kimi_k3.py's `_attn_res_combine`, `mx.compile`d (not shapeless) with `eps` a constant of
/// the trace: one compiled function per `eps` and thread.
fn attn_res_combine(
    raw: &Array,
    inv_rms: &Array,
    partial: &Array,
    w_eff: &Array,
    eps: f32,
) -> Result<Array> {
    type Table = std::collections::HashMap<u32, &'static Compiled<'static>>;
    thread_local! {
        static F: std::cell::RefCell<Table> = std::cell::RefCell::new(Table::new());
    }
    let f = F.with(|table| -> Result<&'static Compiled<'static>> {
        if let Some(f) = table.borrow().get(&eps.to_bits()) {
            return Ok(*f);
        }
        let body = move |xs: &[Array]| -> mlx_core::Result<Vec<Array>> {
            let (raw, inv_rms, partial, w_eff) = (&xs[0], &xs[1], &xs[2], &xs[3]);
            let pf = partial.astype(Dtype::Float32)?;
            let ms = ops::mean(&(&pf * &pf)?, &[-1], false, None)?;
            let p_logit = (&ops::matmul(&pf, w_eff, None)? * &ops::rsqrt(&(&ms + eps)?, None)?)?;
            let raw_logits = (&ops::matmul(&raw.astype(Dtype::Float32)?, w_eff, None)? * inv_rms)?;
            let logits = ops::concatenate(&[&raw_logits, &p_logit.expand_dims(&[0])?], 0, None)?;
            let p = ops::softmax(&logits, &[0], true, None)?;
            let k = p.shape()[0];
            let head = p.slice_axis(0, 0, k - 1)?.expand_dims(&[-1])?;
            let last = ops::squeeze(&p.slice_axis(0, k - 1, k)?, &[0], None)?.expand_dims(&[-1])?;
            let mixed = ops::sum(&(&head * raw)?, &[0], false, None)?;
            let out = (&mixed + &(&last * partial)?)?;
            Ok(vec![out.astype(partial.dtype())?])
        };
        let f: &'static Compiled<'static> = Box::leak(Box::new(compile(body, false)?));
        table.borrow_mut().insert(eps.to_bits(), f);
        Ok(f)
    })?;
    Ok(one(
        f.call(&[raw.clone(), inv_rms.clone(), partial.clone(), w_eff.clone()])?,
        "attn_res_combine",
    )?)
}

/// `norm.weight.astype(float32) * proj.weight.reshape(-1)` of `{p}_norm` and `{p}_proj`.
fn res_weight(w: &mut Weights, p: &str, d: i32, eps: f32) -> Result<Array> {
    let norm = RmsNorm::load(w, &format!("{p}_norm"), d, eps)?;
    let proj = w.take(&format!("{p}_proj.weight"), &[1, d])?;
    let proj = if proj.size() == d as usize {
        proj.reshape(&[-1])?
    } else {
        proj
    };
    Ok((&norm.weight.astype(Dtype::Float32)? * &proj)?)
}

/// kimi_k3's text model.
pub struct Model {
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// The output mix's weights when the model uses attention residuals.
    output_res: Option<Array>,
    lm_head: Option<Linear>,
    eps: f32,
    kda_idx: Option<usize>,
    mla_idx: Option<usize>,
    /// `attn_res_block_size`: how many layers a residual block spans.
    block_size: Option<i32>,
    /// This rank's pipeline stage `(rank, size)` after [`Model::shard_pipeline`].
    pipeline: Option<(i32, i32)>,
    /// The residual blocks recorded before this stage's first layer (`in_blocks`): they
    /// arrive with the hidden state from the stage before.
    in_blocks: i32,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        // ModelArgs.from_dict: the whole config is the text model's without a `text_config`.
        let text = match config.raw.get("text_config") {
            None | Some(Value::Null) => config.raw.clone(),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => {
                return Err(config_error(format!(
                    "field `text_config` must be an object, got {v}"
                )))
            }
        };
        let a: TextArgs =
            serde_json::from_value(text).map_err(|e| config_error(format!("text config: {e}")))?;
        if a.hidden_act != "situ" {
            return Err(config_error(format!(
                "unsupported activation `{}` (`hidden_act`)",
                a.hidden_act
            )));
        }
        if a.moe_router_activation_func != "sigmoid" {
            return Err(config_error(format!(
                "unsupported MoE router activation `{}` (`moe_router_activation_func`)",
                a.moe_router_activation_func
            )));
        }
        if !a.mla_use_nope {
            return Err(config_error(
                "only NoPE MLA is supported (`mla_use_nope` must be true)".into(),
            ));
        }
        let la = &a.linear_attn_config;
        kit::check_positive(
            "kimi_k3",
            &[
                ("vocab_size", a.vocab_size),
                ("hidden_size", a.hidden_size),
                ("num_hidden_layers", a.num_hidden_layers),
                ("num_attention_heads", a.num_attention_heads),
                ("intermediate_size", a.intermediate_size),
                ("kv_lora_rank", a.kv_lora_rank),
                ("qk_nope_head_dim", a.qk_nope_head_dim),
                ("v_head_dim", a.v_head_dim),
                ("linear_attn_config.num_heads", la.num_heads),
                ("linear_attn_config.head_dim", la.head_dim),
                ("moe_layer_freq", a.moe_layer_freq),
                ("num_expert_group", a.num_expert_group),
                ("attn_res_block_size", a.attn_res_block_size.unwrap_or(1)),
                ("q_lora_rank", a.q_lora_rank.unwrap_or(1)),
                (
                    "routed_expert_hidden_size",
                    a.routed_expert_hidden_size.unwrap_or(1),
                ),
            ],
        )?;
        if a.qk_rope_head_dim < 0 {
            return Err(config_error(format!(
                "field `qk_rope_head_dim` must not be negative, got {}",
                a.qk_rope_head_dim
            )));
        }
        crate::models::mamba::conv_kernel_ok("kimi_k3", la.short_conv_kernel_size)?;
        let n = a.num_hidden_layers;
        let is_kda: Vec<bool> = (0..n).map(|i| la.kda_layers.contains(&(i + 1))).collect();
        let experts = a.num_experts.unwrap_or(0);
        let moe_layer =
            |i: i32| experts > 0 && i >= a.first_k_dense_replace && i % a.moe_layer_freq == 0;
        let moe_hidden = a.moe_intermediate_size.unwrap_or(0);
        if (0..n).any(moe_layer) {
            kit::check_positive(
                "kimi_k3",
                &[
                    ("moe_intermediate_size", moe_hidden),
                    ("num_experts_per_token", a.num_experts_per_token),
                    ("topk_group", a.topk_group),
                ],
            )?;
            if experts % a.num_expert_group != 0
                || a.topk_group > a.num_expert_group
                || a.num_experts_per_token > experts
                || (a.num_expert_group > 1 && experts / a.num_expert_group < 2)
            {
                return Err(config_error(format!(
                    "{experts} experts in {} groups (top {} groups, {} experts per token) do \
                     not split evenly (`num_experts`, `num_expert_group`)",
                    a.num_expert_group, a.topk_group, a.num_experts_per_token
                )));
            }
        }
        if a.num_shared_experts > 0 && (0..n).any(moe_layer) {
            kit::check_positive("kimi_k3", &[("num_shared_experts", a.num_shared_experts)])?;
        }

        // Model.sanitize: the text model only, without `language_model.`.
        for p in [
            "vision_tower",
            "vision_model",
            "multi_modal_projector",
            "mm_projector",
        ] {
            w.discard_prefix(p);
        }
        w.strip_prefix("language_model.");
        // LanguageModel.sanitize.
        w.discard_prefix("model.mtp");
        w.discard_prefix("mtp");
        w.discard_layers_from(n);
        if a.tie_word_embeddings {
            w.discard("lm_head.weight");
        }
        for name in w.names() {
            for src in ["self_attention_res", "mlp_res", "output_attn_res"] {
                for (pat, dst) in [
                    ("proj_weight", "proj.weight"),
                    ("norm_weight", "norm.weight"),
                ] {
                    let pat = format!("{src}.{pat}");
                    if let Some(stem) = name.strip_suffix(&pat) {
                        w.rename(&name, format!("{stem}{src}_{dst}"));
                    }
                }
            }
        }

        let eps = a.rms_norm_eps as f32;
        let d = a.hidden_size;
        // The SiTU constants of the MLPs and the experts.
        let (beta, linear_beta) = (
            a.activation_situ_beta.unwrap_or(1.0),
            a.activation_situ_linear_beta,
        );
        let mut layers = Vec::with_capacity(n as usize);
        for i in 0..n {
            let p = format!("model.layers.{i}");
            let moe = moe_layer(i);
            if moe {
                let src = format!("{p}.block_sparse_moe");
                let dst = format!("{p}.mlp");
                if w.contains(&format!("{src}.experts.0.w1.weight")) {
                    kit::stack_experts(
                        w,
                        &format!("{src}.experts"),
                        &format!("{dst}.switch_mlp"),
                        experts,
                        &[("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")],
                        &["weight", "scales", "biases"],
                    )?;
                }
                for name in [
                    "shared_experts.gate_proj",
                    "shared_experts.up_proj",
                    "shared_experts.down_proj",
                    "routed_expert_down_proj",
                    "routed_expert_up_proj",
                    "routed_expert_norm",
                    "gate",
                    "switch_mlp.gate_proj",
                    "switch_mlp.up_proj",
                    "switch_mlp.down_proj",
                ] {
                    for suffix in ["weight", "scales", "biases"] {
                        w.rename(
                            &format!("{src}.{name}.{suffix}"),
                            format!("{dst}.{name}.{suffix}"),
                        );
                    }
                }
                for key in [
                    format!("{src}.gate.e_score_correction_bias"),
                    format!("{src}.e_score_correction_bias"),
                ] {
                    w.rename(&key, format!("{dst}.e_score_correction_bias"));
                }
            }
            let attn = format!("{p}.self_attn");
            let mixer = if is_kda[i as usize] {
                kda::move_kimi_convs(w, &attn)?;
                for name in ["dt_bias", "A_log"] {
                    let key = format!("{attn}.{name}");
                    if w.shape_of(&key).is_some_and(|s| s.len() > 1) {
                        w.map_tensor(&key, |t| Ok(t.reshape(&[-1])?))?;
                    }
                }
                let a_log = format!("{attn}.A_log");
                if w.shape_of(&a_log)
                    .is_some_and(|s| s.first().copied().unwrap_or(0) > la.num_heads)
                {
                    let heads = la.num_heads;
                    w.map_tensor(&a_log, |t| Ok(t.slice_axis(0, 0, heads)?))?;
                }
                if !w.contains(&format!("{attn}.qkv_proj.weight")) {
                    for suffix in ["weight", "scales", "biases"] {
                        let parts: Vec<String> = ["q", "k", "v"]
                            .iter()
                            .map(|c| format!("{attn}.{c}_proj.{suffix}"))
                            .collect();
                        if parts.iter().all(|k| w.contains(k)) {
                            let ts: Vec<Array> = parts.iter().filter_map(|k| w.remove(k)).collect();
                            let refs: Vec<&Array> = ts.iter().collect();
                            w.insert(
                                format!("{attn}.qkv_proj.{suffix}"),
                                ops::concatenate(&refs, 0, None)?,
                            );
                        }
                    }
                }
                let convs: Vec<String> = ["q", "k", "v"]
                    .iter()
                    .map(|c| format!("{attn}.{c}_conv.conv.weight"))
                    .collect();
                if !w.contains(&format!("{attn}.qkv_conv.conv.weight"))
                    && convs.iter().all(|k| w.contains(k))
                {
                    let ts: Vec<Array> = convs.iter().filter_map(|k| w.remove(k)).collect();
                    let refs: Vec<&Array> = ts.iter().collect();
                    w.insert(
                        format!("{attn}.qkv_conv.conv.weight"),
                        ops::concatenate(&refs, 0, None)?,
                    );
                }
                Mixer::Kda(Box::new(Kda::load(
                    &KdaSpec {
                        hidden_size: d,
                        num_heads: la.num_heads,
                        head_dim: la.head_dim,
                        kernel: la.short_conv_kernel_size,
                        eps,
                        conv_names: &["qkv_conv.conv"],
                        a_log_shape: vec![la.num_heads],
                        gates: GateKind::LowRank {
                            lower_bound: la.gate_lower_bound.map(|b| b as f32),
                            full_out: la.use_full_rank_gate,
                        },
                    },
                    w,
                    &attn,
                )?))
            } else {
                let mla = NopeMla {
                    hidden_size: d,
                    num_heads: a.num_attention_heads,
                    q_lora_rank: a.q_lora_rank,
                    kv_lora_rank: a.kv_lora_rank,
                    qk_nope_head_dim: a.qk_nope_head_dim,
                    qk_rope_head_dim: a.qk_rope_head_dim,
                    v_head_dim: a.v_head_dim,
                    // Both LoRA norms of KimiK3MLAAttention use eps 1e-6.
                    lora_norm_eps: 1e-6,
                }
                .load(w, &attn)?;
                let gate = if a.mla_use_output_gate {
                    MlaGate::Output(Linear::load(
                        w,
                        &format!("{attn}.g_proj"),
                        d,
                        a.num_attention_heads * a.v_head_dim,
                        false,
                    )?)
                } else {
                    MlaGate::None
                };
                Mixer::Mla(Box::new(mla), gate)
            };
            let mlp = if moe {
                let m = |n: &str| format!("{p}.mlp.{n}");
                let width = a.routed_expert_hidden_size.unwrap_or(d);
                let gate = Linear::load(w, &m("gate"), d, experts, false)?;
                let switch_mlp = SwitchGlu::load(
                    w,
                    &m("switch_mlp"),
                    width,
                    moe_hidden,
                    experts,
                    false,
                    // Unused: the experts run through `forward_with` and SiTU.
                    SwitchActivation::SwiGlu,
                )?;
                let bias = w.take(&m("e_score_correction_bias"), &[experts])?;
                let latent = match a.routed_expert_hidden_size {
                    Some(l) => {
                        let down = Linear::load(w, &m("routed_expert_down_proj"), d, l, false)?;
                        let up = Linear::load(w, &m("routed_expert_up_proj"), l, d, false)?;
                        let norm = if a.latent_moe_use_norm {
                            Some(RmsNorm::load(w, &m("routed_expert_norm"), l, eps)?)
                        } else {
                            None
                        };
                        Some((down, norm, up))
                    }
                    None => None,
                };
                let shared_experts = if a.num_shared_experts > 0 {
                    Some(DenseMlp::Situ(SituMlp::load(
                        w,
                        &m("shared_experts"),
                        d,
                        moe_hidden * a.num_shared_experts,
                        beta,
                        linear_beta,
                    )?))
                } else {
                    None
                };
                Ffn::Moe(Box::new(SparseMoe {
                    router: Router {
                        gate: Gate::Linear(gate),
                        bias,
                        top_k: a.num_experts_per_token,
                        rule: moe_block::Router::DeepseekGroup(GroupSelect {
                            top_k: a.num_experts_per_token,
                            n_group: a.num_expert_group,
                            topk_group: a.topk_group,
                            scaling_bits: a.routed_scaling_factor.to_bits(),
                            norm_topk_prob: a.moe_renormalize,
                            bailing: false,
                            sigmoid: true,
                            has_bias: true,
                            kimi: false,
                            cast_back: true,
                            grouped: a.num_expert_group > 1,
                            norm_any_k: false,
                            eps: true,
                        }),
                    },
                    switch_mlp,
                    situ: Some((beta, linear_beta)),
                    latent,
                    shared_experts,
                    cast_back: false,
                    sharded: false,
                }))
            } else {
                Ffn::Dense(DenseMlp::Situ(SituMlp::load(
                    w,
                    &format!("{p}.mlp"),
                    d,
                    a.intermediate_size,
                    beta,
                    linear_beta,
                )?))
            };
            let attn_res = match a.attn_res_block_size {
                Some(bs) => Some(AttnRes {
                    block_start: i % bs == 0,
                    attn_w: res_weight(w, &format!("{p}.self_attention_res"), d, eps)?,
                    mlp_w: res_weight(w, &format!("{p}.mlp_res"), d, eps)?,
                }),
                None => None,
            };
            layers.push(Layer {
                block: kda::Layer::load(w, &p, mixer, mlp, d, eps)?,
                attn_res,
            });
        }
        let embed_tokens = Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?;
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let output_res = match a.attn_res_block_size {
            Some(_) => Some(res_weight(w, "model.output_attn_res", d, eps)?),
            None => None,
        };
        let lm_head = super::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        Ok(Model {
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            norm,
            output_res,
            lm_head,
            eps,
            kda_idx: is_kda.iter().position(|k| *k),
            mla_idx: is_kda.iter().position(|k| !*k),
            block_size: a.attn_res_block_size,
            pipeline: None,
            in_blocks: 0,
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
        let boundary = h.dtype();
        let mut caches = caches;
        let (attn_mask, ssm_mask) = kda::masks(caches.as_deref(), self.kda_idx, self.mla_idx, n)?;
        let mut blocks = Blocks {
            raw: None,
            inv_rms: None,
            eps: self.eps,
        };
        // A stage below the last receives the hidden state (and, with attention residuals,
        // the blocks recorded so far packed in front of it) from the stage above.
        if let Some((rank, size)) = self.pipeline {
            if rank < size - 1 {
                if self.output_res.is_some() {
                    let mut shape = vec![self.in_blocks + 1];
                    shape.extend(h.shape());
                    let packed = distributed::recv(&shape, h.dtype(), rank + 1, None, None)?;
                    let k = self.in_blocks;
                    h = ops::squeeze(&packed.slice_axis(0, k, k + 1)?, &[0], None)?;
                    let raw = packed.slice_axis(0, 0, k)?;
                    let xf = raw.astype(Dtype::Float32)?;
                    let ms = ops::mean(&(&xf * &xf)?, &[-1], false, None)?;
                    blocks.inv_rms = Some(ops::rsqrt(&(&ms + self.eps)?, None)?);
                    blocks.raw = Some(raw);
                } else {
                    h = distributed::recv_like(&h, rank + 1, None, None)?;
                }
            }
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let block = &layer.block;
            match &layer.attn_res {
                None => h = block.forward(&h, &attn_mask, ssm_mask.as_ref(), cache, i)?,
                Some(res) => {
                    let mixed = blocks.mix(&h, &res.attn_w)?;
                    let mut partial = Some(h.clone());
                    if res.block_start {
                        blocks.append(&h)?;
                        partial = None;
                    }
                    let x = block.input_layernorm.forward(&mixed)?;
                    let y = block
                        .mixer
                        .forward(&x, &attn_mask, ssm_mask.as_ref(), cache, i)?;
                    let partial = match partial {
                        Some(p) => (&p + &y)?,
                        None => y,
                    };
                    let mixed = blocks.mix(&partial, &res.mlp_w)?;
                    h = (&partial
                        + &block
                            .mlp
                            .forward(&block.post_attention_layernorm.forward(&mixed)?)?)?;
                }
            }
        }
        match self.pipeline {
            // A stage above rank 0 sends its output (and the blocks so far) to the rank below,
            // tied to its last cache.
            Some((rank, _)) if rank != 0 => {
                let dst = rank - 1;
                let sent = match &blocks.raw {
                    Some(raw) if self.output_res.is_some() => {
                        let packed = ops::concatenate(&[raw, &h.expand_dims(&[0])?], 0, None)?
                            .astype(boundary)?;
                        let sent = distributed::send(&packed, dst, None, None)?;
                        let k = sent.shape()[0];
                        h = ops::squeeze(&sent.slice_axis(0, k - 1, k)?, &[0], None)?;
                        sent
                    }
                    _ => {
                        h = distributed::send(&h.astype(boundary)?, dst, None, None)?;
                        h.clone()
                    }
                };
                let last = caches.and_then(|c| c.last_mut());
                crate::shard::tie_to_send(last, &sent)?;
            }
            _ => {
                if let Some(w_eff) = &self.output_res {
                    h = blocks.mix(&h, w_eff)?;
                }
            }
        }
        if let Some((_, size)) = self.pipeline {
            h = crate::shard::gather_stage_output(h.astype(boundary)?, size)?;
        }
        self.norm.forward(&h)
    }

    /// Tensor parallelism as kimi_k3's `shard()`: KDA layers by heads
    /// ([`Kda::shard_tensor_parallel`]), MLA layers as deepseek_v3's with the output gate
    /// split by rows, dense MLPs as llama's, MoE blocks with their experts split in place and
    /// one sum ([`SparseMoe::shard_tensor_parallel`]).
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        crate::shard::check_tensor_rank(size, rank)?;
        if size == 1 {
            return Ok(());
        }
        if self.pipeline.is_some() {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: "the model".into(),
                problem: "already split into pipeline stages".into(),
            });
        }
        // Check every layer before changing any, so that a refusal leaves the model whole.
        for (i, layer) in self.layers.iter().enumerate() {
            let heads = match &layer.block.mixer {
                Mixer::Kda(k) => k.num_heads(),
                Mixer::Mla(m, _) => m.num_heads(),
            };
            if heads % size != 0 {
                return Err(ModelError::Parallel {
                    kind: crate::Parallelism::Tensor,
                    what: format!("model.layers.{i}.self_attn"),
                    problem: format!("{heads} heads do not split over {size} ranks"),
                });
            }
        }
        // Split copies (the arrays are shared) and keep them only when every layer splits.
        let mut layers = self.layers.clone();
        for (i, layer) in layers.iter_mut().enumerate() {
            let p = format!("model.layers.{i}");
            let attn = format!("{p}.self_attn");
            match &mut layer.block.mixer {
                Mixer::Kda(k) => k.shard_tensor_parallel(size, rank, &attn)?,
                Mixer::Mla(m, gate) => {
                    m.shard_tensor_parallel(size, rank, &attn)?;
                    if let MlaGate::Output(g) = gate {
                        crate::shard::all_to_sharded(g, size, rank, &format!("{attn}.g_proj"))?;
                    }
                }
            }
            match &mut layer.block.mlp {
                Ffn::Dense(m) => m.shard_tensor_parallel(size, rank, &format!("{p}.mlp"), false)?,
                Ffn::Moe(m) => m.shard_tensor_parallel(size, rank, &format!("{p}.mlp"))?,
            }
        }
        self.layers = layers;
        Ok(())
    }

    /// Pipeline parallelism as kimi_k3's own `pipeline()`: an even split in which the first
    /// layers' stage (rank `size - 1`) takes the extra layer, rank 0 the last layers; with
    /// attention residuals the blocks recorded so far travel with the hidden state.
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        crate::shard::check_pipeline("kimi_k3", &["kimi_k3"], self.pipeline.is_some())?;
        let layers = self.layers.len();
        let s = usize::try_from(size).unwrap_or(0).max(1);
        let (base, extra) = (layers / s, layers % s);
        // seg = size - rank - 1 counts stages from the first layers; seg < extra take one more.
        let split: Vec<usize> = (0..s)
            .map(|r| base + usize::from(s - 1 - r < extra))
            .collect();
        let range = crate::shard::pipeline_range_split(&split, layers, size, rank)?;
        if let Some(bs) = self.block_size {
            self.in_blocks = (range.start as i32 + bs - 1) / bs;
        }
        crate::shard::keep_range(&mut self.layers, range);
        let is_kda = |l: &Layer| matches!(l.block.mixer, Mixer::Kda(_));
        self.kda_idx = self.layers.iter().position(is_kda);
        self.mla_idx = self.layers.iter().position(|l| !is_kda(l));
        self.pipeline = Some((rank, size));
        Ok(())
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!(tied lm_head, embed_tokens);

    fn model_type(&self) -> &str {
        "kimi_k3"
    }

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    kit::layer_caches! {
        /// mlx-lm's `make_cache`: an `ArraysCache(size=2)` per KDA layer, a `KVCache` per MLA
        /// layer.
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers
                    .iter()
                    .map(|l| matches!(l.block.mixer, Mixer::Mla(..))),
                2,
            )
        }
    }
}
