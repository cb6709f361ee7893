//! Prompt-block products over GGML's block formats (`cpu::kquant`'s types that have an AVX2
//! unpacker: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) for [`MIN_M`] or more input rows
//! with float32 inputs, on AVX-512: the prefill side of the GGML products.
//!
//! The per-row kernels of `cpu::kquant` take four inputs a pass, so a 32-token prompt block
//! decodes every weight block eight times and spends its time widening codes. Here each worker
//! takes a panel of [`NR`] weight rows, decodes it once into a grow-once thread-local scratch
//! of float32 values (the block decoder's own values, bit for bit: `kquant::dequantize_row`),
//! and runs a register-tiled micro-kernel over it: 32 input rows in two 16-lane vectors (the
//! inputs transposed once a call, token-major within each `k`), each weight value broadcast,
//! `NR x 2` accumulators, one FMA per weight value and 16 inputs. Every sum runs over `k` in
//! order in one lane (plain float32 products with FMA rounding).
//!
//! Under the CPU decoder's default activations (`Int16` / `Int16Q8Int8`) the inputs are
//! quantized to int16 per 32 values instead (`x86::quantize_x16`, the decode steps' int16
//! inputs bit for bit) and the panels ([`NR16`] rows) hold each weight as its code times its
//! integer scale in int16 (exact) with a float factor and minimum a chunk: `vpdpwssd` (AVX-512
//! VNNI) sums two products a lane, 32 multiply-adds an instruction against the float FMA's
//! 16, into exact 32-bit sums per chunk (per half chunk for Q6_K, whose scaled codes reach
//! 4096), then `acc += f * (d * sum) - b * s` in float32. `F32` keeps the float panels.
//!
//! Tier L3 against the plain reference (each row dequantized as gguf-py does, then a float32
//! dot with the same inputs): the summation order differs, bound
//! `cols * 2^-24 * sum |w x|` (a float32 rounding bound; tests in this file); with int16
//! inputs plus `sum |w| * d / 2` (each input within half its chunk's step). Unlike the
//! per-row kernels a row's bits depend on whether it comes in a block of at least [`MIN_M`]
//! rows (`matmul_t` only; `matmul_t_each`, the decode and verify steps, never comes here).

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::kquant::GgmlType;
use super::kquant_x86::{Unpack, Q45K, Q4_0, Q4_1, Q5_0, Q5_1, Q6K, Q8_0};
use super::matmul::{Floats, Kind, MatJob, Matrix, MAX_JOBS};
use super::{CpuContext, Isa, SharedOut};
use crate::Result;

/// The fewest input rows a call takes here (fewer: the per-row kernels).
pub const MIN_M: usize = 16;
/// Weight rows a panel (one worker's unit).
pub const NR: usize = 12;
/// Input rows a tile (two 16-lane vectors).
const MT: usize = 32;

/// Weight rows a panel of the int16 kernels.
pub const NR16: usize = 8;

