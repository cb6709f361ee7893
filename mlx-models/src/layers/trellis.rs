//! `TrellisLinear`'s weight: a trellis-coded matrix (`"mode": "trellis"`, see
//! `mlx_core::cpu::trellis` for the code and layout), decoded either with plain MLX ops (the
//! reference) or with the CPU kernel, then `y = su * H_r (Wt (H_c (sv * x)))`.

use std::sync::atomic::{AtomicU8, Ordering};

use mlx_core::cpu::trellis::{self as tc, TrellisSpec};
use mlx_core::prelude::*;

use crate::config::{QuantParams, TrellisParams};
use crate::error::{ModelError, Result};
use crate::layers::LayerParam;
use crate::weights::Weights;

/// How a trellis weight is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrellisDecode {
    /// Plain MLX ops (the reference; lazy, on any device).
    Reference,
    /// The CPU kernel (`mlx_core::cpu::trellis::decode`) over the evaluated words.
    Kernel,
}

static DECODE: AtomicU8 = AtomicU8::new(1);

/// Picks the decode path of every trellis layer in the process (default: the kernel).
pub fn set_trellis_decode(d: TrellisDecode) {
    DECODE.store(
        match d {
            TrellisDecode::Reference => 0,
            TrellisDecode::Kernel => 1,
        },
        Ordering::Relaxed,
    );
}

/// The decode path in use.
pub fn trellis_decode() -> TrellisDecode {
    if DECODE.load(Ordering::Relaxed) == 0 {
        TrellisDecode::Reference
    } else {
        TrellisDecode::Kernel
    }
}

/// A trellis-coded `(rows, cols)` weight.
#[derive(Clone, Debug)]
pub struct TrellisWeight {
    /// `uint32 (rows, cols * bits / 32)`: the blocks' bit streams.
    pub weight: Array,
    /// `(rows, 1)`: each row's scale.
    pub scales: Array,
    pub spec: TrellisSpec,
    pub params: TrellisParams,
    pub rows: i32,
    pub cols: i32,
    /// The layer's signs (made from the seed and path at load) and Hadamard block sizes
    /// (their matrices are shared by every layer: [`hadamard_array`]).
    su: Array,
    sv: Array,
    block_rows: usize,
    block_cols: usize,
    /// The fused decode-and-dot kernel's read plan (`cpu::trellis::TrellisMatvec`).
    plan: tc::TrellisMatvec,
    /// The signs as host vectors and the scales as float32 (made on the first
    /// [`TrellisWeight::cpu_view`]), for the CPU decoder.
    su_host: Vec<f32>,
    sv_host: Vec<f32>,
    scales_host: std::sync::OnceLock<Vec<f32>>,
}

/// Inputs of at most this many rows take the fused kernel (`TrellisDecode::Kernel`): each
/// weight is decoded once per row inside the dot product instead of decoding the whole matrix
/// for a BLAS product (decode steps; prompts keep the decoded matrix).
pub const FUSED_MAX_ROWS: i32 = 4;

/// The workers of the fused kernel (every core), made on first use.
fn pool() -> Option<&'static mlx_core::cpu::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<mlx_core::cpu::ThreadPool>> =
        std::sync::OnceLock::new();
    POOL.get_or_init(|| mlx_core::cpu::ThreadPool::new(mlx_core::cpu::available_threads()).ok())
        .as_ref()
}

fn words_per_row(spec: &TrellisSpec, cols: i32) -> i32 {
    (i64::from(cols) * i64::from(spec.k) / 32) as i32
}

impl TrellisWeight {
    /// Loads `<path>.weight` (uint32) and `<path>.scales` for a logical `(rows, cols)` matrix.
    pub fn load(
        w: &mut Weights,
        path: &str,
        rows: i32,
        cols: i32,
        q: &QuantParams,
        t: &TrellisParams,
    ) -> Result<TrellisWeight> {
        let spec = q.trellis_spec(t);
        spec.check_shape(rows.max(0) as usize, cols.max(0) as usize)
            .map_err(|m| ModelError::Config(format!("{path}: {m}")))?;
        let weight = w.take(
            &format!("{path}.weight"),
            &[rows, words_per_row(&spec, cols)],
        )?;
        if weight.dtype() != Dtype::Uint32 && weight.shape() == [rows, words_per_row(&spec, cols)] {
            return Err(ModelError::Weights(vec![format!(
                "{path}.weight: a trellis weight must be uint32, got {:?}",
                weight.dtype()
            )]));
        }
        let scales = w.take(&format!("{path}.scales"), &[rows, 1])?;
        TrellisWeight::new(weight, scales, spec, *t, path, rows, cols)
    }

