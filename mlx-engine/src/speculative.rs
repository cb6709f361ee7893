//! Speculative decoding, ported from mlx-lm 0.32.2 `generate.py` `speculative_generate_step`:
//! a drafter proposes up to `num_draft_tokens` tokens, the target verifies them all in one
//! forward pass, the longest prefix on which the target's own samples agree is kept plus the
//! target's next token, and the rejected tokens are trimmed from the caches.
//!
//! Two drafters: a draft model sharing the target's vocabulary (mlx-lm's; same draws from the
//! global random key in the same order, the same `from_draft` marks, the same per-position
//! logits-processor path with its `prev_tokens`), and prompt lookup (beyond mlx-lm): the tokens
//! that followed the most recent earlier occurrence of the last `ngram` tokens of the prompt and
//! output so far.
//!
//! Beyond mlx-lm, which refuses a cache it cannot trim: fresh caches are made with
//! [`LanguageModel::make_cache_with_rollback`], so recurrent state (`ArraysCache`) and rotating
//! caches past their window roll back exactly, and hybrids speculate with the output of plain
//! decoding.

use std::collections::VecDeque;

use mlx_cache::{trim_prompt_cache, ArraysCache, Cache, CacheList};
use mlx_core::memory;
use mlx_core::prelude::*;

pub use crate::cpu_spec::SpecStats;
use crate::error::{EngineError, Result};
use crate::generate::{
    check_request, maybe_quantize_kv_cache, next_item, on_generation_stream, step_iterator,
    GenerateOptions, Step,
};
use crate::sample::check_token_ids;
use crate::tokenizer::Tokenizer;
use mlx_models::LanguageModel;

/// What proposes the draft tokens.
pub enum Drafter<'m> {
    /// A smaller model with the target's vocabulary, with its caches (`None`: fresh ones).
    Model {
        model: &'m dyn LanguageModel,
        cache: Option<Vec<Box<dyn Cache>>>,
    },
    /// Prompt lookup by [`crate::cpu_spec::LookupDrafter`] (the drafter every entry point
    /// drafts with): the tokens after the earlier occurrence of the last `ngram` tokens
    /// (prompt and output so far) with the longest matching context, capped by that context
    /// and stopped before a position where copying diverged earlier; no draft when there is
    /// none.
    PromptLookup { ngram: usize },
    /// Any proposer: called with the prompt and output so far and the most tokens it may
    /// propose (tests force accept patterns with it).
    Custom(DraftFn<'m>),
    /// The target's own multi-token-prediction layers ([`LanguageModel::mtp`], loaded with
    /// `--mtp`), chained greedily on the target's final hidden states.
    Mtp,
    /// A drafter conditioned on the target's hidden states (block drafters such as
    /// [`BlockDrafter`]): it sees every kept position's final hidden state and proposes from
    /// them.
    Hidden(Box<dyn HiddenDrafter + 'm>),
}

/// A drafter that reads the target's hidden states: after every pass of the target (prefill
/// chunks and verifications) it is shown the final normed hidden states of the positions that
/// were kept, with the token that follows each; then it proposes the tokens after the last
/// one. Its proposals only decide how many tokens one verification yields: the output is the
/// target's whatever they are.
pub trait HiddenDrafter {
    /// `hidden` `(1, n, hidden)`: the target's final normed hidden states at `n` consecutive
    /// kept positions; `next[i]` the token that follows position `i`.
    fn observe(&mut self, hidden: &Array, next: &[u32]) -> Result<()>;
    /// Up to `k` tokens to follow the last observed `next` token.
    fn propose(&mut self, k: usize) -> Result<Vec<u32>>;
}

/// Greedy token of the last position of logits `(1, n, vocab)`.
fn last_argmax(logits: &Array) -> Result<u32> {
    let n = logits.dim(1)?;
    let row = ops::slice_axis(logits, 1, n - 1, n, None)?;
    let t = ops::argmax(&row, -1, false, None)?;
    Ok(t.astype(Dtype::Uint32)?
        .to_vec::<u32>()?
        .first()
        .copied()
        .unwrap_or(0))
}

/// The multi-token-prediction drafter: the first MTP layer over each kept position's hidden
/// state and next token (its own KV cache holds those), then chained on its own output for
/// the further drafts (what vLLM does when it drafts more tokens than a checkpoint has MTP
/// layers); those chained entries are trimmed before the next observation.
pub struct MtpDrafter<'m> {
    head: &'m dyn mlx_models::models::MtpHead,
    caches: Vec<Box<dyn Cache>>,
    /// The head's logits and hidden output at the last observed position.
    pending: Option<(Array, Array)>,
    /// Chained (speculative) entries in the cache.
    chained: usize,
}

