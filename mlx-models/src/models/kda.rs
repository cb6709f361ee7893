//! mlx-lm 0.32.2 `models/kimi_linear.py` and `models/bailing_moe_v3.py`: Kimi Delta Attention
//! (KDA) layers between multi-head latent attention (MLA) layers, with DeepSeek-style grouped
//! expert routing.
//!
//! A KDA layer projects q, k and v, runs each through its own depthwise causal convolution and
//! `silu`, and feeds the gated delta rule (`gated_delta_ops`, the plain-ops path mlx-lm takes
//! off Apple GPUs) with a per-channel forget gate (`g` of shape `(B, T, H, Dk)`): kimi_linear's
//! from a low-rank `f_a_proj` / `f_b_proj` through `compute_g`, bailing_moe_v3's from `f_proj`
//! through the lower-bounded `compute_lower_bound_g`. Its output is RMS-normed per head and
//! gated by `sigmoid(g(x))`. It holds an [`ArraysCache`] of four slots (three conv states, the
//! recurrent state); MLA layers a `KVCache` of the latent and the rope keys
//! ([`MlaAttention`]): kimi_linear's without rope (`mla_use_nope`), bailing_moe_v3's with an
//! interleaved rope and a sigmoid gate per head before its `dense` output projection.

use mlx_cache::{ArraysCache, AttentionMask, Cache};
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::activations::{compiled, one, situ};
use crate::layers::gated_delta::{compute_g, gated_delta_ops, normalize_qk};
use crate::layers::mla::{MlaAttention, MlaSpec};
use crate::layers::ssm::{arrays_cache, store_recurrent, DepthwiseConv};
use crate::layers::{
    silu, Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope, SwitchActivation, SwitchGlu,
};
use crate::models::checkpoint::layer_loop;
use crate::models::moe_block::{self, GroupSelect};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    default_one: i32 = 1;
    default_four: i32 = 4;
    default_true: bool = true;
    default_sigmoid: String = "sigmoid".into();
    default_scaling: f64 = 1.0;
    b3_vocab: i32 = 157184;
    b3_hidden: i32 = 1536;
    b3_intermediate: i32 = 4608;
    b3_moe_intermediate: i32 = 512;
    b3_layers: i32 = 24;
    b3_heads: i32 = 16;
    b3_experts: i32 = 128;
    b3_top_k: i32 = 8;
    b3_n_group: i32 = 8;
    b3_topk_group: i32 = 4;
    b3_scaling: f64 = 2.5;
    b3_head_dim: i32 = 128;
    b3_q_lora: Option<i32> = Some(256);
    b3_kv_lora: i32 = 512;
    b3_rope_dim: i32 = 64;
    b3_lower_bound: f64 = -5.0;
    b3_eps: f64 = 1e-6;
    b3_rope_theta: f64 = 6000000.0;
    b3_max_pos: i64 = 131072;
}

/// kimi_linear.py's `linear_attn_config`.
#[derive(Clone, Debug, Deserialize)]
struct LinearAttnConfig {
    num_heads: i32,
    head_dim: i32,
    /// 1-based indices of the KDA layers.
    kda_layers: Vec<i32>,
    #[serde(default = "default_four")]
    short_conv_kernel_size: i32,
}

/// kimi_linear.py `ModelArgs` (the fields the text model reads).
#[derive(Clone, Debug, Deserialize)]
struct KimiArgs {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    intermediate_size: i32,
    head_dim: i32,
    rms_norm_eps: f64,
    linear_attn_config: LinearAttnConfig,
    num_experts: i32,
    moe_intermediate_size: i32,
    kv_lora_rank: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    qk_nope_head_dim: Option<i32>,
    #[serde(default)]
    qk_rope_head_dim: Option<i32>,
    #[serde(default)]
    v_head_dim: Option<i32>,
    #[serde(default = "default_one")]
    num_experts_per_token: i32,
    #[serde(default)]
    num_shared_experts: i32,
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
}

/// bailing_moe_v3.py `ModelArgs` (every field has a default there).
#[derive(Clone, Debug, Deserialize)]
struct BailingArgs {
    model_type: String,
    #[serde(default = "b3_vocab")]
    vocab_size: i32,
    #[serde(default = "b3_hidden")]
    hidden_size: i32,
    #[serde(default = "b3_intermediate")]
    intermediate_size: i32,
    #[serde(default = "b3_moe_intermediate")]
    moe_intermediate_size: i32,
    #[serde(default = "b3_moe_intermediate")]
    moe_shared_expert_intermediate_size: i32,
    #[serde(default = "b3_layers")]
    num_hidden_layers: i32,
    #[serde(default = "b3_heads")]
    num_attention_heads: i32,
    #[serde(default = "b3_experts")]
    num_experts: i32,
    #[serde(default = "b3_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "default_one")]
    num_shared_experts: i32,
    #[serde(default = "default_one")]
    first_k_dense_replace: i32,
    #[serde(default = "b3_n_group")]
    n_group: i32,
    #[serde(default = "b3_topk_group")]
    topk_group: i32,
    #[serde(default = "b3_scaling")]
    routed_scaling_factor: f64,
    #[serde(default = "default_four")]
    layer_group_size: i32,
    #[serde(default = "b3_head_dim")]
    head_dim: i32,
    #[serde(default = "b3_q_lora")]
    q_lora_rank: Option<i32>,
    #[serde(default = "b3_kv_lora")]
    kv_lora_rank: i32,
    #[serde(default = "b3_head_dim")]
    qk_nope_head_dim: i32,
    #[serde(default = "b3_rope_dim")]
    qk_rope_head_dim: i32,
    #[serde(default = "b3_head_dim")]
    v_head_dim: i32,
    #[serde(default = "default_four")]
    short_conv_kernel_size: i32,
    #[serde(default = "b3_lower_bound")]
    kda_lower_bound: f64,
    #[serde(default = "default_true")]
    kda_safe_gate: bool,
    #[serde(default = "default_true")]
    no_kda_lora: bool,
    #[serde(default = "b3_eps")]
    rms_norm_eps: f64,
    #[serde(default = "b3_rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_scaling: Option<Map<String, Value>>,
    #[serde(default = "b3_max_pos")]
    max_position_embeddings: i64,
    #[serde(default = "default_true")]
    rope_interleave: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
}

fn config_error(model_type: &str, m: String) -> ModelError {
    ModelError::Config(format!("config.json (`{model_type}`): {m}"))
}

/// rope_utils.py's `apply_yarn_mscale`: the yarn `mscale_all_dim` squared folded into the
/// attention scale (Python floats, so in f64).
pub(crate) fn apply_yarn_mscale(scale: f64, cfg: Option<&Map<String, Value>>) -> f64 {
    let Some(cfg) = cfg.filter(|c| !c.is_empty()) else {
        return scale;
    };
    let rope_type = cfg
        .get("type")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| cfg.get("rope_type").and_then(Value::as_str))
        .unwrap_or("default");
    let mscale_all_dim = cfg
        .get("mscale_all_dim")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let factor = cfg.get("factor").and_then(Value::as_f64).unwrap_or(1.0);
    if rope_type == "default" || mscale_all_dim == 0.0 || factor <= 1.0 {
        return scale;
    }
    let s = 0.1 * mscale_all_dim * factor.ln() + 1.0;
    scale * s * s
}

