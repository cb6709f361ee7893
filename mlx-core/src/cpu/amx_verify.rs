//! Chunk-sum products of 4-bit affine weights (float16 scales and biases, groups of 32 times a
//! power of two: GGUF's Q4_0 / Q4_1 as the CPU decoder loads them) with the decoder's int16
//! inputs, in two bit-identical kernels: [`rows`] on AVX-512 VNNI (one input or several, the
//! one-row kernel of this arithmetic) and [`rows_amx`] on AMX's int8 tiles (2 to 7 inputs: a
//! speculative verification pass). **Off by default**: `CpuContext::lane4`
//! (`MLX_CPU_LANE4=1`) routes the decode step's and the verification pass's 4-bit products
//! here; the AMX kernel is reached only by its test and `examples/cpu_verify_rows.rs` (it is
//! slower than [`rows`] today: `results/bench/2026-12-05-s28-spec/`).
//!
//! **The arithmetic (the definition, [`reference`]).** For weight row `n` and input `t`:
//! - `S_c` = the exact integer sum of chunk `c`'s 32 products `code * q` (`q` the input's
//!   int16 codes), as an int32 (|S_c| <= 32 * 15 * 32767 < 2^24, so its float is exact);
//! - two float accumulators `a[c % 2]`: first `a[c % 2] = fma(bias_g(c), xs_c, a[c % 2])` over
//!   every chunk (`xs_c` the chunk's float input sum), then
//!   `a[c % 2] = fma(float(S_c), scale_g(c) * d_c, a[c % 2])` over every chunk (`d_c` the
//!   chunk's input scale);
//! - the output is `(a[0] + a[1]) + b_n` (`b_n` the layer's bias, 0 without one).
//!
//! Any kernel that forms the same `S_c` (integer sums are exact in any order) and then runs
//! these float operations in this order gets the same bits. That is what lets a tile product
//! (`tdpbuud`: 16 weight rows x up to 16 input rows x 64 bytes of K an instruction) verify
//! several tokens with the bits of the one-row kernel. The decoder's default kernel
//! (`x86::dot4_512_s`) cannot be reproduced this way: its int32 sums are per 8 products
//! (a vector lane), and each lane is scaled and accumulated in float before the lanes are
//! reduced, so a tile product would have to keep 8-product sums (1/8 of its K) to match it.
//!
//! **Layout.** Both kernels take 16 weight rows at a time with the rows in the vector lanes:
//! the rows' packed words are transposed (16 x 16 32-bit lanes) so that vector `Z_j` holds
//! word `j` of one chunk of each row; `Z_j & 0x0f` are 4 even codes of each row and
//! `(Z_j >> 4) & 0x0f` 4 odd ones. The VNNI kernel multiplies them with the input's matching
//! 4 bytes broadcast (`vpdpbusd`; the int16 codes as a signed high byte and an unsigned low
//! byte, `S = 256 * high + low`); the AMX kernel stores them as the B tile (8 rows of 64 bytes:
//! K = 32 codes x 16 weight rows) and takes the inputs as the A tile: rows `0..m` the high bytes
//! plus 128, `m..2m` the low bytes, row `2m` ones (so `S = 256 * (H - 128 * ones) + L`, all in
//! unsigned `tdpbuud`). The scales and biases are transposed the same way, so the float
//! epilogue runs on 16 weight rows a vector in both kernels.
//!
//! Tier L2 (bit-identical): `rows` and `rows_amx` against `reference`, every row of every
//! input, random shapes (this file's tests); through `matmul_t` / `matmul_t_each` each input
//! row gets the bits it gets alone (`lane_rows_are_the_one_row_bits`).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use half::f16;

use super::amx::transpose16;
use super::matmul::{Floats, Kind, Matrix};
use super::SharedOut;

/// Whether [`rows`] takes `w`: 4-bit affine with float16 scales and biases, groups of 32 times
/// a power of two up to 512.
pub(super) fn supports(w: &Matrix<'_>) -> bool {
    match w.kind {
        Kind::Affine {
            bits: 4,
            group,
            scales: Floats::F16(_),
            biases: Floats::F16(_),
            ..
        } => {
            group % 32 == 0 && (group / 32).is_power_of_two() && group <= 512 && w.cols() % 32 == 0
        }
        _ => false,
    }
}

/// The views [`rows`] reads: the packed words, scales and biases of a 4-bit float16 affine
/// matrix ([`supports`]).
struct View<'a> {
    words: &'a [u32],
    scales: &'a [f16],
    biases: &'a [f16],
    rows: usize,
    cols: usize,
    group: usize,
}

fn view<'a>(w: &Matrix<'a>) -> Option<View<'a>> {
    match w.kind {
        Kind::Affine {
            words,
            scales: Floats::F16(scales),
            biases: Floats::F16(biases),
            bits: 4,
            group,
        } => Some(View {
            words,
            scales,
            biases,
            rows: w.rows(),
            cols: w.cols(),
            group,
        }),
        _ => None,
    }
}

/// The arithmetic the kernels follow (see the module), in plain Rust: `out` (`(m, rows)`) for
/// `m` inputs of int16 codes `q` (`(m, cols)`), chunk scales `d` and chunk float sums `s`
/// (`(m, cols / 32)` each), with the layer bias `bias`.
pub fn reference(
    w: &Matrix<'_>,
    q: &[i16],
    d: &[f32],
    s: &[f32],
    m: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let v = view(w).expect("amx_verify::reference takes 4-bit float16 affine matrices");
    let (rows, cols) = (v.rows, v.cols);
    let chunks = cols / 32;
    let groups = cols / v.group;
    let per = v.group / 32;
    for t in 0..m {
        for n in 0..rows {
            let mut acc = [0f32; 2];
            for c in 0..chunks {
                let b = v.biases[n * groups + c / per].to_f32();
                acc[c & 1] = b.mul_add(s[t * chunks + c], acc[c & 1]);
            }
            for c in 0..chunks {
                let mut sum = 0i32;
                for k in 0..32 {
                    let i = n * cols + 32 * c + k;
                    let code = (v.words[i / 8] >> (4 * (i % 8))) & 15;
                    sum += code as i32 * q[t * cols + 32 * c + k] as i32;
                }
                let f = v.scales[n * groups + c / per].to_f32() * d[t * chunks + c];
                acc[c & 1] = (sum as f32).mul_add(f, acc[c & 1]);
            }
            out[t * rows + n] = (acc[0] + acc[1]) + bias.map_or(0.0, |b| b[n]);
        }
    }
}

thread_local! {
    /// A worker's transposed words of one 16-row block (4 vectors a chunk).
    static Z: RefCell<Vec<__m512i>> = const { RefCell::new(Vec::new()) };
    /// A worker's transposed scales, then biases, of one 16-row block (16 floats a group).
    static F: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The AMX kernel's B tiles (512 bytes a chunk) and C tiles.
    static T: RefCell<(Vec<u8>, Vec<i32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

fn mask16(k: usize) -> __mmask16 {
    if k >= 16 {
        0xffff
    } else {
        (1u16 << k) - 1
    }
}

/// The float32 values of a per-group float16 array (`p`: `rows` rows of `groups`) for the 16
/// rows from `n0` (rows past the matrix repeat its last), one vector of 16 rows a group, into
/// `out[g * 16..]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and F16C; `out` holds `groups * 16` floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn factors16(p: &[f16], n0: usize, rows: usize, groups: usize, out: &mut [f32]) {
    assert!(p.len() >= rows * groups && out.len() >= groups * 16);
    let mut g0 = 0;
    while g0 < groups {
        let k = (groups - g0).min(16);
        let mut r = [_mm512_setzero_si512(); 16];
        for (i, v) in r.iter_mut().enumerate() {
            let n = (n0 + i).min(rows - 1);
            // SAFETY: k halves from row n's group g0 lie within `p` (the assert).
            *v = unsafe {
                let h = _mm256_maskz_loadu_epi16(
                    mask16(k),
                    p.as_ptr().add(n * groups + g0) as *const _,
                );
                _mm512_castps_si512(_mm512_cvtph_ps(h))
            };
        }
        for (g, v) in transpose16(&r).iter().enumerate().take(k) {
            // SAFETY: group g0 + g < groups: 16 floats within `out` (the assert).
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().add((g0 + g) * 16) as *mut _, *v) };
        }
        g0 += 16;
    }
}

