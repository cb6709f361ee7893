//! Gradients agree with central finite differences, in float64 on the CPU.
//!
//! For every input element: (f(x + h e) - f(x - h e)) / 2h, compared with the autodiff
//! gradient as |fd - grad| <= tol * max(1, |grad|).
//!
//! Tight: functions of ops that MLX 0.32.4 computes to full float64 precision on the CPU
//! (arithmetic, matmul, tanh, log, sqrt, rsqrt, power): h = 1e-5, tol = 1e-7 (truncation
//! O(h^2 |f'''|) ~ 1e-10, rounding O(eps64 |f| / h) ~ 1e-11).
//!
//! Loose: MLX 0.32.4's CPU kernels for exp, sin, cos, erf (and sigmoid, through exp) on
//! float64 are only float32-accurate (`exp(1.0)` gives 2.7182817459106445), so finite
//! differences of functions using them carry a rounding error of about eps32 |f| / h:
//! h = 1e-3, tol = 2e-4 (rounding ~6e-5, truncation ~2e-7). The tight cases show that the
//! gradient machinery is exact; the loose ones that these ops' derivative rules are right.

use mlx_core::prelude::*;

/// (h, tol) for functions of full-precision float64 ops.
const TIGHT: (f64, f64) = (1e-5, 1e-7);
/// (h, tol) for functions using exp/sin/cos/erf/sigmoid (float32-accurate on float64).
const LOOSE: (f64, f64) = (1e-3, 2e-4);

fn sum2(x: &Array) -> Result<Array> {
    let s = x.shape();
    let l = ops::ones(&[1, s[0]], x.dtype(), None)?;
    let r = ops::ones(&[s[1], 1], x.dtype(), None)?;
    l.matmul(x)?.matmul(&r)?.reshape(&[])
}

fn f64s(v: &[f64], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

/// Checks value_and_grad(f, all inputs) against central differences of f.
fn check<F: Fn(&[Array]) -> Result<Vec<Array>>>(
    name: &str,
    (h, tol): (f64, f64),
    f: F,
    inputs: &[Array],
) {
    let argnums: Vec<usize> = (0..inputs.len()).collect();
    let (value, grads) = value_and_grad(&f, &argnums)(inputs).unwrap();
    let v0 = f(inputs).unwrap()[0].item::<f64>().unwrap();
    assert_eq!(value[0].item::<f64>().unwrap(), v0);
    let mut worst = 0.0f64;
    for (i, input) in inputs.iter().enumerate() {
        let base = input.to_vec::<f64>().unwrap();
        let g = grads[i].to_vec::<f64>().unwrap();
        assert_eq!(g.len(), base.len());
        for j in 0..base.len() {
            let at = |d: f64| {
                let mut v = base.clone();
                v[j] += d;
                let mut args = inputs.to_vec();
                args[i] = f64s(&v, &input.shape());
                f(&args).unwrap()[0].item::<f64>().unwrap()
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let err = (fd - g[j]).abs() / g[j].abs().max(1.0);
            worst = worst.max(err);
            assert!(
                err <= tol,
                "{name}: d/d input{i}[{j}]: autodiff {} vs finite differences {fd} (rel err {err:e})",
                g[j]
            );
        }
    }
    println!("{name}: worst relative error {worst:e} (tolerance {tol:e})");
}

fn vals(n: usize, seed: f64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i as f64 + 1.0) * seed).sin() * 1.5)
        .collect()
}

/// e^x through `power`, which is full precision on float64 (unlike `exp`).
fn exp64(x: &Array) -> Result<Array> {
    ops::power(
        &Array::from_f64(std::f64::consts::E, Dtype::Float64)?,
        x,
        None,
    )
}

#[test]
fn elementwise_function() {
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        let (x, y) = (&a[0], &a[1]);
        let y2 = ops::square(y, None)?;
        let t = (ops::tanh(x, None)? * ops::sqrt(&(&y2 + 2.0)?, None)?)?;
        let t = (t + ops::log(&((x * y)? + 4.0)?, None)?)?;
        let t = (t / (&y2 + 1.0)?)?;
        let base = (ops::square(x, None)? + 0.5)?;
        let expo = ops::rsqrt(&(&y2 + 1.0)?, None)?;
        let t = (t + ops::power(&base, &expo, None)?)?;
        Ok(vec![sum2(&t)?])
    };
    check(
        "elementwise",
        TIGHT,
        f,
        &[f64s(&vals(6, 0.7), &[2, 3]), f64s(&vals(6, 1.3), &[2, 3])],
    );
}

