//! mlx-lm 0.32.2 `models/nemotron-nas.py`: a Llama decoder whose layers each follow their own
//! `block_configs` entry: the attention (GQA with `num_attention_heads / n_heads_in_group` KV
//! heads) and the gated MLP (`intermediate_size` from `ffn_mult`, rounded up to a multiple of
//! 256) may each be absent (`no_op`, no norm either) or a single square linear
//! (`replace_with_linear`). Every layer with an attention entry that is not `no_op` (a linear
//! replacement too) has a KV cache, and the mask comes from the first of them, as there.
//! Inference only (no adapters or full fine-tuning).

use mlx_cache::Cache;
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope, RopeScaling};
use crate::models::kit::{Attention, AttentionSpec};
use crate::models::moe::QkNorm;
use crate::models::{kit, LanguageModel, OutputHead};
use crate::weights::Weights;

serde_defaults! {
    d_hidden: i32 = 8192;
    d_layers: i32 = 80;
    d_heads: i32 = 64;
    d_eps: f64 = 1e-5;
    d_vocab: i32 = 128256;
    d_act: String = "silu".to_string();
    d_theta: f64 = 500000.0;
    d_max_pos: i64 = 131072;
}

/// nemotron-nas.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default)]
    pub block_configs: Vec<Value>,
    #[serde(default = "d_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

/// One sub-block as its config entry asks.
enum Sub<T> {
    NoOp,
    Linear(Linear),
    Full(T),
}

struct Block {
    input_layernorm: Option<RmsNorm>,
    attn: Sub<Box<Attention>>,
    post_attention_layernorm: Option<RmsNorm>,
    mlp: Sub<Mlp>,
}

pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: OutputHead,
    /// Layers with a KV cache (an attention entry that is not `no_op`).
    n_caches: usize,
}

/// The fields of one `block_configs` entry's `attention` or `ffn` object.
#[derive(Default, Deserialize)]
struct SubConfig {
    #[serde(default)]
    no_op: bool,
    #[serde(default)]
    replace_with_linear: bool,
    n_heads_in_group: Option<i32>,
    ffn_mult: Option<f64>,
}

fn sub_config(block: &Value, i: usize, key: &str) -> Result<SubConfig> {
    match block.get(key) {
        None => Ok(SubConfig::default()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
            ModelError::Config(format!(
                "config.json (`nemotron-nas`): block_configs[{i}].{key}: {e}"
            ))
        }),
    }
}

