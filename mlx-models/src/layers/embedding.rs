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
    /// GGML blocks kept from a GGUF file for the CPU decoder (`GgufTensors::Blocks`).
    Ggml(Box<crate::layers::GgmlWeight>),
    /// An adapter standing in for the table (LoRA and DoRA in `mlx-train`, as mlx-lm's
    /// `LoRAEmbedding` and `DoRAEmbedding` replace an `nn.Embedding`).
    Adapted(Box<dyn EmbeddingAdapter>),
}

/// A layer that replaces an [`Embedding`] and computes its lookups and its use as an output
/// projection itself, usually from the table it wraps.
pub trait EmbeddingAdapter: Send + std::fmt::Debug {
    /// The rows of `ids`.
    fn forward(&self, ids: &Array) -> Result<Array>;
    /// The table as an output projection (a tied head).
    fn as_linear(&self, x: &Array) -> Result<Array>;
    fn clone_box(&self) -> Box<dyn EmbeddingAdapter>;
    /// The wrapped table.
    fn base(&self) -> &Embedding;
    /// For downcasting to the concrete adapter.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl Clone for Box<dyn EmbeddingAdapter> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl Embedding {
    pub fn load(w: &mut Weights, path: &str, num: i32, dims: i32) -> Result<Embedding> {
        let q = w.quantization(path, dims)?;
        if let Some(g) = w.take_ggml(&format!("{path}.weight"), num, dims)? {
            return Ok(Embedding::Ggml(Box::new(g)));
        }
        match q {
            Some(q) => Ok(Embedding::Quantized(QuantizedWeight::load_embedding(
                w, path, num, dims, &q,
            )?)),
            None => Ok(Embedding::Dense(
                w.take(&format!("{path}.weight"), &[num, dims])?,
            )),
        }
    }

    /// `(num_embeddings, dims)` (a quantized table's unpacked width).
    pub fn shape(&self) -> (i32, i32) {
        match self {
            Embedding::Dense(w) => {
                let s = w.shape();
                (s[0], s[1])
            }
            Embedding::Quantized(q) => {
                let s = q.weight.shape();
                (s[0], s[1] * 32 / q.bits)
            }
            Embedding::Ggml(g) => (g.rows, g.cols),
            Embedding::Adapted(a) => a.base().shape(),
        }
    }

    /// `weight[ids]` (dequantized rows for a quantized table).
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Adapted(a) => a.forward(ids),
            Embedding::Dense(w) => Ok(ops::take(w, ids, 0, None)?),
            Embedding::Ggml(g) => g.rows_of(ids),
            Embedding::Quantized(q) => {
                let rows = |a: &Array| ops::take(a, ids, 0, None);
                // Scales kept in their stored dtype are widened row by row (exactly) to the
                // dtype they would have been cast to at load.
                let factors = |a: &Array| -> Result<Array> {
                    let r = rows(a)?;
                    match q.lookup_dtype {
                        Some(d) if r.dtype() != d => Ok(r.astype(d)?),
                        _ => Ok(r),
                    }
                };
                let biases = q.biases.as_ref().map(factors).transpose()?;
                Ok(quantized::dequantize(
                    &rows(&q.weight)?,
                    &factors(&q.scales)?,
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
            Embedding::Ggml(g) => g.matmul_t(x),
            Embedding::Adapted(a) => a.as_linear(x),
        }
    }
}
