//! The few array manipulations the caches need, along the sequence axis (axis 2 of
//! `(batch, heads, seq, dim)`), written once. Python's `x[..., a:b, :]` and
//! `x[..., a:b, :] = y` map to [`slice`] and [`update`].

use mlx_core::prelude::*;

/// Sequence axis of `(batch, heads, seq, dim)` tensors.
pub(crate) const SEQ: i32 = 2;

/// `x[..., start:stop, :]`.
pub(crate) fn slice(x: &Array, start: i32, stop: i32) -> Result<Array> {
    ops::slice_axis(x, SEQ, start, stop, None)
}

/// `x[..., start:stop, :] = y`, returning the updated array.
pub(crate) fn update(x: &Array, y: &Array, start: i32, stop: i32) -> Result<Array> {
    let shape = x.shape();
    if shape.len() <= SEQ as usize {
        // Only reachable from a malformed prompt-cache file.
        return Err(Error::InvalidArgument {
            op: "cache update",
            message: format!(
                "a cached array of shape {shape:?} has no sequence axis (expected (batch, \
                 heads, seq, dim))"
            ),
        });
    }
    let mut lo = vec![0; shape.len()];
    let mut hi = shape.clone();
    lo[SEQ as usize] = start;
    hi[SEQ as usize] = stop;
    ops::slice_update(x, y, &lo, &hi, &vec![1; shape.len()], None)
}

/// `mx.concatenate(parts, axis=2)`.
pub(crate) fn concat(parts: &[&Array]) -> Result<Array> {
    ops::concatenate(parts, SEQ, None)
}

/// Length along the sequence axis.
pub(crate) fn len(x: &Array) -> i32 {
    x.shape().get(SEQ as usize).copied().unwrap_or(0)
}
