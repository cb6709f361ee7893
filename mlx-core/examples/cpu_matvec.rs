//! Times the CPU decoder's matrix-vector products at SmolLM2-135M's shapes on one thread, as the fastest
//! of many runs (steady on a machine other work loads): `cargo run -p mlx-core --example
//! cpu_matvec [f32|int16|int8] [scalar|avx2|avx512]`. Prints ns per product and the weight bytes read per ns.
//! `cpu_matvec each` instead times the decode step's products (`matmul_t_each`, one and four
//! inputs) under `Int16Q8Int8` and `Int8Vnni`, alternating the two in this process.
//! `cpu_matvec dispatch [THREADS]` times empty pool dispatches (what a decode step's 151 pool
//! runs cost beyond their work): median and fastest of 200 steps of 151.
//! `cpu_matvec attention [THREADS] [POSITIONS]` times one decode step's attention over a float16
//! cache at SmolLM2-135M's shapes (30 layers of 9 query / 3 KV heads of 64, 600 positions by
//! default, each layer's cache its own memory as in a step): median and fastest of 100 steps.
//! `cpu_matvec ggml [scalar|avx2|avx512] [f32|int16|int8]` times the GGML-block products
//! (`cpu::kquant`) of a decode step (`matmul_t_each`) at Gemma 3 270M's Q4_K_M shapes and types
//! (Q5_0 q/k/v/gate/up, Q4_K o/down, Q6_K down, Q8_0 v and the tied head) and SmolLM2-135M's
//! Q4_1 ones, one and four inputs, on one thread (or a fourth argument's count): fastest of
//! many runs. `f32` (the default):
//! float inputs (`Activations::F32`); `int16`: int16 inputs (`Int16Q8Int8`, the CPU decoder's
//! default); `int8`: int8 inputs (`Int8`).
//! `cpu_matvec split [THREADS]` times a decode step's 4-bit products (`matmul_t_each`, one
//! input, `Int16Q8Int8`) at SmolLM2-135M's and SmolLM2-360M's shapes, groups of 32 and 64 with
//! float16 scales, through the split-byte kernel (`CpuContext::split4`, the default) and the
//! pair kernel, alternating in this process: the fastest of many runs of each, and their ratio.
//! `cpu_matvec kgemm [THREADS] [M]` times a prompt block's GGML products (M rows, 32 by default:
//! the CPU decoder's prefill block) at the same shapes three ways, alternating in this process:
//! `matmul_t` (the panel kernels of `cpu::kgemm`: each weight panel decoded once to floats),
//! the per-row kernels with float inputs (four rows a pass: what `matmul_t` ran before) and
//! with int8 inputs summed by VNNI (`Int8Vnni`, llama.cpp's way with Q8_0 activations), both
//! through `matmul_t_each`. Prints the fastest of many runs and GFLOP/s (2 per weight and row).
//! `cpu_matvec prefill [THREADS] [M]` times a prompt block's affine products (M rows, 32 by
//! default) at SmolLM2-360M's shapes (what its Q4_0 / Q8_0 GGUFs load as: 4-bit and 8-bit in
//! groups of 32 with float16 scales; and 4-bit in groups of 64, an MLX model) under the CPU
//! decoder's default activations, with AMX's tiles (`cpu::amx`, where the CPU has them) and
//! without (the AVX-512 float kernel), alternating in this process: fastest of many runs and
//! G multiply-adds/s. `amx` is the default tile kernel (weights dequantized once a call, one
//! 16-row panel a unit), `amx/pass` the one before it (dequantized once a pass of 32 inputs),
//! `amx/2panel` the default over two panels a unit: all three give the same bits.

use half::f16;
use mlx_core::cpu::{
    matmul_t, matmul_t_each, Activations, CpuContext, Floats, Isa, MatJob, Matrix, RowsScratch,
};

#[path = "support/bench_data.rs"]
mod bench_data;
use bench_data::{random_ggml, Affine, Lcg};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("prefill") {
        return prefill();
    }
    if std::env::args().nth(1).as_deref() == Some("each") {
        return each();
    }
    if std::env::args().nth(1).as_deref() == Some("dispatch") {
        return dispatch();
    }
    if std::env::args().nth(1).as_deref() == Some("attention") {
        if std::env::args().nth(2).as_deref() == Some("prompt") {
            return attention_prompt();
        }
        return attention();
    }
    if std::env::args().nth(1).as_deref() == Some("ggml") {
        return ggml();
    }
    if std::env::args().nth(1).as_deref() == Some("kgemm") {
        return kgemm();
    }
    if std::env::args().nth(1).as_deref() == Some("step") {
        return step();
    }
    if std::env::args().nth(1).as_deref() == Some("split") {
        return split();
    }
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
        let a = Affine::random(&mut rng, (rows, cols, bits, 32), 0.1, 0.1);
        let w = a.matrix()?;
        let bytes = a.bytes();
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

