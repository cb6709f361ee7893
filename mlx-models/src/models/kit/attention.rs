//! The one plain softmax attention of the ports that compose the kit (issue #29): q/k/v
//! projections (separate, fused, or none where a layer reuses another's keys and values),
//! optional q/k RMS norms (whole projection, per head, or per head after the rope), heads,
//! optional rope, the cache, MLX's SDPA with optional per-head sinks, optional output gates,
//! and the output projection. The variants are options of this one type; each names the
//! mlx-lm file that needs it.

use mlx_cache::{AttentionMask, Cache};
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::layers::{join, scaled_dot_product_attention, Linear, RmsNorm, Rope, Walk, Walkable};
use crate::models::moe::QkNorm;
use crate::weights::Weights;

/// The knobs of the standard attention block the mixture-of-experts rows, lfm2,
/// nemotron_nas and deepseek's standard layers share ([`Attention::new`]).
pub(crate) struct AttentionSpec {
    pub hidden_size: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: QkNorm,
    pub eps: f32,
    pub rope: Rope,
    /// Module names: output projection, q norm, k norm.
    pub names: [&'static str; 3],
    /// Learned per-head attention sinks (`<path>.sinks`, gpt_oss).
    pub sinks: bool,
    /// gpt_oss writes `1 / sqrt(head_dim)`, the others `head_dim ** -0.5`.
    pub inv_sqrt_scale: bool,
}

/// The plain softmax attention (mlx-lm's `Attention` of the moe rows, lfm2, nemotron_nas,
/// deepseek's standard layers, `NemotronHAttention`, jamba's, `GraniteMoeHybridAttention`,
/// `FalconH1Attention`, olmo_hybrid's, mimo_v2_flash's, bailing_moe_linear's global layers,
/// recurrent_gemma's `LocalAttentionBlock`, `Qwen3NextAttention`, `Step3p5Attention`,
/// plamo2's). Built as mlx-lm's `__init__` loads it: [`Attention::new`] from an
/// [`AttentionSpec`], or [`Attention::load`] (or `load_v`, `load_fused`, `load_query_gated`)
/// then the `with_*` options (norms, sinks, gates, value scale, rope) in that file's order.
/// How a head-wise gate's `g_proj(x)` scales each head's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeadGate {
    /// laguna: `softplus(g.astype(float32)).astype(out.dtype)`.
    Softplus,
    /// step3p5: `sigmoid(g)`.
    Sigmoid,
}

#[derive(Clone)]
pub(crate) struct Attention {
    pub(crate) n_heads: i32,
    pub(crate) n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
    pub(crate) qk_norm: QkNorm,
    pub(crate) q_proj: Linear,
    /// `None` on hunyuan's layers that reuse the previous layer's keys and values
    /// (cross-layer attention).
    pub(crate) k_proj: Option<Linear>,
    pub(crate) v_proj: Option<Linear>,
    pub(crate) o_proj: Linear,
    pub(crate) q_norm: Option<RmsNorm>,
    pub(crate) k_norm: Option<RmsNorm>,
    pub(crate) sinks: Option<Array>,
    /// `None`: no positional encoding (nemotron_h; exaone_moe's global layers when it has
    /// sliding ones).
    pub(crate) rope: Option<Rope>,
    /// bailing_moe: `q_proj` holds the fused query/key/value projection (named `q_name`),
    /// split after it.
    pub(crate) fused_qkv: bool,
    /// The name of `q_proj` (`query_key_value` when fused).
    q_name: &'static str,
    /// afmoe: `gate_proj`, whose sigmoid scales the attention output before `o_proj`.
    pub(crate) out_gate: Option<Linear>,
    /// `g_proj` to one value per head, whose [`HeadGate`] scales each head's output before
    /// `o_proj`.
    pub(crate) head_gate: Option<(HeadGate, Linear)>,
    /// mimo_v2_flash's `attention_value_scale`: the values' heads times this before the cache.
    value_scale: Option<f64>,
    /// The sinks' parameter name (`sinks`; mimo_v2_flash: `attention_sink_bias`).
    sink_name: &'static str,
    /// plamo2: the heads (transposed layout) normed by a weightless RMS norm of this eps,
    /// then times a weight of each head (`q_weight` `(heads, head_dim)`, `k_weight`
    /// `(kv_heads, head_dim)`).
    head_weights: Option<Box<(Array, Array, f32)>>,
    /// qwen3_next / qwen3_5: `q_proj` gives each head's queries then its gate (twice the
    /// width); the output times `sigmoid(gate)` before `o_proj`.
    query_gate: bool,
    /// Module names: output projection, q norm, k norm ([`AttentionSpec::names`]).
    pub(crate) names: [&'static str; 3],
    /// minimax's `shard()`: the full-width q/k norms as `ShardedRMSNorm` over this many ranks.
    pub(crate) sharded_norms: Option<i32>,
}

impl Attention {
    /// The scores' scale.
    pub(crate) fn scale(&self) -> f32 {
        self.scale
    }

