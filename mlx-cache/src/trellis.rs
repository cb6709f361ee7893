//! A trellis-coded KV cache (not in mlx-lm): every token's key and value vector of each head is
//! coded at `bits` (2, 3 or 4) bits a dimension with the trellis code of the weights
//! (`mlx_core::cpu::trellis`: tail-biting bit-shift trellis, an `L`-bit state, 1MAD), after a
//! per-token incoherence transform, and decoded back to a dense array for attention.
//!
//! Per token and head, a vector `x` of `head_dim` values is stored as
//! `t = H (s * (x - c) / g)` coded in one trellis block (`head_dim * bits / 32` words, the
//! vector zero-padded to whole words) with a least-squares scale: `H` the orthonormal
//! Walsh-Hadamard transform over the largest power-of-two block, `s` seeded random signs, `c`
//! the head's center (the mean of the first write's vectors, fixed from then on and stored with
//! the codes: keys carry a large per-channel offset that would otherwise use most of each
//! token's code), `g` per-channel divisors (ones unless [`TrellisKvSpec::norm_keys`] /
//! `norm_values`). Decoding is `c + g * s * H (scale * code)`. Beside the codes, the first
//! `sink` tokens (the attention sinks) are kept exactly, and the last `window` tokens are read
//! from exact copies (every token is coded when written; the copies of the last
//! `window + history` are kept): the recent tokens most queries attend to are not coded.
//!
//! A token's code depends only on that token and the center, so writes in any chunking give
//! the same codes, and [`Cache::trim`] is exact: dropping the last `n` tokens leaves the cache
//! that writing only the kept tokens leaves (with the same first write; trimming everything
//! resets the center), as long as `n <= history` keeps the window's exact copies (deeper trims
//! short of everything are refused: [`Cache::can_trim`]).
//!
//! The codes live in host memory (`head_dim * bits / 8 + 4` bytes a token and head, against
//! `2 * head_dim` for a float16 cache, plus the fixed exact sink and window);
//! [`Cache::update_and_fetch`] codes the new tokens (the Viterbi search, on every core) and
//! decodes the whole cache for attention, which receives [`Kv::Dense`] in the dtype the keys
//! came in: any model's attention runs unchanged.

use mlx_core::cpu::trellis::{self as tq, TrellisSpec};
use mlx_core::prelude::*;

use crate::mask::{create_attention_mask, AttentionMask};
use crate::state::StateValue;
use crate::{seq_of, Cache, Kv};

/// The state window of the cache's trellis when none is given: `L` 12 (`2^L` states a
/// dimension in the Viterbi search of a token; at 3 bits on SmolLM2-135M L 8 was 1.5% above
/// the plain cache's perplexity at 4k, L 12 0.6%: `results/quant/2026-12-04-trellis-kv/`).
pub const DEFAULT_TRELLIS_KV_L: u32 = 12;

/// Tokens kept exactly when none is given.
pub const DEFAULT_TRELLIS_KV_SINK: usize = 32;
/// The exact recent window when none is given (tokens).
pub const DEFAULT_TRELLIS_KV_WINDOW: usize = 256;
/// How far a trim may go back with the window staying exact, when not given (a speculative
/// draft's rejected tokens).
pub const DEFAULT_TRELLIS_KV_HISTORY: usize = 16;

/// Seed of the per-dimension signs (keys and values draw their own from it).
const SIGN_SEED: u64 = 0x7472_656c_6c69_734b;

const CLASS: &str = "TrellisKVCache";

/// Settings of a trellis KV cache: `bits` a dimension (2, 3 or 4) and the state window `l`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrellisKvSpec {
    pub bits: u32,
    pub l: u32,
    /// The first `sink` tokens are kept exactly (float32), not coded: the attention sink(s)
    /// most heads attend to, where a coding error moves the most attention mass.
    pub sink: usize,
    /// Divide keys (values) channel by channel by their spread in the first write before the
    /// transform (and multiply back after decoding), so each channel's error follows its
    /// spread instead of the head's.
    pub norm_keys: bool,
    pub norm_values: bool,
    /// The most recent `window` tokens are read exactly (every token is coded when written;
    /// the exact copies of the last `window + history` are kept beside the codes).
    pub window: usize,
    /// How many tokens a trim may go back while the window stays exact: a deeper trim (short
    /// of emptying the cache) is refused ([`Cache::can_trim`]).
    pub history: usize,
}

