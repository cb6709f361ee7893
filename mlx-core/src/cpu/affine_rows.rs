//! The products of a speculative verification pass (or a batched decode step) over 4-bit
//! affine weights in groups of 32 with half-precision scales and biases (GGUF's Q4_0 / Q4_1
//! as MLX loads them: SmolLM2-135M's layers), with the CPU decoder's int16 inputs on AVX-512.
//!
//! Each row's sum is [`x86::dot4_512_h`](super::x86)'s, the function the one-row kernel
//! (`rows_int16_512`) calls, bit for bit, so every input row gets the bits it gets alone
//! (tier: bit-identical, `each_row_is_what_it_is_alone` in `batch.rs` and this file's
//! tests); `MLX_CPU_ROWS_SUMS=magic` computes them by [`dot4_512_hm`] instead, the same sums
//! with a float read of the integer lanes in place of a conversion, one operation a pair and
//! input off the integer multiply port (off by default until an idle A/B settles it:
//! `results/bench/2026-12-05-s27-spec/`); up to
//! [`WIDE_TILE`](super::x86::WIDE_TILE) inputs share one pass over each weight row (its bytes
//! loaded and unpacked once, the rows' sums register-blocked). What this adds: the weights
//! stream from memory while the rows' arithmetic runs. A weight row is ~360 bytes (codes,
//! scales, biases), read once per pass; without a prefetch the loads of the next row only
//! start when its sums do, so the memory time adds to the arithmetic instead of overlapping
//! it. Here each row prefetches the one [`PREFETCH_ROWS`] ahead.
//!
//! The plain reference is `x86::rows_int16_512` (the same sums, no prefetch); the micro
//! benchmark is `cargo run --release -p mlx-core --example cpu_rows -- [THREADS] [MAX_ROWS]`.

use std::arch::x86_64::*;

use super::matmul::{Floats, Kind, Matrix};
use super::x86::{dot4_512_h, hsum, QuantX16, MAX_CHUNKS, WIDE_TILE};
use super::SharedOut;

/// How many weight rows ahead each row prefetches (a few rows: ~1.4 KB at SmolLM2's 576
/// columns, enough to cover the memory latency behind one row's sums).
pub(super) const PREFETCH_ROWS: usize = 4;

/// Experiment knobs: `MLX_CPU_PF_ROWS` (rows ahead into L1, default [`PREFETCH_ROWS`]) and
/// `MLX_CPU_PF_FAR` (rows ahead into L2, 0: none, the default).
fn pf_knobs() -> (usize, usize) {
    static K: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let get = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        (
            get("MLX_CPU_PF_ROWS", PREFETCH_ROWS),
            get("MLX_CPU_PF_FAR", 0),
        )
    })
}

/// Whether the rows' sums go through [`dot4_512_h`] (the one-row kernel's instructions, the
/// default) rather than [`dot4_512_hm`] (the same bits, `MLX_CPU_ROWS_SUMS=magic`); for
/// measuring one against the other in one binary.
fn plain_sums() -> bool {
    static P: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *P.get_or_init(|| std::env::var("MLX_CPU_ROWS_SUMS").map_or(true, |v| v != "magic"))
}

/// The float of an int32 lane sum in `(-2^22, 2^22)` without a conversion instruction: the
/// integer sums start from the bits of `1.5 * 2^23` ([`MAGIC_BITS`]), so the lane read as a
/// float is `1.5 * 2^23 + sum` exactly (one unit in the last place is 1 there), and
/// subtracting [`MAGIC`] leaves `sum`, exactly what `cvtepi32_ps` gives (a zero sum is +0
/// both ways).
const MAGIC_BITS: i32 = 0x4B40_0000;
const MAGIC: f32 = 12_582_912.0;

