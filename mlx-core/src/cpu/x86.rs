//! The AVX2 + FMA + F16C kernels (x86-64). Every function here requires those features:
//! callers check [`super::Isa::Avx2`] first.
//!
//! A weight row is read 32 values at a time into four 8-lane float vectors (dequantized in
//! registers: `scale * q + bias`, the scale and bias of the row's groups widened once per row);
//! each input row accumulates `w * x` with FMA in two accumulators. For a block of more than
//! four inputs a quantized row is first dequantized into a stack buffer, then read from L1 for
//! every tile of four inputs.

use std::arch::x86_64::*;

use super::matmul::{AffineParts, Floats, Kind, Matrix};
use super::SharedOut;

/// Groups of one row whose scales and biases are widened on the stack (rows with more
/// groups, or 2-bit rows, take the scalar kernel).
const MAX_GROUPS: usize = 1024;
/// Widest row dequantized into a stack buffer for multi-input blocks.
pub(super) const MAX_BUF: usize = 8192;

/// Whether the AVX2 kernel handles `w` (else the scalar kernel does).
pub(super) fn supports(w: &Matrix<'_>) -> bool {
    if w.cols() % 32 != 0 {
        return false;
    }
    match w.kind {
        Kind::Dense(_) => true,
        // A group size that is not 32 times a power of two dequantizes a whole row into the
        // stack buffer.
        Kind::Affine { bits, group, .. } | Kind::Symmetric { bits, group, .. } => {
            matches!(bits, 4 | 8)
                && w.cols() / group <= MAX_GROUPS
                && ((group / 32).is_power_of_two() || w.cols() <= MAX_BUF)
        }
        Kind::Trellis(_) | Kind::Ggml { .. } => false,
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

/// The sum of `v`'s eight lanes (also used by the k-quant kernels).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
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
            // Never here: `matmul_t` routes trellis matrices to `trellis::matmul_jobs`.
            Kind::Trellis(_) | Kind::Ggml { .. } => {}
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
            Kind::Affine { .. } | Kind::Symmetric { .. } => {
                let Some(parts) = w.affine_parts() else {
                    return;
                };
                let AffineParts {
                    words,
                    scales,
                    bits,
                    group,
                    ..
                } = parts;
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
                    widen_biases(&parts, r * groups, bp, groups);
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

/// An affine or symmetric matrix's biases `[start, start + n)` widened into `out`: the stored
/// ones as [`widen_row`] widens them; a symmetric matrix's formed from its scales, each times
/// [`AffineParts::bias_k`] (exact: the bits of the float16 biases MLX materializes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_biases(p: &AffineParts<'_>, start: usize, out: *mut f32, n: usize) {
    // SAFETY: forwarded contract of `widen_row` (out holds n floats).
    unsafe {
        widen_row(p.biases, start, out, n);
        if p.sym {
            let k = p.bias_k();
            for i in 0..n {
                *out.add(i) *= k;
            }
        }
    }
}

/// Inputs quantized to int8 for the integer dot products of 4-bit rows (llama.cpp's Q8_1
/// activations): per input row and chunk of 32 values, a scale `d = max|x| / 127`, the codes
/// `round(x / d)` stored evens first then odds (the order the 4-bit nibbles come out of a
/// packed chunk), and `d * sum(codes)` (what the rows' biases multiply).
#[derive(Clone, Copy)]
pub(super) struct QuantX {
    pub(super) q: *const i8,
    pub(super) d: *const f32,
    pub(super) s: *const f32,
}

// SAFETY: read-only views of buffers the caller of the pool run keeps alive and unchanged.
unsafe impl Send for QuantX {}
unsafe impl Sync for QuantX {}

/// Quantizes `x` (`(m, cols)`, `cols` a multiple of 32) into `q`, `d` and `s` (see
/// [`QuantX`]). Scalar code: `m * cols` is a few thousand values per product.
pub(super) fn quantize_x(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (c, chunk) in x.chunks_exact(32).enumerate() {
        let amax = chunk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let dc = amax / 127.0;
        let inv = if dc > 0.0 { 1.0 / dc } else { 0.0 };
        let mut sum = 0i32;
        let out = &mut q[c * 32..c * 32 + 32];
        for k in 0..16 {
            let (e, o) = (
                (chunk[2 * k] * inv).round() as i8,
                (chunk[2 * k + 1] * inv).round() as i8,
            );
            out[k] = e;
            out[16 + k] = o;
            sum += e as i32 + o as i32;
        }
        d[c] = dc;
        s[c] = dc * sum as f32;
    }
}

/// A 4-bit affine matrix as the int8 kernels ([`rows_q4_int8`], [`rows_q4_int8_512`]) read
/// it: its factors, and its sizes in groups, chunks of 32 and bytes.
#[derive(Clone, Copy)]
struct Q4<'a> {
    /// The matrix's parts (a symmetric matrix's `biases` are its scales: see `sym`).
    parts: AffineParts<'a>,
    scales: Floats<'a>,
    biases: Floats<'a>,
    /// A symmetric matrix: each bias is its scale times -8.
    sym: bool,
    rows: usize,
    groups: usize,
    chunks: usize,
    /// log2 of the chunks a group.
    shift: u32,
    row_bytes: usize,
    bytes: *const u8,
}

impl<'a> Q4<'a> {
    /// `w`'s view, if it is 4-bit affine or symmetric.
    fn of(w: &Matrix<'a>) -> Option<Q4<'a>> {
        let parts = w.affine_parts()?;
        let AffineParts {
            words,
            scales,
            biases,
            bits: 4,
            group,
            sym,
        } = parts
        else {
            return None;
        };
        let cols = w.cols();
        Some(Q4 {
            parts,
            scales,
            biases,
            sym,
            rows: w.rows(),
            groups: cols / group,
            chunks: cols / 32,
            shift: (group / 32).trailing_zeros(),
            row_bytes: cols / 2,
            bytes: words.as_ptr() as *const u8,
        })
    }
}

/// The `m` inputs' float sums per group of `per` chunks (what the rows' biases multiply) from
/// their per-chunk sums `s` (`chunks` an input), into `out` at a stride of `stride >= groups`
/// an input, zero past the last group: the integer kernels' shared set-up.
///
/// # Safety
/// `s` holds `m * chunks` sums, `chunks >= groups * per`, and `out` `m * stride` floats.
#[allow(clippy::too_many_arguments)]
unsafe fn group_sums(
    s: *const f32,
    m: usize,
    chunks: usize,
    per: usize,
    groups: usize,
    stride: usize,
    out: *mut f32,
) {
    // SAFETY: within the ranges of the contract.
    unsafe {
        for t in 0..m {
            for g in 0..stride {
                let mut v = 0f32;
                if g < groups {
                    for k in 0..per {
                        v += *s.add(t * chunks + g * per + k);
                    }
                }
                *out.add(t * stride + g) = v;
            }
        }
    }
}

/// Rows `r0..r1` of `out (m, rows) = x W^T + bias` for a 4-bit affine `w` whose group is 32
/// times a power of two, `m <= 4`, from `x` quantized by [`quantize_x`]: per chunk of 32 one
/// `maddubs` (unsigned codes times signed inputs) and one `madd` into 32-bit sums, scaled by
/// the group's scale times the chunk's input scale; the biases multiply the inputs' sums.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `qx` holds `m` quantized rows of `cols` values; rows
/// `r0..r1` of `out` are this caller's alone.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) unsafe fn rows_q4_int8(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let Some(g4) = Q4::of(w) else {
        return;
    };
    let Q4 {
        scales,
        biases,
        rows,
        groups,
        chunks,
        shift,
        row_bytes,
        bytes,
        ..
    } = g4;
    let bias_of = |r: usize| bias.map_or(0.0, |b| b.get(r));
    // SAFETY (whole body): rows r0..r1 lie within `words`, `scales` and `biases` (checked by
    // Matrix::affine); qx holds m * chunks codes, scales and sums; the stack buffers hold
    // groups <= MAX_GROUPS values (checked by `supports`) for each of m <= 4 inputs.
    unsafe {
        let mut sw = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
        let mut bw = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
        let mut gs = std::mem::MaybeUninit::<[f32; 4 * MAX_GROUPS]>::uninit();
        let (sp, bp) = (sw.as_mut_ptr() as *mut f32, bw.as_mut_ptr() as *mut f32);
        let gsp = gs.as_mut_ptr() as *mut f32;
        group_sums(qx.s, m, chunks, 1 << shift, groups, groups, gsp);
        let pf = prefetch_rows(row_bytes);
        let mask = _mm256_set1_epi8(0x0f);
        let shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        let ones = _mm256_set1_epi16(1);
        for r in r0..r1 {
            prefetch_affine_row(bytes, row_bytes, scales, biases, groups, r, pf, rows);
            widen_row(scales, r * groups, sp, groups);
            widen_biases(&g4.parts, r * groups, bp, groups);
            let rb = bytes.add(r * row_bytes);
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for c in 0..chunks {
                let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(rb.add(c * 16) as *const _));
                // Low lane: the low nibbles (even values); high lane: the high ones (odd).
                let wq = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), mask);
                let sg = *sp.add(c >> shift);
                for t in 0..m {
                    let xq = _mm256_loadu_si256(qx.q.add((t * chunks + c) * 32) as *const _);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), ones);
                    let f = _mm256_set1_ps(sg * *qx.d.add(t * chunks + c));
                    let a = &mut acc[t][c & 1];
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), f, *a);
                }
            }
            let b = bias_of(r);
            for t in 0..m {
                let mut v = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
                for g in 0..groups {
                    v += *bp.add(g) * *gsp.add(t * groups + g);
                }
                out.write(t * rows + r, v + b);
            }
        }
    }
}

/// Inputs quantized to int16 for the integer dot products of 4- and 8-bit rows: per input
/// row and chunk of 32 values a scale `d = max|x| / 32767` and the codes `round(x / d)` in
/// their natural order; `s` is the chunk's float sum (what the rows' biases multiply); `p`
/// the same codes in [`permute_x16`]'s order (what the 512-bit 4-bit kernel reads).
///
/// `h` (null where not made): the same codes in [`split_x16`]'s layout, `hs` bytes a row (what
/// the 512-bit 4-bit kernel [`dot4_512_s`] reads).
#[derive(Clone, Copy)]
pub(super) struct QuantX16 {
    pub(super) q: *const i16,
    pub(super) p: *const i16,
    pub(super) d: *const f32,
    pub(super) s: *const f32,
    pub(super) h: *const u8,
    pub(super) hs: usize,
}

impl QuantX16 {
    /// The inputs from row `t0` on (their codes, scales and sums; `cols` values a row).
    ///
    /// # Safety
    /// Rows `t0..` exist in every buffer (`h` may be null).
    #[inline]
    pub(super) unsafe fn rows_from(self, t0: usize, cols: usize) -> QuantX16 {
        let c = t0 * (cols / 32);
        // SAFETY: the caller's (offsets within the buffers).
        unsafe {
            QuantX16 {
                q: self.q.add(t0 * cols),
                p: self.p.add(t0 * cols),
                d: self.d.add(c),
                s: self.s.add(c),
                h: if self.h.is_null() {
                    self.h
                } else {
                    self.h.add(t0 * self.hs)
                },
                hs: self.hs,
            }
        }
    }
}

/// Whether the 512-bit int16 kernels take `w`'s rows through [`dot4_512_any`] (4-bit affine
/// in groups of 32 to 512 with scales and biases of one dtype): the others of 4 bits read
/// the inputs' [`permute_x16`] codes.
pub(super) fn split_covers(w: &Matrix<'_>) -> bool {
    w.affine_parts().is_some_and(|p| {
        p.bits == 4
            && p.group % 32 == 0
            && (p.group / 32).is_power_of_two()
            && p.group <= 512
            && dot_kind(&p).is_some()
    })
}

/// Whether the 512-bit int16 kernel reads [`permute_x16`]'s codes for `w`: 4-bit rows that
/// [`split_covers`] leaves out, or all 4-bit rows when the inputs are not `split` (no
/// [`split_x16`] bytes: [`dot4_512_g`]).
pub(super) fn needs_permuted(w: &Matrix<'_>, split: bool) -> bool {
    w.affine_parts().is_some_and(|p| p.bits == 4) && !(split && split_covers(w))
}

/// Bytes a row of `cols` int16 codes takes in [`split_x16`]'s layout (whole quads of chunks).
pub(super) fn split_stride(cols: usize) -> usize {
    (cols / 32).div_ceil(4) * 256
}

/// The int16 codes `q` (rows of `cols`, a multiple of 32) split into bytes for [`dot4_512_s`]:
/// each code `x = 256 * hi + lo` (`hi = x >> 8` signed, `lo = x & 255` unsigned; exact). Per
/// row, quads of four chunks (the last padded with zeros) of 256 bytes: the `hi` bytes of
/// the codes at even positions, `hi` at odd positions, `lo` at even, `lo` at odd (64 each:
/// 16 per chunk, in chunk order). A quad of 4-bit weight chunks (64 bytes) masked to its low
/// nibbles (even positions) or shifted to its high ones (odd) then meets them byte for byte.
pub(super) fn split_x16(q: &[i16], cols: usize, h: &mut [u8]) {
    if super::Isa::Avx512.available() {
        // SAFETY: the CPU has AVX-512 F/BW/VL (checked).
        unsafe { split_x16_512(q, cols, h) };
        return;
    }
    split_x16_scalar(q, cols, h);
}

/// [`split_x16`] in portable code.
fn split_x16_scalar(q: &[i16], cols: usize, h: &mut [u8]) {
    let chunks = cols / 32;
    let stride = split_stride(cols);
    for (rq, rh) in q.chunks_exact(cols).zip(h.chunks_exact_mut(stride)) {
        rh[chunks / 4 * 256..].fill(0);
        for c in 0..chunks {
            let base = c / 4 * 256 + c % 4 * 16;
            let x = &rq[c * 32..c * 32 + 32];
            for j in 0..16 {
                let (e, o) = (x[2 * j], x[2 * j + 1]);
                rh[base + j] = (e >> 8) as u8;
                rh[base + 64 + j] = (o >> 8) as u8;
                rh[base + 128 + j] = e as u8;
                rh[base + 192 + j] = o as u8;
            }
        }
    }
}

/// The int16 codes `q` (rows of `cols`, a multiple of 32) reordered for [`dot4_512`]: in each
/// row, chunks `c, c + 1` (even `c`) as `[c even, c + 1 even, c odd, c + 1 odd]` (16 codes
/// each: the codes at even positions, then those at odd ones), and an unpaired last chunk as
/// `[even, odd]`. A 4-bit weight chunk's bytes, widened to 16-bit lanes, then meet the codes
/// of their low nibbles (even positions) and high nibbles (odd) with one mask and one shift.
pub(super) fn permute_x16(q: &[i16], cols: usize, p: &mut [i16]) {
    let chunks = cols / 32;
    for (rq, rp) in q.chunks_exact(cols).zip(p.chunks_exact_mut(cols)) {
        let mut c = 0;
        while c + 2 <= chunks {
            let (a, b) = (&rq[c * 32..c * 32 + 32], &rq[c * 32 + 32..c * 32 + 64]);
            let d = &mut rp[c * 32..c * 32 + 64];
            for j in 0..16 {
                d[j] = a[2 * j];
                d[16 + j] = b[2 * j];
                d[32 + j] = a[2 * j + 1];
                d[48 + j] = b[2 * j + 1];
            }
            c += 2;
        }
        if c < chunks {
            let a = &rq[c * 32..c * 32 + 32];
            let d = &mut rp[c * 32..c * 32 + 32];
            for j in 0..16 {
                d[j] = a[2 * j];
                d[16 + j] = a[2 * j + 1];
            }
        }
    }
}

/// The 4-bit main loop of [`rows_int16_512_m`] over one row (`chunks` chunks of 16 bytes at
/// `rb`): two chunks at a time, their 32 bytes widened to 16-bit lanes, the low nibbles (one
/// mask) `madd`ed with the inputs' even codes and the high nibbles (one shift) added by
/// `vpdpwssd` with the odd codes ([`permute_x16`]'s order), so lanes 0-7 sum chunk `c` and
/// 8-15 chunk `c + 1`; each half scaled by its chunk's factor `fp[t * chunks + c]`. Pairs
/// alternate between `acc` and a second accumulator; an unpaired last chunk is summed in
/// 256 bits. Returns each input's sum, in an order that does not depend on `MT`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `rb` holds `chunks * 16` bytes; `qp` holds `MT`
/// rows of `chunks * 32` codes in [`permute_x16`]'s order and `fp` `MT * chunks` factors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot4_512<const MT: usize>(
    rb: *const u8,
    chunks: usize,
    qp: *const i16,
    fp: *const f32,
    acc: [__m512; MT],
) -> [f32; MT] {
    // SAFETY (whole body): reads stay within the ranges of the contract.
    unsafe {
        let nib = _mm512_set1_epi16(0x000f);
        // Lanes 0-7: the pair's first factor; 8-15: its second.
        let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let mut a0 = acc;
        let mut a1 = [_mm512_setzero_ps(); MT];
        let pair = |c: usize, acc: &mut [__m512; MT]| {
            let wv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(rb.add(c * 16) as *const __m256i));
            let lo = _mm512_and_si512(wv, nib);
            let hi = _mm512_srli_epi16::<4>(wv);
            for (t, a) in acc.iter_mut().enumerate() {
                let xp = qp.add(t * chunks * 32 + c * 32);
                let sum = _mm512_madd_epi16(lo, _mm512_loadu_si512(xp as *const _));
                let sum = _mm512_dpwssd_epi32(sum, hi, _mm512_loadu_si512(xp.add(32) as *const _));
                let two = (fp.add(t * chunks + c) as *const f64).read_unaligned();
                let f = _mm512_permutexvar_ps(idx, _mm512_castpd_ps(_mm512_set1_pd(two)));
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), f, *a);
            }
        };
        let mut c = 0;
        while c + 4 <= chunks {
            pair(c, &mut a0);
            pair(c + 2, &mut a1);
            c += 4;
        }
        if c + 2 <= chunks {
            pair(c, &mut a0);
            c += 2;
        }
        let mut tail = [_mm256_setzero_ps(); MT];
        if c < chunks {
            let wv = _mm256_cvtepu8_epi16(_mm_loadu_si128(rb.add(c * 16) as *const __m128i));
            let lo = _mm256_and_si256(wv, _mm256_set1_epi16(0x000f));
            let hi = _mm256_srli_epi16::<4>(wv);
            for (t, a) in tail.iter_mut().enumerate() {
                let xp = qp.add(t * chunks * 32 + c * 32);
                let sum = _mm256_madd_epi16(lo, _mm256_loadu_si256(xp as *const __m256i));
                let sum =
                    _mm256_dpwssd_epi32(sum, hi, _mm256_loadu_si256(xp.add(16) as *const __m256i));
                let f = _mm256_set1_ps(*fp.add(t * chunks + c));
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), f, *a);
            }
        }
        let mut out = [0f32; MT];
        for t in 0..MT {
            out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) + hsum(tail[t]);
        }
        out
    }
}