/// `Int16Q8Int8` against `Int8Vnni` through `matmul_t_each` on one thread, alternating per
/// round (the fastest of each side's runs).
fn each() -> Result<(), Box<dyn std::error::Error>> {
    let modes = [Activations::Int16Q8Int8, Activations::Int8Vnni];
    let ctxs = modes
        .iter()
        .map(|&a| {
            let mut c = CpuContext::new(1)?;
            c.activations = a;
            Ok(c)
        })
        .collect::<mlx_core::Result<Vec<_>>>()?;
    let mut rng = Lcg(7);
    let mut scratch = RowsScratch::default();
    for (rows, cols, bits) in [
        (576, 576, 4),
        (192, 576, 4),
        (1536, 576, 4),
        (576, 1536, 4),
        (49152, 576, 8),
    ] {
        let a = Affine::random(&mut rng, (rows, cols, bits, 32), 0.1, 0.1);
        let w = a.matrix()?;
        for m in [1usize, 4] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; m * rows];
            let reps = (100_000_000 / (rows * cols * m)).clamp(5, 1000);
            let mut best = [u64::MAX; 2];
            for _ in 0..reps {
                for (k, ctx) in ctxs.iter().enumerate() {
                    let t = std::time::Instant::now();
                    let mut jobs = [MatJob {
                        w: &w,
                        bias: None,
                        out: &mut out,
                    }];
                    matmul_t_each(ctx, std::hint::black_box(&x), m, &mut jobs, &mut scratch)?;
                    best[k] = best[k].min(t.elapsed().as_nanos() as u64);
                }
            }
            println!(
                "{rows}x{cols} {bits}-bit m={m}: int16q8int8 {} ns, int8vnni {} ns ({:.2}x)",
                best[0],
                best[1],
                best[0] as f64 / best[1] as f64
            );
        }
    }
    Ok(())
}

/// Empty pool runs, 151 a "step" (SmolLM2-135M's decode step), on all cores by default.
fn dispatch() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(2).map_or(Ok(0), |s| s.parse())?;
    let ctx = CpuContext::new(threads)?;
    let mut steps = Vec::new();
    for _ in 0..200 {
        let t = std::time::Instant::now();
        for _ in 0..151 {
            ctx.pool.run(&|w, _| {
                std::hint::black_box(w);
            });
        }
        steps.push(t.elapsed().as_nanos() as u64);
    }
    steps.sort_unstable();
    println!(
        "{} threads: 151 empty dispatches: median {:.1} us ({:.2} us each), fastest {:.1} us",
        ctx.pool.threads(),
        steps[steps.len() / 2] as f64 / 1e3,
        steps[steps.len() / 2] as f64 / 151e3,
        steps[0] as f64 / 1e3
    );
    Ok(())
}

