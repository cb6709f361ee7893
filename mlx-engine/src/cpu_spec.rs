//! Greedy speculative decoding on the CPU decoder ([`CpuDecoder`]): a token drafter (prompt
//! lookup, any proposer) proposes up to `k` tokens, the decoder verifies the pending token and
//! all of them in one batched pass ([`CpuDecoder::verify`]: every weight matrix, the head
//! included, read once for the `k + 1` rows), the longest prefix on which its greedy choices
//! agree is kept plus its own next token, and the cache is truncated past what was kept. The
//! MLX path's speculation ([`crate::speculative`]) is the exact one against mlx-lm; this is
//! the fast one.
//!
//! Output is that of plain greedy decoding on the CPU decoder, bit for bit: every row of a
//! verification pass gets the logits it gets fed alone (`tests/cpu_spec.rs` checks both).
//!
//! How many drafts a round asks for adapts ([`DraftLength`]): after a round whose drafts were
//! all accepted the next asks for more, after a miss it asks for one more than were accepted,
//! so rows that would be rejected are not paid for.

use mlx_core::prelude::*;

use crate::cpu_decode::CpuDecoder;
use crate::error::{EngineError, Result};

/// Acceptance statistics of a speculative generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verification passes of the target.
    pub rounds: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
}

impl SpecStats {
    /// Accepted over proposed (0 when nothing was proposed).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

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

/// Prompt lookup preferring context: among the earlier occurrences of the last `ngram` tokens
/// of `history` (prompt and output so far), the one whose match with the tokens before them
/// reaches furthest back (compared up to 64 tokens; the most recent on ties); drafts the up to
/// `k` tokens that followed it. Where the text being copied recurs (a passage quoted, then
/// edited), the occurrence in the same context beats the most recent one
/// ([`crate::speculative::prompt_lookup`]).
pub fn prompt_lookup_longest(history: &[u32], ngram: usize, k: usize) -> Vec<u32> {
    longest_match(history, ngram).map_or_else(Vec::new, |(_, from)| {
        history[from..(from + k).min(history.len())].to_vec()
    })
}

/// [`prompt_lookup_longest`] drafting no further than its evidence reaches: at most as many
/// tokens as the matched context is long (a one-token match drafts one, a match of eight up
/// to eight), so a weak match costs few verification rows and a long copied span drafts the
/// whole `k`.
pub fn prompt_lookup_by_context(history: &[u32], ngram: usize, k: usize) -> Vec<u32> {
    longest_match(history, ngram).map_or_else(Vec::new, |(len, from)| {
        history[from..(from + k.min(len)).min(history.len())].to_vec()
    })
}

/// How many tokens past the matched context [`prompt_lookup_drafts`] drafts: a match of `n`
/// tokens drafts up to `n + LOOKUP_SLACK`. None: a draft past its evidence is rejected more
/// often than its verification row repays (`spec_bench --simulate` over three prompts and
/// three measured cost curves, `results/bench/2026-12-04-s25-spec/`; again at the idle
/// machine's row cost in `results/spec/2026-12-06-s38-specpolicy/`).
pub const LOOKUP_SLACK: usize = 0;

/// The default most drafts a prompt-lookup round proposes (`--num-draft-tokens` with
/// `--prompt-lookup-ngram` when not given): 4, the best of 3-8 in the same simulations. A
/// pass then stays inside one tile of the multi-row kernels (up to six rows share a pass over
/// each weight block; a seventh costs a second pass).
pub const LOOKUP_DRAFTS: usize = 4;

/// The prompt-lookup rule every entry point drafts with, without memory ([`LookupDrafter`]
/// adds it): among the earlier occurrences (prompt and output so far) of `history`'s last
/// `ngram` tokens, the one whose match with the tokens before them reaches furthest back
/// ([`longest_match`]); the tokens that followed it, at most `k` and at most the matched
/// length plus [`LOOKUP_SLACK`]. A one-token match drafts one, a long copied span the whole
/// `k`. Measured against the other lookups in `results/bench/2026-12-04-s23-spec/` and (the
/// slack and `k`) `results/bench/2026-12-04-s25-spec/`.
pub fn prompt_lookup_drafts(history: &[u32], ngram: usize, k: usize) -> Vec<u32> {
    prompt_lookup_capped(history, ngram, k, LOOKUP_SLACK)
}

/// The prompt-lookup drafter every entry point drafts with (`mlx generate|chat|serve
/// --prompt-lookup-ngram N --num-draft-tokens K`, the MLX path's
/// [`crate::speculative::Drafter::PromptLookup`] and the CPU decoder's alike): the rule of
/// [`prompt_lookup_drafts`], plus a memory of where copying diverged. After a pass it sees
/// (in the next call's history) what the output did where its drafts were copied from: at
/// the first draft the output did not follow, the source position (an index into the
/// history) is remembered, and a later draft copied across that position stops before it.
/// The text being copied diverged there once (an edit the reply makes, a word it changes), so
/// verifying the copy's token there again mostly pays a rejected row. `k` stays the most
/// drafts a pass; the drafts only get shorter than [`prompt_lookup_drafts`]' (never longer),
/// and drafts only steer which rows a pass verifies, so the output is plain greedy decoding's
/// whatever they are. Simulated on five editing replies at three row costs
/// (`results/spec/2026-12-06-s38-specpolicy/`): never worse than the rule alone on any, on
/// the bench's copy-edit reply the same passes (no position diverges twice there).
///
/// One drafter per generation: it takes each call's history to extend the previous call's
/// (a shorter one starts its memory afresh).
#[derive(Clone, Debug, Default)]
pub struct LookupDrafter {
    ngram: usize,
    /// History positions where the output did not follow a draft copied from there.
    diverged: std::collections::HashSet<usize>,
    /// The last call's history length.
    seen: usize,
    /// The last call's drafts and the history position they were copied from.
    last: Option<(usize, Vec<u32>)>,
}

impl LookupDrafter {
    /// A drafter matching n-grams of `ngram` tokens (0: it never drafts).
    pub fn new(ngram: usize) -> LookupDrafter {
        LookupDrafter {
            ngram,
            ..Default::default()
        }
    }