/// gated_delta.py's `compute_lower_bound_g`: `exp(lower_bound * sigmoid(exp(A_log) * (a +
/// dt_bias)))` in float32, compiled shapeless as mlx-lm compiles it (the Python float bound a
/// float32 input of the trace here, the same weak product).
fn compute_lower_bound_g(
    a_log: &Array,
    a: &Array,
    dt_bias: &Array,
    lower_bound: f32,
) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let (a_log, a, dt_bias, bound) = (&xs[0], &xs[1], &xs[2], &xs[3]);
        let decay = ops::exp(&a_log.astype(Dtype::Float32)?, None)?;
        let inner = (&decay * &(&a.astype(Dtype::Float32)? + dt_bias)?)?;
        let gate = (bound * &ops::sigmoid(&inner, None)?)?;
        Ok(vec![ops::exp(&gate, None)?])
    })?;
    Ok(one(
        f.call(&[
            a_log.clone(),
            a.clone(),
            dt_bias.clone(),
            Array::from_f32(lower_bound, Dtype::Float32)?,
        ])?,
        "compute_lower_bound_g",
    )?)
}

/// How a KDA layer computes its forget gate and its output gate.
#[derive(Clone)]
enum Gates {
    /// kimi_linear and kimi_k3: `f_b_proj(f_a_proj(x))` through `compute_g`, or through
    /// `compute_lower_bound_g` when a bound is given (kimi_k3's `gate_lower_bound`); the output
    /// gate [`OutGate`], and `o_norm(out) * sigmoid(gate)` in the activations' dtype.
    LowRank {
        f_a: Linear,
        f_b: Linear,
        out: OutGate,
        lower_bound: Option<f32>,
    },
    /// bailing_moe_v3: `f_proj(x)` through `compute_lower_bound_g`, `b_proj(x)` in float32;
    /// `g_proj(x)`, and `o_norm(out) * sigmoid(gate.astype(float32)).astype(out.dtype)`.
    Full {
        f: Linear,
        g: Linear,
        lower_bound: f32,
    },
}

/// The output gate's projection of a [`Gates::LowRank`] layer.
#[derive(Clone)]
enum OutGate {
    /// `g_b_proj(g_a_proj(x))`.
    LowRank { g_a: Linear, g_b: Linear },
    /// kimi_k3's `use_full_rank_gate`: `g_proj(x)`.
    Full(Linear),
}

impl OutGate {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            OutGate::LowRank { g_a, g_b } => g_b.forward(&g_a.forward(x)?),
            OutGate::Full(g) => g.forward(x),
        }
    }
}

/// A KDA layer's q/k/v projections and their short convolutions.
#[derive(Clone)]
enum Inputs {
    /// kimi_linear, bailing_moe_v3: three projections, each through its own convolution;
    /// cache slots 0-2 the conv states, 3 the recurrent state.
    Separate {
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
        convs: [DepthwiseConv; 3],
    },
    /// kimi_k3: one `qkv_proj` through one `qkv_conv` over the three, split after the `silu`;
    /// cache slot 0 the conv state, 1 the recurrent state.
    Fused {
        qkv_proj: Linear,
        conv: DepthwiseConv,
    },
}

impl Inputs {
    fn convs(&self) -> Vec<&DepthwiseConv> {
        match self {
            Inputs::Separate { convs, .. } => convs.iter().collect(),
            Inputs::Fused { conv, .. } => vec![conv],
        }
    }

    fn projections(&self, x: &Array) -> Result<Vec<Array>> {
        Ok(match self {
            Inputs::Separate {
                q_proj,
                k_proj,
                v_proj,
                ..
            } => vec![q_proj.forward(x)?, k_proj.forward(x)?, v_proj.forward(x)?],
            Inputs::Fused { qkv_proj, .. } => vec![qkv_proj.forward(x)?],
        })
    }
}

/// kimi_linear's `KimiDeltaAttention`, bailing_moe_v3's `BailingKDA`, kimi_k3's
/// `KimiK3DeltaAttention`.
#[derive(Clone)]
pub(super) struct Kda {
    inputs: Inputs,
    gates: Gates,
    b_proj: Linear,
    /// `(H, 1)`.
    a_log: Array,
    /// `(H, Dk)`.
    dt_bias: Array,
    o_norm: RmsNorm,
    o_proj: Linear,
    num_heads: i32,
    head_dim: i32,
}

/// How a KDA layer forms its forget and output gates.
#[derive(Clone, Copy)]
pub(super) enum GateKind {
    /// Low-rank forget gate, optionally lower-bounded; low-rank or (`full_out`) full-rank
    /// output gate.
    LowRank {
        lower_bound: Option<f32>,
        full_out: bool,
    },
    /// bailing_moe_v3's full-rank gates with their lower bound.
    Full(f32),
}

/// What a KDA layer is made of, and the names of its modules.
pub(super) struct KdaSpec<'a> {
    pub(super) hidden_size: i32,
    pub(super) num_heads: i32,
    pub(super) head_dim: i32,
    pub(super) kernel: i32,
    pub(super) eps: f32,
    /// The convolutions' module paths under the layer (`q_conv.conv`, `q_conv1d`, ...); one
    /// name (`qkv_conv.conv`) for kimi_k3's fused projection.
    pub(super) conv_names: &'a [&'a str],
    /// `A_log`'s stored shape.
    pub(super) a_log_shape: Vec<i32>,
    pub(super) gates: GateKind,
}