/// A synthetic SmolLM2-135M decode step (Q4_1 layers as 4-bit affine with half factors, the
/// tied Q8_0 head as 8-bit, every layer its own memory, 97 MB a step), its products through
/// `matmul_t_each` as the CPU decoder runs them (q/k/v one run, o, gate/up one run, down,
/// head) and `attention_f16` at a depth, under `Int16Q8Int8`: median ms per part over the
/// steps, and the same step with one layer's weights reused 30 times (`hot`: from cache, so
/// what is left is compute and hand-offs). Beside it, a 2-thread read of the same bytes (the
/// bandwidth bound). `cpu_matvec step [THREADS] [DEPTH] [STEPS]`; `STEP_SHAPE=360m` for
/// SmolLM2-360M's shapes, `STEP_GROUP=64` for 4-bit groups of 64, `STEP_PAIR=1` for the pair
/// kernel (`CpuContext::split4` false).
fn step() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(2).map_or(Ok(0), |s| s.parse())?;
    let depth: usize = std::env::args().nth(3).map_or(Ok(600), |s| s.parse())?;
    let nsteps: usize = std::env::args().nth(4).map_or(Ok(60), |s| s.parse())?;
    let mut ctx = CpuContext::new(threads)?;
    ctx.activations = Activations::Int16Q8Int8;
    // `STEP_PAIR=1`: the 4-bit products through the pair kernel (`CpuContext::split4` false).
    ctx.split4 = std::env::var("STEP_PAIR").is_err();
    // `STEP_SHAPE=360m`: SmolLM2-360M's shapes (the official bench's Q4_0 / Q8_0 rows);
    // `STEP_GROUP=64`: the 4-bit layers in groups of 64 (an `mlx convert` g64 directory).
    let m360 = std::env::var("STEP_SHAPE").is_ok_and(|v| v == "360m");
    let (hid, inter, qd, kd, layers, vocab) = if m360 {
        (960usize, 2560usize, 960usize, 320usize, 32usize, 49152usize)
    } else {
        (576usize, 1536usize, 576usize, 192usize, 30usize, 49152usize)
    };
    let (nh, nkv, hd) = if m360 {
        (15usize, 5usize, 64usize)
    } else {
        (9usize, 3usize, 64usize)
    };
    let group4: usize = std::env::var("STEP_GROUP").map_or(Ok(32), |s| s.parse())?;
    println!(
        "shape {}, 4-bit groups of {group4}, {} kernel",
        if m360 { "360m" } else { "135m" },
        if ctx.split4 { "split" } else { "pair" }
    );
    let mut rng = Lcg(5);
    let mut mk = |rows: usize, cols: usize, bits: u32| -> Affine {
        let group = if bits == 4 { group4 } else { 32 };
        Affine::random(&mut rng, (rows, cols, bits, group), 0.1, 0.1)
    };
    // q, k, v, o, gate, up, down per layer.
    let stores: Vec<[Affine; 7]> = (0..layers)
        .map(|_| {
            [
                mk(qd, hid, 4),
                mk(kd, hid, 4),
                mk(kd, hid, 4),
                mk(hid, qd, 4),
                mk(inter, hid, 4),
                mk(inter, hid, 4),
                mk(hid, inter, 4),
            ]
        })
        .collect();
    let head_store = mk(vocab, hid, 8);
    let mats: Vec<Vec<Matrix<'_>>> = stores
        .iter()
        .map(|l| l.iter().map(|s| s.matrix().unwrap()).collect())
        .collect();
    let head = head_store.matrix().unwrap();
    // As the CPU decoder does with a model's weights (`MLX_CPU_HUGEPAGES=0`: not).
    let mut spans: Vec<(usize, usize)> = mats.iter().flatten().flat_map(|m| m.spans()).collect();
    spans.extend(head.spans());
    let advised = mlx_core::cpu::prefer_huge_pages(&spans);
    println!("huge pages: {:.1} MB advised", advised as f64 / 1e6);
    let bytes: usize = stores
        .iter()
        .flat_map(|l| l.iter())
        .chain(std::iter::once(&head_store))
        .map(Affine::bytes)
        .sum();
    let cap = depth + 1;
    let caches: Vec<(Vec<f16>, Vec<f16>)> = (0..layers)
        .map(|_| {
            let mut f = || {
                (0..nkv * cap * hd)
                    .map(|_| f16::from_f32(rng.unit()))
                    .collect::<Vec<f16>>()
            };
            (f(), f())
        })
        .collect();
    let kv_bytes = layers * 2 * nkv * cap * hd * 2;
    let shape = mlx_core::cpu::AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        capacity: cap,
    };
    let x: Vec<f32> = (0..inter).map(|_| rng.unit()).collect();
    let (mut q, mut k, mut v) = (vec![0f32; qd], vec![0f32; kd], vec![0f32; kd]);
    let mut att = vec![0f32; qd];
    let (mut o, mut g, mut u) = (vec![0f32; hid], vec![0f32; inter], vec![0f32; inter]);
    let mut logits = vec![0f32; vocab];
    let mut scratch = RowsScratch::default();
    if std::env::var("STEP_MATS").is_ok() {
        // Each matrix kind alone over the 30 layers (cold), one call a layer.
        let names = ["q", "k", "v", "o", "gate", "up", "down"];
        for (j, name) in names.iter().enumerate() {
            let mut best = u64::MAX;
            let mut meds = Vec::new();
            for _ in 0..20 {
                let t0 = std::time::Instant::now();
                for m in &mats {
                    let w = &m[j];
                    let mut out = vec![0f32; w.rows()];
                    let xin = &x[..w.cols()];
                    matmul_t_each(
                        &ctx,
                        xin,
                        1,
                        &mut [MatJob {
                            w,
                            bias: None,
                            out: &mut out,
                        }],
                        &mut scratch,
                    )?;
                }
                let e = t0.elapsed().as_nanos() as u64;
                best = best.min(e);
                meds.push(e);
            }
            meds.sort_unstable();
            let b: usize = stores.iter().map(|l| l[j].bytes()).sum();
            println!(
                "{name:<5} x30: fastest {:.3} ms ({:.1} GB/s), median {:.3} ms",
                best as f64 / 1e6,
                b as f64 / best as f64,
                meds[10] as f64 / 1e6
            );
        }
    }
    const PARTS: [&str; 7] = ["qkv", "attention", "o", "gate_up", "down", "head", "all"];
    // The next layer's keys and values (`share` of their lines) as the CPU decoder prefetches
    // them during a layer's gate/up and down products and the head (`cold-kvpf`).
    let kvpf = |li: usize, share: [f32; 2]| mlx_core::cpu::KvPrefetch {
        bufs: [Floats::F16(&caches[li].0), Floats::F16(&caches[li].1)],
        heads: nkv,
        stride: cap * hd,
        start: 0,
        len: (depth + 1) * hd,
        share,
    };
    let mut run = |hot: bool,
                   att_on: bool,
                   pf_on: bool|
     -> Result<Vec<Vec<u64>>, Box<dyn std::error::Error>> {
        let mut t = vec![Vec::new(); PARTS.len()];
        for _ in 0..nsteps {
            let mut part = [0u64; 7];
            let t0 = std::time::Instant::now();
            let mut last = t0;
            let mut lap = |i: usize, part: &mut [u64; 7]| {
                let now = std::time::Instant::now();
                part[i] += (now - last).as_nanos() as u64;
                last = now;
            };
            for li in 0..layers {
                let m = &mats[if hot { 0 } else { li }];
                let h = &x[..hid];
                let mut jobs = [
                    MatJob {
                        w: &m[0],
                        bias: None,
                        out: &mut q,
                    },
                    MatJob {
                        w: &m[1],
                        bias: None,
                        out: &mut k,
                    },
                    MatJob {
                        w: &m[2],
                        bias: None,
                        out: &mut v,
                    },
                ];
                matmul_t_each(&ctx, h, 1, &mut jobs, &mut scratch)?;
                lap(0, &mut part);
                if att_on {
                    let (kc, vc) = &caches[if hot { 0 } else { li }];
                    mlx_core::cpu::attention_f16(
                        &ctx, shape, &q, kc, vc, depth, 1, 0.125, &mut att,
                    )?;
                }
                lap(1, &mut part);
                matmul_t_each(
                    &ctx,
                    &att,
                    1,
                    &mut [MatJob {
                        w: &m[3],
                        bias: None,
                        out: &mut o,
                    }],
                    &mut scratch,
                )?;
                lap(2, &mut part);
                let mut jobs = [
                    MatJob {
                        w: &m[4],
                        bias: None,
                        out: &mut g,
                    },
                    MatJob {
                        w: &m[5],
                        bias: None,
                        out: &mut u,
                    },
                ];
                let next = (li + 1) % layers;
                let pf = |share| (pf_on && next != 0).then(|| kvpf(next, share));
                let act = ctx.activations;
                mlx_core::cpu::matmul_t_each_prefetch(
                    &ctx,
                    act,
                    h,
                    1,
                    &mut jobs,
                    &mut scratch,
                    pf([0.0, 0.66]).as_ref(),
                )?;
                lap(3, &mut part);
                mlx_core::cpu::matmul_t_each_prefetch(
                    &ctx,
                    act,
                    &x,
                    1,
                    &mut [MatJob {
                        w: &m[6],
                        bias: None,
                        out: &mut o,
                    }],
                    &mut scratch,
                    pf([0.66, 1.0]).as_ref(),
                )?;
                lap(4, &mut part);
            }
            if !hot {
                let pf = pf_on.then(|| kvpf(0, [0.0, 1.0]));
                mlx_core::cpu::matmul_t_each_prefetch(
                    &ctx,
                    ctx.activations,
                    &x[..hid],
                    1,
                    &mut [MatJob {
                        w: &head,
                        bias: None,
                        out: &mut logits,
                    }],
                    &mut scratch,
                    pf.as_ref(),
                )?;
            }
            lap(5, &mut part);
            part[6] = t0.elapsed().as_nanos() as u64;
            for (a, b) in t.iter_mut().zip(part) {
                a.push(b);
            }
        }
        for a in t.iter_mut() {
            a.sort_unstable();
        }
        Ok(t)
    };
    let med = |v: &Vec<u64>| v[v.len() / 2] as f64 / 1e6;
    for round in 0..2 {
        for (name, hot, att_on, pf_on) in [
            ("cold", false, true, false),
            ("cold-kvpf", false, true, true),
            ("cold-noattn", false, false, false),
            ("hot", true, true, false),
        ] {
            let t = run(hot, att_on, pf_on)?;
            let mut line = format!(
                "round {round} {name:<12} {} threads depth {depth}:",
                ctx.pool.threads()
            );
            for (i, p) in PARTS.iter().enumerate() {
                line += &format!(" {p} {:.3}", med(&t[i]));
            }
            let all = med(&t[6]);
            line += &format!(" (fastest {:.3})", t[6][0] as f64 / 1e6);
            if !hot {
                let b = bytes + if att_on { kv_bytes } else { 0 };
                line += &format!(
                    " ms | {:.1} tok/s, {:.1} GB/s",
                    1e3 / all,
                    b as f64 / all / 1e6
                );
            }
            println!("{line}");
        }
        // The bandwidth bound: every worker sums its half of the weight words, statically split.
        let all: Vec<&[u32]> = stores
            .iter()
            .flat_map(|l| l.iter())
            .chain(std::iter::once(&head_store))
            .map(|s| &s.words[..])
            .collect();
        let mut best = Vec::new();
        for _ in 0..20 {
            let t0 = std::time::Instant::now();
            let acc = std::sync::atomic::AtomicU64::new(0);
            ctx.pool.run(&|w, n| {
                let mut s = 0u64;
                for a in &all {
                    let per = a.len().div_ceil(n);
                    let part = &a[(w * per).min(a.len())..((w + 1) * per).min(a.len())];
                    let mut l = [0u32; 16];
                    for c in part.chunks_exact(16) {
                        for (x, y) in l.iter_mut().zip(c) {
                            *x = x.wrapping_add(*y);
                        }
                    }
                    s += l.iter().map(|&v| v as u64).sum::<u64>();
                }
                acc.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
            });
            std::hint::black_box(acc.load(std::sync::atomic::Ordering::Relaxed));
            best.push(t0.elapsed().as_nanos() as u64);
        }
        best.sort_unstable();
        let words: usize = all.iter().map(|a| a.len() * 4).sum();
        println!(
            "round {round} read of the {:.1} MB of weight words: median {:.3} ms, {:.1} GB/s",
            words as f64 / 1e6,
            best[10] as f64 / 1e6,
            words as f64 / best[10] as f64
        );
    }
    Ok(())
}