    /// The options a reader of this attention's arrays (the graph decoder, through
    /// `moe::Model::layer_view`) cannot see from its public parts, named for messages: a
    /// value scale, per-head q/k weights, gated queries.
    pub(crate) fn unusual(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.value_scale.is_some() {
            v.push("a value scale");
        }
        if self.head_weights.is_some() {
            v.push("per-head q/k weights");
        }
        if self.query_gate {
            v.push("gated queries");
        }
        v
    }

    /// `q_proj`, `k_proj`, `v_proj`, `o_proj` under `p` (`d` wide, `h` query and `kv` key-value
    /// heads of `hd`, with biases when `bias`), scores scaled by `scale`; no norms, no rope.
    pub(crate) fn load(
        w: &mut Weights,
        p: &str,
        (d, h, kv, hd): (i32, i32, i32, i32),
        bias: bool,
        scale: f32,
    ) -> Result<Attention> {
        Attention::load_v(w, p, (d, h, kv, hd, hd), (bias, bias), scale)
    }

    /// [`Attention::load`] with value heads of `vd` (mimo_v2_flash's `v_head_dim`) and biases
    /// on q/k/v and on o apart (`(qkv_bias, o_bias)`).
    pub(crate) fn load_v(
        w: &mut Weights,
        p: &str,
        (d, h, kv, hd, vd): (i32, i32, i32, i32, i32),
        (qkv_bias, o_bias): (bool, bool),
        scale: f32,
    ) -> Result<Attention> {
        let mut l =
            |n: &str, i: i32, o: i32, bias: bool| Linear::load(w, &format!("{p}.{n}"), i, o, bias);
        let (q_proj, k_proj, v_proj, o_proj) = (
            l("q_proj", d, h * hd, qkv_bias)?,
            l("k_proj", d, kv * hd, qkv_bias)?,
            l("v_proj", d, kv * vd, qkv_bias)?,
            l("o_proj", h * vd, d, o_bias)?,
        );
        Ok(Attention::load_parts(
            q_proj,
            (Some(k_proj), Some(v_proj)),
            o_proj,
            (h, kv, hd),
            scale,
        ))
    }

    /// Projections as loaded (no keys and values of its own: fused, or another layer's):
    /// no norms, rope, sinks or gates.
    fn load_parts(
        q_proj: Linear,
        (k_proj, v_proj): (Option<Linear>, Option<Linear>),
        o_proj: Linear,
        (h, kv, hd): (i32, i32, i32),
        scale: f32,
    ) -> Attention {
        Attention {
            n_heads: h,
            n_kv_heads: kv,
            head_dim: hd,
            scale,
            qk_norm: QkNorm::None,
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm: None,
            k_norm: None,
            sinks: None,
            rope: None,
            fused_qkv: false,
            q_name: "q_proj",
            out_gate: None,
            head_gate: None,
            value_scale: None,
            sink_name: "sinks",
            head_weights: None,
            query_gate: false,
            names: ["o_proj", "q_norm", "k_norm"],
            sharded_norms: None,
        }
    }

