//! Losses: `nn.losses.cross_entropy` (the CPU path, class-index targets) and mlx-lm's
//! `default_loss` with its prompt/padding mask.

use mlx_core::prelude::*;
use mlx_models::models::OutputHead;
use mlx_models::LanguageModel;

use crate::error::{Result, TrainError};

/// `nn.losses.cross_entropy(logits, targets)` with integer targets over the last axis,
/// `reduction="none"`, as it runs off the GPU.
pub fn cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    let logits = (logits - &logits.max(&[-1], true)?.stop_gradient()?)?;
    let score =
        ops::take_along_axis(&logits, &targets.expand_dims(&[-1])?, -1, None)?.squeeze(&[-1])?;
    let lse = logits.logsumexp(&[-1], false)?;
    Ok((&lse - &score)?)
}

/// The loss mask of `default_loss`: target position `t` (1-based) counts when
/// `offset <= t <= length`, from `lengths[:, 0]` (offsets) and `lengths[:, 1]`.
pub fn length_mask(lengths: &Array, n_targets: i32) -> Result<Array> {
    let steps = ops::arange(1.0, f64::from(n_targets) + 1.0, 1.0, Dtype::Int32, None)?;
    let b = lengths.dim(0)?;
    let offsets = lengths.slice(&[0, 0], &[b, 1], &[1, 1])?;
    let ends = lengths.slice(&[0, 1], &[b, 2], &[1, 1])?;
    Ok(steps
        .greater_equal(&offsets)?
        .logical_and(&steps.less_equal(&ends)?)?)
}

/// `inputs = batch[:, :-1]`, `targets = batch[:, 1:]`.
pub fn shift(batch: &Array) -> Result<(Array, Array)> {
    let (b, t) = (batch.dim(0)?, batch.dim(1)?);
    Ok((
        batch.slice(&[0, 0], &[b, t - 1], &[1, 1])?,
        batch.slice(&[0, 1], &[b, t], &[1, 1])?,
    ))
}

/// mlx-lm's `default_loss(model, batch, lengths)`: the mean cross-entropy over the masked
/// target tokens, and their count.
pub fn default_loss(
    model: &dyn LanguageModel,
    batch: &Array,
    lengths: &Array,
) -> Result<(Array, Array)> {
    let (inputs, targets) = shift(batch)?;
    let logits = model.forward(&inputs, None)?;
    let mask = length_mask(lengths, targets.dim(1)?)?;
    let ce = (&cross_entropy(&logits, &targets)? * &mask)?;
    let ntoks = mask.sum_all(false)?;
    let ce = (&ce.astype(Dtype::Float32)?.sum_all(false)? / &ntoks)?;
    Ok((ce, ntoks))
}

/// The summed masked cross-entropy (float32) of the hidden states `h` (`[B, T, D]`) through
/// `head`, `chunk` target positions at a time, each chunk under `checkpoint`, so the
/// `[tokens, vocab]` logits never exist at once (not in the forward pass, and in the backward
/// pass one chunk is recomputed at a time).
pub fn chunked_ce_sum(
    head: &OutputHead,
    h: &Array,
    targets: &Array,
    mask: &Array,
    chunk: i32,
) -> Result<Array> {
    if chunk <= 0 {
        return Err(TrainError::Config(format!(
            "the cross-entropy chunk must be positive, got {chunk}"
        )));
    }
    let (b, t) = (targets.dim(0)?, targets.dim(1)?);
    // One split rather than a slice per chunk: the split's gradient is one concatenation of
    // the chunks' gradients, where slices would each scatter into a zero `[B, T, D]` array.
    let bounds: Vec<i32> = (chunk..t).step_by(chunk as usize).collect();
    let pieces = if bounds.is_empty() {
        vec![h.clone()]
    } else {
        ops::split_at(h, &bounds, 1, None)?
    };
    let mut total: Option<Array> = None;
    for (i, hc) in pieces.into_iter().enumerate() {
        let start = i as i32 * chunk;
        let end = (start + chunk).min(t);
        let tc = targets.slice(&[0, start], &[b, end], &[1, 1])?;
        let mc = mask.slice(&[0, start], &[b, end], &[1, 1])?;
        // Only the hidden states are an input (the targets are indices, not differentiable).
        let head = head.clone();
        let piece = transforms::checkpoint(move |x: &[Array]| -> mlx_core::Result<Vec<Array>> {
            let cb = |e: &dyn std::fmt::Display| mlx_core::Error::Callback(e.to_string());
            let logits = head.forward(&x[0]).map_err(|e| cb(&e))?;
            let ce = (&cross_entropy(&logits, &tc).map_err(|e| cb(&e))? * &mc)?;
            Ok(vec![ce.astype(Dtype::Float32)?.sum_all(false)?])
        })?;
        let s = piece
            .call(&[hc])?
            .into_iter()
            .next()
            .ok_or_else(|| TrainError::Config("the chunk loss returned nothing".into()))?;
        total = Some(match total {
            None => s,
            Some(a) => (&a + &s)?,
        });
    }
    match total {
        Some(t) => Ok(t),
        None => Ok(Array::from_f32(0.0, Dtype::Float32)?),
    }
}

/// The error for a model that does not split its forward into hidden states and a head.
pub(crate) fn no_hidden_states(model: &dyn LanguageModel) -> TrainError {
    TrainError::Config(format!(
        "model_type {} does not expose its hidden states for a chunked loss",
        model.model_type()
    ))
}

/// `default_loss` with a chunked cross-entropy ([`chunked_ce_sum`]). The mean is the sum of
/// per-chunk sums over the token count: with one chunk it is `default_loss` bit for bit; with
/// several the float32 summation order differs (relative error around 1e-7 of the loss).
pub fn chunked_loss(
    model: &dyn LanguageModel,
    batch: &Array,
    lengths: &Array,
    chunk: i32,
) -> Result<(Array, Array)> {
    if chunk <= 0 {
        return Err(TrainError::Config(format!(
            "the cross-entropy chunk must be positive, got {chunk}"
        )));
    }
    let (inputs, targets) = shift(batch)?;
    let h = model
        .forward_hidden(&inputs)
        .ok_or_else(|| no_hidden_states(model))??;
    let head = model.output_head().ok_or_else(|| no_hidden_states(model))?;
    let mask = length_mask(lengths, targets.dim(1)?)?;
    let total = chunked_ce_sum(&head, &h, &targets, &mask, chunk)?;
    let ntoks = mask.sum_all(false)?;
    Ok(((&total / &ntoks)?, ntoks))
}