/// `_ffn_mult_to_intermediate_size`: `int(2 * round(ffn_mult, 6) * n_embd / 3)` rounded up to
/// a multiple of 256.
fn intermediate_size(ffn_mult: f64, n_embd: i32) -> i32 {
    let m = (ffn_mult * 1e6).round() / 1e6;
    let n = (2.0 * m * f64::from(n_embd) / 3.0) as i32;
    if n % 256 == 0 {
        n
    } else {
        n + 256 - n % 256
    }
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let args: ModelArgs = config.args()?;
        let bad = |m: String| ModelError::Config(format!("config.json (`nemotron-nas`): {m}"));
        let (d, h) = (args.hidden_size, args.num_attention_heads);
        kit::check_positive(
            "nemotron-nas",
            &[
                ("hidden_size", d),
                ("num_attention_heads", h),
                ("vocab_size", args.vocab_size),
            ],
        )?;
        if args.block_configs.len() as i64 != i64::from(args.num_hidden_layers) {
            return Err(bad(format!(
                "Number of block_configs ({}) must match num_hidden_layers ({})",
                args.block_configs.len(),
                args.num_hidden_layers
            )));
        }
        if let Some(rs) = &args.rope_scaling {
            if !rs.contains_key("factor") {
                return Err(bad("rope_scaling must contain 'factor'".into()));
            }
            if rs.get("rope_type").is_none_or(Value::is_null) {
                return Err(bad("rope_scaling must contain 'rope_type'".into()));
            }
        }
        if d % h != 0 {
            return Err(bad(format!(
                "hidden_size ({d}) must be divisible by num_attention_heads ({h})"
            )));
        }
        let kind = match args.hidden_act.as_str() {
            "silu" => MlpKind::SiluGlu,
            "relu" => MlpKind::ReluGlu,
            "gelu" => MlpKind::GeGluErf,
            "gelu_new" | "gelu_fast" => MlpKind::GeGluTanh,
            other => return Err(bad(format!("Unknown activation function: {other}"))),
        };
        if args.tie_word_embeddings {
            w.discard("lm_head.weight");
        }
        let head_dim = d / h;
        let eps = args.rms_norm_eps as f32;
        let mut blocks = Vec::with_capacity(args.block_configs.len());
        let mut n_caches = 0;
        for (i, block) in args.block_configs.iter().enumerate() {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let a = sub_config(block, i, "attention")?;
            let f = sub_config(block, i, "ffn")?;
            let attn = if a.no_op {
                Sub::NoOp
            } else if a.replace_with_linear {
                Sub::Linear(Linear::load(
                    w,
                    &p("self_attn.linear"),
                    d,
                    d,
                    args.attention_bias,
                )?)
            } else {
                let group = a.n_heads_in_group.ok_or_else(|| {
                    bad(format!(
                        "block_configs[{i}]: n_heads_in_group must be specified for active \
                         attention blocks"
                    ))
                })?;
                if group <= 0 || h % group != 0 {
                    return Err(bad(format!(
                        "Layer {i}: num_attention_heads ({h}) must be divisible by \
                         n_heads_in_group ({group})"
                    )));
                }
                Sub::Full(Box::new(Attention::new(
                    AttentionSpec {
                        hidden_size: d,
                        n_heads: h,
                        n_kv_heads: h / group,
                        head_dim,
                        qkv_bias: args.attention_bias,
                        o_bias: args.attention_bias,
                        qk_norm: QkNorm::None,
                        eps,
                        rope: Rope::initialize(
                            head_dim,
                            args.rope_theta,
                            false,
                            args.rope_scaling.as_ref(),
                            Some(args.max_position_embeddings),
                        )?,
                        names: ["o_proj", "q_norm", "k_norm"],
                        sinks: false,
                        inv_sqrt_scale: false,
                    },
                    w,
                    &p("self_attn"),
                )?))
            };
            if !a.no_op {
                n_caches += 1;
            }
            let mlp = if f.no_op {
                Sub::NoOp
            } else if f.replace_with_linear {
                Sub::Linear(Linear::load(w, &p("mlp.linear"), d, d, args.mlp_bias)?)
            } else {
                let mult = f.ffn_mult.ok_or_else(|| {
                    bad(format!(
                        "block_configs[{i}]: ffn_mult must be specified for active FFN blocks"
                    ))
                })?;
                Sub::Full(Mlp::load(
                    w,
                    &p("mlp"),
                    &MlpNames::LLAMA,
                    d,
                    intermediate_size(mult, d),
                    args.mlp_bias,
                    args.mlp_bias,
                    kind,
                )?)
            };
            blocks.push(Block {
                input_layernorm: (!a.no_op)
                    .then(|| RmsNorm::load(w, &p("input_layernorm"), d, eps))
                    .transpose()?,
                attn,
                post_attention_layernorm: (!f.no_op)
                    .then(|| RmsNorm::load(w, &p("post_attention_layernorm"), d, eps))
                    .transpose()?,
                mlp,
            });
        }
        let embed_tokens = Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?;
        let lm_head = crate::models::load_lm_head(w, args.tie_word_embeddings, d, args.vocab_size)?;
        Ok(Model {
            head: OutputHead::of(lm_head.as_ref(), &embed_tokens),
            norm: RmsNorm::load(w, "model.norm", d, eps)?,
            embed_tokens,
            blocks,
            n_caches,
            args,
        })
    }

    fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.n_caches, "attention layers")?;
        let mut caches = caches;
        let mask = kit::cache_mask(caches.as_deref(), 0, n, None, false)?;
        let mut h = self.embed_tokens.forward(inputs)?;
        let mut next = 0;
        for b in &self.blocks {
            let norm = |n: &Option<RmsNorm>, x: &Array| match n {
                Some(n) => n.forward(x),
                None => Ok(x.clone()),
            };
            match &b.attn {
                Sub::NoOp => {}
                Sub::Linear(l) => {
                    next += 1;
                    h = (&h + &l.forward(&norm(&b.input_layernorm, &h)?)?)?;
                }
                Sub::Full(a) => {
                    let cache = caches.as_deref_mut().map(|c| &mut c[next]);
                    next += 1;
                    h = (&h + &a.forward(&norm(&b.input_layernorm, &h)?, &mask, cache)?)?;
                }
            }
            let x = norm(&b.post_attention_layernorm, &h)?;
            match &b.mlp {
                Sub::NoOp => {}
                Sub::Linear(l) => h = (&h + &l.forward(&x)?)?,
                Sub::Full(m) => h = (&h + &m.forward(&x)?)?,
            }
        }
        self.norm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.head.forward(h)
    }
}

impl LanguageModel for Model {
    kit::short_port_entry_points!(args, vocab_size);

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        kit::kv_caches(self.n_caches)
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The number of caches (layers with an attention entry), as mlx-lm's `make_cache`.
    fn num_layers(&self) -> usize {
        self.n_caches
    }
}
