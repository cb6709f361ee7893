//! Decode-step products at SmolLM2-135M's linear shapes on one thread, fastest of many runs:
//! trellis 3-bit (`cpu::trellis::matvec_rows`, L 12, blocks of 64) against the CPU decoder's
//! affine 4-bit kernel (`cpu::matmul_t`, group 64, its default int16 activations).
//! `cargo run -p mlx-core --example trellis_matvec [L]`.

use half::f16;
use mlx_core::cpu::trellis::{matvec_rows, quantize, TrellisSpec};
use mlx_core::cpu::{matmul_t, CpuContext, Floats, MatJob, Matrix};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let l: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let ctx = CpuContext::with_isa(1, mlx_core::cpu::Isa::detect())?;
    let mut z = 7u64;
    let mut unit = move || {
        z = z
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let (mut t_aff, mut t_tre) = (0f64, 0f64);
    // (rows, cols, per layer): q/o, k/v, gate/up, down.
    for (rows, cols, per_layer) in [(576, 576, 2), (192, 576, 2), (1536, 576, 2), (576, 1536, 1)] {
        let w: Vec<f32> = (0..rows * cols).map(|_| unit()).collect();
        let x: Vec<f32> = (0..cols).map(|_| unit()).collect();
        let spec = TrellisSpec { k: 3, l, block: 64 };
        // Rows do not change the kernel's cost: code 64 of them and repeat the words.
        let (w64, s64) = quantize(&spec, &w[..64 * cols], 64, cols, 1, 2)?;
        let words: Vec<u32> = (0..rows / 64).flat_map(|_| w64.iter().copied()).collect();
        let scales: Vec<f32> = (0..rows / 64).flat_map(|_| s64.iter().copied()).collect();
        let aw: Vec<u32> = (0..rows * cols / 8)
            .map(|i| (i as u32).wrapping_mul(2654435761))
            .collect();
        let groups = rows * cols / 64;
        let sc: Vec<f16> = (0..groups).map(|_| f16::from_f32(unit() * 0.1)).collect();
        let bi: Vec<f16> = (0..groups).map(|_| f16::from_f32(unit() * 0.1)).collect();
        let m = Matrix::affine(&aw, Floats::F16(&sc), Floats::F16(&bi), rows, cols, 4, 64)?;
        let mut out = vec![0f32; rows];
        let reps = 200;
        let (mut best_a, mut best_t) = (u64::MAX, u64::MAX);
        for _ in 0..reps {
            let t = std::time::Instant::now();
            let mut jobs = [MatJob {
                w: &m,
                bias: None,
                out: &mut out,
            }];
            matmul_t(&ctx, std::hint::black_box(&x), 1, &mut jobs)?;
            best_a = best_a.min(t.elapsed().as_nanos() as u64);
            let t = std::time::Instant::now();
            matvec_rows(
                &spec,
                &words,
                &scales,
                cols,
                std::hint::black_box(&x),
                0,
                &mut out,
            );
            best_t = best_t.min(t.elapsed().as_nanos() as u64);
        }
        println!(
            "{rows}x{cols}: affine-4 {best_a} ns, trellis-3 {best_t} ns ({:.1}x)",
            best_t as f64 / best_a as f64
        );
        t_aff += (best_a * per_layer) as f64;
        t_tre += (best_t * per_layer) as f64;
    }
    println!(
        "30 layers' linears, one token, one thread: affine-4 {:.2} ms, trellis-3 {:.2} ms",
        t_aff * 30.0 / 1e6,
        t_tre * 30.0 / 1e6
    );
    Ok(())
}
