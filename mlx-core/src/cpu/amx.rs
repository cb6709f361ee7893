//! Prompt-block products on Intel AMX's bfloat16 tiles (`tdpbf16ps`) for MLX affine 4- and
//! 8-bit weights (any group that is a multiple of 32): what Q4_0, Q4_1 and Q8_0 GGUFs and MLX
//! affine models load as, at [`MIN_M`] or more input rows under the CPU decoder's default
//! activations (`Int16` / `Int16Q8Int8`; `F32` keeps the float kernels).
//!
//! A tile product adds a 16 x 16 block of float32 sums of 32 bfloat16 products each, 8192
//! multiply-adds an instruction against AVX-512's 16 (float) or 32 (`vpdpwssd`). bfloat16
//! keeps 8 significant bits, so each float32 value `v` goes in as two: `hi = bf16(v)` and
//! `lo = bf16(v - hi)` (both rounded to nearest even; `v - hi` is exact), 16 significant bits
//! together, and each product as three tile products, `w_hi x_hi + w_hi x_lo + w_lo x_hi`
//! (the dropped `w_lo x_lo` is below `2^-18 |w x|`). The tiles accumulate over the whole row
//! in float32: no per-group rescaling, since the weights go in dequantized.
//!
//! Layout: each worker takes a panel of [`TR`] weight rows. For each 32-column block it
//! dequantizes the panel's rows (`scale * q + bias` in one fused multiply-add: within one
//! rounding of [`Matrix::value`]) into a 16 x 32 bfloat16 tile pair (rows: weight rows; the A
//! operand), and the
//! inputs, split and transposed once a call into the B operand's pair layout (row `k/2` of a
//! tile holds the pairs `(x[t][k], x[t][k+1])` of 16 inputs `t`), give two 16-input tiles a
//! pass of 32 inputs; the C tiles (16 weight rows x 16 inputs) are stored once a pass.
//!
//! Tier L3 against the plain reference (the rows dequantized by [`Matrix::value`], float32
//! dots with the unrounded inputs): per output, `2^-16 * sum |w x|` (the split: each of the
//! three terms' roundings is at most `2^-18 |w x|`, with room) plus the float32 summation
//! bound `3 * cols * 2^-24 * sum |w x|` (tests in this file). A row's bits depend on whether it
//! comes in a block of at least [`MIN_M`] rows (`matmul_t` only; `matmul_t_each`, the decode
//! and verify steps, never comes here).
//!
//! AMX needs the CPU's AMX-TILE and AMX-BF16 and, on Linux, the kernel's permission for the
//! tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once a process:
//! [`available`]). The tile instructions are written as inline assembly (their intrinsics are
//! not stable Rust).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::matmul::{AffineParts, Floats, MatJob, Matrix, MAX_JOBS};
use super::{Activations, CpuContext, Isa, SharedOut};
use crate::Result;

/// The fewest input rows a call takes here (fewer: the per-row kernels).
pub const MIN_M: usize = 8;
/// Weight rows a panel (a tile's rows).
const TR: usize = 16;
/// Inputs a pass (two tiles of 16).
const PASS: usize = 32;
/// bfloat16 values in one 16 x 64-byte tile.
const TILE: usize = 512;

/// 64 bytes, 64-byte aligned: the B tiles' buffer is a vector of these, so that every tile row
/// is one cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u16; 32]);

thread_local! {
    /// The caller's inputs in the B layout ([`split_inputs`]).
    static XB: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    /// A worker's panel scales and biases as float32.
    static SB: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A worker's C tiles between column chunks ([`panel_chunked`]): two tiles a pass and
    /// panel.
    static CB: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Hands back the calling thread's input lines (see [`super::release_prompt_buffers`]).
pub(super) fn release_inputs() {
    XB.with(|x| *x.borrow_mut() = Vec::new());
}

/// 32-column blocks a chunk of [`panel_chunked`]: the panel's dequantized rows of a chunk
/// (hi / lo tile pairs, `2 * KC` tiles, 16 KiB) stay in the L1 cache while every pass reads
/// them.
const KC: usize = 8;

/// Which panel kernel [`matmul_jobs`] takes: [`panel_chunked`] over one panel (0, the
/// default; [`panel`] where `m <= PASS`), [`panel`] (1: the weights dequantized again for
/// every pass of [`PASS`] inputs)
/// or [`panel_chunked`] over two panels (2: no faster in `cpu_matvec prefill`). All give the
/// same bits; a measurement knob for the micro-benchmark.
static MODE: AtomicUsize = AtomicUsize::new(0);

/// Sets [`MODE`] (measurement only: every kernel gives the same bits).
#[doc(hidden)]
pub fn set_panel_mode(mode: usize) {
    MODE.store(mode, Ordering::Relaxed);
}

/// Whether this CPU and operating system run the AMX bfloat16 tile products (CPUID's AMX-TILE,
/// AMX-BF16 and AVX512-BF16 next to [`Isa::Avx512`], and, on Linux, the kernel's permission
/// for the tile state, asked once a process).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if !Isa::Avx512.available() || !std::arch::is_x86_feature_detected!("avx512bf16") {
            return false;
        }
        // CPUID leaf 7, sub-leaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        let r = __cpuid_count(7, 0);
        if (r.edx >> 22) & 1 == 0 || (r.edx >> 24) & 1 == 0 {
            return false;
        }
        request_tile_state()
    })
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only changes which state the kernel lets
    // this process use; it reads no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// Whether a [`super::matmul_t`] call of `m` rows takes these kernels: AMX on (`ctx.amx`),