thread_local! {
    /// A worker's decoded panel (`NR * cols` floats).
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The caller's transposed inputs.
    static XT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A worker's int16 panel: codes times integer scales, and each chunk's factor and
    /// minimum.
    static PANEL16: RefCell<(Vec<i16>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The caller's int16 inputs ([`Xq`]).
    static XQ: RefCell<Xq> = const { RefCell::new(Xq::new()) };
}

/// Hands back the calling thread's transposed and int16 inputs (see
/// [`super::release_prompt_buffers`]).
pub(super) fn release_inputs() {
    XT.with(|x| *x.borrow_mut() = Vec::new());
    XQ.with(|x| *x.borrow_mut() = Xq::new());
}

/// A call's inputs quantized to int16 per 32 values (`x86::quantize_x16`: the decode steps'
/// int16 inputs, bit for bit), laid out for [`micro16`]: tiles of [`MT`] rows, each pair of
/// columns of a tile as `MT` 32-bit lanes (two int16 codes each), each chunk's scales and
/// float sums as `MT` floats; rows past `m` zero.
struct Xq {
    q: Vec<i32>,
    d: Vec<f32>,
    s: Vec<f32>,
    row_q: Vec<i16>,
    row_d: Vec<f32>,
    row_s: Vec<f32>,
}

impl Xq {
    const fn new() -> Xq {
        Xq {
            q: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            row_q: Vec::new(),
            row_d: Vec::new(),
            row_s: Vec::new(),
        }
    }
}

/// Whether the products of a call that [`applies`] read int16 inputs (the CPU decoder's
/// default activations `Int16` / `Int16Q8Int8`; `F32` keeps float inputs).
pub(crate) fn int16_inputs(ctx: &CpuContext) -> bool {
    matches!(
        ctx.activations,
        super::Activations::Int16 | super::Activations::Int16Q8Int8
    )
}

/// Whether a [`super::matmul_t`] call of `m` rows takes these kernels: AVX-512, at least
/// [`MIN_M`] rows, float inputs, every job a GGML matrix of a type with an unpacker.
pub(crate) fn applies(ctx: &CpuContext, m: usize, jobs: &[MatJob<'_, '_>]) -> bool {
    ctx.isa == Isa::Avx512
        && m >= MIN_M
        && !super::kquant::int8_inputs(ctx.activations)
        && jobs.iter().all(|j| match j.w.kind {
            Kind::Ggml { ty, .. } => ty.has_avx2_kernel() && j.w.cols() % 32 == 0,
            _ => false,
        })
}

/// `out = x W^T (+ bias)` for every job ([`applies`] holds; sizes checked by the caller).
pub(crate) fn matmul_jobs(
    ctx: &CpuContext,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
) -> Result<()> {
    let cols = jobs[0].w.cols();
    let tiles = m.div_ceil(MT);
    if int16_inputs(ctx) {
        XQ.with(|xq| {
            let mut xq = xq.borrow_mut();
            quantize16(x, m, cols, &mut xq);
            run16(ctx, &xq, m, jobs);
        });
        return Ok(());
    }
    XT.with(|xt| {
        let mut xt = xt.borrow_mut();
        let need = tiles * cols * MT;
        if xt.len() < need {
            xt.resize(need, 0.0);
        }
        transpose(x, m, cols, &mut xt[..need]);
        run(ctx, &xt[..need], m, jobs);
    });
    Ok(())
}

/// `x` `(m, cols)` into tiles of [`MT`] rows, each `(cols, MT)` (zero past `m`).
fn transpose(x: &[f32], m: usize, cols: usize, xt: &mut [f32]) {
    for (tile, dst) in xt.chunks_exact_mut(cols * MT).enumerate() {
        for t in 0..MT {
            let row = tile * MT + t;
            if row < m {
                for (k, &v) in x[row * cols..(row + 1) * cols].iter().enumerate() {
                    dst[k * MT + t] = v;
                }
            } else {
                for k in 0..cols {
                    dst[k * MT + t] = 0.0;
                }
            }
        }
    }
}

fn run(ctx: &CpuContext, xt: &[f32], m: usize, jobs: &mut [MatJob<'_, '_>]) {
    let cols = jobs[0].w.cols();
    type Plan<'p> = (Matrix<'p>, Option<Floats<'p>>, SharedOut, usize);
    let mut plan: [Option<Plan<'_>>; MAX_JOBS] = [None; MAX_JOBS];
    let mut panels = 0;
    for (p, j) in plan.iter_mut().zip(jobs.iter_mut()) {
        *p = Some((*j.w, j.bias, SharedOut::new(j.out), panels));
        panels += j.w.rows().div_ceil(NR);
    }
    let next = AtomicUsize::new(0);
    ctx.pool.run(&|_, _| {
        PANEL.with(|p| {
            let mut panel = p.borrow_mut();
            if panel.len() < NR * cols {
                panel.resize(NR * cols, 0.0);
            }
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= panels {
                    break;
                }
                let Some(&(w, bias, out, start)) = plan.iter().rev().flatten().find(|p| p.3 <= b)
                else {
                    break;
                };
                let Kind::Ggml { data, ty } = w.kind else {
                    break;
                };
                let n = w.rows();
                let r0 = (b - start) * NR;
                let r1 = (r0 + NR).min(n);
                let rb = ty.row_bytes(cols);
                let rows = &data[r0 * rb..r1 * rb];
                let panel = &mut panel[..NR * cols];
                let mut bv = [0f32; NR];
                if let Some(b) = bias {
                    for (i, v) in bv[..r1 - r0].iter_mut().enumerate() {
                        *v = b.get(r0 + i);
                    }
                }
                // SAFETY: `applies` checked AVX-512 (CpuContext only holds an Isa the CPU
                // runs); `rows` holds r1 - r0 whole rows of `ty`; the panel is NR rows of
                // `cols`; `xt` holds m.div_ceil(MT) tiles of (cols, MT); rows r0..r1 of every
                // output are this worker's alone.
                unsafe {
                    decode(ty, rows, r1 - r0, cols, panel);
                    for tile in 0..m.div_ceil(MT) {
                        let mut acc = [[0f32; MT]; NR];
                        let x = &xt[tile * cols * MT..(tile + 1) * cols * MT];
                        let tn = (m - tile * MT).min(MT);
                        if tn > 16 {
                            micro::<2>(panel.as_ptr(), x.as_ptr(), cols, &mut acc);
                        } else {
                            micro::<1>(panel.as_ptr(), x.as_ptr(), cols, &mut acc);
                        }
                        // Row by row of the output, the panel's outputs contiguous (a
                        // column of scalar writes n apart thrashes the L1's sets).
                        for t in 0..tn {
                            let o = out.range((tile * MT + t) * n + r0, r1 - r0);
                            for ((o, a), b) in o.iter_mut().zip(&acc).zip(&bv) {
                                *o = a[t] + b;
                            }
                        }
                    }
                }
            }
        })
    });
}

/// `rows` whole rows of `ty` (`cols` values each) decoded into the first `rows` rows of
/// `panel` (`NR` rows of `cols`), as [`super::kquant::dequantize_row`] gives them (bit for
/// bit); the rows past `rows` zeroed.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI (as `Isa::Avx512`); `data` holds `rows <= NR` rows; `ty` has an
/// AVX2 unpacker; `panel` is `NR * cols` long.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode(ty: GgmlType, data: &[u8], rows: usize, cols: usize, panel: &mut [f32]) {
    assert!(
        rows <= NR && data.len() == rows * ty.row_bytes(cols) && panel.len() == NR * cols,
        "kgemm decode: sizes"
    );
    panel[rows * cols..].fill(0.0);
    let rb = ty.row_bytes(cols);
    // SAFETY: sizes checked above; features as the contract says.
    unsafe {
        for r in 0..rows {
            let row = data.as_ptr().add(r * rb);
            let dst = panel.as_mut_ptr().add(r * cols);
            match ty {
                GgmlType::Q8_0 => decode_row::<Q8_0>(row, cols, dst),
                GgmlType::Q4_0 => decode_row::<Q4_0>(row, cols, dst),
                GgmlType::Q5_0 => decode_row::<Q5_0>(row, cols, dst),
                GgmlType::Q4_1 => decode_row::<Q4_1>(row, cols, dst),
                GgmlType::Q5_1 => decode_row::<Q5_1>(row, cols, dst),
                GgmlType::Q4_K => decode_row::<Q45K<false>>(row, cols, dst),
                GgmlType::Q5_K => decode_row::<Q45K<true>>(row, cols, dst),
                GgmlType::Q6_K => decode_row::<Q6K>(row, cols, dst),
                GgmlType::Q2_K | GgmlType::Q3_K => unreachable!("no unpacker for {}", ty.name()),
            }
        }
    }
}

