//! Prompt-block attention: causal (optionally sliding-window) attention of a block of
//! [`PROMPT_MIN_M`] or more query rows over a cache, as matrix products (AVX-512), the
//! prefill side of [`super::attention`].
//!
//! [`super::attention`] takes each query row alone (a decode step's kernel: one dot product
//! and one horizontal sum a key and head). Here the keys of each KV head are first
//! transposed once a call into blocks of 16 positions (`(hd, 16)` floats each, float16 caches
//! widened), then each work item takes a tile of [`QN`] query vectors (consecutive rows'
//! heads of one KV head's group) and computes its scores against two key blocks at a time
//! (`QN x 32` accumulators, one broadcast FMA a query and dimension), the softmax over each
//! row's causal window in two passes (the maximum, then `exp` and the sum: no running
//! rescale), and the weighted values (`QN x 32` dimensions a pass, one FMA a query and
//! value vector).
//!
//! Tier L3 against the plain reference (scores, softmax and weighted sum in float64 on the
//! same inputs): bound `1e-5` absolute on outputs of magnitude <= 1 as
//! `tests/cpu_kernels.rs`'s attention tests state it against MLX's SDPA (float32 sums in
//! another order, `exp` to a few ulps). Unlike [`super::attention`] a row's bits depend on
//! coming in a block: the CPU decoder calls this for prompt blocks only (`Rows::Block`),
//! never for decode steps or speculative verification, whose rows must equal rows alone.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use half::f16;

use super::ops::AttentionShape;
use super::{CpuContext, Isa, SharedOut};
use crate::{Error, Result};

/// The fewest query rows a call takes here (fewer: [`super::attention`]).
pub const PROMPT_MIN_M: usize = 16;
/// Query vectors a tile (one work item).
const QN: usize = 8;
/// Positions a key block.
const KB: usize = 16;

