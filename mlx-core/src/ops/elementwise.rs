//! Elementwise ops: unary math, binary arithmetic/comparison/logic/bitwise with broadcasting,
//! their weak-scalar forms, and `where_`, `clip`, `round`, `nan_to_num`, `isclose`.

use mlx_sys as sys;

use super::opt_raw;
use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::error::{Error, Result};
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
    ($($name:ident, $lhs:ident, $rhs:ident => $sys:ident: $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $name(a: &Array, b: &Array, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handles; the shim writes an owned handle on success.
            array_out(stringify!($name), |o| unsafe {
                sys::$sys(o, a.as_raw(), b.as_raw(), raw(s))
            })
        }

        #[doc = concat!("`", stringify!($name), "(a, b)` with `b` a weak scalar (Python's `op(a, 2.0)`).")]
        pub fn $lhs(a: &Array, b: impl Into<Scalar>, s: Option<&Stream>) -> Result<Array> {
            $name(a, &b.into().to_array_like(a.dtype())?, s)
        }

        #[doc = concat!("`", stringify!($name), "(a, b)` with `a` a weak scalar (Python's `op(2.0, b)`).")]
        pub fn $rhs(a: impl Into<Scalar>, b: &Array, s: Option<&Stream>) -> Result<Array> {
            $name(&a.into().to_array_like(b.dtype())?, b, s)
        }
    )*};
}

unary_ops! {
    abs => mlxs_abs: "Elementwise absolute value.";
    negative => mlxs_negative: "Elementwise negation.";
    sign => mlxs_sign: "Elementwise sign (-1, 0 or 1).";
    exp => mlxs_exp: "Elementwise `e^x`.";
    expm1 => mlxs_expm1: "Elementwise `e^x - 1`, accurate near 0.";
    log => mlxs_log: "Elementwise natural logarithm.";
    log1p => mlxs_log1p: "Elementwise `ln(1 + x)`, accurate near 0.";
    log2 => mlxs_log2: "Elementwise base-2 logarithm.";
    log10 => mlxs_log10: "Elementwise base-10 logarithm.";
    sqrt => mlxs_sqrt: "Elementwise square root.";
    rsqrt => mlxs_rsqrt: "Elementwise reciprocal square root.";
    square => mlxs_square: "Elementwise square.";
    reciprocal => mlxs_reciprocal: "Elementwise `1 / x`.";
    sin => mlxs_sin: "Elementwise sine.";
    cos => mlxs_cos: "Elementwise cosine.";
    tan => mlxs_tan: "Elementwise tangent.";
    tanh => mlxs_tanh: "Elementwise hyperbolic tangent.";
    sinh => mlxs_sinh: "Elementwise hyperbolic sine.";
    cosh => mlxs_cosh: "Elementwise hyperbolic cosine.";
    arcsin => mlxs_arcsin: "Elementwise inverse sine.";
    arccos => mlxs_arccos: "Elementwise inverse cosine.";
    arctan => mlxs_arctan: "Elementwise inverse tangent.";
    arcsinh => mlxs_arcsinh: "Elementwise inverse hyperbolic sine.";
    arccosh => mlxs_arccosh: "Elementwise inverse hyperbolic cosine.";
    arctanh => mlxs_arctanh: "Elementwise inverse hyperbolic tangent.";
    degrees => mlxs_degrees: "Radians to degrees.";
    radians => mlxs_radians: "Degrees to radians.";
    sigmoid => mlxs_sigmoid: "Elementwise logistic sigmoid.";
    erf => mlxs_erf: "Elementwise error function.";
    erfinv => mlxs_erfinv: "Elementwise inverse error function.";
    floor => mlxs_floor: "Elementwise floor.";
    ceil => mlxs_ceil: "Elementwise ceiling.";
    trunc => mlxs_trunc: "Elementwise rounding toward zero.";
    isnan => mlxs_isnan: "Elementwise NaN test (bool result).";
    isinf => mlxs_isinf: "Elementwise infinity test (bool result).";
    isfinite => mlxs_isfinite: "Elementwise finiteness test (bool result).";
    isposinf => mlxs_isposinf: "Elementwise `+inf` test (bool result).";
    isneginf => mlxs_isneginf: "Elementwise `-inf` test (bool result).";
    logical_not => mlxs_logical_not: "Elementwise logical not (bool result).";
    bitwise_invert => mlxs_bitwise_invert: "Elementwise bitwise not (integers and bool).";
    stop_gradient => mlxs_stop_gradient: "The same values, with no gradient flowing back.";
    copy => mlxs_copy: "A copy of the array (a new graph node).";
    real => mlxs_real: "The real part of a complex array.";
    imag => mlxs_imag: "The imaginary part of a complex array.";
    conjugate => mlxs_conjugate: "The complex conjugate.";
}