impl<'m> MtpDrafter<'m> {
    pub fn new(head: &'m dyn mlx_models::models::MtpHead) -> Result<MtpDrafter<'m>> {
        if head.depth() == 0 {
            return Err(EngineError::Options {
                option: "--mtp".into(),
                problem: "the model has no multi-token-prediction layers".into(),
            });
        }
        Ok(MtpDrafter {
            head,
            caches: head.make_mtp_cache(),
            pending: None,
            chained: 0,
        })
    }

    fn last_rows(logits: &Array, h: &Array) -> Result<(Array, Array)> {
        let n = h.dim(1)?;
        Ok((
            ops::slice_axis(logits, 1, n - 1, n, None)?,
            ops::slice_axis(h, 1, n - 1, n, None)?,
        ))
    }
}

impl HiddenDrafter for MtpDrafter<'_> {
    fn observe(&mut self, hidden: &Array, next: &[u32]) -> Result<()> {
        if next.is_empty() {
            return Ok(());
        }
        if self.chained > 0 {
            trim_prompt_cache(&mut self.caches, self.chained);
            self.chained = 0;
        }
        let toks = ops::expand_dims(&uint_array(next)?, &[0], None)?;
        let (logits, h) = self
            .head
            .mtp_forward(0, hidden, &toks, &mut self.caches[0])?;
        let (l, h) = Self::last_rows(&logits, &h)?;
        let states: Vec<Array> = self
            .caches
            .iter()
            .flat_map(|c| c.state().into_arrays())
            .chain([l.clone(), h.clone()])
            .collect();
        mlx_core::eval(states.iter())?;
        self.pending = Some((l, h));
        Ok(())
    }

    fn propose(&mut self, k: usize) -> Result<Vec<u32>> {
        let Some((mut logits, mut h)) = self.pending.clone() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(k);
        while out.len() < k {
            let t = last_argmax(&logits)?;
            out.push(t);
            if out.len() == k {
                break;
            }
            let toks = ops::expand_dims(&uint_array(&[t])?, &[0], None)?;
            let (l, nh) = self.head.mtp_forward(0, &h, &toks, &mut self.caches[0])?;
            self.chained += 1;
            logits = l;
            h = nh;
        }
        Ok(out)
    }
}

/// A model's caches, one per layer.
pub type Caches = Vec<Box<dyn Cache>>;

/// The target's caches and the draft model's.
pub type CachePair = (Caches, Caches);

/// What [`Drafter::Custom`] calls: (tokens so far, most tokens to propose) -> proposals.
pub type DraftFn<'m> = Box<dyn FnMut(&[u32], usize) -> Vec<u32> + Send + 'm>;

impl std::fmt::Debug for Drafter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drafter::Model { model, .. } => write!(f, "Drafter::Model({})", model.model_type()),
            Drafter::PromptLookup { ngram } => write!(f, "Drafter::PromptLookup({ngram})"),
            Drafter::Custom(_) => f.write_str("Drafter::Custom(..)"),
            Drafter::Mtp => f.write_str("Drafter::Mtp"),
            Drafter::Hidden(_) => f.write_str("Drafter::Hidden(..)"),
        }
    }
}

/// mlx-lm's check before speculating with a draft model: the two tokenizers must have the
/// same vocabulary size (`draft_tokenizer.vocab_size != tokenizer.vocab_size`).
pub fn check_draft_tokenizer(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    if target.vocab_size() != draft.vocab_size() {
        return Err(EngineError::DraftVocabMismatch {
            draft: draft.vocab_size(),
            model: target.vocab_size(),
        });
    }
    Ok(())
}

/// Whether a caller's cache can be rolled back by speculative decoding: trimmable now, or a
/// recurrent cache that records its recent states.
fn can_roll_back(c: &dyn Cache) -> bool {
    if c.is_trimmable() {
        return true;
    }
    let any = c.as_any();
    if let Some(a) = any.downcast_ref::<ArraysCache>() {
        return a.keeps_history();
    }
    if let Some(l) = any.downcast_ref::<CacheList>() {
        return l.caches().iter().all(|c| can_roll_back(c.as_ref()));
    }
    false
}

/// Python's `list[:end]` length for a list of `len` items.
fn py_end(len: usize, end: isize) -> usize {
    if end < 0 {
        len.saturating_sub(end.unsigned_abs())
    } else {
        (end as usize).min(len)
    }
}

/// The tokens after the most recent earlier occurrence of the last `ngram` tokens of
/// `history`, at most `k` of them (the lookup before [`crate::cpu_spec::prompt_lookup_drafts`];
/// the bench's simulator compares against it).
pub fn prompt_lookup(history: &[u32], ngram: usize, k: usize) -> Vec<u32> {
    if ngram == 0 || k == 0 || history.len() <= ngram {
        return Vec::new();
    }
    let tail = &history[history.len() - ngram..];
    // Start positions of earlier occurrences, most recent first (the tail itself excluded).
    for start in (0..history.len() - ngram).rev() {
        if &history[start..start + ngram] == tail {
            let from = start + ngram;
            let to = (from + k).min(history.len());
            return history[from..to].to_vec();
        }
    }
    Vec::new()
}

/// A block drafter (the shape DFlash-style drafters take): from the target's final hidden
/// state at the last kept position it proposes a whole block of `block` tokens in one pass,
/// `head(h @ proj_j^T)` for `j = 1..=block` as one product (`proj`: `(block * hidden,
/// hidden)`) and one pass of the target's output head. Its tap is the final normed hidden
/// state (the target's `forward_hidden`); weights load from a safetensors file holding
/// `proj.weight`. No trained drafter of this kind is reachable here: [`BlockDrafter::distill`]
/// fits one by least squares on hidden states the target produced (a tiny budget).
pub struct BlockDrafter {
    head: mlx_models::models::OutputHead,
    proj: Array,
    block: usize,
    hidden: usize,
    last: Option<Array>,
}

