//! Flash attention, forward and backward, as a custom VJP over plain MLX ops.
//!
//! `q [B, Hq, L, D]`, `k [B, Hkv, S, D]`, `v [B, Hkv, S, Dv]` (grouped-query attention when
//! `Hkv < Hq`, `Hq % Hkv == 0`); query `i` sits at position `S - L + i` (the keys of earlier
//! segments or a cache come first, as with MLX's causal SDPA). [`FlashSpec`] says which keys a
//! query sees: all, the causal prefix, or a causal sliding window of `window` keys (mlx-lm's
//! `create_causal_mask(N, offset, window_size)`: `k <= q` and `q - k < window`).
//!
//! The forward pass runs over tiles of `block_q` queries and `block_k` keys with an online
//! softmax (running row maximum, row sum and output, all in float32; products in the inputs'
//! dtype), skipping tiles the mask empties; it keeps only the output and the log-sum-exp of each
//! row. The backward pass recomputes each tile's probabilities from that log-sum-exp
//! (`p = exp(s - lse)`, `ds = p * (dp - rowsum(do * o))`) and accumulates `dq`, `dk`, `dv`
//! tile by tile. No `[L, S]` score matrix is ever materialised, in either pass.
//!
//! [`attention_reference`] is the materialised attention (scores, mask, precise softmax,
//! product), bit-equal on CPU to MLX's own SDPA (what mlx-lm calls) with a causal, no or
//! sliding-window mask. Tier of flash attention against it: L3. The summation order differs
//! (per-tile partial sums, rescaled), so flash attention is within a stated bound of it, not
//! bit-equal: in float32 on CPU the output is within [`FWD_REL_BOUND`] and the gradients within
//! [`GRAD_REL_BOUND`] of the reference's (relative to each tensor's largest magnitude;
//! `tests/flash_attention.rs`, which also checks the gradients against central finite
//! differences). With one tile (`block_q >= L`, `block_k >= S`) it is still not the
//! reference's bits: the softmax is normalised after the product with `v`.
//!
//! This plain-ops path runs on every back-end. [`flash_attention_with`] with [`Path::Fused`]
//! runs the same custom VJP over the CUDA kernels of [`crate::flash_cuda`] instead (bounds
//! there).

use mlx_core::prelude::*;
use mlx_core::transforms::{custom_vjp, Function};

pub use crate::flash_spec::FlashSpec;
use crate::{check_float, check_same_dtype, flash_cuda, invalid, Path};

const OP: &str = "flash_attention";

/// Output bound against [`attention_reference`] in float32: `max|flash - ref| <= FWD_REL_BOUND
/// * max|ref|` (measured on CPU over the test cases: at most 3.0e-7).
pub const FWD_REL_BOUND: f32 = 1e-6;
/// Gradient bound against the reference's gradients in float32, per input, relative to the
/// largest magnitude of the reference gradient (measured on CPU: at most 4.6e-7).
pub const GRAD_REL_BOUND: f32 = 2e-6;

struct Dims {
    b: i32,
    hq: i32,
    hkv: i32,
    l: i32,
    s: i32,
    d: i32,
    dv: i32,
}

impl Dims {
    fn groups(&self) -> i32 {
        self.hq / self.hkv
    }
    fn offset(&self) -> i32 {
        self.s - self.l
    }
}

