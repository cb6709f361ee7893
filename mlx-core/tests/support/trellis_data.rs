//! Data and measure of the trellis-coding error test and example (`tests/trellis_mse.rs`,
//! `examples/trellis_mse.rs`): seeded Gaussian weights and the relative squared error.
//! Included by path (`#[path = "support/trellis_data.rs"] mod trellis_data;`; from
//! examples/, `#[path = "../tests/support/trellis_data.rs"]`).

/// `n` standard-normal samples: Box-Muller over a splitmix64 stream from `seed`.
pub fn gauss(n: usize, seed: u64) -> Vec<f32> {
    let mut z = seed;
    let mut next = || {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((x ^ (x >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next().max(1e-12), next());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect()
}

/// The mean squared error of `b` against `a`, relative to `a`'s variance.
pub fn rel_mse(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let mean = a.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = a
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let e = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum::<f64>()
        / n;
    e / var
}
