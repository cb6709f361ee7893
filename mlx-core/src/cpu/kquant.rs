//! Products over GGML's block formats read in place (a GGUF tensor's raw bytes): the legacy
//! 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the 256-value k-quants (Q2_K..Q6_K).
//!
//! Three kinds of input ([`inputs_for`]). A decode step's products (`matmul_t_each`, one to
//! four inputs) under `Int16` and the CPU decoder's default `Int16Q8Int8` quantize them to
//! int16 per 32 values (`d = max|x| / 32767`): each chunk's codes times their integer scale
//! widened to int16, `madd` (AVX-512 VNNI: `vpdpwssd`) into exact 32-bit sums, one float
//! multiply-add a chunk with `f * d`, the minimums times the exact float sums; at most half a
//! step (`d / 2`) of error per input value. A prompt block's products (`matmul_t`) and `F32`
//! keep them float32: each chunk's codes are widened to floats times their factor
//! and summed with FMA (the plain reference up to summation order). Under the int8 modes
//! (`Int8`, `Int8Vnni`, `Int8Normed`) they are quantized once per call to int8 per 32 values
//! (`d = max|x| / 127`, `q = round(x / d)`, llama.cpp's Q8_0 activations; the exact float sum of
//! each 32 kept for the blocks' minimums): faster, but on Gemma 3 270M they failed the quality
//! gate (results/bench/2026-12-04-cpu-gemma3-kquant/README.md). Each 32-value chunk of a weight
//! row is decoded to integer codes
//! `w` with an integer scale per 16 values (Q6_K, Q3_K, Q2_K's sub-blocks; else 1), a float
//! factor `f` and a float minimum `b`, so that a weight is `f * scale * w - b` exactly as the
//! format defines it. A chunk's product with an input is then
//! `f * d * sum(scale * w * q) + b * sum(x)` with int8 inputs: integer dot products (`maddubs`
//! then `madd` with AVX2, `vpdpbusd` two chunks at a time with AVX-512 VNNI), one float
//! multiply-add a chunk; with float inputs `sum((f * scale * w) * x) + b * sum(x)`.
//!
//! Tier L3 against the plain reference (each block dequantized as gguf-py does, then a float32
//! dot with the unquantized inputs): the int8 inputs add at most half a step (`d / 2`) of error
//! per input value (`tests/gguf_kquant.rs` in mlx-models states the bounds: exact where the
//! inputs are representable, else within the rounding of the inputs). The AVX2 kernels and the
//! portable one sum in different orders (tier L3 between them, a float32 rounding bound).
//! Every row's result depends on nothing but its own inputs (not on how many rows a call
//! takes), so a batched decode step gets each sequence's bits alone. A `matmul_t` call of
//! `kgemm::MIN_M` rows or more (a prompt block) takes `cpu::kgemm`'s panel kernels instead
//! where they apply (AVX-512; float inputs, or int16 per 32 values under `Int16` /
//! `Int16Q8Int8`).

use super::matmul::{Kind, MatJob, Matrix};
use super::{Activations, CpuContext, Isa, SharedOut};
use crate::{Error, Result};
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A GGML block type these kernels read.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl GgmlType {
    /// Every type, in GGML id order.
    pub const ALL: [GgmlType; 10] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// The type of GGML id `id` (`ggml_type`), if these kernels read it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }

    /// Values a block.
    pub fn block(self) -> usize {
        match self {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                32
            }
            _ => 256,
        }
    }

    /// Bytes a block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
        }
    }

    /// Bytes of a row of `cols` values (`cols` a multiple of [`GgmlType::block`]).
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block() * self.block_bytes()
    }

    /// Whether the AVX2 kernels read this type (the others take the portable kernel).
    pub fn has_avx2_kernel(self) -> bool {
        !matches!(self, GgmlType::Q2_K | GgmlType::Q3_K)
    }
}

/// numpy's `float16 -> float32` (`npy_halfbits_to_floatbits`): exact, NaN payloads kept.
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exp = h & 0x7c00;
    let bits = match exp {
        0 => {
            let mut sig = h & 0x03ff;
            if sig == 0 {
                return f32::from_bits(sign);
            }
            // Subnormal: normalise.
            let mut e = 0u32;
            sig <<= 1;
            while sig & 0x0400 == 0 {
                sig <<= 1;
                e += 1;
            }
            sign + ((127 - 15 - e) << 23) + ((sig & 0x03ff) << 13)
        }
        0x7c00 => sign + 0x7f80_0000 + ((h & 0x03ff) << 13),
        _ => sign + (((h & 0x7fff) + 0x1_c000) << 13),
    };
    f32::from_bits(bits)
}