fn validate(q: &Array, k: &Array, v: &Array, spec: &FlashSpec) -> Result<Dims> {
    for (name, a) in [("queries", q), ("keys", k), ("values", v)] {
        if a.ndim() != 4 {
            return Err(invalid(
                OP,
                format!(
                    "{name} must be 4-D [batch, heads, length, head_dim], got shape {:?}",
                    a.shape()
                ),
            ));
        }
        check_float(OP, name, a)?;
    }
    check_same_dtype(OP, "keys", k, "queries", q)?;
    check_same_dtype(OP, "values", v, "queries", q)?;
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let dims = Dims {
        b: qs[0],
        hq: qs[1],
        hkv: ks[1],
        l: qs[2],
        s: ks[2],
        d: qs[3],
        dv: vs[3],
    };
    if ks[0] != dims.b || vs[0] != dims.b {
        return Err(invalid(
            OP,
            format!(
                "batch sizes differ: queries {:?}, keys {ks:?}, values {vs:?}",
                qs
            ),
        ));
    }
    if ks[3] != dims.d {
        return Err(invalid(
            OP,
            format!(
                "keys' head_dim {} differs from the queries' {}",
                ks[3], dims.d
            ),
        ));
    }
    if vs[1] != dims.hkv || vs[2] != dims.s {
        return Err(invalid(
            OP,
            format!("values {vs:?} do not match keys {ks:?} in heads and length"),
        ));
    }
    if dims.hkv == 0 || dims.hq % dims.hkv != 0 {
        return Err(invalid(
            OP,
            format!(
                "query heads ({}) must be a multiple of key/value heads ({})",
                dims.hq, dims.hkv
            ),
        ));
    }
    if dims.l == 0 || dims.s == 0 {
        return Err(invalid(OP, "queries and keys must be non-empty"));
    }
    if spec.block_q <= 0 || spec.block_k <= 0 {
        return Err(invalid(
            OP,
            format!(
                "block sizes must be positive, got block_q={} block_k={}",
                spec.block_q, spec.block_k
            ),
        ));
    }
    if !spec.scale.is_finite() {
        return Err(invalid(
            OP,
            format!("scale must be finite, got {}", spec.scale),
        ));
    }
    if spec.causal && dims.l > dims.s {
        return Err(invalid(
            OP,
            format!(
                "causal attention needs at least as many keys ({}) as queries ({})",
                dims.s, dims.l
            ),
        ));
    }
    match spec.window {
        Some(w) if w <= 0 => {
            return Err(invalid(OP, format!("window must be positive, got {w}")));
        }
        Some(_) if !spec.causal => {
            return Err(invalid(OP, "a sliding window needs causal attention"));
        }
        _ => {}
    }
    Ok(dims)
}

/// One tile of queries `[qs, qe)` and the key tiles `[ks, ke)` it needs, with whether the tile
/// needs a mask.
fn key_tiles(spec: &FlashSpec, dims: &Dims, qs: i32, qe: i32) -> Vec<(i32, i32, bool)> {
    let off = dims.offset();
    let (first, last) = (qs + off, qe - 1 + off); // positions of the tile's first and last query
    let lo = match spec.window {
        Some(w) => (first - w + 1).max(0),
        None => 0,
    };
    let hi = if spec.causal { last + 1 } else { dims.s };
    let lo = lo - lo % spec.block_k;
    let mut out = Vec::new();
    let mut ks = lo;
    while ks < hi {
        let ke = (ks + spec.block_k).min(hi);
        let causal_cut = spec.causal && ke - 1 > first;
        let window_cut = spec.window.is_some_and(|w| ks < last - w + 1);
        out.push((ks, ke, causal_cut || window_cut));
        ks = ke;
    }
    out
}

/// `[qe - qs, ke - ks]` booleans: which keys each query of the tile sees.
fn tile_mask(spec: &FlashSpec, dims: &Dims, qs: i32, qe: i32, ks: i32, ke: i32) -> Result<Array> {
    let off = dims.offset();
    let qpos = ops::arange(
        f64::from(qs + off),
        f64::from(qe + off),
        1.0,
        Dtype::Int32,
        None,
    )?
    .reshape(&[qe - qs, 1])?;
    let kpos = ops::arange(f64::from(ks), f64::from(ke), 1.0, Dtype::Int32, None)?
        .reshape(&[1, ke - ks])?;
    let mut m = kpos.less_equal(&qpos)?;
    if let Some(w) = spec.window {
        let start = kpos.add_scalar(w)?;
        m = m.logical_and(&qpos.less(&start)?)?;
    }
    Ok(m)
}