/// One decode row's `attention_f16` over 30 layers' caches (what a step reads), all cores by
/// default.
fn attention() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(2).map_or(Ok(0), |s| s.parse())?;
    let n: usize = std::env::args().nth(3).map_or(Ok(600), |s| s.parse())?;
    let ctx = CpuContext::new(threads)?;
    let (nh, nkv, hd, layers) = (9usize, 3usize, 64usize, 30usize);
    let shape = mlx_core::cpu::AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        capacity: n,
    };
    let mut rng = Lcg(11);
    let caches: Vec<(Vec<f16>, Vec<f16>)> = (0..layers)
        .map(|_| {
            let mut f = || {
                (0..nkv * n * hd)
                    .map(|_| f16::from_f32(rng.unit()))
                    .collect::<Vec<f16>>()
            };
            (f(), f())
        })
        .collect();
    let q: Vec<f32> = (0..nh * hd).map(|_| rng.unit()).collect();
    let mut out = vec![0f32; nh * hd];
    let mut steps = Vec::new();
    for _ in 0..100 {
        let t = std::time::Instant::now();
        for (k, v) in &caches {
            mlx_core::cpu::attention_f16(&ctx, shape, &q, k, v, n - 1, 1, 0.125, &mut out)?;
        }
        steps.push(t.elapsed().as_nanos() as u64);
    }
    steps.sort_unstable();
    println!(
        "{} threads: attention_f16 {nh}/{nkv}x{hd} at {n} positions, {layers} layers: median \
         {:.1} us a step, fastest {:.1} us",
        ctx.pool.threads(),
        steps[steps.len() / 2] as f64 / 1e3,
        steps[0] as f64 / 1e3
    );
    Ok(())
}