    /// `q_norm` and `k_norm` under `p`, RMS norms over the whole query and key projections
    /// (before the heads split).
    pub(crate) fn with_projection_norms(
        mut self,
        w: &mut Weights,
        p: &str,
        eps: f32,
    ) -> Result<Attention> {
        let (q, k) = (
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        self.q_norm = Some(RmsNorm::load(w, &format!("{p}.q_norm"), q, eps)?);
        self.k_norm = Some(RmsNorm::load(w, &format!("{p}.k_norm"), k, eps)?);
        self.qk_norm = QkNorm::Full;
        Ok(self)
    }

    /// [`Attention::load`] with qwen3_next's gated queries: `q_proj` twice as wide, each
    /// head's queries then its output gate.
    pub(crate) fn load_query_gated(
        w: &mut Weights,
        p: &str,
        (d, h, kv, hd): (i32, i32, i32, i32),
        bias: bool,
        scale: f32,
    ) -> Result<Attention> {
        let q_proj = Linear::load(w, &format!("{p}.q_proj"), d, h * hd * 2, bias)?;
        let mut l = |n: &str, i: i32, o: i32| Linear::load(w, &format!("{p}.{n}"), i, o, bias);
        let (k_proj, v_proj, o_proj) = (
            l("k_proj", d, kv * hd)?,
            l("v_proj", d, kv * hd)?,
            l("o_proj", h * hd, d)?,
        );
        let kv_proj = (Some(k_proj), Some(v_proj));
        let mut at = Attention::load_parts(q_proj, kv_proj, o_proj, (h, kv, hd), scale);
        at.query_gate = true;
        Ok(at)
    }

    /// The fused projection `{p}.{qkv}` (queries, keys, values in that order) and `{p}.{o}`,
    /// no biases (plamo2's `qkv_proj`); otherwise as [`Attention::load`].
    pub(crate) fn load_fused(
        w: &mut Weights,
        p: &str,
        (qkv, o): (&'static str, &'static str),
        (d, h, kv, hd): (i32, i32, i32, i32),
        scale: f32,
    ) -> Result<Attention> {
        let fused = Linear::load(w, &format!("{p}.{qkv}"), d, (h + 2 * kv) * hd, false)?;
        let o_proj = Linear::load(w, &format!("{p}.{o}"), h * hd, d, false)?;
        let mut at = Attention::load_parts(fused, (None, None), o_proj, (h, kv, hd), scale);
        at.fused_qkv = true;
        at.q_name = qkv;
        at.names[0] = o;
        Ok(at)
    }

    /// plamo2's `q_weight` / `k_weight` under `p`: each head (after the heads move ahead of
    /// the positions) normed by `rms_norm(x, None, eps)`, then times its own weight row.
    pub(crate) fn with_head_weights(
        mut self,
        w: &mut Weights,
        p: &str,
        eps: f32,
    ) -> Result<Attention> {
        let (h, kv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let q = w.take(&format!("{p}.q_weight"), &[h, hd])?;
        let k = w.take(&format!("{p}.k_weight"), &[kv, hd])?;
        self.head_weights = Some(Box::new((q, k, eps)));
        Ok(self)
    }

    /// `q_norm` and `k_norm` under `p`, RMS norms over each head (`head_dim`) after the heads
    /// split, before they move ahead of the positions.
    pub(crate) fn with_head_norms(
        mut self,
        w: &mut Weights,
        p: &str,
        eps: f32,
    ) -> Result<Attention> {
        let hd = self.head_dim;
        self.q_norm = Some(RmsNorm::load(w, &format!("{p}.q_norm"), hd, eps)?);
        self.k_norm = Some(RmsNorm::load(w, &format!("{p}.k_norm"), hd, eps)?);
        self.qk_norm = QkNorm::PerHead;
        Ok(self)
    }

    /// The rotary embedding of queries and keys (`None`: no positional encoding).
    pub(crate) fn with_rope(mut self, rope: Option<Rope>) -> Attention {
        self.rope = rope;
        self
    }

    pub(crate) fn new(s: AttentionSpec, w: &mut Weights, path: &str) -> Result<Attention> {
        Attention::new_with(s, w, path, true, None)
    }

    /// [`Attention::new`]; without `k_proj` / `v_proj` when `kv_proj` is false (the layer
    /// takes another layer's keys and values); with the fused projection `fused` in place of
    /// the three.
    pub(crate) fn new_with(
        s: AttentionSpec,
        w: &mut Weights,
        path: &str,
        kv_proj: bool,
        fused: Option<&'static str>,
    ) -> Result<Attention> {
        let (dim, hd) = (s.hidden_size, s.head_dim);
        let kv_proj = kv_proj && fused.is_none();
        let p = |n: &str| format!("{path}.{n}");
        let [o_name, q_name, k_name] = s.names;
        let (q_dims, k_dims) = match s.qk_norm {
            QkNorm::Full => (s.n_heads * hd, s.n_kv_heads * hd),
            _ => (hd, hd),
        };
        let (q_norm, k_norm) = match s.qk_norm {
            QkNorm::None => (None, None),
            _ => (
                Some(RmsNorm::load(w, &p(q_name), q_dims, s.eps)?),
                Some(RmsNorm::load(w, &p(k_name), k_dims, s.eps)?),
            ),
        };
        Ok(Attention {
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: hd,
            scale: if s.inv_sqrt_scale {
                (1.0 / f64::from(hd).sqrt()) as f32
            } else {
                f64::from(hd).powf(-0.5) as f32
            },
            qk_norm: s.qk_norm,
            q_proj: match fused {
                Some(name) => Linear::load(
                    w,
                    &p(name),
                    dim,
                    (s.n_heads + 2 * s.n_kv_heads) * hd,
                    s.qkv_bias,
                )?,
                None => Linear::load(w, &p("q_proj"), dim, s.n_heads * hd, s.qkv_bias)?,
            },
            k_proj: if kv_proj {
                Some(Linear::load(
                    w,
                    &p("k_proj"),
                    dim,
                    s.n_kv_heads * hd,
                    s.qkv_bias,
                )?)
            } else {
                None
            },
            v_proj: if kv_proj {
                Some(Linear::load(
                    w,
                    &p("v_proj"),
                    dim,
                    s.n_kv_heads * hd,
                    s.qkv_bias,
                )?)
            } else {
                None
            },
            o_proj: Linear::load(w, &p(o_name), s.n_heads * hd, dim, s.o_bias)?,
            q_norm,
            k_norm,
            sinks: if s.sinks {
                Some(w.take(&p("sinks"), &[s.n_heads])?)
            } else {
                None
            },
            rope: Some(s.rope),
            fused_qkv: fused.is_some(),
            q_name: fused.unwrap_or("q_proj"),
            out_gate: None,
            head_gate: None,
            value_scale: None,
            sink_name: "sinks",
            head_weights: None,
            query_gate: false,
            names: s.names,
            sharded_norms: None,
        })
    }

    /// Learned per-head sinks `{p}.{name}` (one per query head).
    pub(crate) fn with_sinks(
        mut self,
        w: &mut Weights,
        p: &str,
        name: &'static str,
    ) -> Result<Attention> {
        self.sinks = Some(w.take(&format!("{p}.{name}"), &[self.n_heads])?);
        self.sink_name = name;
        Ok(self)
    }

    /// Values times `scale` (mimo_v2_flash's `attention_value_scale`), when given.
    pub(crate) fn with_value_scale(mut self, scale: Option<f64>) -> Attention {
        self.value_scale = scale;
        self
    }

    /// The head-wise gate `{p}.g_proj` (`hidden -> heads`, no bias) of `kind`.
    pub(crate) fn with_head_gate(
        mut self,
        w: &mut Weights,
        p: &str,
        hidden: i32,
        kind: HeadGate,
    ) -> Result<Attention> {
        let g = Linear::load(w, &format!("{p}.g_proj"), hidden, self.n_heads, false)?;
        self.head_gate = Some((kind, g));
        Ok(self)
    }

    /// Scores scaled by `scale` in place of the one the spec gave.
    pub(crate) fn with_scale(mut self, scale: f32) -> Attention {
        self.scale = scale;
        self
    }

    /// llama's `shard()` of the projections (step3p5's): q, k, v all-to-sharded, o
    /// sharded-to-all, heads and KV heads / N, a head-wise gate's rows all-to-sharded.
    pub(crate) fn shard_projections(&mut self, size: i32, rank: i32, path: &str) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all};
        let p = |m: &str| format!("{path}.{m}");
        let (Some(k_proj), Some(v_proj)) = (self.k_proj.as_mut(), self.v_proj.as_mut()) else {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: "a layer reusing another's keys and values cannot be sharded".into(),
            });
        };
        all_to_sharded(&mut self.q_proj, size, rank, &p(self.q_name))?;
        all_to_sharded(k_proj, size, rank, &p("k_proj"))?;
        all_to_sharded(v_proj, size, rank, &p("v_proj"))?;
        sharded_to_all(&mut self.o_proj, size, rank, &p(self.names[0]))?;
        self.n_heads /= size;
        self.n_kv_heads /= size;
        if let Some((_, g)) = self.head_gate.as_mut() {
            all_to_sharded(g, size, rank, &p("g_proj"))?;
        }
        Ok(())
    }

    /// Walks the projections under their names (`q_proj`, `k_proj`, `v_proj`, then the
    /// output projection under this model's name, the order every mlx-lm attention here
    /// declares them in), the q/k norms, the output and head gates, and the sinks.
    pub(crate) fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            sinks,
            names: [o_name, q_name, k_name],
            q_name: q_proj_name,
            out_gate,
            head_gate,
            sink_name,
            head_weights,
            ..
        } = self;
        let p = |n: &str| join(path, n);
        w.linear(&p(q_proj_name), q_proj);
        w.linear_opt(&p("k_proj"), k_proj.as_mut());
        w.linear_opt(&p("v_proj"), v_proj.as_mut());
        w.linear(&p(o_name), o_proj);
        for (name, n) in [(*q_name, q_norm), (*k_name, k_norm)] {
            if let Some(n) = n {
                w.rms_norm(&p(name), n);
            }
        }
        w.linear_opt(&p("gate_proj"), out_gate.as_mut());
        w.linear_opt(&p("g_proj"), head_gate.as_mut().map(|(_, g)| g));
        if let Some(sinks) = sinks {
            w.array(path, sink_name, sinks);
        }
        if let Some((q, k, _)) = head_weights.as_deref_mut() {
            w.array(path, "q_weight", q);
            w.array(path, "k_weight", k);
        }
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        Ok(self.forward_shared(x, mask, cache, None)?.0)
    }

    /// [`Attention::forward`], also returning the keys and values as projected (before the
    /// reshape), which a layer without its own projections takes as `shared` (hunyuan's
    /// cross-layer attention).
    pub(crate) fn forward_shared(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
        shared: Option<&(Array, Array)>,
    ) -> Result<(Array, (Array, Array))> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let norm = |n: &Option<RmsNorm>, y: Array| -> Result<Array> {
            match n {
                Some(n) => n.forward(&y),
                None => Ok(y),
            }
        };
        let mut queries = self.q_proj.forward(x)?;
        let mut query_gate = None;
        if self.query_gate {
            let q_out = ops::reshape(&queries, &[b, l, self.n_heads, -1], None)?;
            let mut qg = ops::split_equal(&q_out, 2, -1, None)?.into_iter();
            let (Some(q), Some(g)) = (qg.next(), qg.next()) else {
                return Err(ModelError::Internal {
                    what: "gated queries".into(),
                    problem: "split gave fewer than 2".into(),
                });
            };
            queries = q;
            query_gate = Some(ops::reshape(&g, &[b, l, -1], None)?);
        }
        let fused = if self.fused_qkv {
            let (qs, ks) = (self.n_heads, self.n_kv_heads);
            let hd = queries.shape().last().copied().unwrap_or(0) / (qs + 2 * ks);
            let mut parts = ops::split_at(&queries, &[qs * hd, (qs + ks) * hd], -1, None)?;
            let v = parts.pop();
            let k = parts.pop();
            queries = parts.pop().ok_or_else(|| ModelError::Internal {
                what: "moe".into(),
                problem: "qkv split".into(),
            })?;
            k.zip(v)
        } else {
            None
        };
        let (mut keys, values) = match (fused, &self.k_proj, &self.v_proj, shared) {
            (Some(kv), ..) => kv,
            (None, Some(k), Some(v), None) => (k.forward(x)?, v.forward(x)?),
            (None, _, _, Some((k, v))) => (k.clone(), v.clone()),
            _ => {
                return Err(ModelError::Unsupported {
                    what: "a layer".into(),
                    problem: "without k_proj / v_proj needs an earlier layer's keys and values"
                        .into(),
                })
            }
        };
        let kv_states = (keys.clone(), values.clone());
        if self.qk_norm == QkNorm::Full {
            if let (Some(n), Some(qn), Some(kn)) = (self.sharded_norms, &self.q_norm, &self.k_norm)
            {
                queries = crate::shard::sharded_rms_norm(&queries, &qn.weight, qn.eps, n)?;
                keys = crate::shard::sharded_rms_norm(&keys, &kn.weight, kn.eps, n)?;
            } else {
                queries = norm(&self.q_norm, queries)?;
                keys = norm(&self.k_norm, keys)?;
            }
        }
        let split = |y: &Array, n: i32| ops::reshape(y, &[b, l, n, -1], None);
        // Gated queries are in heads already (`Qwen3NextAttention` splits the gate off the
        // heads' view and reshapes nothing more): no second reshape, as mlx-lm's graph has none.
        let mut queries = if query_gate.is_some() {
            queries
        } else {
            split(&queries, self.n_heads)?
        };
        let mut keys = split(&keys, self.n_kv_heads)?;
        if self.qk_norm == QkNorm::PerHead {
            queries = norm(&self.q_norm, queries)?;
            keys = norm(&self.k_norm, keys)?;
        }
        let heads = |y: &Array| ops::transpose(y, &[0, 2, 1, 3], None);
        let mut queries = heads(&queries)?;
        let mut keys = heads(&keys)?;
        if self.qk_norm == QkNorm::PerHeadTransposed {
            queries = norm(&self.q_norm, queries)?;
            keys = norm(&self.k_norm, keys)?;
        }
        if let Some((qw, kw, eps)) = self.head_weights.as_deref() {
            let per_head = |t: &Array, wgt: &Array| -> Result<Array> {
                let n = mlx_core::fast::rms_norm(t, None, *eps, None)?;
                Ok((&n * &ops::expand_dims(wgt, &[1], None)?)?)
            };
            queries = per_head(&queries, qw)?;
            keys = per_head(&keys, kw)?;
        }
        let mut values = heads(&split(&values, self.n_kv_heads)?)?;
        if let Some(v) = self.value_scale {
            values = ops::multiply_scalar(&values, v, None)?;
        }
        let rope = |y: &Array, offset: usize| -> Result<Array> {
            match &self.rope {
                Some(r) => r.forward(y, offset),
                None => Ok(y.clone()),
            }
        };
        let after_rope = |q: Array, k: Array| -> Result<(Array, Array)> {
            if self.qk_norm == QkNorm::AfterRope {
                Ok((norm(&self.q_norm, q)?, norm(&self.k_norm, k)?))
            } else {
                Ok((q, k))
            }
        };
        let (queries, kv) = match cache {
            Some(c) => {
                let offset = c.offset();
                let q = rope(&queries, offset)?;
                let k = rope(&keys, offset)?;
                let (q, k) = after_rope(q, k)?;
                (q, c.update_and_fetch(&k, &values)?)
            }
            None => {
                let (q, k) = after_rope(rope(&queries, 0)?, rope(&keys, 0)?)?;
                (q, mlx_cache::Kv::Dense { keys: k, values })
            }
        };
        let out =
            scaled_dot_product_attention(&queries, &kv, self.scale, mask, self.sinks.as_ref())?;
        let mut out = ops::reshape(&heads(&out)?, &[b, l, -1], None)?;
        if let Some(g) = &query_gate {
            out = (&out * &ops::sigmoid(g, None)?)?;
        }
        if let Some(g) = &self.out_gate {
            out = (&out * &ops::sigmoid(&g.forward(x)?, None)?)?;
        }
        if let Some((kind, g)) = &self.head_gate {
            let gate = match kind {
                HeadGate::Softplus => {
                    let z = g.forward(x)?.astype(Dtype::Float32)?;
                    let zero = Scalar::Int(0).to_array_like(z.dtype())?;
                    ops::logaddexp(&z, &zero, None)?.astype(out.dtype())?
                }
                HeadGate::Sigmoid => ops::sigmoid(&g.forward(x)?, None)?,
            };
            let per_head = ops::reshape(&out, &[b, l, self.n_heads, -1], None)?;
            out = ops::reshape(
                &(&per_head * &ops::expand_dims(&gate, &[-1], None)?)?,
                &[b, l, -1],
                None,
            )?;
        }
        Ok((self.o_proj.forward(&out)?, kv_states))
    }
}

impl Walkable for Attention {
    /// [`Attention::walk`].
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        Attention::walk(self, path, w);
    }
}
