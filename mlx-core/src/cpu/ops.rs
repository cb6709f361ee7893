//! The small ops of a decode step: RMSNorm, RoPE, SwiGLU's `silu(g) * u`, and causal
//! attention over a float32 or float16 cache with grouped-query heads.

use std::sync::atomic::{AtomicUsize, Ordering};

use half::f16;

use super::matmul::Floats;
use super::{CpuContext, SharedOut};
use crate::{Error, Result};

/// `out = x * rsqrt(mean(x^2) + eps) * w` for each row of `x` (rows of `w.len()`), as
/// `mx.fast.rms_norm` (sums in f32).
pub fn rms_norm(x: &[f32], w: Floats<'_>, eps: f32, out: &mut [f32]) -> Result<()> {
    let d = w.len();
    if d == 0 || x.len() % d != 0 || out.len() != x.len() {
        return Err(Error::invalid(
            "cpu::rms_norm",
            format!("x of {}, out of {}, weight of {d}", x.len(), out.len()),
        ));
    }
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let n = 1.0 / (ss / d as f32 + eps).sqrt();
        for (i, (o, v)) in or.iter_mut().zip(xr).enumerate() {
            *o = w.get(i) * (v * n);
        }
    }
    Ok(())
}

/// The inverse frequencies of the `dims / 2` rotated pairs: `base ** (-2i / dims)` (as
/// `mx.fast.rope` with a base), or `1 / freqs[i]` (with a frequency table).
pub fn rope_inv_freqs(
    dims: usize,
    base: Option<f32>,
    freqs: Option<Floats<'_>>,
    out: &mut [f32],
) -> Result<()> {
    let half = dims / 2;
    if out.len() != half || dims % 2 != 0 {
        return Err(Error::invalid(
            "cpu::rope_inv_freqs",
            format!("{dims} rotated dims, {} outputs", out.len()),
        ));
    }
    match (base, freqs) {
        (Some(b), None) => {
            let step = -b.ln() / half as f32;
            for (i, o) in out.iter_mut().enumerate() {
                *o = (i as f32 * step).exp();
            }
        }
        (None, Some(f)) if f.len() == half => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = 1.0 / f.get(i);
            }
        }
        _ => {
            return Err(Error::invalid(
                "cpu::rope_inv_freqs",
                format!("need a base or a table of {half} frequencies"),
            ))
        }
    }
    Ok(())
}

/// Rotates the first `2 * inv_freqs.len()` features of every `head_dim` vector of `x` at
/// `position` (already multiplied by any scale): pairs `(i, i + dims/2)`, or `(2i, 2i + 1)`
/// when `traditional`, as `mx.fast.rope`.
pub fn rope(
    x: &mut [f32],
    head_dim: usize,
    traditional: bool,
    inv_freqs: &[f32],
    position: f32,
) -> Result<()> {
    rope_pair(x, &mut [], head_dim, traditional, inv_freqs, position)
}

/// [`rope`] of `a` and then `b` at one position (a row's queries and keys), the angles'
/// cosines and sines computed once for both: each the bits [`rope`] gives it alone.
pub fn rope_pair(
    a: &mut [f32],
    b: &mut [f32],
    head_dim: usize,
    traditional: bool,
    inv_freqs: &[f32],
    position: f32,
) -> Result<()> {
    let half = inv_freqs.len();
    if head_dim == 0 || a.len() % head_dim != 0 || b.len() % head_dim != 0 || 2 * half > head_dim {
        return Err(Error::invalid(
            "cpu::rope",
            format!(
                "x of {} and {}, head_dim {head_dim}, {half} pairs",
                a.len(),
                b.len()
            ),
        ));
    }
    // cos/sin once per call on the stack (head_dim <= 1024 pairs).
    const MAX: usize = 512;
    if half > MAX {
        return Err(Error::invalid("cpu::rope", format!("{half} pairs > {MAX}")));
    }
    let mut cs = [0f32; MAX];
    let mut sn = [0f32; MAX];
    for i in 0..half {
        let theta = position * inv_freqs[i];
        cs[i] = theta.cos();
        sn[i] = theta.sin();
    }
    for h in a
        .chunks_exact_mut(head_dim)
        .chain(b.chunks_exact_mut(head_dim))
    {
        for i in 0..half {
            let (a, b) = if traditional {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x1, x2) = (h[a], h[b]);
            h[a] = x1 * cs[i] - x2 * sn[i];
            h[b] = x1 * sn[i] + x2 * cs[i];
        }
    }
    Ok(())
}

