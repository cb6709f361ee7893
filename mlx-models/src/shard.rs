//! Tensor parallelism as mlx-lm shards a model (`Model.shard()`, run by `sharded_load`), over
//! MLX's distributed layer (`mlx_core::distributed`).
//!
//! mlx-lm's `shard_linear` has two kinds (mlx/nn/layers/distributed.py):
//! - all-to-sharded: rank r keeps the r-th of N equal parts of the weight's output rows (and
//!   of the bias); the input is the full hidden state, the output this rank's slice;
//! - sharded-to-all: rank r keeps the r-th of N equal parts of the weight's input columns; the
//!   output is `all_sum(x @ W_r^T)` and then `+ bias` (the bias is not split).
//!
//! [`crate::models::dense::Model::shard_tensor_parallel`] applies them as llama's `shard()`
//! does (q/k/v, gate, up all-to-sharded; o, down sharded-to-all; heads and KV heads divided by
//! N); [`crate::models::deepseek::Model::shard_tensor_parallel`] as deepseek_v3's (MLA heads
//! split, MoE experts sharded in place as mlx's `shard_inplace`, the block summing).

use mlx_core::distributed;
use mlx_core::ops;
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::layers::{Linear, LinearAdapter, Mlp, MlpNames, QuantizedWeight, SwitchLinear};

/// The r-th of `n` equal parts of `w` along `axis`, made contiguous (mlx-lm's `_shard`).
fn part(w: &Array, n: i32, r: i32, axis: i32, what: &str) -> Result<Array> {
    let shape = w.shape();
    let ax = if axis < 0 {
        shape.len() as i32 + axis
    } else {
        axis
    };
    let len = shape.get(ax as usize).copied().unwrap_or(0);
    if n <= 0 || len % n != 0 {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: what.to_string(),
            problem: format!("dimension {len} cannot be split into {n} equal parts"),
        });
    }
    let parts = ops::split_equal(w, n, axis, None)?;
    let p = parts.get(r as usize).ok_or_else(|| ModelError::Parallel {
        kind: crate::Parallelism::Tensor,
        what: what.to_string(),
        problem: format!("rank {r} out of {n}"),
    })?;
    Ok(ops::contiguous(p, false, None)?)
}

/// mlx's `_shard` with segments: `w` cut along `axis` at `segments` (indices), the r-th of
/// `n` equal parts of each piece, concatenated and made contiguous (a fused q | k | v weight
/// keeps each rank's part of q, of k and of v). No segments: [`part`].
fn part_segments(
    w: &Array,
    segments: &[i32],
    n: i32,
    r: i32,
    axis: i32,
    what: &str,
) -> Result<Array> {
    if segments.is_empty() {
        return part(w, n, r, axis, what);
    }
    let shape = w.shape();
    let ax = if axis < 0 {
        shape.len() as i32 + axis
    } else {
        axis
    };
    let len = shape.get(ax as usize).copied().unwrap_or(0);
    if segments.windows(2).any(|p| p[0] > p[1]) || segments.iter().any(|&i| i < 0 || i > len) {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: what.to_string(),
            problem: format!("segments {segments:?} do not fit a dimension of {len}"),
        });
    }
    let pieces = ops::split_at(w, segments, axis, None)?;
    let mut mine = Vec::with_capacity(pieces.len());
    for p in &pieces {
        mine.push(part(p, n, r, axis, what)?);
    }
    let refs: Vec<&Array> = mine.iter().collect();
    Ok(ops::contiguous(
        &ops::concatenate(&refs, axis, None)?,
        false,
        None,
    )?)
}

