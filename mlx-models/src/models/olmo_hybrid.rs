//! mlx-lm 0.32.2 `models/olmo_hybrid.py`: Gated DeltaNet layers (separate q/k/v causal
//! convolutions, optional negative eigenvalues: `beta` in [0, 2]) interleaved with OLMo-style
//! attention layers (q/k norms over the whole projection, norms after attention and MLP). The
//! DeltaNet layers hold an [`ArraysCache`] of four slots (three conv states, the recurrent
//! state), attention layers a [`KVCache`].

use mlx_cache::{ArraysCache, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::gated_delta::{compute_g, gated_delta_ops, normalize_qk, RmsNormGated};
use crate::layers::ssm::{arrays_cache, store_recurrent, DepthwiseConv};
use crate::layers::{silu, Embedding, Linear, RmsNorm, Rope};
use crate::models::checkpoint::layer_loop;
use crate::models::kit::{self, Attention};
use crate::models::mamba::{conv_kernel_ok, positive};
use crate::models::LanguageModel;
use crate::weights::Weights;

serde_defaults! {
    default_ln_eps: f64 = 1e-5;
    default_rope_theta: Option<f64> = Some(10000.0);
}

/// olmo_hybrid.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    num_key_value_heads: Option<i32>,
    rms_norm_eps: f64,
    vocab_size: i32,
    max_position_embeddings: i64,
    linear_num_key_heads: i32,
    linear_num_value_heads: i32,
    linear_key_head_dim: i32,
    linear_value_head_dim: i32,
    linear_conv_kernel_dim: i32,
    linear_allow_neg_eigval: bool,
    tie_word_embeddings: bool,
    attention_bias: bool,
    #[serde(default = "default_ln_eps")]
    layer_norm_epsilon: f64,
    #[serde(default)]
    head_dim: Option<i32>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    rope_parameters: Option<Value>,
    #[serde(default = "default_rope_theta")]
    rope_theta: Option<f64>,
}

fn bad(m: String) -> ModelError {
    ModelError::Config(format!("olmo_hybrid: {m}"))
}

impl ModelArgs {
    /// `__post_init__` and the checks that keep MLX from seeing bad shapes; returns whether
    /// each layer is full attention.
    fn post_init(&mut self) -> Result<Vec<bool>> {
        if self.num_key_value_heads.is_none() {
            self.num_key_value_heads = Some(self.num_attention_heads);
        }
        if self.head_dim.is_none() && self.num_attention_heads > 0 {
            self.head_dim = Some(self.hidden_size / self.num_attention_heads);
        }
        if let Some(p) = &self.rope_parameters {
            self.rope_theta = Some(
                p.get("rope_theta")
                    .and_then(Value::as_f64)
                    .unwrap_or(10000.0),
            );
        }
        positive(
            "olmo_hybrid",
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads.unwrap_or(0)),
                ("head_dim", self.head_dim.unwrap_or(0)),
                ("linear_num_key_heads", self.linear_num_key_heads),
                ("linear_num_value_heads", self.linear_num_value_heads),
                ("linear_key_head_dim", self.linear_key_head_dim),
                ("linear_value_head_dim", self.linear_value_head_dim),
            ],
        )?;
        conv_kernel_ok("olmo_hybrid", self.linear_conv_kernel_dim)?;
        if self.linear_num_value_heads % self.linear_num_key_heads != 0 {
            return Err(bad(format!(
                "`linear_num_value_heads` {} is not a multiple of `linear_num_key_heads` {}",
                self.linear_num_value_heads, self.linear_num_key_heads
            )));
        }
        if self.num_attention_heads % self.num_key_value_heads.unwrap_or(1) != 0 {
            return Err(bad(
                "`num_attention_heads` is not a multiple of `num_key_value_heads`".into(),
            ));
        }
        match &self.layer_types {
            Some(t) => t
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(true),
                    "linear_attention" => Ok(false),
                    other => Err(bad(format!("unknown layer type `{other}`"))),
                })
                .collect(),
            None => Ok((0..self.num_hidden_layers).map(|i| i % 4 == 3).collect()),
        }
    }
}

/// olmo_hybrid's `GatedDeltaNet`.
#[derive(Clone)]
struct GatedDeltaNet {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    a_proj: Linear,
    b_proj: Linear,
    g_proj: Linear,
    o_proj: Linear,
    convs: [DepthwiseConv; 3],
    a_log: Array,
    dt_bias: Array,
    o_norm: RmsNormGated,
    num_k_heads: i32,
    num_v_heads: i32,
    head_k_dim: i32,
    head_v_dim: i32,
    allow_neg_eigval: bool,
}

