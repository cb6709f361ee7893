//! The products of a decode step, a speculative verification pass or a batched decode step
//! over 4-bit affine weights in groups of 32 to 512 (32 times a power of two) with float16,
//! bfloat16 or float32 scales and biases (GGUF's Q4_0 / Q4_1 as MLX loads them: SmolLM2-135M's
//! layers; `mlx convert`'s g64 and g32 directories), with the CPU decoder's int16 inputs on
//! AVX-512.
//!
//! Each row's sum is [`x86::dot4_512_any`](super::x86)'s, the function the one-row kernel
//! (`rows_int16_512`) calls, so every input row gets the bits it gets alone (tier:
//! bit-identical, `each_row_is_what_it_is_alone` in `batch.rs` and this file's test); up to
//! [`WIDE_TILE`](super::x86::WIDE_TILE) inputs share one pass over each weight row (its bytes
//! loaded and unpacked once, the rows' sums register-blocked). What this adds: the weights
//! stream from memory while the rows' arithmetic runs. A weight row is ~360 bytes (codes,
//! scales, biases), read once per pass; without a prefetch the loads of the next row only
//! start when its sums do, so the memory time adds to the arithmetic instead of overlapping
//! it. Here each row prefetches the one [`PREFETCH_ROWS`] ahead (its codes' lines and all of its
//! scales' and biases').
//!
//! The plain reference is `x86::rows_int16_512` (the same sums, no prefetch); the micro
//! benchmark is `cargo run --release -p mlx-core --example cpu_rows -- [THREADS] [MAX_ROWS]`.

use std::arch::x86_64::*;

use super::matmul::{AffineParts, Floats, Matrix};
use super::x86::{
    dot4_512_any, dot4_512_any2, dot_kind, even_tiles, floats_ptr, split_covers, QuantX16, Row4,
    MAX_CHUNKS, SCALES_F32, WIDE_TILE,
};
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

/// Whether [`rows`] takes `w`: 4-bit affine in groups of 32 to 512 (32 times a power of two)
/// with scales and biases of one float dtype, at most [`MAX_CHUNKS`] chunks a row.
pub(super) fn supports(w: &Matrix<'_>) -> bool {
    split_covers(w) && w.cols() % 32 == 0 && w.cols() / 32 <= MAX_CHUNKS
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
    // The pair kernel where it measured faster (`cpu_verify_rows`, s44's README): one tile
    // (2 to 4 inputs) at any width; more inputs (tiles of at most 3) only over rows of 32+
    // chunks (the down product), where the second tile's repeated bias terms, factors and
    // unpacking weigh less (at 576 columns 5 inputs as 3 + 2 were no faster than the
    // one-row kernel's pass of 5).
    let pairs = m <= PAIR_ONE || (m <= PAIR_MAX && cols >= pair_wide_cols());
    if m >= 2 && pairs && !qx.h.is_null() && pairs_on().0 {
        // SAFETY: forwarded contract (the split inputs present).
        unsafe { rows_pairs(w, r0, r1, qx, m, out, bias) };
        return;
    }
    // Past one tile, tiles of even size (7 rows as 4 + 3, not 6 + 1: a one-row pass over the
    // weights costs nearly what a one-row product does).
    for (t0, mt) in even_tiles(m, m.div_ceil(WIDE_TILE)) {
        // SAFETY: rows t0..t0 + mt of qx start at these offsets; the contract is forwarded.
        unsafe {
            let q = qx.rows_from(t0, cols);
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
    // Affine or symmetric (`dot_kind`: a symmetric matrix's biases are its scales times -8).
    let Some(parts) = w.affine_parts() else {
        return;
    };
    let AffineParts {
        words,
        scales,
        biases,
        bits: 4,
        group,
        ..
    } = parts
    else {
        return;
    };
    let Some(kind) = dot_kind(&parts) else {
        return;
    };
    let (rows, cols) = (w.rows(), w.cols());
    let chunks = cols / 32;
    let groups = cols / group;
    let shift = (group / 32).trailing_zeros();
    let esz = if kind == SCALES_F32 { 4 } else { 2 };
    let row_bytes = cols / 2;
    let bytes = words.as_ptr() as *const u8;
    let (sp, bp) = (floats_ptr(scales), floats_ptr(biases));
    assert!(
        r1 <= rows && scales.len() >= rows * groups && biases.len() >= rows * groups,
        "affine_rows: rows {r0}..{r1} of {rows}, scales out of range"
    );
    // SAFETY (whole body): rows r0..r1 lie within `words`, the scales and the biases
    // (Matrix::affine's checks and the assert); prefetches are hints and only name rows that
    // exist; the contract of `dot4_512_any` is `rows`'.
    unsafe {
        // The lines of weight row `r` (codes, scales, biases) on their way to L1 (`T0`) or L2.
        let lines = |r: usize, hint: i32| {
            let p = bytes.add(r * row_bytes) as *const i8;
            let pre = |p: *const i8| {
                if hint == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(p)
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(p)
                }
            };
            let mut o = 0;
            while o < row_bytes {
                pre(p.add(o));
                o += 64;
            }
            pre(p.add(row_bytes - 1));
            let sb = groups * esz;
            for base in [sp, bp] {
                let q = base.add(r * sb) as *const i8;
                let mut o = 0;
                while o < sb {
                    pre(q.add(o));
                    o += 64;
                }
                pre(q.add(sb - 1));
            }
        };
        let fetch = |r: usize| lines(r, 0);
        let far = |r: usize| lines(r, 1);
        let (ahead, far_ahead) = pf_knobs();
        if prefetch {
            // The block's first rows at once (the loop below reaches each row ahead of it).
            for r in r0..(r0 + ahead).min(r1) {
                fetch(r);
            }
        }
        for r in r0..r1 {
            let s0 = sp.add(r * groups * esz);
            let b0 = bp.add(r * groups * esz);
            let rb = bytes.add(r * row_bytes);
            if prefetch && r + ahead < rows {
                fetch(r + ahead);
            }
            if prefetch && far_ahead > 0 && r + far_ahead < rows {
                far(r + far_ahead);
            }
            let v = dot4_512_any::<MT>(kind, rb, s0, b0, chunks, shift, qx);
            let b = bias.map_or(0.0, |b| b.get(r));
            for (t, v) in v.iter().enumerate() {
                out.write(t * rows + r, v + b);
            }
        }
    }
}

/// Which pair kernels a verification pass's rows take: the 4-bit [`rows_pairs`] and the 8-bit
/// head's `x86::rows_q8_pairs`, both on by default; `MLX_CPU_PAIRS` (`0`: neither, `4`: the
/// 4-bit one only, `8`: the head's only) turns them off for A/B measurements (the bits are
/// the same either way). Returns `(4-bit, 8-bit)`.
pub(super) fn pairs_on() -> (bool, bool) {
    static ON: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("MLX_CPU_PAIRS").as_deref() {
        Ok("0") => (false, false),
        Ok("4") => (true, false),
        Ok("8") => (false, true),
        _ => (true, true),
    })
}

