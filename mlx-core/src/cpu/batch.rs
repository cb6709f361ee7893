//! Products of a batched decode step: `m` input rows that belong to `m` different sequences,
//! each of whose outputs must be what [`matmul_t`](super::matmul_t) gives that row alone.
//!
//! [`matmul_t`] with `m > 1` treats its inputs as a block of prompt tokens: past four inputs it
//! takes the float kernels (and its integer kernels sum four inputs per tile), so a row's
//! output depends on how many rows came with it. [`matmul_t_each`] instead runs every row
//! through the kernel that `matmul_t` picks for one input (the integer kernels of
//! [`Activations::Int8`](super::Activations::Int8) / `Int16`, four rows a tile (six for the
//! AVX-512 kernels), whose per-row sums do not depend on the tile; the float kernels one row
//! at a time), while each worker
//! still reads its block of weight rows once for all of them (it stays in cache between the
//! rows). So a sequence decoded in a batch gets the bits it gets decoded alone.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::matmul::{rows, Floats, MatJob, Matrix, MAX_JOBS};
use super::{Activations, CpuContext, Isa, SharedOut};
use crate::{Error, Result};

/// Scratch space of [`matmul_t_each`]: the inputs quantized for the integer kernels. Grows to
/// the largest batch seen; nothing is allocated once it has.
#[derive(Debug, Default)]
pub struct RowsScratch {
    q16: Vec<i16>,
    p16: Vec<i16>,
    /// The int16 codes split into bytes (`x86::split_x16`) for the AVX-512 4-bit kernel.
    h16: Vec<u8>,
    q8: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    /// `Activations::Int16Q8Int8`'s int8 codes (natural order), scales and sums.
    n8: Vec<i8>,
    nd: Vec<f32>,
    ns: Vec<f32>,
    /// `Activations::Int8Vnni`'s int8 codes for 4-bit rows (pair order), scales and sums.
    p8: Vec<i8>,
    pd: Vec<f32>,
    ps: Vec<f32>,
}

impl SharedOut {
    /// The part of the buffer from `start` on (`start` at most its length).
    pub(super) fn from(self, start: usize) -> SharedOut {
        let start = start.min(self.len);
        SharedOut {
            // SAFETY-free: pointer arithmetic within (or one past) the buffer, never read here.
            ptr: self.ptr.wrapping_add(start),
            len: self.len - start,
        }
    }
}

/// `MLX_CPU_SCHED=shared`: the blocks of a run through one shared counter (interleaved
/// between the workers) instead of [`Regions`](super::Regions). For measuring.
fn shared_counter() -> bool {
    static S: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *S.get_or_init(|| std::env::var("MLX_CPU_SCHED").is_ok_and(|v| v == "shared"))
}

/// Which kernel [`matmul_t`](super::matmul_t) runs for one input row and this matrix.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Float,
    #[cfg(target_arch = "x86_64")]
    Int8,
    #[cfg(target_arch = "x86_64")]
    Int16,
    #[cfg(target_arch = "x86_64")]
    Q8Int8,
    #[cfg(target_arch = "x86_64")]
    Q4Int8,
}

#[allow(unused_variables)]
fn path(ctx: &CpuContext, act: Activations, w: &Matrix<'_>) -> Path {
    #[cfg(target_arch = "x86_64")]
    {
        let cols = w.cols();
        // `matmul_t`'s test for one input.
        let fits = ctx.isa.has_avx2()
            && cols % 32 == 0
            && cols <= super::matmul::INT8_MAX_M * super::x86::MAX_BUF;
        match act {
            Activations::Int8 if fits && super::matmul::int8_kernel(w) => return Path::Int8,
            Activations::Int16 if fits && super::matmul::int16_kernel(w) => return Path::Int16,
            Activations::Int8Vnni | Activations::Int8Normed
                if fits && ctx.isa == Isa::Avx512 && super::x86::q4_int8_512_supports(w) =>
            {
                return Path::Q4Int8
            }
            Activations::Int16Q8Int8 | Activations::Int8Vnni | Activations::Int8Normed
                if fits && ctx.isa == Isa::Avx512 && super::x86::q8_int8_supports(w) =>
            {
                return Path::Q8Int8
            }
            Activations::Int16Q8Int8 | Activations::Int8Vnni | Activations::Int8Normed
                if fits && super::matmul::int16_kernel(w) =>
            {
                return Path::Int16
            }
            _ => {}
        }
    }
    Path::Float
}