/// The r-th of `n` parts of a linear's weight along `axis` (0: output rows, -1: input
/// columns), its quantized scales and biases with it (mlx's `_shard` splits every array of
/// a `QuantizedLinear` the same way: the packed columns and the groups divide alike).
fn split_weight(
    l: &Linear,
    segments: &[i32],
    n: i32,
    r: i32,
    axis: i32,
    what: &str,
) -> Result<(Linear, Option<Array>)> {
    match l {
        Linear::Dense { weight, bias } => Ok((
            Linear::Dense {
                weight: part_segments(weight, segments, n, r, axis, what)?,
                bias: None,
            },
            bias.clone(),
        )),
        Linear::Quantized { weight: q, bias } => {
            let split = |a: &Array| part_segments(a, segments, n, r, axis, what);
            Ok((
                Linear::Quantized {
                    weight: QuantizedWeight {
                        weight: split(&q.weight)?,
                        scales: split(&q.scales)?,
                        biases: q.biases.as_ref().map(split).transpose()?,
                        ..q.clone()
                    },
                    bias: None,
                },
                bias.clone(),
            ))
        }
        Linear::Adapted(_) => Err(ModelError::Parallel { kind: crate::Parallelism::Tensor, what: what.to_string(), problem: "cannot split an adapted linear (fuse the adapter first)".into() }),
        Linear::Ggml { .. } => Err(ModelError::Parallel { kind: crate::Parallelism::Tensor, what: what.to_string(), problem: "cannot split GGML blocks kept for the CPU decoder (load with --decoder mlx)".into() }),
        Linear::Trellis { .. } => Err(ModelError::Parallel { kind: crate::Parallelism::Tensor, what: what.to_string(), problem: "cannot split a trellis-coded linear (its Hadamard blocks and tail-biting streams span the whole matrix)".into() }),
    }
}

fn with_bias(l: Linear, bias: Option<Array>) -> Linear {
    match l {
        Linear::Dense { weight, .. } => Linear::Dense { weight, bias },
        Linear::Quantized { weight, .. } => Linear::Quantized { weight, bias },
        other => other,
    }
}

/// Replaces `l` by its all-to-sharded part for rank `r` of `n`.
pub fn all_to_sharded(l: &mut Linear, n: i32, r: i32, what: &str) -> Result<()> {
    all_to_sharded_segments(l, &[], n, r, what)
}

/// [`all_to_sharded`] of a fused linear whose output rows are `segments` (indices, mlx's
/// `shard_inplace(..., segments=[...])`): rank `r` keeps its part of every segment.
pub fn all_to_sharded_segments(
    l: &mut Linear,
    segments: &[i32],
    n: i32,
    r: i32,
    what: &str,
) -> Result<()> {
    let (base, b) = split_weight(l, segments, n, r, 0, what)?;
    let bias = b
        .map(|b| part_segments(&b, segments, n, r, -1, what))
        .transpose()?;
    *l = with_bias(base, bias);
    Ok(())
}

/// [`part_segments`] along axis 0 of a plain array (a depthwise convolution's weight, a
/// per-head vector such as `dt_bias`).
pub fn split_rows(w: &Array, segments: &[i32], n: i32, r: i32, what: &str) -> Result<Array> {
    part_segments(w, segments, n, r, 0, what)
}