/// The half at byte `at` of `b` as a float ([`f16_to_f32`]).
#[inline]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// One row of a GGML matrix (`row`: its bytes, `out`: its `cols` values) dequantized to f32
/// with gguf-py's formulas in its order (no fused multiply-add), block by block: an embedding
/// lookup, and the portable path's reference.
pub fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    let (bs, bb) = (ty.block(), ty.block_bytes());
    for (b, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
        match ty {
            GgmlType::Q4_0 => {
                let d = half(b, 0);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * f32::from(nibble(&b[2..], j) as i8 - 8);
                }
            }
            GgmlType::Q4_1 => {
                let (d, m) = (half(b, 0), half(b, 2));
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * f32::from(nibble(&b[4..], j)) + m;
                }
            }
            GgmlType::Q5_0 => {
                let d = half(b, 0);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * f32::from(five_bits(&b[2..6], &b[6..], j) as i8 - 16);
                }
            }
            GgmlType::Q5_1 => {
                let (d, m) = (half(b, 0), half(b, 2));
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * f32::from(five_bits(&b[4..8], &b[8..], j)) + m;
                }
            }
            GgmlType::Q8_0 => {
                let d = half(b, 0);
                for (v, &x) in o.iter_mut().zip(&b[2..]) {
                    *v = f32::from(x as i8) * d;
                }
            }
            _ => {
                let mut c = Codes::default();
                for (k, sub) in o.chunks_exact_mut(32).enumerate() {
                    chunk_codes(ty, b, k, &mut c);
                    for (i, v) in sub.iter_mut().enumerate() {
                        *v = c.value(i);
                    }
                }
            }
        }
    }
}

fn nibble(qs: &[u8], j: usize) -> u8 {
    (qs[j % 16] >> (4 * (j / 16))) & 0x0f
}

fn five_bits(qh: &[u8], qs: &[u8], j: usize) -> u8 {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    nibble(qs, j) | ((((h >> j) & 1) as u8) << 4)
}

/// Q4_K's and Q5_K's eight 6-bit scales and mins, packed in 12 bytes.
fn scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for i in 0..4 {
        sc[i] = s[i] & 0x3f;
        sc[i + 4] = (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30);
        m[i] = s[4 + i] & 0x3f;
        m[i + 4] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
    }
    (sc, m)
}

/// A 32-value chunk of a block as integer codes: value `i` is `f[h] * w[i] - b[h]` for the
/// chunk's half `h = i / 16` (both halves alike where the format has one scale per 32), with
/// `f` the format's float factor (`d * scale`, gguf-py's product) and `b` its minimum.
#[derive(Clone, Copy, Default)]
struct Codes {
    w: [i8; 32],
    /// The float factor of each half (`d * scale`, as gguf-py rounds it).
    f: [f32; 2],
    /// Each half's minimum (subtracted).
    b: [f32; 2],
    /// `d` and each half's integer scale (the integer kernels' split of `f`).
    d: f32,
    sc: [i16; 2],
}

impl Codes {
    /// Value `i` as gguf-py computes it.
    #[inline]
    fn value(&self, i: usize) -> f32 {
        let h = i / 16;
        self.f[h] * f32::from(self.w[i]) - self.b[h]
    }
}

