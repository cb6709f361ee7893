//! mlx-lm 0.32.2 `models/falcon_h1.py`: every layer runs a Mamba 2 mixer and a rope attention
//! side by side on the same normed input (their outputs summed into the residual), then a
//! SwiGLU MLP. Each layer's cache is a [`CacheList`] of an [`ArraysCache`] (two slots) and a
//! [`KVCache`]. `sanitize` folds Falcon-H1's muP multipliers into the weights of HF checkpoints
//! (recognised, as in mlx-lm, by their `(C, 1, K)` conv weights).

use mlx_cache::{ArraysCache, Cache, CacheList, KVCache};
use mlx_core::prelude::*;
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::ssm::{GatedNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::{swiglu, Embedding, Linear, RmsNorm, Rope, RopeScaling};
use crate::models::checkpoint::layer_loop;
use crate::models::kit::{self, Attention};
use crate::models::mamba::{conv_kernel_ok, positive};
use crate::models::LanguageModel;
use crate::weights::Weights;

serde_defaults! {
    d_attention_out_multiplier: f64 = 0.9375;
    d_embedding_multiplier: f64 = 5.656854249492381;
    d_head_dim: i32 = 64;
    d_hidden_size: i32 = 1024;
    d_intermediate_size: i32 = 2048;
    d_key_multiplier: f64 = 0.390625;
    d_lm_head_multiplier: f64 = 0.0390625;
    d_one: f64 = 1.0;
    d_true: bool = true;
    d_d_conv: i32 = 4;
    d_d_head: i32 = 64;
    d_d_ssm: i32 = 1536;
    d_d_state: i32 = 128;
    d_one_i: i32 = 1;
    d_n_heads: i32 = 24;
    d_max_pos: i64 = 131072;
    d_mlp_multipliers: Vec<f64> = vec![0.8838834764831844, 0.5859375];
    d_model_type: String = "falcon_h1".into();
    d_num_attention_heads: i32 = 8;
    d_num_hidden_layers: i32 = 36;
    d_num_key_value_heads: i32 = 2;
    d_eps: f64 = 1e-5;
    d_rope_theta: f64 = 100000000000.0;
    d_ssm_in_multiplier: f64 = 1.25;
    d_ssm_multipliers: Vec<f64> = vec![
        0.3535533905932738,
        0.25,
        0.3535533905932738,
        0.5,
        0.3535533905932738,
    ];
    d_ssm_out_multiplier: f64 = 0.23570226039551587;
    d_vocab_size: i32 = 32784;
}

/// falcon_h1.py `ModelArgs` (every field has a default there).
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    #[serde(default)]
    attention_bias: bool,
    #[serde(default = "d_one")]
    attention_in_multiplier: f64,
    #[serde(default = "d_attention_out_multiplier")]
    attention_out_multiplier: f64,
    #[serde(default = "d_embedding_multiplier")]
    embedding_multiplier: f64,
    #[serde(default = "d_head_dim")]
    head_dim: i32,
    #[serde(default = "d_hidden_size")]
    hidden_size: i32,
    #[serde(default = "d_intermediate_size")]
    intermediate_size: i32,
    #[serde(default = "d_key_multiplier")]
    key_multiplier: f64,
    #[serde(default = "d_lm_head_multiplier")]
    lm_head_multiplier: f64,
    #[serde(default = "d_true")]
    mamba_conv_bias: bool,
    #[serde(default = "d_d_conv")]
    mamba_d_conv: i32,
    #[serde(default = "d_d_head")]
    mamba_d_head: i32,
    #[serde(default = "d_d_ssm")]
    mamba_d_ssm: i32,
    #[serde(default = "d_d_state")]
    mamba_d_state: i32,
    #[serde(default = "d_one_i")]
    mamba_n_groups: i32,
    #[serde(default = "d_n_heads")]
    mamba_n_heads: i32,
    #[serde(default)]
    mamba_norm_before_gate: bool,
    #[serde(default)]
    mamba_proj_bias: bool,
    #[serde(default)]
    mamba_rms_norm: bool,
    #[serde(default = "d_max_pos")]
    max_position_embeddings: i64,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "d_mlp_multipliers")]
    mlp_multipliers: Vec<f64>,
    #[serde(default = "d_model_type")]
    model_type: String,
    #[serde(default = "d_num_attention_heads")]
    num_attention_heads: i32,
    #[serde(default = "d_num_hidden_layers")]
    num_hidden_layers: i32,
    #[serde(default = "d_num_key_value_heads")]
    num_key_value_heads: i32,
    #[serde(default)]
    projectors_bias: bool,
    #[serde(default = "d_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default = "d_rope_theta")]
    rope_theta: f64,
    #[serde(default = "d_ssm_in_multiplier")]
    ssm_in_multiplier: f64,
    #[serde(default = "d_ssm_multipliers")]
    ssm_multipliers: Vec<f64>,
    #[serde(default = "d_ssm_out_multiplier")]
    ssm_out_multiplier: f64,
    #[serde(default = "d_vocab_size")]
    vocab_size: i32,
    #[serde(default = "d_true")]
    tie_word_embeddings: bool,
}

