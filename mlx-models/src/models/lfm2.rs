//! mlx-lm 0.32.2 `models/lfm2.py`: gated short-convolution blocks (conv state in an
//! [`ArraysCache`] of one slot) interleaved with attention layers (per-head q/k norms); and
//! `models/lfm2_moe.py`, the same layers with the MoE family's experts
//! ([`crate::models::moe_block::SparseMoe`]) after the first `num_dense_layers`.
//! A cache from [`LanguageModel::make_cache_with_rollback`] keeps recent per-token conv states
//! so `trim(n)` works (see `mlx_cache::ArraysCache`).

use mlx_cache::{ArraysCache, AttentionMask, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{join, swiglu, Embedding, Linear, RmsNorm, Rope, Walk, Walkable};
use crate::models::checkpoint::{layer_stack, LayerArrays};
use crate::models::kit::{Attention, AttentionSpec};
use crate::models::moe::QkNorm;
use crate::models::moe_block::{BlockExtras, Router, SparseMoe, SparseMoeParams};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

fn default_rope_theta() -> f64 {
    1_000_000.0
}

/// lfm2.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: Option<i32>,
    pub max_position_embeddings: i64,
    pub norm_eps: f64,
    pub conv_bias: bool,
    #[serde(rename = "conv_L_cache")]
    pub conv_l_cache: i32,
    pub block_dim: i32,
    pub block_multiple_of: i32,
    pub block_ffn_dim_multiplier: Option<f64>,
    pub block_auto_adjust_ff_dim: bool,
    #[serde(default)]
    pub block_ff_dim: Option<i32>,
    #[serde(default)]
    pub intermediate_size: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default)]
    pub full_attn_idxs: Option<Vec<i32>>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

/// lfm2_moe.py `ModelArgs`: lfm2's layers, the feed-forward blocks replaced.
#[derive(Clone, Debug, Deserialize)]
struct MoeArgs {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    intermediate_size: i32,
    moe_intermediate_size: i32,
    num_hidden_layers: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    norm_topk_prob: bool,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    max_position_embeddings: i64,
    use_expert_bias: bool,
    num_dense_layers: i32,
    norm_eps: f64,
    conv_bias: bool,
    #[serde(rename = "conv_L_cache")]
    conv_l_cache: i32,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    #[serde(default = "one_f64")]
    routed_scaling_factor: f64,
    #[serde(default)]
    rope_parameters: Option<Value>,
    #[serde(default)]
    full_attn_idxs: Option<Vec<i32>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
}

fn one_f64() -> f64 {
    1.0
}

/// What lfm2_moe adds to lfm2's arguments.
#[derive(Clone, Debug)]
struct MoeParts {
    num_dense_layers: i32,
    params: SparseMoeParams,
    expert_bias: bool,
}

impl MoeArgs {
    /// lfm2's arguments for the shared layers (the dense MLP of `intermediate_size`, never
    /// adjusted) and the experts' parameters.
    fn split(self) -> Result<(ModelArgs, MoeParts)> {
        let parts = MoeParts {
            num_dense_layers: self.num_dense_layers,
            params: SparseMoeParams {
                hidden_size: self.hidden_size,
                num_experts: self.num_experts,
                top_k: self.num_experts_per_tok,
                moe_intermediate_size: self.moe_intermediate_size,
                expert_bias: false,
                router: Router::SigmoidUpper {
                    norm_topk_prob: self.norm_topk_prob,
                    routed_scaling_factor: self.routed_scaling_factor,
                    biased: self.use_expert_bias,
                },
                shared_expert_intermediate_size: None,
                names: ["gate", "switch_mlp"],
                router_bias: false,
                activation: crate::layers::SwitchActivation::SwiGlu,
            },
            expert_bias: self.use_expert_bias,
        };
        for (name, v) in [
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ] {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "lfm2_moe: `{name}` must be positive, got {v}"
                )));
            }
        }
        if self.num_experts_per_tok > self.num_experts {
            return Err(ModelError::Config(format!(
                "lfm2_moe: num_experts_per_tok {} exceeds the {} experts",
                self.num_experts_per_tok, self.num_experts
            )));
        }
        let args = ModelArgs {
            model_type: self.model_type,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: Some(self.num_key_value_heads),
            max_position_embeddings: self.max_position_embeddings,
            norm_eps: self.norm_eps,
            conv_bias: self.conv_bias,
            conv_l_cache: self.conv_l_cache,
            block_dim: self.hidden_size,
            block_multiple_of: 1,
            block_ffn_dim_multiplier: None,
            block_auto_adjust_ff_dim: false,
            block_ff_dim: Some(self.intermediate_size),
            intermediate_size: Some(self.intermediate_size),
            rope_theta: self.rope_theta,
            rope_parameters: self.rope_parameters,
            full_attn_idxs: self.full_attn_idxs,
            layer_types: self.layer_types,
        };
        Ok((args.post_init()?, parts))
    }
}

