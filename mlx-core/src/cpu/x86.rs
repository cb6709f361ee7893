//! The AVX2 + FMA + F16C kernels (x86-64). Every function here requires those features:
//! callers check [`super::Isa::Avx2`] first.
//!
//! A weight row is read 32 values at a time into four 8-lane float vectors (dequantized in
//! registers: `scale * q + bias`, the scale and bias of the row's groups widened once per row);
//! each input row accumulates `w * x` with FMA in two accumulators. For a block of more than
//! four inputs a quantized row is first dequantized into a stack buffer, then read from L1 for
//! every tile of four inputs.

use std::arch::x86_64::*;

use super::matmul::{Floats, Kind, Matrix};
use super::SharedOut;

/// Groups of one row whose scales and biases are widened on the stack (rows with more
/// groups, or 2-bit rows, take the scalar kernel).
const MAX_GROUPS: usize = 1024;
/// Widest row dequantized into a stack buffer for multi-input blocks.
const MAX_BUF: usize = 8192;

/// Whether the AVX2 kernel handles `w` (else the scalar kernel does).
pub(super) fn supports(w: &Matrix<'_>) -> bool {
    if w.cols() % 32 != 0 {
        return false;
    }
    match w.kind {
        Kind::Dense(_) => true,
        // A group size that is not 32 times a power of two dequantizes a whole row into the
        // stack buffer.
        Kind::Affine { bits, group, .. } => {
            matches!(bits, 4 | 8)
                && w.cols() / group <= MAX_GROUPS
                && ((group / 32).is_power_of_two() || w.cols() <= MAX_BUF)
        }
    }
}

/// Loads 32 consecutive weights of a row (chunk `c`) as four 8-lane float vectors.
trait Chunks {
    unsafe fn load(&self, c: usize) -> [__m256; 4];
}

struct F32Row(*const f32);
struct F16Row(*const u16);
struct Bf16Row(*const u16);
struct Q4Row {
    bytes: *const u8,
    s: *const f32,
    b: *const f32,
    shift: u32,
}
struct Q8Row {
    bytes: *const u8,
    s: *const f32,
    b: *const f32,
    shift: u32,
}

impl Chunks for F32Row {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, c: usize) -> [__m256; 4] {
        // SAFETY: the caller keeps c within the row (32 floats a chunk).
        unsafe {
            let p = self.0.add(c * 32);
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
    }
}

impl Chunks for F16Row {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, c: usize) -> [__m256; 4] {
        // SAFETY: within the row (32 halves a chunk).
        unsafe {
            let p = self.0.add(c * 32) as *const __m128i;
            [
                _mm256_cvtph_ps(_mm_loadu_si128(p)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(1))),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(2))),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(3))),
            ]
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16x8(p: *const __m128i) -> __m256 {
    // SAFETY: 16 readable bytes at p.
    unsafe {
        _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p)),
            16,
        ))
    }
}

impl Chunks for Bf16Row {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, c: usize) -> [__m256; 4] {
        // SAFETY: within the row (32 bfloat16 a chunk).
        unsafe {
            let p = self.0.add(c * 32) as *const __m128i;
            [
                bf16x8(p),
                bf16x8(p.add(1)),
                bf16x8(p.add(2)),
                bf16x8(p.add(3)),
            ]
        }
    }
}

impl Chunks for Q4Row {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, c: usize) -> [__m256; 4] {
        // SAFETY: within the row (16 bytes a chunk; one scale and bias a group).
        unsafe {
            let g = c >> self.shift;
            let s = _mm256_set1_ps(*self.s.add(g));
            let b = _mm256_set1_ps(*self.b.add(g));
            let v = _mm_loadu_si128(self.bytes.add(c * 16) as *const __m128i);
            let mask = _mm_set1_epi8(0x0f);
            // Byte k holds value 2k in its low nibble and 2k + 1 in its high one.
            let lo = _mm_and_si128(v, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
            let a = _mm_unpacklo_epi8(lo, hi);
            let z = _mm_unpackhi_epi8(lo, hi);
            [
                _mm256_fmadd_ps(u8x8(a), s, b),
                _mm256_fmadd_ps(u8x8(_mm_srli_si128(a, 8)), s, b),
                _mm256_fmadd_ps(u8x8(z), s, b),
                _mm256_fmadd_ps(u8x8(_mm_srli_si128(z, 8)), s, b),
            ]
        }
    }
}