    /// A trellis weight from its arrays; `path` seeds the layer's signs.
    pub fn new(
        weight: Array,
        scales: Array,
        spec: TrellisSpec,
        params: TrellisParams,
        path: &str,
        rows: i32,
        cols: i32,
    ) -> Result<TrellisWeight> {
        let (su, sv) = tc::layer_signs(
            tc::layer_seed(params.seed, path),
            rows as usize,
            cols as usize,
        );
        let (br, bc) = (
            tc::hadamard_block(rows as usize),
            tc::hadamard_block(cols as usize),
        );
        Ok(TrellisWeight {
            weight,
            scales,
            spec,
            params,
            rows,
            cols,
            su: Array::from_slice(&su, &[rows])?,
            sv: Array::from_slice(&sv, &[cols])?,
            su_host: su,
            sv_host: sv,
            scales_host: std::sync::OnceLock::new(),
            block_rows: br,
            block_cols: bc,
            plan: tc::TrellisMatvec::new(&spec, cols as usize)
                .map_err(|m| ModelError::Config(format!("{path}: {m}")))?,
        })
    }

    /// The layer's random signs as the loader made them (float32): `su` over the rows, `sv`
    /// over the columns (the GPU graph decoder uploads these, not a second derivation).
    pub fn signs(&self) -> (&Array, &Array) {
        (&self.su, &self.sv)
    }