/// The packed words of the 16 rows from `n0` (rows past the matrix repeat its last)
/// transposed: `z[4 * c + j]`, lane `i`: word `j` of chunk `c` of row `n0 + i`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL; `z` holds `chunks.div_ceil(4) * 16` vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn words16(v: &View<'_>, n0: usize, z: &mut [__m512i]) {
    let chunks = v.cols / 32;
    let wpr = v.cols / 8;
    assert!(v.words.len() >= v.rows * wpr && z.len() >= chunks.div_ceil(4) * 16);
    let mut c4 = 0;
    while c4 < chunks {
        let nw = ((chunks - c4) * 4).min(16);
        let mut r = [_mm512_setzero_si512(); 16];
        for (i, x) in r.iter_mut().enumerate() {
            let n = (n0 + i).min(v.rows - 1);
            // SAFETY: nw words of row n from word 4 * c4 lie within the row (the assert).
            *x = unsafe {
                _mm512_maskz_loadu_epi32(
                    mask16(nw),
                    v.words.as_ptr().add(n * wpr + c4 * 4) as *const _,
                )
            };
        }
        let t = transpose16(&r);
        z[c4 * 4..c4 * 4 + 16].copy_from_slice(&t);
        c4 += 4;
    }
}

/// Rows `r0..r1` of `out = x W^T (+ bias)` (`out`: `(m, rows)`) for `m` int16-quantized
/// inputs (codes `q`, chunk scales `d`, chunk sums `s` as `x86::quantize_x16` makes them),
/// on AVX-512 VNNI, up to six inputs a pass over each 16-row block: [`reference`]'s bits.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; [`supports`] holds for `w`; `q`
/// holds `m * cols` codes and `d`, `s` `m * cols / 32` values each; rows `r0..r1` (`r1 <=
/// rows`) of every output row are this caller's alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    q: *const i16,
    d: *const f32,
    s: *const f32,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let Some(v) = view(w) else { return };
    let groups = v.cols / v.group;
    assert!(r1 <= v.rows && v.scales.len() >= v.rows * groups && v.biases.len() >= v.rows * groups);
    F.with(|f| {
        let mut f = f.borrow_mut();
        f.resize(2 * groups * 16, 0.0);
        // SAFETY: the contract; the scratch is sized for this matrix.
        unsafe { rows_in(&v, r0, r1, q, d, s, m, out, bias, &mut f) }
    });
}

/// [`rows`] with its scratch (`f`: the block's scales then biases).
///
/// # Safety
/// As [`rows`]; `f` holds `2 * groups * 16` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_in(
    v: &View<'_>,
    r0: usize,
    r1: usize,
    q: *const i16,
    d: *const f32,
    s: *const f32,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
    f: &mut [f32],
) {
    let chunks = v.cols / 32;
    let groups = v.cols / v.group;
    assert!(v.words.len() >= v.rows * (v.cols / 8));
    let mut n0 = r0;
    while n0 < r1 {
        // SAFETY: the contract.
        unsafe {
            let (sv, bv) = f.split_at_mut(groups * 16);
            factors16(v.scales, n0, v.rows, groups, sv);
            factors16(v.biases, n0, v.rows, groups, bv);
            // The next block's scales and biases on their way to L1 (its words: `block`).
            if n0 + 16 < v.rows {
                let nb = (v.rows - n0 - 16).min(16) * groups;
                for p in [v.scales.as_ptr(), v.biases.as_ptr()] {
                    let p = p.add((n0 + 16) * groups) as *const i8;
                    let mut o = 0;
                    while o < nb * 2 {
                        _mm_prefetch::<_MM_HINT_T0>(p.add(o));
                        o += 64;
                    }
                }
            }
            let nr = (r1 - n0).min(16);
            let mut t0 = 0;
            while t0 < m {
                let mt = (m - t0).min(MAX_MT);
                let qt = q.add(t0 * v.cols);
                let (dt, st) = (d.add(t0 * chunks), s.add(t0 * chunks));
                match mt {
                    1 => block::<1>(v, sv, bv, qt, dt, st, n0, nr, t0, out, bias),
                    2 => block::<2>(v, sv, bv, qt, dt, st, n0, nr, t0, out, bias),
                    3 => block::<3>(v, sv, bv, qt, dt, st, n0, nr, t0, out, bias),
                    4 => block::<4>(v, sv, bv, qt, dt, st, n0, nr, t0, out, bias),
                    5 => block::<5>(v, sv, bv, qt, dt, st, n0, nr, t0, out, bias),
                    _ => block::<6>(v, sv, bv, qt, dt, st, n0, nr, t0, out, bias),
                }
                t0 += mt;
            }
        }
        n0 += 16;
    }
}

/// The most inputs [`rows`] takes a pass over each 16-row block.
const MAX_MT: usize = 6;

/// The bias of output rows `n0..n0 + 16` (0 past `nr` rows and without a bias).
fn bias16(bias: Option<Floats<'_>>, n0: usize, nr: usize) -> [f32; 16] {
    let mut b = [0f32; 16];
    if let Some(bias) = bias {
        for (i, v) in b.iter_mut().enumerate().take(nr) {
            *v = bias.get(n0 + i);
        }
    }
    b
}

/// [`rows`] for `MT` inputs (from input `t0`) over the 16-row block at `n0` (`nr` rows of it
/// written).
///
/// # Safety
/// As [`rows`]; `sv`, `bv` hold the block's transposed scales and biases; `q`, `d`,
/// `s` point at input `t0`'s.
#[inline]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block<const MT: usize>(
    v: &View<'_>,
    sv: &[f32],
    bv: &[f32],
    q: *const i16,
    d: *const f32,
    s: *const f32,
    n0: usize,
    nr: usize,
    t0: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let chunks = v.cols / 32;
    let shift = (v.group / 32).trailing_zeros();
    let nib = _mm512_set1_epi8(0x0f);
    // Per 128-bit lane j (codes 8j..8j+8): the low bytes of the even codes, their high bytes,
    // the low bytes of the odd codes, their high bytes.
    let pick = _mm512_set4_epi32(0x0f0b_0703, 0x0e0a_0602, 0x0d09_0501, 0x0c08_0400);
    // SAFETY (whole body): reads within the contract's buffers (chunk c of input t, group
    // c >> shift of the block's factors); the output range is this caller's.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MT];
        for c in 0..chunks {
            let b = _mm512_loadu_ps(bv.as_ptr().add((c >> shift) * 16));
            for t in 0..MT {
                let xs = _mm512_set1_ps(*s.add(t * chunks + c));
                acc[t][c & 1] = _mm512_fmadd_ps(b, xs, acc[t][c & 1]);
            }
        }
        #[repr(C, align(64))]
        struct Lanes([u32; 16]);
        let mut xb = [const { Lanes([0; 16]) }; MT];
        let wpr = v.cols / 8;
        let mut zt = [_mm512_setzero_si512(); 16];
        for c in 0..chunks {
            if c % 4 == 0 {
                // The next 4 chunks' words of the 16 rows, transposed (rows past the matrix
                // repeat its last; words past the row read as 0).
                let nw = ((chunks - c) * 4).min(16);
                let mut r = [_mm512_setzero_si512(); 16];
                for (i, x) in r.iter_mut().enumerate() {
                    let n = (n0 + i).min(v.rows - 1);
                    let p = v.words.as_ptr().add(n * wpr + c * 4);
                    *x = _mm512_maskz_loadu_epi32(mask16(nw), p as *const _);
                }
                zt = transpose16(&r);
                // A share of the next block's words on their way to L1 (the first pass over
                // this block only): each of the ceil(chunks / 4) steps its share of the lines.
                if t0 == 0 && n0 + 16 < v.rows {
                    let bytes = (v.rows - n0 - 16).min(16) * wpr * 4;
                    let lines = bytes.div_ceil(64);
                    let per = lines.div_ceil(chunks.div_ceil(4));
                    let base = v.words.as_ptr().add((n0 + 16) * wpr) as *const i8;
                    let first = c / 4 * per;
                    for l in first..(first + per).min(lines) {
                        _mm_prefetch::<_MM_HINT_T0>(base.add(l * 64));
                    }
                }
            }
            let sc = _mm512_loadu_ps(sv.as_ptr().add((c >> shift) * 16));
            let mut lo = [_mm512_setzero_si512(); 4];
            let mut hi = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                let zv = zt[4 * (c % 4) + j];
                lo[j] = _mm512_and_si512(zv, nib);
                hi[j] = _mm512_and_si512(_mm512_srli_epi32::<4>(zv), nib);
            }
            for t in 0..MT {
                let x = _mm512_loadu_si512(q.add(t * v.cols + 32 * c) as *const _);
                _mm512_store_si512(xb[t].0.as_mut_ptr() as *mut _, _mm512_shuffle_epi8(x, pick));
            }
            for t in 0..MT {
                let xp = xb[t].0.as_ptr();
                let bc = |i: usize| _mm512_set1_epi32(*xp.add(i) as i32);
                let mut sh = _mm512_setzero_si512();
                let mut sl = _mm512_setzero_si512();
                for j in 0..4 {
                    sh = _mm512_dpbusd_epi32(sh, lo[j], bc(4 * j + 1));
                    sl = _mm512_dpbusd_epi32(sl, bc(4 * j), lo[j]);
                    sh = _mm512_dpbusd_epi32(sh, hi[j], bc(4 * j + 3));
                    sl = _mm512_dpbusd_epi32(sl, bc(4 * j + 2), hi[j]);
                }
                let sum = _mm512_add_epi32(_mm512_slli_epi32::<8>(sh), sl);
                let f = _mm512_mul_ps(sc, _mm512_set1_ps(*d.add(t * chunks + c)));
                acc[t][c & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), f, acc[t][c & 1]);
            }
        }
        let b = _mm512_loadu_ps(bias16(bias, n0, nr).as_ptr());
        for t in 0..MT {
            let o = out.range((t0 + t) * v.rows + n0, nr);
            let r = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), b);
            _mm512_mask_storeu_ps(o.as_mut_ptr(), mask16(nr), r);
        }
    }
}

