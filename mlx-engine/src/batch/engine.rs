//! The engine thread: a bounded queue of requests in, a stream of [`BatchEvent`]s out per
//! request, continuous batching in between.
//!
//! Large work is cut into bounded slices so that no request stalls the others. Each loop
//! iteration (1) drops rows whose client has gone or whose deadline has passed, (2) turns the
//! queued requests that fit in the batch into prefill tasks (those arriving together are
//! prefilled together, left-padded, as mlx-lm's `BatchGenerator` does; one with a cached prefix
//! or a seed alone), (3) runs **one slice** of pending large work, alternately for the task
//! queued longest and the one with the least work left (so small requests finish first and no
//! large one starves), unless the slices have taken more time than the decode steps since
//! (running rows get at least half the engine's time), (4) runs one batched decode step and
//! hands every row its token. A slice is one prefill chunk (at most `prefill_step_size` prompt positions per
//! request of the task, the chunks `generate_step` and mlx-lm cut, so the numerics are those
//! of a prefill run to the end at once; the chunk that leaves only the last token also runs
//! that token's step), or one batch of embedding inputs of at most `prefill_step_size` tokens
//! together (a longer input is a slice of its own: an input's forward is not cut, the caller
//! bounds its length). So a running row waits at most one slice and one decode step between
//! two of its tokens, whatever else arrives. A finished row leaves the batch before the next step; its cache
//! (prompt plus generated tokens) is stored for prefix reuse. After a large task, and when the
//! engine goes idle, freed memory is handed back to the system
//! ([`memory::release_free_memory`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mlx_cache::{BatchKVCache, Cache, KVCache, StateValue};
use mlx_core::memory;
use mlx_core::prelude::*;
use mlx_models::embed::{embed, to_vecs};
use mlx_models::LanguageModel;

use crate::cpu_decode::{CpuBatch, CpuCache, BLOCK};
use crate::error::{EngineError, Result};
use crate::generate::{cpu_decode_unsupported, make_prompt_cache, maybe_quantize_kv_cache};
use crate::grammar::{apply_mask, Grammar};
use crate::prompt_cache::PromptCache;
use crate::sample::SamplerSettings;
use crate::sample::{make_logits_processors, LogitsProcessor, ProcessorSettings, Sampler};
use crate::step_tail::{token_logprobs, Chunking, StepTail, Tail};
use crate::stream::FinishReason;
use crate::tokenizer::Tokenizer;
use mlx_kernels::graph_decode::{GraphDecoder, GraphOptions, MMA_MIN_SEQUENCES};

/// One request, already tokenized and validated by the caller.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    pub prompt: Vec<u32>,
    /// At least 1.
    pub max_tokens: usize,
    pub sampler: SamplerSettings,
    pub processors: ProcessorSettings,
    pub stop_strings: Vec<String>,
    /// Report each token's log-probability.
    pub logprobs: bool,
    /// How many most likely alternatives to report per token (with `logprobs`).
    pub top_logprobs: usize,
    /// `mx.random.seed(seed)` when the request is admitted.
    pub seed: Option<u64>,
    /// Give up (with [`BatchEvent::Error`]) after this long in the engine.
    pub timeout: Option<Duration>,
    /// Speculative decoding with the engine's draft model, drafting this many tokens a step
    /// (`mlx_lm.server`'s `num_draft_tokens`); ignored when the engine has no draft model, or
    /// the request has a grammar or several choices (`n > 1`). Such a request is not batched: it runs alone, between
    /// batches, as in mlx-lm.
    pub num_draft_tokens: Option<usize>,
    /// Constrained decoding: this row's logits are masked to what the grammar allows (see
    /// [`crate::grammar`]).
    pub grammar: Option<Grammar>,
}

/// What a request receives, in order: `Started`, any number of `Token`s, then `Done` or
/// `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum BatchEvent {
    /// Prefill finished; `cached_tokens` of the prompt came from the prompt cache.
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// One generated token and the text it completes (possibly empty while a character or a
    /// possible stop string is incomplete).
    Token {
        token: u32,
        text: String,
        logprob: Option<f32>,
        top_logprobs: Vec<(u32, f32)>,
    },
    /// Generation ended; `text` is what was still held back. `completion_tokens` counts a final
    /// EOS token, as mlx-lm does.
    Done {
        text: String,
        finish_reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Error(String),
}

/// Where a request's events go. `send` returns `false` once nobody listens (the request is then
/// cancelled); `is_closed` lets the engine notice a gone client before computing its next token.
pub trait EventSink: Send {
    fn send(&mut self, event: BatchEvent) -> bool;
    fn is_closed(&self) -> bool;
}

impl EventSink for mpsc::Sender<BatchEvent> {
    fn send(&mut self, event: BatchEvent) -> bool {
        mpsc::Sender::send(self, event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// Limits of the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences decoded together at most.
    pub max_batch: usize,
    /// Requests waiting for a slot at most; [`Engine::submit`] refuses more.
    pub queue_size: usize,
    /// Prompt positions per prefill chunk; also the token budget of one slice of embeddings.
    pub prefill_step_size: usize,
    /// Tokens of prefill and embedding work waiting or under way at most (prompt tokens not
    /// yet prefilled, embedding input tokens not yet embedded); a submission past it is
    /// refused with [`SubmitError::TooManyTokens`], unless nothing is queued (so any one
    /// request can run).
    pub max_queued_tokens: usize,
    /// Prompt-cache entries kept for prefix reuse (0 disables reuse).
    pub prompt_cache_entries: usize,
    /// Bytes the prompt cache may hold.
    pub prompt_cache_bytes: usize,
    /// `generate_step`'s cache options (`--max-kv-size`, `--kv-bits`): when set, requests
    /// run one at a time over the caches `generate_step` makes (a rotating or quantized
    /// cache has no batched form), as mlx_lm.server serves them with `--kv-bits`.
    pub kv: Option<KvOptions>,
    /// Which decoder runs the batch (the exact MLX forward by default).
    pub decoder: EngineDecoder,
    /// Prompt lookup speculation on the CPU decoder: where the batch runs on it, a greedy
    /// request (temperature 0, no logits processors, grammar, top log-probabilities or extra
    /// choices) runs alone once the batch has drained, its drafts verified in batched passes
    /// ([`crate::cpu_spec`]): the tokens of plain greedy decoding on the CPU decoder.
    pub prompt_lookup: Option<PromptLookup>,
    /// Whether the engine runs a few tiny requests of its own before it takes any (a prompt
    /// alone, two prefilled together, logit biases, log-probabilities, batched steps), so the
    /// first clients do not wait for the kernels' first use (MLX's CUDA JIT of the batched
    /// prefill, the decoder's paths): `None` (the default) where the graph decoder runs the
    /// batch. Nothing of it stays: the statistics, the prompt cache and the decoder's rows
    /// are as before it, and no random numbers are drawn (greedy rows only).
    pub warm_up: Option<bool>,
}

/// [`EngineConfig::prompt_lookup`]: n-grams of `ngram` tokens, at most `num_draft_tokens`
/// drafts a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    pub ngram: usize,
    pub num_draft_tokens: usize,
}

/// The decoder of [`EngineConfig::decoder`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineDecoder {
    /// The model's MLX forward (the exact path, mlx_lm.server's numerics).
    #[default]
    Mlx,
    /// [`crate::cpu_decode::CpuBatch`] on `threads` workers (0: all cores) where it covers
    /// the model and the options (MLX on the CPU, no `kv` options), else the MLX forward.
    Auto { threads: usize },
    /// The CPU decoder; loading fails with the reason where it does not apply.
    Cpu { threads: usize },
    /// The GPU graph decoder (a `cuda` build): every decode step of the batch is one step of
    /// [`mlx_kernels::graph_decode::GraphDecoder`] over a row a sequence, each row its own
    /// position and cache slot (prefill stays on the MLX forward); loading fails with the
    /// reason where it does not apply. `Auto` takes it first where it applies. A step runs
    /// the kernels sized to its rows (`GraphOptions::fit_rows`): rows of tiles of fewer than
    /// 4 rows (FFMA) are bit-equal to the sequence decoded alone; tiles of 4 or more rows of
    /// 4-bit weights in groups of 64 run on the tensor cores by default (tier L3: within
    /// `TEACHER_FORCED_BOUNDS` of it; `MLX_GRAPH_TENSOR_CORES=0` turns them off), one tile of
    /// the rows rounded up to 8 or 16 (`GraphOptions::wide_tiles`; `MLX_GRAPH_WIDE_TILES=0`
    /// turns that off).
    Graph,
}

/// Positions a sequence may take in the graph decoder's cache ([`EngineDecoder::Graph`]):
/// `MLX_GRAPH_CAPACITY`, default 4096. A request whose prompt and `max_tokens` exceed it is
/// answered with an error that says so.
fn graph_capacity() -> usize {
    std::env::var("MLX_GRAPH_CAPACITY")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(4096)
}

/// The batch's tensor-core tiles ([`GraphOptions::tensor_cores_from`]): from
/// [`SERVE_TENSOR_CORES_FROM`] rows by default; `MLX_GRAPH_TENSOR_CORES=N` from N rows, `0`
/// (or `off`) never. A row of such a tile is tier L3 against the sequence decoded alone
/// (within `TEACHER_FORCED_BOUNDS`: `batched_equals_single`); the FFMA tiles below it are
/// bit-equal. Speculation's verify rows never take them (its own decoder, default options).
fn graph_tensor_cores() -> Option<u32> {
    if env_off("MLX_GRAPH_TENSOR_CORES") {
        return None;
    }
    match std::env::var("MLX_GRAPH_TENSOR_CORES") {
        Ok(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|&n: &u32| n > 0)
            .or(SERVE_TENSOR_CORES_FROM),
        Err(_) => SERVE_TENSOR_CORES_FROM,
    }
}

/// Whether the batch's tensor-core tiles take up to 16 rows in one pass over the weights
/// ([`GraphOptions::wide_tiles`], default on); `MLX_GRAPH_WIDE_TILES=0` (or `off`): no wider
/// than the FFMA tiles (session 33's tiles, 3 x 6 for 16 rows at 8B), for A/B runs.
fn graph_wide_tiles() -> bool {
    !env_off("MLX_GRAPH_WIDE_TILES")
}

/// Whether the variable `name` turns its setting off: `0` or `off` (any case, trimmed).
fn env_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| {
        let v = v.trim();
        v == "0" || v.eq_ignore_ascii_case("off")
    })
}

/// The batch engine's default for [`graph_tensor_cores`]: tiles of at least
/// [`MMA_MIN_SEQUENCES`] rows on the tensor cores (4-bit weights in groups of 64). Measured
/// on an H100 with 16 streaming clients on the 8B-shaped 4-bit model: 630.2 / 627.8 tok/s
/// against 491.7 / 499.0 on the FFMA tiles, a 16-row step 23.4 ms against 30.6
/// (results/gpu/2026-12-05-s32-serve); within `TEACHER_FORCED_BOUNDS` of each sequence
/// decoded alone on an H200 (results/gpu/2026-12-05-s27-run12).
const SERVE_TENSOR_CORES_FROM: Option<u32> = Some(MMA_MIN_SEQUENCES);

/// The KV cache options of [`EngineConfig::kv`], as `generate_step` takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvOptions {
    pub max_kv_size: Option<usize>,
    pub kv_bits: Option<i32>,
    pub kv_group_size: i32,
    pub quantized_kv_start: usize,
    pub kv_mode: mlx_cache::KvMode,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch: 8,
            queue_size: 64,
            prefill_step_size: 2048,
            max_queued_tokens: usize::MAX,
            prompt_cache_entries: 16,
            prompt_cache_bytes: 1 << 30,
            kv: None,
            decoder: EngineDecoder::Mlx,
            prompt_lookup: None,
            warm_up: None,
        }
    }
}

/// Why [`Engine::submit`] refused a request.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    #[error(
        "{queued} tokens of prompts and embedding inputs are queued; {tokens} more would pass \
         the limit of {limit}"
    )]
    TooManyTokens {
        queued: usize,
        tokens: usize,
        limit: usize,
    },
    #[error("the engine has stopped")]
    Stopped,
}

/// Counters shared with the engine thread.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub queued: AtomicUsize,
    /// Tokens of prefill and embedding work waiting or under way (see
    /// [`EngineConfig::max_queued_tokens`]).
    pub queued_tokens: AtomicUsize,
    pub active: AtomicUsize,
    /// Prompt tokens taken from the prompt cache, over all requests.
    pub reused_tokens: AtomicUsize,
    pub prefilled_tokens: AtomicUsize,
    pub decode_steps: AtomicUsize,
    /// Largest batch a decode step ran with.
    pub max_batch_seen: AtomicUsize,
    /// Prefills that ran several new requests together.
    pub batched_prefills: AtomicUsize,
    /// Slices of large work (prefill chunks, batches of embedding inputs) run so far.
    pub slices: AtomicUsize,
    /// Embedding input tokens embedded so far.
    pub embedded_tokens: AtomicUsize,
    /// Requests that continued a prompt-cache entry.
    pub prompt_cache_hits: AtomicUsize,
    /// Rows over all decode steps (over `decode_steps`: the mean batch size).
    pub decoded_rows: AtomicUsize,
    /// MLX's active, peak and cache memory in bytes, as the engine thread last read them
    /// (after each loop iteration that ran work).
    pub active_memory: AtomicUsize,
    pub peak_memory: AtomicUsize,
    pub cache_memory: AtomicUsize,
}