/// The tile's scores `(q * scale) @ k^T` in float32, masked with the lowest float32.
fn tile_scores(
    spec: &FlashSpec,
    dims: &Dims,
    qb: &Array,
    kb: &Array,
    tile: (i32, i32, i32, i32, bool),
) -> Result<Array> {
    let (qs, qe, ks, ke, masked) = tile;
    let s = qb.matmul(&kb.swapaxes(-1, -2)?)?.astype(Dtype::Float32)?;
    if !masked {
        return Ok(s);
    }
    let m = tile_mask(spec, dims, qs, qe, ks, ke)?;
    let low = Array::from_f32(f32::MIN, Dtype::Float32)?;
    ops::where_(&m, &s, &low, None)
}

/// `[B, Hq, L, X]` -> `[B, Hkv, G, L, X]`.
fn group(a: &Array, dims: &Dims) -> Result<Array> {
    let x = a.dim(3)?;
    a.reshape(&[dims.b, dims.hkv, dims.groups(), a.dim(2)?, x])
}

fn add(acc: Option<Array>, x: Array) -> Result<Array> {
    match acc {
        None => Ok(x),
        Some(a) => &a + &x,
    }
}

fn q_tiles(spec: &FlashSpec, dims: &Dims) -> Vec<(i32, i32)> {
    (0..dims.l)
        .step_by(spec.block_q as usize)
        .map(|s| (s, (s + spec.block_q).min(dims.l)))
        .collect()
}

/// The forward pass: `(output [B, Hq, L, Dv], lse [B, Hkv, G, L, 1] float32)`.
fn forward(
    q: &Array,
    k: &Array,
    v: &Array,
    spec: &FlashSpec,
    dims: &Dims,
) -> Result<(Array, Array)> {
    let q5 = group(&q.multiply_scalar(spec.scale)?, dims)?;
    let k5 = k.expand_dims(&[2])?;
    let v5 = v.expand_dims(&[2])?;
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for (qs, qe) in q_tiles(spec, dims) {
        let qb = q5.slice_axis(3, qs, qe)?;
        let mut state: Option<(Array, Array, Array)> = None; // (m, l, o)
        for (ks, ke, masked) in key_tiles(spec, dims, qs, qe) {
            let kb = k5.slice_axis(3, ks, ke)?;
            let vb = v5.slice_axis(3, ks, ke)?;
            let s = tile_scores(spec, dims, &qb, &kb, (qs, qe, ks, ke, masked))?;
            let bmax = s.max(&[-1], true)?;
            let m_new = match &state {
                None => bmax,
                Some((m, _, _)) => m.maximum(&bmax)?,
            };
            let p = (&s - &m_new)?.exp()?;
            let rs = p.sum(&[-1], true)?;
            let pv = p.astype(v.dtype())?.matmul(&vb)?.astype(Dtype::Float32)?;
            state = Some(match state {
                None => (m_new, rs, pv),
                Some((m, l, o)) => {
                    let alpha = (&m - &m_new)?.exp()?;
                    let l = (&(&l * &alpha)? + &rs)?;
                    let o = (&(&o * &alpha)? + &pv)?;
                    (m_new, l, o)
                }
            });
        }
        let (m, l, o) = state.ok_or_else(|| invalid(OP, "a query tile saw no keys"))?;
        outs.push((&o / &l)?.astype(q.dtype())?);
        lses.push((&m + &l.log()?)?);
    }
    let out = ops::concatenate(&outs.iter().collect::<Vec<_>>(), 3, None)?;
    let lse = ops::concatenate(&lses.iter().collect::<Vec<_>>(), 3, None)?;
    Ok((out.reshape(&[dims.b, dims.hq, dims.l, dims.dv])?, lse))
}