impl BlockDrafter {
    /// A drafter of `proj` `(block * hidden, hidden)` over the target's output head.
    pub fn new(model: &dyn LanguageModel, proj: Array) -> Result<BlockDrafter> {
        let head = model.output_head().ok_or_else(|| EngineError::Draft {
            what: "block drafter".into(),
            problem: format!("`{}` does not expose its output head", model.model_type()),
        })?;
        let shape = proj.shape();
        let ok = shape.len() == 2 && shape[1] > 0 && shape[0] > 0 && shape[0] % shape[1] == 0;
        if !ok {
            return Err(EngineError::Draft {
                what: "block drafter".into(),
                problem: format!("`proj.weight` must be (block * hidden, hidden), got {shape:?}"),
            });
        }
        Ok(BlockDrafter {
            head,
            block: (shape[0] / shape[1]) as usize,
            hidden: shape[1] as usize,
            proj: proj.astype(Dtype::Float32)?,
            last: None,
        })
    }

    /// Loads `proj.weight` from the safetensors file `path`.
    pub fn load(model: &dyn LanguageModel, path: &std::path::Path) -> Result<BlockDrafter> {
        let (mut t, _) = mlx_core::io::load_safetensors(path, None)?;
        let proj = t.remove("proj.weight").ok_or_else(|| EngineError::Draft {
            what: path.display().to_string(),
            problem: "block drafter weights need a `proj.weight` tensor".into(),
        })?;
        BlockDrafter::new(model, proj)
    }

    /// Tokens one pass proposes.
    pub fn block(&self) -> usize {
        self.block
    }

    /// The projection, to save (`proj.weight`).
    pub fn proj(&self) -> &Array {
        &self.proj
    }

    /// Fits `proj` for `block` tokens by ridge regression (`lambda`) on `states`: the final
    /// hidden states `(t, hidden)` of consecutive positions of some text the target ran:
    /// `proj_j` maps the state at `i` to the state at `i + j` (the one whose head gives the
    /// token the drafter must propose `j`-th). In float64 on the host.
    pub fn distill(states: &Array, block: usize, lambda: f64) -> Result<Array> {
        let shape = states.shape();
        if shape.len() != 2 || shape[0] as usize <= block || block == 0 {
            return Err(EngineError::Draft {
                what: "block drafter".into(),
                problem: format!(
                    "distilling {block} tokens needs more than {block} hidden states (t, \
                     hidden), got {shape:?}"
                ),
            });
        }
        let (t, d) = (shape[0] as usize, shape[1] as usize);
        let x: Vec<f64> = states
            .astype(Dtype::Float32)?
            .to_vec::<f32>()?
            .into_iter()
            .map(f64::from)
            .collect();
        let mut out = vec![0f32; block * d * d];
        for j in 1..=block {
            let n = t - j;
            // A = X^T X + lambda I, B = X^T Y over the pairs (x_i, x_{i+j}).
            let mut a = vec![0f64; d * d];
            let mut b = vec![0f64; d * d];
            for i in 0..n {
                let xi = &x[i * d..(i + 1) * d];
                let yi = &x[(i + j) * d..(i + j + 1) * d];
                for r in 0..d {
                    let xr = xi[r];
                    for c in 0..d {
                        a[r * d + c] += xr * xi[c];
                        b[r * d + c] += xr * yi[c];
                    }
                }
            }
            for r in 0..d {
                a[r * d + r] += lambda;
            }
            // Solve A W = B (W: (d, d), y = x W) by Gaussian elimination with pivoting.
            let w = solve(&mut a, &mut b, d)?;
            // proj_j = W^T: (out d, in d), row-major; block rows stacked.
            for r in 0..d {
                for c in 0..d {
                    out[(j - 1) * d * d + r * d + c] = w[c * d + r] as f32;
                }
            }
        }
        Ok(Array::from_slice(&out, &[(block * d) as i32, d as i32])?)
    }
}

/// Solves `a x = b` for `x` (`a`: (d, d), `b`: (d, m) with m = d), in place.
fn solve(a: &mut [f64], b: &mut [f64], d: usize) -> Result<Vec<f64>> {
    let m = b.len() / d;
    for col in 0..d {
        let piv = (col..d)
            .max_by(|&i, &j| a[i * d + col].abs().total_cmp(&a[j * d + col].abs()))
            .unwrap_or(col);
        if a[piv * d + col].abs() < 1e-300 {
            return Err(EngineError::Draft {
                what: "block drafter".into(),
                problem: "the hidden states are degenerate (singular system)".into(),
            });
        }
        if piv != col {
            for c in 0..d {
                a.swap(piv * d + c, col * d + c);
            }
            for c in 0..m {
                b.swap(piv * m + c, col * m + c);
            }
        }
        let p = a[col * d + col];
        for r in 0..d {
            if r == col {
                continue;
            }
            let f = a[r * d + col] / p;
            if f == 0.0 {
                continue;
            }
            for c in col..d {
                a[r * d + c] -= f * a[col * d + c];
            }
            for c in 0..m {
                b[r * m + c] -= f * b[col * m + c];
            }
        }
    }
    let mut x = vec![0f64; d * m];
    for r in 0..d {
        let p = a[r * d + r];
        for c in 0..m {
            x[r * m + c] = b[r * m + c] / p;
        }
    }
    Ok(x)
}

