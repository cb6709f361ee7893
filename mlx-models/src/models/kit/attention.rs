//! The one plain softmax attention of the ports that compose the kit and of the dense
//! descriptor rows (issue #29): q/k/v projections (separate; fused in one of three layouts;
//! or none where a layer reuses another's keys and values), optional q/k norms (whole
//! projection, per head, per transposed head, after the rope; Cohere's and StableLM's layer
//! norms), heads, optional rope (whole, partial by slicing, at per-row offsets), the cache,
//! the scores (MLX's SDPA with optional sinks and upcasts, Gemma 2's soft cap, OLMo's written
//! out), optional output gates and sub-norm, and the output projection. The variants are
//! options of this one type; each names the mlx-lm file that needs it.

use mlx_cache::{AttentionMask, Cache, Kv};
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::layers::{
    join, scaled_dot_product_attention, Linear, Norm, RmsNorm, Rope, Walk, Walkable,
};
use crate::models::descriptor::{QkvLayout, Upcast};
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

/// How a head-wise gate's `g_proj(x)` scales each head's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeadGate {
    /// laguna: `softplus(g.astype(float32)).astype(out.dtype)`.
    Softplus,
    /// step3p5: `sigmoid(g)`.
    Sigmoid,
    /// spark2_5 (a descriptor row): `sigmoid(g.astype(float32)).astype(out.dtype)` on the
    /// heads before they are joined; declared before the output projection.
    SigmoidF32,
}

/// How the scores become the attention output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Score {
    /// MLX's SDPA (with the sinks, when given), with the float32 casts of [`Upcast`] (Phi,
    /// StableLM, Cohere 2).
    Sdpa(Upcast),
    /// Gemma 2's scores capped by `cap * tanh(s / cap)`, written out as mlx-lm does.
    SoftCapped(f32),
    /// OLMo's scores written out (olmo.py).
    Manual,
    /// gear.py's `_softcap_attention`: the keys' and values' heads repeated by broadcast, the
    /// scores capped by `cap * tanh(s / cap)`, a causal mask built from positions.
    SoftCappedRepeated(f32),
}

/// Cohere's and StableLM's q/k layer norms, which are not [`Norm`]s: each head normed by a
/// weightless `layer_norm`, then times its own weight row.
#[derive(Clone)]
pub(crate) enum LayerNormQk {
    /// Cohere's `LayerNorm2D`: `weight * layer_norm(x, None, None, eps)`, weights
    /// `(heads, head_dim)`.
    TwoD { q: Array, k: Array, eps: f32 },
    /// StableLM's `LayerNormPerHead`: one stored weight per head (`norms.<h>.weight`),
    /// stacked at every call, then as [`LayerNormQk::TwoD`].
    PerHead {
        q: Vec<Array>,
        k: Vec<Array>,
        eps: f32,
    },
}

/// Where rope rotates: a position (a plain cache's offset) or an int32 array of offsets (a
/// batched cache's per-row offsets, or the compiled decode step's scalar input).
#[derive(Clone, Copy)]
pub(crate) enum RopeAt<'a> {
    Int(usize),
    Array(&'a Array),
}

/// `weight * mx.fast.layer_norm(x, None, None, eps)` (Cohere's `LayerNorm2D`, StableLM's
/// `LayerNormPerHead` after its `mx.stack`).
fn scaled_layer_norm(weight: &Array, x: &Array, eps: f32) -> Result<Array> {
    Ok((weight * &mlx_core::fast::layer_norm(x, None, None, eps, None)?)?)
}

/// `mx.stack([n.weight for n in self.norms])`.
fn stack_heads(rows: &[Array]) -> Result<Array> {
    let refs: Vec<&Array> = rows.iter().collect();
    Ok(ops::stack(&refs, 0, None)?)
}

/// Queries or keys, for the steps both run ([`Attention::finish_heads`]).
#[derive(Clone, Copy)]
enum Side {
    Queries,
    Keys,
}

/// Which keys and values [`Attention::project_heads`] makes.
#[derive(Clone, Copy)]
enum KvSource<'a> {
    /// The layer's own projections.
    Own,
    /// hunyuan's cross-layer attention: an earlier layer's keys and values as projected
    /// (before the reshape).
    Projected(&'a (Array, Array)),
    /// None: the layer attends over keys and values it is handed after the cache
    /// (gemma4_text's KV-shared layers).
    None,
}

/// What [`Attention::project`] gives: queries, keys and values as `(B, heads, L, head_dim)`,
/// and qwen3_next's query gate for the output.
struct Projected {
    queries: Array,
    keys: Array,
    values: Array,
    query_gate: Option<Array>,
}