    /// Up to `k` drafts after `history` (the prompt and output so far).
    pub fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32> {
        let last = self.last.take();
        if history.len() < self.seen {
            self.diverged.clear();
        } else if let Some((from, drafts)) = last {
            // What the output did after the last call's history, against what was copied.
            let got = &history[self.seen..];
            let n = drafts.iter().zip(got).take_while(|(a, b)| a == b).count();
            if n < drafts.len() && n < got.len() {
                self.diverged.insert(from + n);
            }
        }
        self.seen = history.len();
        if k == 0 {
            return Vec::new();
        }
        let Some((len, from)) = longest_match(history, self.ngram) else {
            return Vec::new();
        };
        let mut d = k.min(len + LOOKUP_SLACK).min(history.len() - from);
        if let Some(i) = (0..d).find(|i| self.diverged.contains(&(from + i))) {
            d = i;
        }
        let drafts = history[from..from + d].to_vec();
        if !drafts.is_empty() {
            self.last = Some((from, drafts.clone()));
        }
        drafts
    }

    /// The history positions remembered as diverged, in order.
    pub fn diverged(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.diverged.iter().copied().collect();
        v.sort_unstable();
        v
    }
}

/// [`prompt_lookup_drafts`] with the cap `matched length + slack` (the bench's simulator
/// compares slacks).
pub fn prompt_lookup_capped(history: &[u32], ngram: usize, k: usize, slack: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    longest_match(history, ngram).map_or_else(Vec::new, |(len, from)| {
        history[from..(from + k.min(len + slack)).min(history.len())].to_vec()
    })
}

/// The earlier occurrence of `history`'s last `ngram` tokens whose match with the tokens
/// before them reaches furthest back (up to 64; the most recent on ties): `(matched length,
/// the index after it)`.
pub fn longest_match(history: &[u32], ngram: usize) -> Option<(usize, usize)> {
    const REACH: usize = 64;
    let n = history.len();
    if ngram == 0 || n <= ngram {
        return None;
    }
    let tail = &history[n - ngram..];
    let mut best: Option<(usize, usize)> = None;
    for start in (0..n - ngram).rev() {
        if &history[start..start + ngram] != tail {
            continue;
        }
        let end = start + ngram;
        let mut len = ngram;
        while len < REACH.min(end) && history[end - 1 - len] == history[n - 1 - len] {
            len += 1;
        }
        if best.is_none_or(|(l, _)| len > l) {
            best = Some((len, end));
        }
    }
    best
}

/// A draft model on its own [`CpuDecoder`] as a proposer (`--draft-model` on the CPU
/// decoder): its cache follows the history (kept up to the longest prefix it shares with
/// what it was fed, the rest fed in one block), then it decodes `k` tokens greedily. Drafts
/// only steer which rows a verification pass runs, so the target's output is plain greedy
/// decoding's whatever the draft proposes. Ids the target cannot take (`>= vocab`, a draft
/// with a larger vocabulary) end the drafts.
pub struct CpuDraft<'m> {
    dec: CpuDecoder<'m>,
    /// The tokens the draft's cache holds.
    fed: Vec<u32>,
    /// The target's vocabulary size.
    vocab: usize,
    /// The first error the draft met (drafting stops after it; the target decodes on).
    error: Option<EngineError>,
}