impl ModelArgs {
    /// `__post_init__`, plus the checks that keep MLX from seeing bad shapes.
    fn post_init(mut self) -> Result<ModelArgs> {
        if self.block_ff_dim.is_none() {
            self.block_ff_dim = Some(self.intermediate_size.ok_or_else(|| {
                ModelError::Config(
                    "lfm2: config must specify either 'block_ff_dim' or 'intermediate_size'".into(),
                )
            })?);
        }
        if let Some(t) = self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
        {
            self.rope_theta = t;
        }
        if self.num_key_value_heads.is_none() {
            self.num_key_value_heads = Some(self.num_attention_heads);
        }
        if self.full_attn_idxs.is_none() {
            let types = self.layer_types.as_ref().ok_or_else(|| {
                ModelError::Config("lfm2: needs `full_attn_idxs` or `layer_types`".into())
            })?;
            self.full_attn_idxs = Some(
                types
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| *t == "full_attention")
                    .map(|(i, _)| i as i32)
                    .collect(),
            );
        }
        let kv = self.num_key_value_heads.unwrap_or(0);
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", kv),
            ("conv_L_cache", self.conv_l_cache),
            ("block_multiple_of", self.block_multiple_of),
        ] {
            if v <= 0 {
                return Err(ModelError::Config(format!(
                    "lfm2: `{name}` must be positive, got {v}"
                )));
            }
        }
        if self.hidden_size % self.num_attention_heads != 0 || self.num_attention_heads % kv != 0 {
            return Err(ModelError::Config(format!(
                "lfm2: hidden_size {} / num_attention_heads {} / num_key_value_heads {kv} do not divide",
                self.hidden_size, self.num_attention_heads
            )));
        }
        let attn = self.full_attn_idxs.as_deref().unwrap_or_default();
        if attn.is_empty() || attn.len() as i32 == self.num_hidden_layers {
            return Err(ModelError::Config(
                "lfm2: needs at least one attention and one convolution layer".into(),
            ));
        }
        Ok(self)
    }

    /// `MLP.__init__`'s feed-forward width.
    fn ff_dim(&self) -> i32 {
        let mut ff = self.block_ff_dim.unwrap_or(0);
        if self.block_auto_adjust_ff_dim {
            ff = (2.0 * f64::from(ff) / 3.0) as i32;
            if let Some(m) = self.block_ffn_dim_multiplier {
                ff = (m * f64::from(ff)) as i32;
            }
            let m = self.block_multiple_of;
            ff = m * ((ff + m - 1) / m);
        }
        ff
    }

    fn is_attention(&self, layer: i32) -> bool {
        self.full_attn_idxs
            .as_deref()
            .is_some_and(|a| a.contains(&layer))
    }
}

/// `ShortConv`: `out_proj(C * conv(B * x))` over a depthwise causal convolution.
#[derive(Clone)]
struct ShortConv {
    l_cache: i32,
    conv_weight: Array,
    conv_bias: Option<Array>,
    in_proj: Linear,
    out_proj: Linear,
}