/// mlx-lm's `repeat_kv_layer_inplace` (qwen3_5's `shard()`): with more ranks `n` than the
/// linear's `heads` (output rows in `heads` blocks), every array of it (weight, quantized
/// scales and biases, bias) has each head's rows repeated `n / heads` times, so that an
/// all-to-sharded split gives each rank a whole head. Nothing to do when `n <= heads`.
pub fn repeat_heads(l: &mut Linear, heads: i32, n: i32, what: &str) -> Result<()> {
    if n <= heads {
        return Ok(());
    }
    if heads <= 0 || n % heads != 0 {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: what.to_string(),
            problem: format!("{heads} heads cannot be repeated over {n} ranks"),
        });
    }
    let rep = |p: &Array| -> Result<Array> {
        let s = p.shape();
        let rows = s.first().copied().unwrap_or(0);
        if rows % heads != 0 {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: what.to_string(),
                problem: format!("{rows} rows do not split into {heads} heads"),
            });
        }
        let mut by_head = vec![heads, rows / heads];
        by_head.extend_from_slice(&s[1..]);
        let x = ops::reshape(p, &by_head, None)?;
        let x = ops::repeat(&x, n / heads, 0, None)?;
        let mut flat = vec![-1];
        flat.extend_from_slice(&s[1..]);
        Ok(ops::reshape(&x, &flat, None)?)
    };
    *l = match &*l {
        Linear::Dense { weight, bias } => Linear::Dense {
            weight: rep(weight)?,
            bias: bias.as_ref().map(rep).transpose()?,
        },
        Linear::Quantized { weight: q, bias } => Linear::Quantized {
            weight: QuantizedWeight {
                weight: rep(&q.weight)?,
                scales: rep(&q.scales)?,
                biases: q.biases.as_ref().map(rep).transpose()?,
                ..q.clone()
            },
            bias: bias.as_ref().map(rep).transpose()?,
        },
        _ => {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: what.to_string(),
                problem: "cannot repeat the heads of an adapted or trellis-coded linear".into(),
            })
        }
    };
    Ok(())
}

/// mlx-lm's `gather_last_axis` (models/base.py): `x`'s last axis is split over the `n` ranks
/// of the global group; all-gathers the rows and puts the parts side by side in rank order.
pub fn gather_last_axis(x: &Array, n: i32) -> Result<Array> {
    let shape = x.shape();
    let size = shape.last().copied().unwrap_or(0);
    let parts = distributed::all_gather(&ops::reshape(x, &[-1, size], None)?, None, None)?;
    let parts = ops::transpose(
        &ops::reshape(&parts, &[n, -1, size], None)?,
        &[1, 0, 2],
        None,
    )?;
    let mut out = shape[..shape.len().saturating_sub(1)].to_vec();
    out.push(n * size);
    Ok(ops::reshape(&parts, &out, None)?)
}

/// Replaces `l` by its sharded-to-all part for rank `r` of `n` (sums over the global group).
pub fn sharded_to_all(l: &mut Linear, n: i32, r: i32, what: &str) -> Result<()> {
    let (base, bias) = split_weight(l, &[], n, r, -1, what)?;
    *l = Linear::Adapted(Box::new(ShardedToAll { base, bias }));
    Ok(())
}

/// mlx's `ShardedToAllLinear`: `all_sum(x @ W^T)`, then `+ bias`.
#[derive(Clone, Debug)]
pub struct ShardedToAll {
    base: Linear,
    bias: Option<Array>,
}