impl<'m> CpuDraft<'m> {
    /// A drafter over `dec` (its cache is emptied) for a target of `vocab` logits.
    pub fn new(mut dec: CpuDecoder<'m>, vocab: usize) -> Self {
        dec.reset();
        CpuDraft {
            dec,
            fed: Vec::new(),
            vocab,
            error: None,
        }
    }

    /// Up to `k` greedy draft tokens after `history` (none once the draft has failed: see
    /// [`CpuDraft::error`]).
    pub fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32> {
        if k == 0 || history.is_empty() || self.error.is_some() {
            return Vec::new();
        }
        match self.try_propose(history, k) {
            Ok(d) => d,
            Err(e) => {
                self.error = Some(e);
                Vec::new()
            }
        }
    }

    /// Why drafting stopped, if it did.
    pub fn error(&self) -> Option<&EngineError> {
        self.error.as_ref()
    }

    fn try_propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        let common = self
            .fed
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count();
        // At least the last token is fed again: its logits give the first draft.
        let keep = common.min(history.len() - 1);
        self.dec.truncate(keep);
        self.fed.truncate(keep);
        let mut t = argmax(self.dec.feed(&history[keep..])?);
        self.fed.extend_from_slice(&history[keep..]);
        let mut out = Vec::with_capacity(k);
        loop {
            if t as usize >= self.vocab {
                break;
            }
            out.push(t);
            if out.len() == k {
                break;
            }
            let next = argmax(self.dec.feed(&[t])?);
            self.fed.push(t);
            t = next;
        }
        Ok(out)
    }
}

/// How many drafts the next round asks for: at most `max`; with `adaptive`, two more than the
/// last round's after a round whose drafts were all accepted, one more than were accepted
/// after a miss (so rejected rows are not verified again and again), never below one.
#[derive(Clone, Copy, Debug)]
pub struct DraftLength {
    pub max: usize,
    pub adaptive: bool,
    cur: usize,
}

impl DraftLength {
    /// At most `max` drafts a round, adapting when `adaptive`.
    pub fn new(max: usize, adaptive: bool) -> DraftLength {
        DraftLength {
            max,
            adaptive,
            cur: max,
        }
    }

    /// Drafts to ask for with `room` tokens left to produce.
    pub fn want(&self, room: usize) -> usize {
        self.cur.min(room)
    }

    /// Records a round: `drafted` proposed, `accepted` of them kept.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        if !self.adaptive || drafted == 0 {
            return;
        }
        self.cur = if accepted == drafted {
            self.cur.max(drafted) + 2
        } else {
            accepted + 1
        }
        .clamp(1, self.max.max(1));
    }
}

/// The greedy choice of every row of `logits` (`(rows, vocab)`) up to and including the first
/// that disagrees with the draft at its place: `preds[i]` is the target's token after input
/// `i`; returns how many drafts were accepted.
fn accept(logits: &[f32], vocab: usize, drafts: &[u32], preds: &mut Vec<u32>) -> usize {
    preds.clear();
    for row in logits.chunks_exact(vocab) {
        let t = argmax(row);
        preds.push(t);
        if drafts.get(preds.len() - 1) != Some(&t) {
            break;
        }
    }
    preds.len() - 1
}

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
        return Err(EngineError::EmptyPrompt {
            hint: String::new(),
        });
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
    let mut len = DraftLength::new(k, false);
    speculative_greedy_with(dec, prompt, max_tokens, &mut len, propose, stop)
}