thread_local! {
    /// A worker's inputs in the byte order the lane kernels broadcast ([`pick_inputs`]).
    static XB: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// The `m` inputs' int16 codes (`q`, `m * cols`) with each chunk's 64 bytes reordered as the
/// lane kernels broadcast them: per 4-code word `j` of the chunk (codes `8j..8j + 8`) the low
/// bytes of its 4 even codes, their high bytes, the low bytes of its 4 odd codes, their high
/// bytes (`xb[(t * chunks + c) * 16 + 4 j + k]`), as [`block`] shuffles them per chunk.
///
/// # Safety
/// The CPU has AVX-512 F/BW; `q` holds `m * cols` codes; `xb` holds `m * cols / 2` words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn pick_inputs(q: *const i16, m: usize, cols: usize, xb: &mut [u32]) {
    let n = m * cols / 32;
    assert!(xb.len() >= n * 16);
    let pick = _mm512_set4_epi32(0x0f0b_0703, 0x0e0a_0602, 0x0d09_0501, 0x0c08_0400);
    for i in 0..n {
        // SAFETY: chunk i's 32 codes lie within `q`; 16 words within `xb` (the assert).
        unsafe {
            let x = _mm512_loadu_si512(q.add(32 * i) as *const _);
            _mm512_storeu_si512(
                xb.as_mut_ptr().add(16 * i) as *mut _,
                _mm512_shuffle_epi8(x, pick),
            );
        }
    }
}

/// Rows `r0..r1` of `out` as [`rows`] computes them (the same bits: [`reference`]'s), from the
/// lane layout attached to `w` ([`Matrix::with_lanes`]): the words, scales and biases of each
/// 16-row block are plain loads, not transposes. 4-bit symmetric matrices (Q4_0) too (their
/// biases formed at packing, the bits of the materialized ones). Up to six inputs a pass over
/// each block; a block only partly in `r0..r1` is computed whole and stored in part.
///
/// # Safety
/// As [`rows`], with `w.lanes()` attached.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_lanes(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    q: *const i16,
    d: *const f32,
    s: *const f32,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let Some(l) = w.lanes() else { return };
    if m >= 2 && lane_amx() {
        // SAFETY: the contract; AMX-INT8 usable (lane_amx).
        unsafe { rows_lanes_amx(l, r0, r1, q, d, s, m, out, bias) };
        return;
    }
    // SAFETY: the contract.
    unsafe { rows_lanes_vnni(l, r0, r1, q, d, s, m, out, bias) }
}

/// Panics unless rows `..r1` lie within `l` and its arrays hold every block.
fn check_lanes(l: &super::lanes::Lanes16, r1: usize) {
    let chunks = l.cols / 32;
    let groups = l.cols / l.group;
    let blocks = l.rows.div_ceil(16);
    assert!(
        r1 <= l.rows
            && l.words.len() >= blocks * chunks * 64
            && l.scales.len() >= blocks * groups * 16
            && l.biases.len() >= blocks * groups * 16,
        "lanes: rows ..{r1} of {} or a short layout",
        l.rows
    );
}

/// [`rows_lanes`] on AVX-512 VNNI whatever the number of inputs.
///
/// # Safety
/// As [`rows_lanes`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_lanes_vnni(
    l: &super::lanes::Lanes16,
    r0: usize,
    r1: usize,
    q: *const i16,
    d: *const f32,
    s: *const f32,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    check_lanes(l, r1);
    let chunks = l.cols / 32;
    let blocks = l.rows.div_ceil(16);
    XB.with(|xb| {
        let mut xb = xb.borrow_mut();
        xb.resize(m * chunks * 16, 0);
        // SAFETY: the contract (q holds m rows of cols codes); xb sized above.
        unsafe { pick_inputs(q, m, l.cols, &mut xb) };
        let mut b = r0 / 16;
        while b * 16 < r1 {
            let (lo, hi) = ((b * 16).max(r0), (b * 16 + 16).min(r1));
            let mut t0 = 0;
            while t0 < m {
                let mt = (m - t0).min(MAX_MT);
                // SAFETY: the contract; inputs t0..t0 + mt of xb, d and s.
                unsafe {
                    let x = xb.as_ptr().add(t0 * chunks * 16);
                    let (dt, st) = (d.add(t0 * chunks), s.add(t0 * chunks));
                    let pf = t0 == 0 && b + 1 < blocks;
                    match mt {
                        1 => block_l::<1>(l, b, x, dt, st, lo, hi, t0, out, bias, pf),
                        2 => block_l::<2>(l, b, x, dt, st, lo, hi, t0, out, bias, pf),
                        3 => block_l::<3>(l, b, x, dt, st, lo, hi, t0, out, bias, pf),
                        4 => block_l::<4>(l, b, x, dt, st, lo, hi, t0, out, bias, pf),
                        5 => block_l::<5>(l, b, x, dt, st, lo, hi, t0, out, bias, pf),
                        _ => block_l::<6>(l, b, x, dt, st, lo, hi, t0, out, bias, pf),
                    }
                }
                t0 += mt;
            }
            b += 1;
        }
    });
}

/// Whether [`rows_lanes`] takes 2 or more inputs on AMX's int8 tiles ([`rows_lanes_amx`]):
/// only with `MLX_CPU_LANE_AMX=1` where the CPU and OS allow them ([`amx_int8_available`]).
/// Off by default: measured slower than the VNNI kernel at every row count here
/// (`results/spec/2026-12-06-s37-speccpu/`).
pub fn lane_amx() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("MLX_CPU_LANE_AMX").is_ok_and(|v| v == "1") && amx_int8_available()
    })
}