impl LinearAdapter for ShardedToAll {
    fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.base.forward(x)?;
        let y = distributed::all_sum(&y, None, None)?;
        Ok(match &self.bias {
            Some(b) => (&y + b)?,
            None => y,
        })
    }
    fn clone_box(&self) -> Box<dyn LinearAdapter> {
        Box::new(self.clone())
    }
    fn base(&self) -> &Linear {
        &self.base
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// mlx's `shard_inplace(module, "sharded-to-all")` on a linear: rank `r` keeps its part of the
/// input columns (quantized scales and biases with them), the bias whole, and no sum (the
/// enclosing block sums, as mlx-lm's MoE with `sharding_group` does).
pub fn sharded_to_all_inplace(l: &mut Linear, n: i32, r: i32, what: &str) -> Result<()> {
    let (base, bias) = split_weight(l, &[], n, r, -1, what)?;
    *l = with_bias(base, bias);
    Ok(())
}

/// mlx-lm's `shard()` of an MLP (the ports' dense MLPs and shared experts): gate and up (a
/// plain MLP's up) all-to-sharded, down sharded-to-all; with `in_place`, down is sharded in
/// place without the sum over ranks, which the enclosing MoE block does (`shard_inplace`).
/// `path` is the MLP's module path, for messages.
pub fn shard_mlp(m: &mut Mlp, n: i32, r: i32, path: &str, in_place: bool) -> Result<()> {
    let names = MlpNames::LLAMA;
    for (name, lin) in m.linears_mut(&names) {
        let what = format!("{path}.{name}");
        match (name == names.down, in_place) {
            (true, true) => sharded_to_all_inplace(lin, n, r, &what)?,
            (true, false) => sharded_to_all(lin, n, r, &what)?,
            (false, _) => all_to_sharded(lin, n, r, &what)?,
        }
    }
    Ok(())
}

/// mlx's `shard_inplace` on a `SwitchLinear` (`(experts, out, in)`): all-to-sharded splits
/// the output rows (axis 1) and the `(experts, out)` bias along its last axis;
/// sharded-to-all splits the input columns (axis -1) and keeps the bias whole.
pub fn switch_inplace(
    l: &mut SwitchLinear,
    all_to_sharded: bool,
    n: i32,
    r: i32,
    what: &str,
) -> Result<()> {
    let axis = if all_to_sharded { 1 } else { -1 };
    switch_parts(l, n, r, axis, all_to_sharded.then_some(-1), what)
}

/// mlx's `shard_inplace(module, lambda path, weight: 0)` on a `SwitchLinear`: rank `r` keeps
/// its part of the experts (axis 0 of every array, the bias's too). deepseek_v41's grouped
/// output projection keeps whole groups per rank this way.
pub fn switch_experts_inplace(l: &mut SwitchLinear, n: i32, r: i32, what: &str) -> Result<()> {
    switch_parts(l, n, r, 0, Some(0), what)
}

/// Rank `r`'s part of every array of `l` along `axis`; the bias along `bias_axis`, or whole.
fn switch_parts(
    l: &mut SwitchLinear,
    n: i32,
    r: i32,
    axis: i32,
    bias_axis: Option<i32>,
    what: &str,
) -> Result<()> {
    let split = |a: &Array| part(a, n, r, axis, what);
    let split_bias = |b: &Option<Array>| -> Result<Option<Array>> {
        match (b, bias_axis) {
            (Some(b), Some(ax)) => Ok(Some(part(b, n, r, ax, what)?)),
            (other, _) => Ok(other.clone()),
        }
    };
    *l = match &*l {
        SwitchLinear::Dense { weight, bias } => SwitchLinear::Dense {
            weight: split(weight)?,
            bias: split_bias(bias)?,
        },
        SwitchLinear::Quantized { weight: q, bias } => SwitchLinear::Quantized {
            weight: QuantizedWeight {
                weight: split(&q.weight)?,
                scales: split(&q.scales)?,
                biases: q.biases.as_ref().map(split).transpose()?,
                ..q.clone()
            },
            bias: split_bias(bias)?,
        },
        SwitchLinear::Adapted(_) => {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: what.to_string(),
                problem: "cannot split adapted experts (fuse the adapter first)".into(),
            })
        }
    };
    Ok(())
}

/// Rank `r`'s `heads` of `a` (mlx-lm's `shard_heads`: `w[sh:eh]` on
/// the leading head axis).
pub fn take_heads(a: &Array, heads: i32, r: i32, what: &str) -> Result<Array> {
    let total = a.shape().first().copied().unwrap_or(0);
    let (sh, eh) = (r * heads, r * heads + heads);
    if heads <= 0 || eh > total {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: what.to_string(),
            problem: format!("heads {sh}..{eh} out of {total}"),
        });
    }
    Ok(ops::slice_axis(a, 0, sh, eh, None)?)
}

/// Rank `r`'s `1/n` of a norm weight along its last axis (mlx-lm's
/// `ShardedRMSNorm.from_rms_norm`: `contiguous(split(w, n, -1)[r])`).
pub fn split_last(w: &Array, n: i32, r: i32, what: &str) -> Result<Array> {
    part(w, n, r, -1, what)
}

