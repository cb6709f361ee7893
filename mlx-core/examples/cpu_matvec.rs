//! Times the CPU decoder's matrix-vector products at SmolLM2-135M's shapes on one thread, as the fastest
//! of many runs (steady on a machine other work loads): `cargo run -p mlx-core --example
//! cpu_matvec [f32|int16|int8] [scalar|avx2|avx512]`. Prints ns per product and the weight bytes read per ns.

use half::f16;
use mlx_core::cpu::{matmul_t, Activations, CpuContext, Floats, Isa, MatJob, Matrix};

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn unit(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 - 0.5
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let act = match std::env::args().nth(1).as_deref() {
        Some("f32") => Activations::F32,
        Some("int8") => Activations::Int8,
        _ => Activations::Int16,
    };
    let isa = match std::env::args().nth(2).as_deref() {
        Some("scalar") => Isa::Scalar,
        Some("avx2") => Isa::Avx2,
        Some("avx512") => Isa::Avx512,
        _ => Isa::detect(),
    };
    let mut ctx = CpuContext::with_isa(1, isa)?;
    ctx.activations = act;
    let mut rng = Lcg(7);
    // (rows, cols, bits): SmolLM2-135M's q/o, k/v, gate/up, down and the tied head.
    for (rows, cols, bits) in [
        (576, 576, 4),
        (192, 576, 4),
        (1536, 576, 4),
        (576, 1536, 4),
        (49152, 576, 8),
    ] {
        let words: Vec<u32> = (0..rows * cols * bits / 32).map(|_| rng.next()).collect();
        let groups = rows * cols / 32;
        let scales: Vec<f16> = (0..groups)
            .map(|_| f16::from_f32(rng.unit() * 0.1))
            .collect();
        let biases: Vec<f16> = (0..groups)
            .map(|_| f16::from_f32(rng.unit() * 0.1))
            .collect();
        let w = Matrix::affine(
            &words,
            Floats::F16(&scales),
            Floats::F16(&biases),
            rows,
            cols,
            bits as u32,
            32,
        )?;
        let bytes = words.len() * 4 + groups * 4;
        for m in [1usize, 4, 32] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; m * rows];
            // The fastest of many runs: on a loaded machine most runs are interrupted, the
            // fastest ones are not.
            let reps = (200_000_000 / (rows * cols * m)).clamp(5, 2000);
            let mut best = u64::MAX;
            for _ in 0..reps {
                let t = std::time::Instant::now();
                let mut jobs = [MatJob {
                    w: &w,
                    bias: None,
                    out: &mut out,
                }];
                matmul_t(&ctx, std::hint::black_box(&x), m, &mut jobs)?;
                best = best.min(t.elapsed().as_nanos() as u64);
            }
            println!(
                "{rows}x{cols} {bits}-bit m={m}: {best} ns, {:.2} GB/s of weights, {:.2} GMAC/s",
                bytes as f64 / best as f64,
                (rows * cols * m) as f64 / best as f64
            );
        }
    }
    Ok(())
}
