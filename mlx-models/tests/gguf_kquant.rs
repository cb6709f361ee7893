//! The CPU decoder's GGML-block products (`mlx_core::cpu::kquant`) against the plain reference:
//! each block dequantized by `gguf_dequant` (bit for bit gguf-py's), then a float32 dot with
//! the unquantized inputs.
//!
//! - The kernels' block decoder (`kquant::dequantize_row`, the embedding lookup) is gguf-py's
//!   bit for bit on the seeded finite blocks of `goldens/gguf_dequant.safetensors` (L1).
//! - Inputs the int8 quantization keeps exactly (multiples of 1/128 reaching +-127/128 in each
//!   32): the products are the reference's within float32 rounding, `2e-6 * sum |w x|` (tier
//!   L3; a wrong code among a row's values is ~1e-3 of it), portable and AVX2 kernels alike.
//! - Random inputs: int8 inputs add at most `d / 2` (`d = max |x| / 127` of each 32) to each
//!   input value; over 64 rows of 512 the relative error `|y - ref| / |ref|` (2-norms) stays
//!   under 1.5% (tier L3; seen: 0.015-0.42%, Q8_0 and Q6_K the largest).

use std::path::PathBuf;

use mlx_core::cpu::kquant::{dequantize_row, GgmlType};
use mlx_core::cpu::{matmul_t, Activations, CpuContext, Isa, MatJob, Matrix};
use mlx_core::testing::Goldens;
use mlx_models::gguf_dequant::dequantize;

fn goldens() -> Goldens {
    Goldens::load(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/gguf_dequant.safetensors"),
    )
    .unwrap()
}

/// The goldens' finite blocks of each kernel type: `(type, bytes, values)`.
fn finite_blocks() -> Vec<(GgmlType, Vec<u8>, usize)> {
    let mut out = Vec::new();
    for c in goldens().cases().unwrap() {
        if c.op != "dequantize" || !c.name.ends_with("_finite") {
            continue;
        }
        let Some(ty) = GgmlType::from_id(c.int("ggml_type").unwrap() as u32) else {
            continue;
        };
        let n = c.int("elements").unwrap() as usize;
        out.push((ty, c.inputs[0].to_vec::<u8>().unwrap(), n));
    }
    assert_eq!(
        out.len(),
        GgmlType::ALL.len(),
        "a finite case for every type"
    );
    out
}

#[test]
fn the_block_decoder_is_gguf_py_bit_for_bit() {
    for (ty, bytes, n) in finite_blocks() {
        let want = dequantize(ty.id(), &bytes, n).unwrap();
        let mut got = vec![0f32; n];
        dequantize_row(ty, &bytes, &mut got);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{} value {i}: {a} vs {b}",
                ty.name()
            );
        }
    }
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }
    fn unit(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 - 1.0
    }
}

/// `x W^T` through `matmul_t` on `isa` (two threads) for `rows` rows of `cols` values, int8
/// inputs.
fn product(isa: Isa, ty: GgmlType, bytes: &[u8], rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    product_with(Activations::Int8, isa, ty, bytes, rows, cols, x)
}

fn product_with(
    act: Activations,
    isa: Isa,
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Vec<f32> {
    let mut ctx = CpuContext::with_isa(2, isa).unwrap();
    ctx.activations = act;
    let w = Matrix::ggml(bytes, ty, rows, cols).unwrap();
    let m = x.len() / cols;
    let mut out = vec![0f32; m * rows];
    matmul_t(
        &ctx,
        x,
        m,
        &mut [MatJob {
            w: &w,
            bias: None,
            out: &mut out,
        }],
    )
    .unwrap();
    out
}

fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    if Isa::Avx2.available() {
        v.push(Isa::Avx2);
    }
    if Isa::Avx512.available() {
        v.push(Isa::Avx512);
    }
    v
}