/// The plain softmax attention (mlx-lm's `Attention` of the moe rows, lfm2, nemotron_nas,
/// deepseek's standard layers, `NemotronHAttention`, jamba's, `GraniteMoeHybridAttention`,
/// `FalconH1Attention`, olmo_hybrid's, mimo_v2_flash's, bailing_moe_linear's global layers,
/// recurrent_gemma's `LocalAttentionBlock`, `Qwen3NextAttention`, `Step3p5Attention`,
/// plamo2's, gear's, gemma3n's, gemma4_text's, llama4's, and every dense descriptor
/// row's). Built as mlx-lm's `__init__` loads it: [`Attention::new`] from an [`AttentionSpec`], or [`Attention::load`] (or `load_v`,
/// `load_fused`, `load_query_gated`, `from_parts`) then the `with_*` options (norms, sinks,
/// gates, value scale, rope) in that file's order; the dense rows' loader
/// (`dense::load_attention`) sets the descriptor's layout, norm, score and rope fields.
#[derive(Clone)]
pub(crate) struct Attention {
    pub(crate) n_heads: i32,
    pub(crate) n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
    /// Where `q_norm` / `k_norm` sit.
    pub(crate) qk_norm: QkNorm,
    /// The query projection, or the fused q/k/v one when `fused` is set.
    pub(crate) q_proj: Linear,
    /// `None` on hunyuan's layers that reuse the previous layer's keys and values
    /// (cross-layer attention), and when `q_proj` is fused.
    pub(crate) k_proj: Option<Linear>,
    pub(crate) v_proj: Option<Linear>,
    pub(crate) o_proj: Linear,
    pub(crate) q_norm: Option<Norm>,
    pub(crate) k_norm: Option<Norm>,
    /// Cohere's or StableLM's layer-norm q/k norms (descriptor rows), applied per head
    /// before the heads move ahead of the positions.
    pub(crate) layer_norms: Option<Box<LayerNormQk>>,
    pub(crate) sinks: Option<Array>,
    /// `None`: no positional encoding (nemotron_h; exaone_moe's global layers when it has
    /// sliding ones; the descriptor's no-rope layers).
    pub(crate) rope: Option<Rope>,
    /// gptj: rope on the first `rope.dims()` of each head, concatenated with the rest.
    pub(crate) rope_slice_concat: bool,
    /// Rope at a batched cache's per-row offsets ([`Cache::offsets`]) when it has them, as
    /// the descriptor rows do; otherwise (the kit ports) at its `offset`.
    pub(crate) row_offsets: bool,
    /// `q_proj` holds the fused query/key/value projection (named `q_name`) in this layout
    /// (bailing_moe, plamo2 and phi3 `[q | k | v]`; internlm2's interleaved; gpt_neox's per
    /// head).
    pub(crate) fused: Option<QkvLayout>,
    /// The name of `q_proj` (the fused projection's when fused).
    q_name: &'static str,
    /// The names of `k_proj` and `v_proj`.
    kv_names: [&'static str; 2],
    /// afmoe: `gate_proj`, whose sigmoid scales the attention output before `o_proj`.
    pub(crate) out_gate: Option<Linear>,
    /// `g_proj` (named `gate_name`) to one value per head, whose [`HeadGate`] scales each
    /// head's output before `o_proj`.
    pub(crate) head_gate: Option<(HeadGate, Linear)>,
    gate_name: &'static str,
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
    /// How the scores are computed.
    pub(crate) score: Score,
    /// plamo: the keys' and values' heads tiled this many times after the cache.
    pub(crate) kv_tile: Option<i32>,
    /// The heads' transposes made contiguous ([`crate::models::descriptor::Descriptor::contiguous_heads`]).
    pub(crate) contiguous: bool,
    /// bitnet's `attn_sub_norm` before the output projection.
    pub(crate) sub_norm: Option<Norm>,
    /// gemma3n: the values' heads normed (a weightless RMS norm) before they move ahead of
    /// the positions.
    pub(crate) value_norm: Option<Norm>,
    /// gemma3n's KV-shared layers: with a cache (another layer's, written earlier in this
    /// step) attend over the keys and values it holds, without writing to it.
    pub(crate) kv_from_cache: bool,
    /// gemma4_text's `attention_k_eq_v` layers: no `v_proj`; the values are the keys' heads
    /// as split (before the k norm and the rope).
    pub(crate) values_from_keys: bool,
    /// llama4's temperature tuning: the queries times the query scale are cast back to the
    /// queries' dtype.
    pub(crate) query_scale_cast: bool,
}

impl Attention {
    /// The scores' scale.
    pub(crate) fn scale(&self) -> f32 {
        self.scale
    }

    /// The options a reader of this attention's arrays (the graph decoder, through
    /// `moe::Model::layer_view`) cannot see from its public parts, named for messages: a
    /// value scale, per-head q/k weights, gated queries, and the descriptor rows' options
    /// (layer-norm or non-RMS q/k norms, scores other than SDPA, tiled KV heads, a sub-norm,
    /// a sliced rope, per-row rope offsets).
    pub(crate) fn unusual(&self) -> Vec<&'static str> {
        let non_rms = |n: &Option<Norm>| n.as_ref().is_some_and(|n| n.as_rms().is_none());
        [
            (self.value_scale.is_some(), "a value scale"),
            (self.head_weights.is_some(), "per-head q/k weights"),
            (self.query_gate, "gated queries"),
            (self.layer_norms.is_some(), "layer-norm q/k norms"),
            (
                non_rms(&self.q_norm) || non_rms(&self.k_norm),
                "q/k norms other than RMSNorm",
            ),
            (
                self.score != Score::Sdpa(Upcast::None),
                "scores upcast, soft-capped or written out",
            ),
            (self.kv_tile.is_some(), "tiled KV heads"),
            (self.sub_norm.is_some(), "an attention sub-norm"),
            (self.rope_slice_concat, "a sliced rope"),
            (self.row_offsets, "per-row rope offsets"),
            (self.values_from_keys, "values from the keys"),
        ]
        .into_iter()
        .filter_map(|(present, what)| present.then_some(what))
        .collect()
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
        Ok(Attention::from_parts(
            q_proj,
            (Some(k_proj), Some(v_proj)),
            o_proj,
            (h, kv, hd),
            scale,
        ))
    }

