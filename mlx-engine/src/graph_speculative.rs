//! Draft-model speculation on the GPU graph decoder (#33): the draft model decodes on a graph
//! decoder of its own and the target verifies each round's drafts in one batched graph step
//! ([`GraphDecoder::verify_greedy`]: the round's K + 1 tokens as K + 1 rows of one sequence,
//! sharing its cache at consecutive positions). Rejected positions are rolled back by moving
//! each decoder's position ([`GraphDecoder::rewind`]; the next steps overwrite them).
//!
//! The draft runs one step past its K drafts, caching the last one while the target verifies
//! (each decoder has its own CUDA stream, so the step can overlap the verification), instead
//! of a catch-up step on it after a fully accepted round (`MLX_GRAPH_SPEC_OVERLAP=0`).
//!
//! Greedy only. Tier: the tokens are plain greedy graph decoding's (`mlx generate` on the
//! graph decoder), bit for bit: a verify row computes what a single step computes, in the same
//! order (the FFMA kernels sum each row alone; the tensor-core tiles, which would not, are off),
//! so the target's greedy pick at every position is the one plain decoding makes; a draft only
//! decides how many of them one pass yields. The prompt runs through the MLX path
//! ([`generate_step`]) for both models, as plain graph decoding's does, and the first token is
//! the MLX forward's. The `cuda` test `graph_speculative_equals_plain` checks it on a device.

use std::collections::VecDeque;

use mlx_core::Array;
use mlx_kernels::graph_decode::{GraphDecoder, GraphOptions, MAX_SEQUENCES, MMA_MIN_SEQUENCES};
use mlx_models::LanguageModel;

use crate::generate::{
    generate_step, on_generation_stream, DevicePeak, GenerateOptions, GRAPH_DEFAULT_ROOM,
};
use crate::speculative::SpecStats;
use crate::{EngineError, Result};

