//! A decode step cut into shape-stable segments around each layer's cache write and
//! attention, for a caller that compiles the segments (`mlx-engine`'s `compiled` module).
//!
//! For a model of `L` layers there are `L + 1` segments:
//! - segment 0: `[ids (B, T) int32, offset () int32]` to `[x_0, q_0, k_0, v_0]`: the
//!   embedding, then layer 0 up to its cache write (norm, projections, QK norms, rope at the
//!   array `offset`);
//! - segment `i` in `1..L`: `[x_{i-1}, a_{i-1}, offset]` to `[x_i, q_i, k_i, v_i]`: layer
//!   `i - 1` after its attention (output projection, residuals, MLP) on the attention result
//!   `a_{i-1}` `(B, heads, T, head_dim)`, then layer `i` up to its cache write;
//! - segment `L`: `[x_{L-1}, a_{L-1}, offset]` to `[logits]` (`offset` unused).
//!
//! Between segments the caller writes `k_i`, `v_i` into layer `i`'s cache and runs
//! [`SegmentedDecode::attend`] over what the cache returns: the parts whose shapes grow with
//! the cache stay outside, so one trace of each segment serves every decode step, and the
//! arithmetic is the same code, in the same order, as the model's own forward.

use mlx_cache::{AttentionMask, Cache, Kv};
use mlx_core::prelude::*;

use crate::error::Result;

/// See the module docs.
pub trait SegmentedDecode {
    fn num_layers(&self) -> usize;

    /// Runs segment `i` (`0..=num_layers()`) on `inputs`.
    fn segment(&self, i: usize, inputs: &[Array]) -> Result<Vec<Array>>;

    /// Each layer's attention mask for `n` new tokens over `caches` as they are before the
    /// step (as the model's forward makes them).
    fn masks(&self, caches: &[Box<dyn Cache>], n: usize) -> Result<Vec<AttentionMask>>;

    /// Layer `layer`'s attention of `queries` over the keys and values its cache returned.
    fn attend(&self, layer: usize, queries: &Array, kv: &Kv, mask: &AttentionMask)
        -> Result<Array>;
}