impl Kda {
    pub(super) fn load(s: &KdaSpec<'_>, w: &mut Weights, p: &str) -> Result<Kda> {
        let d = s.hidden_size;
        let proj = s.num_heads * s.head_dim;
        let l = |w: &mut Weights, n: &str, i: i32, o: i32| {
            Linear::load(w, &format!("{p}.{n}"), i, o, false)
        };
        let conv = |w: &mut Weights, n: &str, channels: i32| {
            DepthwiseConv::load(w, &format!("{p}.{n}"), channels, s.kernel, false)
        };
        // The modules in the order the ports always loaded them: projections, gates, b_proj,
        // o_proj, then the convolutions.
        let fused = match s.conv_names {
            [_] => true,
            [_, _, _] => false,
            names => {
                return Err(ModelError::Internal {
                    what: "KDA layer".into(),
                    problem: format!("{} convolution names, not 1 or 3", names.len()),
                })
            }
        };
        let projections = if fused {
            vec![l(w, "qkv_proj", d, 3 * proj)?]
        } else {
            vec![
                l(w, "q_proj", d, proj)?,
                l(w, "k_proj", d, proj)?,
                l(w, "v_proj", d, proj)?,
            ]
        };
        let gates = match s.gates {
            GateKind::LowRank {
                lower_bound,
                full_out,
            } => {
                let f_a = l(w, "f_a_proj", d, s.head_dim)?;
                let f_b = l(w, "f_b_proj", s.head_dim, proj)?;
                let out = if full_out {
                    OutGate::Full(l(w, "g_proj", d, proj)?)
                } else {
                    OutGate::LowRank {
                        g_a: l(w, "g_a_proj", d, s.head_dim)?,
                        g_b: l(w, "g_b_proj", s.head_dim, proj)?,
                    }
                };
                Gates::LowRank {
                    f_a,
                    f_b,
                    out,
                    lower_bound,
                }
            }
            GateKind::Full(lower_bound) => Gates::Full {
                f: l(w, "f_proj", d, proj)?,
                g: l(w, "g_proj", d, proj)?,
                lower_bound,
            },
        };
        let b_proj = l(w, "b_proj", d, s.num_heads)?;
        let o_proj = l(w, "o_proj", proj, d)?;
        let inputs = match (fused, projections.as_slice()) {
            (true, [qkv_proj]) => Inputs::Fused {
                qkv_proj: qkv_proj.clone(),
                conv: conv(w, s.conv_names[0], 3 * proj)?,
            },
            (false, [q_proj, k_proj, v_proj]) => Inputs::Separate {
                q_proj: q_proj.clone(),
                k_proj: k_proj.clone(),
                v_proj: v_proj.clone(),
                convs: [
                    conv(w, s.conv_names[0], proj)?,
                    conv(w, s.conv_names[1], proj)?,
                    conv(w, s.conv_names[2], proj)?,
                ],
            },
            _ => {
                return Err(ModelError::Internal {
                    what: "KDA layer".into(),
                    problem: "projections and convolutions do not pair up".into(),
                })
            }
        };
        // A missing tensor comes back as a placeholder the final weights check reports; only
        // a tensor of the right size is reshaped.
        let as_shape = |t: Array, shape: &[i32]| -> Result<Array> {
            if t.size() as i64 == shape.iter().map(|&d| i64::from(d)).product::<i64>() {
                Ok(t.reshape(shape)?)
            } else {
                Ok(t)
            }
        };
        let a_log = as_shape(
            w.take(&format!("{p}.A_log"), &s.a_log_shape)?,
            &[s.num_heads, 1],
        )?;
        let dt_bias = as_shape(
            w.take(&format!("{p}.dt_bias"), &[proj])?,
            &[s.num_heads, s.head_dim],
        )?;
        Ok(Kda {
            inputs,
            gates,
            b_proj,
            a_log,
            dt_bias,
            o_norm: RmsNorm::load(w, &format!("{p}.o_norm"), s.head_dim, s.eps)?,
            o_proj,
            num_heads: s.num_heads,
            head_dim: s.head_dim,
        })
    }

    /// The layer's heads (this rank's, once sharded).
    pub(super) fn num_heads(&self) -> i32 {
        self.num_heads
    }

    /// Tensor parallelism as kimi_k3's `shard()` on a KDA layer: `qkv_proj` all-to-sharded
    /// by its q | k | v thirds and the convolution's channels alike, `f_b_proj`, the output
    /// gate's last projection (`g_proj` or `g_b_proj`) and `b_proj` all-to-sharded, `o_proj`
    /// sharded-to-all, `A_log` and `dt_bias` by heads. Only the fused inputs of kimi_k3 (its
    /// mlx-lm class is the only KDA one with `shard()`).
    pub(super) fn shard_tensor_parallel(&mut self, n: i32, r: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, all_to_sharded_segments, sharded_to_all, split_rows};
        let p = |m: &str| format!("{path}.{m}");
        let bad = |problem: String| ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: path.to_string(),
            problem,
        };
        if n <= 0 || self.num_heads % n != 0 {
            return Err(bad(format!(
                "{} heads do not split over {n} ranks",
                self.num_heads
            )));
        }
        let Inputs::Fused { qkv_proj, conv } = &mut self.inputs else {
            return Err(bad(
                "separate q/k/v projections (kimi_linear, bailing_moe_v3) have no tensor \
                 parallelism in mlx-lm"
                    .into(),
            ));
        };
        let Gates::LowRank { f_b, out, .. } = &mut self.gates else {
            return Err(bad(
                "full-rank KDA gates have no tensor parallelism in mlx-lm".into(),
            ));
        };
        let proj = self.num_heads * self.head_dim;
        let seg = [proj, 2 * proj];
        all_to_sharded_segments(qkv_proj, &seg, n, r, &p("qkv_proj"))?;
        all_to_sharded(f_b, n, r, &p("f_b_proj"))?;
        match out {
            OutGate::Full(g) => all_to_sharded(g, n, r, &p("g_proj"))?,
            OutGate::LowRank { g_b, .. } => all_to_sharded(g_b, n, r, &p("g_b_proj"))?,
        }
        all_to_sharded(&mut self.b_proj, n, r, &p("b_proj"))?;
        sharded_to_all(&mut self.o_proj, n, r, &p("o_proj"))?;
        conv.weight = split_rows(&conv.weight, &seg, n, r, &p("qkv_conv.conv.weight"))?;
        self.a_log = split_rows(&self.a_log, &[], n, r, &p("A_log"))?;
        self.dt_bias = split_rows(&self.dt_bias, &[], n, r, &p("dt_bias"))?;
        self.num_heads /= n;
        Ok(())
    }

    pub(super) fn forward(
        &self,
        x: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let sh = x.shape();
        let (b, t) = (sh[0], sh[1]);
        let (h, dk) = (self.num_heads, self.head_dim);
        let projected = self.inputs.projections(x)?;
        let convs = self.inputs.convs();
        let mut padded = Vec::with_capacity(convs.len());
        let mut conv_out = Vec::with_capacity(convs.len());
        for (slot, (conv, y)) in convs.iter().zip(&projected).enumerate() {
            let y = match mask {
                Some(m) => ops::where_scalar(&m.expand_dims(&[-1])?, y, 0i32, None)?,
                None => y.clone(),
            };
            let state = cache.as_ref().and_then(|c| c.get(slot));
            // Without a cached state both start from `K - 1` zero steps.
            let p = conv.padded(&y, state, true)?;
            conv_out.push(silu(&conv.forward(&p)?)?);
            padded.push(p);
        }
        if let [qkv] = conv_out.as_slice() {
            let p = h * dk;
            conv_out = (0..3)
                .map(|i| Ok(qkv.slice_axis(-1, i * p, (i + 1) * p)?))
                .collect::<Result<Vec<_>>>()?;
        }
        let q = conv_out[0].reshape(&[b, t, h, dk])?;
        let k = conv_out[1].reshape(&[b, t, h, dk])?;
        let v = conv_out[2].reshape(&[b, t, h, dk])?;
        let (q, k) = normalize_qk(&q, &k, f64::from(dk).powf(-0.5), 1e-6)?;
        let (g, beta) = match &self.gates {
            Gates::LowRank {
                f_a,
                f_b,
                lower_bound,
                ..
            } => {
                let a = f_b.forward(&f_a.forward(x)?)?.reshape(&[b, t, h, dk])?;
                let beta = ops::sigmoid(&self.b_proj.forward(x)?.reshape(&[b, t, h])?, None)?;
                let g = match lower_bound {
                    None => compute_g(&self.a_log, &a, &self.dt_bias)?,
                    Some(lb) => compute_lower_bound_g(&self.a_log, &a, &self.dt_bias, *lb)?,
                };
                (g, beta)
            }
            Gates::Full { f, lower_bound, .. } => {
                let a = f.forward(x)?.reshape(&[b, t, h, dk])?;
                let beta = ops::sigmoid(&self.b_proj.forward(x)?.astype(Dtype::Float32)?, None)?;
                (
                    compute_lower_bound_g(&self.a_log, &a, &self.dt_bias, *lower_bound)?,
                    beta,
                )
            }
        };
        let state_slot = convs.len();
        let state = cache.as_ref().and_then(|c| c.get(state_slot)).cloned();
        let keep = cache.as_ref().is_some_and(|c| c.keeps_history());
        let (out, state, states) =
            gated_delta_ops(&q, &k, &v, &g, &beta, state.as_ref(), mask, keep)?;
        if let Some(c) = cache {
            let pairs: Vec<_> = convs.iter().copied().zip(&padded).collect();
            store_recurrent(c, &pairs, t, keep.then_some(states), Some(state), true)?;
        }
        let out = self.o_norm.forward(&out)?;
        let out = match &self.gates {
            Gates::LowRank { out: gate, .. } => {
                let gate = gate.forward(x)?.reshape(&[b, t, h, dk])?;
                (&out * &ops::sigmoid(&gate, None)?)?
            }
            Gates::Full { g, .. } => {
                let gate = g.forward(x)?.reshape(&[b, t, h, dk])?;
                let gate =
                    ops::sigmoid(&gate.astype(Dtype::Float32)?, None)?.astype(out.dtype())?;
                (&out * &gate)?
            }
        };
        self.o_proj.forward(&out.reshape(&[b, t, -1])?)
    }
}