#[test]
fn transcendental_functions() {
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        let (x, y) = (&a[0], &a[1]);
        let t = ((ops::sin(x, None)? * ops::exp(y, None)?)? + ops::erf(&(x * y)?, None)?)?;
        let t = (t + (ops::cos(y, None)? * ops::sigmoid(x, None)?)?)?;
        Ok(vec![sum2(&t)?])
    };
    check(
        "transcendental",
        LOOSE,
        f,
        &[f64s(&vals(6, 0.7), &[2, 3]), f64s(&vals(6, 1.3), &[2, 3])],
    );
}

#[test]
fn two_layer_network() {
    let f = |a: &[Array]| -> Result<Vec<Array>> {
        let (x, w1, w2) = (&a[0], &a[1], &a[2]);
        let h = ops::tanh(&x.matmul(w1)?, None)?;
        Ok(vec![sum2(&ops::square(&h.matmul(w2)?, None)?)?])
    };
    check(
        "network",
        TIGHT,
        f,
        &[
            f64s(&vals(6, 0.3), &[2, 3]),
            f64s(&vals(12, 0.9), &[3, 4]),
            f64s(&vals(8, 1.7), &[4, 2]),
        ],
    );
}

fn softmax_xent(exp: fn(&Array) -> Result<Array>) -> impl Fn(&[Array]) -> Result<Vec<Array>> {
    move |a: &[Array]| {
        let (z, y) = (&a[0], &a[1]);
        let ones_c = ops::ones(&[4, 1], Dtype::Float64, None)?;
        let lse = ops::log(&exp(z)?.matmul(&ones_c)?, None)?;
        let picked = (z * y)?.matmul(&ones_c)?;
        let ones_n = ops::ones(&[1, 3], Dtype::Float64, None)?;
        Ok(vec![ones_n.matmul(&(lse - picked)?)?.reshape(&[])?])
    }
}

#[test]
fn softmax_cross_entropy() {
    let mut y = vec![0.0; 12];
    y[1] = 1.0;
    y[4] = 1.0;
    y[11] = 1.0;
    // Targets are data; perturbing them too checks the linear part as well.
    let inputs = [f64s(&vals(12, 0.45), &[3, 4]), f64s(&y, &[3, 4])];
    check("softmax_xent (power)", TIGHT, softmax_xent(exp64), &inputs);
    check(
        "softmax_xent (exp)",
        LOOSE,
        softmax_xent(|x| ops::exp(x, None)),
        &inputs,
    );
}

#[test]
fn checkpointed_and_custom_vjp_functions() {
    let ck = checkpoint(|a: &[Array]| {
        let t = ops::tanh(&a[0], None)?;
        let l = ops::log(&(ops::square(&a[0], None)? + 1.0)?, None)?;
        Ok(vec![(&t * &l)?])
    })
    .unwrap();
    check(
        "checkpoint",
        TIGHT,
        |a: &[Array]| Ok(vec![sum2(&ck.call(a)?[0])?]),
        &[f64s(&vals(6, 0.8), &[3, 2])],
    );
    // A custom VJP written by hand: d/dx x tanh(x) = tanh(x) + x (1 - tanh(x)^2).
    let custom = custom_vjp(
        |a: &[Array]| Ok(vec![(&a[0] * ops::tanh(&a[0], None)?)?]),
        |p, c, _o| {
            let t = ops::tanh(&p[0], None)?;
            let d = (&t + (&p[0] * (1.0 - ops::square(&t, None)?)?)?)?;
            Ok(vec![(d * &c[0])?])
        },
    )
    .unwrap();
    check(
        "custom_vjp",
        TIGHT,
        |a: &[Array]| Ok(vec![sum2(&custom.call(a)?[0])?]),
        &[f64s(&vals(6, 1.1), &[2, 3])],
    );
}
