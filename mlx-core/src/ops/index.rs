//! Slicing and indexing: static and dynamic slices and their updates, `take`, `gather`,
//! `scatter`.
//!
//! # Index values are not checked
//!
//! Static slices ([`slice`](fn@slice), [`slice_axis`], [`slice_update`]) clamp to the array, as in
//! Python. Ops whose indices or offsets are *data* ([`take`], [`take_flat`],
//! [`take_along_axis`], [`put_along_axis`], [`gather`], [`scatter`], [`scatter_add`],
//! [`slice_dynamic`], [`slice_update_dynamic`]) are lazy, so the values are not known when the
//! op is built, and MLX does not check them when it runs: an index outside `[-n, n)` (or a
//! dynamic start that puts the slice past the end) reads or writes out of bounds inside
//! MLX, exactly as in Python (where it can segfault). Callers must pass in-range indices;
//! shapes, axes and dtypes are checked and give `Err`.

use mlx_sys as sys;

use super::{same_len, vec_of};
use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::error::{Error, Result};

fn check_strides(op: &'static str, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<()> {
    same_len(
        op,
        "start, stop and strides",
        &[start.len(), stop.len(), strides.len()],
    )?;
    if let Some(i) = strides.iter().position(|&st| st == 0) {
        return Err(Error::invalid(op, format!("stride of axis {i} is 0")));
    }
    Ok(())
}

/// `a[start[0]:stop[0]:strides[0], ...]`, one entry per axis, with MLX's C++ slice rules:
/// negative `start`/`stop` count from the end of the axis (once) and are then clamped to the
/// axis. For a negative stride the slice runs from `start` down to, not including, `stop`;
/// to reach index 0 use a `stop` of `-(n + 1)` or lower (Python's `::-1` is `start = -1`,
/// `stop = i32::MIN`, `stride = -1`).
pub fn slice(
    a: &Array,
    start: &[i32],
    stop: &[i32],
    strides: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    check_strides("slice", start, stop, strides)?;
    // SAFETY: live handle; start, stop and strides each valid for start.len().
    array_out("slice", |o| unsafe {
        sys::mlxs_slice(
            o,
            a.as_raw(),
            start.as_ptr(),
            stop.as_ptr(),
            strides.as_ptr(),
            start.len(),
            raw(s),
        )
    })
}

/// `a[..., start:stop, ...]` on one axis (negative values count from the end, as in Python).
pub fn slice_axis(
    a: &Array,
    axis: i32,
    start: i32,
    stop: i32,
    s: Option<&Stream>,
) -> Result<Array> {
    let shape = a.shape();
    let ax = normalize_axis("slice_axis", axis, shape.len())?;
    let mut lo = vec![0; shape.len()];
    let mut hi = shape;
    lo[ax] = start;
    hi[ax] = stop;
    let strides = vec![1; lo.len()];
    slice(a, &lo, &hi, &strides, s)
}

/// A copy of `src` with the slice `start:stop:strides` (as in [`slice`](fn@slice)) replaced by
/// `update` (broadcast to the slice's shape).
pub fn slice_update(
    src: &Array,
    update: &Array,
    start: &[i32],
    stop: &[i32],
    strides: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    check_strides("slice_update", start, stop, strides)?;
    // SAFETY: live handles; start, stop and strides each valid for start.len().
    array_out("slice_update", |o| unsafe {
        sys::mlxs_slice_update(
            o,
            src.as_raw(),
            update.as_raw(),
            start.as_ptr(),
            stop.as_ptr(),
            strides.as_ptr(),
            start.len(),
            raw(s),
        )
    })
}

/// A slice whose start is data: `start` is an integer array with one entry per axis in
/// `axes`; `slice_size` gives the output size of every axis (Python's `mx.slice`).
pub fn slice_dynamic(
    a: &Array,
    start: &Array,
    axes: &[i32],
    slice_size: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles; axes and slice_size valid for their lengths.
    array_out("slice_dynamic", |o| unsafe {
        sys::mlxs_slice_dynamic(
            o,
            a.as_raw(),
            start.as_raw(),
            axes.as_ptr(),
            axes.len(),
            slice_size.as_ptr(),
            slice_size.len(),
            raw(s),
        )
    })
}

/// A copy of `src` with `update` written at the data-dependent offset `start` (one entry
/// per axis in `axes`), as Python's `mx.slice_update`.
pub fn slice_update_dynamic(
    src: &Array,
    update: &Array,
    start: &Array,
    axes: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles; axes valid for its length.
    array_out("slice_update_dynamic", |o| unsafe {
        sys::mlxs_slice_update_dynamic(
            o,
            src.as_raw(),
            update.as_raw(),
            start.as_raw(),
            axes.as_ptr(),
            axes.len(),
            raw(s),
        )
    })
}