impl ShortConv {
    fn load(a: &ModelArgs, w: &mut Weights, path: &str) -> Result<ShortConv> {
        let d = a.hidden_size;
        let p = |n: &str| format!("{path}.{n}");
        Ok(ShortConv {
            l_cache: a.conv_l_cache,
            conv_weight: w.take(&p("conv.weight"), &[d, a.conv_l_cache, 1])?,
            conv_bias: if a.conv_bias {
                Some(w.take(&p("conv.bias"), &[d])?)
            } else {
                None
            },
            in_proj: Linear::load(w, &p("in_proj"), d, 3 * d, a.conv_bias)?,
            out_proj: Linear::load(w, &p("out_proj"), d, d, a.conv_bias)?,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let bcx = ops::split_equal(&self.in_proj.forward(x)?, 3, -1, None)?;
        let (b, c, x) = (&bcx[0], &bcx[1], &bcx[2]);
        let mut bx = (b * x)?;
        if let Some(m) = mask {
            bx = ops::where_scalar(&ops::expand_dims(m, &[-1], None)?, &bx, 0i32, None)?;
        }
        let n_keep = self.l_cache - 1;
        let t = x.shape().get(1).copied().unwrap_or(0);
        let bx = match cache {
            Some(cache) => {
                let state = match cache.get(0) {
                    Some(s) => s.clone(),
                    None => {
                        let sh = bx.shape();
                        ops::zeros(&[sh[0], n_keep, sh[2]], bx.dtype(), None)?
                    }
                };
                let bx = ops::concatenate(&[&state, &bx], 1, None)?;
                let keep = |from: i32| ops::slice_axis(&bx, 1, from, from + n_keep, None);
                if cache.keeps_history() {
                    let steps = (1..=t)
                        .map(|s| Ok(vec![Some(keep(s)?)]))
                        .collect::<Result<Vec<_>>>()?;
                    cache.checkpoint_steps(steps)?;
                }
                cache.set(0, keep(t)?)?;
                cache.advance(t as usize)?;
                bx
            }
            None => ops::pad_widths(
                &bx,
                &[(0, 0), (n_keep, 0), (0, 0)],
                &Scalar::Int(0).to_array_like(bx.dtype())?,
                "constant",
                None,
            )?,
        };
        let mut conv_out = ops::conv1d(
            &bx,
            &self.conv_weight,
            1,
            0,
            1,
            self.conv_weight.shape()[0],
            None,
        )?;
        if let Some(bias) = &self.conv_bias {
            conv_out = (&conv_out + bias)?;
        }
        self.out_proj.forward(&(c * &conv_out)?)
    }
}

impl Walkable for ShortConv {
    /// The convolution's arrays (`conv.weight`, `conv.bias`), then `in_proj`, `out_proj`.
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let conv = join(path, "conv");
        w.array(&conv, "weight", &mut self.conv_weight);
        if let Some(b) = &mut self.conv_bias {
            w.array(&conv, "bias", b);
        }
        w.linear(&join(path, "in_proj"), &mut self.in_proj);
        w.linear(&join(path, "out_proj"), &mut self.out_proj);
    }
}

/// lfm2's SwiGLU `MLP` (`w1`, `w3`, `w2`; lfm2_moe names them `gate_proj`, `up_proj`,
/// `down_proj`), or lfm2_moe's experts.
#[derive(Clone)]
enum FeedForward {
    Mlp {
        w1: Linear,
        w2: Linear,
        w3: Linear,
        /// Names of w1, w3, w2 (gate, up, down).
        names: [&'static str; 3],
    },
    Moe(Box<SparseMoe>),
}

impl FeedForward {
    fn forward(&self, y: &Array) -> Result<Array> {
        match self {
            FeedForward::Mlp { w1, w2, w3, .. } => {
                w2.forward(&swiglu(&w1.forward(y)?, &w3.forward(y)?)?)
            }
            FeedForward::Moe(m) => m.forward(y),
        }
    }
}

impl Walkable for DecoderLayer {
    /// The operator (`self_attn` or `conv`), the feed-forward block (`w1`, `w3`, `w2`, its
    /// declaration order; lfm2_moe's experts: router, switch), then the norms.
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let DecoderLayer {
            op,
            feed_forward,
            operator_norm,
            ffn_norm,
        } = self;
        match op {
            Operator::Attention(a) => a.walk(&join(path, "self_attn"), w),
            Operator::Conv(c) => w.module(&join(path, "conv"), c),
        }
        let ff = join(path, "feed_forward");
        match feed_forward {
            FeedForward::Mlp { w1, w2, w3, names } => {
                for (name, l) in [(names[0], w1), (names[1], w3), (names[2], w2)] {
                    w.linear(&join(&ff, name), l);
                }
            }
            FeedForward::Moe(m) => m.walk(&ff, w),
        }
        w.rms_norm(&join(path, "operator_norm"), operator_norm);
        w.rms_norm(&join(path, "ffn_norm"), ffn_norm);
    }
}

impl DecoderLayer {
    /// One layer at index `i` (for its error message) over `h`.
    fn forward(
        &self,
        h: &Array,
        i: usize,
        attn_mask: &AttentionMask,
        conv_mask: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let x = self.operator_norm.forward(h)?;
        let r = match &self.op {
            Operator::Attention(a) => a.forward(&x, attn_mask, cache)?,
            Operator::Conv(conv) => {
                let c = match cache {
                    Some(c) => Some(c.as_any_mut().downcast_mut::<ArraysCache>().ok_or_else(
                        || ModelError::Cache {
                            what: format!("layer {i}"),
                            problem: "a convolution layer and needs an ArraysCache".into(),
                        },
                    )?),
                    None => None,
                };
                conv.forward(&x, conv_mask, c)?
            }
        };
        let hh = (h + &r)?;
        let y = self.feed_forward.forward(&self.ffn_norm.forward(&hh)?)?;
        Ok((&hh + &y)?)
    }
}

impl LayerArrays for DecoderLayer {}

#[derive(Clone)]
enum Operator {
    Attention(Box<Attention>),
    Conv(ShortConv),
}

#[derive(Clone)]
struct DecoderLayer {
    op: Operator,
    feed_forward: FeedForward,
    operator_norm: RmsNorm,
    ffn_norm: RmsNorm,
}

/// The LFM2 model (always tied output embeddings).
pub struct Model {
    args: ModelArgs,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    embedding_norm: RmsNorm,
    fa_idx: usize,
    conv_idx: usize,
    /// `--grad-checkpoint`: every layer under `mx.checkpoint` (training, no caches).
    grad_checkpoint: bool,
    /// The layers whose own arrays enter their checkpoints (full fine-tuning).
    checkpoint_own: std::ops::Range<usize>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let (args, moe) = if config.architecture == "lfm2_moe" {
            let (args, moe) = config.args::<MoeArgs>()?.split()?;
            (args, Some(moe))
        } else {
            (config.args::<ModelArgs>()?.post_init()?, None)
        };
        sanitize_conv(w)?;
        if let Some(m) = &moe {
            sanitize_moe(&args, m, w)?;
        }
        let eps = args.norm_eps as f32;
        let d = args.hidden_size;
        let ff = args.ff_dim();
        let embed_tokens = Embedding::load(w, "model.embed_tokens", args.vocab_size, d)?;
        let mut layers = Vec::with_capacity(args.num_hidden_layers as usize);
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let op = if args.is_attention(i) {
                let n_heads = args.num_attention_heads;
                let head_dim = d / n_heads;
                Operator::Attention(Box::new(Attention::new(
                    AttentionSpec {
                        hidden_size: d,
                        n_heads,
                        n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
                        head_dim,
                        qkv_bias: false,
                        o_bias: false,
                        qk_norm: QkNorm::PerHead,
                        eps,
                        rope: Rope::initialize(head_dim, args.rope_theta, false, None, None)?,
                        names: ["out_proj", "q_layernorm", "k_layernorm"],
                        sinks: false,
                        inv_sqrt_scale: false,
                    },
                    w,
                    &format!("{p}.self_attn"),
                )?))
            } else {
                Operator::Conv(ShortConv::load(&args, w, &format!("{p}.conv"))?)
            };
            let f = |n: &str| format!("{p}.feed_forward.{n}");
            let feed_forward = match &moe {
                Some(m) if i >= m.num_dense_layers => {
                    FeedForward::Moe(Box::new(SparseMoe::load_with(
                        w,
                        &format!("{p}.feed_forward"),
                        &BlockExtras {
                            correction_bias: m.expert_bias.then_some("expert_bias"),
                            ..BlockExtras::default()
                        },
                        &m.params,
                    )?))
                }
                _ => {
                    let names = if moe.is_some() {
                        ["gate_proj", "up_proj", "down_proj"]
                    } else {
                        ["w1", "w3", "w2"]
                    };
                    FeedForward::Mlp {
                        w1: Linear::load(w, &f(names[0]), args.block_dim, ff, false)?,
                        w2: Linear::load(w, &f(names[2]), ff, args.block_dim, false)?,
                        w3: Linear::load(w, &f(names[1]), args.block_dim, ff, false)?,
                        names,
                    }
                }
            };
            layers.push(DecoderLayer {
                op,
                feed_forward,
                operator_norm: RmsNorm::load(w, &format!("{p}.operator_norm"), d, eps)?,
                ffn_norm: RmsNorm::load(w, &format!("{p}.ffn_norm"), d, eps)?,
            });
        }
        let embedding_norm = RmsNorm::load(w, "model.embedding_norm", d, eps)?;
        let attn = args.full_attn_idxs.clone().unwrap_or_default();
        let fa_idx = attn.first().copied().unwrap_or(0).max(0) as usize;
        let conv_idx = (0..args.num_hidden_layers)
            .position(|i| !attn.contains(&i))
            .unwrap_or(0);
        Ok(Model {
            args,
            embed_tokens,
            layers,
            embedding_norm,
            fa_idx,
            conv_idx,
            grad_checkpoint: false,
            checkpoint_own: 0..0,
        })
    }
}