/// Why draft-model speculation cannot run on the graph decoder for `target` and `draft` with
/// `opts` and `num_draft_tokens` (`None`: it can).
pub fn unsupported(
    target: &dyn LanguageModel,
    draft: &dyn LanguageModel,
    opts: &GenerateOptions,
    num_draft_tokens: usize,
) -> Option<String> {
    if opts.sampler.settings().temp != 0.0 {
        return Some("it speculates greedily only (a temperature was given)".into());
    }
    if !opts.logits_processors.is_empty() {
        return Some("it speculates greedily only (logits processors were given)".into());
    }
    if num_draft_tokens == 0 || num_draft_tokens + 1 > MAX_SEQUENCES as usize {
        return Some(format!(
            "it verifies 1 to {} draft tokens a pass, not {num_draft_tokens}",
            MAX_SEQUENCES - 1
        ));
    }
    if let Some(why) = crate::generate::graph_decode_unsupported(target, opts, false) {
        return Some(why);
    }
    if let Some(why) = crate::graph::model_unsupported(draft) {
        return Some(format!("the draft model: {why}"));
    }
    match crate::graph::map_model(target) {
        Ok((spec, _)) if GraphDecoder::max_sequences(&spec) < 2 => Some(format!(
            "`{}` decodes one row a step on the graph decoder (a mixture of experts, \
             trellis-coded linears, or inputs that fill the shared memory), so its drafts \
             cannot be verified in one step",
            spec.model_type
        )),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Whether `--decoder auto` speculates on the graph decoder where both models qualify (greedy,
/// on a GPU, `--dtype auto`). On since session 30's device run (an H100,
/// results/gpu/2026-12-05-s30-h100): `graph_speculative_equals_plain` passed and the bench's
/// speculating tokens equalled plain greedy graph decoding's; `verify_equals_single_steps`
/// had its verify groups bit-equal to single steps (its failure was the test's own row count).
pub const BY_DEFAULT: bool = true;

/// `MLX_GRAPH_SPEC_TENSOR_CORES=1`, for measuring only: the target verifies tiles of at least
/// [`MMA_MIN_SEQUENCES`] rows on the tensor cores ([`GraphOptions::tensor_cores_from`]),
/// whose sums run in another order than a single step's: the tokens are then within the
/// tensor-core tiles' L3 bounds of plain greedy graph decoding's, no longer equal to them by
/// construction. The FFMA verify rows cost ~1.4 ms each at 8B (compute-bound; session 30's
/// H100), the most of a round's time past the ideal; this shows what the tiles would save.
fn tensor_core_verify() -> Option<u32> {
    (std::env::var("MLX_GRAPH_SPEC_TENSOR_CORES").as_deref() == Ok("1"))
        .then_some(MMA_MIN_SEQUENCES)
}

/// Weight rows a warp in the verify target's FFMA tiles: 4, where plain decoding's one-row
/// step keeps [`GraphOptions::default`]'s 2. A tile of 5 sequences of the 8B-shaped 4-bit
/// model ran 143.3 steps/s at 4 against 127.2 at 2 (+12.7%, one H100 call,
/// results/gpu/2026-12-06-s40-h100/); a row's bits do not depend on it.
const VERIFY_ROWS_PER_WARP: u32 = 4;

/// The verify target's matrix-vector launch settings. They change speed, never a row's bits
/// (each lane sums its chunks in the same order whatever they are). A/B runs on a device
/// override them: `MLX_GRAPH_SPEC_ROWS=2|4` ([`GraphOptions::rows_per_warp`], default
/// [`VERIFY_ROWS_PER_WARP`], or 2 where `MLX_GRAPH_SPEC_CHUNKS` asks for more than 4 chunks),
/// `MLX_GRAPH_SPEC_CHUNKS=N` ([`GraphOptions::chunks_in_flight`])
/// and `MLX_GRAPH_SPEC_MIN_BLOCKS=N` ([`GraphOptions::min_blocks_per_sm`]); the decoder's
/// defaults otherwise.
fn verify_launch_options() -> GraphOptions {
    let num = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    let d = GraphOptions::default();
    let chunks = num("MLX_GRAPH_SPEC_CHUNKS");
    // More chunks in flight than 4 rows a warp allow (16 loads a lane) keep the 2 rows a warp
    // they were valid with before 4 became the default.
    let rows = num("MLX_GRAPH_SPEC_ROWS").unwrap_or(match chunks {
        Some(c) if c.saturating_mul(VERIFY_ROWS_PER_WARP) > 16 => d.rows_per_warp,
        _ => VERIFY_ROWS_PER_WARP,
    });
    GraphOptions {
        rows_per_warp: rows,
        chunks_in_flight: chunks.or(d.chunks_in_flight),
        min_blocks_per_sm: num("MLX_GRAPH_SPEC_MIN_BLOCKS").or(d.min_blocks_per_sm),
        ..d
    }
}

/// `MLX_GRAPH_SPEC_BREAKDOWN=REPS` (measuring only): before the first round, each part of the
/// target's step ([`GraphDecoder::kernel_breakdown`], `REPS` replays) with the verify
/// target's K + 1 rows and with one row (a decoder of one row built for it, then dropped),
/// alternated three times, to stderr: what a verify row costs each kernel, side by side in
/// one process (results/gpu/2026-12-05-s31-spec).
fn verify_breakdown(
    verify: &mut GraphDecoder,
    spec: &mlx_kernels::graph_decode::GraphSpec,
    weights: &mlx_kernels::graph_decode::GraphWeights,
    kv: &[(Array, Array)],
    room: usize,
) -> Result<()> {
    let Some(reps) = std::env::var("MLX_GRAPH_SPEC_BREAKDOWN")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|&r| r > 0)
    else {
        return Ok(());
    };
    let mut one = GraphDecoder::new(spec.clone(), weights, room)?;
    one.set_prefix(kv)?;
    let rows = verify.sequences();
    // Per part: the one-row and the verify times of each alternation.
    let mut times: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for _ in 0..3 {
        for (which, dec) in [(0, &mut one), (1, &mut *verify)] {
            for (i, p) in dec.kernel_breakdown(reps)?.into_iter().enumerate() {
                if times.len() <= i {
                    times.push((format!("{:?}", p.part), Vec::new(), Vec::new()));
                }
                let t = &mut times[i];
                if which == 0 { &mut t.1 } else { &mut t.2 }.push(p.us_per_step);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (mut sum1, mut sumv) = (0.0, 0.0);
    for (part, a, b) in times.iter_mut() {
        let (a, b) = (median(a), median(b));
        sum1 += a;
        sumv += b;
        eprintln!(
            "[graph verify breakdown] `{}` {part}: 1 row {a:.1} us, {rows} rows {b:.1} us \
             ({:.2}x)",
            spec.model_type,
            b / a.max(1e-9)
        );
    }
    eprintln!(
        "[graph verify breakdown] `{}` parts' sum: 1 row {sum1:.1} us, {rows} rows {sumv:.1} us \
         ({:.2}x; medians of 3, {reps} replays each)",
        spec.model_type,
        sumv / sum1.max(1e-9)
    );
    Ok(())
}

/// A prompt's first token, its log-probability and its keys and values per layer.
type Prefilled = (u32, f32, Vec<(Array, Array)>);

/// The prompt through the MLX path as `generate_step` runs it: the first token, its
/// log-probability and the prompt's keys and values (per layer), as the graph decoder takes
/// them.
fn prefill(model: &dyn LanguageModel, ids: &[i32], opts: &GenerateOptions) -> Result<Prefilled> {
    let mut o = opts.clone();
    o.graph_decode = false;
    o.cpu_decode = None;
    o.graph_keep = None;
    o.graph_stand_in = None;
    o.max_tokens = Some(1);
    o.prompt_progress = None;
    let mut g = generate_step(ids, model, None, o)?;
    let first = g.next().ok_or_else(|| EngineError::Internal {
        what: "graph speculation".into(),
        problem: "the prompt gave no token".into(),
    })??;
    let lp = match first.logprob {
        Some(lp) => lp,
        None => first.logprobs.to_vec_f32()?[first.token as usize],
    };
    let mut caches = g.into_cache();
    // The MLX path ran the first token's step ahead: keep the prompt's positions only.
    for c in caches.iter_mut() {
        let extra = c.offset().saturating_sub(ids.len());
        if extra > 0 && c.trim(extra) != extra {
            return Err(EngineError::GraphDecoderUnsupported(format!(
                "speculation on the graph decoder: a {} of the prompt could not drop the \
                 token run ahead ({} positions for a prompt of {})",
                c.class_name(),
                c.offset(),
                ids.len()
            )));
        }
    }
    let kv = crate::generate::graph_prefix(&caches)?;
    Ok((first.token, lp, kv))
}

/// The prompts are in (MLX's path ran them, no decoder held): the build's window of `peak`
/// begins, `build` makes the decoder pair (and says the device bytes it holds outside MLX's
/// allocator), and those bytes count from that window on: beside MLX's peak of the time they
/// were held, not beside the prompts'.
fn pair_window<T>(peak: &mut DevicePeak, build: impl FnOnce() -> Result<(T, usize)>) -> Result<T> {
    peak.switch(0)?;
    let (pair, bytes) = build()?;
    peak.built(bytes)?;
    Ok(pair)
}

/// What a speculation round asks of a decoder: the CUDA graph decoder's calls (and a stand-in
/// in the unit tests, which check the rounds' bookkeeping against plain greedy decoding over
/// random acceptance patterns on a machine without CUDA).
pub trait VerifyDecoder {
    /// Cached positions.
    fn position(&self) -> usize;
    /// The most positions the cache holds.
    fn capacity(&self) -> usize;
    /// Feeds tokens into the cache, keeping nothing else.
    fn feed(&mut self, tokens: &[u32]) -> mlx_core::Result<()>;
    /// Greedy decoding from `first` for up to `max_steps` tokens ([`Self::next_token`]).
    fn start(&mut self, first: u32, max_steps: usize) -> mlx_core::Result<()>;
    /// The next greedy token and its log-probability.
    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)>;
    /// `tokens` at consecutive positions in one pass: each one's greedy next token.
    fn verify_greedy(&mut self, tokens: &[u32]) -> mlx_core::Result<Vec<(u32, f32)>>;
    /// Moves the position back to `pos`.
    fn rewind(&mut self, pos: usize) -> mlx_core::Result<()>;
    /// Device bytes it holds outside MLX's allocator.
    fn device_bytes(&self) -> usize {
        0
    }
}

impl VerifyDecoder for GraphDecoder {
    fn position(&self) -> usize {
        GraphDecoder::position(self)
    }
    fn capacity(&self) -> usize {
        GraphDecoder::capacity(self)
    }
    fn feed(&mut self, tokens: &[u32]) -> mlx_core::Result<()> {
        GraphDecoder::feed(self, tokens)
    }
    fn start(&mut self, first: u32, max_steps: usize) -> mlx_core::Result<()> {
        GraphDecoder::start(self, first, max_steps)
    }
    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)> {
        GraphDecoder::next_token(self)
    }
    fn verify_greedy(&mut self, tokens: &[u32]) -> mlx_core::Result<Vec<(u32, f32)>> {
        GraphDecoder::verify_greedy(self, tokens)
    }
    fn rewind(&mut self, pos: usize) -> mlx_core::Result<()> {
        GraphDecoder::rewind(self, pos)
    }
    fn device_bytes(&self) -> usize {
        GraphDecoder::device_bytes(self)
    }
}

/// Greedy speculation on the graph decoder: [`GraphSpecSteps::next_token`] gives the tokens.
pub struct GraphSpecSteps {
    target: Box<dyn VerifyDecoder>,
    draft: Box<dyn VerifyDecoder>,
    k: usize,
    /// The last token given out, not yet in either cache (it goes in at the target's position).
    y: u32,
    /// Tokens the draft's cache lacks before `y` (the last draft of a round it fully accepted).
    draft_behind: Vec<u32>,
    /// Tokens verified and not yet given out: token, log-probability, from the draft.
    queue: VecDeque<(u32, f32, bool)>,
    /// Tokens still to produce (`None`: up to the caches' room).
    left: Option<usize>,
    stats: SpecStats,
    /// `MLX_GRAPH_SPEC_PROFILE`'s per-part times (host wall clock), or none.
    profile: Option<Profile>,
    /// The draft runs one step past its K drafts (the last draft into its cache) while the
    /// target verifies, on its own stream, instead of a catch-up step on the last draft after
    /// a fully accepted round (`MLX_GRAPH_SPEC_OVERLAP=0` turns it off, for A/B runs).
    overlap: bool,
    /// MLX's peak and the pair's own bytes as held at once (as a plain graph run's,
    /// [`crate::generate::GenerateStep::device_peak`]): the prompts' window without the pair,
    /// the build's and the decode's with it. `None` for decoders built by the caller
    /// ([`Self::from_decoders`]).
    peak: Option<DevicePeak>,
}

/// Where speculation's rounds spend their time (`MLX_GRAPH_SPEC_PROFILE=1`: a summary on
/// stderr when the generation ends; `=2`: also one line a round). Host wall clock around each
/// part; every part ends waiting for its GPU work (a read or a synchronize), so each part's
/// time is its GPU time plus its host overhead: `catch_up` the draft's step on the last
/// draft of a fully accepted round (`feed`, one synchronize), `drafts` the draft's K steps
/// (`start`: a state upload; K `next_token`: queued replays, one read each), `verify` the
/// target's K + 1 rows (a state upload, the replay, K + 1 reads), `rest` the rewinds and the
/// bookkeeping.
#[derive(Debug, Default)]
struct Profile {
    per_round: bool,
    rounds: usize,
    fed_rounds: usize,
    draft_steps: usize,
    verify_rows: usize,
    tokens: usize,
    /// Seconds: catch-up, drafts, verify, rest.
    parts: [f64; 4],
}

impl Profile {
    fn from_env() -> Option<Profile> {
        match std::env::var("MLX_GRAPH_SPEC_PROFILE").ok()?.trim() {
            "1" => Some(Profile::default()),
            "2" => Some(Profile {
                per_round: true,
                ..Profile::default()
            }),
            _ => None,
        }
    }

    /// One round: the parts' seconds, draft steps, verify rows, tokens it gave.
    fn add(&mut self, parts: [f64; 4], fed: bool, drafts: usize, rows: usize, tokens: usize) {
        self.rounds += 1;
        self.fed_rounds += usize::from(fed);
        self.draft_steps += drafts;
        self.verify_rows += rows;
        self.tokens += tokens;
        for (a, b) in self.parts.iter_mut().zip(parts) {
            *a += b;
        }
        if self.per_round {
            let us = parts.map(|x| x * 1e6);
            eprintln!(
                "graph spec round {}: catch-up {:.0} us, {drafts} drafts {:.0} us, verify {rows} \
                 rows {:.0} us, rest {:.0} us, {tokens} tokens",
                self.rounds, us[0], us[1], us[2], us[3]
            );
        }
    }

    fn summary(&self) -> String {
        let r = self.rounds.max(1) as f64;
        let us = |s: f64, n: usize| if n == 0 { 0.0 } else { s * 1e6 / n as f64 };
        let total: f64 = self.parts.iter().sum();
        format!(
            "graph spec profile: {} rounds, {} tokens ({:.2} a round), {:.0} us a round: \
             catch-up {:.0} us a round ({} rounds fed, {:.0} us each), drafts {:.0} us a round \
             ({:.1} steps, {:.0} us a step), verify {:.0} us a round ({:.1} rows), rest {:.0} us; \
             {:.1} tok/s over the rounds",
            self.rounds,
            self.tokens,
            self.tokens as f64 / r,
            total * 1e6 / r,
            self.parts[0] * 1e6 / r,
            self.fed_rounds,
            us(self.parts[0], self.fed_rounds),
            self.parts[1] * 1e6 / r,
            self.draft_steps as f64 / r,
            us(self.parts[1], self.draft_steps),
            self.parts[2] * 1e6 / r,
            self.verify_rows as f64 / r,
            self.parts[3] * 1e6 / r,
            if total > 0.0 {
                self.tokens as f64 / total
            } else {
                0.0
            },
        )
    }
}

impl Drop for GraphSpecSteps {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            if p.rounds > 0 {
                eprintln!("{}", p.summary());
            }
        }
    }
}

impl std::fmt::Debug for GraphSpecSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphSpecSteps")
            .field("k", &self.k)
            .field("position", &self.target.position())
            .field("stats", &self.stats)
            .finish()
    }
}

