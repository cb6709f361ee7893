//! The universal dense decoder: one attention, one MLP, one block and one model, each with the
//! variants a [`Descriptor`] selects, in mlx-lm's op order for every row (see
//! [`super::descriptor`] for the rows).

use std::cell::RefCell;

use mlx_cache::{AttentionMask, Cache, KVCache, Kv, RotatingKVCache};
use mlx_core::prelude::*;
use mlx_core::transforms;

use crate::error::{ModelError, Result};
use crate::layers::{
    clip_residual, join, Embedding, LayerParam, Linear, LinearMut, Mlp, Norm, NormKind, Rope, Walk,
};
use crate::models::checkpoint::concat_cache;
use crate::models::descriptor::{
    Descriptor, EmbedScale, Head, LogitScale, Names, Placement, QkNorm, QkvLayout, RopeSpec,
    RopeTable,
};
use crate::models::kit::{self, RopeAt};
use crate::models::moe::QkNorm as MoeQkNorm;
use crate::models::{LanguageModel, LogitTransform, OutputHead, SegmentedDecode};
use crate::weights::Weights;

mod mtp;

fn init_rope(r: &RopeSpec) -> Result<Rope> {
    match r.table {
        RopeTable::NtkAlpha(alpha) => return Rope::ntk_alpha(r.dims, r.theta, alpha),
        RopeTable::NegExp => return Rope::neg_exp(r.dims, r.theta),
        RopeTable::Initialize => {}
    }
    Rope::initialize(
        r.dims,
        r.theta,
        r.traditional,
        r.scaling.as_ref(),
        r.max_position_embeddings,
    )
}

/// One layer's weights as the dense model holds them, read-only: for decoders that run the
/// model's own arrays (the CPU decoder in mlx-engine) instead of a second copy.
pub struct LayerView<'a> {
    /// A sliding-window layer ([`Descriptor::sliding`]).
    pub sliding: bool,
    pub pre_attn_norm: Option<&'a Norm>,
    pub post_attn_norm: Option<&'a Norm>,
    pub pre_mlp_norm: Option<&'a Norm>,
    pub post_mlp_norm: Option<&'a Norm>,
    /// The separate q/k/v projections (`None` when the model fuses them).
    pub q: Option<&'a Linear>,
    pub k: Option<&'a Linear>,
    pub v: Option<&'a Linear>,
    /// The fused q/k/v projection whose rows are q's, then k's, then v's (phi3's
    /// `qkv_proj`); `None` when they are separate or laid out otherwise.
    pub qkv: Option<&'a Linear>,
    pub o: &'a Linear,
    /// The layer has a head-wise output gate.
    pub head_gate: bool,
    /// The q/k norms of [`Descriptor::qk_norm`] when they are plain norms.
    pub q_norm: Option<&'a Norm>,
    pub k_norm: Option<&'a Norm>,
    /// The q/k norms are Cohere's or StableLM's layer-norm variants (not in `q_norm`).
    pub other_qk_norm: bool,
    pub rope: Option<&'a Rope>,
    pub mlp: &'a Mlp,
}

/// The descriptor's attention for the layer at `path` ([`kit::Attention`] with the row's
/// layout, norms, scores and rope; `sliding` picks the local rope, `nope` drops it), loaded
/// in mlx-lm's declaration order: q/k/v (or the fused projection), the head gate, o, the q/k
/// norms, the sub-norm.
fn load_attention(
    d: &Descriptor,
    w: &mut Weights,
    path: &str,
    sliding: bool,
    nope: bool,
) -> Result<kit::Attention> {
    let n = &d.names;
    let (dim, nh, nkv, hd) = (d.hidden_size, d.n_heads, d.n_kv_heads, d.head_dim);
    let width = |heads: i32| {
        heads.checked_mul(hd).filter(|w| *w > 0).ok_or_else(|| {
            ModelError::Config(format!(
                "{}: {heads} heads x head_dim {hd} is not a positive 32-bit size",
                d.model_type
            ))
        })
    };
    width(nh)?;
    width(nkv)?;
    let p = |s: &str| join(path, s);
    let (q_proj, kv_proj, fused) = match n.qkv {
        Some(f) => {
            let l = Linear::load(w, &p(f), dim, (nh + 2 * nkv) * hd, d.qkv_bias)?;
            (l, (None, None), Some(n.qkv_layout))
        }
        None => {
            let q = Linear::load(w, &p(n.q), dim, nh * hd, d.qkv_bias)?;
            let k = Linear::load(w, &p(n.k), dim, nkv * hd, d.qkv_bias)?;
            let v = Linear::load(w, &p(n.v), dim, nkv * hd, d.qkv_bias)?;
            (q, (Some(k), Some(v)), None)
        }
    };
    let gate = match d.head_gate {
        Some(g) => Some((g, Linear::load(w, &p(g), dim, nh, d.qkv_bias)?)),
        None => None,
    };
    let o_proj = Linear::load(w, &p(n.o), nh * hd, dim, d.o_bias)?;
    let scale = d.attn_scale as f32;
    let mut a = kit::Attention::from_parts(q_proj, kv_proj, o_proj, (nh, nkv, hd), scale)
        .with_names(n.qkv.unwrap_or(n.q), [n.k, n.v], [n.o, n.q_norm, n.k_norm]);
    a.fused = fused;
    if let Some((name, g)) = gate {
        a = a.with_gate(kit::HeadGate::SigmoidF32, name, g);
    }
    let eps = d.norm_eps;
    let qk_kind = d.qk_norm_kind.unwrap_or(d.norm);
    let mut norms = |at: MoeQkNorm, q_dims: i32, k_dims: i32| -> Result<()> {
        a.q_norm = Some(Norm::load(w, &p(n.q_norm), qk_kind, q_dims, eps)?);
        a.k_norm = Some(Norm::load(w, &p(n.k_norm), qk_kind, k_dims, eps)?);
        a.qk_norm = at;
        Ok(())
    };
    match d.qk_norm {
        QkNorm::None => {}
        QkNorm::PerHead => norms(MoeQkNorm::PerHead, hd, hd)?,
        QkNorm::PerHeadTransposed => norms(MoeQkNorm::PerHeadTransposed, hd, hd)?,
        QkNorm::PerHeadAfterRope => norms(MoeQkNorm::AfterRope, hd, hd)?,
        QkNorm::Full => norms(MoeQkNorm::Full, nh * hd, nkv * hd)?,
        QkNorm::LayerNorm2d => {
            a.layer_norms = Some(Box::new(kit::LayerNormQk::TwoD {
                q: w.take(&format!("{}.weight", p(n.q_norm)), &[nh, hd])?,
                k: w.take(&format!("{}.weight", p(n.k_norm)), &[nkv, hd])?,
                eps,
            }));
        }
        QkNorm::LayerNormPerHead => {
            let mut rows = |name: &str, heads: i32| -> Result<Vec<Array>> {
                (0..heads)
                    .map(|h| w.take(&format!("{}.norms.{h}.weight", p(name)), &[hd]))
                    .collect()
            };
            a.layer_norms = Some(Box::new(kit::LayerNormQk::PerHead {
                q: rows(n.q_norm, nh)?,
                k: rows(n.k_norm, nkv)?,
                eps,
            }));
        }
    }
    let spec = match (&d.local_rope, sliding) {
        _ if nope => None,
        (Some(local), true) => Some(local),
        _ => d.rope.as_ref(),
    };
    a.rope = spec.map(init_rope).transpose()?;
    a.rope_slice_concat = d.rope_slice_concat;
    a.row_offsets = true;
    a.score = match d.attn_logit_softcap {
        Some(cap) => kit::Score::SoftCapped(cap as f32),
        None if d.manual_attention => kit::Score::Manual,
        None => kit::Score::Sdpa(d.upcast),
    };
    a.contiguous = d.contiguous_heads;
    a.kv_tile = d.kv_tile;
    if d.sub_norms {
        let sub = Norm::load(w, &p("attn_sub_norm"), d.norm, d.hidden_size, d.norm_eps)?;
        a.sub_norm = Some(sub);
    }
    Ok(a)
}

