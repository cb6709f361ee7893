//! mlx-lm 0.32.2 `models/step3p5.py`: sliding-window and full attention layers (`layer_types`,
//! else even layers slide; the sliding ones may have their own head counts,
//! `attention_other_setting`), per-head RMS norms on q and k, a rope per layer (its base from a
//! list or one value, `partial_rotary_factors`, YaRN only on `yarn_only_types`), a head-wise
//! sigmoid output gate, and MoE layers (`moe_layers_enum`, else all but the first) whose
//! router is `moe_gate_select` (sigmoid scores, `router_bias` for the choice, weights over
//! their sum + 1e-20, scaled: the shared MoE block's [`Router::SigmoidCorrectedScaled`]) over
//! `SwitchGLU` experts plus an un-gated `share_expert`; MLPs
//! may clamp their SwiGLU (`swiglu_limits`, `swiglu_limits_shared`). Sliding layers cache in a
//! `RotatingKVCache(sliding_window)`. Inference only (no adapters or full fine-tuning).
//! Tensor parallelism as mlx-lm's `shard()` ([`Model::shard_tensor_parallel`]); mlx-lm has no
//! `pipeline` for it.

use mlx_cache::{AttentionMask, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

use crate::layers::{
    Embedding, Linear, Mlp, MlpKind, RmsNorm, Rope, RopeScaling, SwitchActivation, SwitchGlu,
};
use crate::models::moe_block::{Ffn, MoeParts, Router, SparseMoe};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    d_eps: f64 = 1e-5;
    d_theta: Value = Value::from(10000.0);
    d_max_pos: i64 = 262144;
    d_window: i32 = 512;
    d_true: bool = true;
    d_experts: i32 = 288;
    d_top_k: i32 = 8;
    d_moe_inter: i32 = 1280;
    d_share: i32 = 1280;
    d_scaling: f64 = 3.0;
}

/// step3p5.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub vocab_size: i32,
    pub num_attention_heads: i32,
    pub num_attention_groups: i32,
    pub head_dim: i32,
    pub intermediate_size: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    /// One base, or one per layer.
    #[serde(default = "d_theta")]
    pub rope_theta: Value,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default = "d_window")]
    pub sliding_window: i32,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub yarn_only_types: Option<Vec<String>>,
    #[serde(default)]
    pub partial_rotary_factors: Option<Vec<f64>>,
    #[serde(default)]
    pub attention_other_setting: Option<Value>,
    #[serde(default = "d_true")]
    pub use_head_wise_attn_gate: bool,
    #[serde(default = "d_experts")]
    pub moe_num_experts: i32,
    #[serde(default = "d_top_k")]
    pub moe_top_k: i32,
    #[serde(default = "d_moe_inter")]
    pub moe_intermediate_size: i32,
    #[serde(default = "d_share")]
    pub share_expert_dim: i32,
    #[serde(default)]
    pub moe_layers_enum: Option<String>,
    #[serde(default = "d_scaling")]
    pub moe_router_scaling_factor: f64,
    #[serde(default = "d_true")]
    pub norm_expert_weight: bool,
    #[serde(default)]
    pub swiglu_limits: Option<Vec<Option<f64>>>,
    #[serde(default)]
    pub swiglu_limits_shared: Option<Vec<Option<f64>>>,
}

/// `Step3p5MLP`: a SwiGLU MLP, its activation clamped when `limit` is set (> 0), its
/// projections loaded in its declaration order (gate, up, down).
fn step_mlp(w: &mut Weights, path: &str, dim: i32, hidden: i32, limit: f64) -> Result<Mlp> {
    let p = |n: &str| format!("{path}.{n}");
    let gate = Linear::load(w, &p("gate_proj"), dim, hidden, false)?;
    let up = Linear::load(w, &p("up_proj"), dim, hidden, false)?;
    let down = Linear::load(w, &p("down_proj"), hidden, dim, false)?;
    Ok(if limit > 0.0 {
        Mlp::from_linears(MlpKind::ClampedSwiGlu, gate, up, down, limit as f32)
    } else {
        Mlp::from_linears(MlpKind::SwiGlu, gate, up, down, 0.0)
    })
}

