//! mlx-lm 0.32.2 `models/mimo_v2_flash.py`: layers of sliding-window or full attention
//! (`hybrid_layer_pattern`), each kind with its own heads, query/key and value head sizes,
//! rope base and optional learned sinks, a partial rope, values optionally scaled; dense or
//! mixture-of-experts MLPs (`moe_layer_freq`) whose router is DeepSeek V3's
//! `group_expert_select` with `+ 1e-20` ([`Router::Grouped`], as exaone_moe's) plus un-gated
//! shared experts. Sliding layers cache in a `RotatingKVCache` of `sliding_window_size`.
//! FP8 checkpoints (`weight_scale_inv`) are refused (convert them with mlx-lm first).
//! Inference only (no adapters or full fine-tuning).

use mlx_cache::Cache;
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope, SwitchActivation};
use crate::models::moe_block::{BlockExtras, Router, SparseMoe, SparseMoeParams};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

/// mimo_v2_flash.py `ModelArgs` (all required there but `attention_value_scale`).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub num_experts_per_tok: i32,
    pub hybrid_layer_pattern: Vec<i32>,
    pub moe_layer_freq: Vec<i32>,
    pub add_swa_attention_sink_bias: bool,
    pub add_full_attention_sink_bias: bool,
    pub sliding_window_size: i32,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub n_shared_experts: Option<i32>,
    pub n_routed_experts: Option<i32>,
    pub routed_scaling_factor: Option<f64>,
    pub topk_method: String,
    pub scoring_func: String,
    pub norm_topk_prob: bool,
    pub n_group: i32,
    pub topk_group: i32,
    pub max_position_embeddings: i64,
    pub layernorm_epsilon: f64,
    pub rope_theta: f64,
    pub swa_rope_theta: f64,
    pub swa_num_attention_heads: i32,
    pub swa_num_key_value_heads: i32,
    pub head_dim: i32,
    pub v_head_dim: i32,
    pub swa_head_dim: i32,
    pub swa_v_head_dim: i32,
    pub partial_rotary_factor: f64,
    #[serde(default)]
    pub attention_value_scale: Option<f64>,
}

/// mimo_v2_flash.py's `Attention` ([`kit::Attention`]): the sliding or full kind's heads,
/// query/key and value head sizes, rope base and optional `attention_sink_bias`, a partial
/// rope, values times `attention_value_scale` when given; no biases.
fn attention(a: &ModelArgs, sliding: bool, w: &mut Weights, path: &str) -> Result<kit::Attention> {
    let (n_heads, n_kv_heads, sinks, hd, vd, theta) = if sliding {
        (
            a.swa_num_attention_heads,
            a.swa_num_key_value_heads,
            a.add_swa_attention_sink_bias,
            a.swa_head_dim,
            a.swa_v_head_dim,
            a.swa_rope_theta,
        )
    } else {
        (
            a.num_attention_heads,
            a.num_key_value_heads,
            a.add_full_attention_sink_bias,
            a.head_dim,
            a.v_head_dim,
            a.rope_theta,
        )
    };
    let dims = (a.hidden_size, n_heads, n_kv_heads, hd, vd);
    let mut at = kit::Attention::load_v(w, path, dims, (false, false), kit::head_scale(hd))?;
    if sinks {
        at = at.with_sinks(w, path, "attention_sink_bias")?;
    }
    let rope = Rope::initialize(
        (a.partial_rotary_factor * f64::from(hd)) as i32,
        theta,
        false,
        None,
        None,
    )?;
    Ok(at
        .with_value_scale(a.attention_value_scale)
        .with_rope(Some(rope)))
}

enum Ffn {
    Dense(Mlp),
    Moe(Box<SparseMoe>),
}