/// [`dot4_512_h`]'s sums, bit for bit, with fewer operations on the integer multiply port
/// for each input: each pair's lane sums start from [`MAGIC_BITS`] in the first
/// `vpdpwssd` (in place of `vpmaddwd` from zero) and become floats by one subtraction (in
/// place of `vcvtdq2ps`). A lane sums four products of a 4-bit code (0-15) and an int16
/// code (`|q| <= 32767`, [`quantize_x16`](super::x86)): `|sum| <= 4 * 15 * 32767 <
/// 2^21`, inside the range where the float read is exact. On cores whose 512-bit integer
/// multiplies and conversions share one port (Intel's), a row's work a pair was three
/// operations on that port and is two; the subtraction goes to either floating-point port.
///
/// # Safety
/// As [`dot4_512_h`].
#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot4_512_hm<const MT: usize>(
    rb: *const u8,
    s0: *const u16,
    b0: *const u16,
    chunks: usize,
    qx: QuantX16,
) -> [f32; MT] {
    // SAFETY (whole body): reads stay within the ranges of the contract (masked loads past a
    // row's last chunk read nothing).
    unsafe {
        let mask_of = |k: usize| -> __mmask16 {
            if k == 16 {
                0xffff
            } else {
                (1u16 << k) - 1
            }
        };
        let mut a0 = [_mm512_setzero_ps(); MT];
        let mut c0 = 0;
        while c0 < chunks {
            let mask = mask_of((chunks - c0).min(16));
            let bv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, b0.add(c0) as *const _));
            for t in 0..MT {
                let xs = _mm512_maskz_loadu_ps(mask, qx.s.add(t * chunks + c0));
                a0[t] = _mm512_fmadd_ps(bv, xs, a0[t]);
            }
            c0 += 16;
        }
        let nib = _mm512_set1_epi16(0x000f);
        let magic = _mm512_set1_epi32(MAGIC_BITS);
        let magic_f = _mm512_set1_ps(MAGIC);
        // Lanes 0-7: the pair's first chunk; 8-15: its second.
        let base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let qp = qx.p;
        let mut a1 = [_mm512_setzero_ps(); MT];
        let mut tail = [_mm256_setzero_ps(); MT];
        let mut c0 = 0;
        while c0 < chunks {
            let k = (chunks - c0).min(16);
            let mask = mask_of(k);
            let sv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, s0.add(c0) as *const _));
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
                    let sum = _mm512_dpwssd_epi32(magic, lo, _mm512_loadu_si512(xp as *const _));
                    let sum =
                        _mm512_dpwssd_epi32(sum, hi, _mm512_loadu_si512(xp.add(32) as *const _));
                    let fv = _mm512_permutexvar_ps(idx, f[t]);
                    let v = _mm512_sub_ps(_mm512_castsi512_ps(sum), magic_f);
                    *a = _mm512_fmadd_ps(v, fv, *a);
                }
            };
            // c0 is a multiple of 16: pairs at c % 4 == 0 go to a0, as in `dot4_512_h`.
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
                let magic = _mm256_set1_epi32(MAGIC_BITS);
                let magic_f = _mm256_set1_ps(MAGIC);
                for (t, a) in tail.iter_mut().enumerate() {
                    let xp = qp.add(t * chunks * 32 + c * 32);
                    let sum =
                        _mm256_dpwssd_epi32(magic, lo, _mm256_loadu_si256(xp as *const __m256i));
                    let sum = _mm256_dpwssd_epi32(
                        sum,
                        hi,
                        _mm256_loadu_si256(xp.add(16) as *const __m256i),
                    );
                    let fv = _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, f[t]));
                    let v = _mm256_sub_ps(_mm256_castsi256_ps(sum), magic_f);
                    *a = _mm256_fmadd_ps(v, fv, *a);
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

/// Whether [`rows`] takes `w`: 4-bit affine, groups of 32, half-precision scales and biases,
/// at most [`MAX_CHUNKS`] chunks a row.
pub(super) fn supports(w: &Matrix<'_>) -> bool {
    matches!(
        w.kind,
        Kind::Affine {
            bits: 4,
            group: 32,
            scales: Floats::F16(_),
            biases: Floats::F16(_),
            ..
        }
    ) && w.cols() % 32 == 0
        && w.cols() / 32 <= MAX_CHUNKS
}

