//! Times the trellis encoder and reports its error on a Gaussian matrix:
//! `cargo run --release -p mlx-core --example trellis_encode -- [ROWS] [COLS] [L] [THREADS]`.
use mlx_core::cpu::trellis::{decode, quantize, TrellisSpec};

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("a number"))
        .collect();
    let rows = a.first().copied().unwrap_or(64);
    let cols = a.get(1).copied().unwrap_or(576);
    let l = a.get(2).copied().unwrap_or(16) as u32;
    let threads = a.get(3).copied().unwrap_or(2);
    let mut z = 1u64;
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| {
            // Sum of 12 uniforms minus 6: close to a unit Gaussian.
            (0..12)
                .map(|_| {
                    z = z
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (z >> 40) as f32 / (1u64 << 24) as f32
                })
                .sum::<f32>()
                - 6.0
        })
        .collect();
    for k in [2u32, 3, 4] {
        let spec = TrellisSpec {
            k,
            l,
            block: 64,
            code: mlx_core::cpu::trellis::TrellisCode::Mad,
        };
        let t = std::time::Instant::now();
        let (words, scales) = quantize(&spec, &w, rows, cols, 7, threads).expect("quantize");
        let secs = t.elapsed().as_secs_f64();
        let mut out = vec![0.0; w.len()];
        decode(&spec, &words, &scales, rows, cols, 1, &mut out).expect("decode");
        println!(
            "k={k} L={l}: {:.0} weights/s ({secs:.2} s for {rows}x{cols}), {} words",
            (rows * cols) as f64 / secs,
            words.len()
        );
    }
}
