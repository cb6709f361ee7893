//! L1 against the Python oracle (mlx 0.32.4): every case in `tests/goldens/core.safetensors`
//! (written by `cargo xtask goldens core`) must match bit for bit.

use mlx_core::prelude::*;
use mlx_core::testing::{Case, Goldens};

fn dtype(c: &Case) -> Dtype {
    let name = c.str("dtype").expect("dtype");
    Dtype::from_name(match name {
        "i32" => "int32",
        "u8" => "uint8",
        "i8" => "int8",
        other => other,
    })
    .unwrap_or_else(|| panic!("unknown dtype {name}"))
}

fn scalar(c: &Case) -> Scalar {
    let v = c.str("scalar").expect("scalar");
    match v.parse::<i64>() {
        Ok(i) => Scalar::Int(i),
        Err(_) => Scalar::Float(v.parse::<f64>().expect("float scalar") as f32),
    }
}

fn run(c: &Case) -> Result<Vec<Array>> {
    let x = |i: usize| c.input(i).expect("input");
    let out = match c.op.as_str() {
        "add" => ops::add(x(0), x(1), None)?,
        "subtract" => ops::subtract(x(0), x(1), None)?,
        "multiply" => ops::multiply(x(0), x(1), None)?,
        "divide" => ops::divide(x(0), x(1), None)?,
        "maximum" => ops::maximum(x(0), x(1), None)?,
        "minimum" => ops::minimum(x(0), x(1), None)?,
        "power" => ops::power(x(0), x(1), None)?,
        "matmul" => ops::matmul(x(0), x(1), None)?,
        "multiply_scalar" => ops::multiply_scalar(x(0), scalar(c), None)?,
        "add_scalar" => ops::add_scalar(x(0), scalar(c), None)?,
        "rsub_scalar" => ops::subtract(&scalar(c).to_array_like(x(0).dtype())?, x(0), None)?,
        "div_scalar" => ops::divide(x(0), &scalar(c).to_array_like(x(0).dtype())?, None)?,
        "exp" => ops::exp(x(0), None)?,
        "log" => ops::log(x(0), None)?,
        "sqrt" => ops::sqrt(x(0), None)?,
        "rsqrt" => ops::rsqrt(x(0), None)?,
        "square" => ops::square(x(0), None)?,
        "sin" => ops::sin(x(0), None)?,
        "cos" => ops::cos(x(0), None)?,
        "tanh" => ops::tanh(x(0), None)?,
        "sigmoid" => ops::sigmoid(x(0), None)?,
        "erf" => ops::erf(x(0), None)?,
        "abs" => ops::abs(x(0), None)?,
        "negative" => ops::negative(x(0), None)?,
        "astype" => ops::astype(x(0), dtype(c), None)?,
        "arange" => ops::arange(
            c.float("start").expect("start"),
            c.float("stop").expect("stop"),
            c.float("step").expect("step"),
            dtype(c),
            None,
        )?,
        "full" => ops::full(&c.i32s("shape").expect("shape"), x(0), dtype(c), None)?,
        "reshape" => ops::reshape(x(0), &c.i32s("shape").expect("shape"), None)?,
        other => panic!("case {}: no runner for op {other}", c.name),
    };
    Ok(vec![out])
}

#[test]
fn core_ops_match_the_oracle_bit_for_bit() {
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/core.safetensors"
    ))
    .unwrap();
    if let Err(e) = g.check_all(101, run) {
        panic!("{e}");
    }
}
