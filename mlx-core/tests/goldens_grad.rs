//! Gradients against the Python oracle (mlx 0.32.4), bit for bit: every case in
//! `tests/goldens/grad.safetensors` (written by `cargo xtask goldens grad` from
//! `xtask/oracle/goldens_grad.py`). The functions below are the script's, op for op.

use mlx_core::fast::{RopeOffset, SdpaMask};
use mlx_core::prelude::*;
use mlx_core::quantized::QuantMode;
use mlx_core::testing::{Case, Goldens};

fn sum2(x: &Array) -> Result<Array> {
    let s = x.shape();
    let l = ops::ones(&[1, s[0]], x.dtype(), None)?;
    let r = ops::ones(&[s[1], 1], x.dtype(), None)?;
    l.matmul(x)?.matmul(&r)?.reshape(&[])
}

fn sin_mul_sq(a: &[Array]) -> Result<Vec<Array>> {
    let (x, y) = (&a[0], &a[1]);
    let t = ((ops::sin(x, None)? * y)? + ops::square(x, None)?)?;
    Ok(vec![sum2(&t)?])
}

fn unary_mix(a: &[Array]) -> Result<Vec<Array>> {
    let x = &a[0];
    let t = (ops::tanh(x, None)? * ops::sigmoid(x, None)?)?;
    let t = (t + ops::exp(&(x * 0.5)?, None)?)?;
    let t = (t - ops::log(&(ops::abs(x, None)? + 1.0)?, None)?)?;
    Ok(vec![sum2(&t)?])
}

fn sqrt_div(a: &[Array]) -> Result<Vec<Array>> {
    let (x, y) = (&a[0], &a[1]);
    let num = ops::sqrt(&((x * x)? + 1.0)?, None)?;
    let den = (ops::rsqrt(&((y * y)? + 0.5)?, None)? + 2.0)?;
    Ok(vec![sum2(&(num / den)?)?])
}

fn erf_max_min(a: &[Array]) -> Result<Vec<Array>> {
    let (x, y) = (&a[0], &a[1]);
    let t = (ops::erf(x, None)? * ops::maximum(x, y, None)?)?;
    let u = (ops::minimum(x, y, None)? * ops::cos(&(-x)?, None)?)?;
    Ok(vec![sum2(&(t + u)?)?])
}

fn power_fn(a: &[Array]) -> Result<Vec<Array>> {
    let (x, y) = (&a[0], &a[1]);
    let base = (ops::abs(x, None)? + 0.5)?;
    Ok(vec![sum2(&ops::power(&base, y, None)?)?])
}

fn mlp(a: &[Array]) -> Result<Vec<Array>> {
    let (x, w1, b1, w2) = (&a[0], &a[1], &a[2], &a[3]);
    let h = ops::tanh(&(x.matmul(w1)? + b1)?, None)?;
    Ok(vec![sum2(&h.matmul(w2)?)?])
}

fn batched_matmul(a: &[Array]) -> Result<Vec<Array>> {
    let y = ops::sigmoid(&a[0].matmul(&a[1])?, None)?;
    Ok(vec![sum2(&y.reshape(&[6, 5])?)?])
}

fn softmax_xent(a: &[Array]) -> Result<Vec<Array>> {
    let (z, y) = (&a[0], &a[1]);
    let (n, c) = (z.dim(0)?, z.dim(1)?);
    let ones_c = ops::ones(&[c, 1], z.dtype(), None)?;
    let lse = ops::log(&ops::exp(z, None)?.matmul(&ones_c)?, None)?;
    let picked = (z * y)?.matmul(&ones_c)?;
    let ones_n = ops::ones(&[1, n], z.dtype(), None)?;
    let total = ones_n.matmul(&(lse - picked)?)?.reshape(&[])?;
    Ok(vec![(total * (1.0f64 / f64::from(n)) as f32)?])
}

fn linear_xent(a: &[Array]) -> Result<Vec<Array>> {
    let (w, b, x, y) = (&a[0], &a[1], &a[2], &a[3]);
    softmax_xent(&[(x.matmul(w)? + b)?, y.clone()])
}

fn mixed_precision(a: &[Array]) -> Result<Vec<Array>> {
    let (w, x) = (&a[0], &a[1]);
    let h = x
        .astype(Dtype::Float32)?
        .matmul(&w.astype(Dtype::Float32)?)?;
    Ok(vec![sum2(&ops::tanh(&h, None)?)?])
}