impl Chunks for Q8Row {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, c: usize) -> [__m256; 4] {
        // SAFETY: within the row (32 bytes a chunk; one scale and bias a group).
        unsafe {
            let g = c >> self.shift;
            let s = _mm256_set1_ps(*self.s.add(g));
            let b = _mm256_set1_ps(*self.b.add(g));
            let p = self.bytes.add(c * 32);
            let q = p as *const __m128i;
            [
                _mm256_fmadd_ps(u8x8(_mm_loadl_epi64(q)), s, b),
                _mm256_fmadd_ps(u8x8(_mm_loadl_epi64(p.add(8) as *const __m128i)), s, b),
                _mm256_fmadd_ps(u8x8(_mm_loadl_epi64(p.add(16) as *const __m128i)), s, b),
                _mm256_fmadd_ps(u8x8(_mm_loadl_epi64(p.add(24) as *const __m128i)), s, b),
            ]
        }
    }
}

/// The low 8 bytes of `x` as 8 floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn u8x8(x: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `MT` dot products of one row (`chunks` chunks of 32) with inputs `x[t0..t0 + MT]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<L: Chunks, const MT: usize>(
    l: &L,
    chunks: usize,
    x: *const f32,
    cols: usize,
) -> [f32; MT] {
    // SAFETY: x holds MT rows of cols >= chunks * 32 floats; the loader stays in its row.
    unsafe {
        let mut a0 = [_mm256_setzero_ps(); MT];
        let mut a1 = [_mm256_setzero_ps(); MT];
        for c in 0..chunks {
            let w = l.load(c);
            for t in 0..MT {
                let p = x.add(t * cols + c * 32);
                a0[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(p), a0[t]);
                a1[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(p.add(8)), a1[t]);
                a0[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(p.add(16)), a0[t]);
                a1[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(p.add(24)), a1[t]);
            }
        }
        let mut out = [0f32; MT];
        for t in 0..MT {
            out[t] = hsum(_mm256_add_ps(a0[t], a1[t]));
        }
        out
    }
}

/// One dot product of a row with one input, in four accumulators (the two of [`tile`] would
/// make the loop wait on FMA latency: decode is this case).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile1<L: Chunks>(l: &L, chunks: usize, x: *const f32) -> f32 {
    // SAFETY: x holds chunks * 32 floats; the loader stays in its row.
    unsafe {
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        for c in 0..chunks {
            let w = l.load(c);
            let p = x.add(c * 32);
            a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(p), a0);
            a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(p.add(8)), a1);
            a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(p.add(16)), a2);
            a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(p.add(24)), a3);
        }
        hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)))
    }
}

/// Every input row against one weight row, in tiles of four inputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn row_all<L: Chunks>(
    l: &L,
    r: usize,
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
    out: SharedOut,
    b: f32,
) {
    let chunks = cols / 32;
    let mut t0 = 0;
    // SAFETY: x is (m, cols) (checked by matmul_t); row r is this worker's alone.
    unsafe {
        while t0 < m {
            let xp = x.as_ptr().add(t0 * cols);
            let put = |t: usize, v: f32| out.write((t0 + t) * rows + r, v + b);
            match m - t0 {
                1 => {
                    put(0, tile1(l, chunks, xp));
                    t0 += 1;
                }
                2 => {
                    for (t, v) in tile::<L, 2>(l, chunks, xp, cols).into_iter().enumerate() {
                        put(t, v);
                    }
                    t0 += 2;
                }
                3 => {
                    for (t, v) in tile::<L, 3>(l, chunks, xp, cols).into_iter().enumerate() {
                        put(t, v);
                    }
                    t0 += 3;
                }
                _ => {
                    for (t, v) in tile::<L, 4>(l, chunks, xp, cols).into_iter().enumerate() {
                        put(t, v);
                    }
                    t0 += 4;
                }
            }
        }
    }
}