/// The router of a MoE block: its projection, its learned bias, and the shared block's rule
/// ([`moe_block::Router::select`]).
#[derive(Clone)]
pub(super) struct Router {
    pub(super) gate: Gate,
    /// kimi_linear's `e_score_correction_bias`, bailing_moe_v3's `expert_bias`.
    pub(super) bias: Array,
    pub(super) top_k: i32,
    /// kimi_linear and kimi_k3: [`moe_block::Router::DeepseekGroup`] (the compiled
    /// `group_expert_select` with kimi's constants); bailing_moe_v3:
    /// [`moe_block::Router::BailingV3`].
    pub(super) rule: moe_block::Router,
}

/// A MoE router's projection.
#[derive(Clone)]
pub(super) enum Gate {
    /// kimi_linear: `gate`, an `nn.Linear`.
    Linear(Linear),
    /// bailing_moe_v3's `BailingGate`: float32 logits against a raw `weight`.
    Float32(Array),
}

impl Router {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = match &self.gate {
            Gate::Linear(gate) => gate.forward(x)?,
            Gate::Float32(weight) => {
                let w = weight.astype(Dtype::Float32)?;
                ops::matmul(
                    &x.astype(Dtype::Float32)?,
                    &ops::transpose(&w, &[1, 0], None)?,
                    None,
                )?
            }
        };
        let (inds, scores, _) = self.rule.select(&gates, self.top_k, Some(&self.bias), x)?;
        Ok((inds, scores))
    }
}

/// kimi_linear's `KimiSparseMoE`, bailing_moe_v3's `BailingSparseMoE`, kimi_k3's
/// `KimiK3SparseMoE`.
#[derive(Clone)]
pub(super) struct SparseMoe {
    pub(super) router: Router,
    pub(super) switch_mlp: SwitchGlu,
    /// kimi_k3's experts: SiTU with these constants (`beta`, `linear_beta`) through
    /// `forward_with`; otherwise the switch layer's own activation.
    pub(super) situ: Option<(f64, Option<f64>)>,
    /// kimi_k3's latent width: `routed_expert_down_proj`, the optional norm and
    /// `routed_expert_up_proj` around the routed experts.
    pub(super) latent: Option<(Linear, Option<RmsNorm>, Linear)>,
    pub(super) shared_experts: Option<DenseMlp>,
    /// bailing_moe_v3 casts the weighted sum back to the input's dtype.
    pub(super) cast_back: bool,
    /// kimi_k3's `sharding_group` after [`SparseMoe::shard_tensor_parallel`]: the routed sum
    /// and the shared experts' output are summed over the ranks in one `all_sum`.
    pub(super) sharded: bool,
}

impl SparseMoe {
    fn forward(&self, x: &Array) -> Result<Array> {
        let (inds, scores) = self.router.route(x)?;
        let y = match &self.latent {
            Some((down, _, _)) => down.forward(x)?,
            None => x.clone(),
        };
        let y = match self.situ {
            Some((beta, linear_beta)) => self
                .switch_mlp
                .forward_with(&y, &inds, |up, gate| Ok(situ(up, gate, beta, linear_beta)?))?,
            None => self.switch_mlp.forward(&y, &inds)?,
        };
        let mut out = ops::sum(
            &(&y * &ops::expand_dims(&scores, &[-1], None)?)?,
            &[-2],
            false,
            None,
        )?;
        if self.cast_back {
            out = out.astype(x.dtype())?;
        }
        let mut shared = match &self.shared_experts {
            Some(s) => Some(s.forward(x)?),
            None => None,
        };
        if self.sharded {
            match shared {
                Some(s) => {
                    let split = out.shape().last().copied().unwrap_or(0);
                    let both = ops::concatenate(&[&out, &s], -1, None)?;
                    let both = mlx_core::distributed::all_sum(&both, None, None)?;
                    let width = both.shape().last().copied().unwrap_or(0);
                    out = both.slice_axis(-1, 0, split)?;
                    shared = Some(both.slice_axis(-1, split, width)?);
                }
                None => out = mlx_core::distributed::all_sum(&out, None, None)?,
            }
        }
        if let Some((_, norm, up)) = &self.latent {
            if let Some(n) = norm {
                out = n.forward(&out)?;
            }
            out = up.forward(&out)?;
        }
        match shared {
            Some(s) => Ok((&out + &s)?),
            None => Ok(out),
        }
    }
}

impl SparseMoe {
    /// Tensor parallelism as kimi_k3's `shard()` on its MoE blocks: the routed experts' and
    /// the shared experts' projections split in place (gate and up by rows, down by columns,
    /// no sum inside), the router and the latent projections whole, and the block's sums
    /// taken together ([`SparseMoe::sharded`]).
    pub(super) fn shard_tensor_parallel(&mut self, n: i32, r: i32, path: &str) -> Result<()> {
        use crate::shard::switch_inplace;
        let sm = &mut self.switch_mlp;
        let p = |m: &str| format!("{path}.switch_mlp.{m}");
        switch_inplace(&mut sm.gate_proj, true, n, r, &p("gate_proj"))?;
        switch_inplace(&mut sm.up_proj, true, n, r, &p("up_proj"))?;
        switch_inplace(&mut sm.down_proj, false, n, r, &p("down_proj"))?;
        if let Some(shared) = &mut self.shared_experts {
            shared.shard_tensor_parallel(n, r, &format!("{path}.shared_experts"), true)?;
        }
        self.sharded = true;
        Ok(())
    }
}

