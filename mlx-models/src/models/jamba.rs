//! mlx-lm 0.32.2 `models/jamba.py`: Mamba (selective scan, with RMS norms on dt, B and C)
//! and attention layers without positional encoding (`layers_block_type`, or every
//! `attn_layer_period`-th from `attn_layer_offset`), each followed by a SwiGLU MLP or, every
//! `expert_layer_period`-th layer, a mixture of experts. Mamba layers hold an [`ArraysCache`]
//! of two slots, attention layers a [`KVCache`].

use mlx_cache::{ArraysCache, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{arrays_cache, fma, softplus, store_recurrent, DepthwiseConv};
use crate::layers::{silu, swiglu, Embedding, Linear, RmsNorm, SwitchActivation};
use crate::models::checkpoint::layer_loop;
use crate::models::kit::{self, Attention};
use crate::models::mamba::{conv_kernel_ok, positive, sanitize};
use crate::models::moe_block::{Router, SparseMoe, SparseMoeParams};
use crate::models::LanguageModel;
use crate::weights::Weights;

serde_defaults! {
    default_rank: Value = Value::String("auto".into());
    default_true: bool = true;
}

/// jamba.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    attn_layer_offset: i32,
    attn_layer_period: i32,
    expert_layer_offset: i32,
    expert_layer_period: i32,
    mamba_d_conv: i32,
    mamba_d_state: i32,
    mamba_expand: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    #[serde(default = "default_rank")]
    mamba_dt_rank: Value,
    #[serde(default)]
    mamba_proj_bias: bool,
    #[serde(default = "default_true")]
    mamba_conv_bias: bool,
    #[serde(default)]
    layers_block_type: Option<Vec<String>>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

fn bad(m: String) -> ModelError {
    ModelError::Config(format!("jamba: {m}"))
}

impl ModelArgs {
    /// `__post_init__` (the dt rank, the block types) and the checks that keep MLX from seeing
    /// bad shapes; returns the rank and whether each layer is attention.
    fn post_init(&self) -> Result<(i32, Vec<bool>)> {
        let rank = match &self.mamba_dt_rank {
            Value::String(s) if s == "auto" => (self.hidden_size + 15).div_euclid(16),
            v => v
                .as_i64()
                .and_then(|r| i32::try_from(r).ok())
                .ok_or_else(|| {
                    bad(format!(
                        "`mamba_dt_rank` must be an integer or \"auto\", got {v}"
                    ))
                })?,
        };
        positive(
            "jamba",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
                ("mamba_d_state", self.mamba_d_state),
                ("mamba_expand", self.mamba_expand),
                ("mamba_dt_rank", rank),
                ("attn_layer_period", self.attn_layer_period),
                ("expert_layer_period", self.expert_layer_period),
                ("num_experts", self.num_experts),
            ],
        )?;
        conv_kernel_ok("jamba", self.mamba_d_conv)?;
        if self.hidden_size % self.num_attention_heads != 0
            || self.num_attention_heads % self.num_key_value_heads != 0
        {
            return Err(bad(format!(
                "hidden_size {} / num_attention_heads {} / num_key_value_heads {} do not divide",
                self.hidden_size, self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.num_experts > 1
            && (self.num_experts_per_tok <= 0 || self.num_experts_per_tok > self.num_experts)
        {
            return Err(bad(format!(
                "`num_experts_per_tok` must be in 1..={}, got {}",
                self.num_experts, self.num_experts_per_tok
            )));
        }
        let attn: Vec<bool> = match &self.layers_block_type {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "attention" => Ok(true),
                    "mamba" => Ok(false),
                    other => Err(bad(format!("unknown layer type `{other}`"))),
                })
                .collect::<Result<_>>()?,
            None => (0..self.num_hidden_layers)
                .map(|i| i % self.attn_layer_period == self.attn_layer_offset)
                .collect(),
        };
        if !attn.contains(&true) || !attn.contains(&false) {
            return Err(bad(
                "needs at least one attention and one mamba layer (mlx-lm indexes both)".into(),
            ));
        }
        Ok((rank, attn))
    }
}

/// `JambaMambaMixer`.
#[derive(Clone)]
struct MambaMixer {
    in_proj: Linear,
    conv1d: DepthwiseConv,
    x_proj: Linear,
    dt_proj: Linear,
    a_log: Array,
    d: Array,
    out_proj: Linear,
    dt_layernorm: RmsNorm,
    b_layernorm: RmsNorm,
    c_layernorm: RmsNorm,
    rank: i32,
    state_size: i32,
}

impl MambaMixer {
    fn load(a: &ModelArgs, rank: i32, w: &mut Weights, p: &str) -> Result<MambaMixer> {
        let (h, n) = (a.hidden_size, a.mamba_d_state);
        let i = a.mamba_expand * h;
        let eps = a.rms_norm_eps as f32;
        let n_ = |s: &str| format!("{p}.{s}");
        Ok(MambaMixer {
            in_proj: Linear::load(w, &n_("in_proj"), h, 2 * i, a.mamba_proj_bias)?,
            conv1d: DepthwiseConv::load(w, &n_("conv1d"), i, a.mamba_d_conv, a.mamba_conv_bias)?,
            x_proj: Linear::load(w, &n_("x_proj"), i, rank + 2 * n, false)?,
            dt_proj: Linear::load(w, &n_("dt_proj"), rank, i, true)?,
            a_log: w.take(&n_("A_log"), &[i, n])?,
            d: w.take(&n_("D"), &[i])?,
            out_proj: Linear::load(w, &n_("out_proj"), i, h, a.mamba_proj_bias)?,
            dt_layernorm: RmsNorm::load(w, &n_("dt_layernorm"), rank, eps)?,
            b_layernorm: RmsNorm::load(w, &n_("b_layernorm"), n, eps)?,
            c_layernorm: RmsNorm::load(w, &n_("c_layernorm"), n, eps)?,
            rank,
            state_size: n,
        })
    }

    fn forward(&self, x: &Array, cache: Option<&mut ArraysCache>) -> Result<Array> {
        let xz = ops::split_equal(&self.in_proj.forward(x)?, 2, -1, None)?;
        let (x, z) = (&xz[0], &xz[1]);
        let t = x.shape()[1];
        let padded =
            self.conv1d
                .padded(x, cache.as_ref().and_then(|c| c.get(0)), cache.is_some())?;
        let x = silu(&self.conv1d.forward(&padded)?)?;
        let a = ops::negative(&ops::exp(&self.a_log, None)?, None)?;
        // ssm_step over the whole sequence.
        let dbc = self.x_proj.forward(&x)?;
        let parts = ops::split_at(&dbc, &[self.rank, self.rank + self.state_size], -1, None)?;
        let delta = self.dt_layernorm.forward(&parts[0])?;
        let b = self.b_layernorm.forward(&parts[1])?;
        let c = self.c_layernorm.forward(&parts[2])?;
        let delta = softplus(&self.dt_proj.forward(&delta)?)?;
        let new_state = (&(&delta * &x)?.expand_dims(&[-1])? * &b.expand_dims(&[-2])?)?;
        let dta = ops::exp(&(&delta.expand_dims(&[-1])? * &a)?, None)?;
        let mut state = cache.as_ref().and_then(|c| c.get(1)).cloned();
        let mut states = Vec::with_capacity(t as usize);
        for s in 0..t {
            let at = |m: &Array| m.slice_axis(1, s, s + 1)?.squeeze(&[1]);
            let st = match &state {
                Some(prev) => fma(prev, &at(&dta)?, &at(&new_state)?)?,
                None => at(&new_state)?,
            };
            states.push(st.clone());
            state = Some(st);
        }
        let refs: Vec<&Array> = states.iter().collect();
        let full = ops::stack(&refs, 1, None)?;
        let y = ops::matmul(&full, &c.expand_dims(&[-1])?, None)?.squeeze(&[-1])?;
        let y = (&y + &(&self.d * &x)?)?;
        if let Some(cache) = cache {
            let history = cache.keeps_history().then_some(states);
            let conv = [(&self.conv1d, &padded)];
            store_recurrent(cache, &conv, t, history, state, false)?;
        }
        self.out_proj.forward(&swiglu(z, &y)?)
    }
}

#[derive(Clone)]
enum Mixer {
    Mamba(Box<MambaMixer>),
    Attention(Box<Attention>),
}

#[derive(Clone)]
enum Ffn {
    Mlp {
        gate_proj: Linear,
        up_proj: Linear,
        down_proj: Linear,
    },
    Moe(Box<SparseMoe>),
}

#[derive(Clone)]
struct Layer {
    mixer: Mixer,
    feed_forward: Ffn,
    input_layernorm: RmsNorm,
    pre_ff_layernorm: RmsNorm,
}

/// The Jamba model.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    final_layernorm: RmsNorm,
    lm_head: Option<Linear>,
    attn_idx: usize,
}

/// `sanitize`'s expert stacking: `experts.<e>.<proj>.<name>` into `switch_mlp.<proj>.<name>`.
fn stack_experts(n_layers: i32, w: &mut Weights) -> Result<()> {
    for l in 0..n_layers {
        let base = format!("model.layers.{l}.feed_forward");
        let experts = format!("{base}.experts.");
        // Every expert index is below the number of expert tensors.
        let bound = w.names().iter().filter(|k| k.starts_with(&experts)).count();
        if bound == 0 {
            continue;
        }
        for proj in ["gate_proj", "down_proj", "up_proj"] {
            for name in ["weight", "bias", "scales", "biases"] {
                let mut found = Vec::new();
                for e in 0..bound {
                    if let Some(t) = w.remove(&format!("{experts}{e}.{proj}.{name}")) {
                        found.push(t);
                    }
                }
                if !found.is_empty() {
                    let refs: Vec<&Array> = found.iter().collect();
                    w.insert(
                        format!("{base}.switch_mlp.{proj}.{name}"),
                        ops::stack(&refs, 0, None)?,
                    );
                }
            }
        }
    }
    Ok(())
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = config.args()?;
        let (rank, is_attn) = a.post_init()?;
        sanitize(w)?;
        if a.tie_word_embeddings {
            w.discard("lm_head.weight");
        }
        stack_experts(a.num_hidden_layers, w)?;
        let d = a.hidden_size;
        let eps = a.rms_norm_eps as f32;
        let embed_tokens = Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?;
        let mut layers = Vec::with_capacity(is_attn.len());
        for (i, attn) in is_attn.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mixer = if *attn {
                Mixer::Attention(Box::new({
                    let hd = d / a.num_attention_heads;
                    let dims = (d, a.num_attention_heads, a.num_key_value_heads, hd);
                    let p = format!("{p}.self_attn");
                    Attention::load(w, &p, dims, false, kit::head_scale(hd))?
                }))
            } else {
                Mixer::Mamba(Box::new(MambaMixer::load(
                    &a,
                    rank,
                    w,
                    &format!("{p}.mamba"),
                )?))
            };
            let f = format!("{p}.feed_forward");
            let moe = a.num_experts > 1
                && (i as i64 + i64::from(a.expert_layer_offset))
                    .rem_euclid(i64::from(a.expert_layer_period))
                    == 0;
            let feed_forward = if moe {
                Ffn::Moe(Box::new(SparseMoe::load_parts(
                    w,
                    &f,
                    &SparseMoeParams {
                        hidden_size: d,
                        num_experts: a.num_experts,
                        top_k: a.num_experts_per_tok,
                        moe_intermediate_size: a.intermediate_size,
                        expert_bias: false,
                        router: Router::TopKThenSoftmax,
                        shared_expert_intermediate_size: None,
                        names: ["router", "switch_mlp"],
                        router_bias: false,
                        activation: SwitchActivation::SwiGlu,
                    },
                )?))
            } else {
                let h = a.intermediate_size;
                Ffn::Mlp {
                    gate_proj: Linear::load(w, &format!("{f}.gate_proj"), d, h, false)?,
                    up_proj: Linear::load(w, &format!("{f}.up_proj"), d, h, false)?,
                    down_proj: Linear::load(w, &format!("{f}.down_proj"), h, d, false)?,
                }
            };
            layers.push(Layer {
                mixer,
                feed_forward,
                input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                pre_ff_layernorm: RmsNorm::load(w, &format!("{p}.pre_ff_layernorm"), d, eps)?,
            });
        }
        let final_layernorm = RmsNorm::load(w, "model.final_layernorm", d, eps)?;
        let lm_head = crate::models::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        Ok(Model {
            model_type: a.model_type,
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            final_layernorm,
            lm_head,
            attn_idx: is_attn.iter().position(|x| *x).unwrap_or(0),
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (h, n) = kit::embed_inputs(inputs, &self.embed_tokens)?;
        kit::check_caches(caches.as_deref(), self.layers.len(), "layers")?;
        // (jamba's Mamba mixer takes no mask: mlx-lm's `ssm_mask` goes unused.)
        let attn_mask = kit::cache_mask(caches.as_deref(), self.attn_idx, n, None, false)?;
        let h = layer_loop(&self.layers, h, caches, |i, layer, h, cache| {
            let x = layer.input_layernorm.forward(h)?;
            let out = match &layer.mixer {
                Mixer::Attention(a) => a.forward(&x, &attn_mask, cache)?,
                Mixer::Mamba(m) => m.forward(&x, arrays_cache(cache, i)?)?,
            };
            let r = (h + &out)?;
            let y = layer.pre_ff_layernorm.forward(&r)?;
            let y = match &layer.feed_forward {
                Ffn::Mlp {
                    gate_proj,
                    up_proj,
                    down_proj,
                } => down_proj.forward(&swiglu(&gate_proj.forward(&y)?, &up_proj.forward(&y)?)?)?,
                Ffn::Moe(m) => m.forward(&y)?,
            };
            Ok((&r + &y)?)
        })?;
        self.final_layernorm.forward(&h)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!(tied lm_head, embed_tokens);

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