impl EngineStats {
    /// Every counter back to zero (after the engine's warm-up).
    fn reset(&self) {
        for c in [
            &self.queued,
            &self.queued_tokens,
            &self.active,
            &self.reused_tokens,
            &self.prefilled_tokens,
            &self.decode_steps,
            &self.max_batch_seen,
            &self.batched_prefills,
            &self.slices,
            &self.embedded_tokens,
            &self.prompt_cache_hits,
            &self.decoded_rows,
            &self.active_memory,
            &self.peak_memory,
            &self.cache_memory,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

struct Job {
    request: BatchRequest,
    sink: Box<dyn EventSink>,
    /// The sinks of further choices of the same request (`n > 1`): the prompt is prefilled
    /// once, then each choice is a row of its own.
    extra: Vec<Box<dyn EventSink>>,
}

impl Job {
    fn new(request: BatchRequest, sink: Box<dyn EventSink>) -> Job {
        Job {
            request,
            sink,
            extra: Vec::new(),
        }
    }

    /// Rows this request takes in the batch.
    fn width(&self) -> usize {
        1 + self.extra.len()
    }

    /// Whether every client of this request has gone.
    fn closed(&self) -> bool {
        self.sink.is_closed() && self.extra.iter().all(|s| s.is_closed())
    }
}

/// Receives the embeddings of an [`Engine::submit_embed`] call: one unit-length float32 row
/// per input, or the error.
pub type EmbedReply = Box<dyn FnOnce(std::result::Result<Vec<Vec<f32>>, String>) + Send>;

/// What the engine thread is asked to do.
enum Work {
    Generate(Box<Job>),
    /// Requests that join the batch in the same step (so they are prefilled together).
    Group(Vec<Job>),
    Embed {
        inputs: Vec<Vec<i32>>,
        reply: EmbedReply,
    },
}

/// A handle to the engine thread. Dropping every handle stops the thread once the queue and
/// the batch are empty.
#[derive(Clone)]
pub struct Engine {
    tx: SyncSender<Work>,
    queue_size: usize,
    max_queued_tokens: usize,
    stats: Arc<EngineStats>,
    tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
    /// Which decoder runs the batch, and why (see [`Engine::decoder`]).
    decoder: Arc<str>,
}

/// Starts a request run one at a time (a speculative one, or one under `mlx launch`): seeds
/// MLX's generator as it asks, and returns its stream options, with the engine's prefill
/// step and KV options (`max_kv_size` only where `rotating`).
fn one_at_a_time_options(
    config: &EngineConfig,
    r: &super::lockstep::SharedRequest,
    rotating: bool,
) -> Result<crate::stream::StreamOptions> {
    if let Some(s) = r.seed {
        mlx_core::random::seed(s)?;
    }
    let mut generate = crate::generate::GenerateOptions {
        max_tokens: Some(r.max_tokens),
        sampler: Sampler::new(r.sampler.clone()),
        logits_processors: make_logits_processors(&r.processors)?,
        prefill_step_size: config.prefill_step_size,
        ..Default::default()
    };
    if let Some(kv) = &config.kv {
        if rotating {
            generate.max_kv_size = kv.max_kv_size;
        }
        generate.kv_bits = kv.kv_bits;
        generate.kv_group_size = kv.kv_group_size;
        generate.quantized_kv_start = kv.quantized_kv_start;
        generate.kv_mode = kv.kv_mode;
    }
    Ok(crate::stream::StreamOptions {
        generate,
        stop_strings: r.stop_strings.clone(),
        top_logprobs: if r.logprobs { r.top_logprobs } else { 0 },
    })
}

/// The decoder for `model` under `config` (`None`: the MLX forward) and the line saying which
/// runs and, where `auto` fell back, why; an error where `cpu` was asked for and cannot run.
fn pick_decoder<'m>(
    model: &'m dyn LanguageModel,
    config: &EngineConfig,
) -> Result<(Option<CpuBatch<'m>>, Option<GraphDecoder>, String)> {
    let threads = match config.decoder {
        EngineDecoder::Mlx => return Ok((None, None, "mlx (--decoder mlx)".into())),
        EngineDecoder::Graph => {
            return match pick_graph(model, config) {
                Ok((dec, note)) => Ok((None, Some(dec), note)),
                Err(why) => Err(EngineError::CpuDecoderUnsupported(format!(
                    "--decoder graph: {why}"
                ))),
            };
        }
        EngineDecoder::Auto { threads } | EngineDecoder::Cpu { threads } => threads,
    };
    // On a CUDA build with a GPU, the graph decoder first.
    let graph_why = match config.decoder {
        EngineDecoder::Auto { .. } if GraphDecoder::available() => {
            match pick_graph(model, config) {
                Ok((dec, note)) => return Ok((None, Some(dec), note)),
                Err(why) => Some(why),
            }
        }
        _ => None,
    };
    let opts = crate::generate::GenerateOptions {
        max_kv_size: config.kv.as_ref().and_then(|k| k.max_kv_size),
        kv_bits: config.kv.as_ref().and_then(|k| k.kv_bits),
        ..Default::default()
    };
    let why = if config.kv.is_some() && opts.max_kv_size.is_none() && opts.kv_bits.is_none() {
        Some("the one-at-a-time KV cache options".to_string())
    } else {
        cpu_decode_unsupported(model, &opts, false)
    };
    match (why, config.decoder) {
        (None, _) => {
            let cpu = CpuBatch::new(model, threads)?;
            let note = format!("cpu ({}, {} threads)", cpu.isa(), cpu.threads());
            Ok((Some(cpu), None, note))
        }
        (Some(why), EngineDecoder::Cpu { .. }) => Err(EngineError::CpuDecoderUnsupported(format!(
            "--decoder cpu: {why}"
        ))),
        (Some(why), _) => Ok((
            None,
            None,
            match graph_why {
                Some(g) => format!(
                    "mlx (auto: the graph decoder does not apply: {g}; the CPU decoder does not \
                     apply: {why})"
                ),
                None => format!("mlx (auto: the CPU decoder does not apply: {why})"),
            },
        )),
    }
}

/// The graph decoder for the batch: as many rows as the batch holds and the kernels take
/// ([`GraphDecoder::max_sequences`]), [`graph_capacity`] positions each; or why it does not
/// apply.
fn pick_graph(
    model: &dyn LanguageModel,
    config: &EngineConfig,
) -> std::result::Result<(GraphDecoder, String), String> {
    if !GraphDecoder::available() {
        return Err("no CUDA device (or a build without the `cuda` feature)".into());
    }
    if config.kv.is_some() {
        return Err("the one-at-a-time KV cache options (--kv-bits, --max-kv-size)".into());
    }
    if let Some(why) = crate::graph::model_unsupported(model) {
        return Err(why);
    }
    // The MLX prefill's caches are copied in: plain KV caches only (not Gemma 3's rotating
    // windows).
    let plain = make_prompt_cache(model, None).map_err(|e| e.to_string())?;
    if check_plain(&plain).is_err() {
        return Err("the model's caches are not all plain KV caches (sliding windows)".into());
    }
    let (spec, weights) = crate::graph::map_model(model).map_err(|e| e.to_string())?;
    // A row a sequence of the batch (the decoder tiles them as its kernels take them).
    let rows = config
        .max_batch
        .min(mlx_kernels::graph_decode::MAX_SEQUENCES as usize) as u32;
    let mma = graph_tensor_cores();
    let opts = GraphOptions {
        sequences: rows.max(1),
        tensor_cores_from: mma,
        // MLX_GRAPH_FIT_ROWS=0: every step on the full tiles (session 31's engine), for A/B
        // runs on a device.
        fit_rows: std::env::var("MLX_GRAPH_FIT_ROWS").map_or(true, |v| v.trim() != "0"),
        // MLX_GRAPH_WIDE_TILES=0: tensor-core tiles of at most as many rows as FFMA tiles
        // take (3 x 6 for 16 rows at 8B: session 33's engine), for A/B runs on a device.
        wide_tiles: graph_wide_tiles(),
        // MLX_GRAPH_MIN_BLOCKS=N (1-4): the mat-vec kernels' blocks a multiprocessor
        // (`GraphOptions::min_blocks_per_sm`; default: the decoder's choice a width), for A/B
        // runs of the tensor-core tiles' occupancy on a device.
        min_blocks_per_sm: std::env::var("MLX_GRAPH_MIN_BLOCKS")
            .ok()
            .and_then(|v| v.trim().parse().ok()),
        ..GraphOptions::default()
    };
    let cap = graph_capacity();
    let mut dec = GraphDecoder::with_options(spec.clone(), &weights, cap, &opts)
        .map_err(|e| e.to_string())?;
    // Kernels sized to the rows a step has (a lone row on the one-row kernels): every tile
    // set the batch will use, compiled and captured now, before the first request. Where
    // that fails (a narrower module or its graphs), the decoder runs every step on its full
    // tiles, as before the narrower sets existed, and the note says why.
    let t = std::time::Instant::now();
    let (widths, fit_failed) = match dec.prepare_rows(config.max_batch.min(dec.sequences())) {
        Ok(w) => (w, None),
        Err(e) if opts.fit_rows => {
            let full = GraphOptions {
                fit_rows: false,
                ..opts
            };
            dec = GraphDecoder::with_options(spec, &weights, cap, &full)
                .map_err(|e| e.to_string())?;
            (0, Some(e.to_string()))
        }
        Err(e) => return Err(e.to_string()),
    };
    let tiles = |m: usize| {
        let t = dec.tile_for(m);
        format!(
            "{}x{}{}",
            t.tiles,
            t.rows_per_tile,
            if t.tensor_cores {
                " (tensor cores)"
            } else {
                ""
            }
        )
    };
    let (modules, graphs) = dec.prepared();
    let note = format!(
        "graph ({} rows of {} positions{}; tiles for 1, 2, 4, 8 and {} rows: {}, {}, {}, {}, {}; \
         {}{}; {widths} narrower kernel sets prepared in {:.2} s; {modules} kernel modules, \
         {graphs} step graphs)",
        dec.sequences(),
        dec.capacity(),
        if dec.sequences() < config.max_batch {
            format!(
                ", fewer than --max-batch {}: the decoder's limit",
                config.max_batch
            )
        } else {
            String::new()
        },
        dec.sequences(),
        tiles(1),
        tiles(2),
        tiles(4),
        tiles(8),
        tiles(dec.sequences()),
        match mma {
            Some(n) => format!(
                "tensor-core tiles from {n} rows of 4-bit weights in groups of 64 \
                 (MLX_GRAPH_TENSOR_CORES=0 turns them off)"
            ),
            None => "tensor-core tiles off (MLX_GRAPH_TENSOR_CORES=N: from N rows)".into(),
        },
        if mma.is_some() && !opts.wide_tiles {
            " (MLX_GRAPH_WIDE_TILES=0: at most as many rows a tile as FFMA tiles take)"
        } else {
            ""
        },
        t.elapsed().as_secs_f64()
    );
    let note = match fit_failed {
        Some(why) => format!("{note}; the narrower kernel sets failed ({why}): full tiles"),
        None => note,
    };
    Ok((dec, note))
}

impl Engine {
    /// Starts the engine thread, which calls `load` (so the model and its arrays live on that
    /// thread only) and then serves requests. Returns once loading finished, with its error if
    /// it failed.
    pub fn start<F>(load: F, config: EngineConfig) -> Result<(Engine, JoinHandle<()>)>
    where
        F: FnOnce() -> Result<(Box<dyn LanguageModel>, Tokenizer)> + Send + 'static,
    {
        Self::start_with_draft(move || load().map(|(m, t)| (m, t, None)), config)
    }

    /// [`Engine::start`] where `load` may also give a draft model (same vocabulary), for the
    /// requests that ask for speculative decoding ([`BatchRequest::num_draft_tokens`]).
    pub fn start_with_draft<F>(load: F, config: EngineConfig) -> Result<(Engine, JoinHandle<()>)>
    where
        F: FnOnce() -> Result<(
                Box<dyn LanguageModel>,
                Tokenizer,
                Option<Box<dyn LanguageModel>>,
            )> + Send
            + 'static,
    {
        if config.max_batch == 0 {
            return Err(EngineError::Options {
                option: "max_batch".into(),
                problem: "must be at least 1".into(),
            });
        }
        if config.prefill_step_size == 0 {
            return Err(EngineError::Options {
                option: "prefill_step_size".into(),
                problem: "must be positive".into(),
            });
        }
        let mut config = config;
        if config.kv.is_some() {
            // Rotating and quantized caches have no batched form: one request at a time.
            config.max_batch = 1;
            config.prompt_cache_entries = 0;
        }
        let (tx, rx) = mpsc::sync_channel::<Work>(config.queue_size);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(Arc<Tokenizer>, usize, String)>>();
        let stats = Arc::new(EngineStats::default());
        let thread_stats = stats.clone();
        let queue_size = config.queue_size;
        let max_queued_tokens = config.max_queued_tokens;
        let handle = std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || {
                let (model, tokenizer, draft) = match load() {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let tokenizer = Arc::new(tokenizer);
                let vocab = model.vocab_size().max(0) as usize;
                let (cpu, graph, note) = match pick_decoder(model.as_ref(), &config) {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let warm =
                    config.warm_up.unwrap_or(graph.is_some()) && super::lockstep::get().is_none();
                let mut worker =
                    Worker::new(model.as_ref(), tokenizer.clone(), config, thread_stats);
                worker.draft = draft.as_deref();
                worker.cpu = cpu;
                if let Some(dec) = graph {
                    // One row of the decoder a sequence: the batch holds as many.
                    worker.config.max_batch = worker.config.max_batch.min(dec.sequences());
                    worker.graph = Some(dec);
                }
                if warm {
                    // Before the server listens: its first clients find the kernels warm.
                    worker.warm_up();
                }
                if ready_tx.send(Ok((tokenizer, vocab, note))).is_err() {
                    return;
                }
                worker.run(rx);
            })
            .map_err(|e| EngineError::Internal {
                what: "the engine thread".into(),
                problem: format!("could not start: {e}"),
            })?;
        match ready_rx.recv() {
            Ok(Ok((tokenizer, vocab_size, decoder))) => Ok((
                Engine {
                    tx,
                    queue_size,
                    max_queued_tokens,
                    stats,
                    tokenizer,
                    vocab_size,
                    decoder: decoder.into(),
                },
                handle,
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EngineError::Internal {
                what: "the engine thread".into(),
                problem: "stopped while loading".into(),
            }),
        }
    }

    /// The tokenizer the engine was loaded with (tokenize on the caller's thread).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Which decoder runs the batch: `cpu (ISA, N threads)` or `mlx (REASON)`.
    pub fn decoder(&self) -> &str {
        &self.decoder
    }

    /// Whether the batch runs on the CPU decoder.
    pub fn uses_cpu_decoder(&self) -> bool {
        self.decoder.starts_with("cpu")
    }

    /// The model's vocabulary size: prompt ids must be below it.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    /// Queues a request; its events go to `sink`. Refused when the queue is full.
    pub fn submit(
        &self,
        request: BatchRequest,
        sink: Box<dyn EventSink>,
    ) -> std::result::Result<(), SubmitError> {
        let tokens = request.prompt.len();
        self.send(Work::Generate(Box::new(Job::new(request, sink))), 1, tokens)
    }

    /// Queues one request with several choices (`n` = `sinks.len()`): the prompt is
    /// prefilled once, the first tokens of the choices are one draw over `n` rows of its
    /// log-probabilities (after the request's seed), and each choice then decodes as a row
    /// of its own (its own logits processors and stop state). Takes one queue slot and `n`
    /// batch rows.
    pub fn submit_n(
        &self,
        request: BatchRequest,
        mut sinks: Vec<Box<dyn EventSink>>,
    ) -> std::result::Result<(), SubmitError> {
        if sinks.is_empty() {
            return Ok(());
        }
        let tokens = request.prompt.len();
        let sink = sinks.remove(0);
        let job = Job {
            request,
            sink,
            extra: sinks,
        };
        self.send(Work::Generate(Box::new(job)), 1, tokens)
    }

    /// Queues requests that join the batch together, in one step: those without a cached
    /// prefix or a seed are prefilled in one left-padded batch. Takes one queue slot.
    pub fn submit_group(
        &self,
        requests: Vec<(BatchRequest, Box<dyn EventSink>)>,
    ) -> std::result::Result<(), SubmitError> {
        let n = requests.len();
        let tokens = requests.iter().map(|(r, _)| r.prompt.len()).sum();
        let jobs = requests
            .into_iter()
            .map(|(request, sink)| Job::new(request, sink))
            .collect();
        self.send(Work::Group(jobs), n, tokens)
    }

    /// Queues sentence embeddings of `inputs` (token ids, each below the vocabulary size and
    /// non-empty): [`mlx_models::embed::embed`] over the model's final normed hidden states,
    /// run on the engine thread in slices of at most `prefill_step_size` tokens (one input at
    /// least) between decode steps. `reply` receives the rows.
    pub fn submit_embed(
        &self,
        inputs: Vec<Vec<i32>>,
        reply: EmbedReply,
    ) -> std::result::Result<(), SubmitError> {
        let tokens = inputs.iter().map(Vec::len).sum();
        self.send(Work::Embed { inputs, reply }, 1, tokens)
    }

    /// Queues `work`, which holds `requests` requests (the `queued` count) and `tokens` tokens
    /// of prefill or embedding work (the `queued_tokens` count, capped).
    fn send(
        &self,
        work: Work,
        requests: usize,
        tokens: usize,
    ) -> std::result::Result<(), SubmitError> {
        // Reserved before sending, so the engine never takes away more than was added.
        let limit = self.max_queued_tokens;
        self.stats
            .queued_tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q == 0 || q.saturating_add(tokens) <= limit).then(|| q.saturating_add(tokens))
            })
            .map_err(|queued| SubmitError::TooManyTokens {
                queued,
                tokens,
                limit,
            })?;
        self.stats.queued.fetch_add(requests, Ordering::Relaxed);
        match self.tx.try_send(work) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stats.queued.fetch_sub(requests, Ordering::Relaxed);
                release_tokens(&self.stats, tokens);
                Err(match e {
                    TrySendError::Full(_) => SubmitError::QueueFull(self.queue_size),
                    TrySendError::Disconnected(_) => SubmitError::Stopped,
                })
            }
        }
    }
}