/// One row of `U`'s type into `dst` (`cols` floats): each half chunk's codes widened,
/// times the half's factor (`f * scale`, gguf-py's product), minus its minimum.
///
/// # Safety
/// As [`decode`]; `row` holds `cols / 32` chunks, `dst` `cols` floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_row<U: Unpack + Default>(row: *const u8, cols: usize, dst: *mut f32) {
    let mut u = U::default();
    // SAFETY: within the ranges of the contract.
    unsafe {
        for c in 0..cols / 32 {
            let (w, _, f, b) = u.chunk(row, c);
            let h = u.halves(c);
            let parts = [_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)];
            for (k, p) in parts.into_iter().enumerate() {
                let i = if U::SIGNED {
                    _mm512_cvtepi8_epi32(p)
                } else {
                    _mm512_cvtepu8_epi32(p)
                };
                let mut v = _mm512_mul_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(f * h[k]));
                if U::MINS {
                    v = _mm512_sub_ps(v, _mm512_set1_ps(b));
                }
                _mm512_storeu_ps(dst.add(32 * c + 16 * k), v);
            }
        }
    }
}

/// `acc[r][t] = sum_k panel[r][k] * x[k][t]` for the panel's `NR` rows and the tile's first
/// `16 * TV` inputs, `k` in order, one FMA a step.
///
/// # Safety
/// AVX-512 F; `panel` holds `NR * cols` floats, `x` `cols * MT`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn micro<const TV: usize>(
    panel: *const f32,
    x: *const f32,
    cols: usize,
    acc_out: &mut [[f32; MT]; NR],
) {
    let mut acc = [[_mm512_setzero_ps(); TV]; NR];
    // SAFETY: within the ranges of the contract.
    unsafe {
        for k in 0..cols {
            let mut xv = [_mm512_setzero_ps(); TV];
            for (v, xv) in xv.iter_mut().enumerate() {
                *xv = _mm512_loadu_ps(x.add(k * MT + 16 * v));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*panel.add(r * cols + k));
                for (v, a) in a.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(w, xv[v], *a);
                }
            }
        }
        for (a, o) in acc.iter().zip(acc_out.iter_mut()) {
            for (v, a) in a.iter().enumerate() {
                _mm512_storeu_ps(o.as_mut_ptr().add(16 * v), *a);
            }
        }
    }
}