/// [`split_x16`] a chunk at a time in 512-bit registers (the same bytes).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn split_x16_512(q: &[i16], cols: usize, h: &mut [u8]) {
    let chunks = cols / 32;
    let stride = split_stride(cols);
    for (rq, rh) in q.chunks_exact(cols).zip(h.chunks_exact_mut(stride)) {
        rh[chunks / 4 * 256..].fill(0);
        assert!(rq.len() >= chunks * 32 && rh.len() >= chunks.div_ceil(4) * 256);
        // SAFETY: chunk c reads rq[32c..32c + 32] and writes 16 bytes at four offsets below
        // (c / 4 + 1) * 256, all in bounds (the assert).
        unsafe {
            for c in 0..chunks {
                let v = _mm512_loadu_si512(rq.as_ptr().add(c * 32) as *const _);
                // The codes at even positions are the low halves of the 32-bit lanes, the odd
                // ones the high halves.
                let e = _mm512_cvtepi32_epi16(v);
                let o = _mm512_cvtepi32_epi16(_mm512_srai_epi32::<16>(v));
                let d = rh.as_mut_ptr().add(c / 4 * 256 + c % 4 * 16);
                let put = |off: usize, x: __m128i| _mm_storeu_si128(d.add(off) as *mut __m128i, x);
                put(0, _mm256_cvtepi16_epi8(_mm256_srai_epi16::<8>(e)));
                put(64, _mm256_cvtepi16_epi8(_mm256_srai_epi16::<8>(o)));
                put(128, _mm256_cvtepi16_epi8(e));
                put(192, _mm256_cvtepi16_epi8(o));
            }
        }
    }
}

/// [`dot4_512`] for a row in groups of 32 with half-precision scales and biases (`s0`, `b0`:
/// the row's `chunks` of each), its factors kept in registers instead of a stack buffer: the
/// bias term first (bias times the input's float sum, 16 chunks at a time), then per block of
/// 16 chunks the factors (scale times input scale) in one register per input, each pair's
/// two picked out by one permute. The same operations in the same order as the buffered
/// version (bit-identical sums); a store of the factors followed by narrow reloads of them
/// stalled store forwarding. [`dot4_512_g`] with float16 scales and groups of 32.
///
/// # Safety
/// As [`dot4_512`], with `s0` and `b0` holding `chunks` halves each and `qx` `MT` rows of
/// `chunks` scales and sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot4_512_h<const MT: usize>(
    rb: *const u8,
    s0: *const u16,
    b0: *const u16,
    chunks: usize,
    qx: QuantX16,
) -> [f32; MT] {
    // SAFETY: forwarded contract (groups of 32: `chunks` halves of each).
    unsafe { dot4_512_g::<MT, SCALES_F16>(rb, s0 as *const u8, b0 as *const u8, chunks, 0, qx) }
}

/// The scale dtypes of [`dot4_512_g`]: float16, bfloat16, float32.
pub(super) const SCALES_F16: u8 = 0;
pub(super) const SCALES_BF16: u8 = 1;
pub(super) const SCALES_F32: u8 = 2;
/// A symmetric matrix's float16 scales (`Kind::Symmetric`, 4 bits): read as
/// [`SCALES_F16`], and its biases pointer is its scales', each times -8 where read (the bits of
/// the float16 biases `-8 x scale` as [`SCALES_F16`] reads them).
pub(super) const SCALES_F16_SYM: u8 = 3;

/// The [`dot4_512_g`] scale dtype of an affine or symmetric matrix (`None` where the scales
/// and biases differ in dtype, or for a symmetric matrix whose scales are not float16):
/// [`scales_kind`], and [`SCALES_F16_SYM`] for a symmetric matrix.
pub(super) fn dot_kind(p: &AffineParts<'_>) -> Option<u8> {
    match (scales_kind(p.scales, p.biases), p.sym) {
        (k, false) => k,
        (Some(SCALES_F16), true) if p.bits == 4 => Some(SCALES_F16_SYM),
        _ => None,
    }
}

/// The [`dot4_512_g`] scale dtype of an affine matrix's scales and biases (`None` where the
/// two differ).
pub(super) fn scales_kind(scales: Floats<'_>, biases: Floats<'_>) -> Option<u8> {
    match (scales, biases) {
        (Floats::F16(_), Floats::F16(_)) => Some(SCALES_F16),
        (Floats::Bf16(_), Floats::Bf16(_)) => Some(SCALES_BF16),
        (Floats::F32(_), Floats::F32(_)) => Some(SCALES_F32),
        _ => None,
    }
}

/// The address of a float array's first element, as bytes.
pub(super) fn floats_ptr(f: Floats<'_>) -> *const u8 {
    match f {
        Floats::F32(s) => s.as_ptr() as *const u8,
        Floats::F16(s) => s.as_ptr() as *const u8,
        Floats::Bf16(s) => s.as_ptr() as *const u8,
    }
}

/// Up to 16 scales of dtype `K` from element `i` of `p` (the lanes of `mask`; the others 0),
/// widened to float32 (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn load_scales16<const K: u8>(p: *const u8, i: usize, mask: __mmask16) -> __m512 {
    // SAFETY: the caller's: the masked lanes lie within the array (masked-off lanes read
    // nothing).
    unsafe {
        match K {
            SCALES_F16 | SCALES_F16_SYM => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                mask,
                (p as *const u16).add(i) as *const _,
            )),
            SCALES_BF16 => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_maskz_loadu_epi16(mask, (p as *const u16).add(i) as *const _),
            ))),
            _ => _mm512_maskz_loadu_ps(mask, (p as *const f32).add(i)),
        }
    }
}

/// The first pass of [`dot4_512_g`] and [`dot4_512_s`] (the same operations in both), written
/// once and expanded in place: a macro, not a function, for `#[inline(always)]` does not
/// combine with `#[target_feature]` and the loop must stay the one it was. Inside the
/// caller's `unsafe` block (its SAFETY comment covers these reads), it binds `$mask_of` (the
/// lane mask of `k` chunks), `$per_chunk` (a block's per-chunk values of a per-group array of
/// dtype `$K`) and `$a0` (per input row, the biases times the inputs' chunk sums `qx.s`).
macro_rules! dot4_512_biases {
    (
        $mask_of:ident, $per_chunk:ident, $a0:ident;
        $MT:ident, $K:ident, $b0:ident, $chunks:ident, $shift:ident, $qx:ident
    ) => {
        let $mask_of = |k: usize| -> __mmask16 {
            if k == 16 {
                0xffff
            } else {
                (1u16 << k) - 1
            }
        };
        // Lane l of a block's chunks takes group l >> shift of the block's groups.
        let spread = _mm512_srlv_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32($shift as i32),
        );
        // The block's per-chunk values of a per-group array (`c0` a multiple of 16, `k`
        // chunks from it: `k >> shift` groups).
        let $per_chunk = |p: *const u8, c0: usize, k: usize| -> __m512 {
            let v = load_scales16::<$K>(p, c0 >> $shift, $mask_of(k >> $shift));
            if $shift == 0 {
                v
            } else {
                _mm512_permutexvar_ps(spread, v)
            }
        };
        let mut $a0 = [_mm512_setzero_ps(); $MT];
        let mut c0 = 0;
        while c0 < $chunks {
            let k = ($chunks - c0).min(16);
            let mask = $mask_of(k);
            let bv = $per_chunk($b0, c0, k);
            // A symmetric matrix's biases: its scales (`b0`) times -8, exact.
            let bv = if $K == SCALES_F16_SYM {
                _mm512_mul_ps(bv, _mm512_set1_ps(-8.0))
            } else {
                bv
            };
            for t in 0..$MT {
                let xs = _mm512_maskz_loadu_ps(mask, $qx.s.add(t * $chunks + c0));
                $a0[t] = _mm512_fmadd_ps(bv, xs, $a0[t]);
            }
            c0 += 16;
        }
    };
}

/// [`dot4_512_h`] for a row in groups of `32 << shift` values (`shift` at most 4) with scales
/// and biases of dtype `K` (`s0`, `b0`: the row's `chunks >> shift` of each): per block of 16
/// chunks the block's scales (and biases) loaded once and spread to their chunks by one
/// permute, so a group of 64 costs what a group of 32 does and reads half the scales. With
/// float16 scales and `shift` 0, `dot4_512_h` (the same operations).
///
/// # Safety
/// As [`dot4_512`], with `chunks` a multiple of `1 << shift`, `s0` and `b0` holding
/// `chunks >> shift` values of dtype `K` each and `qx` `MT` rows of `chunks` scales and sums.
#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot4_512_g<const MT: usize, const K: u8>(
    rb: *const u8,
    s0: *const u8,
    b0: *const u8,
    chunks: usize,
    shift: u32,
    qx: QuantX16,
) -> [f32; MT] {
    // SAFETY (whole body): reads stay within the ranges of the contract (masked loads past a
    // row's last chunk or group read nothing).
    unsafe {
        dot4_512_biases!(mask_of, per_chunk, a0; MT, K, b0, chunks, shift, qx);
        let nib = _mm512_set1_epi16(0x000f);
        // Lanes 0-7: the pair's first chunk; 8-15: its second.
        let base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let qp = qx.p;
        let mut a1 = [_mm512_setzero_ps(); MT];
        let mut tail = [_mm256_setzero_ps(); MT];
        let mut c0 = 0;
        while c0 < chunks {
            let k = (chunks - c0).min(16);
            let mask = mask_of(k);
            let sv = per_chunk(s0, c0, k);
            let mut f = [_mm512_setzero_ps(); MT];
            for t in 0..MT {
                let dv = _mm512_maskz_loadu_ps(mask, qx.d.add(t * chunks + c0));
                f[t] = _mm512_mul_ps(sv, dv);
            }
            let pair = |j: usize, acc: &mut [__m512; MT]| {
                let c = c0 + j;
                let wv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(rb.add(c * 16) as *const __m256i));
                let lo = _mm512_and_si512(wv, nib);
                let hi = _mm512_srli_epi16::<4>(wv);
                let idx = _mm512_add_epi32(base, _mm512_set1_epi32(j as i32));
                for (t, a) in acc.iter_mut().enumerate() {
                    let xp = qp.add(t * chunks * 32 + c * 32);
                    let sum = _mm512_madd_epi16(lo, _mm512_loadu_si512(xp as *const _));
                    let sum =
                        _mm512_dpwssd_epi32(sum, hi, _mm512_loadu_si512(xp.add(32) as *const _));
                    let fv = _mm512_permutexvar_ps(idx, f[t]);
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), fv, *a);
                }
            };
            // c0 is a multiple of 16: pairs at c % 4 == 0 go to a0, as in `dot4_512`.
            let mut j = 0;
            while j + 4 <= k {
                pair(j, &mut a0);
                pair(j + 2, &mut a1);
                j += 4;
            }
            if j + 2 <= k {
                pair(j, &mut a0);
                j += 2;
            }
            if j < k {
                let c = c0 + j;
                let wv = _mm256_cvtepu8_epi16(_mm_loadu_si128(rb.add(c * 16) as *const __m128i));
                let lo = _mm256_and_si256(wv, _mm256_set1_epi16(0x000f));
                let hi = _mm256_srli_epi16::<4>(wv);
                let idx = _mm512_set1_epi32(j as i32);
                for (t, a) in tail.iter_mut().enumerate() {
                    let xp = qp.add(t * chunks * 32 + c * 32);
                    let sum = _mm256_madd_epi16(lo, _mm256_loadu_si256(xp as *const __m256i));
                    let sum = _mm256_dpwssd_epi32(
                        sum,
                        hi,
                        _mm256_loadu_si256(xp.add(16) as *const __m256i),
                    );
                    let fv = _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, f[t]));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), fv, *a);
                }
            }
            c0 += 16;
        }
        let mut out = [0f32; MT];
        for t in 0..MT {
            out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) + hsum(tail[t]);
        }
        out
    }
}

/// [`dot4_512_g`] over the inputs' [`split_x16`] bytes (`qx.h`, `qx.hs` bytes a row; not
/// null): a quad of chunks (64 weight bytes: 128 codes) a step, its low and high nibbles
/// (one mask, one shift) summed against the inputs' high bytes by two `vpdpbusd`, shifted by
/// 8 bits, then against their low bytes by two more: each int32 lane sums 4 codes of one
/// chunk (lanes `4k..4k + 4`: chunk `k` of the quad), exactly the integer sums of the int16
/// kernels, in 11 instructions a quad where [`dot4_512_g`] takes 18 (its `vpmovzxbw`, shift,
/// `vpmaddwd`, `vpdpwssd`, permute and conversion a pair). Each lane is then scaled by its
/// chunk's factor (group scale times input scale, one permute a quad). A partial last quad
/// loads its weight bytes masked (the inputs are padded with zeros). Sums in another order
/// than `dot4_512_g`'s (tier L3 against it: `dot4_512_s_is_dot4_512_g_up_to_rounding`).
///
/// # Safety
/// As [`dot4_512_g`], with `qx.h` holding `MT` rows of `qx.hs` bytes in `split_x16`'s layout.
#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot4_512_s<const MT: usize, const K: u8>(
    rb: *const u8,
    s0: *const u8,
    b0: *const u8,
    chunks: usize,
    shift: u32,
    qx: QuantX16,
) -> [f32; MT] {
    // SAFETY (whole body): reads stay within the ranges of the contract (masked loads past a
    // row's last chunk or group read nothing; the split inputs are padded to whole quads).
    unsafe {
        dot4_512_biases!(mask_of, per_chunk, a0; MT, K, b0, chunks, shift, qx);
        let nib = _mm512_set1_epi8(0x0f);
        // Lane l of a quad's sums belongs to its chunk l / 4.
        let quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let zero = _mm512_setzero_si512();
        let mut a1 = [_mm512_setzero_ps(); MT];
        let mut c0 = 0;
        while c0 < chunks {
            let k = (chunks - c0).min(16);
            let mask = mask_of(k);
            let sv = per_chunk(s0, c0, k);
            let mut f = [_mm512_setzero_ps(); MT];
            for t in 0..MT {
                let dv = _mm512_maskz_loadu_ps(mask, qx.d.add(t * chunks + c0));
                f[t] = _mm512_mul_ps(sv, dv);
            }
            let step = |j: usize, acc: &mut [__m512; MT]| {
                let c = c0 + j;
                let n = (k - j).min(4) * 16;
                let wv = if n == 64 {
                    _mm512_loadu_si512(rb.add(c * 16) as *const _)
                } else {
                    _mm512_maskz_loadu_epi8((1u64 << n) - 1, rb.add(c * 16) as *const _)
                };
                let lo = _mm512_and_si512(wv, nib);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), nib);
                let idx = _mm512_add_epi32(quad, _mm512_set1_epi32(j as i32));
                for (t, a) in acc.iter_mut().enumerate() {
                    let xp = qx.h.add(t * qx.hs + c / 4 * 256);
                    let ld = |o: usize| _mm512_loadu_si512(xp.add(o) as *const _);
                    let sum = _mm512_dpbusd_epi32(zero, lo, ld(0));
                    let sum = _mm512_dpbusd_epi32(sum, hi, ld(64));
                    let sum = _mm512_slli_epi32::<8>(sum);
                    let sum = _mm512_dpbusd_epi32(sum, ld(128), lo);
                    let sum = _mm512_dpbusd_epi32(sum, ld(192), hi);
                    let fv = _mm512_permutexvar_ps(idx, f[t]);
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), fv, *a);
                }
            };
            // c0 is a multiple of 16: quads at c % 8 == 0 go to a0, the others to a1.
            let mut j = 0;
            while j + 4 < k {
                step(j, &mut a0);
                step(j + 4, &mut a1);
                j += 8;
            }
            if j < k {
                step(j, &mut a0);
            }
            c0 += 16;
        }
        let mut out = [0f32; MT];
        for t in 0..MT {
            out[t] = reduce16(_mm512_add_ps(a0[t], a1[t]));
        }
        out
    }
}

