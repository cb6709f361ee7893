//! Flash attention in training (`--flash-block N`): while [`with_flash_attention`] runs its
//! body, every attention over dense keys and values with a causal or no mask goes through
//! `mlx_kernels::flash_attention` (tiles of `N` queries and `N` keys, its own backward pass
//! from the stored log-sum-exp) instead of MLX's SDPA, whose backward on CPU and CUDA keeps
//! the `[heads, L, S]` probabilities. That covers the plain step, gradient checkpointing and
//! the segmented backward (a segment's queries come after the earlier segments' keys: MLX's
//! causal rule, which flash attention follows). Attention with an array mask (sliding-window
//! layers, padding masks), sinks, or differing query/key dtypes stays on MLX's SDPA.
//!
//! Gradients are within `mlx_kernels::flash_attention::GRAD_REL_BOUND` of the materialised
//! attention's, not bit-equal (another summation order; `tests/segmented.rs` on the tiny models).
//!
//! [`FlashKernel::Cuda`] (`--flash-kernel cuda`) runs the CUDA kernels of
//! `mlx_kernels::flash_cuda` instead of the plain-ops flash path where MLX runs CUDA kernels
//! (`Path::auto()` is `Fused`) and the head dims suit them (`flash_cuda::check`); elsewhere it
//! is the plain path. Their own tiles apply; `N` only picks the plain path's.

use std::rc::Rc;

use mlx_cache::AttentionMask;
use mlx_core::Array;
use mlx_kernels::{flash_attention_with, flash_cuda, FlashSpec, Path};
use mlx_models::layers::{with_dense_attention, DenseAttention};

use crate::error::{Result, TrainError};

/// Checks a `--flash-block` value.
pub fn check_block(block: i32) -> Result<()> {
    if block <= 0 {
        return Err(TrainError::Config(format!(
            "flash_block must be positive, got {block}"
        )));
    }
    Ok(())
}

/// Which flash attention `--flash-block` runs (`--flash-kernel`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashKernel {
    /// The plain-ops flash path on every back-end.
    #[default]
    Plain,
    /// The CUDA kernels where they run, the plain path elsewhere.
    Cuda,
}

impl FlashKernel {
    /// Reads a `--flash-kernel` value (`None`: the default, plain).
    pub fn parse(name: Option<&str>) -> Result<FlashKernel> {
        match name {
            None | Some("plain") => Ok(FlashKernel::Plain),
            Some("cuda") => Ok(FlashKernel::Cuda),
            Some(other) => Err(TrainError::Config(format!(
                "flash_kernel must be `plain` or `cuda`, got `{other}`"
            ))),
        }
    }

    fn path(self, q: &Array, k: &Array, v: &Array) -> Path {
        match (self, Path::auto()) {
            (FlashKernel::Cuda, Path::Fused) if flash_cuda::check(q, k, v).is_ok() => Path::Fused,
            _ => Path::Reference,
        }
    }
}

/// Runs `body` with flash attention of `block`-token tiles standing in for MLX's SDPA (see the
/// module docs), through `kernel`; with `None`, runs `body` as it is.
pub fn with_flash_attention<R>(
    block: Option<i32>,
    kernel: FlashKernel,
    body: impl FnOnce() -> R,
) -> R {
    let Some(block) = block else {
        return body();
    };
    let attention: Rc<DenseAttention> = Rc::new(
        move |q: &Array,
              k: &Array,
              v: &Array,
              scale: f32,
              mask: &AttentionMask|
              -> mlx_models::Result<Option<Array>> {
            let causal = match mask {
                AttentionMask::None => false,
                AttentionMask::Causal => true,
                AttentionMask::Array(_) => return Ok(None),
            };
            if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
                return Ok(None);
            }
            let spec = FlashSpec {
                scale,
                causal,
                window: None,
                block_q: block,
                block_k: block,
            };
            let path = kernel.path(q, k, v);
            Ok(Some(flash_attention_with(q, k, v, spec, path)?))
        },
    );
    with_dense_attention(attention, body)
}