binary_ops! {
    add, add_scalar, scalar_add => mlxs_add: "Elementwise sum with broadcasting.";
    subtract, subtract_scalar, scalar_subtract => mlxs_subtract:
        "Elementwise difference with broadcasting.";
    multiply, multiply_scalar, scalar_multiply => mlxs_multiply:
        "Elementwise product with broadcasting.";
    divide, divide_scalar, scalar_divide => mlxs_divide:
        "Elementwise true division with broadcasting (integers give floats).";
    floor_divide, floor_divide_scalar, scalar_floor_divide => mlxs_floor_divide:
        "Elementwise floor division (Python's `//`).";
    remainder, remainder_scalar, scalar_remainder => mlxs_remainder:
        "Elementwise remainder with the divisor's sign (Python's `%`).";
    power, power_scalar, scalar_power => mlxs_power: "Elementwise `a^b` with broadcasting.";
    maximum, maximum_scalar, scalar_maximum => mlxs_maximum:
        "Elementwise maximum with broadcasting (NaN propagates).";
    minimum, minimum_scalar, scalar_minimum => mlxs_minimum:
        "Elementwise minimum with broadcasting (NaN propagates).";
    equal, equal_scalar, scalar_equal => mlxs_equal: "Elementwise `a == b` (bool result).";
    not_equal, not_equal_scalar, scalar_not_equal => mlxs_not_equal:
        "Elementwise `a != b` (bool result).";
    less, less_scalar, scalar_less => mlxs_less: "Elementwise `a < b` (bool result).";
    less_equal, less_equal_scalar, scalar_less_equal => mlxs_less_equal:
        "Elementwise `a <= b` (bool result).";
    greater, greater_scalar, scalar_greater => mlxs_greater:
        "Elementwise `a > b` (bool result).";
    greater_equal, greater_equal_scalar, scalar_greater_equal => mlxs_greater_equal:
        "Elementwise `a >= b` (bool result).";
    logical_and, logical_and_scalar, scalar_logical_and => mlxs_logical_and:
        "Elementwise logical and (bool result).";
    logical_or, logical_or_scalar, scalar_logical_or => mlxs_logical_or:
        "Elementwise logical or (bool result).";
    logical_xor, logical_xor_scalar, scalar_logical_xor => mlxs_logical_xor:
        "Elementwise logical exclusive or (bool result).";
    bitwise_and, bitwise_and_scalar, scalar_bitwise_and => mlxs_bitwise_and:
        "Elementwise bitwise and (integers and bool).";
    bitwise_or, bitwise_or_scalar, scalar_bitwise_or => mlxs_bitwise_or:
        "Elementwise bitwise or (integers and bool).";
    bitwise_xor, bitwise_xor_scalar, scalar_bitwise_xor => mlxs_bitwise_xor:
        "Elementwise bitwise exclusive or (integers and bool).";
    left_shift, left_shift_scalar, scalar_left_shift => mlxs_left_shift:
        "Elementwise `a << b` (integers).";
    right_shift, right_shift_scalar, scalar_right_shift => mlxs_right_shift:
        "Elementwise `a >> b` (integers).";
    arctan2, arctan2_scalar, scalar_arctan2 => mlxs_arctan2:
        "Elementwise `atan(a / b)` using the signs of both for the quadrant.";
    logaddexp, logaddexp_scalar, scalar_logaddexp => mlxs_logaddexp:
        "Elementwise `log(exp(a) + exp(b))`, computed stably.";
}

