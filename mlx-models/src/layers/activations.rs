//! Activations as `mlx.nn` and mlx-lm's `activations.py` define them. mlx.nn and mlx-lm
//! compile `silu`, `swiglu`, `precise_swiglu`, `swiglu_oai`, `gelu`, `gelu_approx` and
//! gemma4's `geglu` with `mx.compile(shapeless=True)`, so on a GPU each is one fused kernel (one graph node) where
//! the plain ops would be several; they are compiled here too
//! ([`compiled`]), with the same ops inside, so the bits are those of the plain ops (the model
//! goldens check it on the CPU). The others run uncompiled, as mlx-lm runs them.

use mlx_core::prelude::*;

/// `x * sigmoid(x)` as plain ops (the body `silu` compiles).
fn silu_ops(x: &Array) -> Result<Array> {
    x * &ops::sigmoid(x, None)?
}

/// A compiled function of this thread (shapeless unless `shapeless = false` is given), made on
/// first use: the crate's one way to hold an `mx.compile`d helper of mlx-lm. MLX keeps compile
/// caches per thread, so each thread has its own; each is leaked on purpose (a few hundred
/// bytes per thread): dropping it at thread exit would erase its entry from MLX's thread-local
/// compile cache, which may already be gone by then.
macro_rules! compiled {
    ($body:expr) => {
        $crate::layers::activations::compiled!($body, shapeless = true)
    };
    ($body:expr, shapeless = $shapeless:expr) => {{
        thread_local! {
            static F: std::cell::OnceCell<&'static Compiled<'static>> =
                const { std::cell::OnceCell::new() };
        }
        F.with(|cell| -> Result<&'static Compiled<'static>> {
            if let Some(f) = cell.get() {
                return Ok(*f);
            }
            let f: &'static Compiled<'static> = Box::leak(Box::new(compile($body, $shapeless)?));
            Ok(*cell.get_or_init(|| f))
        })
    }};
}
pub(crate) use compiled;

/// The single output of a compiled function.
pub(crate) fn one(out: Vec<Array>, what: &str) -> Result<Array> {
    out.into_iter()
        .next()
        .ok_or_else(|| Error::Callback(format!("compiled {what} returned nothing")))
}

/// `nn.silu`: `x * sigmoid(x)`, compiled shapeless as in mlx.nn.
pub fn silu(x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| Ok(vec![silu_ops(&xs[0])?]))?;
    one(f.call(std::slice::from_ref(x))?, "silu")
}

/// mlx-lm's `swiglu(gate, x)`: `silu(gate) * x`, compiled shapeless as mlx-lm compiles it
/// (its inner `nn.silu` is inlined into the same trace).
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| Ok(vec![(&silu_ops(&xs[0])? * &xs[1])?]))?;
    one(f.call(&[gate.clone(), x.clone()])?, "swiglu")
}

/// mlx-lm's `precise_swiglu(h, gate, x)`: `silu(gate.astype(float32)) * x.astype(float32)`,
/// cast to `h`'s dtype; compiled shapeless as mlx-lm compiles it (`h` is an input of the
/// trace, as there, read only for its dtype).
pub fn precise_swiglu(h: &Array, gate: &Array, x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let gate = silu_ops(&xs[1].astype(Dtype::Float32)?)?;
        let x = xs[2].astype(Dtype::Float32)?;
        Ok(vec![(&gate * &x)?.astype(xs[0].dtype())?])
    })?;
    one(
        f.call(&[h.clone(), gate.clone(), x.clone()])?,
        "precise_swiglu",
    )
}

/// mlx-lm's `swiglu_oai(gate, x)` (gpt_oss's `SwigluOAI`, alpha 1.702, limit 7): the gate
/// clipped from above, the linear part clipped both ways and offset by one,
/// `(x + 1) * (gate * sigmoid(alpha * gate))`; compiled shapeless as mlx-lm compiles it, the
/// two constants weak scalars of the trace.
pub fn swiglu_oai(gate: &Array, x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let (alpha, limit) = (1.702f32, 7.0f32);
        let gate = ops::minimum_scalar(&xs[0], limit, None)?;
        let x = ops::clip_scalar(&xs[1], Some((-limit).into()), Some(limit.into()), None)?;
        let x1 = ops::add_scalar(&x, 1.0f32, None)?;
        let glu = (&gate * &ops::sigmoid(&ops::scalar_multiply(alpha, &gate, None)?, None)?)?;
        Ok(vec![(&x1 * &glu)?])
    })?;
    one(f.call(&[gate.clone(), x.clone()])?, "swiglu_oai")
}

