//! Method sugar over [`crate::ops`], on the default stream. Comparisons are methods
//! (`a.less(&b)`), not `PartialOrd`, because they return arrays.

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::scalar::Scalar;

use super::*;

macro_rules! unary_methods {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("[`ops::", stringify!($name), "`](crate::ops::", stringify!($name), ") on the default stream.")]
            pub fn $name(&self) -> Result<Array> {
                $name(self, None)
            }
        )*
    };
}

macro_rules! binary_methods {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("[`ops::", stringify!($name), "`](crate::ops::", stringify!($name), ") on the default stream.")]
            pub fn $name(&self, other: &Array) -> Result<Array> {
                $name(self, other, None)
            }
        )*
    };
}

impl Array {
    unary_methods!(
        abs,
        negative,
        sign,
        exp,
        expm1,
        log,
        log1p,
        log2,
        log10,
        sqrt,
        rsqrt,
        square,
        reciprocal,
        sin,
        cos,
        tan,
        tanh,
        sinh,
        cosh,
        sigmoid,
        erf,
        erfinv,
        floor,
        ceil,
        isnan,
        isinf,
        isfinite,
        logical_not,
        stop_gradient,
    );

    binary_methods!(
        add,
        subtract,
        multiply,
        divide,
        floor_divide,
        remainder,
        power,
        maximum,
        minimum,
        equal,
        not_equal,
        less,
        less_equal,
        greater,
        greater_equal,
        logical_and,
        logical_or,
        matmul,
        arctan2,
        logaddexp,
    );

    /// [`ops::add_scalar`](crate::ops::add_scalar): `self + v` with `v` weak.
    pub fn add_scalar(&self, v: impl Into<Scalar>) -> Result<Array> {
        add_scalar(self, v, None)
    }
    /// [`ops::multiply_scalar`](crate::ops::multiply_scalar): `self * v` with `v` weak.
    pub fn multiply_scalar(&self, v: impl Into<Scalar>) -> Result<Array> {
        multiply_scalar(self, v, None)
    }
    /// [`ops::power_scalar`](crate::ops::power_scalar): `self ** v` with `v` weak.
    pub fn power_scalar(&self, v: impl Into<Scalar>) -> Result<Array> {
        power_scalar(self, v, None)
    }

    /// [`ops::round`](crate::ops::round).
    pub fn round(&self, decimals: i32) -> Result<Array> {
        round(self, decimals, None)
    }

    /// [`ops::reshape`](crate::ops::reshape).
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        reshape(self, shape, None)
    }
    /// [`ops::flatten`](crate::ops::flatten).
    pub fn flatten(&self, start_axis: i32, end_axis: i32) -> Result<Array> {
        flatten(self, start_axis, end_axis, None)
    }
    /// [`ops::transpose`](crate::ops::transpose).
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        transpose(self, axes, None)
    }
    /// [`ops::transpose_all`](crate::ops::transpose_all) (Python's `a.T`).
    pub fn transpose_all(&self) -> Result<Array> {
        transpose_all(self, None)
    }
    /// Swaps the last two axes (a batched matrix transpose).
    pub fn t(&self) -> Result<Array> {
        swapaxes(self, -1, -2, None)
    }
    /// [`ops::swapaxes`](crate::ops::swapaxes).
    pub fn swapaxes(&self, axis1: i32, axis2: i32) -> Result<Array> {
        swapaxes(self, axis1, axis2, None)
    }
    /// [`ops::moveaxis`](crate::ops::moveaxis).
    pub fn moveaxis(&self, source: i32, destination: i32) -> Result<Array> {
        moveaxis(self, source, destination, None)
    }
    /// [`ops::expand_dims`](crate::ops::expand_dims).
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        expand_dims(self, axes, None)
    }
    /// [`ops::squeeze`](crate::ops::squeeze).
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        squeeze(self, axes, None)
    }
    /// [`ops::squeeze_all`](crate::ops::squeeze_all).
    pub fn squeeze_all(&self) -> Result<Array> {
        squeeze_all(self, None)
    }
    /// [`ops::broadcast_to`](crate::ops::broadcast_to).
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        broadcast_to(self, shape, None)
    }
    /// [`ops::astype`](crate::ops::astype).
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        astype(self, dtype, None)
    }
    /// [`ops::view`](crate::ops::view).
    pub fn view(&self, dtype: Dtype) -> Result<Array> {
        view(self, dtype, None)
    }

    /// [`ops::sum`](crate::ops::sum).
    pub fn sum(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        sum(self, axes, keepdims, None)
    }
    /// [`ops::sum_all`](crate::ops::sum_all).
    pub fn sum_all(&self, keepdims: bool) -> Result<Array> {
        sum_all(self, keepdims, None)
    }
    /// [`ops::mean`](crate::ops::mean).
    pub fn mean(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        mean(self, axes, keepdims, None)
    }
    /// [`ops::mean_all`](crate::ops::mean_all).
    pub fn mean_all(&self, keepdims: bool) -> Result<Array> {
        mean_all(self, keepdims, None)
    }
    /// [`ops::max`](crate::ops::max).
    pub fn max(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        max(self, axes, keepdims, None)
    }
    /// [`ops::max_all`](crate::ops::max_all).
    pub fn max_all(&self, keepdims: bool) -> Result<Array> {
        max_all(self, keepdims, None)
    }
    /// [`ops::min`](crate::ops::min).
    pub fn min(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        min(self, axes, keepdims, None)
    }
    /// [`ops::min_all`](crate::ops::min_all).
    pub fn min_all(&self, keepdims: bool) -> Result<Array> {
        min_all(self, keepdims, None)
    }
    /// [`ops::argmax`](crate::ops::argmax).
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        argmax(self, axis, keepdims, None)
    }
    /// [`ops::argmin`](crate::ops::argmin).
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        argmin(self, axis, keepdims, None)
    }
    /// [`ops::logsumexp`](crate::ops::logsumexp).
    pub fn logsumexp(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        logsumexp(self, axes, keepdims, None)
    }
    /// [`ops::softmax`](crate::ops::softmax).
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        softmax(self, axes, precise, None)
    }
    /// [`ops::cumsum`](crate::ops::cumsum) (forward, inclusive).
    pub fn cumsum(&self, axis: i32) -> Result<Array> {
        cumsum(self, axis, false, true, None)
    }

    /// [`ops::slice`](crate::ops::slice).
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        slice(self, start, stop, strides, None)
    }
    /// [`ops::slice_axis`](crate::ops::slice_axis): `self[..., start:stop, ...]` on `axis`.
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        slice_axis(self, axis, start, stop, None)
    }
    /// [`ops::take`](crate::ops::take).
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        take(self, indices, axis, None)
    }
    /// [`ops::take_along_axis`](crate::ops::take_along_axis).
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        take_along_axis(self, indices, axis, None)
    }
}
