//! The AVX2 kernels of [`super::kquant`]: each 32-value chunk of a GGML row unpacked into 32
//! bytes of codes in registers, then per input `maddubs` (unsigned codes times the int8
//! inputs; signed codes through the sign trick, `|w| * sign(x, w)`), `madd` with the chunk's
//! integer scales (one per 16 values: Q6_K; else 1), one float multiply-add with the chunk's
//! factor times the input's scale, and the minimums (`b * sum(x)`) in a float on the side.
//! Every function requires AVX2, FMA and F16C: callers check [`super::Isa::has_avx2`].

use std::arch::x86_64::*;

use super::kquant::GgmlType;
use super::matmul::Floats;
use super::x86::{hsum, prefetch, prefetch_rows};
use super::SharedOut;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn h2f(p: *const u8) -> f32 {
    // SAFETY: the caller keeps p within its row (two bytes).
    unsafe {
        let h = std::ptr::read_unaligned(p as *const u16);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }
}

/// 16 packed bytes' low nibbles (values 0..16) then high nibbles (16..32), as GGML's legacy
/// blocks order them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    // SAFETY: the caller keeps p within its row (16 bytes).
    unsafe {
        let q = _mm_loadu_si128(p as *const __m128i);
        let m = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(q, m);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
        _mm256_set_m128i(hi, lo)
    }
}

/// Byte `i` is 0xff where bit `i` of `x` is set (llama.cpp's `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_bits(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// One GGML type's chunks: chunk `c` of a row as 32 code bytes, the `madd` operand of its
/// integer scales, its float factor and its minimum (subtracted). Chunks are asked for in
/// order, so a k-quant decodes its block's scales once, at the block's first chunk.
pub(super) trait Unpack {
    /// Codes are signed (else unsigned, at most 63).
    const SIGNED: bool;
    /// The type has minimums.
    const MINS: bool;
    /// One integer scale a chunk (all but Q6_K): the AVX-512 VNNI kernel's types.
    const ONE_SCALE: bool = true;
    /// Integer scales other than 1 ([`Unpack::halves`]): the k-quants.
    const SCALED: bool = false;
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32);
    /// Chunk `c`'s integer scale as a float, after [`Unpack::chunk`] of `c` (one-scale types).
    fn int_scale(&self, _c: usize) -> f32 {
        1.0
    }
    /// Chunk `c`'s integer scale of each half as floats, after [`Unpack::chunk`] of `c`.
    fn halves(&self, _c: usize) -> [f32; 2] {
        [1.0; 2]
    }
    /// [`Unpack::halves`] as integers (the same values).
    fn int_halves(&self, _c: usize) -> [i16; 2] {
        [1; 2]
    }
    /// The type has [`Unpack::chunk512`].
    const CHUNK512: bool = false;
    /// AVX-512 (F/BW/VL): chunk `c`'s codes as 32 int16 lanes (the values `chunk` gives,
    /// times the integer scales, as `v512::widen16` makes them), its factor and minimum, in
    /// fewer instructions. Only where [`Unpack::CHUNK512`].
    ///
    /// # Safety
    /// As [`Unpack::chunk`], and the CPU has AVX-512 F/BW/VL.
    unsafe fn chunk512(&mut self, _row: *const u8, _c: usize) -> (__m512i, f32, f32) {
        unreachable!("no chunk512")
    }
}

#[derive(Default)]
pub(super) struct Q8_0;
#[derive(Default)]
pub(super) struct Q4_0;
#[derive(Default)]
pub(super) struct Q5_0;
#[derive(Default)]
pub(super) struct Q4_1;
#[derive(Default)]
pub(super) struct Q5_1;
#[derive(Default)]
pub(super) struct Q45K<const FIVE: bool> {
    d: f32,
    dmin: f32,
    sc: [u8; 8],
    m: [u8; 8],
}
#[derive(Default)]
pub(super) struct Q6K {
    sc: [f32; 2],
    isc: [i16; 2],
}

impl Unpack for Q8_0 {
    const SIGNED: bool = true;
    const MINS: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: chunk c is within the row (the caller's contract).
        unsafe {
            let p = row.add(34 * c);
            let w = _mm256_loadu_si256(p.add(2) as *const __m256i);
            (w, _mm256_set1_epi16(1), h2f(p), 0.0)
        }
    }
}

impl Unpack for Q4_0 {
    const SIGNED: bool = true;
    const MINS: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: as above.
        unsafe {
            let p = row.add(18 * c);
            let w = _mm256_sub_epi8(nibbles16(p.add(2)), _mm256_set1_epi8(8));
            (w, _mm256_set1_epi16(1), h2f(p), 0.0)
        }
    }
}