impl GraphSpecSteps {
    /// Runs the prompt `ids` through both models (the MLX path), builds their graph decoders
    /// (the target's with `num_draft_tokens + 1` rows) and copies the prompts' caches in.
    /// `opts.max_tokens` bounds the tokens (and sizes the caches).
    pub fn new(
        target: &dyn LanguageModel,
        draft: &dyn LanguageModel,
        ids: &[i32],
        opts: &GenerateOptions,
        num_draft_tokens: usize,
    ) -> Result<Self> {
        if let Some(why) = unsupported(target, draft, opts, num_draft_tokens) {
            return Err(EngineError::GraphDecoderUnsupported(format!(
                "speculation on the graph decoder: {why}"
            )));
        }
        if opts.grammar.is_some() {
            return Err(EngineError::GraphDecoderUnsupported(
                "speculation on the graph decoder: constrained decoding".into(),
            ));
        }
        let k = num_draft_tokens;
        // The prompts' window: MLX's path alone, no decoder held.
        let mut peak = DevicePeak::start(0)?;
        let (first, lp, kv) = prefill(target, ids, opts)?;
        let (_, _, dkv) = prefill(draft, ids, opts)?;
        let room = ids.len() + opts.max_tokens.unwrap_or(GRAPH_DEFAULT_ROOM) + k + 2;
        let map = |m: &dyn LanguageModel| {
            crate::graph::map_model(m)
                .map_err(|e| EngineError::GraphDecoderUnsupported(e.to_string()))
        };
        let (tspec, tweights) = map(target)?;
        let (dspec, dweights) = map(draft)?;
        let (target_dec, draft_dec) = on_generation_stream(|| {
            mlx_core::synchronize()?;
            pair_window(&mut peak, || {
                // The verify rows share row 0's cache slot (one slot, not K + 1) where they fit
                // one launch's tile; past it each row keeps a slot (a second tile's rows in row
                // 0's slot failed a launch's bounds check on session 30's H100).
                let opts = GraphOptions {
                    sequences: (k + 1) as u32,
                    one_cache_slot: k < GraphDecoder::max_sequences(&tspec) as usize,
                    tensor_cores_from: tensor_core_verify(),
                    ..verify_launch_options()
                };
                let mut t = GraphDecoder::with_options(tspec.clone(), &tweights, room, &opts)?;
                let mut d = GraphDecoder::new(dspec, &dweights, room)?;
                t.set_prefix(&kv)?;
                d.set_prefix(&dkv)?;
                // A measurement only (`MLX_GRAPH_SPEC_BREAKDOWN`): its failure is reported,
                // not the speculation's.
                if let Err(e) = verify_breakdown(&mut t, &tspec, &tweights, &kv, room) {
                    eprintln!("[graph verify breakdown] not measured: {e}");
                }
                mlx_core::synchronize()?;
                let bytes = t.device_bytes() + d.device_bytes();
                Ok(((t, d), bytes))
            })
        })?;
        let mut steps = Self::from_decoders(
            Box::new(target_dec),
            Box::new(draft_dec),
            (first, lp),
            opts.max_tokens,
            k,
        );
        steps.peak = Some(peak);
        Ok(steps)
    }

