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
    /// The address and length of the packed words, the scales and the biases (`None`: a
    /// symmetric matrix's, formed from its scales) in the matrix it was made from
    /// ([`Matrix::with_lanes`] attaches it to that matrix only: [`Lanes16::made_from`]).
    pub(crate) src: Sources,
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

/// Where a layout's words, scales and biases came from: address and length of each slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sources {
    words: (usize, usize),
    scales: (usize, usize),
    biases: Option<(usize, usize)>,
}

impl Sources {
    fn of(words: &[u32], scales: &[f16], biases: Option<&[f16]>) -> Self {
        let at = |p: *const f16, n: usize| (p as usize, n);
        Sources {
            words: (words.as_ptr() as usize, words.len()),
            scales: at(scales.as_ptr(), scales.len()),
            biases: biases.map(|b| at(b.as_ptr(), b.len())),
        }
    }
}

/// `k`-th of `n` indices spread evenly over `0..len` (`len > 0`): the first and the last
/// included.
fn spread(k: usize, n: usize, len: usize) -> usize {
    k * (len - 1) / (n - 1)
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
            && w.cols() > 0
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
            src: Sources::of(words, scales, biases),
            words: lw,
            scales: ls,
            biases: lb,
        })
    }

    /// Whether this layout was packed from a matrix of these `words`, float16 `scales` and
    /// `biases` (`None`: a symmetric matrix's): the same slices (addresses and lengths) and,
    /// a cheap check that they still hold what was packed, 64 words and 16 scales and biases
    /// spread over them where this layout put them. Scales or biases of another dtype are
    /// never this layout's.
    pub(crate) fn made_from(
        &self,
        words: &[u32],
        scales: Floats<'_>,
        biases: Option<Floats<'_>>,
    ) -> bool {
        let scales = match scales {
            Floats::F16(s) => s,
            _ => return false,
        };
        let biases = match biases {
            None => None,
            Some(Floats::F16(b)) => Some(b),
            Some(_) => return false,
        };
        let (chunks, wpr, groups) = (self.cols / 32, self.cols / 8, self.cols / self.group);
        if self.src != Sources::of(words, scales, biases)
            || words.len() != self.rows * wpr
            || scales.len() != self.rows * groups
            || biases.is_some_and(|b| b.len() != scales.len())
        {
            return false;
        }
        let words_match = (0..64).all(|k| {
            let i = spread(k, 64, words.len());
            let (n, w) = (i / wpr, i % wpr);
            let (b, c, j) = (n / 16, w / 4, w % 4);
            self.words.get(((b * chunks + c) * 4 + j) * 16 + n % 16) == Some(&words[i])
        });
        // Scale or bias `i` of the matrix (row `n`, group `g`) sits at this lane of the block.
        let at = |i: usize| {
            let (n, g) = (i / groups, i % groups);
            ((n / 16) * groups + g) * 16 + n % 16
        };
        let same = |mine: &[f16], theirs: f16, i: usize| {
            mine.get(at(i)).map(|v| v.to_bits()) == Some(theirs.to_bits())
        };
        words_match
            && (0..16).all(|k| {
                let i = spread(k, 16, scales.len());
                same(&self.scales, scales[i], i)
                    && biases.is_none_or(|b| same(&self.biases, b[i], i))
            })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.words.len() * 4 + (self.scales.len() + self.biases.len()) * 2
    }
}

/// The lane layouts of a model's 4-bit weights, made once on the first request and kept with
/// the model (a dense model holds one: the layouts live as long as the arrays they were made
/// from, and the next decoder over the same model reuses them).
#[derive(Default)]
pub struct LanesStore(std::sync::OnceLock<Vec<Option<Lanes16>>>);

impl std::fmt::Debug for LanesStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            Some(v) => write!(f, "LanesStore({} layouts)", v.iter().flatten().count()),
            None => write!(f, "LanesStore(empty)"),
        }
    }
}

impl LanesStore {
    /// `ws` with their lane layouts attached: packed on the first call (where
    /// [`Lanes16::packs`] holds), and attached where a layout is its matrix's own
    /// ([`Matrix::with_lanes`]: the same words, shape and group; a matrix whose arrays were
    /// replaced since keeps no layout). Later calls must list the same matrices in the same
    /// order; any other matrix is left as it is.
    pub fn attach<'a>(&'a self, ws: &mut [Matrix<'a>]) {
        let packed = self
            .0
            .get_or_init(|| ws.iter().map(|w| Lanes16::pack(w).ok()).collect());
        for (w, l) in ws.iter_mut().zip(packed) {
            if let Some(l) = l {
                if let Ok(m) = w.with_lanes(l) {
                    *w = m;
                }
            }
        }
    }
}