    /// Projections as loaded (no keys and values of its own: fused, or another layer's):
    /// no norms, rope, sinks or gates; the scores MLX's SDPA.
    pub(crate) fn from_parts(
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
            layer_norms: None,
            sinks: None,
            rope: None,
            rope_slice_concat: false,
            row_offsets: false,
            fused: None,
            q_name: "q_proj",
            kv_names: ["k_proj", "v_proj"],
            out_gate: None,
            head_gate: None,
            gate_name: "g_proj",
            value_scale: None,
            sink_name: "sinks",
            head_weights: None,
            query_gate: false,
            names: ["o_proj", "q_norm", "k_norm"],
            sharded_norms: None,
            score: Score::Sdpa(Upcast::None),
            kv_tile: None,
            contiguous: false,
            sub_norm: None,
            value_norm: None,
            kv_from_cache: false,
            values_from_keys: false,
            query_scale_cast: false,
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
        self.q_norm = Some(Norm::Rms(RmsNorm::load(w, &format!("{p}.q_norm"), q, eps)?));
        self.k_norm = Some(Norm::Rms(RmsNorm::load(w, &format!("{p}.k_norm"), k, eps)?));
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
        let mut at = Attention::from_parts(q_proj, kv_proj, o_proj, (h, kv, hd), scale);
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
        let mut at = Attention::from_parts(fused, (None, None), o_proj, (h, kv, hd), scale);
        at.fused = Some(QkvLayout::Split);
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
        self.q_norm = Some(Norm::Rms(RmsNorm::load(
            w,
            &format!("{p}.q_norm"),
            hd,
            eps,
        )?));
        self.k_norm = Some(Norm::Rms(RmsNorm::load(
            w,
            &format!("{p}.k_norm"),
            hd,
            eps,
        )?));
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
                Some(Norm::Rms(RmsNorm::load(w, &p(q_name), q_dims, s.eps)?)),
                Some(Norm::Rms(RmsNorm::load(w, &p(k_name), k_dims, s.eps)?)),
            ),
        };
        let (h, kv) = (s.n_heads, s.n_kv_heads);
        let q_proj = match fused {
            Some(name) => Linear::load(w, &p(name), dim, (h + 2 * kv) * hd, s.qkv_bias)?,
            None => Linear::load(w, &p("q_proj"), dim, h * hd, s.qkv_bias)?,
        };
        let kv_proj = if kv_proj {
            let mut l = |n: &str| Linear::load(w, &p(n), dim, kv * hd, s.qkv_bias);
            (Some(l("k_proj")?), Some(l("v_proj")?))
        } else {
            (None, None)
        };
        let o_proj = Linear::load(w, &p(o_name), h * hd, dim, s.o_bias)?;
        let scale = if s.inv_sqrt_scale {
            (1.0 / f64::from(hd).sqrt()) as f32
        } else {
            f64::from(hd).powf(-0.5) as f32
        };
        let mut a = Attention::from_parts(q_proj, kv_proj, o_proj, (h, kv, hd), scale);
        if s.sinks {
            a.sinks = Some(w.take(&p("sinks"), &[h])?);
        }
        if let Some(name) = fused {
            a.fused = Some(QkvLayout::Split);
            a.q_name = name;
        }
        a.qk_norm = s.qk_norm;
        a.q_norm = q_norm;
        a.k_norm = k_norm;
        a.rope = Some(s.rope);
        a.names = s.names;
        Ok(a)
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

    /// The modules' names: the query (or fused) projection, the key and value projections,
    /// and [`AttentionSpec::names`] (output projection, q norm, k norm).
    pub(crate) fn with_names(
        mut self,
        q: &'static str,
        kv: [&'static str; 2],
        names: [&'static str; 3],
    ) -> Attention {
        self.q_name = q;
        self.kv_names = kv;
        self.names = names;
        self
    }

    /// A head-wise gate of `kind` already loaded, named `name`.
    pub(crate) fn with_gate(mut self, kind: HeadGate, name: &'static str, g: Linear) -> Attention {
        self.head_gate = Some((kind, g));
        self.gate_name = name;
        self
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
        let [k_name, v_name] = self.kv_names;
        all_to_sharded(&mut self.q_proj, size, rank, &p(self.q_name))?;
        all_to_sharded(k_proj, size, rank, &p(k_name))?;
        all_to_sharded(v_proj, size, rank, &p(v_name))?;
        sharded_to_all(&mut self.o_proj, size, rank, &p(self.names[0]))?;
        self.n_heads /= size;
        self.n_kv_heads /= size;
        if let Some((_, g)) = self.head_gate.as_mut() {
            all_to_sharded(g, size, rank, &p(self.gate_name))?;
        }
        Ok(())
    }

    /// Walks the projections under their names (`q_proj`, `k_proj`, `v_proj` or the fused
    /// one, a [`HeadGate::SigmoidF32`] gate, then the output projection under this model's
    /// name, the order every mlx-lm attention here declares them in), the q/k norms, the
    /// output and other head gates, and the sinks.
    pub(crate) fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            layer_norms,
            sinks,
            names: [o_name, q_name, k_name],
            q_name: q_proj_name,
            kv_names: [k_proj_name, v_proj_name],
            out_gate,
            head_gate,
            gate_name,
            sink_name,
            head_weights,
            ..
        } = self;
        let p = |n: &str| join(path, n);
        w.linear(&p(q_proj_name), q_proj);
        w.linear_opt(&p(k_proj_name), k_proj.as_mut());
        w.linear_opt(&p(v_proj_name), v_proj.as_mut());
        let (early_gate, late_gate) = match head_gate {
            Some((HeadGate::SigmoidF32, g)) => (Some(g), None),
            Some((_, g)) => (None, Some(g)),
            None => (None, None),
        };
        w.linear_opt(&p(gate_name), early_gate);
        w.linear(&p(o_name), o_proj);
        for (name, n) in [(*q_name, q_norm), (*k_name, k_norm)] {
            if let Some(n) = n {
                w.norm(&p(name), n);
            }
        }
        match layer_norms.as_deref_mut() {
            None => {}
            Some(LayerNormQk::TwoD { q, k, .. }) => {
                w.array(&p(q_name), "weight", q);
                w.array(&p(k_name), "weight", k);
            }
            Some(LayerNormQk::PerHead { q, k, .. }) => {
                for (name, rows) in [(*q_name, q), (*k_name, k)] {
                    let path = p(name);
                    for (h, a) in rows.iter_mut().enumerate() {
                        w.array(&join(&path, &format!("norms.{h}")), "weight", a);
                    }
                }
            }
        }
        w.linear_opt(&p("gate_proj"), out_gate.as_mut());
        w.linear_opt(&p(gate_name), late_gate);
        if let Some(sinks) = sinks {
            w.array(path, sink_name, sinks);
        }
        if let Some((q, k, _)) = head_weights.as_deref_mut() {
            w.array(path, "q_weight", q);
            w.array(path, "k_weight", k);
        }
    }

    /// The projections in [`Attention::walk`]'s order.
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        let mut out = vec![&self.q_proj];
        out.extend(self.k_proj.iter().chain(&self.v_proj));
        let gate = self.head_gate.as_ref();
        if let Some((HeadGate::SigmoidF32, g)) = gate {
            out.push(g);
        }
        out.push(&self.o_proj);
        out.extend(&self.out_gate);
        if let Some((kind, g)) = gate {
            if *kind != HeadGate::SigmoidF32 {
                out.push(g);
            }
        }
        out
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        Ok(self.forward_shared(x, mask, cache, None)?.0)
    }

    /// [`Attention::forward`] with Ministral 3's per-position query scale (the descriptor
    /// rows' `llama_4_scaling`).
    pub(crate) fn forward_scaled(
        &self,
        x: &Array,
        mask: &AttentionMask,
        query_scale: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        Ok(self.run(x, mask, query_scale, cache, None)?.0)
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
        self.run(x, mask, None, cache, shared)
    }

    /// [`Attention::forward`] with the rope at `offset` (gemma3n: one offset for the whole
    /// pass, read before its KV-shared layers' caches advanced).
    pub(crate) fn forward_at(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
        offset: usize,
    ) -> Result<Array> {
        Ok(self.run_at(x, mask, None, cache, None, Some(offset))?.0)
    }

    fn run(
        &self,
        x: &Array,
        mask: &AttentionMask,
        query_scale: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
        shared: Option<&(Array, Array)>,
    ) -> Result<(Array, (Array, Array))> {
        self.run_at(x, mask, query_scale, cache, shared, None)
    }

    /// The whole attention; the rope at `offset` when given, else at the cache's.
    fn run_at(
        &self,
        x: &Array,
        mask: &AttentionMask,
        query_scale: Option<&Array>,
        cache: Option<&mut Box<dyn Cache>>,
        shared: Option<&(Array, Array)>,
        offset: Option<usize>,
    ) -> Result<(Array, (Array, Array))> {
        // A batched cache (left-padded rows) carries one offset per row.
        let offset = offset.unwrap_or_else(|| cache.as_ref().map_or(0, |c| c.offset()));
        let offsets = match &cache {
            Some(c) if self.row_offsets => c.offsets(),
            _ => None,
        };
        let at = match &offsets {
            Some(o) => RopeAt::Array(o),
            None => RopeAt::Int(offset),
        };
        let (p, kv_states) = self.project_full(x, at, shared)?;
        let kv = match cache {
            // The keys and values projected above are left unused (never evaluated).
            Some(c) if self.kv_from_cache => c.fetch()?.ok_or_else(|| ModelError::Cache {
                what: "a KV-shared layer".into(),
                problem: "its cache holds no keys and values".into(),
            })?,
            Some(c) => c.update_and_fetch(&p.keys, &p.values)?,
            None => Kv::Dense {
                keys: p.keys,
                values: p.values,
            },
        };
        let out = self.attend(&p.queries, &kv, mask, query_scale)?;
        Ok((
            self.output_gated(x, &out, p.query_gate.as_ref())?,
            kv_states,
        ))
    }

    /// gemma4_text's attention, at one offset for the pass. With `shared` (an earlier
    /// layer's keys and values after its cache, and the offset its rope used) only the
    /// queries are projected, roped at that offset, and attend over them; the cache is
    /// neither read nor written. Otherwise as [`Attention::forward`], the rope at the cache's
    /// offset. Returns the output, the keys and values attended over, and the offset, which
    /// the layers sharing them take.
    pub(crate) fn forward_reusing(
        &self,
        x: &Array,
        mask: &AttentionMask,
        cache: Option<&mut Box<dyn Cache>>,
        shared: Option<(&Kv, usize)>,
    ) -> Result<(Array, Kv, usize)> {
        let (offset, source) = match shared {
            Some((_, offset)) => (offset, KvSource::None),
            None => (cache.as_ref().map_or(0, |c| c.offset()), KvSource::Own),
        };
        let (queries, query_gate, own) = self.project_heads(x, RopeAt::Int(offset), source)?;
        let kv = match (shared, own, cache) {
            (Some((kv, _)), _, _) => kv.clone(),
            (None, Some((keys, values, _)), Some(c)) => c.update_and_fetch(&keys, &values)?,
            (None, Some((keys, values, _)), None) => Kv::Dense { keys, values },
            (None, None, _) => {
                return Err(ModelError::Internal {
                    what: "attention".into(),
                    problem: "projected no keys and values".into(),
                })
            }
        };
        let out = self.attend(&queries, &kv, mask, None)?;
        Ok((self.output_gated(x, &out, query_gate.as_ref())?, kv, offset))
    }

    /// Everything before the cache write: projections, q/k norms, head split and rope at
    /// `at`; queries, keys and values as `(B, heads, L, head_dim)` (the descriptor rows'
    /// segmented decode). Gated queries (whose gate the output needs) are refused.
    pub(crate) fn project(&self, x: &Array, at: RopeAt<'_>) -> Result<(Array, Array, Array)> {
        if self.query_gate {
            return Err(ModelError::Unsupported {
                what: "gated queries".into(),
                problem: "cannot run as separate projection and output steps".into(),
            });
        }
        let (p, _) = self.project_full(x, at, None)?;
        Ok((p.queries, p.keys, p.values))
    }

    /// [`Attention::project`] with the query gate, and the keys and values as projected
    /// (before the reshape; [`Attention::forward_shared`]).
    fn project_full(
        &self,
        x: &Array,
        at: RopeAt<'_>,
        shared: Option<&(Array, Array)>,
    ) -> Result<(Projected, (Array, Array))> {
        let source = shared.map_or(KvSource::Own, KvSource::Projected);
        let (queries, query_gate, kv) = self.project_heads(x, at, source)?;
        let Some((keys, values, kv_states)) = kv else {
            return Err(ModelError::Internal {
                what: "attention".into(),
                problem: "projected no keys and values".into(),
            });
        };
        let p = Projected {
            queries,
            keys,
            values,
            query_gate,
        };
        Ok((p, kv_states))
    }

    /// The projections, q/k norms, head split and rope at `at`: the queries' heads, the
    /// query gate, and (unless `source` is [`KvSource::None`]) the keys' and values' heads
    /// with the keys and values as projected. Each of queries and keys runs the same
    /// pipeline ([`Attention::finish_heads`]).
    #[allow(clippy::type_complexity)]
    fn project_heads(
        &self,
        x: &Array,
        at: RopeAt<'_>,
        source: KvSource<'_>,
    ) -> Result<(Array, Option<Array>, Option<(Array, Array, (Array, Array))>)> {
        let sh = x.shape();
        let (b, l) = (sh[0], sh[1]);
        let (hd, qs, ks) = (self.head_dim, self.n_heads, self.n_kv_heads);
        let three = |parts: Vec<Array>| -> Result<(Array, Option<(Array, Option<Array>)>)> {
            let mut parts = parts.into_iter();
            match (parts.next(), parts.next(), parts.next()) {
                (Some(q), Some(k), Some(v)) => Ok((q, Some((k, Some(v))))),
                _ => Err(ModelError::Internal {
                    what: "qkv split".into(),
                    problem: "gave fewer than 3".into(),
                }),
            }
        };
        if self.fused.is_some() && matches!(source, KvSource::None) {
            return Err(ModelError::Unsupported {
                what: "a fused q/k/v projection".into(),
                problem: "cannot project the queries alone".into(),
            });
        }
        let mut query_gate = None;
        // The keys and values as projected; values `None` where they are the keys' heads
        // (`values_from_keys`).
        let (queries, kv_raw) = match self.fused {
            None => {
                let mut queries = self.q_proj.forward(x)?;
                if self.query_gate {
                    let q_out = ops::reshape(&queries, &[b, l, qs, -1], None)?;
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
                let kv = match (source, &self.k_proj, &self.v_proj) {
                    (KvSource::None, _, _) => None,
                    (KvSource::Projected((k, v)), _, _) => Some((k.clone(), Some(v.clone()))),
                    (KvSource::Own, Some(k), _) if self.values_from_keys => {
                        Some((k.forward(x)?, None))
                    }
                    (KvSource::Own, Some(k), Some(v)) => Some((k.forward(x)?, Some(v.forward(x)?))),
                    _ => {
                        return Err(ModelError::Unsupported {
                            what: "a layer".into(),
                            problem:
                                "without k_proj / v_proj needs an earlier layer's keys and values"
                                    .into(),
                        })
                    }
                };
                (queries, kv)
            }
            Some(QkvLayout::Split) => {
                let qp = qs * hd;
                let fused = self.q_proj.forward(x)?;
                three(ops::split_at(&fused, &[qp, qp + ks * hd], -1, None)?)?
            }
            Some(QkvLayout::Interleaved) => {
                // internlm2.py: reshape (B, L, -1, 2 + groups, head_dim); queries are
                // `[..., :groups, :]`, keys `[..., -2, :]`, values `[..., -1, :]`.
                let groups = qs / ks;
                let qkv =
                    ops::reshape(&self.q_proj.forward(x)?, &[b, l, -1, 2 + groups, hd], None)?;
                let q = ops::slice_axis(&qkv, 3, 0, groups, None)?;
                let q = ops::reshape(&q, &[b, l, -1, hd], None)?;
                let pick = |i: i32| -> Result<Array> {
                    let a = ops::slice_axis(&qkv, 3, i, i + 1, None)?;
                    Ok(ops::squeeze(&a, &[3], None)?)
                };
                (q, Some((pick(groups)?, Some(pick(groups + 1)?))))
            }
            Some(QkvLayout::PerHead) => {
                // gpt_neox.py: reshape (B, L, heads, 3 * head_dim), split in three.
                let qkv = ops::reshape(&self.q_proj.forward(x)?, &[b, l, qs, 3 * hd], None)?;
                three(ops::split_equal(&qkv, 3, -1, None)?)?
            }
        };
        // gpt_neox's per-head layout is already `(B, L, heads, head_dim)`, and gated queries
        // are in heads already (`Qwen3NextAttention` splits the gate off the heads' view):
        // mlx-lm reshapes nothing more there.
        let per_head = self.fused == Some(QkvLayout::PerHead);
        let split = |y: &Array, n: i32| -> mlx_core::Result<Array> {
            if per_head {
                return Ok(y.clone());
            }
            ops::reshape(y, &[b, l, n, -1], None)
        };
        let queries = self.full_norm(queries, Side::Queries)?;
        let queries = if query_gate.is_some() {
            queries
        } else {
            split(&queries, qs)?
        };
        let queries = self.finish_heads(queries, Side::Queries, at)?;
        let Some((keys, values)) = kv_raw else {
            return Ok((queries, query_gate, None));
        };
        let kv_states = (keys.clone(), values.clone().unwrap_or_else(|| keys.clone()));
        let keys = split(&self.full_norm(keys, Side::Keys)?, ks)?;
        // gemma4_text's `attention_k_eq_v`: the values are the keys' heads, one reshape.
        let values = match values {
            Some(v) => split(&v, ks)?,
            None => keys.clone(),
        };
        let keys = self.finish_heads(keys, Side::Keys, at)?;
        let mut values = values;
        if let Some(n) = &self.value_norm {
            values = n.forward(&values)?;
        }
        let mut values = self.heads_transpose(&values)?;
        if let Some(v) = self.value_scale {
            values = ops::multiply_scalar(&values, v, None)?;
        }
        Ok((queries, query_gate, Some((keys, values, kv_states))))
    }

    /// The q or k norm over the whole projection ([`QkNorm::Full`]; minimax's sharded one
    /// when both norms are RMS norms), else `y` as is.
    fn full_norm(&self, y: Array, side: Side) -> Result<Array> {
        if self.qk_norm != QkNorm::Full {
            return Ok(y);
        }
        if let (Some(n), Some(Norm::Rms(qn)), Some(Norm::Rms(kn))) =
            (self.sharded_norms, &self.q_norm, &self.k_norm)
        {
            let rms = match side {
                Side::Queries => qn,
                Side::Keys => kn,
            };
            return crate::shard::sharded_rms_norm(&y, &rms.weight, rms.eps, n);
        }
        self.side_norm(side, y)
    }

    /// `q_norm` or `k_norm` of `y`, or `y` where there is none.
    fn side_norm(&self, side: Side, y: Array) -> Result<Array> {
        let n = match side {
            Side::Queries => &self.q_norm,
            Side::Keys => &self.k_norm,
        };
        match n {
            Some(n) => n.forward(&y),
            None => Ok(y),
        }
    }

    /// Queries' or keys' heads `(B, L, heads, head_dim)` to `(B, heads, L, head_dim)`: the
    /// per-head norms, the layer norms, the transpose, the transposed per-head norms,
    /// plamo2's head weights, the rope at `at`, the norms after it.
    fn finish_heads(&self, y: Array, side: Side, at: RopeAt<'_>) -> Result<Array> {
        let hd = self.head_dim;
        let mut y = y;
        if self.qk_norm == QkNorm::PerHead {
            y = self.side_norm(side, y)?;
        }
        match (self.layer_norms.as_deref(), side) {
            (Some(LayerNormQk::TwoD { q, eps, .. }), Side::Queries)
            | (Some(LayerNormQk::TwoD { k: q, eps, .. }), Side::Keys) => {
                y = scaled_layer_norm(q, &y, *eps)?;
            }
            (Some(LayerNormQk::PerHead { q, eps, .. }), Side::Queries)
            | (Some(LayerNormQk::PerHead { k: q, eps, .. }), Side::Keys) => {
                y = scaled_layer_norm(&stack_heads(q)?, &y, *eps)?;
            }
            (None, _) => {}
        }
        let mut y = self.heads_transpose(&y)?;
        if self.qk_norm == QkNorm::PerHeadTransposed {
            y = self.side_norm(side, y)?;
        }
        if let Some((qw, kw, eps)) = self.head_weights.as_deref() {
            let wgt = match side {
                Side::Queries => qw,
                Side::Keys => kw,
            };
            let n = mlx_core::fast::rms_norm(&y, None, *eps, None)?;
            y = (&n * &ops::expand_dims(wgt, &[1], None)?)?;
        }
        let rotate = |r: &Rope, y: &Array| -> Result<Array> {
            match at {
                RopeAt::Array(o) => r.forward_offsets(y, o),
                RopeAt::Int(offset) => r.forward(y, offset),
            }
        };
        y = match &self.rope {
            Some(r) if self.rope_slice_concat => {
                // gptj.py: rope on `x[..., :dims]`, then concatenated with the rest.
                let rot = ops::slice_axis(&y, 3, 0, r.dims(), None)?;
                let pass = ops::slice_axis(&y, 3, r.dims(), hd, None)?;
                let rot = rotate(r, &rot)?;
                ops::concatenate(&[&rot, &pass], -1, None)?
            }
            Some(r) => rotate(r, &y)?,
            None => y,
        };
        if self.qk_norm == QkNorm::AfterRope {
            y = self.side_norm(side, y)?;
        }
        Ok(y)
    }

    /// Attention of `queries` over what the cache returned, `(B, heads, L, head_dim)`; the
    /// queries times `query_scale` first when given.
    pub(crate) fn attend(
        &self,
        queries: &Array,
        kv: &Kv,
        mask: &AttentionMask,
        query_scale: Option<&Array>,
    ) -> Result<Array> {
        let tiled;
        let kv = match (self.kv_tile, kv) {
            (Some(n), Kv::Dense { keys, values }) => {
                let reps = [1, n, 1, 1];
                tiled = Kv::Dense {
                    keys: ops::tile(keys, &reps, None)?,
                    values: ops::tile(values, &reps, None)?,
                };
                &tiled
            }
            (Some(_), Kv::Quantized { .. }) => {
                return Err(ModelError::Cache {
                    what: "tiled KV heads (plamo)".into(),
                    problem: "cannot read a quantized KV cache".into(),
                })
            }
            (None, kv) => kv,
        };
        let mut queries = queries.clone();
        if let Some(s) = query_scale {
            let scaled = (&queries * s)?;
            queries = if self.query_scale_cast {
                scaled.astype(queries.dtype())?
            } else {
                scaled
            };
        }
        let sinks = self.sinks.as_ref();
        let sdpa =
            |q: &Array, kv: &Kv| scaled_dot_product_attention(q, kv, self.scale, mask, sinks);
        let out = match (self.score, kv) {
            (Score::SoftCapped(cap), _) => self.softcapped(&queries, kv, mask, cap)?,
            (Score::Manual, _) => self.manual_attention(&queries, kv, mask)?,
            (Score::SoftCappedRepeated(cap), _) => {
                self.softcapped_repeated(&queries, kv, mask, cap)?
            }
            (Score::Sdpa(Upcast::None), _) | (Score::Sdpa(_), Kv::Quantized { .. }) => {
                sdpa(&queries, kv)?
            }
            (Score::Sdpa(Upcast::QueriesIfF16), _) if queries.dtype() != Dtype::Float16 => {
                sdpa(&queries, kv)?
            }
            (Score::Sdpa(Upcast::QueriesIfF16), _) => {
                sdpa(&queries.astype(Dtype::Float32)?, kv)?.astype(queries.dtype())?
            }
            (Score::Sdpa(up), Kv::Dense { keys, values }) => {
                let f32_ = |a: &Array| a.astype(Dtype::Float32);
                let keys = match up {
                    Upcast::QueriesKeys => f32_(keys)?,
                    _ => keys.clone(),
                };
                let kv32 = Kv::Dense {
                    keys,
                    values: values.clone(),
                };
                sdpa(&f32_(&queries)?, &kv32)?.astype(values.dtype())?
            }
        };
        Ok(out)
    }

    /// `transpose(0, 2, 1, 3)`, made contiguous where mlx-lm does (`contiguous`).
    fn heads_transpose(&self, y: &Array) -> Result<Array> {
        let y = ops::transpose(y, &[0, 2, 1, 3], None)?;
        if self.contiguous {
            return Ok(ops::contiguous(&y, false, None)?);
        }
        Ok(y)
    }

    /// The output projection of the attention result `(B, heads, L, head_dim)`; `x` is the
    /// attention's input, which the output and head gates read.
    pub(crate) fn output(&self, x: &Array, out: &Array) -> Result<Array> {
        self.output_gated(x, out, None)
    }

    /// OLMo's attention as olmo.py writes it (one head per KV head).
    fn manual_attention(&self, queries: &Array, kv: &Kv, mask: &AttentionMask) -> Result<Array> {
        let Kv::Dense { keys, values } = kv else {
            return Err(ModelError::Cache {
                what: "OLMo's attention".into(),
                problem: "needs a dense (unquantized) cache".into(),
            });
        };
        let q = (queries * self.scale)?;
        let mut scores = ops::matmul(&q, &ops::transpose(keys, &[0, 1, 3, 2], None)?, None)?;
        match mask {
            AttentionMask::None => {}
            AttentionMask::Array(m) if m.dtype() != Dtype::Bool => scores = (&scores + m)?,
            other => {
                // mlx-lm adds the mask as is (and fails on its "causal" string); here a
                // boolean or causal mask becomes the additive 0 / -inf it means.
                let ss = scores.shape();
                let (ql, kl) = (ss[ss.len() - 2], ss[ss.len() - 1]);
                let allowed = match other {
                    AttentionMask::Array(m) => m.clone(),
                    _ => mlx_cache::mask::create_causal_mask(
                        ql.max(0) as usize,
                        (kl - ql).max(0) as usize,
                        None,
                    )?,
                };
                let zero = Array::from_f32(0.0, scores.dtype())?;
                let ninf = Array::from_f32(f32::NEG_INFINITY, scores.dtype())?;
                scores = (&scores + &ops::where_(&allowed, &zero, &ninf, None)?)?;
            }
        }
        let dtype = scores.dtype();
        let scores = ops::softmax(&scores.astype(Dtype::Float32)?, &[-1], false, None)?;
        Ok(ops::matmul(&scores.astype(dtype)?, values, None)?)
    }

    /// Gemma 2's attention with a logit soft cap, written out as mlx-lm does.
    fn softcapped(
        &self,
        queries: &Array,
        kv: &Kv,
        mask: &AttentionMask,
        cap: f32,
    ) -> Result<Array> {
        let Kv::Dense { keys, values } = kv else {
            return Err(ModelError::Cache {
                what: "attention logit soft-capping".into(),
                problem: "needs a dense (unquantized) cache".into(),
            });
        };
        let qs = queries.shape();
        let (b, l) = (qs[0], qs[2]);
        let repeats = self.n_heads / self.n_kv_heads;
        let mut queries = (queries * self.scale)?;
        let (mut keys, mut values) = (keys.clone(), values.clone());
        if repeats > 1 {
            queries = ops::reshape(
                &queries,
                &[b, self.n_kv_heads, repeats, l, self.head_dim],
                None,
            )?;
            keys = ops::expand_dims(&keys, &[2], None)?;
            values = ops::expand_dims(&values, &[2], None)?;
        }
        let scores = ops::matmul(&queries, &ops::swapaxes(&keys, -1, -2, None)?, None)?;
        let mut scores = crate::layers::softcap(&scores, cap)?;
        match mask {
            AttentionMask::None => {}
            AttentionMask::Array(m) if m.dtype() == Dtype::Bool => {
                let min = crate::layers::finfo_min(scores.dtype());
                let fill = Array::from_f32(min, scores.dtype())?;
                scores = ops::where_(m, &scores, &fill, None)?;
            }
            AttentionMask::Array(m) => scores = (&scores + m)?,
            AttentionMask::Causal => {
                return Err(ModelError::Input {
                    what: "soft-capped attention".into(),
                    problem: "needs an explicit mask array".into(),
                })
            }
        }
        let scores = ops::softmax(&scores, &[-1], true, None)?;
        let out = ops::matmul(&scores, &values, None)?;
        if repeats > 1 {
            Ok(ops::reshape(
                &out,
                &[b, self.n_heads, l, self.head_dim],
                None,
            )?)
        } else {
            Ok(out)
        }
    }

    /// gear.py's `_softcap_attention` ([`Score::SoftCappedRepeated`]).
    fn softcapped_repeated(
        &self,
        queries: &Array,
        kv_all: &Kv,
        mask: &AttentionMask,
        softcap: f32,
    ) -> Result<Array> {
        let Kv::Dense { keys, values } = kv_all else {
            return Err(ModelError::Cache { what: "gear".into(), problem: "soft-capped attention needs a dense KV cache (mlx-lm's runs on plain keys and values)".into() });
        };
        let repeats = queries.shape()[1] / keys.shape()[1];
        let repeat_kv = |x: &Array| -> Result<Array> {
            if repeats == 1 {
                return Ok(x.clone());
            }
            let s = x.shape();
            let y = ops::expand_dims(x, &[2], None)?;
            let y = ops::broadcast_to(&y, &[s[0], s[1], repeats, s[2], s[3]], None)?;
            Ok(ops::reshape(&y, &[s[0], s[1] * repeats, s[2], s[3]], None)?)
        };
        let (keys, values) = (repeat_kv(keys)?, repeat_kv(values)?);
        let q = ops::multiply_scalar(queries, self.scale, None)?;
        let scores = ops::matmul(&q, &ops::swapaxes(&keys, -1, -2, None)?, None)?;
        let mut scores = crate::layers::softcap(&scores, softcap)?;
        let ss = scores.shape();
        let (ql, kl) = (ss[ss.len() - 2], ss[ss.len() - 1]);
        let bool_mask = match mask {
            AttentionMask::None => None,
            AttentionMask::Causal => {
                let qi = ops::arange(f64::from(kl - ql), f64::from(kl), 1.0, Dtype::Int32, None)?;
                let ki = ops::arange(0.0, f64::from(kl), 1.0, Dtype::Int32, None)?;
                Some(ops::greater_equal(
                    &ops::expand_dims(&qi, &[1], None)?,
                    &ops::expand_dims(&ki, &[0], None)?,
                    None,
                )?)
            }
            AttentionMask::Array(m) if m.dtype() == Dtype::Bool => Some(m.clone()),
            AttentionMask::Array(m) => {
                scores = (&scores + m)?;
                None
            }
        };
        if let Some(m) = bool_mask {
            let min = crate::layers::finfo_min(scores.dtype());
            scores = ops::where_scalar(&m, &scores, min, None)?;
        }
        let scores = ops::softmax(&scores, &[-1], true, None)?;
        Ok(ops::matmul(&scores, &values, None)?)
    }

    fn output_gated(&self, x: &Array, out: &Array, query_gate: Option<&Array>) -> Result<Array> {
        let s = out.shape();
        let (b, l) = (s[0], s[2]);
        let mut out = self.heads_transpose(out)?;
        if let Some((HeadGate::SigmoidF32, g)) = &self.head_gate {
            // spark2_5.py: `sigmoid(g_proj(x).astype(float32)).astype(output.dtype)`, per head.
            let gate = ops::sigmoid(&g.forward(x)?.astype(Dtype::Float32)?, None)?;
            let gate = ops::expand_dims(&gate.astype(out.dtype())?, &[-1], None)?;
            out = (&out * &gate)?;
        }
        let mut out = ops::reshape(&out, &[b, l, -1], None)?;
        if let Some(g) = query_gate {
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
                    Some(ops::logaddexp(&z, &zero, None)?.astype(out.dtype())?)
                }
                HeadGate::Sigmoid => Some(ops::sigmoid(&g.forward(x)?, None)?),
                HeadGate::SigmoidF32 => None,
            };
            if let Some(gate) = gate {
                let per_head = ops::reshape(&out, &[b, l, self.n_heads, -1], None)?;
                out = ops::reshape(
                    &(&per_head * &ops::expand_dims(&gate, &[-1], None)?)?,
                    &[b, l, -1],
                    None,
                )?;
            }
        }
        match &self.sub_norm {
            Some(n) => self.o_proj.forward(&n.forward(&out)?),
            None => self.o_proj.forward(&out),
        }
    }
}

impl Walkable for Attention {
    /// [`Attention::walk`].
    fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        Attention::walk(self, path, w);
    }
}