thread_local! {
    /// A worker's A tiles, B tiles and C tiles for [`rows_lanes_amx`].
    static LT: RefCell<(Vec<u8>, Vec<u8>, Vec<i32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The most inputs a pass of [`rows_lanes_amx`] takes (its A and C tiles hold `2 m + 1`
/// rows).
const LANE_AMX_MT: usize = 7;

/// [`amx_l`]'s ring of B and C tiles: slots, how many chunks ahead a B tile is written and
/// how many behind a C tile is read.
const RING: usize = 8;
const LEAD: usize = 3;
const LAG: usize = 3;

/// [`rows_lanes`] for 2 or more inputs with the integer sums on AMX (as [`rows_amx`] forms
/// them: per block and chunk one `tdpbuud` of `2 m + 1` rows, the B tile the block's lane
/// words split into nibbles, plain stores), the float epilogue [`block_l`]'s: the same bits
/// ([`reference`]'s). Inputs in passes of up to [`LANE_AMX_MT`].
///
/// # Safety
/// As [`rows_lanes`], and AMX-INT8 usable by this thread ([`amx_int8_available`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_lanes_amx(
    l: &super::lanes::Lanes16,
    r0: usize,
    r1: usize,
    q: *const i16,
    d: *const f32,
    s: *const f32,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    check_lanes(l, r1);
    let chunks = l.cols / 32;
    LT.with(|lt| {
        let mut lt = lt.borrow_mut();
        let (xa, bt, ct) = &mut *lt;
        let passes = m.div_ceil(LANE_AMX_MT);
        let mut t0 = 0;
        for p in 0..passes {
            let mt = (m - t0).div_ceil(passes - p);
            let r = 2 * mt + 1;
            xa.resize(chunks * r * 32, 0);
            bt.resize(RING * 512, 0);
            ct.resize(RING * r * 16, 0);
            // SAFETY: the contract; inputs t0..t0 + mt; the scratch sized above.
            unsafe {
                lane_a_tiles(q.add(t0 * l.cols), mt, l.cols, xa);
                let (dt, st) = (d.add(t0 * chunks), s.add(t0 * chunks));
                match mt {
                    1 => amx_l::<1>(l, r0, r1, xa, dt, st, t0, out, bias, bt, ct),
                    2 => amx_l::<2>(l, r0, r1, xa, dt, st, t0, out, bias, bt, ct),
                    3 => amx_l::<3>(l, r0, r1, xa, dt, st, t0, out, bias, bt, ct),
                    4 => amx_l::<4>(l, r0, r1, xa, dt, st, t0, out, bias, bt, ct),
                    5 => amx_l::<5>(l, r0, r1, xa, dt, st, t0, out, bias, bt, ct),
                    6 => amx_l::<6>(l, r0, r1, xa, dt, st, t0, out, bias, bt, ct),
                    _ => amx_l::<7>(l, r0, r1, xa, dt, st, t0, out, bias, bt, ct),
                }
            }
            t0 += mt;
        }
    });
}

/// The A tiles of `mt` inputs (`q`: `mt * cols` int16 codes) in [`amx_inputs`]' layout, with
/// vector shuffles: per chunk `2 mt + 1` rows of 32 bytes (the high bytes plus 128, the low
/// bytes, ones).
///
/// # Safety
/// The CPU has AVX-512 F/BW; `q` holds `mt * cols` codes; `xa` holds `cols / 32 * (2 mt + 1)
/// * 32` bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn lane_a_tiles(q: *const i16, mt: usize, cols: usize, xa: &mut [u8]) {
    let chunks = cols / 32;
    let r = 2 * mt + 1;
    assert!(xa.len() >= chunks * r * 32);
    let pick = _mm512_set4_epi32(0x0f0b_0703, 0x0e0a_0602, 0x0d09_0501, 0x0c08_0400);
    // Dwords 0..8: the low bytes (even codes of words 0..4, then odd), 8..16: the high ones.
    let idx = _mm512_set_epi32(15, 11, 7, 3, 13, 9, 5, 1, 14, 10, 6, 2, 12, 8, 4, 0);
    let flip = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi8(-128));
    let ones = _mm256_set1_epi8(1);
    let a = xa.as_mut_ptr();
    for c in 0..chunks {
        // SAFETY: chunk c of each input lies within `q`; the rows within `xa` (the assert).
        unsafe {
            for t in 0..mt {
                let x = _mm512_loadu_si512(q.add(t * cols + 32 * c) as *const _);
                let y = _mm512_permutexvar_epi32(idx, _mm512_shuffle_epi8(x, pick));
                let y = _mm512_xor_si512(y, flip);
                _mm256_storeu_si256(
                    a.add((c * r + mt + t) * 32) as *mut _,
                    _mm512_castsi512_si256(y),
                );
                _mm256_storeu_si256(
                    a.add((c * r + t) * 32) as *mut _,
                    _mm512_extracti64x4_epi64::<1>(y),
                );
            }
            _mm256_storeu_si256(a.add((c * r + 2 * mt) * 32) as *mut _, ones);
        }
    }
}

/// One chunk's product on the tile unit: `cc` (`r` rows of 16 int32, rows 64 bytes apart) =
/// `a` (`r` rows of 32 bytes) times the chunk's B tile `b` (8 rows of 64 bytes), on tile
/// registers 0-2 for an `even` chunk and 3-5 for an odd one (the configuration's two sets),
/// so that consecutive chunks' products do not wait on one register.
///
/// # Safety
/// AMX is available and a configuration with both sets (B 8 x 64, A `r` x 32, C `r` x 64
/// bytes) is loaded; `b`, `a` and `cc` point at that many readable (`cc`: writable) bytes.
#[inline(always)]
unsafe fn tile_product(even: bool, b: *const u8, a: *const u8, cc: *mut i32) {
    // SAFETY: the caller's contract.
    unsafe {
        if even {
            asm!(
                "tileloadd tmm0, [{b} + {s64}*1]",
                "tileloadd tmm1, [{a} + {s32}*1]",
                "tilezero tmm2",
                "tdpbuud tmm2, tmm1, tmm0",
                "tilestored [{c} + {s64}*1], tmm2",
                b = in(reg) b, a = in(reg) a, c = in(reg) cc,
                s64 = in(reg) 64usize, s32 = in(reg) 32usize,
                options(nostack)
            );
        } else {
            asm!(
                "tileloadd tmm3, [{b} + {s64}*1]",
                "tileloadd tmm4, [{a} + {s32}*1]",
                "tilezero tmm5",
                "tdpbuud tmm5, tmm4, tmm3",
                "tilestored [{c} + {s64}*1], tmm5",
                b = in(reg) b, a = in(reg) a, c = in(reg) cc,
                s64 = in(reg) 64usize, s32 = in(reg) 32usize,
                options(nostack)
            );
        }
    }
}