/// [`dot4_512_s`] (where `qx.h` holds the split inputs) or [`dot4_512_g`], for scales of
/// dtype `kind`.
///
/// # Safety
/// As `dot4_512_s` / `dot4_512_g`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot4_512_any<const MT: usize>(
    kind: u8,
    rb: *const u8,
    s0: *const u8,
    b0: *const u8,
    chunks: usize,
    shift: u32,
    qx: QuantX16,
) -> [f32; MT] {
    // SAFETY: forwarded contract.
    unsafe {
        if qx.h.is_null() {
            return match kind {
                SCALES_F16 => dot4_512_g::<MT, SCALES_F16>(rb, s0, b0, chunks, shift, qx),
                SCALES_F16_SYM => dot4_512_g::<MT, SCALES_F16_SYM>(rb, s0, b0, chunks, shift, qx),
                SCALES_BF16 => dot4_512_g::<MT, SCALES_BF16>(rb, s0, b0, chunks, shift, qx),
                _ => dot4_512_g::<MT, SCALES_F32>(rb, s0, b0, chunks, shift, qx),
            };
        }
        match kind {
            SCALES_F16 => dot4_512_s::<MT, SCALES_F16>(rb, s0, b0, chunks, shift, qx),
            SCALES_F16_SYM => dot4_512_s::<MT, SCALES_F16_SYM>(rb, s0, b0, chunks, shift, qx),
            SCALES_BF16 => dot4_512_s::<MT, SCALES_BF16>(rb, s0, b0, chunks, shift, qx),
            _ => dot4_512_s::<MT, SCALES_F32>(rb, s0, b0, chunks, shift, qx),
        }
    }
}

/// The sum of `v`'s 16 lanes by the tree `_mm512_reduce_add_ps` compiled to in the one-row
/// kernels (halves of 256, then 128 bits, then the pairs (0, 2) and (1, 3), then the two),
/// written out: `_mm512_reduce_add_ps` is an unordered reduction, which LLVM may reassociate
/// where the code around it differs (the pair kernels' four-input instances did, under
/// register pressure). The one-row kernels whose bits the pair kernels reproduce
/// (`dot4_512_s`, `rows_int16_512_m`'s half-precision branch) and the pair kernels all call
/// this, so a verify row's bits equal its one-token step's by construction, whatever a
/// compiler does with the intrinsic.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn reduce16(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let s8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}

/// One weight row of [`dot4_512_s2`]: its codes and its per-group scales and biases.
#[derive(Clone, Copy)]
pub(super) struct Row4 {
    pub(super) rb: *const u8,
    pub(super) s0: *const u8,
    pub(super) b0: *const u8,
}

/// [`dot4_512_s`] for two weight rows at once (`w0`, `w1`) over the same `MT` inputs: each
/// input's four vectors of split bytes (`qx.h`) are loaded once a quad and serve both rows,
/// where `dot4_512_s` loads them again for every row (four 512-bit loads a row and quad, one
/// a cycle on this machine's load ports: the loads, not the multiplies, bound the verify
/// rows' products). Every output is computed by the same operations in the same order as
/// `dot4_512_s` gives it (the bias term, the factors, the quads' integer sums, the
/// accumulators `a0` / `a1` and the final reduction), only interleaved with the other row's:
/// bit-identical (tier L2, `affine_rows`' `rows_are_the_one_row_kernels_bits` and
/// `pair_kernel_is_dot4_512_s_bit_for_bit`).
///
/// # Safety
/// As [`dot4_512_s`] for each row (`qx.h` not null), `MT` at most 4.
#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot4_512_s2<const MT: usize, const K: u8>(
    w0: Row4,
    w1: Row4,
    chunks: usize,
    shift: u32,
    qx: QuantX16,
) -> ([f32; MT], [f32; MT]) {
    // SAFETY (whole body): as dot4_512_s, for each row.
    unsafe {
        let b0 = w0.b0;
        let b1 = w1.b0;
        dot4_512_biases!(mask_of, per_chunk, a0; MT, K, b0, chunks, shift, qx);
        dot4_512_biases!(mask_of2, per_chunk2, e0; MT, K, b1, chunks, shift, qx);
        let _ = (mask_of2, per_chunk2);
        let nib = _mm512_set1_epi8(0x0f);
        let quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let zero = _mm512_setzero_si512();
        let mut a1 = [_mm512_setzero_ps(); MT];
        let mut e1 = [_mm512_setzero_ps(); MT];
        #[repr(align(64))]
        struct Fs([[f32; 16]; 8]);
        let mut fs = Fs([[0f32; 16]; 8]);
        let mut c0 = 0;
        while c0 < chunks {
            let k = (chunks - c0).min(16);
            let mask = mask_of(k);
            let sv = per_chunk(w0.s0, c0, k);
            let sv2 = per_chunk(w1.s0, c0, k);
            let mut f = [_mm512_setzero_ps(); MT];
            let mut f2 = [_mm512_setzero_ps(); MT];
            for t in 0..MT {
                let dv = _mm512_maskz_loadu_ps(mask, qx.d.add(t * chunks + c0));
                f[t] = _mm512_mul_ps(sv, dv);
                f2[t] = _mm512_mul_ps(sv2, dv);
            }
            // Past three inputs the factors wait on the stack (whole vectors, read back whole
            // by the permutes), leaving the registers to the accumulators.
            if MT > 3 {
                for t in 0..MT {
                    _mm512_store_ps(fs.0[t].as_mut_ptr(), f[t]);
                    _mm512_store_ps(fs.0[MT + t].as_mut_ptr(), f2[t]);
                }
            }
            let step = |j: usize, acc: &mut [__m512; MT], acc2: &mut [__m512; MT]| {
                let c = c0 + j;
                let n = (k - j).min(4) * 16;
                let (wv, wv2) = if n == 64 {
                    (
                        _mm512_loadu_si512(w0.rb.add(c * 16) as *const _),
                        _mm512_loadu_si512(w1.rb.add(c * 16) as *const _),
                    )
                } else {
                    let m = (1u64 << n) - 1;
                    (
                        _mm512_maskz_loadu_epi8(m, w0.rb.add(c * 16) as *const _),
                        _mm512_maskz_loadu_epi8(m, w1.rb.add(c * 16) as *const _),
                    )
                };
                let lo = _mm512_and_si512(wv, nib);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), nib);
                let lo2 = _mm512_and_si512(wv2, nib);
                let hi2 = _mm512_and_si512(_mm512_srli_epi16::<4>(wv2), nib);
                let idx = _mm512_add_epi32(quad, _mm512_set1_epi32(j as i32));
                for t in 0..MT {
                    let xp = qx.h.add(t * qx.hs + c / 4 * 256);
                    let ld = |o: usize| _mm512_loadu_si512(xp.add(o) as *const _);
                    let (x0, x1, x2, x3) = (ld(0), ld(64), ld(128), ld(192));
                    let sum = _mm512_dpbusd_epi32(zero, lo, x0);
                    let sum = _mm512_dpbusd_epi32(sum, hi, x1);
                    let sum = _mm512_slli_epi32::<8>(sum);
                    let sum = _mm512_dpbusd_epi32(sum, x2, lo);
                    let sum = _mm512_dpbusd_epi32(sum, x3, hi);
                    let sum2 = _mm512_dpbusd_epi32(zero, lo2, x0);
                    let sum2 = _mm512_dpbusd_epi32(sum2, hi2, x1);
                    let sum2 = _mm512_slli_epi32::<8>(sum2);
                    let sum2 = _mm512_dpbusd_epi32(sum2, x2, lo2);
                    let sum2 = _mm512_dpbusd_epi32(sum2, x3, hi2);
                    let (ft, ft2) = if MT > 3 {
                        (
                            _mm512_load_ps(fs.0[t].as_ptr()),
                            _mm512_load_ps(fs.0[MT + t].as_ptr()),
                        )
                    } else {
                        (f[t], f2[t])
                    };
                    let fv = _mm512_permutexvar_ps(idx, ft);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), fv, acc[t]);
                    let fv2 = _mm512_permutexvar_ps(idx, ft2);
                    acc2[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum2), fv2, acc2[t]);
                }
            };
            // As dot4_512_s: quads at c % 8 == 0 go to a0 / e0, the others to a1 / e1.
            let mut j = 0;
            while j + 4 < k {
                step(j, &mut a0, &mut e0);
                step(j + 4, &mut a1, &mut e1);
                j += 8;
            }
            if j < k {
                step(j, &mut a0, &mut e0);
            }
            c0 += 16;
        }
        let mut out = [0f32; MT];
        let mut out2 = [0f32; MT];
        for t in 0..MT {
            out[t] = reduce16(_mm512_add_ps(a0[t], a1[t]));
            out2[t] = reduce16(_mm512_add_ps(e0[t], e1[t]));
        }
        (out, out2)
    }
}

/// [`dot4_512_s2`] for scales of dtype `kind`.
///
/// # Safety
/// As `dot4_512_s2`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot4_512_any2<const MT: usize>(
    kind: u8,
    w0: Row4,
    w1: Row4,
    chunks: usize,
    shift: u32,
    qx: QuantX16,
) -> ([f32; MT], [f32; MT]) {
    // SAFETY: forwarded contract.
    unsafe {
        match kind {
            SCALES_F16 => dot4_512_s2::<MT, SCALES_F16>(w0, w1, chunks, shift, qx),
            SCALES_F16_SYM => dot4_512_s2::<MT, SCALES_F16_SYM>(w0, w1, chunks, shift, qx),
            SCALES_BF16 => dot4_512_s2::<MT, SCALES_BF16>(w0, w1, chunks, shift, qx),
            _ => dot4_512_s2::<MT, SCALES_F32>(w0, w1, chunks, shift, qx),
        }
    }
}

// SAFETY: read-only views of buffers the caller of the pool run keeps alive and unchanged.
unsafe impl Send for QuantX16 {}
unsafe impl Sync for QuantX16 {}

/// Quantizes `x` (`(m, cols)`, `cols` a multiple of 32) into `q`, `d` and `s` (see
/// [`QuantX16`]), eight values at a time (codes rounded half to even).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_x16(x: &[f32], q: &mut [i16], d: &mut [f32], s: &mut [f32]) {
    let chunks = x.len() / 32;
    assert!(
        q.len() >= chunks * 32 && d.len() >= chunks && s.len() >= chunks,
        "quantize_x16 buffers"
    );
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // SAFETY: chunk c reads x[32c..32c + 32] and writes q[32c..32c + 32], d[c], s[c], all in
    // bounds (checked above).
    unsafe {
        for c in 0..chunks {
            let p = x.as_ptr().add(c * 32);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let mx = _mm256_max_ps(
                _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
                _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
            );
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
            let amax = lanes.iter().fold(0f32, |a, &b| a.max(b));
            let dc = amax / 32767.0;
            let inv = _mm256_set1_ps(if dc > 0.0 { 1.0 / dc } else { 0.0 });
            let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], inv));
            let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inv));
            let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], inv));
            let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inv));
            // packs works within 128-bit lanes: put the quarters back in order.
            let a = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i0, i1));
            let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i2, i3));
            let qp = q.as_mut_ptr().add(c * 32) as *mut __m256i;
            _mm256_storeu_si256(qp, a);
            _mm256_storeu_si256(qp.add(1), b);
            *d.get_unchecked_mut(c) = dc;
            *s.get_unchecked_mut(c) = hsum(_mm256_add_ps(
                _mm256_add_ps(v[0], v[1]),
                _mm256_add_ps(v[2], v[3]),
            ));
        }
    }
}

/// The portable reference of [`quantize_x16`] (codes rounded half away from zero).
#[cfg(test)]
fn quantize_x16_scalar(x: &[f32], q: &mut [i16], d: &mut [f32], s: &mut [f32]) {
    for (c, chunk) in x.chunks_exact(32).enumerate() {
        let amax = chunk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let dc = amax / 32767.0;
        let inv = if dc > 0.0 { 1.0 / dc } else { 0.0 };
        for (o, v) in q[c * 32..c * 32 + 32].iter_mut().zip(chunk) {
            *o = (v * inv).round() as i16;
        }
        d[c] = dc;
        s[c] = chunk.iter().sum();
    }
}

/// 32 codes of a 4-bit row (chunk at `p`, 16 bytes) as two vectors of 16 `i16`, in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes4(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: 16 readable bytes at p.
    unsafe {
        let v = _mm_loadu_si128(p as *const __m128i);
        let mask = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(v, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        (
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi)),
            _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(lo, hi)),
        )
    }
}

/// 32 codes of an 8-bit row (chunk at `p`, 32 bytes) as two vectors of 16 `i16`, in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes8(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: 32 readable bytes at p.
    unsafe {
        (
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
        )
    }
}

/// Rows `r0..r1` of `out (m, rows) = x W^T + bias` for a 4- or 8-bit affine `w` whose group
/// is 32 times a power of two, `m <= 4`, from `x` quantized by [`quantize_x16`]: per chunk of
/// 32 two `madd`s of the codes with the inputs' int16 codes into 32-bit sums, scaled by the
/// group's scale times the chunk's input scale; the biases multiply the inputs' float sums.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `qx` holds `m` quantized rows of `cols` values; rows
/// `r0..r1` of `out` are this caller's alone.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_int16(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX16,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match m {
            1 => rows_int16_m::<1>(w, r0, r1, qx, out, bias),
            2 => rows_int16_m::<2>(w, r0, r1, qx, out, bias),
            3 => rows_int16_m::<3>(w, r0, r1, qx, out, bias),
            _ => rows_int16_m::<4>(w, r0, r1, qx, out, bias),
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn rows_int16_m<const MT: usize>(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX16,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    // Affine or symmetric (a symmetric matrix's biases formed from its scales).
    let Some(parts) = w.affine_parts() else {
        return;
    };
    let AffineParts {
        words,
        scales,
        biases,
        bits,
        group,
        ..
    } = parts;
    let (rows, cols) = (w.rows(), w.cols());
    let groups = cols / group;
    let chunks = cols / 32;
    let shift = (group / 32).trailing_zeros();
    let per = group / 32;
    let row_bytes = cols * bits as usize / 8;
    let cb = 4 * bits as usize;
    let bytes = words.as_ptr() as *const u8;
    let bias_of = |r: usize| bias.map_or(0.0, |b| b.get(r));
    // SAFETY (whole body): rows r0..r1 lie within `words`, `scales` and `biases` (checked by
    // Matrix::affine); qx holds MT * chunks codes, scales and sums; the stack buffers hold
    // groups <= MAX_GROUPS values (checked by `supports`) for each of MT <= 4 inputs.
    unsafe {
        let mut sw = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
        let mut bw = std::mem::MaybeUninit::<[f32; MAX_GROUPS + 8]>::uninit();
        let mut gs = std::mem::MaybeUninit::<[f32; 4 * (MAX_GROUPS + 8)]>::uninit();
        let (sp, bp) = (sw.as_mut_ptr() as *mut f32, bw.as_mut_ptr() as *mut f32);
        let gsp = gs.as_mut_ptr() as *mut f32;
        // The inputs' sums per group, each input's padded to a multiple of 8 with zeros.
        let gpad = groups.div_ceil(8) * 8;
        group_sums(qx.s, MT, chunks, per, groups, gpad, gsp);
        let pf = prefetch_rows(row_bytes);
        for r in r0..r1 {
            prefetch_affine_row(bytes, row_bytes, scales, biases, groups, r, pf, rows);
            widen_row(scales, r * groups, sp, groups);
            widen_biases(&parts, r * groups, bp, groups);
            for g in groups..gpad {
                *bp.add(g) = 0.0;
            }
            let rb = bytes.add(r * row_bytes);
            // Two accumulators per input (even and odd chunks), indexed by constants only so
            // that they stay in registers.
            let mut a0 = [_mm256_setzero_ps(); MT];
            let mut a1 = [_mm256_setzero_ps(); MT];
            let step = |c: usize, acc: &mut [__m256; MT]| {
                let (w0, w1) = if bits == 4 {
                    codes4(rb.add(c * cb))
                } else {
                    codes8(rb.add(c * cb))
                };
                let sg = *sp.add(c >> shift);
                for (t, a) in acc.iter_mut().enumerate() {
                    let xp = qx.q.add((t * chunks + c) * 32);
                    let p = _mm256_add_epi32(
                        _mm256_madd_epi16(w0, _mm256_loadu_si256(xp as *const __m256i)),
                        _mm256_madd_epi16(w1, _mm256_loadu_si256(xp.add(16) as *const __m256i)),
                    );
                    let f = _mm256_set1_ps(sg * *qx.d.add(t * chunks + c));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), f, *a);
                }
            };
            let mut c = 0;
            while c + 2 <= chunks {
                step(c, &mut a0);
                step(c + 1, &mut a1);
                c += 2;
            }
            if c < chunks {
                step(c, &mut a0);
            }
            let acc: [[__m256; 2]; MT] = std::array::from_fn(|t| [a0[t], a1[t]]);
            let b = bias_of(r);
            for t in 0..MT {
                let mut bv = _mm256_setzero_ps();
                let mut g = 0;
                while g < gpad {
                    bv = _mm256_fmadd_ps(
                        _mm256_loadu_ps(bp.add(g)),
                        _mm256_loadu_ps(gsp.add(t * gpad + g)),
                        bv,
                    );
                    g += 8;
                }
                let v = hsum(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), bv));
                out.write(t * rows + r, v + b);
            }
        }
    }
}