    /// Speculation over two decoders whose caches hold the same prompt, `first` (and its
    /// log-probability) the target's token after it: the first token given out.
    pub fn from_decoders(
        target: Box<dyn VerifyDecoder>,
        draft: Box<dyn VerifyDecoder>,
        first: (u32, f32),
        max_tokens: Option<usize>,
        num_draft_tokens: usize,
    ) -> Self {
        let mut queue = VecDeque::new();
        queue.push_back((first.0, first.1, false));
        GraphSpecSteps {
            target,
            draft,
            k: num_draft_tokens,
            y: first.0,
            draft_behind: Vec::new(),
            queue,
            left: max_tokens.map(|m| m.saturating_sub(1)),
            stats: SpecStats::default(),
            profile: Profile::from_env(),
            overlap: std::env::var("MLX_GRAPH_SPEC_OVERLAP").as_deref() != Ok("0"),
            peak: None,
        }
    }

    /// Device bytes both decoders hold outside MLX's allocator (their weights as the kernels
    /// take them, caches, activations): a generation's reported peak adds them.
    pub fn device_bytes(&self) -> usize {
        self.target.device_bytes() + self.draft.device_bytes()
    }

    /// The most bytes this run held on the device at once, MLX's allocator and the pair's own
    /// buffers together: the pair's bytes beside MLX's peak of the time they were held, not
    /// beside the prompts' (MLX's path ran them before the pair was built). For decoders
    /// built by the caller ([`Self::from_decoders`]): MLX's peak plus their bytes, an upper
    /// bound.
    pub fn device_peak(&self) -> Result<usize> {
        Ok(match &self.peak {
            Some(p) => p.now()?,
            None => mlx_core::memory::peak_memory()? + self.device_bytes(),
        })
    }