/// at least [`MIN_M`] rows, int16 activations, every job a 4- or 8-bit affine matrix.
pub(crate) fn applies(ctx: &CpuContext, m: usize, jobs: &[MatJob<'_, '_>]) -> bool {
    ctx.amx
        && m >= MIN_M
        && matches!(
            ctx.activations,
            Activations::Int16 | Activations::Int16Q8Int8
        )
        && jobs.iter().all(|j| takes(j.w))
}

/// Whether the tile kernels read `w`: 4- or 8-bit affine (groups are multiples of 32 and
/// divide the row, as [`Matrix::affine`] checks).
fn takes(w: &Matrix<'_>) -> bool {
    w.affine_parts().is_some_and(|p| matches!(p.bits, 4 | 8)) && w.cols() % 32 == 0
}

/// `out = x W^T (+ bias)` for every job ([`applies`] holds; sizes checked by the caller).
pub(crate) fn matmul_jobs(
    ctx: &CpuContext,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
) -> Result<()> {
    matmul_jobs_with(ctx, x, m, jobs, MODE.load(Ordering::Relaxed))
}

/// [`matmul_jobs`] through the panel kernel `mode` names ([`MODE`]).
fn matmul_jobs_with(
    ctx: &CpuContext,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
    mode: usize,
) -> Result<()> {
    let cols = jobs[0].w.cols();
    let need = m.div_ceil(PASS) * (cols / 32) * 4 * TILE;
    XB.with(|xb| {
        let mut xb = xb.borrow_mut();
        if xb.len() < need / 32 {
            xb.resize(need / 32, Line([0; 32]));
        }
        // SAFETY: `need / 32` lines of 32 u16 each, viewed as `need` u16 (no padding: 64 bytes
        // of u16 at alignment 64).
        let xb = unsafe { std::slice::from_raw_parts_mut(xb.as_mut_ptr() as *mut u16, need) };
        // One unit: 16 inputs (half a pass) over one 32-column block.
        let kblocks = cols / 32;
        let units = m.div_ceil(16) * kblocks;
        let dst = SharedXb(xb.as_mut_ptr());
        let next = AtomicUsize::new(0);
        ctx.pool.run(&|_, _| loop {
            let u = next.fetch_add(1, Ordering::Relaxed);
            if u >= units {
                break;
            }
            // SAFETY: `applies` saw `ctx.amx`, which is only set where `available` (AVX-512
            // F/BW and AVX512-BF16); the unit's two tiles are this worker's alone, within the
            // `need` values of `xb`.
            unsafe { split_inputs(x, m, cols, u / kblocks, u % kblocks, dst) };
        });
        run(ctx, xb, m, jobs, mode);
    });
    Ok(())
}

/// One 64-byte tile configuration (palette 1): eight tiles of 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

static CONFIG: TileConfig = {
    let mut c = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    let mut t = 0;
    while t < 8 {
        c.colsb[t] = 64;
        c.rows[t] = 16;
        t += 1;
    }
    c
};

fn run(ctx: &CpuContext, xb: &[u16], m: usize, jobs: &mut [MatJob<'_, '_>], mode: usize) {
    // One pass: nothing to reuse, and `panel` spares the C tiles' stores and loads between
    // chunks (the same bits).
    let mode = if mode == 0 && m <= PASS { 1 } else { mode };
    type Plan<'p> = (Matrix<'p>, Option<Floats<'p>>, SharedOut, usize);
    let mut plan: [Option<Plan<'_>>; MAX_JOBS] = [None; MAX_JOBS];
    // Weight rows a unit of work.
    let unit = if mode == 2 { 2 * TR } else { TR };
    let mut panels = 0;
    for (p, j) in plan.iter_mut().zip(jobs.iter_mut()) {
        *p = Some((*j.w, j.bias, SharedOut::new(j.out), panels));
        panels += j.w.rows().div_ceil(unit);
    }
    let next = AtomicUsize::new(0);
    ctx.pool.run(&|_, _| {
        let mut c = [0f32; 2 * TR * 16];
        let mut started = false;
        // Two 16 x 32 tile pairs (hi, lo), one being filled while the other is read.
        #[repr(C, align(64))]
        struct Panel([u16; 4 * TILE]);
        let mut a = Panel([0; 4 * TILE]);
        // A chunk's dequantized rows ([`panel_chunked`]).
        #[repr(C, align(64))]
        struct Chunk([u16; 2 * KC * TILE]);
        let mut ch = Chunk([0; 2 * KC * TILE]);
        SB.with(|sb| {
            CB.with(|cb| {
                let mut sb = sb.borrow_mut();
                let mut cb = cb.borrow_mut();
                let lines = m.div_ceil(PASS) * 2 * 2 * TR;
                if cb.len() < lines {
                    cb.resize(lines, Line([0; 32]));
                }
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= panels {
                        break;
                    }
                    let Some(&(w, bias, out, start)) =
                        plan.iter().rev().flatten().find(|p| p.3 <= b)
                    else {
                        break;
                    };
                    let n = w.rows();
                    let r0 = (b - start) * unit;
                    let r1 = (r0 + unit).min(n);
                    if !started {
                        // SAFETY: AMX is available (`applies` saw `ctx.amx`); the configuration is
                        // 64 readable bytes.
                        unsafe {
                            asm!("ldtilecfg [{0}]", in(reg) &CONFIG, options(nostack, readonly))
                        };
                        started = true;
                    }
                    // SAFETY: as in `matmul_jobs`; `w` is a 4- or 8-bit affine matrix (`applies`),
                    // rows r0..r1 of every output are this worker's alone, `xb` holds the inputs'
                    // passes ([`split_inputs`]).
                    unsafe {
                        match mode {
                            1 => panel(&w, r0, r1, xb, m, &mut a.0, &mut c, &mut sb, out, bias),
                            2 => panel_chunked::<2>(
                                &w, r0, r1, xb, m, &mut ch.0, &mut cb, &mut sb, out, bias,
                            ),
                            _ => panel_chunked::<1>(
                                &w, r0, r1, xb, m, &mut ch.0, &mut cb, &mut sb, out, bias,
                            ),
                        }
                    };
                }
                if started {
                    // SAFETY: tiles were configured above.
                    unsafe { asm!("tilerelease", options(nostack, nomem)) };
                }
            })
        });
    });
}