fn with_aux(a: &[Array]) -> Result<Vec<Array>> {
    let x = &a[0];
    Ok(vec![sum2(&ops::square(x, None)?)?, (x * 3.0)?])
}

fn two_out(a: &[Array]) -> Result<Vec<Array>> {
    let x = &a[0];
    Ok(vec![
        (ops::exp(x, None)? * ops::sin(x, None)?)?,
        (ops::tanh(x, None)? * 2.0)?,
    ])
}

// ---- fast ops, quantized matmul, mlx-lm's loss ----

fn sum_all(x: &Array) -> Result<Array> {
    ops::sum_all(x, false, None)
}

fn rms_norm_fn(a: &[Array]) -> Result<Vec<Array>> {
    let y = fast::rms_norm(&a[0], Some(&a[1]), 1e-5, None)?;
    Ok(vec![sum_all(&(y * &a[2])?)?])
}

fn rope_fn(a: &[Array]) -> Result<Vec<Array>> {
    let y = fast::rope(
        &a[0],
        8,
        false,
        Some(10000.0),
        1.0,
        RopeOffset::Int(3),
        None,
        None,
    )?;
    Ok(vec![sum_all(&(y * &a[1])?)?])
}

fn rope_trad_fn(a: &[Array]) -> Result<Vec<Array>> {
    let y = fast::rope(
        &a[0],
        6,
        true,
        Some(500.0),
        0.5,
        RopeOffset::Int(0),
        None,
        None,
    )?;
    Ok(vec![sum_all(&(y * &a[1])?)?])
}

fn sdpa_with(a: &[Array], mask: SdpaMask<'_>) -> Result<Vec<Array>> {
    let o = fast::scaled_dot_product_attention(&a[0], &a[1], &a[2], 0.35, mask, None, None)?;
    Ok(vec![sum_all(&(o * &a[3])?)?])
}

fn sdpa_fn(a: &[Array]) -> Result<Vec<Array>> {
    sdpa_with(a, SdpaMask::None)
}

fn sdpa_causal_fn(a: &[Array]) -> Result<Vec<Array>> {
    sdpa_with(a, SdpaMask::Causal)
}

fn qmm_fn(a: &[Array]) -> Result<Vec<Array>> {
    let y = quantized::quantized_matmul(
        &a[0],
        &a[1],
        &a[2],
        Some(&a[3]),
        true,
        32,
        4,
        QuantMode::Affine,
        None,
    )?;
    Ok(vec![sum_all(&(y * &a[4])?)?])
}

/// `mlx.nn.losses.cross_entropy(logits, targets)` with class indices, on the CPU path.
fn cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    let m = ops::max(logits, &[-1], true, None)?;
    let logits = (logits - stop_gradient(&m, None)?)?;
    let score =
        ops::take_along_axis(&logits, &targets.expand_dims(&[-1])?, -1, None)?.squeeze(&[-1])?;
    ops::logsumexp(&logits, &[-1], false, None)? - score
}

/// `mlx_lm.tuner.trainer.default_loss` with logits = x @ w.T.
fn lm_loss(a: &[Array]) -> Result<Vec<Array>> {
    let (x, w, targets, lengths) = (&a[0], &a[1], &a[2], &a[3]);
    let logits = x.matmul(&w.transpose_all()?)?;
    lm_loss_logits(&logits, targets, lengths)
}

fn lm_loss_logits(logits: &Array, targets: &Array, lengths: &Array) -> Result<Vec<Array>> {
    let t = targets.dim(1)?;
    let steps = ops::arange(1.0, f64::from(t + 1), 1.0, Dtype::Int32, None)?;
    let lo = ops::slice_axis(lengths, 1, 0, 1, None)?;
    let hi = ops::slice_axis(lengths, 1, 1, i32::MAX, None)?;
    let mask = ops::logical_and(
        &ops::greater_equal(&steps, &lo, None)?,
        &ops::less_equal(&steps, &hi, None)?,
        None,
    )?;
    let ce = (cross_entropy(logits, targets)? * &mask)?;
    let ntoks = ops::sum_all(&mask, false, None)?;
    let ce = (sum_all(&ce.astype(Dtype::Float32)?)? / &ntoks)?;
    Ok(vec![ce, ntoks])
}