/// `out = x W^T (+ bias)` for every job, where each of the `m` rows of `x` is a sequence of
/// its own: row `t` of every output is bit for bit what `matmul_t(ctx, x[t], 1, ...)` writes
/// (see the module's note). One pool run for all jobs and rows; `scratch` holds the quantized
/// inputs.
pub fn matmul_t_each(
    ctx: &CpuContext,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
    scratch: &mut RowsScratch,
) -> Result<()> {
    matmul_t_each_with(ctx, ctx.activations, x, m, jobs, scratch)
}

/// [`matmul_t_each`] with activations `act` in place of the context's (a decode step gives
/// [`Activations::unnormed`] for the products whose inputs are not an RMSNorm's output).
pub fn matmul_t_each_with(
    ctx: &CpuContext,
    act: Activations,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
    scratch: &mut RowsScratch,
) -> Result<()> {
    matmul_t_each_prefetch(ctx, act, x, m, jobs, scratch, None)
}

/// Memory a run of [`matmul_t_each_prefetch`] pulls into the cores' L2 caches while its
/// products stream their weights: a KV cache layer's keys and values that the next attention
/// reads (`heads` spans of `len` values, `stride` values apart, from `start` on, in each of
/// `bufs`), or the share `share` (fractions of its cache lines, `[from, to)`) of them. A
/// decode step's attention otherwise finds them evicted by the weights streamed since the
/// last step and waits on memory; spread over the products before it, the loads overlap the
/// weights'. A hint: which bytes it names changes no result.
#[derive(Clone, Copy, Debug)]
pub struct KvPrefetch<'a> {
    pub bufs: [Floats<'a>; 2],
    pub heads: usize,
    pub stride: usize,
    pub start: usize,
    pub len: usize,
    pub share: [f32; 2],
}

/// One span's cache lines as `(base address, lines a head)` for each buffer.
#[derive(Clone, Copy)]
struct PfPlan {
    base: [usize; 2],
    stride_bytes: usize,
    heads: usize,
    per_head: usize,
    lo: usize,
    hi: usize,
}

impl KvPrefetch<'_> {
    fn plan(&self, op: &'static str) -> Result<PfPlan> {
        let mut base = [0usize; 2];
        let mut esz = 0;
        for (b, f) in base.iter_mut().zip(&self.bufs) {
            let (ptr, len, e) = match f {
                Floats::F32(a) => (a.as_ptr() as usize, a.len(), 4),
                Floats::F16(a) => (a.as_ptr() as usize, a.len(), 2),
                Floats::Bf16(a) => (a.as_ptr() as usize, a.len(), 2),
            };
            let end = self.heads.saturating_sub(1) * self.stride + self.start + self.len;
            if self.heads > 0 && self.len > 0 && end > len {
                return Err(Error::invalid(
                    op,
                    format!(
                        "prefetch of {} heads of {} values {} apart from {} past a buffer of {len}",
                        self.heads, self.len, self.stride, self.start
                    ),
                ));
            }
            if esz != 0 && esz != e {
                return Err(Error::invalid(op, "prefetch buffers of two types"));
            }
            esz = e;
            *b = ptr + self.start * e;
        }
        let per_head = (self.len * esz).div_ceil(64);
        let total = 2 * self.heads * per_head;
        let [a, b] = self.share;
        let frac = |f: f32| ((f.clamp(0.0, 1.0) as f64 * total as f64) as usize).min(total);
        Ok(PfPlan {
            base,
            stride_bytes: self.stride * esz,
            heads: self.heads,
            per_head,
            lo: frac(a),
            hi: frac(b).max(frac(a)),
        })
    }
}

impl PfPlan {
    /// Prefetches the plan's lines that fall to block `b` of `blocks` (into L2).
    #[inline]
    fn block(&self, b: usize, blocks: usize) {
        self.lines(b, blocks, |a| {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint; it reads nothing (the address lies within the
            // buffer checked by `plan` in any case).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    a as *const i8,
                )
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = a;
        });
    }

