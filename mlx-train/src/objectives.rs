//! Training objectives over the same step: SFT (mlx-lm's `default_loss`, in [`crate::loss`]),
//! DPO (sigmoid loss against the base model, i.e. the adapters switched off) and ORPO
//! (chosen NLL plus the odds-ratio term). mlx-lm has neither DPO nor ORPO: the reference is
//! the MLX implementation in `xtask/oracle/goldens_train.py`, ported op for op.
//!
//! A preference batch holds `2n` rows: `n` chosen sequences then their `n` rejected ones
//! (see [`crate::data::pad_batch`]).

use mlx_core::prelude::*;
use mlx_models::LanguageModel;

use crate::error::{Result, TrainError};
use crate::loss::{cross_entropy, length_mask, shift};
use crate::params::Params;

/// Per sequence: the summed log-probability of its unmasked target tokens, and their count.
pub fn seq_logps(
    model: &dyn LanguageModel,
    batch: &Array,
    lengths: &Array,
) -> Result<(Array, Array)> {
    let (inputs, targets) = shift(batch)?;
    let logits = model.forward(&inputs, None)?;
    let mask = length_mask(lengths, targets.dim(1)?)?;
    let ce = (&cross_entropy(&logits, &targets)? * &mask)?;
    let logps = ce.astype(Dtype::Float32)?.sum(&[1], false)?.negative()?;
    Ok((logps, mask.sum(&[1], false)?))
}

fn halves(a: &Array) -> Result<(Array, Array)> {
    let rows = a.dim(0)?;
    if rows % 2 != 0 || rows == 0 {
        return Err(TrainError::Config(format!(
            "a preference batch needs chosen and rejected rows, got {rows} rows"
        )));
    }
    let n = rows / 2;
    Ok((a.slice_axis(0, 0, n)?, a.slice_axis(0, n, rows)?))
}

/// The reference log-probabilities for DPO: the same model with its adapters off.
pub fn reference_logps(
    model: &dyn LanguageModel,
    params: &Params,
    batch: &Array,
    lengths: &Array,
) -> Result<Array> {
    let was = params.enabled();
    params.set_enabled(false);
    let r = seq_logps(model, batch, lengths);
    params.set_enabled(was);
    Ok(r?.0.stop_gradient()?)
}

/// DPO: `mean(-log_sigmoid(beta * ((pc - pr) - (rc - rr))))`, with the token count.
pub fn dpo_loss(
    model: &dyn LanguageModel,
    batch: &Array,
    lengths: &Array,
    ref_logps: &Array,
    beta: f64,
) -> Result<(Array, Array)> {
    let (logps, ntoks) = seq_logps(model, batch, lengths)?;
    let (pc, pr) = halves(&logps)?;
    let (rc, rr) = halves(ref_logps)?;
    let logits = (&(&pc - &pr)? - &(&rc - &rr)?)?;
    let x = ops::scalar_multiply(-beta, &logits, None)?;
    let loss = ops::scalar_logaddexp(0.0, &x, None)?.mean_all(false)?;
    Ok((loss, ntoks.sum_all(false)?))
}

/// ORPO: the chosen tokens' NLL minus `beta` times the mean log-sigmoid of the log odds
/// ratio of the mean token log-probabilities, with the token count.
pub fn orpo_loss(
    model: &dyn LanguageModel,
    batch: &Array,
    lengths: &Array,
    beta: f64,
) -> Result<(Array, Array)> {
    let (logps, ntoks) = seq_logps(model, batch, lengths)?;
    let (pc, pr) = halves(&logps)?;
    let (nc, nr) = halves(&ntoks)?;
    let nll = (&pc.sum_all(false)?.negative()? / &nc.sum_all(false)?)?;
    let (ac, ar) = ((&pc / &nc)?, (&pr / &nr)?);
    let l1m = |a: &Array| -> Result<Array> { Ok(a.exp()?.negative()?.log1p()?) };
    let log_odds = (&(&ac - &ar)? - &(&l1m(&ac)? - &l1m(&ar)?)?)?;
    let ratio = ops::scalar_logaddexp(0.0, &log_odds.negative()?, None)?.negative()?;
    let loss = (&nll - &ops::scalar_multiply(beta, &ratio.mean_all(false)?, None)?)?;
    Ok((loss, ntoks.sum_all(false)?))
}
