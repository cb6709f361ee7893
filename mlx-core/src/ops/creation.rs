//! Creating arrays (`zeros`, `full`, `arange`, `eye`, ...) and converting them (`astype`,
//! `view`, `contiguous`).

use mlx_sys as sys;

use super::{c_string, vec_of};
use crate::array::{array_out, vec_out, Array};
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::Result;
use crate::scalar::Scalar;

/// An array of zeros.
pub fn zeros(shape: &[i32], dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: shape valid for its length.
    array_out("zeros", |o| unsafe {
        sys::mlxs_zeros(o, shape.as_ptr(), shape.len(), dtype.to_sys(), raw(s))
    })
}

/// An array of ones.
pub fn ones(shape: &[i32], dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: shape valid for its length.
    array_out("ones", |o| unsafe {
        sys::mlxs_ones(o, shape.as_ptr(), shape.len(), dtype.to_sys(), raw(s))
    })
}

/// An array of `shape` filled with `vals` (broadcast), cast to `dtype` (C++ semantics).
///
/// Python's `mx.full(shape, vals, dtype)` differs: with a number it is [`full_scalar`]; with an
/// array it ignores `dtype` and keeps `vals.dtype()` (pass that here).
pub fn full(shape: &[i32], vals: &Array, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: shape valid for its length; live handle.
    array_out("full", |o| unsafe {
        sys::mlxs_full(
            o,
            shape.as_ptr(),
            shape.len(),
            vals.as_raw(),
            dtype.to_sys(),
            raw(s),
        )
    })
}

/// Python's `mx.full(shape, v, dtype)` with a number `v`: the value is built as Python builds
/// it (`v` converted to `dtype` when that can hold it: a float next to an integer `dtype`
/// stays `float32`, an int next to `bool` is `int32`; `None`: `float32` / `int32` / `bool`),
/// and the result has that value's dtype.
pub fn full_scalar(
    shape: &[i32],
    v: impl Into<Scalar>,
    dtype: Option<Dtype>,
    s: Option<&Stream>,
) -> Result<Array> {
    let v = v.into();
    let vals = match dtype {
        Some(d) => v.to_array_like(d)?,
        None => v.to_array()?,
    };
    full(shape, &vals, vals.dtype(), s)
}

/// Zeros with `a`'s shape and dtype.
pub fn zeros_like(a: &Array, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("zeros_like", |o| unsafe {
        sys::mlxs_zeros_like(o, a.as_raw(), raw(s))
    })
}

/// Ones with `a`'s shape and dtype.
pub fn ones_like(a: &Array, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("ones_like", |o| unsafe {
        sys::mlxs_ones_like(o, a.as_raw(), raw(s))
    })
}

/// `vals` broadcast to `a`'s shape, cast to `dtype` (`None`: `a`'s dtype).
pub fn full_like(
    a: &Array,
    vals: &Array,
    dtype: Option<Dtype>,
    s: Option<&Stream>,
) -> Result<Array> {
    let dtype = dtype.unwrap_or_else(|| a.dtype());
    // SAFETY: live handles.
    array_out("full_like", |o| unsafe {
        sys::mlxs_full_like(o, a.as_raw(), vals.as_raw(), dtype.to_sys(), raw(s))
    })
}

/// `[start, stop)` in steps of `step`.
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: plain values.
    array_out("arange", |o| unsafe {
        sys::mlxs_arange(o, start, stop, step, dtype.to_sys(), raw(s))
    })
}

/// `num` evenly spaced values from `start` to `stop` (included when `endpoint`). Python's
/// defaults: `num = 50`, `endpoint = true`, `dtype = float32`.
pub fn linspace(
    start: f64,
    stop: f64,
    num: i32,
    endpoint: bool,
    dtype: Dtype,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: plain values.
    array_out("linspace", |o| unsafe {
        sys::mlxs_linspace(o, start, stop, num, endpoint, dtype.to_sys(), raw(s))
    })
}

/// An `n x m` matrix with ones on diagonal `k` (0: main, > 0: above) and zeros elsewhere.
pub fn eye(n: i32, m: i32, k: i32, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: plain values.
    array_out("eye", |o| unsafe {
        sys::mlxs_eye(o, n, m, k, dtype.to_sys(), raw(s))
    })
}

/// The `n x n` identity matrix.
pub fn identity(n: i32, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: plain values.
    array_out("identity", |o| unsafe {
        sys::mlxs_identity(o, n, dtype.to_sys(), raw(s))
    })
}

/// An `n x m` matrix with ones at and below diagonal `k`, zeros above.
pub fn tri(n: i32, m: i32, k: i32, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: plain values.
    array_out("tri", |o| unsafe {
        sys::mlxs_tri(o, n, m, k, dtype.to_sys(), raw(s))
    })
}

/// Coordinate grids from 1-D coordinate arrays; `indexing` is `"xy"` (Python's default) or
/// `"ij"`.
pub fn meshgrid(
    arrays: &[&Array],
    sparse: bool,
    indexing: &str,
    s: Option<&Stream>,
) -> Result<Vec<Array>> {
    let v = vec_of("meshgrid", arrays)?;
    let indexing = c_string("meshgrid", indexing)?;
    // SAFETY: live vector handle; indexing NUL-terminated; the shim writes an owned vector.
    vec_out("meshgrid", |o| unsafe {
        sys::mlxs_meshgrid(o, v.0, sparse, indexing.as_ptr(), raw(s))
    })
}

/// Converts to `dtype`.
pub fn astype(a: &Array, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("astype", |o| unsafe {
        sys::mlxs_astype(o, a.as_raw(), dtype.to_sys(), raw(s))
    })
}

/// The same bytes reinterpreted as `dtype` (a bit cast; the last axis scales by the ratio of
/// the item sizes).
pub fn view(a: &Array, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("view", |o| unsafe {
        sys::mlxs_view(o, a.as_raw(), dtype.to_sys(), raw(s))
    })
}

/// `a`'s values, evaluated only after `dep` has been (MLX's `depends`): keeps a node whose
/// result nobody reads (a pipeline stage's `send`) in the graph of what is evaluated.
pub fn depends(a: &Array, dep: &Array) -> Result<Array> {
    // SAFETY: live handles.
    array_out("depends", |o| unsafe {
        sys::mlxs_depends(o, a.as_raw(), dep.as_raw())
    })
}

/// The same values in row-major contiguous memory (`allow_col_major`: a column-major array
/// is left as is).
pub fn contiguous(a: &Array, allow_col_major: bool, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("contiguous", |o| unsafe {
        sys::mlxs_contiguous(o, a.as_raw(), allow_col_major, raw(s))
    })
}