/// One sequence of the running batch.
struct Seq {
    sink: Box<dyn EventSink>,
    sampler: Sampler,
    processors: Vec<LogitsProcessor>,
    /// Every token so far, for the logits processors.
    context: Vec<i32>,
    /// Tokens the batch cache holds for this row.
    cached: Vec<u32>,
    /// Its text, token count and endings.
    tail: StepTail,
    /// The next input of the decode step (the last token emitted).
    next_input: u32,
    prompt_tokens: usize,
    logprobs: bool,
    top_logprobs: usize,
    deadline: Option<Instant>,
    /// The row's grammar, advanced by every token it emits.
    grammar: Option<Grammar>,
    /// The row's cache when the CPU decoder runs the batch.
    cpu: Option<CpuCache>,
    /// The row's row in the graph decoder, when it runs the batch.
    graph_row: Option<usize>,
    /// Whether the graph decoder's row holds this row's logit bias (none, or its one
    /// `LogitBias` processor's), set before its first step with tokens picked on the device.
    graph_bias_set: bool,
}

struct Worker<'m> {
    model: &'m dyn LanguageModel,
    /// The CPU decoder, when it runs the batch (each row's cache is in its `Seq`).
    cpu: Option<CpuBatch<'m>>,
    /// The GPU graph decoder, when it runs the batch (each row's cache in its row of the
    /// decoder: `Seq::graph_row`; `caches` stays empty).
    graph: Option<GraphDecoder>,
    /// The draft model of speculative requests, and those requests, waiting to run alone.
    draft: Option<&'m dyn LanguageModel>,
    speculative: VecDeque<Job>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    /// The model's fresh caches are not all plain KV caches (rotating sliding windows, mlx-lm's
    /// `LayerCache`, ...): they have no batched form, so requests run one at a time over their
    /// own caches, as under `--kv-bits` / `--max-kv-size`.
    own_caches: bool,
    stats: Arc<EngineStats>,
    prompt_cache: PromptCache,
    /// The CPU decoder's prompt cache: finished sequences' tokens and caches, most recent
    /// first (see [`Worker::cpu_reuse`]).
    cpu_prompts: VecDeque<(Vec<u32>, CpuCache)>,
    rows: Vec<Seq>,
    caches: Vec<Box<dyn Cache>>,
    steps: usize,
    /// Large work under way, one slice at a time, in turn.
    tasks: VecDeque<Task>,
    /// Time the slices of large work (tasks of more than one slice) took beyond the decode
    /// steps run since, while rows were running: no slice runs while it is positive, so running
    /// rows get at least half the engine's time (and still wait at most one slice between two
    /// tokens).
    slice_debt: Duration,
    /// Whether the next slice goes to the task queued longest; otherwise to the one with the
    /// least work left, so small requests finish first while a large one still gets every
    /// other slice (it cannot be starved).
    oldest_next: bool,
    /// Tokens of large work done since freed memory was last handed back.
    since_release: usize,
    /// Whether anything ran since freed memory was last handed back.
    dirty: bool,
    /// `MLX_SERVE_PROFILE=1`: where the engine's time goes.
    profile: super::profile::Profile,
    /// Whether the last decode step picked its tokens on the graph decoder.
    device_step: bool,
}

/// What happened to a row after its token.
enum Outcome {
    Continue,
    Finished,
}

/// Large work, done one bounded slice per loop iteration between decode steps.
enum Task {
    Prefill(Box<Prefill>),
    Embed(EmbedTask),
}

/// A prefill under way: one request (continuing a cached prefix, or seeded), or requests from
/// nothing prefilled together, left-padded into one `BatchKVCache` per layer.
struct Prefill {
    jobs: Vec<Job>,
    caches: Vec<Box<dyn Cache>>,
    /// Prompt tokens taken from the prompt cache (a request alone).
    reused: usize,
    /// Prefilled together into batch caches (else alone, into plain caches).
    together: bool,
    /// Every row's prompt but its last token (after the reused prefix), left-padded to `m`
    /// with zeros, row after row.
    heads: Vec<i32>,
    /// Each row's length in `heads` before padding.
    lens: Vec<usize>,
    m: usize,
    /// Columns of `heads` prefilled so far.
    done: usize,
    /// Tokens of this task still counted in `queued_tokens`.
    pending: usize,
    /// The request's cache when the CPU decoder prefills it (then `heads` is the whole
    /// prompt, `m` its length).
    cpu: Option<CpuCache>,
}

/// Embeddings under way.
struct EmbedTask {
    inputs: Vec<Vec<u32>>,
    /// Inputs embedded so far (their rows are in `rows`).
    next: usize,
    rows: Vec<Vec<f32>>,
    reply: Option<EmbedReply>,
    /// Tokens of this task still counted in `queued_tokens`.
    pending: usize,
}

/// Takes `n` tokens off the queued-token count (never below zero).
fn release_tokens(stats: &EngineStats, n: usize) {
    if n > 0 {
        let _ = stats
            .queued_tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                Some(q.saturating_sub(n))
            });
    }
}

impl<'m> Worker<'m> {
    fn new(
        model: &'m dyn LanguageModel,
        tokenizer: Arc<Tokenizer>,
        mut config: EngineConfig,
        stats: Arc<EngineStats>,
    ) -> Self {
        let own_caches = config.kv.is_none()
            && make_prompt_cache(model, None).is_ok_and(|c| check_plain(&c).is_err());
        if own_caches {
            config.max_batch = 1;
            config.prompt_cache_entries = 0;
        }
        let prompt_cache = PromptCache::new(config.prompt_cache_entries, config.prompt_cache_bytes);
        Worker {
            model,
            cpu: None,
            graph: None,
            draft: None,
            speculative: VecDeque::new(),
            tokenizer,
            config,
            own_caches,
            stats,
            prompt_cache,
            cpu_prompts: VecDeque::new(),
            rows: Vec::new(),
            caches: Vec::new(),
            steps: 0,
            tasks: VecDeque::new(),
            slice_debt: Duration::ZERO,
            oldest_next: false,
            since_release: 0,
            dirty: false,
            profile: super::profile::Profile::from_env(),
            device_step: false,
        }
    }

    /// Requests in prefill tasks (they hold a batch slot).
    fn prefilling(&self) -> usize {
        self.tasks
            .iter()
            .map(|t| match t {
                Task::Prefill(p) => p.jobs.iter().map(Job::width).sum(),
                Task::Embed(_) => 0,
            })
            .sum()
    }