/// `g = silu(g) * u` elementwise (SwiGLU), `silu(x) = x * sigmoid(x)`.
pub fn silu_mul(g: &mut [f32], u: &[f32]) -> Result<()> {
    if g.len() != u.len() {
        return Err(Error::invalid(
            "cpu::silu_mul",
            format!("{} and {} elements", g.len(), u.len()),
        ));
    }
    for (a, b) in g.iter_mut().zip(u) {
        *a = *a / (1.0 + (-*a).exp()) * b;
    }
    Ok(())
}

/// [`silu_mul`] on `isa`: with AVX2, eight at a time through a vector `exp` (within 8 ulps
/// of MLX's `x * sigmoid(x) * u` instead of 4).
pub fn silu_mul_isa(isa: super::Isa, g: &mut [f32], u: &[f32]) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && isa.available() {
        if g.len() != u.len() {
            return silu_mul(g, u);
        }
        let n = g.len() / 8 * 8;
        // SAFETY: the ISA is available (checked); both slices hold n floats.
        unsafe { super::x86::silu_mul8(&mut g[..n], &u[..n]) };
        return silu_mul(&mut g[n..], &u[n..]);
    }
    let _ = isa;
    silu_mul(g, u)
}

/// `g = gelu_approx(g) * u` elementwise (Gemma 2 / 3's gate), MLX's `nn.gelu_approx`
/// `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))` computed as the same value's
/// `x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 * x^3))` (no cancellation where `tanh` nears
/// -1), eight at a time through the vector `exp` with AVX2; the portable loop uses Rust's
/// `tanh` as written. Tier L3: within `1e-6` relative plus `2^-23 |x u|` of the float64
/// formula (test below).
pub fn gelu_approx_mul_isa(isa: super::Isa, g: &mut [f32], u: &[f32]) -> Result<()> {
    if g.len() != u.len() {
        return Err(Error::invalid(
            "cpu::gelu_approx_mul",
            format!("{} and {} elements", g.len(), u.len()),
        ));
    }
    let mut n = 0;
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && isa.available() {
        n = g.len() / 8 * 8;
        // SAFETY: the ISA is available (checked); both slices hold n floats.
        unsafe { gelu_approx_mul8(&mut g[..n], &u[..n]) };
    }
    let _ = isa;
    let c = (2.0f64 / std::f64::consts::PI).sqrt() as f32;
    for (a, &b) in g[n..].iter_mut().zip(&u[n..]) {
        let x = *a;
        let inner = c * (x + 0.044715 * (x * x * x));
        *a = 0.5 * x * (1.0 + inner.tanh()) * b;
    }
    Ok(())
}

/// # Safety
/// AVX2, FMA and F16C; `g` and `u` have the same length, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_approx_mul8(g: &mut [f32], u: &[f32]) {
    use std::arch::x86_64::*;
    assert!(
        g.len() == u.len() && g.len() % 8 == 0,
        "gelu_approx_mul8 lengths"
    );
    let c2 = _mm256_set1_ps(-2.0 * (2.0f64 / std::f64::consts::PI).sqrt() as f32);
    let k = _mm256_set1_ps(0.044715);
    let one = _mm256_set1_ps(1.0);
    // SAFETY: every access is within the slices (checked lengths, steps of 8).
    unsafe {
        let mut i = 0;
        while i < g.len() {
            let gp = g.as_mut_ptr().add(i);
            let x = _mm256_loadu_ps(gp);
            let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
            let inner = _mm256_fmadd_ps(k, x3, x);
            let e = super::x86::exp8(_mm256_mul_ps(c2, inner));
            let y = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gp, _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr().add(i))));
            i += 8;
        }
    }
}

/// Greedy sampling's host side over one row of logits: the first largest's index, and the
/// log-sum-exp `ln(sum(exp(x - top))) + top` as MLX's CPU `logsumexp` computes it on
/// x86-64, bit for bit (its `simd::exp`, each term added in order in f32: [`mlx_exp`]),
/// the exponentials 8 at a time with AVX2; `None` where `x` is empty, holds a NaN or its
/// largest is not finite. Tier: equal to MLX's (`greedy_lse_matches_logsumexp` in
/// mlx-engine).
pub fn greedy_lse(isa: super::Isa, x: &[f32]) -> Option<(usize, f32)> {
    let n = x.len() / 8 * 8;
    let (mut top, mut nan) = max_nan(isa, &x[..n]);
    for &v in &x[n..] {
        top = top.max(v);
        nan |= v.is_nan();
    }
    if x.is_empty() || nan || !top.is_finite() {
        return None;
    }
    let best = x.iter().position(|&v| v == top)?;
    let mut sum = sum_exp(isa, &x[..n], top);
    for &v in &x[n..] {
        sum += mlx_exp(v - top);
    }
    Some((best, sum.ln() + top))
}