struct Layer {
    sliding: bool,
    /// `Step3p5Attention` ([`kit::Attention`]): per-head q/k norms, a partial rope of the
    /// layer's base, an optional head-wise sigmoid gate.
    self_attn: kit::Attention,
    mlp: Ffn,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
}

/// `(swiglu_limits or [])[i] or 0`.
fn limit_at(list: &Option<Vec<Option<f64>>>, i: usize) -> f64 {
    list.as_ref()
        .and_then(|l| l.get(i).copied().flatten())
        .unwrap_or(0.0)
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = config.args()?;
        let t = "step3p5";
        let bad = |m: String| ModelError::Config(format!("config.json (`{t}`): {m}"));
        kit::check_positive(
            t,
            &[
                ("hidden_size", a.hidden_size),
                ("num_hidden_layers", a.num_hidden_layers),
                ("vocab_size", a.vocab_size),
                ("num_attention_heads", a.num_attention_heads),
                ("num_attention_groups", a.num_attention_groups),
                ("head_dim", a.head_dim),
                ("intermediate_size", a.intermediate_size),
                ("sliding_window", a.sliding_window),
                ("moe_num_experts", a.moe_num_experts),
                ("moe_top_k", a.moe_top_k),
            ],
        )?;
        if a.moe_top_k > a.moe_num_experts {
            return Err(bad(format!(
                "moe_top_k {} exceeds moe_num_experts {}",
                a.moe_top_k, a.moe_num_experts
            )));
        }
        let n = a.num_hidden_layers as usize;
        let moe_layers: Vec<usize> = match &a.moe_layers_enum {
            Some(e) if !e.trim().is_empty() => e
                .trim()
                .split(',')
                .map(|i| i.trim().parse::<usize>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| {
                    bad(format!(
                        "field `moe_layers_enum` {e:?} is not a list of ints"
                    ))
                })?,
            _ => (1..n).collect(),
        };
        let layer_types = a.layer_types.clone().unwrap_or_default();
        if !layer_types.is_empty() && layer_types.len() < n {
            return Err(bad(format!(
                "field `layer_types` has {} entries for {n} layers",
                layer_types.len()
            )));
        }
        sanitize(&a, w)?;
        let (d, eps) = (a.hidden_size, a.rms_norm_eps as f32);
        let mut layers = Vec::with_capacity(n);
        for i in 0..n {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let sliding = match layer_types.get(i) {
                Some(k) => k == "sliding_attention",
                None => i % 2 == 0,
            };
            let (heads, groups) = match (&a.attention_other_setting, sliding) {
                (Some(o), true) if !o.is_null() => {
                    let get = |k: &str| {
                        o.get(k)
                            .and_then(Value::as_i64)
                            .and_then(|v| i32::try_from(v).ok())
                            .filter(|v| *v > 0)
                            .ok_or_else(|| {
                                bad(format!(
                                    "field `attention_other_setting.{k}` must be a positive \
                                     integer"
                                ))
                            })
                    };
                    (get("num_attention_heads")?, get("num_attention_groups")?)
                }
                _ => (a.num_attention_heads, a.num_attention_groups),
            };
            if heads % groups != 0 {
                return Err(bad(format!(
                    "layer {i}: {heads} heads must be a multiple of {groups} groups"
                )));
            }
            let theta = match &a.rope_theta {
                Value::Array(l) => l.get(i).and_then(Value::as_f64),
                v => v.as_f64(),
            }
            .ok_or_else(|| bad(format!("field `rope_theta` has no number for layer {i}")))?;
            let partial = a
                .partial_rotary_factors
                .as_ref()
                .and_then(|l| l.get(i).copied())
                .unwrap_or(1.0);
            let layer_type = layer_types.get(i).map_or("full_attention", String::as_str);
            let scaling = match &a.yarn_only_types {
                Some(y) if !y.is_empty() && !y.iter().any(|k| k == layer_type) => None,
                _ => a.rope_scaling.as_ref(),
            };
            let hd = a.head_dim;
            let at = p("self_attn");
            let dims = (d, heads, groups, hd);
            let mut self_attn = kit::Attention::load(w, &at, dims, false, kit::head_scale(hd))?
                .with_head_norms(w, &at, eps)?;
            if a.use_head_wise_attn_gate {
                self_attn = self_attn.with_head_gate(w, &at, d, kit::HeadGate::Sigmoid)?;
            }
            let self_attn = self_attn.with_rope(Some(Rope::initialize(
                (f64::from(hd) * partial) as i32,
                theta,
                false,
                scaling,
                Some(a.max_position_embeddings),
            )?));
            let mlp = if moe_layers.contains(&i) {
                let limit = limit_at(&a.swiglu_limits, i);
                let activation = if limit > 0.0 {
                    SwitchActivation::ClampedSwiGlu(limit as f32)
                } else {
                    SwitchActivation::SwiGlu
                };
                let e = a.moe_num_experts;
                // `Step3p5MoE` declares gate (`MoEGate`: gate, router_bias), switch_mlp,
                // share_expert.
                let gate = Linear::load(w, &p("mlp.gate.gate"), d, e, false)?;
                let router_bias = w.take(&p("mlp.gate.router_bias"), &[e])?;
                let experts = SwitchGlu::load(
                    w,
                    &p("mlp.switch_mlp"),
                    d,
                    a.moe_intermediate_size,
                    e,
                    false,
                    activation,
                )?;
                let shared = step_mlp(
                    w,
                    &p("mlp.share_expert"),
                    d,
                    a.share_expert_dim,
                    limit_at(&a.swiglu_limits_shared, i),
                )?;
                Ffn::Sparse(Box::new(SparseMoe::from_parts(MoeParts {
                    top_k: a.moe_top_k,
                    router: Router::SigmoidCorrectedScaled {
                        norm_topk_prob: a.norm_expert_weight,
                        routed_scaling_factor: a.moe_router_scaling_factor,
                        cast_weights: false,
                    },
                    gate,
                    experts,
                    names: ["gate.gate", "switch_mlp"],
                    correction_bias: Some(("gate.router_bias", router_bias)),
                    plain_shared: Some(("share_expert", shared)),
                    flatten: false,
                })))
            } else {
                Ffn::Dense(step_mlp(
                    w,
                    &p("mlp"),
                    d,
                    a.intermediate_size,
                    limit_at(&a.swiglu_limits_shared, i),
                )?)
            };
            layers.push(Layer {
                sliding,
                self_attn,
                mlp,
                input_layernorm: RmsNorm::load(w, &p("input_layernorm"), d, eps)?,
                post_attention_layernorm: RmsNorm::load(w, &p("post_attention_layernorm"), d, eps)?,
            });
        }
        Ok(Model {
            embed_tokens: Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?,
            norm: RmsNorm::load(w, "model.norm", d, eps)?,
            lm_head: Linear::load(w, "lm_head", d, a.vocab_size, false)?,
            layers,
            args: a,
        })
    }

    /// Tensor parallelism as step3p5.py's `shard()`: q, k, v and the head-wise gate
    /// all-to-sharded, o sharded-to-all, heads and KV heads / N (sliding layers' own counts
    /// too); dense MLPs as llama's; MoE blocks with the shared expert and the experts split in
    /// place (gate, up by output rows, down by input columns) and the block's output summed.
    /// Every layer's head counts are checked before the first split (mlx-lm would fail part
    /// way, on an indivisible weight).
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::switch_inplace;
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
            if a.n_heads % size != 0 || a.n_kv_heads % size != 0 {
                return Err(par(
                    format!("model.layers.{i}.self_attn"),
                    format!(
                        "{} heads and {} KV heads do not split over {size} ranks",
                        a.n_heads, a.n_kv_heads
                    ),
                ));
            }
            if let Ffn::Sparse(m) = &l.mlp {
                if m.sharded {
                    return Err(par("the model".into(), "already split".into()));
                }
            }
        }
        let mlp = |m: &mut Mlp, path: &str, in_place: bool| -> Result<()> {
            crate::shard::shard_mlp(m, size, rank, path, in_place)
        };
        for (i, l) in self.layers.iter_mut().enumerate() {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            l.self_attn.shard_projections(size, rank, &p("self_attn"))?;
            match &mut l.mlp {
                Ffn::Dense(m) => mlp(m, &p("mlp"), false)?,
                Ffn::Sparse(m) => {
                    if let Some(shared) = m.plain_shared.as_mut() {
                        mlp(shared, &p("mlp.share_expert"), true)?;
                    }
                    let e = &mut m.switch_mlp;
                    let w = |n: &str| p(&format!("mlp.switch_mlp.{n}"));
                    switch_inplace(&mut e.gate_proj, true, size, rank, &w("gate_proj"))?;
                    switch_inplace(&mut e.up_proj, true, size, rank, &w("up_proj"))?;
                    switch_inplace(&mut e.down_proj, false, size, rank, &w("down_proj"))?;
                    m.sharded = true;
                }
            }
        }
        Ok(())
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut caches = caches;
        let window = Some(self.args.sliding_window as usize);
        let mask_of = |sliding: bool| -> Result<AttentionMask> {
            match self.layers.iter().position(|l| l.sliding == sliding) {
                Some(i) => {
                    kit::cache_mask(caches.as_deref(), i, n, window.filter(|_| sliding), false)
                }
                None => Ok(AttentionMask::None),
            }
        };
        let (full_mask, swa_mask) = (mask_of(false)?, mask_of(true)?);
        let mut h = self.embed_tokens.forward(inputs)?;
        for (i, l) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let mask = if l.sliding { &swa_mask } else { &full_mask };
            let r = l
                .self_attn
                .forward(&l.input_layernorm.forward(&h)?, mask, cache)?;
            let h2 = (&h + &r)?;
            let x = l.post_attention_layernorm.forward(&h2)?;
            let r = l.mlp.forward(&x)?;
            h = (&h2 + &r)?;
        }
        self.norm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.lm_head.forward(h)
    }
}