impl HiddenDrafter for BlockDrafter {
    fn observe(&mut self, hidden: &Array, next: &[u32]) -> Result<()> {
        if next.is_empty() {
            return Ok(());
        }
        let n = hidden.dim(1)?;
        let h = ops::slice_axis(hidden, 1, n - 1, n, None)?;
        if h.shape().last().copied() != Some(self.hidden as i32) {
            return Err(EngineError::Draft {
                what: "block drafter".into(),
                problem: format!(
                    "built for hidden size {}, the model's is {:?}",
                    self.hidden,
                    h.shape().last()
                ),
            });
        }
        h.eval()?;
        self.last = Some(h);
        Ok(())
    }

    fn propose(&mut self, k: usize) -> Result<Vec<u32>> {
        let Some(h) = &self.last else {
            return Ok(Vec::new());
        };
        let d = self.hidden as i32;
        let h = h.reshape(&[1, d])?.astype(Dtype::Float32)?;
        // One pass: every block position's state, then the head over all of them.
        let z = ops::matmul(&h, &self.proj.transpose(&[1, 0])?, None)?;
        let z = z.reshape(&[1, self.block as i32, d])?;
        let logits = self.head.forward(&z)?;
        let t = ops::argmax(&logits, -1, false, None)?;
        let mut out = t.astype(Dtype::Uint32)?.to_vec::<u32>()?;
        out.truncate(k);
        Ok(out)
    }
}

/// One verification round's tokens, handed out one by one as mlx-lm's generator yields them.
struct Round {
    num_draft: usize,
    /// Accepted draft tokens.
    accepted: usize,
    /// (token, logprobs, from_draft) still to hand out.
    queue: VecDeque<(u32, Array, bool)>,
    /// mlx-lm's `n` at the last token handed out (what its `finally` rewinds with).
    n_now: usize,
    /// The target's token after the accepted ones, and the last draft token.
    next: u32,
    last_draft: Option<u32>,
    /// `max_tokens` was reached in this round.
    last: bool,
}

/// The token stream of [`speculative_generate_step`]: [`Step`]s with `from_draft` set.
pub struct SpeculativeStep<'m> {
    model: &'m dyn LanguageModel,
    caches: Vec<Box<dyn Cache>>,
    draft: Option<(&'m dyn LanguageModel, Caches)>,
    /// Prompt lookup or a custom proposer, when there is no draft model.
    propose: Option<DraftFn<'m>>,
    /// A drafter shown the target's hidden states (MTP, block drafters).
    hidden: Option<Box<dyn HiddenDrafter + 'm>>,
    /// The target's hidden states of its last pass, when `hidden` is set.
    last_hidden: Option<Array>,
    num_draft_tokens: usize,
    opts: GenerateOptions,
    prev_tokens: Option<Vec<i32>>,
    /// The target's pending input (`y`) and the draft model's (`draft_y`).
    y: Vec<u32>,
    draft_y: Vec<u32>,
    /// Prompt and emitted tokens (prompt lookup searches them).
    history: Vec<u32>,
    round: Option<Round>,
    /// The round's bookkeeping (cache rewind, next inputs) is still owed.
    owed: bool,
    ntoks: usize,
    /// Generated tokens the target's cache holds once the owed rewind is done.
    emitted_before_round: usize,
    done: bool,
    stats: SpecStats,
    /// How many tokens of `history` the target's and the draft model's caches hold.
    target_len: usize,
    draft_len: usize,
    /// MLX's CUDA back-end on the GPU: see [`few_query_attention`].
    cuda_attention: bool,
}