#[derive(Clone)]
pub struct TransformerBlock {
    sliding: bool,
    placement: Placement,
    residual_multiplier: Option<f32>,
    clip_residual: bool,
    self_attn: kit::Attention,
    mlp: Mlp,
    pre_attn: Option<Norm>,
    post_attn: Option<Norm>,
    pre_mlp: Option<Norm>,
    post_mlp: Option<Norm>,
}

fn norm_opt(n: &Option<Norm>, x: &Array) -> Result<Array> {
    match n {
        Some(n) => n.forward(x),
        None => Ok(x.clone()),
    }
}

impl TransformerBlock {
    fn load(d: &Descriptor, w: &mut Weights, i: usize) -> Result<TransformerBlock> {
        Self::load_at(d, w, i, &format!("{}.{i}", d.names.layers))
    }

    /// Layer `i` of the row (its shape, sliding and rope flags) with its tensors under `p`
    /// (a multi-token-prediction block lives outside `model.layers`).
    fn load_at(d: &Descriptor, w: &mut Weights, i: usize, p: &str) -> Result<TransformerBlock> {
        // This layer's own head counts and MLP width where they vary (OpenELM).
        let own;
        let d = match d.layer_shapes.get(i) {
            Some(&(n_heads, n_kv_heads, intermediate_size)) => {
                own = Descriptor {
                    n_heads,
                    n_kv_heads,
                    intermediate_size,
                    ..d.clone()
                };
                &own
            }
            None => d,
        };
        let n = &d.names;
        let sliding = d.sliding.get(i).copied().unwrap_or(false);
        let mut norm = |name: &str| -> Result<Option<Norm>> {
            Ok(Some(Norm::load(
                w,
                &format!("{p}.{name}"),
                d.norm,
                d.hidden_size,
                d.norm_eps,
            )?))
        };
        let (pre_attn, post_attn, pre_mlp, post_mlp) = match d.placement {
            Placement::Pre => (norm(n.pre_attn_norm)?, None, norm(n.pre_mlp_norm)?, None),
            Placement::Sandwich => match d.post_norm_offsets {
                Some((attn, mlp)) => {
                    let (pre_attn, pre_mlp) = (norm(n.pre_attn_norm)?, norm(n.pre_mlp_norm)?);
                    let mut plus = |name: &str, offset: f32| -> Result<Option<Norm>> {
                        let path = format!("{p}.{name}");
                        let (h, eps) = (d.hidden_size, d.norm_eps);
                        Ok(Some(Norm::load_rms_plus(w, &path, h, eps, offset)?))
                    };
                    let post_attn = plus(n.post_attn_norm, attn)?;
                    (pre_attn, post_attn, pre_mlp, plus(n.post_mlp_norm, mlp)?)
                }
                None => (
                    norm(n.pre_attn_norm)?,
                    norm(n.post_attn_norm)?,
                    norm(n.pre_mlp_norm)?,
                    norm(n.post_mlp_norm)?,
                ),
            },
            Placement::PostOnly => (None, norm(n.post_attn_norm)?, None, norm(n.post_mlp_norm)?),
            Placement::Parallel | Placement::ParallelResidualFirst => {
                (norm(n.pre_attn_norm)?, None, None, None)
            }
            Placement::ParallelTwoNorms => {
                (norm(n.pre_attn_norm)?, None, norm(n.pre_mlp_norm)?, None)
            }
        };
        Ok(TransformerBlock {
            sliding,
            placement: d.placement,
            residual_multiplier: d.residual_multiplier.map(|m| m as f32),
            clip_residual: d.clip_residual,
            self_attn: load_attention(
                d,
                w,
                &join(p, n.attn),
                sliding,
                d.no_rope.get(i).copied().unwrap_or(false),
            )?,
            mlp: {
                let path = join(p, n.mlp);
                let mlp = Mlp::load(
                    w,
                    &path,
                    &n.mlp_names,
                    d.hidden_size,
                    d.intermediate_size,
                    d.mlp_bias,
                    d.down_bias,
                    d.mlp,
                )?;
                if d.sub_norms {
                    let sub = join(&path, "ffn_sub_norm");
                    let (inter, eps) = (d.intermediate_size, d.norm_eps);
                    mlp.with_inner_norm(Norm::load(w, &sub, d.norm, inter, eps)?)
                } else {
                    mlp
                }
            },
            pre_attn,
            post_attn,
            pre_mlp,
            post_mlp,
        })
    }

    /// `x + r` (times the residual multiplier; Gemma 3's `clip_residual` for float16).
    fn residual(&self, x: &Array, r: &Array) -> Result<Array> {
        if self.clip_residual {
            return Ok(clip_residual(x, r)?);
        }
        match self.residual_multiplier {
            Some(m) => Ok((x + &(r * m)?)?),
            None => Ok((x + r)?),
        }
    }

    fn forward(&self, x: &Array, ctx: &Ctx, cache: Option<&mut Box<dyn Cache>>) -> Result<Array> {
        match self.placement {
            Placement::Parallel | Placement::ParallelResidualFirst => {
                let h = norm_opt(&self.pre_attn, x)?;
                let attn_h = self.attn(&h, ctx, cache)?;
                let ff_h = self.ffn(&h, ctx)?;
                return if self.placement == Placement::Parallel {
                    Ok((&(&attn_h + &ff_h)? + x)?)
                } else {
                    Ok((&(x + &attn_h)? + &ff_h)?)
                };
            }
            Placement::ParallelTwoNorms => {
                let attn = self.attn(&norm_opt(&self.pre_attn, x)?, ctx, cache)?;
                let ffn = self.ffn(&norm_opt(&self.pre_mlp, x)?, ctx)?;
                return Ok((&(&attn + &ffn)? + x)?);
            }
            _ => {}
        }
        let r = self.attn(&norm_opt(&self.pre_attn, x)?, ctx, cache)?;
        self.after_attn(x, &r, ctx)
    }

