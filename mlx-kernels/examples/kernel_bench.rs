//! Micro-benchmark of each fused kernel against its plain-ops reference on the GPU, in one
//! run, alternating the two. Needs the CUDA build (`--features cuda`); see xtask/gpu/kernels.sh.
//!
//!     kernel_bench [OUT.md]
//!
//! Three timings per kernel and shape (bfloat16), each the median over many repetitions:
//! - `call`: one call, built and evaluated synchronously (`eval` waits for the GPU): the
//!   per-call cost as an uncompiled decode step pays it, host work included;
//! - `chain`: 64 dependent calls built into one graph and evaluated once, per call: host
//!   scheduling and launch per node, amortised over a graph as a decode step is;
//! - GB/s of the `call` timing over the bytes the op must move (inputs read, outputs written).

use std::fmt::Write as _;
use std::time::Instant;

use mlx_core::prelude::*;
use mlx_kernels::{add_rms_norm, swiglu, Path};

const REPS: usize = 200;
const CHAIN: usize = 64;

fn rnd(shape: &[i32], scale: f32, seed: u64) -> Result<Array> {
    let key = random::key(seed)?;
    random::normal(shape, Dtype::Float32, None, Some(scale), Some(&key), None)?
        .astype(Dtype::Bfloat16)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times `f` (which builds and evaluates one unit of work) for both paths, alternating.
fn time_both(reps: usize, mut f: impl FnMut(Path) -> Result<()>) -> Result<(f64, f64)> {
    for _ in 0..10 {
        f(Path::Fused)?;
        f(Path::Reference)?;
    }
    let (mut fused, mut reference) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        for (path, out) in [(Path::Fused, &mut fused), (Path::Reference, &mut reference)] {
            let t = Instant::now();
            f(path)?;
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok((median(fused), median(reference)))
}

struct Row {
    kernel: &'static str,
    shape: String,
    bytes: f64,
    call: (f64, f64),
    chain: (f64, f64),
}

fn rms_rows(dims: i32, rows: i32) -> Result<Row> {
    let x = rnd(&[rows, 1, dims], 1.0, 1)?;
    let r = rnd(&[rows, 1, dims], 1.0, 2)?;
    let w = rnd(&[dims], 1.0, 3)?;
    eval([&x, &r, &w])?;
    let call = time_both(REPS, |p| {
        let (h, o) = add_rms_norm(&x, &r, &w, 1e-5, p)?;
        eval([&h, &o])
    })?;
    let chain = time_both(REPS / 4, |p| {
        let (mut a, mut b) = (x.clone(), r.clone());
        for _ in 0..CHAIN {
            let (h, o) = add_rms_norm(&a, &b, &w, 1e-5, p)?;
            a = o;
            b = h;
        }
        eval([&a, &b])
    })?;
    let n = f64::from(rows) * f64::from(dims);
    Ok(Row {
        kernel: "add_rms_norm",
        shape: format!("[{rows}, 1, {dims}]"),
        bytes: 2.0 * (4.0 * n + f64::from(dims)),
        call,
        chain: (chain.0 / CHAIN as f64, chain.1 / CHAIN as f64),
    })
}

fn swiglu_rows(shape: &[i32]) -> Result<Row> {
    let g = rnd(shape, 3.0, 4)?;
    let u = rnd(shape, 1.0, 5)?;
    eval([&g, &u])?;
    let call = time_both(REPS, |p| swiglu(&g, &u, p)?.eval())?;
    let chain = time_both(REPS / 4, |p| {
        let mut a = g.clone();
        for _ in 0..CHAIN {
            a = swiglu(&a, &u, p)?;
        }
        a.eval()
    })?;
    let n = shape.iter().map(|&d| f64::from(d)).product::<f64>();
    Ok(Row {
        kernel: "swiglu",
        shape: format!("{shape:?}"),
        bytes: 2.0 * 3.0 * n,
        call,
        chain: (chain.0 / CHAIN as f64, chain.1 / CHAIN as f64),
    })
}

/// One native MLX op (`add`, one kernel) timed the same way: the per-node baseline.
fn native_add() -> Result<(f64, f64)> {
    let a = rnd(&[1, 1, 576], 1.0, 6)?;
    let b = rnd(&[1, 1, 576], 1.0, 7)?;
    eval([&a, &b])?;
    let (call, chain) = time_both(REPS, |p| {
        if p == Path::Fused {
            ops::add(&a, &b, None)?.eval()
        } else {
            let mut c = a.clone();
            for _ in 0..CHAIN {
                c = ops::add(&c, &b, None)?;
            }
            c.eval()
        }
    })?;
    Ok((call, chain / CHAIN as f64))
}

fn main() -> Result<()> {
    let out = std::env::args().nth(1);
    if Path::auto() != Path::Fused {
        eprintln!("kernel_bench: no CUDA back-end here; nothing to measure");
        std::process::exit(2);
    }
    let rows = vec![
        rms_rows(576, 1)?,
        rms_rows(4096, 1)?,
        rms_rows(576, 512)?,
        rms_rows(4096, 512)?,
        rms_rows(4096, 16384)?,
        swiglu_rows(&[1, 1, 1536])?,
        swiglu_rows(&[1, 1, 14336])?,
        swiglu_rows(&[1, 512, 14336])?,
        swiglu_rows(&[16, 512, 14336])?,
    ];
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| kernel (bf16) | shape | call fused us | call ref us | speed-up | fused GB/s | ref GB/s | \
         chain fused us/call | chain ref us/call | speed-up |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.2}x | {:.0} | {:.0} | {:.2} | {:.2} | {:.2}x |",
            r.kernel,
            r.shape,
            r.call.0,
            r.call.1,
            r.call.1 / r.call.0,
            r.bytes / r.call.0 / 1e3,
            r.bytes / r.call.1 / 1e3,
            r.chain.0,
            r.chain.1,
            r.chain.1 / r.chain.0,
        );
    }
    let (call, chain) = native_add()?;
    let _ = writeln!(
        md,
        "\nBaseline, one native op (`add`, bf16 [1, 1, 576]): call {call:.1} us, chain {chain:.2} us/node."
    );
    let _ = writeln!(
        md,
        "MLX_USE_CUDA_GRAPHS={}",
        std::env::var("MLX_USE_CUDA_GRAPHS").unwrap_or_else(|_| "(unset: on)".into())
    );
    print!("{md}");
    if let Some(path) = out {
        std::fs::write(&path, &md).map_err(|e| Error::Io {
            path,
            message: e.to_string(),
        })?;
    }
    Ok(())
}