fn bad(m: String) -> ModelError {
    ModelError::Config(format!("falcon_h1: {m}"))
}

impl ModelArgs {
    fn check(&self) -> Result<()> {
        positive(
            "falcon_h1",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("head_dim", self.head_dim),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
                ("num_hidden_layers", self.num_hidden_layers),
                ("mamba_n_heads", self.mamba_n_heads),
                ("mamba_d_head", self.mamba_d_head),
                ("mamba_d_state", self.mamba_d_state),
                ("mamba_n_groups", self.mamba_n_groups),
            ],
        )?;
        conv_kernel_ok("falcon_h1", self.mamba_d_conv)?;
        if self.mamba_d_ssm != self.mamba_n_heads * self.mamba_d_head {
            return Err(bad(format!(
                "`mamba_d_ssm` {} is not `mamba_n_heads` {} x `mamba_d_head` {}",
                self.mamba_d_ssm, self.mamba_n_heads, self.mamba_d_head
            )));
        }
        if self.mamba_n_heads % self.mamba_n_groups != 0
            || self.num_attention_heads % self.num_key_value_heads != 0
        {
            return Err(bad(
                "`mamba_n_heads` / `mamba_n_groups` or `num_attention_heads` / \
                 `num_key_value_heads` do not divide"
                    .into(),
            ));
        }
        if self.mlp_multipliers.len() != 2 || self.ssm_multipliers.len() != 5 {
            return Err(bad(format!(
                "`mlp_multipliers` needs 2 values and `ssm_multipliers` 5, got {} and {}",
                self.mlp_multipliers.len(),
                self.ssm_multipliers.len()
            )));
        }
        Ok(())
    }

    fn mamba_dims(&self) -> Mamba2Dims {
        Mamba2Dims {
            hidden_size: self.hidden_size,
            num_heads: self.mamba_n_heads,
            head_dim: self.mamba_d_head,
            n_groups: self.mamba_n_groups,
            state_size: self.mamba_d_state,
            conv_kernel: self.mamba_d_conv,
            use_conv_bias: self.mamba_conv_bias,
            proj_bias: self.mamba_proj_bias,
            out_bias: self.projectors_bias,
            eps: self.rms_norm_eps as f32,
            time_step_limit: (0.0, f32::INFINITY),
            norm: match (self.mamba_rms_norm, self.mamba_norm_before_gate) {
                (false, _) => GatedNorm::GateOnly,
                (true, false) => GatedNorm::Plain,
                (true, true) => GatedNorm::NormThenGate,
            },
            cast_d: false,
        }
    }

    /// `compute_mup_vector`: each of the five `ssm_multipliers` over its slice of `in_proj`'s
    /// rows, float32.
    fn mup_vector(&self) -> Result<Array> {
        let gs = self.mamba_n_groups * self.mamba_d_state;
        let sizes = [
            self.mamba_d_ssm,
            self.mamba_d_ssm,
            gs,
            gs,
            self.mamba_n_heads,
        ];
        let parts = sizes
            .iter()
            .zip(&self.ssm_multipliers)
            .map(|(s, m)| {
                Ok(ops::broadcast_to(
                    &Array::from_f32(*m as f32, Dtype::Float32)?,
                    &[*s],
                    None,
                )?)
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Array> = parts.iter().collect();
        Ok(ops::concatenate(&refs, 0, None)?)
    }
}

/// `sanitize`: for HF checkpoints (conv weights `(C, 1, K)`), the muP multipliers folded into
/// the weights and the conv weights transposed to `(C, K, 1)`.
fn sanitize(a: &ModelArgs, w: &mut Weights) -> Result<()> {
    let Some(c1d) = w.shape_of("model.layers.0.mamba.conv1d.weight") else {
        return Err(ModelError::Weights(vec![
            "model.layers.0.mamba.conv1d.weight: missing (falcon_h1's sanitize reads it)".into(),
        ]));
    };
    if c1d.len() != 3 || c1d[2] <= c1d[1] {
        return Ok(());
    }
    let mup = a.mup_vector()?;
    for name in w.names() {
        let Some(param) = w.remove(&name) else {
            continue;
        };
        let scaled = |m: f64| -> Result<Array> { Ok((&param * (m as f32))?) };
        let param = if name.ends_with("embed_tokens.weight") {
            scaled(a.embedding_multiplier)?
        } else if name.ends_with("lm_head.weight") {
            scaled(a.lm_head_multiplier)?
        } else if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
            scaled(a.attention_in_multiplier)?
        } else if name.ends_with("key_proj.weight") {
            scaled(a.attention_in_multiplier * a.key_multiplier)?
        } else if name.ends_with("o_proj.weight") {
            scaled(a.attention_out_multiplier)?
        } else if name.ends_with("out_proj.weight") {
            scaled(a.ssm_out_multiplier)?
        } else if name.ends_with("gate_proj.weight") {
            scaled(a.mlp_multipliers[0])?
        } else if name.ends_with("down_proj.weight") {
            scaled(a.mlp_multipliers[1])?
        } else if name.ends_with("in_proj.weight") {
            let m = mup.astype(param.dtype())?.expand_dims(&[1])?;
            let m = ops::scalar_multiply(a.ssm_in_multiplier as f32, &m, None)?;
            (&param * &m)?
        } else if name.contains("conv1d.weight") {
            param.transpose(&[0, 2, 1])?
        } else {
            param
        };
        w.insert(name, param);
    }
    Ok(())
}

