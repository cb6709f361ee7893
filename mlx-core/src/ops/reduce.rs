//! Reductions (`sum`, `mean`, `max`, ..., `var`, `logsumexp`, `softmax`), arg-reductions and
//! cumulative scans.
//!
//! `op(a, axes, keepdims, s)` reduces the listed axes (negative axes count from the end; an
//! empty list reduces nothing); `op_all(a, keepdims, s)` reduces every axis, like Python's
//! `axis=None`.

use mlx_sys as sys;

use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::error::Result;

macro_rules! reduce_ops {
    ($($name:ident, $all:ident => $sys:ident, $sys_all:ident: $doc:literal;)*) => {$(
        #[doc = concat!($doc, " over `axes`.")]
        pub fn $name(a: &Array, axes: &[i32], keepdims: bool, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handle; axes valid for its length.
            array_out(stringify!($name), |o| unsafe {
                sys::$sys(o, a.as_raw(), axes.as_ptr(), axes.len(), keepdims, raw(s))
            })
        }

        #[doc = concat!($doc, " over every axis (Python's `axis=None`).")]
        pub fn $all(a: &Array, keepdims: bool, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handle.
            array_out(stringify!($all), |o| unsafe {
                sys::$sys_all(o, a.as_raw(), keepdims, raw(s))
            })
        }
    )*};
}

reduce_ops! {
    sum, sum_all => mlxs_sum, mlxs_sum_all: "Sum";
    mean, mean_all => mlxs_mean, mlxs_mean_all: "Mean";
    max, max_all => mlxs_max, mlxs_max_all: "Maximum";
    min, min_all => mlxs_min, mlxs_min_all: "Minimum";
    prod, prod_all => mlxs_prod, mlxs_prod_all: "Product";
    all, all_all => mlxs_all, mlxs_all_all: "Logical and (bool result)";
    any, any_all => mlxs_any, mlxs_any_all: "Logical or (bool result)";
    logsumexp, logsumexp_all => mlxs_logsumexp, mlxs_logsumexp_all:
        "`log(sum(exp(a)))`, computed stably,";
}

macro_rules! arg_reduce_ops {
    ($($name:ident, $all:ident => $sys:ident, $sys_all:ident: $doc:literal;)*) => {$(
        #[doc = concat!($doc, " along `axis` (uint32 result; ties give the first index).")]
        pub fn $name(a: &Array, axis: i32, keepdims: bool, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handle.
            array_out(stringify!($name), |o| unsafe {
                sys::$sys(o, a.as_raw(), axis, keepdims, raw(s))
            })
        }

        #[doc = concat!($doc, " of the flattened array (Python's `axis=None`).")]
        pub fn $all(a: &Array, keepdims: bool, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handle.
            array_out(stringify!($all), |o| unsafe {
                sys::$sys_all(o, a.as_raw(), keepdims, raw(s))
            })
        }
    )*};
}

arg_reduce_ops! {
    argmax, argmax_all => mlxs_argmax, mlxs_argmax_all: "Index of the maximum";
    argmin, argmin_all => mlxs_argmin, mlxs_argmin_all: "Index of the minimum";
}

macro_rules! scan_ops {
    ($($name:ident => $sys:ident: $doc:literal;)*) => {$(
        #[doc = concat!($doc, " along `axis`; `reverse` scans from the end, `inclusive = false` ",
                        "shifts by one (Python's defaults: `false`, `true`).")]
        pub fn $name(
            a: &Array,
            axis: i32,
            reverse: bool,
            inclusive: bool,
            s: Option<&Stream>,
        ) -> Result<Array> {
            // SAFETY: live handle.
            array_out(stringify!($name), |o| unsafe {
                sys::$sys(o, a.as_raw(), axis, reverse, inclusive, raw(s))
            })
        }
    )*};
}

scan_ops! {
    cumsum => mlxs_cumsum: "Cumulative sum";
    cumprod => mlxs_cumprod: "Cumulative product";
    cummax => mlxs_cummax: "Cumulative maximum";
    cummin => mlxs_cummin: "Cumulative minimum";
    logcumsumexp => mlxs_logcumsumexp: "Cumulative `log(sum(exp(a)))`";
}

/// Variance over `axes` with `ddof` delta degrees of freedom (Python's default 0).
pub fn var(
    a: &Array,
    axes: &[i32],
    keepdims: bool,
    ddof: i32,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handle; axes valid for its length.
    array_out("var", |o| unsafe {
        sys::mlxs_var(
            o,
            a.as_raw(),
            axes.as_ptr(),
            axes.len(),
            keepdims,
            ddof,
            raw(s),
        )
    })
}

/// Variance over every axis.
pub fn var_all(a: &Array, keepdims: bool, ddof: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("var_all", |o| unsafe {
        sys::mlxs_var_all(o, a.as_raw(), keepdims, ddof, raw(s))
    })
}

/// Standard deviation over `axes` with `ddof` delta degrees of freedom.
pub fn std(
    a: &Array,
    axes: &[i32],
    keepdims: bool,
    ddof: i32,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handle; axes valid for its length.
    array_out("std", |o| unsafe {
        sys::mlxs_std(
            o,
            a.as_raw(),
            axes.as_ptr(),
            axes.len(),
            keepdims,
            ddof,
            raw(s),
        )
    })
}

/// Standard deviation over every axis.
pub fn std_all(a: &Array, keepdims: bool, ddof: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("std_all", |o| unsafe {
        sys::mlxs_std_all(o, a.as_raw(), keepdims, ddof, raw(s))
    })
}

/// Softmax over `axes`. `precise` accumulates half-precision inputs in `f32` (Python's
/// default `false`).
pub fn softmax(a: &Array, axes: &[i32], precise: bool, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; axes valid for its length.
    array_out("softmax", |o| unsafe {
        sys::mlxs_softmax(o, a.as_raw(), axes.as_ptr(), axes.len(), precise, raw(s))
    })
}

/// Softmax over every axis (Python's `axis=None`).
pub fn softmax_all(a: &Array, precise: bool, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("softmax_all", |o| unsafe {
        sys::mlxs_softmax_all(o, a.as_raw(), precise, raw(s))
    })
}
