//! L1 against the Python oracle (mlx 0.32.4): every case in `tests/goldens/ops.safetensors`
//! (written by `cargo xtask goldens ops` from `xtask/oracle/goldens_ops.py`) replayed through
//! `mlx_core::ops` must match bit for bit.

use mlx_core::prelude::*;
use mlx_core::testing::{Case, Goldens};

type Unary = fn(&Array, Option<&Stream>) -> Result<Array>;
type Binary = fn(&Array, &Array, Option<&Stream>) -> Result<Array>;
type WithScalar = fn(&Array, Scalar, Option<&Stream>) -> Result<Array>;
type ScalarWith = fn(Scalar, &Array, Option<&Stream>) -> Result<Array>;
type Reduce = fn(&Array, &[i32], bool, Option<&Stream>) -> Result<Array>;
type ReduceAll = fn(&Array, bool, Option<&Stream>) -> Result<Array>;
type Scan = fn(&Array, i32, bool, bool, Option<&Stream>) -> Result<Array>;

fn unary(op: &str) -> Option<Unary> {
    Some(match op {
        "abs" => ops::abs,
        "negative" => ops::negative,
        "sign" => ops::sign,
        "exp" => ops::exp,
        "expm1" => ops::expm1,
        "log" => ops::log,
        "log1p" => ops::log1p,
        "log2" => ops::log2,
        "log10" => ops::log10,
        "sqrt" => ops::sqrt,
        "rsqrt" => ops::rsqrt,
        "square" => ops::square,
        "reciprocal" => ops::reciprocal,
        "sin" => ops::sin,
        "cos" => ops::cos,
        "tan" => ops::tan,
        "tanh" => ops::tanh,
        "sinh" => ops::sinh,
        "cosh" => ops::cosh,
        "arcsin" => ops::arcsin,
        "arccos" => ops::arccos,
        "arctan" => ops::arctan,
        "arcsinh" => ops::arcsinh,
        "arccosh" => ops::arccosh,
        "arctanh" => ops::arctanh,
        "degrees" => ops::degrees,
        "radians" => ops::radians,
        "sigmoid" => ops::sigmoid,
        "erf" => ops::erf,
        "erfinv" => ops::erfinv,
        "floor" => ops::floor,
        "ceil" => ops::ceil,
        "trunc" => ops::trunc,
        "isnan" => ops::isnan,
        "isinf" => ops::isinf,
        "isfinite" => ops::isfinite,
        "isposinf" => ops::isposinf,
        "isneginf" => ops::isneginf,
        "logical_not" => ops::logical_not,
        "bitwise_invert" => ops::bitwise_invert,
        "stop_gradient" => ops::stop_gradient,
        "copy" => ops::copy,
        "zeros_like" => ops::zeros_like,
        "ones_like" => ops::ones_like,
        "transpose_all" => ops::transpose_all,
        "squeeze_all" => ops::squeeze_all,
        "t" => |a, _| a.t(),
        _ => return None,
    })
}

/// Binary ops with their `*_scalar` and `scalar_*` forms.
macro_rules! binary_table {
    ($($name:ident, $lhs:ident, $rhs:ident;)*) => {
        fn binary(op: &str) -> Option<Binary> {
            match op {
                $(stringify!($name) => Some(ops::$name),)*
                "matmul" => Some(ops::matmul),
                "outer" => Some(ops::outer),
                "inner" => Some(ops::inner),
                "kron" => Some(ops::kron),
                _ => None,
            }
        }
        fn with_scalar(op: &str) -> Option<WithScalar> {
            match op {
                $(stringify!($lhs) => Some(|a, v, s| ops::$lhs(a, v, s)),)*
                _ => None,
            }
        }
        fn scalar_with(op: &str) -> Option<ScalarWith> {
            match op {
                $(stringify!($rhs) => Some(|v, b, s| ops::$rhs(v, b, s)),)*
                _ => None,
            }
        }
    };
}