/// A dense MLP (a layer's, or a MoE block's shared experts).
#[derive(Clone)]
pub(super) enum DenseMlp {
    /// kimi_linear, bailing_moe_v3: `down_proj(silu(gate_proj(x)) * up_proj(x))`.
    SwiGlu(Mlp),
    /// kimi_k3's `KimiK3MLP`: `down_proj(situ(up_proj(x), gate_proj(x)))`.
    Situ(SituMlp),
}

impl DenseMlp {
    /// The SwiGLU MLP at `path`: `gate_proj`, `up_proj`, `down_proj`, no biases.
    pub(super) fn swiglu(w: &mut Weights, path: &str, d: i32, h: i32) -> Result<DenseMlp> {
        Ok(DenseMlp::SwiGlu(Mlp::load(
            w,
            path,
            &MlpNames::LLAMA,
            d,
            h,
            false,
            false,
            MlpKind::SwiGlu,
        )?))
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            DenseMlp::SwiGlu(m) => m.forward(x),
            DenseMlp::Situ(m) => m.forward(x),
        }
    }

    /// Tensor parallelism as kimi_k3's `shard()`: gate and up all-to-sharded, down
    /// sharded-to-all — summed inside (`shard_linear`, a layer's MLP) or, `in_place`, left to
    /// the enclosing MoE block's sum (`shard_inplace`, its shared experts).
    pub(super) fn shard_tensor_parallel(
        &mut self,
        n: i32,
        r: i32,
        path: &str,
        in_place: bool,
    ) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all, sharded_to_all_inplace};
        let DenseMlp::Situ(m) = self else {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: "a SwiGLU MLP of a KDA model has no tensor parallelism in mlx-lm".into(),
            });
        };
        let p = |l: &str| format!("{path}.{l}");
        all_to_sharded(&mut m.gate_proj, n, r, &p("gate_proj"))?;
        all_to_sharded(&mut m.up_proj, n, r, &p("up_proj"))?;
        if in_place {
            sharded_to_all_inplace(&mut m.down_proj, n, r, &p("down_proj"))
        } else {
            sharded_to_all(&mut m.down_proj, n, r, &p("down_proj"))
        }
    }
}

/// kimi_k3's `KimiK3MLP`: `down_proj(situ(up_proj(x), gate_proj(x)))`.
#[derive(Clone)]
pub(super) struct SituMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    beta: f64,
    linear_beta: Option<f64>,
}

impl SituMlp {
    pub(super) fn load(
        w: &mut Weights,
        p: &str,
        d: i32,
        hidden: i32,
        beta: f64,
        linear_beta: Option<f64>,
    ) -> Result<SituMlp> {
        Ok(SituMlp {
            gate_proj: Linear::load(w, &format!("{p}.gate_proj"), d, hidden, false)?,
            up_proj: Linear::load(w, &format!("{p}.up_proj"), d, hidden, false)?,
            down_proj: Linear::load(w, &format!("{p}.down_proj"), hidden, d, false)?,
            beta,
            linear_beta,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let up = self.up_proj.forward(x)?;
        let gate = self.gate_proj.forward(x)?;
        self.down_proj
            .forward(&situ(&up, &gate, self.beta, self.linear_beta)?)
    }
}

#[derive(Clone)]
pub(super) enum Ffn {
    Dense(DenseMlp),
    Moe(Box<SparseMoe>),
}

impl Ffn {
    pub(super) fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe(m) => m.forward(x),
        }
    }
}

/// The gate an MLA layer applies to its attention output before the output projection.
#[derive(Clone)]
pub(super) enum MlaGate {
    None,
    /// kimi_k3's `mla_use_output_gate`: `out * sigmoid(g_proj(x))`.
    Output(Linear),
    /// bailing_moe_v3: one sigmoid gate per head (`g_proj`: hidden -> heads) in float32.
    PerHead(Linear),
}

#[derive(Clone)]
pub(super) enum Mixer {
    Kda(Box<Kda>),
    Mla(Box<MlaAttention>, MlaGate),
}

impl Mixer {
    /// The mixer on the normed input `x`; `i` names the layer in cache errors.
    pub(super) fn forward(
        &self,
        x: &Array,
        attn_mask: &AttentionMask,
        ssm_mask: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
        i: usize,
    ) -> Result<Array> {
        match self {
            Mixer::Kda(k) => k.forward(x, ssm_mask, arrays_cache(cache, i)?),
            Mixer::Mla(m, MlaGate::None) => m.forward(x, attn_mask, cache),
            Mixer::Mla(m, MlaGate::Output(gate)) => {
                let out = m.attend(x, attn_mask, cache)?;
                let out = (&out * &ops::sigmoid(&gate.forward(x)?, None)?)?;
                m.project_out(&out)
            }
            Mixer::Mla(m, MlaGate::PerHead(gate)) => {
                let out = m.attend(x, attn_mask, cache)?;
                let s = out.shape();
                // `g_proj` maps hidden -> heads.
                let heads = out.reshape(&[s[0], s[1], gate.dims()?.0, -1])?;
                let g = ops::sigmoid(&gate.forward(x)?.astype(Dtype::Float32)?, None)?
                    .astype(heads.dtype())?;
                let out = (&heads * &g.expand_dims(&[-1])?)?;
                m.project_out(&out.reshape(&[s[0], s[1], -1])?)
            }
        }
    }
}

/// A KDA or MLA layer with its feed-forward block, pre-normed.
#[derive(Clone)]
pub(super) struct Layer {
    pub(super) mixer: Mixer,
    pub(super) mlp: Ffn,
    pub(super) input_layernorm: RmsNorm,
    pub(super) post_attention_layernorm: RmsNorm,
}

impl Layer {
    /// Loads the two norms of layer `p` around `mixer` and `mlp`.
    pub(super) fn load(
        w: &mut Weights,
        p: &str,
        mixer: Mixer,
        mlp: Ffn,
        d: i32,
        eps: f32,
    ) -> Result<Layer> {
        Ok(Layer {
            mixer,
            mlp,
            input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                d,
                eps,
            )?,
        })
    }

    /// `h + mixer(norm(h))`, then that plus `mlp(norm(..))`.
    pub(super) fn forward(
        &self,
        h: &Array,
        attn_mask: &AttentionMask,
        ssm_mask: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
        i: usize,
    ) -> Result<Array> {
        let x = self.input_layernorm.forward(h)?;
        let r = self.mixer.forward(&x, attn_mask, ssm_mask, cache, i)?;
        let hh = (h + &r)?;
        Ok((&hh
            + &self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&hh)?)?)?)
    }
}