/// The narrowest rows (in columns) whose passes of more than [`PAIR_ONE`] inputs take
/// [`rows_pairs`] (tiles of at most [`PAIR_TILE`]): 1024 (the down product) by default;
/// `MLX_CPU_PAIR_COLS` sets it for A/B measurements (`0`: every width, so gate/up, q/k/v and
/// o at 5+ inputs take the pair kernel too; the bits are the same either way).
fn pair_wide_cols() -> usize {
    static C: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *C.get_or_init(|| {
        std::env::var("MLX_CPU_PAIR_COLS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024)
    })
}

/// Input rows a pass of [`rows_pairs`] takes (its registers: two weight rows' accumulators
/// and factors for each).
pub(super) const PAIR_TILE: usize = 3;

/// The most inputs [`rows_pairs`] takes in one tile (at 4, `dot4_512_s2` keeps its factors
/// on the stack; 5 in one tile measured no faster than the one-row kernel's pass).
pub(super) const PAIR_ONE: usize = 4;

/// The most inputs [`rows`] hands to [`rows_pairs`] (a verification pass: K drafts and the
/// pending token; past it, the tiles of [`WIDE_TILE`]).
pub(super) const PAIR_MAX: usize = 4 * PAIR_TILE;

/// [`rows`] for `m >= 2` inputs with their split bytes (`qx.h`): weight rows two at a time
/// ([`dot4_512_any2`]: each input's bytes loaded once for both rows), the inputs in tiles of
/// up to [`PAIR_ONE`] in one tile, more in tiles of at most [`PAIR_TILE`] (sizes as even as
/// can be: 5 as 3 + 2), every tile over
/// the same two rows before the next pair (their bytes still in L1); an odd last row paired
/// with itself. Each output is its one-row kernel's bits (`dot4_512_s2`'s contract).
///
/// # Safety
/// As [`rows`], with `qx.h` not null.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_pairs(
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
    let AffineParts {
        words,
        scales,
        biases,
        bits: 4,
        group,
        ..
    } = parts
    else {
        return;
    };
    let Some(kind) = dot_kind(&parts) else {
        return;
    };
    let (rows, cols) = (w.rows(), w.cols());
    let chunks = cols / 32;
    let groups = cols / group;
    let shift = (group / 32).trailing_zeros();
    let esz = if kind == SCALES_F32 { 4 } else { 2 };
    let row_bytes = cols / 2;
    let bytes = words.as_ptr() as *const u8;
    let (sp, bp) = (floats_ptr(scales), floats_ptr(biases));
    assert!(
        r1 <= rows && scales.len() >= rows * groups && biases.len() >= rows * groups,
        "affine_rows: rows {r0}..{r1} of {rows}, scales out of range"
    );
    // The input tiles: one up to PAIR_ONE inputs, else as even as can be, at most PAIR_TILE
    // rows each.
    let ntiles = if m <= PAIR_ONE {
        1
    } else {
        m.div_ceil(PAIR_TILE)
    };
    // SAFETY (whole body): rows r0..r1 lie within `words`, the scales and the biases
    // (Matrix::affine's checks and the assert); prefetches are hints and only name rows that
    // exist; the input tiles lie within `qx`'s m rows; the contracts of `dot4_512_any2` and
    // `dot4_512_any` are `rows`'.
    unsafe {
        let row = |r: usize| Row4 {
            rb: bytes.add(r * row_bytes),
            s0: sp.add(r * groups * esz),
            b0: bp.add(r * groups * esz),
        };
        let fetch = |r: usize| {
            let p = bytes.add(r * row_bytes) as *const i8;
            let mut o = 0;
            while o < row_bytes {
                _mm_prefetch::<_MM_HINT_T0>(p.add(o));
                o += 64;
            }
            _mm_prefetch::<_MM_HINT_T0>(p.add(row_bytes - 1));
            let sb = groups * esz;
            for base in [sp, bp] {
                let q = base.add(r * sb) as *const i8;
                let mut o = 0;
                while o < sb {
                    _mm_prefetch::<_MM_HINT_T0>(q.add(o));
                    o += 64;
                }
                _mm_prefetch::<_MM_HINT_T0>(q.add(sb - 1));
            }
        };
        let (ahead, _) = pf_knobs();
        for r in r0..(r0 + ahead).min(r1) {
            fetch(r);
        }
        let put = |r: usize, t0: usize, v: &[f32]| {
            let b = bias.map_or(0.0, |b| b.get(r));
            for (t, v) in v.iter().enumerate() {
                out.write((t0 + t) * rows + r, v + b);
            }
        };
        // Weight rows two at a time; an odd last row paired with itself (its first result
        // kept): `dot4_512_any` inlined here compiled its unordered `_mm512_reduce_add_ps` to
        // another order than the one-row kernel's at four inputs (other bits), so both kernels
        // reduce by `reduce16`.
        let mut r = r0;
        while r < r1 {
            let r2 = if r + 1 < r1 { r + 1 } else { r };
            for q in [r + ahead, r2 + ahead] {
                if q < rows {
                    fetch(q);
                }
            }
            let (w0, w1) = (row(r), row(r2));
            let put2 = |t0: usize, a: &[f32], b: &[f32]| {
                put(r, t0, a);
                if r2 != r {
                    put(r2, t0, b);
                }
            };
            for (t0, mt) in even_tiles(m, ntiles) {
                debug_assert!(mt <= PAIR_ONE, "affine_rows: a pair tile of {mt} inputs");
                let q = qx.rows_from(t0, cols);
                match mt {
                    1 => {
                        let (a, b) = dot4_512_any2::<1>(kind, w0, w1, chunks, shift, q);
                        put2(t0, &a, &b);
                    }
                    2 => {
                        let (a, b) = dot4_512_any2::<2>(kind, w0, w1, chunks, shift, q);
                        put2(t0, &a, &b);
                    }
                    3 => {
                        let (a, b) = dot4_512_any2::<3>(kind, w0, w1, chunks, shift, q);
                        put2(t0, &a, &b);
                    }
                    _ => {
                        let (a, b) = dot4_512_any2::<4>(kind, w0, w1, chunks, shift, q);
                        put2(t0, &a, &b);
                    }
                }
            }
            r += 2;
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

    /// Every row of 1..=9 inputs through `matmul_t_each` (this file's kernel, prefetching)
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
            for m in 1..=9 {
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

    /// The pair kernel (`rows_pairs`, `dot4_512_s2`) over every scale dtype and group it
    /// takes (float16 in groups of 32 and 64, bfloat16 in 32, float32 in 64 or 128, a symmetric
    /// Q4_0-style matrix): every row of 1..=9 inputs has the bits `matmul_t` gives that input
    /// alone, over widths that take one tile only (576: 18 chunks, a partial quad) and tiles
    /// of 3 and 2 (1088: 34 chunks; 1152: 36), an odd number of weight rows (the last row alone) and
    /// two workers: tier bit-identical.
    #[test]
    fn pair_kernel_rows_are_the_one_row_bits_for_every_dtype() {
        let mut ctx = CpuContext::new(2).unwrap();
        if ctx.isa != Isa::Avx512 {
            eprintln!("no AVX-512: affine_rows is not reached here");
            return;
        }
        ctx.activations = Activations::Int16;
        let mut scratch = RowsScratch::default();
        for (rows, cols) in [(41, 576), (23, 1088), (9, 1152)] {
            let words: Vec<u32> = seeded(rows * cols / 8, 5)
                .iter()
                .map(|v| (v.to_bits()).wrapping_mul(2_654_435_761))
                .collect();
            let vals = |g: usize, seed: u64| -> Vec<f32> {
                seeded(rows * cols / g, seed)
                    .iter()
                    .map(|v| v * 0.1)
                    .collect()
            };
            let h = |v: &[f32]| -> Vec<half::f16> {
                v.iter().map(|&x| half::f16::from_f32(x)).collect()
            };
            let b16 = |v: &[f32]| -> Vec<half::bf16> {
                v.iter().map(|&x| half::bf16::from_f32(x)).collect()
            };
            let (s32, b32) = (h(&vals(32, 6)), h(&vals(32, 7)));
            let (s64, b64) = (h(&vals(64, 8)), h(&vals(64, 9)));
            let (sb, bb) = (b16(&vals(32, 10)), b16(&vals(32, 11)));
            let gf = if cols % 128 == 0 { 128 } else { 64 };
            let (sf, bf) = (vals(gf, 12), vals(gf, 13));
            let sym: Vec<half::f16> = seeded(rows * cols / 32, 14)
                .iter()
                .map(|v| half::f16::from_f32(v.abs() * 0.01 + 0.001))
                .collect();
            let mats = [
                (
                    "f16 g32",
                    Matrix::affine(
                        &words,
                        Floats::F16(&s32),
                        Floats::F16(&b32),
                        rows,
                        cols,
                        4,
                        32,
                    ),
                ),
                (
                    "f16 g64",
                    Matrix::affine(
                        &words,
                        Floats::F16(&s64),
                        Floats::F16(&b64),
                        rows,
                        cols,
                        4,
                        64,
                    ),
                ),
                (
                    "bf16 g32",
                    Matrix::affine(
                        &words,
                        Floats::Bf16(&sb),
                        Floats::Bf16(&bb),
                        rows,
                        cols,
                        4,
                        32,
                    ),
                ),
                (
                    "f32 g64 / g128",
                    Matrix::affine(
                        &words,
                        Floats::F32(&sf),
                        Floats::F32(&bf),
                        rows,
                        cols,
                        4,
                        gf,
                    ),
                ),
                (
                    "symmetric",
                    Matrix::symmetric(&words, Floats::F16(&sym), rows, cols, 4, 32),
                ),
            ];
            for (what, w) in mats {
                let w = w.unwrap();
                assert!(supports(&w), "{what}");
                for m in 1..=9 {
                    let x = seeded(m * cols, 20 + m as u64);
                    let mut got = vec![0f32; m * rows];
                    let mut jobs = [MatJob {
                        w: &w,
                        bias: None,
                        out: &mut got,
                    }];
                    matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                    for t in 0..m {
                        let mut alone = vec![0f32; rows];
                        let mut jobs = [MatJob {
                            w: &w,
                            bias: None,
                            out: &mut alone,
                        }];
                        matmul_t(&ctx, &x[t * cols..(t + 1) * cols], 1, &mut jobs).unwrap();
                        let row = &got[t * rows..(t + 1) * rows];
                        let bad: Vec<usize> = (0..rows)
                            .filter(|&r| row[r].to_bits() != alone[r].to_bits())
                            .collect();
                        assert!(
                            bad.is_empty(),
                            "{what} {rows}x{cols}, {m} inputs, row {t}: weight rows {bad:?} not the bits alone"
                        );
                    }
                }
            }
        }
    }
}