/// step3p5.py `sanitize`: `.mtp` weights and layers past `num_hidden_layers` dropped; the
/// original checkpoint's names (`.moe.gate_proj.`, `.moe.gate.`, `.moe.router_bias`,
/// `.share_expert.`, ...) mapped to this model's, and then (a "vanilla" checkpoint, one that
/// had such names) every norm weight stored as `w` becomes `w + 1`.
fn sanitize(a: &ModelArgs, w: &mut Weights) -> Result<()> {
    const REMAP: [(&str, &str); 6] = [
        (".moe.gate_proj.", ".mlp.switch_mlp.gate_proj."),
        (".moe.up_proj.", ".mlp.switch_mlp.up_proj."),
        (".moe.down_proj.", ".mlp.switch_mlp.down_proj."),
        (".moe.gate.", ".mlp.gate.gate."),
        (".moe.router_bias", ".mlp.gate.router_bias"),
        (".share_expert.", ".mlp.share_expert."),
    ];
    let names = w.names();
    let vanilla = names
        .iter()
        .any(|k| REMAP.iter().any(|(s, d)| k.contains(s) && !k.contains(d)));
    for k in names {
        let past = k
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<i64>().ok())
            .is_some_and(|i| i >= i64::from(a.num_hidden_layers));
        if k.contains(".mtp") || past {
            w.discard(&k);
            continue;
        }
        let mut new = k.clone();
        if let Some((s, d)) = REMAP.iter().find(|(s, d)| k.contains(s) && !k.contains(d)) {
            new = k.replacen(s, d, 1);
        }
        let plus_one = vanilla && new.ends_with(".weight") && new.contains("norm");
        if new != k || plus_one {
            if let Some(v) = w.remove(&k) {
                let v = if plus_one {
                    ops::add_scalar(&v, 1i32, None)?
                } else {
                    v
                };
                w.insert(new, v);
            }
        }
    }
    Ok(())
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    kit::layer_caches! {
        /// `make_cache`: a `RotatingKVCache(sliding_window)` for sliding layers, else a `KVCache`.
        fn make_cache(&self) {
            kit::sliding_caches(
                self.layers.iter().map(|l| l.sliding),
                self.args.sliding_window as usize,
            )
        }
    }
}