/// Rows `r0..r1` of `out = x W^T (+ bias)` for the `m` int16-quantized inputs `qx` (as
/// `rows_int16_512` computes them), up to [`WIDE_TILE`] inputs a pass over each weight row.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL with VNNI; [`supports`] holds for `w`;
/// `qx` holds `m` rows of `cols` codes (and [`permute_x16`](super::x86)'s copy), scales and
/// sums; rows `r0..r1` (`r1 <= w.rows()`) of `out` (`(m, rows)`) are this caller's alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX16,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let (n, cols) = (w.rows(), w.cols());
    let chunks = cols / 32;
    // Past one tile, tiles of even size (7 rows as 4 + 3, not 6 + 1: a one-row pass over the
    // weights costs nearly what a one-row product does).
    let mut tiles = m.div_ceil(WIDE_TILE);
    let mut t0 = 0;
    while t0 < m {
        let mt = (m - t0).div_ceil(tiles);
        tiles -= 1;
        let c = t0 * chunks;
        // SAFETY: rows t0..t0 + mt of qx start at these offsets; the contract is forwarded.
        unsafe {
            let q = QuantX16 {
                q: qx.q.add(t0 * cols),
                p: qx.p.add(t0 * cols),
                d: qx.d.add(c),
                s: qx.s.add(c),
            };
            // Only the first pass prefetches: the others find the block's rows in cache.
            let pf = t0 == 0;
            let o = out.from(t0 * n);
            match mt {
                1 => rows_m::<1>(w, r0, r1, q, o, bias, pf),
                2 => rows_m::<2>(w, r0, r1, q, o, bias, pf),
                3 => rows_m::<3>(w, r0, r1, q, o, bias, pf),
                4 => rows_m::<4>(w, r0, r1, q, o, bias, pf),
                5 => rows_m::<5>(w, r0, r1, q, o, bias, pf),
                _ => rows_m::<6>(w, r0, r1, q, o, bias, pf),
            }
        }
        t0 += mt;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_m<const MT: usize>(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    qx: QuantX16,
    out: SharedOut,
    bias: Option<Floats<'_>>,
    prefetch: bool,
) {
    let Kind::Affine {
        words,
        scales: Floats::F16(sh),
        biases: Floats::F16(bh),
        bits: 4,
        group: 32,
    } = w.kind
    else {
        return;
    };
    let (rows, cols) = (w.rows(), w.cols());
    let chunks = cols / 32;
    let row_bytes = cols / 2;
    let bytes = words.as_ptr() as *const u8;
    assert!(
        r1 <= rows && sh.len() >= rows * chunks && bh.len() >= rows * chunks,
        "affine_rows: rows {r0}..{r1} of {rows}, scales out of range"
    );
    // SAFETY (whole body): rows r0..r1 lie within `words`, `sh` and `bh` (Matrix::affine's
    // checks and the assert); prefetches are hints and only name rows that exist; the
    // contract of `dot4_512_h` is `rows`'.
    unsafe {
        // The lines of weight row `r` (codes, scales, biases) on their way to L1.
        let fetch = |r: usize| {
            let p = bytes.add(r * row_bytes) as *const i8;
            let mut o = 0;
            while o < row_bytes {
                _mm_prefetch::<_MM_HINT_T0>(p.add(o));
                o += 64;
            }
            _mm_prefetch::<_MM_HINT_T0>(p.add(row_bytes - 1));
            _mm_prefetch::<_MM_HINT_T0>(sh.as_ptr().add(r * chunks) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(bh.as_ptr().add(r * chunks) as *const i8);
        };
        let far = |r: usize| {
            let p = bytes.add(r * row_bytes) as *const i8;
            let mut o = 0;
            while o < row_bytes {
                _mm_prefetch::<_MM_HINT_T1>(p.add(o));
                o += 64;
            }
            _mm_prefetch::<_MM_HINT_T1>(p.add(row_bytes - 1));
            _mm_prefetch::<_MM_HINT_T1>(sh.as_ptr().add(r * chunks) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(bh.as_ptr().add(r * chunks) as *const i8);
        };
        let (ahead, far_ahead) = pf_knobs();
        let plain = plain_sums();
        if prefetch {
            // The block's first rows at once (the loop below reaches each row ahead of it).
            for r in r0..(r0 + ahead).min(r1) {
                fetch(r);
            }
        }
        for r in r0..r1 {
            let s0 = sh.as_ptr().add(r * chunks) as *const u16;
            let b0 = bh.as_ptr().add(r * chunks) as *const u16;
            let rb = bytes.add(r * row_bytes);
            if prefetch && r + ahead < rows {
                fetch(r + ahead);
            }
            if prefetch && far_ahead > 0 && r + far_ahead < rows {
                far(r + far_ahead);
            }
            let v = if plain {
                dot4_512_h::<MT>(rb, s0, b0, chunks, qx)
            } else {
                dot4_512_hm::<MT>(rb, s0, b0, chunks, qx)
            };
            let b = bias.map_or(0.0, |b| b.get(r));
            for (t, v) in v.iter().enumerate() {
                out.write(t * rows + r, v + b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        matmul_t, matmul_t_each, Activations, CpuContext, Isa, MatJob, RowsScratch,
    };
    use super::*;

    fn seeded(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// [`dot4_512_hm`] against [`dot4_512_h`] (the one-row kernel's sums), 1-6 inputs, bit
    /// for bit: random codes, then the extremes of the float read's range (every nibble 15
    /// against codes of +-32767, all of one sign, so lane sums reach +-4 * 15 * 32767), zero
    /// sums and codes of mixed sign, over chunk counts with an unpaired chunk (17, 19) and a
    /// partial block of 16 (18, 35). Tier: bit-identical. Skipped without AVX-512.
    #[test]
    fn magic_sums_are_the_plain_sums_bit_for_bit() {
        if !Isa::Avx512.available() {
            eprintln!("no AVX-512: dot4_512_hm is not reached here");
            return;
        }
        let mut seed = 5u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as u32
        };
        for case in 0..5 {
            for chunks in [1usize, 2, 17, 18, 19, 35, 48] {
                let cols = chunks * 32;
                let m = 6;
                let bytes: Vec<u8> = (0..chunks * 16)
                    .map(|_| match case {
                        1 | 2 => 0xff,
                        3 => 0,
                        _ => next() as u8,
                    })
                    .collect();
                let q: Vec<i16> = (0..m * cols)
                    .map(|i| match case {
                        1 => 32767,
                        2 => -32767,
                        4 => {
                            if i % 2 == 0 {
                                32767
                            } else {
                                -32767
                            }
                        }
                        _ => ((next() % 65535) as i32 - 32767) as i16,
                    })
                    .collect();
                let mut p = vec![0i16; m * cols];
                crate::cpu::x86::permute_x16(&q, cols, &mut p);
                let d: Vec<f32> = (0..m * chunks)
                    .map(|_| (next() % 1000) as f32 / 3e6)
                    .collect();
                let sm: Vec<f32> = (0..m * chunks)
                    .map(|_| (next() % 1000) as f32 / 7e2 - 0.7)
                    .collect();
                let sc: Vec<u16> = (0..chunks)
                    .map(|_| half::f16::from_f32((next() % 1000) as f32 / 7e4).to_bits())
                    .collect();
                let bi: Vec<u16> = (0..chunks)
                    .map(|_| half::f16::from_f32((next() % 1000) as f32 / -3e4).to_bits())
                    .collect();
                let qx = QuantX16 {
                    q: q.as_ptr(),
                    p: p.as_ptr(),
                    d: d.as_ptr(),
                    s: sm.as_ptr(),
                };
                macro_rules! check {
                    ($mt:literal) => {{
                        // SAFETY: AVX-512 checked above; the buffers hold `m >= $mt` rows of
                        // `chunks` chunks (codes, permuted codes, scales, sums) and one weight
                        // row of `chunks` chunks with its halves.
                        let (a, b) = unsafe {
                            (
                                dot4_512_h::<$mt>(
                                    bytes.as_ptr(),
                                    sc.as_ptr(),
                                    bi.as_ptr(),
                                    chunks,
                                    qx,
                                ),
                                dot4_512_hm::<$mt>(
                                    bytes.as_ptr(),
                                    sc.as_ptr(),
                                    bi.as_ptr(),
                                    chunks,
                                    qx,
                                ),
                            )
                        };
                        for t in 0..$mt {
                            assert_eq!(
                                a[t].to_bits(),
                                b[t].to_bits(),
                                "case {case}, {chunks} chunks, MT {}, input {t}: {} vs {}",
                                $mt,
                                a[t],
                                b[t]
                            );
                        }
                    }};
                }
                check!(1);
                check!(2);
                check!(3);
                check!(4);
                check!(5);
                check!(6);
            }
        }
    }

    /// Every row of 1..=8 inputs through `matmul_t_each` (this file's kernel, prefetching)
    /// has the bits `matmul_t` gives that input alone (the plain `rows_int16_512`), with and
    /// without a bias, over row counts that end blocks and prefetches early and column counts
    /// with an unpaired chunk (17, 33) and a partial block of 16 chunks (18): tier
    /// bit-identical. Skipped where the CPU lacks AVX-512 (the kernel is not reached).
    #[test]
    fn rows_are_the_one_row_kernels_bits() {
        let mut ctx = CpuContext::new(2).unwrap();
        if ctx.isa != Isa::Avx512 {
            eprintln!("no AVX-512: affine_rows is not reached here");
            return;
        }
        ctx.activations = Activations::Int16;
        let mut scratch = RowsScratch::default();
        for (rows, cols) in [(37, 544), (70, 576), (5, 1056), (3, 32)] {
            let words: Vec<u32> = seeded(rows * cols / 8, 1)
                .iter()
                .map(|v| (v.to_bits()).wrapping_mul(2_654_435_761))
                .collect();
            let sh: Vec<half::f16> = seeded(rows * cols / 32, 2)
                .iter()
                .map(|&v| half::f16::from_f32(v * 0.1))
                .collect();
            let bh: Vec<half::f16> = seeded(rows * cols / 32, 3)
                .iter()
                .map(|&v| half::f16::from_f32(v * 0.1))
                .collect();
            let bias = seeded(rows, 4);
            let w = Matrix::affine(
                &words,
                Floats::F16(&sh),
                Floats::F16(&bh),
                rows,
                cols,
                4,
                32,
            )
            .unwrap();
            assert!(supports(&w));
            for m in 1..=8 {
                let x = seeded(m * cols, 10 + m as u64);
                for b in [None, Some(Floats::F32(&bias))] {
                    let mut got = vec![0f32; m * rows];
                    let mut jobs = [MatJob {
                        w: &w,
                        bias: b,
                        out: &mut got,
                    }];
                    matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                    for t in 0..m {
                        let mut alone = vec![0f32; rows];
                        let mut jobs = [MatJob {
                            w: &w,
                            bias: b,
                            out: &mut alone,
                        }];
                        matmul_t(&ctx, &x[t * cols..(t + 1) * cols], 1, &mut jobs).unwrap();
                        let row = &got[t * rows..(t + 1) * rows];
                        assert!(
                            row.iter()
                                .zip(&alone)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{rows}x{cols}, {m} inputs, row {t}, bias {}: not the bits alone",
                            b.is_some()
                        );
                    }
                }
            }
        }
    }
}