impl Unpack for Q5_0 {
    const SIGNED: bool = true;
    const MINS: bool = false;
    const CHUNK512: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn chunk512(&mut self, row: *const u8, c: usize) -> (__m512i, f32, f32) {
        // SAFETY: as `chunk`.
        unsafe {
            let p = row.add(22 * c);
            let qh = std::ptr::read_unaligned(p.add(2) as *const u32);
            // The 16 bytes in both halves, as int16: low nibbles in lanes 0..16, high in
            // 16..32; minus 16 where the fifth bit is clear (`(n | h << 4) - 16`).
            let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(6) as *const __m128i));
            let v = _mm512_srlv_epi16(
                _mm512_cvtepu8_epi16(q),
                _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1),
            );
            let v = _mm512_and_si512(v, _mm512_set1_epi16(0x0f));
            let w = _mm512_mask_sub_epi16(v, !qh, v, _mm512_set1_epi16(16));
            (w, h2f(p), 0.0)
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: as above.
        unsafe {
            let p = row.add(22 * c);
            let qh = std::ptr::read_unaligned(p.add(2) as *const u32);
            let hb = _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
            let w = _mm256_or_si256(nibbles16(p.add(6)), hb);
            let w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
            (w, _mm256_set1_epi16(1), h2f(p), 0.0)
        }
    }
}

impl Unpack for Q4_1 {
    const SIGNED: bool = false;
    const MINS: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: as above.
        unsafe {
            let p = row.add(20 * c);
            (
                nibbles16(p.add(4)),
                _mm256_set1_epi16(1),
                h2f(p),
                -h2f(p.add(2)),
            )
        }
    }
}

impl Unpack for Q5_1 {
    const SIGNED: bool = false;
    const MINS: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: as above.
        unsafe {
            let p = row.add(24 * c);
            let qh = std::ptr::read_unaligned(p.add(4) as *const u32);
            let hb = _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
            let w = _mm256_or_si256(nibbles16(p.add(8)), hb);
            (w, _mm256_set1_epi16(1), h2f(p), -h2f(p.add(2)))
        }
    }
}

impl<const FIVE: bool> Unpack for Q45K<FIVE> {
    const SIGNED: bool = false;
    const MINS: bool = true;
    const SCALED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32) {
        let bb = if FIVE { 176 } else { 144 };
        let (sb, j) = (c / 8, c % 8);
        // SAFETY: as above (block sb holds chunk c).
        unsafe {
            let p = row.add(bb * sb);
            if j == 0 {
                self.d = h2f(p);
                self.dmin = h2f(p.add(2));
                let s = std::slice::from_raw_parts(p.add(4), 12);
                for i in 0..4 {
                    self.sc[i] = s[i] & 0x3f;
                    self.sc[i + 4] = (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30);
                    self.m[i] = s[4 + i] & 0x3f;
                    self.m[i + 4] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
                }
            }
            let qs = p.add(if FIVE { 48 } else { 16 });
            let q = _mm256_loadu_si256(qs.add(32 * (j / 2)) as *const __m256i);
            let q = if j % 2 == 0 {
                q
            } else {
                _mm256_srli_epi16(q, 4)
            };
            let mut w = _mm256_and_si256(q, _mm256_set1_epi8(0x0f));
            if FIVE {
                let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
                let h = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)),
                    _mm256_set1_epi8(1),
                );
                w = _mm256_or_si256(w, _mm256_slli_epi16(h, 4));
            }
            let dm = self.dmin * f32::from(self.m[j]);
            (w, _mm256_set1_epi16(i16::from(self.sc[j])), self.d, dm)
        }
    }
    fn int_scale(&self, c: usize) -> f32 {
        f32::from(self.sc[c % 8])
    }
    fn halves(&self, c: usize) -> [f32; 2] {
        [f32::from(self.sc[c % 8]); 2]
    }
    fn int_halves(&self, c: usize) -> [i16; 2] {
        [i16::from(self.sc[c % 8]); 2]
    }
}