/// lfm2_moe.py `sanitize` after the conv transpose: `w1` / `w2` / `w3` weights renamed
/// `gate_proj` / `down_proj` / `up_proj`, per-expert weights stacked into `switch_mlp`.
fn sanitize_moe(args: &ModelArgs, m: &MoeParts, w: &mut Weights) -> Result<()> {
    for name in w.names() {
        let mut new = name.clone();
        for (old, to) in [
            ("w1.weight", "gate_proj.weight"),
            ("w2.weight", "down_proj.weight"),
            ("w3.weight", "up_proj.weight"),
        ] {
            if new.contains(old) {
                new = new.replace(old, to);
            }
        }
        if new != name {
            if let Some(v) = w.remove(&name) {
                w.insert(new, v);
            }
        }
    }
    for l in 0..args.num_hidden_layers {
        let prefix = format!("model.layers.{l}.feed_forward");
        kit::stack_experts(
            w,
            &format!("{prefix}.experts"),
            &format!("{prefix}.switch_mlp"),
            m.params.num_experts,
            &kit::GLU_PROJECTIONS,
            &["weight"],
        )?;
    }
    Ok(())
}

/// lfm2.py `sanitize`: HF conv weights `(C, 1, K)` become `(C, K, 1)`.
fn sanitize_conv(w: &mut Weights) -> Result<()> {
    for name in w.names() {
        let Some(shape) = w.shape_of(&name) else {
            continue;
        };
        if name.contains("conv.weight") && shape.len() == 3 && shape[2] > shape[1] {
            if let Some(t) = w.remove(&name) {
                w.insert(name, ops::transpose(&t, &[0, 2, 1], None)?);
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
        let (attn_mask, conv_mask) = kit::hybrid_masks(
            caches.as_deref(),
            self.layers.len(),
            Some(self.fa_idx),
            Some(self.conv_idx),
            n,
        )?;
        h = layer_stack(
            &self.layers,
            h,
            caches,
            self.grad_checkpoint,
            &self.checkpoint_own,
            |i| {
                let (am, cm) = (attn_mask.clone(), conv_mask.clone());
                move |l: &DecoderLayer, x: &Array, c: Option<&mut Box<dyn Cache>>| {
                    l.forward(x, i, &am, cm.as_ref(), c)
                }
            },
        )?;
        self.embedding_norm.forward(&h)
    }

    /// The output head over normed hidden states.
    fn head(&self, out: &Array) -> Result<Array> {
        self.embed_tokens.as_linear(out)
    }
}

impl LanguageModel for Model {
    port_entry_points!(args);

    /// The projection `head` applies (for the chunked cross-entropy of training).
    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::Tied(self.embed_tokens.clone()))
    }

    kit::layer_caches! {
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers.iter().map(|l| matches!(l.op, Operator::Attention(_))),
                1,
            )
        }
    }
}

impl super::Trainable for Model {
    checkpoint_switches!();

    fn top_modules_mut(&mut self) -> Vec<(String, super::TopModuleMut<'_>)> {
        super::head_and_embedding(
            "",
            None,
            "lm_head",
            &mut self.embed_tokens,
            "model.embed_tokens",
        )
    }

    kit::walked_layers!(layers);
}
