//! mlx-lm 0.32.2 `models/bailing_moe_linear.py` (Ling / Ring linear) and
//! `models/bailing_hybrid.py`: groups of
//! `layer_group_size` layers whose last is softmax attention (bailing_moe's fused
//! `query_key_value`, optional q/k norms, partial rope) and the others gated linear attention
//! (GLA): a recurrence `h_t = h_{t-1} * exp(slope) + k_t^T v_t`, `y_t = (q_t * scale) h_t`
//! with a fixed negative ALiBi-style slope per head and layer, a grouped RMS norm and a sigmoid
//! output gate. Linear layers hold an [`ArraysCache`] of one slot (the state `h`); their rope
//! offset is the first attention layer's cache offset before the step, as in mlx-lm. The
//! feed-forward blocks are bailing_moe's: a dense first `first_k_dense_replace` layers, then
//! grouped softmax / sigmoid routing (plain ops) with an optional expert bias and shared
//! experts.
//!
//! bailing_hybrid closes each group with multi-head latent attention ([`MlaAttention`],
//! interleaved rope, biases on the latent projections) instead, runs the recurrence chunked
//! over a prompt (blocks of up to 128 steps as a decay-weighted causal attention plus a state
//! carry, the state in float32) and one compiled step per token, and masks dropped expert
//! groups with `-inf`. Pipeline parallelism for bailing_hybrid as its mlx-lm `pipeline`
//! ([`Model::shard_pipeline`]: whole layer groups per rank); mlx-lm has no `shard()` for either.

use mlx_cache::{ArraysCache, Cache};
use mlx_core::fast;
use mlx_core::prelude::*;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::activations::compiled;
use crate::layers::mla::{MlaAttention, MlaSpec};
use crate::layers::ssm::arrays_cache;
use crate::layers::{
    Embedding, Linear, Mlp, MlpKind, MlpNames, RmsNorm, Rope, SwitchActivation, SwitchGlu,
};
use crate::models::moe_block::{Ffn, MoeParts, Router, SparseMoe};
use crate::models::{kit, LanguageModel};
use crate::weights::Weights;

serde_defaults! {
    default_true: bool = true;
    default_one_f: f64 = 1.0;
    default_softmax: String = "softmax".into();
    default_one: i32 = 1;
    default_four: i32 = 4;
    default_half: f64 = 0.5;
    default_sigmoid: String = "sigmoid".into();
}

/// bailing_moe_linear.py `ModelArgs`.
#[derive(Clone, Debug, Deserialize)]
struct ModelArgs {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    max_position_embeddings: i64,
    moe_intermediate_size: i32,
    num_experts: Option<i32>,
    num_shared_experts: i32,
    norm_topk_prob: bool,
    num_attention_heads: i32,
    num_experts_per_tok: i32,
    num_hidden_layers: i32,
    num_key_value_heads: i32,
    rms_norm_eps: f64,
    rope_theta: f64,
    vocab_size: i32,
    first_k_dense_replace: i32,
    layer_group_size: i32,
    group_norm_size: i32,
    #[serde(default)]
    rope_scaling: Option<Map<String, Value>>,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    use_bias: bool,
    #[serde(default)]
    use_qkv_bias: bool,
    #[serde(default)]
    norm_head: bool,
    #[serde(default)]
    use_qk_norm: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_one_f")]
    partial_rotary_factor: f64,
    #[serde(default)]
    moe_router_enable_expert_bias: bool,
    #[serde(default = "default_one_f")]
    routed_scaling_factor: f64,
    #[serde(default = "default_softmax")]
    score_function: String,
    #[serde(default = "default_one")]
    n_group: i32,
    #[serde(default = "default_four")]
    topk_group: i32,
    #[serde(default)]
    moe_shared_expert_intermediate_size: Option<i32>,
    #[serde(default = "default_true")]
    moe_router_enable_shared_expert: bool,
    #[serde(default)]
    head_dim: Option<i32>,
    // bailing_hybrid's MLA (required there, absent here).
    #[serde(default)]
    kv_lora_rank: i32,
    #[serde(default)]
    qk_rope_head_dim: i32,
    #[serde(default)]
    qk_nope_head_dim: i32,
    #[serde(default)]
    v_head_dim: i32,
    #[serde(default)]
    q_lora_rank: Option<i32>,
    #[serde(default = "default_true")]
    rope_interleave: bool,
    /// Set for bailing_hybrid (not a config field).
    #[serde(skip)]
    hybrid: bool,
}