/// create_attention_mask(h, cache[attn], return_array=True) and create_ssm_mask(h, cache) of
/// the first MLA layer `mla_idx` and the first KDA layer `kda_idx`, for `n` new positions.
pub(super) fn masks(
    caches: Option<&[Box<dyn Cache>]>,
    kda_idx: Option<usize>,
    mla_idx: Option<usize>,
    n: usize,
) -> Result<(AttentionMask, Option<Array>)> {
    let attn_mask = match mla_idx {
        Some(i) => kit::cache_mask(caches, i, n, None, true)?,
        None => AttentionMask::None,
    };
    let ssm_mask = match (kda_idx, caches) {
        (Some(i), Some(c)) => c[i].make_mask(n, None, false)?.as_array().cloned(),
        _ => None,
    };
    Ok((attn_mask, ssm_mask))
}

/// kimi_linear's and kimi_k3's sanitize of a KDA layer's separate convolutions: `{q,k,v}_conv1d`
/// (moved to `(C, K, 1)` when 3-dimensional) become `{q,k,v}_conv.conv`.
pub(super) fn move_kimi_convs(w: &mut Weights, attn: &str) -> Result<()> {
    for (src, dst) in [
        ("q_conv1d", "q_conv"),
        ("k_conv1d", "k_conv"),
        ("v_conv1d", "v_conv"),
    ] {
        if let Some(t) = w.remove(&format!("{attn}.{src}.weight")) {
            let t = if t.ndim() == 3 {
                ops::moveaxis(&t, 2, 1, None)?
            } else {
                t
            };
            w.insert(format!("{attn}.{dst}.conv.weight"), t);
        }
    }
    Ok(())
}

/// The dimensions of a kimi MLA layer without rope (`mla_use_nope`).
pub(super) struct NopeMla {
    pub(super) hidden_size: i32,
    pub(super) num_heads: i32,
    pub(super) q_lora_rank: Option<i32>,
    pub(super) kv_lora_rank: i32,
    pub(super) qk_nope_head_dim: i32,
    pub(super) qk_rope_head_dim: i32,
    pub(super) v_head_dim: i32,
    pub(super) lora_norm_eps: f32,
}

impl NopeMla {
    /// kimi_linear's and kimi_k3's MLA layer at `attn`: `kv_b_proj` split as mlx-lm's sanitize
    /// splits it, no rope.
    pub(super) fn load(&self, w: &mut Weights, attn: &str) -> Result<MlaAttention> {
        crate::models::deepseek::split_kv_b_proj_dims(
            w,
            attn,
            self.num_heads,
            self.qk_nope_head_dim,
            self.v_head_dim,
            self.kv_lora_rank,
        )?;
        let rope_dim = self.qk_rope_head_dim;
        let spec = MlaSpec {
            hidden_size: self.hidden_size,
            num_heads: self.num_heads,
            q_lora_rank: self.q_lora_rank,
            kv_lora_rank: self.kv_lora_rank,
            qk_nope_head_dim: self.qk_nope_head_dim,
            qk_rope_head_dim: rope_dim,
            v_head_dim: self.v_head_dim,
            attention_bias: false,
            lora_norm_eps: self.lora_norm_eps,
            scale: f64::from(self.qk_nope_head_dim + rope_dim).powf(-0.5) as f32,
            // Unused: these MLA layers apply no rope.
            rope: Rope::Base {
                dims: rope_dim,
                traditional: false,
                base: 10000.0,
                scale: 1.0,
            },
            q_scale: None,
            kv_scale: None,
        };
        Ok(MlaAttention::load(false, spec, w, attn)?.without_rope())
    }
}