/// Elements of `a` at `indices` along `axis` (the indexed axis is replaced by the indices'
/// shape). Negative indices count from the end.
pub fn take(a: &Array, indices: &Array, axis: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles.
    array_out("take", |o| unsafe {
        sys::mlxs_take(o, a.as_raw(), indices.as_raw(), axis, raw(s))
    })
}

/// Elements of the flattened `a` at `indices` (Python's `take(a, indices)`, `axis=None`).
pub fn take_flat(a: &Array, indices: &Array, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles.
    array_out("take_flat", |o| unsafe {
        sys::mlxs_take_flat(o, a.as_raw(), indices.as_raw(), raw(s))
    })
}

/// `out[..., i, ...] = a[..., indices[..., i, ...], ...]` along `axis` (indices broadcast
/// against `a` on the other axes).
pub fn take_along_axis(a: &Array, indices: &Array, axis: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles.
    array_out("take_along_axis", |o| unsafe {
        sys::mlxs_take_along_axis(o, a.as_raw(), indices.as_raw(), axis, raw(s))
    })
}

/// A copy of `a` with `values` written at `indices` along `axis` (the inverse of
/// [`take_along_axis`]).
pub fn put_along_axis(
    a: &Array,
    indices: &Array,
    values: &Array,
    axis: i32,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles.
    array_out("put_along_axis", |o| unsafe {
        sys::mlxs_put_along_axis(
            o,
            a.as_raw(),
            indices.as_raw(),
            values.as_raw(),
            axis,
            raw(s),
        )
    })
}

/// MLX's general gather: `indices[i]` indexes axis `axes[i]` (the index arrays broadcast),
/// taking a block of `slice_sizes` (one per axis of `a`) at each index. The output shape is
/// the broadcast index shape followed by `slice_sizes`.
pub fn gather(
    a: &Array,
    indices: &[&Array],
    axes: &[i32],
    slice_sizes: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    same_len("gather", "indices and axes", &[indices.len(), axes.len()])?;
    let v = vec_of("gather", indices)?;
    // SAFETY: live handles; axes and slice_sizes valid for their lengths.
    array_out("gather", |o| unsafe {
        sys::mlxs_gather(
            o,
            a.as_raw(),
            v.0,
            axes.as_ptr(),
            axes.len(),
            slice_sizes.as_ptr(),
            slice_sizes.len(),
            raw(s),
        )
    })
}

/// A copy of `a` with `updates` written at `indices` (one index array per axis in `axes`;
/// `updates` has the broadcast index shape followed by one block per index, of `a`'s rank).
/// With repeated indices, which update wins is unspecified.
pub fn scatter(
    a: &Array,
    indices: &[&Array],
    updates: &Array,
    axes: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    same_len("scatter", "indices and axes", &[indices.len(), axes.len()])?;
    let v = vec_of("scatter", indices)?;
    // SAFETY: live handles; axes valid for its length.
    array_out("scatter", |o| unsafe {
        sys::mlxs_scatter(
            o,
            a.as_raw(),
            v.0,
            updates.as_raw(),
            axes.as_ptr(),
            axes.len(),
            raw(s),
        )
    })
}

/// Like [`scatter`], adding `updates` (repeated indices accumulate).
pub fn scatter_add(
    a: &Array,
    indices: &[&Array],
    updates: &Array,
    axes: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    same_len(
        "scatter_add",
        "indices and axes",
        &[indices.len(), axes.len()],
    )?;
    let v = vec_of("scatter_add", indices)?;
    // SAFETY: live handles; axes valid for its length.
    array_out("scatter_add", |o| unsafe {
        sys::mlxs_scatter_add(
            o,
            a.as_raw(),
            v.0,
            updates.as_raw(),
            axes.as_ptr(),
            axes.len(),
            raw(s),
        )
    })
}

/// `axis` as an index into `ndim` axes (negative counts from the end).
pub(crate) fn normalize_axis(op: &'static str, axis: i32, ndim: usize) -> Result<usize> {
    let n = i64::try_from(ndim).unwrap_or(i64::MAX);
    let ax = if axis < 0 {
        i64::from(axis) + n
    } else {
        i64::from(axis)
    };
    if (0..n).contains(&ax) {
        Ok(ax as usize)
    } else {
        Err(Error::invalid(
            op,
            format!("axis {axis} is out of bounds for an array with {ndim} dimensions"),
        ))
    }
}