/// The backward pass: `(dq, dk, dv)` from the output's cotangent `dout`.
#[allow(clippy::too_many_arguments)]
fn backward(
    q: &Array,
    k: &Array,
    v: &Array,
    out: &Array,
    lse: &Array,
    dout: &Array,
    spec: &FlashSpec,
    dims: &Dims,
) -> Result<Vec<Array>> {
    let dt = q.dtype();
    let q5 = group(&q.multiply_scalar(spec.scale)?, dims)?;
    let k5 = k.expand_dims(&[2])?;
    let v5 = v.expand_dims(&[2])?;
    let do5 = group(&dout.astype(dt)?, dims)?;
    let delta = (&do5.astype(Dtype::Float32)? * &group(out, dims)?.astype(Dtype::Float32)?)?
        .sum(&[-1], true)?;
    let nk = (dims.s + spec.block_k - 1) / spec.block_k;
    let mut dks: Vec<Option<Array>> = vec![None; nk as usize];
    let mut dvs: Vec<Option<Array>> = vec![None; nk as usize];
    let mut dqs = Vec::new();
    for (qs, qe) in q_tiles(spec, dims) {
        let qb = q5.slice_axis(3, qs, qe)?;
        let dob = do5.slice_axis(3, qs, qe)?;
        let lb = lse.slice_axis(3, qs, qe)?;
        let db = delta.slice_axis(3, qs, qe)?;
        let mut dq: Option<Array> = None;
        for (ks, ke, masked) in key_tiles(spec, dims, qs, qe) {
            let kb = k5.slice_axis(3, ks, ke)?;
            let vb = v5.slice_axis(3, ks, ke)?;
            let s = tile_scores(spec, dims, &qb, &kb, (qs, qe, ks, ke, masked))?;
            let p = (&s - &lb)?.exp()?;
            let pt = p.astype(dt)?.swapaxes(-1, -2)?;
            let dvb = pt.matmul(&dob)?.astype(Dtype::Float32)?.sum(&[2], false)?;
            let dp = dob.matmul(&vb.swapaxes(-1, -2)?)?.astype(Dtype::Float32)?;
            let ds = (&p * &(&dp - &db)?)?.astype(dt)?;
            let dqb = ds.matmul(&kb)?.astype(Dtype::Float32)?;
            let dkb = ds
                .swapaxes(-1, -2)?
                .matmul(&qb)?
                .astype(Dtype::Float32)?
                .sum(&[2], false)?;
            dq = Some(add(dq, dqb)?);
            // Key tiles start on multiples of block_k, so `j` indexes the tile exactly.
            let j = (ks / spec.block_k) as usize;
            let (dkj, dvj) = (dks[j].take(), dvs[j].take());
            dks[j] = Some(add_partial(dkj, dkb)?);
            dvs[j] = Some(add_partial(dvj, dvb)?);
        }
        let dq = dq.ok_or_else(|| invalid(OP, "a query tile saw no keys"))?;
        dqs.push(dq.multiply_scalar(spec.scale)?);
    }
    let dq = ops::concatenate(&dqs.iter().collect::<Vec<_>>(), 3, None)?
        .reshape(&[dims.b, dims.hq, dims.l, dims.d])?
        .astype(dt)?;
    let full = |parts: Vec<Option<Array>>, width: i32| -> Result<Array> {
        let mut tiles = Vec::with_capacity(parts.len());
        for (j, p) in parts.into_iter().enumerate() {
            let ks = j as i32 * spec.block_k;
            let len = (ks + spec.block_k).min(dims.s) - ks;
            tiles.push(match p {
                Some(a) => pad_rows(a, len)?,
                None => ops::zeros(&[dims.b, dims.hkv, len, width], Dtype::Float32, None)?,
            });
        }
        ops::concatenate(&tiles.iter().collect::<Vec<_>>(), 2, None)?.astype(dt)
    };
    Ok(vec![dq, full(dks, dims.d)?, full(dvs, dims.dv)?])
}

/// Adds a key tile's partial gradient `[B, Hkv, n, X]` to the accumulator of its block. Every
/// tile of a block starts at the block's start; a causal limit can end one early (a query tile
/// sees fewer of the block's keys than a later one does), so the shorter is zero-padded.
fn add_partial(acc: Option<Array>, x: Array) -> Result<Array> {
    match acc {
        None => Ok(x),
        Some(a) => {
            let (na, nx) = (a.dim(2)?, x.dim(2)?);
            let n = na.max(nx);
            &pad_rows(a, n)? + &pad_rows(x, n)?
        }
    }
}