    /// This layer's mask: the sliding-window one for a sliding layer where there is one.
    fn pick_mask<'a>(
        &self,
        fa: &'a AttentionMask,
        swa: &'a Option<AttentionMask>,
    ) -> &'a AttentionMask {
        match (swa, self.sliding) {
            (Some(m), true) => m,
            _ => fa,
        }
    }

    /// Whether the attention sub-step sits between two sequential halves (every placement
    /// but the parallel ones): `pre_attn` before it, [`TransformerBlock::after_attn`] after.
    fn sequential(&self) -> bool {
        matches!(
            self.placement,
            Placement::Pre | Placement::Sandwich | Placement::PostOnly
        )
    }

    /// A sequential block after its attention output `r`: the attention residual, the MLP
    /// and its residual.
    fn after_attn(&self, x: &Array, r: &Array, ctx: &Ctx) -> Result<Array> {
        let h = self.residual(x, &norm_opt(&self.post_attn, r)?)?;
        let r = self.ffn(&norm_opt(&self.pre_mlp, &h)?, ctx)?;
        self.residual(&h, &norm_opt(&self.post_mlp, &r)?)
    }

    /// Walks the attention, the MLP and the norms, under `path` (`model.layers.<i>`).
    fn walk<'a>(&'a mut self, path: &str, n: &Names, w: &mut Walk<'a>) {
        let TransformerBlock {
            self_attn,
            mlp,
            pre_attn,
            post_attn,
            pre_mlp,
            post_mlp,
            ..
        } = self;
        self_attn.walk(&join(path, n.attn), w);
        mlp.walk(&join(path, n.mlp), &n.mlp_names, w);
        for (norm, name) in [
            (pre_attn, n.pre_attn_norm),
            (post_attn, n.post_attn_norm),
            (pre_mlp, n.pre_mlp_norm),
            (post_mlp, n.post_mlp_norm),
        ] {
            if let Some(norm) = norm {
                w.norm(&join(path, name), norm);
            }
        }
    }

    /// Every array of the block under `path`, for full fine-tuning.
    fn parameters_mut(&mut self, path: &str, n: &Names) -> Result<Vec<LayerParam<'_>>> {
        Walk::params(path, move |w| self.walk("", n, w))
    }

    fn linears(&self) -> Vec<&Linear> {
        let mut out = self.self_attn.linears();
        out.extend(self.mlp.linears());
        out
    }

    /// `forward` under `mx.checkpoint`, with the adapters' parameters as inputs (mlx-lm's
    /// `grad_checkpoint`: `checkpoint(inner_fn)(model.trainable_parameters(), x, mask)`).
    /// With `own` (full fine-tuning), the block's own trainable arrays (those
    /// [`TransformerBlock::parameters_mut`] gives, quantized ones excepted) enter as inputs too.
    /// With a `ConcatenateKVCache` (training's segmented backward) the cache's keys and
    /// values enter as inputs too and the layer's full keys and values come out, so the
    /// checkpointed function stays pure; the cache then holds those outputs.
    fn forward_checkpointed(
        &self,
        x: &Array,
        mask: &AttentionMask,
        query_scale: Option<&Array>,
        layer: usize,
        own: Option<&Names>,
        cache: Option<&mut Box<dyn Cache>>,
    ) -> Result<Array> {
        let mut inputs = vec![x.clone()];
        let prev = cache.as_ref().map(|c| c.state().into_arrays());
        let n_prev = prev.as_ref().map_or(0, Vec::len);
        inputs.extend(prev.iter().flatten().cloned());
        for l in self.linears() {
            if let Linear::Adapted(a) = l {
                inputs.extend(a.parameters()?);
            }
        }
        let mut block = self.clone();
        let names = own.copied();
        if let Some(n) = &names {
            let own = block.parameters_mut("", n)?;
            inputs.extend(
                own.into_iter()
                    .filter(|p| !p.quantized)
                    .map(|p| p.value.clone()),
            );
        }
        let cached = cache.is_some();
        let (mask, query_scale) = (mask.clone(), query_scale.cloned());
        let f = transforms::checkpoint(move |xs: &[Array]| -> mlx_core::Result<Vec<Array>> {
            let cb = |e: ModelError| mlx_core::Error::Callback(e.to_string());
            let missing = || mlx_core::Error::Callback("checkpoint: missing inputs".into());
            let mut i = 1 + n_prev;
            for l in block.linears() {
                if let Linear::Adapted(a) = l {
                    let n = a.parameters().map_err(cb)?.len();
                    let vals = xs.get(i..i + n).ok_or_else(missing)?;
                    a.set_parameters(vals).map_err(cb)?;
                    i += n;
                }
            }
            let mut block = block.clone();
            if let Some(n) = &names {
                let own = block.parameters_mut("", n).map_err(cb)?;
                for p in own.into_iter().filter(|p| !p.quantized) {
                    *p.value = xs.get(i).ok_or_else(missing)?.clone();
                    i += 1;
                }
            }
            let ctx = Ctx {
                mask: &mask,
                query_scale: query_scale.as_ref(),
                layer,
                trace: None,
            };
            if !cached {
                return Ok(vec![block.forward(&xs[0], &ctx, None).map_err(cb)?]);
            }
            let prev = xs.get(1..1 + n_prev).ok_or_else(missing)?;
            let mut c: Box<dyn Cache> = Box::new(concat_cache(prev).map_err(cb)?);
            let h = block.forward(&xs[0], &ctx, Some(&mut c)).map_err(cb)?;
            match c.fetch()? {
                Some(Kv::Dense { keys, values }) => Ok(vec![h, keys, values]),
                _ => Err(mlx_core::Error::Callback(
                    "checkpoint: the layer left no dense keys".into(),
                )),
            }
        })?;
        let mut out = f.call(&inputs)?.into_iter();
        let h = out.next().ok_or_else(|| ModelError::Internal {
            what: "checkpointed layer".into(),
            problem: "returned nothing".into(),
        })?;
        if let Some(c) = cache {
            let kv: Vec<Array> = out.collect();
            *c = Box::new(concat_cache(&kv)?);
        }
        Ok(h)
    }

    /// The attention sub-step, recorded (input and output) when tracing.
    fn attn(&self, x: &Array, ctx: &Ctx, cache: Option<&mut Box<dyn Cache>>) -> Result<Array> {
        ctx.tap("attn_in", x);
        let y = self
            .self_attn
            .forward_scaled(x, ctx.mask, ctx.query_scale, cache)?;
        ctx.tap("attn", &y);
        Ok(y)
    }

    /// The MLP sub-step, recorded (input and output) when tracing.
    fn ffn(&self, x: &Array, ctx: &Ctx) -> Result<Array> {
        ctx.tap("mlp_in", x);
        let y = self.mlp.forward(x)?;
        ctx.tap("mlp", &y);
        Ok(y)
    }
}

/// What every layer of one forward shares: its mask and Ministral 3's per-position query
/// scale.
struct Ctx<'a> {
    mask: &'a AttentionMask,
    query_scale: Option<&'a Array>,
    layer: usize,
    trace: Option<&'a RefCell<Vec<(String, Array)>>>,
}

impl Ctx<'_> {
    /// Records `layers.<i>.<what>` when tracing (`cargo xtask port-check`).
    fn tap(&self, what: &str, a: &Array) {
        if let Some(t) = self.trace {
            t.borrow_mut()
                .push((format!("layers.{}.{what}", self.layer), a.clone()));
        }
    }
}

