//! Sentence embeddings the way sentence-transformers computes them for Qwen3-Embedding-style
//! models: the final normed hidden state of the last token of each text (last-token pooling),
//! L2-normalised (`torch.nn.functional.normalize`: `x / max(||x||, 1e-12)`), in float32.
//!
//! Each text runs alone (no padding), which is what left padding with an attention mask
//! computes. The hidden states are the model's inner stack (mlx-lm's `model.model`), from
//! [`LanguageModel::forward_hidden`]: every descriptor-table row and every dedicated port has
//! it; a model without it is an error naming its `model_type`.

use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::models::LanguageModel;

/// Embeds each token sequence of `batch`: an `(n, hidden)` float32 array of unit rows. Token
/// ids are checked against the vocabulary first.
pub fn embed(model: &dyn LanguageModel, batch: &[Vec<u32>]) -> Result<Array> {
    if batch.is_empty() {
        return Err(ModelError::Input {
            what: "embed".into(),
            problem: "no texts given".into(),
        });
    }
    let vocab = model.vocab_size();
    let mut rows = Vec::with_capacity(batch.len());
    for (i, ids) in batch.iter().enumerate() {
        if ids.is_empty() {
            return Err(ModelError::Input {
                what: "embed".into(),
                problem: format!("text {i} has no tokens"),
            });
        }
        let n = i32::try_from(ids.len()).map_err(|_| ModelError::Input {
            what: "embed".into(),
            problem: format!("text {i} is too long"),
        })?;
        let ids = ids
            .iter()
            .map(|&t| {
                i32::try_from(t)
                    .ok()
                    .filter(|&t| t < vocab)
                    .ok_or_else(|| ModelError::Input {
                        what: "embed".into(),
                        problem: format!(
                            "text {i}: token id {t} is outside the vocabulary (size {vocab})"
                        ),
                    })
            })
            .collect::<Result<Vec<i32>>>()?;
        let h = model
            .forward_hidden(&Array::from_slice(&ids, &[1, n])?)
            .ok_or_else(|| ModelError::Input {
                what: "embed".into(),
                problem: format!(
                    "model type `{}` has no hidden-state entry (cannot embed)",
                    model.model_type()
                ),
            })??;
        let last = ops::slice_axis(&h, 1, n - 1, n, None)?;
        let last = ops::squeeze(&last, &[1], None)?.astype(Dtype::Float32)?;
        rows.push(normalize(&last)?);
    }
    let refs: Vec<&Array> = rows.iter().collect();
    Ok(ops::concatenate(&refs, 0, None)?)
}

/// `x / max(sqrt(sum(x * x, -1)), 1e-12)` over the last axis.
fn normalize(x: &Array) -> Result<Array> {
    let norm = ops::sqrt(&ops::sum(&(x * x)?, &[-1], true, None)?, None)?;
    let norm = ops::maximum_scalar(&norm, 1e-12f32, None)?;
    Ok((x / &norm)?)
}

/// The rows of an [`embed`] result as vectors (for printing as JSON).
pub fn to_vecs(embeddings: &Array) -> Result<Vec<Vec<f32>>> {
    let shape = embeddings.shape();
    let d = *shape.last().unwrap_or(&0) as usize;
    let flat = embeddings.astype(Dtype::Float32)?.to_vec::<f32>()?;
    if d == 0 {
        return Ok(Vec::new());
    }
    Ok(flat.chunks(d).map(<[f32]>::to_vec).collect())
}