/// Chunk `k` (`0..block / 32`) of block `b` of type `ty` as codes.
fn chunk_codes(ty: GgmlType, b: &[u8], k: usize, c: &mut Codes) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let d = half(b, 0);
            let m = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                -half(b, 2)
            } else {
                0.0
            };
            for j in 0..32 {
                c.w[j] = match ty {
                    GgmlType::Q4_0 => nibble(&b[2..], j) as i8 - 8,
                    GgmlType::Q4_1 => nibble(&b[4..], j) as i8,
                    GgmlType::Q5_0 => five_bits(&b[2..6], &b[6..], j) as i8 - 16,
                    GgmlType::Q5_1 => five_bits(&b[4..8], &b[8..], j) as i8,
                    _ => b[2 + j] as i8,
                };
            }
            *c = Codes {
                w: c.w,
                f: [d; 2],
                b: [m; 2],
                d,
                sc: [1; 2],
            };
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let five = ty == GgmlType::Q5_K;
            let (d, dmin) = (half(b, 0), half(b, 2));
            let (sc, m) = scale_min(&b[4..16]);
            let (qh, qs) = if five {
                (&b[16..48], &b[48..176])
            } else {
                (&b[16..16], &b[16..144])
            };
            let (part, s) = (k / 2, k % 2);
            for i in 0..32 {
                let mut q = (qs[32 * part + i] >> (4 * s)) & 0x0f;
                if five {
                    q |= ((qh[i] >> k) & 1) << 4;
                }
                c.w[i] = q as i8;
            }
            let f = d * f32::from(sc[k]);
            let dm = dmin * f32::from(m[k]);
            c.f = [f; 2];
            c.b = [dm; 2];
            c.d = d;
            c.sc = [i16::from(sc[k]); 2];
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
            let d = half(b, 208);
            for i in 0..32 {
                let p = 32 * k + i;
                let (h, r) = (p / 128, p % 128);
                let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
                let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
                c.w[i] = (low | (high << 4)) as i8 - 32;
            }
            for h in 0..2 {
                let s = scales[2 * k + h] as i8;
                c.f[h] = d * f32::from(s);
                c.sc[h] = i16::from(s);
            }
            c.b = [0.0; 2];
            c.d = d;
        }
        GgmlType::Q2_K => {
            let (scales, qs) = (&b[..16], &b[16..80]);
            let (d, dmin) = (half(b, 80), half(b, 82));
            for i in 0..32 {
                let p = 32 * k + i;
                let (h, s, j) = (p / 128, (p % 128) / 32, p % 32);
                c.w[i] = ((qs[32 * h + j] >> (2 * s)) & 3) as i8;
            }
            for h in 0..2 {
                let sc = scales[2 * k + h];
                c.f[h] = d * f32::from(sc & 0x0f);
                c.b[h] = dmin * f32::from(sc >> 4);
                c.sc[h] = i16::from(sc & 0x0f);
            }
            c.d = d;
        }
        GgmlType::Q3_K => {
            let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
            let d = half(b, 108);
            for i in 0..32 {
                let p = 32 * k + i;
                let (h, s, j) = (p / 128, (p % 128) / 32, p % 32);
                let ql = (qs[32 * h + j] >> (2 * s)) & 3;
                let qh = ((hmask[p % 32] >> (p / 32)) & 1) ^ 1;
                c.w[i] = ql as i8 - (qh << 2) as i8;
            }
            for h in 0..2 {
                let i = 2 * k + h;
                let low = (scales[i % 8] >> (4 * (i / 8))) & 0x0f;
                let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
                let s = (low | (high << 4)) as i8 - 32;
                c.f[h] = d * f32::from(s);
                c.sc[h] = i16::from(s);
            }
            c.b = [0.0; 2];
            c.d = d;
        }
    }
}

/// The inputs of a call quantized to int8 per 32 values: codes, scales, and each chunk's exact
/// float sum.
#[derive(Debug, Default)]
pub(crate) struct Acts {
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    /// Each 4 codes' sum times -128 (the AVX-512 kernel's start for signed codes + 128).
    n4: Vec<i32>,
    /// The int16 codes ([`Inputs::Int16`]; `d` and `s` then hold their scales and sums).
    q16: Vec<i16>,
}

/// How a call's GGML products read their inputs ([`inputs_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inputs {
    /// Float32: each chunk's codes widened to floats times their factor.
    F32,
    /// Int8 per 32 values ([`quantize_acts`]): integer dot products.
    Int8,
    /// Int16 per 32 values (`d = max|x| / 32767`, codes rounded to nearest), integer dot
    /// products (`madd`; AVX-512 VNNI's `vpdpwssd`): an input error of at most 1/65534 of
    /// each chunk's largest input, 256 times less than int8's. AVX2 only.
    Int16,
}

/// The inputs a call takes: int8 under the int8 modes ([`int8_inputs`]); int16 for the
/// decode steps' products (`each`: `matmul_t_each`, one to four inputs) under `Int16` and
/// `Int16Q8Int8` (the CPU decoder's default) where the CPU has AVX2; else float32 (a prompt
/// block's `matmul_t`, `F32`, no AVX2).
pub fn inputs_for(isa: Isa, act: Activations, m: usize, each: bool) -> Inputs {
    if int8_inputs(act) {
        Inputs::Int8
    } else if each
        && m <= 4
        && isa.has_avx2()
        && matches!(act, Activations::Int16 | Activations::Int16Q8Int8)
    {
        Inputs::Int16
    } else {
        Inputs::F32
    }
}