/// The tile products of one K block ([`panel`], [`panel_chunked`]): `tmm0` (and `tmm1` where
/// `tn > 16`: two input tiles) accumulate the weights' bfloat16 halves at `buf` (high, then
/// low `TILE` bytes on) times the inputs' at `xp` (high, low; then the second tile's high,
/// low), as `w_hi x_hi + w_hi x_lo + w_lo x_hi`, the two tiles' terms interleaved (two
/// accumulation chains in flight). A macro, the same `asm!` expanded in place in both kernels;
/// inside the caller's `unsafe` block, whose SAFETY comment covers these reads.
macro_rules! tile_products {
    ($tn:expr, $buf:expr, $xp:expr, $stride:expr) => {
        let (tn, buf, xp, stride) = ($tn, $buf, $xp, $stride);
        if tn > 16 {
            asm!(
                "tileloadd tmm2, [{a} + {s}*1]",
                "tileloadd tmm4, [{x} + {s}*1]",
                "tileloadd tmm6, [{x1} + {s}*1]",
                "tdpbf16ps tmm0, tmm2, tmm4",
                "tdpbf16ps tmm1, tmm2, tmm6",
                "tileloadd tmm5, [{xl} + {s}*1]",
                "tileloadd tmm7, [{xl1} + {s}*1]",
                "tdpbf16ps tmm0, tmm2, tmm5",
                "tdpbf16ps tmm1, tmm2, tmm7",
                "tileloadd tmm3, [{al} + {s}*1]",
                "tdpbf16ps tmm0, tmm3, tmm4",
                "tdpbf16ps tmm1, tmm3, tmm6",
                a = in(reg) buf,
                al = in(reg) buf.add(TILE),
                x = in(reg) xp,
                xl = in(reg) xp.add(TILE),
                x1 = in(reg) xp.add(2 * TILE),
                xl1 = in(reg) xp.add(3 * TILE),
                s = in(reg) stride,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tileloadd tmm2, [{a} + {s}*1]",
                "tileloadd tmm4, [{x} + {s}*1]",
                "tdpbf16ps tmm0, tmm2, tmm4",
                "tileloadd tmm5, [{xl} + {s}*1]",
                "tdpbf16ps tmm0, tmm2, tmm5",
                "tileloadd tmm3, [{al} + {s}*1]",
                "tdpbf16ps tmm0, tmm3, tmm4",
                a = in(reg) buf,
                al = in(reg) buf.add(TILE),
                x = in(reg) xp,
                xl = in(reg) xp.add(TILE),
                s = in(reg) stride,
                options(nostack, readonly),
            );
        }
    };
}