/// MLX's `simd::exp` of one float (`mlx/backend/cpu/simd/math.h`, as built for x86-64: one
/// lane, `std::fma`, `floor` of the float plus a double 0.5).
#[allow(clippy::excessive_precision, clippy::approx_constant)]
pub fn mlx_exp(x: f32) -> f32 {
    // MLX's constant (not `LOG2_E`'s value).
    let xl = x * 1.442695f32;
    let ipart = (f64::from(xl) + 0.5).floor() as f32;
    let f = xl - ipart;
    let mut p = 1.535336188319500e-4f32;
    p = p.mul_add(f, 1.339887440266574e-3);
    p = p.mul_add(f, 9.618437357674640e-3);
    p = p.mul_add(f, 5.550332471162809e-2);
    p = p.mul_add(f, 2.402264791363012e-1);
    p = p.mul_add(f, 6.931472028550421e-1);
    p = p.mul_add(f, 1.0);
    let e = f32::from_bits(((ipart as i32).wrapping_add(127) as u32).wrapping_shl(23));
    if x.is_nan() {
        x
    } else if x > 88.0 {
        f32::INFINITY
    } else if x < -88.0 {
        0.0
    } else {
        e * p
    }
}

/// The largest of `x` (a multiple of 8 floats) and whether any is NaN.
fn max_nan(isa: super::Isa, x: &[f32]) -> (f32, bool) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && isa.available() {
        // SAFETY: the ISA is available (checked); the length is a multiple of 8.
        return unsafe { super::x86::max_nan8(x) };
    }
    let _ = isa;
    x.iter().fold((f32::NEG_INFINITY, false), |(m, n), &v| {
        (m.max(v), n | v.is_nan())
    })
}

/// `sum(exp(x - top))` of `x` (a multiple of 8 floats), MLX's way (see [`greedy_lse`]).
fn sum_exp(isa: super::Isa, x: &[f32], top: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && isa.available() {
        // SAFETY: as above.
        return unsafe { super::x86::mlx_sum_exp8(x, top, 0.0) };
    }
    let _ = isa;
    x.iter().fold(0f32, |a, &v| a + mlx_exp(v - top))
}

/// Head layout of [`attention`].
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions each cache head holds (its stride in positions).
    pub capacity: usize,
}

/// The widest head [`attention`] takes.
pub const MAX_HEAD_DIM: usize = 512;

/// Causal attention of `m` new tokens at positions `start..start + m`: `q` and `out` are
/// `(m, n_heads, head_dim)`; `k` and `v` are one layer's cache `(n_kv_heads, capacity,
/// head_dim)` already holding positions `0..start + m`. Query head `h` reads KV head
/// `h / (n_heads / n_kv_heads)`. Softmax in f32 with a running maximum (one pass).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    ctx: &CpuContext,
    s: AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    start: usize,
    m: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    attention_impl(ctx, s, q, k, v, start, m, scale, out)
}

/// [`attention`] over a float16 cache (half the bytes a decode step reads; each cached
/// value widened to float32 exactly, the products and softmax in float32 as there).
#[allow(clippy::too_many_arguments)]
pub fn attention_f16(
    ctx: &CpuContext,
    s: AttentionShape,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    start: usize,
    m: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    attention_impl(ctx, s, q, k, v, start, m, scale, out)
}

/// A cached value's type: float32, or float16 widened on load.
pub(super) trait KvElem: Copy + Send + Sync {
    fn f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline]
    fn f32(self) -> f32 {
        self
    }
}