/// Each 32 values' float sum (the minimums' factor of the float inputs) into `s`.
fn chunk_sums(x: &[f32], s: &mut Vec<f32>) {
    s.clear();
    s.extend(x.chunks_exact(32).map(|c| c.iter().sum::<f32>()));
}

/// `x` quantized to int16 per 32 values into `a.q16`, `a.d`, `a.s` (grown as needed).
fn quantize_acts16(isa: Isa, x: &[f32], a: &mut Acts) {
    let chunks = x.len() / 32;
    a.q16.resize(x.len(), 0);
    a.d.resize(chunks, 0.0);
    a.s.resize(chunks, 0.0);
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: AVX2, FMA and F16C checked (Isa::Avx2 / Avx512 exist only where the CPU
        // has them); the buffers were sized above.
        unsafe { super::x86::quantize_x16(x, &mut a.q16, &mut a.d, &mut a.s) };
        return;
    }
    let _ = isa;
    for (c, chunk) in x.chunks_exact(32).enumerate() {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 32767.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (q, v) in a.q16[c * 32..c * 32 + 32].iter_mut().zip(chunk) {
            *q = (v * inv).round() as i16;
        }
        a.d[c] = d;
        a.s[c] = chunk.iter().sum();
    }
}

/// Quantizes `x` (a multiple of 32 values) into `a` (grown as needed; nothing is allocated
/// once it has the room).
pub(crate) fn quantize_acts(x: &[f32], a: &mut Acts) {
    let chunks = x.len() / 32;
    a.q.resize(x.len(), 0);
    a.d.resize(chunks, 0.0);
    a.s.resize(chunks, 0.0);
    a.n4.resize(chunks * 8, 0);
    for (c, chunk) in x.chunks_exact(32).enumerate() {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0f32;
        for (q, &v) in a.q[c * 32..c * 32 + 32].iter_mut().zip(chunk) {
            *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
            sum += v;
        }
        a.d[c] = d;
        a.s[c] = sum;
        for (l, n) in a.n4[c * 8..c * 8 + 8].iter_mut().enumerate() {
            let q = &a.q[c * 32 + 4 * l..c * 32 + 4 * l + 4];
            *n = -128 * q.iter().map(|&v| i32::from(v)).sum::<i32>();
        }
    }
}

/// The portable kernel: row `row` (its bytes) against one input (`q`, `d`, `s`: its codes,
/// scales and sums).
fn dot_scalar(ty: GgmlType, row: &[u8], q: &[i8], d: &[f32], s: &[f32]) -> f32 {
    let (bb, per) = (ty.block_bytes(), ty.block() / 32);
    let mut c = Codes::default();
    let mut acc = 0f32;
    let mut mins = 0f32;
    for (ch, (qx, (&dx, &sx))) in q.chunks_exact(32).zip(d.iter().zip(s)).enumerate() {
        let b = &row[ch / per * bb..(ch / per + 1) * bb];
        chunk_codes(ty, b, ch % per, &mut c);
        let mut isum = [0i32; 2];
        for (i, (&w, &x)) in c.w.iter().zip(qx).enumerate() {
            isum[i / 16] += i32::from(w) * i32::from(x);
        }
        let dot = i32::from(c.sc[0]) * isum[0] + i32::from(c.sc[1]) * isum[1];
        acc += c.d * dx * dot as f32;
        if c.b[0] == c.b[1] {
            mins -= c.b[0] * sx;
        } else {
            // Two minimums a chunk (Q2_K): each half's sum from the int8 inputs.
            for (h, &bh) in c.b.iter().enumerate() {
                let qs: i32 = qx[16 * h..16 * h + 16].iter().map(|&v| i32::from(v)).sum();
                mins -= bh * (dx * qs as f32);
            }
        }
    }
    acc + mins
}

/// The portable float kernel: each block dequantized ([`dequantize_row`]), then a float32 dot.
fn dot_plain(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let (bs, bb) = (ty.block(), ty.block_bytes());
    let mut w = [0f32; 256];
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(bb).zip(x.chunks_exact(bs)) {
        dequantize_row(ty, b, &mut w[..bs]);
        acc += w[..bs].iter().zip(xb).map(|(a, b)| a * b).sum::<f32>();
    }
    acc
}

thread_local! {
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
}

/// Whether `w` is in a GGML block layout.
pub(crate) fn is_ggml(w: &Matrix<'_>) -> bool {
    matches!(w.kind, Kind::Ggml { .. })
}

