//! Per-weight reconstruction error of trellis (k = 2, 3, 4) against MLX's affine quantization
//! (2, 3, 4 bits, group 64), relative to the weights' variance, on a seeded Gaussian matrix
//! and on real matrices:
//! `cargo run --release -p mlx-core --example trellis_mse -- [--l L,...] [--block B]
//! [--threads N] [FILE.safetensors TENSOR ...]`.
//! `TRELLIS_MSE_CODE=1mad8h` (or another config name) codes the trellis rows with that code;
//! `--bits 3` (or `2,4`...) limits the bit widths; `TRELLIS_MSE_ROWS=1024` and
//! `TRELLIS_MSE_GSEED=6` set the Gaussian matrix's rows (64) and seed (5).
//! `--hessians FILE` (written by `results/quant/hessians.py`: `<path>.weight` and
//! `<path>.hessian` pairs) reports instead, for each pair, the weight error and the output
//! error `tr(dW H dW^T) / tr(W H W^T)` of affine, trellis and trellis with LDLQ.
//! The trellis error is measured in the incoherent basis (the transform is orthonormal, so it
//! equals the error in the original basis).

#[path = "../tests/support/trellis_data.rs"]
mod trellis_data;

use mlx_core::cpu::trellis::{
    decode, incoherent, layer_signs, quantize, quantize_ldlq, TrellisSpec,
};
use mlx_core::prelude::*;
use mlx_core::quantized::{dequantize, quantize as mlx_quantize, QuantMode};
use trellis_data::{gauss, rel_mse};

static BITS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// The code of the environment's `TRELLIS_MSE_CODE` (a config name), `1mad` by default.
fn code_arg() -> mlx_core::cpu::trellis::TrellisCode {
    std::env::var("TRELLIS_MSE_CODE")
        .ok()
        .map(|c| mlx_core::cpu::trellis::TrellisCode::from_name(&c).expect("TRELLIS_MSE_CODE"))
        .unwrap_or_default()
}

fn affine(w: &[f32], rows: usize, cols: usize, bits: i32) -> Vec<f32> {
    let a = Array::from_slice(w, &[rows as i32, cols as i32]).expect("array");
    let (q, s, b) = mlx_quantize(&a, 64, bits, QuantMode::Affine, None).expect("quantize");
    dequantize(&q, &s, b.as_ref(), 64, bits, QuantMode::Affine, None, None)
        .expect("dequantize")
        .to_vec::<f32>()
        .expect("values")
}

fn trellis(w: &[f32], rows: usize, cols: usize, spec: &TrellisSpec, threads: usize) -> f64 {
    let seed = 17;
    let (words, scales) = quantize(spec, w, rows, cols, seed, threads).expect("trellis");
    let mut out = vec![0.0; w.len()];
    decode(spec, &words, &scales, rows, cols, threads, &mut out).expect("decode");
    let (su, sv) = layer_signs(seed, rows, cols);
    let mut wt = w.to_vec();
    incoherent(&mut wt, rows, cols, &su, &sv);
    rel_mse(&wt, &out)
}

fn report(name: &str, w: &[f32], rows: usize, cols: usize, ls: &[u32], block: usize, th: usize) {
    for &k in BITS.get().map(|b| b.as_slice()).unwrap_or(&[2u32, 3, 4]) {
        let aff = rel_mse(w, &affine(w, rows, cols, k as i32));
        let mut line = format!("{name} ({rows}x{cols}) {k} bits: affine g64 {aff:.5}");
        for &l in ls {
            let spec = TrellisSpec {
                k,
                l,
                block,
                code: code_arg(),
            };
            let t = std::time::Instant::now();
            let e = trellis(w, rows, cols, &spec, th);
            line += &format!(", trellis L{l} {e:.5} ({:.1}s)", t.elapsed().as_secs_f64());
        }
        println!("{line}");
    }
}

/// `tr(d H d^T) / tr(w H w^T)` for row-major `(rows, cols)` `w`, `d` and `(cols, cols)` `h`.
fn out_err(w: &[f32], d: &[f32], h: &[f32], cols: usize) -> f64 {
    let quad = |m: &[f32]| -> f64 {
        m.chunks_exact(cols)
            .map(|r| {
                h.chunks_exact(cols)
                    .zip(r)
                    .map(|(hr, &ri)| {
                        f64::from(ri)
                            * r.iter()
                                .zip(hr)
                                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                                .sum::<f64>()
                    })
                    .sum::<f64>()
            })
            .sum()
    };
    quad(d) / quad(w)
}