/// [`rows_lanes_amx`]'s pass of `MT` inputs (from input `t0`) over the blocks of `r0..r1`.
///
/// # Safety
/// As [`rows_lanes_amx`]; `xa` holds the inputs' A tiles ([`lane_a_tiles`]), `bt` `RING *
/// 512` bytes, `ct` `RING * (2 MT + 1) * 16` words.
#[inline]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn amx_l<const MT: usize>(
    l: &super::lanes::Lanes16,
    r0: usize,
    r1: usize,
    xa: &[u8],
    d: *const f32,
    s: *const f32,
    t0: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
    bt: &mut [u8],
    ct: &mut [i32],
) {
    let r = 2 * MT + 1;
    let chunks = l.cols / 32;
    let groups = l.cols / l.group;
    let shift = (l.group / 32).trailing_zeros();
    let blocks = l.rows.div_ceil(16);
    assert!(xa.len() >= chunks * r * 32 && bt.len() >= RING * 512 && ct.len() >= RING * r * 16);
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for set in 0..2 {
        cfg.rows[3 * set] = 8;
        cfg.colsb[3 * set] = 64;
        cfg.rows[3 * set + 1] = r as u8;
        cfg.colsb[3 * set + 1] = 32;
        cfg.rows[3 * set + 2] = r as u8;
        cfg.colsb[3 * set + 2] = 64;
    }
    let nib = _mm512_set1_epi8(0x0f);
    // SAFETY (whole body): the layout's blocks, the inputs and the scratch as checked (the
    // asserts here and in `rows_lanes`); tile loads and stores stay within `bt`, `xa`, `ct`;
    // the configuration is 64 readable bytes; prefetches are hints naming the next block,
    // which exists; the output rows of `r0..r1` are this caller's.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) &cfg, options(nostack, readonly));
        let (bp, cp) = (bt.as_mut_ptr(), ct.as_mut_ptr());
        let f16x16 = |p: *const f16| _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _));
        let mut b = r0 / 16;
        while b * 16 < r1 {
            let wp = l.words.as_ptr().add(b * chunks * 64);
            let sp = l.scales.as_ptr().add(b * groups * 16);
            let bq = l.biases.as_ptr().add(b * groups * 16);
            let (nw, ns) = (chunks * 64, groups * 16);
            let pf = t0 == 0 && b + 1 < blocks;
            let mut acc = [[_mm512_setzero_ps(); 2]; MT];
            for c in 0..chunks {
                let bv = f16x16(bq.add((c >> shift) * 16));
                for t in 0..MT {
                    let xs = _mm512_set1_ps(*s.add(t * chunks + c));
                    acc[t][c & 1] = _mm512_fmadd_ps(bv, xs, acc[t][c & 1]);
                }
            }
            // A ring of RING slots: chunk c's B tile is written LEAD chunks before its
            // product, and its C tile read LAG chunks after (stores settle before the tile
            // unit or the vector loads read them; the scratch stays in L1).
            let prep = |c: usize| {
                let slot = bp.add(c % RING * 512);
                for j in 0..4 {
                    let zv = _mm512_loadu_si512(wp.add((c * 4 + j) * 16) as *const _);
                    let lo = _mm512_and_si512(zv, nib);
                    let hi = _mm512_and_si512(_mm512_srli_epi32::<4>(zv), nib);
                    _mm512_storeu_si512(slot.add(j * 64) as *mut _, lo);
                    _mm512_storeu_si512(slot.add((4 + j) * 64) as *mut _, hi);
                }
            };
            for c in 0..LEAD.min(chunks) {
                prep(c);
            }
            for c in 0..chunks + LAG {
                if pf && c < chunks {
                    let p = wp.add(nw + c * 64) as *const i8;
                    for k in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(p.add(64 * k));
                    }
                    if c * 32 < ns {
                        _mm_prefetch::<_MM_HINT_T0>(sp.add(ns + c * 32) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(bq.add(ns + c * 32) as *const i8);
                    }
                }
                if c + LEAD < chunks {
                    prep(c + LEAD);
                }
                if c < chunks {
                    let (bb, a, cc) = (
                        bp.add(c % RING * 512),
                        xa.as_ptr().add(c * r * 32),
                        cp.add(c % RING * r * 16),
                    );
                    tile_product(c % 2 == 0, bb, a, cc);
                }
                if c >= LAG {
                    let e = c - LAG;
                    let sc = f16x16(sp.add((e >> shift) * 16));
                    let cc = cp.add(e % RING * r * 16);
                    let onesc = _mm512_slli_epi32::<15>(_mm512_loadu_si512(
                        cc.add(2 * MT * 16) as *const _
                    ));
                    for t in 0..MT {
                        let ch = _mm512_loadu_si512(cc.add(t * 16) as *const _);
                        let cl = _mm512_loadu_si512(cc.add((MT + t) * 16) as *const _);
                        let sum = _mm512_add_epi32(
                            _mm512_sub_epi32(_mm512_slli_epi32::<8>(ch), onesc),
                            cl,
                        );
                        let f = _mm512_mul_ps(sc, _mm512_set1_ps(*d.add(t * chunks + e)));
                        acc[t][e & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), f, acc[t][e & 1]);
                    }
                }
            }
            let n0 = b * 16;
            let nr = (l.rows - n0).min(16);
            let (lo, hi) = (n0.max(r0), (n0 + 16).min(r1));
            let bvec = _mm512_loadu_ps(bias16(bias, n0, nr).as_ptr());
            let keep = mask16(hi - n0) & !mask16(lo - n0);
            for t in 0..MT {
                let o = out.range((t0 + t) * l.rows + n0, nr);
                let res = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), bvec);
                _mm512_mask_storeu_ps(o.as_mut_ptr(), keep, res);
            }
            b += 1;
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// [`rows_lanes`] for `MT` inputs (from input `t0`: `xb`, `d`, `s` point at its values) over
/// block `b`, rows `lo..hi` of it stored; `pf`: prefetch block `b + 1` on the way.
///
/// # Safety
/// As [`rows_lanes`].
#[inline]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_l<const MT: usize>(
    l: &super::lanes::Lanes16,
    b: usize,
    xb: *const u32,
    d: *const f32,
    s: *const f32,
    lo: usize,
    hi: usize,
    t0: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
    pf: bool,
) {
    let chunks = l.cols / 32;
    let groups = l.cols / l.group;
    let shift = (l.group / 32).trailing_zeros();
    let nib = _mm512_set1_epi8(0x0f);
    // SAFETY (whole body): block b's words, scales and biases lie within the layout
    // (`rows_lanes`' assert); inputs within the contract's buffers; prefetches are hints
    // naming block b + 1, which exists when `pf` is set; the output rows lo..hi of every
    // input are this caller's.
    unsafe {
        let wp = l.words.as_ptr().add(b * chunks * 64);
        let sp = l.scales.as_ptr().add(b * groups * 16);
        let bp = l.biases.as_ptr().add(b * groups * 16);
        let f16x16 = |p: *const f16| _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _));
        let mut acc = [[_mm512_setzero_ps(); 2]; MT];
        for c in 0..chunks {
            let bv = f16x16(bp.add((c >> shift) * 16));
            for t in 0..MT {
                let xs = _mm512_set1_ps(*s.add(t * chunks + c));
                acc[t][c & 1] = _mm512_fmadd_ps(bv, xs, acc[t][c & 1]);
            }
        }
        let (nw, ns) = (chunks * 64, groups * 16);
        for c in 0..chunks {
            if pf {
                // Block b + 1's share: this chunk's 4 lines of words, a line of its scales and
                // of its biases while any are left.
                let p = wp.add(nw + c * 64) as *const i8;
                for k in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(64 * k));
                }
                if c * 32 < ns {
                    _mm_prefetch::<_MM_HINT_T0>(sp.add(ns + c * 32) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(bp.add(ns + c * 32) as *const i8);
                }
            }
            let sc = f16x16(sp.add((c >> shift) * 16));
            let mut lov = [_mm512_setzero_si512(); 4];
            let mut hiv = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                let zv = _mm512_loadu_si512(wp.add((c * 4 + j) * 16) as *const _);
                lov[j] = _mm512_and_si512(zv, nib);
                hiv[j] = _mm512_and_si512(_mm512_srli_epi32::<4>(zv), nib);
            }
            for t in 0..MT {
                let xp = xb.add((t * chunks + c) * 16);
                let bc = |i: usize| _mm512_set1_epi32(*xp.add(i) as i32);
                let mut sh = _mm512_setzero_si512();
                let mut sl = _mm512_setzero_si512();
                for j in 0..4 {
                    sh = _mm512_dpbusd_epi32(sh, lov[j], bc(4 * j + 1));
                    sl = _mm512_dpbusd_epi32(sl, bc(4 * j), lov[j]);
                    sh = _mm512_dpbusd_epi32(sh, hiv[j], bc(4 * j + 3));
                    sl = _mm512_dpbusd_epi32(sl, bc(4 * j + 2), hiv[j]);
                }
                let sum = _mm512_add_epi32(_mm512_slli_epi32::<8>(sh), sl);
                let f = _mm512_mul_ps(sc, _mm512_set1_ps(*d.add(t * chunks + c)));
                acc[t][c & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), f, acc[t][c & 1]);
            }
        }
        let n0 = b * 16;
        let nr = (l.rows - n0).min(16);
        let bvec = _mm512_loadu_ps(bias16(bias, n0, nr).as_ptr());
        // Lanes lo - n0 .. hi - n0 of the block are stored.
        let keep = mask16(hi - n0) & !mask16(lo - n0);
        for t in 0..MT {
            let o = out.range((t0 + t) * l.rows + n0, nr);
            let r = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), bvec);
            _mm512_mask_storeu_ps(o.as_mut_ptr(), keep, r);
        }
    }
}

/// The most inputs [`rows_amx`] takes (its A and C tiles hold `2 m + 1` rows).
pub const AMX_MAX_M: usize = 7;