    pub(crate) fn parameters_mut<'a>(&'a mut self, path: &str, out: &mut Vec<LayerParam<'a>>) {
        // The scales may change through these: the host copy is made again when next needed.
        self.scales_host = std::sync::OnceLock::new();
        LayerParam::push(out, path, "weight", &mut self.weight, true);
        LayerParam::push(out, path, "scales", &mut self.scales, true);
    }

    /// The weight as the CPU decoder's kernels read it (`cpu::Matrix::trellis`): borrowed
    /// words (evaluated at load), the scales as float32, the signs and the kernel's plan.
    pub fn cpu_view(&self) -> Result<tc::TrellisView<'_>> {
        let words = self.weight.as_slice::<u32>()?;
        let scales = match self.scales_host.get() {
            Some(s) => s,
            None => {
                let s = self.scales.astype(Dtype::Float32)?;
                s.eval()?;
                let v = s.to_vec::<f32>()?;
                self.scales_host.get_or_init(|| v)
            }
        };
        tc::TrellisView::new(words, scales, &self.su_host, &self.sv_host, &self.plan)
            .map_err(|e| ModelError::Config(e.to_string()))
    }

    /// The stored matrix `Wt` (scaled rows, before the incoherence is undone), float32,
    /// with plain MLX ops.
    pub fn decode_reference(&self) -> Result<Array> {
        let spec = &self.spec;
        let bw = spec.block_words();
        let nb = self.cols / spec.block as i32;
        let words = self.weight.reshape(&[self.rows, nb, bw as i32])?;
        let (mut a, mut a1, mut shift) = (Vec::new(), Vec::new(), Vec::new());
        for t in 0..spec.block {
            let start = spec.window_start(t);
            a.push((start / 32) as u32);
            a1.push(((start / 32 + 1) % bw) as u32);
            shift.push((64 - start % 32 - spec.l as usize) as u64);
        }
        let hi = words.take(&Array::from_vec(a)?, 2)?.astype(Dtype::Uint64)?;
        let lo = words
            .take(&Array::from_vec(a1)?, 2)?
            .astype(Dtype::Uint64)?;
        let both = (&(&hi << &Array::scalar(32u64)?)? | &lo)?;
        let state = (&(&both >> &Array::from_vec(shift)?)?
            & &Array::scalar((1u64 << spec.l) - 1)?)?
            .astype(Dtype::Uint32)?;
        if spec.code != tc::TrellisCode::Mad {
            // Other codes: the state's value from the table of every state's value.
            let table = Array::from_vec(tc::spec_code_table(spec))?;
            let code = table.take(&state, 0)?.reshape(&[self.rows, self.cols])?;
            return Ok((&code * &self.scales.astype(Dtype::Float32)?)?);
        }
        let x = (&(&state * &Array::scalar(tc::MAD_A)?)? + &Array::scalar(tc::MAD_B)?)?;
        let pairs = Array::scalar(0x00FF_00FFu32)?;
        let y = (&(&x & &pairs)? + &(&(&x >> &Array::scalar(8u32)?)? & &pairs)?)?;
        let s = (&(&y & &Array::scalar(0xFFFFu32)?)? + &(&y >> &Array::scalar(16u32)?)?)?;
        let centered = (&s.astype(Dtype::Int32)? - &Array::scalar(510i32)?)?;
        let code = (&centered.astype(Dtype::Float32)? / &Array::scalar(tc::MAD_SCALE)?)?;
        let code = code.reshape(&[self.rows, self.cols])?;
        Ok((&code * &self.scales.astype(Dtype::Float32)?)?)
    }

    /// The stored matrix `Wt` with the CPU kernel (the words must be evaluated).
    pub fn decode_kernel(&self) -> Result<Array> {
        let words = self.weight.as_slice::<u32>()?;
        let scales = self.scales.astype(Dtype::Float32)?;
        scales.eval()?;
        let scales = scales.as_slice::<f32>()?;
        let (rows, cols) = (self.rows as usize, self.cols as usize);
        let mut out = vec![0.0f32; rows * cols];
        tc::decode(
            &self.spec,
            words,
            scales,
            rows,
            cols,
            mlx_core::cpu::available_threads(),
            &mut out,
        )
        .map_err(|problem| ModelError::Tensor {
            name: "trellis-coded weight".into(),
            problem: problem.to_string(),
        })?;
        Ok(Array::from_slice(&out, &[self.rows, self.cols])?)
    }

    /// The stored matrix on the process's decode path.
    pub fn decoded(&self) -> Result<Array> {
        match trellis_decode() {
            TrellisDecode::Reference => self.decode_reference(),
            TrellisDecode::Kernel => self.decode_kernel(),
        }
    }

    /// `x`'s last axis in Hadamard blocks of `block`: a product with the block's matrix.
    fn hadamard(x: &Array, block: usize) -> Result<Array> {
        let h = hadamard_array(block)?;
        let shape = x.shape();
        let n = *shape.last().unwrap_or(&0);
        let b = block as i32;
        let mut blocks = shape.clone();
        blocks.pop();
        blocks.push(n / b);
        blocks.push(b);
        Ok(ops::matmul(&x.reshape(&blocks)?, &h, None)?.reshape(&shape)?)
    }

    /// `x W^T` for the logical `W` (float32 inside, `x`'s dtype out). On the kernel path an
    /// input of at most [`FUSED_MAX_ROWS`] rows takes the fused decode-and-dot kernel.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        let xf = (&x.astype(Dtype::Float32)? * &self.sv)?;
        let xh = Self::hadamard(&xf, self.block_cols)?;
        let n_in = x.size() as i64 / i64::from(self.cols.max(1));
        let z = match pool() {
            Some(pool)
                if trellis_decode() == TrellisDecode::Kernel
                    && n_in <= i64::from(FUSED_MAX_ROWS) =>
            {
                self.fused(pool, &xh)?
            }
            _ => {
                let z = ops::matmul(&xh, &self.decoded()?.transpose_all()?, None)?;
                // The kernel's decoded matrix is a float32 copy of the whole weight: the
                // product is computed now, so that the matrix is freed before the next linear
                // decodes its own. Left lazy, a prompt's forward held every linear's at once
                // until its evaluation (issue #34). The plain-ops decode stays lazy (MLX frees
                // its intermediates as the graph runs).
                if trellis_decode() == TrellisDecode::Kernel {
                    z.eval()?;
                }
                z
            }
        };
        let y = (&Self::hadamard(&z, self.block_rows)? * &self.su)?;
        Ok(y.astype(x.dtype())?)
    }

    /// `xh Wt^T` by the fused kernel, `xh` the transformed input (float32, last axis `cols`).
    fn fused(&self, pool: &mlx_core::cpu::ThreadPool, xh: &Array) -> Result<Array> {
        let mut shape = xh.shape();
        xh.eval()?;
        let xs = xh.to_vec::<f32>()?;
        let words = self.weight.as_slice::<u32>()?;
        let scales = self.scales.astype(Dtype::Float32)?;
        scales.eval()?;
        let scales = scales.as_slice::<f32>()?;
        let (rows, cols) = (self.rows as usize, self.cols as usize);
        let mut out = vec![0.0f32; xs.len() / cols * rows];
        for (xr, yr) in xs.chunks_exact(cols).zip(out.chunks_exact_mut(rows)) {
            self.plan
                .par(pool, words, scales, xr, yr)
                .map_err(|problem| ModelError::Tensor {
                    name: "trellis-coded weight".into(),
                    problem: problem.to_string(),
                })?;
        }
        if let Some(last) = shape.last_mut() {
            *last = self.rows;
        }
        Ok(Array::from_slice(&out, &shape)?)
    }

    /// The logical (dequantized) matrix `diag(su) H_r Wt H_c diag(sv)`, float32.
    pub fn dequantize(&self) -> Result<Array> {
        let wt = self.decoded()?;
        let left = Self::hadamard(&wt.transpose_all()?, self.block_rows)?.transpose_all()?;
        let both = Self::hadamard(&left, self.block_cols)?;
        Ok((&(&both * &self.sv)? * &self.su.reshape(&[self.rows, 1])?)?)
    }
}