/// The model: embeddings, blocks, final norm, head and logit transforms of a descriptor.
pub struct Model {
    desc: Descriptor,
    embed_tokens: Embedding,
    embed_norm: Option<Norm>,
    positions: Option<Embedding>,
    layers: Vec<TransformerBlock>,
    norm: Norm,
    lm_head: Option<Linear>,
    fa_idx: usize,
    swa_idx: Option<usize>,
    /// Recompute each layer in the backward pass (training; cache-less forwards only).
    grad_checkpoint: bool,
    /// The layers whose own arrays train in full (checkpoint inputs).
    checkpoint_own: std::ops::Range<usize>,
    /// This rank's pipeline stage `(rank, size)` after [`Model::shard_pipeline`]; `layers`
    /// then holds only the stage's layers.
    pipeline: Option<(i32, i32)>,
    /// The checkpoint's multi-token-prediction layers, loaded only under `--mtp`
    /// ([`Weights::with_mtp`]; MiMo's `model.mtp_layers`).
    mtp: Vec<mtp::MtpLayer>,
    /// The CPU decoder's lane layouts of the layers' 4-bit weights ([`Model::cpu_lanes`]).
    cpu_lanes: mlx_core::cpu::LanesStore,
}

impl Model {
    /// Tensor parallelism over `size` ranks as mlx-lm's llama `Model.shard()` does (this
    /// process is rank `rank`): q/k/v, gate and up all-to-sharded, o and down sharded-to-all
    /// (summed over MLX's global group), heads and KV heads divided by `size`. See
    /// [`crate::shard`]. The llama, qwen2 and qwen3 rows, dense or quantized.
    pub fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        use crate::shard::{all_to_sharded, sharded_to_all};
        let d = &self.desc;
        // The rows whose mlx-lm class has this same `shard()` (llama.py, which also serves
        // mistral, iquestcoder and xverse through MODEL_REMAPPING; qwen2.py, qwen3.py,
        // ministral3.py).
        const SHARDED: [&str; 4] = ["llama", "qwen2", "qwen3", "ministral3"];
        if !SHARDED.contains(&crate::config::remap(&d.model_type)) {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: format!("model_type `{}`", d.model_type),
                problem: format!("not supported yet ({})", SHARDED.join(", ")),
            });
        }
        crate::shard::check_tensor_rank(size, rank)?;
        if d.n_heads % size != 0 || d.n_kv_heads % size != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: format!("{} heads and {} KV heads", d.n_heads, d.n_kv_heads),
                problem: format!("do not split over {size} ranks"),
            });
        }
        for (i, l) in self.layers.iter_mut().enumerate() {
            let what = |m: &str| format!("model.layers.{i}.{m}");
            let a = &mut l.self_attn;
            if a.head_gate.is_some() {
                return Err(ModelError::Parallel {
                    kind: crate::Parallelism::Tensor,
                    what: what("self_attn").to_string(),
                    problem: "a gated attention cannot be sharded yet".into(),
                });
            }
            match (a.fused, a.k_proj.as_mut(), a.v_proj.as_mut()) {
                (None, Some(k), Some(v)) => {
                    all_to_sharded(&mut a.q_proj, size, rank, &what("self_attn.q_proj"))?;
                    all_to_sharded(k, size, rank, &what("self_attn.k_proj"))?;
                    all_to_sharded(v, size, rank, &what("self_attn.v_proj"))?;
                }
                _ => {
                    return Err(ModelError::Parallel {
                        kind: crate::Parallelism::Tensor,
                        what: what("self_attn").to_string(),
                        problem: "fused q/k/v projections cannot be sharded yet".into(),
                    })
                }
            }
            sharded_to_all(&mut a.o_proj, size, rank, &what("self_attn.o_proj"))?;
            a.n_heads /= size;
            a.n_kv_heads /= size;
            if l.mlp.gate_up_down().is_none() {
                return Err(ModelError::Parallel {
                    kind: crate::Parallelism::Tensor,
                    what: what("mlp").to_string(),
                    problem: "a fused gate/up projection cannot be sharded yet".into(),
                });
            }
            crate::shard::shard_mlp(&mut l.mlp, size, rank, &what("mlp"), false)?;
        }
        Ok(())
    }
}

/// The rows whose mlx-lm class has `pipeline` (qwen2.py with `PipelineMixin`; ministral3.py,
/// whose `pipeline` also re-picks the stage's first full and first sliding layer).
const PIPELINED: [&str; 2] = ["qwen2", "ministral3"];

