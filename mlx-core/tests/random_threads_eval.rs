//! Keyless draws evaluated from eight threads at once (issue #29). Each keyless draw splits
//! the process-wide key; when that split stayed lazy, concurrent draws shared the unevaluated
//! node and evaluating them together crashed inside MLX (SIGSEGV). The split is now
//! materialized under the global key's lock, so the draws share only evaluated arrays.
//!
//! Its own test binary: it owns the global key.

use mlx_core::prelude::*;
use mlx_core::random;

const THREADS: usize = 8;
const ROUNDS: usize = 200;

#[test]
fn keyless_draws_evaluated_from_eight_threads_at_once() {
    random::seed(3).unwrap();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || -> Result<Vec<f32>> {
                barrier.wait();
                let mut seen = Vec::with_capacity(ROUNDS * 4);
                for _ in 0..ROUNDS {
                    let u = random::uniform(0.0, 1.0, &[4], Dtype::Float32, None, None)?;
                    u.eval()?;
                    let k = random::next_key()?;
                    k.eval()?;
                    let c = random::categorical(
                        &Array::from_slice(&[0.0f32, 1.0, 2.0], &[3])?,
                        -1,
                        None,
                        None,
                    )?;
                    c.eval()?;
                    seen.extend(u.to_vec::<f32>()?);
                }
                Ok(seen)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().expect("thread panicked").expect("draw failed"));
    }
    // Every value is a uniform draw, and no two threads drew from the same key.
    assert!(all.iter().all(|v| (0.0..1.0).contains(v)));
    let mut bits: Vec<u32> = all.iter().map(|v| v.to_bits()).collect();
    bits.sort_unstable();
    bits.dedup();
    assert!(
        bits.len() > all.len() * 9 / 10,
        "{} distinct of {}",
        bits.len(),
        all.len()
    );
}
