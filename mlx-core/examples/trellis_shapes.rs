//! One decode step's products of one shape, streamed from memory as in a decode step:
//! trellis-3 `1mad8` (L 8, blocks of 32, the CPU decoder's int8 kernel; the kernel alone and
//! the decoder's whole product with its transforms, `matmul_t` on a trellis `Matrix`) against
//! affine-4 (group 64, float16 scales and biases, the decoder's kernel, int16 inputs), each
//! over `COPIES` copies of the matrix read once a sweep, on `THREADS` threads (the kernel
//! alone: one thread). The words are random (every bit pattern is a valid trellis stream), so
//! no encoding runs and it starts at once. (Valgrind has no AVX-512: under callgrind every
//! kernel takes its portable path, so count instructions with objdump instead.) Variants
//! alternate sweep by sweep; the line gives each one's median and best sweep (`ONLY`: one).
//! `cargo run --release -p mlx-core --example trellis_shapes -- ROWS COLS [COPIES] [SWEEPS] [THREADS] [ONLY]`
//! (`ONLY`: `a4`, `t8` or `t8whole`). The kernel's knobs (`MLX_CPU_TRELLIS_PF`,
//! `MLX_CPU_TRELLIS_ROWS2`, `MLX_CPU_TRELLIS_CHUNK`) apply.

use half::f16;
use mlx_core::cpu::trellis::{layer_signs, TrellisCode, TrellisMatvec, TrellisSpec, TrellisView};
use mlx_core::cpu::{matmul_t, Activations, CpuContext, Floats, MatJob, Matrix};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: usize| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (rows, cols) = (num(0, 576), num(1, 576));
    let copies = num(2, 30).max(1);
    let sweeps = num(3, 20).max(1);
    let threads = num(4, 1).max(1);
    let only = a.get(5).cloned();
    let run = |v: &str| only.as_deref().is_none_or(|o| o == v);
    let z = std::cell::Cell::new(7u64);
    let next = || {
        z.set(
            z.get()
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
        z.get()
    };
    let unit = || (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
    let mut ctx = CpuContext::with_isa(threads, mlx_core::cpu::Isa::detect())?;
    ctx.activations = Activations::Int16;
    let mut ctx1 = CpuContext::with_isa(1, mlx_core::cpu::Isa::detect())?;
    ctx1.activations = Activations::Int16;
    let x: Vec<f32> = (0..cols).map(|_| unit()).collect();
    let spec = TrellisSpec {
        k: 3,
        l: 8,
        block: 32,
        code: TrellisCode::Mad8,
    };
    let plan = TrellisMatvec::new(&spec, cols)?.int16_inputs();
    let wpr = cols * 3 / 32;
    let tw: Vec<Vec<u32>> = (0..copies)
        .map(|_| (0..rows * wpr).map(|_| (next() >> 32) as u32).collect())
        .collect();
    let ts: Vec<f32> = (0..rows).map(|_| 0.01 + unit().abs() * 0.01).collect();
    let (su, sv) = layer_signs(5, rows, cols);
    let groups = rows * cols / 64;
    let sc: Vec<f16> = (0..groups).map(|_| f16::from_f32(unit() * 0.1)).collect();
    let bi: Vec<f16> = (0..groups).map(|_| f16::from_f32(unit() * 0.1)).collect();
    let aw: Vec<Vec<u32>> = (0..copies)
        .map(|_| {
            (0..rows * cols / 8)
                .map(|_| (next() >> 32) as u32)
                .collect()
        })
        .collect();
    let am: Vec<Matrix> = aw
        .iter()
        .map(|w| Matrix::affine(w, Floats::F16(&sc), Floats::F16(&bi), rows, cols, 4, 64))
        .collect::<Result<_, _>>()?;
    let tv: Vec<TrellisView> = tw
        .iter()
        .map(|w| TrellisView::new(w, &ts, &su, &sv, &plan))
        .collect::<Result<_, _>>()?;
    let tm: Vec<Matrix> = tv.iter().map(|v| Matrix::trellis(*v)).collect();
    let mut out = vec![0f32; rows];
    let mut times: [Vec<u64>; 3] = Default::default();
    for _ in 0..sweeps {
        if run("a4") {
            let t = std::time::Instant::now();
            for m in &am {
                let mut jobs = [MatJob {
                    w: m,
                    bias: None,
                    out: &mut out,
                }];
                matmul_t(&ctx, std::hint::black_box(&x), 1, &mut jobs)?;
            }
            times[0].push(t.elapsed().as_nanos() as u64);
        }
        if run("t8") {
            let t = std::time::Instant::now();
            for w in &tw {
                plan.rows(w, &ts, std::hint::black_box(&x), 0, &mut out)?;
            }
            times[1].push(t.elapsed().as_nanos() as u64);
        }
        if run("t8whole") {
            let t = std::time::Instant::now();
            for m in &tm {
                let mut jobs = [MatJob {
                    w: m,
                    bias: None,
                    out: &mut out,
                }];
                matmul_t(&ctx, std::hint::black_box(&x), 1, &mut jobs)?;
            }
            times[2].push(t.elapsed().as_nanos() as u64);
        }
    }
    let per = |v: &mut Vec<u64>| {
        v.sort_unstable();
        (
            v[v.len() / 2] as f64 / 1e3 / copies as f64,
            v[0] as f64 / 1e3 / copies as f64,
        )
    };
    let mut line = format!("{rows}x{cols} copies {copies} sweeps {sweeps} threads {threads}:");
    let mut med = [0f64; 3];
    for (i, name) in ["a4 (threads)", "t8 kernel (1 thread)", "t8 whole (threads)"]
        .iter()
        .enumerate()
    {
        if !times[i].is_empty() {
            let (m, b) = per(&mut times[i]);
            med[i] = m;
            line += &format!(" {name} median {m:.2} us best {b:.2} us;");
        }
    }
    if med[0] > 0.0 && med[2] > 0.0 {
        line += &format!(" whole/a4 {:.3}", med[2] / med[0]);
    }
    println!("{line}");
    Ok(())
}