/// Whether `act` gives GGML products int8 inputs (the int8 modes: `Int8`, `Int8Vnni`,
/// `Int8Normed` for normed inputs); else float32 inputs (the default `Int16Q8Int8`, `Int16`,
/// `F32`): the blocks' codes widened to floats, no input rounding.
pub fn int8_inputs(act: Activations) -> bool {
    matches!(
        act,
        Activations::Int8 | Activations::Int8Vnni | Activations::Int8Normed
    )
}

/// `out = x W^T (+ bias)` for every job of a call that holds a GGML matrix: each input row
/// through the kernels above (float, int8 or int16 inputs as [`inputs_for`] says of `act`,
/// `m` and `each`; for given inputs the same bits whatever `m`), other layouts through the
/// float kernels one row at a time.
pub(crate) fn matmul_jobs(
    ctx: &CpuContext,
    act: Activations,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
    each: bool,
) -> Result<()> {
    let cols = jobs[0].w.cols();
    if cols % 32 != 0 {
        return Err(Error::invalid(
            "cpu::matmul_t",
            format!("GGML blocks of {cols} columns (not a multiple of 32)"),
        ));
    }
    let inputs = inputs_for(ctx.isa, act, m, each);
    ACTS.with(|a| {
        let mut acts = a.borrow_mut();
        match inputs {
            Inputs::Int8 => quantize_acts(x, &mut acts),
            Inputs::Int16 => quantize_acts16(ctx.isa, x, &mut acts),
            Inputs::F32 => chunk_sums(x, &mut acts.s),
        }
        run(ctx, inputs, x, m, jobs, &acts)
    })
}