binary_table! {
    add, add_scalar, scalar_add;
    subtract, subtract_scalar, scalar_subtract;
    multiply, multiply_scalar, scalar_multiply;
    divide, divide_scalar, scalar_divide;
    floor_divide, floor_divide_scalar, scalar_floor_divide;
    remainder, remainder_scalar, scalar_remainder;
    power, power_scalar, scalar_power;
    maximum, maximum_scalar, scalar_maximum;
    minimum, minimum_scalar, scalar_minimum;
    equal, equal_scalar, scalar_equal;
    not_equal, not_equal_scalar, scalar_not_equal;
    less, less_scalar, scalar_less;
    less_equal, less_equal_scalar, scalar_less_equal;
    greater, greater_scalar, scalar_greater;
    greater_equal, greater_equal_scalar, scalar_greater_equal;
    logical_and, logical_and_scalar, scalar_logical_and;
    logical_or, logical_or_scalar, scalar_logical_or;
    logical_xor, logical_xor_scalar, scalar_logical_xor;
    bitwise_and, bitwise_and_scalar, scalar_bitwise_and;
    bitwise_or, bitwise_or_scalar, scalar_bitwise_or;
    bitwise_xor, bitwise_xor_scalar, scalar_bitwise_xor;
    left_shift, left_shift_scalar, scalar_left_shift;
    right_shift, right_shift_scalar, scalar_right_shift;
    arctan2, arctan2_scalar, scalar_arctan2;
    logaddexp, logaddexp_scalar, scalar_logaddexp;
}

fn reduce(op: &str) -> Option<Reduce> {
    Some(match op {
        "sum" => ops::sum,
        "mean" => ops::mean,
        "max" => ops::max,
        "min" => ops::min,
        "prod" => ops::prod,
        "all" => ops::all,
        "any" => ops::any,
        "logsumexp" => ops::logsumexp,
        _ => return None,
    })
}

fn reduce_all(op: &str) -> Option<ReduceAll> {
    Some(match op {
        "sum_all" => ops::sum_all,
        "mean_all" => ops::mean_all,
        "max_all" => ops::max_all,
        "min_all" => ops::min_all,
        "prod_all" => ops::prod_all,
        "all_all" => ops::all_all,
        "any_all" => ops::any_all,
        "logsumexp_all" => ops::logsumexp_all,
        "argmax_all" => ops::argmax_all,
        "argmin_all" => ops::argmin_all,
        _ => return None,
    })
}

fn scan(op: &str) -> Option<Scan> {
    Some(match op {
        "cumsum" => ops::cumsum,
        "cumprod" => ops::cumprod,
        "cummax" => ops::cummax,
        "cummin" => ops::cummin,
        "logcumsumexp" => ops::logcumsumexp,
        _ => return None,
    })
}

fn tag_dtype(tag: &str) -> Result<Dtype> {
    let name = match tag {
        "i32" => "int32",
        "u8" => "uint8",
        "i8" => "int8",
        "i16" => "int16",
        "u32" => "uint32",
        "i64" => "int64",
        other => other,
    };
    Dtype::from_name(name).ok_or_else(|| Error::InvalidArgument {
        op: "goldens_ops",
        message: format!("unknown dtype tag {tag}"),
    })
}

fn parse_scalar(v: &str) -> Scalar {
    match v {
        "true" => Scalar::Bool(true),
        "false" => Scalar::Bool(false),
        _ => match v.parse::<i64>() {
            Ok(i) => Scalar::Int(i),
            Err(_) => Scalar::Float(v.parse::<f64>().expect("float scalar") as f32),
        },
    }
}

