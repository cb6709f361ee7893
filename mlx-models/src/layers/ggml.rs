//! A weight kept as the GGML blocks a GGUF file stores (`GgufTensors::Blocks`): the bytes as
//! one uint8 array `(rows, row_bytes)`, read in place by the CPU decoder's int8 kernels
//! (`mlx_core::cpu::kquant`). The MLX forward dequantizes on use with `gguf_dequant`, bit for
//! bit as the dequantizing loader does (so `Linear::forward` gives the dense layer's bits, only
//! slower): a fallback, not the path this layout is for.

use mlx_core::cpu::kquant::GgmlType;
use mlx_core::cpu::Matrix;
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};

/// A GGML-block weight of logical shape `(rows, cols)`.
#[derive(Clone, Debug)]
pub struct GgmlWeight {
    /// uint8 `(rows, ty.row_bytes(cols))`.
    pub data: Array,
    pub ty: GgmlType,
    pub rows: i32,
    pub cols: i32,
}

impl GgmlWeight {
    /// Checks `data`'s dtype and shape against the type and logical shape.
    pub fn new(data: Array, ty: GgmlType, rows: i32, cols: i32) -> Result<GgmlWeight> {
        let bad = |m: String| ModelError::Weights(vec![m]);
        if rows <= 0 || cols <= 0 || cols as usize % ty.block() != 0 {
            return Err(bad(format!(
                "{} weight of ({rows}, {cols}): columns not whole {}-value blocks",
                ty.name(),
                ty.block()
            )));
        }
        let want = [rows, ty.row_bytes(cols as usize) as i32];
        if data.dtype() != Dtype::Uint8 || data.shape() != want {
            return Err(bad(format!(
                "{} weight of ({rows}, {cols}): bytes {:?} {}, expected {want:?} uint8",
                ty.name(),
                data.shape(),
                data.dtype()
            )));
        }
        Ok(GgmlWeight {
            data,
            ty,
            rows,
            cols,
        })
    }

    fn values(&self, bytes: &[u8], rows: usize) -> Result<Vec<f32>> {
        crate::gguf_dequant::dequantize(self.ty.id(), bytes, rows * self.cols as usize)
            .map_err(|e| ModelError::Weights(vec![format!("GGML weight: {e}")]))
    }

    /// The whole matrix dequantized to float32, as the dequantizing loader gives it.
    pub fn dequantize(&self) -> Result<Array> {
        let v = self.values(self.data.as_slice::<u8>()?, self.rows as usize)?;
        Ok(Array::from_slice(&v, &[self.rows, self.cols])?)
    }

    /// `x @ W.T`, as a dense linear over [`GgmlWeight::dequantize`].
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(ops::matmul(
            x,
            &ops::transpose_all(&self.dequantize()?, None)?,
            None,
        )?)
    }

    /// Rows `ids` dequantized (an embedding lookup): shape `ids.shape + [cols]`.
    pub fn rows_of(&self, ids: &Array) -> Result<Array> {
        let picked = ops::take(&self.data, ids, 0, None)?;
        let n = ids.size();
        let v = self.values(picked.as_slice::<u8>()?, n)?;
        let mut shape = ids.shape();
        shape.push(self.cols);
        Ok(Array::from_slice(&v, &shape)?)
    }

    /// The CPU kernels' view of the bytes, in place.
    pub fn cpu_view(&self) -> Result<Matrix<'_>> {
        Ok(Matrix::ggml(
            self.data.as_slice::<u8>()?,
            self.ty,
            self.rows as usize,
            self.cols as usize,
        )?)
    }
}
