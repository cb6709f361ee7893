//! The engine thread: a bounded queue of requests in, a stream of [`BatchEvent`]s out per
//! request, continuous batching in between.
//!
//! Each loop iteration (1) drops rows whose client has gone or whose deadline has passed,
//! (2) admits queued requests while the batch has room (prefilling each alone, reusing a cached
//! prefix when one is stored), (3) runs one batched decode step and hands every row its token.
//! A finished row leaves the batch before the next step; its cache (prompt plus generated
//! tokens) is stored for prefix reuse.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mlx_cache::{Cache, KVCache, StateValue};
use mlx_core::memory;
use mlx_core::prelude::*;
use mlx_models::embed::{embed, to_vecs};
use mlx_models::LanguageModel;

use super::cache::BatchKVCache;
use super::text::TextState;
use crate::error::{EngineError, Result};
use crate::generate::make_prompt_cache;
use crate::prompt_cache::PromptCache;
use crate::sample::SamplerSettings;
use crate::sample::{make_logits_processors, LogitsProcessor, ProcessorSettings, Sampler};
use crate::stream::FinishReason;
use crate::tokenizer::Tokenizer;

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
    pub prefill_step_size: usize,
    /// Prompt-cache entries kept for prefix reuse (0 disables reuse).
    pub prompt_cache_entries: usize,
    /// Bytes the prompt cache may hold.
    pub prompt_cache_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch: 8,
            queue_size: 64,
            prefill_step_size: 2048,
            prompt_cache_entries: 16,
            prompt_cache_bytes: 1 << 30,
        }
    }
}

/// Why [`Engine::submit`] refused a request.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
}

/// Counters shared with the engine thread.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    /// Prompt tokens taken from the prompt cache, over all requests.
    pub reused_tokens: AtomicUsize,
    pub prefilled_tokens: AtomicUsize,
    pub decode_steps: AtomicUsize,
    /// Largest batch a decode step ran with.
    pub max_batch_seen: AtomicUsize,
    /// Prefills that ran several new requests together.
    pub batched_prefills: AtomicUsize,
}

struct Job {
    request: BatchRequest,
    sink: Box<dyn EventSink>,
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
    stats: Arc<EngineStats>,
    tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
}

impl Engine {
    /// Starts the engine thread, which calls `load` (so the model and its arrays live on that
    /// thread only) and then serves requests. Returns once loading finished, with its error if
    /// it failed.
    pub fn start<F>(load: F, config: EngineConfig) -> Result<(Engine, JoinHandle<()>)>
    where
        F: FnOnce() -> Result<(Box<dyn LanguageModel>, Tokenizer)> + Send + 'static,
    {
        if config.max_batch == 0 {
            return Err(EngineError::Other("max_batch must be at least 1".into()));
        }
        if config.prefill_step_size == 0 {
            return Err(EngineError::Other(
                "prefill_step_size must be positive".into(),
            ));
        }
        let (tx, rx) = mpsc::sync_channel::<Work>(config.queue_size);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(Arc<Tokenizer>, usize)>>();
        let stats = Arc::new(EngineStats::default());
        let thread_stats = stats.clone();
        let queue_size = config.queue_size;
        let handle = std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || {
                let (model, tokenizer) = match load() {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let tokenizer = Arc::new(tokenizer);
                let vocab = model.vocab_size().max(0) as usize;
                if ready_tx.send(Ok((tokenizer.clone(), vocab))).is_err() {
                    return;
                }
                let mut worker = Worker::new(model, tokenizer, config, thread_stats);
                worker.run(rx);
            })
            .map_err(|e| EngineError::Other(format!("starting the engine thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((tokenizer, vocab_size))) => Ok((
                Engine {
                    tx,
                    queue_size,
                    stats,
                    tokenizer,
                    vocab_size,
                },
                handle,
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EngineError::Other(
                "the engine thread stopped while loading".into(),
            )),
        }
    }

    /// The tokenizer the engine was loaded with (tokenize on the caller's thread).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
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
        self.send(Work::Generate(Box::new(Job { request, sink })), 1)
    }

    /// Queues requests that join the batch together, in one step: those without a cached
    /// prefix or a seed are prefilled in one left-padded batch. Takes one queue slot.
    pub fn submit_group(
        &self,
        requests: Vec<(BatchRequest, Box<dyn EventSink>)>,
    ) -> std::result::Result<(), SubmitError> {
        let n = requests.len();
        let jobs = requests
            .into_iter()
            .map(|(request, sink)| Job { request, sink })
            .collect();
        self.send(Work::Group(jobs), n)
    }