/// `cpu_matvec attention prompt [THREADS]`: one prompt block's attention (32 rows) at Gemma 3
/// 270M's heads (4 query heads, 1 KV head, width 256, float16 cache) at several depths, the
/// decode kernel (`attention_f16`, each row alone) against the prompt kernel
/// (`attention_prompt_f16`), alternating, fastest of many runs.
fn attention_prompt() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(3).map_or(Ok(1), |s| s.parse())?;
    let ctx = CpuContext::new(threads)?;
    let (nh, nkv, hd, m, cap) = (4usize, 1usize, 256usize, 32usize, 1024usize);
    let shape = mlx_core::cpu::AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        capacity: cap,
    };
    let mut rng = Lcg(13);
    let mut f = || {
        (0..nkv * cap * hd)
            .map(|_| f16::from_f32(rng.unit()))
            .collect::<Vec<f16>>()
    };
    let (k, v) = (f(), f());
    let q: Vec<f32> = (0..m * nh * hd).map(|_| rng.unit()).collect();
    let mut out = vec![0f32; m * nh * hd];
    println!("threads {threads}: one 32-row prompt block, 4/1 heads x 256, float16 cache");
    let mut totals = [0u64; 2];
    for start in [0usize, 128, 256, 480] {
        let mut best = [u64::MAX; 2];
        for _ in 0..200 {
            for (i, b) in best.iter_mut().enumerate() {
                let t = std::time::Instant::now();
                if i == 0 {
                    mlx_core::cpu::attention_f16(
                        &ctx, shape, &q, &k, &v, start, m, 0.0625, &mut out,
                    )?;
                } else {
                    mlx_core::cpu::attention_prompt_f16(
                        &ctx, shape, &q, &k, &v, start, m, None, 0.0625, &mut out,
                    )?;
                }
                *b = (*b).min(t.elapsed().as_nanos() as u64);
            }
        }
        // Multiply-adds: scores and weighted values over each row's causal span, per head.
        let macs: f64 = (0..m).map(|t| (start + t + 1) as f64).sum::<f64>() * (2 * nh * hd) as f64;
        println!(
            "start {start}: rows alone {} ns ({:.1} GFLOP/s), prompt kernel {} ns ({:.1}), {:.2}x",
            best[0],
            2.0 * macs / best[0] as f64,
            best[1],
            2.0 * macs / best[1] as f64,
            best[0] as f64 / best[1] as f64
        );
        totals[0] += best[0];
        totals[1] += best[1];
    }
    println!(
        "sum of the four depths: rows alone {} ns, prompt kernel {} ns ({:.2}x)",
        totals[0],
        totals[1],
        totals[0] as f64 / totals[1] as f64
    );
    Ok(())
}