/// bailing_hybrid.py `ModelArgs`: the same fields with other defaults (and the MLA ones).
#[derive(Clone, Debug, Deserialize)]
struct HybridArgs {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    moe_intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    num_experts: Option<i32>,
    num_experts_per_tok: i32,
    num_shared_experts: i32,
    n_group: i32,
    topk_group: i32,
    first_k_dense_replace: i32,
    layer_group_size: i32,
    group_norm_size: i32,
    vocab_size: i32,
    rms_norm_eps: f64,
    rope_theta: f64,
    max_position_embeddings: i64,
    routed_scaling_factor: f64,
    head_dim: Option<i32>,
    kv_lora_rank: i32,
    qk_rope_head_dim: i32,
    qk_nope_head_dim: i32,
    v_head_dim: i32,
    #[serde(default)]
    q_lora_rank: Option<i32>,
    #[serde(default)]
    moe_shared_expert_intermediate_size: Option<i32>,
    #[serde(default = "default_true")]
    rope_interleave: bool,
    #[serde(default = "default_half")]
    partial_rotary_factor: f64,
    #[serde(default)]
    rope_scaling: Option<Map<String, Value>>,
    #[serde(default)]
    use_qkv_bias: bool,
    #[serde(default)]
    use_bias: bool,
    #[serde(default = "default_true")]
    use_qk_norm: bool,
    #[serde(default = "default_sigmoid")]
    score_function: String,
    #[serde(default = "default_true")]
    norm_topk_prob: bool,
    #[serde(default = "default_true")]
    moe_router_enable_expert_bias: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
}

impl From<HybridArgs> for ModelArgs {
    fn from(h: HybridArgs) -> ModelArgs {
        ModelArgs {
            model_type: h.model_type,
            hidden_size: h.hidden_size,
            intermediate_size: h.intermediate_size,
            max_position_embeddings: h.max_position_embeddings,
            moe_intermediate_size: h.moe_intermediate_size,
            num_experts: h.num_experts,
            num_shared_experts: h.num_shared_experts,
            norm_topk_prob: h.norm_topk_prob,
            num_attention_heads: h.num_attention_heads,
            num_experts_per_tok: h.num_experts_per_tok,
            num_hidden_layers: h.num_hidden_layers,
            num_key_value_heads: h.num_key_value_heads,
            rms_norm_eps: h.rms_norm_eps,
            rope_theta: h.rope_theta,
            vocab_size: h.vocab_size,
            first_k_dense_replace: h.first_k_dense_replace,
            layer_group_size: h.layer_group_size,
            group_norm_size: h.group_norm_size,
            rope_scaling: h.rope_scaling,
            rope_traditional: false,
            use_bias: h.use_bias,
            use_qkv_bias: h.use_qkv_bias,
            norm_head: false,
            use_qk_norm: h.use_qk_norm,
            tie_word_embeddings: h.tie_word_embeddings,
            partial_rotary_factor: h.partial_rotary_factor,
            moe_router_enable_expert_bias: h.moe_router_enable_expert_bias,
            routed_scaling_factor: h.routed_scaling_factor,
            score_function: h.score_function,
            n_group: h.n_group,
            topk_group: h.topk_group,
            moe_shared_expert_intermediate_size: h.moe_shared_expert_intermediate_size,
            moe_router_enable_shared_expert: true,
            head_dim: h.head_dim,
            kv_lora_rank: h.kv_lora_rank,
            qk_rope_head_dim: h.qk_rope_head_dim,
            qk_nope_head_dim: h.qk_nope_head_dim,
            v_head_dim: h.v_head_dim,
            q_lora_rank: h.q_lora_rank,
            rope_interleave: h.rope_interleave,
            hybrid: true,
        }
    }
}

fn config_error(model_type: &str, m: String) -> ModelError {
    ModelError::Config(format!("config.json (`{model_type}`): {m}"))
}

/// The optional per-head `query_layernorm` / `key_layernorm`.
#[derive(Clone)]
struct QkNorm {
    query: RmsNorm,
    key: RmsNorm,
}

impl QkNorm {
    fn load(a: &ModelArgs, w: &mut Weights, p: &str, d: i32) -> Result<Option<QkNorm>> {
        if !a.use_qk_norm {
            return Ok(None);
        }
        let eps = a.rms_norm_eps as f32;
        Ok(Some(QkNorm {
            query: RmsNorm::load(w, &format!("{p}.query_layernorm"), d, eps)?,
            key: RmsNorm::load(w, &format!("{p}.key_layernorm"), d, eps)?,
        }))
    }
}

fn rope_for(a: &ModelArgs, head_dim: i32) -> Result<Rope> {
    Rope::initialize(
        (f64::from(head_dim) * a.partial_rotary_factor) as i32,
        a.rope_theta,
        a.rope_traditional && !a.hybrid,
        a.rope_scaling.as_ref(),
        Some(a.max_position_embeddings),
    )
}

/// bailing_moe_linear's `Attention` (the global layers, [`kit::Attention`]): the fused
/// `query_key_value` split, the optional per-head `query_layernorm` / `key_layernorm` over the
/// transposed heads, a partial rope, `dense` out.
fn global_attention(a: &ModelArgs, w: &mut Weights, p: &str) -> Result<kit::Attention> {
    let h = a.num_attention_heads;
    let d = a.head_dim.filter(|d| *d != 0).unwrap_or(a.hidden_size / h);
    let spec = kit::AttentionSpec {
        hidden_size: a.hidden_size,
        n_heads: h,
        n_kv_heads: a.num_key_value_heads,
        head_dim: d,
        qkv_bias: a.use_qkv_bias,
        o_bias: a.use_bias,
        qk_norm: if a.use_qk_norm {
            crate::models::moe::QkNorm::PerHeadTransposed
        } else {
            crate::models::moe::QkNorm::None
        },
        eps: a.rms_norm_eps as f32,
        rope: rope_for(a, d)?,
        names: ["dense", "query_layernorm", "key_layernorm"],
        sinks: false,
        inv_sqrt_scale: false,
    };
    kit::Attention::new_with(spec, w, p, true, Some("query_key_value"))
}