    fn run(&mut self, rx: Receiver<Work>) {
        if let Some(ls) = super::lockstep::get() {
            return self.run_lockstep(rx, ls);
        }
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let mut open = true;
        loop {
            if self.rows.is_empty() && self.tasks.is_empty() && !self.speculative.is_empty() {
                // A speculative request runs alone, to its end, once the batch has drained
                // (mlx-lm does not batch them).
                if let Some(job) = self.speculative.pop_front() {
                    self.dirty = true;
                    self.run_speculative(job);
                }
                continue;
            }
            if self.rows.is_empty() && waiting.is_empty() && self.tasks.is_empty() {
                // Idle: hand back what the last work left behind before sleeping.
                if self.dirty {
                    self.since_release = 0;
                    self.dirty = false;
                    // Only the resident size depends on it: a failure changes no result.
                    let _ = memory::release_free_memory();
                    self.publish_memory();
                }
                self.profile.report("idle");
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(work) => self.take(work, &mut waiting),
                    Err(_) => return,
                }
            }
            while open
                && self.rows.len()
                    + waiting.iter().map(Job::width).sum::<usize>()
                    + self.prefilling()
                    < self.config.max_batch
            {
                match rx.try_recv() {
                    Ok(work) => self.take(work, &mut waiting),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if let Err(e) = self.drop_gone_rows() {
                self.fail_all(&e);
                continue;
            }
            self.drop_gone_prefills();
            let busy = self.rows.len() + self.prefilling();
            let mut room = self.config.max_batch.saturating_sub(busy);
            let mut take = 0;
            // A request of more choices than the batch holds runs when the batch is empty.
            while take < waiting.len()
                && (waiting[take].width() <= room || (busy == 0 && take == 0))
            {
                room = room.saturating_sub(waiting[take].width());
                take += 1;
            }
            let joining: Vec<Job> = waiting.drain(..take).collect();
            if !joining.is_empty() {
                self.stats
                    .queued
                    .fetch_sub(joining.len(), Ordering::Relaxed);
                self.start_prefills(joining);
            }
            // At most one slice of large work, then one decode step: a running row waits at
            // most one slice between two tokens. While rows run, a slice waits until decode
            // steps have taken as long as the slices before it (time shared half and half).
            if self.rows.is_empty() {
                self.slice_debt = Duration::ZERO;
            }
            let task = if self.slice_debt.is_zero() {
                self.next_task()
            } else {
                None
            };
            if let Some(mut task) = task {
                self.dirty = true;
                self.stats.slices.fetch_add(1, Ordering::Relaxed);
                let started = Instant::now();
                let clock = self.profile.start();
                let sliced = self.slice(&mut task);
                self.profile.prefill(clock);
                match sliced {
                    Ok(false) => {
                        // Only work that takes more than one slice is large enough to owe the
                        // running rows time: a small request joins as soon as it is prefilled.
                        if !self.rows.is_empty() {
                            self.slice_debt += started.elapsed();
                        }
                        self.tasks.push_back(task)
                    }
                    Ok(true) => self.release_memory(),
                    // A failed join may leave the batch inconsistent: start over.
                    Err(e) => self.fail_all(&e),
                }
            }
            self.stats.active.store(self.rows.len(), Ordering::Relaxed);
            if !self.rows.is_empty() {
                self.dirty = true;
                let started = Instant::now();
                let clock = self.profile.start();
                let b = self.rows.len();
                if let Err(e) = self.decode_step() {
                    self.fail_all(&e);
                }
                self.profile.step(clock, b, self.device_step);
                self.slice_debt = self.slice_debt.saturating_sub(started.elapsed());
            }
            self.stats.active.store(self.rows.len(), Ordering::Relaxed);
            self.publish_memory();
        }
    }

    /// Publishes MLX's memory figures for `/metrics` (three reads of counters).
    fn publish_memory(&self) {
        let set = |a: &AtomicUsize, v: mlx_core::Result<usize>| {
            if let Ok(v) = v {
                a.store(v, Ordering::Relaxed);
            }
        };
        set(&self.stats.active_memory, memory::active_memory());
        set(&self.stats.peak_memory, memory::peak_memory());
        set(&self.stats.cache_memory, memory::cache_memory());
    }

    /// The task the next slice goes to, taken out of the queue: alternately the one queued
    /// longest and the one with the fewest tokens left (the first of those on a tie).
    fn next_task(&mut self) -> Option<Task> {
        let pending = |t: &Task| match t {
            Task::Prefill(p) => p.pending,
            Task::Embed(e) => e.pending,
        };
        self.oldest_next = !self.oldest_next;
        let i = if self.oldest_next {
            0
        } else {
            (0..self.tasks.len()).min_by_key(|&i| pending(&self.tasks[i]))?
        };
        self.tasks.remove(i)
    }

    /// After a task: hands freed memory back to the system once at least one slice's worth of
    /// large work (`prefill_step_size` tokens) ran since the last time.
    fn release_memory(&mut self) {
        if self.since_release >= self.config.prefill_step_size {
            self.since_release = 0;
            // Only the resident size depends on it: a failure changes no result.
            let _ = memory::release_free_memory();
        }
    }

    /// A generation request waits for a slot; embeddings become a task at once (validated
    /// here, embedded in slices).
    fn take(&mut self, work: Work, waiting: &mut VecDeque<Job>) {
        match work {
            Work::Generate(job)
                if job.request.num_draft_tokens.is_some()
                    && job.request.grammar.is_none()
                    && job.extra.is_empty()
                    && self.draft.is_some() =>
            {
                self.speculative.push_back(*job)
            }
            Work::Generate(job) if self.looks_up(&job) => self.speculative.push_back(*job),
            Work::Generate(job) => waiting.push_back(*job),
            Work::Group(jobs) => waiting.extend(jobs),
            Work::Embed { inputs, reply } => {
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                let pending: usize = inputs.iter().map(Vec::len).sum();
                let vocab = self.vocab() as i64;
                let bad = inputs.iter().enumerate().find_map(|(i, ids)| {
                    if ids.is_empty() {
                        return Some(format!("input {i} has no tokens"));
                    }
                    ids.iter()
                        .find(|&&t| t < 0 || i64::from(t) >= vocab)
                        .map(|t| {
                            format!("input {i}: token id {t} is outside the vocabulary of {vocab}")
                        })
                });
                if let Some(e) = bad.or_else(|| inputs.is_empty().then(|| "no inputs".into())) {
                    release_tokens(&self.stats, pending);
                    reply(Err(e));
                    return;
                }
                // Checked above: every id is in 0..vocab.
                let inputs = inputs
                    .iter()
                    .map(|r| r.iter().map(|&t| t as u32).collect())
                    .collect();
                self.tasks.push_back(Task::Embed(EmbedTask {
                    inputs,
                    next: 0,
                    rows: Vec::new(),
                    reply: Some(reply),
                    pending,
                }));
            }
        }
    }

    /// One slice of `task`; `true` when the task is finished (its requests answered).
    fn slice(&mut self, task: &mut Task) -> Result<bool> {
        match task {
            Task::Embed(t) => {
                self.embed_slice(t);
                Ok(t.reply.is_none())
            }
            Task::Prefill(p) => self.prefill_slice(p),
        }
    }

    /// Embeds the next inputs: as many as fit in `prefill_step_size` tokens, one at least.
    /// Each input runs alone, as [`embed`] runs it, so the rows are those of one `embed` call
    /// over every input.
    fn embed_slice(&mut self, t: &mut EmbedTask) {
        let budget = self.config.prefill_step_size;
        let mut end = t.next + 1;
        let mut tokens = t.inputs[t.next].len();
        while end < t.inputs.len() && tokens + t.inputs[end].len() <= budget {
            tokens += t.inputs[end].len();
            end += 1;
        }
        let result = match self.cpu.as_mut() {
            // The CPU decoder's embeddings (`mlx embed`'s default; tier L3 against MLX's).
            Some(cpu) => cpu.embed(&t.inputs[t.next..end]).map_err(|e| e.to_string()),
            None => embed(self.model, &t.inputs[t.next..end])
                .and_then(|e| to_vecs(&e))
                .map_err(|e| e.to_string()),
        };
        let _ = memory::clear_cache();
        self.since_release += tokens;
        match result {
            Ok(rows) => {
                self.stats
                    .embedded_tokens
                    .fetch_add(tokens, Ordering::Relaxed);
                release_tokens(&self.stats, tokens);
                t.pending = t.pending.saturating_sub(tokens);
                t.rows.extend(rows);
                t.next = end;
                if t.next == t.inputs.len() {
                    if let Some(reply) = t.reply.take() {
                        reply(Ok(std::mem::take(&mut t.rows)));
                    }
                }
            }
            Err(e) => {
                release_tokens(&self.stats, t.pending);
                t.pending = 0;
                if let Some(reply) = t.reply.take() {
                    reply(Err(e));
                }
            }
        }
    }

    /// Whether `job` speculates by prompt lookup on the CPU decoder
    /// ([`EngineConfig::prompt_lookup`]).
    fn looks_up(&self, job: &Job) -> bool {
        let r = &job.request;
        self.config.prompt_lookup.is_some_and(|p| p.ngram > 0)
            && self.cpu.is_some()
            && r.grammar.is_none()
            && job.extra.is_empty()
            && r.sampler.temp == 0.0
            && !(r.logprobs && r.top_logprobs > 0)
            && make_logits_processors(&r.processors).is_ok_and(|p| p.is_empty())
    }

    /// Runs a speculative request to its end with the draft model (no prompt-cache reuse: its
    /// caches hold the draft's layers too), or by prompt lookup on the CPU decoder, sending
    /// its events as a batched request's.
    fn run_speculative(&mut self, job: Job) {
        let Job {
            request: r,
            mut sink,
            ..
        } = job;
        self.stats.queued.fetch_sub(1, Ordering::Relaxed);
        release_tokens(&self.stats, r.prompt.len());
        let draft = self.draft.filter(|_| r.num_draft_tokens.is_some());
        let lookup = self
            .config
            .prompt_lookup
            .zip(self.cpu.as_ref().map(|c| c.threads()));
        if draft.is_none() && lookup.is_none() {
            sink.send(BatchEvent::Error("the engine has no draft model".into()));
            return;
        }
        let deadline = r.timeout.map(|t| Instant::now() + t);
        let result = (|| -> Result<()> {
            // The KV quantization options apply (mlx-lm passes them); a rotating cache does
            // not (speculation drops `max_kv_size`, as mlx-lm's `stream_generate` does).
            let shared = super::lockstep::SharedRequest::with_seed(&r, r.seed);
            let opts = one_at_a_time_options(&self.config, &shared, false)?;
            let stream = match (draft, lookup) {
                (Some(draft), _) => crate::stream::stream_generate_speculative(
                    self.model,
                    &self.tokenizer,
                    &r.prompt,
                    None,
                    crate::speculative::Drafter::Model {
                        model: draft,
                        cache: None,
                    },
                    r.num_draft_tokens.unwrap_or(0),
                    opts,
                )?,
                (None, Some((pl, threads))) => {
                    let mut opts = opts;
                    opts.generate.cpu_decode = Some(crate::generate::CpuDecode { threads });
                    crate::stream::stream_generate_cpu_speculative(
                        self.model,
                        &self.tokenizer,
                        &r.prompt,
                        pl.ngram,
                        pl.num_draft_tokens,
                        opts,
                    )?
                }
                (None, None) => return Ok(()),
            };
            if !sink.send(BatchEvent::Started {
                prompt_tokens: r.prompt.len(),
                cached_tokens: 0,
            }) {
                return Ok(());
            }
            for resp in stream {
                let resp = resp?;
                if sink.is_closed() {
                    return Ok(());
                }
                if deadline.is_some_and(|d| Instant::now() > d) {
                    sink.send(BatchEvent::Error("the request timed out".into()));
                    return Ok(());
                }
                let (token, done) = response_events(
                    resp,
                    self.tokenizer.eos_token_ids(),
                    r.logprobs,
                    r.prompt.len(),
                );
                if token.is_some_and(|t| !sink.send(t)) {
                    return Ok(());
                }
                if let Some(done) = done {
                    sink.send(done);
                    return Ok(());
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            sink.send(BatchEvent::Error(e.to_string()));
        }
    }

    /// The engine loop of a rank of `mlx launch -- serve` (mlx_lm.server under mlx.launch):
    /// every rank runs the same requests in the same order, one at a time to its end, and
    /// every step's collectives with them. Rank 0 takes each request from the queue and
    /// shares it ([`super::lockstep::Lockstep::share`]); after every token it shares whether
    /// to go on (its client gone or its deadline passed stops every rank). The other ranks
    /// ignore `rx` and follow; they return when rank 0 shares that it stops or a share fails.
    fn run_lockstep(
        &mut self,
        rx: Receiver<Work>,
        ls: std::sync::Arc<dyn super::lockstep::Lockstep>,
    ) {
        use super::lockstep::{Message, SharedRequest};
        let leader = ls.is_leader();
        loop {
            let mut job: Option<Job> = None;
            let mine = if leader {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(Work::Generate(j)) => {
                        self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                        release_tokens(&self.stats, j.request.prompt.len());
                        match SharedRequest::of(&j.request, j.extra.len()) {
                            Ok(r) => {
                                job = Some(*j);
                                Some(Message::Run(Box::new(r)))
                            }
                            Err(e) => {
                                let mut j = *j;
                                j.sink.send(BatchEvent::Error(e.to_string()));
                                None
                            }
                        }
                    }
                    Ok(other) => {
                        self.refuse_under_launch(other);
                        None
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => Some(Message::Quit),
                }
            } else {
                None
            };
            let got = match ls.share(mine.as_ref()) {
                Ok(m) => m,
                Err(e) => {
                    if let Some(mut j) = job {
                        j.sink.send(BatchEvent::Error(e.clone()));
                    }
                    ls.lost(&e);
                    return;
                }
            };
            match got {
                None => {}
                Some(Message::Quit) => return,
                Some(Message::Stop) => {}
                Some(Message::Run(r)) => {
                    let sink: Box<dyn EventSink> = match job {
                        Some(j) => j.sink,
                        None => Box::new(super::lockstep::NullSink),
                    };
                    if let Err(e) = self.run_locked(*r, sink, ls.as_ref()) {
                        ls.lost(&e);
                        return;
                    }
                }
            }
        }
    }

    /// Under `mlx launch`: only single-choice generations without a grammar are served.
    fn refuse_under_launch(&mut self, work: Work) {
        let why = "not supported under mlx launch (one choice, no grammar, no embeddings)";
        match work {
            Work::Generate(mut j) => {
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                release_tokens(&self.stats, j.request.prompt.len());
                j.sink.send(BatchEvent::Error(why.into()));
            }
            Work::Group(jobs) => {
                self.stats.queued.fetch_sub(jobs.len(), Ordering::Relaxed);
                for mut j in jobs {
                    release_tokens(&self.stats, j.request.prompt.len());
                    j.sink.send(BatchEvent::Error(why.into()));
                }
            }
            Work::Embed { inputs, reply } => {
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                release_tokens(&self.stats, inputs.iter().map(Vec::len).sum());
                reply(Err(why.into()));
            }
        }
    }

    /// One shared request on every rank: `stream_generate` to its end (the same steps and
    /// collectives everywhere), rank 0 sending the events. `Err` only when a share failed
    /// (a peer was lost): the ranks can no longer step together.
    fn run_locked(
        &mut self,
        r: super::lockstep::SharedRequest,
        mut sink: Box<dyn EventSink>,
        ls: &dyn super::lockstep::Lockstep,
    ) -> std::result::Result<(), String> {
        use super::lockstep::Message;
        let leader = ls.is_leader();
        let deadline = r
            .timeout_ms
            .map(|t| Instant::now() + Duration::from_millis(t));
        self.dirty = true;
        let prompt_tokens = r.prompt.len();
        let started = (|| -> Result<crate::stream::TextStream<'_>> {
            let opts = one_at_a_time_options(&self.config, &r, true)?;
            crate::stream::stream_generate(self.model, &self.tokenizer, &r.prompt, None, opts)
        })();
        let stream = match started {
            Ok(s) => s,
            Err(e) => {
                // The same request fails alike on every rank (nothing ran yet).
                sink.send(BatchEvent::Error(e.to_string()));
                return Ok(());
            }
        };
        let mut open = sink.send(BatchEvent::Started {
            prompt_tokens,
            cached_tokens: 0,
        });
        let eos_ids = self.tokenizer.eos_token_ids().clone();
        for resp in stream {
            let resp = match resp {
                Ok(x) => x,
                Err(e) => {
                    sink.send(BatchEvent::Error(e.to_string()));
                    return Err(format!("a step failed: {e}"));
                }
            };
            // Rank 0 decides whether every rank goes on.
            let late = deadline.is_some_and(|d| Instant::now() > d);
            let stop = leader && (!open || sink.is_closed() || late);
            let mine = if leader && stop {
                Some(Message::Stop)
            } else {
                None
            };
            if ls.share(mine.as_ref())?.is_some() {
                if late && open {
                    sink.send(BatchEvent::Error("the request timed out".into()));
                }
                return Ok(());
            }
            let (token, done) = response_events(resp, &eos_ids, r.logprobs, prompt_tokens);
            if let Some(t) = token {
                open = sink.send(t);
            }
            if let Some(done) = done {
                sink.send(done);
                return Ok(());
            }
        }
        Ok(())
    }

    fn fail_all(&mut self, e: &EngineError) {
        for mut row in self.rows.drain(..) {
            if let (Some(dec), Some(r)) = (self.graph.as_mut(), row.graph_row) {
                dec.release_row(r);
            }
            row.sink.send(BatchEvent::Error(e.to_string()));
        }
        self.caches.clear();
        if self.graph.as_ref().is_some_and(|d| d.is_broken()) {
            // A failed CUDA call: the MLX path serves the requests from here on.
            eprintln!(
                "[mlx-engine] the graph decoder failed ({e}); the MLX forward decodes from now on"
            );
            self.graph = None;
        }
    }

    /// A sequence's caches (one plain KV cache a layer, after its prompt) into a free row of
    /// the graph decoder; returns the row.
    fn graph_join(&mut self, caches: &[Box<dyn Cache>]) -> Result<usize> {
        let internal = |problem: String| EngineError::Internal {
            what: "the graph decoder's batch".into(),
            problem,
        };
        let kv = caches
            .iter()
            .map(|c| match c.fetch()? {
                Some(mlx_cache::Kv::Dense { keys, values }) => Ok((keys, values)),
                _ => Err(internal("a layer's cache is not a plain KV cache".into())),
            })
            .collect::<Result<Vec<_>>>()?;
        let clock = self.profile.start();
        // Every layer's keys and values made contiguous in one evaluation (the same values),
        // so the decoder's copies find them ready instead of evaluating a copy of each view
        // one at a time (two a layer, each waiting for the device).
        let kv = kv
            .iter()
            .map(|(k, v)| {
                let dense =
                    |a: &Array| -> Result<Array> { Ok(a.reshape(&[-1])?.reshape(&a.shape())?) };
                Ok((dense(k)?, dense(v)?))
            })
            .collect::<Result<Vec<_>>>()?;
        mlx_core::eval(kv.iter().flat_map(|(k, v)| [k, v]))?;
        let dec = self
            .graph
            .as_mut()
            .ok_or_else(|| internal("no graph decoder".into()))?;
        let row = dec
            .free_row()
            .ok_or_else(|| internal(format!("all {} rows are taken", dec.sequences())))?;
        dec.set_row_prefix(row, &kv)?;
        self.profile.join(clock);
        Ok(row)
    }

    /// Rows whose client went away or whose deadline passed leave the batch.
    fn drop_gone_rows(&mut self) -> Result<()> {
        let now = Instant::now();
        let mut keep = Vec::with_capacity(self.rows.len());
        for (i, row) in self.rows.iter_mut().enumerate() {
            if row.sink.is_closed() {
                continue;
            }
            if row.deadline.is_some_and(|d| now >= d) {
                row.sink
                    .send(BatchEvent::Error("the request timed out".into()));
                continue;
            }
            keep.push(i);
        }
        self.keep_rows(&keep, false)
    }

    /// Keeps the rows `keep` (indices, ascending); stores the caches of the others when
    /// `store` is set.
    fn keep_rows(&mut self, keep: &[usize], store: bool) -> Result<()> {
        if keep.len() == self.rows.len() {
            return Ok(());
        }
        if let Some(dec) = self.graph.as_mut() {
            for (i, row) in self.rows.iter().enumerate() {
                if let (false, Some(r)) = (keep.contains(&i), row.graph_row) {
                    dec.release_row(r);
                }
            }
        }
        if store
            && self.config.prompt_cache_entries > 0
            && self.config.kv.is_none()
            && self.cpu.is_none()
            && self.graph.is_none()
        {
            for i in (0..self.rows.len()).filter(|i| !keep.contains(i)) {
                let caches = self.extract_row(i)?;
                if caches.first().map(|c| c.offset()) == Some(self.rows[i].cached.len()) {
                    self.prompt_cache
                        .insert(self.rows[i].cached.clone(), caches);
                }
            }
        }
        let mut old: Vec<Option<Seq>> = self.rows.drain(..).map(Some).collect();
        self.rows = keep.iter().filter_map(|&i| old[i].take()).collect();
        if store {
            for row in old.into_iter().flatten() {
                if let Some(cache) = row.cpu {
                    self.cpu_store(row.cached, cache);
                }
            }
        }
        if self.rows.is_empty() {
            self.caches.clear();
            return Ok(());
        }
        for c in &mut self.caches {
            batch_cache(c)?.filter(keep)?;
        }
        Ok(())
    }

    /// mlx-lm's `BatchKVCache.extract(idx)`: row `i` without its padding, as plain caches.
    fn extract_row(&self, i: usize) -> Result<Vec<Box<dyn Cache>>> {
        extract_row(&self.caches, i)
    }
}

/// Row `i` of batch caches without its padding, as plain caches.
fn extract_row(caches: &[Box<dyn Cache>], i: usize) -> Result<Vec<Box<dyn Cache>>> {
    caches
        .iter()
        .map(|c| -> Result<Box<dyn Cache>> {
            let pad = c
                .as_any()
                .downcast_ref::<BatchKVCache>()
                .map(|b| b.left_padding()[i])
                .unwrap_or(0);
            let Some(mlx_cache::Kv::Dense { keys, values }) = c.fetch()? else {
                return Ok(Box::new(KVCache::new()));
            };
            let row = |a: &Array| -> Result<Array> {
                let s = a.shape();
                Ok(ops::contiguous(
                    &ops::slice(
                        a,
                        &[i as i32, 0, pad, 0],
                        &[i as i32 + 1, s[1], s[2], s[3]],
                        &[1, 1, 1, 1],
                        None,
                    )?,
                    false,
                    None,
                )?)
            };
            let (k, v) = (row(&keys)?, row(&values)?);
            let n = k.dim(2)? as i64;
            Ok(Box::new(KVCache::from_state(StateValue::List(vec![
                StateValue::Array(k),
                StateValue::Array(v),
                StateValue::Int(n),
            ]))?))
        })
        .collect()
}

/// How an admitted request is prefilled.
enum Start {
    /// Alone: it continues a cached prefix, or it has a seed.
    Alone(Vec<Box<dyn Cache>>, usize),
    /// From nothing: together with the other such requests of the same step.
    Fresh,
}

fn check_plain(caches: &[Box<dyn Cache>]) -> Result<()> {
    match caches
        .iter()
        .find(|c| c.as_any().downcast_ref::<KVCache>().is_none())
    {
        Some(c) => Err(EngineError::Cache {
            what: "continuous batching".into(),
            problem: format!("needs plain KV caches; this model uses {}", c.class_name()),
        }),
        None => Ok(()),
    }
}

/// Evaluates every cache's keys and values (between prefill chunks, as mlx-lm does).
fn eval_caches(caches: &[Box<dyn Cache>]) -> Result<()> {
    let states: Vec<Array> = caches
        .iter()
        .filter_map(|c| c.fetch().ok().flatten())
        .flat_map(|kv| kv.arrays().into_iter().cloned().collect::<Vec<_>>())
        .collect();
    mlx_core::eval(states.iter())?;
    memory::clear_cache()?;
    Ok(())
}

/// The logits of the last position, `(batch, vocab)`.
fn last_logits(logits: &Array) -> Result<Array> {
    let n = logits.dim(1)?;
    Ok(ops::squeeze(
        &ops::slice_axis(logits, 1, n - 1, n, None)?,
        &[1],
        None,
    )?)
}

impl Worker<'_> {
    /// Turns the requests that join in this step into prefill tasks. Those without a cached
    /// prefix or a seed are prefilled together, left-padded in one batch cache (mlx-lm's
    /// `BatchGenerator`); the others alone, continuing their cached prefix.
    fn start_prefills(&mut self, jobs: Vec<Job>) {
        let mut fresh = Vec::new();
        for job in jobs {
            if job.closed() {
                release_tokens(&self.stats, job.request.prompt.len());
                continue;
            }
            if self.cpu.is_some() {
                self.start_cpu(job);
                continue;
            }
            let alone = !job.extra.is_empty() || self.config.kv.is_some() || self.own_caches;
            match self.plan(&job.request, alone) {
                Ok(Start::Alone(caches, reused)) => self.start_alone(job, caches, reused),
                Ok(Start::Fresh) => fresh.push(job),
                Err(e) => {
                    release_tokens(&self.stats, job.request.prompt.len());
                    let mut sink = job.sink;
                    sink.send(BatchEvent::Error(e.to_string()));
                }
            }
        }
        let started = match fresh.len() {
            0 => Ok(()),
            1 => self.fresh_caches().map(|caches| {
                let job = fresh.remove(0);
                self.start_alone(job, caches, 0);
            }),
            _ => self.start_together(&mut fresh),
        };
        if let Err(e) = &started {
            // Whatever was not queued is answered (and no longer counted).
            for mut job in fresh {
                release_tokens(&self.stats, job.request.prompt.len());
                job.sink.send(BatchEvent::Error(e.to_string()));
            }
        }
    }

    /// Validates the prompt and decides how it is prefilled.
    fn plan(&mut self, r: &BatchRequest, alone: bool) -> Result<Start> {
        if r.prompt.is_empty() {
            return Err(EngineError::Input {
                what: "request".into(),
                problem: "the prompt is empty".into(),
            });
        }
        if let Some(&bad) = r.prompt.iter().find(|&&t| t as usize >= self.vocab()) {
            return Err(EngineError::Input {
                what: "request".into(),
                problem: format!(
                    "prompt token id {bad} is outside the model's vocabulary of {}",
                    self.vocab()
                ),
            });
        }
        if let Some(dec) = &self.graph {
            if r.prompt.len() + r.max_tokens > dec.capacity() {
                return Err(EngineError::Input {
                    what: "request".into(),
                    problem: format!(
                        "{} prompt tokens and max_tokens {} exceed the graph decoder's {} \
                         positions a sequence (MLX_GRAPH_CAPACITY; --decoder mlx has no such \
                         limit)",
                        r.prompt.len(),
                        r.max_tokens,
                        dec.capacity()
                    ),
                });
            }
        }
        match self.prompt_cache.fetch(&r.prompt) {
            Some(hit) => Ok(Start::Alone(hit.caches, hit.reused)),
            None if r.seed.is_some() || alone => Ok(Start::Alone(self.fresh_caches()?, 0)),
            None => Ok(Start::Fresh),
        }
    }

    /// Queues the prefill of one request over `caches`, which hold its first `reused` prompt
    /// tokens (`generate_step`'s prefill: chunks of all but the last prompt token, then one
    /// step on the last token).
    fn start_alone(&mut self, job: Job, caches: Vec<Box<dyn Cache>>, reused: usize) {
        let len = job.request.prompt.len();
        let plain = if self.config.kv.is_some() || self.own_caches {
            Ok(())
        } else {
            check_plain(&caches)
        };
        let checked = plain.and_then(|()| {
            // The prompt cache always leaves the last token to run.
            if reused < len {
                Ok(())
            } else {
                Err(EngineError::Internal {
                    what: "the prompt cache".into(),
                    problem: format!("reused {reused} of {len} prompt tokens"),
                })
            }
        });
        if let Err(e) = checked {
            release_tokens(&self.stats, len);
            let mut sink = job.sink;
            sink.send(BatchEvent::Error(e.to_string()));
            return;
        }
        self.count_reuse(len, reused);
        let heads: Vec<i32> = job.request.prompt[reused..len - 1]
            .iter()
            .map(|&t| t as i32)
            .collect();
        let m = heads.len();
        self.tasks.push_back(Task::Prefill(Box::new(Prefill {
            jobs: vec![job],
            caches,
            reused,
            together: false,
            heads,
            lens: vec![m],
            m,
            done: 0,
            pending: len - reused,
            cpu: None,
        })));
    }

    /// Queues the prefill of requests with no cached prefix together: all but their last
    /// prompt token, left-padded to the longest into one `BatchKVCache` per layer (rope at
    /// per-row offsets, the padding masked), in chunks of `prefill_step_size`; then one step on
    /// every last token gives each its first token.
    /// Takes the jobs out of `jobs` once nothing can fail any more.
    fn start_together(&mut self, jobs: &mut Vec<Job>) -> Result<()> {
        let layers = make_prompt_cache(self.model, None)?;
        let jobs = std::mem::take(jobs);
        let total: usize = jobs.iter().map(|j| j.request.prompt.len()).sum();
        if let Err(e) = check_plain(&layers) {
            release_tokens(&self.stats, total);
            for mut job in jobs {
                job.sink.send(BatchEvent::Error(e.to_string()));
            }
            return Ok(());
        }
        let lens: Vec<usize> = jobs.iter().map(|j| j.request.prompt.len() - 1).collect();
        let m = lens.iter().copied().max().unwrap_or(0);
        let pad: Vec<i32> = lens.iter().map(|&h| (m - h) as i32).collect();
        let caches: Vec<Box<dyn Cache>> = layers
            .iter()
            .map(|_| Box::new(BatchKVCache::new(&pad)) as Box<dyn Cache>)
            .collect();
        self.stats
            .prefilled_tokens
            .fetch_add(total, Ordering::Relaxed);
        self.stats.batched_prefills.fetch_add(1, Ordering::Relaxed);
        let mut heads = Vec::with_capacity(jobs.len() * m);
        for (j, &h) in jobs.iter().zip(&lens) {
            heads.extend(std::iter::repeat_n(0i32, m - h));
            heads.extend(j.request.prompt[..h].iter().map(|&t| t as i32));
        }
        self.tasks.push_back(Task::Prefill(Box::new(Prefill {
            jobs,
            caches,
            reused: 0,
            together: true,
            heads,
            lens,
            m,
            done: 0,
            pending: total,
            cpu: None,
        })));
        Ok(())
    }

    /// Prefill tasks whose every client has gone are dropped.
    /// A request of `len` prompt tokens starts its prefill with `reused` of them from the
    /// prompt cache: the cached prefix is no work, and the cache statistics count it.
    fn count_reuse(&self, len: usize, reused: usize) {
        release_tokens(&self.stats, reused);
        if reused > 0 {
            self.stats.prompt_cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .reused_tokens
            .fetch_add(reused, Ordering::Relaxed);
        self.stats
            .prefilled_tokens
            .fetch_add(len - reused, Ordering::Relaxed);
    }

    fn drop_gone_prefills(&mut self) {
        let stats = self.stats.clone();
        self.tasks.retain(|t| match t {
            Task::Prefill(p) if p.jobs.iter().all(Job::closed) => {
                release_tokens(&stats, p.pending);
                false
            }
            _ => true,
        });
    }

    /// One chunk of a prefill: the next `prefill_step_size` columns of every row (the chunks
    /// `generate_step` cuts). When only the last prompt tokens remain, their step too, which
    /// gives every request its first token and joins the batch. `true` when finished.
    fn prefill_slice(&mut self, p: &mut Prefill) -> Result<bool> {
        if p.cpu.is_some() {
            return self.cpu_prefill_slice(p);
        }
        if p.done < p.m {
            let n = self.config.prefill_step_size.min(p.m - p.done);
            let k = p.jobs.len();
            let clock = self.profile.start();
            let mut chunk = Vec::with_capacity(k * n);
            for row in p.heads.chunks(p.m) {
                chunk.extend_from_slice(&row[p.done..p.done + n]);
            }
            let step = Array::from_slice(&chunk, &[k as i32, n as i32])
                .map_err(EngineError::from)
                .and_then(|x| Ok(self.model.forward(&x, Some(&mut p.caches))?))
                .and_then(|_| self.quantize(&mut p.caches))
                .and_then(|_| eval_caches(&p.caches));
            self.profile.chunk(clock);
            // Tokens of the chunk that are not padding.
            let real: usize = p
                .lens
                .iter()
                .map(|&h| (p.done + n).saturating_sub((p.m - h).max(p.done)))
                .sum();
            release_tokens(&self.stats, real.min(p.pending));
            p.pending = p.pending.saturating_sub(real);
            self.since_release += real;
            p.done += n;
            if let Err(e) = step {
                self.fail_prefill(p, &e);
                return Ok(true);
            }
            if p.done < p.m {
                return Ok(false);
            }
        }
        let clock = self.profile.start();
        self.finish_prefill(p)?;
        self.profile.finish(clock);
        Ok(true)
    }

    /// Queues the prefill of one request on the CPU decoder: its whole prompt into a cache of
    /// its own, in slices of `prefill_step_size` rounded down to whole blocks (so the cache
    /// and the last logits are those of one [`CpuBatch::prefill`] of the prompt, what `mlx
    /// generate` computes). No prompt-cache reuse: the prompt cache holds MLX caches.
    fn start_cpu(&mut self, job: Job) {
        let len = job.request.prompt.len();
        let checked = if len == 0 {
            Err("the prompt is empty".to_string())
        } else if let Some(&bad) = job
            .request
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.vocab())
        {
            Err(format!(
                "token id {bad} is outside the model's vocabulary of {}",
                self.vocab()
            ))
        } else {
            Ok(())
        };
        if self.cpu.is_none() {
            return;
        }
        if let Err(e) = checked {
            release_tokens(&self.stats, len);
            let mut sink = job.sink;
            sink.send(BatchEvent::Error(e));
            return;
        }
        let (cache, reused) = match self.cpu_reuse(&job.request.prompt) {
            Some(hit) => hit,
            None => match self.cpu.as_ref() {
                Some(cpu) => (cpu.new_cache(len + job.request.max_tokens.min(4096)), 0),
                None => return,
            },
        };
        self.count_reuse(len, reused);
        let heads = job.request.prompt.iter().map(|&t| t as i32).collect();
        self.tasks.push_back(Task::Prefill(Box::new(Prefill {
            jobs: vec![job],
            caches: Vec::new(),
            reused,
            together: false,
            heads,
            lens: vec![len],
            m: len,
            done: reused,
            pending: len - reused,
            cpu: Some(cache),
        })));
    }

    /// One slice of a CPU prefill; the last one also gives the request its first tokens and
    /// its rows. `true` when finished.
    fn cpu_prefill_slice(&mut self, p: &mut Prefill) -> Result<bool> {
        let step = (self.config.prefill_step_size / BLOCK * BLOCK).max(BLOCK);
        let n = step.min(p.m - p.done);
        let tokens: Vec<u32> = p.heads[p.done..p.done + n]
            .iter()
            .map(|&t| t as u32)
            .collect();
        let last = p.done + n == p.m;
        let (Some(cpu), Some(cache)) = (self.cpu.as_mut(), p.cpu.as_mut()) else {
            return Err(EngineError::Internal {
                what: "CPU prefill".into(),
                problem: "without the CPU decoder".into(),
            });
        };
        let result = if last {
            cpu.prefill(cache, &tokens).map(|l| Some(l.to_vec()))
        } else {
            cpu.prefill_part(cache, &tokens).map(|()| None)
        };
        release_tokens(&self.stats, n.min(p.pending));
        p.pending = p.pending.saturating_sub(n);
        self.since_release += n;
        p.done += n;
        match result {
            Err(e) => {
                self.fail_prefill(p, &e);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Ok(Some(logits)) => {
                self.cpu_finish_prefill(p, &logits)?;
                Ok(true)
            }
        }
    }

    /// The first tokens of a CPU-prefilled request from its prompt's last logits, as
    /// `last_step` gives them on the MLX path (the seed applied just before); each choice a
    /// row with its own copy of the cache.
    fn cpu_finish_prefill(&mut self, p: &mut Prefill, logits: &[f32]) -> Result<()> {
        release_tokens(&self.stats, p.pending);
        p.pending = 0;
        let (Some(job), Some(cache)) = (p.jobs.pop(), p.cpu.take()) else {
            return Ok(());
        };
        let Job {
            mut request,
            sink,
            extra,
        } = job;
        let mut grammar = request.grammar.take();
        let mut sinks = vec![sink];
        sinks.extend(extra);
        let n = sinks.len();
        let first = (|| -> Result<(Vec<u32>, Array)> {
            if let Some(seed) = request.seed {
                random::seed(seed)?;
            }
            let logits = Array::from_slice(logits, &[1, logits.len() as i32])?;
            self.first_token(&request, logits, grammar.as_mut(), n)
        })();
        let Some((first, logprobs)) = or_tell_all(&mut sinks, first) else {
            return Ok(());
        };
        let mut cache = Some(cache);
        for (i, (sink, &token)) in sinks.into_iter().zip(&first).enumerate() {
            let g = if i + 1 == n {
                grammar.take()
            } else {
                grammar.clone()
            };
            if let Some(mut row) = self.start_row(&request, sink, token, &logprobs, p.reused, g)? {
                row.cpu = if i + 1 == n {
                    cache.take()
                } else {
                    cache.clone()
                };
                self.rows.push(row);
            }
        }
        if let Some(cache) = cache {
            // No choice went on: the prompt's cache is kept for reuse.
            self.cpu_store(request.prompt, cache);
        }
        Ok(())
    }

    /// The longest reusable prefix of `prompt` among the stored CPU caches: a copy of that
    /// cache cut to a whole number of prefill blocks, short of the last prompt token (so the
    /// rest is prefilled in the blocks a full prefill cuts: where the reused part was itself
    /// prefilled, the result is a full prefill's, bit for bit). `None` under one block.
    fn cpu_reuse(&mut self, prompt: &[u32]) -> Option<(CpuCache, usize)> {
        let (i, common) = self
            .cpu_prompts
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (i, t.iter().zip(prompt).take_while(|(a, b)| a == b).count()))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))?;
        let n = common.min(prompt.len().saturating_sub(1)) / BLOCK * BLOCK;
        if n == 0 {
            return None;
        }
        let entry = self.cpu_prompts.remove(i)?;
        let mut cache = entry.1.clone();
        cache.truncate(n);
        // Most recently used first.
        self.cpu_prompts.push_front(entry);
        Some((cache, n))
    }