/// mlx-lm's `sharded_rms_norm` (minimax.py): an RMS norm over a feature axis split across
/// the group. `x` is this rank's `D / N` features, `w` its part of the weight; the squared
/// sums (float32) are summed over the group, then `x * rsqrt(sum / D + eps) * w`, cast back.
pub fn sharded_rms_norm(x: &Array, w: &Array, eps: f32, n: i32) -> Result<Array> {
    let xf = x.astype(Dtype::Float32)?;
    let norm2 = ops::square(&xf, None)?.sum(&[-1], true)?;
    let norm2 = distributed::all_sum(&norm2, None, None)?;
    let d = x.shape().last().copied().unwrap_or(0) * n;
    let norm = ops::rsqrt(
        &(&(&norm2 / &Array::from_f32(d as f32, Dtype::Float32)?)?
            + &Array::from_f32(eps, Dtype::Float32)?)?,
        None,
    )?;
    Ok((&(&xf * &norm)? * w)?.astype(x.dtype())?)
}

/// `l.bias /= n` on a `SwitchLinear` (gpt_oss's sharded-to-all experts, whose biases the
/// block's `all_sum` would otherwise add `n` times); `n` as a weak scalar.
pub fn divide_switch_bias(l: &mut SwitchLinear, n: i32) -> Result<()> {
    let bias = match l {
        SwitchLinear::Dense { bias, .. } | SwitchLinear::Quantized { bias, .. } => bias,
        SwitchLinear::Adapted(_) => return Ok(()),
    };
    if let Some(b) = bias.as_mut() {
        *b = (&*b / &Array::from_f32(n as f32, b.dtype())?)?;
    }
    Ok(())
}

/// mlx-lm's `PipelineMixin.pipeline` split of `layers` over `size` ranks: an even split with
/// the low ranks taking the extra layers, rank `size - 1` running the first layers and rank
/// 0 the last. Returns this rank's `start..end`.
pub fn pipeline_range(layers: usize, size: i32, rank: i32) -> Result<std::ops::Range<usize>> {
    check_rank(size, rank)?;
    let s = size as usize;
    let (base, extra) = (layers / s, layers % s);
    let split: Vec<usize> = (0..s).map(|k| base + usize::from(k < extra)).collect();
    if split.contains(&0) {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Pipeline,
            what: format!("{layers} layers"),
            problem: format!("cannot give each of {s} ranks a layer"),
        });
    }
    pipeline_range_split(&split, layers, size, rank)
}

/// Tensor parallelism's first check: `rank` is a rank of a group of `size`.
pub(crate) fn check_tensor_rank(size: i32, rank: i32) -> Result<()> {
    if size < 1 || rank < 0 || rank >= size {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Tensor,
            what: format!("rank {rank}"),
            problem: format!("not a rank of a group of {size}"),
        });
    }
    Ok(())
}

fn check_rank(size: i32, rank: i32) -> Result<()> {
    if size < 1 || rank < 0 || rank >= size {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Pipeline,
            what: format!("rank {rank}"),
            problem: format!("not a rank of a group of {size}"),
        });
    }
    Ok(())
}

/// `PipelineMixin.pipeline(group, split)` with an explicit `split` (layers per rank, rank 0
/// first), checked as mlx-lm checks it: one entry per rank, each positive, summing to
/// `layers`. Rank r runs the layers after those of ranks r+1 ... size-1.
pub fn pipeline_range_split(
    split: &[usize],
    layers: usize,
    size: i32,
    rank: i32,
) -> Result<std::ops::Range<usize>> {
    check_rank(size, rank)?;
    let bad = |problem: String| ModelError::Parallel {
        kind: crate::Parallelism::Pipeline,
        what: format!("split {split:?}"),
        problem,
    };
    if split.len() != size as usize {
        return Err(bad(format!(
            "has {} entries for group size {size}",
            split.len()
        )));
    }
    if split.contains(&0) || split.iter().sum::<usize>() != layers {
        return Err(bad(format!("must be positive and sum to {layers} layers")));
    }
    let r = rank as usize;
    let start: usize = split[r + 1..].iter().sum();
    Ok(start..start + split[r])
}