    /// Queues sentence embeddings of `inputs` (token ids, each below the vocabulary size and
    /// non-empty): [`mlx_models::embed::embed`] over the model's final normed hidden states,
    /// run on the engine thread between decode steps. `reply` receives the rows.
    pub fn submit_embed(
        &self,
        inputs: Vec<Vec<i32>>,
        reply: EmbedReply,
    ) -> std::result::Result<(), SubmitError> {
        self.send(Work::Embed { inputs, reply }, 1)
    }

    /// Queues `work`, which holds `requests` requests (the `queued` count).
    fn send(&self, work: Work, requests: usize) -> std::result::Result<(), SubmitError> {
        // Counted before sending, so the engine never takes away more than was added.
        self.stats.queued.fetch_add(requests, Ordering::Relaxed);
        match self.tx.try_send(work) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stats.queued.fetch_sub(requests, Ordering::Relaxed);
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
    text: TextState,
    /// The next input of the decode step (the last token emitted).
    next_input: u32,
    generated: usize,
    max_tokens: usize,
    prompt_tokens: usize,
    logprobs: bool,
    top_logprobs: usize,
    deadline: Option<Instant>,
}

struct Worker {
    model: Box<dyn LanguageModel>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    prompt_cache: PromptCache,
    rows: Vec<Seq>,
    caches: Vec<Box<dyn Cache>>,
    steps: usize,
}

/// What happened to a row after its token.
enum Outcome {
    Continue,
    Finished,
}

impl Worker {
    fn new(
        model: Box<dyn LanguageModel>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        stats: Arc<EngineStats>,
    ) -> Self {
        let prompt_cache = PromptCache::new(config.prompt_cache_entries, config.prompt_cache_bytes);
        Worker {
            model,
            tokenizer,
            config,
            stats,
            prompt_cache,
            rows: Vec::new(),
            caches: Vec::new(),
            steps: 0,
        }
    }

    fn run(&mut self, rx: Receiver<Work>) {
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let mut open = true;
        loop {
            if self.rows.is_empty() && waiting.is_empty() {
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(work) => self.take(work, &mut waiting),
                    Err(_) => return,
                }
            }
            while open && self.rows.len() + waiting.len() < self.config.max_batch {
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
            let room = self.config.max_batch.saturating_sub(self.rows.len());
            let joining: Vec<Job> = waiting.drain(..room.min(waiting.len())).collect();
            if !joining.is_empty() {
                self.stats
                    .queued
                    .fetch_sub(joining.len(), Ordering::Relaxed);
                if let Err(e) = self.admit_all(joining) {
                    // The batch may be inconsistent after a failed join: start over.
                    self.fail_all(&e);
                }
            }
            self.stats.active.store(self.rows.len(), Ordering::Relaxed);
            if !self.rows.is_empty() {
                if let Err(e) = self.decode_step() {
                    self.fail_all(&e);
                }
            }
            self.stats.active.store(self.rows.len(), Ordering::Relaxed);
        }
    }

    /// A generation request waits for a slot; embeddings run at once (one forward per input,
    /// no cache).
    fn take(&mut self, work: Work, waiting: &mut VecDeque<Job>) {
        match work {
            Work::Generate(job) => waiting.push_back(*job),
            Work::Group(jobs) => waiting.extend(jobs),
            Work::Embed { inputs, reply } => {
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                let vocab = self.vocab() as i64;
                let bad = inputs.iter().enumerate().find_map(|(i, ids)| {
                    ids.iter()
                        .find(|&&t| t < 0 || i64::from(t) >= vocab)
                        .map(|t| {
                            format!("input {i}: token id {t} is outside the vocabulary of {vocab}")
                        })
                });
                let result = match bad {
                    Some(e) => Err(e),
                    None => {
                        // Checked above: every id is in 0..vocab.
                        let ids: Vec<Vec<u32>> = inputs
                            .iter()
                            .map(|r| r.iter().map(|&t| t as u32).collect())
                            .collect();
                        embed(self.model.as_ref(), &ids).and_then(|e| to_vecs(&e))
                    }
                    .map_err(|e| e.to_string()),
                };
                reply(result);
            }
        }
    }