/// bailing_moe_linear's `LinearAttention`.
#[derive(Clone)]
struct LinearAttention {
    query_key_value: Linear,
    dense: Linear,
    g_proj: Linear,
    /// `GroupRMSNorm`'s weight and its group count.
    g_norm: Array,
    groups: i32,
    eps: f32,
    qk_norm: Option<QkNorm>,
    rope: Rope,
    heads: i32,
    head_dim: i32,
    scale: f32,
    /// The slopes `g` `(H,)` float32.
    g: Array,
    /// `exp(g)` as `(H, 1, 1)` float32 (cast to the queries' dtype when used).
    exp_g: Array,
    /// bailing_hybrid: the chunked recurrence with a float32 state.
    hybrid: bool,
}

impl LinearAttention {
    fn load(a: &ModelArgs, w: &mut Weights, p: &str, layer: i32) -> Result<LinearAttention> {
        let h = a.num_attention_heads;
        let d = match a.head_dim.filter(|d| *d != 0) {
            Some(d) if a.hybrid => d,
            _ => a.hidden_size / h,
        };
        let proj = h * d;
        let g = slopes(h, a.num_hidden_layers, layer, a.hybrid)?;
        Ok(LinearAttention {
            query_key_value: Linear::load(
                w,
                &format!("{p}.query_key_value"),
                a.hidden_size,
                3 * proj,
                a.use_qkv_bias,
            )?,
            dense: Linear::load(w, &format!("{p}.dense"), proj, a.hidden_size, a.use_bias)?,
            g_proj: Linear::load(w, &format!("{p}.g_proj"), a.hidden_size, proj, false)?,
            g_norm: w.take(&format!("{p}.g_norm.weight"), &[proj])?,
            groups: a.group_norm_size,
            eps: a.rms_norm_eps as f32,
            qk_norm: QkNorm::load(a, w, p, d)?,
            rope: rope_for(a, d)?,
            heads: h,
            head_dim: d,
            scale: f64::from(d).powf(-0.5) as f32,
            exp_g: ops::exp(&g, None)?.reshape(&[h, 1, 1])?,
            g,
            hybrid: a.hybrid,
        })
    }

    fn forward(
        &self,
        x: &Array,
        offset: usize,
        mask: Option<&Array>,
        cache: Option<&mut ArraysCache>,
    ) -> Result<Array> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let (h, d) = (self.heads, self.head_dim);
        let qkv = self
            .query_key_value
            .forward(x)?
            .reshape(&[b, l, 3 * h, d])?;
        let parts = ops::split_at(&qkv, &[h, 2 * h], 2, None)?;
        let t = |y: &Array| y.transpose(&[0, 2, 1, 3]);
        let (mut q, mut k, v) = (t(&parts[0])?, t(&parts[1])?, t(&parts[2])?);
        if let Some(n) = &self.qk_norm {
            q = n.query.forward(&q)?;
            k = n.key.forward(&k)?;
        }
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        if self.hybrid {
            let state0 = cache.as_ref().and_then(|c| c.get(0)).cloned();
            let (out, state) = self.chunked_gla(&q, &k, &v, state0.clone(), mask)?;
            if let Some(c) = cache {
                if c.keeps_history() {
                    // The state after each kept token is what a call over that prefix leaves
                    // (the chunking depends on the call's length); older ones are dropped.
                    let first = (l as usize).saturating_sub(c.max_rollback() + 1);
                    let mut steps = Vec::with_capacity(l.max(0) as usize);
                    for i in 0..l {
                        let t = i + 1;
                        if (i as usize) < first {
                            steps.push(vec![None]);
                        } else if t == l {
                            steps.push(vec![Some(state.clone())]);
                        } else {
                            let pre = |y: &Array| ops::slice_axis(y, 2, 0, t, None);
                            let m = mask
                                .map(|m| ops::slice_axis(m, 1, 0, t, None))
                                .transpose()?;
                            let (_, st) = self.chunked_gla(
                                &pre(&q)?,
                                &pre(&k)?,
                                &pre(&v)?,
                                state0.clone(),
                                m.as_ref(),
                            )?;
                            steps.push(vec![Some(st)]);
                        }
                    }
                    c.checkpoint_steps(steps)?;
                }
                c.set(0, state)?;
                c.advance(l as usize)?;
            }
            return self.finish(x, &out);
        }
        // recurrent_gla
        let exp_g = self.exp_g.astype(q.dtype())?;
        let q = (&q * self.scale)?;
        let mut state = cache.as_ref().and_then(|c| c.get(0)).cloned();
        let keep = cache.as_ref().is_some_and(|c| c.keeps_history());
        let mut outs = Vec::with_capacity(l.max(0) as usize);
        let mut states = Vec::new();
        for i in 0..l {
            let at = |y: &Array| ops::slice_axis(y, 2, i, i + 1, None);
            let h_up = ops::matmul(&at(&k)?.transpose(&[0, 1, 3, 2])?, &at(&v)?, None)?;
            let next = match &state {
                Some(s) => (&(s * &exp_g)? + &h_up)?,
                None => h_up,
            };
            outs.push(ops::matmul(&at(&q)?, &next, None)?);
            if keep {
                states.push(vec![Some(next.clone())]);
            }
            state = Some(next);
        }
        let refs: Vec<&Array> = outs.iter().collect();
        let out = ops::concatenate(&refs, 2, None)?;
        if let Some(c) = cache {
            if keep {
                c.checkpoint_steps(states)?;
            }
            if let Some(s) = state {
                c.set(0, s)?;
            }
            c.advance(l as usize)?;
        }
        self.finish(x, &out)
    }

    /// The heads `(B, H, L, D)` joined, group-normed, gated by `sigmoid(g_proj(x))` and
    /// projected.
    fn finish(&self, x: &Array, out: &Array) -> Result<Array> {
        let out = kit::merge_heads(out)?;
        // GroupRMSNorm: `weight * flatten(rms_norm(unflatten(x, groups)))`.
        let grouped = ops::unflatten(&out, -1, &[self.groups, -1], None)?;
        let normed = ops::flatten(
            &fast::rms_norm(&grouped, None, self.eps, None)?,
            -2,
            -1,
            None,
        )?;
        let normed = (&self.g_norm * &normed)?;
        let gated = (&normed * &ops::sigmoid(&self.g_proj.forward(x)?, None)?)?;
        self.dense.forward(&gated)
    }
}