/// The normalized Hadamard matrix of `block` (`cpu::trellis::hadamard_matrix`, float32
/// `(block, block)`) as an MLX array, made on first use and shared by every trellis layer of
/// the process. Each layer held its own two before (made at load, up to 4096 x 4096 float32
/// each, in MLX's memory from the load on: issue #34's peak, results/gpu/2026-12-06-s37-trelpeak);
/// the distinct sizes are few (at most 13 blocks) and only the MLX forward makes them.
fn hadamard_array(block: usize) -> Result<Array> {
    static MATRICES: std::sync::Mutex<std::collections::BTreeMap<usize, Array>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let mut m = MATRICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = m.get(&block) {
        return Ok(h.clone());
    }
    let b = i32::try_from(block).map_err(|_| ModelError::Tensor {
        name: "trellis-coded weight".into(),
        problem: format!("a Hadamard block of {block}"),
    })?;
    let h = Array::from_slice(&tc::hadamard_matrix(block), &[b, b])?;
    m.insert(block, h.clone());
    Ok(h)
}

/// Trellis-quantizes a float `(rows, cols)` weight for the layer at `path` on `threads`
/// threads: `(weight uint32, scales float32 (rows, 1))`. With `hessian` (the `(cols, cols)`
/// second moment of the layer's inputs) the blocks are rounded by LDLQ
/// (`cpu::trellis::quantize_ldlq`), else by plain Viterbi with least-squares row scales.
pub fn quantize_trellis(
    w: &Array,
    path: &str,
    q: &QuantParams,
    t: &TrellisParams,
    threads: usize,
    hessian: Option<&Array>,
) -> Result<(Array, Array)> {
    let spec = q.trellis_spec(t);
    let shape = w.shape();
    if shape.len() != 2 {
        return Err(ModelError::Tensor {
            name: path.to_string(),
            problem: format!("a trellis weight must be a matrix, got shape {shape:?}"),
        });
    }
    let (rows, cols) = (shape[0], shape[1]);
    let wf = w.astype(Dtype::Float32)?;
    wf.eval()?;
    let seed = tc::layer_seed(t.seed, path);
    let (words, scales) = match hessian {
        None => tc::quantize(
            &spec,
            wf.as_slice::<f32>()?,
            rows as usize,
            cols as usize,
            seed,
            threads,
        ),
        Some(h) => {
            if h.shape() != [cols, cols] {
                return Err(ModelError::Tensor {
                    name: format!("{path}.hessian"),
                    problem: format!(
                        "shape {:?}, expected [{cols}, {cols}] (the layer's inputs)",
                        h.shape()
                    ),
                });
            }
            let hf = h.astype(Dtype::Float32)?;
            hf.eval()?;
            tc::quantize_ldlq(
                &spec,
                wf.as_slice::<f32>()?,
                rows as usize,
                cols as usize,
                seed,
                threads,
                hf.as_slice::<f32>()?,
            )
        }
    }
    .map_err(|m| ModelError::Unsupported {
        what: path.to_string(),
        problem: m.to_string(),
    })?;
    Ok((
        Array::from_slice(&words, &[rows, words_per_row(&spec, cols)])?,
        Array::from_slice(&scales, &[rows, 1])?,
    ))
}

/// How many sign seeds `mlx convert --q-mode trellis` tries for each linear when it is given
/// held-out Hessians (`--q-select-hessians`) and no `--q-seed-candidates`.
pub const SEED_CANDIDATES: usize = 4;

/// The most seeds `--q-seed-candidates` may ask for (each is one more encode of every linear).
pub const MAX_SEED_CANDIDATES: usize = 64;

/// One linear's seed choice ([`quantize_trellis_select`]): the kept codes and the errors.
#[derive(Debug)]
pub struct TrellisChoice {
    /// `uint32 (rows, cols * bits / 32)`: the kept candidate's words.
    pub weight: Array,
    /// `(rows, 1)`: its scales, in the stored dtype (as they were scored).
    pub scales: Array,
    /// The kept candidate's seed (the model-level seed the layer's entry records).
    pub seed: u64,
    /// Each candidate's held-out error `tr(E H E^T) / tr(W H W^T)` (`E` the decoded weight
    /// less the source), in the order of their seeds `t.seed, t.seed + 1, ...`.
    pub errors: Vec<f64>,
}

