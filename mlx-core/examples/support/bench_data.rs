//! Random weights for the CPU kernels' examples and benchmarks: a seeded sequence (no `rand`
//! dependency) and affine-quantized matrices drawn from it. Included by path
//! (`#[path = "support/bench_data.rs"] mod bench_data;`; from benches/,
//! `#[path = "../examples/support/bench_data.rs"]`); each user takes its part.
#![allow(dead_code)]

use half::f16;
use mlx_core::cpu::kquant::GgmlType;
use mlx_core::cpu::{Floats, Matrix};

/// A seeded pseudo-random sequence (a 64-bit LCG, its high bits).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// A value in [-0.5, 0.5).
    pub fn unit(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 - 0.5
    }
}

/// Random affine weights: `rows x cols` codes of `bits` bits, then float16 scales and biases
/// (one a group of `group`) drawn as `unit() * scale` and `unit() * bias`, in that order.
pub struct Affine {
    pub words: Vec<u32>,
    pub scales: Vec<f16>,
    pub biases: Vec<f16>,
    pub rows: usize,
    pub cols: usize,
    pub bits: u32,
    pub group: usize,
}

impl Affine {
    pub fn random(
        rng: &mut Lcg,
        (rows, cols, bits, group): (usize, usize, u32, usize),
        scale: f32,
        bias: f32,
    ) -> Affine {
        let words: Vec<u32> = (0..rows * cols * bits as usize / 32)
            .map(|_| rng.next())
            .collect();
        let groups = rows * cols / group;
        let scales: Vec<f16> = (0..groups)
            .map(|_| f16::from_f32(rng.unit() * scale))
            .collect();
        let biases: Vec<f16> = (0..groups)
            .map(|_| f16::from_f32(rng.unit() * bias))
            .collect();
        Affine {
            words,
            scales,
            biases,
            rows,
            cols,
            bits,
            group,
        }
    }

    pub fn matrix(&self) -> mlx_core::Result<Matrix<'_>> {
        Matrix::affine(
            &self.words,
            Floats::F16(&self.scales),
            Floats::F16(&self.biases),
            self.rows,
            self.cols,
            self.bits,
            self.group,
        )
    }

    /// The bytes a product reads: the codes, a float16 scale and bias a group.
    pub fn bytes(&self) -> usize {
        self.words.len() * 4 + self.scales.len() * 4
    }
}

/// Random GGML rows of type `ty` (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K): `rows x cols` random
/// bytes, then finite half-precision factors (`unit() * 0.01`) wherever the format keeps them
/// (a block's first; Q4_K's and Q4_1's first two; Q6_K's at byte 208), block by block.
pub fn random_ggml(rng: &mut Lcg, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data: Vec<u8> = (0..rows * ty.row_bytes(cols))
        .map(|_| rng.next() as u8)
        .collect();
    let halves: &[usize] = match ty {
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_K | GgmlType::Q4_1 => &[0, 2],
        _ => &[0],
    };
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in halves {
            let f = f16::from_f32(rng.unit() * 0.01);
            b[at..at + 2].copy_from_slice(&f.to_le_bytes());
        }
    }
    data
}