/// Rows `r0..r1` (at most [`TR`]) of every output row: per pass of 32 inputs, per 32-column
/// block, the panel's rows dequantized and split into `a` (two hi / lo tile pairs, used in
/// turn), then three tile products per 16 inputs into `tmm0` / `tmm1`, stored into `c` and
/// written out with the bias. Rows of `a` past the panel's keep what they held: a C row
/// depends on its A row alone, and those rows are not written out.
///
/// # Safety
/// AMX tiles configured ([`CONFIG`]) on this thread; AVX-512 F/BW + BF16; `w` 4- or 8-bit
/// affine with `cols % 32 == 0`; `xb` as [`split_inputs`] made it for `m` rows of `cols`; rows
/// `r0..r1` of `out` (`(m, rows)`) are this caller's alone.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn panel(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    xb: &[u16],
    m: usize,
    a: &mut [u16; 4 * TILE],
    c: &mut [f32; 2 * TR * 16],
    sb: &mut Vec<f32>,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let cols = w.cols();
    let kblocks = cols / 32;
    let n = w.rows();
    // Affine or symmetric (a symmetric matrix's biases formed from its scales below).
    let Some(AffineParts {
        words,
        scales,
        biases,
        bits,
        group,
        sym,
    }) = w.affine_parts()
    else {
        unreachable!("amx::panel takes affine or symmetric matrices")
    };
    let bias_k = -((1u32 << (bits - 1)) as f32);
    assert!(
        r0 < r1 && r1 - r0 <= TR && r1 <= n && xb.len() >= m.div_ceil(PASS) * kblocks * 4 * TILE,
        "amx panel: sizes"
    );
    let bytes: &[u8] = {
        // SAFETY: a u32 slice viewed as its bytes (alignment 1, same length in bytes).
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 4) }
    };
    let row_bytes = cols * bits as usize / 8;
    let groups = cols / group;
    let per_group = group / 32;
    let stride = 64usize;
    let rows = r1 - r0;
    // The panel's scales and biases as float32, row after row.
    if sb.len() < 2 * TR * groups {
        sb.resize(2 * TR * groups, 0.0);
    }
    let (ps, pb) = sb[..2 * TR * groups].split_at_mut(TR * groups);
    for i in 0..rows {
        let at = (r0 + i) * groups;
        // SAFETY: F16C as the contract says; `at + groups` is within the matrix's groups.
        unsafe {
            widen(scales, at, &mut ps[i * groups..(i + 1) * groups]);
            widen(biases, at, &mut pb[i * groups..(i + 1) * groups]);
        }
        if sym {
            // Exact: the float16 biases `bias_k x scale` MLX materializes, widened.
            pb[i * groups..(i + 1) * groups]
                .iter_mut()
                .for_each(|b| *b *= bias_k);
        }
    }
    // SAFETY: every pointer below stays inside `bytes` (rows r0..r1 < n, blocks < kblocks),
    // `a` (64-byte aligned: the caller's), `c`, `ps`, `pb` and `xb` (sizes asserted and grown
    // above); features and tiles as the contract says.
    unsafe {
        for pass in 0..m.div_ceil(PASS) {
            let tn = (m - pass * PASS).min(PASS);
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
            for kb in 0..kblocks {
                // Each block's rows into one of two hi / lo tile pairs (the other may still
                // be read by the previous block's products), kept in the L1 cache.
                let buf = a.as_mut_ptr().add((kb & 1) * 2 * TILE);
                let gi = kb / per_group;
                for i in 0..rows {
                    let sv = _mm512_set1_ps(*ps.get_unchecked(i * groups + gi));
                    let bv = _mm512_set1_ps(*pb.get_unchecked(i * groups + gi));
                    let p = bytes
                        .as_ptr()
                        .add((r0 + i) * row_bytes + kb * 32 * bits as usize / 8);
                    // Dword j holds values 2j and 2j + 1.
                    let (e, o) = if bits == 4 {
                        let d = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                        (
                            _mm512_and_si512(d, _mm512_set1_epi32(0x0f)),
                            _mm512_srli_epi32::<4>(d),
                        )
                    } else {
                        let d = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
                        (
                            _mm512_and_si512(d, _mm512_set1_epi32(0xff)),
                            _mm512_srli_epi32::<8>(d),
                        )
                    };
                    let we = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e), sv, bv);
                    let wo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(o), sv, bv);
                    let (hi, lo) = split_pairs(we, wo);
                    _mm512_store_si512(buf.add(i * 32) as *mut _, hi);
                    _mm512_store_si512(buf.add(TILE + i * 32) as *mut _, lo);
                }
                let xp = xb.as_ptr().add((pass * kblocks + kb) * 4 * TILE);
                // Each C tile's sum as w_hi x_hi + w_hi x_lo + w_lo x_hi, the two tiles' terms
                // interleaved (two accumulation chains in flight).
                tile_products!(tn, buf, xp, stride);
            }
            asm!(
                "tilestored [{c} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm1",
                c = in(reg) c.as_mut_ptr(),
                c1 = in(reg) c.as_mut_ptr().add(TR * 16),
                s = in(reg) stride,
                options(nostack),
            );
            let mut bv = [0f32; TR];
            if let Some(b) = bias {
                for (i, v) in bv[..r1 - r0].iter_mut().enumerate() {
                    *v = b.get(r0 + i);
                }
            }
            for t in 0..tn {
                let o = out.range((pass * PASS + t) * n + r0, r1 - r0);
                let (tile, col) = (t / 16, t % 16);
                for (i, (o, b)) in o.iter_mut().zip(&bv).enumerate() {
                    *o = c[tile * TR * 16 + i * 16 + col] + b;
                }
            }
        }
    }
}

