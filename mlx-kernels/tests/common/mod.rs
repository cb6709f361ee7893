//! Helpers shared by the flash attention tests (`flash_attention.rs` on every back-end, the
//! `cuda` set on the GPU).
#![allow(dead_code)]

use mlx_core::prelude::*;

/// `max|a - b| / max|b|`, in float32.
pub fn rel_err(a: &Array, b: &Array) -> f32 {
    let a = a.astype(Dtype::Float32).unwrap();
    let b = b.astype(Dtype::Float32).unwrap();
    let d = (&a - &b).unwrap().abs().unwrap().max_all(false).unwrap();
    let m = b.abs().unwrap().max_all(false).unwrap();
    d.item::<f32>().unwrap() / m.item::<f32>().unwrap().max(f32::MIN_POSITIVE)
}

/// Checks `grads` (of `loss` at `x`, one per input) against central finite differences in
/// float32: `d/de loss(x + e*u)` at `e = 0` (step 1e-2) against `<grad, u>`, along a standard
/// normal direction `u` per input (seeded `seed + input index`). Prints one line per input and
/// panics when the relative difference reaches 2e-2.
pub fn check_finite_differences(
    label: &str,
    x: &[Array],
    grads: &[Array],
    seed: u64,
    loss: impl Fn(&[Array]) -> f32,
) {
    for (which, n) in ["q", "k", "v"].iter().enumerate().take(x.len()) {
        let key = random::key(seed + which as u64).unwrap();
        let u = random::normal(
            &x[which].shape(),
            Dtype::Float32,
            None,
            None,
            Some(&key),
            None,
        )
        .unwrap();
        let eps = 1e-2f32;
        let shifted = |sign: f32| -> f32 {
            let mut xs = x.to_vec();
            xs[which] = (&x[which] + &u.multiply_scalar(sign * eps).unwrap()).unwrap();
            loss(&xs)
        };
        let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * eps);
        let an = (&grads[which] * &u)
            .unwrap()
            .sum_all(false)
            .unwrap()
            .item::<f32>()
            .unwrap();
        let rel = (fd - an).abs() / an.abs().max(1e-3);
        println!("{label}: d{n}: finite difference {fd}, backward {an}, rel {rel:.3e}");
        assert!(
            rel < 2e-2,
            "{label}: d{n}: finite difference {fd} vs backward {an}"
        );
    }
}