impl Model {
    /// Pipeline parallelism over `size` ranks as mlx-lm's `PipelineMixin.pipeline()`: the
    /// layers split evenly (the low ranks take the extra ones), rank `size - 1` runs the
    /// first layers and rank 0 the last; this model keeps only its stage's layers (and
    /// caches for them). See [`Model::run`] for the send/recv order.
    pub fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        let t = &self.desc.model_type;
        crate::shard::check_pipeline(t, &PIPELINED, self.pipeline.is_some())?;
        if self.desc.loops > 1 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Pipeline,
                what: "looped layers".into(),
                problem: "not supported".into(),
            });
        }
        crate::shard::keep_stage(&mut self.layers, size, rank)?;
        // ministral3's `pipeline`: the masks come from the stage's own first full and first
        // sliding layer (a stage without full layers computes no full mask it would use).
        let swa = self.layers.iter().position(|l| l.sliding);
        self.swa_idx = self.swa_idx.and(swa);
        self.fa_idx = self
            .layers
            .iter()
            .position(|l| !l.sliding)
            .or(swa)
            .unwrap_or(0);
        self.pipeline = Some((rank, size));
        Ok(())
    }

    /// This rank's pipeline stage `(rank, size)`, if the model was split.
    pub fn pipeline_stage(&self) -> Option<(i32, i32)> {
        self.pipeline
    }

    /// Builds the model from `w`, after the row's `sanitize`.
    pub fn load(desc: Descriptor, w: &mut Weights) -> Result<Model> {
        let d = &desc;
        Self::sanitize(d, w)?;
        let embed_tokens = Embedding::load(w, d.names.embed, d.vocab_size, d.hidden_size)?;
        let positions = match d.names.positions {
            Some(p) => Some(Embedding::load(w, p, d.n_positions, d.hidden_size)?),
            None => None,
        };
        let layers = (0..d.num_layers as usize)
            .map(|i| TransformerBlock::load(d, w, i))
            .collect::<Result<Vec<_>>>()?;
        let norm = Norm::load(w, d.names.final_norm, d.norm, d.hidden_size, d.norm_eps)?;
        let untied = match d.head {
            Head::Tied => false,
            Head::Untied => true,
            Head::TiedIfMissing => w.contains(&format!("{}.weight", d.names.lm_head)),
        };
        let lm_head = if untied {
            Some(Linear::load(
                w,
                d.names.lm_head,
                d.hidden_size,
                d.vocab_size,
                d.lm_head_bias,
            )?)
        } else {
            None
        };
        let fa_idx = d
            .sliding
            .iter()
            .position(|s| !s)
            .ok_or_else(|| ModelError::Config("no full-attention layer".into()))?;
        let swa_idx = d.sliding.iter().position(|s| *s);
        let mtp = mtp::load(d, w)?;
        let embed_norm = if d.embed_norm {
            Some(Norm::load(
                w,
                "embed_norm",
                d.norm,
                d.hidden_size,
                d.norm_eps,
            )?)
        } else {
            None
        };
        Ok(Model {
            embed_tokens,
            embed_norm,
            positions,
            layers,
            norm,
            lm_head,
            fa_idx,
            swa_idx,
            desc,
            grad_checkpoint: false,
            checkpoint_own: 0..0,
            pipeline: None,
            mtp,
            cpu_lanes: Default::default(),
        })
    }

    /// Where the CPU decoder keeps the lane layouts of this model's 4-bit weights
    /// (`mlx_core::cpu::LanesStore`, made only under `MLX_CPU_LANE4=1`): they live as long as
    /// the model, and a layout whose arrays were replaced since is not attached.
    pub fn cpu_lanes(&self) -> &mlx_core::cpu::LanesStore {
        &self.cpu_lanes
    }

    fn sanitize(d: &Descriptor, w: &mut Weights) -> Result<()> {
        if let Some(r) = &d.hf_renames {
            for k in w.names() {
                if r.is_conv1d(&k) {
                    w.map_tensor(&k, |a| Ok(ops::transpose_all(a, None)?))?;
                }
            }
            w.rename_all(|k| r.rename(k))?;
        }
        for prefix in &d.drop_prefixes {
            // `--mtp`: the multi-token-prediction layers stay for `mtp::load`.
            if w.mtp() && d.mtp_layers.is_some_and(|m| prefix.starts_with(m)) {
                continue;
            }
            w.discard_prefix(prefix);
        }
        if let Some(invert_head) = d.bitlinear {
            for k in w.names() {
                let Some(base) = k.strip_suffix(".weight_scale") else {
                    continue;
                };
                let weight = format!("{base}.weight");
                let (Some(packed), Some(scale)) = (w.remove(&weight), w.remove(&k)) else {
                    return Err(ModelError::Weights(vec![format!(
                        "{k} present but {weight} missing"
                    )]));
                };
                let invert = invert_head && base == d.names.lm_head;
                let unpacked = unpack_bitlinear(&packed, &scale, invert)
                    .map_err(|e| ModelError::Weights(vec![format!("{weight}: {e}")]))?;
                w.insert(weight, unpacked);
            }
        }
        if let Some(p) = d.strip_prefix {
            w.strip_prefix(p);
        }
        for i in 0..d.num_layers {
            for t in &d.drop_layer_tensors {
                w.discard(&format!("{}.{i}.{t}", d.names.layers));
            }
        }
        if d.head == Head::Tied {
            for suffix in ["weight", "scales", "biases"] {
                w.discard(&format!("{}.{suffix}", d.names.lm_head));
            }
        }
        Ok(())
    }

    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    /// The input embedding, read-only.
    pub fn embed_tokens(&self) -> &Embedding {
        &self.embed_tokens
    }

    /// The final norm, read-only.
    pub fn final_norm(&self) -> &Norm {
        &self.norm
    }

    /// The untied output head (`None` when the head is the tied embedding).
    pub fn lm_head(&self) -> Option<&Linear> {
        self.lm_head.as_ref()
    }

    /// Layer `i`'s weights, read-only (`None` past the last layer).
    pub fn layer_view(&self, i: usize) -> Option<LayerView<'_>> {
        let b = self.layers.get(i)?;
        let a = &b.self_attn;
        let (q, k, v) = match a.fused {
            None => (Some(&a.q_proj), a.k_proj.as_ref(), a.v_proj.as_ref()),
            Some(_) => (None, None, None),
        };
        let qkv = match a.fused {
            Some(QkvLayout::Split) => Some(&a.q_proj),
            _ => None,
        };
        Some(LayerView {
            sliding: b.sliding,
            pre_attn_norm: b.pre_attn.as_ref(),
            post_attn_norm: b.post_attn.as_ref(),
            pre_mlp_norm: b.pre_mlp.as_ref(),
            post_mlp_norm: b.post_mlp.as_ref(),
            q,
            k,
            v,
            qkv,
            o: &a.o_proj,
            head_gate: a.head_gate.is_some(),
            q_norm: a.q_norm.as_ref(),
            k_norm: a.k_norm.as_ref(),
            other_qk_norm: a.layer_norms.is_some(),
            rope: a.rope.as_ref(),
            mlp: &b.mlp,
        })
    }

    fn embed(&self, inputs: &Array, offset: usize) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        if let Some(wpe) = &self.positions {
            // gpt2.py: `h += wpe(mx.arange(L) + mx.array(offset)[..., None])`;
            // gpt_bigcode.py: `h += wpe(mx.array(np.arange(offset, offset + L)))`.
            let l = inputs.shape().get(1).copied().unwrap_or(0);
            if offset + l.max(0) as usize > self.desc.n_positions as usize {
                return Err(ModelError::Input {
                    what: format!("position {}", offset + l.max(0) as usize),
                    problem: format!(
                        "past the learned position table ({} rows)",
                        self.desc.n_positions
                    ),
                });
            }
            let ids = if self.desc.positions_on_host {
                let ids: Vec<i64> = (0..i64::from(l)).map(|i| offset as i64 + i).collect();
                Array::from_slice(&ids, &[l])?
            } else {
                let start = Array::from_int(offset as i64, Dtype::Int32)?;
                let range = ops::arange(0.0, f64::from(l), 1.0, Dtype::Int32, None)?;
                (&range + &ops::expand_dims(&start, &[-1], None)?)?
            };
            h = (&h + &wpe.forward(&ids)?)?;
        }
        let h = match self.desc.embed_scale {
            EmbedScale::None => h,
            EmbedScale::Weak(s) => (&h * (s as f32))?,
            EmbedScale::Bf16(s) => {
                let c = Array::from_f32(s as f32, Dtype::Bfloat16)?.astype(h.dtype())?;
                (&h * &c)?
            }
        };
        match &self.embed_norm {
            Some(n) => n.forward(&h),
            None => Ok(h),
        }
    }

    fn head(&self, out: &Array) -> Result<Array> {
        self.shaped_head().forward(out)
    }

    /// The projection with the row's logit scaling and soft-capping around it.
    fn shaped_head(&self) -> OutputHead {
        let plain = OutputHead::of(self.lm_head.as_ref(), &self.embed_tokens);
        let pre_div = match self.desc.logit_scale {
            LogitScale::DivBeforeHead(s) if self.lm_head.is_some() => Some(s as f32),
            _ => None,
        };
        let mut post = Vec::new();
        match self.desc.logit_scale {
            LogitScale::None | LogitScale::DivBeforeHead(_) => {}
            LogitScale::Mul(s) => post.push(LogitTransform::Mul(s as f32)),
            LogitScale::Div(s) => post.push(LogitTransform::Div(s as f32)),
        }
        match self.desc.final_logit_softcap {
            None => {}
            // nanochat's `cap * tanh(logits / cap)`: the same ops, one compiled function.
            Some(cap) if self.desc.final_logit_softcap_compiled => {
                post.push(LogitTransform::SoftcapCompiled(cap))
            }
            Some(cap) => post.push(LogitTransform::Softcap(cap as f32)),
        }
        if pre_div.is_none() && post.is_empty() {
            return plain;
        }
        OutputHead::Shaped {
            inner: Box::new(plain),
            pre_div,
            post,
        }
    }
}

