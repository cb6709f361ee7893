//! Shape manipulation: reshape, flatten, transpose, axes, broadcasting, concatenation,
//! splitting, padding, repetition.

use mlx_sys as sys;

use super::{c_string, same_len, vec_of};
use crate::array::{array_out, vec_out, Array};
use crate::device::{raw, Stream};
use crate::error::{Error, Result};

/// The same data with a new shape (one dimension may be -1).
pub fn reshape(a: &Array, shape: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; shape valid for its length.
    array_out("reshape", |o| unsafe {
        sys::mlxs_reshape(o, a.as_raw(), shape.as_ptr(), shape.len(), raw(s))
    })
}

/// Merges axes `start_axis..=end_axis` into one (Python's defaults: 0, -1).
pub fn flatten(a: &Array, start_axis: i32, end_axis: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("flatten", |o| unsafe {
        sys::mlxs_flatten(o, a.as_raw(), start_axis, end_axis, raw(s))
    })
}

/// Splits `axis` into `shape` (one entry may be -1).
pub fn unflatten(a: &Array, axis: i32, shape: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; shape valid for its length.
    array_out("unflatten", |o| unsafe {
        sys::mlxs_unflatten(o, a.as_raw(), axis, shape.as_ptr(), shape.len(), raw(s))
    })
}

/// Permutes the axes: output axis `i` is input axis `axes[i]`.
pub fn transpose(a: &Array, axes: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; axes valid for its length.
    array_out("transpose", |o| unsafe {
        sys::mlxs_transpose(o, a.as_raw(), axes.as_ptr(), axes.len(), raw(s))
    })
}

/// Reverses the axes (Python's `transpose(a)` / `a.T`).
pub fn transpose_all(a: &Array, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("transpose_all", |o| unsafe {
        sys::mlxs_transpose_all(o, a.as_raw(), raw(s))
    })
}

/// Swaps two axes.
pub fn swapaxes(a: &Array, axis1: i32, axis2: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("swapaxes", |o| unsafe {
        sys::mlxs_swapaxes(o, a.as_raw(), axis1, axis2, raw(s))
    })
}

/// Moves axis `source` to position `destination`.
pub fn moveaxis(a: &Array, source: i32, destination: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("moveaxis", |o| unsafe {
        sys::mlxs_moveaxis(o, a.as_raw(), source, destination, raw(s))
    })
}

/// Inserts size-1 axes at `axes` (positions in the output).
pub fn expand_dims(a: &Array, axes: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; axes valid for its length.
    array_out("expand_dims", |o| unsafe {
        sys::mlxs_expand_dims(o, a.as_raw(), axes.as_ptr(), axes.len(), raw(s))
    })
}

/// Removes the size-1 axes `axes`.
pub fn squeeze(a: &Array, axes: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; axes valid for its length.
    array_out("squeeze", |o| unsafe {
        sys::mlxs_squeeze(o, a.as_raw(), axes.as_ptr(), axes.len(), raw(s))
    })
}

/// Removes every size-1 axis (Python's `axis=None`).
pub fn squeeze_all(a: &Array, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("squeeze_all", |o| unsafe {
        sys::mlxs_squeeze_all(o, a.as_raw(), raw(s))
    })
}

/// Broadcasts to `shape` (numpy rules).
pub fn broadcast_to(a: &Array, shape: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; shape valid for its length.
    array_out("broadcast_to", |o| unsafe {
        sys::mlxs_broadcast_to(o, a.as_raw(), shape.as_ptr(), shape.len(), raw(s))
    })
}

/// Broadcasts the arrays against one another.
pub fn broadcast_arrays(arrays: &[&Array], s: Option<&Stream>) -> Result<Vec<Array>> {
    let v = vec_of("broadcast_arrays", arrays)?;
    // SAFETY: live vector handle; the shim writes an owned vector on success.
    vec_out("broadcast_arrays", |o| unsafe {
        sys::mlxs_broadcast_arrays(o, v.0, raw(s))
    })
}

/// Joins arrays along an existing axis.
pub fn concatenate(arrays: &[&Array], axis: i32, s: Option<&Stream>) -> Result<Array> {
    let v = vec_of("concatenate", arrays)?;
    // SAFETY: live vector handle.
    array_out("concatenate", |o| unsafe {
        sys::mlxs_concatenate(o, v.0, axis, raw(s))
    })
}

/// Joins arrays of one shape along a new axis.
pub fn stack(arrays: &[&Array], axis: i32, s: Option<&Stream>) -> Result<Array> {
    let v = vec_of("stack", arrays)?;
    // SAFETY: live vector handle.
    array_out("stack", |o| unsafe {
        sys::mlxs_stack(o, v.0, axis, raw(s))
    })
}