/// `nn.relu2` (and nemotron's `relu_squared`): `square(maximum(x, 0))`, compiled shapeless as
/// mlx.nn / mlx-lm compile it.
pub fn relu2(x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let x = &xs[0];
        let r = ops::maximum(x, &Scalar::Int(0).to_array_like(x.dtype())?, None)?;
        Ok(vec![ops::square(&r, None)?])
    })?;
    one(f.call(std::slice::from_ref(x))?, "relu2")
}

/// mlx-lm's `xielu(x, alpha_p, alpha_n, beta, eps)` (Apertus), compiled shapeless as mlx-lm
/// compiles it, the four learned scalars inputs of the trace.
pub fn xielu(
    x: &Array,
    alpha_p: &Array,
    alpha_n: &Array,
    beta: &Array,
    eps: &Array,
) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let (x, alpha_p, alpha_n, beta, eps) = (&xs[0], &xs[1], &xs[2], &xs[3], &xs[4]);
        // nn.softplus(a) = logaddexp(a, 0), the 0 a weak Python int.
        let softplus =
            |a: &Array| ops::logaddexp(a, &Scalar::Int(0).to_array_like(a.dtype())?, None);
        let alpha_p = softplus(alpha_p)?;
        let alpha_n = (beta + &softplus(alpha_n)?)?;
        let cond = ops::greater(x, &Scalar::Int(0).to_array_like(x.dtype())?, None)?;
        let pos = (&(&alpha_p * &ops::square(x, None)?)? + &(beta * x)?)?;
        let neg = (&(&(&ops::expm1(&ops::minimum(x, eps, None)?, None)? - x)? * &alpha_n)?
            + &(beta * x)?)?;
        Ok(vec![ops::where_(&cond, &pos, &neg, None)?])
    })?;
    one(
        f.call(&[
            x.clone(),
            alpha_p.clone(),
            alpha_n.clone(),
            beta.clone(),
            eps.clone(),
        ])?,
        "xielu",
    )
}

/// gemma3_text's `clip_residual(x, y)`: `x + y`, or for float16 the sum in float32 clipped to
/// float16's range and cast back; compiled shapeless as mlx-lm compiles it.
pub fn clip_residual(x: &Array, y: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let (x, y) = (&xs[0], &xs[1]);
        if x.dtype() != Dtype::Float16 {
            return Ok(vec![(x + y)?]);
        }
        let bound = 65504.0f32;
        let sum = (&x.astype(Dtype::Float32)? + &y.astype(Dtype::Float32)?)?;
        let lo = Array::from_f32(-bound, Dtype::Float32)?;
        let hi = Array::from_f32(bound, Dtype::Float32)?;
        Ok(vec![
            ops::clip(&sum, Some(&lo), Some(&hi), None)?.astype(Dtype::Float16)?
        ])
    })?;
    one(f.call(&[x.clone(), y.clone()])?, "clip_residual")
}

/// `nn.gelu`: `x * (1 + erf(x / sqrt(2))) / 2`, compiled shapeless as in mlx.nn.
pub fn gelu(x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| Ok(vec![gelu_ops(&xs[0])?]))?;
    one(f.call(std::slice::from_ref(x))?, "gelu")
}

/// `nn.gelu_approx`: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`, compiled
/// shapeless as in mlx.nn.
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| Ok(vec![gelu_approx_ops(&xs[0])?]))?;
    one(f.call(std::slice::from_ref(x))?, "gelu_approx")
}

/// `geglu(gate, x)` (gemma4_text's, compiled shapeless there): `gelu_approx(gate) * x`.
pub fn geglu(gate: &Array, x: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| Ok(vec![(&gelu_approx_ops(&xs[0])? * &xs[1])?]))?;
    one(f.call(&[gate.clone(), x.clone()])?, "geglu")
}

/// gemma3n's `gelu_topk(inputs, std_multiplier)` (activation sparsity): `gelu_approx` of
/// `maximum(0, inputs - (mean + std * std_multiplier))` over the last axis, compiled shapeless
/// as gemma3n.py compiles it (its inner `nn.gelu_approx` inlined into the same trace; the
/// float32 multiplier cast to the std's dtype).
pub fn gelu_topk(inputs: &Array, std_multiplier: &Array) -> Result<Array> {
    let f = compiled!(|xs: &[Array]| {
        let x = &xs[0];
        let mean = ops::mean(x, &[-1], true, None)?;
        let std = ops::std(x, &[-1], true, 0, None)?;
        let cutoff = (&mean + &(&std * &xs[1].astype(std.dtype())?)?)?;
        let d = (x - &cutoff)?;
        let r = ops::maximum(&Scalar::Int(0).to_array_like(d.dtype())?, &d, None)?;
        Ok(vec![gelu_approx_ops(&r)?])
    })?;
    one(
        f.call(&[inputs.clone(), std_multiplier.clone()])?,
        "gelu_topk",
    )
}