/// As [`panel`], the same bits, with the weights dequantized once a call instead of once a
/// pass, over `NP` panels of [`TR`] rows (rows `r0..r1`, at most `NP * TR`): per chunk of
/// `KC / NP` 32-column blocks, the rows are dequantized and split into `a` (hi / lo tile
/// pairs, 16 KiB: in the L1 cache), then every pass of [`PASS`] inputs, for each panel, loads
/// its two C tiles from `cb` (zero at the first chunk), runs the chunk's blocks (the same
/// three tile products per 16 inputs in the same order as [`panel`]) and stores them back.
/// Float32 C tiles are stored and loaded exactly, so each output's sums are [`panel`]'s. A
/// prompt block of `m` rows dequantizes each weight once, against `m / 32` times in
/// [`panel`]. With `NP = 2` the inputs' tiles of a chunk, read from the L2 cache by the first
/// panel, are in the L1 cache for the second (half the L2 traffic of one panel at a time),
/// but that measured no faster (`cpu_matvec prefill`): the default is `NP = 1`.
///
/// # Safety
/// As [`panel`] (with `r1 - r0 <= NP * TR`); `cb` holds at least
/// `m.div_ceil(PASS) * NP * 2 * TR` lines.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn panel_chunked<const NP: usize>(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    xb: &[u16],
    m: usize,
    a: &mut [u16; 2 * KC * TILE],
    cb: &mut [Line],
    sb: &mut Vec<f32>,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let kc_max = KC / NP;
    let cols = w.cols();
    let kblocks = cols / 32;
    let n = w.rows();
    let passes = m.div_ceil(PASS);
    // Affine or symmetric (a symmetric matrix's biases formed from its scales below).
    let Some(AffineParts {
        words,
        scales,
        biases,
        bits,
        group,
        sym,
    }) = w.affine_parts()
    else {
        unreachable!("amx::panel_chunked takes affine or symmetric matrices")
    };
    let bias_k = -((1u32 << (bits - 1)) as f32);
    assert!(
        (1..=2).contains(&NP)
            && r0 < r1
            && r1 - r0 <= NP * TR
            && r1 <= n
            && xb.len() >= passes * kblocks * 4 * TILE
            && cb.len() >= passes * NP * 2 * TR,
        "amx panel_chunked: sizes"
    );
    let bytes: &[u8] = {
        // SAFETY: a u32 slice viewed as its bytes (alignment 1, same length in bytes).
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 4) }
    };
    let row_bytes = cols * bits as usize / 8;
    let groups = cols / group;
    let per_group = group / 32;
    let stride = 64usize;
    let rows = r1 - r0;
    // Panels that hold rows (the last may be short).
    let np = rows.div_ceil(TR);
    if sb.len() < 2 * NP * TR * groups {
        sb.resize(2 * NP * TR * groups, 0.0);
    }
    let (ps, pb) = sb[..2 * NP * TR * groups].split_at_mut(NP * TR * groups);
    for i in 0..rows {
        let at = (r0 + i) * groups;
        // SAFETY: F16C as the contract says; `at + groups` is within the matrix's groups.
        unsafe {
            widen(scales, at, &mut ps[i * groups..(i + 1) * groups]);
            widen(biases, at, &mut pb[i * groups..(i + 1) * groups]);
        }
        if sym {
            // Exact: the float16 biases `bias_k x scale` MLX materializes, widened.
            pb[i * groups..(i + 1) * groups]
                .iter_mut()
                .for_each(|b| *b *= bias_k);
        }
    }
    let cp = cb.as_mut_ptr() as *mut f32;
    // C tiles of (pass, panel): two tiles of TR x 16 float32.
    // SAFETY (of each call): `pass < passes` and `p < NP`, within `cb` (asserted above).
    let ctile = |pass: usize, p: usize| unsafe { cp.add((pass * NP + p) * 2 * TR * 16) };
    // A tiles of (panel, block of the chunk): a hi / lo pair.
    let atile = |p: usize, kc: usize| (p * kc_max + kc) * 2 * TILE;
    // SAFETY: every pointer below stays inside `bytes` (rows r0..r1 < n, blocks < kblocks),
    // `a` (64-byte aligned: the caller's; `NP * kc_max` = KC pairs), `cb` (`passes * NP * 2 *
    // TR` lines, asserted), `ps`, `pb` and `xb` (sizes asserted and grown above); features and
    // tiles as the contract says.
    unsafe {
        for k0 in (0..kblocks).step_by(kc_max) {
            let kn = kc_max.min(kblocks - k0);
            for kc in 0..kn {
                let kb = k0 + kc;
                let gi = kb / per_group;
                for i in 0..rows {
                    let buf = a.as_mut_ptr().add(atile(i / TR, kc));
                    let ir = i % TR;
                    let sv = _mm512_set1_ps(*ps.get_unchecked(i * groups + gi));
                    let bv = _mm512_set1_ps(*pb.get_unchecked(i * groups + gi));
                    let p = bytes
                        .as_ptr()
                        .add((r0 + i) * row_bytes + kb * 32 * bits as usize / 8);
                    // Dword j holds values 2j and 2j + 1 (as in `panel`).
                    let (e, o) = if bits == 4 {
                        let d = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                        (
                            _mm512_and_si512(d, _mm512_set1_epi32(0x0f)),
                            _mm512_srli_epi32::<4>(d),
                        )
                    } else {
                        let d = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
                        (
                            _mm512_and_si512(d, _mm512_set1_epi32(0xff)),
                            _mm512_srli_epi32::<8>(d),
                        )
                    };
                    let we = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e), sv, bv);
                    let wo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(o), sv, bv);
                    let (hi, lo) = split_pairs(we, wo);
                    _mm512_store_si512(buf.add(ir * 32) as *mut _, hi);
                    _mm512_store_si512(buf.add(TILE + ir * 32) as *mut _, lo);
                }
            }
            for pass in 0..passes {
                let tn = (m - pass * PASS).min(PASS);
                for p in 0..np {
                    let c0 = ctile(pass, p);
                    let c1 = c0.add(TR * 16);
                    if k0 == 0 {
                        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    } else {
                        asm!(
                            "tileloadd tmm0, [{c} + {s}*1]",
                            "tileloadd tmm1, [{c1} + {s}*1]",
                            c = in(reg) c0,
                            c1 = in(reg) c1,
                            s = in(reg) stride,
                            options(nostack, readonly),
                        );
                    }
                    for kc in 0..kn {
                        let buf = a.as_ptr().add(atile(p, kc));
                        let xp = xb.as_ptr().add((pass * kblocks + k0 + kc) * 4 * TILE);
                        tile_products!(tn, buf, xp, stride);
                    }
                    asm!(
                        "tilestored [{c} + {s}*1], tmm0",
                        "tilestored [{c1} + {s}*1], tmm1",
                        c = in(reg) c0,
                        c1 = in(reg) c1,
                        s = in(reg) stride,
                        options(nostack),
                    );
                }
            }
        }
        for p in 0..np {
            let (pr0, pr1) = (p * TR, ((p + 1) * TR).min(rows));
            let mut bv = [0f32; TR];
            if let Some(b) = bias {
                for (i, v) in bv[..pr1 - pr0].iter_mut().enumerate() {
                    *v = b.get(r0 + pr0 + i);
                }
            }
            for pass in 0..passes {
                let tn = (m - pass * PASS).min(PASS);
                let c = std::slice::from_raw_parts(ctile(pass, p), 2 * TR * 16);
                for t in 0..tn {
                    let o = out.range((pass * PASS + t) * n + r0 + pr0, pr1 - pr0);
                    let (tile, col) = (t / 16, t % 16);
                    for (i, (o, b)) in o.iter_mut().zip(&bv).enumerate() {
                        *o = c[tile * TR * 16 + i * 16 + col] + b;
                    }
                }
            }
        }
    }
}

