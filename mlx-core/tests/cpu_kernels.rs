//! Parity of the CPU kernels (`mlx_core::cpu`) with their plain-MLX-ops references, on every
//! instruction set this CPU runs (scalar always, AVX2 where present).
//!
//! Tier L3: the kernels sum in another order than MLX (and fuse multiply-adds), so results
//! differ by float rounding. The bound for a dot product of `n` terms is the classic forward
//! error bound of recursive summation, `n * eps * sum |w_i x_i|` (plus a tiny absolute
//! floor), computed per output from the same data; the other ops state theirs.

use mlx_core::cpu::{self, AttentionShape, CpuContext, Floats, Isa, MatJob, Matrix};
use mlx_core::fast::{self, SdpaMask};
use mlx_core::quantized::{self, QuantMode};
use mlx_core::{ops, Array, Dtype, Result};

/// Deterministic values in [-1, 1) (a 64-bit LCG): the tests need no random generator.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn contexts() -> Vec<CpuContext> {
    let mut v = vec![CpuContext::with_isa(3, Isa::Scalar).unwrap()];
    if Isa::Avx2.available() {
        v.push(CpuContext::with_isa(3, Isa::Avx2).unwrap());
        v.push(CpuContext::with_isa(1, Isa::Avx2).unwrap());
    }
    if Isa::Avx512.available() {
        v.push(CpuContext::with_isa(2, Isa::Avx512).unwrap());
    }
    v
}

/// Checks `ours` against `reference` (both `(m, rows)`) with the summation bound from the
/// dequantized weights `w` `(rows, cols)` and `x` `(m, cols)`.
fn check_dot_bound(what: &str, ours: &[f32], reference: &[f32], w: &[f32], x: &[f32], cols: usize) {
    let rows = w.len() / cols;
    let m = x.len() / cols;
    for t in 0..m {
        for r in 0..rows {
            let abs: f32 = (0..cols)
                .map(|c| (w[r * cols + c] * x[t * cols + c]).abs())
                .sum();
            let bound = cols as f32 * f32::EPSILON * abs + 1e-6;
            let (a, b) = (ours[t * rows + r], reference[t * rows + r]);
            assert!(
                (a - b).abs() <= bound,
                "{what}: row {r} input {t}: ours {a}, MLX {b}, bound {bound}"
            );
        }
    }
}

fn scales_as(a: &Array, dt: Dtype) -> Array {
    let c = a.astype(dt).unwrap();
    c.eval().unwrap();
    c
}

/// `quantized_matmul(x, wq^T)` with affine scales `s` and biases `b`, as the models call it.
fn qmm(x: &Array, wq: &Array, s: &Array, b: &Array, group: i32, bits: i32) -> Result<Array> {
    quantized::quantized_matmul(
        x,
        wq,
        s,
        Some(b),
        true,
        group,
        bits,
        QuantMode::Affine,
        None,
    )
}

/// The weights `quantized_matmul` multiplies float32 inputs by: it widens the scales and
/// biases to float32 (type promotion) before dequantizing, and so does this reference.
fn dequantize_f32(wq: &Array, s: &Array, b: &Array, group: i32, bits: i32) -> Result<Array> {
    quantized::dequantize(
        wq,
        &s.astype(Dtype::Float32)?,
        Some(&b.astype(Dtype::Float32)?),
        group,
        bits,
        QuantMode::Affine,
        Some(Dtype::Float32),
        None,
    )
}

/// The CPU kernels' view of the affine-quantized `rows x cols` weights `wq` (scales `s`,
/// biases `b`, in their own dtype).
fn affine_matrix<'a>(
    wq: &'a Array,
    s: &'a Array,
    b: &'a Array,
    rows: usize,
    cols: usize,
    group: i32,
    bits: i32,
) -> Result<Matrix<'a>> {
    Matrix::affine(
        wq.as_slice::<u32>()?,
        Floats::from_array(s)?,
        Floats::from_array(b)?,
        rows,
        cols,
        bits as u32,
        group as usize,
    )
}

/// The activation tests' quantization bound, per output: each input within `amax / step` of
/// its quantized value (amax: its chunk of 32's largest) moves a product by at most
/// `sum |w_i| * amax / step`, times `slack`, plus `sum` times the float summation bound
/// `cols * eps * sum |w_i x_i|` (and `|b x_i|` terms where the biases `bias`, one a group of
/// `.1` columns, multiply the exact input sums), plus 1e-5.
struct QuantBound<'a> {
    xv: &'a [f32],
    wd: &'a [f32],
    rows: usize,
    cols: usize,
    step: f32,
    slack: f32,
    sum: f32,
    bias: Option<(&'a [f32], usize)>,
}

impl QuantBound<'_> {
    /// Every output of input `t` of `ours` within the bound of `reference`'s.
    fn check(&self, what: &str, t: usize, ours: &[f32], reference: &[f32]) {
        let (xv, wd, rows, cols) = (self.xv, self.wd, self.rows, self.cols);
        let xr = &xv[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let wr = &wd[r * cols..(r + 1) * cols];
            let (mut quant, mut abs) = (0f32, 0f32);
            for c in 0..cols / 32 {
                let amax = xr[c * 32..c * 32 + 32]
                    .iter()
                    .fold(0f32, |a, v| a.max(v.abs()));
                match self.bias {
                    None => {
                        for i in c * 32..c * 32 + 32 {
                            quant += wr[i].abs() * amax / self.step;
                            abs += (wr[i] * xr[i]).abs();
                        }
                    }
                    Some((bf, group)) => {
                        let bg = bf[r * cols / group + c * 32 / group];
                        for i in c * 32..c * 32 + 32 {
                            quant += wr[i].abs() * amax / self.step;
                            abs += (wr[i] * xr[i]).abs() + (bg * xr[i]).abs();
                        }
                    }
                }
            }
            let bound = quant * self.slack + self.sum * cols as f32 * f32::EPSILON * abs + 1e-5;
            let (a, e) = (ours[t * rows + r], reference[t * rows + r]);
            assert!(
                (a - e).abs() <= bound,
                "{what}: row {r} input {t}: ours {a}, MLX {e}, bound {bound}"
            );
        }
    }
}