/// `x` `(m, cols)` quantized row by row (`x86::quantize_x16`) into `xq`'s tiles (grown as
/// needed, never shrunk).
fn quantize16(x: &[f32], m: usize, cols: usize, xq: &mut Xq) {
    let tiles = m.div_ceil(MT);
    let chunks = cols / 32;
    let Xq {
        q,
        d,
        s,
        row_q,
        row_d,
        row_s,
    } = xq;
    for (v, n) in [
        (&mut *d, tiles * chunks * MT),
        (&mut *s, tiles * chunks * MT),
    ] {
        if v.len() < n {
            v.resize(n, 0.0);
        }
    }
    if q.len() < tiles * cols / 2 * MT {
        q.resize(tiles * cols / 2 * MT, 0);
    }
    if row_q.len() < cols {
        row_q.resize(cols, 0);
        row_d.resize(chunks, 0.0);
        row_s.resize(chunks, 0.0);
    }
    for tile in 0..tiles {
        let qt = &mut q[tile * cols / 2 * MT..(tile + 1) * cols / 2 * MT];
        let dt = &mut d[tile * chunks * MT..(tile + 1) * chunks * MT];
        let st = &mut s[tile * chunks * MT..(tile + 1) * chunks * MT];
        for t in 0..MT {
            let row = tile * MT + t;
            if row >= m {
                for kp in 0..cols / 2 {
                    qt[kp * MT + t] = 0;
                }
                for c in 0..chunks {
                    dt[c * MT + t] = 0.0;
                    st[c * MT + t] = 0.0;
                }
                continue;
            }
            // SAFETY: the int16 kernels run only where `applies` saw AVX-512 (which
            // includes AVX2, FMA and F16C); the row buffers hold `cols` codes and
            // `cols / 32` chunks.
            unsafe {
                super::x86::quantize_x16(
                    &x[row * cols..(row + 1) * cols],
                    &mut row_q[..cols],
                    &mut row_d[..chunks],
                    &mut row_s[..chunks],
                )
            };
            for kp in 0..cols / 2 {
                let lo = row_q[2 * kp] as u16 as u32;
                let hi = row_q[2 * kp + 1] as u16 as u32;
                qt[kp * MT + t] = (lo | (hi << 16)) as i32;
            }
            for c in 0..chunks {
                dt[c * MT + t] = row_d[c];
                st[c * MT + t] = row_s[c];
            }
        }
    }
}