/// kimi_linear and bailing_moe_v3.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// The first KDA layer and the first MLA layer (their caches give the masks).
    kda_idx: Option<usize>,
    mla_idx: Option<usize>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        match config.model_type.as_str() {
            "bailing_moe_v3" => Model::load_bailing(config, w),
            _ => Model::load_kimi(config, w),
        }
    }

    fn load_kimi(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: KimiArgs = config.args()?;
        let mt = a.model_type.clone();
        let la = &a.linear_attn_config;
        let nope = a.qk_nope_head_dim.filter(|v| *v != 0).unwrap_or(a.head_dim);
        let rope_dim = a.qk_rope_head_dim.unwrap_or(0);
        let v_head = a.v_head_dim.filter(|v| *v != 0).unwrap_or(a.head_dim);
        kit::check_positive(
            &mt,
            &[
                ("vocab_size", a.vocab_size),
                ("hidden_size", a.hidden_size),
                ("num_hidden_layers", a.num_hidden_layers),
                ("num_attention_heads", a.num_attention_heads),
                ("intermediate_size", a.intermediate_size),
                ("kv_lora_rank", a.kv_lora_rank),
                ("qk_nope_head_dim", nope),
                ("v_head_dim", v_head),
                ("linear_attn_config.num_heads", la.num_heads),
                ("linear_attn_config.head_dim", la.head_dim),
                ("num_experts_per_token", a.num_experts_per_token),
                ("moe_layer_freq", a.moe_layer_freq),
                ("num_expert_group", a.num_expert_group),
            ],
        )?;
        if rope_dim < 0 {
            return Err(config_error(
                &mt,
                format!("field `qk_rope_head_dim` must not be negative, got {rope_dim}"),
            ));
        }
        crate::models::mamba::conv_kernel_ok(&mt, la.short_conv_kernel_size)?;
        let sigmoid = match a.moe_router_activation_func.as_str() {
            "sigmoid" => true,
            "softmax" => false,
            other => {
                return Err(config_error(
                    &mt,
                    format!(
                    "unsupported MoE router activation `{other}` (`moe_router_activation_func`)"
                ),
                ))
            }
        };
        let n = a.num_hidden_layers;
        let is_kda: Vec<bool> = (0..n).map(|i| la.kda_layers.contains(&(i + 1))).collect();
        let Some(kda_idx) = is_kda.iter().position(|k| *k) else {
            return Err(config_error(
                &mt,
                "`linear_attn_config.kda_layers` names no layer of the model".into(),
            ));
        };
        let Some(mla_idx) = is_kda.iter().position(|k| !*k) else {
            return Err(config_error(
                &mt,
                "`linear_attn_config.kda_layers` leaves no attention layer".into(),
            ));
        };
        if la.kda_layers[0] - 1 != kda_idx as i32 {
            // mlx-lm takes the SSM mask from layer `kda_layers[0] - 1`.
            return Err(config_error(
                &mt,
                "`linear_attn_config.kda_layers` must start with the first KDA layer".into(),
            ));
        }
        let moe_layer =
            |i: i32| a.num_experts > 0 && i >= a.first_k_dense_replace && i % a.moe_layer_freq == 0;
        if (0..n).any(moe_layer) {
            kit::check_positive(
                &mt,
                &[
                    ("moe_intermediate_size", a.moe_intermediate_size),
                    ("topk_group", a.topk_group),
                ],
            )?;
            if a.num_experts % a.num_expert_group != 0
                || a.topk_group > a.num_expert_group
                || a.num_experts_per_token > a.num_experts
            {
                return Err(config_error(
                    &mt,
                    format!(
                        "{} experts in {} groups (top {} groups, {} experts per token) do not \
                         split evenly",
                        a.num_experts, a.num_expert_group, a.topk_group, a.num_experts_per_token
                    ),
                ));
            }
        }
        // sanitize
        w.discard_prefix("model.mtp");
        if a.tie_word_embeddings {
            w.discard("lm_head.weight");
        }
        let eps = a.rms_norm_eps as f32;
        let d = a.hidden_size;
        let mut layers = Vec::with_capacity(n as usize);
        for i in 0..n {
            let p = format!("model.layers.{i}");
            let moe = moe_layer(i);
            if moe {
                let src = format!("{p}.block_sparse_moe");
                let dst = format!("{p}.mlp");
                kit::stack_experts(
                    w,
                    &format!("{src}.experts"),
                    &format!("{dst}.switch_mlp"),
                    a.num_experts,
                    &[("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")],
                    &["weight"],
                )?;
                for name in ["gate_proj", "up_proj", "down_proj"] {
                    w.rename(
                        &format!("{src}.shared_experts.{name}.weight"),
                        format!("{dst}.shared_experts.{name}.weight"),
                    );
                }
                w.rename(&format!("{src}.gate.weight"), format!("{dst}.gate.weight"));
                w.rename(
                    &format!("{src}.gate.e_score_correction_bias"),
                    format!("{dst}.e_score_correction_bias"),
                );
            }
            let attn = format!("{p}.self_attn");
            let mixer = if is_kda[i as usize] {
                move_kimi_convs(w, &attn)?;
                let dt = format!("{attn}.dt_bias");
                if w.shape_of(&dt).is_some_and(|s| s.len() > 1) {
                    w.map_tensor(&dt, |t| Ok(t.reshape(&[-1])?))?;
                }
                Mixer::Kda(Box::new(Kda::load(
                    &KdaSpec {
                        hidden_size: d,
                        num_heads: la.num_heads,
                        head_dim: la.head_dim,
                        kernel: la.short_conv_kernel_size,
                        eps,
                        conv_names: &["q_conv.conv", "k_conv.conv", "v_conv.conv"],
                        a_log_shape: vec![1, 1, la.num_heads, 1],
                        gates: GateKind::LowRank {
                            lower_bound: None,
                            full_out: false,
                        },
                    },
                    w,
                    &attn,
                )?))
            } else {
                let mla = NopeMla {
                    hidden_size: d,
                    num_heads: a.num_attention_heads,
                    q_lora_rank: None,
                    kv_lora_rank: a.kv_lora_rank,
                    qk_nope_head_dim: nope,
                    qk_rope_head_dim: rope_dim,
                    v_head_dim: v_head,
                    lora_norm_eps: eps,
                };
                Mixer::Mla(Box::new(mla.load(w, &attn)?), MlaGate::None)
            };
            let mlp = if moe {
                let m = |n: &str| format!("{p}.mlp.{n}");
                Ffn::Moe(Box::new(SparseMoe {
                    router: Router {
                        gate: Gate::Linear(Linear::load(w, &m("gate"), d, a.num_experts, false)?),
                        bias: w.take(&m("e_score_correction_bias"), &[a.num_experts])?,
                        top_k: a.num_experts_per_token,
                        rule: moe_block::Router::DeepseekGroup(GroupSelect {
                            top_k: a.num_experts_per_token,
                            n_group: a.num_expert_group,
                            topk_group: a.topk_group,
                            scaling_bits: a.routed_scaling_factor.to_bits(),
                            norm_topk_prob: a.moe_renormalize,
                            bailing: false,
                            sigmoid,
                            has_bias: true,
                            kimi: true,
                            cast_back: false,
                            grouped: a.num_expert_group > 1,
                            norm_any_k: false,
                            eps: true,
                        }),
                    },
                    switch_mlp: SwitchGlu::load(
                        w,
                        &m("switch_mlp"),
                        d,
                        a.moe_intermediate_size,
                        a.num_experts,
                        false,
                        SwitchActivation::SwiGlu,
                    )?,
                    situ: None,
                    latent: None,
                    shared_experts: if a.num_shared_experts > 0 {
                        Some(DenseMlp::swiglu(
                            w,
                            &m("shared_experts"),
                            d,
                            a.moe_intermediate_size * a.num_shared_experts,
                        )?)
                    } else {
                        None
                    },
                    cast_back: false,
                    sharded: false,
                }))
            } else {
                Ffn::Dense(DenseMlp::swiglu(
                    w,
                    &format!("{p}.mlp"),
                    d,
                    a.intermediate_size,
                )?)
            };
            layers.push(Layer::load(w, &p, mixer, mlp, d, eps)?);
        }
        let embed_tokens = Embedding::load(w, "model.embed_tokens", a.vocab_size, d)?;
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = super::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        Ok(Model {
            model_type: mt,
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            norm,
            lm_head,
            kda_idx: Some(kda_idx),
            mla_idx: Some(mla_idx),
        })
    }

    fn load_bailing(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: BailingArgs = config.args()?;
        let mt = a.model_type.clone();
        kit::check_positive(
            &mt,
            &[
                ("vocab_size", a.vocab_size),
                ("hidden_size", a.hidden_size),
                ("intermediate_size", a.intermediate_size),
                ("num_hidden_layers", a.num_hidden_layers),
                ("num_attention_heads", a.num_attention_heads),
                ("layer_group_size", a.layer_group_size),
                ("head_dim", a.head_dim),
                ("kv_lora_rank", a.kv_lora_rank),
                ("qk_nope_head_dim", a.qk_nope_head_dim),
                ("qk_rope_head_dim", a.qk_rope_head_dim),
                ("v_head_dim", a.v_head_dim),
                ("q_lora_rank", a.q_lora_rank.unwrap_or(1)),
            ],
        )?;
        crate::models::mamba::conv_kernel_ok(&mt, a.short_conv_kernel_size)?;
        // BailingKDA's and BailingMLA's own checks.
        for (ok, field) in [
            (a.no_kda_lora, "no_kda_lora"),
            (a.kda_safe_gate, "kda_safe_gate"),
            (a.rope_interleave, "rope_interleave"),
        ] {
            if !ok {
                return Err(config_error(
                    &mt,
                    format!("Bailing V3 MLX currently requires {field}=true"),
                ));
            }
        }
        let n = a.num_hidden_layers;
        let g = a.layer_group_size;
        let is_kda: Vec<bool> = (0..n)
            .map(|i| !((i + 1) % g == 0 || i >= n / g * g))
            .collect();
        let moe_layer = |i: i32| i >= a.first_k_dense_replace;
        if (0..n).any(moe_layer) {
            kit::check_positive(
                &mt,
                &[
                    ("num_experts", a.num_experts),
                    ("num_experts_per_tok", a.num_experts_per_tok),
                    ("n_group", a.n_group),
                    ("topk_group", a.topk_group),
                    ("moe_intermediate_size", a.moe_intermediate_size),
                    (
                        "moe_shared_expert_intermediate_size",
                        a.moe_shared_expert_intermediate_size * a.num_shared_experts,
                    ),
                ],
            )?;
            let per_group = if a.n_group > 0 {
                a.num_experts / a.n_group
            } else {
                0
            };
            if a.num_experts % a.n_group != 0
                || a.topk_group > a.n_group
                || per_group < 2
                || a.num_experts_per_tok > a.num_experts
            {
                return Err(config_error(
                    &mt,
                    format!(
                        "{} experts in {} groups (top {} groups, {} experts per token) do not \
                         split evenly into groups of at least 2",
                        a.num_experts, a.n_group, a.topk_group, a.num_experts_per_tok
                    ),
                ));
            }
        }
        // sanitize
        if a.tie_word_embeddings {
            w.discard("lm_head.weight");
        }
        w.discard_layers_from(n);
        let eps = a.rms_norm_eps as f32;
        let d = a.hidden_size;
        let q_head = a.qk_nope_head_dim + a.qk_rope_head_dim;
        let scale = apply_yarn_mscale(f64::from(q_head).powf(-0.5), a.rope_scaling.as_ref());
        let rope = Rope::initialize(
            a.qk_rope_head_dim,
            a.rope_theta,
            true,
            a.rope_scaling.as_ref(),
            Some(a.max_position_embeddings),
        )?;
        let mut layers = Vec::with_capacity(n as usize);
        for i in 0..n {
            let p = format!("model.layers.{i}");
            let moe = moe_layer(i);
            if moe {
                kit::stack_experts(
                    w,
                    &format!("{p}.mlp.experts"),
                    &format!("{p}.mlp.switch_mlp"),
                    a.num_experts,
                    &kit::GLU_PROJECTIONS,
                    &["weight"],
                )?;
            }
            let attn = format!("{p}.attention");
            if w.contains(&format!("{attn}.kv_b_proj.weight")) {
                if w.contains(&format!("{attn}.kv_b_proj.scales")) {
                    return Err(ModelError::Weights(vec![format!(
                        "{attn}.kv_b_proj: quantized Bailing V3 kv_b_proj weights are not \
                         supported (as in mlx-lm)"
                    )]));
                }
                crate::models::deepseek::split_kv_b_proj_dims(
                    w,
                    &attn,
                    a.num_attention_heads,
                    a.qk_nope_head_dim,
                    a.v_head_dim,
                    a.kv_lora_rank,
                )?;
            }
            for conv in ["q_conv1d", "k_conv1d", "v_conv1d"] {
                let name = format!("{attn}.{conv}.weight");
                if w.shape_of(&name)
                    .is_some_and(|s| s.last().copied() != Some(1))
                {
                    w.map_tensor(&name, |t| Ok(ops::moveaxis(t, 2, 1, None)?))?;
                }
            }
            let mixer = if is_kda[i as usize] {
                Mixer::Kda(Box::new(Kda::load(
                    &KdaSpec {
                        hidden_size: d,
                        num_heads: a.num_attention_heads,
                        head_dim: a.head_dim,
                        kernel: a.short_conv_kernel_size,
                        eps,
                        conv_names: &["q_conv1d", "k_conv1d", "v_conv1d"],
                        a_log_shape: vec![a.num_attention_heads],
                        gates: GateKind::Full(a.kda_lower_bound as f32),
                    },
                    w,
                    &attn,
                )?))
            } else {
                let spec = MlaSpec {
                    hidden_size: d,
                    num_heads: a.num_attention_heads,
                    q_lora_rank: a.q_lora_rank,
                    kv_lora_rank: a.kv_lora_rank,
                    qk_nope_head_dim: a.qk_nope_head_dim,
                    qk_rope_head_dim: a.qk_rope_head_dim,
                    v_head_dim: a.v_head_dim,
                    attention_bias: false,
                    lora_norm_eps: eps,
                    scale: scale as f32,
                    rope: rope.clone(),
                    q_scale: None,
                    kv_scale: None,
                };
                let mla = MlaAttention::load_named(false, spec, w, &attn, "dense")?;
                let gate = Linear::load(
                    w,
                    &format!("{attn}.g_proj"),
                    d,
                    a.num_attention_heads,
                    false,
                )?;
                Mixer::Mla(Box::new(mla), MlaGate::PerHead(gate))
            };
            let mlp = if moe {
                let m = |n: &str| format!("{p}.mlp.{n}");
                Ffn::Moe(Box::new(SparseMoe {
                    router: Router {
                        gate: Gate::Float32(w.take(&m("gate.weight"), &[a.num_experts, d])?),
                        bias: w.take(&m("gate.expert_bias"), &[a.num_experts])?,
                        top_k: a.num_experts_per_tok,
                        rule: moe_block::Router::BailingV3 {
                            n_group: a.n_group,
                            topk_group: a.topk_group,
                            routed_scaling_factor: a.routed_scaling_factor,
                        },
                    },
                    switch_mlp: SwitchGlu::load(
                        w,
                        &m("switch_mlp"),
                        d,
                        a.moe_intermediate_size,
                        a.num_experts,
                        false,
                        SwitchActivation::SwiGlu,
                    )?,
                    situ: None,
                    latent: None,
                    shared_experts: Some(DenseMlp::swiglu(
                        w,
                        &m("shared_experts"),
                        d,
                        a.moe_shared_expert_intermediate_size * a.num_shared_experts,
                    )?),
                    cast_back: true,
                    sharded: false,
                }))
            } else {
                Ffn::Dense(DenseMlp::swiglu(
                    w,
                    &format!("{p}.mlp"),
                    d,
                    a.intermediate_size,
                )?)
            };
            layers.push(Layer::load(w, &p, mixer, mlp, d, eps)?);
        }
        let embed_tokens = Embedding::load(w, "model.word_embeddings", a.vocab_size, d)?;
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = super::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        Ok(Model {
            model_type: mt,
            vocab_size: a.vocab_size,
            embed_tokens,
            layers,
            norm,
            lm_head,
            kda_idx: is_kda.iter().position(|k| *k),
            mla_idx: is_kda.iter().position(|k| !*k),
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let h = self.embed_tokens.forward(inputs)?;
        let (attn_mask, ssm_mask) = masks(caches.as_deref(), self.kda_idx, self.mla_idx, n)?;
        let h = layer_loop(&self.layers, h, caches, |i, layer, h, cache| {
            layer.forward(h, &attn_mask, ssm_mask.as_ref(), cache, i)
        })?;
        self.norm.forward(&h)
    }
}

impl LanguageModel for Model {
    kit::hidden_state_entry_points!(tied lm_head, embed_tokens);

    kit::own_type_and_vocab!();

    kit::layer_caches! {
        /// mlx-lm's `make_cache`: an `ArraysCache(size=4)` per KDA layer, a `KVCache` per MLA
        /// layer.
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers.iter().map(|l| matches!(l.mixer, Mixer::Mla(..))),
                4,
            )
        }
    }
}
