//! `y = x W^T (+ b)` for `m` input rows over MLX's weight layouts, rows of `W` split across the
//! pool's workers.
//!
//! Layouts (as MLX stores them, read in place):
//! - dense: `W` row-major `(rows, cols)` in float32, float16 or bfloat16;
//! - affine (`mx.quantize(..., mode="affine")`): `words` uint32 `(rows, cols * bits / 32)`,
//!   each word packing `32 / bits` values, the first in the lowest bits; `scales` and `biases`
//!   `(rows, cols / group)` in float32, float16 or bfloat16; a value is `scale * q + bias`.
//!
//! With `m > 1` (a block of prompt tokens) each weight row is read once for all `m` inputs,
//! which is what makes prefill fast.

#[cfg(target_arch = "x86_64")]
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use half::{bf16, f16};

use super::{Activations, CpuContext, Isa, SharedOut};
use crate::{Array, Dtype, Error, Result};

/// A borrowed float vector in one of MLX's float dtypes.
#[derive(Clone, Copy, Debug)]
pub enum Floats<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl<'a> Floats<'a> {
    /// The elements of an evaluated, row-contiguous float array, borrowed in place.
    pub fn from_array(a: &'a Array) -> Result<Floats<'a>> {
        Ok(match a.dtype() {
            Dtype::Float32 => Floats::F32(a.as_slice()?),
            Dtype::Float16 => Floats::F16(a.as_slice()?),
            Dtype::Bfloat16 => Floats::Bf16(a.as_slice()?),
            d => {
                return Err(Error::invalid(
                    "Floats::from_array",
                    format!("dtype {d} is not float32, float16 or bfloat16"),
                ))
            }
        })
    }

    pub fn len(&self) -> usize {
        match self {
            Floats::F32(s) => s.len(),
            Floats::F16(s) => s.len(),
            Floats::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f32 (exact). Panics past the end, as slice indexing does.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Floats::F32(s) => s[i],
            Floats::F16(s) => s[i].to_f32(),
            Floats::Bf16(s) => s[i].to_f32(),
        }
    }

    /// Widens `[start, start + out.len())` into `out`.
    pub fn copy_to(&self, start: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            Floats::F32(s) => out.copy_from_slice(&s[start..start + n]),
            Floats::F16(s) => {
                for (o, v) in out.iter_mut().zip(&s[start..start + n]) {
                    *o = v.to_f32();
                }
            }
            Floats::Bf16(s) => {
                for (o, v) in out.iter_mut().zip(&s[start..start + n]) {
                    *o = v.to_f32();
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind<'a> {
    Dense(Floats<'a>),
    Affine {
        words: &'a [u32],
        scales: Floats<'a>,
        biases: Floats<'a>,
        bits: u32,
        group: usize,
    },
    /// Symmetric affine (GGUF's Q4_0 / Q8_0 as MLX's affine triple, without its biases
    /// array): codes `q` of `bits` bits, a value is `scale * q + bias` with `bias = -2^(bits -
    /// 1) * scale`, formed from the scale where a kernel needs it (exact in float32: a power of
    /// two times a float16), so every product has the bits of [`Kind::Affine`] over the
    /// materialized biases (`-8 x scale` / `-128 x scale` rounded to float16, exact too for
    /// the scales [`Matrix::symmetric`] takes). Only the kernels [`Matrix::affine_parts`]
    /// serves take it; the others' dispatch tests match `Affine` alone.
    Symmetric {
        words: &'a [u32],
        scales: Floats<'a>,
        bits: u32,
        group: usize,
    },
    /// Trellis-coded (`cpu::trellis`): products take `trellis::matmul_jobs`.
    Trellis(super::trellis::TrellisView<'a>),
    /// GGML blocks as a GGUF file stores them, row after row (`cpu::kquant`): products take
    /// `kquant::matmul_jobs`.
    Ggml {
        data: &'a [u8],
        ty: super::kquant::GgmlType,
    },
}

/// An affine or symmetric matrix as the kernels that take both read it
/// ([`Matrix::affine_parts`]): for a symmetric matrix `biases` is its `scales` and `sym` is set,
/// and a kernel forms each bias as `bias_k() x` the value it reads there (exact: `bias_k` is
/// `-2^(bits - 1)`); for an affine one `sym` is clear and the biases are read as stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AffineParts<'a> {
    pub(crate) words: &'a [u32],
    pub(crate) scales: Floats<'a>,
    pub(crate) biases: Floats<'a>,
    pub(crate) bits: u32,
    pub(crate) group: usize,
    pub(crate) sym: bool,
}

impl AffineParts<'_> {
    /// What a symmetric matrix's scales are multiplied by to give its biases: `-2^(bits - 1)`
    /// (`-8` for 4 bits, `-128` for 8).
    pub(crate) fn bias_k(&self) -> f32 {
        -((1u32 << (self.bits - 1)) as f32)
    }
}

/// A weight matrix `(rows, cols)` borrowed in one of MLX's layouts (checked at construction).
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    rows: usize,
    cols: usize,
    pub(crate) kind: Kind<'a>,
    /// The same matrix laid out for the lane kernel ([`Matrix::with_lanes`]), if attached.
    lanes: Option<&'a super::lanes::Lanes16>,
}

fn bad(msg: String) -> Error {
    Error::invalid("cpu::Matrix", msg)
}

impl<'a> Matrix<'a> {
    /// A dense row-major matrix.
    pub fn dense(data: Floats<'a>, rows: usize, cols: usize) -> Result<Matrix<'a>> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(bad(format!(
                "a dense ({rows}, {cols}) matrix needs {} elements, got {}",
                rows.saturating_mul(cols),
                data.len()
            )));
        }
        Ok(Matrix {
            rows,
            cols,
            kind: Kind::Dense(data),
            lanes: None,
        })
    }

    /// An MLX affine-quantized matrix of logical shape `(rows, cols)`. `bits` must divide 32
    /// (2, 4 or 8: the widths MLX packs within one word) and `group` be a positive multiple of
    /// 32 dividing `cols`.
    pub fn affine(
        words: &'a [u32],
        scales: Floats<'a>,
        biases: Floats<'a>,
        rows: usize,
        cols: usize,
        bits: u32,
        group: usize,
    ) -> Result<Matrix<'a>> {
        if !matches!(bits, 2 | 4 | 8) {
            return Err(bad(format!(
                "{bits}-bit affine weights are not supported (2, 4 or 8)"
            )));
        }
        if group == 0 || group % 32 != 0 || cols % group != 0 {
            return Err(bad(format!(
                "group size {group} must be a positive multiple of 32 dividing {cols} columns"
            )));
        }
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| bad("matrix too large".into()))?;
        let need_words = n / 32 * bits as usize;
        if words.len() != need_words {
            return Err(bad(format!(
                "({rows}, {cols}) at {bits} bits needs {need_words} words, got {}",
                words.len()
            )));
        }
        let groups = n / group;
        if scales.len() != groups || biases.len() != groups {
            return Err(bad(format!(
                "({rows}, {cols}) in groups of {group} needs {groups} scales and biases, got {} \
                 and {}",
                scales.len(),
                biases.len()
            )));
        }
        Ok(Matrix {
            rows,
            cols,
            kind: Kind::Affine {
                words,
                scales,
                biases,
                bits,
                group,
            },
            lanes: None,
        })
    }