impl LinearAttention {
    /// bailing_hybrid.py's `recurrent_gla`: one compiled step for a single token, else the
    /// chunked form (blocks of `C = min(L, 128)` steps). `q`, `k`, `v` `(B, H, L, D)`; the
    /// state `(B, H, K, V)` float32 (zeros when absent). Returns `(B, H, L, V)` and the state.
    fn chunked_gla(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        state: Option<Array>,
        mask: Option<&Array>,
    ) -> Result<(Array, Array)> {
        let qs = q.shape();
        let (b, h, l, kd) = (qs[0], qs[1], qs[2], qs[3]);
        let vd = v.shape()[3];
        let out_dtype = q.dtype();
        let mut state = match state {
            Some(s) => s,
            None => ops::zeros(&[b, h, kd, vd], Dtype::Float32, None)?,
        };
        let scale = self.scale;
        if l == 1 {
            let exp_g = self.exp_g.astype(state.dtype())?;
            let f = compiled!(
                |xs: &[Array]| {
                    let (q_t, k_t, v_t, h, exp_g) = (&xs[0], &xs[1], &xs[2], &xs[3], &xs[4]);
                    let up = ops::matmul(&k_t.transpose(&[0, 1, 3, 2])?, v_t, None)?;
                    let h = (&(h * exp_g)? + &up)?;
                    let y = ops::matmul(q_t, &h, None)?.astype(q_t.dtype())?;
                    Ok(vec![y, h])
                },
                shapeless = false
            )?;
            let mut out = f
                .call(&[(q * scale)?, k.clone(), v.clone(), state.clone(), exp_g])?
                .into_iter();
            let (Some(y), Some(h_t)) = (out.next(), out.next()) else {
                return Err(ModelError::Internal {
                    what: "compiled GLA step".into(),
                    problem: "returned fewer than two arrays".into(),
                });
            };
            return match mask {
                None => Ok((y, h_t)),
                Some(m) => {
                    let keep = ops::slice_axis(m, 1, 0, 1, None)?.reshape(&[-1, 1, 1, 1])?;
                    Ok((
                        ops::where_scalar(&keep, &y, 0i32, None)?,
                        ops::where_(&keep, &h_t, &state, None)?,
                    ))
                }
            };
        }
        let c = l.min(128);
        let n_chunks = (l + c - 1) / c;
        let pad = n_chunks * c - l;
        let m = match mask {
            None => ops::less_scalar(
                &ops::arange(0.0, f64::from(n_chunks * c), 1.0, Dtype::Int32, None)?,
                l,
                None,
            )?
            .astype(Dtype::Float32)?
            .expand_dims(&[0])?,
            Some(m) => ops::pad_widths(
                &m.astype(Dtype::Float32)?,
                &[(0, 0), (0, pad)],
                &Array::from_f32(0.0, Dtype::Float32)?,
                "constant",
                None,
            )?,
        };
        let padded = |y: &Array| -> Result<Array> {
            if pad == 0 {
                return Ok(y.clone());
            }
            Ok(ops::pad_widths(
                y,
                &[(0, 0), (0, 0), (0, pad), (0, 0)],
                &Scalar::Int(0).to_array_like(y.dtype())?,
                "constant",
                None,
            )?)
        };
        let chunks = |y: &Array| -> Result<Array> {
            Ok(ops::unflatten(&padded(y)?, 2, &[n_chunks, c], None)?)
        };
        let q = chunks(q)?;
        let k = chunks(k)?;
        let v = chunks(v)?.astype(Dtype::Float32)?;
        let m = ops::unflatten(&m, 1, &[n_chunks, c], None)?.expand_dims(&[1])?;
        let rank = ops::cumsum(&m, -1, false, true, None)?;
        let total = ops::slice_axis(&rank, -1, c - 1, c, None)?;
        let gh = self.g.reshape(&[1, h, 1, 1])?;
        let centre = 0.5 * c as f32;
        let e = (&gh * &(&rank - centre)?)?;
        let eq = (&(&ops::exp(&e, None)? * scale)? * &m)?;
        let ek = (&ops::exp(&ops::negative(&e, None)?, None)? * &m)?;
        let q = (&q * &eq.expand_dims(&[-1])?)?;
        let k = (&k * &ek.expand_dims(&[-1])?)?;
        let kt = ops::swapaxes(&k, -1, -2, None)?;
        let scores = ops::tril(&ops::matmul(&q, &kt, None)?, 0, None)?;
        let intra = ops::matmul(&scores, &v, None)?;
        let carry = ops::matmul(&kt, &v, None)?;
        let decay = ops::exp(&(&gh * &(&total - centre)?)?, None)?.expand_dims(&[-1])?;
        let state_decay = ops::exp(&(&gh * &total)?, None)?.expand_dims(&[-1])?;
        let at = |y: &Array, i: i32| -> Result<Array> {
            Ok(ops::squeeze(
                &ops::slice_axis(y, 2, i, i + 1, None)?,
                &[2],
                None,
            )?)
        };
        let mut cross = Vec::with_capacity(n_chunks as usize);
        for i in 0..n_chunks {
            cross.push(ops::matmul(&at(&q, i)?, &state, None)?);
            state = (&(&at(&state_decay, i)? * &state)? + &(&at(&carry, i)? * &at(&decay, i)?)?)?;
        }
        let refs: Vec<&Array> = cross.iter().collect();
        let cross = ops::stack(&refs, 2, None)?;
        let cross_scale = ops::exp(&(&self.g * centre)?, None)?.reshape(&[1, h, 1, 1, 1])?;
        let y = (&intra + &(&cross * &cross_scale)?)?.astype(out_dtype)?;
        let y = ops::flatten(&y, 2, 3, None)?;
        Ok((ops::slice_axis(&y, 2, 0, l, None)?, state))
    }
}