    /// Keeps `cache` (holding `tokens`) for reuse, within the prompt cache's entry and byte
    /// limits (the least recently used go first).
    fn cpu_store(&mut self, tokens: Vec<u32>, cache: CpuCache) {
        let (entries, bytes) = (
            self.config.prompt_cache_entries,
            self.config.prompt_cache_bytes,
        );
        if entries == 0 || cache.nbytes() > bytes || cache.position() != tokens.len() {
            return;
        }
        // An entry this one extends is redundant.
        self.cpu_prompts
            .retain(|(t, _)| !(t.len() <= tokens.len() && tokens[..t.len()] == t[..]));
        self.cpu_prompts.push_front((tokens, cache));
        let mut total = 0;
        let mut keep = 0;
        for (_, c) in &self.cpu_prompts {
            if keep == entries || total + c.nbytes() > bytes {
                break;
            }
            total += c.nbytes();
            keep += 1;
        }
        self.cpu_prompts.truncate(keep);
    }

    /// Ends a prefill with an error for each of its requests (the running batch is untouched).
    fn fail_prefill(&mut self, p: &mut Prefill, e: &EngineError) {
        release_tokens(&self.stats, p.pending);
        p.pending = 0;
        for job in &mut p.jobs {
            job.sink.send(BatchEvent::Error(e.to_string()));
        }
        p.jobs.clear();
    }