/// The inputs in the A-tile layout of [`rows_amx`]: per chunk `2 m + 1` rows of 32 bytes
/// (rows `0..m`: the codes' high bytes plus 128, `m..2m`: their low bytes, `2m`: ones), the
/// 32 codes of a chunk in the order of the B tile's K (per word `j` of the chunk the 4 even
/// codes `8j + 2i`, then the 4 odd ones; see [`rows`]).
pub fn amx_inputs(q: &[i16], m: usize, cols: usize, xa: &mut Vec<u8>) {
    let chunks = cols / 32;
    let r = 2 * m + 1;
    xa.clear();
    xa.resize(chunks * r * 32, 0);
    for c in 0..chunks {
        let base = c * r * 32;
        for p in 0..32 {
            let (kk, i) = (p / 4, p % 4);
            let k = 32 * c
                + if kk < 4 {
                    8 * kk + 2 * i
                } else {
                    8 * (kk - 4) + 2 * i + 1
                };
            for t in 0..m {
                let v = q[t * cols + k];
                xa[base + t * 32 + p] = ((v >> 8) + 128) as u8;
                xa[base + (m + t) * 32 + p] = (v & 0xff) as u8;
            }
            xa[base + 2 * m * 32 + p] = 1;
        }
    }
}

#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Rows `r0..r1` of `out = x W^T (+ bias)` for `m` (1 to [`AMX_MAX_M`]) inputs as [`rows`]
/// computes them, the integer sums on AMX (`xa`: [`amx_inputs`]): per 16-row block and chunk
/// one `tdpbuud` of `2 m + 1` input rows; [`reference`]'s bits.
///
/// # Safety
/// As [`rows`], and AMX-TILE / AMX-INT8 are usable by this thread (`amx::available`); `xa`
/// is [`amx_inputs`] of the same `q`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_amx(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    xa: &[u8],
    d: *const f32,
    s: *const f32,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let Some(v) = view(w) else { return };
    assert!((1..=AMX_MAX_M).contains(&m));
    let r = 2 * m + 1;
    let chunks = v.cols / 32;
    let groups = v.cols / v.group;
    assert!(xa.len() >= chunks * r * 32);
    assert!(r1 <= v.rows && v.scales.len() >= v.rows * groups && v.biases.len() >= v.rows * groups);
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for set in 0..2 {
        cfg.rows[3 * set] = 8;
        cfg.colsb[3 * set] = 64;
        cfg.rows[3 * set + 1] = r as u8;
        cfg.colsb[3 * set + 1] = 32;
        cfg.rows[3 * set + 2] = r as u8;
        cfg.colsb[3 * set + 2] = 64;
    }
    Z.with(|z| {
        F.with(|f| {
            T.with(|tb| {
                let (mut z, mut f, mut tb) = (z.borrow_mut(), f.borrow_mut(), tb.borrow_mut());
                z.resize(chunks.div_ceil(4) * 16, _mm512_setzero_si512());
                f.resize(2 * groups * 16, 0.0);
                let (bt, ct) = &mut *tb;
                bt.resize(chunks * 512, 0);
                ct.resize(chunks * r * 16, 0);
                // SAFETY: the contract; the scratch is sized for this matrix and `m`.
                unsafe {
                    amx_in(
                        &v, r0, r1, xa, d, s, m, out, bias, &cfg, &mut z, &mut f, bt, ct,
                    )
                }
            })
        })
    });
}

/// [`rows_amx`] with its scratch (`bt`: the B tiles, `ct`: the C tiles).
///
/// # Safety
/// As [`rows_amx`], with the scratch sized as it sizes it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_in(
    v: &View<'_>,
    r0: usize,
    r1: usize,
    xa: &[u8],
    d: *const f32,
    s: *const f32,
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
    cfg: &TileConfig,
    z: &mut [__m512i],
    f: &mut [f32],
    bt: &mut [u8],
    ct: &mut [i32],
) {
    let r = 2 * m + 1;
    let chunks = v.cols / 32;
    let groups = v.cols / v.group;
    let shift = (v.group / 32).trailing_zeros();
    let nib = _mm512_set1_epi8(0x0f);
    // SAFETY (whole block): the contract; tile loads and stores stay within `bt`,
    // `xa` and `ct` (sized above); the configuration is 64 readable bytes.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) cfg, options(nostack, readonly));
        let (bp, cp) = (bt.as_mut_ptr(), ct.as_mut_ptr());
        let mut n0 = r0;
        while n0 < r1 {
            let nr = (r1 - n0).min(16);
            words16(v, n0, z);
            for c in 0..chunks {
                for j in 0..4 {
                    let zv = z[4 * c + j];
                    let lo = _mm512_and_si512(zv, nib);
                    let hi = _mm512_and_si512(_mm512_srli_epi32::<4>(zv), nib);
                    _mm512_storeu_si512(bp.add(c * 512 + j * 64) as *mut _, lo);
                    _mm512_storeu_si512(bp.add(c * 512 + (4 + j) * 64) as *mut _, hi);
                }
            }
            for c in 0..chunks {
                let (b, a, cc) = (
                    bp.add(c * 512),
                    xa.as_ptr().add(c * r * 32),
                    cp.add(c * r * 16),
                );
                tile_product(c % 2 == 0, b, a, cc);
            }
            let (sv, bv) = f.split_at_mut(groups * 16);
            factors16(v.scales, n0, v.rows, groups, sv);
            factors16(v.biases, n0, v.rows, groups, bv);
            let bb = _mm512_loadu_ps(bias16(bias, n0, nr).as_ptr());
            for t in 0..m {
                let mut acc = [_mm512_setzero_ps(); 2];
                for c in 0..chunks {
                    let b = _mm512_loadu_ps(bv.as_ptr().add((c >> shift) * 16));
                    let xs = _mm512_set1_ps(*s.add(t * chunks + c));
                    acc[c & 1] = _mm512_fmadd_ps(b, xs, acc[c & 1]);
                }
                for c in 0..chunks {
                    let sc = _mm512_loadu_ps(sv.as_ptr().add((c >> shift) * 16));
                    let cc = cp.add(c * r * 16);
                    let ones = _mm512_loadu_si512(cc.add(2 * m * 16) as *const _);
                    let ch = _mm512_loadu_si512(cc.add(t * 16) as *const _);
                    let cl = _mm512_loadu_si512(cc.add((m + t) * 16) as *const _);
                    let sum = _mm512_add_epi32(
                        _mm512_sub_epi32(_mm512_slli_epi32::<8>(ch), _mm512_slli_epi32::<15>(ones)),
                        cl,
                    );
                    let fct = _mm512_mul_ps(sc, _mm512_set1_ps(*d.add(t * chunks + c)));
                    acc[c & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), fct, acc[c & 1]);
                }
                let o = out.range(t * v.rows + n0, nr);
                let res = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), bb);
                _mm512_mask_storeu_ps(o.as_mut_ptr(), mask16(nr), res);
            }
            n0 += 16;
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Which kernel [`products`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// [`reference`].
    Reference,
    /// The AVX-512 VNNI kernel.
    Vnni,
    /// The AMX tile kernel (at most [`AMX_MAX_M`] inputs).
    Amx,
    /// The AVX-512 VNNI kernel over the lane layout attached to the matrix
    /// ([`Matrix::with_lanes`]; 4-bit symmetric matrices too).
    Lanes,
    /// The AMX tile kernel over the lane layout (what `rows_lanes` runs for 2 or more inputs).
    LanesAmx,
}