impl Unpack for Q6K {
    const SIGNED: bool = true;
    const MINS: bool = false;
    const ONE_SCALE: bool = false;
    const SCALED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(&mut self, row: *const u8, c: usize) -> (__m256i, __m256i, f32, f32) {
        let (sb, g) = (c / 8, c % 8);
        let (h, gg) = (g / 4, g % 4);
        // SAFETY: as above.
        unsafe {
            let p = row.add(210 * sb);
            let l = _mm256_loadu_si256(p.add(64 * h + 32 * (gg % 2)) as *const __m256i);
            let l = if gg / 2 == 0 {
                l
            } else {
                _mm256_srli_epi16(l, 4)
            };
            let low = _mm256_and_si256(l, _mm256_set1_epi8(0x0f));
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            let high = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * gg as i32)),
                _mm256_set1_epi8(3),
            );
            let w = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
            let w = _mm256_sub_epi8(w, _mm256_set1_epi8(32));
            let s = p.add(192 + 8 * h + 2 * gg);
            self.sc = [f32::from(*s as i8), f32::from(*s.add(1) as i8)];
            self.isc = [i16::from(*s as i8), i16::from(*s.add(1) as i8)];
            let sc = _mm256_set_m128i(
                _mm_set1_epi16(i16::from(*s.add(1) as i8)),
                _mm_set1_epi16(i16::from(*s as i8)),
            );
            (w, sc, h2f(p.add(208)), 0.0)
        }
    }
    fn halves(&self, _c: usize) -> [f32; 2] {
        self.sc
    }
    fn int_halves(&self, _c: usize) -> [i16; 2] {
        self.isc
    }
}

/// A call's inputs as the kernels read them.
#[derive(Clone, Copy)]
pub(super) enum Inputs<'a> {
    /// Int8 per 32 values (`q`, scales `d`, float sums `s`, `n4`: see `v512::kernel8`).
    Int8 {
        q: &'a [i8],
        d: &'a [f32],
        s: &'a [f32],
        n4: &'a [i32],
    },
    /// Float32 (`x`) with each chunk's float sum (`s`, for the minimums).
    F32 { x: &'a [f32], s: &'a [f32] },
    /// Int16 per 32 values (`q`, scales `d`, float sums `s`: `x86::quantize_x16`'s layout).
    Int16 {
        q: &'a [i16],
        d: &'a [f32],
        s: &'a [f32],
    },
}

/// Rows `r0..r1` of a matrix of type `ty` (`data`, `rb` bytes a row) against `m` inputs
/// (`chunks` chunks each), four inputs a pass over each row, into `out` (`(m, n)`) plus
/// `bias`. `wide`: the AVX-512 kernels.
///
/// # Safety
/// AVX2, FMA and F16C (and AVX-512 F/BW/VL + VNNI where `wide`); `ty` has an AVX2 kernel
/// ([`GgmlType::has_avx2_kernel`]); rows `r0..r1` of `out` are the caller's alone during the
/// pool run.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows(
    ty: GgmlType,
    data: &[u8],
    rb: usize,
    (r0, r1): (usize, usize),
    inputs: Inputs<'_>,
    wide: bool,
    m: usize,
    chunks: usize,
    out: SharedOut,
    n: usize,
    bias: Option<Floats<'_>>,
) {
    let (vals, sums) = (m * chunks * 32, m * chunks);
    let fits = match inputs {
        Inputs::Int8 { q, d, s, n4 } => {
            q.len() >= vals && d.len() >= sums && s.len() >= sums && n4.len() >= sums * 8
        }
        Inputs::F32 { x, s } => x.len() >= vals && s.len() >= sums,
        Inputs::Int16 { q, d, s } => q.len() >= vals && d.len() >= sums && s.len() >= sums,
    };
    assert!(
        rb == ty.row_bytes(chunks * 32) && data.len() >= r1 * rb && r1 <= n && fits,
        "kquant rows: short buffers"
    );
    let a = Args {
        data: data.as_ptr(),
        rb,
        inputs,
        m,
        chunks,
        out,
        n,
        bias,
    };
    // SAFETY: the sizes were checked above; the features and the output rows are the
    // caller's contract.
    unsafe {
        match ty {
            GgmlType::Q8_0 => rows_w::<Q8_0>(&a, r0, r1, wide),
            GgmlType::Q4_0 => rows_w::<Q4_0>(&a, r0, r1, wide),
            GgmlType::Q5_0 => rows_w::<Q5_0>(&a, r0, r1, wide),
            GgmlType::Q4_1 => rows_w::<Q4_1>(&a, r0, r1, wide),
            GgmlType::Q5_1 => rows_w::<Q5_1>(&a, r0, r1, wide),
            GgmlType::Q4_K => rows_w::<Q45K<false>>(&a, r0, r1, wide),
            GgmlType::Q5_K => rows_w::<Q45K<true>>(&a, r0, r1, wide),
            GgmlType::Q6_K => rows_w::<Q6K>(&a, r0, r1, wide),
            GgmlType::Q2_K | GgmlType::Q3_K => unreachable!("no AVX2 kernel for {}", ty.name()),
        }
    }
}