thread_local! {
    /// The caller's transposed keys.
    static KT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A worker's scores (`QN` rows of the longest window).
    static SC: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Hands back the calling thread's transposed keys (see [`super::release_prompt_buffers`]).
pub(super) fn release_prompt_keys() {
    KT.with(|kt| *kt.borrow_mut() = Vec::new());
}

/// A cached value widened to float32, 16 at a time.
pub(super) trait Widen16: Copy + Send + Sync {
    /// # Safety
    /// AVX-512 F; 16 values readable at `p`.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Widen16 for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Widen16 for f16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller's contract (16 halves are 32 bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

/// Whether a call of `m` rows and head width `hd` takes these kernels.
pub fn prompt_applies(ctx: &CpuContext, m: usize, hd: usize) -> bool {
    ctx.isa == Isa::Avx512 && m >= PROMPT_MIN_M && hd % 16 == 0 && hd <= super::MAX_HEAD_DIM
}

/// As [`super::attention`] for a prompt block of `m` rows at `start..start + m`, each row
/// over the positions `[max(0, pos + 1 - window), pos]` (`window`: a sliding layer's width;
/// `None`: all of them). Falls back to [`super::attention`] where [`prompt_applies`] does
/// not hold (with a window, an error there: the caller handles windows itself then).
#[allow(clippy::too_many_arguments)]
pub fn attention_prompt(
    ctx: &CpuContext,
    s: AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    start: usize,
    m: usize,
    window: Option<usize>,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    if !prompt_applies(ctx, m, s.head_dim) {
        no_window_reached("cpu::attention_prompt", window, start, m)?;
        return super::attention(ctx, s, q, k, v, start, m, scale, out);
    }
    prompt_impl(ctx, s, q, k, v, start, m, window, scale, out)
}

/// The plain kernels the calls fall back to take no window: a fallback call whose rows reach
/// past one is an error, not a silently wider attention.
fn no_window_reached(
    op: &'static str,
    window: Option<usize>,
    start: usize,
    m: usize,
) -> Result<()> {
    if window.is_some_and(|w| start + m > w) {
        return Err(Error::invalid(
            op,
            "a window on a call these kernels do not take",
        ));
    }
    Ok(())
}

/// [`attention_prompt`] over a float16 cache (each value widened exactly).
#[allow(clippy::too_many_arguments)]
pub fn attention_prompt_f16(
    ctx: &CpuContext,
    s: AttentionShape,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    start: usize,
    m: usize,
    window: Option<usize>,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    if !prompt_applies(ctx, m, s.head_dim) {
        no_window_reached("cpu::attention_prompt_f16", window, start, m)?;
        return super::attention_f16(ctx, s, q, k, v, start, m, scale, out);
    }
    prompt_impl(ctx, s, q, k, v, start, m, window, scale, out)
}

#[allow(clippy::too_many_arguments)]
fn prompt_impl<E: Widen16>(
    ctx: &CpuContext,
    s: AttentionShape,
    q: &[f32],
    k: &[E],
    v: &[E],
    start: usize,
    m: usize,
    window: Option<usize>,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    let op = "cpu::attention_prompt";
    let hd = s.head_dim;
    let cache = s.n_kv_heads * s.capacity * hd;
    if s.n_kv_heads == 0
        || s.n_heads % s.n_kv_heads != 0
        || start + m > s.capacity
        || window == Some(0)
        || q.len() != m * s.n_heads * hd
        || out.len() != q.len()
        || k.len() != cache
        || v.len() != cache
    {
        return Err(Error::invalid(
            op,
            format!(
                "bad shape {s:?} for {start}+{m} (q {}, out {}, k {}, v {})",
                q.len(),
                out.len(),
                k.len(),
                v.len()
            ),
        ));
    }
    let (nkv, group) = (s.n_kv_heads, s.n_heads / s.n_kv_heads);
    let total = start + m;
    // The first position any row reads.
    let lo0 = window.map_or(0, |w| (start + 1).saturating_sub(w));
    let (b0, b1) = (lo0 / KB, total.div_ceil(KB));
    let blocks = b1 - b0;
    let kt_len = nkv * blocks * hd * KB;
    KT.with(|kt| {
        let mut kt = kt.borrow_mut();
        if kt.len() < kt_len {
            kt.resize(kt_len, 0.0);
        }
        let kt = &mut kt[..kt_len];
        // Pass 1: each (KV head, key block) transposed.
        let shared = SharedOut::new(kt);
        let next = AtomicUsize::new(0);
        ctx.pool.run(&|_, _| loop {
            let it = next.fetch_add(1, Ordering::Relaxed);
            if it >= nkv * blocks {
                break;
            }
            let (kvh, b) = (it / blocks, it % blocks);
            let p0 = (b0 + b) * KB;
            let n = (total - p0).min(KB);
            // SAFETY: item `it` owns its hd * KB floats; positions p0..p0 + n < capacity of
            // head kvh lie in `k` (checked above); AVX-512 checked by `prompt_applies`.
            unsafe {
                let dst = shared.range(it * hd * KB, hd * KB);
                transpose_block(k[(kvh * s.capacity + p0) * hd..].as_ptr(), n, hd, dst);
            }
        });
        // Pass 2: tiles of QN query vectors of one KV head.
        let tiles = (m * group).div_ceil(QN);
        let o = SharedOut::new(out);
        let kt = &*kt;
        let next = AtomicUsize::new(0);
        ctx.pool.run(&|_, _| {
            SC.with(|sc| {
                let mut sc = sc.borrow_mut();
                let need = QN * (blocks * KB);
                if sc.len() < need {
                    sc.resize(need, 0.0);
                }
                loop {
                    let it = next.fetch_add(1, Ordering::Relaxed);
                    if it >= nkv * tiles {
                        break;
                    }
                    let (kvh, tile) = (it / tiles, it % tiles);
                    let v0 = tile * QN;
                    let nq = (m * group - v0).min(QN);
                    // Query vector j of the tile: row (v0 + j) / group, head kvh * group +
                    // (v0 + j) % group; its positions [lo, hi).
                    let mut qp = [std::ptr::null::<f32>(); QN];
                    let mut span = [(0usize, 0usize); QN];
                    for j in 0..QN {
                        let jj = v0 + j.min(nq - 1);
                        let (t, gi) = (jj / group, jj % group);
                        qp[j] = q[(t * s.n_heads + kvh * group + gi) * hd..].as_ptr();
                        let pos = start + t;
                        let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                        span[j] = (lo, pos + 1);
                    }
                    let kth = &kt[kvh * blocks * hd * KB..(kvh + 1) * blocks * hd * KB];
                    let vh = &v[kvh * s.capacity * hd..(kvh + 1) * s.capacity * hd];
                    // SAFETY: AVX-512 checked by `prompt_applies`; the scores hold QN rows of
                    // blocks * KB; every span lies within [b0 * KB, total) and the
                    // transposed blocks cover it; the tile's output vectors are this item's
                    // alone (distinct query vectors).
                    unsafe {
                        let scp = sc.as_mut_ptr();
                        let stride = blocks * KB;
                        tile_kernel(&qp, &span, kth, hd, b0 * KB, stride, scale, scp);
                        let mut dst = [std::ptr::null_mut::<f32>(); QN];
                        for (j, d) in dst.iter_mut().enumerate().take(nq) {
                            let jj = v0 + j;
                            let (t, gi) = (jj / group, jj % group);
                            let r = o.range((t * s.n_heads + kvh * group + gi) * hd, hd);
                            *d = r.as_mut_ptr();
                        }
                        weighted_tile(&span, scp, stride, vh, hd, b0 * KB, &dst, nq);
                    }
                }
            })
        });
    });
    Ok(())
}

/// `n <= KB` keys of `hd` values at `k` into `dst` as `(hd, KB)` (zero past `n`).
///
/// # Safety
/// AVX-512 F; `k` holds `n * hd` values, `dst` `hd * KB` floats, `hd % 16 == 0`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn transpose_block<E: Widen16>(k: *const E, n: usize, hd: usize, dst: &mut [f32]) {
    assert!(dst.len() == hd * KB && n <= KB, "transpose_block sizes");
    if n < KB {
        dst.fill(0.0);
    }
    let mut tmp = [0f32; 16];
    // SAFETY: within the ranges of the contract.
    unsafe {
        for j in 0..n {
            for c in 0..hd / 16 {
                _mm512_storeu_ps(tmp.as_mut_ptr(), E::load16(k.add(j * hd + 16 * c)));
                for (e, &x) in tmp.iter().enumerate() {
                    *dst.get_unchecked_mut((16 * c + e) * KB + j) = x;
                }
            }
        }
    }
}

/// The tile's scores: `sc[j][p - base] = scale * q_j . k_p` for the positions of every
/// block touching the tile's spans (two blocks a pass), then each row's softmax numerators
/// over its own span (`exp(s - max)`), zero elsewhere in those blocks.
///
/// Row `j` of `sc` (stride `stride`) holds position `base + i` at `i`.
///
/// # Safety
/// AVX-512 F; `kt` holds the transposed blocks from `base` on (`(hd, KB)` each) covering
/// every span; `sc` `QN * stride` floats; `hd % 16 == 0`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn tile_kernel(
    qp: &[*const f32; QN],
    span: &[(usize, usize); QN],
    kt: &[f32],
    hd: usize,
    base: usize,
    stride: usize,
    scale: f32,
    sc: *mut f32,
) {
    let lo = span.iter().map(|s| s.0).min().unwrap_or(0);
    let hi = span.iter().map(|s| s.1).max().unwrap_or(0);
    let (bl, bh) = ((lo - base) / KB, (hi - base).div_ceil(KB));
    let sv = _mm512_set1_ps(scale);
    // SAFETY: within the ranges of the contract.
    unsafe {
        let mut b = bl;
        while b < bh {
            let two = b + 1 < bh;
            let k0 = kt.as_ptr().add(b * hd * KB);
            let k1 = if two { k0.add(hd * KB) } else { k0 };
            let mut a0 = [_mm512_setzero_ps(); QN];
            let mut a1 = [_mm512_setzero_ps(); QN];
            for d in 0..hd {
                let x0 = _mm512_loadu_ps(k0.add(d * KB));
                let x1 = _mm512_loadu_ps(k1.add(d * KB));
                for j in 0..QN {
                    let qv = _mm512_set1_ps(*qp[j].add(d));
                    a0[j] = _mm512_fmadd_ps(qv, x0, a0[j]);
                    a1[j] = _mm512_fmadd_ps(qv, x1, a1[j]);
                }
            }
            for j in 0..QN {
                let row = sc.add(j * stride + b * KB);
                _mm512_storeu_ps(row, _mm512_mul_ps(a0[j], sv));
                if two {
                    _mm512_storeu_ps(row.add(KB), _mm512_mul_ps(a1[j], sv));
                }
            }
            b += if two { 2 } else { 1 };
        }
        // Softmax numerators over each row's span; zero elsewhere in the computed blocks.
        for (j, &(l, h)) in span.iter().enumerate() {
            let row = sc.add(j * stride);
            let (i0, i1) = (l - base, h - base);
            let mut mx = f32::NEG_INFINITY;
            for i in i0..i1 {
                mx = mx.max(*row.add(i));
            }
            for i in bl * KB..i0 {
                *row.add(i) = 0.0;
            }
            for i in i1..bh * KB {
                *row.add(i) = 0.0;
            }
            let mv = _mm256_set1_ps(mx);
            let mut i = i0;
            while i + 8 <= i1 {
                let e = super::x86::exp8(_mm256_sub_ps(_mm256_loadu_ps(row.add(i)), mv));
                _mm256_storeu_ps(row.add(i), e);
                i += 8;
            }
            while i < i1 {
                *row.add(i) = (*row.add(i) - mx).exp();
                i += 1;
            }
        }
    }
}