/// Starts speculative generation from `prompt` (token ids): the target `model` with its
/// caches (`None`: fresh caches able to roll back `num_draft_tokens + 1` tokens), the drafter,
/// and `generate_step`'s options (`max_kv_size`, `prompt_progress`, `compiled_decode` and
/// `eval_probe` do not apply, as mlx-lm drops `max_kv_size` and the progress callback;
/// `cpu_decode` is refused).
pub fn speculative_generate_step<'m>(
    prompt: &[i32],
    model: &'m dyn LanguageModel,
    prompt_cache: Option<Vec<Box<dyn Cache>>>,
    drafter: Drafter<'m>,
    num_draft_tokens: usize,
    opts: GenerateOptions,
) -> Result<SpeculativeStep<'m>> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt {
            hint: String::new(),
        });
    }
    if opts.prefill_step_size == 0 {
        return Err(EngineError::NotPositive {
            option: "prefill_step_size".into(),
        });
    }
    if opts.grammar.is_some() {
        return Err(EngineError::Conflict(
            "constrained decoding (a grammar, --json-schema) does not combine with speculative \
             decoding"
                .into(),
        ));
    }
    if opts.cpu_decode.is_some() {
        return Err(EngineError::Conflict(
            "speculative decoding runs on the MLX path: the CPU decoder cannot verify draft \
             tokens (use --decoder mlx)"
                .into(),
        ));
    }
    let vocab = check_request(model, prompt, &opts)?;
    let depth = num_draft_tokens + 1;
    let caches = match prompt_cache {
        Some(c) => {
            if let Some(bad) = c.iter().find(|c| !can_roll_back(c.as_ref())) {
                return Err(EngineError::UntrimmableCache {
                    class: bad.class_name().to_string(),
                });
            }
            c
        }
        None => {
            let c = model.make_cache_with_rollback(depth);
            // mlx-lm checks its fresh caches too: a cache kind that cannot go back (deepseek_v41's
            // `LayerCache`) would keep the rejected drafts.
            if let Some(bad) = c.iter().find(|c| !can_roll_back(c.as_ref())) {
                return Err(EngineError::UntrimmableCache {
                    class: bad.class_name().to_string(),
                });
            }
            c
        }
    };
    let mut hidden: Option<Box<dyn HiddenDrafter + 'm>> = None;
    let (draft, propose): (_, Option<DraftFn<'m>>) = match drafter {
        Drafter::Model { model: d, cache } => {
            if d.vocab_size() > vocab {
                return Err(EngineError::DraftVocabTooLarge {
                    draft: d.vocab_size(),
                    model: vocab,
                });
            }
            let dc = match cache {
                Some(c) => c,
                None => {
                    let c = d.make_cache_with_rollback(depth);
                    if let Some(bad) = c.iter().find(|c| !can_roll_back(c.as_ref())) {
                        return Err(EngineError::Cache {
                            what: "Speculative decoding".into(),
                            problem: format!(
                                "requires a trimmable draft cache (got {})",
                                bad.class_name()
                            ),
                        });
                    }
                    c
                }
            };
            (Some((d, dc)), None)
        }
        Drafter::PromptLookup { ngram } => {
            if ngram == 0 {
                return Err(EngineError::Options {
                    option: "prompt lookup".into(),
                    problem: "the n-gram size must be at least 1".into(),
                });
            }
            (
                None,
                Some({
                    let mut lookup = crate::cpu_spec::LookupDrafter::new(ngram);
                    Box::new(move |h: &[u32], k: usize| lookup.propose(h, k))
                }),
            )
        }
        Drafter::Custom(f) => (None, Some(f)),
        Drafter::Mtp => {
            let head = model.mtp().ok_or_else(|| EngineError::Options {
                option: "--mtp".into(),
                problem: "the model was loaded without multi-token-prediction layers".into(),
            })?;
            hidden = Some(Box::new(MtpDrafter::new(head)?));
            (None, None)
        }
        Drafter::Hidden(h) => {
            hidden = Some(h);
            (None, None)
        }
    };
    if hidden.is_some() && model.output_head().is_none() {
        return Err(EngineError::ModelLacks {
            model_type: model.model_type().to_string(),
            problem: "does not expose its hidden states: a hidden-state drafter cannot follow it"
                .into(),
        });
    }
    let ids: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let mut g = SpeculativeStep {
        model,
        caches,
        draft,
        propose,
        hidden,
        last_hidden: None,
        num_draft_tokens,
        opts,
        prev_tokens: None,
        y: Vec::new(),
        draft_y: Vec::new(),
        history: ids.clone(),
        round: None,
        owed: false,
        ntoks: 0,
        emitted_before_round: 0,
        done: false,
        stats: SpecStats::default(),
        target_len: prompt.len() - 1,
        draft_len: prompt.len() - 1,
        cuda_attention: mlx_core::Device::default_device()?.kind == mlx_core::DeviceType::Gpu
            && mlx_core::kernels::KernelBackend::native()
                == Some(mlx_core::kernels::KernelBackend::Cuda),
    };
    on_generation_stream(|| {
        if let Some((d, mut dc)) = g.draft.take() {
            g.draft_y = g.prefill(d, &mut dc, &ids, false)?;
            g.draft = Some((d, dc));
        }
        let mut caches = std::mem::take(&mut g.caches);
        let r = g.prefill(model, &mut caches, &ids, true);
        g.caches = caches;
        g.y = r?;
        Ok(())
    })?;
    Ok(g)
}

/// Queries at most this many rows over a longer cache attend through the bucketed attention
/// on CUDA.
const FEW_QUERIES: i32 = 32;
/// The key buckets of that attention (mlx-lm's KV cache grows by 256 positions too).
const KEY_BUCKET: i32 = 256;

/// The attention of a verification round (and of a draft step) on MLX's CUDA back-end. There MLX
/// sends attention with more than one query row to cuDNN, whose graph cache is keyed by the
/// shapes: every round's key length is new, so every round built a new cuDNN graph, which cost
/// more than the round's other work (results/gpu/2026-12-04-s24-spec-attn). A forward of
/// 2..=FEW_QUERIES queries over a longer cache attends over keys padded to a multiple of
/// KEY_BUCKET, the padding masked ([`mlx_models::layers::bucketed_scaled_dot_product_attention`]:
/// cuDNN builds one graph a bucket, and plain ops over keys that grow pay a per-shape cost of
/// their own; the figures are in that folder); an array mask (a sliding
/// window) goes through plain ops ([`mlx_models::layers::plain_scaled_dot_product_attention`]).
/// Everything else, and every other back-end (the CPU path is untouched), keeps MLX's SDPA.
/// Against mlx-lm's cuDNN attention on the GPU the tier is L3 (a different reduction order).
fn few_query_attention() -> std::rc::Rc<mlx_models::layers::DenseAttention> {
    std::rc::Rc::new(|q: &Array, k: &Array, v: &Array, scale: f32, mask| {
        let (ql, kl) = (q.dim(2)?, k.dim(2)?);
        if !(2..=FEW_QUERIES).contains(&ql) || kl <= ql {
            return Ok(None);
        }
        use mlx_models::layers::{
            bucketed_scaled_dot_product_attention, plain_scaled_dot_product_attention,
        };
        Ok(Some(
            match bucketed_scaled_dot_product_attention(q, k, v, scale, mask, KEY_BUCKET)? {
                Some(out) => out,
                None => plain_scaled_dot_product_attention(q, k, v, scale, mask)?,
            },
        ))
    })
}