impl TrellisKvSpec {
    /// Checks `bits` (2, 3 or 4) and `l` (`bits + 1..=16`).
    pub fn new(bits: i32, l: u32) -> Result<TrellisKvSpec> {
        let bad = |message: String| Error::InvalidArgument {
            op: "TrellisKVCache",
            message,
        };
        let bits = u32::try_from(bits)
            .ok()
            .filter(|b| (2..=4).contains(b))
            .ok_or_else(|| bad(format!("trellis KV bits must be 2, 3 or 4, got {bits}")))?;
        if l <= bits || l > 16 {
            return Err(bad(format!(
                "the trellis state window L must be in {}..=16, got {l}",
                bits + 1
            )));
        }
        Ok(TrellisKvSpec {
            bits,
            l,
            sink: DEFAULT_TRELLIS_KV_SINK,
            norm_keys: false,
            norm_values: false,
            window: DEFAULT_TRELLIS_KV_WINDOW,
            history: DEFAULT_TRELLIS_KV_HISTORY,
        })
    }

    /// The same settings reading the last `window` tokens exactly, trims of up to `history`
    /// tokens keeping that exact.
    pub fn with_window(self, window: usize, history: usize) -> TrellisKvSpec {
        TrellisKvSpec {
            window,
            history,
            ..self
        }
    }

    /// The same settings keeping the first `sink` tokens exactly.
    pub fn with_sink(self, sink: usize) -> TrellisKvSpec {
        TrellisKvSpec { sink, ..self }
    }

    /// The coded length of a vector of `dim` values: `dim` rounded up to a whole number of
    /// 32-bit words at `bits` a value (64 and 128 stay; 16 at 3 bits codes 32, the padding
    /// zeros before the transform).
    fn coded_dim(self, dim: usize) -> usize {
        let unit = 32 / gcd(self.bits as usize, 32);
        dim.div_ceil(unit) * unit
    }