/// As [`run`] with int16 inputs: panels of [`NR16`] rows decoded to int16 codes times their
/// integer scales, `vpdpwssd` into exact 32-bit sums per chunk (per half chunk for Q6_K),
/// each sum times the input chunk's scale and the weight chunk's factor added in float32,
/// minus the minimum times the input chunk's float sum.
fn run16(ctx: &CpuContext, xq: &Xq, m: usize, jobs: &mut [MatJob<'_, '_>]) {
    let cols = jobs[0].w.cols();
    let chunks = cols / 32;
    type Plan<'p> = (Matrix<'p>, Option<Floats<'p>>, SharedOut, usize);
    let mut plan: [Option<Plan<'_>>; MAX_JOBS] = [None; MAX_JOBS];
    let mut panels = 0;
    for (p, j) in plan.iter_mut().zip(jobs.iter_mut()) {
        *p = Some((*j.w, j.bias, SharedOut::new(j.out), panels));
        panels += j.w.rows().div_ceil(NR16);
    }
    let next = AtomicUsize::new(0);
    ctx.pool.run(&|_, _| {
        PANEL16.with(|p| {
            let mut p = p.borrow_mut();
            let (panel, fb) = &mut *p;
            if panel.len() < NR16 * cols {
                panel.resize(NR16 * cols, 0);
                fb.resize(NR16 * chunks * 2, 0.0);
            }
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= panels {
                    break;
                }
                let Some(&(w, bias, out, start)) = plan.iter().rev().flatten().find(|p| p.3 <= b)
                else {
                    break;
                };
                let Kind::Ggml { data, ty } = w.kind else {
                    break;
                };
                let n = w.rows();
                let r0 = (b - start) * NR16;
                let r1 = (r0 + NR16).min(n);
                let rb = ty.row_bytes(cols);
                let rows = &data[r0 * rb..r1 * rb];
                let panel = &mut panel[..NR16 * cols];
                let fb = &mut fb[..NR16 * chunks * 2];
                let mut bv = [0f32; NR16];
                if let Some(b) = bias {
                    for (i, v) in bv[..r1 - r0].iter_mut().enumerate() {
                        *v = b.get(r0 + i);
                    }
                }
                // SAFETY: as in `run` (AVX-512 F/BW/VL + VNNI checked by `applies`); the
                // panel is NR16 rows of `cols` codes and `fb` NR16 rows of `chunks` pairs;
                // `xq` holds m.div_ceil(MT) tiles (`quantize16`).
                unsafe {
                    decode16(ty, rows, r1 - r0, cols, panel, fb);
                    for tile in 0..m.div_ceil(MT) {
                        let mut acc = [[0f32; MT]; NR16];
                        let x = xq.q.as_ptr().add(tile * cols / 2 * MT);
                        let xd = xq.d.as_ptr().add(tile * chunks * MT);
                        let xs = xq.s.as_ptr().add(tile * chunks * MT);
                        let tn = (m - tile * MT).min(MT);
                        let (p, f) = (panel.as_ptr(), fb.as_ptr());
                        macro_rules! go {
                            ($half:expr, $mins:expr) => {
                                if tn > 16 {
                                    micro16::<2, $half, $mins>(p, f, x, xd, xs, cols, &mut acc)
                                } else {
                                    micro16::<1, $half, $mins>(p, f, x, xd, xs, cols, &mut acc)
                                }
                            };
                        }
                        match ty {
                            GgmlType::Q6_K => go!(true, false),
                            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                                go!(false, true)
                            }
                            _ => go!(false, false),
                        }
                        for t in 0..tn {
                            let o = out.range((tile * MT + t) * n + r0, r1 - r0);
                            for ((o, a), b) in o.iter_mut().zip(&acc).zip(&bv) {
                                *o = a[t] + b;
                            }
                        }
                    }
                }
            }
        })
    });
}

/// `rows` whole rows of `ty` into the first `rows` rows of an int16 panel: each value as its
/// code times its integer scale (exact: at most 32 * 128 in magnitude), each chunk's float
/// factor and minimum in `fb` (`[f, b]` per chunk, row-major), so that a weight is
/// `f * code16 - b` (`dequantize_row`'s value up to the rounding of `f * scale`); the rows
/// past `rows` zeroed.
///
/// # Safety
/// As [`decode`]; `panel` is `NR16 * cols` long, `fb` `NR16 * cols / 16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode16(
    ty: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    panel: &mut [i16],
    fb: &mut [f32],
) {
    assert!(
        rows <= NR16
            && data.len() == rows * ty.row_bytes(cols)
            && panel.len() == NR16 * cols
            && fb.len() == NR16 * cols / 16,
        "kgemm decode16: sizes"
    );
    panel[rows * cols..].fill(0);
    fb[rows * cols / 16..].fill(0.0);
    let rb = ty.row_bytes(cols);
    // SAFETY: sizes checked above; features as the contract says.
    unsafe {
        for r in 0..rows {
            let row = data.as_ptr().add(r * rb);
            let dst = panel.as_mut_ptr().add(r * cols);
            let f = fb.as_mut_ptr().add(r * cols / 16);
            match ty {
                GgmlType::Q8_0 => decode_row16::<Q8_0>(row, cols, dst, f),
                GgmlType::Q4_0 => decode_row16::<Q4_0>(row, cols, dst, f),
                GgmlType::Q5_0 => decode_row16::<Q5_0>(row, cols, dst, f),
                GgmlType::Q4_1 => decode_row16::<Q4_1>(row, cols, dst, f),
                GgmlType::Q5_1 => decode_row16::<Q5_1>(row, cols, dst, f),
                GgmlType::Q4_K => decode_row16::<Q45K<false>>(row, cols, dst, f),
                GgmlType::Q5_K => decode_row16::<Q45K<true>>(row, cols, dst, f),
                GgmlType::Q6_K => decode_row16::<Q6K>(row, cols, dst, f),
                GgmlType::Q2_K | GgmlType::Q3_K => unreachable!("no unpacker for {}", ty.name()),
            }
        }
    }
}