struct Args<'a> {
    data: *const u8,
    rb: usize,
    inputs: Inputs<'a>,
    m: usize,
    chunks: usize,
    out: SharedOut,
    n: usize,
    bias: Option<Floats<'a>>,
}

/// Rows a pass of the one-input int16 kernel (`kernel_i16_rows`).
const ROWS: usize = 4;

/// The row loop every kernel shares: rows `r0..r1` of `a`, the inputs four at a time through
/// `$k::<$U, MT>(U::default(), row, args...)` (`$row`, `$t0`: the names the arguments may use
/// for the row's bytes and the first input of the pass), each result plus the bias; the
/// row [`prefetch_rows`] ahead prefetched.
macro_rules! row_loop {
    ($a:ident, $r0:ident, $r1:ident, $U:ty, |$row:ident, $t0:ident| $k:ident($($arg:expr),* $(,)?)) => {{
        let ahead = prefetch_rows($a.rb);
        for r in $r0..$r1 {
            let bv = $a.bias.map_or(0.0, |b| b.get(r));
            let $row = $a.data.add(r * $a.rb);
            if ahead > 0 && r + ahead < $a.n {
                prefetch($row.wrapping_add(ahead * $a.rb), $a.rb);
            }
            let mut $t0 = 0;
            while $t0 < $a.m {
                let mut res = [0f32; 4];
                let mt = ($a.m - $t0).min(4);
                match mt {
                    1 => res[..1].copy_from_slice(&$k::<$U, 1>(<$U>::default(), $row, $($arg),*)),
                    2 => res[..2].copy_from_slice(&$k::<$U, 2>(<$U>::default(), $row, $($arg),*)),
                    3 => res[..3].copy_from_slice(&$k::<$U, 3>(<$U>::default(), $row, $($arg),*)),
                    _ => res.copy_from_slice(&$k::<$U, 4>(<$U>::default(), $row, $($arg),*)),
                }
                for (t, v) in res[..mt].iter().enumerate() {
                    $a.out.write(($t0 + t) * $a.n + r, v + bv);
                }
                $t0 += mt;
            }
        }
    }};
}

/// [`rows`] for one type: the AVX-512 kernels where `wide` (for int8 inputs only where the
/// chunks pair up and the type has one scale a chunk), else the AVX2 ones.
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_w<U: Unpack + Default>(a: &Args<'_>, r0: usize, r1: usize, wide: bool) {
    let wide = wide
        && match a.inputs {
            Inputs::Int8 { .. } => a.chunks % 2 == 0 && U::ONE_SCALE,
            Inputs::F32 { .. } | Inputs::Int16 { .. } => true,
        };
    // SAFETY: the caller's contract (AVX-512 F/BW/VL + VNNI where `wide`).
    unsafe {
        if wide {
            v512::rows::<U>(a, r0, r1)
        } else {
            v256::rows::<U>(a, r0, r1)
        }
    }
}

