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
//!
//! [`FlashKernel::PaddedSdpa`] (`--flash-kernel sdpa`) keeps MLX's own SDPA but pads the
//! queries to a multiple of 128 on CUDA, where MLX's fused SDPA backward needs it: mlx-lm's
//! batches give the model `1 + 32k`-wide rows less one token (8191 queries for an 8192-token
//! row), for which MLX materialises the attention.

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
    /// MLX's own SDPA with the queries (and, causal, the keys and values) zero-padded at the
    /// end to a multiple of [`SDPA_QUERY_MULTIPLE`] where MLX runs CUDA kernels (see
    /// [`padded_sdpa`]); MLX's SDPA as it is elsewhere. `--flash-block` is not used.
    PaddedSdpa,
}

/// The query lengths MLX 0.32's CUDA back-end runs its fused (cuDNN) SDPA backward for
/// (`ScaledDotProductAttentionVJP::use_fallback`: `L % 128 == 0`); other lengths fall back to
/// the materialised attention, `[heads, L, S]` scores, probabilities and their gradients.
pub const SDPA_QUERY_MULTIPLE: i32 = 128;

/// MLX's SDPA over `q` zero-padded at the end to a multiple of `multiple` queries, the padded
/// rows dropped from the result; with `causal`, the keys and values are padded as much, which
/// keeps MLX's lower-right causal alignment, and no real query sees a padded key. Without a
/// mask only the queries are padded. The real rows and every gradient are those of the
/// unpadded attention up to the kernels' own rounding: the padded rows' cotangents are zero,
/// so they add nothing to the keys' and values' gradients. Dims `[B, H, L, D]`.
pub fn padded_sdpa(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    causal: bool,
    multiple: i32,
) -> mlx_core::Result<Array> {
    use mlx_core::fast::{scaled_dot_product_attention as sdpa, SdpaMask};
    let shape = q.shape();
    if multiple <= 0 || shape.len() != 4 {
        return Err(mlx_core::Error::InvalidArgument {
            op: "padded_sdpa",
            message: format!(
                "needs [B, H, L, D] queries and a positive multiple, got {shape:?} and {multiple}"
            ),
        });
    }
    let l = shape[2];
    let pad = (multiple - l % multiple) % multiple;
    let mask = if causal {
        SdpaMask::Causal
    } else {
        SdpaMask::None
    };
    if pad == 0 {
        return sdpa(q, k, v, scale, mask, None, None);
    }
    let zero = mlx_core::ops::zeros(&[], q.dtype(), None)?;
    let padded = |a: &Array| mlx_core::ops::pad(a, &[2], &[0], &[pad], &zero, "constant", None);
    let qp = padded(q)?;
    let out = if causal {
        sdpa(&qp, &padded(k)?, &padded(v)?, scale, mask, None, None)?
    } else {
        sdpa(&qp, k, v, scale, mask, None, None)?
    };
    let mut stop = out.shape();
    stop[2] = l;
    let start = vec![0; stop.len()];
    let strides = vec![1; stop.len()];
    mlx_core::ops::slice(&out, &start, &stop, &strides, None)
}

impl FlashKernel {
    /// Reads a `--flash-kernel` value (`None`: the default, plain).
    pub fn parse(name: Option<&str>) -> Result<FlashKernel> {
        match name {
            None | Some("plain") => Ok(FlashKernel::Plain),
            Some("cuda") => Ok(FlashKernel::Cuda),
            Some("sdpa") => Ok(FlashKernel::PaddedSdpa),
            Some(other) => Err(TrainError::Config(format!(
                "flash_kernel must be `plain`, `cuda` or `sdpa`, got `{other}`"
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
/// module docs), through `kernel`; with `None`, runs `body` as it is, except that
/// [`FlashKernel::PaddedSdpa`] applies either way.
pub fn with_flash_attention<R>(
    block: Option<i32>,
    kernel: FlashKernel,
    body: impl FnOnce() -> R,
) -> R {
    if block.is_none() && kernel != FlashKernel::PaddedSdpa {
        return body();
    }
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
            if kernel == FlashKernel::PaddedSdpa {
                if Path::auto() != Path::Fused {
                    return Ok(None);
                }
                let out = padded_sdpa(q, k, v, scale, causal, SDPA_QUERY_MULTIPLE)?;
                return Ok(Some(out));
            }
            let Some(block) = block else {
                return Ok(None);
            };
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
