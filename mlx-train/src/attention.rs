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

use std::rc::Rc;

use mlx_cache::AttentionMask;
use mlx_core::Array;
use mlx_kernels::{flash_attention, FlashSpec};
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

/// Runs `body` with flash attention of `block`-token tiles standing in for MLX's SDPA (see the
/// module docs); with `None`, runs `body` as it is.
pub fn with_flash_attention<R>(block: Option<i32>, body: impl FnOnce() -> R) -> R {
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
            Ok(Some(flash_attention(q, k, v, spec)?))
        },
    );
    with_dense_attention(attention, body)
}