impl Model {
    /// The full-attention mask and (with sliding layers) the sliding-window mask for `n` new
    /// tokens over `caches` as they are before the step (`create_attention_mask` on the first
    /// full and the first sliding layer's cache, as mlx-lm's models do).
    fn cache_masks(
        &self,
        caches: &[Box<dyn Cache>],
        n: usize,
    ) -> Result<(AttentionMask, Option<AttentionMask>)> {
        if caches.len() != self.layers.len() * self.desc.loops.max(1) {
            return Err(ModelError::Cache {
                what: "dense".into(),
                problem: format!(
                    "{} caches for {} layers",
                    caches.len(),
                    self.layers.len() * self.desc.loops.max(1)
                ),
            });
        }
        let as_array = self.desc.mask_as_array;
        let fa_mask = caches[self.fa_idx].make_mask(n, None, as_array)?;
        let swa_mask = match self.swa_idx {
            Some(i) => Some(caches[i].make_mask(n, self.mask_window(), as_array)?),
            None => None,
        };
        Ok((fa_mask, swa_mask))
    }

    /// The sliding layers' mask window.
    fn mask_window(&self) -> Option<usize> {
        self.desc.sliding_mask_window.or(self.desc.sliding_window)
    }

    /// Whether [`SegmentedDecode`] can run this model: sequential blocks, no learned
    /// positions, no per-position query scale, no output gate (it reads the attention's
    /// input, which the segments do not carry), ropes that take an array offset.
    fn segmentable(&self) -> bool {
        self.pipeline.is_none()
            && self.positions.is_none()
            && self.desc.loops <= 1
            && self.desc.query_scale.is_none()
            && self.layers.iter().all(|l| {
                l.sequential()
                    && l.self_attn.head_gate.is_none()
                    && l.self_attn
                        .rope
                        .as_ref()
                        .is_none_or(Rope::takes_array_offset)
            })
    }

    /// The layers and the final norm: the hidden states [`Model::head`] turns into logits.
    fn run(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
        trace: Option<&RefCell<Vec<(String, Array)>>>,
    ) -> Result<Array> {
        if inputs.ndim() != 2 {
            return Err(ModelError::Input {
                what: "inputs".into(),
                problem: format!(
                    "must be token ids of shape (batch, seq), got shape {:?}",
                    inputs.shape()
                ),
            });
        }
        let offset = match &caches {
            Some(c) => c.first().map_or(0, |c| c.offset()),
            None => 0,
        };
        let mut h = self.embed(inputs, offset)?;
        let n = h.shape().get(1).copied().unwrap_or(0) as usize;
        let qs = match self.desc.query_scale {
            Some((beta, original)) => {
                Some(llama4_attn_scale(n, offset, beta, original, h.dtype())?)
            }
            None => None,
        };
        let query_scale = qs.as_ref();
        let window = self.mask_window();
        let as_array = self.desc.mask_as_array;
        match caches {
            Some(caches) => {
                let (fa_mask, swa_mask) = self.cache_masks(caches, n)?;
                let h0 = h;
                h = self.pipeline_recv(h0)?;
                let nl = self.layers.len();
                for (j, cache) in caches.iter_mut().enumerate() {
                    let i = j % nl;
                    let layer = &self.layers[i];
                    if j > 0 && i == 0 && self.desc.loop_norm {
                        h = self.norm.forward(&h)?;
                    }
                    let mask = layer.pick_mask(&fa_mask, &swa_mask);
                    let ctx = Ctx {
                        mask,
                        query_scale,
                        layer: i,
                        trace,
                    };
                    ctx.tap("in", &h);
                    h = if self.grad_checkpoint
                        && trace.is_none()
                        && cache.class_name() == "ConcatenateKVCache"
                    {
                        let own = self.checkpoint_own.contains(&i).then_some(&self.desc.names);
                        layer.forward_checkpointed(&h, mask, query_scale, i, own, Some(cache))?
                    } else {
                        layer.forward(&h, &ctx, Some(cache))?
                    };
                    ctx.tap("out", &h);
                }
                h = self.pipeline_send(h, caches.last_mut())?;
            }
            None => {
                let fa_mask = no_cache_mask(n, None, as_array)?;
                let swa_mask = no_cache_mask(n, window, as_array)?;
                h = self.pipeline_recv(h)?;
                let nl = self.layers.len();
                for j in 0..nl * self.desc.loops.max(1) {
                    let i = j % nl;
                    let layer = &self.layers[i];
                    if j > 0 && i == 0 && self.desc.loop_norm {
                        h = self.norm.forward(&h)?;
                    }
                    let mask = if layer.sliding { &swa_mask } else { &fa_mask };
                    let ctx = Ctx {
                        mask,
                        query_scale,
                        layer: i,
                        trace,
                    };
                    ctx.tap("in", &h);
                    h = if self.grad_checkpoint && trace.is_none() {
                        let own = self.checkpoint_own.contains(&i).then_some(&self.desc.names);
                        layer.forward_checkpointed(&h, mask, query_scale, i, own, None)?
                    } else {
                        layer.forward(&h, &ctx, None)?
                    };
                    ctx.tap("out", &h);
                }
                h = self.pipeline_send(h, None)?;
            }
        }
        self.norm.forward(&h)
    }

    /// A pipeline stage's input ([`crate::shard::pipeline_recv`]).
    fn pipeline_recv(&self, h: Array) -> Result<Array> {
        crate::shard::pipeline_recv(h, self.pipeline)
    }

    /// A pipeline stage's output ([`crate::shard::pipeline_send`]).
    fn pipeline_send(&self, h: Array, last: Option<&mut Box<dyn Cache>>) -> Result<Array> {
        crate::shard::pipeline_send(h, self.pipeline, last)
    }
}

impl LanguageModel for Model {
    fn shard_tensor_parallel(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_tensor_parallel(self, size, rank)
    }