/// `f[at..at + out.len()]` widened to float32 (exact).
///
/// # Safety
/// The CPU has AVX-512 F and F16C; the range is within `f`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn widen(f: Floats<'_>, at: usize, out: &mut [f32]) {
    let n = out.len();
    match f {
        Floats::F16(h) => {
            let h = &h[at..at + n];
            let mut i = 0;
            // SAFETY: i + 16 <= n for the vector part; the tail is indexed.
            unsafe {
                while i + 16 <= n {
                    let v = _mm256_loadu_si256(h.as_ptr().add(i) as *const __m256i);
                    _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_cvtph_ps(v));
                    i += 16;
                }
            }
            for (o, v) in out[i..].iter_mut().zip(&h[i..]) {
                *o = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(v.to_bits()))));
            }
        }
        _ => f.copy_to(at, out),
    }
}

/// Even and odd values (`e[j]` is value `2j`, `o[j]` value `2j + 1`) as bfloat16 pairs `hi =
/// bf16(v)` and `lo = bf16(v - hi)` (rounded to nearest even), each as 16 dwords holding
/// values `2j` (low half) and `2j + 1`: 32 values in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn split_pairs(e: __m512, o: __m512) -> (__m512i, __m512i) {
    // Word 2j from the first half (the evens), word 2j + 1 from the second (the odds).
    let inter = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    // SAFETY: 32 bfloat16 values are 64 bytes, as an __m512i.
    let hi: __m512i = unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(o, e)) };
    let hi = _mm512_permutexvar_epi16(inter, hi);
    let he = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(hi));
    let ho = _mm512_castsi512_ps(_mm512_and_si512(hi, _mm512_set1_epi32(-65536)));
    // SAFETY: as above.
    let lo: __m512i = unsafe {
        std::mem::transmute(_mm512_cvtne2ps_pbh(
            _mm512_sub_ps(o, ho),
            _mm512_sub_ps(e, he),
        ))
    };
    (hi, _mm512_permutexvar_epi16(inter, lo))
}

#[inline]
fn bits(h: __m256bh) -> __m256i {
    // SAFETY: 16 bfloat16 values are 32 bytes, as an __m256i.
    unsafe { std::mem::transmute(h) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn split(v0: __m512, v1: __m512) -> (__m512i, __m512i) {
    let widen =
        |h: __m256bh| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits(h))));
    let h0 = _mm512_cvtneps_pbh(v0);
    let h1 = _mm512_cvtneps_pbh(v1);
    let l0 = _mm512_sub_ps(v0, widen(h0));
    let l1 = _mm512_sub_ps(v1, widen(h1));
    let hi = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bits(h0)), bits(h1));
    // SAFETY: 32 bfloat16 values are 64 bytes, as an __m512i.
    let lo: __m512i = unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(l1, l0)) };
    (hi, lo)
}

/// The B layout's buffer, written by several workers at disjoint tiles.
#[derive(Clone, Copy)]
struct SharedXb(*mut u16);
// SAFETY: workers write disjoint tiles ([`split_inputs`]'s units), and the buffer outlives the
// pool run.
unsafe impl Send for SharedXb {}
unsafe impl Sync for SharedXb {}

/// Inputs `16 * half .. 16 * half + 16` of `x` `(m, cols)`, block `kb` of 32 columns, split
/// into bfloat16 pairs ([`split`]) in the B operand's layout: per pass of [`PASS`] inputs and
/// 32-column block, four tiles (`hi` of inputs 0..16, their `lo`, `hi` of 16..32, their `lo`),
/// row `k2` of a tile holding, for each of its 16 inputs `t`, the pair `(x[t][2 k2],
/// x[t][2 k2 + 1])` of the block; inputs past `m` zero. Each input's 16 pairs, one vector, go
/// to a tile's column: a 16 x 16 transpose of 32-bit lanes in registers.
///
/// # Safety
/// AVX-512 F/BW + BF16; `xb` holds `m.div_ceil(PASS) * cols / 32 * 4 * TILE` values, of which
/// this caller alone writes the two tiles of (`half`, `kb`).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn split_inputs(x: &[f32], m: usize, cols: usize, half: usize, kb: usize, xb: SharedXb) {
    let kblocks = cols / 32;
    assert!(
        x.len() == m * cols && cols % 32 == 0 && kb < kblocks && 16 * half < m,
        "amx split_inputs: sizes"
    );
    let (pass, h) = (half / 2, half % 2);
    let mut hi = [_mm512_setzero_si512(); 16];
    let mut lo = [_mm512_setzero_si512(); 16];
    // SAFETY: rows below m, columns within the row; the tiles as the contract says.
    unsafe {
        for t in 0..16 {
            let row = 16 * half + t;
            if row < m {
                let p = x.as_ptr().add(row * cols + kb * 32);
                (hi[t], lo[t]) = split(_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            }
        }
        let base = xb.0.add((pass * kblocks + kb) * 4 * TILE + h * 2 * TILE);
        for (k, v) in transpose16(&hi).iter().enumerate() {
            _mm512_storeu_si512(base.add(32 * k) as *mut _, *v);
        }
        for (k, v) in transpose16(&lo).iter().enumerate() {
            _mm512_storeu_si512(base.add(TILE + 32 * k) as *mut _, *v);
        }
    }
}