    fn fail_all(&mut self, e: &EngineError) {
        for mut row in self.rows.drain(..) {
            row.sink.send(BatchEvent::Error(e.to_string()));
        }
        self.caches.clear();
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
        if store && self.config.prompt_cache_entries > 0 {
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

/// A prefill's caches, first token and its `(vocab,)` log-probabilities.
type Prefilled = (Vec<Box<dyn Cache>>, u32, Array);

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
        Some(c) => Err(EngineError::Other(format!(
            "continuous batching needs plain KV caches; this model uses {}",
            c.class_name()
        ))),
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

impl Worker {
    /// Admits the requests that join in this step. Those without a cached prefix or a seed are
    /// prefilled together, left-padded in one batch cache (mlx-lm's `BatchGenerator`); the
    /// others alone, continuing their cached prefix.
    fn admit_all(&mut self, jobs: Vec<Job>) -> Result<()> {
        let mut fresh = Vec::new();
        for job in jobs {
            if job.sink.is_closed() {
                continue;
            }
            match self.plan(&job.request) {
                Ok(Start::Alone(caches, reused)) => self.admit_alone(job, caches, reused)?,
                Ok(Start::Fresh) => fresh.push(job),
                Err(e) => {
                    let mut sink = job.sink;
                    sink.send(BatchEvent::Error(e.to_string()));
                }
            }
        }
        if fresh.len() == 1 {
            let caches = make_prompt_cache(self.model.as_ref(), None)?;
            let job = fresh.remove(0);
            return self.admit_alone(job, caches, 0);
        }
        if !fresh.is_empty() {
            self.admit_together(fresh)?;
        }
        Ok(())
    }

    /// Validates the prompt and decides how it is prefilled.
    fn plan(&mut self, r: &BatchRequest) -> Result<Start> {
        if r.prompt.is_empty() {
            return Err(EngineError::Other("the prompt is empty".into()));
        }
        if let Some(&bad) = r.prompt.iter().find(|&&t| t as usize >= self.vocab()) {
            return Err(EngineError::Other(format!(
                "token id {bad} is outside the model's vocabulary of {}",
                self.vocab()
            )));
        }
        match self.prompt_cache.fetch(&r.prompt) {
            Some(hit) => Ok(Start::Alone(hit.caches, hit.reused)),
            None if r.seed.is_some() => Ok(Start::Alone(
                make_prompt_cache(self.model.as_ref(), None)?,
                0,
            )),
            None => Ok(Start::Fresh),
        }
    }

    /// Prefills a request alone, emits its first token and, unless it is already finished,
    /// adds it to the batch.
    fn admit_alone(&mut self, job: Job, caches: Vec<Box<dyn Cache>>, reused: usize) -> Result<()> {
        let Job { request, mut sink } = job;
        match self.prefill(&request, caches, reused) {
            Ok((caches, first, logprobs)) => {
                match self.start_row(&request, sink, first, &logprobs, reused)? {
                    Some(row) => {
                        self.join(&caches)?;
                        self.rows.push(row);
                    }
                    None if self.config.prompt_cache_entries > 0 => {
                        let mut tokens = request.prompt.clone();
                        tokens.truncate(caches.first().map_or(0, |c| c.offset()));
                        self.prompt_cache.insert(tokens, caches);
                    }
                    None => {}
                }
                Ok(())
            }
            Err(e) => {
                sink.send(BatchEvent::Error(e.to_string()));
                Ok(())
            }
        }
    }

    /// Prefills requests with no cached prefix together: all but their last prompt token,
    /// left-padded to the longest into one `BatchKVCache` per layer (rope at per-row offsets,
    /// the padding masked), in chunks of `prefill_step_size`; then one step on every last
    /// token gives each its first token. The rows that go on join the running batch.
    fn admit_together(&mut self, jobs: Vec<Job>) -> Result<()> {
        let layers = make_prompt_cache(self.model.as_ref(), None)?;
        if let Err(e) = check_plain(&layers) {
            for mut job in jobs {
                job.sink.send(BatchEvent::Error(e.to_string()));
            }
            return Ok(());
        }
        let k = jobs.len();
        let heads: Vec<&[u32]> = jobs
            .iter()
            .map(|j| &j.request.prompt[..j.request.prompt.len() - 1])
            .collect();
        let m = heads.iter().map(|h| h.len()).max().unwrap_or(0);
        let pad: Vec<i32> = heads.iter().map(|h| (m - h.len()) as i32).collect();
        let mut caches: Vec<Box<dyn Cache>> = layers
            .iter()
            .map(|_| Box::new(BatchKVCache::new(&pad)) as Box<dyn Cache>)
            .collect();
        let total: usize = jobs.iter().map(|j| j.request.prompt.len()).sum();
        self.stats
            .prefilled_tokens
            .fetch_add(total, Ordering::Relaxed);
        self.stats.batched_prefills.fetch_add(1, Ordering::Relaxed);
        let mut padded = Vec::with_capacity(k * m);
        for h in &heads {
            padded.extend(std::iter::repeat_n(0i32, m - h.len()));
            padded.extend(h.iter().map(|&t| t as i32));
        }
        let all = Array::from_slice(&padded, &[k as i32, m as i32])?;
        let mut start = 0;
        while start < m {
            let n = self.config.prefill_step_size.min(m - start);
            let x = ops::slice_axis(&all, 1, start as i32, (start + n) as i32, None)?;
            self.model.forward(&x, Some(&mut caches))?;
            eval_caches(&caches)?;
            start += n;
        }
        let last: Vec<i32> = jobs
            .iter()
            .map(|j| j.request.prompt[j.request.prompt.len() - 1] as i32)
            .collect();
        let x = Array::from_slice(&last, &[k as i32, 1])?;
        let logits = last_logits(&self.model.forward(&x, Some(&mut caches))?)?;
        let mut keep = Vec::with_capacity(k);
        let mut rows = Vec::with_capacity(k);
        for (e, job) in jobs.into_iter().enumerate() {
            let Job { request, mut sink } = job;
            let row_logits = ops::slice_axis(&logits, 0, e as i32, e as i32 + 1, None)?;
            let (first, logprobs) = match self.first_token(&request, row_logits) {
                Ok(x) => x,
                Err(err) => {
                    sink.send(BatchEvent::Error(err.to_string()));
                    continue;
                }
            };
            match self.start_row(&request, sink, first, &logprobs, 0)? {
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

    /// Tells the client its prefill is done and hands it its first token. Returns the row
    /// when it goes on (`None`: finished already, or the client is gone).
    fn start_row(
        &mut self,
        request: &BatchRequest,
        mut sink: Box<dyn EventSink>,
        first: u32,
        logprobs: &Array,
        reused: usize,
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
            text: TextState::new(&self.tokenizer, request.stop_strings.clone()),
            next_input: first,
            generated: 0,
            max_tokens: request.max_tokens,
            prompt_tokens,
            logprobs: request.logprobs,
            top_logprobs: request.top_logprobs,
            deadline: request.timeout.map(|t| Instant::now() + t),
        };
        Ok(match self.emit(&mut row, first, Some(logprobs))? {
            Outcome::Continue => Some(row),
            Outcome::Finished => None,
        })
    }

    /// Adds a single sequence's caches to the batch as a new last row.
    fn join(&mut self, caches: &[Box<dyn Cache>]) -> Result<()> {
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

    /// `generate_step`'s prefill over `caches` (holding the first `reused` prompt tokens):
    /// chunks of all but the last prompt token, then one step on the last token. Returns the
    /// caches, the first token and its log-probabilities.
    fn prefill(
        &mut self,
        r: &BatchRequest,
        mut caches: Vec<Box<dyn Cache>>,
        reused: usize,
    ) -> Result<Prefilled> {
        if let Some(seed) = r.seed {
            random::seed(seed)?;
        }
        check_plain(&caches)?;
        self.stats
            .reused_tokens
            .fetch_add(reused, Ordering::Relaxed);
        self.stats
            .prefilled_tokens
            .fetch_add(r.prompt.len() - reused, Ordering::Relaxed);
        let ids: Vec<i32> = r.prompt[reused..].iter().map(|&t| t as i32).collect();
        let mut rest = ids.as_slice();
        while rest.len() > 1 {
            let n = self.config.prefill_step_size.min(rest.len() - 1);
            let x = Array::from_slice(&rest[..n], &[1, n as i32])?;
            self.model.forward(&x, Some(&mut caches))?;
            eval_caches(&caches)?;
            rest = &rest[n..];
        }
        let x = Array::from_slice(rest, &[1, rest.len() as i32])?;
        let logits = last_logits(&self.model.forward(&x, Some(&mut caches))?)?;
        let (token, logprobs) = self.first_token(r, logits)?;
        Ok((caches, token, logprobs))
    }

    /// The first token from the prompt's last logits `(1, vocab)`: the request's logits
    /// processors (over the prompt), log-probabilities, its sampler. Returns the token and the
    /// `(vocab,)` log-probabilities.
    fn first_token(&self, r: &BatchRequest, mut logits: Array) -> Result<(u32, Array)> {
        let processors = make_logits_processors(&r.processors)?;
        if !processors.is_empty() {
            let context: Vec<i32> = r.prompt.iter().map(|&t| t as i32).collect();
            for p in &processors {
                logits = p.apply(&context, &logits)?;
            }
        }
        let all: Vec<i32> = (0..logits.ndim() as i32).collect();
        let lse = ops::logsumexp(&logits, &all, true, None)?;
        let logprobs = ops::subtract(&logits, &lse, None)?;
        let sampled = Sampler::new(r.sampler.clone()).sample(&logprobs)?;
        mlx_core::eval([&sampled, &logprobs])?;
        let token = sampled.astype(Dtype::Uint32)?.to_vec::<u32>()?;
        let token = token
            .first()
            .copied()
            .ok_or_else(|| EngineError::Other("the sampler returned no token".into()))?;
        Ok((token, ops::squeeze(&logprobs, &[0], None)?))
    }

    fn vocab(&self) -> usize {
        self.model.vocab_size().max(0) as usize
    }

    /// One forward pass for every row, then each row's token.
    fn decode_step(&mut self) -> Result<()> {
        let b = self.rows.len();
        self.stats.max_batch_seen.fetch_max(b, Ordering::Relaxed);
        let inputs: Vec<i32> = self.rows.iter().map(|r| r.next_input as i32).collect();
        let x = Array::from_slice(&inputs, &[b as i32, 1])?;
        let logits = self.model.forward(&x, Some(&mut self.caches))?;
        let n = logits.dim(1)?;
        let mut logits = ops::squeeze(&ops::slice_axis(&logits, 1, n - 1, n, None)?, &[1], None)?;
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
        let lse = ops::logsumexp(&logits, &[-1], true, None)?;
        let logprobs = ops::subtract(&logits, &lse, None)?;
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
        let tokens = sampled.astype(Dtype::Uint32)?.to_vec::<u32>()?;
        self.steps += 1;
        self.stats.decode_steps.fetch_add(1, Ordering::Relaxed);
        if self.steps % 256 == 0 {
            memory::clear_cache()?;
        }
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
        let mut keep = Vec::with_capacity(b);
        let mut rows = std::mem::take(&mut self.rows);
        let mut result = Ok(());
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
        result?;
        self.keep_rows(&keep, true)
    }

    /// Hands `token` to its row: EOS, stop strings and the token limit end the row.
    fn emit(&mut self, row: &mut Seq, token: u32, logprobs: Option<&Array>) -> Result<Outcome> {
        let done = |row: &mut Seq, text: String, reason: FinishReason| -> Result<Outcome> {
            row.sink.send(BatchEvent::Done {
                text,
                finish_reason: reason,
                prompt_tokens: row.prompt_tokens,
                completion_tokens: row.generated,
            });
            Ok(Outcome::Finished)
        };
        if self.tokenizer.eos_token_ids().contains(&token) {
            // Counted among the generated tokens, as mlx-lm (and mlx_lm.server's usage) count it.
            row.generated += 1;
            let text = row.text.finish()?;
            return done(row, text, FinishReason::Stop);
        }
        row.generated += 1;
        row.next_input = token;
        let (text, stopped) = row.text.push(token)?;
        let (logprob, top) = match logprobs {
            Some(lp) if row.logprobs => token_logprobs(lp, token, row.top_logprobs)?,
            _ => (None, Vec::new()),
        };
        if stopped {
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
        if row.generated >= row.max_tokens {
            let text = row.text.finish()?;
            return done(row, text, FinishReason::Length);
        }
        Ok(Outcome::Continue)
    }
}

/// A row's processors when they are only logit biases (which read no context): their ids and
/// value bits, to compare rows; `None` otherwise or when there are none.
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
        .ok_or_else(|| EngineError::Other("the running batch holds a non-batch cache".into()))
}

/// A token's log-probability and the most likely `(id, logprob)` pairs of its step.
type TokenLogprobs = (Option<f32>, Vec<(u32, f32)>);

/// The token's log-probability and the `top` most likely `(id, logprob)` pairs.
fn token_logprobs(logprobs: &Array, token: u32, top: usize) -> Result<TokenLogprobs> {
    let lp = logprobs.astype(Dtype::Float32)?;
    let logprob = ops::take(&lp, &Array::from_slice(&[token as i32], &[1])?, 0, None)?
        .to_vec::<f32>()?
        .first()
        .copied();
    let pairs = if top > 0 {
        let k = (top as i32).min(lp.size() as i32);
        let order = ops::argsort(&ops::negative(&lp, None)?, -1, None)?;
        let idx = ops::slice_axis(&order, 0, 0, k, None)?;
        let vals = ops::take(&lp, &idx, 0, None)?.to_vec::<f32>()?;
        idx.to_vec::<u32>()?.into_iter().zip(vals).collect()
    } else {
        Vec::new()
    };
    Ok((logprob, pairs))
}
