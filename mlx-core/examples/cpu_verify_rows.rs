//! Times the products of a speculative verification pass (`m` input rows over one weight
//! matrix, one thread) at SmolLM2-135M's 4-bit shapes four ways, interleaved per row count:
//! the default kernel (`matmul_t_each`), the chunk-sum lane kernel (`matmul_t_each` with
//! `CpuContext::lane4`), the same lane kernel over a `Lanes16` layout made once (`lanes16`)
//! and the AMX int8 tile kernel (`cpu::amx_verify`, its inputs laid out
//! on each call): `cargo run --release -p mlx-core --example cpu_verify_rows -- [MAX_ROWS]
//! [MB] [ROUNDS]`. Each shape cycles through `MB` (default 8) of weight copies; the fastest of
//! many runs is printed with its cost in the default kernel's one-row products. Last, a slice
//! of SmolLM2's 8-bit head (8192 x 576, Q8_0) through the default kernel only (int16 inputs).
//! `MLX_CPU_PAIRS=0` (or `4`, `8`) turns the verify rows' pair kernels off (s44);
//! `CPU_VERIFY_SHAPES=576x576,1536x576` times only those shapes, `CPU_VERIFY_THREADS=2` on two
//! workers.

use half::f16;
use mlx_core::cpu::amx_verify::{self, Kernel};
use mlx_core::cpu::{
    matmul_t_each, Activations, CpuContext, Floats, Lanes16, MatJob, Matrix, RowsScratch,
};

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 32) as u32
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 1) as f32 / (1u64 << 31) as f32 - 0.5
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, d: f64| {
        std::env::args()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (max_rows, mb, rounds) = (arg(1, 7.0) as usize, arg(2, 8.0), arg(3, 1.0) as usize);
    // `CPU_VERIFY_THREADS=2`: the decoder's two workers (one by default).
    let threads = std::env::var("CPU_VERIFY_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut ctx = CpuContext::new(threads)?;
    ctx.activations = Activations::Int16Q8Int8;
    let amx = amx_verify::amx_int8_available();
    let mut rng = Lcg(7);
    let mut scratch = RowsScratch::default();
    // The 4-bit shapes, then a slice of the 8-bit head (Q8_0, symmetric: 8192 of its 49,152
    // rows; only the default kernel's column applies there).
    for (rows, cols, bits) in [
        (576, 576, 4),
        (1536, 576, 4),
        (576, 1536, 4),
        (8192, 576, 8),
    ] {
        // `CPU_VERIFY_SHAPES=576x576,1536x576`: only these shapes (all by default).
        if let Ok(only) = std::env::var("CPU_VERIFY_SHAPES") {
            if !only.split(',').any(|s| s == format!("{rows}x{cols}")) {
                continue;
            }
        }
        // The head's products read int16 inputs (the decoder's `Activations::head`).
        ctx.activations = if bits == 8 {
            Activations::Int16
        } else {
            Activations::Int16Q8Int8
        };
        let one = rows * cols * bits / 8 + rows * cols / 32 * 4;
        let copies = ((mb * 1e6) as usize / one).max(1);
        let store: Vec<_> = (0..copies)
            .map(|_| {
                let words: Vec<u32> = (0..rows * cols * bits / 32).map(|_| rng.next()).collect();
                let g = rows * cols / 32;
                let s: Vec<f16> = (0..g).map(|_| f16::from_f32(rng.unit() * 0.1)).collect();
                let b: Vec<f16> = (0..g).map(|_| f16::from_f32(rng.unit() * 0.1)).collect();
                (words, s, b)
            })
            .collect();
        let mats: Vec<Matrix<'_>> = store
            .iter()
            .map(|(w, s, b)| {
                if bits == 8 {
                    Matrix::symmetric(w, Floats::F16(s), rows, cols, 8, 32)
                } else {
                    Matrix::affine(w, Floats::F16(s), Floats::F16(b), rows, cols, 4, 32)
                }
            })
            .collect::<Result<_, _>>()?;
        // The lane kernel over each matrix's lane layout (`Lanes16`, made here once).
        let lanes: Vec<Lanes16> = if bits == 4 {
            mats.iter().map(Lanes16::pack).collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let laned: Vec<Matrix<'_>> = mats
            .iter()
            .zip(&lanes)
            .map(|(w, l)| w.with_lanes(l))
            .collect::<Result<_, _>>()?;
        for round in 0..rounds {
            let mut base = 0.0;
            for m in 1..=max_rows {
                let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
                let q: Vec<i16> = (0..m * cols)
                    .map(|_| (rng.next() % 65535) as i32 as i16)
                    .map(|v| v.max(-32767))
                    .collect();
                let d: Vec<f32> = (0..m * cols / 32)
                    .map(|_| rng.unit().abs() * 1e-4)
                    .collect();
                let s: Vec<f32> = (0..m * cols / 32).map(|_| rng.unit()).collect();
                let mut out = vec![0f32; m * rows];
                let reps = (copies * 8).max(40);
                let mut best = [f64::INFINITY; 4];
                for i in 0..reps {
                    for (k, b) in best.iter_mut().enumerate() {
                        if bits == 8 && k > 0 {
                            continue;
                        }
                        let w = if k == 3 {
                            &laned[(i + k) % copies]
                        } else {
                            &mats[(i + k) % copies]
                        };
                        let t = std::time::Instant::now();
                        match k {
                            0 | 1 | 3 => {
                                ctx.lane4 = k != 0;
                                let mut jobs = [MatJob {
                                    w,
                                    bias: None,
                                    out: &mut out,
                                }];
                                matmul_t_each(
                                    &ctx,
                                    std::hint::black_box(&x),
                                    m,
                                    &mut jobs,
                                    &mut scratch,
                                )?;
                            }
                            _ => {
                                if !amx || m > amx_verify::AMX_MAX_M {
                                    continue;
                                }
                                amx_verify::products(Kernel::Amx, w, &q, &d, &s, m, None, &mut out);
                            }
                        }
                        *b = b.min(t.elapsed().as_secs_f64());
                    }
                }
                if m == 1 {
                    base = best[0];
                }
                println!(
                    "round {round} {rows}x{cols} m={m}: default {:.1} us ({:.2}) | lane {:.1} us ({:.2}) | amx {:.1} us ({:.2}) | lanes16 {:.1} us ({:.2})",
                    best[0] * 1e6,
                    best[0] / base,
                    best[1] * 1e6,
                    best[1] / base,
                    best[2] * 1e6,
                    best[2] / base,
                    best[3] * 1e6,
                    best[3] / base
                );
            }
        }
    }
    Ok(())
}