/// One row of `U`'s type as int16 codes times their integer scales, and `[f, b]` a chunk.
///
/// # Safety
/// As [`decode16`]; `row` holds `cols / 32` chunks, `dst` `cols` codes, `fb` `cols / 16`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_row16<U: Unpack + Default>(
    row: *const u8,
    cols: usize,
    dst: *mut i16,
    fb: *mut f32,
) {
    let mut u = U::default();
    // SAFETY: within the ranges of the contract.
    unsafe {
        for c in 0..cols / 32 {
            let (w, _, f, b) = u.chunk(row, c);
            let mut v = if U::SIGNED {
                _mm512_cvtepi8_epi16(w)
            } else {
                _mm512_cvtepu8_epi16(w)
            };
            if U::SCALED {
                let h = u.halves(c);
                let s = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set1_epi16(h[0] as i16)),
                    _mm256_set1_epi16(h[1] as i16),
                );
                v = _mm512_mullo_epi16(v, s);
            }
            _mm512_storeu_si512(dst.add(32 * c) as *mut _, v);
            *fb.add(2 * c) = f;
            *fb.add(2 * c + 1) = if U::MINS { b } else { 0.0 };
        }
    }
}

/// `acc[r][t]` = row `r` of the int16 panel times input `t` of the tile, for the first
/// `16 * TV` inputs: per chunk (per half chunk where `HALF`, Q6_K's 16-value scales) exact
/// 32-bit sums of `vpdpwssd`, then `acc += f * (d * sum)` in float32, and where `MINS`
/// `acc -= b * s` (the chunk's minimum times the input chunk's float sum).
///
/// # Safety
/// AVX-512 F/BW + VNNI; `panel` holds `NR16 * cols` codes, `fb` `NR16 * cols / 16` floats,
/// `x` `cols / 2 * MT` lanes, `xd` and `xs` `cols / 32 * MT` floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn micro16<const TV: usize, const HALF: bool, const MINS: bool>(
    panel: *const i16,
    fb: *const f32,
    x: *const i32,
    xd: *const f32,
    xs: *const f32,
    cols: usize,
    acc_out: &mut [[f32; MT]; NR16],
) {
    let mut accf = [[_mm512_setzero_ps(); TV]; NR16];
    let parts = if HALF { 2 } else { 1 };
    let pairs = 16 / parts;
    // SAFETY: within the ranges of the contract.
    unsafe {
        for c in 0..cols / 32 {
            let mut dv = [_mm512_setzero_ps(); TV];
            for (v, d) in dv.iter_mut().enumerate() {
                *d = _mm512_loadu_ps(xd.add(c * MT + 16 * v));
            }
            for h in 0..parts {
                let mut acci = [[_mm512_setzero_si512(); TV]; NR16];
                for p in 0..pairs {
                    let kp = c * 16 + h * pairs + p;
                    let mut xv = [_mm512_setzero_si512(); TV];
                    for (v, xv) in xv.iter_mut().enumerate() {
                        *xv = _mm512_loadu_si512(x.add(kp * MT + 16 * v) as *const _);
                    }
                    for (r, a) in acci.iter_mut().enumerate() {
                        let w = _mm512_set1_epi32(std::ptr::read_unaligned(
                            panel.add(r * cols + 2 * kp) as *const i32,
                        ));
                        for (v, a) in a.iter_mut().enumerate() {
                            *a = _mm512_dpwssd_epi32(*a, xv[v], w);
                        }
                    }
                }
                for (r, (a, af)) in acci.iter().zip(accf.iter_mut()).enumerate() {
                    let f = _mm512_set1_ps(*fb.add(r * cols / 16 + 2 * c));
                    for v in 0..TV {
                        let t = _mm512_mul_ps(_mm512_cvtepi32_ps(a[v]), dv[v]);
                        af[v] = _mm512_fmadd_ps(t, f, af[v]);
                    }
                }
            }
            if MINS {
                let mut sv = [_mm512_setzero_ps(); TV];
                for (v, s) in sv.iter_mut().enumerate() {
                    *s = _mm512_loadu_ps(xs.add(c * MT + 16 * v));
                }
                for (r, af) in accf.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*fb.add(r * cols / 16 + 2 * c + 1));
                    for v in 0..TV {
                        af[v] = _mm512_fnmadd_ps(b, sv[v], af[v]);
                    }
                }
            }
        }
        for (a, o) in accf.iter().zip(acc_out.iter_mut()) {
            for (v, a) in a.iter().enumerate() {
                _mm512_storeu_ps(o.as_mut_ptr().add(16 * v), *a);
            }
        }
    }
}