/// `LinearAttention._get_slopes`: ALiBi slopes (Python floats, then float32), negated and
/// scaled by the layer's position.
fn slopes(n: i32, layers: i32, layer: i32, hybrid: bool) -> Result<Array> {
    let pow2 = |n: i32| -> Vec<f64> {
        let e = -(2f64.powf(-(f64::from(n).log2() - 3.0)));
        (0..n).map(|i| 2f64.powf(e * f64::from(i + 1))).collect()
    };
    let lg = f64::from(n).log2();
    let s = if lg.fract() == 0.0 {
        pow2(n)
    } else {
        let p = 2f64.powf(lg.floor()) as i32;
        let mut s = pow2(p);
        s.extend(pow2(2 * p).into_iter().step_by(2).take((n - p) as usize));
        s
    };
    let s: Vec<f32> = s.into_iter().map(|x| x as f32).collect();
    let s = Array::from_slice(&s, &[n])?;
    let denom = (layers - 1).max(1);
    // bailing_hybrid: `1 - layer_idx / denom`; bailing_moe_linear: `max(0, layer_idx - 1)`.
    let layer_pos = if hybrid { layer } else { (layer - 1).max(0) };
    let factor = 1.0 - (f64::from(layer_pos) / f64::from(denom)) + 1e-5;
    Ok((&ops::negative(&s, None)? * factor as f32)?)
}

#[derive(Clone)]
enum Mixer {
    Global(Box<kit::Attention>),
    /// bailing_hybrid's global layers.
    Mla(Box<MlaAttention>),
    Linear(Box<LinearAttention>),
}