/// Rows `r0..r1` of `out (m, rows) = x W^T + bias`. `w` must pass [`supports`].
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x` is `(m, cols)`; rows `r0..r1` of `out` are this
/// caller's alone.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_avx2(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    x: &[f32],
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let (rows, cols) = (w.rows(), w.cols());
    let bias_of = |r: usize| bias.map_or(0.0, |b| b.get(r));
    // SAFETY (whole body): every pointer below is the start of row r of a slice checked by
    // Matrix's constructor to hold `rows` rows, and the loaders stay within `cols`.
    unsafe {
        match w.kind {
            Kind::Dense(Floats::F32(d)) => {
                for r in r0..r1 {
                    let l = F32Row(d.as_ptr().add(r * cols));
                    row_all(&l, r, rows, cols, x, m, out, bias_of(r));
                }
            }
            Kind::Dense(Floats::F16(d)) => {
                for r in r0..r1 {
                    let l = F16Row(d.as_ptr().add(r * cols) as *const u16);
                    row_all(&l, r, rows, cols, x, m, out, bias_of(r));
                }
            }
            Kind::Dense(Floats::Bf16(d)) => {
                for r in r0..r1 {
                    let l = Bf16Row(d.as_ptr().add(r * cols) as *const u16);
                    row_all(&l, r, rows, cols, x, m, out, bias_of(r));
                }
            }
            Kind::Affine {
                words,
                scales,
                biases,
                bits,
                group,
            } => {
                let groups = cols / group;
                let shift = (group / 32).trailing_zeros();
                let pow2 = (group / 32).is_power_of_two();
                let row_bytes = cols * bits as usize / 8;
                let bytes = words.as_ptr() as *const u8;
                // Uninitialized scratch (zeroing 40 KB per block of rows would cost more than
                // the rows): every element is written before it is read.
                let mut s = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
                let mut b = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
                let mut buf = std::mem::MaybeUninit::<[f32; MAX_BUF]>::uninit();
                let (sp, bp) = (s.as_mut_ptr() as *mut f32, b.as_mut_ptr() as *mut f32);
                let buf = buf.as_mut_ptr() as *mut f32;
                let widen = m > 4 && cols <= MAX_BUF;
                for r in r0..r1 {
                    widen_row(scales, r * groups, sp, groups);
                    widen_row(biases, r * groups, bp, groups);
                    let rb = bytes.add(r * row_bytes);
                    if !pow2 {
                        // Group sizes like 96: per-chunk group index by division.
                        for c in 0..cols / 32 {
                            let g = c * 32 / group;
                            let (sv, bv) = (*sp.add(g), *bp.add(g));
                            for k in 0..32 {
                                let i = c * 32 + k;
                                let bit = i * bits as usize;
                                let word =
                                    *words.as_ptr().add((r * cols * bits as usize + bit) / 32);
                                let q = (word >> (bit % 32)) & ((1u32 << bits) - 1);
                                *buf.add(i) = sv * q as f32 + bv;
                            }
                        }
                        row_all(&F32Row(buf), r, rows, cols, x, m, out, bias_of(r));
                        continue;
                    }
                    let (sp, bp) = (sp as *const f32, bp as *const f32);
                    if bits == 4 {
                        let l = Q4Row {
                            bytes: rb,
                            s: sp,
                            b: bp,
                            shift,
                        };
                        if widen {
                            dequant_into(&l, cols, buf);
                            row_all(&F32Row(buf), r, rows, cols, x, m, out, bias_of(r));
                        } else {
                            row_all(&l, r, rows, cols, x, m, out, bias_of(r));
                        }
                    } else {
                        let l = Q8Row {
                            bytes: rb,
                            s: sp,
                            b: bp,
                            shift,
                        };
                        if widen {
                            dequant_into(&l, cols, buf);
                            row_all(&F32Row(buf), r, rows, cols, x, m, out, bias_of(r));
                        } else {
                            row_all(&l, r, rows, cols, x, m, out, bias_of(r));
                        }
                    }
                }
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_into<L: Chunks>(l: &L, cols: usize, buf: *mut f32) {
    // SAFETY: buf holds cols <= MAX_BUF floats (checked by the caller) and the loader stays
    // in its row.
    unsafe {
        for c in 0..cols / 32 {
            let w = l.load(c);
            let p = buf.add(c * 32);
            _mm256_storeu_ps(p, w[0]);
            _mm256_storeu_ps(p.add(8), w[1]);
            _mm256_storeu_ps(p.add(16), w[2]);
            _mm256_storeu_ps(p.add(24), w[3]);
        }
    }
}

/// `out[i] = src[start + i]` widened for `i < n`, eight at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_row(src: Floats<'_>, start: usize, out: *mut f32, n: usize) {
    let mut i = 0;
    assert!(start + n <= src.len(), "scales out of range");
    // SAFETY: start + n <= src.len() (checked); out holds n <= MAX_GROUPS floats.
    unsafe {
        match src {
            Floats::F32(v) => std::ptr::copy_nonoverlapping(v.as_ptr().add(start), out, n),
            Floats::F16(v) => {
                while i + 8 <= n {
                    let p = v.as_ptr().add(start + i) as *const __m128i;
                    _mm256_storeu_ps(out.add(i), _mm256_cvtph_ps(_mm_loadu_si128(p)));
                    i += 8;
                }
                for k in i..n {
                    *out.add(k) = v[start + k].to_f32();
                }
            }
            Floats::Bf16(v) => {
                while i + 8 <= n {
                    let p = v.as_ptr().add(start + i) as *const __m128i;
                    _mm256_storeu_ps(out.add(i), bf16x8(p));
                    i += 8;
                }
                for k in i..n {
                    *out.add(k) = v[start + k].to_f32();
                }
            }
        }
    }
}