    /// The acceptance statistics so far.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The next token, its log-probability and whether the draft proposed it.
    pub fn next_token(&mut self) -> Result<(u32, f32, bool)> {
        if self.queue.is_empty() {
            self.round()?;
        }
        self.queue.pop_front().ok_or_else(|| EngineError::Internal {
            what: "graph speculation".into(),
            problem: "a round gave no token".into(),
        })
    }

    /// One round: up to K drafts from the draft's decoder, verified in one pass of the target;
    /// the accepted drafts and the target's own next token go to the queue.
    fn round(&mut self) -> Result<()> {
        // A failed round leaves both decoders as they were: their positions are their caches'
        // state (keys past a position are overwritten before they are read), so rewinding both
        // and restoring the draft's catch-up tokens and the queue undoes it.
        let (tp, dp) = (self.target.position(), self.draft.position());
        let (behind, queued) = (self.draft_behind.clone(), self.queue.len());
        let r = self.round_inner();
        if r.is_err() {
            let _ = self.target.rewind(tp);
            let _ = self.draft.rewind(dp);
            self.draft_behind = behind;
            self.queue.truncate(queued);
        }
        r
    }

    fn round_inner(&mut self) -> Result<()> {
        let p = self.target.position();
        let room = self.target.capacity().saturating_sub(p);
        if room == 0 {
            return Err(EngineError::Options {
                option: "max_tokens".into(),
                problem: format!("the graph decoders' caches are full ({p} positions)"),
            });
        }
        // mlx-lm drafts min(num_draft_tokens, tokens left) a round.
        let mut k = self.k.min(room - 1);
        if let Some(left) = self.left {
            k = k.min(left);
        }
        let clock = self.profile.as_ref().map(|_| std::time::Instant::now());
        let mut marks = [0f64; 3];
        let mut mark = |i: usize| {
            if let Some(c) = clock {
                marks[i] = c.elapsed().as_secs_f64();
            }
        };
        let fed = !self.draft_behind.is_empty();
        if fed {
            let behind = std::mem::take(&mut self.draft_behind);
            self.draft.feed(&behind)?;
        }
        mark(0);
        let mut tokens = Vec::with_capacity(k + 1);
        tokens.push(self.y);
        // With `overlap`, one step past the drafts: it caches the last draft while the target
        // verifies (each decoder has its own stream); its token is not used.
        let extra = usize::from(self.overlap && k > 0);
        if k > 0 {
            self.draft.start(self.y, k + extra)?;
            for _ in 0..k {
                tokens.push(self.draft.next_token()?.0);
            }
        }
        mark(1);
        let out = self.target.verify_greedy(&tokens)?;
        mark(2);
        if let Some(&(t, lp)) = out.iter().find(|o| !o.1.is_finite()) {
            return Err(EngineError::GraphDecoderUnsupported(format!(
                "the graph decoder gave token {t} a log-probability of {lp}"
            )));
        }
        let n = (0..k).take_while(|&i| tokens[i + 1] == out[i].0).count();
        for (i, &(t, lp)) in out.iter().enumerate().take(n + 1) {
            self.queue.push_back((t, lp, i < n));
        }
        self.target.rewind(p + n + 1)?;
        if k > 0 {
            if n < k {
                // Drops the extra step too (its position is past the rewind).
                self.draft.rewind(p + n + 1)?;
            } else if extra == 1 {
                // The extra step cached the last draft: the draft is level with the target.
                self.draft.next_token()?;
            } else {
                // The draft fed y and its first k - 1 drafts; the last one goes in next round.
                self.draft_behind.push(tokens[k]);
            }
        } else {
            // No draft this round: the draft's cache takes y next round.
            self.draft_behind.push(self.y);
        }
        self.y = out[n].0;
        self.left = self.left.map(|l| l - (n + 1).min(l));
        self.stats.rounds += 1;
        self.stats.drafted += k;
        self.stats.accepted += n;
        if let (Some(p), Some(c)) = (self.profile.as_mut(), clock) {
            let end = c.elapsed().as_secs_f64();
            let parts = [
                marks[0],
                marks[1] - marks[0],
                marks[2] - marks[1],
                end - marks[2],
            ];
            p.add(parts, fed, k, tokens.len(), n + 1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod peak_tests {
    use super::*;

    /// Graph speculation's reported peak (`GraphSpecSteps::device_peak`, what every response
    /// reports and `mlx_core::memory::note_device_peak` keeps for the process): the prompts'
    /// MLX peak (raised here by 64 MiB of activations, freed before the build) and the pair's
    /// bytes are not added. It was MLX's process peak plus the pair's bytes, which counted
    /// the prompts' activations beside the pair, and stayed in the process's peak for every
    /// later response (`mlx benchmark`'s trials, `mlx generate --verbose`).
    #[test]
    fn the_pair_is_not_counted_beside_the_prompts_peak() {
        const SPIKE: usize = 64 << 20;
        const PAIR: usize = 3 << 30;
        let mut peak = DevicePeak::start(0).unwrap();
        let spike =
            mlx_core::ops::zeros(&[(SPIKE / 4) as i32], mlx_core::Dtype::Float32, None).unwrap();
        spike.eval().unwrap();
        drop(spike);
        let prompts = mlx_core::memory::window_peak(0).unwrap();
        assert!(prompts >= SPIKE, "{prompts}");
        pair_window(&mut peak, || Ok(((), PAIR))).unwrap();
        let got = peak.now().unwrap();
        assert!(got >= PAIR, "{got}: the pair counted");
        assert!(
            got + SPIKE / 2 <= prompts + PAIR,
            "{got}: the pair counted beside the prompts' MLX peak {prompts}"
        );
        let old = mlx_core::memory::peak_memory().unwrap() + PAIR;
        assert!(
            got + SPIKE / 2 <= old,
            "{got} against the old estimate {old}"
        );
        // A failed build leaves the pair uncounted.
        let mut peak = DevicePeak::start(0).unwrap();
        let failed: Result<()> = pair_window(&mut peak, || {
            Err(EngineError::GraphDecoderUnsupported("no device".into()))
        });
        assert!(failed.is_err());
        assert!(peak.now().unwrap() < PAIR);
    }
}

#[cfg(test)]
mod tests {
    //! The rounds' bookkeeping (drafts, verification, rollback of both caches, the draft's
    //! catch-up after a fully accepted round, the token budget) against plain greedy decoding,
    //! over stand-in decoders whose next token hashes the whole cached sequence (a cache that
    //! holds a wrong token at any position, or a position read past a rollback, changes every
    //! later token): random prompts, drafts that agree with the target at random, K = 1 to 9.

    use super::*;

    /// A stand-in decoder: its next token after a sequence is a hash of all of it (the draft's
    /// agrees with the target's where `agree` says, by another hash).
    struct Fake {
        cache: Vec<u32>,
        pos: usize,
        cap: usize,
        run: Option<(u32, usize)>,
        model: fn(&[u32]) -> u32,
        /// The next `verify_greedy` fails after writing its first position.
        fail_verify: bool,
    }

    fn hash(seq: &[u32], salt: u64) -> u64 {
        seq.iter().fold(0xcbf2_9ce4_8422_2325 ^ salt, |h, &t| {
            (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3)
        })
    }

    const VOCAB: u64 = 50;

    fn target_model(seq: &[u32]) -> u32 {
        (hash(seq, 1) % VOCAB) as u32
    }

    /// Agrees with the target two times in three (a run of acceptances ends at random).
    fn draft_model(seq: &[u32]) -> u32 {
        if hash(seq, 2) % 3 == 0 {
            (hash(seq, 3) % VOCAB) as u32
        } else {
            target_model(seq)
        }
    }

    impl Fake {
        fn new(prompt: &[u32], cap: usize, model: fn(&[u32]) -> u32) -> Self {
            let mut cache = prompt.to_vec();
            cache.resize(cap, u32::MAX);
            Fake {
                cache,
                pos: prompt.len(),
                cap,
                run: None,
                model,
                fail_verify: false,
            }
        }
        fn put(&mut self, t: u32) -> mlx_core::Result<u32> {
            if self.pos >= self.cap {
                return Err(mlx_core::Error::InvalidArgument {
                    op: "fake",
                    message: "full".into(),
                });
            }
            self.cache[self.pos] = t;
            self.pos += 1;
            Ok((self.model)(&self.cache[..self.pos]))
        }
    }

    fn lp(t: u32) -> f32 {
        -(t as f32) / 64.0
    }

    impl VerifyDecoder for Fake {
        fn position(&self) -> usize {
            self.pos
        }
        fn capacity(&self) -> usize {
            self.cap
        }
        fn feed(&mut self, tokens: &[u32]) -> mlx_core::Result<()> {
            self.run = None;
            for &t in tokens {
                self.put(t)?;
            }
            Ok(())
        }
        fn start(&mut self, first: u32, max_steps: usize) -> mlx_core::Result<()> {
            self.run = Some((first, max_steps));
            Ok(())
        }
        fn next_token(&mut self) -> mlx_core::Result<(u32, f32)> {
            let (cur, left) = self.run.take().expect("a run");
            assert!(left > 0, "next_token past the run's steps");
            let t = self.put(cur)?;
            self.run = Some((t, left - 1));
            Ok((t, lp(t)))
        }
        fn verify_greedy(&mut self, tokens: &[u32]) -> mlx_core::Result<Vec<(u32, f32)>> {
            self.run = None;
            if std::mem::take(&mut self.fail_verify) {
                // A device error after the pass wrote its first position.
                self.put(tokens[0])?;
                return Err(mlx_core::Error::InvalidArgument {
                    op: "fake",
                    message: "injected".into(),
                });
            }
            tokens
                .iter()
                .map(|&t| self.put(t).map(|n| (n, lp(n))))
                .collect()
        }
        fn rewind(&mut self, pos: usize) -> mlx_core::Result<()> {
            assert!(pos <= self.pos, "rewind forward");
            self.run = None;
            self.pos = pos;
            Ok(())
        }
    }

    #[test]
    fn rounds_equal_plain_greedy_decoding() {
        for seed in 0..40u32 {
            let prompt: Vec<u32> = (0..(3 + seed % 7)).map(|i| (i * 17 + seed) % 50).collect();
            let n = 30 + (seed as usize % 13);
            // Plain greedy decoding of the target.
            let mut plain = Fake::new(&prompt, 200, target_model);
            let first = target_model(&prompt);
            let mut want = vec![first];
            plain.start(first, n - 1).unwrap();
            for _ in 1..n {
                want.push(plain.next_token().unwrap().0);
            }
            for k in 1..=9usize {
                let cap = prompt.len() + n + k + 2;
                let mut s = GraphSpecSteps::from_decoders(
                    Box::new(Fake::new(&prompt, cap, target_model)),
                    Box::new(Fake::new(&prompt, cap, draft_model)),
                    (first, lp(first)),
                    Some(n),
                    k,
                );
                // The draft's extra step during verification, or its catch-up step after.
                s.overlap = seed % 2 == 0;
                let mut got = Vec::new();
                let mut from_draft = 0;
                for _ in 0..n {
                    let (t, l, d) = s.next_token().unwrap();
                    assert_eq!(l, lp(t));
                    from_draft += usize::from(d);
                    got.push(t);
                }
                assert_eq!(got, want, "seed {seed}, K = {k}");
                let st = s.stats();
                assert!(from_draft <= st.accepted && st.accepted <= st.drafted);
                assert!(st.drafted <= st.rounds * k);
                // Some rounds accepted drafts and some rejected them.
                if k > 2 && n > 35 {
                    assert!(st.accepted > 0 && st.accepted < st.drafted, "{st:?}");
                }
            }
        }
    }

    #[test]
    fn the_profile_counts_every_round_part() {
        let prompt = [4u32, 8, 15, 16];
        let first = target_model(&prompt);
        let (n, k) = (30, 3);
        let cap = prompt.len() + n + k + 2;
        let mut s = GraphSpecSteps::from_decoders(
            Box::new(Fake::new(&prompt, cap, target_model)),
            Box::new(Fake::new(&prompt, cap, draft_model)),
            (first, lp(first)),
            Some(n),
            k,
        );
        s.profile = Some(Profile::default());
        for _ in 0..n {
            s.next_token().unwrap();
        }
        let st = s.stats();
        let p = s.profile.as_ref().unwrap();
        assert_eq!(p.rounds, st.rounds);
        assert_eq!(p.draft_steps, st.drafted);
        assert_eq!(p.verify_rows, st.drafted + st.rounds);
        // The first token is the prompt's; the rounds give the rest (the last may overshoot).
        assert!(
            p.tokens >= n - 1 && p.tokens == st.accepted + st.rounds,
            "{p:?}"
        );
        assert!(p.parts.iter().all(|t| *t >= 0.0));
        let line = p.summary();
        assert!(
            line.starts_with(&format!("graph spec profile: {} rounds", st.rounds)),
            "{line}"
        );
    }

    #[test]
    fn a_failed_round_leaves_both_decoders_as_they_were() {
        let prompt = [5u32, 9, 2, 7];
        let n = 24;
        let first = target_model(&prompt);
        let mut plain = Fake::new(&prompt, 100, target_model);
        let mut want = vec![first];
        plain.start(first, n - 1).unwrap();
        for _ in 1..n {
            want.push(plain.next_token().unwrap().0);
        }
        let cap = prompt.len() + n + 6;
        let mut target = Fake::new(&prompt, cap, target_model);
        target.fail_verify = true;
        let mut s = GraphSpecSteps::from_decoders(
            Box::new(target),
            Box::new(Fake::new(&prompt, cap, draft_model)),
            (first, lp(first)),
            Some(n),
            4,
        );
        let mut got = vec![s.next_token().unwrap().0];
        // The first round fails (after its drafts and one verified position) ...
        assert!(s.next_token().is_err());
        // ... and the next call runs it again from the same state.
        while got.len() < n {
            got.push(s.next_token().unwrap().0);
        }
        assert_eq!(got, want);
    }

    #[test]
    fn a_self_draft_is_always_accepted_and_the_budget_holds() {
        let prompt = [1u32, 2, 3];
        let first = target_model(&prompt);
        for k in 1..=6usize {
            let n = 20;
            let cap = prompt.len() + n + k + 2;
            let mut s = GraphSpecSteps::from_decoders(
                Box::new(Fake::new(&prompt, cap, target_model)),
                Box::new(Fake::new(&prompt, cap, target_model)),
                (first, lp(first)),
                Some(n),
                k,
            );
            for _ in 0..n {
                s.next_token().unwrap();
            }
            let st = s.stats();
            assert_eq!(st.accepted, st.drafted, "K = {k}");
            // mlx-lm's draft lengths: min(K, tokens left) a round.
            assert!(st.drafted <= n, "K = {k}: {st:?}");
        }
        // Past the caches' room: an error, not a panic.
        let mut s = GraphSpecSteps::from_decoders(
            Box::new(Fake::new(&prompt, 6, target_model)),
            Box::new(Fake::new(&prompt, 6, target_model)),
            (first, lp(first)),
            None,
            2,
        );
        let r: Vec<_> = (0..8).map(|_| s.next_token()).collect();
        assert!(r.iter().any(|x| x.is_err()));
    }
}