/// Test access: `rows` rows of `ty` decoded as a panel ([`NR`] rows of `cols`).
#[cfg(test)]
fn decode_for_test(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut p = vec![0f32; NR * cols];
    // SAFETY: only called where Isa::Avx512 is available; sizes as `decode` checks.
    unsafe { decode(ty, data, rows, cols, &mut p) };
    p
}

#[cfg(test)]
mod tests {
    use super::super::kquant::dequantize_row;
    use super::super::test_rng::Lcg;
    use super::super::{matmul_t, Activations};
    use super::*;

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    fn random_rows(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut g = Lcg(seed);
        let mut v: Vec<u8> = (0..rows * ty.row_bytes(cols))
            .map(|_| g.next() as u8)
            .collect();
        let halves: &[usize] = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::Q6_K => &[208],
            _ => &[0, 2],
        };
        for b in v.chunks_exact_mut(ty.block_bytes()) {
            for &at in halves {
                let f = (g.next() % 2000) as f32 / 1e5 - 0.004;
                b[at..at + 2].copy_from_slice(&half::f16::from_f32(f).to_le_bytes());
            }
        }
        v
    }

    /// The panel decoder gives `dequantize_row`'s values bit for bit (tier: exact), and
    /// zeros past the rows it was given.
    #[test]
    fn decode_is_the_block_decoder() {
        if !Isa::Avx512.available() {
            return;
        }
        let cols = 512;
        for ty in TYPES {
            let rows = 5;
            let data = random_rows(ty, rows, cols, 17 + u64::from(ty.id()));
            let p = decode_for_test(ty, &data, rows, cols);
            let rb = ty.row_bytes(cols);
            let mut want = vec![0f32; cols];
            for r in 0..NR {
                if r < rows {
                    dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut want);
                } else {
                    want.fill(0.0);
                }
                let got = &p[r * cols..(r + 1) * cols];
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} row {r}",
                    ty.name()
                );
            }
        }
    }

    /// Every row of `data` through the bit-exact block decoder: the plain reference's weights.
    fn dequantized(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
        let rb = ty.row_bytes(cols);
        let mut deq = vec![0f32; rows * cols];
        for (r, out) in deq.chunks_exact_mut(cols).enumerate() {
            dequantize_row(ty, &data[r * rb..(r + 1) * rb], out);
        }
        deq
    }

    /// `matmul_t` with at least `MIN_M` rows (through this module) against the plain
    /// reference (rows dequantized, float32 dots in f64 here): tier L3, bound
    /// `cols * 2^-24 * sum |w x|` per output (float32 summation in any order), with a bias,
    /// a tail panel (29 rows) and tails of the input tiles (16, 17, 33, 40 rows).
    #[test]
    fn block_products_match_the_plain_reference() {
        let ctx = CpuContext::new(2).unwrap();
        if ctx.isa != Isa::Avx512 {
            return;
        }
        let (rows, cols) = (29, 512);
        let mut g = Lcg(5);
        let bias: Vec<f32> = (0..rows).map(|i| i as f32 * 0.25).collect();
        for ty in TYPES {
            let data = random_rows(ty, rows, cols, 3 + u64::from(ty.id()));
            let w = Matrix::ggml(&data, ty, rows, cols).unwrap();
            let deq = dequantized(ty, &data, rows, cols);
            for m in [16, 17, 32, 33, 40] {
                let x: Vec<f32> = (0..m * cols).map(|_| g.unit()).collect();
                let mut out = vec![0f32; m * rows];
                let mut jobs = [MatJob {
                    w: &w,
                    bias: Some(Floats::F32(&bias)),
                    out: &mut out,
                }];
                assert!(applies(&ctx, m, &jobs));
                matmul_t(&ctx, &x, m, &mut jobs).unwrap();
                for t in 0..m {
                    for r in 0..rows {
                        let (mut dot, mut abs) = (0f64, 0f64);
                        for k in 0..cols {
                            let p = f64::from(deq[r * cols + k]) * f64::from(x[t * cols + k]);
                            dot += p;
                            abs += p.abs();
                        }
                        let want = dot + f64::from(bias[r]);
                        let got = f64::from(out[t * rows + r]);
                        let bound = cols as f64 * 2f64.powi(-24) * (abs + f64::from(bias[r]));
                        assert!(
                            (got - want).abs() <= bound,
                            "{} m {m} t {t} r {r}: {got} vs {want} (bound {bound})",
                            ty.name()
                        );
                    }
                }
            }
        }
    }

    /// The int16-input panels (`Int16Q8Int8`, the CPU decoder's default) against the plain
    /// reference with the unquantized inputs: tier L3, bound per output `sum |w| * d / 2`
    /// (each input within half its chunk's step `d = max|x| / 32767`) plus twice the float32
    /// rounding bound `cols * 2^-24 * sum |w x|`; every type, a bias, a tail panel (29 rows),
    /// tails of the input tiles, and inputs spanning six decades.
    #[test]
    fn int16_panels_are_within_half_an_input_step() {
        let mut ctx = CpuContext::new(2).unwrap();
        if ctx.isa != Isa::Avx512 {
            return;
        }
        ctx.activations = Activations::Int16Q8Int8;
        let (rows, cols) = (29, 512);
        let mut g = Lcg(11);
        let bias: Vec<f32> = (0..rows).map(|i| i as f32 * 0.25).collect();
        for ty in TYPES {
            let data = random_rows(ty, rows, cols, 7 + u64::from(ty.id()));
            let w = Matrix::ggml(&data, ty, rows, cols).unwrap();
            let deq = dequantized(ty, &data, rows, cols);
            for m in [16, 17, 32, 33, 40] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| g.unit() * 10f32.powi((i % 7) as i32 - 3))
                    .collect();
                let mut out = vec![0f32; m * rows];
                let mut jobs = [MatJob {
                    w: &w,
                    bias: Some(Floats::F32(&bias)),
                    out: &mut out,
                }];
                assert!(applies(&ctx, m, &jobs) && int16_inputs(&ctx));
                matmul_t(&ctx, &x, m, &mut jobs).unwrap();
                for t in 0..m {
                    let xr = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let (mut dot, mut abs, mut quant) = (0f64, 0f64, 0f64);
                        for (c, xc) in xr.chunks_exact(32).enumerate() {
                            let amax = xc.iter().fold(0f32, |a, v| a.max(v.abs()));
                            let d = f64::from(amax / 32767.0);
                            for (k, &xv) in xc.iter().enumerate() {
                                let wv = f64::from(deq[r * cols + 32 * c + k]);
                                let p = wv * f64::from(xv);
                                dot += p;
                                abs += p.abs();
                                quant += wv.abs() * d / 2.0;
                            }
                        }
                        let want = dot + f64::from(bias[r]);
                        let got = f64::from(out[t * rows + r]);
                        let bound = quant
                            + 2.0
                                * cols as f64
                                * 2f64.powi(-24)
                                * (abs + quant + f64::from(bias[r]));
                        assert!(
                            (got - want).abs() <= bound,
                            "{} m {m} t {t} r {r}: {got} vs {want} (bound {bound})",
                            ty.name()
                        );
                    }
                }
            }
        }
    }

    /// Fewer than `MIN_M` rows, int8 inputs, or another layout in the call: not here.
    #[test]
    fn dispatch() {
        let mut ctx = CpuContext::new(1).unwrap();
        if ctx.isa != Isa::Avx512 {
            return;
        }
        let data = random_rows(GgmlType::Q4_K, 2, 256, 1);
        let w = Matrix::ggml(&data, GgmlType::Q4_K, 2, 256).unwrap();
        let q2 = random_rows(GgmlType::Q2_K, 2, 256, 1);
        let w2 = Matrix::ggml(&q2, GgmlType::Q2_K, 2, 256).unwrap();
        let mut out = vec![0f32; 64];
        let mut out2 = vec![0f32; 64];
        let jobs = [MatJob {
            w: &w,
            bias: None,
            out: &mut out,
        }];
        assert!(applies(&ctx, MIN_M, &jobs));
        assert!(!applies(&ctx, MIN_M - 1, &jobs));
        ctx.activations = Activations::Int8;
        assert!(!applies(&ctx, MIN_M, &jobs));
        ctx.activations = Activations::Int16Q8Int8;
        assert!(applies(&ctx, MIN_M, &jobs) && int16_inputs(&ctx));
        ctx.activations = Activations::F32;
        assert!(applies(&ctx, MIN_M, &jobs) && !int16_inputs(&ctx));
        let [j] = jobs;
        let both = [
            j,
            MatJob {
                w: &w2,
                bias: None,
                out: &mut out2,
            },
        ];
        assert!(!applies(&ctx, MIN_M, &both));
    }
}