/// `FalconH1Attention` ([`kit::Attention`]): rope, scale `head_dim ** -0.5`.
fn attention(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<Attention> {
    let (h, d, kv, hd) = (
        a.num_attention_heads,
        a.hidden_size,
        a.num_key_value_heads,
        a.head_dim,
    );
    let attn = Attention::load(w, p, (d, h, kv, hd), a.attention_bias, kit::head_scale(hd))?;
    Ok(attn.with_rope(Some(Rope::initialize(
        hd,
        a.rope_theta,
        a.rope_traditional,
        a.rope_scaling.as_ref(),
        Some(a.max_position_embeddings),
    )?)))
}

#[derive(Clone)]
struct Layer {
    mamba: Box<Mamba2Mixer>,
    self_attn: Attention,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    input_layernorm: RmsNorm,
    pre_ff_layernorm: RmsNorm,
}

/// The Falcon-H1 model.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    final_layernorm: RmsNorm,
    lm_head: Option<Linear>,
    /// `lm_head_multiplier / embedding_multiplier` (tied head only).
    tied_scale: f32,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = config.args()?;
        a.check()?;
        sanitize(&a, w)?;
        let d = a.hidden_size;
        let eps = a.rms_norm_eps as f32;
        let embed_tokens = Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?;
        let mut layers = Vec::with_capacity(a.num_hidden_layers as usize);
        for i in 0..a.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let f = |n: &str| format!("{p}.feed_forward.{n}");
            let h = a.intermediate_size;
            layers.push(Layer {
                gate_proj: Linear::load(w, &f("gate_proj"), d, h, a.mlp_bias)?,
                up_proj: Linear::load(w, &f("up_proj"), d, h, a.mlp_bias)?,
                down_proj: Linear::load(w, &f("down_proj"), h, d, a.mlp_bias)?,
                mamba: Box::new(Mamba2Mixer::load(
                    &a.mamba_dims(),
                    w,
                    &format!("{p}.mamba"),
                )?),
                self_attn: attention(&a, w, &format!("{p}.self_attn"))?,
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
            tied_scale: (a.lm_head_multiplier / a.embedding_multiplier) as f32,
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (h, n) = kit::embed_inputs(inputs, &self.embed_tokens)?;
        let mut caches = caches;
        let (attn_mask, ssm_mask) = match caches.as_deref_mut() {
            Some(c) => {
                kit::check_caches(Some(&*c), self.layers.len(), "layers")?;
                match kit::split_recurrent_cache(c.first_mut(), 0)? {
                    (Some(s), Some(a)) => (
                        a.make_mask(n, None, false)?,
                        s.make_mask(n, None, false)?.as_array().cloned(),
                    ),
                    _ => (mlx_cache::mask::fallback_mask(n, None, false)?, None),
                }
            }
            None => (mlx_cache::mask::fallback_mask(n, None, false)?, None),
        };
        let h = layer_loop(&self.layers, h, caches, |i, layer, h, cache| {
            let (ssm_cache, attn_cache) = kit::split_recurrent_cache(cache, i)?;
            let x = layer.input_layernorm.forward(h)?;
            let mamba_h = layer.mamba.forward(&x, ssm_mask.as_ref(), ssm_cache)?;
            let attn_h = layer.self_attn.forward(&x, &attn_mask, attn_cache)?;
            let h = (&(h + &mamba_h)? + &attn_h)?;
            let y = layer.pre_ff_layernorm.forward(&h)?;
            let y = layer.down_proj.forward(&swiglu(
                &layer.gate_proj.forward(&y)?,
                &layer.up_proj.forward(&y)?,
            )?)?;
            Ok((&h + &y)?)
        })?;
        self.final_layernorm.forward(&h)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(l) => l.forward(h),
            None => Ok((&self.embed_tokens.as_linear(h)? * self.tied_scale)?),
        }
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!();

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(match &self.lm_head {
            Some(l) => crate::models::OutputHead::Linear(l.clone()),
            None => crate::models::OutputHead::Shaped {
                inner: Box::new(crate::models::OutputHead::Tied(self.embed_tokens.clone())),
                pre_div: None,
                post: vec![crate::models::LogitTransform::Mul(self.tied_scale)],
            },
        })
    }

    kit::layer_caches! {
        fn make_cache(&self) {
            self.layers
                .iter()
                .map(|_| {
                    Box::new(CacheList::new(vec![
                        Box::new(ArraysCache::new(2)),
                        Box::new(KVCache::new()),
                    ])) as Box<dyn Cache>
                })
                .collect()
        }
    }

    kit::own_type_and_vocab!();
}