#[test]
fn exact_inputs_give_the_reference_within_rounding() {
    for (ty, bytes, n) in finite_blocks() {
        let w = dequantize(ty.id(), &bytes, n).unwrap();
        // One row of every block, and one row a block.
        for (rows, cols) in [(1, n), (n / ty.block(), ty.block())] {
            let mut g = Lcg(u64::from(ty.id()));
            let m = 3;
            let x: Vec<f32> = (0..m * cols)
                .map(|i| {
                    let q = if i % 32 == 9 {
                        -127
                    } else {
                        (g.next() % 255) as i32 - 127
                    };
                    q as f32 / 128.0
                })
                .collect();
            for isa in isas() {
                let got = product(isa, ty, &bytes, rows, cols, &x);
                for t in 0..m {
                    for r in 0..rows {
                        let (wr, xt) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        let want: f32 = wr.iter().zip(xt).map(|(a, b)| a * b).sum();
                        let abs: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                        let y = got[t * rows + r];
                        assert!(
                            (y - want).abs() <= 2e-6 * abs,
                            "{} {isa:?} ({rows}, {cols}) input {t} row {r}: {y} vs {want}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }
}

/// Seeded rows: random bytes, the format's half-precision factors set to N(0, 0.05)-like
/// finite values (as the goldens' script does).
fn random_rows(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut g = Lcg(seed);
    let mut v: Vec<u8> = (0..rows * ty.row_bytes(cols))
        .map(|_| g.next() as u8)
        .collect();
    let halves: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
    };
    for b in v.chunks_exact_mut(ty.block_bytes()) {
        for &at in halves {
            let f = half::f16::from_f32(g.unit() * 0.08);
            b[at..at + 2].copy_from_slice(&f.to_le_bytes());
        }
    }
    v
}

#[test]
fn random_inputs_stay_within_the_int8_bound() {
    let (rows, cols, m) = (64, 512, 2);
    for ty in GgmlType::ALL {
        let bytes = random_rows(ty, rows, cols, 100 + u64::from(ty.id()));
        let w = dequantize(ty.id(), &bytes, rows * cols).unwrap();
        let mut g = Lcg(7);
        let x: Vec<f32> = (0..m * cols).map(|_| g.unit() * 3.0).collect();
        for isa in isas() {
            let got = product(isa, ty, &bytes, rows, cols, &x);
            let (mut err, mut norm) = (0f64, 0f64);
            for t in 0..m {
                for r in 0..rows {
                    let (wr, xt) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                    let want: f64 = wr.iter().zip(xt).map(|(a, b)| f64::from(a * b)).sum();
                    err += (f64::from(got[t * rows + r]) - want).powi(2);
                    norm += want * want;
                }
            }
            let rel = (err / norm).sqrt();
            eprintln!("{} {isa:?}: relative error {rel:.2e}", ty.name());
            assert!(rel < 0.015, "{} {isa:?}: relative error {rel}", ty.name());
        }
    }
}

/// Float inputs (the CPU decoder's default activations, `Int16Q8Int8`; also `F32`): the blocks'
/// codes widened to floats, no input rounding: the reference within float32 rounding,
/// `2e-6 * sum |w x|` on random inputs (tier L3).
#[test]
fn float_inputs_give_the_reference_within_rounding() {
    let (rows, cols, m) = (16, 512, 5);
    for ty in GgmlType::ALL {
        let bytes = random_rows(ty, rows, cols, 300 + u64::from(ty.id()));
        let w = dequantize(ty.id(), &bytes, rows * cols).unwrap();
        let mut g = Lcg(9);
        let x: Vec<f32> = (0..m * cols).map(|_| g.unit() * 3.0).collect();
        for act in [Activations::Int16Q8Int8, Activations::F32] {
            for isa in isas() {
                let got = product_with(act, isa, ty, &bytes, rows, cols, &x);
                for t in 0..m {
                    for r in 0..rows {
                        let (wr, xt) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        let want: f32 = wr.iter().zip(xt).map(|(a, b)| a * b).sum();
                        let abs: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                        let y = got[t * rows + r];
                        assert!(
                            (y - want).abs() <= 2e-6 * abs,
                            "{} {act:?} {isa:?} input {t} row {r}: {y} vs {want}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }
}