fn hessians(file: &str, ls: &[u32], block: usize, threads: usize) {
    let (arrays, _) = mlx_core::io::load_safetensors(file, None).expect("load");
    let mut names: Vec<&String> = arrays.keys().filter(|k| k.ends_with(".hessian")).collect();
    names.sort();
    for hn in names {
        let path = hn.trim_end_matches(".hessian");
        let wa = &arrays[&format!("{path}.weight")];
        let sh = wa.shape().to_vec();
        let (rows, cols) = (sh[0] as usize, sh[1] as usize);
        let w = wa.to_vec::<f32>().expect("weight");
        let h = arrays[hn.as_str()].to_vec::<f32>().expect("hessian");
        let diff = |q: &[f32]| -> Vec<f32> { q.iter().zip(&w).map(|(a, b)| a - b).collect() };
        for &k in BITS.get().map(|b| b.as_slice()).unwrap_or(&[2u32, 3, 4]) {
            let aq = affine(&w, rows, cols, k as i32);
            let mut line = format!(
                "{path} ({rows}x{cols}) {k} bits: affine g64 {:.5}/{:.5}",
                rel_mse(&w, &aq),
                out_err(&w, &diff(&aq), &h, cols)
            );
            for &l in ls {
                let spec = TrellisSpec {
                    k,
                    l,
                    block,
                    code: code_arg(),
                };
                let seed = 17;
                let (su, sv) = layer_signs(seed, rows, cols);
                let mut wt = w.clone();
                incoherent(&mut wt, rows, cols, &su, &sv);
                let mut hp = h.clone();
                incoherent(&mut hp, cols, cols, &sv, &sv);
                for (name, coded) in [
                    ("", quantize(&spec, &w, rows, cols, seed, threads)),
                    (
                        " LDLQ",
                        quantize_ldlq(&spec, &w, rows, cols, seed, threads, &h),
                    ),
                ] {
                    let (words, scales) = coded.expect("trellis");
                    let mut out = vec![0.0; w.len()];
                    decode(&spec, &words, &scales, rows, cols, threads, &mut out).expect("decode");
                    let d: Vec<f32> = out.iter().zip(&wt).map(|(a, b)| a - b).collect();
                    line += &format!(
                        ", trellis L{l}{name} {:.5}/{:.5}",
                        rel_mse(&wt, &out),
                        out_err(&wt, &d, &hp, cols)
                    );
                    if name == " LDLQ" {
                        // The same codes at the rows' RMS (LDLQ's scales before the refit).
                        let rms: Vec<f32> = wt
                            .chunks_exact(cols)
                            .map(|r| {
                                let ss: f64 = r.iter().map(|&v| f64::from(v).powi(2)).sum();
                                ((ss / cols as f64).sqrt() as f32).max(f32::MIN_POSITIVE)
                            })
                            .collect();
                        decode(&spec, &words, &rms, rows, cols, threads, &mut out).expect("decode");
                        let d: Vec<f32> = out.iter().zip(&wt).map(|(a, b)| a - b).collect();
                        line += &format!(
                            " (at the rows' RMS {:.5}/{:.5})",
                            rel_mse(&wt, &out),
                            out_err(&wt, &d, &hp, cols)
                        );
                    }
                }
            }
            println!("{line}");
        }
    }
}

fn main() {
    let mut ls = vec![8u32, 12];
    let mut block = 64usize;
    let mut threads = 2usize;
    let mut rest = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--l" => {
                ls = args
                    .next()
                    .expect("--l L,...")
                    .split(',')
                    .map(|s| s.parse().expect("L"))
                    .collect()
            }
            "--bits" => BITS
                .set(
                    args.next()
                        .expect("--bits K,...")
                        .split(',')
                        .map(|s| s.parse().expect("K"))
                        .collect(),
                )
                .expect("once"),
            "--block" => block = args.next().expect("--block B").parse().expect("B"),
            "--threads" => threads = args.next().expect("--threads N").parse().expect("N"),
            "--hessians" => {
                hessians(&args.next().expect("--hessians FILE"), &ls, block, threads);
                return;
            }
            _ => rest.push(a),
        }
    }
    let rows: usize = std::env::var("TRELLIS_MSE_ROWS")
        .map(|r| r.parse().expect("rows"))
        .unwrap_or(64);
    let cols = 1024;
    report(
        "gaussian",
        &gauss(
            rows * cols,
            std::env::var("TRELLIS_MSE_GSEED")
                .map(|r| r.parse().expect("seed"))
                .unwrap_or(5),
        ),
        rows,
        cols,
        &ls,
        block,
        threads,
    );
    if let Some((file, names)) = rest.split_first() {
        let (arrays, _) = mlx_core::io::load_safetensors(file, None).expect("load");
        for n in names {
            let a = arrays
                .get(n.as_str())
                .expect("tensor")
                .astype(Dtype::Float32)
                .expect("f32");
            let sh = a.shape().to_vec();
            let w = a.to_vec::<f32>().expect("values");
            report(n, &w, sh[0] as usize, sh[1] as usize, &ls, block, threads);
        }
    }
}