/// Rounds to `decimals` decimal places (half to even), as Python's `mx.round(a, decimals)`.
pub fn round(a: &Array, decimals: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("round", |o| unsafe {
        sys::mlxs_round(o, a.as_raw(), decimals, raw(s))
    })
}

/// Limits values to `[min, max]`; either bound may be `None`, not both. Bounds broadcast.
/// For Python's `mx.clip(a, 0.0, 1.0)` (weak scalar bounds) use [`clip_scalar`].
pub fn clip(
    a: &Array,
    min: Option<&Array>,
    max: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    if min.is_none() && max.is_none() {
        return Err(Error::invalid(
            "clip",
            "at least one of min and max is needed",
        ));
    }
    // SAFETY: live (or null) handles.
    array_out("clip", |o| unsafe {
        sys::mlxs_clip(o, a.as_raw(), opt_raw(min), opt_raw(max), raw(s))
    })
}

/// [`clip`] with weak scalar bounds, as Python's `mx.clip(a, a_min, a_max)` with numbers.
pub fn clip_scalar(
    a: &Array,
    min: Option<Scalar>,
    max: Option<Scalar>,
    s: Option<&Stream>,
) -> Result<Array> {
    let lo = min.map(|v| v.to_array_like(a.dtype())).transpose()?;
    let hi = max.map(|v| v.to_array_like(a.dtype())).transpose()?;
    clip(a, lo.as_ref(), hi.as_ref(), s)
}

/// `x` where `cond` is true, else `y` (all three broadcast; the result has the promoted
/// dtype of `x` and `y`).
pub fn where_(cond: &Array, x: &Array, y: &Array, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles.
    array_out("where", |o| unsafe {
        sys::mlxs_where(o, cond.as_raw(), x.as_raw(), y.as_raw(), raw(s))
    })
}

/// [`where_`] with `y` a weak scalar (Python's `mx.where(cond, x, 0.0)`).
pub fn where_scalar(
    cond: &Array,
    x: &Array,
    y: impl Into<Scalar>,
    s: Option<&Stream>,
) -> Result<Array> {
    where_(cond, x, &y.into().to_array_like(x.dtype())?, s)
}

/// Replaces NaN with `nan`, `+inf` with `posinf` and `-inf` with `neginf`; a `None` bound is
/// the dtype's largest (lowest) finite value. Python's defaults are `(0.0, None, None)`.
pub fn nan_to_num(
    a: &Array,
    nan: f32,
    posinf: Option<f32>,
    neginf: Option<f32>,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handle; plain values.
    array_out("nan_to_num", |o| unsafe {
        sys::mlxs_nan_to_num(
            o,
            a.as_raw(),
            nan,
            posinf.is_some(),
            posinf.unwrap_or(0.0),
            neginf.is_some(),
            neginf.unwrap_or(0.0),
            raw(s),
        )
    })
}

/// Elementwise `|a - b| <= atol + rtol * |b|` (bool result). Python's defaults are
/// `rtol = 1e-5`, `atol = 1e-8`, `equal_nan = false`.
pub fn isclose(
    a: &Array,
    b: &Array,
    rtol: f64,
    atol: f64,
    equal_nan: bool,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles.
    array_out("isclose", |o| unsafe {
        sys::mlxs_isclose(o, a.as_raw(), b.as_raw(), rtol, atol, equal_nan, raw(s))
    })
}

/// Whether every element is close ([`isclose`]); a 0-d bool array.
pub fn allclose(
    a: &Array,
    b: &Array,
    rtol: f64,
    atol: f64,
    equal_nan: bool,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles.
    array_out("allclose", |o| unsafe {
        sys::mlxs_allclose(o, a.as_raw(), b.as_raw(), rtol, atol, equal_nan, raw(s))
    })
}

/// Whether the arrays have the same shape and equal values (dtypes may differ); a 0-d bool.
pub fn array_equal(a: &Array, b: &Array, equal_nan: bool, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles.
    array_out("array_equal", |o| unsafe {
        sys::mlxs_array_equal(o, a.as_raw(), b.as_raw(), equal_nan, raw(s))
    })
}