/// [`speculative_greedy`] with the number of drafts a round asks for from `len`.
pub fn speculative_greedy_with(
    dec: &mut CpuDecoder<'_>,
    prompt: &[u32],
    max_tokens: usize,
    len: &mut DraftLength,
    propose: &mut Propose<'_>,
    stop: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, SpecStats)> {
    check(prompt)?;
    let k = len.max;
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
        let want = len.want(max_tokens - out.len());
        let mut drafts = propose(&history, want);
        drafts.truncate(want);
        let base = dec.position();
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.push(y);
        input.extend_from_slice(&drafts);
        let vocab = dec.vocab();
        let n = accept(dec.verify(&input)?, vocab, &drafts, &mut preds);
        len.update(drafts.len(), n);
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

/// Greedy choice and log-probability of one row of logits, as plain greedy decoding on the
/// CPU decoder computes a step's (`generate`'s `host_greedy`: [`mlx_core::cpu::greedy_lse`],
/// the first largest logit and MLX's CPU `logsumexp` replayed on the host bit for bit, then
/// the entry minus it), so speculation reports the bits plain decoding reports with no MLX
/// graph a pass. A row holding a NaN or no finite largest value takes [`argmax`] and MLX's
/// own `logsumexp` (as plain decoding's MLX fallback does).
fn pick(isa: mlx_core::cpu::Isa, row: &[f32]) -> Result<(u32, f32)> {
    match mlx_core::cpu::greedy_lse(isa, row) {
        Some((best, lse)) => Ok((best as u32, row[best] - lse)),
        None => {
            let t = argmax(row);
            Ok((t, mlx_logprob(row, t)?))
        }
    }
}

/// [`accept`] with each row's log-probability ([`pick`]) into `preds`.
fn accept_logprobs(
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    preds: &mut Vec<(u32, f32)>,
) -> Result<usize> {
    let isa = mlx_core::cpu::Isa::detect();
    preds.clear();
    for row in logits.chunks_exact(vocab) {
        let p = pick(isa, row)?;
        preds.push(p);
        if drafts.get(preds.len() - 1) != Some(&p.0) {
            break;
        }
    }
    Ok(preds.len() - 1)
}

/// `row`'s log-probability of `t` through MLX (`logsumexp` over the `(1, vocab)` row,
/// subtracted, the entry taken).
fn mlx_logprob(row: &[f32], t: u32) -> Result<f32> {
    let x = Array::from_slice(row, &[1, row.len() as i32])?;
    let lse = ops::logsumexp(&x, &[0, 1], true, None)?;
    let lp = ops::squeeze(&ops::subtract(&x, &lse, None)?, &[0], None)?;
    let v = ops::take(&lp, &Array::from_slice(&[t as i32], &[1])?, 0, None)?;
    Ok(v.to_vec::<f32>()?[0])
}

/// [`speculative_greedy`] as a step iterator, what
/// [`crate::stream::stream_generate_cpu_speculative`] streams: each call yields one token
/// (`(token, log-probability, from_draft)`). The decoder's own next token is yielded as soon
/// as it is known (after the prompt, after each pass), as plain decoding yields it; the
/// verification pass that feeds it with the drafts after it runs on the call after, so a
/// stream that stops at that token (EOS, `max_tokens`, a stop string) runs no pass for it.
/// `max_tokens` (`None`: no limit) only bounds the drafts so no pass verifies tokens past it.
pub struct CpuSpecSteps<'m> {
    dec: CpuDecoder<'m>,
    propose: Box<Propose<'m>>,
    len: DraftLength,
    max_tokens: Option<usize>,
    history: Vec<u32>,
    queue: std::collections::VecDeque<(u32, f32, bool)>,
    /// The decoder's next token (and its log-probability), not yet in the cache.
    y: (u32, f32),
    /// Whether `y` has been yielded (its pass runs on the next call).
    y_out: bool,
    /// Tokens yielded or queued.
    produced: usize,
    stats: SpecStats,
    /// The last pass's greedy choices and log-probabilities, and its input tokens (kept
    /// between passes: no allocation a pass).
    preds: Vec<(u32, f32)>,
    input: Vec<u32>,
}