/// The kernels both vector widths share, written once: each ISA's module ([`v256`], [`v512`])
/// defines its vector helpers (`Acc`, `LANES`, `zero`, `splat`, `fmadd`, `load`, `reduce`,
/// `widen16`, `dot16`, `widen_f`) and its int8 kernel `kernel8` under its target features
/// (`$feat`), and this expands the int16 and float kernels and the row dispatch over them,
/// so every helper inlines into kernels of the same features.
macro_rules! lane_kernels {
    ($feat:literal) => {
        /// `MT` int16 inputs' dot products with one row: each chunk's codes widened to int16
        /// (times their integer scales, per half: the k-quants'), integer dot products into
        /// exact 32-bit sums (`widen16`, `dot16`), one float multiply-add with the chunk's
        /// factor times the input's scale; the minimums times the inputs' float sums. Exact
        /// integer sums (a code times its scale is at most 4096 in magnitude, an input 32767:
        /// a lane's two pairs stay below 2^30).
        ///
        /// # Safety
        /// The module's features; `row` holds `chunks` chunks of `U`'s type, `q`
        /// `MT * chunks * 32` int16 codes, `d` and `s` `MT * chunks` floats.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kernel_i16<U: Unpack, const MT: usize>(
            mut u: U,
            row: *const u8,
            q: *const i16,
            d: *const f32,
            s: *const f32,
            chunks: usize,
        ) -> [f32; MT] {
            let mut acc = [zero(); MT];
            let mut mins = [0f32; MT];
            // SAFETY: within the ranges of the contract.
            unsafe {
                for c in 0..chunks {
                    let (w16, f, b) = codes16(&mut u, row, c);
                    for t in 0..MT {
                        let i = t * chunks + c;
                        let p = dot16(w16, q.add(i * 32));
                        acc[t] = fmadd(p, splat(f * *d.add(i)), acc[t]);
                        if U::MINS {
                            mins[t] -= b * *s.add(i);
                        }
                    }
                }
                let mut out = [0f32; MT];
                for t in 0..MT {
                    out[t] = reduce(acc[t]) + mins[t];
                }
                out
            }
        }

        /// `R` rows' dot products with one int16 input, the rows' chunks interleaved: `R`
        /// independent chains of float multiply-adds where one row alone waits on each
        /// multiply-add's latency. Each row's operations, in their order, are
        /// `kernel_i16`'s with `MT = 1`: the same bits.
        ///
        /// # Safety
        /// As `kernel_i16` (`MT = 1`), for each of `rows`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kernel_i16_rows<U: Unpack + Default, const R: usize>(
            rows: [*const u8; R],
            q: *const i16,
            d: *const f32,
            s: *const f32,
            chunks: usize,
        ) -> [f32; R] {
            let mut u: [U; R] = std::array::from_fn(|_| U::default());
            let mut acc = [zero(); R];
            let mut mins = [0f32; R];
            // SAFETY: within the ranges of the contract.
            unsafe {
                for c in 0..chunks {
                    let (xd, xs) = (*d.add(c), *s.add(c));
                    for r in 0..R {
                        let (w16, f, b) = codes16(&mut u[r], rows[r], c);
                        let p = dot16(w16, q.add(c * 32));
                        acc[r] = fmadd(p, splat(f * xd), acc[r]);
                        if U::MINS {
                            mins[r] -= b * xs;
                        }
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = reduce(acc[r]) + mins[r];
                }
                out
            }
        }

        /// `MT` float inputs' dot products with one row: each chunk's codes widened to floats
        /// times their factor (`f * scale`, per half: `widen_f`), one FMA per `LANES` values
        /// and input; the minimums times the inputs' exact sums.
        ///
        /// # Safety
        /// As `kernel_i16`, with `x` holding `MT * chunks * 32` floats.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn kernel_f32<U: Unpack, const MT: usize>(
            mut u: U,
            row: *const u8,
            x: *const f32,
            s: *const f32,
            chunks: usize,
        ) -> [f32; MT] {
            let mut acc = [zero(); MT];
            let mut mins = [0f32; MT];
            // SAFETY: within the ranges of the contract.
            unsafe {
                for c in 0..chunks {
                    let (w, _, f, b) = u.chunk(row, c);
                    let wv = widen_f::<U>(w, f, u.halves(c));
                    for t in 0..MT {
                        let xp = x.add((t * chunks + c) * 32);
                        for (k, v) in wv.iter().enumerate() {
                            acc[t] = fmadd(*v, load(xp.add(LANES * k)), acc[t]);
                        }
                        if U::MINS {
                            mins[t] -= b * *s.add(t * chunks + c);
                        }
                    }
                }
                let mut out = [0f32; MT];
                for t in 0..MT {
                    out[t] = reduce(acc[t]) + mins[t];
                }
                out
            }
        }

        /// [`rows_w`]'s kernels at this width, by the inputs' kind.
        ///
        /// # Safety
        /// As [`rows`], with the module's features.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn rows<U: Unpack + Default>(a: &Args<'_>, r0: usize, r1: usize) {
            let c = a.chunks;
            // SAFETY: within the sizes `rows` checked.
            unsafe {
                match a.inputs {
                    Inputs::Int8 { q, d, s, n4 } => {
                        let (q, d, s, n4) = (q.as_ptr(), d.as_ptr(), s.as_ptr(), n4.as_ptr());
                        row_loop!(a, r0, r1, U, |row, t0| kernel8(
                            q.add(t0 * c * 32),
                            d.add(t0 * c),
                            s.add(t0 * c),
                            n4.add(t0 * c * 8),
                            c
                        ))
                    }
                    Inputs::F32 { x, s } => {
                        let (x, s) = (x.as_ptr(), s.as_ptr());
                        row_loop!(a, r0, r1, U, |row, t0| kernel_f32(
                            x.add(t0 * c * 32),
                            s.add(t0 * c),
                            c
                        ))
                    }
                    Inputs::Int16 { q, d, s } => {
                        let (q, d, s) = (q.as_ptr(), d.as_ptr(), s.as_ptr());
                        let mut r0 = r0;
                        if a.m == 1 && U::SCALED {
                            // One input of a k-quant: four rows at a time
                            // (`kernel_i16_rows`), the rest below. The prefetch leads each
                            // group by as many rows as one row at a time does.
                            let ahead = prefetch_rows(a.rb) + ROWS - 1;
                            while r0 + ROWS <= r1 {
                                let rows: [*const u8; ROWS] =
                                    std::array::from_fn(|k| a.data.add((r0 + k) * a.rb));
                                for (k, &row) in rows.iter().enumerate() {
                                    if ahead > 0 && r0 + k + ahead < a.n {
                                        prefetch(row.wrapping_add(ahead * a.rb), a.rb);
                                    }
                                }
                                let res = kernel_i16_rows::<U, ROWS>(rows, q, d, s, c);
                                for (k, v) in res.iter().enumerate() {
                                    let bv = a.bias.map_or(0.0, |b| b.get(r0 + k));
                                    a.out.write(r0 + k, v + bv);
                                }
                                r0 += ROWS;
                            }
                        }
                        row_loop!(a, r0, r1, U, |row, t0| kernel_i16(
                            q.add(t0 * c * 32),
                            d.add(t0 * c),
                            s.add(t0 * c),
                            c
                        ))
                    }
                }
            }
        }
    };
}