/// GGML-block products at Gemma 3 270M's shapes (see the module's note).
fn ggml() -> Result<(), Box<dyn std::error::Error>> {
    use mlx_core::cpu::kquant::GgmlType;
    let isa = match std::env::args().nth(2).as_deref() {
        Some("scalar") => Isa::Scalar,
        Some("avx2") => Isa::Avx2,
        Some("avx512") => Isa::Avx512,
        _ => Isa::detect(),
    };
    let threads: usize = std::env::args().nth(4).map_or(Ok(1), |s| s.parse())?;
    let mut ctx = CpuContext::with_isa(threads, isa)?;
    let inputs = std::env::args().nth(3).unwrap_or_else(|| "f32".into());
    ctx.activations = match inputs.as_str() {
        "int8" => Activations::Int8,
        "int16" => Activations::Int16Q8Int8,
        _ => Activations::F32,
    };
    let mut scratch = RowsScratch::default();
    let mut rng = Lcg(7);
    for (rows, cols, ty, what) in [
        (1024, 640, GgmlType::Q5_0, "q_proj"),
        (256, 640, GgmlType::Q5_0, "k/v_proj"),
        (256, 640, GgmlType::Q8_0, "v_proj"),
        (640, 1024, GgmlType::Q4_K, "o_proj"),
        (2048, 640, GgmlType::Q5_0, "gate/up_proj"),
        (640, 2048, GgmlType::Q4_K, "down_proj"),
        (640, 2048, GgmlType::Q6_K, "down_proj"),
        (262_144, 640, GgmlType::Q8_0, "tied head"),
        (576, 576, GgmlType::Q4_1, "smollm2 q/o_proj"),
        (1536, 576, GgmlType::Q4_1, "smollm2 gate/up_proj"),
        (576, 1536, GgmlType::Q4_1, "smollm2 down_proj"),
    ] {
        let data = random_ggml(&mut rng, ty, rows, cols);
        let w = Matrix::ggml(&data, ty, rows, cols)?;
        for m in [1usize, 4] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; m * rows];
            let reps = (100_000_000 / (rows * cols * m)).clamp(5, 2000);
            let mut best = u64::MAX;
            for _ in 0..reps {
                let t = std::time::Instant::now();
                let mut jobs = [MatJob {
                    w: &w,
                    bias: None,
                    out: &mut out,
                }];
                matmul_t_each(&ctx, std::hint::black_box(&x), m, &mut jobs, &mut scratch)?;
                best = best.min(t.elapsed().as_nanos() as u64);
            }
            println!(
                "{what} {rows}x{cols} {} m={m} ({}, {inputs} inputs): {best} ns, {:.2} GB/s of \
                 weights, {:.2} GMAC/s",
                ty.name(),
                isa.name(),
                data.len() as f64 / best as f64,
                (rows * cols * m) as f64 / best as f64
            );
        }
    }
    Ok(())
}