#[derive(Clone)]
struct Layer {
    attention: Mixer,
    mlp: Ffn,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

/// The Bailing linear-attention MoE model.
pub struct Model {
    model_type: String,
    vocab_size: i32,
    word_embeddings: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// The layer whose cache gives the attention mask and the linear layers' rope offset
    /// (bailing_moe_linear: `layer_group_size - 1`; bailing_hybrid: the first global one).
    attn_idx: Option<usize>,
    /// The first linear layer (bailing_hybrid's SSM mask).
    gla_idx: Option<usize>,
    hybrid: bool,
    layer_group_size: usize,
    /// Pipeline stage `(rank, size)` after [`Model::shard_pipeline`].
    pipeline: Option<(i32, i32)>,
}

impl Model {
    pub fn load(config: &ModelConfig, w: &mut Weights) -> Result<Model> {
        let a: ModelArgs = if config.model_type == "bailing_hybrid" {
            ModelArgs::from(config.args::<HybridArgs>()?)
        } else {
            config.args()?
        };
        let mt = a.model_type.clone();
        kit::check_positive(
            &mt,
            &[
                ("vocab_size", a.vocab_size),
                ("hidden_size", a.hidden_size),
                ("intermediate_size", a.intermediate_size),
                ("num_hidden_layers", a.num_hidden_layers),
                ("num_attention_heads", a.num_attention_heads),
                ("num_key_value_heads", a.num_key_value_heads),
                ("layer_group_size", a.layer_group_size),
                ("group_norm_size", a.group_norm_size),
            ],
        )?;
        let (h, n, g) = (
            a.num_attention_heads,
            a.num_hidden_layers,
            a.layer_group_size,
        );
        if a.hidden_size % h != 0 || a.num_attention_heads % a.num_key_value_heads != 0 {
            return Err(config_error(
                &mt,
                format!(
                    "`hidden_size` {} and `num_key_value_heads` {} must divide into \
                 `num_attention_heads` {h} heads",
                    a.hidden_size, a.num_key_value_heads
                ),
            ));
        }
        if a.hidden_size % a.group_norm_size != 0 {
            return Err(config_error(
                &mt,
                format!(
                    "`group_norm_size` {} does not divide `hidden_size` {}",
                    a.group_norm_size, a.hidden_size
                ),
            ));
        }
        if a.hybrid {
            kit::check_positive(
                &mt,
                &[
                    ("kv_lora_rank", a.kv_lora_rank),
                    ("qk_nope_head_dim", a.qk_nope_head_dim),
                    ("qk_rope_head_dim", a.qk_rope_head_dim),
                    ("v_head_dim", a.v_head_dim),
                    ("q_lora_rank", a.q_lora_rank.unwrap_or(1)),
                ],
            )?;
            // ModelArgs.__post_init__.
            let hd = a.head_dim.filter(|d| *d != 0).unwrap_or(a.hidden_size / h);
            let dims = (f64::from(hd) * a.partial_rotary_factor) as i32;
            if dims <= 0 || dims > hd || dims % 2 != 0 {
                return Err(config_error(
                    &mt,
                    format!("Invalid rotary dimension {dims} with head_dim={hd}"),
                ));
            }
        } else if g > n {
            return Err(config_error(
                &mt,
                format!(
                    "`layer_group_size` {g} is larger than `num_hidden_layers` {n}: mlx-lm reads \
                 the attention cache of layer {}",
                    g - 1
                ),
            ));
        }
        let experts = a.num_experts.unwrap_or(0);
        let moe_layer = |i: i32| a.num_experts.is_some() && i >= a.first_k_dense_replace;
        let sigmoid = a.score_function == "sigmoid";
        if (0..n).any(moe_layer) {
            kit::check_positive(
                &mt,
                &[
                    ("num_experts", experts),
                    ("num_experts_per_tok", a.num_experts_per_tok),
                    ("moe_intermediate_size", a.moe_intermediate_size),
                    ("n_group", a.n_group),
                ],
            )?;
            if a.num_experts_per_tok > experts
                || (a.n_group > 1
                    && a.n_group > a.topk_group
                    && (experts % a.n_group != 0 || experts / a.n_group < 2 || a.topk_group < 1))
            {
                return Err(config_error(
                    &mt,
                    format!(
                        "{experts} experts in {} groups (top {} groups, {} per token) do not split",
                        a.n_group, a.topk_group, a.num_experts_per_tok
                    ),
                ));
            }
        }
        // sanitize
        if a.tie_word_embeddings {
            w.discard("lm_head.weight");
        }
        if a.norm_head && !a.tie_word_embeddings {
            let head = w.remove("lm_head.weight").ok_or_else(|| {
                ModelError::Weights(vec![
                    "bailing_moe_linear: norm_head needs lm_head.weight".into()
                ])
            })?;
            let dtype = head.dtype();
            let f = head.astype(Dtype::Float32)?;
            let norm = ops::sqrt(&ops::sum(&ops::square(&f, None)?, &[0], true, None)?, None)?;
            let norm = (&norm + 1e-7f32)?;
            w.insert("lm_head.weight".into(), (&head / &norm)?.astype(dtype)?);
        }
        if a.hybrid {
            // The checkpoint appends MTP layers after the base ones.
            w.discard_layers_from(n);
        }
        let mla_rope = if a.hybrid {
            Some(Rope::initialize(
                a.qk_rope_head_dim,
                a.rope_theta,
                a.rope_interleave,
                a.rope_scaling.as_ref(),
                Some(a.max_position_embeddings),
            )?)
        } else {
            None
        };
        let eps = a.rms_norm_eps as f32;
        let d = a.hidden_size;
        let mlp_load = |w: &mut Weights, p: &str, hidden: i32| {
            Mlp::load(
                w,
                p,
                &MlpNames::LLAMA,
                d,
                hidden,
                a.use_bias,
                a.use_bias,
                MlpKind::SwiGlu,
            )
        };
        let globals: Vec<bool> = (0..n).map(|i| (i + 1) % g == 0 || i >= n / g * g).collect();
        let mut layers = Vec::with_capacity(n as usize);
        for i in 0..n {
            let p = format!("model.layers.{i}");
            let global = globals[i as usize];
            let attention = if global && a.hybrid {
                let attn = format!("{p}.attention");
                if w.contains(&format!("{attn}.kv_b_proj.scales")) {
                    return Err(ModelError::Weights(vec![format!(
                        "{attn}.kv_b_proj: a quantized kv_b_proj is not supported (mlx-lm \
                         splits it unquantized)"
                    )]));
                }
                crate::models::deepseek::split_kv_b_proj_dims(
                    w,
                    &attn,
                    h,
                    a.qk_nope_head_dim,
                    a.v_head_dim,
                    a.kv_lora_rank,
                )?;
                let q_head = a.qk_nope_head_dim + a.qk_rope_head_dim;
                let spec = MlaSpec {
                    hidden_size: d,
                    num_heads: h,
                    q_lora_rank: a.q_lora_rank,
                    kv_lora_rank: a.kv_lora_rank,
                    qk_nope_head_dim: a.qk_nope_head_dim,
                    qk_rope_head_dim: a.qk_rope_head_dim,
                    v_head_dim: a.v_head_dim,
                    attention_bias: a.use_qkv_bias,
                    lora_norm_eps: eps,
                    scale: crate::models::kda::apply_yarn_mscale(
                        f64::from(q_head).powf(-0.5),
                        a.rope_scaling.as_ref(),
                    ) as f32,
                    rope: mla_rope.clone().ok_or_else(|| ModelError::Internal {
                        what: "bailing_hybrid".into(),
                        problem: "the MLA layers' rope is missing".into(),
                    })?,
                    q_scale: None,
                    kv_scale: None,
                };
                Mixer::Mla(Box::new(MlaAttention::load_named(
                    false, spec, w, &attn, "dense",
                )?))
            } else if global {
                Mixer::Global(Box::new(global_attention(
                    &a,
                    w,
                    &format!("{p}.attention"),
                )?))
            } else {
                Mixer::Linear(Box::new(LinearAttention::load(
                    &a,
                    w,
                    &format!("{p}.attention"),
                    i,
                )?))
            };
            let mlp = if moe_layer(i) {
                let m = format!("{p}.mlp");
                kit::stack_experts(
                    w,
                    &format!("{m}.experts"),
                    &format!("{m}.switch_mlp"),
                    experts,
                    &kit::GLU_PROJECTIONS,
                    &kit::LINEAR_KEYS,
                )?;
                let keys: &[&str] = if a.hybrid {
                    &["weight"]
                } else {
                    &["weight", "bias"]
                };
                for k in keys {
                    if let Some(v) = w.remove(&format!("{m}.gate.{k}")) {
                        w.insert(format!("{m}.gate.gate_proj.{k}"), v);
                    }
                }
                // bailing_moe_linear: `(shared or moe) * num_shared`; bailing_hybrid: `shared
                // or moe * num_shared`.
                let shared_size = match a.moe_shared_expert_intermediate_size.filter(|s| *s != 0) {
                    Some(s) if a.hybrid => s,
                    None if a.hybrid => a.moe_intermediate_size * a.num_shared_experts,
                    Some(s) => s * a.num_shared_experts,
                    None => a.moe_intermediate_size * a.num_shared_experts,
                };
                // `SparseMoeBlock` declares switch_mlp, gate, shared_experts; the weights load
                // in the port's order (gate.gate_proj, gate.expert_bias, switch_mlp,
                // shared_experts), as before.
                let gate = Linear::load(w, &format!("{m}.gate.gate_proj"), d, experts, false)?;
                let correction_bias = if a.moe_router_enable_expert_bias {
                    Some((
                        "gate.expert_bias",
                        w.take(&format!("{m}.gate.expert_bias"), &[experts])?,
                    ))
                } else {
                    None
                };
                let switch_mlp = SwitchGlu::load(
                    w,
                    &format!("{m}.switch_mlp"),
                    d,
                    a.moe_intermediate_size,
                    experts,
                    a.use_bias,
                    SwitchActivation::SwiGlu,
                )?;
                let plain_shared = if a.num_shared_experts > 0 && a.moe_router_enable_shared_expert
                {
                    Some((
                        "shared_experts",
                        mlp_load(w, &format!("{m}.shared_experts"), shared_size)?,
                    ))
                } else {
                    None
                };
                Ffn::Sparse(Box::new(SparseMoe::from_parts(MoeParts {
                    top_k: a.num_experts_per_tok,
                    router: Router::BailingPlain {
                        n_group: a.n_group,
                        topk_group: a.topk_group,
                        routed_scaling_factor: a.routed_scaling_factor,
                        norm_topk_prob: a.norm_topk_prob,
                        sigmoid,
                        hybrid: a.hybrid,
                    },
                    gate,
                    experts: switch_mlp,
                    names: ["gate.gate_proj", "switch_mlp"],
                    correction_bias,
                    plain_shared,
                    flatten: false,
                })))
            } else {
                Ffn::Dense(mlp_load(w, &format!("{p}.mlp"), a.intermediate_size)?)
            };
            layers.push(Layer {
                attention,
                mlp,
                input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), d, eps)?,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    d,
                    eps,
                )?,
            });
        }
        let word_embeddings = Embedding::load(w, "model.word_embeddings", a.vocab_size, d)?;
        let norm = RmsNorm::load(w, "model.norm", d, eps)?;
        let lm_head = super::load_lm_head(w, a.tie_word_embeddings, d, a.vocab_size)?;
        Ok(Model {
            model_type: mt,
            vocab_size: a.vocab_size,
            word_embeddings,
            layers,
            norm,
            lm_head,
            attn_idx: if a.hybrid {
                globals.iter().position(|g| *g)
            } else {
                Some((g - 1) as usize)
            },
            gla_idx: globals.iter().position(|g| !*g),
            hybrid: a.hybrid,
            layer_group_size: g as usize,
            pipeline: None,
        })
    }

    /// The final normed hidden states `(batch, seq, hidden)`.
    pub fn hidden_states(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> Result<Array> {
        let n = kit::new_positions(inputs, caches.as_deref(), self.layers.len(), "layers")?;
        let mut h = self.word_embeddings.forward(inputs)?;
        let mut caches = caches;
        let attn_mask = match self.attn_idx {
            Some(i) => kit::cache_mask(caches.as_deref(), i, n, None, self.hybrid)?,
            None => mlx_cache::mask::fallback_mask(n, None, true)?,
        };
        let offset = match (caches.as_deref(), self.attn_idx) {
            (Some(c), Some(i)) => c[i].offset(),
            _ => 0,
        };
        // create_ssm_mask(h, cache[gla_idx]) (bailing_moe_linear's layers ignore it).
        let gla_mask = match (caches.as_deref(), self.gla_idx) {
            (Some(c), Some(i)) if self.hybrid => {
                c[i].make_mask(n, None, false)?.as_array().cloned()
            }
            _ => None,
        };
        h = crate::shard::pipeline_recv(h, self.pipeline)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let x = layer.input_layernorm.forward(&h)?;
            let r = match &layer.attention {
                Mixer::Global(m) => m.forward(&x, &attn_mask, cache)?,
                Mixer::Mla(m) => m.forward(&x, &attn_mask, cache)?,
                Mixer::Linear(m) => {
                    m.forward(&x, offset, gla_mask.as_ref(), arrays_cache(cache, i)?)?
                }
            };
            let hh = (&h + &r)?;
            h = (&hh
                + &layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&hh)?)?)?;
        }
        h = crate::shard::pipeline_send(h, self.pipeline, caches.and_then(|c| c.last_mut()))?;
        self.norm.forward(&h)
    }

    /// Pipeline parallelism as bailing_hybrid.py's `LanguageModel.pipeline`: whole layer
    /// groups per rank (the low ranks taking the extra groups), the layers past the last whole
    /// group added to rank 0's share, then `PipelineMixin`'s split
    /// ([`crate::shard::pipeline_range_split`]); the stage's masks and the linear layers'
    /// offset come from its own first MLA and first linear layer, and a stage without an MLA
    /// layer is refused. A stage's send is tied to its last cache (an MLA layer's keys or a
    /// linear layer's state). bailing_moe_linear has no `pipeline` in mlx-lm.
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        let t = self.model_type.as_str();
        crate::shard::check_pipeline(t, &["bailing_hybrid"], self.pipeline.is_some())?;
        let (layers, group) = (self.layers.len(), self.layer_group_size);
        let s = usize::try_from(size).unwrap_or(0).max(1);
        let (n_groups, tail) = (layers / group, layers % group);
        let (base, extra) = (n_groups / s, n_groups % s);
        let mut split: Vec<usize> = (0..s)
            .map(|r| (base + usize::from(r < extra)) * group)
            .collect();
        split[0] += tail;
        let range = crate::shard::pipeline_range_split(&split, layers, size, rank)?;
        let global = |l: &Layer| !matches!(l.attention, Mixer::Linear(_));
        let stage = &self.layers[range.clone()];
        let attn_idx = stage
            .iter()
            .position(global)
            .ok_or_else(|| ModelError::Parallel {
                kind: crate::Parallelism::Pipeline,
                what: format!("split {split:?}"),
                problem: format!("leaves rank {rank} without an MLA layer"),
            })?;
        let gla_idx = stage.iter().position(|l| !global(l));
        crate::shard::keep_range(&mut self.layers, range);
        self.attn_idx = Some(attn_idx);
        self.gla_idx = gla_idx;
        self.pipeline = Some((rank, size));
        Ok(())
    }

    fn head(&self, h: &Array) -> Result<Array> {
        crate::models::project(self.lm_head.as_ref(), &self.word_embeddings, h)
    }
}