/// Splits into `num_splits` equal parts along `axis` (Python's `split(a, n, axis)`).
pub fn split_equal(
    a: &Array,
    num_splits: i32,
    axis: i32,
    s: Option<&Stream>,
) -> Result<Vec<Array>> {
    if num_splits <= 0 {
        return Err(Error::invalid(
            "split_equal",
            format!("number of splits must be positive, got {num_splits}"),
        ));
    }
    // SAFETY: live handle; the shim writes an owned vector on success.
    vec_out("split_equal", |o| unsafe {
        sys::mlxs_split_equal(o, a.as_raw(), num_splits, axis, raw(s))
    })
}

/// Splits along `axis` before each of `indices` (Python's `split(a, [i, j], axis)`).
pub fn split_at(a: &Array, indices: &[i32], axis: i32, s: Option<&Stream>) -> Result<Vec<Array>> {
    // SAFETY: live handle; indices valid for its length.
    vec_out("split_at", |o| unsafe {
        sys::mlxs_split_at(o, a.as_raw(), indices.as_ptr(), indices.len(), axis, raw(s))
    })
}

/// Pads `axes[i]` with `low[i]` entries before and `high[i]` after. `mode` is `"constant"`
/// (fill with `value`, cast to `a`'s dtype), `"edge"`, `"reflect"` or `"symmetric"`.
pub fn pad(
    a: &Array,
    axes: &[i32],
    low: &[i32],
    high: &[i32],
    value: &Array,
    mode: &str,
    s: Option<&Stream>,
) -> Result<Array> {
    same_len(
        "pad",
        "axes, low and high",
        &[axes.len(), low.len(), high.len()],
    )?;
    let mode = c_string("pad", mode)?;
    // SAFETY: live handles; axes, low and high each valid for axes.len(); mode NUL-terminated.
    array_out("pad", |o| unsafe {
        sys::mlxs_pad(
            o,
            a.as_raw(),
            axes.as_ptr(),
            axes.len(),
            low.as_ptr(),
            high.as_ptr(),
            value.as_raw(),
            mode.as_ptr(),
            raw(s),
        )
    })
}

/// Python's `mx.pad(a, [(lo0, hi0), (lo1, hi1), ...], mode, value)`: one `(low, high)` pair
/// per axis, or a single pair used for every axis.
pub fn pad_widths(
    a: &Array,
    widths: &[(i32, i32)],
    value: &Array,
    mode: &str,
    s: Option<&Stream>,
) -> Result<Array> {
    let ndim = a.ndim();
    let widths = match widths {
        [w] => vec![*w; ndim],
        _ if widths.len() == ndim => widths.to_vec(),
        _ => {
            return Err(Error::invalid(
                "pad",
                format!(
                    "{} (low, high) pairs for an array with {ndim} dimensions",
                    widths.len()
                ),
            ))
        }
    };
    let axes: Vec<i32> = (0..ndim as i32).collect();
    let low: Vec<i32> = widths.iter().map(|w| w.0).collect();
    let high: Vec<i32> = widths.iter().map(|w| w.1).collect();
    pad(a, &axes, &low, &high, value, mode, s)
}

/// Repeats each element `repeats` times along `axis`.
pub fn repeat(a: &Array, repeats: i32, axis: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("repeat", |o| unsafe {
        sys::mlxs_repeat(o, a.as_raw(), repeats, axis, raw(s))
    })
}

/// Repeats each element of the flattened array (Python's `axis=None`).
pub fn repeat_flat(a: &Array, repeats: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("repeat_flat", |o| unsafe {
        sys::mlxs_repeat_flat(o, a.as_raw(), repeats, raw(s))
    })
}

/// Tiles the array `reps[i]` times along axis `i` (numpy's `tile`).
pub fn tile(a: &Array, reps: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; reps valid for its length.
    array_out("tile", |o| unsafe {
        sys::mlxs_tile(o, a.as_raw(), reps.as_ptr(), reps.len(), raw(s))
    })
}

/// Reverses the order of elements along `axes`.
pub fn flip(a: &Array, axes: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; axes valid for its length.
    array_out("flip", |o| unsafe {
        sys::mlxs_flip(o, a.as_raw(), axes.as_ptr(), axes.len(), raw(s))
    })
}

/// Rolls elements by `shift[i]` along `axes[i]` (elements leaving one end come back at the
/// other).
pub fn roll(a: &Array, shift: &[i32], axes: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; shift and axes valid for their lengths.
    array_out("roll", |o| unsafe {
        sys::mlxs_roll(
            o,
            a.as_raw(),
            shift.as_ptr(),
            shift.len(),
            axes.as_ptr(),
            axes.len(),
            raw(s),
        )
    })
}