fn run(c: &Case) -> Result<Vec<Array>> {
    let x = |i: usize| c.input(i);
    let i32p = |k: &str| -> Result<i32> { Ok(c.int(k)? as i32) };
    let f32p = |k: &str| -> Result<f32> { Ok(c.float(k)? as f32) };
    let opt_f32 = |k: &str| -> Result<Option<f32>> {
        if c.has(k) {
            Ok(Some(f32p(k)?))
        } else {
            Ok(None)
        }
    };
    let opt_scalar = |k: &str| -> Result<Option<Scalar>> {
        Ok(if c.has(k) {
            Some(parse_scalar(c.str(k)?))
        } else {
            None
        })
    };
    let scalar = || -> Result<Scalar> { Ok(parse_scalar(c.str("scalar")?)) };
    let dtype = || -> Result<Dtype> { tag_dtype(c.str("dtype")?) };
    let inputs: Vec<&Array> = c.inputs.iter().collect();
    let op = c.op.as_str();

    if let Some(f) = unary(op) {
        return Ok(vec![f(x(0)?, None)?]);
    }
    if let Some(f) = binary(op) {
        return Ok(vec![f(x(0)?, x(1)?, None)?]);
    }
    if let Some(f) = with_scalar(op) {
        return Ok(vec![f(x(0)?, scalar()?, None)?]);
    }
    if let Some(f) = scalar_with(op) {
        return Ok(vec![f(scalar()?, x(0)?, None)?]);
    }
    if let Some(f) = reduce(op) {
        return Ok(vec![f(x(0)?, &c.i32s("axes")?, c.bool("keepdims")?, None)?]);
    }
    if let Some(f) = reduce_all(op) {
        return Ok(vec![f(x(0)?, c.bool("keepdims")?, None)?]);
    }
    if let Some(f) = scan(op) {
        return Ok(vec![f(
            x(0)?,
            i32p("axis")?,
            c.bool("reverse")?,
            c.bool("inclusive")?,
            None,
        )?]);
    }

    let out = match op {
        // ---- elementwise with parameters
        "expr_mul_add" => ((x(0)? * 0.5)? + 1)?,
        "where" => ops::where_(x(0)?, x(1)?, x(2)?, None)?,
        "where_scalar" => ops::where_scalar(x(0)?, x(1)?, scalar()?, None)?,
        "clip" => {
            let (has_min, has_max) = (c.bool("min")?, c.bool("max")?);
            let lo = has_min.then(|| x(1)).transpose()?;
            let hi = has_max
                .then(|| x(if has_min { 2 } else { 1 }))
                .transpose()?;
            ops::clip(x(0)?, lo, hi, None)?
        }
        "clip_scalar" => ops::clip_scalar(x(0)?, opt_scalar("lo")?, opt_scalar("hi")?, None)?,
        "round" => ops::round(x(0)?, i32p("decimals")?, None)?,
        "nan_to_num" => ops::nan_to_num(
            x(0)?,
            f32p("nan")?,
            opt_f32("posinf")?,
            opt_f32("neginf")?,
            None,
        )?,
        "isclose" => ops::isclose(
            x(0)?,
            x(1)?,
            c.float("rtol")?,
            c.float("atol")?,
            c.bool("equal_nan")?,
            None,
        )?,
        "allclose" => ops::allclose(
            x(0)?,
            x(1)?,
            c.float("rtol")?,
            c.float("atol")?,
            c.bool("equal_nan")?,
            None,
        )?,
        "array_equal" => ops::array_equal(x(0)?, x(1)?, c.bool("equal_nan")?, None)?,

        // ---- reductions with parameters
        "argmax" => ops::argmax(x(0)?, i32p("axis")?, c.bool("keepdims")?, None)?,
        "argmin" => ops::argmin(x(0)?, i32p("axis")?, c.bool("keepdims")?, None)?,
        "var" => ops::var(
            x(0)?,
            &c.i32s("axes")?,
            c.bool("keepdims")?,
            i32p("ddof")?,
            None,
        )?,
        "std" => ops::std(
            x(0)?,
            &c.i32s("axes")?,
            c.bool("keepdims")?,
            i32p("ddof")?,
            None,
        )?,
        "var_all" => ops::var_all(x(0)?, c.bool("keepdims")?, i32p("ddof")?, None)?,
        "std_all" => ops::std_all(x(0)?, c.bool("keepdims")?, i32p("ddof")?, None)?,
        "softmax" => ops::softmax(x(0)?, &c.i32s("axes")?, c.bool("precise")?, None)?,
        "softmax_all" => ops::softmax_all(x(0)?, c.bool("precise")?, None)?,

        // ---- shape
        "reshape" => ops::reshape(x(0)?, &c.i32s("shape")?, None)?,
        "flatten" => ops::flatten(x(0)?, i32p("start")?, i32p("end")?, None)?,
        "unflatten" => ops::unflatten(x(0)?, i32p("axis")?, &c.i32s("shape")?, None)?,
        "transpose" => ops::transpose(x(0)?, &c.i32s("axes")?, None)?,
        "swapaxes" => ops::swapaxes(x(0)?, i32p("axis1")?, i32p("axis2")?, None)?,
        "moveaxis" => ops::moveaxis(x(0)?, i32p("source")?, i32p("destination")?, None)?,
        "expand_dims" => ops::expand_dims(x(0)?, &c.i32s("axes")?, None)?,
        "squeeze" => ops::squeeze(x(0)?, &c.i32s("axes")?, None)?,
        "broadcast_to" => ops::broadcast_to(x(0)?, &c.i32s("shape")?, None)?,
        "broadcast_arrays" => return ops::broadcast_arrays(&inputs, None),
        "concatenate" => ops::concatenate(&inputs, i32p("axis")?, None)?,
        "stack" => ops::stack(&inputs, i32p("axis")?, None)?,
        "split_equal" => return ops::split_equal(x(0)?, i32p("n")?, i32p("axis")?, None),
        "split_at" => return ops::split_at(x(0)?, &c.i32s("indices")?, i32p("axis")?, None),
        "repeat" => ops::repeat(x(0)?, i32p("repeats")?, i32p("axis")?, None)?,
        "repeat_flat" => ops::repeat_flat(x(0)?, i32p("repeats")?, None)?,
        "tile" => ops::tile(x(0)?, &c.i32s("reps")?, None)?,
        "flip" => ops::flip(x(0)?, &c.i32s("axes")?, None)?,
        "roll" => ops::roll(x(0)?, &c.i32s("shift")?, &c.i32s("axes")?, None)?,
        "pad" => ops::pad(
            x(0)?,
            &c.i32s("axes")?,
            &c.i32s("low")?,
            &c.i32s("high")?,
            x(1)?,
            c.str("mode")?,
            None,
        )?,
        "pad_widths" => {
            let widths: Vec<(i32, i32)> = c.i32s("low")?.into_iter().zip(c.i32s("high")?).collect();
            ops::pad_widths(x(0)?, &widths, x(1)?, c.str("mode")?, None)?
        }

        // ---- slicing and indexing
        "slice" => ops::slice(
            x(0)?,
            &c.i32s("start")?,
            &c.i32s("stop")?,
            &c.i32s("strides")?,
            None,
        )?,
        "slice_axis" => x(0)?.slice_axis(i32p("axis")?, i32p("start")?, i32p("stop")?)?,
        "slice_update" => ops::slice_update(
            x(0)?,
            x(1)?,
            &c.i32s("start")?,
            &c.i32s("stop")?,
            &c.i32s("strides")?,
            None,
        )?,
        "slice_dynamic" => {
            ops::slice_dynamic(x(0)?, x(1)?, &c.i32s("axes")?, &c.i32s("slice_size")?, None)?
        }
        "slice_update_dynamic" => {
            ops::slice_update_dynamic(x(0)?, x(1)?, x(2)?, &c.i32s("axes")?, None)?
        }
        "take" => ops::take(x(0)?, x(1)?, i32p("axis")?, None)?,
        "take_flat" => ops::take_flat(x(0)?, x(1)?, None)?,
        "take_along_axis" => ops::take_along_axis(x(0)?, x(1)?, i32p("axis")?, None)?,
        "put_along_axis" => ops::put_along_axis(x(0)?, x(1)?, x(2)?, i32p("axis")?, None)?,
        "scatter" | "scatter_add" => {
            let n = inputs.len();
            let (idx, upd) = (&inputs[1..n - 1], inputs[n - 1]);
            let axes = c.i32s("axes")?;
            if op == "scatter" {
                ops::scatter(x(0)?, idx, upd, &axes, None)?
            } else {
                ops::scatter_add(x(0)?, idx, upd, &axes, None)?
            }
        }

        // ---- products, convolutions, triangles, sorting
        "addmm" => ops::addmm(x(0)?, x(1)?, x(2)?, f32p("alpha")?, f32p("beta")?, None)?,
        "tensordot" => ops::tensordot(x(0)?, x(1)?, &c.i32s("axes_a")?, &c.i32s("axes_b")?, None)?,
        "tensordot_n" => ops::tensordot_n(x(0)?, x(1)?, i32p("n")?, None)?,
        "conv1d" => ops::conv1d(
            x(0)?,
            x(1)?,
            i32p("stride")?,
            i32p("padding")?,
            i32p("dilation")?,
            i32p("groups")?,
            None,
        )?,
        "conv2d" => {
            let pair = |k: &str| -> Result<(i32, i32)> {
                let v = c.i32s(k)?;
                Ok((v[0], v[1]))
            };
            ops::conv2d(
                x(0)?,
                x(1)?,
                pair("stride")?,
                pair("padding")?,
                pair("dilation")?,
                i32p("groups")?,
                None,
            )?
        }
        "tril" => ops::tril(x(0)?, i32p("k")?, None)?,
        "triu" => ops::triu(x(0)?, i32p("k")?, None)?,
        "sort" => ops::sort(x(0)?, i32p("axis")?, None)?,
        "argsort" => ops::argsort(x(0)?, i32p("axis")?, None)?,
        "partition" => ops::partition(x(0)?, i32p("kth")?, i32p("axis")?, None)?,
        "argpartition" => ops::argpartition(x(0)?, i32p("kth")?, i32p("axis")?, None)?,
        "topk" => ops::topk(x(0)?, i32p("k")?, i32p("axis")?, None)?,

        // ---- creation
        "zeros" => ops::zeros(&c.i32s("shape")?, dtype()?, None)?,
        "ones" => ops::ones(&c.i32s("shape")?, dtype()?, None)?,
        "full" => {
            let dt = if c.has("dtype") { Some(dtype()?) } else { None };
            ops::full_scalar(&c.i32s("shape")?, scalar()?, dt, None)?
        }
        // Python ignores `dtype` when the value is an array (see `ops::full`).
        "full_array" => ops::full(&c.i32s("shape")?, x(0)?, x(0)?.dtype(), None)?,
        "full_like" => {
            let dt = if c.has("dtype") { Some(dtype()?) } else { None };
            let vals = scalar()?.to_array_like(dt.unwrap_or(x(0)?.dtype()))?;
            ops::full_like(x(0)?, &vals, dt, None)?
        }
        "eye" => ops::eye(i32p("n")?, i32p("m")?, i32p("k")?, dtype()?, None)?,
        "identity" => ops::identity(i32p("n")?, dtype()?, None)?,
        "tri" => ops::tri(i32p("n")?, i32p("m")?, i32p("k")?, dtype()?, None)?,
        "arange" => ops::arange(
            c.float("start")?,
            c.float("stop")?,
            c.float("step")?,
            dtype()?,
            None,
        )?,
        "linspace" => ops::linspace(
            c.float("start")?,
            c.float("stop")?,
            i32p("num")?,
            c.bool("endpoint")?,
            dtype()?,
            None,
        )?,
        "meshgrid" => return ops::meshgrid(&inputs, c.bool("sparse")?, c.str("indexing")?, None),

        // ---- type
        "astype" => ops::astype(x(0)?, dtype()?, None)?,
        "view" => ops::view(x(0)?, dtype()?, None)?,
        "contiguous" => ops::contiguous(x(0)?, c.bool("allow_col_major")?, None)?,
        "hadamard_transform" => ops::hadamard_transform(x(0)?, opt_f32("scale")?, None)?,

        other => {
            return Err(Error::InvalidArgument {
                op: "goldens_ops",
                message: format!("case {}: no runner for op {other}", c.name),
            })
        }
    };
    Ok(vec![out])
}