/// Prompt-block GGML products three ways (see the module's note).
fn kgemm() -> Result<(), Box<dyn std::error::Error>> {
    use mlx_core::cpu::kquant::GgmlType;
    let threads: usize = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let m: usize = std::env::args()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut ctx = CpuContext::new(threads)?;
    let mut scratch = RowsScratch::default();
    let mut rng = Lcg(7);
    println!("threads {threads}, m {m}, {}", ctx.isa.name());
    let mut totals = [0u64; 4];
    for (rows, cols, ty, what) in [
        (1024, 640, GgmlType::Q5_0, "q_proj"),
        (256, 640, GgmlType::Q5_0, "k_proj"),
        (256, 640, GgmlType::Q8_0, "v_proj"),
        (640, 1024, GgmlType::Q4_K, "o_proj"),
        (2048, 640, GgmlType::Q5_0, "gate_proj"),
        (2048, 640, GgmlType::Q5_0, "up_proj"),
        (640, 2048, GgmlType::Q4_K, "down_proj"),
        (640, 2048, GgmlType::Q6_K, "down_proj"),
    ] {
        let data = random_ggml(&mut rng, ty, rows, cols);
        let w = Matrix::ggml(&data, ty, rows, cols)?;
        let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
        let mut out = vec![0f32; m * rows];
        let reps = (400_000_000 / (rows * cols * m)).clamp(5, 400);
        let mut best = [u64::MAX; 4];
        for _ in 0..reps {
            for (k, b) in best.iter_mut().enumerate() {
                let t = std::time::Instant::now();
                let mut jobs = [MatJob {
                    w: &w,
                    bias: None,
                    out: &mut out,
                }];
                let x = std::hint::black_box(&x);
                match k {
                    0 => matmul_t(&ctx, x, m, &mut jobs)?,
                    3 => {
                        ctx.activations = Activations::Int16Q8Int8;
                        matmul_t(&ctx, x, m, &mut jobs)?
                    }
                    1 => {
                        ctx.activations = Activations::Int16Q8Int8;
                        matmul_t_each(&ctx, x, m, &mut jobs, &mut scratch)?
                    }
                    _ => {
                        ctx.activations = Activations::Int8Vnni;
                        matmul_t_each(&ctx, x, m, &mut jobs, &mut scratch)?
                    }
                }
                ctx.activations = Activations::F32;
                *b = (*b).min(t.elapsed().as_nanos() as u64);
            }
        }
        let flops = 2.0 * (rows * cols * m) as f64;
        println!(
            "{what} {rows}x{cols} {}: panel {} ns ({:.1} GFLOP/s), panel int16 {} ns ({:.1}), \
             per-row f32 {} ns ({:.1}), per-row int8 VNNI {} ns ({:.1})",
            ty.name(),
            best[0],
            flops / best[0] as f64,
            best[3],
            flops / best[3] as f64,
            best[1],
            flops / best[1] as f64,
            best[2],
            flops / best[2] as f64
        );
        for (t, b) in totals.iter_mut().zip(best) {
            *t += b;
        }
    }
    println!(
        "one layer (both down_proj types counted): panel {} ns, panel int16 {} ns ({:.2}x), \
         per-row f32 {} ns ({:.2}x), per-row int8 VNNI {} ns ({:.2}x)",
        totals[0],
        totals[3],
        totals[3] as f64 / totals[0] as f64,
        totals[1],
        totals[1] as f64 / totals[0] as f64,
        totals[2],
        totals[2] as f64 / totals[0] as f64
    );
    Ok(())
}