/// `exp(x)` of 8 floats (Cephes' polynomial, as `exp256_ps` of avx_mathfun: within about 2
/// ulp of `expf` over `[-88, 88]`, inputs clamped to that range).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.336_55)),
        _mm256_set1_ps(88.376_26),
    );
    let fx = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
    let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), x);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.398_2e-3));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.333_452e-3));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.166_579_6e-2));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.666_666_5e-1));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(0.5));
    let xx = _mm256_mul_ps(x, x);
    y = _mm256_fmadd_ps(y, xx, _mm256_add_ps(x, _mm256_set1_ps(1.0)));
    let n = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(n))
}

/// The largest of `x` (a multiple of 8 floats; `-inf` when empty) and whether any is NaN.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn max_nan8(x: &[f32]) -> (f32, bool) {
    assert!(x.len() % 8 == 0, "max_nan8 length");
    // SAFETY: every load is within the slice (steps of 8 over a multiple of 8).
    unsafe {
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut nan = _mm256_setzero_ps();
        for i in (0..x.len()).step_by(8) {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            m = _mm256_max_ps(m, v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let top = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        (top, _mm256_movemask_ps(nan) != 0)
    }
}

/// `acc + sum(exp(x - top))` of `x` (a multiple of 8 floats) as MLX's CPU `logsumexp` sums
/// it on x86-64 (one lane: each term added in order in f32), each `exp` MLX's
/// `simd::exp` in 8 lanes (the same operations: the rounding to the nearest integer in
/// double, `fma`s, the exponent by shifting, 0 below -88), so the sum is MLX's bit for bit.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::excessive_precision, clippy::approx_constant)]
pub(super) unsafe fn mlx_sum_exp8(x: &[f32], top: f32, mut acc: f32) -> f32 {
    assert!(x.len() % 8 == 0, "mlx_sum_exp8 length");
    // SAFETY: every load is within the slice (steps of 8 over a multiple of 8).
    unsafe {
        let t = _mm256_set1_ps(top);
        let half = _mm256_set1_pd(0.5);
        let mut lanes = [0f32; 8];
        for i in (0..x.len()).step_by(8) {
            let xi = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), t);
            // MLX's constant (not `LOG2_E`'s value).
            let xl = _mm256_mul_ps(xi, _mm256_set1_ps(1.442695));
            // `floor(x + 0.5)` with the double 0.5: the sum and floor in double.
            let lo = _mm256_floor_pd(_mm256_add_pd(
                _mm256_cvtps_pd(_mm256_castps256_ps128(xl)),
                half,
            ));
            let hi = _mm256_floor_pd(_mm256_add_pd(
                _mm256_cvtps_pd(_mm256_extractf128_ps(xl, 1)),
                half,
            ));
            let ipart = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
            let f = _mm256_sub_ps(xl, ipart);
            let mut p = _mm256_set1_ps(1.535336188319500e-4);
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3));
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3));
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2));
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1));
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1));
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0));
            let e = _mm256_slli_epi32(
                _mm256_add_epi32(_mm256_cvttps_epi32(ipart), _mm256_set1_epi32(127)),
                23,
            );
            let r = _mm256_mul_ps(_mm256_castsi256_ps(e), p);
            let r = _mm256_blendv_ps(
                r,
                _mm256_set1_ps(f32::INFINITY),
                _mm256_cmp_ps(xi, _mm256_set1_ps(88.0), _CMP_GT_OQ),
            );
            let r = _mm256_blendv_ps(
                r,
                _mm256_setzero_ps(),
                _mm256_cmp_ps(xi, _mm256_set1_ps(-88.0), _CMP_LT_OQ),
            );
            _mm256_storeu_ps(lanes.as_mut_ptr(), r);
            for v in lanes {
                acc += v;
            }
        }
        acc
    }
}

/// `g = g / (1 + exp(-g)) * u`, eight at a time.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `g` and `u` have the same length, a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn silu_mul8(g: &mut [f32], u: &[f32]) {
    assert!(g.len() == u.len() && g.len() % 8 == 0, "silu_mul8 lengths");
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    // SAFETY: every access is within the slices (checked lengths, steps of 8).
    unsafe {
        let mut i = 0;
        while i < g.len() {
            let gp = g.as_mut_ptr().add(i);
            let x = _mm256_loadu_ps(gp);
            let e = exp8(_mm256_sub_ps(zero, x));
            let y = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gp, _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr().add(i))));
            i += 8;
        }
    }
}

/// Positions per block of [`attend`]'s scores.
const ATT_BLOCK: usize = 64;

/// Eight cached values widened to float32: the element types of [`attend`]'s cache.
pub(in crate::cpu) trait Load8: Copy {
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; eight values are readable at `p`.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Load8 for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: eight floats readable at p (the caller's contract).
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Load8 for half::f16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const half::f16) -> __m256 {
        // SAFETY: eight halves (16 bytes) readable at p (the caller's contract).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

/// Floats [`attend_part`] writes per query head: the unnormalized output (`hd`), then the
/// running maximum of the scaled scores and the sum of their exponentials.
pub(super) const fn part_stride(hd: usize) -> usize {
    hd + 2
}

/// The `g` query heads that share one KV head (rows of `hd` floats at `q`, one after the
/// other) over `n` cached positions (`k` and `v` rows of `hd` values one position apart:
/// float32, or float16 widened on load): per head, into `part` at a stride of
/// [`part_stride`], `acc = sum_j exp(scale * q.k_j - mx) v_j`, `mx` and `l = sum_j
/// exp(scale * q.k_j - mx)` (the caller merges parts: `out = acc / l`). Per block of positions
/// the scores of one head are computed first, then exponentiated eight at a time against
/// its running maximum, then summed into its output (a rescale only when a block raises the
/// maximum); the heads take a block in turn, so each block of keys and values is read from
/// memory once for all of them (the later heads find it in the L1 cache).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `hd` is a multiple of 8; `q` holds `g * hd` floats and
/// `part` `g * part_stride(hd)`; `k` and `v` hold `n * hd` values.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_part<E: Load8>(
    q: *const f32,
    g: usize,
    k: *const E,
    v: *const E,
    hd: usize,
    n: usize,
    scale: f32,
    part: *mut f32,
) {
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        match g {
            1 => attend_part_g::<E, 1>(q, k, v, hd, n, scale, part),
            2 => attend_part_g::<E, 2>(q, k, v, hd, n, scale, part),
            3 => attend_part_g::<E, 3>(q, k, v, hd, n, scale, part),
            4 => attend_part_g::<E, 4>(q, k, v, hd, n, scale, part),
            _ => attend_part_each::<E>(q, g, k, v, hd, n, scale, part),
        }
    }
}

/// [`attend_part`] for `G` query heads with each key and value vector loaded (and widened)
/// once for all of them: the scores of all heads per position, then per head the rescale
/// and exponentials, then the values into every head's output. Per head the same operations
/// in the same order as [`attend_part_each`] (bit-identical results): only the interleaving
/// across heads differs.
///
/// # Safety
/// As [`attend_part`] with `g = G`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn attend_part_g<E: Load8, const G: usize>(
    q: *const f32,
    k: *const E,
    v: *const E,
    hd: usize,
    n: usize,
    scale: f32,
    part: *mut f32,
) {
    let stride = part_stride(hd);
    // SAFETY (whole body): every pointer stays within the ranges of the contract; the stack
    // buffers hold G * ATT_BLOCK floats.
    unsafe {
        let mut sc = [[0f32; ATT_BLOCK]; G];
        for h in 0..G {
            let ap = part.add(h * stride);
            let mut d = 0;
            while d < hd {
                _mm256_storeu_ps(ap.add(d), _mm256_setzero_ps());
                d += 8;
            }
            *ap.add(hd) = f32::NEG_INFINITY;
            *ap.add(hd + 1) = 0.0;
        }
        let row = hd * std::mem::size_of::<E>();
        let mut p0 = 0;
        while p0 < n {
            let c = (n - p0).min(ATT_BLOCK);
            // This block's values (read after its scores) and the next block's keys, on
            // their way while the scores are computed (see `PREFETCH_BYTES`).
            prefetch(v.add(p0 * hd) as *const u8, c * row);
            prefetch(
                k.wrapping_add((p0 + c) * hd) as *const u8,
                (n - p0 - c).min(ATT_BLOCK) * row,
            );
            let mut cmax = [f32::NEG_INFINITY; G];
            for j in 0..c {
                let kp = k.add((p0 + j) * hd);
                let mut a0 = [_mm256_setzero_ps(); G];
                let mut a1 = [_mm256_setzero_ps(); G];
                let mut d = 0;
                while d + 16 <= hd {
                    let (k0, k1) = (E::load8(kp.add(d)), E::load8(kp.add(d + 8)));
                    for h in 0..G {
                        let qh = q.add(h * hd);
                        a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(d)), k0, a0[h]);
                        a1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(d + 8)), k1, a1[h]);
                    }
                    d += 16;
                }
                if d < hd {
                    let k0 = E::load8(kp.add(d));
                    for h in 0..G {
                        let qh = q.add(h * hd);
                        a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(d)), k0, a0[h]);
                    }
                }
                for h in 0..G {
                    let s = hsum(_mm256_add_ps(a0[h], a1[h])) * scale;
                    sc[h][j] = s;
                    cmax[h] = cmax[h].max(s);
                }
            }
            for h in 0..G {
                let ap = part.add(h * stride);
                let (mut mx, mut l) = (*ap.add(hd), *ap.add(hd + 1));
                if cmax[h] > mx {
                    let corr = (mx - cmax[h]).exp();
                    l *= corr;
                    let cv = _mm256_set1_ps(corr);
                    let mut d = 0;
                    while d < hd {
                        _mm256_storeu_ps(ap.add(d), _mm256_mul_ps(_mm256_loadu_ps(ap.add(d)), cv));
                        d += 8;
                    }
                    mx = cmax[h];
                }
                let mv = _mm256_set1_ps(mx);
                let mut sum = _mm256_setzero_ps();
                let mut j = 0;
                let sp = sc[h].as_mut_ptr();
                while j + 8 <= c {
                    let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(j)), mv));
                    _mm256_storeu_ps(sp.add(j), e);
                    sum = _mm256_add_ps(sum, e);
                    j += 8;
                }
                let mut tail = 0f32;
                for s in &mut sc[h][j..c] {
                    *s = (*s - mx).exp();
                    tail += *s;
                }
                l += hsum(sum) + tail;
                *ap.add(hd) = mx;
                *ap.add(hd + 1) = l;
            }
            let vb = v.add(p0 * hd);
            let mut d = 0;
            while d + 16 <= hd {
                let mut a = [[_mm256_setzero_ps(); 2]; G];
                for h in 0..G {
                    let ap = part.add(h * stride + d);
                    a[h] = [_mm256_loadu_ps(ap), _mm256_loadu_ps(ap.add(8))];
                }
                for j in 0..c {
                    let vp = vb.add(j * hd + d);
                    let (v0, v1) = (E::load8(vp), E::load8(vp.add(8)));
                    for h in 0..G {
                        let wv = _mm256_set1_ps(sc[h][j]);
                        a[h][0] = _mm256_fmadd_ps(wv, v0, a[h][0]);
                        a[h][1] = _mm256_fmadd_ps(wv, v1, a[h][1]);
                    }
                }
                for h in 0..G {
                    let ap = part.add(h * stride + d);
                    _mm256_storeu_ps(ap, a[h][0]);
                    _mm256_storeu_ps(ap.add(8), a[h][1]);
                }
                d += 16;
            }
            if d < hd {
                let mut a = [_mm256_setzero_ps(); G];
                for h in 0..G {
                    a[h] = _mm256_loadu_ps(part.add(h * stride + d));
                }
                for j in 0..c {
                    let v0 = E::load8(vb.add(j * hd + d));
                    for h in 0..G {
                        a[h] = _mm256_fmadd_ps(_mm256_set1_ps(sc[h][j]), v0, a[h]);
                    }
                }
                for h in 0..G {
                    _mm256_storeu_ps(part.add(h * stride + d), a[h]);
                }
            }
            p0 += c;
        }
    }
}

/// [`attend_part`] one query head at a time (any group size).
///
/// # Safety
/// As [`attend_part`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_part_each<E: Load8>(
    q: *const f32,
    g: usize,
    k: *const E,
    v: *const E,
    hd: usize,
    n: usize,
    scale: f32,
    part: *mut f32,
) {
    let stride = part_stride(hd);
    // SAFETY (whole body): every pointer stays within the ranges of the contract; the stack
    // buffer holds ATT_BLOCK floats.
    unsafe {
        let mut sc = [0f32; ATT_BLOCK];
        for h in 0..g {
            let ap = part.add(h * stride);
            let mut d = 0;
            while d < hd {
                _mm256_storeu_ps(ap.add(d), _mm256_setzero_ps());
                d += 8;
            }
            *ap.add(hd) = f32::NEG_INFINITY;
            *ap.add(hd + 1) = 0.0;
        }
        let mut p0 = 0;
        let row = hd * std::mem::size_of::<E>();
        while p0 < n {
            let c = (n - p0).min(ATT_BLOCK);
            // This block's values (read after its scores) and the next block's keys, on
            // their way while the scores are computed (see `PREFETCH_BYTES`).
            prefetch(v.add(p0 * hd) as *const u8, c * row);
            prefetch(
                k.wrapping_add((p0 + c) * hd) as *const u8,
                (n - p0 - c).min(ATT_BLOCK) * row,
            );
            for h in 0..g {
                let q = q.add(h * hd);
                let ap = part.add(h * stride);
                let (mut mx, mut l) = (*ap.add(hd), *ap.add(hd + 1));
                let mut cmax = f32::NEG_INFINITY;
                for (j, s) in sc[..c].iter_mut().enumerate() {
                    let kp = k.add((p0 + j) * hd);
                    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                    let mut d = 0;
                    while d + 16 <= hd {
                        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), E::load8(kp.add(d)), a0);
                        a1 = _mm256_fmadd_ps(
                            _mm256_loadu_ps(q.add(d + 8)),
                            E::load8(kp.add(d + 8)),
                            a1,
                        );
                        d += 16;
                    }
                    if d < hd {
                        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), E::load8(kp.add(d)), a0);
                    }
                    *s = hsum(_mm256_add_ps(a0, a1)) * scale;
                    cmax = cmax.max(*s);
                }
                if cmax > mx {
                    let corr = (mx - cmax).exp();
                    l *= corr;
                    let cv = _mm256_set1_ps(corr);
                    let mut d = 0;
                    while d < hd {
                        _mm256_storeu_ps(ap.add(d), _mm256_mul_ps(_mm256_loadu_ps(ap.add(d)), cv));
                        d += 8;
                    }
                    mx = cmax;
                }
                let mv = _mm256_set1_ps(mx);
                let mut sum = _mm256_setzero_ps();
                let mut j = 0;
                let sp = sc.as_mut_ptr();
                while j + 8 <= c {
                    let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(j)), mv));
                    _mm256_storeu_ps(sp.add(j), e);
                    sum = _mm256_add_ps(sum, e);
                    j += 8;
                }
                let mut tail = 0f32;
                for s in &mut sc[j..c] {
                    *s = (*s - mx).exp();
                    tail += *s;
                }
                l += hsum(sum) + tail;
                let vb = v.add(p0 * hd);
                let mut d = 0;
                while d + 32 <= hd {
                    let mut a = [
                        _mm256_loadu_ps(ap.add(d)),
                        _mm256_loadu_ps(ap.add(d + 8)),
                        _mm256_loadu_ps(ap.add(d + 16)),
                        _mm256_loadu_ps(ap.add(d + 24)),
                    ];
                    for (j, &w) in sc[..c].iter().enumerate() {
                        let wv = _mm256_set1_ps(w);
                        let vp = vb.add(j * hd + d);
                        a[0] = _mm256_fmadd_ps(wv, E::load8(vp), a[0]);
                        a[1] = _mm256_fmadd_ps(wv, E::load8(vp.add(8)), a[1]);
                        a[2] = _mm256_fmadd_ps(wv, E::load8(vp.add(16)), a[2]);
                        a[3] = _mm256_fmadd_ps(wv, E::load8(vp.add(24)), a[3]);
                    }
                    for (i, a) in a.iter().enumerate() {
                        _mm256_storeu_ps(ap.add(d + 8 * i), *a);
                    }
                    d += 32;
                }
                while d < hd {
                    let mut a = _mm256_loadu_ps(ap.add(d));
                    for (j, &w) in sc[..c].iter().enumerate() {
                        a = _mm256_fmadd_ps(_mm256_set1_ps(w), E::load8(vb.add(j * hd + d)), a);
                    }
                    _mm256_storeu_ps(ap.add(d), a);
                    d += 8;
                }
                *ap.add(hd) = mx;
                *ap.add(hd + 1) = l;
            }
            p0 += c;
        }
    }
}