impl KvElem for f16 {
    #[inline]
    fn f32(self) -> f32 {
        self.to_f32()
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_impl<E: KvElem + KvSimd>(
    ctx: &CpuContext,
    s: AttentionShape,
    q: &[f32],
    k: &[E],
    v: &[E],
    start: usize,
    m: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    let op = "cpu::attention";
    let hd = s.head_dim;
    if s.n_kv_heads == 0
        || s.n_heads % s.n_kv_heads != 0
        || hd == 0
        || hd > MAX_HEAD_DIM
        || start + m > s.capacity
    {
        return Err(Error::invalid(
            op,
            format!("bad shape {s:?} for {start}+{m}"),
        ));
    }
    let cache = s.n_kv_heads * s.capacity * hd;
    if q.len() != m * s.n_heads * hd || out.len() != q.len() || k.len() != cache || v.len() != cache
    {
        return Err(Error::invalid(
            op,
            format!(
                "q {}, out {}, k {}, v {} for {s:?} and {m} tokens",
                q.len(),
                out.len(),
                k.len(),
                v.len()
            ),
        ));
    }
    let group = s.n_heads / s.n_kv_heads;
    #[cfg(target_arch = "x86_64")]
    if ctx.isa.has_avx2() && hd % 8 == 0 {
        return attention_parts(ctx, s, q, k, v, start, m, scale, out);
    }
    let items = m * s.n_heads;
    let next = AtomicUsize::new(0);
    let o = SharedOut::new(out);
    ctx.pool.run(&|_, _| loop {
        let it = next.fetch_add(1, Ordering::Relaxed);
        if it >= items {
            break;
        }
        let (t, h) = (it / s.n_heads, it % s.n_heads);
        let kvh = h / group;
        let qv = &q[it * hd..(it + 1) * hd];
        let base = kvh * s.capacity * hd;
        let mut acc = [0f32; MAX_HEAD_DIM];
        let acc = &mut acc[..hd];
        let (mut mx, mut l) = (f32::NEG_INFINITY, 0f32);
        for p in 0..=start + t {
            let kr = &k[base + p * hd..base + (p + 1) * hd];
            let sc = dot(qv, kr) * scale;
            let vr = &v[base + p * hd..base + (p + 1) * hd];
            if sc > mx {
                let c = (mx - sc).exp();
                l *= c;
                for a in acc.iter_mut() {
                    *a *= c;
                }
                mx = sc;
            }
            let w = (sc - mx).exp();
            l += w;
            for (a, x) in acc.iter_mut().zip(vr) {
                *a += w * x.f32();
            }
        }
        // SAFETY: item `it` owns out[it * hd .. (it + 1) * hd].
        let dst = unsafe { o.range(it * hd, hd) };
        for (d, a) in dst.iter_mut().zip(acc.iter()) {
            *d = a / l;
        }
    });
    Ok(())
}

/// Positions per part on the SIMD path: each (query row, KV head, part) is one work item, so
/// one decode row at a few hundred positions spreads over the workers. The parts depend on
/// the row's position count only, so its output does not depend on the thread count or on
/// the rows that come with it.
#[cfg(target_arch = "x86_64")]
const ATT_PART: usize = 128;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// [`attention_parts`]' partial results, grown to the largest call (nothing allocated
    /// once it has).
    static PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`attention_impl`] with AVX2 (`hd % 8 == 0`, the shapes checked): every KV head's query
/// heads over each part of [`ATT_PART`] positions in one work item (`x86::attend_part`: the
/// part's keys and values read from memory once for all of them), then per query head the
/// parts merged in order on the caller: `out = sum_p acc_p e^(mx_p - mx) / sum_p l_p e^(mx_p
/// - mx)`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn attention_parts<E: KvElem + KvSimd>(
    ctx: &CpuContext,
    s: AttentionShape,
    q: &[f32],
    k: &[E],
    v: &[E],
    start: usize,
    m: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    let (hd, nkv) = (s.head_dim, s.n_kv_heads);
    let group = s.n_heads / nkv;
    let np = (start + m).div_ceil(ATT_PART);
    let stride = super::x86::part_stride(hd);
    let items = m * nkv * np;
    let at = |t: usize, kvh: usize, p: usize, gi: usize| {
        ((t * nkv + kvh) * np + p) * group * stride + gi * stride
    };
    PARTS.with(|buf| {
        let mut buf = buf.borrow_mut();
        let need = items * group * stride;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let parts = SharedOut::new(&mut buf[..need]);
        let next = AtomicUsize::new(0);
        ctx.pool.run(&|_, _| loop {
            let it = next.fetch_add(1, Ordering::Relaxed);
            if it >= items {
                break;
            }
            let (t, kvh, p) = (it / (nkv * np), it / np % nkv, it % np);
            let n = start + t + 1;
            let p0 = p * ATT_PART;
            if p0 >= n {
                continue;
            }
            let len = (n - p0).min(ATT_PART);
            let base = kvh * s.capacity * hd + p0 * hd;
            let q0 = (t * s.n_heads + kvh * group) * hd;
            // SAFETY: positions p0..p0 + len <= start + m <= capacity of head kvh lie in k and
            // v (checked by the caller), the group's query rows in q; item `it` owns its
            // group * stride floats of the parts; the ISA (AVX2, FMA, F16C) and hd % 8 == 0
            // were checked by the caller.
            unsafe {
                let dst = parts.range(at(t, kvh, p, 0), group * stride);
                super::x86::attend_part::<E>(
                    q[q0..q0 + group * hd].as_ptr(),
                    group,
                    k[base..base + len * hd].as_ptr(),
                    v[base..base + len * hd].as_ptr(),
                    hd,
                    len,
                    scale,
                    dst.as_mut_ptr(),
                );
            }
        });
        for t in 0..m {
            let used = (start + t + 1).div_ceil(ATT_PART);
            for kvh in 0..nkv {
                for gi in 0..group {
                    let h = kvh * group + gi;
                    let o = &mut out[(t * s.n_heads + h) * hd..][..hd];
                    let mx = (0..used)
                        .map(|p| buf[at(t, kvh, p, gi) + hd])
                        .fold(f32::NEG_INFINITY, f32::max);
                    let mut l = 0f32;
                    o.fill(0.0);
                    for p in 0..used {
                        let a = &buf[at(t, kvh, p, gi)..][..stride];
                        let f = (a[hd] - mx).exp();
                        l += a[hd + 1] * f;
                        for (d, x) in o.iter_mut().zip(&a[..hd]) {
                            *d += x * f;
                        }
                    }
                    let inv = 1.0 / l;
                    for d in o.iter_mut() {
                        *d *= inv;
                    }
                }
            }
        }
        Ok(())
    })
}