/// The AVX2 kernels (256-bit vectors).
mod v256 {
    use super::*;

    type Acc = __m256;
    const LANES: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn zero() -> Acc {
        _mm256_setzero_ps()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn splat(v: f32) -> Acc {
        _mm256_set1_ps(v)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fmadd(a: Acc, b: Acc, c: Acc) -> Acc {
        _mm256_fmadd_ps(a, b, c)
    }

    /// # Safety
    /// `p` holds `LANES` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> Acc {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn reduce(v: Acc) -> f32 {
        // SAFETY: AVX2 is enabled here.
        unsafe { hsum(v) }
    }

    /// A chunk's 32 codes as two vectors of 16 int16, times their halves' integer scales.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn widen16<U: Unpack>(u: &U, w: __m256i, c: usize) -> [__m256i; 2] {
        let (lo, hi) = (_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        let (mut w0, mut w1) = if U::SIGNED {
            (_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi))
        } else {
            (_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi))
        };
        if U::SCALED {
            let h = u.int_halves(c);
            w0 = _mm256_mullo_epi16(w0, _mm256_set1_epi16(h[0]));
            w1 = _mm256_mullo_epi16(w1, _mm256_set1_epi16(h[1]));
        }
        [w0, w1]
    }

    /// Chunk `c`'s codes as int16 ([`widen16`]), its factor and minimum.
    ///
    /// # Safety
    /// As [`Unpack::chunk`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes16<U: Unpack>(u: &mut U, row: *const u8, c: usize) -> ([__m256i; 2], f32, f32) {
        // SAFETY: the caller's contract.
        unsafe {
            let (w, _, f, b) = u.chunk(row, c);
            (widen16(u, w, c), f, b)
        }
    }

    /// The chunk's 32-bit integer sums against 32 int16 inputs at `xp`, as floats.
    ///
    /// # Safety
    /// `xp` holds 32 int16 values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot16(w: [__m256i; 2], xp: *const i16) -> Acc {
        let xp = xp as *const __m256i;
        // SAFETY: the caller's contract.
        unsafe {
            let p = _mm256_add_epi32(
                _mm256_madd_epi16(w[0], _mm256_loadu_si256(xp)),
                _mm256_madd_epi16(w[1], _mm256_loadu_si256(xp.add(1))),
            );
            _mm256_cvtepi32_ps(p)
        }
    }

    /// A chunk's 32 codes as four vectors of 8 floats times their half's factor.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn widen_f<U: Unpack>(w: __m256i, f: f32, h: [f32; 2]) -> [Acc; 4] {
        let lo = _mm256_castsi256_si128(w);
        let hi = _mm256_extracti128_si256(w, 1);
        let parts = [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)];
        let mut wv = [_mm256_setzero_ps(); 4];
        for (k, (v, p)) in wv.iter_mut().zip(parts).enumerate() {
            let i = if U::SIGNED {
                _mm256_cvtepi8_epi32(p)
            } else {
                _mm256_cvtepu8_epi32(p)
            };
            *v = _mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(f * h[k / 2]));
        }
        wv
    }

    /// `MT` int8 inputs' dot products with one row: per chunk `maddubs` (unsigned codes
    /// times the int8 inputs; signed codes through the sign trick, `|w| * sign(x, w)`),
    /// `madd` with the chunk's integer scales, one float multiply-add with the chunk's
    /// factor times the input's scale, and the minimums in a float on the side (`_n4`:
    /// unused here).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `row` holds `chunks` chunks of `U`'s type, `q` `MT * chunks * 32`
    /// codes, `d` and `s` `MT * chunks` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn kernel8<U: Unpack, const MT: usize>(
        mut u: U,
        row: *const u8,
        q: *const i8,
        d: *const f32,
        s: *const f32,
        _n4: *const i32,
        chunks: usize,
    ) -> [f32; MT] {
        let mut acc = [_mm256_setzero_ps(); MT];
        let mut mins = [0f32; MT];
        // SAFETY: within the ranges of the contract.
        unsafe {
            for c in 0..chunks {
                let (w, sc, f, b) = u.chunk(row, c);
                let aw = _mm256_sign_epi8(w, w);
                for t in 0..MT {
                    let i = t * chunks + c;
                    let x = _mm256_loadu_si256(q.add(i * 32) as *const __m256i);
                    let p = if U::SIGNED {
                        _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w))
                    } else {
                        _mm256_maddubs_epi16(w, x)
                    };
                    let v = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, sc));
                    acc[t] = _mm256_fmadd_ps(v, _mm256_set1_ps(f * *d.add(i)), acc[t]);
                    if U::MINS {
                        mins[t] -= b * *s.add(i);
                    }
                }
            }
            let mut out = [0f32; MT];
            for t in 0..MT {
                out[t] = hsum(acc[t]) + mins[t];
            }
            out
        }
    }

    lane_kernels!("avx2,fma,f16c");
}

