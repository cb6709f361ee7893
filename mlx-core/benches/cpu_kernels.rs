//! Micro-benchmarks of the CPU decoder's kernels (`mlx_core::cpu`), each instruction set the
//! machine has against the scalar reference, at SmolLM2-135M's shapes:
//!
//!     cargo bench -p mlx-core --bench cpu_kernels
//!
//! Figures go under `results/bench/` when they back a claim, never into source comments.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use mlx_core::cpu::{
    attention, attention_f16, matmul_t, matmul_t_each, Activations, AttentionShape, CpuContext,
    Floats, Isa, MatJob, Matrix, RowsScratch,
};

#[path = "../examples/support/bench_data.rs"]
mod bench_data;
use bench_data::{Affine, Lcg};

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
        let a4 = Affine::random(&mut rng, (rows, cols, 4, 32), 0.1, 0.1);
        let mats = [
            (
                "f16",
                Matrix::dense(Floats::F16(&dense), rows, cols).expect("dense matrix"),
            ),
            ("affine4g32", a4.matrix().expect("affine matrix")),
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

/// SmolLM2-135M's tied head (49152 x 576, GGUF Q8_0 as MLX 8-bit, groups of 32, half
/// scales), one decode input: int16 activations against `Int16Q8Int8`'s int8 VNNI kernel.
fn head(c: &mut Criterion) {
    if !Isa::Avx512.available() {
        return;
    }
    let (rows, cols) = (49152usize, 576usize);
    let mut rng = Lcg(11);
    let a8 = Affine::random(&mut rng, (rows, cols, 8, 32), 0.01, 0.1);
    let w = a8.matrix().expect("affine matrix");
    let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
    let mut out = vec![0f32; rows];
    let mut group = c.benchmark_group(format!("head/{rows}x{cols}/m1"));
    group.throughput(Throughput::Bytes((rows * cols) as u64));
    for (name, act) in [
        ("int16", Activations::Int16),
        ("int16q8int8", Activations::Int16Q8Int8),
    ] {
        let mut ctx = CpuContext::with_isa(0, Isa::Avx512).expect("cpu context");
        ctx.activations = act;
        let mut scratch = RowsScratch::default();
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut jobs = [MatJob {
                    w: &w,
                    bias: None,
                    out: &mut out,
                }];
                matmul_t_each(&ctx, black_box(&x), 1, &mut jobs, &mut scratch)
                    .expect("matmul_t_each");
            })
        });
    }
    group.finish();
}

/// One decode step's attention of one layer at SmolLM2-135M's heads (9 query, 3 KV, 64 wide)
/// over 600 cached positions: a float32 cache against a float16 one.
fn decode_attention(c: &mut Criterion) {
    let (nh, nkv, hd, n) = (9usize, 3usize, 64usize, 600usize);
    let mut rng = Lcg(13);
    let k: Vec<f32> = (0..nkv * n * hd).map(|_| rng.unit()).collect();
    let v: Vec<f32> = (0..nkv * n * hd).map(|_| rng.unit()).collect();
    let (k16, v16): (Vec<f16>, Vec<f16>) = (
        k.iter().map(|&a| f16::from_f32(a)).collect(),
        v.iter().map(|&a| f16::from_f32(a)).collect(),
    );
    let q: Vec<f32> = (0..nh * hd).map(|_| rng.unit()).collect();
    let mut out = vec![0f32; nh * hd];
    let shape = AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        capacity: n,
    };
    let scale = 0.125;
    let mut group = c.benchmark_group(format!("attention/{nh}x{nkv}x{hd}/{n}"));
    for isa in isas() {
        let ctx = CpuContext::with_isa(0, isa).expect("cpu context");
        group.bench_function(BenchmarkId::new("f32", isa.name()), |b| {
            b.iter(|| {
                attention(
                    &ctx,
                    shape,
                    black_box(&q),
                    &k,
                    &v,
                    n - 1,
                    1,
                    scale,
                    &mut out,
                )
                .expect("attention")
            })
        });
        group.bench_function(BenchmarkId::new("f16", isa.name()), |b| {
            b.iter(|| {
                attention_f16(
                    &ctx,
                    shape,
                    black_box(&q),
                    &k16,
                    &v16,
                    n - 1,
                    1,
                    scale,
                    &mut out,
                )
                .expect("attention")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, matvec, head, decode_attention);
criterion_main!(benches);