/// A 16 x 16 matrix of 32-bit lanes (one row a vector) transposed.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4i + j], 128-bit lane l: rows 4i..4i+4 of column 4l + j.
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    let mut o = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x44>(u[j], u[4 + j]);
        let v1 = _mm512_shuffle_i32x4::<0xee>(u[j], u[4 + j]);
        let v2 = _mm512_shuffle_i32x4::<0x44>(u[8 + j], u[12 + j]);
        let v3 = _mm512_shuffle_i32x4::<0xee>(u[8 + j], u[12 + j]);
        o[j] = _mm512_shuffle_i32x4::<0x88>(v0, v2);
        o[4 + j] = _mm512_shuffle_i32x4::<0xdd>(v0, v2);
        o[8 + j] = _mm512_shuffle_i32x4::<0x88>(v1, v3);
        o[12 + j] = _mm512_shuffle_i32x4::<0xdd>(v1, v3);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::super::matmul_t;
    use super::super::test_rng::Lcg;
    use super::*;
    use half::f16;

    fn amx_ctx() -> Option<CpuContext> {
        let mut ctx = CpuContext::new(2).unwrap();
        if !ctx.amx {
            return None;
        }
        ctx.activations = Activations::Int16Q8Int8;
        Some(ctx)
    }

    /// `matmul_t` with at least `MIN_M` rows over 4- and 8-bit affine weights (groups 32, 64
    /// and 128, float16 and float32 scales) through the tile kernels against the plain
    /// reference (rows dequantized by `Matrix::value`, dots in f64 with the unrounded inputs):
    /// tier L3, bound per output `2^-16 * sum |w x|` (the bfloat16 split) plus
    /// `3 * cols * 2^-24 * (sum |w x| + |bias|)` (float32 summation in any order); a bias, a
    /// tail panel (37 rows), tails of the passes (8, 16, 17, 32, 33, 70 rows) and inputs over
    /// six decades.
    #[test]
    fn tile_products_match_the_plain_reference() {
        let Some(ctx) = amx_ctx() else {
            return;
        };
        let (rows, cols) = (37, 384);
        let mut g = Lcg(23);
        let bias: Vec<f32> = (0..rows).map(|i| i as f32 * 0.25 - 3.0).collect();
        for (bits, group, half) in [
            (4u32, 32usize, true),
            (4, 64, true),
            (8, 32, true),
            (8, 64, false),
            (4, 128, false),
        ] {
            let words: Vec<u32> = (0..rows * cols * bits as usize / 32)
                .map(|_| g.next())
                .collect();
            let groups = rows * cols / group;
            let sc: Vec<f32> = (0..groups).map(|_| g.unit() * 0.02).collect();
            let bi: Vec<f32> = (0..groups).map(|_| g.unit() * 0.1).collect();
            let (sh, bh): (Vec<f16>, Vec<f16>) = (
                sc.iter().map(|&v| f16::from_f32(v)).collect(),
                bi.iter().map(|&v| f16::from_f32(v)).collect(),
            );
            let (s, b) = if half {
                (Floats::F16(&sh), Floats::F16(&bh))
            } else {
                (Floats::F32(&sc), Floats::F32(&bi))
            };
            let w = Matrix::affine(&words, s, b, rows, cols, bits, group).unwrap();
            for m in [8, 16, 17, 32, 33, 70, 130] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| g.unit() * 10f32.powi((i % 7) as i32 - 3))
                    .collect();
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
                            let p = f64::from(w.value(r, k)) * f64::from(x[t * cols + k]);
                            dot += p;
                            abs += p.abs();
                        }
                        let want = dot + f64::from(bias[r]);
                        let got = f64::from(out[t * rows + r]);
                        let bound = 2f64.powi(-16) * abs
                            + 3.0 * cols as f64 * 2f64.powi(-24) * (abs + f64::from(bias[r]).abs());
                        assert!(
                            (got - want).abs() <= bound,
                            "bits {bits} group {group} m {m} t {t} r {r}: {got} vs {want} \
                             (bound {bound})"
                        );
                    }
                }
            }
        }
    }

    /// `panel_chunked` over one panel (the default) and over two (the weights dequantized
    /// once a call) against `panel` (once a pass of 32 inputs): tier L2, bit for bit (the same
    /// tile products in the same order per output; float32 C tiles stored and loaded exactly
    /// between chunks). Columns of 1, 8, 9 and 12 blocks (tail chunks), 37 rows (a unit of 32
    /// and one of 5: a short second panel, none), 4/8 bits, groups 32/64, a bias, m from 8 to
    /// 130 (tail passes of 16 or fewer inputs).
    #[test]
    fn chunked_panels_equal_the_per_pass_panels() {
        let Some(ctx) = amx_ctx() else {
            return;
        };
        let mut g = Lcg(41);
        for (bits, group, cols) in [
            (4u32, 32usize, 256usize),
            (8, 32, 288),
            (4, 64, 384),
            (4, 32, 32),
        ] {
            let rows = 37;
            let words: Vec<u32> = (0..rows * cols * bits as usize / 32)
                .map(|_| g.next())
                .collect();
            let groups = rows * cols / group;
            let sc: Vec<f16> = (0..groups)
                .map(|_| f16::from_f32(g.unit() * 0.02))
                .collect();
            let bi: Vec<f16> = (0..groups).map(|_| f16::from_f32(g.unit() * 0.1)).collect();
            let bias: Vec<f32> = (0..rows).map(|i| i as f32 * 0.5 - 7.0).collect();
            let w = Matrix::affine(
                &words,
                Floats::F16(&sc),
                Floats::F16(&bi),
                rows,
                cols,
                bits,
                group,
            )
            .unwrap();
            for m in [8, 16, 33, 64, 70, 130] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| g.unit() * 10f32.powi((i % 5) as i32 - 2))
                    .collect();
                let mut outs = [
                    vec![0f32; m * rows],
                    vec![0f32; m * rows],
                    vec![0f32; m * rows],
                ];
                for (o, mode) in outs.iter_mut().zip([1, 0, 2]) {
                    let mut jobs = [MatJob {
                        w: &w,
                        bias: Some(Floats::F32(&bias)),
                        out: o,
                    }];
                    assert!(applies(&ctx, m, &jobs));
                    matmul_jobs_with(&ctx, &x, m, &mut jobs, mode).unwrap();
                }
                for (k, o) in outs[1..].iter().enumerate() {
                    for (i, (a, b)) in outs[0].iter().zip(o).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "mode {k} bits {bits} group {group} cols {cols} m {m} at {i}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    /// The splits: `hi + lo` is within `2^-17 |v|` of `v` (16 significant bits), in order
    /// (`split` from the values in order, `split_pairs` from the evens and the odds).
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn split_keeps_sixteen_bits() {
        if !available() {
            return;
        }
        let mut g = Lcg(3);
        let v: Vec<f32> = (0..32).map(|i| g.unit() * 10f32.powi(i % 9 - 4)).collect();
        let even: Vec<f32> = v.iter().step_by(2).copied().collect();
        let odd: Vec<f32> = v.iter().skip(1).step_by(2).copied().collect();
        for pairs in [false, true] {
            let mut hi = [0u16; 32];
            let mut lo = [0u16; 32];
            // SAFETY: `available` checked the features.
            unsafe {
                let (h, l) = if pairs {
                    split_pairs(
                        _mm512_loadu_ps(even.as_ptr()),
                        _mm512_loadu_ps(odd.as_ptr()),
                    )
                } else {
                    split(
                        _mm512_loadu_ps(v.as_ptr()),
                        _mm512_loadu_ps(v.as_ptr().add(16)),
                    )
                };
                _mm512_storeu_si512(hi.as_mut_ptr() as *mut _, h);
                _mm512_storeu_si512(lo.as_mut_ptr() as *mut _, l);
            }
            for i in 0..32 {
                let back =
                    f32::from_bits(u32::from(hi[i]) << 16) + f32::from_bits(u32::from(lo[i]) << 16);
                assert!(
                    (back - v[i]).abs() <= v[i].abs() * 2f32.powi(-17),
                    "pairs {pairs} {i}: {back} vs {}",
                    v[i]
                );
            }
        }
    }

    /// The register transpose is a transpose.
    #[test]
    fn transpose_transposes() {
        if !available() {
            return;
        }
        let m: Vec<i32> = (0..256).collect();
        let mut out = [0i32; 256];
        // SAFETY: `available` checked the features; 16 rows of 16 lanes each way.
        unsafe {
            let mut r = [_mm512_setzero_si512(); 16];
            for (i, v) in r.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(m.as_ptr().add(16 * i) as *const _);
            }
            for (i, v) in transpose16(&r).iter().enumerate() {
                _mm512_storeu_si512(out.as_mut_ptr().add(16 * i) as *mut _, *v);
            }
        }
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(out[16 * i + j], m[16 * j + i], "({i}, {j})");
            }
        }
    }

    /// Fewer than `MIN_M` rows, other activations, or another layout in the call: not here.
    #[test]
    fn dispatch() {
        let Some(mut ctx) = amx_ctx() else {
            return;
        };
        let words = vec![0u32; 64 * 4];
        let s = vec![f16::ONE; 64];
        let w = Matrix::affine(&words, Floats::F16(&s), Floats::F16(&s), 64, 32, 4, 32).unwrap();
        let w2 = Matrix::affine(
            &words[..128],
            Floats::F16(&s),
            Floats::F16(&s),
            64,
            32,
            2,
            32,
        )
        .unwrap();
        let mut out = vec![0f32; 64 * MIN_M];
        let mut out2 = vec![0f32; 64 * MIN_M];
        let jobs = [MatJob {
            w: &w,
            bias: None,
            out: &mut out,
        }];
        assert!(applies(&ctx, MIN_M, &jobs));
        assert!(!applies(&ctx, MIN_M - 1, &jobs));
        ctx.activations = Activations::F32;
        assert!(!applies(&ctx, MIN_M, &jobs));
        ctx.activations = Activations::Int16;
        assert!(applies(&ctx, MIN_M, &jobs));
        ctx.amx = false;
        assert!(!applies(&ctx, MIN_M, &jobs));
        ctx.amx = true;
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