/// Rows `r0..r1` as [`rows_int16`], with 512-bit integer dot products: one chunk of 32 codes
/// is one vector of 32 `i16` (4-bit codes split in registers: each byte widened to a 32-bit
/// lane, its high nibble shifted to the lane's upper half), one `madd` with the input's
/// codes, then scaled in float by the group's scale times the chunk's input scale.
///
/// Up to [`WIDE_TILE`] inputs a pass (`m` past it: the first `WIDE_TILE`).
///
/// # Safety
/// As [`rows_int16`] with `m <= WIDE_TILE`, and the CPU has AVX-512 F, BW, VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_int16_512(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX16,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match m {
            1 => rows_int16_512_m::<1>(w, r0, r1, qx, out, bias),
            2 => rows_int16_512_m::<2>(w, r0, r1, qx, out, bias),
            3 => rows_int16_512_m::<3>(w, r0, r1, qx, out, bias),
            4 => rows_int16_512_m::<4>(w, r0, r1, qx, out, bias),
            5 => rows_int16_512_m::<5>(w, r0, r1, qx, out, bias),
            _ => rows_int16_512_m::<6>(w, r0, r1, qx, out, bias),
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)]
unsafe fn rows_int16_512_m<const MT: usize>(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX16,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    // Affine or symmetric (a symmetric matrix's biases formed from its scales).
    let Some(parts) = w.affine_parts() else {
        return;
    };
    let AffineParts {
        words,
        scales,
        biases,
        bits,
        group,
        sym,
    } = parts;
    let (rows, cols) = (w.rows(), w.cols());
    let groups = cols / group;
    let chunks = cols / 32;
    let shift = (group / 32).trailing_zeros();
    let per = group / 32;
    let row_bytes = cols * bits as usize / 8;
    let cb = 4 * bits as usize;
    let bytes = words.as_ptr() as *const u8;
    let bias_of = |r: usize| bias.map_or(0.0, |b| b.get(r));
    // 4-bit rows in groups of up to 512 with scales and biases of one dtype: their factors
    // in registers ([`dot4_512_any`]).
    if split_covers(w) {
        if let Some(kind) = dot_kind(&parts) {
            assert!(
                scales.len() >= r1 * groups && biases.len() >= r1 * groups,
                "scales out of range"
            );
            let esz = if kind == SCALES_F32 { 4 } else { 2 };
            let (sp, bp) = (floats_ptr(scales), floats_ptr(biases));
            let pf = prefetch_rows(row_bytes);
            for r in r0..r1 {
                prefetch_affine_row(bytes, row_bytes, scales, biases, groups, r, pf, rows);
                // SAFETY: row r's codes and `groups` scales and biases lie within the arrays
                // (Matrix::affine's checks and the assert); the rest is this function's
                // contract.
                let v = unsafe {
                    let (s0, b0) = (sp.add(r * groups * esz), bp.add(r * groups * esz));
                    let rb = bytes.add(r * row_bytes);
                    dot4_512_any::<MT>(kind, rb, s0, b0, chunks, shift, qx)
                };
                let b = bias_of(r);
                for t in 0..MT {
                    // SAFETY: row r of the output is this caller's alone.
                    unsafe { out.write(t * rows + r, v[t] + b) };
                }
            }
            return;
        }
    }
    // SAFETY (whole body): as rows_int16_m; the per-chunk factor buffer holds chunks <=
    // MAX_GROUPS * per values per input (checked by `supports`: cols / group <= MAX_GROUPS
    // and chunks = groups * per; see the assert).
    unsafe {
        assert!(chunks <= MAX_CHUNKS, "row of {chunks} chunks");
        let mut sw = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
        let mut bw = std::mem::MaybeUninit::<[f32; MAX_GROUPS + 8]>::uninit();
        let mut gs = std::mem::MaybeUninit::<[f32; WIDE_TILE * (MAX_GROUPS + 8)]>::uninit();
        let mut fw = std::mem::MaybeUninit::<[f32; WIDE_TILE * MAX_CHUNKS]>::uninit();
        let (sp, bp) = (sw.as_mut_ptr() as *mut f32, bw.as_mut_ptr() as *mut f32);
        let gsp = gs.as_mut_ptr() as *mut f32;
        let fp = fw.as_mut_ptr() as *mut f32;
        let gpad = groups.div_ceil(8) * 8;
        group_sums(qx.s, MT, chunks, per, groups, gpad, gsp);
        let pf = prefetch_rows(row_bytes);
        let nib = _mm512_set1_epi32(0x000f_000f);
        if let (0, Floats::F16(sh), Floats::F16(bh), false) =
            (shift, scales, biases, sym && bits == 4)
        {
            // Groups of 32 with half-precision scales and biases (GGUF's Q4_0/Q4_1/Q8_0 as
            // loaded): the row's factors and its bias term 16 chunks at a time, read as
            // halves with masked loads (no widening pass, no scalar tail). A symmetric
            // matrix's biases (`bh` is its scales) are formed times `-2^(bits - 1)` (8 bits
            // here: 4-bit rows take `dot4_512_any` above).
            assert!(
                sh.len() >= r1 * groups && bh.len() >= r1 * groups,
                "scales out of range"
            );
            let bk = _mm512_set1_ps(parts.bias_k());
            for r in r0..r1 {
                let (s0, b0) = (
                    sh.as_ptr().add(r * groups) as *const u16,
                    bh.as_ptr().add(r * groups) as *const u16,
                );
                let rb = bytes.add(r * row_bytes);
                prefetch_affine_row(bytes, row_bytes, scales, biases, groups, r, pf, rows);
                if bits == 4 {
                    let v = dot4_512_h::<MT>(rb, s0, b0, chunks, qx);
                    let b = bias_of(r);
                    for t in 0..MT {
                        out.write(t * rows + r, v[t] + b);
                    }
                    continue;
                }
                let mut bacc = [_mm512_setzero_ps(); MT];
                let mut c0 = 0;
                while c0 < chunks {
                    let k = (chunks - c0).min(16);
                    let mask: __mmask16 = if k == 16 { 0xffff } else { (1u16 << k) - 1 };
                    let sv =
                        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, s0.add(c0) as *const _));
                    let bv =
                        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, b0.add(c0) as *const _));
                    let bv = if sym { _mm512_mul_ps(bv, bk) } else { bv };
                    for t in 0..MT {
                        let dv = _mm512_maskz_loadu_ps(mask, qx.d.add(t * chunks + c0));
                        _mm512_mask_storeu_ps(fp.add(t * chunks + c0), mask, _mm512_mul_ps(sv, dv));
                        let xs = _mm512_maskz_loadu_ps(mask, qx.s.add(t * chunks + c0));
                        bacc[t] = _mm512_fmadd_ps(bv, xs, bacc[t]);
                    }
                    c0 += 16;
                }
                let mut a0 = bacc;
                let mut a1 = [_mm512_setzero_ps(); MT];
                let step = |c: usize, acc: &mut [__m512; MT]| {
                    let p = rb.add(c * cb);
                    let wq = if bits == 4 {
                        let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                        _mm512_ternarylogic_epi32::<0xA8>(b, _mm512_slli_epi32::<12>(b), nib)
                    } else {
                        _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const __m256i))
                    };
                    for (t, a) in acc.iter_mut().enumerate() {
                        let xp = qx.q.add((t * chunks + c) * 32);
                        let prod = _mm512_madd_epi16(wq, _mm512_loadu_si512(xp as *const _));
                        let f = _mm512_set1_ps(*fp.add(t * chunks + c));
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), f, *a);
                    }
                };
                let mut c = 0;
                while c + 2 <= chunks {
                    step(c, &mut a0);
                    step(c + 1, &mut a1);
                    c += 2;
                }
                if c < chunks {
                    step(c, &mut a0);
                }
                let b = bias_of(r);
                for t in 0..MT {
                    let v = reduce16(_mm512_add_ps(a0[t], a1[t]));
                    out.write(t * rows + r, v + b);
                }
            }
            return;
        }
        for r in r0..r1 {
            prefetch_affine_row(bytes, row_bytes, scales, biases, groups, r, pf, rows);
            widen_row(scales, r * groups, sp, groups);
            widen_biases(&parts, r * groups, bp, groups);
            for g in groups..gpad {
                *bp.add(g) = 0.0;
            }
            // The factor of each chunk and input: group scale times input scale.
            for t in 0..MT {
                let d = qx.d.add(t * chunks);
                let f = fp.add(t * chunks);
                if shift == 0 {
                    let mut c = 0;
                    while c + 8 <= chunks {
                        _mm256_storeu_ps(
                            f.add(c),
                            _mm256_mul_ps(_mm256_loadu_ps(sp.add(c)), _mm256_loadu_ps(d.add(c))),
                        );
                        c += 8;
                    }
                    for c in c..chunks {
                        *f.add(c) = *sp.add(c) * *d.add(c);
                    }
                } else {
                    for c in 0..chunks {
                        *f.add(c) = *sp.add(c >> shift) * *d.add(c);
                    }
                }
            }
            let rb = bytes.add(r * row_bytes);
            let b = bias_of(r);
            if bits == 4 {
                let v = dot4_512::<MT>(rb, chunks, qx.p, fp, [_mm512_setzero_ps(); MT]);
                for t in 0..MT {
                    let mut bv = _mm256_setzero_ps();
                    let mut g = 0;
                    while g < gpad {
                        bv = _mm256_fmadd_ps(
                            _mm256_loadu_ps(bp.add(g)),
                            _mm256_loadu_ps(gsp.add(t * gpad + g)),
                            bv,
                        );
                        g += 8;
                    }
                    out.write(t * rows + r, v[t] + hsum(bv) + b);
                }
                continue;
            }
            let mut a0 = [_mm512_setzero_ps(); MT];
            let mut a1 = [_mm512_setzero_ps(); MT];
            let step = |c: usize, acc: &mut [__m512; MT]| {
                let p = rb.add(c * cb);
                let wq = if bits == 4 {
                    let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                    // Lane k: code 2k in bits 0-3, code 2k + 1 in bits 16-19.
                    _mm512_ternarylogic_epi32::<0xA8>(b, _mm512_slli_epi32::<12>(b), nib)
                } else {
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const __m256i))
                };
                for (t, a) in acc.iter_mut().enumerate() {
                    let xp = qx.q.add((t * chunks + c) * 32);
                    let prod = _mm512_madd_epi16(wq, _mm512_loadu_si512(xp as *const _));
                    let f = _mm512_set1_ps(*fp.add(t * chunks + c));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), f, *a);
                }
            };
            let mut c = 0;
            while c + 2 <= chunks {
                step(c, &mut a0);
                step(c + 1, &mut a1);
                c += 2;
            }
            if c < chunks {
                step(c, &mut a0);
            }
            let b = bias_of(r);
            for t in 0..MT {
                let mut bv = _mm256_setzero_ps();
                let mut g = 0;
                while g < gpad {
                    bv = _mm256_fmadd_ps(
                        _mm256_loadu_ps(bp.add(g)),
                        _mm256_loadu_ps(gsp.add(t * gpad + g)),
                        bv,
                    );
                    g += 8;
                }
                let v = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) + hsum(bv);
                out.write(t * rows + r, v + b);
            }
        }
    }
}

/// Whether [`rows_q8_pairs`] takes `w`: 8-bit affine or symmetric rows in groups of 32 with
/// float16 scales and biases (GGUF's Q8_0 as loaded: SmolLM2's tied head), at most
/// [`MAX_CHUNKS`] chunks a row: the matrices [`rows_int16_512_m`]'s half-precision branch
/// takes at 8 bits.
pub(super) fn q8_pairs_supports(w: &Matrix<'_>) -> bool {
    w.affine_parts().is_some_and(|p| {
        p.bits == 8
            && p.group == 32
            && matches!((p.scales, p.biases), (Floats::F16(_), Floats::F16(_)))
            && w.cols() % 32 == 0
            && w.cols() / 32 <= MAX_CHUNKS
    })
}

/// `m` input rows in `tiles` tiles as even as can be (7 in 2 as 4 + 3, 5 in 2 as 3 + 2): each
/// tile's first row and size, in order.
pub(super) fn even_tiles(m: usize, tiles: usize) -> impl Iterator<Item = (usize, usize)> {
    let (mut left, mut t0) = (tiles.max(1), 0);
    std::iter::from_fn(move || {
        if t0 >= m {
            return None;
        }
        let mt = (m - t0).div_ceil(left);
        let tile = (t0, mt);
        left = left.saturating_sub(1).max(1);
        t0 += mt;
        Some(tile)
    })
}

/// Input rows a pass of [`rows_q8_pairs`] takes.
pub(super) const Q8_PAIR_TILE: usize = 3;

/// Rows `r0..r1` of `out = x W^T (+ bias)` for `m` (2 to `4 * Q8_PAIR_TILE`) int16 inputs
/// over an 8-bit matrix of [`q8_pairs_supports`]: the sums of [`rows_int16_512_m`]'s
/// half-precision branch, weight rows two at a time so that each input chunk's codes are
/// loaded once for both (one 512-bit load a chunk and input, where the one-row kernel loads
/// them for every row, and a broadcast of the chunk's factor from the stack for every row
/// and input), the factors kept in registers and picked out by a permute, the inputs in tiles
/// of at most [`Q8_PAIR_TILE`] (as even as can be). Every output is computed by the same
/// float operations in the same order as `rows_int16_512_m` gives it (the bias term over all
/// chunks first, then the chunks' products alternating between two accumulators by the
/// chunk's parity, the reduction, the bias): bit-identical (tier L2, `batch.rs`'s
/// `q8_pairs_are_the_one_row_bits`). An odd last row is paired with itself.
///
/// # Safety
/// As [`rows_int16_512`] (with `m` inputs), and [`q8_pairs_supports`] holds for `w`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_q8_pairs(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX16,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let Some(parts) = w.affine_parts() else {
        return;
    };
    let (Floats::F16(sh), Floats::F16(bh)) = (parts.scales, parts.biases) else {
        return;
    };
    let (rows, cols) = (w.rows(), w.cols());
    let chunks = cols / 32;
    let groups = chunks;
    assert!(
        parts.bits == 8
            && parts.group == 32
            && r1 <= rows
            && sh.len() >= rows * groups
            && bh.len() >= rows * groups
            && (2..=4 * Q8_PAIR_TILE).contains(&m),
        "rows_q8_pairs: rows {r0}..{r1} of {rows}, {m} inputs"
    );
    let bytes = parts.words.as_ptr() as *const u8;
    let row_bytes = cols;
    let sym = parts.sym;
    let bk = parts.bias_k();
    let pf = prefetch_rows(row_bytes);
    // SAFETY (whole body): rows r0..r1's codes, scales and biases lie within the arrays
    // (Matrix::affine's checks and the assert); the tiles lie within qx's m rows; the rest is
    // this function's contract.
    unsafe {
        let put = |r: usize, t0: usize, v: &[f32]| {
            let b = bias.map_or(0.0, |b| b.get(r));
            for (t, v) in v.iter().enumerate() {
                out.write((t0 + t) * rows + r, v + b);
            }
        };
        // Weight rows two at a time; an odd last row paired with itself (its first result
        // kept; see `affine_rows::rows_pairs`).
        let mut r = r0;
        while r < r1 {
            let r2 = if r + 1 < r1 { r + 1 } else { r };
            for q in [r, r2] {
                prefetch_affine_row(
                    bytes,
                    row_bytes,
                    parts.scales,
                    parts.biases,
                    groups,
                    q,
                    pf,
                    rows,
                );
            }
            let rw = [r, r2];
            let put2 = |t0: usize, a: &[f32], b: &[f32]| {
                put(r, t0, a);
                if r2 != r {
                    put(r2, t0, b);
                }
            };
            for (t0, mt) in even_tiles(m, m.div_ceil(Q8_PAIR_TILE)) {
                let q = qx.rows_from(t0, cols);
                match mt {
                    1 => {
                        let (a, b) = q8_pair::<1>(bytes, sh, bh, sym, bk, rw, chunks, q);
                        put2(t0, &a, &b);
                    }
                    2 => {
                        let (a, b) = q8_pair::<2>(bytes, sh, bh, sym, bk, rw, chunks, q);
                        put2(t0, &a, &b);
                    }
                    _ => {
                        let (a, b) = q8_pair::<3>(bytes, sh, bh, sym, bk, rw, chunks, q);
                        put2(t0, &a, &b);
                    }
                }
            }
            r += 2;
        }
    }
}

