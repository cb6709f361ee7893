//! Times the multi-row products of speculative verification (`matmul_t_each`, `m` rows of
//! one sequence) against one row, at SmolLM2-135M's shapes in its GGUF's formats (Q4_1
//! layers as 4-bit affine, the tied Q8_0 head as 8-bit), under the CPU decoder's default
//! activations (`Int16Q8Int8`): `cargo run --release -p mlx-core --example cpu_rows --
//! [THREADS] [MAX_ROWS] [MB]`. Each shape cycles through enough copies to stream its weights
//! from memory (as a decode step does, 98 MB a token; `MB`, default 96, the size of the cycle:
//! a small one keeps the weights in cache, so the kernels' arithmetic alone is timed), and
//! prints the fastest of many runs per row count and its cost in one-row products.
//!
//! `CPU_ROWS_ACT=int16` times every shape under `Activations::Int16` (what the head's product
//! takes, [`Activations::head`]) instead, and `CPU_ROWS_HEAD=q8_0` makes the 8-bit shape
//! symmetric (GGUF's Q8_0 as loaded, which `Int16Q8Int8` reads with int8 inputs): together
//! they time the tied head's verify rows under int16 and under int8 inputs (#33, session 30).

use mlx_core::cpu::{matmul_t_each, Activations, CpuContext, Floats, MatJob, Matrix, RowsScratch};

#[path = "support/bench_data.rs"]
mod bench_data;
use bench_data::{Affine, Lcg};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let max_rows: usize = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let cycle_mb: f64 = std::env::args()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(96.0);
    let mut ctx = CpuContext::new(threads)?;
    ctx.activations = match std::env::var("CPU_ROWS_ACT").as_deref() {
        Ok("int16") => Activations::Int16,
        _ => Activations::Int16Q8Int8,
    };
    let q8_0 = std::env::var("CPU_ROWS_HEAD").is_ok_and(|v| v == "q8_0");
    let mut rng = Lcg(7);
    let mut scratch = RowsScratch::default();
    for (rows, cols, bits) in [
        (576, 576, 4),
        (1536, 576, 4),
        (576, 1536, 4),
        (49152, 576, 8),
    ] {
        // Enough copies for `cycle_mb` (96 MB: the cycle does not stay in the 32 MB L3).
        let one = rows * cols * bits as usize / 8 + rows * cols / 32 * 4;
        let copies = ((cycle_mb * 1e6) as usize / one).max(1);
        let mut store = Vec::new();
        for _ in 0..copies {
            store.push(Affine::random(&mut rng, (rows, cols, bits, 32), 0.1, 0.1));
        }
        let mats: Vec<Matrix<'_>> = store
            .iter()
            .map(|a| {
                if q8_0 && bits == 8 {
                    Matrix::symmetric(&a.words, Floats::F16(&a.scales), rows, cols, 8, 32)
                } else {
                    a.matrix()
                }
            })
            .collect::<Result<_, _>>()?;
        let mut base = 0.0;
        for m in 1..=max_rows {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; m * rows];
            let reps = (copies * 8).max(40);
            let mut best = f64::INFINITY;
            for i in 0..reps {
                let t = std::time::Instant::now();
                let mut jobs = [MatJob {
                    w: &mats[i % copies],
                    bias: None,
                    out: &mut out,
                }];
                matmul_t_each(&ctx, std::hint::black_box(&x), m, &mut jobs, &mut scratch)?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            if m == 1 {
                base = best;
            }
            println!(
                "{rows}x{cols} {bits}-bit m={m}: {:.1} us, {:.2} one-row products, {:.2} GB/s",
                best * 1e6,
                best / base,
                one as f64 / best / 1e9
            );
        }
    }
    Ok(())
}