impl GatedDeltaNet {
    fn load(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<GatedDeltaNet> {
        let d = a.hidden_size;
        let kd = a.linear_key_head_dim * a.linear_num_key_heads;
        let vd = a.linear_value_head_dim * a.linear_num_value_heads;
        let hv = a.linear_num_value_heads;
        let k = a.linear_conv_kernel_dim;
        let mut l = |n: &str, i: i32, o: i32| Linear::load(w, &format!("{p}.{n}"), i, o, false);
        let (q_proj, k_proj, v_proj, a_proj, b_proj, g_proj, o_proj) = (
            l("q_proj", d, kd)?,
            l("k_proj", d, kd)?,
            l("v_proj", d, vd)?,
            l("a_proj", d, hv)?,
            l("b_proj", d, hv)?,
            l("g_proj", d, vd)?,
            l("o_proj", vd, d)?,
        );
        Ok(GatedDeltaNet {
            q_proj,
            k_proj,
            v_proj,
            a_proj,
            b_proj,
            g_proj,
            o_proj,
            convs: [
                DepthwiseConv::load(w, &format!("{p}.q_conv1d"), kd, k, false)?,
                DepthwiseConv::load(w, &format!("{p}.k_conv1d"), kd, k, false)?,
                DepthwiseConv::load(w, &format!("{p}.v_conv1d"), vd, k, false)?,
            ],
            a_log: w.take(&format!("{p}.A_log"), &[hv])?,
            dt_bias: w.take(&format!("{p}.dt_bias"), &[hv])?,
            o_norm: RmsNormGated::load(
                w,
                &format!("{p}.o_norm"),
                a.linear_value_head_dim,
                a.layer_norm_epsilon as f32,
            )?,
            num_k_heads: a.linear_num_key_heads,
            num_v_heads: hv,
            head_k_dim: a.linear_key_head_dim,
            head_v_dim: a.linear_value_head_dim,
            allow_neg_eigval: a.linear_allow_neg_eigval,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let sh = x.shape();
        let (b, s) = (sh[0], sh[1]);
        let projected = [
            self.q_proj.forward(x)?,
            self.k_proj.forward(x)?,
            self.v_proj.forward(x)?,
        ];
        let mut padded = Vec::with_capacity(3);
        let mut conv_out = Vec::with_capacity(3);
        for (slot, (conv, y)) in self.convs.iter().zip(&projected).enumerate() {
            let state = cache.as_ref().and_then(|c| c.get(slot));
            // `_apply_conv1d` pads with zeros whether or not a cache is given.
            let p = conv.padded(y, state, true)?;
            conv_out.push(silu(&conv.forward(&p)?)?);
            padded.push(p);
        }
        let q = conv_out[0].reshape(&[b, s, self.num_k_heads, self.head_k_dim])?;
        let k = conv_out[1].reshape(&[b, s, self.num_k_heads, self.head_k_dim])?;
        let v = conv_out[2].reshape(&[b, s, self.num_v_heads, self.head_v_dim])?;
        let (q, k) = normalize_qk(&q, &k, f64::from(self.head_k_dim).powf(-0.5), 1e-6)?;
        let state = cache.as_ref().and_then(|c| c.get(3)).cloned();
        let mut beta = ops::sigmoid(&self.b_proj.forward(x)?, None)?;
        if self.allow_neg_eigval {
            beta = (&beta * 2.0f32)?;
        }
        let g = compute_g(&self.a_log, &self.a_proj.forward(x)?, &self.dt_bias)?;
        let keep = cache.as_ref().is_some_and(|c| c.keeps_history());
        let (out, state, states) =
            gated_delta_ops(&q, &k, &v, &g, &beta, state.as_ref(), mask, keep)?;
        if let Some(c) = cache {
            let pairs: Vec<_> = self.convs.iter().zip(&padded).collect();
            store_recurrent(c, &pairs, s, keep.then_some(states), Some(state), false)?;
        }
        let gate = self.g_proj.forward(x)?.reshape(&[-1, self.head_v_dim])?;
        let out = out.reshape(&[-1, self.head_v_dim])?;
        let out = self.o_norm.forward(&out, Some(&gate))?;
        self.o_proj.forward(&out.reshape(&[b, s, -1])?)
    }
}

/// olmo_hybrid's `Attention` ([`kit::Attention`]): the query and key projections normed
/// whole, rope when `rope_theta` is given, scale `head_dim ** -0.5`.
fn attention(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<Attention> {
    let (h, kv, hd, d) = (
        a.num_attention_heads,
        a.num_key_value_heads.unwrap_or(a.num_attention_heads),
        a.head_dim.unwrap_or(1),
        a.hidden_size,
    );
    let eps = a.rms_norm_eps as f32;
    let attn = Attention::load(w, p, (d, h, kv, hd), a.attention_bias, kit::head_scale(hd))?
        .with_projection_norms(w, p, eps)?;
    Ok(attn.with_rope(match a.rope_theta {
        Some(t) => Some(Rope::initialize(
            hd,
            t,
            false,
            None,
            Some(a.max_position_embeddings),
        )?),
        None => None,
    }))
}

#[derive(Clone)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// `down(silu(gate(x)) * up(x))`: `nn.silu`, then a plain product.
    fn forward(&self, x: &Array) -> Result<Array> {
        let h = (&silu(&self.gate_proj.forward(x)?)? * &self.up_proj.forward(x)?)?;
        self.down_proj.forward(&h)
    }
}

#[derive(Clone)]
enum Layer {
    Linear {
        linear_attn: Box<GatedDeltaNet>,
        mlp: Mlp,
        input_layernorm: RmsNorm,
        post_attention_layernorm: RmsNorm,
    },
    Full {
        self_attn: Box<Attention>,
        mlp: Mlp,
        post_attention_layernorm: RmsNorm,
        post_feedforward_layernorm: RmsNorm,
    },
}

/// The OLMo hybrid model.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    fa_idx: Option<usize>,
    lin_idx: Option<usize>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let mut a: ModelArgs = config.args()?;
        let full = a.post_init()?;
        // sanitize
        if a.tie_word_embeddings {
            w.discard("lm_head.weight");
        }
        crate::models::mamba::sanitize(w)?;
        let d = a.hidden_size;
        let eps = a.rms_norm_eps as f32;
        let embed_tokens = Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?;
        let mut layers = Vec::with_capacity(full.len());
        for (i, is_full) in full.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let m = |n: &str| format!("{p}.mlp.{n}");
            let h = a.intermediate_size;
            let mlp = Mlp {
                gate_proj: Linear::load(w, &m("gate_proj"), d, h, false)?,
                up_proj: Linear::load(w, &m("up_proj"), d, h, false)?,
                down_proj: Linear::load(w, &m("down_proj"), h, d, false)?,
            };
            let norm = |w: &mut Weights, n: &str| RmsNorm::load(w, &format!("{p}.{n}"), d, eps);
            layers.push(if *is_full {
                Layer::Full {
                    self_attn: Box::new(attention(&a, w, &format!("{p}.self_attn"))?),
                    mlp,
                    post_attention_layernorm: norm(w, "post_attention_layernorm")?,
                    post_feedforward_layernorm: norm(w, "post_feedforward_layernorm")?,
                }
            } else {
                Layer::Linear {
                    linear_attn: Box::new(GatedDeltaNet::load(&a, w, &format!("{p}.linear_attn"))?),
                    mlp,
                    input_layernorm: norm(w, "input_layernorm")?,
                    post_attention_layernorm: norm(w, "post_attention_layernorm")?,
                }
            });
        }
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = crate::models::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        Ok(Model {
            model_type: a.model_type,
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            norm,
            lm_head,
            fa_idx: full.iter().position(|f| *f),
            lin_idx: full.iter().position(|f| !*f),
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let (h, n) = kit::embed_inputs(inputs, &self.embed_tokens)?;
        let (fa_mask, ssm_mask) = kit::hybrid_masks(
            caches.as_deref(),
            self.layers.len(),
            self.fa_idx,
            self.lin_idx,
            n,
        )?;
        let h = layer_loop(&self.layers, h, caches, |i, layer, h, cache| {
            Ok(match layer {
                Layer::Linear {
                    linear_attn,
                    mlp,
                    input_layernorm,
                    post_attention_layernorm,
                } => {
                    let r = linear_attn.forward(
                        &input_layernorm.forward(h)?,
                        ssm_mask.as_ref(),
                        arrays_cache(cache, i)?,
                    )?;
                    let h = (h + &r)?;
                    (&h + &mlp.forward(&post_attention_layernorm.forward(&h)?)?)?
                }
                Layer::Full {
                    self_attn,
                    mlp,
                    post_attention_layernorm,
                    post_feedforward_layernorm,
                } => {
                    let r = post_attention_layernorm
                        .forward(&self_attn.forward(h, &fa_mask, cache)?)?;
                    let h = (h + &r)?;
                    (&h + &post_feedforward_layernorm.forward(&mlp.forward(&h)?)?)?
                }
            })
        })?;
        self.norm.forward(&h)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!(tied lm_head, embed_tokens);

    kit::layer_caches! {
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers.iter().map(|l| matches!(l, Layer::Full { .. })),
                4,
            )
        }
    }

    kit::own_type_and_vocab!();
}