/// `out = x W^T (+ bias)` for `m` int16-quantized inputs (as the CPU decoder quantizes them)
/// through one of this file's kernels on the calling thread, for tests and micro benchmarks.
/// `None` where the CPU lacks the kernel's instructions, `w` is not a 4-bit float16 affine
/// matrix or the sizes do not match.
#[allow(clippy::too_many_arguments)]
pub fn products(
    kernel: Kernel,
    w: &Matrix<'_>,
    q: &[i16],
    d: &[f32],
    s: &[f32],
    m: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Option<()> {
    let (n, cols) = (w.rows(), w.cols());
    let chunks = cols / 32;
    let takes = if matches!(kernel, Kernel::Lanes | Kernel::LanesAmx) {
        w.lanes().is_some()
    } else {
        supports(w)
    };
    if !takes
        || m == 0
        || q.len() < m * cols
        || d.len() < m * chunks
        || s.len() < m * chunks
        || out.len() < m * n
        || bias.is_some_and(|b| b.len() < n)
    {
        return None;
    }
    let fb = bias.map(Floats::F32);
    match kernel {
        Kernel::Reference => reference(w, q, d, s, m, bias, out),
        Kernel::Vnni => {
            if !super::Isa::Avx512.available() {
                return None;
            }
            // SAFETY: AVX-512 F/BW/VL/VNNI checked; sizes checked above; one thread.
            unsafe {
                rows(
                    w,
                    0,
                    n,
                    q.as_ptr(),
                    d.as_ptr(),
                    s.as_ptr(),
                    m,
                    SharedOut::new(out),
                    fb,
                )
            }
        }
        Kernel::Lanes | Kernel::LanesAmx => {
            let l = w.lanes()?;
            if !super::Isa::Avx512.available()
                || (kernel == Kernel::LanesAmx && !amx_int8_available())
            {
                return None;
            }
            let f = if kernel == Kernel::Lanes {
                rows_lanes_vnni
            } else {
                rows_lanes_amx
            };
            // SAFETY: AVX-512 F/BW/VL/VNNI checked (and AMX-INT8 for the tiles); lanes
            // attached; sizes checked above; one thread.
            unsafe {
                f(
                    l,
                    0,
                    n,
                    q.as_ptr(),
                    d.as_ptr(),
                    s.as_ptr(),
                    m,
                    SharedOut::new(out),
                    fb,
                )
            }
        }
        Kernel::Amx => {
            if m > AMX_MAX_M || !amx_int8_available() {
                return None;
            }
            let mut xa = Vec::new();
            amx_inputs(q, m, cols, &mut xa);
            // SAFETY: AMX-INT8 usable (checked); sizes checked above; one thread.
            unsafe {
                rows_amx(
                    w,
                    0,
                    n,
                    &xa,
                    d.as_ptr(),
                    s.as_ptr(),
                    m,
                    SharedOut::new(out),
                    fb,
                )
            }
        }
    }
    Some(())
}

/// Whether the AMX int8 tile products run here: [`super::amx::available`] (tiles, the OS's
/// permission) and CPUID's AMX-INT8 (leaf 7, EDX bit 25).
pub fn amx_int8_available() -> bool {
    super::amx::available() && (__cpuid_count(7, 0).edx >> 25) & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::super::test_rng::Lcg;
    use super::super::{
        matmul_t, matmul_t_each, Activations, CpuContext, Isa, MatJob, RowsScratch,
    };
    use super::*;

    /// `w x + bias` for one input row by `matmul_t` (the one-row step's kernels).
    fn row_alone(
        ctx: &CpuContext,
        w: &Matrix<'_>,
        bias: Option<Floats<'_>>,
        x: &[f32],
    ) -> Vec<f32> {
        let mut out = vec![0f32; w.rows()];
        let mut jobs = [MatJob {
            w,
            bias,
            out: &mut out,
        }];
        matmul_t(ctx, x, 1, &mut jobs).unwrap();
        out
    }

    /// Whether two outputs are equal bit for bit.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    struct Case {
        words: Vec<u32>,
        scales: Vec<f16>,
        biases: Vec<f16>,
        rows: usize,
        cols: usize,
        group: usize,
    }

    fn case(g: &mut Lcg, rows: usize, cols: usize, group: usize) -> Case {
        let groups = cols / group;
        Case {
            words: (0..rows * cols / 8)
                .map(|_| g.next() ^ (g.next() << 16))
                .collect(),
            scales: (0..rows * groups)
                .map(|_| f16::from_f32(g.unit() * 0.1))
                .collect(),
            biases: (0..rows * groups)
                .map(|_| f16::from_f32(g.unit() * 0.1))
                .collect(),
            rows,
            cols,
            group,
        }
    }

    /// `m` inputs' int16 codes (every seventh +32767, the next -32767: the extreme sums),
    /// chunk scales and sums.
    fn inputs(g: &mut Lcg, m: usize, cols: usize) -> (Vec<i16>, Vec<f32>, Vec<f32>) {
        let q = (0..m * cols)
            .map(|i| match i % 7 {
                0 => 32767,
                1 => -32767,
                _ => (g.next() % 65535) as i32 - 32767,
            } as i16)
            .collect();
        let chunks = cols / 32;
        let d = (0..m * chunks).map(|_| g.unit().abs() * 1e-4).collect();
        let s = (0..m * chunks).map(|_| g.unit() * 3.0).collect();
        (q, d, s)
    }

    /// The VNNI and AMX kernels give [`reference`]'s bits for every row of 1..=7 inputs, with
    /// and without a bias, over shapes with partial 16-row blocks, chunk counts that are not
    /// multiples of 4 and groups of 32 to 128: tier L2 (bit-identical). Kernels the CPU lacks
    /// are skipped (and said so).
    #[test]
    fn kernels_are_the_reference_bit_for_bit() {
        let mut g = Lcg(11);
        let amx = amx_int8_available();
        if !amx {
            eprintln!("no AMX-INT8 here: rows_amx not checked");
        }
        if !Isa::Avx512.available() {
            eprintln!("no AVX-512 here: rows not checked");
        }
        for (rows, cols, group) in [
            (37, 576, 32),
            (70, 1536, 32),
            (16, 64, 64),
            (5, 544, 32),
            (33, 1024, 128),
            (3, 32, 32),
        ] {
            let c = case(&mut g, rows, cols, group);
            let w = Matrix::affine(
                &c.words,
                Floats::F16(&c.scales),
                Floats::F16(&c.biases),
                c.rows,
                c.cols,
                4,
                c.group,
            )
            .unwrap();
            let bias: Vec<f32> = (0..rows).map(|_| g.unit()).collect();
            for m in 1..=7 {
                let (q, d, s) = inputs(&mut g, m, cols);
                for b in [None, Some(&bias[..])] {
                    let mut want = vec![0f32; m * rows];
                    products(Kernel::Reference, &w, &q, &d, &s, m, b, &mut want).unwrap();
                    for k in [Kernel::Vnni, Kernel::Amx] {
                        let mut got = vec![f32::NAN; m * rows];
                        if products(k, &w, &q, &d, &s, m, b, &mut got).is_none() {
                            continue;
                        }
                        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                x.to_bits(),
                                y.to_bits(),
                                "{k:?} {rows}x{cols} g{group} m {m} bias {}: output {i}: {x} vs {y}",
                                b.is_some()
                            );
                        }
                    }
                }
            }
        }
    }

    /// With `lane4` on, `matmul_t_each` (the verification pass) gives every input row the bits
    /// `matmul_t` (the decode step) gives it alone, and those are the reference's: tier L2.
    #[test]
    fn lane_rows_are_the_one_row_bits() {
        let mut ctx = CpuContext::new(2).unwrap();
        if ctx.isa != Isa::Avx512 {
            eprintln!("no AVX-512: the lane kernel is not reached here");
            return;
        }
        ctx.activations = Activations::Int16;
        ctx.lane4 = true;
        let mut g = Lcg(5);
        let mut scratch = RowsScratch::default();
        for (rows, cols) in [(37, 544), (70, 576), (5, 1056)] {
            let c = case(&mut g, rows, cols, 32);
            let w = Matrix::affine(
                &c.words,
                Floats::F16(&c.scales),
                Floats::F16(&c.biases),
                rows,
                cols,
                4,
                32,
            )
            .unwrap();
            assert!(supports(&w));
            let bias: Vec<f32> = (0..rows).map(|_| g.unit()).collect();
            for m in 1..=6 {
                let x: Vec<f32> = (0..m * cols).map(|_| g.unit()).collect();
                for b in [None, Some(Floats::F32(&bias))] {
                    let mut got = vec![0f32; m * rows];
                    let mut jobs = [MatJob {
                        w: &w,
                        bias: b,
                        out: &mut got,
                    }];
                    matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                    for t in 0..m {
                        let alone = row_alone(&ctx, &w, b, &x[t * cols..(t + 1) * cols]);
                        assert!(
                            same_bits(&got[t * rows..(t + 1) * rows], &alone),
                            "{rows}x{cols}, {m} inputs, row {t}: not the bits alone"
                        );
                    }
                }
            }
        }
    }
    /// The lane kernels over a [`Lanes16`](super::super::Lanes16) layout (VNNI, and AMX where
    /// the CPU has it) give [`reference`]'s bits for every row of 1..=9 inputs (past six or
    /// seven: two passes over each block), with and
    /// without a bias, for 4-bit affine matrices (GGUF's Q4_1 as loaded; groups 32 to 128) and
    /// 4-bit symmetric ones (Q4_0: against the reference over the materialized biases
    /// `-8 x scale`), over partial 16-row blocks and chunk counts not a multiple of 4; and
    /// through `matmul_t_each` with `lane4` (2 workers: blocks split at any row) every input
    /// row of a verification pass has the bits `matmul_t` gives it alone. Tier L2.
    #[test]
    fn lanes_are_the_reference_bit_for_bit() {
        use super::super::Lanes16;
        if !Isa::Avx512.available() {
            eprintln!("no AVX-512 here: rows_lanes not checked");
            return;
        }
        let mut ctx = CpuContext::new(2).unwrap();
        ctx.activations = Activations::Int16;
        ctx.lane4 = true;
        let mut scratch = RowsScratch::default();
        let mut g = Lcg(23);
        for (rows, cols, group) in [
            (37, 576, 32),
            (70, 1536, 32),
            (16, 64, 64),
            (33, 1024, 128),
            (3, 96, 32),
        ] {
            let c = case(&mut g, rows, cols, group);
            // Symmetric: the scales within Matrix::symmetric's range, the materialized
            // biases -8 x scale (exact in float16).
            let sym_b: Vec<f16> = c
                .scales
                .iter()
                .map(|v| f16::from_f32(-8.0 * v.to_f32()))
                .collect();
            let affine = Matrix::affine(
                &c.words,
                Floats::F16(&c.scales),
                Floats::F16(&c.biases),
                rows,
                cols,
                4,
                group,
            )
            .unwrap();
            let sym =
                Matrix::symmetric(&c.words, Floats::F16(&c.scales), rows, cols, 4, group).unwrap();
            let sym_ref = Matrix::affine(
                &c.words,
                Floats::F16(&c.scales),
                Floats::F16(&sym_b),
                rows,
                cols,
                4,
                group,
            )
            .unwrap();
            let bias: Vec<f32> = (0..rows).map(|_| g.unit()).collect();
            for (w, wref, what) in [(affine, affine, "affine"), (sym, sym_ref, "symmetric")] {
                assert!(Lanes16::packs(&w));
                let l = Lanes16::pack(&w).unwrap();
                let wl = w.with_lanes(&l).unwrap();
                // Another matrix's layout is refused (a copy of the words: another array).
                let words2 = c.words.clone();
                let other =
                    Matrix::symmetric(&words2, Floats::F16(&c.scales), rows, cols, 4, group)
                        .unwrap();
                assert!(other.with_lanes(&l).is_err());
                for m in 1..=9 {
                    let (q, d, s) = inputs(&mut g, m, cols);
                    for b in [None, Some(&bias[..])] {
                        let mut want = vec![0f32; m * rows];
                        products(Kernel::Reference, &wref, &q, &d, &s, m, b, &mut want).unwrap();
                        for k in [Kernel::Lanes, Kernel::LanesAmx] {
                            let mut got = vec![f32::NAN; m * rows];
                            if products(k, &wl, &q, &d, &s, m, b, &mut got).is_none() {
                                eprintln!("{k:?} not available here");
                                continue;
                            }
                            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    x.to_bits(),
                                    y.to_bits(),
                                    "{k:?} {what} {rows}x{cols} g{group} m {m} bias {}: output {i}: {x} vs {y}",
                                    b.is_some()
                                );
                            }
                        }
                    }
                    // Through the decoder's entry points: each row of the pass is the row
                    // alone.
                    let x: Vec<f32> = (0..m * cols).map(|_| g.unit()).collect();
                    let mut got = vec![0f32; m * rows];
                    let fb = Some(Floats::F32(&bias));
                    let mut jobs = [MatJob {
                        w: &wl,
                        bias: fb,
                        out: &mut got,
                    }];
                    matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                    for t in 0..m {
                        let xt = &x[t * cols..(t + 1) * cols];
                        let alone = row_alone(&ctx, &wl, fb, xt);
                        // The lane kernel without the layout (transposing per call): the same
                        // bits (affine only: it does not take symmetric matrices).
                        if what == "affine" {
                            assert!(
                                same_bits(&row_alone(&ctx, &wref, fb, xt), &alone),
                                "{what} {rows}x{cols} row {t}: lanes16 is not rows' bits"
                            );
                        }
                        assert!(
                            same_bits(&got[t * rows..(t + 1) * rows], &alone),
                            "{what} {rows}x{cols}, {m} inputs, row {t}: not the bits alone"
                        );
                    }
                }
            }
        }
    }

    /// A layout attaches to the matrix it was packed from only: one with the same words but
    /// other scales or biases is refused, whether they are other arrays (a copy of the scales,
    /// the other kind's biases: these words' affine and symmetric layouts differ in their
    /// biases only) or the same arrays changed in place (found by the sampled values).
    #[test]
    fn a_layout_attaches_to_its_own_scales_and_biases_only() {
        use super::super::Lanes16;
        /// `c`'s words as a 4-bit affine matrix with scales `s` and biases `b`.
        fn affine4<'a>(c: &'a Case, s: &'a [f16], b: &'a [f16]) -> Matrix<'a> {
            Matrix::affine(
                &c.words,
                Floats::F16(s),
                Floats::F16(b),
                c.rows,
                c.cols,
                4,
                c.group,
            )
            .unwrap()
        }
        let mut g = Lcg(29);
        for (rows, cols, group) in [(37, 576, 32), (16, 64, 64), (3, 96, 32)] {
            let c = case(&mut g, rows, cols, group);
            let sym_b: Vec<f16> = c
                .scales
                .iter()
                .map(|v| f16::from_f32(-8.0 * v.to_f32()))
                .collect();
            let affine = affine4(&c, &c.scales, &c.biases);
            let sym =
                Matrix::symmetric(&c.words, Floats::F16(&c.scales), rows, cols, 4, group).unwrap();
            let sym_ref = affine4(&c, &c.scales, &sym_b);
            let scales2 = c.scales.clone();
            let copy = affine4(&c, &scales2, &c.biases);
            for (w, others) in [
                (affine, [sym, sym_ref, copy]),
                (sym, [affine, sym_ref, copy]),
            ] {
                let l = Lanes16::pack(&w).unwrap();
                assert!(w.with_lanes(&l).is_ok(), "its own layout");
                for o in others {
                    assert!(o.with_lanes(&l).is_err(), "another matrix's layout");
                }
            }
            // The same arrays changed in place after packing (the layout keeps no borrow).
            let (mut s2, mut b2) = (c.scales.clone(), c.biases.clone());
            let l2 = Lanes16::pack(&affine4(&c, &s2, &b2)).unwrap();
            let attaches = |s2: &[f16], b2: &[f16]| affine4(&c, s2, b2).with_lanes(&l2).is_ok();
            assert!(attaches(&s2, &b2), "its own layout");
            let last = s2.len() - 1;
            s2[last] = -s2[last];
            assert!(!attaches(&s2, &b2), "a scale changed in place");
            s2[last] = -s2[last];
            b2[0] = f16::from_f32(b2[0].to_f32() + 1.0);
            assert!(!attaches(&s2, &b2), "a bias changed in place");
        }
    }

    /// A `LanesStore` packs on its first request and attaches the same layouts to the same
    /// matrices afterwards; a matrix it cannot lay out (8-bit) is left without one.
    #[test]
    fn lanes_store_packs_once_and_attaches() {
        use super::super::LanesStore;
        let mut g = Lcg(31);
        let c = case(&mut g, 40, 96, 32);
        let w4 = Matrix::affine(
            &c.words,
            Floats::F16(&c.scales),
            Floats::F16(&c.biases),
            40,
            96,
            4,
            32,
        )
        .unwrap();
        let w8 = Matrix::affine(
            &c.words,
            Floats::F16(&c.scales[..60]),
            Floats::F16(&c.biases[..60]),
            20,
            96,
            8,
            32,
        )
        .unwrap();
        let store = LanesStore::default();
        for _ in 0..2 {
            let mut ws = [w4, w8];
            store.attach(&mut ws);
            assert!(ws[0].lanes().is_some());
            assert!(ws[1].lanes().is_none());
        }
    }
}
