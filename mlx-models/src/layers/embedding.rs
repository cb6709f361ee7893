//! `nn.Embedding` and `nn.QuantizedEmbedding`, with `as_linear` for tied output heads.

use mlx_core::prelude::*;
use mlx_core::quantized;

use crate::error::Result;
use crate::layers::linear::QuantizedWeight;
use crate::weights::Weights;

#[derive(Clone, Debug)]
pub enum Embedding {
    Dense(Array),
    Quantized(QuantizedWeight),
}

impl Embedding {
    pub fn load(w: &mut Weights, path: &str, num: i32, dims: i32) -> Result<Embedding> {
        match w.quantization(path, dims)? {
            Some(q) => Ok(Embedding::Quantized(QuantizedWeight::load(
                w, path, num, dims, &q,
            )?)),
            None => Ok(Embedding::Dense(
                w.take(&format!("{path}.weight"), &[num, dims])?,
            )),
        }
    }

    /// `weight[ids]` (dequantized rows for a quantized table).
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(w) => Ok(ops::take(w, ids, 0, None)?),
            Embedding::Quantized(q) => {
                let rows = |a: &Array| ops::take(a, ids, 0, None);
                let biases = q.biases.as_ref().map(rows).transpose()?;
                Ok(quantized::dequantize(
                    &rows(&q.weight)?,
                    &rows(&q.scales)?,
                    biases.as_ref(),
                    q.group_size,
                    q.bits,
                    q.mode,
                    None,
                    None,
                )?)
            }
        }
    }

    /// The table used as an output projection: `x @ weight.T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(w) => Ok(ops::matmul(x, &ops::transpose_all(w, None)?, None)?),
            Embedding::Quantized(q) => q.matmul_t(x),
        }
    }
}