struct Layer {
    sliding: bool,
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
    /// The first full and the first sliding layer (`hybrid_layer_pattern.index(0)` / `(1)`).
    ga_idx: usize,
    swa_idx: usize,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = config.args()?;
        let t = "mimo_v2_flash";
        let bad = |m: String| ModelError::Config(format!("config.json (`{t}`): {m}"));
        kit::check_positive(
            t,
            &[
                ("vocab_size", a.vocab_size),
                ("hidden_size", a.hidden_size),
                ("num_hidden_layers", a.num_hidden_layers),
                ("num_attention_heads", a.num_attention_heads),
                ("num_key_value_heads", a.num_key_value_heads),
                ("swa_num_attention_heads", a.swa_num_attention_heads),
                ("swa_num_key_value_heads", a.swa_num_key_value_heads),
                ("head_dim", a.head_dim),
                ("v_head_dim", a.v_head_dim),
                ("swa_head_dim", a.swa_head_dim),
                ("swa_v_head_dim", a.swa_v_head_dim),
                ("sliding_window_size", a.sliding_window_size),
            ],
        )?;
        let layers_n = a.num_hidden_layers as usize;
        for (name, list) in [
            ("hybrid_layer_pattern", &a.hybrid_layer_pattern),
            ("moe_layer_freq", &a.moe_layer_freq),
        ] {
            if list.len() < layers_n {
                return Err(bad(format!(
                    "field `{name}` has {} entries for {layers_n} layers",
                    list.len()
                )));
            }
        }
        let pattern = &a.hybrid_layer_pattern[..layers_n];
        let (Some(swa_idx), Some(ga_idx)) = (
            a.hybrid_layer_pattern.iter().position(|p| *p == 1),
            a.hybrid_layer_pattern.iter().position(|p| *p == 0),
        ) else {
            return Err(bad(
                "field `hybrid_layer_pattern` needs both a sliding (1) and a full (0) layer".into(),
            ));
        };
        if swa_idx >= layers_n || ga_idx >= layers_n {
            return Err(bad(
                "field `hybrid_layer_pattern`: the first sliding and full layers must be \
                 among the model's layers"
                    .into(),
            ));
        }
        if a.topk_method != "noaux_tc" {
            return Err(bad(format!(
                "topk_method `{}` is not supported (mlx-lm asserts \"noaux_tc\")",
                a.topk_method
            )));
        }
        for (name, heads, kv) in [
            ("", a.num_attention_heads, a.num_key_value_heads),
            ("swa_", a.swa_num_attention_heads, a.swa_num_key_value_heads),
        ] {
            if heads % kv != 0 {
                return Err(bad(format!(
                    "{name}num_attention_heads {heads} must be a multiple of \
                     {name}num_key_value_heads {kv}"
                )));
            }
        }
        sanitize(&a, w)?;
        let d = a.hidden_size;
        let eps = a.layernorm_epsilon as f32;
        let mut layers = Vec::with_capacity(layers_n);
        for (i, &p_i) in pattern.iter().enumerate() {
            let p = |n: &str| format!("model.layers.{i}.{n}");
            let sliding = p_i == 1;
            let mlp = if a.moe_layer_freq[i] == 1 {
                let n = a.n_routed_experts.ok_or_else(|| {
                    bad(format!(
                        "layer {i} is a MoE layer but `n_routed_experts` is null"
                    ))
                })?;
                if a.num_experts_per_tok <= 0 || a.num_experts_per_tok > n {
                    return Err(bad(format!(
                        "num_experts_per_tok {} must be in 1..={n}",
                        a.num_experts_per_tok
                    )));
                }
                if a.n_group <= 0 || n % a.n_group != 0 {
                    return Err(bad(format!(
                        "n_routed_experts {n} must divide into n_group {} groups",
                        a.n_group
                    )));
                }
                Ffn::Moe(Box::new(SparseMoe::load_with(
                    w,
                    &p("mlp"),
                    &BlockExtras {
                        correction_bias: Some("gate.e_score_correction_bias"),
                        plain_shared: a
                            .n_shared_experts
                            .map(|s| (a.moe_intermediate_size * s, false)),
                        ..BlockExtras::default()
                    },
                    &SparseMoeParams {
                        hidden_size: d,
                        num_experts: n,
                        top_k: a.num_experts_per_tok,
                        moe_intermediate_size: a.moe_intermediate_size,
                        expert_bias: false,
                        router: Router::Grouped {
                            n_group: a.n_group,
                            topk_group: a.topk_group,
                            routed_scaling_factor: a.routed_scaling_factor.unwrap_or(1.0),
                            norm_topk_prob: a.norm_topk_prob,
                        },
                        shared_expert_intermediate_size: None,
                        names: ["gate", "switch_mlp"],
                        router_bias: false,
                        activation: SwitchActivation::SwiGlu,
                    },
                )?))
            } else {
                Ffn::Dense(Mlp::load(
                    w,
                    &p("mlp"),
                    &MlpNames::LLAMA,
                    d,
                    a.intermediate_size,
                    false,
                    false,
                    MlpKind::SwiGlu,
                )?)
            };
            layers.push(Layer {
                sliding,
                self_attn: attention(&a, sliding, w, &p("self_attn"))?,
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
            ga_idx,
            swa_idx,
            args: a,
        })
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut caches = caches;
        let window = Some(self.args.sliding_window_size as usize);
        let full_mask = kit::cache_mask(caches.as_deref(), self.ga_idx, n, None, false)?;
        let swa_mask = kit::cache_mask(caches.as_deref(), self.swa_idx, n, window, false)?;
        let mut h = self.embed_tokens.forward(inputs)?;
        for (i, l) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let mask = if l.sliding { &swa_mask } else { &full_mask };
            let r = l
                .self_attn
                .forward(&l.input_layernorm.forward(&h)?, mask, cache)?;
            let h2 = (&h + &r)?;
            let x = l.post_attention_layernorm.forward(&h2)?;
            let r = match &l.mlp {
                Ffn::Dense(m) => m.forward(&x)?,
                Ffn::Moe(m) => m.forward(&x)?,
            };
            h = (&h2 + &r)?;
        }
        self.norm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.lm_head.forward(h)
    }
}

/// mimo_v2_flash.py `sanitize`: FP8 weights (`weight_scale_inv`) refused here, per-expert
/// weights stacked into `switch_mlp`, the multi-token-prediction weights (`model.mtp*`) dropped.
fn sanitize(a: &ModelArgs, w: &mut Weights) -> Result<()> {
    if w.names().iter().any(|k| k.contains("weight_scale_inv")) {
        return Err(ModelError::Weights(vec![
            "mimo_v2_flash: FP8 checkpoints (`weight_scale_inv`) are not supported yet; \
             convert the model with mlx_lm.convert first"
                .into(),
        ]));
    }
    if let Some(n) = a.n_routed_experts {
        for l in 0..a.num_hidden_layers {
            let prefix = format!("model.layers.{l}.mlp");
            kit::stack_experts(
                w,
                &format!("{prefix}.experts"),
                &format!("{prefix}.switch_mlp"),
                n,
                &kit::GLU_PROJECTIONS,
                &kit::LINEAR_KEYS,
            )?;
        }
    }
    w.discard_prefix("model.mtp");
    Ok(())
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    kit::layer_caches! {
        /// `make_cache`: a `RotatingKVCache(sliding_window_size)` for sliding layers, else a
        /// `KVCache`.
        fn make_cache(&self) {
            kit::sliding_caches(
                self.layers.iter().map(|l| l.sliding),
                self.args.sliding_window_size as usize,
            )
        }
    }
}