impl LanguageModel for Model {
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        let h = self.hidden_states(inputs, caches)?;
        self.head(&h)
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, None))
    }

    fn forward_hidden_cached(
        &self,
        inputs: &Array,
        caches: &mut [Box<dyn Cache>],
    ) -> Option<Result<Array>> {
        Some(self.hidden_states(inputs, Some(caches)))
    }

    fn output_head(&self) -> Option<crate::models::OutputHead> {
        Some(crate::models::OutputHead::of(
            self.lm_head.as_ref(),
            &self.word_embeddings,
        ))
    }

    kit::own_type_and_vocab!();

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    /// mlx-lm has no `shard()` for either type (bailing_hybrid pipelines: `--pipeline`).
    fn shard_tensor_parallel(&mut self, _size: i32, _rank: i32) -> Result<()> {
        let t = &self.model_type;
        let hint = if self.hybrid {
            "; split it into pipeline stages instead (`mlx launch --pipeline`)"
        } else {
            ""
        };
        Err(ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: format!("model_type `{t}`"),
            problem: format!("not supported (mlx-lm's {t} has no shard()){hint}"),
        })
    }

    kit::layer_caches! {
        /// mlx-lm's `make_cache`: a `KVCache` per global layer, an `ArraysCache(size=1)` per
        /// linear one.
        fn make_cache(&self) {
            kit::hybrid_caches(
                self.layers
                    .iter()
                    .map(|l| !matches!(l.attention, Mixer::Linear(_))),
                1,
            )
        }
    }
}