/// Two weight rows (`rw`) of [`rows_q8_pairs`] over `MT` inputs (no bias).
///
/// # Safety
/// As `rows_q8_pairs`, for rows `rw` and `MT` rows of `qx`.
#[inline]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q8_pair<const MT: usize>(
    bytes: *const u8,
    sh: &[half::f16],
    bh: &[half::f16],
    sym: bool,
    bk: f32,
    rw: [usize; 2],
    chunks: usize,
    qx: QuantX16,
) -> ([f32; MT], [f32; MT]) {
    // SAFETY (whole body): the caller's.
    unsafe {
        let groups = chunks;
        let s0 = |i: usize| sh.as_ptr().add(rw[i] * groups) as *const u16;
        let b0 = |i: usize| bh.as_ptr().add(rw[i] * groups) as *const u16;
        let rb = |i: usize| bytes.add(rw[i] * chunks * 32);
        let mask_of = |k: usize| -> __mmask16 {
            if k == 16 {
                0xffff
            } else {
                (1u16 << k) - 1
            }
        };
        // The bias terms over all chunks first (`bacc`, as the one-row kernel).
        let mut a0 = [[_mm512_setzero_ps(); MT]; 2];
        let mut c0 = 0;
        while c0 < chunks {
            let k = (chunks - c0).min(16);
            let mask = mask_of(k);
            for i in 0..2 {
                let bv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, b0(i).add(c0) as *const _));
                let bv = if sym {
                    _mm512_mul_ps(bv, _mm512_set1_ps(bk))
                } else {
                    bv
                };
                for t in 0..MT {
                    let xs = _mm512_maskz_loadu_ps(mask, qx.s.add(t * chunks + c0));
                    a0[i][t] = _mm512_fmadd_ps(bv, xs, a0[i][t]);
                }
            }
            c0 += 16;
        }
        let mut a1 = [[_mm512_setzero_ps(); MT]; 2];
        let mut c0 = 0;
        while c0 < chunks {
            let k = (chunks - c0).min(16);
            let mask = mask_of(k);
            let mut f = [[_mm512_setzero_ps(); MT]; 2];
            for i in 0..2 {
                let sv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, s0(i).add(c0) as *const _));
                for t in 0..MT {
                    let dv = _mm512_maskz_loadu_ps(mask, qx.d.add(t * chunks + c0));
                    f[i][t] = _mm512_mul_ps(sv, dv);
                }
            }
            let step = |j: usize, acc: &mut [[__m512; MT]; 2]| {
                let c = c0 + j;
                let w0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(rb(0).add(c * 32) as *const _));
                let w1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(rb(1).add(c * 32) as *const _));
                let idx = _mm512_set1_epi32(j as i32);
                for t in 0..MT {
                    let xv = _mm512_loadu_si512(qx.q.add((t * chunks + c) * 32) as *const _);
                    let p0 = _mm512_madd_epi16(w0, xv);
                    let p1 = _mm512_madd_epi16(w1, xv);
                    let f0 = _mm512_permutexvar_ps(idx, f[0][t]);
                    let f1 = _mm512_permutexvar_ps(idx, f[1][t]);
                    acc[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), f0, acc[0][t]);
                    acc[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), f1, acc[1][t]);
                }
            };
            // c0 is even: even chunks to a0, odd ones to a1 (the one-row kernel's order).
            let mut j = 0;
            while j + 2 <= k {
                step(j, &mut a0);
                step(j + 1, &mut a1);
                j += 2;
            }
            if j < k {
                step(j, &mut a0);
            }
            c0 += 16;
        }
        let mut out = [[0f32; MT]; 2];
        for i in 0..2 {
            for t in 0..MT {
                out[i][t] = reduce16(_mm512_add_ps(a0[i][t], a1[i][t]));
            }
        }
        (out[0], out[1])
    }
}

/// How far ahead of the row it reads a decode kernel prefetches its weights, in bytes. A
/// decode step's products are small (a few hundred KB each) and split into blocks of rows
/// that the workers take in turn, so the hardware prefetchers, which stop at every 4 KB
/// page, keep too few lines in flight: without it the kernels streamed from memory at a
/// fifth to a third of what a plain read of the same bytes reaches on this machine
/// (`cpu_matvec step`; results/bench/2026-12-04-s23-cpu-decode/).
pub(super) const PREFETCH_BYTES: usize = 4096;

/// Rows ahead to prefetch for rows of `row_bytes` bytes (`MLX_CPU_PF` overrides the bytes,
/// for measurements; 0 turns prefetching off).
pub(super) fn prefetch_rows(row_bytes: usize) -> usize {
    static PF: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let bytes = *PF.get_or_init(|| {
        std::env::var("MLX_CPU_PF")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PREFETCH_BYTES)
    });
    if bytes == 0 {
        0
    } else {
        bytes.div_ceil(row_bytes.max(1))
    }
}

/// Prefetches `n` bytes from `p` into L1 (whole lines). A hint: nothing is read, so `p` may
/// lie past a buffer's end.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch(p: *const u8, n: usize) {
    let mut o = 0;
    while o < n {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// A float array's row `r` of `n` elements, as bytes to prefetch.
#[inline]
fn floats_row(f: Floats<'_>, r: usize, n: usize) -> (*const u8, usize) {
    match f {
        Floats::F32(s) => (s.as_ptr().wrapping_add(r * n) as *const u8, 4 * n),
        Floats::F16(s) => (s.as_ptr().wrapping_add(r * n) as *const u8, 2 * n),
        Floats::Bf16(s) => (s.as_ptr().wrapping_add(r * n) as *const u8, 2 * n),
    }
}

/// Prefetches row `r + ahead` (when `ahead > 0` and that row exists) of an affine matrix:
/// its code bytes (`row_bytes` a row from `bytes`) and its `groups` scales and biases.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn prefetch_affine_row(
    bytes: *const u8,
    row_bytes: usize,
    scales: Floats<'_>,
    biases: Floats<'_>,
    groups: usize,
    r: usize,
    ahead: usize,
    rows: usize,
) {
    if ahead == 0 || r + ahead >= rows {
        return;
    }
    let n = r + ahead;
    prefetch(bytes.wrapping_add(n * row_bytes), row_bytes);
    let (p, l) = floats_row(scales, n, groups);
    prefetch(p, l);
    let (p, l) = floats_row(biases, n, groups);
    prefetch(p, l);
}

/// Quantizes `x` (`(m, cols)`, `cols` a multiple of 32) to int8 codes in their natural order
/// for [`rows_q8_int8_512`]: per chunk of 32 values a scale `d = max|x| / 127`, the codes
/// `round(x / d)` (half away from zero), and `s` the sum of the codes' values, `d` times the
/// codes' integer sum (what the rows' biases multiply). The sum of the quantized values, not
/// of the float inputs: MLX's Q8_0 rows are unsigned codes `128 + k` with bias `-128 x
/// scale`, so with the float sums the inputs' rounding errors met the codes (`128 + k`) in
/// place of the weights (`k`), several times int8 inputs' own error (SmolLM2's tied head
/// parted from the exact path's greedy reply); with these sums the product is the weights
/// times the quantized inputs, as llama.cpp's Q8_0 x Q8_0 dot. Scalar code: a few hundred
/// values per product.
pub(super) fn quantize_x8(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (c, chunk) in x.chunks_exact(32).enumerate() {
        let amax = chunk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let dc = amax / 127.0;
        let inv = if dc > 0.0 { 1.0 / dc } else { 0.0 };
        let mut sum = 0i32;
        for (o, v) in q[c * 32..c * 32 + 32].iter_mut().zip(chunk) {
            *o = (v * inv).round() as i8;
            sum += *o as i32;
        }
        d[c] = dc;
        // |sum| <= 32 x 127: exact in f32.
        s[c] = dc * sum as f32;
    }
}

/// Whether [`rows_q8_int8_512`] takes `w`: 8-bit affine in groups of 32 with half-precision
/// scales and biases (GGUF's Q8_0 as MLX loads it, e.g. a tied head), at most
/// [`MAX_CHUNKS`] chunks a row.
pub(super) fn q8_int8_supports(w: &Matrix<'_>) -> bool {
    w.affine_parts().is_some_and(|p| {
        matches!(
            p,
            AffineParts {
                bits: 8,
                group: 32,
                scales: Floats::F16(_),
                biases: Floats::F16(_),
                ..
            }
        )
    }) && w.cols() % 32 == 0
        && w.cols() / 32 <= MAX_CHUNKS
}

/// Rows `r0..r1` of `out (m, rows) = x W^T + bias` for an 8-bit `w` that
/// [`q8_int8_supports`], `m <= WIDE_TILE`, from `x` quantized by [`quantize_x8`]: the unsigned weight
/// bytes times the signed input codes by `vpdpbusd`, 64 a instruction (two chunks: lanes 0-7
/// sum chunk `c`, 8-15 chunk `c + 1`), each half scaled in float by its group's scale times
/// the chunk's input scale; the biases multiply the inputs' float sums.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL with VNNI; `w` is as
/// [`q8_int8_supports`] requires; `qx` holds `m` quantized rows of `cols` values; rows
/// `r0..r1` of `out` are this caller's alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_q8_int8_512(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match m {
            1 => rows_q8_int8_512_m::<1>(w, r0, r1, qx, out, bias),
            2 => rows_q8_int8_512_m::<2>(w, r0, r1, qx, out, bias),
            3 => rows_q8_int8_512_m::<3>(w, r0, r1, qx, out, bias),
            4 => rows_q8_int8_512_m::<4>(w, r0, r1, qx, out, bias),
            5 => rows_q8_int8_512_m::<5>(w, r0, r1, qx, out, bias),
            _ => rows_q8_int8_512_m::<6>(w, r0, r1, qx, out, bias),
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)]
unsafe fn rows_q8_int8_512_m<const MT: usize>(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    // Affine or symmetric (`bh` then is the scales, each times -128 where read).
    let Some(AffineParts {
        words,
        scales: Floats::F16(sh),
        biases: Floats::F16(bh),
        bits: 8,
        group: 32,
        sym,
    }) = w.affine_parts()
    else {
        return;
    };
    let (rows, cols) = (w.rows(), w.cols());
    let chunks = cols / 32;
    let bytes = words.as_ptr() as *const u8;
    let bias_of = |r: usize| bias.map_or(0.0, |b| b.get(r));
    // SAFETY (whole body): rows r0..r1 lie within `words`, `sh` and `bh` (checked by
    // Matrix::affine, and the assert); qx holds MT * chunks codes, scales and sums; the
    // factor buffer holds MT * MAX_CHUNKS floats and chunks <= MAX_CHUNKS (the assert).
    unsafe {
        assert!(
            chunks <= MAX_CHUNKS && sh.len() >= r1 * chunks && bh.len() >= r1 * chunks,
            "rows_q8_int8_512: {chunks} chunks a row, scales out of range"
        );
        // Lanes 0-7: the pair's first chunk; 8-15: its second.
        let base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let pf = prefetch_rows(cols);
        let (scales, biases) = (Floats::F16(sh), Floats::F16(bh));
        for r in r0..r1 {
            let (s0, b0) = (
                sh.as_ptr().add(r * chunks) as *const u16,
                bh.as_ptr().add(r * chunks) as *const u16,
            );
            prefetch_affine_row(bytes, cols, scales, biases, chunks, r, pf, rows);
            // The bias term first, 16 chunks at a time; then per block of 16 chunks the
            // factors (scale times input scale) in a register per input, each pair's two
            // picked out by one permute (the same operations in the same order as through a
            // buffer of factors, whose narrow reloads stalled store forwarding).
            let mut a0 = [_mm512_setzero_ps(); MT];
            let mut c0 = 0;
            while c0 < chunks {
                let k = (chunks - c0).min(16);
                let mask: __mmask16 = if k == 16 { 0xffff } else { (1u16 << k) - 1 };
                let bv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, b0.add(c0) as *const _));
                let bv = if sym {
                    _mm512_mul_ps(bv, _mm512_set1_ps(-128.0))
                } else {
                    bv
                };
                for t in 0..MT {
                    let xs = _mm512_maskz_loadu_ps(mask, qx.s.add(t * chunks + c0));
                    a0[t] = _mm512_fmadd_ps(bv, xs, a0[t]);
                }
                c0 += 16;
            }
            let rb = bytes.add(r * cols);
            let mut a1 = [_mm512_setzero_ps(); MT];
            let mut tail = [_mm256_setzero_ps(); MT];
            let mut c0 = 0;
            while c0 < chunks {
                let k = (chunks - c0).min(16);
                let mask: __mmask16 = if k == 16 { 0xffff } else { (1u16 << k) - 1 };
                let sv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, s0.add(c0) as *const _));
                let mut f = [_mm512_setzero_ps(); MT];
                for t in 0..MT {
                    let dv = _mm512_maskz_loadu_ps(mask, qx.d.add(t * chunks + c0));
                    f[t] = _mm512_mul_ps(sv, dv);
                }
                let pair = |j: usize, acc: &mut [__m512; MT]| {
                    let c = c0 + j;
                    let wv = _mm512_loadu_si512(rb.add(c * 32) as *const _);
                    let idx = _mm512_add_epi32(base, _mm512_set1_epi32(j as i32));
                    for (t, a) in acc.iter_mut().enumerate() {
                        let xv = _mm512_loadu_si512(qx.q.add(t * cols + c * 32) as *const _);
                        let sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
                        let fv = _mm512_permutexvar_ps(idx, f[t]);
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), fv, *a);
                    }
                };
                // c0 is a multiple of 16: pairs at c % 4 == 0 go to a0.
                let mut j = 0;
                while j + 4 <= k {
                    pair(j, &mut a0);
                    pair(j + 2, &mut a1);
                    j += 4;
                }
                if j + 2 <= k {
                    pair(j, &mut a0);
                    j += 2;
                }
                if j < k {
                    let c = c0 + j;
                    let wv = _mm256_loadu_si256(rb.add(c * 32) as *const __m256i);
                    let idx = _mm512_set1_epi32(j as i32);
                    for (t, a) in tail.iter_mut().enumerate() {
                        let xv = _mm256_loadu_si256(qx.q.add(t * cols + c * 32) as *const __m256i);
                        let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wv, xv);
                        let fv = _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, f[t]));
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), fv, *a);
                    }
                }
                c0 += 16;
            }
            let b = bias_of(r);
            for t in 0..MT {
                let v = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) + hsum(tail[t]);
                out.write(t * rows + r, v + b);
            }
        }
    }
}

/// Quantizes `x` (`(m, cols)`, `cols` a multiple of 32) to int8 for [`rows_q4_int8_512`]
/// (llama.cpp's Q8_0 activations): per chunk of 32 values a scale `d = max|x| / 127` and the
/// codes `round(x / d)` (half to even), laid out in each row as [`permute_x16`] lays out its
/// int16 codes (a pair of chunks as `[c even, c + 1 even, c odd, c + 1 odd]`, 16 codes each;
/// an unpaired last chunk as `[even, odd]`), and `s` the chunk's float sum (what the rows'
/// biases multiply). Eight values at a time.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_x8p(
    x: &[f32],
    cols: usize,
    q: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
) {
    let chunks = x.len() / 32;
    let row_chunks = cols / 32;
    assert!(
        cols % 32 == 0
            && x.len() % cols.max(1) == 0
            && q.len() >= chunks * 32
            && d.len() >= chunks
            && s.len() >= chunks,
        "quantize_x8p buffers"
    );
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // SAFETY: chunk c reads x[32c..32c + 32] and writes 32 codes within its row's pair
    // (q[32 * (c - c % 2)..] up to 64 codes, or 32 for an unpaired last chunk), d[c], s[c],
    // all in bounds (checked above).
    unsafe {
        let mut codes = [0i8; 32];
        for c in 0..chunks {
            let p = x.as_ptr().add(c * 32);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let mx = _mm256_max_ps(
                _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
                _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
            );
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
            let amax = lanes.iter().fold(0f32, |a, &b| a.max(b));
            let dc = amax / 127.0;
            let inv = _mm256_set1_ps(if dc > 0.0 { 1.0 / dc } else { 0.0 });
            let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], inv));
            let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inv));
            let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], inv));
            let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inv));
            // packs works within 128-bit lanes: dwords come out as 0-3, 8-11, 16-19, 24-27,
            // 4-7, 12-15, 20-23, 28-31; the permute puts them back in order.
            let b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(codes.as_mut_ptr() as *mut __m256i, b);
            let (rc, row) = (c % row_chunks, c / row_chunks);
            let paired = rc + 1 < row_chunks || rc % 2 == 1;
            let base = q.as_mut_ptr().add(row * cols + (rc - rc % 2) * 32);
            let (e, o) = if !paired {
                (base, base.add(16))
            } else if rc % 2 == 0 {
                (base, base.add(32))
            } else {
                (base.add(16), base.add(48))
            };
            for j in 0..16 {
                *e.add(j) = codes[2 * j];
                *o.add(j) = codes[2 * j + 1];
            }
            *d.get_unchecked_mut(c) = dc;
            *s.get_unchecked_mut(c) = hsum(_mm256_add_ps(
                _mm256_add_ps(v[0], v[1]),
                _mm256_add_ps(v[2], v[3]),
            ));
        }
    }
}

/// Rows `r0..r1` of `out (m, rows) = x W^T + bias` for a 4-bit affine `w` whose group is 32
/// times a power of two (at most [`MAX_CHUNKS`] chunks a row), `m <= 4`, from `x` quantized
/// by [`quantize_x8p`]: per pair of chunks the 32 weight bytes split into low nibbles (even
/// positions) and high nibbles (odd) in one 512-bit vector, times the inputs' int8 codes by
/// one `vpdpbusd` (lanes 0-3 and 8-11 sum chunk `c`, 4-7 and 12-15 chunk `c + 1`), each
/// scaled in float by its group's scale times the chunk's input scale; the biases multiply
/// the inputs' float sums. A quarter of [`rows_int16_512`]'s multiplies and half its input
/// bytes.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL with VNNI; `w` is as
/// [`q4_int8_512_supports`] requires; `qx` holds `m` rows of `cols` codes from
/// [`quantize_x8p`]; rows `r0..r1` of `out` are this caller's alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_q4_int8_512(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match m {
            1 => rows_q4_int8_512_m::<1>(w, r0, r1, qx, out, bias),
            2 => rows_q4_int8_512_m::<2>(w, r0, r1, qx, out, bias),
            3 => rows_q4_int8_512_m::<3>(w, r0, r1, qx, out, bias),
            _ => rows_q4_int8_512_m::<4>(w, r0, r1, qx, out, bias),
        }
    }
}

/// Whether [`rows_q4_int8_512`] takes `w`: 4-bit affine, groups of 32 times a power of two,
/// at most [`MAX_CHUNKS`] chunks and [`MAX_GROUPS`] groups a row.
pub(super) fn q4_int8_512_supports(w: &Matrix<'_>) -> bool {
    w.affine_parts()
        .is_some_and(|p| p.bits == 4 && (p.group / 32).is_power_of_two())
        && w.cols() % 32 == 0
        && w.cols() / 32 <= MAX_CHUNKS
        && supports(w)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)]