/// The AVX-512 kernels (512-bit vectors; F/BW/VL + VNNI).
mod v512 {
    use super::*;

    type Acc = __m512;
    const LANES: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn zero() -> Acc {
        _mm512_setzero_ps()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn splat(v: f32) -> Acc {
        _mm512_set1_ps(v)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn fmadd(a: Acc, b: Acc, c: Acc) -> Acc {
        _mm512_fmadd_ps(a, b, c)
    }

    /// # Safety
    /// `p` holds `LANES` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn load(p: *const f32) -> Acc {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn reduce(v: Acc) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    /// A chunk's 32 codes as 32 int16 lanes, times their halves' integer scales.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) fn widen16<U: Unpack>(u: &U, w: __m256i, c: usize) -> __m512i {
        let mut w16 = if U::SIGNED {
            _mm512_cvtepi8_epi16(w)
        } else {
            _mm512_cvtepu8_epi16(w)
        };
        if U::SCALED {
            let h = u.int_halves(c);
            let sc = _mm512_mask_blend_epi16(
                0xffff_0000,
                _mm512_set1_epi16(h[0]),
                _mm512_set1_epi16(h[1]),
            );
            w16 = _mm512_mullo_epi16(w16, sc);
        }
        w16
    }

    /// Chunk `c`'s codes as int16 ([`Unpack::chunk512`] where the type has it, else
    /// [`widen16`]), its factor and minimum.
    ///
    /// # Safety
    /// As [`Unpack::chunk`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn codes16<U: Unpack>(u: &mut U, row: *const u8, c: usize) -> (__m512i, f32, f32) {
        // SAFETY: the caller's contract.
        unsafe {
            if U::CHUNK512 {
                return u.chunk512(row, c);
            }
            let (w, _, f, b) = u.chunk(row, c);
            (widen16(u, w, c), f, b)
        }
    }

