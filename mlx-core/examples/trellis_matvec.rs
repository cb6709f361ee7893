//! Decode-step products at SmolLM2-135M's linear shapes, fastest of many runs: trellis 3-bit
//! (the first kernel `cpu::trellis::matvec_rows`, and the fused `TrellisMatvec` on one thread
//! and on every thread) against the CPU decoder's affine 4-bit kernel (`cpu::matmul_t`, group
//! 64, its default int16 activations, one thread and every thread), and the whole product the
//! CPU decoder runs for a trellis linear (`cpu::Matrix::trellis` through `matmul_t`: signs, block
//! Walsh-Hadamard transforms of input and output, the fused kernel on every thread).
//! `cargo run --release -p mlx-core --example trellis_matvec [L] [THREADS] [BLOCK] [f32|int16] [1mad|1mad8]`
//! (release: the portable kernels are compiler-vectorized Rust, tens of times slower in a debug
//! build; `f32`: the table path with float32 inputs instead of its default int16 ones).

use half::f16;
use mlx_core::cpu::trellis::{
    layer_signs, matvec_rows, quantize, TrellisMatvec, TrellisSpec, TrellisView,
};
use mlx_core::cpu::{matmul_t, Activations, CpuContext, Floats, MatJob, Matrix};

fn best(reps: usize, mut f: impl FnMut()) -> u64 {
    let mut b = u64::MAX;
    for _ in 0..reps {
        let t = std::time::Instant::now();
        f();
        b = b.min(t.elapsed().as_nanos() as u64);
    }
    b
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let l: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(12);
    let threads: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(mlx_core::cpu::available_threads);
    let block: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(64);
    let exact = args.next().as_deref() == Some("f32");
    // A fifth argument names the code (`1mad`, the default, or `1mad8`).
    let code = args
        .next()
        .and_then(|s| mlx_core::cpu::trellis::TrellisCode::from_name(&s))
        .unwrap_or_default();
    let mut ctx1 = CpuContext::with_isa(1, mlx_core::cpu::Isa::detect())?;
    ctx1.activations = Activations::Int16;
    let mut ctxn = CpuContext::with_isa(threads, mlx_core::cpu::Isa::detect())?;
    ctxn.activations = Activations::Int16;
    let mut z = 7u64;
    let mut unit = move || {
        z = z
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let mut tot = [0f64; 7];
    let mut stream = [0f64; 2];
    println!(
        "isa {:?}, trellis SIMD {}, table path {} ({} inputs), {threads} threads, L {l}, code {}",
        ctx1.isa,
        mlx_core::cpu::trellis::simd_available(),
        mlx_core::cpu::trellis::lut_available() && l <= 8,
        if exact { "float32" } else { "int16" },
        code.name()
    );
    // (rows, cols, per layer): q/o, k/v, gate/up, down.
    for (rows, cols, per_layer) in [(576, 576, 2), (192, 576, 2), (1536, 576, 2), (576, 1536, 1)] {
        let w: Vec<f32> = (0..rows * cols).map(|_| unit()).collect();
        let x: Vec<f32> = (0..cols).map(|_| unit()).collect();
        let spec = TrellisSpec {
            k: 3,
            l,
            block,
            code,
        };
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
        let plan = TrellisMatvec::new(&spec, cols)?;
        let plan = if exact { plan } else { plan.int16_inputs() };
        let gather = plan.clone().without_table();
        let mut out = vec![0f32; rows];
        let reps = 200;
        let affine = |ctx: &CpuContext, out: &mut Vec<f32>| {
            let mut jobs = [MatJob {
                w: &m,
                bias: None,
                out,
            }];
            matmul_t(ctx, std::hint::black_box(&x), 1, &mut jobs).expect("affine");
        };
        let a1 = best(reps, || affine(&ctx1, &mut out));
        let an = best(reps, || affine(&ctxn, &mut out));
        let old = best(reps / 10, || {
            matvec_rows(
                &spec,
                &words,
                &scales,
                cols,
                std::hint::black_box(&x),
                0,
                &mut out,
            )
        });
        let t1 = best(reps, || {
            plan.rows(&words, &scales, std::hint::black_box(&x), 0, &mut out)
                .expect("trellis")
        });
        let tg = best(reps, || {
            gather
                .rows(&words, &scales, std::hint::black_box(&x), 0, &mut out)
                .expect("trellis")
        });
        let tn = best(reps, || {
            plan.par(
                &ctxn.pool,
                &words,
                &scales,
                std::hint::black_box(&x),
                &mut out,
            )
            .expect("trellis")
        });
        let (su, sv) = layer_signs(5, rows, cols);
        let tm = Matrix::trellis(TrellisView::new(&words, &scales, &su, &sv, &plan)?);
        let dn = best(reps, || {
            let mut jobs = [MatJob {
                w: &tm,
                bias: None,
                out: &mut out,
            }];
            matmul_t(&ctxn, std::hint::black_box(&x), 1, &mut jobs).expect("trellis");
        });
        println!(
            "{rows}x{cols}: affine-4 {a1} ns ({threads} threads {an}), trellis-3 first kernel {old} ns, fused {t1} ns (window-gather path {tg} ns; {threads} threads {tn}, decoder's whole product {dn}); fused/affine {:.2}x",
            t1 as f64 / a1 as f64
        );
        for (s, v) in tot.iter_mut().zip([a1, an, old, t1, tn, dn, tg]) {
            *s += (v * per_layer) as f64 * 30.0 / 1e6;
        }
        // Streamed from memory, as in a decode step: the 30 layers' copies of this shape, each
        // read once a sweep (best of a few sweeps), one thread, the table (or SIMD) kernel
        // against the affine 4-bit one.
        let n = 30 * per_layer as usize;
        let tw: Vec<Vec<u32>> = (0..n).map(|_| words.clone()).collect();
        let awc: Vec<Vec<u32>> = (0..n).map(|_| aw.clone()).collect();
        let am: Vec<Matrix> = awc
            .iter()
            .map(|a| Matrix::affine(a, Floats::F16(&sc), Floats::F16(&bi), rows, cols, 4, 64))
            .collect::<Result<_, _>>()?;
        let sweeps = 5;
        let st = best(sweeps, || {
            for w in &tw {
                plan.rows(w, &scales, std::hint::black_box(&x), 0, &mut out)
                    .expect("trellis");
            }
        });
        let sa = best(sweeps, || {
            for m in &am {
                let mut jobs = [MatJob {
                    w: m,
                    bias: None,
                    out: &mut out,
                }];
                matmul_t(&ctx1, std::hint::black_box(&x), 1, &mut jobs).expect("affine");
            }
        });
        println!(
            "  streamed, {n} copies: affine-4 {:.3} ms, trellis-3 {:.3} ms ({:.2}x)",
            sa as f64 / 1e6,
            st as f64 / 1e6,
            st as f64 / sa as f64
        );
        stream[0] += sa as f64 / 1e6;
        stream[1] += st as f64 / 1e6;
    }
    println!(
        "30 layers' linears streamed from memory, one thread: affine-4 {:.2} ms, trellis-3 {:.2} ms ({:.2}x)",
        stream[0],
        stream[1],
        stream[1] / stream[0]
    );
    println!(
        "30 layers' linears, one token: affine-4 {:.2} ms (one thread), {:.2} ms ({threads}); trellis-3 first kernel {:.2} ms, fused {:.2} ms (one thread; window-gather path {:.2} ms), {:.2} ms ({threads}), the decoder's whole products {:.2} ms ({threads})",
        tot[0], tot[1], tot[2], tot[3], tot[6], tot[4], tot[5]
    );
    Ok(())
}