fn uint_array(ids: &[u32]) -> Result<Array> {
    Ok(Array::from_slice(ids, &[ids.len() as i32])?)
}

impl<'m> SpeculativeStep<'m> {
    /// Acceptance statistics so far.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The target's caches and the draft model's (empty for prompt lookup), after the rewind
    /// mlx-lm's generator does when it is closed.
    pub fn into_caches(mut self) -> Result<CachePair> {
        self.close()?;
        let draft = self.draft.take().map(|(_, c)| c).unwrap_or_default();
        Ok((std::mem::take(&mut self.caches), draft))
    }

    /// How many generated tokens the target's cache holds after [`Self::into_caches`].
    pub fn cached_generated(&self) -> usize {
        self.round
            .as_ref()
            .map_or(0, |r| self.emitted_before_round + r.n_now)
    }

    /// mlx-lm's `finally: _rewind_cache(num_draft, n)`.
    fn close(&mut self) -> Result<()> {
        if self.owed {
            self.owed = false;
            if let Some(r) = &self.round {
                let (nd, n) = (r.num_draft, r.n_now);
                self.rewind(nd, n);
            }
        }
        Ok(())
    }

    fn rewind(&mut self, num_draft: usize, num_accept: usize) {
        self.target_len -= trim_prompt_cache(&mut self.caches, num_draft - num_accept);
        if let Some((_, dc)) = self.draft.as_mut() {
            self.draft_len -= trim_prompt_cache(dc, (num_draft - num_accept).saturating_sub(1));
        }
    }

    /// [`Self::into_caches`], then every token generated but not yet in a cache run through
    /// it, so both caches hold the prompt and every generated token (what plain decoding
    /// leaves): a conversation continues them as it would continue plain decoding's.
    pub fn into_synced_caches(mut self) -> Result<CachePair> {
        self.close()?;
        on_generation_stream(|| {
            let model = self.model;
            let rest = self.history[self.target_len.min(self.history.len())..].to_vec();
            if !rest.is_empty() {
                let x = ops::expand_dims(&uint_array(&rest)?, &[0], None)?;
                model.forward(&x, Some(&mut self.caches))?;
                self.target_len += rest.len();
            }
            if let Some((d, dc)) = self.draft.as_mut() {
                let rest = &self.history[self.draft_len.min(self.history.len())..];
                if !rest.is_empty() {
                    let x = ops::expand_dims(&uint_array(rest)?, &[0], None)?;
                    d.forward(&x, Some(dc))?;
                    self.draft_len += rest.len();
                }
            }
            let states: Vec<Array> = self
                .caches
                .iter()
                .chain(self.draft.iter().flat_map(|(_, dc)| dc.iter()))
                .flat_map(|c| c.state().into_arrays())
                .collect();
            mlx_core::eval(states.iter())?;
            Ok(())
        })?;
        let draft = self.draft.take().map(|(_, c)| c).unwrap_or_default();
        Ok((std::mem::take(&mut self.caches), draft))
    }

    fn quantize(&self, caches: &mut [Box<dyn Cache>]) -> Result<()> {
        maybe_quantize_kv_cache(
            caches,
            self.opts.quantized_kv_start,
            self.opts.kv_group_size,
            self.opts.kv_bits,
            self.opts.kv_mode,
        )
    }

    /// `_prefill`: all but the last token in chunks; returns the rest.
    fn prefill(
        &mut self,
        model: &dyn LanguageModel,
        caches: &mut [Box<dyn Cache>],
        prompt: &[u32],
        target: bool,
    ) -> Result<Vec<u32>> {
        let mut y = uint_array(prompt)?;
        let mut rest = prompt;
        while rest.len() > 1 {
            let n = self.opts.prefill_step_size.min(rest.len() - 1);
            let chunk = ops::slice_axis(&y, 0, 0, n as i32, None)?;
            let x = ops::expand_dims(&chunk, &[0], None)?;
            if target && self.hidden.is_some() {
                self.forward_tapped(model, caches, &x)?;
                if let (Some(h), Some(d)) = (self.last_hidden.take(), self.hidden.as_mut()) {
                    d.observe(&h, &rest[1..=n])?;
                }
            } else {
                model.forward(&x, Some(caches))?;
            }
            self.quantize(caches)?;
            let states: Vec<Array> = caches
                .iter()
                .flat_map(|c| c.state().into_arrays())
                .collect();
            mlx_core::eval(states.iter())?;
            rest = &rest[n..];
            y = ops::slice_axis(&y, 0, n as i32, (n + rest.len()) as i32, None)?;
            memory::clear_cache()?;
        }
        Ok(rest.to_vec())
    }

    /// The target's forward as hidden states then its head, keeping the hidden states for the
    /// hidden-state drafter (the same ops as `forward`).
    fn forward_tapped(
        &mut self,
        model: &dyn LanguageModel,
        caches: &mut [Box<dyn Cache>],
        x: &Array,
    ) -> Result<Array> {
        let head = model.output_head().ok_or_else(|| EngineError::ModelLacks {
            model_type: model.model_type().to_string(),
            problem: "has no output head".into(),
        })?;
        let h =
            model
                .forward_hidden_cached(x, caches)
                .ok_or_else(|| EngineError::ModelLacks {
                    model_type: model.model_type().to_string(),
                    problem: "does not expose its hidden states".into(),
                })??;
        let logits = head.forward(&h)?;
        self.last_hidden = Some(h);
        Ok(logits)
    }