/// The 4-bit decode products through the split-byte and the pair kernel, alternating.
fn split() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(2).map_or(Ok(1), |s| s.parse())?;
    let ctxs = [true, false]
        .iter()
        .map(|&on| {
            let mut c = CpuContext::new(threads)?;
            c.activations = Activations::Int16Q8Int8;
            c.split4 = on;
            Ok(c)
        })
        .collect::<mlx_core::Result<Vec<_>>>()?;
    let mut rng = Lcg(11);
    let mut scratch = RowsScratch::default();
    println!("{threads} thread(s); fastest run of each kernel, ns (weight GB/s)");
    for (shape, rows, cols) in [
        ("135m q", 576, 576),
        ("135m gate", 1536, 576),
        ("135m down", 576, 1536),
        ("360m q", 960, 960),
        ("360m k", 320, 960),
        ("360m gate", 2560, 960),
        ("360m down", 960, 2560),
    ] {
        for group in [32usize, 64] {
            let a = Affine::random(&mut rng, (rows, cols, 4, group), 0.1, 0.1);
            let w = a.matrix()?;
            let bytes = a.bytes();
            let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; rows];
            let reps = (400_000_000 / (rows * cols)).clamp(50, 3000);
            let mut best = [u64::MAX; 2];
            for _ in 0..reps {
                for (k, ctx) in ctxs.iter().enumerate() {
                    let t = std::time::Instant::now();
                    let mut jobs = [MatJob {
                        w: &w,
                        bias: None,
                        out: &mut out,
                    }];
                    matmul_t_each(ctx, std::hint::black_box(&x), 1, &mut jobs, &mut scratch)?;
                    best[k] = best[k].min(t.elapsed().as_nanos() as u64);
                }
            }
            println!(
                "{shape:<10} {rows}x{cols} g{group}: split {} ns ({:.1}), pair {} ns ({:.1}), \
                 split/pair time {:.3}",
                best[0],
                bytes as f64 / best[0] as f64,
                best[1],
                bytes as f64 / best[1] as f64,
                best[0] as f64 / best[1] as f64
            );
        }
    }
    Ok(())
}

/// Prompt-block affine products with and without AMX (see the module's note).
fn prefill() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let m: usize = std::env::args()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut ctx = CpuContext::new(threads)?;
    ctx.activations = Activations::Int16Q8Int8;
    let amx = ctx.amx;
    let mut rng = Lcg(7);
    println!("threads {threads}, m {m}, {}", ctx.kernels());
    for (bits, group) in [(4u32, 32usize), (8, 32), (4, 64)] {
        let mut totals = [0u64; 4];
        let mut macs = 0usize;
        for (rows, cols, what) in [
            (960, 960, "q_proj"),
            (320, 960, "k_proj"),
            (960, 960, "o_proj"),
            (2560, 960, "gate_proj"),
            (960, 2560, "down_proj"),
        ] {
            let a = Affine::random(&mut rng, (rows, cols, bits, group), 0.01, 0.05);
            let w = a.matrix()?;
            let x: Vec<f32> = (0..m * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; m * rows];
            let reps = (400_000_000 / (rows * cols * m)).clamp(5, 400);
            let mut best = [u64::MAX; 4];
            for _ in 0..reps {
                for (k, b) in best.iter_mut().enumerate() {
                    ctx.amx = amx && k < 3;
                    mlx_core::cpu::amx::set_panel_mode(k);
                    let t = std::time::Instant::now();
                    let mut jobs = [MatJob {
                        w: &w,
                        bias: None,
                        out: &mut out,
                    }];
                    matmul_t(&ctx, std::hint::black_box(&x), m, &mut jobs)?;
                    *b = (*b).min(t.elapsed().as_nanos() as u64);
                }
            }
            let gmac = (rows * cols * m) as f64;
            macs += rows * cols * m * if what == "k_proj" { 2 } else { 1 };
            println!(
                "{bits}-bit g{group} {what} {rows}x{cols}: amx {} ns ({:.1} G MAC/s), \
                 amx/pass {} ns ({:.1}), amx/2panel {} ns ({:.1}), avx512 {} ns ({:.1}), \
                 amx/pass {:.2}x",
                best[0],
                gmac / best[0] as f64,
                best[1],
                gmac / best[1] as f64,
                best[2],
                gmac / best[2] as f64,
                best[3],
                gmac / best[3] as f64,
                best[1] as f64 / best[0] as f64
            );
            let twice = if what == "k_proj" { 2 } else { 1 };
            let up = if what == "gate_proj" { 2 } else { 1 };
            for (t, b) in totals.iter_mut().zip(best) {
                *t += b * twice * up;
            }
            if what == "gate_proj" {
                macs += rows * cols * m;
            }
        }
        println!(
            "{bits}-bit g{group} one layer (q k v o gate up down): amx {} ns ({:.1} G MAC/s), \
             amx/pass {} ns ({:.1}), amx/2panel {} ns ({:.1}), avx512 {} ns ({:.1}), \
             amx/pass {:.2}x",
            totals[0],
            macs as f64 / totals[0] as f64,
            totals[1],
            macs as f64 / totals[1] as f64,
            totals[2],
            macs as f64 / totals[2] as f64,
            totals[3],
            macs as f64 / totals[3] as f64,
            totals[1] as f64 / totals[0] as f64
        );
        mlx_core::cpu::amx::set_panel_mode(0);
    }
    Ok(())
}