    fn shard_pipeline(&mut self, size: i32, rank: i32) -> Result<()> {
        Model::shard_pipeline(self, size, rank)
    }

    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
        self.head(&self.run(inputs, caches, None)?)
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
        Some(self.run(inputs, None, None))
    }

    fn forward_hidden_cached(
        &self,
        inputs: &Array,
        caches: &mut [Box<dyn Cache>],
    ) -> Option<Result<Array>> {
        Some(self.run(inputs, Some(caches), None))
    }

    fn output_head(&self) -> Option<OutputHead> {
        Some(self.shaped_head())
    }

    fn mtp(&self) -> Option<&dyn crate::models::MtpHead> {
        (!self.mtp.is_empty()).then_some(self as &dyn crate::models::MtpHead)
    }

    fn trace(&self, inputs: &Array) -> Result<Vec<(String, Array)>> {
        let taps = RefCell::new(Vec::new());
        let logits = self.head(&self.run(inputs, None, Some(&taps))?)?;
        let mut taps = taps.into_inner();
        taps.push(("logits".into(), logits));
        Ok(taps)
    }

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        // One cache per layer and pass of the stack (Nanbeige's loops).
        std::iter::repeat_n(&self.layers, self.desc.loops.max(1))
            .flatten()
            .map(|l| -> Box<dyn Cache> {
                // Without a `make_cache` of its own, mlx-lm's `make_prompt_cache` gives every
                // layer a plain KVCache.
                match (
                    l.sliding && self.desc.defines_make_cache,
                    self.desc.sliding_window,
                ) {
                    (true, Some(w)) => match RotatingKVCache::new(w, 0) {
                        Ok(c) => Box::new(c),
                        Err(_) => Box::new(KVCache::new()),
                    },
                    _ => Box::new(KVCache::new()),
                }
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        self.desc.defines_make_cache
    }

    fn as_dense(&self) -> Option<&Model> {
        Some(self)
    }

    fn as_dense_mut(&mut self) -> Option<&mut Model> {
        Some(self)
    }

    fn segmented(&self) -> Option<&dyn SegmentedDecode> {
        if self.segmentable() {
            Some(self)
        } else {
            None
        }
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn model_type(&self) -> &str {
        &self.desc.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.desc.vocab_size
    }

    fn as_trainable_mut(&mut self) -> Option<&mut dyn super::Trainable> {
        Some(self)
    }
}

impl super::Trainable for Model {
    fn layer_adaptables_mut(&mut self) -> Vec<Vec<(String, LinearMut<'_>)>> {
        let names = &self.desc.names;
        self.layers
            .iter_mut()
            .map(|l| Walk::linears(move |w| l.walk("", names, w)))
            .collect()
    }

    fn layers_path(&self) -> String {
        self.desc.names.layers.to_string()
    }

    fn top_modules_mut(&mut self) -> Vec<(String, super::TopModuleMut<'_>)> {
        let names = &self.desc.names;
        super::head_and_embedding(
            "",
            self.lm_head.as_mut(),
            names.lm_head,
            &mut self.embed_tokens,
            names.embed,
        )
    }

    fn layer_parameters_mut(&mut self) -> Result<Vec<Vec<LayerParam<'_>>>> {
        let d = &self.desc;
        let names = &d.names;
        self.layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| l.parameters_mut(&format!("{}.{i}", names.layers), names))
            .collect()
    }

    fn set_grad_checkpoint(&mut self, on: bool) -> bool {
        self.grad_checkpoint = on;
        true
    }

    fn set_checkpoint_layer_params(&mut self, layers: std::ops::Range<usize>) -> bool {
        self.checkpoint_own = layers;
        true
    }
}

impl SegmentedDecode for Model {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn segment(&self, i: usize, inputs: &[Array]) -> Result<Vec<Array>> {
        let n = self.layers.len();
        let input = |j: usize| {
            inputs.get(j).ok_or_else(|| ModelError::Input {
                what: format!("decode segment {i}"),
                problem: format!(
                    "expected {} inputs, got {}",
                    if i == 0 { 2 } else { 3 },
                    inputs.len()
                ),
            })
        };
        let (x, offset) = if i == 0 {
            (self.embed(input(0)?, 0)?, input(1)?)
        } else if i <= n {
            let layer = &self.layers[i - 1];
            let ctx = Ctx {
                mask: &AttentionMask::None,
                query_scale: None,
                layer: i - 1,
                trace: None,
            };
            // `x` is read only by an output gate, which `segmentable` excludes.
            let r = layer.self_attn.output(input(0)?, input(1)?)?;
            (layer.after_attn(input(0)?, &r, &ctx)?, input(2)?)
        } else {
            return Err(ModelError::Input {
                what: format!("decode segment {i}"),
                problem: format!("out of range for a model with {n} layers"),
            });
        };
        match self.layers.get(i) {
            Some(layer) => {
                let h = norm_opt(&layer.pre_attn, &x)?;
                let (q, k, v) = layer.self_attn.project(&h, RopeAt::Array(offset))?;
                Ok(vec![x, q, k, v])
            }
            None => Ok(vec![self.head(&self.norm.forward(&x)?)?]),
        }
    }

    fn masks(&self, caches: &[Box<dyn Cache>], n: usize) -> Result<Vec<AttentionMask>> {
        let (fa, swa) = self.cache_masks(caches, n)?;
        Ok(self
            .layers
            .iter()
            .map(|l| l.pick_mask(&fa, &swa).clone())
            .collect())
    }

    fn attend(
        &self,
        layer: usize,
        queries: &Array,
        kv: &Kv,
        mask: &AttentionMask,
    ) -> Result<Array> {
        let l = self.layers.get(layer).ok_or_else(|| ModelError::Input {
            what: format!("layer {layer}"),
            problem: format!("out of range: the model has {}", self.layers.len()),
        })?;
        l.self_attn.attend(queries, kv, mask, None)
    }
}