    /// `_process_and_sample`: processors, log-probabilities over the last axis, the sampler.
    fn process_and_sample(&self, tokens: Option<&[i32]>, logits: Array) -> Result<(Array, Array)> {
        let mut logits = logits;
        if let Some(t) = tokens {
            for p in &self.opts.logits_processors {
                logits = p.apply(t, &logits)?;
            }
        }
        let lse = ops::logsumexp(&logits, &[-1], true, None)?;
        let logprobs = ops::subtract(&logits, &lse, None)?;
        let y = self.opts.sampler.sample(&logprobs)?;
        Ok((y, logprobs))
    }

    /// `_step(model, cache, y, n_predict)`: tokens `(n_predict,)` and log-probabilities
    /// `(n_predict, vocab)`.
    fn step(
        &mut self,
        model: &dyn LanguageModel,
        caches: &mut [Box<dyn Cache>],
        y: &Array,
        n_predict: usize,
        target: bool,
    ) -> Result<(Array, Array)> {
        let x = ops::expand_dims(y, &[0], None)?;
        let mut forward = |this: &mut Self| -> Result<Array> {
            if target && this.hidden.is_some() {
                this.forward_tapped(model, caches, &x)
            } else {
                Ok(model.forward(&x, Some(caches))?)
            }
        };
        let logits = if self.cuda_attention {
            mlx_models::layers::with_dense_attention(few_query_attention(), || forward(self))?
        } else {
            forward(self)?
        };
        let len = logits.dim(1)?;
        let np = n_predict as i32;
        let logits = ops::slice_axis(&logits, 1, len - np, len, None)?;
        self.quantize(caches)?;
        if self.opts.logits_processors.is_empty() {
            return self.process_and_sample(None, ops::squeeze(&logits, &[0], None)?);
        }
        let mut y = if n_predict > 1 {
            ops::slice_axis(y, 0, 0, y.size() as i32 - (np - 1), None)?
        } else {
            y.clone()
        };
        let (mut out_y, mut out_lp) = (Vec::new(), Vec::new());
        for i in 0..np {
            let ids = y.astype(Dtype::Int32)?.to_vec::<i32>()?;
            let prev = self.prev_tokens.get_or_insert_with(Vec::new);
            prev.extend_from_slice(&ids);
            let prev = prev.clone();
            let row = ops::squeeze(&ops::slice_axis(&logits, 1, i, i + 1, None)?, &[1], None)?;
            let (ny, lp) = self.process_and_sample(Some(&prev), row)?;
            out_y.push(ny.clone());
            out_lp.push(lp);
            y = ny;
        }
        Ok((
            ops::concatenate(&out_y.iter().collect::<Vec<_>>(), 0, None)?,
            ops::concatenate(&out_lp.iter().collect::<Vec<_>>(), 0, None)?,
        ))
    }

    /// `_draft_generate`: `num_draft` tokens from the draft model, chained lazily.
    fn draft_generate(&mut self, num_draft: usize) -> Result<Option<Array>> {
        if num_draft == 0 {
            return Ok(None);
        }
        let Some((d, mut dc)) = self.draft.take() else {
            return Ok(None);
        };
        let mut ys = Vec::new();
        let r = (|| -> Result<()> {
            let mut y = uint_array(&self.draft_y)?;
            for _ in 0..num_draft {
                self.draft_len += y.size();
                let (ny, _) = self.step(d, &mut dc, &y, 1, false)?;
                mlx_core::async_eval([&ny])?;
                ys.push(ny.clone());
                y = ny;
            }
            Ok(())
        })();
        self.draft = Some((d, dc));
        r?;
        Ok(Some(ops::concatenate(
            &ys.iter().collect::<Vec<_>>(),
            0,
            None,
        )?))
    }

    /// The bookkeeping after a round's tokens were handed out: the next inputs,
    /// `prev_tokens` and the caches' rewind.
    fn finish_round(&mut self) -> Result<()> {
        let Some(r) = &self.round else { return Ok(()) };
        if !self.owed || r.last {
            return Ok(());
        }
        let (num_draft, n, next, last_draft) = (r.num_draft, r.accepted, r.next, r.last_draft);
        self.y = vec![next];
        self.draft_y = match (n == num_draft, last_draft) {
            (true, Some(d)) => vec![d, next],
            _ => vec![next],
        };
        if let Some(p) = self.prev_tokens.as_mut() {
            let end = py_end(p.len(), -(num_draft.saturating_sub(n).max(1) as isize));
            p.truncate(end);
        }
        self.owed = false;
        self.rewind(num_draft, n);
        Ok(())
    }

