//! Sentence embeddings the way sentence-transformers computes them for Qwen3-Embedding-style
//! models: the final normed hidden state of the last token of each text (last-token pooling),
//! L2-normalised (`torch.nn.functional.normalize`: `x / max(||x||, 1e-12)`), in float32.
//!
//! Each text runs alone (no padding), which is what left padding with an attention mask
//! computes. The hidden states come from the model's inner stack (mlx-lm's `model.model`).

use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::models::{gemma4_text, lfm2, moe, qwen3_next};

/// A model that can return its final normed hidden states `(batch, seq, hidden)`.
pub trait HiddenStates {
    fn final_hidden_states(&self, inputs: &Array) -> Result<Array>;
}

macro_rules! hidden_states_via_inner_model {
    ($($t:ty),*) => {$(
        impl HiddenStates for $t {
            fn final_hidden_states(&self, inputs: &Array) -> Result<Array> {
                self.hidden_states(inputs, None)
            }
        }
    )*};
}

hidden_states_via_inner_model!(
    moe::Model,
    qwen3_next::Model,
    lfm2::Model,
    gemma4_text::Model
);

/// Embeds each token sequence of `batch`: an `(n, hidden)` float32 array of unit rows.
pub fn embed(model: &dyn HiddenStates, batch: &[Vec<i32>]) -> Result<Array> {
    if batch.is_empty() {
        return Err(ModelError::Other("embed: no texts given".into()));
    }
    let mut rows = Vec::with_capacity(batch.len());
    for (i, ids) in batch.iter().enumerate() {
        if ids.is_empty() {
            return Err(ModelError::Other(format!("embed: text {i} has no tokens")));
        }
        let n = i32::try_from(ids.len())
            .map_err(|_| ModelError::Other(format!("embed: text {i} is too long")))?;
        let h = model.final_hidden_states(&Array::from_slice(ids, &[1, n])?)?;
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
