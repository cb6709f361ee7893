//! Flash attention forward + backward on the GPU: the CUDA kernels against the plain-ops
//! flash path, the materialised attention and MLX's own SDPA (its CUDA backward), bfloat16,
//! causal, GQA (32 query heads, 8 key/value heads, head dim 128, batch 1). Needs the CUDA
//! build (`--features cuda`); see xtask/gpu/flash.sh.
//!
//!     flash_bench [OUT.md] [LENGTHS, default 512,2048,8192]
//!
//! Per variant and length: the median wall time of one `vjp` (forward and backward, built and
//! evaluated synchronously) over a few repetitions, and the peak memory above the inputs.

use std::fmt::Write as _;
use std::time::Instant;

use mlx_core::prelude::*;
use mlx_core::transforms::vjp;
use mlx_kernels::{attention_reference, flash_attention_with, FlashSpec, Path};

const REPS: usize = 5;

fn rnd(shape: &[i32], seed: u64) -> Result<Array> {
    let key = random::key(seed)?;
    random::normal(shape, Dtype::Float32, None, None, Some(&key), None)?.astype(Dtype::Bfloat16)
}

fn run(variant: &str, spec: FlashSpec, x: &[Array; 4]) -> Result<()> {
    let f = |xs: &[Array]| -> Result<Vec<Array>> {
        let (q, k, v) = (&xs[0], &xs[1], &xs[2]);
        Ok(vec![match variant {
            "cuda kernels" => flash_attention_with(q, k, v, spec, Path::Fused)?,
            "plain-ops flash" => flash_attention_with(q, k, v, spec, Path::Reference)?,
            "materialised" => attention_reference(q, k, v, spec)?,
            _ => fast::scaled_dot_product_attention(
                q,
                k,
                v,
                spec.scale,
                fast::SdpaMask::Causal,
                None,
                None,
            )?,
        }])
    };
    let (outs, grads) = vjp(f, &x[..3], &x[3..])?;
    let mut all = outs;
    all.extend(grads);
    eval(&all)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let lengths: Vec<i32> = args
        .get(2)
        .map(String::as_str)
        .unwrap_or("512,2048,8192")
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let (hq, hkv, d) = (32, 8, 128);
    let mut md = String::from(
        "| tokens | variant | ms (fwd+bwd, median) | peak MB above inputs |\n| ---: | --- | ---: | ---: |\n",
    );
    for &l in &lengths {
        let x = [
            rnd(&[1, hq, l, d], 1)?,
            rnd(&[1, hkv, l, d], 2)?,
            rnd(&[1, hkv, l, d], 3)?,
            rnd(&[1, hq, l, d], 4)?,
        ];
        eval(&x)?;
        let spec = FlashSpec::causal(1.0 / (d as f32).sqrt(), 256);
        for variant in [
            "cuda kernels",
            "mlx sdpa",
            "materialised",
            "plain-ops flash",
        ] {
            let started = Instant::now();
            let mut times = Vec::new();
            let mut peak = 0;
            for rep in 0..REPS + 1 {
                mlx_core::memory::reset_peak_memory()?;
                let base = mlx_core::memory::active_memory()?;
                let t = Instant::now();
                run(variant, spec, &x)?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                peak = peak.max(mlx_core::memory::peak_memory()? - base);
                if rep > 0 {
                    times.push(ms);
                }
                if started.elapsed().as_secs() > 20 {
                    break;
                }
            }
            times.sort_by(|a, b| a.total_cmp(b));
            let med = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
            let line = format!("| {l} | {variant} | {med:.2} | {:.1} |", peak as f64 / 1e6);
            println!("{line}");
            let _ = writeln!(md, "{line}");
        }
    }
    if let Some(path) = args.get(1) {
        std::fs::write(path, md).map_err(|e| Error::Io {
            path: path.into(),
            message: e.to_string(),
        })?;
    }
    Ok(())
}