fn run(
    ctx: &CpuContext,
    inputs: Inputs,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
    acts: &Acts,
) -> Result<()> {
    use super::matmul::{Floats, MAX_JOBS};
    let cols = jobs[0].w.cols();
    let chunks = cols / 32;
    let threads = ctx.pool.threads();
    let total: usize = jobs.iter().map(|j| j.w.rows()).sum();
    // Blocks of rows the workers take in turn: at most 32 rows, but up to 256 in a call of
    // 64k rows or more (a large vocabulary's head: 8192 blocks of 32 rows at Gemma 3's
    // 262,144 would cost as many contended atomic increments, and each block's last rows'
    // prefetches would land in another worker's block).
    let cap = if total >= 1 << 16 { 256 } else { 32 };
    let block = (total / (threads * 8)).clamp(1, cap);
    type Plan<'p> = (Matrix<'p>, Option<Floats<'p>>, SharedOut, usize);
    let mut plan: [Option<Plan<'_>>; MAX_JOBS] = [None; MAX_JOBS];
    let mut blocks = 0;
    for (p, j) in plan.iter_mut().zip(jobs.iter_mut()) {
        *p = Some((*j.w, j.bias, SharedOut::new(j.out), blocks));
        blocks += j.w.rows().div_ceil(block);
    }
    let next = AtomicUsize::new(0);
    let isa = ctx.isa;
    ctx.pool.run(&|_, _| loop {
        let b = next.fetch_add(1, Ordering::Relaxed);
        if b >= blocks {
            break;
        }
        let Some(&(w, bias, out, start)) = plan.iter().rev().flatten().find(|p| p.3 <= b) else {
            break;
        };
        let r0 = (b - start) * block;
        let r1 = (r0 + block).min(w.rows());
        let n = w.rows();
        let Kind::Ggml { data, ty } = w.kind else {
            // Another layout in the same call: the float kernels, one input row at a time
            // (as `matmul_t_each`'s float path).
            for t in 0..m {
                let xr = &x[t * cols..(t + 1) * cols];
                super::matmul::rows(isa, &w, r0, r1, xr, 1, out.from(t * n), bias);
            }
            continue;
        };
        let rb = ty.row_bytes(cols);
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() && ty.has_avx2_kernel() {
            // SAFETY: Isa::Avx2 / Avx512 are only constructed where the CPU has AVX2, FMA and
            // F16C (CpuContext checks `available`); rows r0..r1 of every output are this
            // worker's alone; `rows` checks the sizes.
            unsafe {
                super::kquant_x86::rows(
                    ty,
                    data,
                    rb,
                    (r0, r1),
                    x86_inputs(inputs, x, acts),
                    isa == Isa::Avx512,
                    m,
                    chunks,
                    out,
                    n,
                    bias,
                )
            };
            continue;
        }
        for r in r0..r1 {
            let row = &data[r * rb..(r + 1) * rb];
            let bv = bias.map_or(0.0, |b| b.get(r));
            if inputs != Inputs::Int8 {
                // Float (or int16: no portable int16 kernel) inputs: the plain product.
                for t in 0..m {
                    let v = dot_plain(ty, row, &x[t * cols..(t + 1) * cols]);
                    // SAFETY: row r of every output is this worker's alone.
                    unsafe { out.write(t * n + r, v + bv) };
                }
                continue;
            }
            let mut t0 = 0;
            while t0 < m {
                let mt = (m - t0).min(4);
                let mut res = [0f32; 4];
                dots(isa, ty, row, acts, t0, mt, chunks, &mut res);
                for (t, v) in res[..mt].iter().enumerate() {
                    // SAFETY: row r of every output is this worker's alone.
                    unsafe { out.write((t0 + t) * n + r, v + bv) };
                }
                t0 += mt;
            }
        }
    });
    Ok(())
}

/// The x86 kernels' view of a call's inputs.
#[cfg(target_arch = "x86_64")]
fn x86_inputs<'a>(inputs: Inputs, x: &'a [f32], a: &'a Acts) -> super::kquant_x86::Inputs<'a> {
    use super::kquant_x86::Inputs as X;
    match inputs {
        Inputs::Int8 => X::Int8 {
            q: &a.q,
            d: &a.d,
            s: &a.s,
            n4: &a.n4,
        },
        Inputs::F32 => X::F32 { x, s: &a.s },
        Inputs::Int16 => X::Int16 {
            q: &a.q16,
            d: &a.d,
            s: &a.s,
        },
    }
}

/// `mt` (1..=4) inputs from `t0` on against one row.
#[allow(clippy::too_many_arguments)]
fn dots(
    isa: Isa,
    ty: GgmlType,
    row: &[u8],
    a: &Acts,
    t0: usize,
    mt: usize,
    chunks: usize,
    res: &mut [f32; 4],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && ty.has_avx2_kernel() {
        let c0 = t0 * chunks;
        let q = &a.q[t0 * chunks * 32..(t0 + mt) * chunks * 32];
        let d = &a.d[c0..c0 + mt * chunks];
        let s = &a.s[c0..c0 + mt * chunks];
        let n4 = &a.n4[c0 * 8..(c0 + mt * chunks) * 8];
        let inputs = super::kquant_x86::Inputs::Int8 { q, d, s, n4 };
        let out = SharedOut::new(&mut res[..mt]);
        // SAFETY: Isa::Avx2 / Avx512 are only constructed where the CPU has AVX2, FMA and
        // F16C; `out` is this call's own.
        unsafe {
            super::kquant_x86::rows(
                ty,
                row,
                row.len(),
                (0, 1),
                inputs,
                isa == Isa::Avx512,
                mt,
                chunks,
                out,
                1,
                None,
            )
        };
        return;
    }
    let _ = isa;
    for (t, r) in res.iter_mut().enumerate().take(mt) {
        let u = t0 + t;
        *r = dot_scalar(
            ty,
            row,
            &a.q[u * chunks * 32..(u + 1) * chunks * 32],
            &a.d[u * chunks..(u + 1) * chunks],
            &a.s[u * chunks..(u + 1) * chunks],
        );
    }
}

/// Test and benchmark access to the two kernels on one input row: the portable one, and the
/// one `isa` picks.
#[doc(hidden)]
pub fn dot_row_with(isa: Isa, ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let mut a = Acts::default();
    quantize_acts(x, &mut a);
    let mut res = [0f32; 4];
    dots(isa, ty, row, &a, 0, 1, x.len() / 32, &mut res);
    res[0]
}

/// Test and benchmark access to `m` input rows (`x`, `(m, cols)`) against a GGML matrix
/// (`data`, `rows` rows) through the kernels `act` picks on `isa` for a decode step's
/// products (`matmul_t_each`: float, int8 or int16 inputs, [`inputs_for`]), `threads` workers.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn matvec_with(
    isa: Isa,
    act: Activations,
    threads: usize,
    ty: GgmlType,
    data: &[u8],
    rows: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<()> {
    let mut ctx = CpuContext::with_isa(threads, isa)?;
    ctx.activations = act;
    let w = Matrix::ggml(data, ty, rows, x.len() / m.max(1))?;
    let mut scratch = super::RowsScratch::default();
    super::matmul_t_each(
        &ctx,
        x,
        m,
        &mut [MatJob {
            w: &w,
            bias: None,
            out,
        }],
        &mut scratch,
    )
}

#[cfg(test)]
mod tests {
    use super::super::matmul::Floats;
    use super::super::test_rng::Lcg;
    use super::super::{matmul_t, matmul_t_each, RowsScratch};
    use super::*;

    /// Seeded rows of `ty`: random code bytes, half-precision factors set to small finite
    /// values (positive and negative).
    pub(crate) fn random_rows(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
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
                let f = (g.next() % 2000) as f32 / 1e5 - 0.004;
                b[at..at + 2].copy_from_slice(&half::f16::from_f32(f).to_le_bytes());
            }
        }
        v
    }

    /// Inputs the int8 quantization keeps exactly: multiples of 1/128 whose chunks reach
    /// +-127/128.
    fn exact_inputs(n: usize, seed: u64) -> Vec<f32> {
        let mut g = Lcg(seed);
        (0..n)
            .map(|i| {
                let q = if i % 32 == 5 {
                    127
                } else {
                    (g.next() % 255) as i32 - 127
                };
                q as f32 / 128.0
            })
            .collect()
    }

    fn plain(ty: GgmlType, row: &[u8], x: &[f32]) -> (f32, f32) {
        let mut w = vec![0f32; x.len()];
        dequantize_row(ty, row, &mut w);
        let dot = w.iter().zip(x).map(|(a, b)| a * b).sum();
        let abs = w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
        (dot, abs)
    }

    /// Where the inputs are exact in int8, every type's portable and AVX2 kernels give the
    /// plain product (dequantized row, float32 dot) within float32 rounding: tier L3, bound
    /// `2e-6 * sum |w x|` (seen: at most 5e-8; a wrong code among 512 is ~2e-3 of it).
    #[test]
    fn exact_inputs_give_the_plain_product() {
        let cols = 512;
        for ty in GgmlType::ALL {
            let rows = 8;
            let data = random_rows(ty, rows, cols, 3 + ty.id() as u64);
            let x = exact_inputs(cols, 11);
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                if !isa.available() {
                    continue;
                }
                for r in 0..rows {
                    let row = &data[r * ty.row_bytes(cols)..(r + 1) * ty.row_bytes(cols)];
                    let (want, abs) = plain(ty, row, &x);
                    let got = dot_row_with(isa, ty, row, &x);
                    assert!(
                        (got - want).abs() <= 2e-6 * abs + 1e-30,
                        "{} {isa:?} row {r}: {got} vs {want} (sum |wx| {abs})",
                        ty.name()
                    );
                }
            }
        }
    }

    /// Int16 inputs (a decode step's default, `Int16Q8Int8`): every AVX2-kernel type's AVX2
    /// and AVX-512 int16 kernels against the plain product (dequantized row, float32 dot with
    /// the unquantized inputs), one to four inputs a call: tier L3, bound `sum_c (d_c / 2)
    /// sum_{i in c} |w_i|` (each input off by at most half its chunk's step `d_c = max|x| /
    /// 32767`) plus `2e-6 * sum |w x|` of float32 rounding; and each input's bits are the
    /// same whatever `m` (70 rows: one input's four-row passes, `kquant_x86::ROWS`, and
    /// their remainders, on one and two threads).
    #[test]
    fn int16_inputs_are_within_half_a_step() {
        let rows = 70;
        // 16 chunks, and 19 (the 32-value types' grouped kernel's tail).
        let shapes = GgmlType::ALL
            .into_iter()
            .filter(|t| t.has_avx2_kernel())
            .flat_map(|t| [(t, 512), (t, 608)])
            .filter(|(t, cols)| cols % t.block() == 0);
        for (ty, cols) in shapes {
            let data = random_rows(ty, rows, cols, 21 + ty.id() as u64);
            let mut g = Lcg(99);
            let x: Vec<f32> = (0..4 * cols)
                .map(|i| {
                    let v = (g.next() % 20001) as f32 / 10000.0 - 1.0;
                    // An outlier channel, as a Gemma hidden state has.
                    if i % 97 == 3 {
                        v * 300.0
                    } else {
                        v
                    }
                })
                .collect();
            for isa in [Isa::Avx2, Isa::Avx512] {
                if !isa.available() {
                    continue;
                }
                assert_eq!(
                    inputs_for(isa, Activations::Int16Q8Int8, 1, true),
                    Inputs::Int16
                );
                let mut one = vec![0f32; rows];
                for m in 1..=4 {
                    let mut out = vec![0f32; m * rows];
                    let xm = &x[..m * cols];
                    let act = Activations::Int16Q8Int8;
                    matvec_with(isa, act, 2, ty, &data, rows, xm, m, &mut out).unwrap();
                    for t in 0..m {
                        let xt = &x[t * cols..(t + 1) * cols];
                        matvec_with(isa, act, 1, ty, &data, rows, xt, 1, &mut one).unwrap();
                        for r in 0..rows {
                            let rb = ty.row_bytes(cols);
                            let row = &data[r * rb..(r + 1) * rb];
                            let (want, abs) = plain(ty, row, xt);
                            let mut w = vec![0f32; cols];
                            dequantize_row(ty, row, &mut w);
                            let step: f32 = w
                                .chunks_exact(32)
                                .zip(xt.chunks_exact(32))
                                .map(|(wc, xc)| {
                                    let amax = xc.iter().fold(0f32, |a, v| a.max(v.abs()));
                                    amax / 32767.0 / 2.0 * wc.iter().map(|v| v.abs()).sum::<f32>()
                                })
                                .sum();
                            let got = out[t * rows + r];
                            assert!(
                                (got - want).abs() <= 1.001 * step + 2e-6 * abs + 1e-30,
                                "{} {isa:?} m {m} input {t} row {r}: {got} vs {want} \
                                 (bound {step} + {abs} * 2e-6)",
                                ty.name()
                            );
                            assert_eq!(got.to_bits(), one[r].to_bits(), "{} m {m}", ty.name());
                        }
                    }
                }
            }
        }
    }

    /// A call's rows each get the bits they get alone, through `matmul_t` (a prompt block of
    /// 1..=9 rows) and `matmul_t_each` (tier: bit-identical), with a bias.
    #[test]
    fn each_row_is_what_it_is_alone() {
        let (rows, cols) = (24, 256);
        let ctx = CpuContext::new(2).unwrap();
        let mut scratch = RowsScratch::default();
        let bias: Vec<f32> = (0..rows).map(|i| i as f32 * 0.25).collect();
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
        ] {
            let data = random_rows(ty, rows, cols, 5);
            let w = Matrix::ggml(&data, ty, rows, cols).unwrap();
            for m in 1..=9 {
                let x: Vec<f32> = exact_inputs(m * cols, 40 + m as u64)
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v * (1.0 + (i % 7) as f32 * 0.1))
                    .collect();
                let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
                let b_ = Some(Floats::F32(&bias));
                matmul_t(
                    &ctx,
                    &x,
                    m,
                    &mut [MatJob {
                        w: &w,
                        bias: b_,
                        out: &mut a,
                    }],
                )
                .unwrap();
                let mut jobs = [MatJob {
                    w: &w,
                    bias: b_,
                    out: &mut b,
                }];
                matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                for t in 0..m {
                    let mut one = vec![0f32; rows];
                    let xt = &x[t * cols..(t + 1) * cols];
                    matmul_t(
                        &ctx,
                        xt,
                        1,
                        &mut [MatJob {
                            w: &w,
                            bias: b_,
                            out: &mut one,
                        }],
                    )
                    .unwrap();
                    for (k, got) in [&a, &b].iter().enumerate() {
                        let same = got[t * rows..(t + 1) * rows]
                            .iter()
                            .zip(&one)
                            .all(|(p, q)| p.to_bits() == q.to_bits());
                        assert!(same, "{} m {m} row {t} path {k}", ty.name());
                    }
                }
            }
        }
    }

    /// The row lookup dequantizes as `dequantize_row`, and bad sizes are errors.
    #[test]
    fn lookup_and_sizes() {
        let (rows, cols) = (3, 256);
        let data = random_rows(GgmlType::Q6_K, rows, cols, 9);
        let w = Matrix::ggml(&data, GgmlType::Q6_K, rows, cols).unwrap();
        let mut a = vec![0f32; cols];
        let mut b = vec![0f32; cols];
        w.row_to(2, &mut a).unwrap();
        dequantize_row(GgmlType::Q6_K, &data[2 * 210..3 * 210], &mut b);
        assert_eq!(a, b);
        assert_eq!(w.value(2, 77), b[77]);
        assert!(Matrix::ggml(&data, GgmlType::Q6_K, rows, 128).is_err());
        assert!(Matrix::ggml(&data[1..], GgmlType::Q6_K, rows, cols).is_err());
        assert_eq!(GgmlType::from_id(14), Some(GgmlType::Q6_K));
        assert_eq!(GgmlType::from_id(1), None);
    }
}
