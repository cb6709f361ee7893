//! Losses: `nn.losses.cross_entropy` (the CPU path, class-index targets) and mlx-lm's
//! `default_loss` with its prompt/padding mask.

use mlx_core::prelude::*;
use mlx_models::LanguageModel;

use crate::error::Result;

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
