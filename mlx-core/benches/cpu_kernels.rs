//! Micro-benchmarks of the CPU decoder's kernels (`mlx_core::cpu`), each instruction set the
//! machine has against the scalar reference, at SmolLM2-135M's shapes:
//!
//!     cargo bench -p mlx-core --bench cpu_kernels
//!
//! Figures go under `results/bench/` when they back a claim, never into source comments.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use mlx_core::cpu::{matmul_t, CpuContext, Floats, Isa, MatJob, Matrix};

/// A seeded pseudo-random sequence (no `rand` dependency needed for benchmark data).
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

fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

/// `(rows, cols)`: SmolLM2-135M's attention output, MLP up and MLP down projections.
const SHAPES: [(usize, usize); 3] = [(576, 576), (1536, 576), (576, 1536)];

fn matvec(c: &mut Criterion) {
    let mut rng = Lcg(7);
    for (rows, cols) in SHAPES {
        let dense: Vec<f16> = (0..rows * cols)
            .map(|_| f16::from_f32(rng.unit()))
            .collect();
        let words: Vec<u32> = (0..rows * cols / 8).map(|_| rng.next()).collect();
        let groups = rows * cols / 32;
        let scales: Vec<f16> = (0..groups)
            .map(|_| f16::from_f32(rng.unit() * 0.1))
            .collect();
        let biases: Vec<f16> = (0..groups)
            .map(|_| f16::from_f32(rng.unit() * 0.1))
            .collect();
        let mats = [
            (
                "f16",
                Matrix::dense(Floats::F16(&dense), rows, cols).expect("dense matrix"),
            ),
            (
                "affine4g32",
                Matrix::affine(
                    &words,
                    Floats::F16(&scales),
                    Floats::F16(&biases),
                    rows,
                    cols,
                    4,
                    32,
                )
                .expect("affine matrix"),
            ),
        ];
        for m in [1usize, 32] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; m * rows];
            let mut group = c.benchmark_group(format!("matmul_t/{rows}x{cols}/m{m}"));
            group.throughput(Throughput::Elements((m * rows * cols) as u64));
            for (name, w) in &mats {
                for isa in isas() {
                    let ctx = CpuContext::with_isa(0, isa).expect("cpu context");
                    group.bench_function(BenchmarkId::new(*name, isa.name()), |b| {
                        b.iter(|| {
                            let mut jobs = [MatJob {
                                w,
                                bias: None,
                                out: &mut out,
                            }];
                            matmul_t(&ctx, black_box(&x), m, &mut jobs).expect("matmul_t");
                        })
                    });
                }
            }
            group.finish();
        }
    }
}

criterion_group!(benches, matvec);
criterion_main!(benches);