/// The int8 inputs' values: each chunk of 32 rounded to codes of its `amax / 127` step,
/// `d * code`.
fn int8_values(xv: &[f32]) -> Vec<f32> {
    xv.chunks_exact(32)
        .flat_map(|c| {
            let d = c.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            c.iter()
                .map(move |v| (v * inv).round() * d)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Affine-quantized products against `dequantize` + `matmul` in MLX: bits 2/4/8, groups
/// 32/64/128, scales and biases in f32, f16 and bf16, one input and blocks of 3 and 7 (the
/// multi-input path), with and without a bias vector.
#[test]
fn affine_matmul_matches_dequantize_then_matmul() -> Result<()> {
    let (rows, cols) = (37usize, 256usize);
    let wf = Array::from_slice(&values(rows * cols, 1), &[rows as i32, cols as i32])?;
    for ctx in contexts() {
        for bits in [2, 4, 8] {
            for group in [32, 64, 128] {
                let (wq, s32, b32) =
                    quantized::quantize(&wf, group, bits, QuantMode::Affine, None)?;
                let b32 = b32.expect("affine biases");
                for dt in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                    let (s, b) = (scales_as(&s32, dt), scales_as(&b32, dt));
                    // The model's op is `quantized_matmul` with float32 inputs, which
                    // widens the scales and biases to float32 (type promotion) before
                    // dequantizing: so is the reference.
                    let wd = dequantize_f32(&wq, &s, &b, group, bits)?;
                    let wdv = wd.to_vec::<f32>()?;
                    let mat = affine_matrix(&wq, &s, &b, rows, cols, group, bits)?;
                    for m in [1usize, 3, 7, 13, 32] {
                        let xv = values(m * cols, 7 + m as u64);
                        let x = Array::from_slice(&xv, &[m as i32, cols as i32])?;
                        let bias = values(rows, 99);
                        let product = qmm(&x, &wq, &s, &b, group, bits)?;
                        let reference = (&product + &Array::from_slice(&bias, &[rows as i32])?)?
                            .to_vec::<f32>()?;
                        let mut out = vec![0f32; m * rows];
                        cpu::matmul_t(
                            &ctx,
                            &xv,
                            m,
                            &mut [MatJob {
                                w: &mat,
                                bias: Some(Floats::F32(&bias)),
                                out: &mut out,
                            }],
                        )?;
                        let what =
                            format!("{} bits {bits} group {group} {dt} m {m}", ctx.isa.name());
                        check_dot_bound(&what, &out, &reference, &wdv, &xv, cols);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Dense products (f32, f16, bf16 weights) against `matmul` in MLX, several products in one
/// call (as q, k and v share one dispatch), including a width that is not a multiple of 32
/// (the scalar kernel's tail).
#[test]
fn dense_matmul_matches_matmul() -> Result<()> {
    for ctx in contexts() {
        for cols in [64usize, 40] {
            let shapes = [(19usize, cols), (8, cols), (5, cols)];
            for dt in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let ws: Vec<Array> = shapes
                    .iter()
                    .enumerate()
                    .map(|(i, &(r, c))| {
                        let a =
                            Array::from_slice(&values(r * c, 20 + i as u64), &[r as i32, c as i32])
                                .unwrap();
                        scales_as(&a, dt)
                    })
                    .collect();
                let mats: Vec<Matrix<'_>> = ws
                    .iter()
                    .zip(&shapes)
                    .map(|(a, &(r, c))| {
                        Matrix::dense(Floats::from_array(a).unwrap(), r, c).unwrap()
                    })
                    .collect();
                for m in [1usize, 6] {
                    let xv = values(m * cols, 5);
                    let x = Array::from_slice(&xv, &[m as i32, cols as i32])?;
                    let mut outs: Vec<Vec<f32>> =
                        shapes.iter().map(|&(r, _)| vec![0f32; m * r]).collect();
                    let mut jobs: Vec<MatJob<'_, '_>> = mats
                        .iter()
                        .zip(outs.iter_mut())
                        .map(|(w, out)| MatJob { w, bias: None, out })
                        .collect();
                    cpu::matmul_t(&ctx, &xv, m, &mut jobs)?;
                    drop(jobs);
                    for (i, w) in ws.iter().enumerate() {
                        let wf = w.astype(Dtype::Float32)?;
                        let reference =
                            ops::matmul(&x, &wf.transpose_all()?, None)?.to_vec::<f32>()?;
                        let what =
                            format!("{} dense {dt} cols {cols} m {m} job {i}", ctx.isa.name());
                        check_dot_bound(
                            &what,
                            &outs[i],
                            &reference,
                            &wf.to_vec::<f32>()?,
                            &xv,
                            cols,
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// Mismatched shapes are errors, not panics or reads out of bounds.
#[test]
fn bad_shapes_are_refused() -> Result<()> {
    let words = vec![0u32; 8];
    let s = vec![1f32; 2];
    assert!(Matrix::affine(&words[..7], Floats::F32(&s), Floats::F32(&s), 2, 32, 4, 32).is_err());
    assert!(Matrix::affine(&words, Floats::F32(&s), Floats::F32(&s), 2, 64, 3, 32).is_err());
    assert!(Matrix::affine(&words, Floats::F32(&s), Floats::F32(&s), 1, 64, 4, 48).is_err());
    let m = Matrix::affine(&words, Floats::F32(&s), Floats::F32(&s), 2, 64, 2, 64)?;
    let ctx = CpuContext::new(2)?;
    let mut out = vec![0f32; 2];
    assert!(cpu::matmul_t(
        &ctx,
        &[0.0; 63],
        1,
        &mut [MatJob {
            w: &m,
            bias: None,
            out: &mut out
        }]
    )
    .is_err());
    let mut short = vec![0f32; 1];
    assert!(cpu::matmul_t(
        &ctx,
        &[0.0; 64],
        1,
        &mut [MatJob {
            w: &m,
            bias: None,
            out: &mut short
        }]
    )
    .is_err());
    assert!(cpu::rms_norm(&[1.0; 5], Floats::F32(&[1.0; 2]), 1e-5, &mut [0.0; 5]).is_err());
    Ok(())
}

/// RMSNorm against `mx.fast.rms_norm` (bound: 8 ulps relative, the sum of squares in
/// another order), with f32 and bf16 weights.
#[test]
fn rms_norm_matches_fast_rms_norm() -> Result<()> {
    let d = 96;
    let xv = values(3 * d, 3);
    let x = Array::from_slice(&xv, &[3, d as i32])?;
    for dt in [Dtype::Float32, Dtype::Bfloat16] {
        let w = scales_as(&Array::from_slice(&values(d, 4), &[d as i32])?, dt);
        let reference =
            fast::rms_norm(&x, Some(&w.astype(Dtype::Float32)?), 1e-5, None)?.to_vec::<f32>()?;
        let mut out = vec![0f32; 3 * d];
        cpu::rms_norm(&xv, Floats::from_array(&w)?, 1e-5, &mut out)?;
        for (a, b) in out.iter().zip(&reference) {
            assert!(
                (a - b).abs() <= 8.0 * f32::EPSILON * b.abs().max(1e-3),
                "{a} vs {b}"
            );
        }
    }
    Ok(())
}

/// RoPE against `mx.fast.rope`, traditional or not, with a base and scale or a frequency
/// table, partial rotation, at positions up to 4,000 (bound: 2e-4 absolute, from the
/// angles' rounding: `position * inv_freq` in f32 carries ~position * 6e-8 of phase error).
#[test]
fn rope_matches_fast_rope() -> Result<()> {
    let (heads, hd, dims) = (3usize, 32usize, 24usize);
    let xv = values(heads * hd, 11);
    let x = Array::from_slice(&xv, &[1, heads as i32, 1, hd as i32])?;
    let table: Vec<f32> = (0..dims / 2)
        .map(|i| 10000f32.powf(2.0 * i as f32 / dims as f32) * 1.5)
        .collect();
    let freqs = Array::from_slice(&table, &[(dims / 2) as i32])?;
    for traditional in [false, true] {
        for pos in [0usize, 7, 4000] {
            for (base, scale, fr) in [
                (Some(10000f32), 1.0f32, None),
                (Some(500000.0), 0.25, None),
                (None, 1.0, Some(&freqs)),
            ] {
                let reference = fast::rope(
                    &x,
                    dims as i32,
                    traditional,
                    base,
                    scale,
                    (pos as i32).into(),
                    fr,
                    None,
                )?
                .to_vec::<f32>()?;
                let mut inv = vec![0f32; dims / 2];
                cpu::rope_inv_freqs(dims, base, fr.map(|_| Floats::F32(&table)), &mut inv)?;
                let mut ours = xv.clone();
                cpu::rope(&mut ours, hd, traditional, &inv, pos as f32 * scale)?;
                for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
                    assert!(
                        (a - b).abs() <= 2e-4,
                        "traditional {traditional} pos {pos} base {base:?} element {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// `silu(g) * u` against MLX's `sigmoid` ops (bound: 4 ulps relative).
#[test]
fn silu_mul_matches_ops() -> Result<()> {
    let g = values(300, 1).iter().map(|v| v * 8.0).collect::<Vec<_>>();
    let u = values(300, 2);
    let ga = Array::from_slice(&g, &[300])?;
    let reference =
        (&(&ga * &ops::sigmoid(&ga, None)?)? * &Array::from_slice(&u, &[300])?)?.to_vec::<f32>()?;
    let mut ours = g.clone();
    cpu::silu_mul(&mut ours, &u)?;
    for (a, b) in ours.iter().zip(&reference) {
        assert!(
            (a - b).abs() <= 4.0 * f32::EPSILON * b.abs().max(1e-6),
            "{a} vs {b}"
        );
    }
    Ok(())
}

/// The SIMD `silu(g) * u` of every instruction set this CPU has against MLX's `sigmoid` ops
/// (bound: 8 ulps relative; the vector `exp` is within about 2 ulps of `expf`), lengths
/// with and without a tail past the last full vector, inputs far into both saturations.
#[test]
fn silu_mul_isa_matches_ops() -> Result<()> {
    for n in [301usize, 1536] {
        let mut g = values(n, 3).iter().map(|v| v * 12.0).collect::<Vec<_>>();
        g[0] = -95.0;
        g[1] = 95.0;
        let u = values(n, 4);
        let ga = Array::from_slice(&g, &[n as i32])?;
        let reference = (&(&ga * &ops::sigmoid(&ga, None)?)?
            * &Array::from_slice(&u, &[n as i32])?)?
            .to_vec::<f32>()?;
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            if !isa.available() {
                continue;
            }
            let mut ours = g.clone();
            cpu::silu_mul_isa(isa, &mut ours, &u)?;
            for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
                assert!(
                    (a - b).abs() <= 8.0 * f32::EPSILON * b.abs().max(1e-30),
                    "{} n {n} element {i} (g {}): {a} vs {b}",
                    isa.name(),
                    g[i]
                );
            }
        }
    }
    Ok(())
}

/// Decode and prefill attention over a cache with grouped-query heads against
/// `mx.fast.scaled_dot_product_attention` with a causal mask (bound: 1e-5 absolute on
/// outputs of magnitude <= 1, the softmax summed in another order). Shapes: short, longer
/// than the SIMD kernel's block of 64 positions (running-maximum rescales), and head widths
/// that take its 32-, 16- and 8-wide loops.
#[test]
fn attention_matches_sdpa() -> Result<()> {
    for (nh, nkv, hd, cap, start, m) in [
        (6usize, 2usize, 16usize, 40usize, 29usize, 4usize),
        (6, 2, 64, 200, 150, 3),
        (4, 4, 24, 140, 0, 130),
        (2, 1, 40, 90, 88, 1),
    ] {
        attention_case(nh, nkv, hd, cap, start, m)?;
    }
    Ok(())
}

fn attention_case(
    nh: usize,
    nkv: usize,
    hd: usize,
    cap: usize,
    start: usize,
    m: usize,
) -> Result<()> {
    let kv = values(nkv * cap * hd, 1);
    let vv = values(nkv * cap * hd, 2);
    let qv = values(m * nh * hd, 3);
    let scale = 1.0 / (hd as f32).sqrt();
    let shape = AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        capacity: cap,
    };
    let reference = sdpa_reference(shape, &qv, &kv, &vv, start, m, scale)?;
    for ctx in contexts() {
        let mut out = vec![0f32; m * nh * hd];
        cpu::attention(&ctx, shape, &qv, &kv, &vv, start, m, scale, &mut out)?;
        let what = format!("{} hd {hd} start {start} m {m}", ctx.isa.name());
        assert_attention_close(&what, &out, &reference);
    }
    Ok(())
}

/// `mx.fast.scaled_dot_product_attention`, causal, of the `m` query rows `qv` (the kernels'
/// layout, `(m, nh, hd)`) over the first `start + m` positions of the caches `kv`, `vv`
/// (`(nkv, cap, hd)`), in the kernels' layout.
fn sdpa_reference(
    shape: AttentionShape,
    qv: &[f32],
    kv: &[f32],
    vv: &[f32],
    start: usize,
    m: usize,
    scale: f32,
) -> Result<Vec<f32>> {
    let (nh, nkv, hd, cap) = (
        shape.n_heads as i32,
        shape.n_kv_heads as i32,
        shape.head_dim as i32,
        shape.capacity as i32,
    );
    let total = (start + m) as i32;
    // MLX's layout: q (1, nh, m, hd); k, v (1, nkv, total, hd).
    let kf = Array::from_slice(kv, &[1, nkv, cap, hd])?;
    let vf = Array::from_slice(vv, &[1, nkv, cap, hd])?;
    let k = ops::slice_axis(&kf, 2, 0, total, None)?;
    let v = ops::slice_axis(&vf, 2, 0, total, None)?;
    let q = Array::from_slice(qv, &[1, m as i32, nh, hd])?.transpose(&[0, 2, 1, 3])?;
    fast::scaled_dot_product_attention(&q, &k, &v, scale, SdpaMask::Causal, None, None)?
        .transpose(&[0, 2, 1, 3])?
        .to_vec::<f32>()
}

/// Every element of `out` within 1e-5 of `reference` (the attention tests' bound).
fn assert_attention_close(what: &str, out: &[f32], reference: &[f32]) {
    for (i, (a, b)) in out.iter().zip(reference).enumerate() {
        assert!((a - b).abs() <= 1e-5, "{what} element {i}: {a} vs {b}");
    }
}

/// Each query row's attention is bit for bit the same whether its row comes alone (a decode
/// step), with others (a verify pass or prompt block) or on another thread count: the SIMD
/// path's parts of positions depend on the row's position count only (tier: bit-identical;
/// speculative verification and batched rows rely on it).
/// Shapes: SmolLM2's heads with rows across a part boundary (all rows of a pass in one work
/// item), one part only (rows split into groups), one KV head, a group of one and of eight
/// (the kernel without register-blocked heads), a first row at position 0.
#[test]
fn attention_rows_are_what_they_are_alone() -> Result<()> {
    for (nh, nkv, start, m) in [
        (9usize, 3usize, 250usize, 7usize),
        (9, 3, 100, 5),
        (8, 1, 126, 4),
        (4, 4, 300, 3),
        (8, 1, 0, 6),
        (16, 2, 40, 2),
    ] {
        attention_rows_alone(nh, nkv, start, m)?;
    }
    Ok(())
}

fn attention_rows_alone(nh: usize, nkv: usize, start: usize, m: usize) -> Result<()> {
    let (hd, cap) = (64usize, 420usize);
    let kv: Vec<half::f16> = values(nkv * cap * hd, 4)
        .iter()
        .map(|&x| half::f16::from_f32(x))
        .collect();
    let vv: Vec<half::f16> = values(nkv * cap * hd, 5)
        .iter()
        .map(|&x| half::f16::from_f32(x))
        .collect();
    let qv = values(m * nh * hd, 6);
    let shape = AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        capacity: cap,
    };
    let scale = 0.125;
    for ctx in contexts() {
        let mut all = vec![0f32; m * nh * hd];
        cpu::attention_f16(&ctx, shape, &qv, &kv, &vv, start, m, scale, &mut all)?;
        let one = CpuContext::with_isa(1, ctx.isa).unwrap();
        for t in 0..m {
            let row = t * nh * hd..(t + 1) * nh * hd;
            let mut alone = vec![0f32; nh * hd];
            cpu::attention_f16(
                &one,
                shape,
                &qv[row.clone()],
                &kv,
                &vv,
                start + t,
                1,
                scale,
                &mut alone,
            )?;
            assert!(
                all[row]
                    .iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} {nh}/{nkv} heads, rows {start}+{m}, row {t}: not the bits alone",
                ctx.isa.name()
            );
        }
    }
    Ok(())
}

/// `attention_f16` over a float16 cache against the same SDPA reference fed the cache's
/// values rounded to float16 and widened back (what the kernel reads); same shapes and bound
/// as `attention_matches_sdpa`.
#[test]
fn attention_f16_matches_sdpa_on_the_rounded_cache() -> Result<()> {
    for (nh, nkv, hd, cap, start, m) in [
        (6usize, 2usize, 16usize, 40usize, 29usize, 4usize),
        (6, 2, 64, 200, 150, 3),
        (9, 3, 64, 700, 600, 1),
        (4, 4, 24, 140, 0, 130),
        (2, 1, 40, 90, 88, 1),
    ] {
        let kv: Vec<half::f16> = values(nkv * cap * hd, 1)
            .iter()
            .map(|&x| half::f16::from_f32(x))
            .collect();
        let vv: Vec<half::f16> = values(nkv * cap * hd, 2)
            .iter()
            .map(|&x| half::f16::from_f32(x))
            .collect();
        let widen = |h: &[half::f16]| h.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
        let qv = values(m * nh * hd, 3);
        let scale = 1.0 / (hd as f32).sqrt();
        let shape = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            capacity: cap,
        };
        let reference = sdpa_reference(shape, &qv, &widen(&kv), &widen(&vv), start, m, scale)?;
        for ctx in contexts() {
            let mut out = vec![0f32; m * nh * hd];
            cpu::attention_f16(&ctx, shape, &qv, &kv, &vv, start, m, scale, &mut out)?;
            let what = format!("f16 {} hd {hd} start {start} m {m}", ctx.isa.name());
            assert_attention_close(&what, &out, &reference);
        }
    }
    Ok(())
}

/// Group sizes MLX's `quantize` does not make (96: not 32 times a power of two) take the
/// AVX2 kernel's row-buffer path, or the scalar kernel for rows wider than that buffer;
/// checked against the scalar kernel (itself checked against MLX above) with the same
/// summation bound.
#[test]
fn odd_group_sizes_match_the_scalar_kernel() -> Result<()> {
    if !Isa::Avx2.available() {
        return Ok(());
    }
    let group = 96usize;
    // The last shape is wider than the kernel's row buffer: the scalar kernel runs it.
    for (rows, cols, bits) in [(5usize, 192usize, 4u32), (5, 192, 8), (2, 8256, 4)] {
        let words: Vec<u32> = values(rows * cols * bits as usize / 32, 3)
            .iter()
            .map(|v| (v.to_bits()).wrapping_mul(2_654_435_761))
            .collect();
        let scales: Vec<f32> = values(rows * cols / group, 4)
            .iter()
            .map(|v| v * 0.1)
            .collect();
        let biases = values(rows * cols / group, 5);
        let mat = Matrix::affine(
            &words,
            Floats::F32(&scales),
            Floats::F32(&biases),
            rows,
            cols,
            bits,
            group,
        )?;
        let mut w = vec![0f32; rows * cols];
        for r in 0..rows {
            mat.row_to(r, &mut w[r * cols..(r + 1) * cols])?;
        }
        for m in [1usize, 6] {
            let xv = values(m * cols, 6);
            let mut outs = Vec::new();
            for isa in [Isa::Scalar, Isa::Avx2] {
                let ctx = CpuContext::with_isa(2, isa)?;
                let mut out = vec![0f32; m * rows];
                cpu::matmul_t(
                    &ctx,
                    &xv,
                    m,
                    &mut [MatJob {
                        w: &mat,
                        bias: None,
                        out: &mut out,
                    }],
                )?;
                outs.push(out);
            }
            check_dot_bound(
                &format!("group 96 bits {bits} m {m}"),
                &outs[1],
                &outs[0],
                &w,
                &xv,
                cols,
            );
        }
    }
    Ok(())
}

/// Int8 activations (`Activations::Int8`): 4-bit products of one to four inputs against
/// MLX's `quantized_matmul` with float32 inputs, groups 32/64/128, scales in f32/f16/bf16.
/// Tier L3 with the quantization's own bound: each input is within half a step (`amax / 254`
/// of its chunk of 32) of its int8 value, so a product moves by at most `sum |w_i| *
/// amax(chunk of i) / 254`, plus the float summation bound. Wider blocks (m > 4) and other
/// widths keep the float32 kernels (checked equal to the plain context's output).
#[test]
fn int8_activations_stay_within_the_quantization_bound() -> Result<()> {
    if !Isa::Avx2.available() {
        return Ok(());
    }
    let (rows, cols) = (45usize, 512usize);
    let wf = Array::from_slice(&values(rows * cols, 3), &[rows as i32, cols as i32])?;
    for threads in [1, 3] {
        let mut ctx = CpuContext::with_isa(threads, Isa::Avx2)?;
        ctx.activations = cpu::Activations::Int8;
        let plain = CpuContext::with_isa(threads, Isa::Avx2)?;
        for (bits, group) in [(4, 32), (4, 64), (4, 128), (8, 32), (2, 64)] {
            let (wq, s32, b32) = quantized::quantize(&wf, group, bits, QuantMode::Affine, None)?;
            let b32 = b32.expect("affine biases");
            for dt in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let (s, b) = (scales_as(&s32, dt), scales_as(&b32, dt));
                let wd = dequantize_f32(&wq, &s, &b, group, bits)?.to_vec::<f32>()?;
                let mat = affine_matrix(&wq, &s, &b, rows, cols, group, bits)?;
                for m in [1usize, 2, 4, 5] {
                    // Inputs with an outlier per row, as activations have.
                    let mut xv = values(m * cols, 11 + m as u64);
                    for t in 0..m {
                        xv[t * cols + 17] = 9.0;
                    }
                    let x = Array::from_slice(&xv, &[m as i32, cols as i32])?;
                    let reference = qmm(&x, &wq, &s, &b, group, bits)?.to_vec::<f32>()?;
                    let run = |c: &CpuContext| -> Result<Vec<f32>> {
                        let mut out = vec![0f32; m * rows];
                        cpu::matmul_t(
                            c,
                            &xv,
                            m,
                            &mut [MatJob {
                                w: &mat,
                                bias: None,
                                out: &mut out,
                            }],
                        )?;
                        Ok(out)
                    };
                    let (ours, exact) = (run(&ctx)?, run(&plain)?);
                    let what = format!("bits {bits} group {group} {dt} m {m} threads {threads}");
                    if bits != 4 || m > 4 {
                        assert_eq!(ours, exact, "{what}: should take the float kernels");
                        continue;
                    }
                    assert_ne!(ours, exact, "{what}: should take the int8 kernel");
                    // Tight: the same products from the int8 inputs' values (d * code per
                    // chunk of 32), through MLX, within the float summation bound.
                    let xd = int8_values(&xv);
                    let xda = Array::from_slice(&xd, &[m as i32, cols as i32])?;
                    let tight = qmm(&xda, &wq, &s, &b, group, bits)?.to_vec::<f32>()?;
                    check_dot_bound(&what, &ours, &tight, &wd, &xd, cols);
                    let bound = QuantBound {
                        xv: &xv,
                        wd: &wd,
                        rows,
                        cols,
                        step: 254.0,
                        slack: 1.001,
                        sum: 1.0,
                        bias: None,
                    };
                    for t in 0..m {
                        bound.check(&what, t, &ours, &reference);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Int16 activations (`Activations::Int16`, the CPU decoder's default): 4- and 8-bit products
/// of one to four inputs against MLX's `quantized_matmul` with float32 inputs, groups
/// 32/64/128, scales in f32/f16/bf16. Tier L3 with the quantization's bound: each input is
/// within `amax / 65534` of its int16 value (amax: its chunk of 32's largest), the biases
/// multiply the exact float sums, so a product moves by at most `sum |w_i| * amax / 65534`,
/// plus the float summation bound. Other widths and wider blocks keep the float32 kernels.
/// Every SIMD kernel this CPU runs: AVX2 and the 512-bit one (AVX-512 F/BW/VL + VNNI; 20
/// chunks a row: its half-scale path reads a full block of 16 and a masked tail; and 19).
#[test]
fn int16_activations_stay_within_the_quantization_bound() -> Result<()> {
    if !Isa::Avx2.available() {
        return Ok(());
    }
    // 608 columns: 19 chunks, an odd count (the 512-bit 4-bit kernel's pairs and its
    // unpaired last chunk).
    for cols in [640usize, 608] {
        int16_case(45, cols)?;
    }
    Ok(())
}

/// `Activations::Int16Q8Int8` (AVX-512 VNNI): 8-bit products in groups of 32 with half
/// scales (GGUF Q8_0 as loaded) of one to five inputs through `matmul_t_each` (tiles of four
/// and one), against MLX's `quantized_matmul` with float32 inputs. Tier L3 with the
/// quantization's bound: the codes multiply inputs within `amax / 254` of their int8 values
/// (amax: the chunk of 32's largest), the biases the exact float sums, so a product moves by
/// at most `sum |scale * q_i| * amax / 254`, plus the float summation bound. 4-bit products
/// and 8-bit ones with float32 scales or groups of 64 keep the int16 kernel (outputs equal
/// to `Int16`'s); 20, 19, 18 and 17 chunks a row (masked factor loads, an unpaired last
/// chunk; SmolLM2's 576 columns).
#[test]
fn q8_int8_activations_stay_within_the_quantization_bound() -> Result<()> {
    if !Isa::Avx512.available() {
        return Ok(());
    }
    let rows = 45usize;
    for cols in [640usize, 608, 576, 544] {
        let wf = Array::from_slice(&values(rows * cols, 6), &[rows as i32, cols as i32])?;
        for threads in [1, 3] {
            let mut ctx = CpuContext::with_isa(threads, Isa::Avx512)?;
            ctx.activations = cpu::Activations::Int16Q8Int8;
            let mut i16ctx = CpuContext::with_isa(threads, Isa::Avx512)?;
            i16ctx.activations = cpu::Activations::Int16;
            for (bits, group, dt) in [
                (8, 32, Dtype::Float16),
                (8, 32, Dtype::Float32),
                (8, 64, Dtype::Float16),
                (4, 32, Dtype::Float16),
            ] {
                if cols % group as usize != 0 {
                    continue;
                }
                let (wq, s32, b32) =
                    quantized::quantize(&wf, group, bits, QuantMode::Affine, None)?;
                let b32 = b32.expect("affine biases");
                let (s, b) = (scales_as(&s32, dt), scales_as(&b32, dt));
                let wd = dequantize_f32(&wq, &s, &b, group, bits)?.to_vec::<f32>()?;
                let bf = b.astype(Dtype::Float32)?.to_vec::<f32>()?;
                let mat = affine_matrix(&wq, &s, &b, rows, cols, group, bits)?;
                for m in [1usize, 2, 4, 5] {
                    let mut xv = values(m * cols, 31 + m as u64);
                    for t in 0..m {
                        xv[t * cols + 40] = -12.0;
                    }
                    let x = Array::from_slice(&xv, &[m as i32, cols as i32])?;
                    let bias = values(rows, 78);
                    let reference = (&qmm(&x, &wq, &s, &b, group, bits)?
                        + &Array::from_slice(&bias, &[rows as i32])?)?
                        .to_vec::<f32>()?;
                    let run = |c: &CpuContext| -> Result<Vec<f32>> {
                        let mut out = vec![0f32; m * rows];
                        cpu::matmul_t_each(
                            c,
                            &xv,
                            m,
                            &mut [MatJob {
                                w: &mat,
                                bias: Some(Floats::F32(&bias)),
                                out: &mut out,
                            }],
                            &mut cpu::RowsScratch::default(),
                        )?;
                        Ok(out)
                    };
                    let (ours, int16) = (run(&ctx)?, run(&i16ctx)?);
                    let what = format!("bits {bits} group {group} {dt} m {m} threads {threads}");
                    if (bits, group, dt) != (8, 32, Dtype::Float16) {
                        assert_eq!(ours, int16, "{what}: should take the int16 kernel");
                        continue;
                    }
                    assert_ne!(ours, int16, "{what}: should take the int8 kernel");
                    // Tight: the same products of the int8 inputs' values (d * code per
                    // chunk of 32), through MLX, within the float summation bound of the
                    // kernel's terms (codes times inputs, biases times the inputs' sums). The
                    // biases must multiply the sums of those values, not of the float inputs:
                    // else the inputs' rounding errors meet the unsigned codes (Q8_0's sit at
                    // 128 + k) in place of the weights, several times the error of int8
                    // inputs (SmolLM2's tied head parted from the exact path's greedy reply).
                    let xd = int8_values(&xv);
                    let tight = (&qmm(
                        &Array::from_slice(&xd, &[m as i32, cols as i32])?,
                        &wq,
                        &s,
                        &b,
                        group,
                        bits,
                    )? + &Array::from_slice(&bias, &[rows as i32])?)?
                        .to_vec::<f32>()?;
                    for t in 0..m {
                        for r in 0..rows {
                            let abs: f32 = (0..cols)
                                .map(|i| {
                                    let bg = bf[r * cols / 32 + i / 32];
                                    let x = xd[t * cols + i];
                                    ((wd[r * cols + i] - bg) * x).abs() + (bg * x).abs()
                                })
                                .sum();
                            let bound = 2.0 * cols as f32 * f32::EPSILON * abs + 1e-5;
                            let (a, e) = (ours[t * rows + r], tight[t * rows + r]);
                            assert!(
                                (a - e).abs() <= bound,
                                "{what}: row {r} input {t}: ours {a}, MLX on the int8 inputs \
                                 {e}, bound {bound}"
                            );
                        }
                    }
                    let bound = QuantBound {
                        xv: &xv,
                        wd: &wd,
                        rows,
                        cols,
                        step: 254.0,
                        slack: 1.01,
                        sum: 2.0,
                        bias: Some((&bf[..], 32)),
                    };
                    for t in 0..m {
                        bound.check(&what, t, &ours, &reference);
                    }
                }
            }
        }
    }
    Ok(())
}

fn int16_case(rows: usize, cols: usize) -> Result<()> {
    let wf = Array::from_slice(&values(rows * cols, 5), &[rows as i32, cols as i32])?;
    let isas = [Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.available());
    for (threads, isa) in isas.flat_map(|i| [(1, i), (3, i)]) {
        let mut ctx = CpuContext::with_isa(threads, isa)?;
        ctx.activations = cpu::Activations::Int16;
        let plain = CpuContext::with_isa(threads, isa)?;
        for (bits, group) in [
            (4, 32),
            (4, 64),
            (4, 128),
            (8, 32),
            (8, 64),
            (8, 128),
            (2, 64),
        ] {
            if cols % group as usize != 0 {
                continue;
            }
            let (wq, s32, b32) = quantized::quantize(&wf, group, bits, QuantMode::Affine, None)?;
            let b32 = b32.expect("affine biases");
            for dt in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let (s, b) = (scales_as(&s32, dt), scales_as(&b32, dt));
                let wd = dequantize_f32(&wq, &s, &b, group, bits)?.to_vec::<f32>()?;
                let mat = affine_matrix(&wq, &s, &b, rows, cols, group, bits)?;
                for m in [1usize, 2, 3, 4, 5] {
                    let mut xv = values(m * cols, 21 + m as u64);
                    for t in 0..m {
                        xv[t * cols + 40] = -12.0;
                    }
                    let x = Array::from_slice(&xv, &[m as i32, cols as i32])?;
                    let bias = values(rows, 77);
                    let reference = (&qmm(&x, &wq, &s, &b, group, bits)?
                        + &Array::from_slice(&bias, &[rows as i32])?)?
                        .to_vec::<f32>()?;
                    let run = |c: &CpuContext| -> Result<Vec<f32>> {
                        let mut out = vec![0f32; m * rows];
                        cpu::matmul_t(
                            c,
                            &xv,
                            m,
                            &mut [MatJob {
                                w: &mat,
                                bias: Some(Floats::F32(&bias)),
                                out: &mut out,
                            }],
                        )?;
                        Ok(out)
                    };
                    let (ours, exact) = (run(&ctx)?, run(&plain)?);
                    let what = format!("bits {bits} group {group} {dt} m {m} threads {threads}");
                    if bits == 2 || m > 4 {
                        assert_eq!(ours, exact, "{what}: should take the float kernels");
                        continue;
                    }
                    assert_ne!(ours, exact, "{what}: should take the int16 kernel");
                    let bound = QuantBound {
                        xv: &xv,
                        wd: &wd,
                        rows,
                        cols,
                        step: 65534.0,
                        slack: 1.01,
                        sum: 2.0,
                        bias: None,
                    };
                    for t in 0..m {
                        bound.check(&what, t, &ours, &reference);
                    }
                }
            }
        }
    }
    Ok(())
}

/// `Activations::Int8Vnni` (AVX-512 VNNI): 4-bit products (groups 32/64/128, scales in
/// f16/f32/bf16) of one to five inputs through `matmul_t_each`, against MLX's
/// `quantized_matmul` with float32 inputs. Tier L3 with the quantization's bound: the codes
/// multiply inputs within `amax / 254` of their int8 values (amax: the chunk of 32's
/// largest), the biases the exact float sums, so a product moves by at most
/// `sum |scale * q_i| * amax / 254`, plus the float summation bound. Each row of a batch is
/// bit for bit that row alone (the decode step's promise); 8-bit Q8_0-style rows take
/// `Int16Q8Int8`'s kernel (equal outputs); 20 and 19 chunks a row (an unpaired last chunk).
#[test]
fn int8_vnni_activations_stay_within_the_quantization_bound() -> Result<()> {
    if !Isa::Avx512.available() {
        return Ok(());
    }
    let rows = 45usize;
    for cols in [640usize, 608] {
        let wf = Array::from_slice(&values(rows * cols, 8), &[rows as i32, cols as i32])?;
        for threads in [1, 3] {
            let mut ctx = CpuContext::with_isa(threads, Isa::Avx512)?;
            ctx.activations = cpu::Activations::Int8Vnni;
            let mut old = CpuContext::with_isa(threads, Isa::Avx512)?;
            old.activations = cpu::Activations::Int16Q8Int8;
            for (bits, group, dt) in [
                (4, 32, Dtype::Float16),
                (4, 32, Dtype::Float32),
                (4, 64, Dtype::Bfloat16),
                (4, 128, Dtype::Float16),
                (8, 32, Dtype::Float16),
            ] {
                if cols % group as usize != 0 {
                    continue;
                }
                let (wq, s32, b32) =
                    quantized::quantize(&wf, group, bits, QuantMode::Affine, None)?;
                let b32 = b32.expect("affine biases");
                let (s, b) = (scales_as(&s32, dt), scales_as(&b32, dt));
                let wd = dequantize_f32(&wq, &s, &b, group, bits)?.to_vec::<f32>()?;
                let bf = b.astype(Dtype::Float32)?.to_vec::<f32>()?;
                let mat = affine_matrix(&wq, &s, &b, rows, cols, group, bits)?;
                let bias = values(rows, 79);
                let run = |c: &CpuContext, xv: &[f32], m: usize| -> Result<Vec<f32>> {
                    let mut out = vec![0f32; m * rows];
                    cpu::matmul_t_each(
                        c,
                        xv,
                        m,
                        &mut [MatJob {
                            w: &mat,
                            bias: Some(Floats::F32(&bias)),
                            out: &mut out,
                        }],
                        &mut cpu::RowsScratch::default(),
                    )?;
                    Ok(out)
                };
                for m in [1usize, 2, 4, 5] {
                    let mut xv = values(m * cols, 41 + m as u64);
                    for t in 0..m {
                        xv[t * cols + 40] = -12.0;
                    }
                    let x = Array::from_slice(&xv, &[m as i32, cols as i32])?;
                    let reference = (&qmm(&x, &wq, &s, &b, group, bits)?
                        + &Array::from_slice(&bias, &[rows as i32])?)?
                        .to_vec::<f32>()?;
                    let (ours, before) = (run(&ctx, &xv, m)?, run(&old, &xv, m)?);
                    let what = format!("bits {bits} group {group} {dt} m {m} threads {threads}");
                    if bits == 8 {
                        assert_eq!(ours, before, "{what}: should take the Q8 int8 kernel");
                        continue;
                    }
                    assert_ne!(ours, before, "{what}: should take the 4-bit int8 kernel");
                    for t in 0..m {
                        let alone = run(&ctx, &xv[t * cols..(t + 1) * cols], 1)?;
                        let got = &ours[t * rows..(t + 1) * rows];
                        assert!(
                            got.iter()
                                .zip(&alone)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{what}: row {t} is not the bits it gets alone"
                        );
                        QuantBound {
                            xv: &xv,
                            wd: &wd,
                            rows,
                            cols,
                            step: 254.0,
                            slack: 1.01,
                            sum: 2.0,
                            bias: Some((&bf[..], group as usize)),
                        }
                        .check(&what, t, &ours, &reference);
                    }
                }
            }
        }
    }
    Ok(())
}

/// A symmetric matrix (`Matrix::symmetric`: GGUF's Q4_0 / Q8_0 without MLX's biases array,
/// each bias formed as `-2^(bits - 1) x scale`) gives the bits of the affine matrix over the
/// float16 biases MLX materializes (`scales x -8` / `x -128`, exact), through every kernel
/// and activation mode: one to eight inputs and a 64-row prompt block through `matmul_t`
/// (int8 / int16 / VNNI decode kernels, the prefill kernels, AMX's tiles where the CPU has
/// them and without), rows of their own through `matmul_t_each`, the split and pair 4-bit
/// kernels, with and without a bias vector, and an embedding row
/// (tier L2: bit-identical to the affine twin). Scales include the largest `symmetric`
/// takes; larger ones are refused.
#[test]
fn symmetric_matrices_give_the_bits_of_their_materialized_biases() -> Result<()> {
    use half::f16;
    use mlx_core::cpu::{matmul_t_each, Activations, RowsScratch};
    let acts = [
        Activations::F32,
        Activations::Int8,
        Activations::Int16,
        Activations::Int16Q8Int8,
        Activations::Int8Vnni,
        Activations::Int8Normed,
    ];
    for (bits, rows, cols) in [(4u32, 40usize, 256usize), (8, 37, 160), (4, 9, 96)] {
        let k = -((1u32 << (bits - 1)) as f32);
        let n = rows * cols;
        let words: Vec<u32> = values(n * bits as usize / 32, 7 + bits as u64)
            .iter()
            .map(|v| (v.to_bits()).wrapping_mul(2654435761))
            .collect();
        let groups = n / 32;
        let mut scales: Vec<f16> = values(groups, 11)
            .iter()
            .map(|v| f16::from_f32(v * 0.05))
            .collect();
        // The largest scale whose bias is a finite float16, and a subnormal one.
        scales[3] = f16::from_f32(65504.0 / -k);
        scales[5] = f16::from_bits(3);
        let biases: Vec<f16> = scales
            .iter()
            .map(|s| f16::from_f32(s.to_f32() * k))
            .collect();
        assert!(biases.iter().all(|b| b.is_finite()));
        let sym = Matrix::symmetric(&words, Floats::F16(&scales), rows, cols, bits, 32)?;
        let aff = Matrix::affine(
            &words,
            Floats::F16(&scales),
            Floats::F16(&biases),
            rows,
            cols,
            bits,
            32,
        )?;
        assert!(sym.is_symmetric() && !aff.is_symmetric());
        let vb: Vec<f32> = values(rows, 5);
        for r in [0, rows - 1] {
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            sym.row_to(r, &mut a)?;
            aff.row_to(r, &mut b)?;
            assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        for mut ctx in contexts() {
            for &act in &acts {
                ctx.activations = act;
                // Not `lane4` (`MLX_CPU_LANE4=1`, an experiment of #33): `amx_verify` takes
                // affine matrices only, and a symmetric one takes the default kernel there.
                for (split4, amx, lane4) in [(true, true, false), (false, false, false)] {
                    ctx.split4 = split4;
                    ctx.amx = amx && cpu::amx_available(ctx.isa);
                    ctx.lane4 = lane4;
                    for m in [1usize, 2, 3, 4, 5, 8, 64] {
                        let x = values(m * cols, 100 + m as u64);
                        for with_bias in [false, true] {
                            let bias = with_bias.then_some(Floats::F32(&vb));
                            let mut outs = Vec::new();
                            for w in [&sym, &aff] {
                                let mut o = vec![0f32; m * rows];
                                cpu::matmul_t(
                                    &ctx,
                                    &x,
                                    m,
                                    &mut [MatJob {
                                        w,
                                        bias,
                                        out: &mut o,
                                    }],
                                )?;
                                let mut e = vec![0f32; m * rows];
                                if m <= 8 {
                                    matmul_t_each(
                                        &ctx,
                                        &x,
                                        m,
                                        &mut [MatJob {
                                            w,
                                            bias,
                                            out: &mut e,
                                        }],
                                        &mut RowsScratch::default(),
                                    )?;
                                }
                                outs.push((o, e));
                            }
                            let what = format!(
                                "{bits} bits, {:?}, {act:?}, split {split4}, amx {}, lane4 \
                                 {lane4}, m {m}, bias {with_bias}",
                                ctx.isa, ctx.amx
                            );
                            let same = |a: &[f32], b: &[f32]| {
                                a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
                            };
                            assert!(same(&outs[0].0, &outs[1].0), "matmul_t: {what}");
                            assert!(same(&outs[0].1, &outs[1].1), "matmul_t_each: {what}");
                        }
                    }
                }
            }
        }
    }
    // Scales whose biases are not finite float16s, and other widths, are refused.
    let words = vec![0u32; 4];
    let big = vec![f16::from_f32(8200.0)];
    assert!(Matrix::symmetric(&words, Floats::F16(&big), 1, 32, 4, 32).is_err());
    let words8 = vec![0u32; 8];
    let over = vec![f16::from_f32(512.0)];
    assert!(Matrix::symmetric(&words8, Floats::F16(&over), 1, 32, 8, 32).is_err());
    let nan = vec![f16::NAN];
    assert!(Matrix::symmetric(&words, Floats::F16(&nan), 1, 32, 4, 32).is_err());
    let f32s = vec![0.1f32];
    assert!(Matrix::symmetric(&words, Floats::F32(&f32s), 1, 32, 4, 32).is_err());
    let words2 = vec![0u32; 2];
    assert!(Matrix::symmetric(&words2, Floats::F16(&big[..]), 1, 32, 2, 32).is_err());
    Ok(())
}