/// Zero-pads axis 2 of `a` to `n` rows.
fn pad_rows(a: Array, n: i32) -> Result<Array> {
    let have = a.dim(2)?;
    if have == n {
        return Ok(a);
    }
    let mut shape = a.shape();
    shape[2] = n - have;
    let z = ops::zeros(&shape, a.dtype(), None)?;
    ops::concatenate(&[&a, &z], 2, None)
}

/// Flash attention (see the module docs) on the plain-ops path: the output `[B, Hq, L, Dv]`,
/// differentiable through its own backward pass. The same as [`flash_attention_with`] with
/// [`Path::Reference`].
pub fn flash_attention(q: &Array, k: &Array, v: &Array, spec: FlashSpec) -> Result<Array> {
    flash_attention_with(q, k, v, spec, Path::Reference)
}

/// Flash attention on the chosen [`Path`]: [`Path::Reference`] is the tiled plain-ops graph
/// (every back-end; `block_q`/`block_k` are its tiles), [`Path::Fused`] the CUDA kernels of
/// [`crate::flash_cuda`] for the forward pass and the backward pass (their own tiles; head dims
/// as [`crate::flash_cuda`] states). Both are one custom VJP with the same interface.
pub fn flash_attention_with(
    q: &Array,
    k: &Array,
    v: &Array,
    spec: FlashSpec,
    path: Path,
) -> Result<Array> {
    validate(q, k, v, &spec)?;
    if path == Path::Fused {
        flash_cuda::check(q, k, v)?;
    }
    let f = flash_function(spec, path)?;
    let mut outs = f.call(&[q.clone(), k.clone(), v.clone()])?;
    if outs.is_empty() {
        return Err(invalid(OP, "the custom function returned nothing"));
    }
    Ok(outs.swap_remove(0))
}

/// The custom-VJP function `[q, k, v] -> [out, lse]` on `path`.
fn flash_function(spec: FlashSpec, path: Path) -> Result<Function> {
    custom_vjp(
        move |xs: &[Array]| {
            let [q, k, v] = xs else {
                return Err(invalid(OP, "expected queries, keys and values"));
            };
            let dims = validate(q, k, v, &spec)?;
            let (out, lse) = match path {
                Path::Reference => forward(q, k, v, &spec, &dims)?,
                Path::Fused => flash_cuda::forward(q, k, v, &spec)?,
            };
            Ok(vec![out, lse])
        },
        move |primals: &[Array], cotangents: &[Array], outputs: &[Array]| {
            let ([q, k, v], [dout, ..], [out, lse]) = (primals, cotangents, outputs) else {
                return Err(invalid(OP, "unexpected arity in the backward pass"));
            };
            let dims = validate(q, k, v, &spec)?;
            match path {
                Path::Reference => backward(q, k, v, out, lse, dout, &spec, &dims),
                Path::Fused => flash_cuda::backward(q, k, v, out, lse, dout, &spec),
            }
        },
    )
}

/// The materialised attention: `softmax((q * scale) @ k^T + mask, precise) @ v`, with GQA by
/// grouping the queries per key/value head: MLX's SDPA (bit for bit on CPU).
pub fn attention_reference(q: &Array, k: &Array, v: &Array, spec: FlashSpec) -> Result<Array> {
    let dims = validate(q, k, v, &spec)?;
    let q5 = group(&q.multiply_scalar(spec.scale)?, &dims)?;
    let k5 = k.expand_dims(&[2])?;
    let v5 = v.expand_dims(&[2])?;
    let mut s = q5.matmul(&k5.swapaxes(-1, -2)?)?;
    if spec.causal {
        let m = tile_mask(&spec, &dims, 0, dims.l, 0, dims.s)?;
        let low = Array::from_f32(f32::MIN, s.dtype())?;
        s = ops::where_(&m, &s, &low, None)?;
    }
    let p = s.softmax(&[-1], true)?;
    p.matmul(&v5)?.reshape(&[dims.b, dims.hq, dims.l, dims.dv])
}