/// `tanh(x / cap) * cap` in plain ops, `cap` a weak scalar: the soft cap that mlx-lm writes
/// inline (gemma2's attention scores and logits, grok's, gear's, recurrent_gemma's logits,
/// Laguna's router). gemma4_text's compiled one is [`logit_softcap`].
pub fn softcap(x: &Array, cap: f32) -> Result<Array> {
    let t = ops::tanh(&ops::divide_scalar(x, cap, None)?, None)?;
    ops::multiply_scalar(&t, cap, None)
}

/// gemma4_text's `logit_softcap(softcap, x)`: `tanh(x / softcap) * softcap`, compiled
/// shapeless there with `softcap` a constant of the trace; here one compiled function per
/// distinct `softcap` and thread (leaked like the others: a model has one).
pub fn logit_softcap(softcap: f64, x: &Array) -> Result<Array> {
    type Table = std::collections::HashMap<u64, &'static Compiled<'static>>;
    thread_local! {
        static F: std::cell::RefCell<Table> = std::cell::RefCell::new(Table::new());
    }
    let f = F.with(|table| -> Result<&'static Compiled<'static>> {
        if let Some(f) = table.borrow().get(&softcap.to_bits()) {
            return Ok(*f);
        }
        let body = move |xs: &[Array]| -> Result<Vec<Array>> {
            let t = ops::tanh(&ops::divide_scalar(&xs[0], softcap, None)?, None)?;
            Ok(vec![ops::multiply_scalar(&t, softcap, None)?])
        };
        let f: &'static Compiled<'static> = Box::leak(Box::new(compile(body, true)?));
        table.borrow_mut().insert(softcap.to_bits(), f);
        Ok(f)
    })?;
    one(f.call(std::slice::from_ref(x))?, "logit_softcap")
}

/// The body `gelu` compiles.
fn gelu_ops(x: &Array) -> Result<Array> {
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

/// The body `gelu_approx` compiles.
fn gelu_approx_ops(x: &Array) -> Result<Array> {
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

/// kimi_k3's `_situ(x, gate, beta, linear_beta)`: `beta * tanh(gate / beta) * sigmoid(gate)`
/// times `x` (first `linear_beta * tanh(x / linear_beta)` when given), in float32, cast back
/// to `x`'s dtype; compiled shapeless there with `beta` and `linear_beta` constants of the
/// trace, so here one compiled function per pair and thread.
pub fn situ(x: &Array, gate: &Array, beta: f64, linear_beta: Option<f64>) -> Result<Array> {
    type Key = (u64, Option<u64>);
    type Table = std::collections::HashMap<Key, &'static Compiled<'static>>;
    thread_local! {
        static F: std::cell::RefCell<Table> = std::cell::RefCell::new(Table::new());
    }
    let key = (beta.to_bits(), linear_beta.map(f64::to_bits));
    let f = F.with(|table| -> Result<&'static Compiled<'static>> {
        if let Some(f) = table.borrow().get(&key) {
            return Ok(*f);
        }
        let body = move |xs: &[Array]| -> Result<Vec<Array>> {
            let dtype = xs[0].dtype();
            let gate = xs[1].astype(Dtype::Float32)?;
            let mut x = xs[0].astype(Dtype::Float32)?;
            let t = ops::tanh(&ops::divide_scalar(&gate, beta, None)?, None)?;
            let a = (&ops::multiply_scalar(&t, beta, None)? * &ops::sigmoid(&gate, None)?)?;
            if let Some(lb) = linear_beta {
                let t = ops::tanh(&ops::divide_scalar(&x, lb, None)?, None)?;
                x = ops::multiply_scalar(&t, lb, None)?;
            }
            Ok(vec![(&a * &x)?.astype(dtype)?])
        };
        let f: &'static Compiled<'static> = Box::leak(Box::new(compile(body, true)?));
        table.borrow_mut().insert(key, f);
        Ok(f)
    })?;
    one(f.call(&[x.clone(), gate.clone()])?, "situ")
}