#[inline]
fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
    // Eight partial sums: lets the compiler vectorize without reassociating.
    let mut s = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            s[i] += x[i] * y[i].f32();
        }
    }
    let mut t: f32 = s.iter().sum();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        t += x * y.f32();
    }
    t
}

/// Where the SIMD attention kernel can load a cached value type (x86-64: all of [`KvElem`]'s).
#[cfg(target_arch = "x86_64")]
pub(super) use super::x86::Load8 as KvSimd;

/// Elsewhere: no SIMD kernel, every type qualifies.
#[cfg(not(target_arch = "x86_64"))]
pub(super) trait KvSimd {}
#[cfg(not(target_arch = "x86_64"))]
impl<T> KvSimd for T {}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gelu_approx_mul_isa` on every ISA here against the float64 formula: within `1e-6`
    /// relative plus `2^-23 |x u|` (the float32 `1 + tanh` cancellation of the portable
    /// formula, MLX's own) (tier L3), over inputs from -12 to 12 and a tail of 5.
    #[test]
    fn gelu_approx_mul_is_within_a_bound() {
        let x: Vec<f32> = (0..4005).map(|i| (i as f32 - 2002.0) * 0.006).collect();
        let u: Vec<f32> = (0..4005).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let c = (2.0f64 / std::f64::consts::PI).sqrt();
        for isa in [super::super::Isa::Scalar, super::super::Isa::detect()] {
            let mut g = x.clone();
            gelu_approx_mul_isa(isa, &mut g, &u).unwrap();
            for ((&a, &xv), &uv) in g.iter().zip(&x).zip(&u) {
                let xd = f64::from(xv);
                let want =
                    0.5 * xd * (1.0 + (c * (xd + 0.044715 * xd * xd * xd)).tanh()) * f64::from(uv);
                assert!(
                    (f64::from(a) - want).abs()
                        <= 1e-6 * want.abs() + 2f64.powi(-23) * (xd * f64::from(uv)).abs(),
                    "{} x {xv}: {a} vs {want}",
                    isa.name()
                );
            }
        }
    }

    /// [`greedy_lse`]'s 8-lane path gives its portable one's bits (each `exp` and the sum in
    /// order are MLX's; mlx-engine's `greedy_lse_matches_logsumexp` checks both against MLX),
    /// over spreads past the -88 cut-off, a masked logit and tails past the last 8.
    #[test]
    fn greedy_lse_lanes_match_the_portable_path() {
        for (n, scale) in [(8usize, 1.0f32), (1003, 9.0), (4096, 70.0), (17, 200.0)] {
            let mut x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1009) as f32 / 37.0).sin() * scale)
                .collect();
            x[n / 3] = f32::NEG_INFINITY;
            let want = greedy_lse(super::super::Isa::Scalar, &x).unwrap();
            for isa in [super::super::Isa::Avx2, super::super::Isa::Avx512] {
                if isa.available() {
                    let got = greedy_lse(isa, &x).unwrap();
                    assert_eq!(got.0, want.0, "n {n}");
                    assert_eq!(got.1.to_bits(), want.1.to_bits(), "n {n}: {got:?} {want:?}");
                }
            }
        }
        assert!(greedy_lse(super::super::Isa::Scalar, &[1.0, f32::NAN]).is_none());
        assert!(greedy_lse(super::super::Isa::Scalar, &[]).is_none());
    }
}