/// The output error of a decoded weight `deq` against its source `w` (both `(rows, cols)`
/// float32) under the second moment `h` (`(cols, cols)`): `tr(E H E^T) / tr(W H W^T)`, the
/// share of the layer's output energy on that text the coding error adds.
pub fn output_error(w: &Array, deq: &Array, h: &Array) -> Result<f64> {
    let e = (deq - w)?;
    let num = (&ops::matmul(&e, h, None)? * &e)?.sum_all(false)?;
    let den = (&ops::matmul(w, h, None)? * w)?.sum_all(false)?;
    mlx_core::eval([&num, &den])?;
    let (num, den) = (num.item::<f32>()?, den.item::<f32>()?);
    Ok(if den > 0.0 {
        f64::from(num) / f64::from(den)
    } else {
        f64::from(num)
    })
}

/// [`quantize_trellis`] under `candidates` sign seeds (`t.seed`, `t.seed + 1`, ...; each mixed
/// with `path` as every layer's seed is), keeping the candidate whose decoded weight (its
/// scales rounded to `scale_dtype`, as they will be stored) has the least [`output_error`]
/// under `select`, the second moment of the layer's inputs on HELD-OUT text (text that is
/// neither `hessian`'s calibration text nor an evaluation text). The seed's effect on a
/// layer's error is noise of the incoherence; LDLQ fits its calibration text, so only text it
/// did not see can rank the candidates (results/quant/2026-12-05-s31-trellis/). One candidate
/// is [`quantize_trellis`] itself (its seed is `t.seed`).
#[allow(clippy::too_many_arguments)]
pub fn quantize_trellis_select(
    w: &Array,
    path: &str,
    q: &QuantParams,
    t: &TrellisParams,
    threads: usize,
    hessian: Option<&Array>,
    select: &Array,
    candidates: usize,
    scale_dtype: Dtype,
) -> Result<TrellisChoice> {
    let shape = w.shape();
    let (rows, cols) = match shape.as_slice() {
        [r, c] => (*r, *c),
        _ => {
            return Err(ModelError::Tensor {
                name: path.to_string(),
                problem: format!("a trellis weight must be a matrix, got shape {shape:?}"),
            })
        }
    };
    if select.shape() != [cols, cols] {
        return Err(ModelError::Tensor {
            name: format!("{path}.hessian (held-out)"),
            problem: format!(
                "shape {:?}, expected [{cols}, {cols}] (the layer's inputs)",
                select.shape()
            ),
        });
    }
    let wf = w.astype(Dtype::Float32)?;
    let hs = select.astype(Dtype::Float32)?;
    mlx_core::eval([&wf, &hs])?;
    if hs.as_slice::<f32>()?.iter().any(|v| !v.is_finite()) {
        return Err(ModelError::Tensor {
            name: format!("{path}.hessian (held-out)"),
            problem: "holds a value that is not finite".into(),
        });
    }
    let mut best: Option<TrellisChoice> = None;
    let mut errors = Vec::with_capacity(candidates.max(1));
    for j in 0..candidates.max(1) as u64 {
        let tj = TrellisParams {
            seed: t.seed.wrapping_add(j),
            ..*t
        };
        let (words, scales) = quantize_trellis(w, path, q, &tj, threads, hessian)?;
        let scales = scales.astype(scale_dtype)?;
        let deq = TrellisWeight::new(
            words.clone(),
            scales.clone(),
            q.trellis_spec(&tj),
            tj,
            path,
            rows,
            cols,
        )?
        .dequantize()?;
        let e = output_error(&wf, &deq, &hs)?;
        errors.push(e);
        // A non-finite error (a NaN from a degenerate Hessian) ranks last, never first.
        let rank = |x: f64| if x.is_finite() { x } else { f64::INFINITY };
        if best.as_ref().is_none_or(|b| rank(e) < rank(b.errors[0])) {
            best = Some(TrellisChoice {
                weight: words,
                scales,
                seed: tj.seed,
                errors: vec![e],
            });
        }
    }
    let mut best = best.ok_or_else(|| ModelError::Internal {
        what: "trellis seed choice".into(),
        problem: "no candidate was coded".into(),
    })?;
    best.errors = errors;
    Ok(best)
}