/// A BitLinear's packed ternary weight (uint8 `(out / 4, in)`: bits `2i..2i + 2` of row `r`
/// hold row `r + i * out / 4` as `code - 1`) as a plain weight: the ternary values in float32
/// times the scale (or divided by it), cast to the scale's dtype, as mlx-lm's Metal kernel
/// scales its float32 sums.
fn unpack_bitlinear(packed: &Array, scale: &Array, invert: bool) -> Result<Array> {
    if packed.dtype() != Dtype::Uint8 || packed.ndim() != 2 {
        return Err(ModelError::Tensor {
            name: "a packed BitLinear weight".into(),
            problem: format!(
                "must be a 2-d uint8 array, got {:?} of shape {:?}",
                packed.dtype(),
                packed.shape()
            ),
        });
    }
    if scale.size() != 1 {
        return Err(ModelError::Tensor {
            name: "weight_scale".into(),
            problem: format!("must hold one value, got shape {:?}", scale.shape()),
        });
    }
    let planes = (0..4)
        .map(|i| -> Result<Array> {
            let code = (&(packed >> (2 * i))? & 3)?;
            Ok((&code.astype(Dtype::Float32)? - 1.0f32)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let ternary = ops::concatenate(&planes.iter().collect::<Vec<_>>(), 0, None)?;
    let s = scale.astype(Dtype::Float32)?;
    let s = if invert { (1.0f32 / &s)? } else { s };
    Ok((&ternary * &s)?.astype(scale.dtype())?)
}

/// ministral3.py `_get_llama_4_attn_scale(L, offset, beta, original)[:, None]`, in `dtype`:
/// `1 + beta * log(1 + floor((arange(L) + offset) / original))`.
pub(crate) fn llama4_attn_scale(
    n: usize,
    offset: usize,
    beta: f64,
    original: i64,
    dtype: Dtype,
) -> Result<Array> {
    let pos = ops::arange(0.0, n as f64, 1.0, Dtype::Int32, None)?;
    let pos = (&pos + &Scalar::Int(offset as i64).to_array_like(Dtype::Int32)?)?;
    let q = (&pos / &Scalar::Int(original).to_array_like(Dtype::Int32)?)?;
    let f = ops::floor(&q, None)?;
    let one_plus = (1 + &f)?;
    let l = ops::log(&one_plus, None)?;
    let scaled = (&l * &Scalar::from(beta).to_array_like(l.dtype())?)?;
    let s = (1 + &scaled)?;
    Ok(ops::expand_dims(&s, &[1], None)?.astype(dtype)?)
}

/// `base.create_attention_mask(h, None, window_size, return_array)`.
/// The parts of a layer AWQ (`mlx_lm.quant.awq`) runs alone: the whole block, its
/// `self_attn`, its `mlp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AwqPart {
    Block,
    Attention,
    Mlp,
}

/// What AWQ changes of a layer: its attention and MLP input norms and its linears.
pub struct AwqLayerMut<'a> {
    /// `input_layernorm`.
    pub pre_attn: &'a mut Norm,
    /// `post_attention_layernorm`.
    pub pre_mlp: &'a mut Norm,
    /// The linears under their paths inside the layer (mlx-lm's declaration order).
    pub linears: Vec<(String, &'a mut Linear)>,
}

/// What in a model AWQ's recipe does not fit ([`Model::awq_llama_shape`]): the part that
/// differs, as AWQ's refusal names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AwqMismatch(pub &'static str);

impl From<&'static str> for AwqMismatch {
    fn from(what: &'static str) -> AwqMismatch {
        AwqMismatch(what)
    }
}

impl std::fmt::Display for AwqMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Model {
    /// Whether AWQ's llama recipe (`llama_awq`) fits this model: pre-norm blocks with plain
    /// RMS norms, separate q/k/v projections, gate/up/down MLPs, one causal mask, learned
    /// positions and loops absent; the problem otherwise.
    pub fn awq_llama_shape(&self) -> std::result::Result<(), AwqMismatch> {
        let d = &self.desc;
        if d.placement != Placement::Pre {
            return Err("its blocks are not pre-norm".into());
        }
        if d.norm != NormKind::Rms {
            return Err("its norms are not plain RMS norms".into());
        }
        self.awq_common_shape(false)
    }

    /// Whether AWQ's Gemma 3 recipe (`gemma3_text_awq`) fits: sandwich blocks with Gemma's
    /// `1 + w` RMS norms (sliding layers and the float16 residual clip allowed: AWQ runs every
    /// block under the one causal mask); the problem otherwise.
    pub fn awq_gemma3_shape(&self) -> std::result::Result<(), AwqMismatch> {
        let d = &self.desc;
        if d.placement != Placement::Sandwich || d.post_norm_offsets.is_some() {
            return Err("its blocks are not Gemma's sandwich blocks".into());
        }
        if d.norm != NormKind::RmsOffset {
            return Err("its norms are not Gemma's `1 + w` RMS norms".into());
        }
        self.awq_common_shape(true)
    }

    /// The names of the norms AWQ folds scales into: before attention and before the MLP.
    pub fn awq_norm_names(&self) -> (&'static str, &'static str) {
        (self.desc.names.pre_attn_norm, self.desc.names.pre_mlp_norm)
    }

    fn awq_common_shape(&self, gemma: bool) -> std::result::Result<(), AwqMismatch> {
        let d = &self.desc;
        // Query scales (`llama_4_scaling`, ministral3) are fine: run alone, mlx-lm's attention
        // computes them itself for positions from 0, as `awq_run` does.
        if self.positions.is_some() || d.loops > 1 {
            return Err("learned positions or loops".into());
        }
        if self.pipeline.is_some() || self.embed_norm.is_some() {
            return Err("a pipeline stage or an embedding norm".into());
        }
        for l in &self.layers {
            // Sliding layers run under the one causal mask (`awq_run`), as mlx-lm calls them.
            if (!gemma && l.clip_residual)
                || l.self_attn.head_gate.is_some()
                || l.residual_multiplier.is_some()
            {
                return Err("a clipped residual, gated attention or scaled residuals".into());
            }
            if l.self_attn.fused.is_some() {
                return Err("fused q/k/v projections".into());
            }
            if l.self_attn.sub_norm.is_some() {
                return Err("an attention sub-norm".into());
            }
        }
        Ok(())
    }

    /// `model.model.embed_tokens(ids)` alone (AWQ's first input; no embedding scale).
    pub fn awq_embed(&self, ids: &Array) -> Result<Array> {
        self.embed_tokens.forward(ids)
    }

    /// The input embedding, to quantize it in place.
    pub fn awq_embedding_mut(&mut self) -> &mut Embedding {
        &mut self.embed_tokens
    }

    /// Layer `i`'s `part` on `x` without a cache, under `create_attention_mask(x)` (causal
    /// for more than one position).
    pub fn awq_run(&self, i: usize, part: AwqPart, x: &Array) -> Result<Array> {
        let l = self.layers.get(i).ok_or_else(|| ModelError::Input {
            what: format!("layer {i}"),
            problem: format!("the model has {} layers", self.layers.len()),
        })?;
        let n = x.shape().get(1).copied().unwrap_or(0) as usize;
        let mask = no_cache_mask(n, None, self.desc.mask_as_array)?;
        // ministral3's attention, called without `attn_scale`, makes its own for positions
        // from 0 in its input's dtype.
        let qs = match self.desc.query_scale {
            Some((beta, original)) => Some(llama4_attn_scale(n, 0, beta, original, x.dtype())?),
            None => None,
        };
        let ctx = Ctx {
            mask: &mask,
            query_scale: qs.as_ref(),
            layer: i,
            trace: None,
        };
        match part {
            AwqPart::Block => l.forward(x, &ctx, None),
            AwqPart::Attention => l
                .self_attn
                .forward_scaled(x, ctx.mask, ctx.query_scale, None),
            AwqPart::Mlp => l.mlp.forward(x),
        }
    }

    /// Layer `i`'s norms and linears (a pre-norm layer: see [`Model::awq_llama_shape`]).
    pub fn awq_layer_mut(&mut self, i: usize) -> Result<AwqLayerMut<'_>> {
        let names = &self.desc.names;
        let n = self.layers.len();
        let l = self.layers.get_mut(i).ok_or_else(|| ModelError::Input {
            what: format!("layer {i}"),
            problem: format!("the model has {n} layers"),
        })?;
        let TransformerBlock {
            self_attn,
            mlp,
            pre_attn,
            pre_mlp,
            ..
        } = l;
        let (Some(pre_attn), Some(pre_mlp)) = (pre_attn.as_mut(), pre_mlp.as_mut()) else {
            return Err(ModelError::Unsupported {
                what: format!("layer {i}"),
                problem: "has no pre-attention and pre-MLP norms".into(),
            });
        };
        let walked = crate::layers::Walk::linears(|w| {
            self_attn.walk(names.attn, w);
            mlp.walk(names.mlp, &names.mlp_names, w);
        });
        let mut linears = Vec::with_capacity(walked.len());
        for (name, l) in walked {
            match l {
                LinearMut::Linear(l) => linears.push((name, l)),
                LinearMut::Switch(_) => {
                    return Err(ModelError::Unsupported {
                        what: format!("layer {i}: {name}"),
                        problem: "AWQ of switch linears is not implemented".into(),
                    })
                }
            }
        }
        Ok(AwqLayerMut {
            pre_attn,
            pre_mlp,
            linears,
        })
    }

    /// The untied output head, if any.
    pub fn awq_lm_head_mut(&mut self) -> Option<&mut Linear> {
        self.lm_head.as_mut()
    }
}

fn no_cache_mask(n: usize, window: Option<usize>, return_array: bool) -> Result<AttentionMask> {
    Ok(mlx_cache::mask::fallback_mask(n, window, return_array)?)
}

impl NormKind {
    /// mlx-lm's name for the norm, for descriptions.
    pub fn describe(self) -> &'static str {
        match self {
            NormKind::Rms => "RMSNorm",
            NormKind::RmsOffset => "RMSNorm (1 + w)",
            NormKind::Layer { bias: true } => "LayerNorm",
            NormKind::Layer { bias: false } => "LayerNorm (no bias)",
            NormKind::LayerOffset { .. } => "LayerNorm (1 + w)",
            NormKind::RmsNoWeight => "RMSNorm (no weight)",
            NormKind::LayerNoAffine => "LayerNorm (no affine)",
        }
    }
}