/// The tile's outputs: `out_j = sum_p w_jp v_p / sum_p w_jp` over each row's span, `w` the
/// numerators from [`tile_kernel`] (row `j` at `w + j * stride`, position `base + i` at
/// `i`, zero outside the span within the blocks it computed), `QN` rows times 32 dimensions
/// a pass (one FMA a row and value vector).
///
/// # Safety
/// AVX-512 F; `w` as said; `v` holds every span's positions (`hd` values each); `out[j]`
/// is `hd` writable floats for `j < nq`; `hd % 16 == 0`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weighted_tile<E: Widen16>(
    span: &[(usize, usize); QN],
    w: *const f32,
    stride: usize,
    v: &[E],
    hd: usize,
    base: usize,
    out: &[*mut f32; QN],
    nq: usize,
) {
    let lo = span.iter().map(|s| s.0).min().unwrap_or(0);
    let hi = span.iter().map(|s| s.1).max().unwrap_or(0);
    assert!(hi * hd <= v.len() && lo >= base, "weighted_tile sizes");
    // SAFETY: within the ranges of the contract.
    unsafe {
        let mut inv = [0f32; QN];
        for (j, &(l, h)) in span.iter().enumerate() {
            let mut sum = 0f32;
            for p in l..h {
                sum += *w.add(j * stride + p - base);
            }
            inv[j] = 1.0 / sum;
        }
        let mut d = 0;
        while d < hd {
            let two = d + 32 <= hd;
            let mut a0 = [_mm512_setzero_ps(); QN];
            let mut a1 = [_mm512_setzero_ps(); QN];
            for p in lo..hi {
                let vp = v.as_ptr().add(p * hd + d);
                let x0 = E::load16(vp);
                let x1 = if two { E::load16(vp.add(16)) } else { x0 };
                for j in 0..QN {
                    let wp = _mm512_set1_ps(*w.add(j * stride + p - base));
                    a0[j] = _mm512_fmadd_ps(wp, x0, a0[j]);
                    a1[j] = _mm512_fmadd_ps(wp, x1, a1[j]);
                }
            }
            for j in 0..nq {
                let iv = _mm512_set1_ps(inv[j]);
                _mm512_storeu_ps(out[j].add(d), _mm512_mul_ps(a0[j], iv));
                if two {
                    _mm512_storeu_ps(out[j].add(d + 16), _mm512_mul_ps(a1[j], iv));
                }
            }
            d += if two { 32 } else { 16 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_rng::Lcg;
    use super::*;

    /// The plain reference in float64: each row over its window, softmax, weighted sum.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        s: AttentionShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        start: usize,
        m: usize,
        window: Option<usize>,
        scale: f32,
    ) -> Vec<f64> {
        let hd = s.head_dim;
        let group = s.n_heads / s.n_kv_heads;
        let mut out = vec![0f64; m * s.n_heads * hd];
        for t in 0..m {
            let pos = start + t;
            let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            for h in 0..s.n_heads {
                let base = (h / group) * s.capacity * hd;
                let qv = &q[(t * s.n_heads + h) * hd..][..hd];
                let sc: Vec<f64> = (lo..=pos)
                    .map(|p| {
                        let kr = &k[base + p * hd..][..hd];
                        let d: f64 = qv.iter().zip(kr).map(|(a, b)| f64::from(a * b)).sum();
                        d * f64::from(scale)
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let l: f64 = e.iter().sum();
                let o = &mut out[(t * s.n_heads + h) * hd..][..hd];
                for (i, p) in (lo..=pos).enumerate() {
                    let vr = &v[base + p * hd..][..hd];
                    for (a, b) in o.iter_mut().zip(vr) {
                        *a += e[i] / l * f64::from(*b);
                    }
                }
            }
        }
        out
    }

    /// Tier L3: within 1e-5 of the float64 reference (outputs of magnitude <= 1), float32
    /// and float16 caches (the reference fed the widened halves), Gemma 3's and SmolLM2's
    /// head layouts, a head width with a 16-wide tail, blocks at the start and deep in the
    /// cache, tails of the query tiles, and sliding windows that cut into the block.
    #[test]
    fn prompt_attention_matches_the_plain_reference() {
        let ctx = CpuContext::new(2).unwrap();
        if ctx.isa != Isa::Avx512 {
            return;
        }
        let mut g = Lcg(3);
        for (nh, nkv, hd, cap, start, m, window) in [
            (4usize, 1usize, 256usize, 600usize, 0usize, 32usize, None),
            (4, 1, 256, 600, 510, 32, Some(512usize)),
            (9, 3, 64, 300, 200, 17, None),
            (2, 2, 48, 200, 40, 40, Some(30)),
            (4, 1, 256, 600, 100, 16, Some(64)),
        ] {
            let s = AttentionShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                capacity: cap,
            };
            let kf: Vec<f32> = (0..nkv * cap * hd).map(|_| g.unit()).collect();
            let vf: Vec<f32> = (0..nkv * cap * hd).map(|_| g.unit()).collect();
            let q: Vec<f32> = (0..m * nh * hd).map(|_| g.unit() * 2.0).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let kh: Vec<f16> = kf.iter().map(|&x| f16::from_f32(x)).collect();
            let vh: Vec<f16> = vf.iter().map(|&x| f16::from_f32(x)).collect();
            let kw: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
            let vw: Vec<f32> = vh.iter().map(|x| x.to_f32()).collect();
            for half in [false, true] {
                let mut out = vec![0f32; m * nh * hd];
                let want = if half {
                    attention_prompt_f16(&ctx, s, &q, &kh, &vh, start, m, window, scale, &mut out)
                        .unwrap();
                    reference(s, &q, &kw, &vw, start, m, window, scale)
                } else {
                    attention_prompt(&ctx, s, &q, &kf, &vf, start, m, window, scale, &mut out)
                        .unwrap();
                    reference(s, &q, &kf, &vf, start, m, window, scale)
                };
                for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*a) - b).abs() <= 1e-5,
                        "half {half} {nh}/{nkv}x{hd} start {start} m {m} {window:?} element \
                         {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// Too few rows: the decode kernel (bit for bit); a window there is refused.
    #[test]
    fn few_rows_take_the_decode_kernel() {
        let ctx = CpuContext::new(1).unwrap();
        let s = AttentionShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 32,
            capacity: 64,
        };
        let mut g = Lcg(5);
        let k: Vec<f32> = (0..64 * 32).map(|_| g.unit()).collect();
        let v: Vec<f32> = (0..64 * 32).map(|_| g.unit()).collect();
        let m = PROMPT_MIN_M - 1;
        let q: Vec<f32> = (0..m * 2 * 32).map(|_| g.unit()).collect();
        let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
        attention_prompt(&ctx, s, &q, &k, &v, 3, m, None, 0.2, &mut a).unwrap();
        super::super::attention(&ctx, s, &q, &k, &v, 3, m, 0.2, &mut b).unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        assert!(attention_prompt(&ctx, s, &q, &k, &v, 3, m, Some(4), 0.2, &mut a).is_err());
    }
}