impl<'m> CpuSpecSteps<'m> {
    /// Runs the prompt through `dec` (from an empty cache) and gets ready to speculate with
    /// drafts from `propose`, as many a round as `len` asks for (prompt lookup: a fixed
    /// [`DraftLength`], the policy caps drafts by their evidence; a draft model: adaptive).
    pub fn new(
        mut dec: CpuDecoder<'m>,
        prompt: &[u32],
        max_tokens: Option<usize>,
        len: DraftLength,
        propose: Box<Propose<'m>>,
    ) -> Result<Self> {
        dec.reset();
        Self::resume(dec, Vec::new(), prompt, max_tokens, len, propose)
    }

    /// As [`CpuSpecSteps::new`] over a decoder whose cache already holds `earlier` (a
    /// conversation's earlier turns, as [`CpuSpecSteps::into_decoder`] gave them back):
    /// `prompt` is fed after them and drafts are looked up in all of it.
    pub fn resume(
        mut dec: CpuDecoder<'m>,
        earlier: Vec<u32>,
        prompt: &[u32],
        max_tokens: Option<usize>,
        len: DraftLength,
        propose: Box<Propose<'m>>,
    ) -> Result<Self> {
        check(prompt)?;
        if earlier.len() != dec.position() {
            return Err(EngineError::Cache {
                what: "CPU speculation".into(),
                problem: format!(
                    "the decoder's cache holds {} tokens, {} were given as its contents",
                    dec.position(),
                    earlier.len()
                ),
            });
        }
        let mut history = earlier;
        history.extend_from_slice(prompt);
        let y = pick(mlx_core::cpu::Isa::detect(), dec.feed(prompt)?)?;
        Ok(CpuSpecSteps {
            dec,
            propose,
            len,
            max_tokens,
            history,
            queue: Default::default(),
            y,
            y_out: false,
            produced: 0,
            stats: SpecStats::default(),
            preds: Vec::new(),
            input: Vec::new(),
        })
    }

    /// Acceptance statistics so far.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The decoder and the tokens its cache holds, as plain decoding leaves them after the
    /// tokens yielded so far (the prompt and every yielded token; verified tokens not yet
    /// yielded are rolled back): what a conversation continues.
    pub fn into_decoder(mut self) -> (CpuDecoder<'m>, Vec<u32>) {
        // A yielded token whose pass has not run yet goes into the cache now (should that
        // fail, it is left out of both).
        if self.y_out && self.queue.is_empty() && self.dec.feed(&[self.y.0]).is_err() {
            self.history.pop();
        }
        let keep = self.dec.position().saturating_sub(self.queue.len());
        self.dec.truncate(keep);
        self.history.truncate(keep);
        (self.dec, self.history)
    }

    /// One verification pass: the yielded token `y` and the drafts after it, the accepted
    /// drafts queued, the decoder's next token pending (not yet yielded).
    fn round(&mut self) -> Result<()> {
        let y = self.y.0;
        let room = self
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(self.produced));
        // With no room left (a caller reading past `max_tokens`) `y` still runs, no drafts.
        let want = self.len.want(room);
        let mut drafts = (self.propose)(&self.history, want);
        drafts.truncate(want);
        let base = self.dec.position();
        let input = &mut self.input;
        input.clear();
        input.push(y);
        input.extend_from_slice(&drafts);
        let vocab = self.dec.vocab();
        let logits = self.dec.verify(input)?;
        let preds = &mut self.preds;
        let n = accept_logprobs(logits, vocab, &drafts, preds)?;
        self.len.update(drafts.len(), n);
        self.stats.rounds += 1;
        self.stats.drafted += drafts.len();
        self.stats.accepted += n;
        self.dec.truncate(base + 1 + n);
        for (d, p) in drafts.iter().zip(self.preds.iter()).take(n) {
            self.queue.push_back((*d, p.1, true));
            self.history.push(*d);
            self.produced += 1;
        }
        self.y = self.preds[n];
        self.y_out = false;
        Ok(())
    }

    /// The next token, its log-probability and whether a draft proposed it.
    pub fn next_token(&mut self) -> Result<(u32, f32, bool)> {
        if let Some(t) = self.queue.pop_front() {
            return Ok(t);
        }
        if self.y_out {
            self.round()?;
            if let Some(t) = self.queue.pop_front() {
                return Ok(t);
            }
        }
        // The decoder's own token: yielded before the pass that feeds it.
        self.y_out = true;
        self.history.push(self.y.0);
        self.produced += 1;
        Ok((self.y.0, self.y.1, false))
    }
}
