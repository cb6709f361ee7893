//! A 4-bit matrix laid out once for the chunk-sum lane kernel (`amx_verify`'s arithmetic,
//! `CpuContext::lane4`): 16 weight rows a block, each chunk's four packed words transposed so
//! that one vector holds word `j` of that chunk of all 16 rows, and the block's float16 scales
//! and biases transposed the same way (one 16-lane vector a group). `amx_verify::rows`
//! transposes these on every call (~2 shuffles a weight-row-chunk); read from a [`Lanes16`]
//! they are plain loads, so the lane kernel's one-row product needs no shuffles and a
//! verification pass's extra rows cost only their dot products.
//!
//! A copy of the 4-bit data (the words at the same size, the scales and biases as float16),
//! made on request ([`Lanes16::pack`]) and attached to a [`Matrix`] view
//! ([`Matrix::with_lanes`]): nothing here reads it unless the lane kernel is switched on.

use half::f16;

use super::matmul::{Floats, Kind, Matrix};
use crate::error::{Error, Result};

/// A 4-bit affine or symmetric matrix (float16 scales, groups of 32 times a power of two up
/// to 512) in 16-row blocks: see the module.
#[derive(Clone)]
pub struct Lanes16 {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) group: usize,
    /// The packed words' address and length in the matrix it was made from
    /// ([`Matrix::with_lanes`] attaches it to that matrix only).
    pub(crate) src: (usize, usize),
    /// Per block `b` and chunk `c`: 4 x 16 words, `words[((b * chunks + c) * 4 + j) * 16 + i]`
    /// = word `j` of chunk `c` of row `16 b + i` (rows past the matrix repeat its last).
    pub(crate) words: Vec<u32>,
    /// Per block `b` and group `g`: 16 scales, `scales[(b * groups + g) * 16 + i]`.
    pub(crate) scales: Vec<f16>,
    /// As `scales`, the biases (a symmetric matrix's formed as `-8 x scale`, exact in float16
    /// for the scales [`Matrix::symmetric`] takes: the materialized biases' bits).
    pub(crate) biases: Vec<f16>,
}

impl std::fmt::Debug for Lanes16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Lanes16({} x {}, group {})",
            self.rows, self.cols, self.group
        )
    }
}

fn bad(msg: String) -> Error {
    Error::invalid("cpu::Lanes16", msg)
}

impl Lanes16 {
    /// Whether [`Lanes16::pack`] takes `w`: 4-bit affine with float16 scales and biases, or
    /// 4-bit symmetric (float16 scales), in groups of 32 times a power of two up to 512.
    pub fn packs(w: &Matrix<'_>) -> bool {
        let (group, ok) = match w.kind {
            Kind::Affine {
                bits: 4,
                group,
                scales: Floats::F16(_),
                biases: Floats::F16(_),
                ..
            } => (group, true),
            Kind::Symmetric {
                bits: 4,
                group,
                scales: Floats::F16(_),
                ..
            } => (group, true),
            _ => (0, false),
        };
        ok && group % 32 == 0
            && (group / 32).is_power_of_two()
            && group <= 512
            && w.cols() % 32 == 0
            && w.rows() > 0
    }

    /// `w` laid out in 16-row blocks (see the module): an error naming the layout where
    /// [`Lanes16::packs`] does not hold.
    pub fn pack(w: &Matrix<'_>) -> Result<Lanes16> {
        if !Lanes16::packs(w) {
            return Err(bad(format!(
                "a ({}, {}) matrix that is not 4-bit float16 affine or symmetric in groups of \
                 32 x 2^k (<= 512)",
                w.rows(),
                w.cols()
            )));
        }
        let (words, scales, biases, group) = match w.kind {
            Kind::Affine {
                words,
                scales: Floats::F16(s),
                biases: Floats::F16(b),
                group,
                ..
            } => (words, s, Some(b), group),
            Kind::Symmetric {
                words,
                scales: Floats::F16(s),
                group,
                ..
            } => (words, s, None, group),
            _ => unreachable!("checked by packs"),
        };
        let (rows, cols) = (w.rows(), w.cols());
        let (chunks, groups, wpr) = (cols / 32, cols / group, cols / 8);
        let blocks = rows.div_ceil(16);
        let mut lw = vec![0u32; blocks * chunks * 64];
        let mut ls = vec![f16::ZERO; blocks * groups * 16];
        let mut lb = vec![f16::ZERO; blocks * groups * 16];
        for b in 0..blocks {
            for i in 0..16 {
                let n = (16 * b + i).min(rows - 1);
                for c in 0..chunks {
                    for j in 0..4 {
                        lw[((b * chunks + c) * 4 + j) * 16 + i] = words[n * wpr + 4 * c + j];
                    }
                }
                for g in 0..groups {
                    let s = scales[n * groups + g];
                    ls[(b * groups + g) * 16 + i] = s;
                    // A symmetric matrix's bias: -8 x its scale, exact in float16 for the
                    // scales `Matrix::symmetric` takes (the materialized biases' bits).
                    lb[(b * groups + g) * 16 + i] = match biases {
                        Some(bs) => bs[n * groups + g],
                        None => f16::from_f32(-8.0 * s.to_f32()),
                    };
                }
            }
        }
        Ok(Lanes16 {
            rows,
            cols,
            group,
            src: (words.as_ptr() as usize, words.len()),
            words: lw,
            scales: ls,
            biases: lb,
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.words.len() * 4 + (self.scales.len() + self.biases.len()) * 2
    }
}

/// A place for a weight's [`Lanes16`], made on first request and kept with the weight (a
/// quantized weight holds one, so the layout lives as long as the arrays it was made from).
/// A clone starts empty: a cloned weight may have its arrays replaced.
#[derive(Default)]
pub struct LanesCache(std::sync::OnceLock<Option<Lanes16>>);

impl Clone for LanesCache {
    fn clone(&self) -> Self {
        LanesCache::default()
    }
}

impl std::fmt::Debug for LanesCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            Some(Some(l)) => write!(f, "LanesCache({l:?})"),
            _ => write!(f, "LanesCache(empty)"),
        }
    }
}

impl LanesCache {
    /// `w` with its lane layout attached: packed on the first call (`None` kept where
    /// [`Lanes16::packs`] does not hold), attached where it is `w`'s own
    /// ([`Matrix::with_lanes`]); `w` unchanged otherwise.
    pub fn attach<'a>(&'a self, w: Matrix<'a>) -> Matrix<'a> {
        let l = self.0.get_or_init(|| Lanes16::pack(&w).ok());
        match l {
            Some(l) => w.with_lanes(l).unwrap_or(w),
            None => w,
        }
    }

    /// Drops the layout (the weight's arrays may change).
    pub fn clear(&mut self) {
        self.0 = std::sync::OnceLock::new();
    }
}