unsafe fn rows_q4_int8_512_m<const MT: usize>(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let Some(g4) = Q4::of(w) else {
        return;
    };
    let Q4 {
        scales,
        biases,
        sym,
        rows,
        groups,
        chunks,
        shift,
        row_bytes,
        bytes,
        ..
    } = g4;
    let bias_of = |r: usize| bias.map_or(0.0, |b| b.get(r));
    // SAFETY (whole body): rows r0..r1 lie within `words`, `scales` and `biases` (checked by
    // Matrix::affine, and the assert for the half-scale path); qx holds MT * chunks codes,
    // scales and sums; the stack buffers hold groups <= MAX_GROUPS (+ padding) values and
    // MT * chunks <= 4 * MAX_CHUNKS factors (the assert).
    unsafe {
        assert!(
            chunks <= MAX_CHUNKS && groups <= MAX_GROUPS,
            "rows_q4_int8_512: {chunks} chunks a row"
        );
        let mut sw = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
        let mut bw = std::mem::MaybeUninit::<[f32; MAX_GROUPS + 8]>::uninit();
        let mut gs = std::mem::MaybeUninit::<[f32; 4 * (MAX_GROUPS + 8)]>::uninit();
        let mut fw = std::mem::MaybeUninit::<[f32; 4 * MAX_CHUNKS]>::uninit();
        let (sp, bp) = (sw.as_mut_ptr() as *mut f32, bw.as_mut_ptr() as *mut f32);
        let gsp = gs.as_mut_ptr() as *mut f32;
        let fp = fw.as_mut_ptr() as *mut f32;
        let gpad = groups.div_ceil(8) * 8;
        if let (0, Floats::F16(sh), Floats::F16(bh)) = (shift, scales, biases) {
            // Groups of 32 with half-precision scales and biases (GGUF's Q4_0/Q4_1 as
            // loaded): the factors stay in registers, 16 chunks at a time.
            assert!(
                sh.len() >= r1 * groups && bh.len() >= r1 * groups,
                "scales out of range"
            );
            let pf = prefetch_rows(row_bytes);
            for r in r0..r1 {
                prefetch_affine_row(bytes, row_bytes, scales, biases, groups, r, pf, rows);
                let v = row_q4_int8_512_h::<MT>(
                    bytes.add(r * row_bytes),
                    sh.as_ptr().add(r * groups) as *const u16,
                    bh.as_ptr().add(r * groups) as *const u16,
                    sym,
                    chunks,
                    qx,
                );
                let b = bias_of(r);
                for t in 0..MT {
                    out.write(t * rows + r, v[t] + b);
                }
            }
            return;
        }
        group_sums(qx.s, MT, chunks, 1 << shift, groups, gpad, gsp);
        let pf = prefetch_rows(row_bytes);
        for r in r0..r1 {
            prefetch_affine_row(bytes, row_bytes, scales, biases, groups, r, pf, rows);
            widen_row(scales, r * groups, sp, groups);
            widen_biases(&g4.parts, r * groups, bp, groups);
            for g in groups..gpad {
                *bp.add(g) = 0.0;
            }
            for t in 0..MT {
                let d = qx.d.add(t * chunks);
                let f = fp.add(t * chunks);
                for c in 0..chunks {
                    *f.add(c) = *sp.add(c >> shift) * *d.add(c);
                }
            }
            let v = dot4_512_i8::<MT>(
                bytes.add(r * row_bytes),
                chunks,
                qx.q,
                fp,
                [_mm512_setzero_ps(); MT],
            );
            let b = bias_of(r);
            for t in 0..MT {
                let mut bv = _mm256_setzero_ps();
                let mut g = 0;
                while g < gpad {
                    bv = _mm256_fmadd_ps(
                        _mm256_loadu_ps(bp.add(g)),
                        _mm256_loadu_ps(gsp.add(t * gpad + g)),
                        bv,
                    );
                    g += 8;
                }
                out.write(t * rows + r, v[t] + hsum(bv) + b);
            }
        }
    }
}

/// One row of [`rows_q4_int8_512_m`] with groups of 32 and half-precision scales and biases
/// (`s0`, `b0`: the row's `chunks` of each): per block of 16 chunks the factors (scale times
/// input scale) in one register per input and the bias term (bias times the input's float
/// sum) added; then per pair of chunks in the block the 32 weight bytes as low nibbles (lower
/// half) and high nibbles (upper half), one `vpdpbusd` with the inputs' codes in
/// [`quantize_x8p`]'s order, the pair's two factors picked out of the register by one
/// permute. Pairs alternate between two accumulators; an unpaired last chunk is summed in 256
/// bits. Each input's sum is computed alike whatever `MT` is.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `rb` holds `chunks * 16` bytes, `s0` and `b0`
/// `chunks` halves each (with `sym`, `b0` is the scales and each bias is -8 times its
/// value); `qx` holds `MT` rows of `chunks * 32` codes, scales and sums.
#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row_q4_int8_512_h<const MT: usize>(
    rb: *const u8,
    s0: *const u16,
    b0: *const u16,
    sym: bool,
    chunks: usize,
    qx: QuantX,
) -> [f32; MT] {
    // SAFETY (whole body): reads stay within the ranges of the contract (masked loads past a
    // row's last chunk read nothing).
    unsafe {
        let nib = _mm512_set1_epi8(0x0f);
        // Lanes 0-3 and 8-11: the pair's first chunk; 4-7 and 12-15: its second.
        let base = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
        let mut a0 = [_mm512_setzero_ps(); MT];
        let mut a1 = [_mm512_setzero_ps(); MT];
        let mut tail = [_mm256_setzero_ps(); MT];
        let mut c0 = 0;
        while c0 < chunks {
            let k = (chunks - c0).min(16);
            let mask: __mmask16 = if k == 16 { 0xffff } else { (1u16 << k) - 1 };
            let sv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, s0.add(c0) as *const _));
            let bv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, b0.add(c0) as *const _));
            // A symmetric matrix's biases (`b0`: its scales) times -8, exact.
            let bv = if sym {
                _mm512_mul_ps(bv, _mm512_set1_ps(-8.0))
            } else {
                bv
            };
            let mut f = [_mm512_setzero_ps(); MT];
            for t in 0..MT {
                let dv = _mm512_maskz_loadu_ps(mask, qx.d.add(t * chunks + c0));
                f[t] = _mm512_mul_ps(sv, dv);
                let xs = _mm512_maskz_loadu_ps(mask, qx.s.add(t * chunks + c0));
                a0[t] = _mm512_fmadd_ps(bv, xs, a0[t]);
            }
            let pair = |j: usize, acc: &mut [__m512; MT]| {
                let c = c0 + j;
                let wv = _mm256_loadu_si256(rb.add(c * 16) as *const __m256i);
                let w2 =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(wv), _mm256_srli_epi16::<4>(wv));
                let wq = _mm512_and_si512(w2, nib);
                let idx = _mm512_add_epi32(base, _mm512_set1_epi32(j as i32));
                for (t, a) in acc.iter_mut().enumerate() {
                    let xv = _mm512_loadu_si512(qx.q.add((t * chunks + c) * 32) as *const _);
                    let sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xv);
                    let fv = _mm512_permutexvar_ps(idx, f[t]);
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), fv, *a);
                }
            };
            let mut j = 0;
            while j + 4 <= k {
                pair(j, &mut a0);
                pair(j + 2, &mut a1);
                j += 4;
            }
            if j + 2 <= k {
                pair(j, &mut a0);
                j += 2;
            }
            if j < k {
                // The row's unpaired last chunk.
                let c = c0 + j;
                let wv = _mm_loadu_si128(rb.add(c * 16) as *const __m128i);
                let w2 = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(wv),
                    _mm_srli_epi16::<4>(wv),
                );
                let wq = _mm256_and_si256(w2, _mm256_set1_epi8(0x0f));
                let idx = _mm512_set1_epi32(j as i32);
                for (t, a) in tail.iter_mut().enumerate() {
                    let xv = _mm256_loadu_si256(qx.q.add((t * chunks + c) * 32) as *const __m256i);
                    let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xv);
                    let fv = _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, f[t]));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), fv, *a);
                }
            }
            c0 += 16;
        }
        let mut out = [0f32; MT];
        for t in 0..MT {
            out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) + hsum(tail[t]);
        }
        out
    }
}

/// The main loop of [`rows_q4_int8_512_m`] over one row (`chunks` chunks of 16 bytes at
/// `rb`): two chunks at a time, their 32 bytes as low nibbles (lower half) and high nibbles
/// (upper half) of one vector, one `vpdpbusd` with the inputs' codes in [`quantize_x8p`]'s
/// order, each chunk's lanes scaled by its factor `fp[t * chunks + c]`. Pairs alternate
/// between `acc` and a second accumulator; an unpaired last chunk is summed in 256 bits.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `rb` holds `chunks * 16` bytes; `qp` holds `MT`
/// rows of `chunks * 32` codes in [`quantize_x8p`]'s order and `fp` `MT * chunks` factors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot4_512_i8<const MT: usize>(
    rb: *const u8,
    chunks: usize,
    qp: *const i8,
    fp: *const f32,
    acc: [__m512; MT],
) -> [f32; MT] {
    // SAFETY (whole body): reads stay within the ranges of the contract.
    unsafe {
        let nib = _mm512_set1_epi8(0x0f);
        // Lanes 0-3 and 8-11: the pair's first factor; 4-7 and 12-15: its second.
        let idx = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
        let mut a0 = acc;
        let mut a1 = [_mm512_setzero_ps(); MT];
        let pair = |c: usize, acc: &mut [__m512; MT]| {
            let wv = _mm256_loadu_si256(rb.add(c * 16) as *const __m256i);
            let w2 =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(wv), _mm256_srli_epi16::<4>(wv));
            let wq = _mm512_and_si512(w2, nib);
            for (t, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_si512(qp.add(t * chunks * 32 + c * 32) as *const _);
                let sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xv);
                let two = (fp.add(t * chunks + c) as *const f64).read_unaligned();
                let f = _mm512_permutexvar_ps(idx, _mm512_castpd_ps(_mm512_set1_pd(two)));
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), f, *a);
            }
        };
        let mut c = 0;
        while c + 4 <= chunks {
            pair(c, &mut a0);
            pair(c + 2, &mut a1);
            c += 4;
        }
        if c + 2 <= chunks {
            pair(c, &mut a0);
            c += 2;
        }
        let mut tail = [_mm256_setzero_ps(); MT];
        if c < chunks {
            let wv = _mm_loadu_si128(rb.add(c * 16) as *const __m128i);
            let w2 =
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(wv), _mm_srli_epi16::<4>(wv));
            let wq = _mm256_and_si256(w2, _mm256_set1_epi8(0x0f));
            for (t, a) in tail.iter_mut().enumerate() {
                let xv = _mm256_loadu_si256(qp.add(t * chunks * 32 + c * 32) as *const __m256i);
                let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xv);
                let f = _mm256_set1_ps(*fp.add(t * chunks + c));
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), f, *a);
            }
        }
        let mut out = [0f32; MT];
        for t in 0..MT {
            out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) + hsum(tail[t]);
        }
        out
    }
}

/// Chunks of 32 per row the 512-bit kernel takes (wider rows: the AVX2 one).
pub(super) const MAX_CHUNKS: usize = 1024;

/// Input rows the AVX-512 kernels ([`rows_int16_512`], [`rows_q8_int8_512`]) take in one
/// pass over each weight row (the AVX2 ones take 4): a speculative verification of up to
/// six rows reads and unpacks every weight block once (eight spill registers and cost more
/// than six plus two; `examples/cpu_rows.rs`). Each row's sums do not depend on how many
/// come with it.
pub(super) const WIDE_TILE: usize = 6;

/// `MT` inputs times four weight rows (widened into `w`), 8 columns at a time: 4 * MT
/// accumulators (AVX-512 VL's 32 vector registers hold them with the operands), so each
/// input vector loaded serves four rows and each weight vector `MT` inputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn tile4<const MT: usize>(w: [*const f32; 4], x: *const f32, cols: usize) -> [[f32; 4]; MT] {
    // SAFETY: each w[i] holds cols floats, x holds MT rows of cols; cols % 8 == 0.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 4]; MT];
        let mut c = 0;
        while c < cols {
            let wv = [
                _mm256_loadu_ps(w[0].add(c)),
                _mm256_loadu_ps(w[1].add(c)),
                _mm256_loadu_ps(w[2].add(c)),
                _mm256_loadu_ps(w[3].add(c)),
            ];
            for (t, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add(t * cols + c));
                for (r, ar) in a.iter_mut().enumerate() {
                    *ar = _mm256_fmadd_ps(wv[r], xv, *ar);
                }
            }
            c += 8;
        }
        let mut out = [[0f32; 4]; MT];
        for t in 0..MT {
            for r in 0..4 {
                out[t][r] = hsum(acc[t][r]);
            }
        }
        out
    }
}

/// Rows `r0..r1` of `out (m, rows) = x W^T + bias` for a block of inputs (prefill): four
/// weight rows at a time widened (dequantized) into stack buffers, then [`tile4`] over the
/// inputs in tiles of four; leftover rows go through [`rows_avx2`]. Takes dense weights and
/// 4/8-bit affine ones whose group is 32 times a power of two, `cols <= MAX_BUF`.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/VL; `w` passes [`prefill_512_supports`]; `x`
/// is `(m, cols)`; rows `r0..r1` of `out` are this caller's alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_prefill_512(
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
    let r4 = r0 + (r1 - r0) / 4 * 4;
    // SAFETY (whole body): rows r0..r4 lie within the matrix (checked by its constructor);
    // the buffers hold 4 * MAX_BUF >= 4 * cols floats; x is (m, cols).
    unsafe {
        let mut buf = std::mem::MaybeUninit::<[f32; 4 * MAX_BUF]>::uninit();
        let bp = buf.as_mut_ptr() as *mut f32;
        let mut s = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
        let mut b = std::mem::MaybeUninit::<[f32; MAX_GROUPS]>::uninit();
        let (sp, bq) = (s.as_mut_ptr() as *mut f32, b.as_mut_ptr() as *mut f32);
        let mut r = r0;
        while r < r4 {
            let mut wp = [std::ptr::null::<f32>(); 4];
            for (i, p) in wp.iter_mut().enumerate() {
                let dst = bp.add(i * MAX_BUF);
                let row = r + i;
                match w.kind {
                    // Never here (`prefill_512_supports` refuses trellis matrices).
                    Kind::Trellis(_) | Kind::Ggml { .. } => return,
                    Kind::Dense(Floats::F32(d)) => *p = d.as_ptr().add(row * cols),
                    Kind::Dense(Floats::F16(d)) => {
                        dequant_into(&F16Row(d.as_ptr().add(row * cols) as *const u16), cols, dst);
                        *p = dst;
                    }
                    Kind::Dense(Floats::Bf16(d)) => {
                        dequant_into(
                            &Bf16Row(d.as_ptr().add(row * cols) as *const u16),
                            cols,
                            dst,
                        );
                        *p = dst;
                    }
                    Kind::Affine { .. } | Kind::Symmetric { .. } => {
                        let Some(parts) = w.affine_parts() else {
                            return;
                        };
                        let AffineParts {
                            words,
                            scales,
                            bits,
                            group,
                            ..
                        } = parts;
                        let groups = cols / group;
                        let shift = (group / 32).trailing_zeros();
                        widen_row(scales, row * groups, sp, groups);
                        widen_biases(&parts, row * groups, bq, groups);
                        let rb = (words.as_ptr() as *const u8).add(row * cols * bits as usize / 8);
                        let (s, b) = (sp as *const f32, bq as *const f32);
                        if bits == 4 {
                            dequant_into(
                                &Q4Row {
                                    bytes: rb,
                                    s,
                                    b,
                                    shift,
                                },
                                cols,
                                dst,
                            );
                        } else {
                            dequant_into(
                                &Q8Row {
                                    bytes: rb,
                                    s,
                                    b,
                                    shift,
                                },
                                cols,
                                dst,
                            );
                        }
                        *p = dst;
                    }
                }
            }
            let bias4 = [bias_of(r), bias_of(r + 1), bias_of(r + 2), bias_of(r + 3)];
            let mut t0 = 0;
            while t0 < m {
                let xp = x.as_ptr().add(t0 * cols);
                let mt = (m - t0).min(4);
                let put = |t: usize, v: [f32; 4]| {
                    for (i, v) in v.into_iter().enumerate() {
                        out.write((t0 + t) * rows + r + i, v + bias4[i]);
                    }
                };
                match mt {
                    1 => tile4::<1>(wp, xp, cols)
                        .into_iter()
                        .enumerate()
                        .for_each(|(t, v)| put(t, v)),
                    2 => tile4::<2>(wp, xp, cols)
                        .into_iter()
                        .enumerate()
                        .for_each(|(t, v)| put(t, v)),
                    3 => tile4::<3>(wp, xp, cols)
                        .into_iter()
                        .enumerate()
                        .for_each(|(t, v)| put(t, v)),
                    _ => tile4::<4>(wp, xp, cols)
                        .into_iter()
                        .enumerate()
                        .for_each(|(t, v)| put(t, v)),
                }
                t0 += mt;
            }
            r += 4;
        }
        if r4 < r1 {
            rows_avx2(w, r4, r1, x, m, out, bias);
        }
    }
}