    /// A symmetric affine matrix ([`Kind::Symmetric`]): MLX's affine layout of GGUF's Q4_0
    /// (`bits` 4) or Q8_0 (`bits` 8) without its biases array, each bias `-2^(bits - 1) x`
    /// its group's scale. `scales` must be float16, finite and at most `65504 / 2^(bits - 1)`
    /// in magnitude (so that the float16 biases MLX materializes, `scale x -2^(bits - 1)`
    /// rounded to float16, are exactly what the kernels form in float32); `group` as for
    /// [`Matrix::affine`].
    pub fn symmetric(
        words: &'a [u32],
        scales: Floats<'a>,
        rows: usize,
        cols: usize,
        bits: u32,
        group: usize,
    ) -> Result<Matrix<'a>> {
        if !matches!(bits, 4 | 8) {
            return Err(bad(format!(
                "{bits}-bit symmetric weights are not supported (4 or 8)"
            )));
        }
        let Floats::F16(s) = scales else {
            return Err(bad("symmetric weights need float16 scales".into()));
        };
        let limit = 65504.0 / (1u32 << (bits - 1)) as f32;
        if let Some(i) = s
            .iter()
            .position(|v| v.is_nan() || v.to_f32().abs() > limit)
        {
            return Err(bad(format!(
                "scale {i} ({}) is not finite or above {limit}: its bias -2^{} x scale is not \
                 a finite float16",
                s[i],
                bits - 1
            )));
        }
        // The shape checks of `affine`, with the scales standing in for the biases.
        let m = Matrix::affine(words, scales, scales, rows, cols, bits, group)?;
        Ok(Matrix {
            kind: Kind::Symmetric {
                words,
                scales,
                bits,
                group,
            },
            ..m
        })
    }

    /// The parts of an affine or symmetric matrix as the kernels that take both read them
    /// (`None` for other layouts).
    pub(crate) fn affine_parts(&self) -> Option<AffineParts<'a>> {
        match self.kind {
            Kind::Affine {
                words,
                scales,
                biases,
                bits,
                group,
            } => Some(AffineParts {
                words,
                scales,
                biases,
                bits,
                group,
                sym: false,
            }),
            Kind::Symmetric {
                words,
                scales,
                bits,
                group,
            } => Some(AffineParts {
                words,
                scales,
                biases: scales,
                bits,
                group,
                sym: true,
            }),
            _ => None,
        }
    }

    /// Whether this is a symmetric affine matrix ([`Matrix::symmetric`]).
    pub fn is_symmetric(&self) -> bool {
        matches!(self.kind, Kind::Symmetric { .. })
    }

    /// A matrix of GGML blocks (`data`: a GGUF tensor's bytes, `rows` rows of `cols` values,
    /// `cols` a multiple of the type's block), read in place by the int8 kernels of
    /// [`super::kquant`].
    pub fn ggml(
        data: &'a [u8],
        ty: super::kquant::GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix<'a>> {
        if cols == 0 || cols % ty.block() != 0 {
            return Err(bad(format!(
                "{} rows of {cols} values are not whole {}-value {} blocks",
                rows,
                ty.block(),
                ty.name()
            )));
        }
        let need = rows
            .checked_mul(ty.row_bytes(cols))
            .ok_or_else(|| bad("matrix too large".into()))?;
        if data.len() != need {
            return Err(bad(format!(
                "({rows}, {cols}) in {} blocks needs {need} bytes, got {}",
                ty.name(),
                data.len()
            )));
        }
        Ok(Matrix {
            rows,
            cols,
            kind: Kind::Ggml { data, ty },
            lanes: None,
        })
    }

    /// A trellis-coded matrix (its products run the fused trellis kernel).
    pub fn trellis(view: super::trellis::TrellisView<'a>) -> Matrix<'a> {
        Matrix {
            rows: view.rows(),
            cols: view.cols(),
            kind: Kind::Trellis(view),
            lanes: None,
        }
    }

    pub(crate) fn trellis_view(&self) -> Option<super::trellis::TrellisView<'a>> {
        match self.kind {
            Kind::Trellis(t) => Some(t),
            _ => None,
        }
    }

    /// The address ranges `[start, end)` of the buffers this matrix reads (codes, scales and
    /// biases; floats; GGML blocks), for [`super::prefer_huge_pages`]. Trellis matrices give
    /// none.
    pub fn spans(&self) -> Vec<(usize, usize)> {
        fn span<T>(s: &[T]) -> (usize, usize) {
            let a = s.as_ptr() as usize;
            (a, a + std::mem::size_of_val(s))
        }
        fn floats(f: &Floats<'_>) -> (usize, usize) {
            match f {
                Floats::F32(s) => span(s),
                Floats::F16(s) => span(s),
                Floats::Bf16(s) => span(s),
            }
        }
        match &self.kind {
            Kind::Dense(f) => vec![floats(f)],
            Kind::Affine {
                words,
                scales,
                biases,
                ..
            } => vec![span(words), floats(scales), floats(biases)],
            Kind::Symmetric { words, scales, .. } => vec![span(words), floats(scales)],
            Kind::Ggml { data, .. } => vec![span(data)],
            Kind::Trellis(_) => Vec::new(),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// This matrix with `lanes` attached: its lane layout ([`super::lanes::Lanes16::pack`] of
    /// this same matrix: the same words, scales, biases, shape and group, else an error), which
    /// the lane kernel (`CpuContext::lane4`) reads instead of transposing the words on every
    /// call.
    pub fn with_lanes(self, lanes: &'a super::lanes::Lanes16) -> Result<Matrix<'a>> {
        let (words, scales, biases) = match self.kind {
            Kind::Affine {
                words,
                scales,
                biases,
                group,
                ..
            } if group == lanes.group => (words, scales, Some(biases)),
            Kind::Symmetric {
                words,
                scales,
                group,
                ..
            } if group == lanes.group => (words, scales, None),
            _ => {
                return Err(bad(format!(
                    "lanes of a ({}, {}) group-{} matrix attached to another layout",
                    lanes.rows, lanes.cols, lanes.group
                )))
            }
        };
        if (self.rows, self.cols) != (lanes.rows, lanes.cols)
            || !lanes.made_from(words, scales, biases)
        {
            return Err(bad(format!(
                "lanes of a ({}, {}) matrix attached to another ({}, {}) matrix (other \
                 words, scales or biases)",
                lanes.rows, lanes.cols, self.rows, self.cols
            )));
        }
        Ok(Matrix {
            lanes: Some(lanes),
            ..self
        })
    }

    /// The lane layout attached by [`Matrix::with_lanes`].
    pub fn lanes(&self) -> Option<&'a super::lanes::Lanes16> {
        self.lanes
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` widened (dequantized) into `out` (`cols` long): an embedding lookup.
    pub fn row_to(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if r >= self.rows || out.len() != self.cols {
            return Err(bad(format!(
                "row {r} into {} floats of a ({}, {}) matrix",
                out.len(),
                self.rows,
                self.cols
            )));
        }
        if let Kind::Ggml { data, ty } = self.kind {
            let rb = ty.row_bytes(self.cols);
            super::kquant::dequantize_row(ty, &data[r * rb..(r + 1) * rb], out);
            return Ok(());
        }
        for (c, o) in out.iter_mut().enumerate() {
            *o = self.value(r, c);
        }
        Ok(())
    }

    /// Element `(r, c)` as f32 (dequantized).
    #[inline]
    pub(crate) fn value(&self, r: usize, c: usize) -> f32 {
        match self.kind {
            Kind::Dense(d) => d.get(r * self.cols + c),
            Kind::Affine {
                words,
                scales,
                biases,
                bits,
                group,
            } => {
                let i = r * self.cols + c;
                let bit = i * bits as usize;
                let q = (words[bit / 32] >> (bit % 32)) & ((1u32 << bits) - 1);
                let g = i / group;
                scales.get(g) * q as f32 + biases.get(g)
            }
            Kind::Symmetric {
                words,
                scales,
                bits,
                group,
            } => {
                let i = r * self.cols + c;
                let bit = i * bits as usize;
                let q = (words[bit / 32] >> (bit % 32)) & ((1u32 << bits) - 1);
                let s = scales.get(i / group);
                s * q as f32 + s * -((1u32 << (bits - 1)) as f32)
            }
            Kind::Trellis(t) => t.value(r, c),
            Kind::Ggml { data, ty } => {
                let (bs, bb) = (ty.block(), ty.block_bytes());
                let at = (r * self.cols + c) / bs * bb;
                let mut block = [0f32; 256];
                super::kquant::dequantize_row(ty, &data[at..at + bb], &mut block[..bs]);
                block[c % bs]
            }
        }
    }
}

/// The most products one [`matmul_t`] call runs together.
pub const MAX_JOBS: usize = 4;

/// One product of a [`matmul_t`] call: `out (m, rows) = x (m, cols) W^T + bias`.
#[derive(Debug)]
pub struct MatJob<'a, 'b> {
    pub w: &'b Matrix<'a>,
    pub bias: Option<Floats<'a>>,
    pub out: &'b mut [f32],
}

/// `out = x W^T (+ bias)` for every job (one pool run for all of them, so q, k and v or gate
/// and up share one dispatch). `x` is `(m, cols)` row-major, the same `cols` for every job.
/// Blocks of rows go to whichever worker is free (a loaded machine stays balanced).
pub fn matmul_t(ctx: &CpuContext, x: &[f32], m: usize, jobs: &mut [MatJob<'_, '_>]) -> Result<()> {
    let op = "cpu::matmul_t";
    let Some(first) = jobs.first() else {
        return Ok(());
    };
    if jobs.len() > MAX_JOBS {
        return Err(Error::invalid(
            op,
            format!("{} products in one call, at most {MAX_JOBS}", jobs.len()),
        ));
    }
    let cols = first.w.cols;
    if x.len() != m * cols {
        return Err(Error::invalid(
            op,
            format!("x has {} floats, ({m}, {cols}) needs {}", x.len(), m * cols),
        ));
    }
    for j in jobs.iter() {
        if j.w.cols != cols {
            return Err(Error::invalid(
                op,
                format!("matrices of {} and {cols} columns in one call", j.w.cols),
            ));
        }
        if j.out.len() != m * j.w.rows {
            return Err(Error::invalid(
                op,
                format!(
                    "out has {} floats, ({m}, {}) needs more",
                    j.out.len(),
                    j.w.rows
                ),
            ));
        }
        if let Some(b) = j.bias {
            if b.len() != j.w.rows {
                return Err(Error::invalid(
                    op,
                    format!("bias of {} for {} rows", b.len(), j.w.rows),
                ));
            }
        }
    }
    if m == 0 {
        return Ok(());
    }
    if jobs.iter().any(|j| j.w.trellis_view().is_some()) {
        return super::trellis::matmul_jobs(ctx, x, m, jobs, None);
    }
    // A prompt block over affine weights on AMX's tiles.
    #[cfg(target_arch = "x86_64")]
    if super::amx::applies(ctx, m, jobs) {
        return super::amx::matmul_jobs(ctx, x, m, jobs);
    }
    // A prompt block over GGML blocks: each weight panel decoded once for all rows.
    #[cfg(target_arch = "x86_64")]
    if super::kgemm::applies(ctx, m, jobs) {
        return super::kgemm::matmul_jobs(ctx, x, m, jobs);
    }
    if jobs.iter().any(|j| super::kquant::is_ggml(j.w)) {
        return super::kquant::matmul_jobs(ctx, ctx.activations, x, m, jobs, false);
    }
    let threads = ctx.pool.threads();
    let total: usize = jobs.iter().map(|j| j.w.rows).sum();
    let block = (total / (threads * 8)).clamp(1, 32);
    // Per job: its matrix, bias, output and first block index (on the stack: no allocation
    // in a decode step).
    type Plan<'p> = (Matrix<'p>, Option<Floats<'p>>, SharedOut, usize);
    let mut plan: [Option<Plan<'_>>; MAX_JOBS] = [None; MAX_JOBS];
    let mut blocks = 0;
    for (p, j) in plan.iter_mut().zip(jobs.iter_mut()) {
        *p = Some((*j.w, j.bias, SharedOut::new(j.out), blocks));
        blocks += j.w.rows.div_ceil(block);
    }
    let next = AtomicUsize::new(0);
    let isa = ctx.isa;
    #[cfg(target_arch = "x86_64")]
    let lane4 = ctx.lane4;
    // Int8/int16 activations: `x` quantized once here, read by every product of the call that
    // the integer kernels take, in this thread's buffers (`QBUFS`: made at its first such
    // call, then kept; no allocation in a decode step after the first).
    #[cfg(target_arch = "x86_64")]
    let mut bufs = QBUFS.with(Cell::take);
    #[cfg(target_arch = "x86_64")]
    let (qx, qx16) = {
        let fits = isa.has_avx2()
            && m <= INT8_MAX_M
            && cols % 32 == 0
            && m * cols <= INT8_MAX_M * super::x86::MAX_BUF;
        let chunks = m * cols / 32;
        match ctx.activations {
            Activations::Int8 if fits && jobs.iter().any(|j| int8_kernel(j.w)) => {
                // SAFETY: QBuf is plain integers and floats, for which any bit pattern is
                // valid; quantize_x writes the prefix that the kernels read.
                let b = unsafe {
                    bufs.q8
                        .get_or_insert_with(Box::new_uninit)
                        .assume_init_mut()
                };
                super::x86::quantize_x(
                    x,
                    &mut b.q[..m * cols],
                    &mut b.d[..chunks],
                    &mut b.s[..chunks],
                );
                let q = super::x86::QuantX {
                    q: b.q.as_ptr(),
                    d: b.d.as_ptr(),
                    s: b.s.as_ptr(),
                };
                (Some(q), None)
            }
            Activations::Int16
            | Activations::Int16Q8Int8
            | Activations::Int8Vnni
            | Activations::Int8Normed
                if fits && jobs.iter().any(|j| int16_kernel(j.w)) =>
            {
                // SAFETY: as above (QBuf16 is plain integers and floats).
                let b = unsafe {
                    bufs.q16
                        .get_or_insert_with(Box::new_uninit)
                        .assume_init_mut()
                };
                // SAFETY: `fits` checked the ISA (AVX2, FMA, F16C).
                unsafe {
                    super::x86::quantize_x16(
                        x,
                        &mut b.q[..m * cols],
                        &mut b.d[..chunks],
                        &mut b.s[..chunks],
                    )
                };
                // The permuted codes only where a 512-bit kernel reads them (see
                // `matmul_t_each`), and the split bytes of the 512-bit 4-bit kernel
                // (`dot4_512_s`), as `matmul_t_each` makes them (the same sums each input).
                let split = isa == Isa::Avx512 && ctx.split4;
                if isa == Isa::Avx512 && jobs.iter().any(|j| super::x86::needs_permuted(j.w, split))
                {
                    super::x86::permute_x16(&b.q[..m * cols], cols, &mut b.p[..m * cols]);
                }
                let hs = super::x86::split_stride(cols);
                let h = if split {
                    super::x86::split_x16(&b.q[..m * cols], cols, &mut b.h[..m * hs]);
                    b.h.as_ptr()
                } else {
                    std::ptr::null()
                };
                let q = super::x86::QuantX16 {
                    q: b.q.as_ptr(),
                    p: b.p.as_ptr(),
                    d: b.d.as_ptr(),
                    s: b.s.as_ptr(),
                    h,
                    hs,
                };
                (None, Some(q))
            }
            _ => (None, None),
        }
    };
    ctx.pool.run(&|_, _| loop {
        let b = next.fetch_add(1, Ordering::Relaxed);
        if b >= blocks {
            break;
        }
        let Some(&(w, bias, out, start)) = plan.iter().rev().flatten().find(|p| p.3 <= b) else {
            break;
        };
        let r0 = (b - start) * block;
        let r1 = (r0 + block).min(w.rows);
        #[cfg(target_arch = "x86_64")]
        if let Some(q) = qx.filter(|_| int8_kernel(&w)) {
            // SAFETY: Isa::Avx2 was checked available by CpuContext; q holds x quantized
            // (m rows of cols values); these rows are this worker's alone.
            unsafe { super::x86::rows_q4_int8(&w, r0, r1, q, m, out, bias) };
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(q) = qx16.filter(|_| int16_kernel(&w)) {
            if isa == Isa::Avx512 && lane4 && w.lanes().is_some() {
                // SAFETY: as below, with the lane layout attached (`rows_lanes` reads it).
                unsafe { super::amx_verify::rows_lanes(&w, r0, r1, q.q, q.d, q.s, m, out, bias) };
                continue;
            }
            if isa == Isa::Avx512 && lane4 && super::amx_verify::supports(&w) {
                // SAFETY: as below (Isa::Avx512: AVX-512 F/BW/VL + VNNI), q holding m rows of
                // codes, scales and sums.
                unsafe { super::amx_verify::rows(&w, r0, r1, q.q, q.d, q.s, m, out, bias) };
                continue;
            }
            if isa == Isa::Avx512 && w.cols / 32 <= super::x86::MAX_CHUNKS {
                // SAFETY: as below, and Isa::Avx512 was checked available by CpuContext.
                unsafe { super::x86::rows_int16_512(&w, r0, r1, q, m, out, bias) };
                continue;
            }
            // SAFETY: as above, with x quantized to int16.
            unsafe { super::x86::rows_int16(&w, r0, r1, q, m, out, bias) };
            continue;
        }
        rows(isa, &w, r0, r1, x, m, out, bias);
    });
    #[cfg(target_arch = "x86_64")]
    QBUFS.with(|c| c.set(bufs));
    Ok(())
}

/// A thread's buffers for `x` quantized to int8 / int16 ([`matmul_t`]), each made at the
/// thread's first call that needs it. On the stack (~240 KiB together), every call's frame
/// probes touched all their pages, which then stayed resident for the rest of the run
/// (issue #31's peak memory); here a call touches only the rows it writes.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct QBufs {
    q8: Option<Box<std::mem::MaybeUninit<QBuf>>>,
    q16: Option<Box<std::mem::MaybeUninit<QBuf16>>>,
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// This thread's [`QBufs`], taken out for a call (a nested call makes its own).
    static QBUFS: Cell<QBufs> = const { Cell::new(QBufs { q8: None, q16: None }) };
}

/// Inputs at most for the int8 path (more: a prompt block, which the float kernels' reuse of
/// each dequantized row serves better).
pub(super) const INT8_MAX_M: usize = 4;

/// Stack space for `x` quantized to int8.
#[cfg(target_arch = "x86_64")]
struct QBuf {
    q: [i8; INT8_MAX_M * super::x86::MAX_BUF],
    d: [f32; INT8_MAX_M * super::x86::MAX_BUF / 32],
    s: [f32; INT8_MAX_M * super::x86::MAX_BUF / 32],
}

/// Stack space for `x` quantized to int16.
#[cfg(target_arch = "x86_64")]
struct QBuf16 {
    q: [i16; INT8_MAX_M * super::x86::MAX_BUF],
    p: [i16; INT8_MAX_M * super::x86::MAX_BUF],
    /// `q` split into bytes, rows padded to whole quads of chunks (`x86::split_x16`).
    h: [u8; INT8_MAX_M * (super::x86::MAX_BUF + 128) * 2],
    d: [f32; INT8_MAX_M * super::x86::MAX_BUF / 32],
    s: [f32; INT8_MAX_M * super::x86::MAX_BUF / 32],
}

/// Whether the int16 kernel takes `w`: 4- or 8-bit affine, groups of 32 times a power of two.
#[cfg(target_arch = "x86_64")]
pub(super) fn int16_kernel(w: &Matrix<'_>) -> bool {
    w.affine_parts()
        .is_some_and(|p| matches!(p.bits, 4 | 8) && (p.group / 32).is_power_of_two())
        && super::x86::supports(w)
}

/// Whether the int8 kernel takes `w`: 4-bit affine, groups of 32 times a power of two.
#[cfg(target_arch = "x86_64")]
pub(super) fn int8_kernel(w: &Matrix<'_>) -> bool {
    w.affine_parts()
        .is_some_and(|p| p.bits == 4 && (p.group / 32).is_power_of_two())
        && super::x86::supports(w)
}

/// Rows `r0..r1` of the product into `out` (`(m, rows)`).
#[allow(clippy::too_many_arguments)]
pub(super) fn rows(
    isa: Isa,
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    x: &[f32],
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && m > 4 && super::x86::prefill_512_supports(w) {
        // SAFETY: Isa::Avx512 is only constructed where the CPU has AVX2, FMA, F16C and
        // AVX-512 F/BW/VL (CpuContext checks `available`); the arguments were checked by
        // `matmul_t`.
        unsafe { super::x86::rows_prefill_512(w, r0, r1, x, m, out, bias) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && super::x86::supports(w) {
        // SAFETY: Isa::Avx2 is only constructed where the CPU has AVX2, FMA and F16C
        // (CpuContext checks `available`); the arguments were checked by `matmul_t`.
        unsafe { super::x86::rows_avx2(w, r0, r1, x, m, out, bias) };
        return;
    }
    let _ = isa;
    rows_scalar(w, r0, r1, x, m, out, bias);
}

/// The portable kernel: dequantize each 32-value chunk of a row, then sum its products with
/// each input row.
pub(crate) fn rows_scalar(
    w: &Matrix<'_>,
    r0: usize,
    r1: usize,
    x: &[f32],
    m: usize,
    out: SharedOut,
    bias: Option<Floats<'_>>,
) {
    let cols = w.cols;
    let mut chunk = [0f32; 32];
    let mut acc = [0f32; 8];
    for r in r0..r1 {
        let mut t0 = 0;
        while t0 < m {
            let mt = (m - t0).min(8);
            acc[..mt].fill(0.0);
            let mut c0 = 0;
            while c0 < cols {
                let n = (cols - c0).min(32);
                for (k, v) in chunk[..n].iter_mut().enumerate() {
                    *v = w.value(r, c0 + k);
                }
                for (t, a) in acc[..mt].iter_mut().enumerate() {
                    let xr = &x[(t0 + t) * cols + c0..(t0 + t) * cols + c0 + n];
                    let mut s = 0f32;
                    for (wv, xv) in chunk[..n].iter().zip(xr) {
                        s += wv * xv;
                    }
                    *a += s;
                }
                c0 += n;
            }
            let b = bias.map_or(0.0, |b| b.get(r));
            for (t, a) in acc[..mt].iter().enumerate() {
                // SAFETY: row r of this block is this worker's alone.
                unsafe { out.write((t0 + t) * w.rows + r, a + b) };
            }
            t0 += mt;
        }
    }
}