    /// The step on every row's last prompt token: first tokens, rows started; those that go
    /// on join the running batch.
    fn finish_prefill(&mut self, p: &mut Prefill) -> Result<()> {
        release_tokens(&self.stats, p.pending);
        p.pending = 0;
        let jobs = std::mem::take(&mut p.jobs);
        let mut caches = std::mem::take(&mut p.caches);
        if !p.together {
            let Some(Job {
                mut request,
                sink,
                extra,
            }) = jobs.into_iter().next()
            else {
                return Ok(());
            };
            let mut grammar = request.grammar.take();
            let mut sinks = vec![sink];
            sinks.extend(extra);
            let first = self.last_step(&request, &mut caches, grammar.as_mut(), sinks.len());
            let Some((first, logprobs)) = or_tell_all(&mut sinks, first) else {
                return Ok(());
            };
            let mut joined = false;
            let n = sinks.len();
            for (i, (sink, &token)) in sinks.into_iter().zip(&first).enumerate() {
                // Each choice its own parser state (all fresh until this first token).
                let g = if i + 1 == n {
                    grammar.take()
                } else {
                    grammar.clone()
                };
                if let Some(mut row) =
                    self.start_row(&request, sink, token, &logprobs, p.reused, g)?
                {
                    if self.graph.is_some() {
                        row.graph_row = Some(self.graph_join(&caches)?);
                    } else {
                        self.join(&caches)?;
                    }
                    self.rows.push(row);
                    joined = true;
                }
            }
            if !joined && self.config.prompt_cache_entries > 0 && self.config.kv.is_none() {
                let mut tokens = request.prompt.clone();
                tokens.truncate(caches.first().map_or(0, |c| c.offset()));
                self.prompt_cache.insert(tokens, caches);
            }
            return Ok(());
        }
        let k = jobs.len();
        let last: Vec<i32> = jobs
            .iter()
            .map(|j| j.request.prompt[j.request.prompt.len() - 1] as i32)
            .collect();
        let logits = Array::from_slice(&last, &[k as i32, 1])
            .map_err(EngineError::from)
            .and_then(|x| Ok(self.model.forward(&x, Some(&mut caches))?))
            .and_then(|l| last_logits(&l));
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                for mut job in jobs {
                    job.sink.send(BatchEvent::Error(e.to_string()));
                }
                return Ok(());
            }
        };
        let mut keep = Vec::with_capacity(k);
        let mut rows = Vec::with_capacity(k);
        for (e, job) in jobs.into_iter().enumerate() {
            let Job {
                mut request,
                mut sink,
                ..
            } = job;
            let mut grammar = request.grammar.take();
            let row_logits = ops::slice_axis(&logits, 0, e as i32, e as i32 + 1, None)?;
            let (first, logprobs) =
                match self.first_token(&request, row_logits, grammar.as_mut(), 1) {
                    Ok(x) => x,
                    Err(err) => {
                        sink.send(BatchEvent::Error(err.to_string()));
                        continue;
                    }
                };
            match self.start_row(&request, sink, first[0], &logprobs, 0, grammar)? {
                Some(row) => {
                    keep.push(e);
                    rows.push(row);
                }
                None if self.config.prompt_cache_entries > 0 => {
                    self.prompt_cache
                        .insert(request.prompt.clone(), extract_row(&caches, e)?);
                }
                None => {}
            }
        }
        if keep.is_empty() {
            return Ok(());
        }
        if self.graph.is_some() {
            // Each row's prompt (without its padding) into its own row of the decoder.
            for (row, &e) in rows.iter_mut().zip(&keep) {
                row.graph_row = Some(self.graph_join(&extract_row(&caches, e)?)?);
            }
            self.rows.extend(rows);
            return Ok(());
        }
        if keep.len() < k {
            for c in &mut caches {
                batch_cache(c)?.filter(&keep)?;
            }
        }
        if self.rows.is_empty() {
            self.caches = caches;
        } else {
            for (c, new) in self.caches.iter_mut().zip(&mut caches) {
                let new = batch_cache(new)?.clone();
                batch_cache(c)?.extend(&new)?;
            }
        }
        self.rows.extend(rows);
        Ok(())
    }

    /// A request alone: the step on its last prompt token (the request's seed applied just
    /// before it: the prefill chunks draw nothing, and decode steps of other rows that ran
    /// between them may have). Returns the first token of each of its `n` choices and the
    /// log-probabilities.
    fn last_step(
        &mut self,
        r: &BatchRequest,
        caches: &mut Vec<Box<dyn Cache>>,
        grammar: Option<&mut Grammar>,
        n: usize,
    ) -> Result<(Vec<u32>, Array)> {
        if let Some(seed) = r.seed {
            random::seed(seed)?;
        }
        let last = [r.prompt[r.prompt.len() - 1] as i32];
        let x = Array::from_slice(&last, &[1, 1])?;
        let logits = last_logits(&self.model.forward(&x, Some(caches))?)?;
        self.quantize(caches)?;
        self.first_token(r, logits, grammar, n)
    }

    /// New caches for one request: `generate_step`'s (`--max-kv-size`) in the one-at-a-time
    /// mode of [`EngineConfig::kv`], the model's own otherwise.
    fn fresh_caches(&self) -> Result<Vec<Box<dyn Cache>>> {
        let max_kv_size = self.config.kv.as_ref().and_then(|k| k.max_kv_size);
        make_prompt_cache(self.model, max_kv_size)
    }

    /// `maybe_quantize_kv_cache` after a forward pass, with `--kv-bits`.
    fn quantize(&self, caches: &mut [Box<dyn Cache>]) -> Result<()> {
        match &self.config.kv {
            Some(k) => maybe_quantize_kv_cache(
                caches,
                k.quantized_kv_start,
                k.kv_group_size,
                k.kv_bits,
                k.kv_mode,
            ),
            None => Ok(()),
        }
    }

    /// Tells the client its prefill is done and hands it its first token. Returns the row
    /// when it goes on (`None`: finished already, or the client is gone).
    fn start_row(
        &mut self,
        request: &BatchRequest,
        sink: Box<dyn EventSink>,
        first: u32,
        logprobs: &Array,
        reused: usize,
        grammar: Option<Grammar>,
    ) -> Result<Option<Seq>> {
        // Counted before the client hears of it: whoever holds the response head or the first
        // token and asks `/health` sees the row (the loop's own count comes after the push).
        self.stats.active.fetch_add(1, Ordering::Relaxed);
        let row = self.start_row_counted(request, sink, first, logprobs, reused, grammar);
        if !matches!(row, Ok(Some(_))) {
            self.stats.active.fetch_sub(1, Ordering::Relaxed);
        }
        row
    }

    fn start_row_counted(
        &mut self,
        request: &BatchRequest,
        mut sink: Box<dyn EventSink>,
        first: u32,
        logprobs: &Array,
        reused: usize,
        grammar: Option<Grammar>,
    ) -> Result<Option<Seq>> {
        let prompt_tokens = request.prompt.len();
        if !sink.send(BatchEvent::Started {
            prompt_tokens,
            cached_tokens: reused,
        }) {
            return Ok(None);
        }
        let mut row = Seq {
            sink,
            sampler: Sampler::new(request.sampler.clone()),
            processors: make_logits_processors(&request.processors)?,
            context: request.prompt.iter().map(|&t| t as i32).collect(),
            cached: request.prompt.clone(),
            tail: StepTail::new(
                &self.tokenizer,
                request.stop_strings.clone(),
                Some(request.max_tokens),
                Chunking::Batch,
            ),
            next_input: first,
            prompt_tokens,
            logprobs: request.logprobs,
            top_logprobs: request.top_logprobs,
            deadline: request.timeout.map(|t| Instant::now() + t),
            grammar,
            cpu: None,
            graph_row: None,
            graph_bias_set: false,
        };
        Ok(match self.emit(&mut row, first, Some(logprobs))? {
            Outcome::Continue => Some(row),
            Outcome::Finished => None,
        })
    }

    /// Adds a single sequence's caches to the batch as a new last row.
    fn join(&mut self, caches: &[Box<dyn Cache>]) -> Result<()> {
        if self.config.kv.is_some() || self.own_caches {
            // One request at a time, over its own (rotating or quantized) caches.
            if !self.rows.is_empty() {
                return Err(EngineError::Internal {
                    what: "--kv-bits / --max-kv-size".into(),
                    problem: "requests run one at a time".into(),
                });
            }
            self.caches = caches.iter().map(|c| c.boxed_clone()).collect();
            return Ok(());
        }
        let singles: Vec<BatchKVCache> = caches
            .iter()
            .map(|c| BatchKVCache::from_single(c.as_ref()))
            .collect::<mlx_core::Result<_>>()?;
        if self.rows.is_empty() {
            self.caches = singles
                .into_iter()
                .map(|c| Box::new(c) as Box<dyn Cache>)
                .collect();
            return Ok(());
        }
        for (c, s) in self.caches.iter_mut().zip(&singles) {
            batch_cache(c)?.extend(s)?;
        }
        Ok(())
    }

    /// The first token from the prompt's last logits `(1, vocab)`: the request's logits
    /// processors (over the prompt), log-probabilities, its sampler. Returns the token and the
    /// `(vocab,)` log-probabilities.
    fn first_token(
        &self,
        r: &BatchRequest,
        mut logits: Array,
        grammar: Option<&mut Grammar>,
        n: usize,
    ) -> Result<(Vec<u32>, Array)> {
        let processors = make_logits_processors(&r.processors)?;
        if !processors.is_empty() {
            let context: Vec<i32> = r.prompt.iter().map(|&t| t as i32).collect();
            for p in &processors {
                logits = p.apply(&context, &logits)?;
            }
        }
        if let Some(g) = grammar {
            logits = g.mask_logits(&logits)?;
        }
        let all: Vec<i32> = (0..logits.ndim() as i32).collect();
        let lse = ops::logsumexp(&logits, &all, true, None)?;
        let logprobs = ops::subtract(&logits, &lse, None)?;
        // `n` choices: one draw over `n` copies of the row.
        let rows = if n > 1 {
            let v = logprobs.dim(-1)?;
            ops::broadcast_to(&logprobs, &[n as i32, v], None)?
        } else {
            logprobs.clone()
        };
        let sampled = Sampler::new(r.sampler.clone()).sample(&rows)?;
        mlx_core::eval([&sampled, &logprobs])?;
        let tokens = sampled.astype(Dtype::Uint32)?.to_vec::<u32>()?;
        if tokens.len() < n.max(1) {
            return Err(EngineError::Internal {
                what: "the sampler".into(),
                problem: "returned no token".into(),
            });
        }
        Ok((tokens, ops::squeeze(&logprobs, &[0], None)?))
    }

    fn vocab(&self) -> usize {
        self.model.vocab_size().max(0) as usize
    }

    /// [`EngineConfig::warm_up`]: tiny greedy requests of the engine's own, run to their end
    /// before any client's, through the paths clients take: a prompt alone; two prefilled
    /// together (left-padded), one with a logit bias and one reporting log-probabilities (the
    /// host's logits path); two with logit biases (tokens picked on the graph decoder). Then
    /// everything they changed is put back: statistics, prompt caches, step count, memory.
    fn warm_up(&mut self) {
        struct Quiet;
        impl EventSink for Quiet {
            fn send(&mut self, _: BatchEvent) -> bool {
                true
            }
            fn is_closed(&self) -> bool {
                false
            }
        }
        let vocab = self.vocab();
        if vocab < 8 || self.config.max_batch < 2 {
            return;
        }
        let clock = Instant::now();
        let job = |len: u32, bias: bool, logprobs: bool| {
            let request = BatchRequest {
                prompt: (1..=len).collect(),
                max_tokens: 3,
                sampler: SamplerSettings::default(),
                processors: ProcessorSettings {
                    logit_bias: if bias { vec![(0, -100.0)] } else { Vec::new() },
                    ..Default::default()
                },
                stop_strings: Vec::new(),
                logprobs,
                top_logprobs: if logprobs { 2 } else { 0 },
                seed: None,
                timeout: None,
                num_draft_tokens: None,
                grammar: None,
            };
            Job::new(request, Box::new(Quiet))
        };
        let groups = [
            vec![job(4, true, false)],
            vec![job(3, true, false), job(5, false, true)],
            vec![job(4, true, false), job(2, true, false)],
        ];
        for group in groups {
            self.start_prefills(group);
            // A few slices and steps each; bounded whatever happens.
            for _ in 0..64 {
                if self.tasks.is_empty() && self.rows.is_empty() {
                    break;
                }
                if let Some(mut task) = self.tasks.pop_front() {
                    match self.slice(&mut task) {
                        Ok(false) => self.tasks.push_back(task),
                        Ok(true) => {}
                        Err(e) => self.fail_all(&e),
                    }
                }
                if !self.rows.is_empty() {
                    if let Err(e) = self.decode_step() {
                        self.fail_all(&e);
                    }
                }
            }
        }
        let (steps, together) = (
            self.stats.decode_steps.load(Ordering::Relaxed),
            self.stats.batched_prefills.load(Ordering::Relaxed),
        );
        // Whatever is left (it cannot be, short of a bug) goes, with its decoder rows.
        self.tasks.clear();
        let _ = self.keep_rows(&[], false);
        self.caches.clear();
        self.prompt_cache = PromptCache::new(
            self.config.prompt_cache_entries,
            self.config.prompt_cache_bytes,
        );
        self.cpu_prompts.clear();
        self.steps = 0;
        self.slice_debt = Duration::ZERO;
        self.oldest_next = false;
        self.since_release = 0;
        self.dirty = false;
        self.profile = super::profile::Profile::from_env();
        let _ = memory::clear_cache();
        let _ = memory::release_free_memory();
        self.stats.reset();
        // The warm-up's peak is not a request's: `/metrics` starts from what is held now.
        let _ = memory::reset_peak_memory();
        self.publish_memory();
        if self.profile.on() {
            eprintln!(
                "[serve profile] warm-up: {:.1} ms ({steps} decode steps, {together} prefills \
                 of several prompts)",
                clock.elapsed().as_secs_f64() * 1e3
            );
        }
    }

    /// One forward pass for every row, then each row's token.
    fn decode_step(&mut self) -> Result<()> {
        let b = self.rows.len();
        self.stats.max_batch_seen.fetch_max(b, Ordering::Relaxed);
        self.stats.decoded_rows.fetch_add(b, Ordering::Relaxed);
        let inputs: Vec<i32> = self.rows.iter().map(|r| r.next_input as i32).collect();
        self.device_step = false;
        let graph_rows = if self.graph.is_some() {
            self.rows
                .iter()
                .map(|r| {
                    r.graph_row
                        .map(|g| (g, r.next_input))
                        .ok_or_else(|| EngineError::Internal {
                            what: "the graph decoder's batch".into(),
                            problem: "a row has no row of the decoder".into(),
                        })
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        // Greedy rows without grammars or log-probabilities, and without logits processors
        // but one logit bias (set in the decoder's row): the tokens are picked on the device
        // (mlx-lm's argmax of the log-probabilities of the biased logits).
        let device_greedy = self.graph.is_some()
            && self.rows.iter().all(|r| {
                r.sampler.settings().temp == 0.0
                    && device_bias(&r.processors).is_some()
                    && r.grammar.is_none()
                    && !r.logprobs
            });
        if let (Some(dec), true) = (self.graph.as_mut(), device_greedy) {
            for row in self.rows.iter_mut().filter(|r| !r.graph_bias_set) {
                if let (Some(g), Some(bias)) = (row.graph_row, device_bias(&row.processors)) {
                    dec.set_row_bias(g, &bias)?;
                    row.graph_bias_set = true;
                }
            }
            let picks = dec.step_rows_greedy(&graph_rows)?;
            self.device_step = true;
            let tokens: Vec<u32> = picks.iter().map(|p| p.0).collect();
            return self.finish_step(&tokens, vec![None; b]);
        }
        // Greedy rows without processors or a grammar on the CPU decoder: each row's token and
        // log-sum-exp on the host (`mlx_core::cpu::greedy_lse`, MLX's `logsumexp` bit for bit),
        // as `generate_step` takes them, instead of an MLX log-sum-exp over the vocabulary.
        let host_greedy = self.rows.iter().all(|r| {
            r.processors.is_empty() && r.grammar.is_none() && r.sampler.settings().temp == 0.0
        });
        let mut host: Option<(Vec<u32>, Vec<f32>)> = None;
        let mut logits = if let Some(dec) = self.graph.as_mut() {
            // One step of the graph decoder over every row: `(batch, vocab)` float32 logits;
            // the rest of the step is the MLX path's.
            let l = dec.step_rows_logits(&graph_rows)?;
            let vocab = l.first().map_or(0, Vec::len);
            let flat: Vec<f32> = l.into_iter().flatten().collect();
            Array::from_slice(&flat, &[b as i32, vocab as i32])?
        } else if let Some(cpu) = self.cpu.as_mut() {
            // One CPU step over every row's own cache: `(batch, vocab)` float32 logits, each
            // row's what it gets decoded alone; the rest of the step is the MLX path's.
            let tokens: Vec<u32> = self.rows.iter().map(|r| r.next_input).collect();
            let mut caches = self
                .rows
                .iter_mut()
                .map(|r| {
                    r.cpu.as_mut().ok_or_else(|| EngineError::Internal {
                        what: "the CPU batch".into(),
                        problem: "a row has no CPU cache".into(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let vocab = cpu.vocab();
            let l = cpu.step(&mut caches, &tokens)?;
            if host_greedy && vocab > 0 {
                let isa = mlx_core::cpu::Isa::detect();
                host = l
                    .chunks_exact(vocab)
                    .map(|row| mlx_core::cpu::greedy_lse(isa, row).map(|(t, v)| (t as u32, v)))
                    .collect::<Option<Vec<_>>>()
                    .map(|v| v.into_iter().unzip());
            }
            Array::from_slice(l, &[b as i32, vocab as i32])?
        } else {
            let x = Array::from_slice(&inputs, &[b as i32, 1])?;
            let logits = self.model.forward(&x, Some(&mut self.caches))?;
            if self.config.kv.is_some() {
                let mut caches = std::mem::take(&mut self.caches);
                let q = self.quantize(&mut caches);
                self.caches = caches;
                q?;
            }
            let n = logits.dim(1)?;
            ops::squeeze(&ops::slice_axis(&logits, 1, n - 1, n, None)?, &[1], None)?
        };
        for (row, &t) in self.rows.iter_mut().zip(&inputs) {
            if !row.processors.is_empty() {
                row.context.push(t);
            }
        }
        let shared = bias_only(&self.rows[0].processors).filter(|first| {
            self.rows[1..]
                .iter()
                .all(|r| bias_only(&r.processors).as_ref() == Some(first))
        });
        if shared.is_some() {
            // The same logit bias on every row (it reads no context): one application over the
            // whole batch, element for element what each row would get alone.
            for p in &self.rows[0].processors {
                logits = p.apply(&[], &logits)?;
            }
        } else if self.rows.iter().any(|r| !r.processors.is_empty()) {
            let mut parts = Vec::with_capacity(b);
            for (e, row) in self.rows.iter().enumerate() {
                let mut l = ops::slice_axis(&logits, 0, e as i32, e as i32 + 1, None)?;
                for p in &row.processors {
                    l = p.apply(&row.context, &l)?;
                }
                parts.push(l);
            }
            logits = ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0, None)?;
        }
        if self.rows.iter().any(|r| r.grammar.is_some()) {
            // One `(batch, vocab)` mask: each constrained row its grammar's, the others all set;
            // the forward runs while the host computes it.
            mlx_core::async_eval([&logits])?;
            let v = logits.shape().last().copied().unwrap_or(0).max(0) as usize;
            let mut bits = vec![true; b * v];
            for (row, out) in self.rows.iter_mut().zip(bits.chunks_mut(v.max(1))) {
                if let Some(g) = row.grammar.as_mut() {
                    if g.fill_mask(out).is_err() {
                        // Cannot happen with a grammar in a sane state; end this row (EOS
                        // only) rather than fail the whole batch.
                        out.fill(false);
                        for &e in self.tokenizer.eos_token_ids() {
                            if let Some(x) = out.get_mut(e as usize) {
                                *x = true;
                            }
                        }
                    }
                }
            }
            logits = apply_mask(&logits, &bits, &[b as i32, v as i32])?;
        }
        let (tokens, logprobs) = match host {
            // The log-probabilities left lazy: only rows that report them read theirs.
            Some((tokens, lse)) => {
                let lse = Array::from_slice(&lse, &[b as i32, 1])?;
                (tokens, ops::subtract(&logits, &lse, None)?)
            }
            None => self.sample_rows(&logits)?,
        };
        // Rows that report log-probabilities get their `(vocab,)` row.
        let lps: Vec<Option<Array>> = self
            .rows
            .iter()
            .enumerate()
            .map(|(e, r)| -> Result<Option<Array>> {
                if !r.logprobs {
                    return Ok(None);
                }
                let e = e as i32;
                Ok(Some(ops::squeeze(
                    &ops::slice_axis(&logprobs, 0, e, e + 1, None)?,
                    &[0],
                    None,
                )?))
            })
            .collect::<Result<_>>()?;
        self.finish_step(&tokens, lps)
    }

    /// The end of a decode step: each row gets its token (and log-probabilities); the
    /// finished rows leave.
    fn finish_step(&mut self, tokens: &[u32], lps: Vec<Option<Array>>) -> Result<()> {
        let b = self.rows.len();
        self.steps += 1;
        self.stats.decode_steps.fetch_add(1, Ordering::Relaxed);
        if self.steps % 256 == 0 {
            memory::clear_cache()?;
        }
        let mut keep = Vec::with_capacity(b);
        let mut rows = std::mem::take(&mut self.rows);
        let mut result = Ok(());
        let clock = self.profile.start();
        for (e, row) in rows.iter_mut().enumerate() {
            row.cached.push(row.next_input);
            match self.emit(row, tokens[e], lps[e].as_ref()) {
                Ok(Outcome::Continue) => keep.push(e),
                Ok(Outcome::Finished) => {}
                Err(err) => {
                    row.sink.send(BatchEvent::Error(err.to_string()));
                    result = Err(err);
                }
            }
        }
        self.rows = rows;
        self.profile.emit(clock);
        result?;
        self.keep_rows(&keep, true)
    }

    /// Each row's token from the step's `(batch, vocab)` logits through MLX: log-sum-exp,
    /// log-probabilities (returned, evaluated) and each row's sampler (one call where all
    /// rows share their settings).
    fn sample_rows(&self, logits: &Array) -> Result<(Vec<u32>, Array)> {
        let lse = ops::logsumexp(logits, &[-1], true, None)?;
        let logprobs = ops::subtract(logits, &lse, None)?;
        let first = self.rows[0].sampler.settings().clone();
        let sampled = if self.rows.iter().all(|r| *r.sampler.settings() == first) {
            self.rows[0].sampler.sample(&logprobs)?
        } else {
            let parts: Vec<Array> = self
                .rows
                .iter()
                .enumerate()
                .map(|(e, r)| {
                    r.sampler.sample(&ops::slice_axis(
                        &logprobs,
                        0,
                        e as i32,
                        e as i32 + 1,
                        None,
                    )?)
                })
                .collect::<Result<_>>()?;
            ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0, None)?
        };
        mlx_core::eval([&sampled, &logprobs])?;
        Ok((sampled.astype(Dtype::Uint32)?.to_vec::<u32>()?, logprobs))
    }

    /// Hands `token` to its row: EOS, stop strings and the token limit end the row.
    fn emit(&mut self, row: &mut Seq, token: u32, logprobs: Option<&Array>) -> Result<Outcome> {
        let done = |row: &mut Seq, text: String, reason: FinishReason| -> Result<Outcome> {
            row.sink.send(BatchEvent::Done {
                text,
                finish_reason: reason,
                prompt_tokens: row.prompt_tokens,
                completion_tokens: row.tail.generated(),
            });
            Ok(Outcome::Finished)
        };
        if let Some(g) = row.grammar.as_mut() {
            if let Err(e) = g.commit(token) {
                row.sink.send(BatchEvent::Error(e.to_string()));
                return Ok(Outcome::Finished);
            }
        }
        let eos = self.tokenizer.eos_token_ids().contains(&token);
        let (text, finish, rest) = match row.tail.step(token, eos)? {
            Tail::Eos { text } => return done(row, text, FinishReason::Stop),
            Tail::Token { text, finish, rest } => (text, finish, rest),
        };
        row.next_input = token;
        let (logprob, top) = match logprobs {
            Some(lp) if row.logprobs => {
                let (v, top) = token_logprobs(lp, None, token, row.top_logprobs)?;
                (Some(v), top)
            }
            _ => (None, Vec::new()),
        };
        if finish == Some(FinishReason::Stop) {
            // The text ends before the stop string; the token that completed it is not sent.
            return done(row, text, FinishReason::Stop);
        }
        if !row.sink.send(BatchEvent::Token {
            token,
            text,
            logprob,
            top_logprobs: top,
        }) {
            return Ok(Outcome::Finished);
        }
        match finish {
            Some(reason) => done(row, rest, reason),
            None => Ok(Outcome::Continue),
        }
    }
}

/// The events of one response of a request run one at a time through
/// [`crate::stream::stream_generate`] (speculation, `mlx launch`), as a batched row sends them:
/// the `Token` (not for an EOS token, nor for the token completing a stop string) and, on the
/// last response, `Done` with the text still held.
fn response_events(
    resp: crate::stream::GenerationResponse,
    eos_ids: &std::collections::BTreeSet<u32>,
    logprobs: bool,
    prompt_tokens: usize,
) -> (Option<BatchEvent>, Option<BatchEvent>) {
    let eos = resp.token.is_some_and(|t| eos_ids.contains(&t));
    let stop_string = resp.finish_reason == Some(FinishReason::Stop) && !eos;
    let mut held = resp.text;
    let token = match (resp.token, eos, stop_string) {
        (Some(token), false, false) => Some(BatchEvent::Token {
            token,
            text: std::mem::take(&mut held),
            logprob: logprobs.then_some(resp.logprob).flatten(),
            top_logprobs: resp.top_logprobs,
        }),
        _ => None,
    };
    let done = resp.finish_reason.map(|finish_reason| BatchEvent::Done {
        text: held,
        finish_reason,
        prompt_tokens,
        completion_tokens: resp.generation_tokens,
    });
    (token, done)
}

/// `r`'s value, or `None` after sending its error to every choice of the request.
fn or_tell_all<T>(sinks: &mut [Box<dyn EventSink>], r: Result<T>) -> Option<T> {
    match r {
        Ok(x) => Some(x),
        Err(e) => {
            for sink in sinks {
                sink.send(BatchEvent::Error(e.to_string()));
            }
            None
        }
    }
}

/// A row's processors when they are only logit biases (which read no context): their ids and
/// value bits, to compare rows; `None` otherwise or when there are none.
/// A row's logits processors as the graph decoder's device bias: none (empty), or the
/// `(token, bias)` pairs of a single `LogitBias`; `None` when the row has other processors.
fn device_bias(processors: &[LogitsProcessor]) -> Option<Vec<(u32, f32)>> {
    match processors {
        [] => Some(Vec::new()),
        [LogitsProcessor::LogitBias { ids, values }] if ids.len() == values.len() => ids
            .iter()
            .zip(values)
            .map(|(&i, &v)| u32::try_from(i).ok().map(|i| (i, v)))
            .collect(),
        _ => None,
    }
}

fn bias_only(processors: &[LogitsProcessor]) -> Option<Vec<(Vec<i32>, Vec<u32>)>> {
    if processors.is_empty() {
        return None;
    }
    processors
        .iter()
        .map(|p| match p {
            LogitsProcessor::LogitBias { ids, values } => {
                Some((ids.clone(), values.iter().map(|v| v.to_bits()).collect()))
            }
            _ => None,
        })
        .collect()
}

fn batch_cache(c: &mut Box<dyn Cache>) -> Result<&mut BatchKVCache> {
    c.as_any_mut()
        .downcast_mut::<BatchKVCache>()
        .ok_or_else(|| EngineError::Internal {
            what: "the running batch".into(),
            problem: "holds a non-batch cache".into(),
        })
}