/// Whether [`rows_prefill_512`] takes `w`.
pub(super) fn prefill_512_supports(w: &Matrix<'_>) -> bool {
    w.cols() % 32 == 0
        && w.cols() <= MAX_BUF
        && match w.kind {
            Kind::Dense(_) => true,
            Kind::Affine { bits, group, .. } | Kind::Symmetric { bits, group, .. } => {
                matches!(bits, 4 | 8)
                    && (group / 32).is_power_of_two()
                    && w.cols() / group <= MAX_GROUPS
            }
            Kind::Trellis(_) | Kind::Ggml { .. } => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grouped attention kernel (each key and value loaded once for the group's heads)
    /// gives every head the bits of the one-head-at-a-time kernel: 1-4 heads, f32 and f16
    /// caches, head sizes with and without an 8-value tail, parts shorter than, equal to and
    /// longer than a block (tier: bit-identical).
    #[test]
    fn grouped_attention_is_the_per_head_kernel_bit_for_bit() {
        if !super::super::Isa::Avx2.available() {
            return;
        }
        let mut seed = 9u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
                })
                .collect()
        };
        for &hd in &[24usize, 64, 256] {
            for g in 1..=4usize {
                for &n in &[1usize, 63, 64, 130] {
                    let q = rnd(g * hd);
                    let k = rnd(n * hd);
                    let v = rnd(n * hd);
                    let kh: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
                    let vh: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
                    let len = g * part_stride(hd);
                    let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
                    let (mut c, mut d) = (vec![0f32; len], vec![0f32; len]);
                    // SAFETY: AVX2 checked above; the buffers hold what the kernels read and
                    // write.
                    unsafe {
                        let (qp, s) = (q.as_ptr(), 0.125);
                        attend_part(qp, g, k.as_ptr(), v.as_ptr(), hd, n, s, a.as_mut_ptr());
                        attend_part_each(qp, g, k.as_ptr(), v.as_ptr(), hd, n, s, b.as_mut_ptr());
                        attend_part(qp, g, kh.as_ptr(), vh.as_ptr(), hd, n, s, c.as_mut_ptr());
                        attend_part_each(qp, g, kh.as_ptr(), vh.as_ptr(), hd, n, s, d.as_mut_ptr());
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "f32, hd {hd}, {g} heads, {n} positions");
                    assert_eq!(bits(&c), bits(&d), "f16, hd {hd}, {g} heads, {n} positions");
                }
            }
        }
    }

    /// The SIMD quantizer gives the scalar one's scales, its codes up to ties rounded the
    /// other way (at most 1 apart), and its sums up to float summation order.
    #[test]
    fn quantize_x16_matches_the_scalar_quantizer() {
        if !super::super::Isa::Avx2.available() {
            return;
        }
        let mut seed = 5u64;
        let x: Vec<f32> = (0..256)
            .map(|i| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                let v = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
                if i % 37 == 0 {
                    0.0
                } else {
                    v
                }
            })
            .chain(std::iter::repeat_n(0.0, 32))
            .collect();
        let n = x.len();
        let (mut q1, mut d1, mut s1) = (vec![0i16; n], vec![0f32; n / 32], vec![0f32; n / 32]);
        let (mut q2, mut d2, mut s2) = (vec![0i16; n], vec![0f32; n / 32], vec![0f32; n / 32]);
        quantize_x16_scalar(&x, &mut q1, &mut d1, &mut s1);
        // SAFETY: AVX2 checked above.
        unsafe { quantize_x16(&x, &mut q2, &mut d2, &mut s2) };
        assert_eq!(d1, d2);
        for (i, (a, b)) in q1.iter().zip(&q2).enumerate() {
            assert!((*a as i32 - *b as i32).abs() <= 1, "code {i}: {a} vs {b}");
        }
        for (a, b) in s1.iter().zip(&s2) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "sum {a} vs {b}");
        }
        assert_eq!(q2[n - 32..], [0i16; 32]);
    }

    /// The pair-order int8 quantizer puts each chunk's codes (half to even) where the 4-bit
    /// int8 kernel reads them: pairs of chunks as `[c even, c + 1 even, c odd, c + 1 odd]`,
    /// an unpaired last chunk of a row as `[even, odd]`; scales `amax / 127`, float sums.
    #[test]
    fn quantize_x8p_lays_codes_out_in_pair_order() {
        if !super::super::Isa::Avx2.available() {
            return;
        }
        // Two rows of 96 columns (3 chunks: a pair and an unpaired last one).
        let cols = 96;
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let n = x.len();
        let (mut q, mut d, mut s) = (vec![0i8; n], vec![0f32; n / 32], vec![0f32; n / 32]);
        // SAFETY: AVX2 checked above.
        unsafe { quantize_x8p(&x, cols, &mut q, &mut d, &mut s) };
        for (c, chunk) in x.chunks_exact(32).enumerate() {
            let amax = chunk.iter().fold(0f32, |a, v| a.max(v.abs()));
            assert_eq!(d[c], amax / 127.0);
            let inv = 1.0 / d[c];
            let code = |k: usize| (chunk[k] * inv).round_ties_even() as i8;
            let (row, rc) = (c / 3, c % 3);
            let at = |off: usize| q[row * cols + off];
            for j in 0..16 {
                let (e, o) = match rc {
                    0 => (j, 32 + j),
                    1 => (16 + j, 48 + j),
                    _ => (64 + j, 80 + j),
                };
                assert_eq!(at(e), code(2 * j), "chunk {c} even {j}");
                assert_eq!(at(o), code(2 * j + 1), "chunk {c} odd {j}");
            }
            let sum: f32 = chunk.iter().sum();
            assert!((s[c] - sum).abs() <= 1e-4 * (1.0 + sum.abs()));
        }
    }

    /// The half-scale 4-bit int16 row with its factors in registers ([`dot4_512_h`]) gives
    /// the buffered version's bits ([`dot4_512`] over a factor buffer, the bias term as its
    /// starting sum), for one to four inputs and even and odd chunk counts past 16.
    #[test]
    fn dot4_512_h_is_the_buffered_kernel_bit_for_bit() {
        if !super::super::Isa::Avx512.available() {
            return;
        }
        let mut seed = 9u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for chunks in [18usize, 19, 35, 48] {
            let cols = chunks * 32;
            let bytes: Vec<u8> = (0..chunks * 16).map(|_| next() as u8).collect();
            let sc: Vec<u16> = (0..chunks)
                .map(|_| half::f16::from_f32((next() % 1000) as f32 / 7e4).to_bits())
                .collect();
            let bi: Vec<u16> = (0..chunks)
                .map(|_| half::f16::from_f32((next() % 1000) as f32 / -3e4).to_bits())
                .collect();
            let x: Vec<f32> = (0..4 * cols)
                .map(|_| (next() % 20001) as f32 / 1e4 - 1.0)
                .collect();
            let (mut q, mut d, mut sm) = (
                vec![0i16; 4 * cols],
                vec![0f32; 4 * chunks],
                vec![0f32; 4 * chunks],
            );
            let mut p = vec![0i16; 4 * cols];
            // SAFETY: AVX-512 (and so AVX2) checked above; the buffers have the sizes the
            // kernels read.
            unsafe {
                quantize_x16(&x, &mut q, &mut d, &mut sm);
                permute_x16(&q, cols, &mut p);
                let qx = QuantX16 {
                    q: q.as_ptr(),
                    p: p.as_ptr(),
                    d: d.as_ptr(),
                    s: sm.as_ptr(),
                    h: std::ptr::null(),
                    hs: 0,
                };
                macro_rules! check {
                    ($mt:literal) => {{
                        let mut fp = vec![0f32; $mt * chunks];
                        let mut bacc = [_mm512_setzero_ps(); $mt];
                        let mut c0 = 0;
                        while c0 < chunks {
                            let k = (chunks - c0).min(16);
                            let mask: __mmask16 = if k == 16 { 0xffff } else { (1u16 << k) - 1 };
                            let sv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                mask,
                                sc.as_ptr().add(c0) as *const _,
                            ));
                            let bv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                mask,
                                bi.as_ptr().add(c0) as *const _,
                            ));
                            for t in 0..$mt {
                                let dv =
                                    _mm512_maskz_loadu_ps(mask, d.as_ptr().add(t * chunks + c0));
                                _mm512_mask_storeu_ps(
                                    fp.as_mut_ptr().add(t * chunks + c0),
                                    mask,
                                    _mm512_mul_ps(sv, dv),
                                );
                                let xs =
                                    _mm512_maskz_loadu_ps(mask, sm.as_ptr().add(t * chunks + c0));
                                bacc[t] = _mm512_fmadd_ps(bv, xs, bacc[t]);
                            }
                            c0 += 16;
                        }
                        let old =
                            dot4_512::<$mt>(bytes.as_ptr(), chunks, p.as_ptr(), fp.as_ptr(), bacc);
                        let new =
                            dot4_512_h::<$mt>(bytes.as_ptr(), sc.as_ptr(), bi.as_ptr(), chunks, qx);
                        for t in 0..$mt {
                            assert_eq!(
                                old[t].to_bits(),
                                new[t].to_bits(),
                                "chunks {chunks} MT {} input {t}",
                                $mt
                            );
                        }
                    }};
                }
                check!(1);
                check!(2);
                check!(3);
                check!(4);
            }
        }
    }

    /// [`dot4_512_g`] and [`dot4_512_s`] (over [`split_x16`]'s bytes) over groups of 32 to 256
    /// with float16, bfloat16 and float32 scales against a float64 sum of the same terms (each chunk's integer dot product times its
    /// group scale times the input scale, plus the group bias times the input's float sum):
    /// within 1e-6 of the terms' magnitude (tier L3: summation order); and with float16
    /// scales in groups of 32 it is [`dot4_512_h`] bit for bit.
    #[test]
    fn dot4_512_g_matches_a_float64_sum() {
        if !super::super::Isa::Avx512.available() {
            return;
        }
        let mut seed = 21u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for (chunks, shift) in [(18usize, 0u32), (18, 1), (36, 2), (48, 3), (30, 1), (64, 2)] {
            let cols = chunks * 32;
            let groups = chunks >> shift;
            let bytes: Vec<u8> = (0..chunks * 16).map(|_| next() as u8).collect();
            let sf: Vec<f32> = (0..groups)
                .map(|_| half::f16::from_f32((next() % 1000) as f32 / 7e4).to_f32())
                .collect();
            let bf: Vec<f32> = (0..groups)
                .map(|_| half::f16::from_f32((next() % 1000) as f32 / -3e4).to_f32())
                .collect();
            let x: Vec<f32> = (0..4 * cols)
                .map(|_| (next() % 20001) as f32 / 1e4 - 1.0)
                .collect();
            let (mut q, mut d, mut sm) = (
                vec![0i16; 4 * cols],
                vec![0f32; 4 * chunks],
                vec![0f32; 4 * chunks],
            );
            let mut p = vec![0i16; 4 * cols];
            let sh: Vec<u16> = sf
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let bh: Vec<u16> = bf
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let sb: Vec<u16> = sf
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let bb: Vec<u16> = bf
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let sbf: Vec<f32> = sb
                .iter()
                .map(|&v| half::bf16::from_bits(v).to_f32())
                .collect();
            let bbf: Vec<f32> = bb
                .iter()
                .map(|&v| half::bf16::from_bits(v).to_f32())
                .collect();
            // SAFETY: AVX-512 (and so AVX2) checked above; the buffers have the sizes the
            // kernels read.
            unsafe {
                quantize_x16(&x, &mut q, &mut d, &mut sm);
                permute_x16(&q, cols, &mut p);
                let qx = QuantX16 {
                    q: q.as_ptr(),
                    p: p.as_ptr(),
                    d: d.as_ptr(),
                    s: sm.as_ptr(),
                    h: std::ptr::null(),
                    hs: 0,
                };
                let hs = split_stride(cols);
                let mut hb = vec![0u8; 4 * hs];
                split_x16(&q, cols, &mut hb);
                let qs = QuantX16 {
                    h: hb.as_ptr(),
                    hs,
                    ..qx
                };
                // The float64 sum of row input `t` with scales `s` and biases `b`, and the sum
                // of its terms' magnitudes.
                let reference = |t: usize, s: &[f32], b: &[f32]| -> (f64, f64) {
                    let (mut v, mut mag) = (0f64, 0f64);
                    for c in 0..chunks {
                        let mut dot = 0i64;
                        for j in 0..32 {
                            let byte = bytes[c * 16 + j / 2];
                            let w = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                            dot += w as i64 * q[t * cols + c * 32 + j] as i64;
                        }
                        let g = c >> shift;
                        let a = dot as f64 * s[g] as f64 * d[t * chunks + c] as f64;
                        let bt = b[g] as f64 * sm[t * chunks + c] as f64;
                        v += a + bt;
                        mag += a.abs() + bt.abs();
                    }
                    (v, mag)
                };
                macro_rules! check {
                    ($mt:literal) => {{
                        let runs: [([f32; $mt], &[f32], &[f32], &str); 6] = [
                            (
                                dot4_512_s::<$mt, SCALES_F16>(
                                    bytes.as_ptr(),
                                    sh.as_ptr() as *const u8,
                                    bh.as_ptr() as *const u8,
                                    chunks,
                                    shift,
                                    qs,
                                ),
                                &sf,
                                &bf,
                                "split f16",
                            ),
                            (
                                dot4_512_s::<$mt, SCALES_BF16>(
                                    bytes.as_ptr(),
                                    sb.as_ptr() as *const u8,
                                    bb.as_ptr() as *const u8,
                                    chunks,
                                    shift,
                                    qs,
                                ),
                                &sbf,
                                &bbf,
                                "split bf16",
                            ),
                            (
                                dot4_512_s::<$mt, SCALES_F32>(
                                    bytes.as_ptr(),
                                    sf.as_ptr() as *const u8,
                                    bf.as_ptr() as *const u8,
                                    chunks,
                                    shift,
                                    qs,
                                ),
                                &sf,
                                &bf,
                                "split f32",
                            ),
                            (
                                dot4_512_g::<$mt, SCALES_F16>(
                                    bytes.as_ptr(),
                                    sh.as_ptr() as *const u8,
                                    bh.as_ptr() as *const u8,
                                    chunks,
                                    shift,
                                    qx,
                                ),
                                &sf,
                                &bf,
                                "f16",
                            ),
                            (
                                dot4_512_g::<$mt, SCALES_BF16>(
                                    bytes.as_ptr(),
                                    sb.as_ptr() as *const u8,
                                    bb.as_ptr() as *const u8,
                                    chunks,
                                    shift,
                                    qx,
                                ),
                                &sbf,
                                &bbf,
                                "bf16",
                            ),
                            (
                                dot4_512_g::<$mt, SCALES_F32>(
                                    bytes.as_ptr(),
                                    sf.as_ptr() as *const u8,
                                    bf.as_ptr() as *const u8,
                                    chunks,
                                    shift,
                                    qx,
                                ),
                                &sf,
                                &bf,
                                "f32",
                            ),
                        ];
                        for (got, s, b, what) in runs {
                            for t in 0..$mt {
                                let (want, mag) = reference(t, s, b);
                                assert!(
                                    (got[t] as f64 - want).abs() <= 1e-6 * mag,
                                    "{what} chunks {chunks} shift {shift} MT {} input {t}: \
                                     {} vs {want}",
                                    $mt,
                                    got[t]
                                );
                            }
                        }
                        if shift == 0 {
                            let h = dot4_512_h::<$mt>(
                                bytes.as_ptr(),
                                sh.as_ptr(),
                                bh.as_ptr(),
                                chunks,
                                qx,
                            );
                            let g = dot4_512_g::<$mt, SCALES_F16>(
                                bytes.as_ptr(),
                                sh.as_ptr() as *const u8,
                                bh.as_ptr() as *const u8,
                                chunks,
                                0,
                                qx,
                            );
                            for t in 0..$mt {
                                assert_eq!(h[t].to_bits(), g[t].to_bits());
                            }
                        }
                    }};
                }
                check!(1);
                check!(2);
                check!(4);
            }
        }
    }

    /// [`split_x16`]'s 512-bit version writes the portable version's bytes, and the bytes
    /// put each code back together (`256 * hi + lo`), padding zero.
    #[test]
    fn split_x16_bytes() {
        if !super::super::Isa::Avx512.available() {
            return;
        }
        for cols in [32usize, 64, 96, 576, 960] {
            let q: Vec<i16> = (0..2 * cols)
                .map(|i| ((i as i64 * 7919 + 13) % 65535 - 32767) as i16)
                .collect();
            let hs = split_stride(cols);
            let (mut a, mut b) = (vec![7u8; 2 * hs], vec![9u8; 2 * hs]);
            split_x16_scalar(&q, cols, &mut a);
            // SAFETY: AVX-512 checked above.
            unsafe { split_x16_512(&q, cols, &mut b) };
            assert_eq!(a, b, "cols {cols}");
            for r in 0..2 {
                for i in 0..cols {
                    let (c, j) = (i / 32, i % 32);
                    let at =
                        r * hs + c / 4 * 256 + c % 4 * 16 + j / 2 + if j % 2 == 1 { 64 } else { 0 };
                    let v = 256 * (a[at] as i8 as i32) + a[at + 128] as i32;
                    assert_eq!(v, q[r * cols + i] as i32, "cols {cols} row {r} code {i}");
                }
                let used = (cols / 32) / 4 * 256 + (cols / 32) % 4 * 16;
                if (cols / 32) % 4 != 0 {
                    for part in 0..4 {
                        let from =
                            r * hs + used - (cols / 32) % 4 * 16 + part * 64 + (cols / 32) % 4 * 16;
                        let to = r * hs + used - (cols / 32) % 4 * 16 + part * 64 + 64;
                        assert!(a[from..to].iter().all(|&v| v == 0), "padding");
                    }
                }
            }
        }
    }
}
