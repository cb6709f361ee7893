//! Activations as `mlx.nn` and mlx-lm's `activations.py` define them. mlx-lm compiles these
//! with `mx.compile(shapeless=True)`; on MLX's CPU backend the compiled and uncompiled graphs
//! give identical bits (checked by the model goldens), so they run uncompiled here.

use mlx_core::prelude::*;

/// `nn.silu`: `x * sigmoid(x)`.
pub fn silu(x: &Array) -> Result<Array> {
    x * &ops::sigmoid(x, None)?
}

/// mlx-lm's `swiglu(gate, x)`: `silu(gate) * x`.
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    &silu(gate)? * x
}

/// `nn.gelu`: `x * (1 + erf(x / sqrt(2))) / 2`.
pub fn gelu(x: &Array) -> Result<Array> {
    let inner = ops::erf(
        &ops::divide(
            x,
            &Scalar::from(std::f64::consts::SQRT_2).to_array_like(x.dtype())?,
            None,
        )?,
        None,
    )?;
    let one_plus = (1.0f32 + &inner)?;
    &(x * &one_plus)? / 2.0f32
}

/// `nn.gelu_approx`: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`.
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let x3 = ops::power(x, &Scalar::Int(3).to_array_like(x.dtype())?, None)?;
    let inner = (x + &(0.044715f32 * &x3)?)?;
    let c = (2.0f64 / std::f64::consts::PI).sqrt();
    let t = ops::tanh(
        &ops::multiply(&Scalar::from(c).to_array_like(x.dtype())?, &inner, None)?,
        None,
    )?;
    let half_x = (0.5f32 * x)?;
    &half_x * &(1.0f32 + &t)?
}
