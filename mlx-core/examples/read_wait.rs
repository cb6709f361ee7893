//! How long reading a scheduled array waits when more work is queued behind it on its stream
//! (issue #15: a pipelined decode reads token n while step n+1 is queued).
//!
//! ```text
//! cargo run --release -p mlx-core --example read_wait [-- N]
//! ```
//!
//! Schedules a small array `a`, then `b` (a chain of N 1024x1024 float32 matmuls that needs
//! `a`) on the same stream, and times reading `a` three ways: `to_vec` (evaluates `a` itself,
//! then copies), `contiguous(a)` then `to_vec` (a new node, as `to_data` did before: queued
//! behind `b`) and `astype(float16)` then `to_vec` (likewise). Prints the times in ms and
//! whether `b` was finished when the read returned.
#![forbid(unsafe_code)]

use std::time::Instant;

use mlx_core::prelude::*;

fn main() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let m = random::normal(
        &[1024, 1024],
        Dtype::Float32,
        Some(0.0),
        Some(0.03),
        None,
        None,
    )?;
    m.eval()?;
    let read = |how: &str| -> Result<()> {
        let a = (&Array::from_slice(&[1.0f32, 2.0], &[2])? + 1.0f32)?;
        let mut b = m.clone();
        for _ in 0..n {
            b = b.matmul(&m)?;
        }
        let b = (&b + &a.sum_all(false)?)?;
        mlx_core::async_eval([&a])?;
        mlx_core::async_eval([&b])?;
        let t = Instant::now();
        let v = match how {
            "to_vec" => a.to_vec::<f32>()?,
            "contiguous" => ops::contiguous(&a, false, None)?.to_vec::<f32>()?,
            _ => a.astype(Dtype::Float16)?.to_vec_f32()?,
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let b_done = b.is_evaluated();
        b.eval()?;
        println!(
            "{how:>10}: read {v:?} in {ms:8.2} ms; the queued chain finished by then: {b_done}"
        );
        Ok(())
    };
    for how in ["to_vec", "contiguous", "astype", "to_vec"] {
        read(how)?;
    }
    Ok(())
}