/// `shard_pipeline`'s first checks: the model type is one whose mlx-lm class has `pipeline`
/// (`supported`, named in the error), and the model is not split already.
pub(crate) fn check_pipeline(model_type: &str, supported: &[&str], split: bool) -> Result<()> {
    if !supported.contains(&model_type) {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Pipeline,
            what: format!("model_type `{model_type}`"),
            problem: format!("not supported ({})", supported.join(", ")),
        });
    }
    if split {
        return Err(ModelError::Parallel {
            kind: crate::Parallelism::Pipeline,
            what: "the model".into(),
            problem: "already split".into(),
        });
    }
    Ok(())
}

/// Keeps only this stage's layers ([`pipeline_range`] of `size` ranks, for `rank`).
pub(crate) fn keep_stage<T>(layers: &mut Vec<T>, size: i32, rank: i32) -> Result<()> {
    let range = pipeline_range(layers.len(), size, rank)?;
    keep_range(layers, range);
    Ok(())
}

/// Keeps only `range` of `layers` (a stage from [`pipeline_range_split`]).
pub(crate) fn keep_range<T>(layers: &mut Vec<T>, range: std::ops::Range<usize>) {
    layers.truncate(range.end);
    layers.drain(..range.start);
}

/// A pipeline stage's input: ranks below the last receive the hidden states from the rank
/// above (mlx-lm's `recv_like(h, rank + 1)`); the last rank keeps the embedding.
pub fn pipeline_recv(h: Array, stage: Option<(i32, i32)>) -> Result<Array> {
    match stage {
        Some((rank, size)) if rank < size - 1 => {
            Ok(distributed::recv_like(&h, rank + 1, None, None)?)
        }
        _ => Ok(h),
    }
}

/// A pipeline stage's output: ranks above 0 send theirs to the rank below (tying the send
/// to the last cache, mlx-lm's `cache[-1].keys = mx.depends(cache[-1].keys, h)`), then every
/// rank takes rank 0's hidden states from an `all_gather` (mlx-lm's broadcast that keeps the
/// send in the graph).
pub fn pipeline_send(
    h: Array,
    stage: Option<(i32, i32)>,
    last: Option<&mut Box<dyn mlx_cache::Cache>>,
) -> Result<Array> {
    let Some((rank, size)) = stage else {
        return Ok(h);
    };
    let mut h = h;
    if rank != 0 {
        h = distributed::send(&h, (rank - 1).rem_euclid(size), None, None)?;
        tie_to_send(last, &h)?;
    }
    gather_stage_output(h, size)
}

/// mlx-lm's `cache[-1].keys = mx.depends(cache[-1].keys, sent)` (or `cache[-1][0]` of an
/// `ArraysCache`): the stage's last cache made to depend on what it sent, so that evaluating
/// the cache runs the send.
pub fn tie_to_send(last: Option<&mut Box<dyn mlx_cache::Cache>>, sent: &Array) -> Result<()> {
    if let Some(c) = last {
        if !c.is_empty() && !c.depend_on(sent)? {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Pipeline,
                what: format!("a {}", c.class_name()),
                problem: "cannot be tied to the stage's send".into(),
            });
        }
    }
    Ok(())
}

/// Every rank's copy of rank 0's stage output: `all_gather(h)[:batch]` over `size` ranks
/// (mlx-lm's broadcast that keeps the send in the graph); `h` itself with one rank.
pub fn gather_stage_output(h: Array, size: i32) -> Result<Array> {
    if size <= 1 {
        return Ok(h);
    }
    let b = h.shape().first().copied().unwrap_or(0);
    let all = distributed::all_gather(&h, None, None)?;
    let mut stop = all.shape();
    stop[0] = b;
    let start = vec![0; stop.len()];
    let strides = vec![1; stop.len()];
    Ok(all.slice(&start, &stop, &strides)?)
}
