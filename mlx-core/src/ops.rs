//! Array operations as free functions, one per MLX op, each taking an optional stream
//! (`None`: the default stream of the default device). Methods on [`Array`] call these.

use mlx_sys as sys;

use crate::array::Array;
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::Result;
use crate::ffi::array_out;
use crate::scalar::Scalar;

macro_rules! unary_ops {
    ($($name:ident => $sys:ident: $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $name(a: &Array, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handles; the shim writes an owned handle on success.
            array_out(stringify!($name), |o| unsafe { sys::$sys(o, a.as_raw(), raw(s)) })
        }
    )*};
}

macro_rules! binary_ops {
    ($($name:ident => $sys:ident: $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $name(a: &Array, b: &Array, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handles; the shim writes an owned handle on success.
            array_out(stringify!($name), |o| unsafe { sys::$sys(o, a.as_raw(), b.as_raw(), raw(s)) })
        }
    )*};
}

unary_ops! {
    abs => mlxs_abs: "Elementwise absolute value.";
    negative => mlxs_negative: "Elementwise negation.";
    exp => mlxs_exp: "Elementwise `e^x`.";
    log => mlxs_log: "Elementwise natural logarithm.";
    sqrt => mlxs_sqrt: "Elementwise square root.";
    rsqrt => mlxs_rsqrt: "Elementwise reciprocal square root.";
    square => mlxs_square: "Elementwise square.";
    sin => mlxs_sin: "Elementwise sine.";
    cos => mlxs_cos: "Elementwise cosine.";
    tanh => mlxs_tanh: "Elementwise hyperbolic tangent.";
    sigmoid => mlxs_sigmoid: "Elementwise logistic sigmoid.";
    erf => mlxs_erf: "Elementwise error function.";
}

binary_ops! {
    add => mlxs_add: "Elementwise sum with broadcasting.";
    subtract => mlxs_subtract: "Elementwise difference with broadcasting.";
    multiply => mlxs_multiply: "Elementwise product with broadcasting.";
    divide => mlxs_divide: "Elementwise quotient with broadcasting.";
    maximum => mlxs_maximum: "Elementwise maximum with broadcasting.";
    minimum => mlxs_minimum: "Elementwise minimum with broadcasting.";
    power => mlxs_power: "Elementwise `a^b` with broadcasting.";
    matmul => mlxs_matmul: "Matrix product (batched, with broadcasting of batch dims).";
}

/// `a + scalar` with the scalar weak (it takes `a`'s dtype where Python would).
pub fn add_scalar(a: &Array, b: impl Into<Scalar>, s: Option<&Stream>) -> Result<Array> {
    add(a, &b.into().to_array_like(a.dtype())?, s)
}

/// `a * scalar` with the scalar weak.
pub fn multiply_scalar(a: &Array, b: impl Into<Scalar>, s: Option<&Stream>) -> Result<Array> {
    multiply(a, &b.into().to_array_like(a.dtype())?, s)
}

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

/// An array of `shape` filled with `vals` (broadcast), cast to `dtype`.
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

/// `[start, stop)` in steps of `step`.
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: plain values.
    array_out("arange", |o| unsafe {
        sys::mlxs_arange(o, start, stop, step, dtype.to_sys(), raw(s))
    })
}

/// The same data with a new shape (one dimension may be -1).
pub fn reshape(a: &Array, shape: &[i32], s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle; shape valid for its length.
    array_out("reshape", |o| unsafe {
        sys::mlxs_reshape(o, a.as_raw(), shape.as_ptr(), shape.len(), raw(s))
    })
}

/// Converts to `dtype`.
pub fn astype(a: &Array, dtype: Dtype, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("astype", |o| unsafe {
        sys::mlxs_astype(o, a.as_raw(), dtype.to_sys(), raw(s))
    })
}

/// Method sugar over [`crate::ops`], on the default stream.
impl Array {
    pub fn add(&self, other: &Array) -> Result<Array> {
        add(self, other, None)
    }
    pub fn subtract(&self, other: &Array) -> Result<Array> {
        subtract(self, other, None)
    }
    pub fn multiply(&self, other: &Array) -> Result<Array> {
        multiply(self, other, None)
    }
    pub fn divide(&self, other: &Array) -> Result<Array> {
        divide(self, other, None)
    }
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        matmul(self, other, None)
    }
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        reshape(self, shape, None)
    }
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        astype(self, dtype, None)
    }
    pub fn exp(&self) -> Result<Array> {
        exp(self, None)
    }
    pub fn sqrt(&self) -> Result<Array> {
        sqrt(self, None)
    }
}