    /// The chunk's 32-bit integer sums against 32 int16 inputs at `xp` (one `vpdpwssd`), as
    /// floats.
    ///
    /// # Safety
    /// `xp` holds 32 int16 values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot16(w: __m512i, xp: *const i16) -> Acc {
        // SAFETY: the caller's contract.
        unsafe {
            let x = _mm512_loadu_si512(xp as *const _);
            _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(_mm512_setzero_si512(), w, x))
        }
    }

    /// A chunk's 32 codes as two vectors of 16 floats times their half's factor.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn widen_f<U: Unpack>(w: __m256i, f: f32, h: [f32; 2]) -> [Acc; 2] {
        let parts = [_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)];
        let mut wv = [_mm512_setzero_ps(); 2];
        for (k, (v, p)) in wv.iter_mut().zip(parts).enumerate() {
            let i = if U::SIGNED {
                _mm512_cvtepi8_epi32(p)
            } else {
                _mm512_cvtepu8_epi32(p)
            };
            *v = _mm512_mul_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(f * h[k]));
        }
        wv
    }

    /// `MT` int8 inputs' dot products with one row, two chunks at a time: codes as unsigned
    /// bytes (signed ones `+ 128`, their `128 * sum(q)` taken off by starting each sum at
    /// `n4`, the inputs' per-4 sums times -128), one `vpdpbusd` per input, the chunk factors
    /// (`f * scale * d`) in one float multiply-add.
    ///
    /// # Safety
    /// As `v256::kernel8`, `chunks` even, `n4` holding `MT * chunks * 8` sums, AVX-512
    /// F/BW/VL + VNNI; `U` has one integer scale a chunk.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn kernel8<U: Unpack, const MT: usize>(
        mut u: U,
        row: *const u8,
        q: *const i8,
        d: *const f32,
        s: *const f32,
        n4: *const i32,
        chunks: usize,
    ) -> [f32; MT] {
        let mut acc = [_mm512_setzero_ps(); MT];
        let mut mins = [0f32; MT];
        // SAFETY: within the ranges of the contract.
        unsafe {
            let mut c = 0;
            while c < chunks {
                let (w0, _, f0, b0) = u.chunk(row, c);
                let g0 = f0 * u.int_scale(c);
                let (w1, _, f1, b1) = u.chunk(row, c + 1);
                let g1 = f1 * u.int_scale(c + 1);
                let mut w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                if U::SIGNED {
                    w = _mm512_xor_si512(w, _mm512_set1_epi8(-128));
                }
                for t in 0..MT {
                    let i = t * chunks + c;
                    let x = _mm512_loadu_si512(q.add(i * 32) as *const _);
                    let init = if U::SIGNED {
                        _mm512_loadu_si512(n4.add(i * 8) as *const _)
                    } else {
                        _mm512_setzero_si512()
                    };
                    let p = _mm512_dpbusd_epi32(init, w, x);
                    let lo = _mm512_castps_pd(_mm512_set1_ps(g0 * *d.add(i)));
                    let hi = _mm256_castps_pd(_mm256_set1_ps(g1 * *d.add(i + 1)));
                    let sc = _mm512_castpd_ps(_mm512_insertf64x4(lo, hi, 1));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[t]);
                    if U::MINS {
                        mins[t] -= b0 * *s.add(i) + b1 * *s.add(i + 1);
                    }
                }
                c += 2;
            }
            let mut out = [0f32; MT];
            for t in 0..MT {
                out[t] = _mm512_reduce_add_ps(acc[t]) + mins[t];
            }
            out
        }
    }

    lane_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q5_0's AVX-512 unpacking (`Unpack::chunk512`) gives the int16 codes, factor and
    /// minimum of the AVX2 one widened (`v512::widen16`), bit for bit, on every bit pattern
    /// of random blocks.
    #[test]
    fn q5_0_chunk512_is_the_widened_chunk() {
        if !super::super::Isa::Avx512.available() {
            return;
        }
        let mut g = 12345u64;
        let data: Vec<u8> = (0..22 * 64)
            .map(|_| {
                g = g.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (g >> 33) as u8
            })
            .collect();
        for c in 0..64 {
            let mut u = Q5_0;
            // SAFETY: AVX-512 F/BW/VL checked above; chunk c lies within `data`.
            let (a, b) = unsafe {
                let (w, _, f, m) = u.chunk(data.as_ptr(), c);
                let (w16, f2, m2) = u.chunk512(data.as_ptr(), c);
                let mut x = [0i16; 32];
                let mut y = [0i16; 32];
                _mm512_storeu_si512(x.as_mut_ptr() as *mut _, v512_widen(&u, w, c));
                _mm512_storeu_si512(y.as_mut_ptr() as *mut _, w16);
                (
                    (x, f.to_bits(), m.to_bits()),
                    (y, f2.to_bits(), m2.to_bits()),
                )
            };
            assert_eq!(a, b, "chunk {c}");
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn v512_widen<U: Unpack>(u: &U, w: __m256i, c: usize) -> __m512i {
        v512::widen16(u, w, c)
    }
}
