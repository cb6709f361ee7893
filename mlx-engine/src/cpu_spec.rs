//! Greedy speculative decoding on the CPU decoder ([`CpuDecoder`]): a token drafter (prompt
//! lookup, any proposer) proposes up to `k` tokens, the decoder verifies the pending token and
//! all of them in one batched pass (`feed_all`: one block, every weight matrix read once for
//! the `k + 1` rows), the longest prefix on which its greedy choices agree is kept plus its
//! own next token, and the cache is truncated past what was kept. The MLX path's speculation
//! ([`crate::speculative`]) is the exact one; this is the fast one.
//!
//! Output is that of plain greedy decoding on the CPU decoder as long as a row of a block gives
//! the logits it gives fed alone, which `cpu_decode` does not promise bit for bit (the
//! products of a block take up to four rows a tile); `cargo xtask bench spec` reports whether
//! the two outputs agreed in each run.

use crate::cpu_decode::CpuDecoder;
use crate::error::{EngineError, Result};
use crate::speculative::SpecStats;

/// The first index of the largest value (MLX's `argmax`).
fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// What proposes the drafts: (tokens so far, most tokens to propose) -> proposals.
pub type Propose<'a> = dyn FnMut(&[u32], usize) -> Vec<u32> + 'a;

/// Plain greedy decoding on `dec` from an empty cache: `max_tokens` tokens after `prompt`
/// (`stop`: return early once it returns true for the token just emitted).
pub fn greedy(
    dec: &mut CpuDecoder<'_>,
    prompt: &[u32],
    max_tokens: usize,
    stop: &mut dyn FnMut(u32) -> bool,
) -> Result<Vec<u32>> {
    check(prompt)?;
    dec.reset();
    let mut out = Vec::with_capacity(max_tokens);
    let mut y = argmax(dec.feed(prompt)?);
    while out.len() < max_tokens {
        out.push(y);
        if stop(y) || out.len() == max_tokens {
            break;
        }
        y = argmax(dec.feed(&[y])?);
    }
    Ok(out)
}

fn check(prompt: &[u32]) -> Result<()> {
    if prompt.is_empty() {
        return Err(EngineError::Other(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    Ok(())
}

/// Speculative greedy decoding on `dec` from an empty cache: `max_tokens` tokens after
/// `prompt`, drafts of at most `k` tokens from `propose` verified in one pass each.
pub fn speculative_greedy(
    dec: &mut CpuDecoder<'_>,
    prompt: &[u32],
    max_tokens: usize,
    k: usize,
    propose: &mut Propose<'_>,
    stop: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, SpecStats)> {
    check(prompt)?;
    dec.reset();
    let mut stats = SpecStats::default();
    let mut history = prompt.to_vec();
    let mut out = Vec::with_capacity(max_tokens);
    let mut y = argmax(dec.feed(prompt)?);
    let mut preds = Vec::with_capacity(k + 1);
    'outer: while out.len() < max_tokens {
        out.push(y);
        history.push(y);
        if stop(y) || out.len() == max_tokens {
            break;
        }
        let room = max_tokens - out.len();
        let mut drafts = propose(&history, k.min(room));
        drafts.truncate(k.min(room));
        let base = dec.position();
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.push(y);
        input.extend_from_slice(&drafts);
        preds.clear();
        dec.feed_all(&input, &mut |_, l| preds.push(argmax(l)))?;
        let n = drafts
            .iter()
            .zip(&preds)
            .take_while(|(d, p)| d == p)
            .count();
        stats.rounds += 1;
        stats.drafted += drafts.len();
        stats.accepted += n;
        // The cache keeps `y` and the accepted drafts; the rest is rolled back.
        dec.truncate(base + 1 + n);
        for &d in &drafts[..n] {
            out.push(d);
            history.push(d);
            if stop(d) || out.len() == max_tokens {
                break 'outer;
            }
        }
        y = preds[n];
    }
    Ok((out, stats))
}

/// The log-probability of token `t` under logits `l` (`l[t] - logsumexp(l)`, on the host).
fn logprob(l: &[f32], t: u32) -> f32 {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = l.iter().map(|&v| (v - max).exp()).sum();
    l[t as usize] - max - sum.ln()
}

/// [`speculative_greedy`] as a step iterator, what
/// [`crate::stream::stream_generate_cpu_speculative`] streams: each call yields one token
/// (`(token, log-probability, from_draft)`); a verification pass runs when the tokens of the
/// last one are used up. The caller stops it (EOS, stop strings); `max_tokens` (`None`: no
/// limit) only bounds the drafts so no pass verifies tokens past it.
pub struct CpuSpecSteps<'m> {
    dec: CpuDecoder<'m>,
    propose: Box<Propose<'m>>,
    k: usize,
    max_tokens: Option<usize>,
    history: Vec<u32>,
    queue: std::collections::VecDeque<(u32, f32, bool)>,
    /// The decoder's next token (and its log-probability), not yet yielded nor in the cache.
    y: (u32, f32),
    /// Tokens yielded or queued.
    produced: usize,
    stats: SpecStats,
}

impl<'m> CpuSpecSteps<'m> {
    /// Runs the prompt through `dec` (from an empty cache) and gets ready to speculate with
    /// drafts of at most `k` tokens from `propose`.
    pub fn new(
        mut dec: CpuDecoder<'m>,
        prompt: &[u32],
        max_tokens: Option<usize>,
        k: usize,
        propose: Box<Propose<'m>>,
    ) -> Result<Self> {
        check(prompt)?;
        dec.reset();
        let l = dec.feed(prompt)?;
        let t = argmax(l);
        let y = (t, logprob(l, t));
        Ok(CpuSpecSteps {
            dec,
            propose,
            k,
            max_tokens,
            history: prompt.to_vec(),
            queue: Default::default(),
            y,
            produced: 0,
            stats: SpecStats::default(),
        })
    }

    /// Acceptance statistics so far.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// One verification pass: the pending token and the drafts queued, the decoder's next
    /// token pending.
    fn round(&mut self) -> Result<()> {
        let y = self.y.0;
        self.queue.push_back((y, self.y.1, false));
        self.history.push(y);
        self.produced += 1;
        let room = self
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(self.produced));
        if room == 0 {
            return Ok(());
        }
        let want = self.k.min(room);
        let mut drafts = (self.propose)(&self.history, want);
        drafts.truncate(want);
        let base = self.dec.position();
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.push(y);
        input.extend_from_slice(&drafts);
        let mut preds = Vec::with_capacity(input.len());
        self.dec.feed_all(&input, &mut |_, l| {
            let t = argmax(l);
            preds.push((t, logprob(l, t)));
        })?;
        let n = drafts
            .iter()
            .zip(&preds)
            .take_while(|(d, p)| **d == p.0)
            .count();
        self.stats.rounds += 1;
        self.stats.drafted += drafts.len();
        self.stats.accepted += n;
        self.dec.truncate(base + 1 + n);
        for (d, p) in drafts.iter().zip(&preds).take(n) {
            self.queue.push_back((*d, p.1, true));
            self.history.push(*d);
            self.produced += 1;
        }
        self.y = preds[n];
        Ok(())
    }

    /// The next token, its log-probability and whether a draft proposed it.
    pub fn next_token(&mut self) -> Result<(u32, f32, bool)> {
        if self.queue.is_empty() {
            self.round()?;
        }
        self.queue
            .pop_front()
            .ok_or_else(|| EngineError::Other("speculation produced no token".into()))
    }
}