#[test]
fn ops_match_the_oracle_bit_for_bit() {
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/ops.safetensors"
    ))
    .unwrap();
    if let Err(e) = g.check_all(1001, run) {
        panic!("{e}");
    }
}

/// Every op family the generator covers has cases (a guard against a generator edit that
/// silently drops a family).
#[test]
fn every_family_has_cases() {
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/ops.safetensors"
    ))
    .unwrap();
    let cases = g.cases().unwrap();
    let ops: std::collections::BTreeSet<&str> = cases.iter().map(|c| c.op.as_str()).collect();
    for op in [
        "abs",
        "erfinv",
        "add",
        "remainder",
        "left_shift",
        "add_scalar",
        "scalar_subtract",
        "where_scalar",
        "clip_scalar",
        "round",
        "nan_to_num",
        "isclose",
        "sum",
        "sum_all",
        "argmax",
        "logsumexp",
        "softmax",
        "var",
        "std",
        "cumsum",
        "logcumsumexp",
        "reshape",
        "concatenate",
        "split_at",
        "pad",
        "slice",
        "slice_update",
        "slice_dynamic",
        "slice_update_dynamic",
        "take",
        "take_along_axis",
        "put_along_axis",
        "scatter_add",
        "matmul",
        "addmm",
        "conv1d",
        "conv2d",
        "argsort",
        "topk",
        "arange",
        "linspace",
        "eye",
        "view",
        "meshgrid",
    ] {
        assert!(ops.contains(op), "no golden cases for {op}");
    }
}