    fn new_round(&mut self) -> Result<()> {
        self.finish_round()?;
        let vocab = self.model.vocab_size();
        let remaining = self
            .opts
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(self.ntoks));
        let mut num_draft = remaining.min(self.num_draft_tokens);
        let drafts: Option<Array> = if self.draft.is_some() {
            self.draft_generate(num_draft)?
        } else if let Some(h) = self.hidden.as_mut() {
            let mut d = h.propose(num_draft)?;
            d.truncate(num_draft);
            num_draft = d.len();
            let ids: Vec<i32> = d.iter().map(|&t| t as i32).collect();
            check_token_ids("draft token", &ids, vocab)?;
            (!d.is_empty()).then(|| uint_array(&d)).transpose()?
        } else {
            let mut d = match self.propose.as_mut() {
                Some(f) => f(&self.history, num_draft),
                None => Vec::new(),
            };
            d.truncate(num_draft);
            num_draft = d.len();
            let ids: Vec<i32> = d.iter().map(|&t| t as i32).collect();
            check_token_ids("draft token", &ids, vocab)?;
            (!d.is_empty()).then(|| uint_array(&d)).transpose()?
        };
        if let Some(p) = self.prev_tokens.as_mut() {
            let end = p.len() as isize - self.y.len() as isize - num_draft as isize + 1;
            let end = py_end(p.len(), end);
            p.truncate(end);
        }
        let y = uint_array(&self.y)?;
        let input = match &drafts {
            Some(d) => ops::concatenate(&[&y, d], 0, None)?,
            None => y,
        };
        let mut caches = std::mem::take(&mut self.caches);
        self.target_len += input.size();
        let stepped = self.step(self.model, &mut caches, &input, num_draft + 1, true);
        self.caches = caches;
        let (tokens, logprobs) = stepped?;
        match &drafts {
            Some(d) => mlx_core::eval([&tokens, d])?,
            None => tokens.eval()?,
        }
        let draft_tokens: Vec<u32> = match &drafts {
            Some(d) => d.astype(Dtype::Uint32)?.to_vec::<u32>()?,
            None => Vec::new(),
        };
        let tokens: Vec<u32> = tokens.astype(Dtype::Uint32)?.to_vec::<u32>()?;
        let as_i32 = |v: &[u32]| v.iter().map(|&t| t as i32).collect::<Vec<_>>();
        if let Some((d, _)) = &self.draft {
            check_token_ids(
                "target token fed to the draft model",
                &as_i32(&tokens),
                d.vocab_size(),
            )?;
        }
        let max = self.opts.max_tokens;
        let mut queue = VecDeque::new();
        let mut n = 0;
        let mut last = false;
        while n < num_draft {
            if tokens[n] != draft_tokens[n] {
                break;
            }
            queue.push_back((
                tokens[n],
                logprobs.slice_axis(0, n as i32, n as i32 + 1)?,
                true,
            ));
            n += 1;
            if max == Some(self.ntoks + queue.len()) {
                last = true;
                break;
            }
        }
        if !last {
            queue.push_back((
                tokens[n],
                logprobs.slice_axis(0, n as i32, n as i32 + 1)?,
                false,
            ));
            last = max == Some(self.ntoks + queue.len());
        }
        if let (Some(h), Some(d)) = (self.last_hidden.take(), self.hidden.as_mut()) {
            let kept = ops::slice_axis(&h, 1, 0, n as i32 + 1, None)?;
            d.observe(&kept, &tokens[..=n])?;
        }
        self.stats.rounds += 1;
        self.stats.drafted += num_draft;
        self.stats.accepted += n;
        self.emitted_before_round = self.ntoks;
        self.round = Some(Round {
            num_draft,
            accepted: n,
            queue,
            n_now: 0,
            next: tokens[n.min(tokens.len() - 1)],
            last_draft: draft_tokens.last().copied(),
            last,
        });
        self.owed = true;
        Ok(())
    }

    fn advance(&mut self) -> Result<Option<Step>> {
        if self.done {
            return Ok(None);
        }
        if self.round.as_ref().is_none_or(|r| r.queue.is_empty()) {
            if self.round.as_ref().is_some_and(|r| r.last) {
                self.done = true;
                return Ok(None);
            }
            self.new_round()?;
        }
        let Some(r) = self.round.as_mut() else {
            return Ok(None);
        };
        let Some((token, lp, from_draft)) = r.queue.pop_front() else {
            return Ok(None);
        };
        r.n_now = if from_draft { r.n_now + 1 } else { r.accepted };
        self.ntoks += 1;
        self.history.push(token);
        Ok(Some(Step {
            token,
            logprobs: ops::squeeze(&lp, &[0], None)?,
            from_draft,
            logprob: None,
        }))
    }
}

step_iterator!(SpeculativeStep);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lookup_takes_the_most_recent_match() {
        let h = [1, 2, 3, 9, 1, 2, 4, 5, 1, 2];
        assert_eq!(prompt_lookup(&h, 2, 3), vec![4, 5, 1]);
        assert_eq!(prompt_lookup(&h, 3, 3), Vec::<u32>::new());
        assert_eq!(prompt_lookup(&[7, 7], 1, 4), vec![7]);
        assert_eq!(prompt_lookup(&h, 0, 3), Vec::<u32>::new());
        assert_eq!(prompt_lookup(&h, 2, 0), Vec::<u32>::new());
    }

    #[test]
    fn python_slice_ends() {
        assert_eq!(py_end(5, -1), 4);
        assert_eq!(py_end(5, -7), 0);
        assert_eq!(py_end(5, 3), 3);
        assert_eq!(py_end(5, 9), 5);
        assert_eq!(py_end(5, 0), 0);
    }
}