    /// `f(address)` for each line of block `b` of `blocks`: blocks `0..blocks` together name
    /// lines `lo..hi` of the spans once each (a line: 64 bytes from a span's start on).
    #[inline]
    fn lines(&self, b: usize, blocks: usize, mut f: impl FnMut(usize)) {
        let n = self.hi - self.lo;
        if n == 0 || self.per_head == 0 || blocks == 0 {
            return;
        }
        let (i0, i1) = (self.lo + n * b / blocks, self.lo + n * (b + 1) / blocks);
        if i0 >= i1 {
            return;
        }
        let per_buf = self.heads * self.per_head;
        let (mut buf, mut h, mut l) = (
            i0 / per_buf,
            i0 / self.per_head % self.heads,
            i0 % self.per_head,
        );
        for _ in i0..i1 {
            f(self.base[buf] + h * self.stride_bytes + l * 64);
            l += 1;
            if l == self.per_head {
                l = 0;
                h += 1;
                if h == self.heads {
                    h = 0;
                    buf += 1;
                }
            }
        }
    }
}

/// [`matmul_t_each_with`] that also prefetches `pf` (see [`KvPrefetch`]) while the products
/// run (for the affine and dense products; the GGML-block and trellis products ignore it).
pub fn matmul_t_each_prefetch(
    ctx: &CpuContext,
    act: Activations,
    x: &[f32],
    m: usize,
    jobs: &mut [MatJob<'_, '_>],
    scratch: &mut RowsScratch,
    pf: Option<&KvPrefetch<'_>>,
) -> Result<()> {
    let op = "cpu::matmul_t_each";
    let pf = match pf {
        Some(p) => Some(p.plan(op)?),
        None => None,
    };
    let Some(first) = jobs.first() else {
        return Ok(());
    };
    if jobs.len() > MAX_JOBS {
        return Err(Error::invalid(
            op,
            format!("{} products in one call, at most {MAX_JOBS}", jobs.len()),
        ));
    }
    let cols = first.w.cols();
    if x.len() != m * cols {
        return Err(Error::invalid(
            op,
            format!("x has {} floats, ({m}, {cols}) needs {}", x.len(), m * cols),
        ));
    }
    for j in jobs.iter() {
        if j.w.cols() != cols {
            return Err(Error::invalid(
                op,
                format!("matrices of {} and {cols} columns in one call", j.w.cols()),
            ));
        }
        if j.out.len() != m * j.w.rows() {
            return Err(Error::invalid(
                op,
                format!(
                    "out has {} floats, ({m}, {}) needs {}",
                    j.out.len(),
                    j.w.rows(),
                    m * j.w.rows()
                ),
            ));
        }
        if let Some(b) = j.bias {
            if b.len() != j.w.rows() {
                return Err(Error::invalid(
                    op,
                    format!("bias of {} for {} rows", b.len(), j.w.rows()),
                ));
            }
        }
    }
    if m == 0 {
        return Ok(());
    }
    if jobs.iter().any(|j| j.w.trellis_view().is_some()) {
        // The KV prefetch spread over the trellis products' row chunks, as over the blocks
        // below.
        let hook = |b: usize, n: usize| {
            if let Some(p) = &pf {
                p.block(b, n)
            }
        };
        let hook: Option<&(dyn Fn(usize, usize) + Sync)> = pf.is_some().then_some(&hook);
        return super::trellis::matmul_jobs(ctx, x, m, jobs, hook);
    }
    if jobs.iter().any(|j| super::kquant::is_ggml(j.w)) {
        // Each row's bits do not depend on the rows that come with it.
        return super::kquant::matmul_jobs(ctx, act, x, m, jobs, true);
    }
    let mut paths = [Path::Float; MAX_JOBS];
    for (p, j) in paths.iter_mut().zip(jobs.iter()) {
        *p = path(ctx, act, j.w);
    }
    let paths = paths;
    // The inputs quantized once, each row as `matmul_t` quantizes one input.
    #[cfg(target_arch = "x86_64")]
    let (qx, qx16, qn8, qp8) = {
        let chunks = m * cols / 32;
        let (mut a, mut b, mut n, mut p) = (None, None, None, None);
        if paths[..jobs.len()].contains(&Path::Q4Int8) {
            scratch.p8.resize(m * cols, 0);
            scratch.pd.resize(chunks, 0.0);
            scratch.ps.resize(chunks, 0.0);
            // SAFETY: `path` chose Q4Int8 only on Isa::Avx512 (AVX2, FMA and F16C included).
            unsafe {
                super::x86::quantize_x8p(x, cols, &mut scratch.p8, &mut scratch.pd, &mut scratch.ps)
            };
            p = Some(super::x86::QuantX {
                q: scratch.p8.as_ptr(),
                d: scratch.pd.as_ptr(),
                s: scratch.ps.as_ptr(),
            });
        }
        if paths[..jobs.len()].contains(&Path::Q8Int8) {
            scratch.n8.resize(m * cols, 0);
            scratch.nd.resize(chunks, 0.0);
            scratch.ns.resize(chunks, 0.0);
            super::x86::quantize_x8(x, &mut scratch.n8, &mut scratch.nd, &mut scratch.ns);
            n = Some(super::x86::QuantX {
                q: scratch.n8.as_ptr(),
                d: scratch.nd.as_ptr(),
                s: scratch.ns.as_ptr(),
            });
        }
        if paths[..jobs.len()].contains(&Path::Int8) {
            scratch.q8.resize(m * cols, 0);
            scratch.d.resize(chunks, 0.0);
            scratch.s.resize(chunks, 0.0);
            super::x86::quantize_x(x, &mut scratch.q8, &mut scratch.d, &mut scratch.s);
            a = Some(super::x86::QuantX {
                q: scratch.q8.as_ptr(),
                d: scratch.d.as_ptr(),
                s: scratch.s.as_ptr(),
            });
        } else if paths[..jobs.len()].contains(&Path::Int16) {
            scratch.q16.resize(m * cols, 0);
            scratch.d.resize(chunks, 0.0);
            scratch.s.resize(chunks, 0.0);
            // SAFETY: `path` chose Int16 only where the ISA has AVX2, FMA and F16C.
            unsafe {
                super::x86::quantize_x16(x, &mut scratch.q16, &mut scratch.d, &mut scratch.s)
            };
            scratch.p16.resize(m * cols, 0);
            // The permuted codes only where a 512-bit kernel reads them (on AVX2 the int16
            // kernels read the natural order; on AVX-512 the split bytes serve the 4-bit rows
            // of `split_covers`).
            let avx512 = ctx.isa == Isa::Avx512;
            let split = avx512 && ctx.split4;
            if avx512
                && jobs
                    .iter()
                    .zip(&paths)
                    .any(|(j, &k)| k == Path::Int16 && super::x86::needs_permuted(j.w, split))
            {
                super::x86::permute_x16(&scratch.q16, cols, &mut scratch.p16);
            }
            // The 512-bit 4-bit kernel's split bytes (`dot4_512_s`).
            let hs = super::x86::split_stride(cols);
            let h = if split {
                scratch.h16.resize(m * hs, 0);
                super::x86::split_x16(&scratch.q16, cols, &mut scratch.h16);
                scratch.h16.as_ptr()
            } else {
                std::ptr::null()
            };
            b = Some(super::x86::QuantX16 {
                q: scratch.q16.as_ptr(),
                p: scratch.p16.as_ptr(),
                d: scratch.d.as_ptr(),
                s: scratch.s.as_ptr(),
                h,
                hs,
            });
        }
        (a, b, n, p)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = &scratch;
    let threads = ctx.pool.threads();
    let total: usize = jobs.iter().map(|j| j.w.rows()).sum();
    let block = (total / (threads * 8)).clamp(1, 32);
    // The lane kernel computes whole 16-row blocks: a worker's rows are then whole blocks, so
    // no two workers write one block's rows.
    let block = if jobs.iter().any(|j| j.w.lanes().is_some()) {
        block.next_multiple_of(16)
    } else {
        block
    };
    type Plan<'p> = (Matrix<'p>, Option<Floats<'p>>, SharedOut, usize, Path);
    let mut plan: [Option<Plan<'_>>; MAX_JOBS] = [None; MAX_JOBS];
    let mut blocks = 0;
    for ((p, j), &k) in plan.iter_mut().zip(jobs.iter_mut()).zip(&paths) {
        *p = Some((*j.w, j.bias, SharedOut::new(j.out), blocks, k));
        blocks += j.w.rows().div_ceil(block);
    }
    let next = AtomicUsize::new(0);
    let regions = super::Regions::new(blocks, threads);
    let shared = shared_counter();
    let isa = ctx.isa;
    #[cfg(target_arch = "x86_64")]
    let lane4 = ctx.lane4;
    ctx.pool.run(&|worker, _| loop {
        let b = if shared {
            next.fetch_add(1, Ordering::Relaxed)
        } else {
            regions.claim(worker).unwrap_or(blocks)
        };
        if b >= blocks {
            break;
        }
        if let Some(p) = &pf {
            p.block(b, blocks);
        }
        let Some(&(w, bias, out, start, kind)) = plan.iter().rev().flatten().find(|p| p.3 <= b)
        else {
            break;
        };
        let r0 = (b - start) * block;
        let r1 = (r0 + block).min(w.rows());
        let n = w.rows();
        match kind {
            #[cfg(target_arch = "x86_64")]
            Path::Int8 | Path::Q8Int8 | Path::Q4Int8 => {
                // 4-bit rows (AVX2 or AVX-512 VNNI) or the 8-bit head (AVX-512 VNNI), all
                // over int8 inputs.
                let q = match kind {
                    Path::Int8 => qx,
                    Path::Q8Int8 => qn8,
                    _ => qp8,
                };
                let Some(q) = q else {
                    break;
                };
                // Rows a pass over each weight row: the 8-bit head's AVX-512 kernel takes
                // six, the 4-bit kernels four (their dispatchers' widest arm).
                let tile = if matches!(kind, Path::Q8Int8) {
                    super::x86::WIDE_TILE
                } else {
                    4
                };
                let mut t0 = 0;
                while t0 < m {
                    let mt = (m - t0).min(tile);
                    let c = t0 * cols / 32;
                    // SAFETY: `path` chose Int8 only on Isa::Avx2 and Q8Int8 / Q4Int8 only on
                    // Isa::Avx512 (AVX-512 F/BW/VL + VNNI, checked available by CpuContext)
                    // for a matrix `q8_int8_supports` / `q4_int8_512_supports`; q holds m quantized rows of cols values,
                    // of which rows t0..t0 + mt start at these offsets; these weight rows of the
                    // output are this worker's alone.
                    unsafe {
                        let q = super::x86::QuantX {
                            q: q.q.add(t0 * cols),
                            d: q.d.add(c),
                            s: q.s.add(c),
                        };
                        let o = out.from(t0 * n);
                        match kind {
                            Path::Int8 => super::x86::rows_q4_int8(&w, r0, r1, q, mt, o, bias),
                            Path::Q8Int8 => {
                                super::x86::rows_q8_int8_512(&w, r0, r1, q, mt, o, bias)
                            }
                            _ => super::x86::rows_q4_int8_512(&w, r0, r1, q, mt, o, bias),
                        }
                    }
                    t0 += mt;
                }
            }
            #[cfg(target_arch = "x86_64")]
            Path::Int16 => {
                let Some(q) = qx16 else { break };
                // The kernel `matmul_t` picks for one input; each input row's sums are
                // independent of how many rows a call takes (`each_row_is_what_it_is_alone`).
                if isa == Isa::Avx512 && lane4 && w.lanes().is_some() {
                    // SAFETY: as below, with the lane layout attached (`rows_lanes` reads it).
                    unsafe {
                        super::amx_verify::rows_lanes(&w, r0, r1, q.q, q.d, q.s, m, out, bias)
                    };
                    continue;
                }
                if isa == Isa::Avx512 && lane4 && super::amx_verify::supports(&w) {
                    // SAFETY: as below (Isa::Avx512, q holding m rows of codes, scales and
                    // sums, these weight rows of the output this worker's alone).
                    unsafe { super::amx_verify::rows(&w, r0, r1, q.q, q.d, q.s, m, out, bias) };
                    continue;
                }
                let wide = isa == Isa::Avx512 && cols / 32 <= super::x86::MAX_CHUNKS;
                if wide && super::affine_rows::supports(&w) {
                    // SAFETY: as below (Isa::Avx512, the inputs quantized to int16, these
                    // weight rows of the output this worker's alone).
                    unsafe { super::affine_rows::rows(&w, r0, r1, q, m, out, bias) };
                    continue;
                }
                if wide
                    && (2..=4 * super::x86::Q8_PAIR_TILE).contains(&m)
                    && super::affine_rows::pairs_on().1
                    && super::x86::q8_pairs_supports(&w)
                {
                    // SAFETY: as below (Isa::Avx512, the inputs quantized to int16, these
                    // weight rows of the output this worker's alone; `q8_pairs_supports`
                    // checked, m in range).
                    unsafe { super::x86::rows_q8_pairs(&w, r0, r1, q, m, out, bias) };
                    continue;
                }
                let tile = if wide { super::x86::WIDE_TILE } else { 4 };
                let mut t0 = 0;
                while t0 < m {
                    let mt = (m - t0).min(tile);
                    // SAFETY: as above, with the inputs quantized to int16.
                    unsafe {
                        let q = q.rows_from(t0, cols);
                        if wide {
                            // As `matmul_t` picks for one input (Isa::Avx512: AVX-512 F/BW/VL
                            // checked by CpuContext).
                            super::x86::rows_int16_512(&w, r0, r1, q, mt, out.from(t0 * n), bias);
                        } else {
                            super::x86::rows_int16(&w, r0, r1, q, mt, out.from(t0 * n), bias);
                        }
                    }
                    t0 += mt;
                }
            }
            Path::Float => {
                for t in 0..m {
                    let xr = &x[t * cols..(t + 1) * cols];
                    rows(isa, &w, r0, r1, xr, 1, out.from(t * n), bias);
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::matmul_t;
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

    fn words(n: usize, seed: u64) -> Vec<u32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (s >> 32) as u32
            })
            .collect()
    }

    /// A prefetch plan's blocks name every line of the spans once (each share exactly its
    /// part), a span past its buffer is an error, and the products' outputs are the same
    /// with or without a prefetch (a hint).
    #[test]
    fn kv_prefetch_covers_its_spans_and_changes_nothing() {
        let k = vec![half::f16::ZERO; 3 * 100 * 64];
        let v = vec![half::f16::ZERO; 3 * 100 * 64];
        let pf = |start: usize, len: usize, share: [f32; 2]| KvPrefetch {
            bufs: [Floats::F16(&k), Floats::F16(&v)],
            heads: 3,
            stride: 100 * 64,
            start,
            len,
            share,
        };
        for (start, len) in [(0usize, 37 * 64), (5 * 64, 90 * 64), (0, 0), (64 * 99, 64)] {
            let mut all = Vec::new();
            for share in [[0.0, 0.66], [0.66, 1.0]] {
                let plan = pf(start, len, share).plan("test").unwrap();
                for blocks in [1usize, 7, 96] {
                    let mut got = Vec::new();
                    for b in 0..blocks {
                        plan.lines(b, blocks, |a| got.push(a));
                    }
                    let mut want = Vec::new();
                    plan.lines(0, 1, |a| want.push(a));
                    assert_eq!(got, want, "blocks {blocks}");
                }
                plan.lines(0, 1, |a| all.push(a));
            }
            let mut want = Vec::new();
            for buf in [k.as_ptr() as usize, v.as_ptr() as usize] {
                for h in 0..3 {
                    let s = buf + (h * 100 * 64 + start) * 2;
                    let mut o = 0;
                    while o < len * 2 {
                        want.push(s + o);
                        o += 64;
                    }
                }
            }
            assert_eq!(all, want, "start {start} len {len}");
        }
        assert!(pf(0, 101 * 64, [0.0, 1.0]).plan("test").is_err());
        assert!(pf(3 * 64, 98 * 64, [0.0, 1.0]).plan("test").is_err());

        let (rows, cols) = (70, 128);
        let w4 = words(rows * cols * 4 / 32, 2);
        let sh: Vec<half::f16> = seeded(rows * cols / 32, 4)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let bh: Vec<half::f16> = seeded(rows * cols / 32, 5)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let m4 =
            Matrix::affine(&w4, Floats::F16(&sh), Floats::F16(&bh), rows, cols, 4, 32).unwrap();
        let x = seeded(2 * cols, 7);
        let mut ctx = CpuContext::new(2).unwrap();
        ctx.activations = Activations::Int16Q8Int8;
        let mut scratch = RowsScratch::default();
        let (mut a, mut b) = (vec![0f32; 2 * rows], vec![0f32; 2 * rows]);
        let job = |out| {
            [MatJob {
                w: &m4,
                bias: None,
                out,
            }]
        };
        matmul_t_each(&ctx, &x, 2, &mut job(&mut a), &mut scratch).unwrap();
        let p = pf(0, 50 * 64, [0.0, 1.0]);
        let act = ctx.activations;
        matmul_t_each_prefetch(&ctx, act, &x, 2, &mut job(&mut b), &mut scratch, Some(&p)).unwrap();
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// The head's pair kernel (`x86::rows_q8_pairs`: GGUF's Q8_0 as loaded, symmetric, and an
    /// affine 8-bit matrix with float16 factors, groups of 32) under int16 inputs: every row
    /// of 2..=13 inputs (13: past the kernel, the plain tiles) through `matmul_t_each` has the
    /// bits `matmul_t` gives that input alone, with and without a bias, over an odd number of
    /// weight rows (the last one alone), 17 and 18 chunks (an odd chunk, a partial block) and
    /// two workers: tier bit-identical.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn q8_pairs_are_the_one_row_bits() {
        let mut ctx = CpuContext::new(2).unwrap();
        if ctx.isa != Isa::Avx512 {
            eprintln!("no AVX-512: the pair kernel is not reached here");
            return;
        }
        ctx.activations = Activations::Int16;
        let mut scratch = RowsScratch::default();
        for (rows, cols) in [(41, 576), (19, 544)] {
            let w8 = words(rows * cols / 4, 31);
            let sh: Vec<half::f16> = seeded(rows * cols / 32, 32)
                .iter()
                .map(|&v| half::f16::from_f32(v * 0.01))
                .collect();
            let bh: Vec<half::f16> = seeded(rows * cols / 32, 33)
                .iter()
                .map(|&v| half::f16::from_f32(v * 0.01))
                .collect();
            let bias = seeded(rows, 34);
            let mats = [
                (
                    "q8_0",
                    Matrix::symmetric(&w8, Floats::F16(&sh), rows, cols, 8, 32).unwrap(),
                ),
                (
                    "affine 8-bit",
                    Matrix::affine(&w8, Floats::F16(&sh), Floats::F16(&bh), rows, cols, 8, 32)
                        .unwrap(),
                ),
            ];
            for (what, w) in &mats {
                assert!(super::super::x86::q8_pairs_supports(w), "{what}");
                for m in 2..=13 {
                    let x = seeded(m * cols, 40 + m as u64);
                    for b in [None, Some(Floats::F32(&bias))] {
                        let mut got = vec![0f32; m * rows];
                        let mut jobs = [MatJob {
                            w,
                            bias: b,
                            out: &mut got,
                        }];
                        matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                        for t in 0..m {
                            let mut alone = vec![0f32; rows];
                            let mut jobs = [MatJob {
                                w,
                                bias: b,
                                out: &mut alone,
                            }];
                            matmul_t(&ctx, &x[t * cols..(t + 1) * cols], 1, &mut jobs).unwrap();
                            let row = &got[t * rows..(t + 1) * rows];
                            assert!(
                                row.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{what} {rows}x{cols}, {m} inputs, row {t}, bias {}: not the bits alone",
                                b.is_some()
                            );
                        }
                    }
                }
            }
        }
    }

    /// Every row of a batch of 1..=17 gets the bits `matmul_t` gives it alone (past two tiles
    /// of six), for dense and 4/8-bit weights (float and half factors) under every
    /// activation mode (tier: bit-identical).
    #[test]
    fn each_row_is_what_it_is_alone() {
        let (rows, cols) = (40, 128);
        let dense = seeded(rows * cols, 1);
        let w4 = words(rows * cols * 4 / 32, 2);
        let w8 = words(rows * cols * 8 / 32, 3);
        let sc = seeded(rows * cols / 32, 4);
        let bi = seeded(rows * cols / 32, 5);
        let bias = seeded(rows, 6);
        let sh: Vec<half::f16> = sc.iter().map(|&v| half::f16::from_f32(v)).collect();
        let bh: Vec<half::f16> = bi.iter().map(|&v| half::f16::from_f32(v)).collect();
        let mats = [
            Matrix::dense(Floats::F32(&dense), rows, cols).unwrap(),
            Matrix::affine(&w4, Floats::F32(&sc), Floats::F32(&bi), rows, cols, 4, 32).unwrap(),
            Matrix::affine(&w8, Floats::F32(&sc), Floats::F32(&bi), rows, cols, 8, 32).unwrap(),
            // GGUF's Q4_1 and Q8_0 as loaded (half-precision factors, groups of 32): the
            // kernels of the CPU decoder's default activations.
            Matrix::affine(&w4, Floats::F16(&sh), Floats::F16(&bh), rows, cols, 4, 32).unwrap(),
            Matrix::affine(&w8, Floats::F16(&sh), Floats::F16(&bh), rows, cols, 8, 32).unwrap(),
        ];
        let mut scratch = RowsScratch::default();
        for act in [
            Activations::F32,
            Activations::Int8,
            Activations::Int16,
            Activations::Int16Q8Int8,
        ] {
            let mut ctx = CpuContext::new(2).unwrap();
            ctx.activations = act;
            for m in 1..=17 {
                let x = seeded(m * cols, 10 + m as u64);
                let mut outs = vec![vec![0f32; m * rows]; 5];
                {
                    let [a, b, c, d, e] = &mut outs[..] else {
                        unreachable!()
                    };
                    let mut jobs = [
                        MatJob {
                            w: &mats[0],
                            bias: Some(Floats::F32(&bias)),
                            out: a,
                        },
                        MatJob {
                            w: &mats[1],
                            bias: None,
                            out: b,
                        },
                        MatJob {
                            w: &mats[2],
                            bias: None,
                            out: c,
                        },
                    ];
                    matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                    let mut jobs = [
                        MatJob {
                            w: &mats[3],
                            bias: None,
                            out: d,
                        },
                        MatJob {
                            w: &mats[4],
                            bias: None,
                            out: e,
                        },
                    ];
                    matmul_t_each(&ctx, &x, m, &mut jobs, &mut scratch).unwrap();
                }
                for t in 0..m {
                    for (k, w) in mats.iter().enumerate() {
                        let mut alone = vec![0f32; rows];
                        let b = (k == 0).then_some(Floats::F32(&bias));
                        let mut jobs = [MatJob {
                            w,
                            bias: b,
                            out: &mut alone,
                        }];
                        let xt = &x[t * cols..(t + 1) * cols];
                        if act == Activations::Int16Q8Int8 {
                            // A decode step's own kernels (`matmul_t` takes it as Int16).
                            let mut one = RowsScratch::default();
                            matmul_t_each(&ctx, xt, 1, &mut jobs, &mut one).unwrap();
                        } else {
                            matmul_t(&ctx, xt, 1, &mut jobs).unwrap();
                        }
                        let got = &outs[k][t * rows..(t + 1) * rows];
                        let same = got
                            .iter()
                            .zip(&alone)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{act:?} batch {m} row {t} matrix {k}: not the bits alone"
                        );
                    }
                }
            }
        }
    }

    /// `Int8Normed` is `Int8Vnni` for a normed input and, through [`Activations::unnormed`],
    /// `Int16Q8Int8` for the others, bit for bit (4-bit and the 8-bit head, 1 and 5 rows).
    #[test]
    fn int8_normed_takes_int8vnni_or_int16q8int8() {
        let (rows, cols) = (24, 128);
        let w4 = words(rows * cols * 4 / 32, 2);
        let w8 = words(rows * cols * 8 / 32, 3);
        let sh: Vec<half::f16> = seeded(rows * cols / 32, 4)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let bh: Vec<half::f16> = seeded(rows * cols / 32, 5)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let mats = [
            Matrix::affine(&w4, Floats::F16(&sh), Floats::F16(&bh), rows, cols, 4, 32).unwrap(),
            Matrix::affine(&w8, Floats::F16(&sh), Floats::F16(&bh), rows, cols, 8, 32).unwrap(),
        ];
        assert_eq!(Activations::Int8Normed.unnormed(), Activations::Int16Q8Int8);
        // The logits' product keeps int16 inputs under the default.
        assert_eq!(Activations::Int16Q8Int8.head(), Activations::Int16);
        assert_eq!(Activations::Int8Normed.head(), Activations::Int8Normed);
        assert_eq!(Activations::Int8Vnni.unnormed(), Activations::Int8Vnni);
        let mut ctx = CpuContext::new(2).unwrap();
        ctx.activations = Activations::Int8Normed;
        let mut scratch = RowsScratch::default();
        for m in [1, 5] {
            let x = seeded(m * cols, 20 + m as u64);
            for w in &mats {
                for (act, like) in [
                    (Activations::Int8Normed, Activations::Int8Vnni),
                    (Activations::Int8Normed.unnormed(), Activations::Int16Q8Int8),
                ] {
                    let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
                    let mut jobs = [MatJob {
                        w,
                        bias: None,
                        out: &mut a,
                    }];
                    matmul_t_each_with(&ctx, act, &x, m, &mut jobs, &mut scratch).unwrap();
                    let mut jobs = [MatJob {
                        w,
                        bias: None,
                        out: &mut b,
                    }];
                    matmul_t_each_with(&ctx, like, &x, m, &mut jobs, &mut scratch).unwrap();
                    assert!(
                        a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                        "{act:?} vs {like:?}, m {m}"
                    );
                }
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        let ctx = CpuContext::new(1).unwrap();
        let w = vec![0f32; 64];
        let m = Matrix::dense(Floats::F32(&w), 2, 32).unwrap();
        let mut out = vec![0f32; 3];
        let mut jobs = [MatJob {
            w: &m,
            bias: None,
            out: &mut out,
        }];
        let e = matmul_t_each(&ctx, &[0.0; 64], 2, &mut jobs, &mut RowsScratch::default());
        assert!(e.is_err());
    }
}