/// LoRA adapters on a frozen linear head (mlx-lm's LoRALinear with scale 20), then the loss.
fn lora_loss(p: &ParamMap, o: &[Array]) -> Result<Vec<Array>> {
    let (x, w, targets, lengths) = (&o[0], &o[1], &o[2], &o[3]);
    let z = x.matmul(&p["lora_a"])?.matmul(&p["lora_b"])?;
    let logits = (x.matmul(&w.transpose_all()?)? + (z * 20.0)?.astype(x.dtype())?)?;
    lm_loss_logits(&logits, targets, lengths)
}

type F = fn(&[Array]) -> Result<Vec<Array>>;

fn function(name: &str) -> F {
    match name {
        "sin_mul_sq" => sin_mul_sq,
        "unary_mix" => unary_mix,
        "sqrt_div" => sqrt_div,
        "erf_max_min" => erf_max_min,
        "power_fn" => power_fn,
        "mlp" => mlp,
        "batched_matmul" => batched_matmul,
        "softmax_xent" => softmax_xent,
        "linear_xent" => linear_xent,
        "mixed_precision" => mixed_precision,
        "with_aux" => with_aux,
        "two_out" => two_out,
        "rms_norm" => rms_norm_fn,
        "rope" => rope_fn,
        "rope_traditional" => rope_trad_fn,
        "sdpa" => sdpa_fn,
        "sdpa_causal" => sdpa_causal_fn,
        "quantized_matmul" => qmm_fn,
        "lm_loss" => lm_loss,
        other => panic!("no function {other}"),
    }
}

fn argnums(c: &Case) -> Vec<usize> {
    c.ints("argnums")
        .unwrap()
        .into_iter()
        .map(|i| i as usize)
        .collect()
}

fn run(c: &Case) -> Result<Vec<Array>> {
    let name = c.str("fn").unwrap();
    let cat = |(v, g): (Vec<Array>, Vec<Array>)| v.into_iter().chain(g).collect::<Vec<_>>();
    let split = |c: &Case| {
        let n = c.int("nprimals").unwrap() as usize;
        (c.inputs[..n].to_vec(), c.inputs[n..].to_vec())
    };
    Ok(match c.op.as_str() {
        "value_and_grad" => cat(value_and_grad(function(name), &argnums(c))(&c.inputs)?),
        "vjp" => {
            let (p, t) = split(c);
            cat(vjp(function(name), &p, &t)?)
        }
        "jvp" => {
            let (p, t) = split(c);
            cat(jvp(function(name), &p, &t)?)
        }
        "checkpoint" => {
            let ck = checkpoint(function(name))?;
            let r = value_and_grad(|a: &[Array]| ck.call(a), &argnums(c))(&c.inputs)?;
            cat(r)
        }
        "custom_vjp" => {
            assert_eq!(name, "sin_sum");
            let sin_custom = custom_vjp(
                |a: &[Array]| Ok(vec![ops::sin(&a[0], None)?]),
                |p, cot, _o| Ok(vec![(ops::cos(&p[0], None)? * &cot[0])?]),
            )?;
            let loss = |a: &[Array]| Ok(vec![sum2(&sin_custom.call(a)?[0])?]);
            let r = value_and_grad(loss, &argnums(c))(&c.inputs)?;
            cat(r)
        }
        "compile" => {
            let f = compile(function(name), c.bool("shapeless").unwrap())?;
            f.call(&c.inputs)?
        }
        "value_and_grad_tree" => {
            assert_eq!(name, "lora_loss");
            let names = c.str("names").unwrap();
            let names: Vec<&str> = names
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(',')
                .collect();
            let params: ParamMap = names
                .iter()
                .map(|n| n.to_string())
                .zip(c.inputs.iter().cloned())
                .collect();
            let (values, grads) =
                value_and_grad_tree(lora_loss)(&params, &c.inputs[names.len()..])?;
            values.into_iter().chain(grads.into_values()).collect()
        }
        "compile_grad" => {
            let f = compile(function(name), false)?;
            let loss = |a: &[Array]| Ok(vec![f.call(a)?[0].clone()]);
            let r = value_and_grad(loss, &argnums(c))(&c.inputs)?;
            cat(r)
        }
        other => panic!("case {}: no runner for op {other}", c.name),
    })
}

#[test]
fn gradients_match_the_oracle_bit_for_bit() {
    let g = Goldens::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/grad.safetensors"
    ))
    .unwrap();
    let cases = g.cases().unwrap();
    assert!(cases.len() >= 102, "only {} cases", cases.len());
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| match run(c) {
            Ok(out) => c.check(&out).err(),
            Err(e) => Some(format!("case {}: {e}", c.name)),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