    /// The trellis block for vectors of `dim` values: one block a vector (padded).
    fn block(self, dim: usize) -> Result<TrellisSpec> {
        let spec = TrellisSpec {
            k: self.bits,
            l: self.l,
            block: self.coded_dim(dim),
            code: mlx_core::cpu::trellis::TrellisCode::Mad,
        };
        spec.check().map_err(|e| Error::InvalidArgument {
            op: "TrellisKVCache",
            message: format!(
                "head_dim {dim} cannot be trellis-coded at {} bits as one block of {}: {e}",
                self.bits,
                self.coded_dim(dim)
            ),
        })?;
        Ok(spec)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Keys or values: the codes of every `(batch, head)` row's tokens.
#[derive(Clone, Debug)]
struct Side {
    spec: TrellisSpec,
    /// Values a vector (`head_dim`); `spec.block` of them are coded (zero padding).
    dim: usize,
    /// Per-dimension signs (`spec.block`).
    signs: Vec<f32>,
    /// `(rows, dim)`: each row's center.
    center: Vec<f32>,
    /// `(rows, dim)`: each row's per-channel divisor (ones without normalization).
    norm: Vec<f32>,
    /// Per row: `tokens * words_per_token` words.
    words: Vec<Vec<u32>>,
    /// Per row: one scale a token.
    scales: Vec<Vec<f32>>,
    /// Per row: the first `sink` tokens' vectors, exactly (`min(tokens, sink) * dim`).
    dense: Vec<Vec<f32>>,
    sink: usize,
    /// Per row: exact copies of the last coded tokens (at most `window + history`).
    recent: Vec<Vec<f32>>,
    window: usize,
    history: usize,
    dtype: Dtype,
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn err(message: String) -> Error {
    Error::InvalidArgument {
        op: "TrellisKVCache",
        message,
    }
}

impl Side {
    fn words_per_token(&self) -> usize {
        self.spec.block_words()
    }

    /// An empty side for `rows` rows of `dim`, the center taken from `x` (`(rows, n, dim)`).
    #[allow(clippy::too_many_arguments)]
    fn new(
        spec: TrellisKvSpec,
        salt: u64,
        normalize: bool,
        x: &[f32],
        rows: usize,
        dim: usize,
        dtype: Dtype,
    ) -> Result<Side> {
        let block = spec.block(dim)?;
        let n = x.len() / (rows * dim);
        let mut center = vec![0.0f32; rows * dim];
        let mut norm = vec![1.0f32; rows * dim];
        for r in 0..rows {
            for d in 0..dim {
                let s: f64 = (0..n).map(|t| f64::from(x[(r * n + t) * dim + d])).sum();
                center[r * dim + d] = (s / n as f64) as f32;
            }
            if normalize && n > 1 {
                let sd: Vec<f64> = (0..dim)
                    .map(|d| {
                        let c = f64::from(center[r * dim + d]);
                        let v: f64 = (0..n)
                            .map(|t| (f64::from(x[(r * n + t) * dim + d]) - c).powi(2))
                            .sum();
                        (v / n as f64).sqrt()
                    })
                    .collect();
                let mean = sd.iter().sum::<f64>() / dim as f64;
                if mean > 0.0 && mean.is_finite() {
                    for d in 0..dim {
                        norm[r * dim + d] = sd[d].max(0.05 * mean) as f32;
                    }
                }
            }
        }
        Ok(Side {
            signs: tq::signs(SIGN_SEED ^ salt, block.block),
            spec: block,
            dim,
            center,
            norm,
            words: vec![Vec::new(); rows],
            scales: vec![Vec::new(); rows],
            dense: vec![Vec::new(); rows],
            sink: spec.sink,
            recent: vec![Vec::new(); rows],
            window: spec.window,
            history: spec.history,
            dtype,
        })
    }

    /// Coded tokens held.
    fn coded(&self) -> usize {
        self.scales.first().map_or(0, Vec::len)
    }

    /// Coded tokens whose exact copy is kept.
    fn recent_len(&self) -> usize {
        self.recent.first().map_or(0, |v| v.len() / self.dim)
    }

    /// Whether dropping the last `n` of `tokens` leaves every token of the window exact.
    fn can_trim(&self, tokens: usize, n: usize) -> bool {
        let after = tokens.saturating_sub(n).saturating_sub(self.sink);
        // `after == 0`: what is kept lies within the sink (held exactly), so no coded token
        // is left for the window to cover.
        n >= tokens
            || after == 0
            || self.window == 0
            || self.recent_len() >= n.min(self.coded()) + self.window.min(after)
    }

    /// Tokens held exactly.
    fn exact(&self) -> usize {
        self.dense.first().map_or(0, |d| d.len() / self.dim)
    }

    /// Appends `x` (`(rows, n, dim)`, host `f32`): the tokens still within the sink as they
    /// are, the others coded.
    fn append(&mut self, x: &[f32]) -> Result<()> {
        let (rows, dim, cdim) = (self.words.len(), self.dim, self.spec.block);
        let n = x.len() / (rows * dim);
        let e = n.min(self.sink - self.exact().min(self.sink));
        for r in 0..rows {
            self.dense[r].extend_from_slice(&x[r * n * dim..(r * n + e) * dim]);
        }
        let m = n - e;
        if m == 0 {
            return Ok(());
        }
        let hb = tq::hadamard_block(cdim);
        let mut t = vec![0.0f32; rows * m * cdim];
        for (i, v) in t.chunks_exact_mut(cdim).enumerate() {
            let (r, j) = (i / m, i % m);
            let x = &x[(r * n + e + j) * dim..(r * n + e + j + 1) * dim];
            let c = &self.center[r * dim..(r + 1) * dim];
            let g = &self.norm[r * dim..(r + 1) * dim];
            for ((((v, x), c), g), s) in v.iter_mut().zip(x).zip(c).zip(g).zip(&self.signs) {
                *v = (x - c) / g * s;
            }
            tq::fwht_blocks(v, hb);
        }
        let (words, scales) = tq::encode_rows(&self.spec, &t, rows * m, cdim, threads())
            .map_err(|e| err(e.to_string()))?;
        let wpt = self.words_per_token();
        let keep = (self.window + self.history) * dim;
        for r in 0..rows {
            self.words[r].extend_from_slice(&words[r * m * wpt..(r + 1) * m * wpt]);
            self.scales[r].extend_from_slice(&scales[r * m..(r + 1) * m]);
            if keep > 0 {
                let rec = &mut self.recent[r];
                rec.extend_from_slice(&x[(r * n + e) * dim..(r + 1) * n * dim]);
                if rec.len() > keep {
                    rec.drain(..rec.len() - keep);
                }
            }
        }
        Ok(())
    }

    fn truncate(&mut self, tokens: usize) {
        let wpt = self.words_per_token();
        let e = tokens.min(self.sink);
        let coded = tokens - e;
        let drop = self.coded().saturating_sub(coded) * self.dim;
        for ((w, s), (d, rec)) in self
            .words
            .iter_mut()
            .zip(&mut self.scales)
            .zip(self.dense.iter_mut().zip(&mut self.recent))
        {
            w.truncate(coded * wpt);
            s.truncate(coded);
            d.truncate(e * self.dim);
            rec.truncate(rec.len().saturating_sub(drop));
        }
    }

    /// The decoded `(batch, heads, tokens, dim)` array in the side's dtype.
    fn decode(&self, batch: usize, heads: usize, tokens: usize) -> Result<Array> {
        let (dim, cdim) = (self.dim, self.spec.block);
        let hb = tq::hadamard_block(cdim);
        let mut out = vec![0.0f32; batch * heads * tokens * dim];
        let e = tokens.min(self.sink);
        // The last `w` coded tokens are read from their exact copies.
        let rl = self.recent_len();
        let w = self.window.min(rl).min(tokens - e);
        if tokens > 0 {
            let th = threads();
            let mut coded = vec![0.0f32; (tokens - e) * cdim];
            for (r, chunk) in out.chunks_exact_mut(tokens * dim).enumerate() {
                let (exact, chunk) = chunk.split_at_mut(e * dim);
                exact.copy_from_slice(&self.dense[r][..e * dim]);
                if tokens == e {
                    continue;
                }
                tq::decode(
                    &self.spec,
                    &self.words[r],
                    &self.scales[r],
                    tokens - e,
                    cdim,
                    th,
                    &mut coded,
                )
                .map_err(|e| err(e.to_string()))?;
                let c = &self.center[r * dim..(r + 1) * dim];
                let g = &self.norm[r * dim..(r + 1) * dim];
                for (o, v) in chunk
                    .chunks_exact_mut(dim)
                    .zip(coded.chunks_exact_mut(cdim))
                {
                    tq::fwht_blocks(v, hb);
                    for ((((o, v), c), g), s) in
                        o.iter_mut().zip(&*v).zip(c).zip(g).zip(&self.signs)
                    {
                        *o = v * s * g + c;
                    }
                }
                if w > 0 {
                    let rec = &self.recent[r];
                    let n = chunk.len();
                    chunk[n - w * dim..].copy_from_slice(&rec[rec.len() - w * dim..]);
                }
            }
        }
        let shape = [batch as i32, heads as i32, tokens as i32, dim as i32];
        let a = Array::from_slice(&out, &shape)?;
        if self.dtype == Dtype::Float32 {
            Ok(a)
        } else {
            a.astype(self.dtype)
        }
    }

    /// Per row its center then its divisors.
    fn affine(&self) -> Vec<f32> {
        let d = self.dim;
        self.center
            .chunks_exact(d)
            .zip(self.norm.chunks_exact(d))
            .flat_map(|(c, g)| c.iter().chain(g).copied())
            .collect()
    }

    fn nbytes(&self) -> usize {
        let w: usize = self.words.iter().map(Vec::len).sum();
        let s: usize = self.scales.iter().map(Vec::len).sum();
        let d: usize = self.dense.iter().map(Vec::len).sum();
        let r: usize = self.recent.iter().map(Vec::len).sum();
        4 * (w + s + d + r + self.center.len() + self.norm.len())
    }

    /// `[words (B, H, T - E, wpt) uint32, scales (B, H, T - E, 1) f32, center (B, H, 1, D)
    /// f32, exact (B, H, E, D) f32]`, `E = min(T, sink)`.
    fn state(&self, batch: usize, heads: usize, tokens: usize) -> Result<StateValue> {
        let wpt = self.words_per_token();
        let e = tokens.min(self.sink);
        let (b, h, t) = (batch as i32, heads as i32, (tokens - e) as i32);
        let d = self.dim as i32;
        let words: Vec<u32> = self.words.concat();
        let scales: Vec<f32> = self.scales.concat();
        let dense: Vec<f32> = self.dense.concat();
        let recent: Vec<f32> = self.recent.concat();
        let rl = self.recent_len() as i32;
        Ok(StateValue::List(vec![
            StateValue::Array(Array::from_slice(&words, &[b, h, t, wpt as i32])?),
            StateValue::Array(Array::from_slice(&scales, &[b, h, t, 1])?),
            StateValue::Array(Array::from_slice(&self.affine(), &[b, h, 2, d])?),
            StateValue::Array(Array::from_slice(&dense, &[b, h, e as i32, d])?),
            StateValue::Array(Array::from_slice(&recent, &[b, h, rl, d])?),
        ]))
    }

    fn from_state(
        v: StateValue,
        spec: TrellisKvSpec,
        salt: u64,
        dtype: Dtype,
        what: &str,
    ) -> Result<(Side, [usize; 3])> {
        let bad = |m: String| Error::InvalidArgument {
            op: "from_state",
            message: format!("{CLASS}: {what} {m}"),
        };
        let [w, s, c, x, rc]: [StateValue; 5] = v
            .list(CLASS, 5)?
            .try_into()
            .map_err(|_| bad("must have 5 entries".into()))?;
        let (w, s, c) = (w.array(CLASS)?, s.array(CLASS)?, c.array(CLASS)?);
        let (x, rc) = (x.array(CLASS)?, rc.array(CLASS)?);
        let (ws, ss, cs, xs) = (w.shape(), s.shape(), c.shape(), x.shape());
        if ws.len() != 4 || ss.len() != 4 || cs.len() != 4 || xs.len() != 4 {
            return Err(bad(format!(
                "arrays must be 4-d, got {ws:?}, {ss:?}, {cs:?} and {xs:?}"
            )));
        }
        let (b, h, t, dim) = (ws[0], ws[1], ws[2], cs[3]);
        if dim <= 0 || b <= 0 || h <= 0 || t < 0 {
            return Err(bad(format!("have impossible shapes {ws:?} and {cs:?}")));
        }
        let side_spec = spec.block(dim as usize)?;
        let wpt = side_spec.block_words() as i32;
        if ws[3] != wpt || ss != [b, h, t, 1] || cs != [b, h, 2, dim] {
            return Err(bad(format!(
                "shapes {ws:?}, {ss:?}, {cs:?} do not fit head_dim {dim} at {} bits \
                 (words (B, H, T, {wpt}), scales (B, H, T, 1), center and divisors (B, H, 2, {dim}))",
                spec.bits
            )));
        }
        let e = xs[2];
        if xs != [b, h, e, dim] || e as usize > spec.sink || (t > 0 && e as usize != spec.sink) {
            return Err(bad(format!(
                "exact tokens {xs:?} do not fit (B, H, E, {dim}) with E = min(tokens, sink {}) \
                 beside {t} coded tokens",
                spec.sink
            )));
        }
        let rs = rc.shape();
        let rl = rs.get(2).copied().unwrap_or(-1);
        if rs.len() != 4
            || rs != [b, h, rl, dim]
            || rl > t
            || rl as usize > spec.window + spec.history
        {
            return Err(bad(format!(
                "exact recent tokens {rs:?} do not fit (B, H, R, {dim}) with R at most the {t} \
                 coded tokens and window + history {}",
                spec.window + spec.history
            )));
        }
        if w.dtype() != Dtype::Uint32
            || rc.dtype() != Dtype::Float32
            || s.dtype() != Dtype::Float32
            || c.dtype() != Dtype::Float32
            || x.dtype() != Dtype::Float32
        {
            return Err(bad(format!(
                "dtypes {}, {}, {}; expected uint32 words, float32 scales and center",
                w.dtype().name(),
                s.dtype().name(),
                c.dtype().name()
            )));
        }
        let (w, s, c) = (w.to_vec::<u32>()?, s.to_vec::<f32>()?, c.to_vec::<f32>()?);
        let x = x.to_vec::<f32>()?;
        let rc = rc.to_vec::<f32>()?;
        if s.iter()
            .chain(&c)
            .chain(&x)
            .chain(&rc)
            .any(|v| !v.is_finite())
        {
            return Err(bad("hold a non-finite scale or center".into()));
        }
        if c.chunks_exact(2 * dim as usize)
            .any(|a| a[dim as usize..].iter().any(|&g| g <= 0.0))
        {
            return Err(bad("hold a channel divisor that is not positive".into()));
        }
        let rows = (b * h) as usize;
        let (t, wpt, dim, e) = (t as usize, wpt as usize, dim as usize, e as usize);
        Ok((
            Side {
                signs: tq::signs(SIGN_SEED ^ salt, side_spec.block),
                spec: side_spec,
                dim,
                center: c
                    .chunks_exact(2 * dim)
                    .flat_map(|a| a[..dim].to_vec())
                    .collect(),
                norm: c
                    .chunks_exact(2 * dim)
                    .flat_map(|a| a[dim..].to_vec())
                    .collect(),
                words: (0..rows)
                    .map(|r| w[r * t * wpt..(r + 1) * t * wpt].to_vec())
                    .collect(),
                scales: (0..rows).map(|r| s[r * t..(r + 1) * t].to_vec()).collect(),
                dense: (0..rows)
                    .map(|r| x[r * e * dim..(r + 1) * e * dim].to_vec())
                    .collect(),
                sink: spec.sink,
                recent: (0..rows)
                    .map(|r| rc[r * rl as usize * dim..(r + 1) * rl as usize * dim].to_vec())
                    .collect(),
                window: spec.window,
                history: spec.history,
                dtype,
            },
            [b as usize, h as usize, t + e],
        ))
    }
}

/// A KV cache whose keys and values are trellis-coded (see the module documentation).
#[derive(Clone, Debug)]
pub struct TrellisKVCache {
    spec: TrellisKvSpec,
    keys: Option<Side>,
    values: Option<Side>,
    batch: usize,
    heads: usize,
    offset: usize,
}

const KEY_SALT: u64 = 0;
const VALUE_SALT: u64 = 0x5555_5555_5555_5555;

/// `x` `(B, H, S, D)` as host `f32`, row-major, with its shape.
fn host(x: &Array, what: &str) -> Result<(Vec<f32>, [usize; 4])> {
    if !x.dtype().is_floating() {
        return Err(err(format!(
            "{what} are {}; expected a floating-point dtype",
            x.dtype().name()
        )));
    }
    let s = x.shape();
    let shape = [s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize];
    let v = if x.dtype() == Dtype::Float64 {
        x.astype(Dtype::Float32)?.to_vec::<f32>()?
    } else {
        x.to_vec_f32()?
    };
    if let Some(i) = v.iter().position(|v| !v.is_finite()) {
        return Err(err(format!(
            "{what} hold a non-finite value at flat index {i}; a trellis code needs finite values"
        )));
    }
    Ok((v, shape))
}

impl TrellisKVCache {
    /// `bits` 2, 3 or 4 a dimension, state window `l` (see [`TrellisKvSpec::new`]).
    pub fn new(bits: i32, l: u32) -> Result<Self> {
        Ok(Self::with_spec(TrellisKvSpec::new(bits, l)?))
    }

    /// A cache of checked settings (see [`TrellisKvSpec`]).
    pub fn with_spec(spec: TrellisKvSpec) -> Self {
        TrellisKVCache {
            spec,
            keys: None,
            values: None,
            batch: 0,
            heads: 0,
            offset: 0,
        }
    }

    pub fn spec(&self) -> TrellisKvSpec {
        self.spec
    }

    /// The centers of keys and values (`(B, H, 1, D)`, float32), once written.
    pub fn centers(&self) -> Result<Option<(Array, Array)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => {
                let (b, h) = (self.batch as i32, self.heads as i32);
                Ok(Some((
                    Array::from_slice(&k.center, &[b, h, 1, k.dim as i32])?,
                    Array::from_slice(&v.center, &[b, h, 1, v.dim as i32])?,
                )))
            }
            _ => Ok(None),
        }
    }

    /// Codes `keys`/`values` (a plain cache's contents, `(B, H, S, D)`) into a fresh trellis
    /// cache: what [`crate::KVCache::to_trellis`] does.
    pub(crate) fn from_dense(spec: TrellisKvSpec, keys: &Array, values: &Array) -> Result<Self> {
        let mut c = TrellisKVCache {
            spec,
            keys: None,
            values: None,
            batch: 0,
            heads: 0,
            offset: 0,
        };
        c.write(keys, values)?;
        Ok(c)
    }

    fn write(&mut self, keys: &Array, values: &Array) -> Result<()> {
        let n = seq_of(keys, values, "update_and_fetch")?;
        if n == 0 {
            return Ok(());
        }
        let (k, ks) = host(keys, "keys")?;
        let (v, vs) = host(values, "values")?;
        let rows = ks[0] * ks[1];
        match (&mut self.keys, &mut self.values) {
            (Some(kside), Some(vside)) => {
                if ks[0] != self.batch
                    || ks[1] != self.heads
                    || ks[3] != kside.dim
                    || vs[3] != vside.dim
                {
                    return Err(err(format!(
                        "new keys {ks:?} / values {vs:?} do not match the cache's (batch {}, \
                         heads {}, key dim {}, value dim {})",
                        self.batch, self.heads, kside.dim, vside.dim
                    )));
                }
                if keys.dtype() != kside.dtype || values.dtype() != vside.dtype {
                    return Err(err(format!(
                        "new keys/values are {}/{}, the cache holds {}/{}",
                        keys.dtype().name(),
                        values.dtype().name(),
                        kside.dtype.name(),
                        vside.dtype.name()
                    )));
                }
                kside.append(&k)?;
                vside.append(&v)?;
            }
            _ => {
                if keys.dtype() != values.dtype() {
                    return Err(err(format!(
                        "keys are {} but values {}; expected one dtype",
                        keys.dtype().name(),
                        values.dtype().name()
                    )));
                }
                let sp = self.spec;
                let mut kside =
                    Side::new(sp, KEY_SALT, sp.norm_keys, &k, rows, ks[3], keys.dtype())?;
                let mut vside = Side::new(
                    sp,
                    VALUE_SALT,
                    sp.norm_values,
                    &v,
                    rows,
                    vs[3],
                    values.dtype(),
                )?;
                kside.append(&k)?;
                vside.append(&v)?;
                self.keys = Some(kside);
                self.values = Some(vside);
                self.batch = ks[0];
                self.heads = ks[1];
            }
        }
        self.offset += n;
        Ok(())
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let [k, v, o, bits, l, dtype, sink, window, history]: [StateValue; 9] = state
            .list(CLASS, 9)?
            .try_into()
            .map_err(|_| err("state must have 9 entries".into()))?;
        let sink = sink.usize(CLASS)?;
        let (window, history) = (window.usize(CLASS)?, history.usize(CLASS)?);
        let offset = o.usize(CLASS)?;
        let bits = bits.int(CLASS)?;
        let l = l.int(CLASS)?;
        let spec = TrellisKvSpec::new(
            i32::try_from(bits).unwrap_or(0),
            u32::try_from(l).unwrap_or(0),
        )
        .map_err(|e| Error::InvalidArgument {
            op: "from_state",
            message: format!("{CLASS}: {}", e.message()),
        })?
        .with_sink(sink)
        .with_window(window, history);
        let dtype_name = dtype.string(CLASS)?;
        let dtype = Dtype::from_name(&dtype_name)
            .filter(|d| d.is_floating())
            .ok_or_else(|| Error::InvalidArgument {
                op: "from_state",
                message: format!("{CLASS}: dtype {dtype_name:?} is not a floating-point dtype"),
            })?;
        let mut c = TrellisKVCache {
            spec,
            keys: None,
            values: None,
            batch: 0,
            heads: 0,
            offset: 0,
        };
        match (k, v) {
            (StateValue::None, StateValue::None) => {
                if offset != 0 {
                    return Err(err(format!(
                        "from_state: offset {offset} but no keys or values"
                    )));
                }
            }
            (k, v) => {
                let (ks, [b, h, t]) = Side::from_state(k, spec, KEY_SALT, dtype, "keys")?;
                let (vs, vshape) = Side::from_state(v, spec, VALUE_SALT, dtype, "values")?;
                if vshape != [b, h, t] || t != offset {
                    return Err(Error::InvalidArgument {
                        op: "from_state",
                        message: format!(
                            "{CLASS}: keys hold (batch, heads, tokens) {:?}, values {vshape:?}, \
                             offset {offset}; expected equal and tokens = offset",
                            [b, h, t]
                        ),
                    });
                }
                c.keys = Some(ks);
                c.values = Some(vs);
                c.batch = b;
                c.heads = h;
                c.offset = offset;
            }
        }
        Ok(c)
    }
}

impl Cache for TrellisKVCache {
    fn class_name(&self) -> &'static str {
        CLASS
    }
    fn offset(&self) -> usize {
        self.offset
    }
    fn size(&self) -> usize {
        self.offset
    }
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv> {
        self.write(keys, values)?;
        self.fetch()?
            .ok_or_else(|| err("nothing was written".into()))
    }
    fn fetch(&self) -> Result<Option<Kv>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok(Some(Kv::Dense {
                keys: k.decode(self.batch, self.heads, self.offset)?,
                values: v.decode(self.batch, self.heads, self.offset)?,
            })),
            _ => Ok(None),
        }
    }
    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        create_attention_mask(n, self.offset, return_array, window_size)
    }
    fn state(&self) -> StateValue {
        let side = |s: &Option<Side>| match s {
            None => StateValue::None,
            Some(s) => s
                .state(self.batch, self.heads, self.offset)
                .unwrap_or(StateValue::None),
        };
        let dtype = self.keys.as_ref().map_or(Dtype::Float32, |k| k.dtype);
        StateValue::List(vec![
            side(&self.keys),
            side(&self.values),
            StateValue::count(self.offset),
            StateValue::Int(self.spec.bits.into()),
            StateValue::Int(self.spec.l.into()),
            StateValue::Str(dtype.name().to_string()),
            StateValue::count(self.spec.sink),
            StateValue::count(self.spec.window),
            StateValue::count(self.spec.history),
        ])
    }
    fn is_trimmable(&self) -> bool {
        true
    }
    fn can_trim(&self, n: usize) -> bool {
        match &self.keys {
            Some(k) => k.can_trim(self.offset, n.min(self.offset)),
            None => true,
        }
    }
    /// Refused (0, unchanged) where the exact window would lose tokens it needs (deeper than
    /// `history`, short of emptying the cache).
    fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset);
        if !self.can_trim(n) {
            return 0;
        }
        self.offset -= n;
        if self.offset == 0 {
            self.keys = None;
            self.values = None;
            self.batch = 0;
            self.heads = 0;
        } else {
            for s in [&mut self.keys, &mut self.values].into_iter().flatten() {
                s.truncate(self.offset);
            }
        }
        n
    }
    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Side::nbytes) + self.values.as_ref().map_or(0, Side::nbytes)
    }
    fn is_empty(&self) -> bool {
        self.keys.is_none()
    }
}
