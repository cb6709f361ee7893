//! Generation, ported from mlx-lm 0.32.2 `generate.py` `generate_step`: chunked prefill of all
//! but the last prompt token, then a pipelined decode that builds and starts step n+1 before
//! reading token n, MLX's buffer cache cleared where mlx-lm clears it, optional KV-cache
//! quantization, and a caller-supplied prompt cache.

use std::cell::RefCell;
use std::sync::Arc;

use mlx_cache::{Cache, KVCache, RotatingKVCache};
use mlx_core::prelude::*;
use mlx_core::{async_eval, memory};

use crate::compiled::CompiledDecoder;
use crate::cpu_decode::CpuDecoder;
use crate::error::{EngineError, Result};
use crate::sample::{check_logits_processors, check_token_ids, LogitsProcessor, Sampler};
use mlx_models::layers::with_dense_prompt;
pub use mlx_models::layers::DensePrompt;
use mlx_models::LanguageModel;

/// mlx-lm's `DEFAULT_QUANTIZED_KV_START`.
pub const DEFAULT_QUANTIZED_KV_START: usize = 5000;

/// A `--quantized-kv-start` as given (argparse's `int`) as a cache offset: mlx-lm quantizes a
/// cache once `offset >= start`, and an offset is never negative, so a negative start is 0.
pub fn quantized_kv_start_from(start: i64) -> usize {
    usize::try_from(start.max(0)).unwrap_or(usize::MAX)
}

/// `prompt_progress_callback`: called with (prompt tokens processed, prompt tokens) before the
/// prefill, after each prefill chunk and once the first token is ready.
#[derive(Clone)]
pub struct PromptProgress(pub Arc<dyn Fn(usize, usize) + Send + Sync>);

impl std::fmt::Debug for PromptProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PromptProgress(..)")
    }
}

/// Called with what `generate_step` is about to evaluate, before it evaluates it: `"prefill"`
/// with every cache's state after a prefill chunk (`mx.eval([c.state for c in cache])`),
/// `"step"` with a step's token, log-probabilities and log-sum-exp (`mx.async_eval`). The
/// arrays are unevaluated, so their graphs can be inspected ([`mlx_core::graph`]); the graph
/// test compares them with what mlx-lm's `generate_step` evaluates.
#[derive(Clone)]
pub struct EvalProbe(pub Arc<ProbeFn>);

/// What an [`EvalProbe`] calls: the call's name and the arrays about to be evaluated.
pub type ProbeFn = dyn Fn(&'static str, &[&Array]) + Send + Sync;

impl std::fmt::Debug for EvalProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EvalProbe(..)")
    }
}

/// `generate_step`'s keyword arguments.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// `None`: generate until the caller stops (mlx-lm's `-1`).
    pub max_tokens: Option<usize>,
    pub sampler: Sampler,
    pub logits_processors: Vec<LogitsProcessor>,
    /// With no prompt cache given: a rotating cache of this size (keep 4) per layer.
    pub max_kv_size: Option<usize>,
    pub prefill_step_size: usize,
    pub kv_bits: Option<i32>,
    pub kv_group_size: i32,
    pub quantized_kv_start: usize,
    /// How `kv_bits` quantizes: mlx-lm's affine cache, or the trellis cache (2-4 bits; not in
    /// mlx-lm; `--kv-mode trellis`).
    pub kv_mode: mlx_cache::KvMode,
    pub prompt_progress: Option<PromptProgress>,
    /// Decode through [`crate::compiled::CompiledDecoder`] where the model supports it (see
    /// [`CompiledDecode`]).
    pub compiled_decode: CompiledDecode,
    /// Sees each graph before it is evaluated (tests and diagnostics; see [`EvalProbe`]).
    pub eval_probe: Option<EvalProbe>,
    /// Run the model through [`crate::cpu_decode::CpuDecoder`] instead of its MLX forward
    /// (`None`: the exact MLX path). [`cpu_decode_unsupported`] says beforehand whether it
    /// applies; where it does not, `generate_step` fails with the reason. The decoder keeps
    /// its own cache: the MLX caches ([`GenerateStep::into_cache`]) stay empty.
    pub cpu_decode: Option<CpuDecode>,
    /// Constrained decoding: every step's logits are masked to the tokens this grammar allows
    /// next (EOS only where it accepts). The step after a token then waits for that token (its
    /// mask depends on it), so the pipelining of the next step's graph is lost.
    pub grammar: Option<crate::grammar::Grammar>,
    /// Decode through the GPU graph decoder ([`crate::graph`]): the prompt runs through the
    /// MLX forward (which also gives the first token), its cache is copied to the decoder,
    /// and every later token is a replay of the decoder's CUDA graph. [`graph_decode_unsupported`]
    /// says beforehand whether it applies; where it does not, `generate_step` fails with the
    /// reason. A CUDA call that fails mid-run hands the rest of the run to the MLX path (the
    /// tokens generated so far are run through the MLX forward first), noted in
    /// [`GenerateStep::graph_fallback`].
    pub graph_decode: bool,
    /// Testing the fall-back: the graph decoder's `n`-th token fails as a CUDA call would
    /// ([`mlx_kernels::graph_decode::GraphDecoder::inject_failure_after`]).
    #[doc(hidden)]
    pub graph_fail_after: Option<usize>,
    /// Where [`GenerateOptions::graph_decode`] keeps its decoder between generations of one
    /// model ([`crate::graph::GraphKeep`]; `None`: each generation builds its own).
    pub graph_keep: Option<crate::graph::GraphKeep>,
    /// Tests: a stand-in for the CUDA graph decoder ([`crate::graph::GraphStandIn`]), so the
    /// engine's glue runs without a GPU.
    pub graph_stand_in: Option<crate::graph::GraphStandIn>,
    /// Issue #30's prefill: how the quantized linears of the prompt's MLX forward run when
    /// the graph decoder decodes the generation ([`GenerateOptions::graph_decode`], the
    /// prompt through MLX's forward): `Some`: `x @ dequantize(w).T` by blocks for chunks of
    /// enough rows ([`DensePrompt`], tier L3 against the exact forward); `None`: MLX's
    /// `quantized_matmul` (the exact path). Read only with the graph decoder; the environment
    /// overrides it there ([`prompt_dense_from_env`]: `MLX_PREFILL_DENSE`, `_ROWS`,
    /// `_BLOCK_MB`; `_HEADROOM_MB`, [`prefill_headroom_from_env`]). Default
    /// [`PREFILL_DENSE_DEFAULT`].
    pub graph_prompt_dense: Option<DensePrompt>,
}

/// [`GenerateOptions::graph_prompt_dense`]'s default: [`DensePrompt::DEFAULT`] (chunks of 256
/// rows or more, blocks of 32 MiB). It applies where the model's densifiable linears
/// ([`dense_prompt_bytes`]) hold at least [`PREFILL_DENSE_MIN_BYTES`]; a setting other than
/// the default, or `MLX_PREFILL_DENSE=1`, applies at any size ([`dense_prompt_applies`]).
/// MLX's memory limit is then held at the active memory plus [`default_prefill_headroom`]
/// (1,536 MiB at 8B) before each chunk, unless `MLX_PREFILL_DENSE_HEADROOM_MB` says. Measured
/// on an H100 (`results/gpu/2026-12-06-s38-h100` call 3, `mlx benchmark --decoder auto`, the
/// Llama-3.1-8B-shaped 4-bit model, prompt 512, one run of 3 trials a setting): prompt 7,189
/// tok/s off, 11,458 with a 1,536 MiB headroom, 8,971-9,052 with 1,024 (mlx-lm: 6,699); peak
/// 6.228 GB (off 6.348; mlx-lm 6.044 by its trials' mean, 6.347 its largest); without a limit
/// 10,090 tok/s at a 10.73 GB peak. Tier L3 (end to end the 8B's logits were within 0.0135 of
/// the exact forward's; each linear on its own was bit-equal to MLX's CUDA `quantized_matmul`
/// from 256 rows as one block, not always in blocks).
pub const PREFILL_DENSE_DEFAULT: Option<DensePrompt> = Some(DensePrompt::DEFAULT);

/// The default dense prompt ([`PREFILL_DENSE_DEFAULT`]) applies to models whose quantized
/// linears (codes, scales and biases) hold at least this many bytes: 1 GiB. It was measured
/// at 8B (4.5 GB); below, the memory limit's headroom is small against a block and MLX's
/// `quantized_matmul` stays.
pub const PREFILL_DENSE_MIN_BYTES: usize = 1 << 30;

/// The most [`default_prefill_headroom`] gives: 1,536 MiB (at 8B, 2,048 MiB took the peak to
/// 6.70 GB and 1,024 MiB cost a fifth of the gain).
pub const PREFILL_HEADROOM_MAX: usize = 1536 << 20;

/// The memory limit's headroom through a dense prompt when `MLX_PREFILL_DENSE_HEADROOM_MB`
/// does not say: half the densifiable linears' bytes ([`dense_prompt_bytes`]), at least
/// 256 MiB (eight blocks) and at most [`PREFILL_HEADROOM_MAX`], which an 8B model's 3.9 GB
/// reach: the measured setting.
pub fn default_prefill_headroom(quantized_bytes: usize) -> usize {
    (quantized_bytes / 2).clamp(256 << 20, PREFILL_HEADROOM_MAX)
}

/// The bytes (codes, scales and biases) of the quantized linears a dense prompt dequantizes:
/// the attention's projections and the MLPs of layers without experts, affine or
/// floating-point quantized, not trellis-coded. The embedding and the head are not counted (a
/// prompt chunk reads neither as a quantized linear's product), nor experts (MLX's path runs
/// them through `gather_qmm`).
fn dense_prompt_bytes(
    spec: &mlx_kernels::graph_decode::GraphSpec,
    w: &mlx_kernels::graph_decode::GraphWeights,
) -> usize {
    let one = |l: &mlx_kernels::graph_decode::GraphLinear| -> usize {
        match (&l.scales, &l.trellis) {
            (Some(s), None) => {
                l.weight.nbytes() + s.nbytes() + l.biases.as_ref().map_or(0, |b| b.nbytes())
            }
            _ => 0,
        }
    };
    w.layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let attn: usize = [&l.q, &l.k, &l.v, &l.o].into_iter().map(one).sum();
            let mlp: usize = if spec.moe_layer(i) {
                0
            } else {
                [&l.gate, &l.up, &l.down].into_iter().map(one).sum()
            };
            attn + mlp
        })
        .sum()
}

/// Whether the dense prompt linears apply: there must be quantized linears to densify
/// (`bytes` > 0); then the default ([`PREFILL_DENSE_DEFAULT`], neither `explicit` nor
/// `forced` by `MLX_PREFILL_DENSE`) from [`PREFILL_DENSE_MIN_BYTES`] on, a setting at any size.
pub fn dense_prompt_applies(explicit: bool, forced: bool, bytes: usize) -> bool {
    bytes > 0 && (explicit || forced || bytes >= PREFILL_DENSE_MIN_BYTES)
}

/// The fewest rows a prompt chunk takes the dense linears with when `MLX_PREFILL_DENSE=1`
/// turns them on and `MLX_PREFILL_DENSE_ROWS` does not say: the dequantization costs the
/// same at any width (session 38's probe, H100: ~40 ms for the 8B's linears with the probe's
/// per-call synchronisation), so narrow chunks keep MLX's `quantized_matmul` (the probe shows
/// the dense product faster at 512 and 2,048 rows; below, unmeasured).
pub const PREFILL_DENSE_ROWS: usize = 256;

/// [`GenerateOptions::graph_prompt_dense`] under the environment: `MLX_PREFILL_DENSE` `0` (or
/// `off`) turns the dense prompt linears off, `1` (or `on`) on (blocks of
/// [`DensePrompt::DEFAULT_BLOCK_BYTES`] from [`PREFILL_DENSE_ROWS`] rows, unless `given` says
/// otherwise); unset, `given` stands. `MLX_PREFILL_DENSE_ROWS=T` (T >= 1) and
/// `MLX_PREFILL_DENSE_BLOCK_MB=B` (B >= 1, MiB) then set the rows and the block. Any other
/// value is an error naming the variable.
pub fn prompt_dense_from_env(given: Option<DensePrompt>) -> Result<Option<DensePrompt>> {
    let var = |name| std::env::var(name).ok();
    prompt_dense_setting(
        given,
        var("MLX_PREFILL_DENSE").as_deref(),
        var("MLX_PREFILL_DENSE_ROWS").as_deref(),
        var("MLX_PREFILL_DENSE_BLOCK_MB").as_deref(),
    )
}

/// `MLX_PREFILL_DENSE_HEADROOM_MB=H` (H >= 1, MiB; unset: none): with the dense prompt
/// linears on, MLX's memory limit is the active memory at the prompt's start plus H through
/// the prompt ([`with_memory_headroom`]). MLX's CUDA backend keeps every op's inputs (here
/// the dequantized weight blocks) until the batch of ops they were queued in has run, and
/// the host may queue up to ten batches ahead of the device; above the limit, MLX's `eval`
/// waits for queued batches before it queues more, which bounds what the blocks add to the
/// prompt's peak (at some cost in overlap). For A/B runs of speed against peak memory.
pub fn prefill_headroom_from_env() -> Result<Option<usize>> {
    let v = std::env::var("MLX_PREFILL_DENSE_HEADROOM_MB").ok();
    headroom_setting(v.as_deref())
}

/// [`prefill_headroom_from_env`] with the variable's value given (`None`: unset), in bytes.
pub fn headroom_setting(value: Option<&str>) -> Result<Option<usize>> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => match v.parse::<usize>().ok().filter(|&n| n > 0) {
            Some(mb) => mb
                .checked_mul(1 << 20)
                .map(Some)
                .ok_or_else(|| EngineError::Options {
                    option: "MLX_PREFILL_DENSE_HEADROOM_MB".into(),
                    problem: format!("`{v}` MiB is more than this machine can count"),
                }),
            None => Err(EngineError::Options {
                option: "MLX_PREFILL_DENSE_HEADROOM_MB".into(),
                problem: format!("`{v}` is not a whole number of at least 1"),
            }),
        },
    }
}

/// Runs `body` with MLX's memory limit at the active memory now plus `headroom` bytes (`None`:
/// the limit as it is), restoring the previous limit afterwards, also when `body` fails. The
/// limit is never raised above the one in force.
///
/// The limit follows the prompt: before each chunk [`reapply_memory_headroom`] moves it to
/// the active memory then plus `headroom` (the caches grow through a long prompt). It is
/// restored also when `body` panics (a guard), and nothing is done where MLX reports no limit
/// (0). MLX's limit is the process's: one generation at a time should hold it.
pub fn with_memory_headroom<T>(
    headroom: Option<usize>,
    body: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(h) = headroom else {
        return body();
    };
    let previous = memory::memory_limit()?;
    if previous == 0 {
        return body();
    }
    struct Restore(usize, Option<(usize, usize)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            HEADROOM.with(|c| c.set(self.1));
            let _ = memory::set_memory_limit(self.0);
        }
    }
    let outer = HEADROOM.with(|c| c.replace(Some((h, previous))));
    let guard = Restore(previous, outer);
    reapply_memory_headroom()?;
    let out = body();
    drop(guard);
    out
}

thread_local! {
    /// The prompt's memory headroom and the limit before it ([`with_memory_headroom`]).
    static HEADROOM: std::cell::Cell<Option<(usize, usize)>> = const { std::cell::Cell::new(None) };
}

/// Inside [`with_memory_headroom`]: MLX's memory limit to the active memory now plus the
/// headroom, never above the limit before it; elsewhere nothing.
pub fn reapply_memory_headroom() -> Result<()> {
    if let Some((h, previous)) = HEADROOM.with(|c| c.get()) {
        let limit = memory::active_memory()?.saturating_add(h).min(previous);
        memory::set_memory_limit(limit)?;
    }
    Ok(())
}

/// [`prompt_dense_from_env`] with the variables' values given (`None`: unset).
pub fn prompt_dense_setting(
    given: Option<DensePrompt>,
    dense: Option<&str>,
    rows: Option<&str>,
    block_mb: Option<&str>,
) -> Result<Option<DensePrompt>> {
    let bad = |option: &str, value: &str, want: &str| EngineError::Options {
        option: option.into(),
        problem: format!("`{value}` is not {want}"),
    };
    let on = match dense.map(str::trim) {
        None | Some("") => given,
        Some(v) if v == "0" || v.eq_ignore_ascii_case("off") => None,
        Some(v) if v == "1" || v.eq_ignore_ascii_case("on") => Some(given.unwrap_or(
            DensePrompt::new(PREFILL_DENSE_ROWS, DensePrompt::DEFAULT_BLOCK_BYTES)?,
        )),
        Some(v) => return Err(bad("MLX_PREFILL_DENSE", v, "0, off, 1 or on")),
    };
    let count = |option: &str, value: Option<&str>| -> Result<Option<usize>> {
        match value.map(str::trim) {
            None | Some("") => Ok(None),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => Err(bad(option, v, "a whole number of at least 1")),
            },
        }
    };
    let rows = count("MLX_PREFILL_DENSE_ROWS", rows)?;
    let block_mb = count("MLX_PREFILL_DENSE_BLOCK_MB", block_mb)?;
    let Some(d) = on else {
        return Ok(None);
    };
    let block = match block_mb {
        Some(mb) => mb.checked_mul(1 << 20).ok_or_else(|| {
            bad(
                "MLX_PREFILL_DENSE_BLOCK_MB",
                &mb.to_string(),
                "a size in MiB this machine can count",
            )
        })?,
        None => d.block_bytes(),
    };
    Ok(Some(DensePrompt::new(rows.unwrap_or(d.min_rows()), block)?))
}

/// The CPU decoder's settings in [`GenerateOptions`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuDecode {
    /// Worker threads (0: all cores).
    pub threads: usize,
}

/// Why `generate_step` with [`GenerateOptions::cpu_decode`] cannot run `model` with `opts`
/// and a prompt cache (`has_prompt_cache`); `None` when it can. The CPU decoder keeps its own
/// cache, so it cannot continue an MLX prompt cache, and it has no rotating or quantized
/// cache.
pub fn cpu_decode_unsupported(
    model: &dyn LanguageModel,
    opts: &GenerateOptions,
    has_prompt_cache: bool,
) -> Option<String> {
    if has_prompt_cache {
        return Some("a prompt cache is given (the CPU decoder keeps its own cache)".into());
    }
    if opts.max_kv_size.is_some() {
        return Some("--max-kv-size (a rotating cache)".into());
    }
    if opts.kv_bits.is_some() {
        return Some("--kv-bits (a quantized cache)".into());
    }
    if Device::default_device().is_ok_and(|d| d != Device::cpu()) {
        return Some("MLX runs on a GPU".into());
    }
    crate::cpu_decode::unsupported(model)
}

/// Why the graph decoder ([`crate::graph`]) cannot run `model` with `opts` (`None`: it can).
/// `has_prompt_cache`: a prompt cache is continued (`mlx chat`'s turns,
/// `--prompt-cache-file`): taken where its layers are plain KV caches, which `generate_step`
/// checks (the decoder copies the whole cache in after the prompt, and
/// [`GenerateStep::into_cache`] brings the MLX caches up to the generated tokens). It sits
/// here, beside [`GenerateOptions`] which it reads, as [`cpu_decode_unsupported`] does, so
/// that `graph.rs` does not read this module.
pub fn graph_decode_unsupported(
    model: &dyn LanguageModel,
    opts: &GenerateOptions,
    has_prompt_cache: bool,
) -> Option<String> {
    graph_options_unsupported(opts, has_prompt_cache)
        .or_else(|| crate::graph::model_unsupported(model))
        .or_else(|| {
            (!mlx_kernels::graph_decode::GraphDecoder::available())
                .then(|| "no CUDA device (or a build without the `cuda` feature)".to_string())
        })
}

/// The options the graph decoder does not take (one sequence with a plain cache and no
/// grammar; greedy decoding runs on the device, a sampler with a temperature or logits
/// processors on the host from the decoder's logits, as the MLX path samples).
pub fn graph_options_unsupported(opts: &GenerateOptions, has_prompt_cache: bool) -> Option<String> {
    if opts.grammar.is_some() {
        return Some("constrained decoding".into());
    }
    let _ = has_prompt_cache;
    if opts.max_kv_size.is_some() {
        return Some("--max-kv-size (a rotating cache)".into());
    }
    if opts.kv_bits.is_some() {
        return Some("--kv-bits (a quantized cache)".into());
    }
    if opts.cpu_decode.is_some() {
        return Some("the CPU decoder was asked for".into());
    }
    None
}

/// Whether `generate_step` decodes through the compiled step. Off by default: on the CPU
/// the two paths give the same bits (`tests/compiled_decode.rs`), but on the GPU the
/// compiled step gained little for a small model and lost for an 8B 4-bit one (the figures
/// are in `results/gpu/README.md`), so it stays opt-in until it pays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompiledDecode {
    /// The uncompiled forward (mlx-lm's path).
    #[default]
    Off,
    /// The compiled step where the model offers one, else the uncompiled forward; a step
    /// that fails compiled leaves the caches untouched and runs uncompiled (and later steps
    /// stay uncompiled).
    Auto,
}

/// mlx-lm's `prefill_step_size` (`GenerateOptions::prefill_step_size`'s default).
pub const DEFAULT_PREFILL_STEP_SIZE: usize = 2048;

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: Some(256),
            sampler: Sampler::greedy(),
            logits_processors: Vec::new(),
            max_kv_size: None,
            prefill_step_size: DEFAULT_PREFILL_STEP_SIZE,
            kv_bits: None,
            kv_group_size: 64,
            quantized_kv_start: DEFAULT_QUANTIZED_KV_START,
            kv_mode: mlx_cache::KvMode::Affine,
            prompt_progress: None,
            compiled_decode: CompiledDecode::default(),
            eval_probe: None,
            cpu_decode: None,
            grammar: None,
            graph_decode: false,
            graph_fail_after: None,
            graph_keep: None,
            graph_stand_in: None,
            graph_prompt_dense: PREFILL_DENSE_DEFAULT,
        }
    }
}

/// `make_prompt_cache(model, max_kv_size)`: the model's own caches when its mlx-lm class
/// defines `make_cache` (llama does, so `max_kv_size` is ignored there, as in mlx-lm),
/// otherwise rotating caches of `max_kv_size` (keep 4) or plain ones.
pub fn make_prompt_cache(
    model: &dyn LanguageModel,
    max_kv_size: Option<usize>,
) -> Result<Vec<Box<dyn Cache>>> {
    if model.defines_make_cache() {
        return Ok(model.make_cache());
    }
    match max_kv_size {
        None => Ok(model.make_cache()),
        Some(n) => (0..model.num_layers())
            .map(|_| -> Result<Box<dyn Cache>> {
                Ok(Box::new(RotatingKVCache::new(
                    n,
                    4.min(n.saturating_sub(1)),
                )?))
            })
            .collect(),
    }
}

/// `maybe_quantize_kv_cache`: plain caches past `start` tokens become quantized. Unlike
/// mlx-lm (whose `RotatingKVCache.to_quantized` raises), rotating caches become
/// [`mlx_cache::RotatingQuantizedKVCache`]. With [`mlx_cache::KvMode::Trellis`] plain caches
/// become [`mlx_cache::TrellisKVCache`]s (state window [`mlx_cache::DEFAULT_TRELLIS_KV_L`]);
/// rotating caches stay dense (they are bounded already).
pub fn maybe_quantize_kv_cache(
    caches: &mut [Box<dyn Cache>],
    start: usize,
    group_size: i32,
    bits: Option<i32>,
    mode: mlx_cache::KvMode,
) -> Result<()> {
    let Some(bits) = bits else { return Ok(()) };
    for c in caches.iter_mut() {
        if c.offset() < start {
            continue;
        }
        if mode == mlx_cache::KvMode::Trellis {
            if let Some(kv) = c.as_any().downcast_ref::<KVCache>() {
                *c = Box::new(kv.to_trellis(bits, mlx_cache::DEFAULT_TRELLIS_KV_L)?);
            }
            continue;
        }
        if let Some(kv) = c.as_any().downcast_ref::<KVCache>() {
            *c = Box::new(kv.to_quantized(group_size, bits)?);
        } else if let Some(r) = c.as_any().downcast_ref::<RotatingKVCache>() {
            *c = Box::new(r.to_quantized(group_size, bits)?);
        }
    }
    Ok(())
}

/// One generated token: its id and the log-probabilities `(vocab,)` it was sampled from
/// (after logits processors, before the sampler's own transforms).
pub struct Step {
    pub token: u32,
    pub logprobs: Array,
    /// Proposed by a drafter and accepted by the target (speculative decoding; mlx-lm's
    /// `from_draft`).
    pub from_draft: bool,
    /// The token's log-probability where `logprobs` is not given (the graph decoder's steps,
    /// whose `logprobs` is empty: it reads back only the token and this).
    pub logprob: Option<f32>,
}

/// Runs `f` with mlx-lm's `generation_stream` as the default stream: a stream of the default
/// device made once per thread (`mx.new_thread_local_stream(mx.default_device())`), which
/// `generate_step` wraps its prefill and every step in (`with mx.stream(stream)`). The previous
/// default stream is restored afterwards, also when `f` fails.
pub fn on_generation_stream<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    thread_local! {
        static STREAM: RefCell<Option<(Device, Stream)>> = const { RefCell::new(None) };
    }
    let device = Device::default_device()?;
    let previous = Stream::default_for(device)?;
    STREAM.with(|cell| -> Result<()> {
        let mut cell = cell.borrow_mut();
        match &*cell {
            Some((d, s)) if *d == device => s.set_default()?,
            _ => {
                let s = Stream::new(device)?;
                s.set_default()?;
                *cell = Some((device, s));
            }
        }
        Ok(())
    })?;
    let out = f();
    previous.set_default()?;
    out
}

/// Issue #30's peak memory with the graph decoder: MLX's allocator and the decoder's own
/// device buffers (outside it: the decoder's cache and step buffers) as held at once. The run
/// is cut into windows of MLX's peak counter ([`memory::restart_peak_window`]), each with the
/// decoder bytes held through it: the prompt (a decoder kept from an earlier generation, or
/// none), the decoder's build (the larger of the two), the decode (the decoder's), after a
/// failure (none). The peak is the largest window's MLX peak plus its decoder bytes: an upper
/// bound of what the device held at once, never below MLX's own peak, and below MLX's peak
/// plus the decoder's bytes where MLX's peak came in a window without them (the prompt's
/// activations, freed before a decoder built after the prompt allocates its cache).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DevicePeak {
    /// The decoder bytes held through the current window.
    extra: usize,
    /// MLX's live bytes when the current window began (its peak's floor).
    floor: usize,
    /// The largest of the closed windows' MLX peak plus their decoder bytes.
    closed: usize,
}

impl DevicePeak {
    /// A first window, with `extra` decoder bytes held through it.
    pub(crate) fn start(extra: usize) -> mlx_core::Result<Self> {
        let (ended, floor) = memory::restart_peak_window()?;
        Ok(Self {
            extra,
            floor,
            // MLX's peak before the run (the load) held no decoder bytes of this run's.
            closed: ended,
        })
    }

    /// Closes the current window and starts one with `next` decoder bytes held through it.
    pub(crate) fn switch(&mut self, next: usize) -> mlx_core::Result<()> {
        let (ended, floor) = memory::restart_peak_window()?;
        self.close(ended, floor, next);
        Ok(())
    }

    /// [`Self::switch`] with MLX's readings given: the ending window's peak `ended`, the bytes
    /// live as the next one begins `floor`.
    fn close(&mut self, ended: usize, floor: usize, next: usize) {
        self.closed = self.closed.max(ended.max(self.floor) + self.extra);
        self.floor = floor;
        self.extra = next;
    }

    /// Closes the current window, in which `bytes` more came to be held (a decoder built in
    /// it: counted beside the window's whole MLX peak), and starts one that holds `bytes`.
    pub(crate) fn built(&mut self, bytes: usize) -> mlx_core::Result<()> {
        let (ended, floor) = memory::restart_peak_window()?;
        self.built_with(ended, floor, bytes);
        Ok(())
    }

    /// [`Self::built`] with MLX's readings given.
    fn built_with(&mut self, ended: usize, floor: usize, bytes: usize) {
        self.extra = self.extra.max(bytes);
        self.close(ended, floor, bytes);
    }

    /// The peak so far.
    pub(crate) fn now(&self) -> mlx_core::Result<usize> {
        Ok(self.with_window(memory::window_peak(self.floor)?))
    }

    /// [`Self::now`] with the current window's MLX peak given.
    fn with_window(&self, window: usize) -> usize {
        self.closed.max(window.max(self.floor) + self.extra)
    }
}

/// Whether a trellis-coded model's prompt goes through the graph decoder (the default), not
/// MLX's path (`MLX_GRAPH_TRELLIS_PROMPT=0`).
pub fn trellis_prompt_on_decoder() -> bool {
    std::env::var("MLX_GRAPH_TRELLIS_PROMPT").as_deref() != Ok("0")
}

/// Whether the graph path waits for MLX's release of each prompt chunk's intermediates
/// ([`GenerateStep::prefill`]): on unless `MLX_GRAPH_PROMPT_SYNC=0` (read once).
fn prompt_sync_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| prompt_sync_from(std::env::var("MLX_GRAPH_PROMPT_SYNC").ok().as_deref()))
}

/// `MLX_GRAPH_PROMPT_SYNC`'s reading: `0` is off; unset or any other value, on.
fn prompt_sync_from(v: Option<&str>) -> bool {
    v.map(str::trim) != Some("0")
}

/// Whether `MLX_GRAPH_MEMORY=1` (read once).
fn graph_memory_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_GRAPH_MEMORY").is_ok_and(|v| v == "1"))
}

/// `MLX_GRAPH_MEMORY=1`: MLX's allocator (live, cached, peak) and the graph decoder's bytes at
/// a point of a graph run (issue #30's peak), on stderr.
fn graph_memory_line(what: &str, decoder: usize, peak: &DevicePeak) {
    if !graph_memory_on() {
        return;
    }
    let r = (|| -> mlx_core::Result<String> {
        Ok(format!(
            "[graph memory] {what}: MLX live {} B, cached {} B, peak {} B (window {} B); \
             decoder {decoder} B; the run's peak so far {} B",
            memory::active_memory()?,
            memory::cache_memory()?,
            memory::peak_memory()?,
            memory::window_peak(peak.floor)?,
            peak.now()?
        ))
    })();
    if let Ok(line) = r {
        eprintln!("{line}");
    }
}

/// The token stream of [`generate_step`].
pub struct GenerateStep<'m> {
    model: &'m dyn LanguageModel,
    caches: Vec<Box<dyn Cache>>,
    opts: GenerateOptions,
    tokens: Vec<i32>,
    /// The pending token, its log-probabilities and the log-sum-exp of its logits (checked for
    /// NaN or infinity when the token is read).
    y: Option<(Array, Array, Array)>,
    n: usize,
    done: bool,
    prompt_len: usize,
    decoder: Decoder<'m>,
    compiled_steps: usize,
    /// The CPU decoder, when [`GenerateOptions::cpu_decode`] asked for it.
    cpu: Option<CpuDecoder<'m>>,
    /// The graph decoder, when [`GenerateOptions::graph_decode`] asked for it.
    graph: Option<GraphRun<'m>>,
    /// Why the graph decoder handed the run to the MLX path, if it did.
    graph_fallback: Option<String>,
    /// The most device bytes a graph decoder of this run held outside MLX's allocator.
    graph_bytes: usize,
    /// MLX's peak and the graph decoder's own bytes as held at once (issue #30's peak).
    device_peak: DevicePeak,
    /// Prompt tokens a kept decoder held already and did not run again
    /// ([`GenerateStep::prompt_reused`]).
    prompt_reused: usize,
    /// The newest step's token and its log-probability where the host computed them (the
    /// CPU decoder's greedy steps, [`host_greedy`]): the step's log-probabilities are then
    /// left lazy, read only by whoever asks, and the token is read and fed on without MLX.
    host: Option<(u32, f32)>,
    /// Whether a host-greedy step carries its `(vocab,)` log-probabilities (the lazy
    /// `logits - lse`); `false` for a caller that reads only [`Step::logprob`]
    /// ([`generate_step_host`]).
    host_logprobs: bool,
}

/// A run of the graph decoder: the decoder, and the tokens it was given or produced since the
/// MLX caches last saw a token (run through the MLX forward if it fails).
struct GraphRun<'m> {
    /// Always `Some` until the run is dropped (then a CUDA decoder goes back to `keep`).
    dec: Option<Box<dyn crate::graph::GraphBackend + 'm>>,
    started: bool,
    /// The prompt went in through the decoder ([`GenerateStep::prefill_graph`]): it holds the
    /// prompt already, so no MLX cache is copied in when it starts. Its cache then holds
    /// `since_mlx` from position 0 (the MLX caches hold nothing): a conversation's slot keeps
    /// it so ([`crate::graph::GraphKeep::put_holding`]).
    fed: bool,
    since_mlx: Vec<i32>,
    /// Positions of the prompt a kept decoder holds already ([`crate::graph::reusable`]):
    /// [`GenerateStep::prefill_graph`] runs only the rest.
    reuse: usize,
    /// The slot the decoder came from or goes to, the model's identity and the decoder's
    /// spec.
    keep: Option<(
        crate::graph::GraphKeep,
        usize,
        mlx_kernels::graph_decode::GraphSpec,
    )>,
    /// The decoder's construction times, or `None` when it was the kept one.
    built: Option<mlx_kernels::graph_decode::BuildTimes>,
}

impl<'m> GraphRun<'m> {
    fn dec(&mut self) -> mlx_core::Result<&mut (dyn crate::graph::GraphBackend + 'm)> {
        match self.dec.as_mut() {
            Some(d) => Ok(d.as_mut()),
            None => Err(mlx_core::Error::InvalidArgument {
                op: "graph_decoder",
                message: "the run's decoder was given back".into(),
            }),
        }
    }
}

impl Drop for GraphRun<'_> {
    fn drop(&mut self) {
        if let (Some((keep, model, spec)), Some(dec)) = (self.keep.take(), self.dec.take()) {
            if let Some(dec) = dec.into_kept() {
                let (t, held) = (std::time::Instant::now(), dec.device_bytes());
                // A prompt that went in through the decoder: its cache holds the run's tokens
                // from position 0, up to its position (a greedy run's last token is not in
                // it).
                let holds: Vec<u32> = match dec.position() {
                    Some(p) if self.fed && p <= self.since_mlx.len() => {
                        self.since_mlx[..p].iter().map(|&t| t as u32).collect()
                    }
                    _ => Vec::new(),
                };
                keep.put_holding(model, spec, dec, holds);
                if graph_memory_on() {
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    if keep.holds() {
                        eprintln!(
                            "[graph memory] the decoder is kept: {held} B decoding, {} B \
                             while it waits, holding {} positions ({ms:.3} ms)",
                            keep.device_bytes(),
                            keep.held_tokens().len()
                        );
                    } else {
                        eprintln!("[graph memory] the decoder could not be parked: dropped");
                    }
                }
            }
        }
    }
}

/// The compiled decode step a [`GenerateStep`] uses: none, its own (traced during this
/// generation), or the caller's (traced once, reused by every generation of the model).
enum Decoder<'m> {
    None,
    Owned(CompiledDecoder<'m>),
    Shared(&'m CompiledDecoder<'m>),
}

impl<'m> Decoder<'m> {
    fn get(&self) -> Option<&CompiledDecoder<'m>> {
        match self {
            Decoder::None => None,
            Decoder::Owned(d) => Some(d),
            Decoder::Shared(d) => Some(d),
        }
    }
}

/// Starts generating from `prompt` (token ids). With `prompt_cache`, the cache is used and
/// updated (recover it with [`GenerateStep::into_cache`]); otherwise a fresh one is made.
pub fn generate_step<'m>(
    prompt: &[i32],
    model: &'m dyn LanguageModel,
    prompt_cache: Option<Vec<Box<dyn Cache>>>,
    opts: GenerateOptions,
) -> Result<GenerateStep<'m>> {
    generate_step_host(prompt, model, prompt_cache, opts, true)
}

/// [`generate_step`] for a caller that reads of a host-greedy step (the CPU decoder's greedy
/// steps, [`host_greedy`]) only its token's log-probability ([`Step::logprob`]), never its
/// `(vocab,)` log-probabilities (`host_logprobs` false): those steps, the prompt's first
/// token's included, then carry an empty `logprobs`, as the graph decoder's do, and build no
/// MLX graph (no copy of the logits, no MLX op a step: issue #31's peak memory counts the code
/// pages those touch). Tokens and log-probabilities are unchanged.
pub(crate) fn generate_step_host<'m>(
    prompt: &[i32],
    model: &'m dyn LanguageModel,
    prompt_cache: Option<Vec<Box<dyn Cache>>>,
    opts: GenerateOptions,
    host_logprobs: bool,
) -> Result<GenerateStep<'m>> {
    let decoder = match opts.compiled_decode {
        CompiledDecode::Off => Decoder::None,
        CompiledDecode::Auto => match CompiledDecoder::new(model)? {
            Some(d) => Decoder::Owned(d),
            None => Decoder::None,
        },
    };
    start(
        prompt,
        model,
        prompt_cache,
        opts,
        decoder,
        None,
        host_logprobs,
    )
}

/// [`generate_step`] through `cpu`, a CPU decoder of `model` that the caller keeps across
/// generations with its cache (a chat: each turn's prompt continues what the decoder holds;
/// take it back with [`GenerateStep::into_cpu_decoder`]). `opts.cpu_decode` is not consulted,
/// and the options the decoder cannot honour (a rotating or quantized cache) are an error.
/// A decoder made for another model is an error.
pub fn generate_step_cpu<'m>(
    prompt: &[i32],
    model: &'m dyn LanguageModel,
    cpu: CpuDecoder<'m>,
    opts: GenerateOptions,
) -> Result<GenerateStep<'m>> {
    if !cpu.is_for(model) {
        return Err(EngineError::DecoderMismatch {
            context: "generate_step_cpu".into(),
            decoder: "CPU decoder".into(),
            model_type: model.model_type().to_string(),
        });
    }
    start(prompt, model, None, opts, Decoder::None, Some(cpu), true)
}

/// [`generate_step`] decoding through `decoder`, a compiled step of `model` that the caller
/// keeps across generations (`opts.compiled_decode` is not consulted). A decoder made per
/// call traces its segments during the first decode step, which then lands in the time to
/// the first token of every generation; a kept one traces once (a server, a chat session,
/// repeated benchmark trials). If a step fails compiled, this generation goes on uncompiled.
/// A decoder made for another model is an error.
pub fn generate_step_with_decoder<'m>(
    prompt: &[i32],
    model: &'m dyn LanguageModel,
    prompt_cache: Option<Vec<Box<dyn Cache>>>,
    opts: GenerateOptions,
    decoder: &'m CompiledDecoder<'m>,
) -> Result<GenerateStep<'m>> {
    if !decoder.is_for(model) {
        return Err(EngineError::DecoderMismatch {
            context: "generate_step_with_decoder".into(),
            decoder: "compiled decoder".into(),
            model_type: model.model_type().to_string(),
        });
    }
    start(
        prompt,
        model,
        prompt_cache,
        opts,
        Decoder::Shared(decoder),
        None,
        true,
    )
}

fn start<'m>(
    prompt: &[i32],
    model: &'m dyn LanguageModel,
    prompt_cache: Option<Vec<Box<dyn Cache>>>,
    opts: GenerateOptions,
    decoder: Decoder<'m>,
    cpu_given: Option<CpuDecoder<'m>>,
    host_logprobs: bool,
) -> Result<GenerateStep<'m>> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt {
            hint: " (mlx-lm: \"Either input_embeddings or prompt (or both) must be provided.\")"
                .into(),
        });
    }
    if opts.prefill_step_size == 0 {
        return Err(EngineError::NotPositive {
            option: "prefill_step_size".into(),
        });
    }
    check_request(model, prompt, &opts)?;
    let cpu = match (cpu_given, opts.cpu_decode) {
        (Some(d), _) => {
            if let Some(why) = cpu_decode_unsupported(model, &opts, false) {
                return Err(EngineError::CpuDecoderUnsupported(why));
            }
            Some(d)
        }
        (None, Some(c)) => {
            if let Some(why) = cpu_decode_unsupported(model, &opts, prompt_cache.is_some()) {
                return Err(EngineError::CpuDecoderUnsupported(why));
            }
            let room = prompt.len() + opts.max_tokens.unwrap_or(0) + 1;
            Some(CpuDecoder::new(model, c.threads, room)?)
        }
        (None, None) => None,
    };
    // The graph decoder's model and options are checked now; it is built after the prompt
    // (`build_graph`), so that nothing of its build (CUDA allocations, copies out of MLX's
    // buffers, MLX work on the default stream) is in flight while MLX runs the prompt.
    let graph_spec = if opts.graph_decode {
        let why = match &opts.graph_stand_in {
            Some(_) => graph_options_unsupported(&opts, prompt_cache.is_some())
                .or_else(|| crate::graph::model_unsupported(model)),
            None => graph_decode_unsupported(model, &opts, prompt_cache.is_some()),
        };
        let why = why.or_else(|| {
            prompt_cache.as_ref().and_then(|c| {
                c.iter()
                    .find(|c| c.class_name() != "KVCache")
                    .map(|c| format!("the continued prompt cache holds a {}", c.class_name()))
            })
        });
        if let Some(why) = why {
            return Err(EngineError::GraphDecoderUnsupported(why));
        }
        Some(
            crate::graph::map_model(model)
                .map_err(|e| EngineError::GraphDecoderUnsupported(e.to_string()))?,
        )
    } else {
        None
    };
    let caches = match prompt_cache {
        Some(c) => c,
        None => make_prompt_cache(model, opts.max_kv_size)?,
    };
    let mut g = GenerateStep {
        model,
        caches,
        opts,
        tokens: Vec::new(),
        y: None,
        n: 0,
        done: false,
        prompt_len: prompt.len(),
        decoder,
        compiled_steps: 0,
        cpu,
        graph: None,
        graph_fallback: None,
        graph_bytes: 0,
        device_peak: DevicePeak::default(),
        prompt_reused: 0,
        host: None,
        host_logprobs,
    };
    if g.opts.graph_decode {
        // A decoder kept from an earlier generation holds what it keeps while parked (its
        // cache's memory is given back) through this prompt.
        let kept = g.opts.graph_keep.as_ref().map_or(0, |k| k.device_bytes());
        g.device_peak = DevicePeak::start(kept)?;
        graph_memory_line("the prompt starts", kept, &g.device_peak);
    }
    // A trellis-coded model's prompt goes through the graph decoder a token a step: MLX's path
    // has no GPU kernel for its linears (it decodes every weight on the host, one linear at a
    // time; issue #34, results/gpu/2026-12-06-s37-trelpeak). By default (`MLX_GRAPH_TRELLIS_PROMPT=0` sends it to MLX's path): the
    // decoder is L3 against the MLX forward from its first token on, whose choice at a near
    // tie may then differ from the MLX forward's (session 30's `trellis3_b32` row,
    // results/gpu/2026-12-05-s30-h100/call5; graph_decode_cuda's engine check allows that
    // within its teacher-forced bound).
    let trellis_prompt = g.opts.graph_stand_in.is_some() || trellis_prompt_on_decoder();
    let cached = g.caches.iter().map(|c| c.offset()).max().unwrap_or(0);
    match graph_spec {
        Some((spec, weights))
            if trellis_prompt && spec.trellis.is_some() && cached == 0 && prompt.len() > 1 =>
        {
            on_generation_stream(|| g.build_graph(spec, &weights, Some(prompt)))?;
            on_generation_stream(|| g.prefill_graph(prompt))?;
        }
        Some((spec, weights)) => {
            // Issue #30's prefill: the prompt's quantized linears as the graph decoder's
            // generation asks (`graph_prompt_dense`, under the environment).
            let qbytes = dense_prompt_bytes(&spec, &weights);
            let explicit = g.opts.graph_prompt_dense != PREFILL_DENSE_DEFAULT;
            let forced = std::env::var("MLX_PREFILL_DENSE").is_ok_and(|v| !v.trim().is_empty());
            let dense = prompt_dense_from_env(g.opts.graph_prompt_dense)?
                .filter(|_| dense_prompt_applies(explicit, forced, qbytes));
            let headroom = match dense {
                Some(_) => Some(
                    prefill_headroom_from_env()?
                        .unwrap_or_else(|| default_prefill_headroom(qbytes)),
                ),
                None => None,
            };
            on_generation_stream(|| {
                with_memory_headroom(headroom, || with_dense_prompt(dense, || g.prefill(prompt)))
            })?;
            on_generation_stream(|| g.build_graph(spec, &weights, None))?;
        }
        None => on_generation_stream(|| g.prefill(prompt))?,
    }
    Ok(g)
}

impl<'m> GenerateStep<'m> {
    fn track(&mut self, input: &[i32]) {
        if !self.opts.logits_processors.is_empty() {
            self.tokens.extend_from_slice(input);
        }
    }

    /// Builds (or takes the kept) graph decoder once the prompt's first token is computed:
    /// the prompt's MLX work is waited for first, and the build's after it, so a build's CUDA
    /// work never overlaps MLX's (a kept decoder's cache is mapped again while the prompt's
    /// last step runs: driver calls and a memset on the decoder's own stream). A build that
    /// fails (a CUDA call, device memory) leaves the run on the MLX path, with the reason in
    /// [`GenerateStep::graph_fallback`].
    /// `fed`: the prompt, none of it in the MLX caches, that the decoder will take
    /// ([`GenerateStep::prefill_graph`]); a kept decoder that holds the tokens it begins with
    /// (a conversation's slot, [`crate::graph::GraphKeep::for_conversation`]) keeps them.
    fn build_graph(
        &mut self,
        spec: mlx_kernels::graph_decode::GraphSpec,
        weights: &mlx_kernels::graph_decode::GraphWeights,
        fed: Option<&[i32]>,
    ) -> Result<()> {
        let pending = fed.map_or(0, <[i32]>::len);
        // The prompt's window closes here, its MLX work queued (its chunks waited for, its
        // last token's step encoded: MLX allocates as it encodes): its MLX peak beside a kept
        // decoder's parked bytes only.
        let before = self.device_peak.extra;
        graph_memory_line("the prompt is queued", before, &self.device_peak);
        self.device_peak.switch(before)?;
        let model = self.model;
        // The cache holds the prompt and whatever a continued prompt cache held before it.
        let cached = self.caches.iter().map(|c| c.offset()).max().unwrap_or(0);
        let room = cached + pending + self.opts.max_tokens.unwrap_or(GRAPH_DEFAULT_ROOM) + 2;
        // A conversation's decoder is built with room to spare (half again what this turn
        // needs, rounded up to 256 positions, MLX's cache step), so that later turns continue
        // it rather than build another, which would run the whole conversation again: a
        // conversation of `n` positions builds about log1.5(n) decoders, each with at most
        // 1.5x the room it needs plus 255 positions.
        let conversation = self
            .opts
            .graph_keep
            .as_ref()
            .is_some_and(crate::graph::GraphKeep::is_for_conversation);
        let build_room = if conversation {
            (room + room / 2).next_multiple_of(256)
        } else {
            room
        };
        // A kept decoder is taken while the device runs the prompt's last step: mapping its
        // cache's memory again is host work of the driver (milliseconds), hidden behind that
        // step instead of added to the prompt's time. The window that follows counts the
        // whole decoder.
        let taking = std::time::Instant::now();
        let kept = self
            .opts
            .graph_keep
            .as_ref()
            .and_then(|k| k.take(model, &spec, room));
        let took = taking.elapsed().as_secs_f64();
        let prompt_in = (|| -> mlx_core::Result<()> {
            if let Some((y, _, lse)) = &self.y {
                mlx_core::eval([y, lse])?;
            }
            mlx_core::synchronize()
        })();
        if let Err(e) = prompt_in {
            // The prompt failed: the kept decoder goes back (parked) for the next generation.
            if let (Some((d, holds)), Some(k)) = (kept, &self.opts.graph_keep) {
                k.put_holding(crate::graph::model_id(model), spec, d, holds);
            }
            return Err(e.into());
        }
        graph_memory_line("the prompt is in", before, &self.device_peak);
        if let Some((d, holds)) = &kept {
            graph_memory_line(
                &format!(
                    "the kept decoder was taken (holding {} positions), its cache mapped \
                     again in {:.3} ms",
                    holds.len(),
                    took * 1e3
                ),
                d.device_bytes(),
                &self.device_peak,
            );
        }
        let built = kept.is_none();
        let stand_in = self.opts.graph_stand_in.clone();
        let build = |spec: mlx_kernels::graph_decode::GraphSpec,
                     positions: usize|
         -> mlx_core::Result<Box<dyn crate::graph::GraphBackend + 'm>> {
            match &stand_in {
                Some(s) => (s.0)(model, positions),
                None => mlx_kernels::graph_decode::GraphDecoder::new(spec, weights, positions)
                    .map(|d| Box::new(d) as Box<dyn crate::graph::GraphBackend + 'm>),
            }
        };
        let keep_spec = spec.clone();
        // The positions of the prompt the kept decoder holds already.
        let reuse = match (&kept, fed) {
            (Some((_, holds)), Some(prompt)) => crate::graph::reusable(holds, prompt),
            _ => 0,
        };
        let made = match kept {
            Some((d, _)) => Ok(d as Box<dyn crate::graph::GraphBackend + 'm>),
            None => match build(spec.clone(), build_room) {
                // The decoder allocates outside MLX's allocator, so device memory that MLX
                // keeps in its buffer cache (the prompt's freed activations) is not free to
                // it: where a build fails while MLX caches something, the cache goes back to
                // the device and the build is tried once more; a conversation's decoder
                // (built with room to spare) is then tried at the room this turn needs.
                // Where the retries fail too, the first error is the one reported.
                Err(first) => {
                    let mut again = None;
                    if memory::cache_memory()? > 0 {
                        memory::clear_cache()?;
                        again = build(spec.clone(), build_room).ok();
                    }
                    if again.is_none() && build_room > room {
                        again = build(spec, room).ok();
                    }
                    again.ok_or(first)
                }
                r => r,
            },
        };
        let mut dec = match made {
            Ok(d) => d,
            Err(e) => {
                self.graph_fallback = Some(format!(
                    "the graph decoder could not be built ({e}); the MLX path runs the \
                     generation"
                ));
                // A kept decoder that did not fit was dropped before the build.
                self.device_peak.switch(0)?;
                return Ok(());
            }
        };
        mlx_core::synchronize()?;
        // The build's window: a kept decoder that did not fit was dropped before the new one
        // was made, so at most the larger of the two was held during it.
        self.device_peak.extra = before.max(dec.device_bytes());
        self.device_peak.switch(dec.device_bytes())?;
        graph_memory_line(
            "the decoder is ready",
            dec.device_bytes(),
            &self.device_peak,
        );
        if let Some(n) = self.opts.graph_fail_after {
            dec.inject_failure_after(n);
        }
        self.graph_bytes = self.graph_bytes.max(dec.device_bytes());
        self.graph = Some(GraphRun {
            built: if built { dec.build_times() } else { None },
            dec: Some(dec),
            started: false,
            fed: false,
            since_mlx: Vec::new(),
            reuse,
            keep: self
                .opts
                .graph_keep
                .clone()
                .map(|k| (k, crate::graph::model_id(model), keep_spec)),
        });
        Ok(())
    }

    /// `_step`: one forward of `input` through the cache, then processors and the sampler.
    fn step(&mut self, input: &Array, ids: Option<&[i32]>) -> Result<(Array, Array, Array)> {
        let len = input.size();
        // Decode steps only (`ids` is `None`): the prompt's last token runs through the MLX
        // forward, which gives the first token as on the greedy path.
        if len == 1 && ids.is_none() && self.graph_host() {
            if let Some((tok, logits)) = self.graph_logits(input)? {
                let logits = Array::from_slice(&logits, &[1, logits.len() as i32])?
                    .astype(Dtype::Bfloat16)?;
                return self.sample_logits(logits, len, Some(&[tok]), None);
            }
        }
        if let Some(cpu) = self.cpu.as_mut() {
            if len == 1 {
                // A decode step (host-greedy ones come with their id): the prompt is in, its
                // blocks' scratch goes back (issue #31's peak memory; once a prompt, nothing
                // to do on later steps).
                cpu.release_prompt_scratch();
            }
            let owned;
            let ids = match ids {
                Some(ids) => ids,
                None => {
                    owned = input.astype(Dtype::Int32)?.to_vec::<i32>()?;
                    &owned
                }
            };
            let toks: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
            let logits = cpu.feed(&toks)?;
            let greedy = self.opts.sampler.settings().temp == 0.0
                && self.opts.logits_processors.is_empty()
                && self.opts.grammar.is_none();
            self.host = None;
            if greedy {
                if let Some((r, tok, lp)) = host_greedy(logits, self.host_logprobs)? {
                    self.host = Some((tok, lp));
                    return Ok(r);
                }
            }
            let logits = Array::from_slice(logits, &[1, logits.len() as i32])?;
            return self.sample_logits(logits, len, Some(ids), None);
        }
        let x = ops::expand_dims(input, &[0], None)?;
        let staged = match self.decoder.get() {
            Some(d) if len == 1 => match d.step(&x, &self.caches) {
                Ok(s) => Some(s),
                // The caches are untouched: go on uncompiled.
                Err(_) => {
                    self.decoder = Decoder::None;
                    None
                }
            },
            _ => None,
        };
        let logits = match &staged {
            Some(s) => s.logits().clone(),
            None => self.model.forward(&x, Some(&mut self.caches))?,
        };
        let n = logits.dim(1)?;
        let logits = ops::squeeze(&ops::slice_axis(&logits, 1, n - 1, n, None)?, &[1], None)?;
        self.sample_logits(logits, len, ids, Some((input, staged)))
    }

    /// The processors and the sampler on the last position's `logits` `(1, vocab)`; then the
    /// compiled step's commit (`staged`) and the cache quantization of the MLX path.
    fn sample_logits(
        &mut self,
        mut logits: Array,
        len: usize,
        ids: Option<&[i32]>,
        mlx: Option<(&Array, Option<crate::compiled::StagedStep>)>,
    ) -> Result<(Array, Array, Array)> {
        if !self.opts.logits_processors.is_empty() && len > 0 {
            match ids {
                Some(ids) => self.track(ids),
                None => {
                    let input = mlx
                        .as_ref()
                        .map(|m| m.0)
                        .ok_or_else(|| EngineError::Internal {
                            what: "sample_logits".into(),
                            problem: "no input ids".into(),
                        })?;
                    let v = input.astype(Dtype::Int32)?.to_vec::<i32>()?;
                    self.track(&v);
                }
            }
            for p in &self.opts.logits_processors {
                logits = p.apply(&self.tokens, &logits)?;
            }
        }
        if let Some(g) = self.opts.grammar.as_mut() {
            // The forward runs while the host computes the mask.
            async_eval([&logits])?;
            logits = g.mask_logits(&logits)?;
        }
        let all: Vec<i32> = (0..logits.ndim() as i32).collect();
        let lse = ops::logsumexp(&logits, &all, true, None)?;
        let logprobs = ops::subtract(&logits, &lse, None)?;
        let sampled = self.opts.sampler.sample(&logprobs)?;
        let Some((_, staged)) = mlx else {
            return Ok((sampled, ops::squeeze(&logprobs, &[0], None)?, lse));
        };
        if let Some(s) = staged {
            s.commit(&mut self.caches)?;
            self.compiled_steps += 1;
        }
        self.quantize_kv()?;
        Ok((sampled, ops::squeeze(&logprobs, &[0], None)?, lse))
    }

    /// mlx-lm's `quantize_cache_fn`: `maybe_quantize_kv_cache` with the run's KV options.
    fn quantize_kv(&mut self) -> Result<()> {
        maybe_quantize_kv_cache(
            &mut self.caches,
            self.opts.quantized_kv_start,
            self.opts.kv_group_size,
            self.opts.kv_bits,
            self.opts.kv_mode,
        )
    }

    fn probe(&self, what: &'static str, arrays: &[&Array]) {
        if let Some(p) = &self.opts.eval_probe {
            (p.0)(what, arrays);
        }
    }

    fn progress(&self, done: usize) {
        if let Some(p) = &self.opts.prompt_progress {
            (p.0)(done, self.prompt_len);
        }
    }

    fn prefill(&mut self, prompt: &[i32]) -> Result<()> {
        let mut rest = prompt;
        // One array for the prompt, sliced per chunk as mlx-lm slices it (`prompt[:n][None]`,
        // then `prompt = prompt[n:]`), so the graphs are mlx-lm's node for node.
        let mut remaining = Array::from_slice(rest, &[rest.len() as i32])?;
        self.progress(0);
        if self.cpu.is_some() {
            // The whole prompt through the CPU decoder (in blocks, inside `feed`).
            let (y, lp, lse) = self.step(&remaining, Some(rest))?;
            if self.host.is_none() {
                async_eval([&y, &lp, &lse])?;
            }
            self.y = Some((y, lp, lse));
            return Ok(());
        }
        while rest.len() > 1 {
            let n = self.opts.prefill_step_size.min(rest.len() - 1);
            let chunk = &rest[..n];
            // A dense prompt's memory headroom follows the caches' growth.
            reapply_memory_headroom()?;
            let processed = ops::slice_axis(&remaining, 0, 0, n as i32, None)?;
            let x = ops::expand_dims(&processed, &[0], None)?;
            self.model.forward(&x, Some(&mut self.caches))?;
            self.quantize_kv()?;
            // `mx.eval([c.state for c in prompt_cache])`: every cache's state, recurrent
            // (ArraysCache) state included, so the lazy graph never grows with the prompt.
            let states: Vec<Array> = self
                .caches
                .iter()
                .flat_map(|c| c.state().into_arrays())
                .collect();
            self.probe("prefill", &states.iter().collect::<Vec<_>>());
            mlx_core::eval(states.iter())?;
            self.track(chunk);
            rest = &rest[n..];
            remaining = ops::slice_axis(&remaining, 0, n as i32, (n + rest.len()) as i32, None)?;
            self.progress(self.prompt_len - rest.len());
            if self.opts.graph_decode && prompt_sync_on() {
                // MLX's CUDA backend keeps a chunk's intermediates alive until its worker
                // thread has seen the chunk's kernels complete, after `eval` returns: waiting
                // for that worker here frees them (and lets `clear_cache` give them back)
                // before the graph decoder's bytes are counted beside MLX's live ones
                // ([`DevicePeak`]'s windows) or allocated. Without it, whether they were still
                // live when the decoder's window began depended on that thread's timing.
                mlx_core::synchronize()?;
            }
            memory::clear_cache()?;
        }
        let (y, lp, lse) = self.step(&remaining, Some(rest))?;
        self.probe("step", &[&y, &lp, &lse]);
        async_eval([&y, &lp, &lse])?;
        self.y = Some((y, lp, lse));
        Ok(())
    }

    /// The prompt through the graph decoder ([`crate::graph::GraphBackend::feed_prompt`], one
    /// step a token), its last token's logits sampled as the MLX path samples them. Where the
    /// decoder was not built, or fails, the MLX path takes the prompt (the tokens the decoder
    /// took are run through the MLX forward first).
    fn prefill_graph(&mut self, prompt: &[i32]) -> Result<()> {
        let Some((&last, head)) = prompt.split_last() else {
            return self.prefill(prompt);
        };
        if self.graph.is_none() {
            return self.prefill(prompt);
        }
        self.progress(0);
        let Some(g) = self.graph.as_mut() else {
            return self.prefill(prompt);
        };
        let r = (|| -> mlx_core::Result<Vec<f32>> {
            let ids = |ts: &[i32]| -> mlx_core::Result<Vec<u32>> {
                ts.iter()
                    .map(|&t| {
                        u32::try_from(t).map_err(|_| mlx_core::Error::InvalidArgument {
                            op: "graph_decoder",
                            message: format!("token id {t}"),
                        })
                    })
                    .collect()
            };
            // A kept decoder that holds the prompt's first `reuse` tokens (a conversation's
            // earlier turns) runs only the rest; else the whole prompt from position 0.
            let reuse = g.reuse.min(head.len());
            if reuse > 0 {
                g.dec()?.resume(reuse, &ids(&head[reuse..])?)?;
            } else {
                g.dec()?.feed_prompt(&ids(head)?)?;
            }
            g.fed = true;
            g.since_mlx.extend_from_slice(head);
            let l = g.dec()?.step_logits(ids(&[last])?[0])?;
            g.since_mlx.push(last);
            if let Some(v) = l.iter().find(|v| !v.is_finite()) {
                return Err(graph_not_finite(format!("a logit of {v}")));
            }
            Ok(l)
        })();
        match r {
            Ok(l) => {
                self.prompt_reused = self.graph.as_ref().map_or(0, |g| g.reuse.min(head.len()));
                self.track(head);
                self.progress(self.prompt_len);
                let logits =
                    Array::from_slice(&l, &[1, l.len() as i32])?.astype(Dtype::Bfloat16)?;
                let (y, lp, lse) = self.sample_logits(logits, 1, Some(&[last]), None)?;
                async_eval([&y, &lp, &lse])?;
                self.y = Some((y, lp, lse));
                Ok(())
            }
            Err(e) => {
                // The MLX caches hold nothing of the prompt yet: the MLX path runs it all.
                let _ = self.graph_give_up(&e);
                self.prefill(prompt)
            }
        }
    }

    /// The caches, e.g. to keep as a prompt cache for the next call. After the graph decoder,
    /// the tokens it saw are run through the MLX forward first, so that the caches hold what
    /// the MLX path's would (every token returned); if that fails, the caches may hold fewer.
    /// A caller that may not need the caches takes [`Self::into_held_cache`] instead.
    pub fn into_cache(self) -> Vec<Box<dyn Cache>> {
        let model = self.model;
        self.into_held_cache().sync_or_keep(model)
    }

    /// The caches and the tokens the graph decoder saw that they do not hold yet, run through
    /// the MLX forward only when the caches are used ([`crate::held::HeldCaches`]): after a
    /// trellis prompt on the decoder, the MLX caches hold nothing and every token is pending
    /// (`mlx chat`'s next turn then runs them on the decoder with its prompt). Nothing is
    /// pending after the MLX path or the CPU decoder.
    /// A decoder kept in a conversation's slot ([`crate::graph::GraphKeep::for_conversation`])
    /// keeps those tokens in its cache: the next turn, given them as the head of its prompt,
    /// runs only what follows them.
    pub fn into_held_cache(mut self) -> crate::held::HeldCaches {
        // Cloned: the run's decoder, given back to its slot when `settle` lets it go, says
        // which of them its cache holds.
        let ids = self
            .graph
            .as_ref()
            .map(|g| g.since_mlx.clone())
            .unwrap_or_default();
        self.settle();
        crate::held::HeldCaches::new(std::mem::take(&mut self.caches), ids)
    }

    /// The CPU decoder this generation ran through (`None` on the MLX path), its cache
    /// holding the prompt and every token the model ran on (as [`Self::into_cache`]'s).
    pub fn into_cpu_decoder(mut self) -> Option<CpuDecoder<'m>> {
        self.settle();
        self.cpu.take()
    }

    /// Waits for the step still in flight (the token computed ahead of the one returned last,
    /// which the caller never took) and then lets the graph decoder go: what a generation
    /// queued on the device is finished before the next one seeds, samples or builds a
    /// decoder, and no CUDA teardown (the decoder's streams, buffers, module) overlaps MLX work.
    fn settle(&mut self) {
        if let Some((y, lp, lse)) = self.y.take() {
            let _ = on_generation_stream(|| {
                mlx_core::eval([&y, &lp, &lse])?;
                Ok(())
            });
        }
        if let Some(g) = self.graph.take() {
            let _ = on_generation_stream(|| Ok(mlx_core::synchronize()?));
            graph_memory_line("the run ends", self.graph_bytes, &self.device_peak);
            drop(g);
        }
    }

    /// Whether this generation runs through the CPU decoder.
    pub fn uses_cpu_decoder(&self) -> bool {
        self.cpu.is_some()
    }

    pub fn cache(&self) -> &[Box<dyn Cache>] {
        &self.caches
    }

    /// Whether this generation decodes through the graph decoder (until a fallback).
    pub fn uses_graph_decoder(&self) -> bool {
        self.graph.is_some()
    }

    /// Tokens at the head of the prompt that a kept decoder held already
    /// ([`crate::graph::GraphKeep::for_conversation`]: a conversation's earlier turns) and
    /// that this generation did not run again; 0 without one (every other run).
    pub fn prompt_reused(&self) -> usize {
        self.prompt_reused
    }

    /// How the graph decoder of this generation was made: `Some(times)` when it was built
    /// for it (kernels, weights, capture), `None` when it was a kept one
    /// ([`GenerateOptions::graph_keep`]) or the run has no graph decoder.
    pub fn graph_build_times(&self) -> Option<mlx_kernels::graph_decode::BuildTimes> {
        self.graph.as_ref().and_then(|g| g.built)
    }

    /// The most device bytes this run's graph decoder held outside MLX's allocator (the
    /// weights it re-lays for the kernels, its cache and activations); 0 without
    /// one. [`crate::stream`]'s peak memory is MLX's peak plus this, an upper bound of what
    /// the device held at once.
    pub fn graph_device_bytes(&self) -> usize {
        self.graph_bytes
    }

    /// The most bytes this run held on the device at once, MLX's allocator and the graph
    /// decoder's own buffers together (`None` without [`GenerateOptions::graph_decode`]:
    /// MLX's [`memory::peak_memory`] is the whole of it then). A decoder's buffers count
    /// only beside MLX's peak of the time they were held: a decoder built after the prompt
    /// does not add its cache to the prompt's activations, which MLX has freed by then
    /// ([`DevicePeak`]); one kept from an earlier generation holds them through the prompt.
    pub fn device_peak(&self) -> Result<Option<usize>> {
        if !self.opts.graph_decode {
            return Ok(None);
        }
        Ok(Some(self.device_peak.now()?))
    }

    /// Why the graph decoder handed this run to the MLX path (a failed CUDA call or a full
    /// cache), if it did.
    pub fn graph_fallback(&self) -> Option<&str> {
        self.graph_fallback.as_deref()
    }

    /// Whether the graph decoder runs teacher-forced, its logits sampled on the host by the MLX
    /// path's sampler and processors (a sampler with a temperature, logits processors); else
    /// it decodes greedily on the device ([`Self::advance_graph`]).
    fn graph_host(&self) -> bool {
        self.graph.is_some()
            && (self.opts.sampler.settings().temp != 0.0 || !self.opts.logits_processors.is_empty())
    }

    /// The graph decoder's logits (bfloat16 values as `f32`) after the one token `input`, with
    /// that token's id: the first call copies the prompt's MLX cache in. `None`: the decoder
    /// failed (a CUDA call, or logits that are not finite where the MLX forward's were); the
    /// tokens it had taken are run through the MLX forward (the MLX caches catch up), and the
    /// run goes on on the MLX path from `input`.
    fn graph_logits(&mut self, input: &Array) -> Result<Option<(i32, Vec<f32>)>> {
        let tok = input.astype(Dtype::Int32)?.item::<i32>()?;
        let Some(g) = self.graph.as_mut() else {
            return Ok(None);
        };
        let r = (|| -> mlx_core::Result<Vec<f32>> {
            if !g.started {
                if !g.fed {
                    let kv = graph_prefix(&self.caches)?;
                    g.dec()?.set_prefix(&kv)?;
                }
                g.started = true;
            }
            let t = u32::try_from(tok).map_err(|_| mlx_core::Error::InvalidArgument {
                op: "graph_decoder",
                message: format!("token id {tok}"),
            })?;
            let l = g.dec()?.step_logits(t)?;
            if let Some(v) = l.iter().find(|v| !v.is_finite()) {
                return Err(graph_not_finite(format!("a logit of {v}")));
            }
            Ok(l)
        })();
        match r {
            Ok(l) => {
                g.since_mlx.push(tok);
                Ok(Some((tok, l)))
            }
            Err(e) => {
                let ids = self.graph_give_up(&e);
                if !ids.is_empty() {
                    forward_into_caches(
                        self.model,
                        &mut self.caches,
                        &ids,
                        self.opts.prefill_step_size,
                    )?;
                }
                Ok(None)
            }
        }
    }

    /// Drops the run's graph decoder after `e` and notes why; the tokens it had taken since
    /// the MLX caches were last brought up to date, for the MLX forward to catch up on.
    fn graph_give_up(&mut self, e: &mlx_core::Error) -> Vec<i32> {
        let Some(mut g) = self.graph.take() else {
            return Vec::new();
        };
        self.graph_fallback = Some(format!(
            "the graph decoder failed ({e}); the MLX path continues the run"
        ));
        // A decoder that failed is not kept for the next generation.
        g.keep = None;
        let ids = std::mem::take(&mut g.since_mlx);
        drop(g);
        let _ = self.device_peak.switch(0);
        ids
    }

    /// One token from the graph decoder: the first call copies the prompt's cache in and
    /// starts the run at the MLX forward's first token `first`. `None`: the decoder failed (a
    /// CUDA call, or a log-probability that is not finite) and the run goes on on the MLX path
    /// (the tokens it produced are run through the MLX forward, which gives the next token as
    /// `self.y`).
    fn graph_next(&mut self, first: u32) -> Result<Option<(u32, f32)>> {
        let Some(g) = self.graph.as_mut() else {
            return Ok(None);
        };
        let left = self.opts.max_tokens.map_or(usize::MAX, |m| m - self.n);
        let r = (|| -> mlx_core::Result<(u32, f32)> {
            graph_begin(g, &self.caches, first, left)?;
            let (t, lp) = g.dec()?.next_token()?;
            if !lp.is_finite() {
                return Err(graph_not_finite(format!(
                    "token {t} with a log-probability of {lp}"
                )));
            }
            Ok((t, lp))
        })();
        match r {
            Ok((t, lp)) => {
                g.since_mlx.push(t as i32);
                Ok(Some((t, lp)))
            }
            Err(e) => {
                // The MLX caches hold the prompt: run the tokens the decoder saw or produced
                // through the MLX forward, whose last position gives the next token.
                let ids = self.graph_give_up(&e);
                let toks = if ids.is_empty() {
                    vec![first as i32]
                } else {
                    ids
                };
                // A long history (a conversation whose turns ran on the decoder) goes in
                // chunks of `prefill_step_size`, as a prompt does; the last chunk gives the
                // next token.
                let split = toks.len().saturating_sub(self.opts.prefill_step_size);
                if split > 0 {
                    let (head, _) = toks.split_at(split);
                    forward_into_caches(
                        self.model,
                        &mut self.caches,
                        head,
                        self.opts.prefill_step_size,
                    )?;
                    self.track(head);
                }
                let toks = &toks[split..];
                let x = Array::from_slice(toks, &[toks.len() as i32])?;
                let next = self.step(&x, Some(toks))?;
                async_eval([&next.0, &next.1, &next.2])?;
                self.y = Some(next);
                Ok(None)
            }
        }
    }

    /// How many steps ran through the compiled decode step.
    pub fn compiled_steps(&self) -> usize {
        self.compiled_steps
    }

    fn advance(&mut self) -> Result<Option<Step>> {
        if self.done {
            return Ok(None);
        }
        let Some((y, logprobs, lse)) = self.y.take() else {
            return Ok(None);
        };
        let stop = self.opts.max_tokens == Some(self.n);
        // This step's token and log-probability where the host computed them (`step` below
        // replaces them with the next one's).
        let host = self.host;
        if self.graph.is_some() && !stop && !self.graph_host() {
            return self.advance_graph(y, logprobs, lse);
        }
        if !stop {
            if let Some(g) = self.opts.grammar.as_mut() {
                // The next step's mask depends on this token: read it now.
                g.commit(y.astype(Dtype::Uint32)?.item::<u32>()?)?;
            }
        }
        let next = if !stop {
            // A host-greedy token is fed as its id: reading `y` would be an MLX evaluation on
            // the generation stream (a hand-off to its thread) every step.
            let id = host.map(|h| [h.0 as i32]);
            let next = self.step(&y, id.as_ref().map(|i| &i[..]))?;
            self.probe("step", &[&next.0, &next.1, &next.2]);
            // A host-greedy step's arrays hold their values already but its
            // log-probabilities, left lazy.
            if self.host.is_none() {
                async_eval([&next.0, &next.1, &next.2])?;
            }
            Some(next)
        } else {
            None
        };
        if self.n == 0 {
            y.eval()?;
            self.progress(self.prompt_len);
        }
        if stop {
            self.done = true;
            // Kept (not dropped while the device may still compute it): `settle` waits.
            self.y = Some((y, logprobs, lse));
            return Ok(None);
        }
        let token = match host {
            Some((t, _)) => t,
            None => y.astype(Dtype::Uint32)?.item::<u32>()?,
        };
        // A NaN or infinite logit makes every log-probability NaN; the samplers would then
        // return token 0 as if it had been chosen.
        // Read in its own dtype: an `astype` here would be a new node queued on the
        // generation stream behind the whole next step, and waiting for it would serialise
        // the pipeline (the host could not build step n+2 while the device runs step n+1).
        // A host-greedy step checked its logits already (finite largest, no NaN).
        if host.is_none() {
            let norm = lse.to_vec_f32()?;
            if let Some(v) = norm.iter().find(|v| !v.is_finite()) {
                return Err(EngineError::NonFiniteLogits {
                    token: self.n,
                    lse: *v,
                });
            }
        }
        if self.n % 256 == 0 {
            memory::clear_cache()?;
        }
        self.y = next;
        self.n += 1;
        Ok(Some(Step {
            token,
            logprobs,
            from_draft: false,
            logprob: host.map(|h| h.1),
        }))
    }
}

/// Greedy sampling of the CPU decoder's `logits` on the host, so that a decode step runs no
/// MLX graph before the next one can start: the token the first largest logit, the
/// log-sum-exp on the host ([`mlx_core::cpu::greedy_lse`]: MLX's CPU `logsumexp` replayed
/// bit for bit, its `exp` 8 lanes at a time; MLX's own runs one lane on its stream's thread,
/// beside the decoder's workers, every step), the log-probabilities `logits - lse` left as
/// MLX's lazy op for whoever reads them (`with_logprobs`; else an empty array, see
/// [`generate_step_host`]), and the token's log-probability. `((token (1,),
/// logprobs (vocab,), lse (1, 1)), token, log-probability)`; `None` where a logit is NaN or the
/// largest is not finite (the MLX path then reports it as usual). Tier L3 for the token
/// only: it differs from `argmax` over MLX's log-probabilities only where two logits round
/// to one log-probability (an exact tie there); the log-sum-exp and log-probabilities are
/// MLX's bits (`greedy_lse_matches_logsumexp`).
#[allow(clippy::type_complexity)]
fn host_greedy(
    logits: &[f32],
    with_logprobs: bool,
) -> Result<Option<((Array, Array, Array), u32, f32)>> {
    let Some((best, lse)) = mlx_core::cpu::greedy_lse(mlx_core::cpu::Isa::detect(), logits) else {
        return Ok(None);
    };
    let lse_a = Array::from_slice(&[lse], &[1, 1])?;
    let logprobs = if with_logprobs {
        let x = Array::from_slice(logits, &[1, logits.len() as i32])?;
        ops::squeeze(&ops::subtract(&x, &lse_a, None)?, &[0], None)?
    } else {
        Array::from_slice::<f32>(&[], &[0])?
    };
    let token = Array::from_slice(&[best as u32], &[1])?;
    Ok(Some((
        (token, logprobs, lse_a),
        best as u32,
        logits[best] - lse,
    )))
}

impl GenerateStep<'_> {
    /// [`GenerateStep::advance`] on the graph decoder: the first token is the MLX forward's
    /// (`y`, with its log-probabilities); every later one the decoder's, until it fails.
    fn advance_graph(&mut self, y: Array, logprobs: Array, lse: Array) -> Result<Option<Step>> {
        if self.n == 0 {
            y.eval()?;
            self.progress(self.prompt_len);
            let norm = lse.to_vec_f32()?;
            if let Some(v) = norm.iter().find(|v| !v.is_finite()) {
                return Err(EngineError::NonFiniteLogits { token: 0, lse: *v });
            }
            let token = y.astype(Dtype::Uint32)?.item::<u32>()?;
            // The decoder starts from it now (the prompt's cache copied in, its first steps
            // queued), so that the device computes the next tokens while this one goes to the
            // caller, as mlx-lm queues its next step before it yields a token. A failure here
            // is met again, and handled, by the next call (`graph_next`).
            if self.opts.max_tokens.is_none_or(|m| m > 1) {
                if let Some(g) = self.graph.as_mut() {
                    let left = self.opts.max_tokens.map_or(usize::MAX, |m| m - 1);
                    let _ = graph_begin(g, &self.caches, token, left);
                }
                graph_memory_line("the prefix is in", self.graph_bytes, &self.device_peak);
            } else if let Some(g) = self.graph.as_mut() {
                // The run's only token: the decoder never takes it, but the caches the MLX
                // path leaves hold it (its step ran before it was handed out), so it is
                // pending for them, as `graph_begin` leaves a started run's first token.
                g.since_mlx.push(token as i32);
            }
            // Held as the pending token: the decoder started (or the next call starts it)
            // from it.
            self.y = Some((y, Array::from_slice::<f32>(&[], &[0])?, lse));
            self.n += 1;
            return Ok(Some(Step {
                token,
                logprobs,
                from_draft: false,
                logprob: None,
            }));
        }
        let first = y.astype(Dtype::Uint32)?.item::<u32>()?;
        if self.n == 1 {
            // mlx-lm clears MLX's buffer cache after it hands out the first token
            // (`n % 256 == 0`); the MLX path here does at that token. The graph decoder's run
            // does it now, once the first token is out: the prompt's freed activations (up to
            // ~1.8 GB at 8B, prompt 512) go back to the device rather than sit in MLX's cache
            // beside the decoder for the whole run (the decoder's steps use none of it).
            memory::clear_cache()?;
            graph_memory_line("MLX's cache cleared", self.graph_bytes, &self.device_peak);
        }
        match self.graph_next(first)? {
            Some((token, logprob)) => {
                // The pending token stays the run's first (the decoder holds the rest).
                self.y = Some((y, logprobs, lse));
                self.n += 1;
                Ok(Some(Step {
                    token,
                    logprobs: Array::from_slice::<f32>(&[], &[0])?,
                    from_draft: false,
                    logprob: Some(logprob),
                }))
            }
            // Fell back: `self.y` holds the MLX forward's next token.
            None => self.advance(),
        }
    }
}

/// Starts the graph decoder's run once: the prompt's cache copied in (unless the prompt went
/// through the decoder), greedy decoding from `first` for at most `left` tokens.
fn graph_begin(
    g: &mut GraphRun<'_>,
    caches: &[Box<dyn Cache>],
    first: u32,
    left: usize,
) -> mlx_core::Result<()> {
    if g.started {
        return Ok(());
    }
    if !g.fed {
        let kv = graph_prefix(caches)?;
        g.dec()?.set_prefix(&kv)?;
    }
    g.dec()?.start(first, left)?;
    g.started = true;
    g.since_mlx.push(first as i32);
    Ok(())
}

/// The prompt's keys and values from plain MLX caches, for the graph decoder. A sliding
/// layer's rotating cache qualifies while it holds every position in order (it has not
/// wrapped: the prompt fits its window); the decoder keeps every position and masks the
/// window itself.
pub(crate) fn graph_prefix(caches: &[Box<dyn Cache>]) -> mlx_core::Result<Vec<(Array, Array)>> {
    caches
        .iter()
        .map(|c| {
            let bad = |message: String| mlx_core::Error::InvalidArgument {
                op: "graph_prefix",
                message,
            };
            match c.fetch().map_err(|e| bad(e.to_string()))? {
                Some(mlx_cache::Kv::Dense { keys, .. })
                    if keys.dim(2).ok() != Some(c.offset() as i32) =>
                {
                    Err(bad(format!(
                        "a {} holds {} of its {} positions (a sliding window the prompt \
                         outgrew); the graph decoder needs them all",
                        c.class_name(),
                        keys.dim(2).unwrap_or(0),
                        c.offset()
                    )))
                }
                Some(mlx_cache::Kv::Dense { keys, values }) => Ok((keys, values)),
                _ => Err(bad(format!(
                    "the graph decoder needs plain KV caches, got {}",
                    c.class_name()
                ))),
            }
        })
        .collect()
}

const GRAPH_NOT_FINITE: &str = "the graph decoder gave non-finite values";

/// The error a non-finite value from the graph decoder is treated as (a device fault: the
/// MLX forward's values were finite for the same prompt).
/// Runs `ids` through the MLX forward into `caches`, in chunks of at most `chunk` tokens (a
/// prompt's `prefill_step_size`: a long conversation's history never goes in as one
/// forward), and evaluates their states after each: the MLX caches catch up on the tokens the
/// graph decoder took.
pub(crate) fn forward_into_caches(
    model: &dyn LanguageModel,
    caches: &mut [Box<dyn Cache>],
    ids: &[i32],
    chunk: usize,
) -> Result<()> {
    for part in ids.chunks(chunk.max(1)) {
        let x = Array::from_slice(part, &[1, part.len() as i32])?;
        model.forward(&x, Some(caches))?;
        let states: Vec<Array> = caches
            .iter()
            .flat_map(|c| c.state().into_arrays())
            .collect();
        mlx_core::eval(states.iter())?;
    }
    Ok(())
}

fn graph_not_finite(what: String) -> mlx_core::Error {
    mlx_core::Error::InvalidArgument {
        op: "graph_decoder",
        message: format!("{GRAPH_NOT_FINITE}: {what}"),
    }
}

/// Positions the graph decoder's cache holds past the prompt when no `max_tokens` is given.
pub const GRAPH_DEFAULT_ROOM: usize = 4096;

/// The checks both starters (plain and speculative) make of a request once its own are
/// done: the prompt's ids and the sampler against the vocabulary, the logits processors, the
/// KV-cache quantization; the vocabulary size is returned.
pub(crate) fn check_request(
    model: &dyn LanguageModel,
    prompt: &[i32],
    opts: &GenerateOptions,
) -> Result<i32> {
    let vocab = model.vocab_size();
    check_token_ids("prompt", prompt, vocab)?;
    opts.sampler.settings().validate(vocab)?;
    check_logits_processors(&opts.logits_processors, vocab)?;
    if let Some(bits) = opts.kv_bits {
        opts.kv_mode.check(opts.kv_group_size, bits)?;
    }
    Ok(vocab)
}

/// The `Iterator` of a step type with `advance(&mut self) -> Result<Option<Step>>` and a
/// `done` flag: each step runs on the generation stream, and an error ends the iteration.
macro_rules! step_iterator {
    ($t:ident) => {
        impl Iterator for $t<'_> {
            type Item = Result<Step>;

            fn next(&mut self) -> Option<Result<Step>> {
                let r = on_generation_stream(|| self.advance());
                next_item(r, &mut self.done)
            }
        }
    };
}
pub(crate) use step_iterator;

/// One step as an iterator item: a step, the end, or an error that ends the iteration.
pub(crate) fn next_item(r: Result<Option<Step>>, done: &mut bool) -> Option<Result<Step>> {
    match r {
        Ok(step) => step.map(Ok),
        Err(e) => {
            *done = true;
            Some(Err(e))
        }
    }
}

impl Drop for GenerateStep<'_> {
    fn drop(&mut self) {
        self.settle();
    }
}

step_iterator!(GenerateStep);

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU decoder's host-side greedy step gives what the MLX sampler gives on the same
    /// logits: the token, and the log-sum-exp, the log-probabilities and the token's bit for
    /// bit (the host log-sum-exp is MLX's CPU `logsumexp` replayed, at 1,000 and 262,144
    /// logits, 13 for the tail past the last 8, a spread past MLX's -88 cut-off and a masked
    /// logit); a logit that is NaN or a largest that is not finite steps aside (the MLX path
    /// reports it).
    #[test]
    fn greedy_lse_matches_logsumexp() {
        for (n, scale) in [
            (1000usize, 8.0f32),
            (262_144, 12.0),
            (13, 3.0),
            (4099, 70.0),
        ] {
            let mut logits: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1009) as f32 / 50.0 + (i % 13) as f32).sin() * scale)
                .collect();
            // A masked logit (below MLX's -88 cut-off once the largest is taken off).
            logits[n / 2] = f32::NEG_INFINITY;
            let ((tok, lp, lse), htok, tlp) =
                host_greedy(&logits, true).unwrap().expect("finite logits");
            let x = Array::from_slice(&logits, &[1, logits.len() as i32]).unwrap();
            let mlx_lse = ops::logsumexp(&x, &[0, 1], true, None).unwrap();
            let mlx_lp = ops::subtract(&x, &mlx_lse, None).unwrap();
            let mlx_tok = Sampler::greedy().sample(&mlx_lp).unwrap();
            assert_eq!(tok.shape(), mlx_tok.shape());
            let t = tok.astype(Dtype::Uint32).unwrap().item::<u32>().unwrap();
            assert_eq!(
                t,
                mlx_tok
                    .astype(Dtype::Uint32)
                    .unwrap()
                    .item::<u32>()
                    .unwrap()
            );
            assert_eq!(lse.shape(), mlx_lse.shape());
            let (a, b) = (lse.item::<f32>().unwrap(), mlx_lse.item::<f32>().unwrap());
            assert_eq!(a.to_bits(), b.to_bits(), "n {n}: lse {a} vs {b}");
            let (a, b) = (
                lp.to_vec::<f32>().unwrap(),
                ops::squeeze(&mlx_lp, &[0], None)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap(),
            );
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.to_bits(), y.to_bits(), "n {n}: logprob {x} vs {y}");
            }
            assert_eq!(htok, t);
            assert_eq!(tlp.to_bits(), a[t as usize].to_bits());
        }
        let mut bad: Vec<f32> = (0..100).map(|i| i as f32 * 0.01).collect();
        bad[3] = f32::NAN;
        assert!(host_greedy(&bad, true).unwrap().is_none());
        bad[3] = f32::INFINITY;
        assert!(host_greedy(&bad, true).unwrap().is_none());
        bad[3] = f32::NEG_INFINITY;
        assert!(host_greedy(&bad, true).unwrap().is_some());
        assert!(host_greedy(&[], true).unwrap().is_none());
    }

    fn default_index() -> i32 {
        Stream::default_for(Device::default_device().unwrap())
            .unwrap()
            .index()
    }

    #[test]
    fn generation_runs_on_its_own_stream_and_restores_the_default() {
        let before = default_index();
        let first = on_generation_stream(|| Ok(default_index())).unwrap();
        assert_ne!(
            first, before,
            "generation should not run on the default stream"
        );
        assert_eq!(default_index(), before);
        // One stream per thread, reused.
        let again = on_generation_stream(|| Ok(default_index())).unwrap();
        assert_eq!(again, first);
        // Restored when the work fails too.
        let err = on_generation_stream(|| -> Result<()> { Err(EngineError::Conflict("x".into())) });
        assert!(err.is_err());
        assert_eq!(default_index(), before);
        // Work done there is usable from the default stream.
        let a =
            on_generation_stream(|| Ok(Array::from_slice(&[1.0f32, 2.0], &[2])?.sum_all(false)?))
                .unwrap();
        assert_eq!(a.item::<f32>().unwrap(), 3.0);
    }
}

#[cfg(test)]
mod device_peak_tests {
    use super::DevicePeak;

    /// `MLX_GRAPH_PROMPT_SYNC`: only `0` turns the wait off.
    #[test]
    fn prompt_sync_reads_only_zero_as_off() {
        assert!(super::prompt_sync_from(None));
        assert!(super::prompt_sync_from(Some("1")));
        assert!(super::prompt_sync_from(Some("")));
        assert!(super::prompt_sync_from(Some("yes")));
        assert!(!super::prompt_sync_from(Some("0")));
        assert!(!super::prompt_sync_from(Some(" 0 ")));
    }

    /// Session 31's 8B figures (H200, prompt 512): MLX's peak 6.346 GB in the prompt, 4.62 GB
    /// live after it, a decoder of 0.094 GB.
    const PROMPT_PEAK: usize = 6_346_000_000;
    const LIVE: usize = 4_620_000_000;
    const DEC: usize = 94_000_000;

    fn run(kept: usize) -> usize {
        let mut p = DevicePeak {
            extra: kept,
            floor: 4_520_000_000,
            closed: 4_600_000_000,
        };
        // The prompt's window closes with its peak; the build's window: the larger decoder.
        p.close(PROMPT_PEAK, LIVE, kept);
        p.extra = kept.max(DEC);
        p.close(LIVE + 1_000_000, LIVE, DEC);
        // Decoding: MLX's live bytes do not grow.
        p.with_window(LIVE + 2_000_000)
    }

    #[test]
    fn a_decoder_built_after_the_prompt_is_not_added_to_the_prompts_peak() {
        assert_eq!(run(0), PROMPT_PEAK);
    }

    #[test]
    fn a_kept_decoder_is_held_through_the_prompt() {
        assert_eq!(run(DEC), PROMPT_PEAK + DEC);
    }

    /// A kept decoder parked through the prompt (its cache's memory given back): only what
    /// it keeps while parked (session 35's 8B: 1.8 MB of 94 MB) rides beside the prompt's peak.
    #[test]
    fn a_parked_decoder_adds_only_its_small_state_to_the_prompts_peak() {
        // Taken, its cache's memory is mapped again through the build's window (`run`'s).
        const PARKED: usize = 1_815_000;
        assert_eq!(run(PARKED), PROMPT_PEAK + PARKED);
    }

    /// Graph speculation (`GraphSpecSteps::new`): both prompts run on MLX's path with no
    /// decoder, then the pair is built (its window closed by `built`) and decodes. Its peak is
    /// the prompts' MLX peak or the pair beside MLX's bytes while it was held, never the two
    /// added (it was MLX's process peak plus the pair's bytes, noted into the process's device
    /// peak, so every later response of the process reported that sum).
    #[test]
    fn a_speculative_pair_built_after_the_prompts_is_not_added_to_their_peak() {
        const PAIR: usize = 2 * DEC;
        let run = |prompt_peak: usize| {
            let mut p = DevicePeak {
                extra: 0,
                floor: 4_520_000_000,
                closed: 4_600_000_000,
            };
            p.close(prompt_peak, LIVE, 0);
            p.built_with(LIVE + 1_000_000, LIVE, PAIR);
            p.with_window(LIVE + 2_000_000)
        };
        assert_eq!(run(PROMPT_PEAK), PROMPT_PEAK);
        assert_eq!(run(LIVE), LIVE + 2_000_000 + PAIR);
    }

    #[test]
    fn a_decode_window_above_the_prompt_counts_the_decoder() {
        let mut p = DevicePeak::default();
        p.close(100, 90, 50);
        assert_eq!(p.with_window(95), 145);
        // MLX's counter restarts from 0: the window's floor is what was live.
        assert_eq!(p.with_window(0), 140);
        p.close(95, 80, 0);
        assert_eq!(p.with_window(85), 145);
    }
}

#[cfg(test)]
mod prompt_dense_tests {
    #[test]
    fn the_default_applies_from_its_size_and_a_setting_at_any_size() {
        use super::{dense_prompt_applies, PREFILL_DENSE_MIN_BYTES};
        let big = PREFILL_DENSE_MIN_BYTES;
        assert!(dense_prompt_applies(false, false, big));
        assert!(!dense_prompt_applies(false, false, big - 1));
        assert!(dense_prompt_applies(true, false, 1));
        assert!(dense_prompt_applies(false, true, 1));
        // Nothing to densify: never (no headroom either).
        assert!(!dense_prompt_applies(true, true, 0));
    }

    #[test]
    fn the_headroom_is_restored_after_a_panic_and_reapplied_per_chunk() {
        use super::{reapply_memory_headroom, with_memory_headroom};
        use mlx_core::memory;
        let before = memory::memory_limit().unwrap();
        let r = std::panic::catch_unwind(|| {
            let _ = with_memory_headroom(Some(1 << 30), || -> crate::error::Result<()> {
                panic!("a callback panics");
            });
        });
        assert!(r.is_err());
        assert_eq!(memory::memory_limit().unwrap(), before);
        with_memory_headroom(Some(1 << 30), || {
            reapply_memory_headroom()?;
            assert!(memory::memory_limit().unwrap() <= before);
            Ok(())
        })
        .unwrap();
        assert_eq!(memory::memory_limit().unwrap(), before);
        // Outside: nothing.
        reapply_memory_headroom().unwrap();
        assert_eq!(memory::memory_limit().unwrap(), before);
    }

    #[test]
    fn the_default_headroom_is_half_the_densifiable_bytes_within_its_bounds() {
        use super::{default_prefill_headroom, PREFILL_HEADROOM_MAX};
        assert_eq!(default_prefill_headroom(0), 256 << 20);
        assert_eq!(default_prefill_headroom(2 << 30), 1 << 30);
        // The Llama-3.1-8B-shaped 4-bit model's attention and MLP linears (codes, scales and
        // biases: 32 layers of 218.1 M weights at 4.5 bits): the measured 1,536 MiB.
        assert_eq!(
            default_prefill_headroom(3_925_868_544),
            PREFILL_HEADROOM_MAX
        );
        assert_eq!(default_prefill_headroom(usize::MAX), PREFILL_HEADROOM_MAX);
    }

    use super::{prompt_dense_setting, DensePrompt, PREFILL_DENSE_ROWS};

    const MIB: usize = 1 << 20;

    #[test]
    fn the_environment_turns_the_dense_prompt_linears_on_and_off() {
        let given = DensePrompt::new(100, 4 * MIB).unwrap();
        let on = DensePrompt::new(PREFILL_DENSE_ROWS, DensePrompt::DEFAULT_BLOCK_BYTES).unwrap();
        let s = |g, d, r, b| prompt_dense_setting(g, d, r, b).unwrap();
        // Unset: the option stands.
        assert_eq!(s(None, None, None, None), None);
        assert_eq!(s(Some(given), None, None, None), Some(given));
        assert_eq!(s(Some(given), Some(""), None, None), Some(given));
        // Off and on.
        for v in ["0", "off", " OFF "] {
            assert_eq!(s(Some(given), Some(v), Some("8"), None), None, "{v}");
        }
        for v in ["1", "on", "On"] {
            assert_eq!(s(None, Some(v), None, None), Some(on), "{v}");
            assert_eq!(s(Some(given), Some(v), None, None), Some(given), "{v}");
        }
        // Rows and block size over whichever setting is on.
        let want = DensePrompt::new(8, 2 * MIB).unwrap();
        assert_eq!(s(None, Some("1"), Some("8"), Some("2")), Some(want));
        assert_eq!(
            s(Some(given), None, Some("8"), None),
            Some(DensePrompt::new(8, 4 * MIB).unwrap())
        );
        assert_eq!(
            s(None, None, Some("8"), Some("2")),
            None,
            "rows alone turn nothing on"
        );
    }

    /// The headroom's limit holds inside the body only (also when it fails), never above the
    /// limit in force.
    #[test]
    fn the_memory_headroom_is_undone_after_the_prompt() {
        use super::{memory, with_memory_headroom, EngineError};
        let before = memory::memory_limit().unwrap();
        let inside = with_memory_headroom(Some(MIB), || Ok(memory::memory_limit()?)).unwrap();
        assert!(inside <= before && inside >= MIB, "{inside} of {before}");
        assert_eq!(memory::memory_limit().unwrap(), before);
        let failed = with_memory_headroom(Some(MIB), || -> super::Result<()> {
            Err(EngineError::ZeroMaxTokens)
        });
        assert!(failed.is_err());
        assert_eq!(memory::memory_limit().unwrap(), before);
        let huge = with_memory_headroom(Some(usize::MAX), || Ok(memory::memory_limit()?));
        assert_eq!(huge.unwrap(), before, "never raised");
        let none = with_memory_headroom(None, || Ok(memory::memory_limit()?));
        assert_eq!(none.unwrap(), before);
    }

    #[test]
    fn a_bad_value_is_an_error_naming_the_variable() {
        for (d, r, b, var) in [
            (Some("yes"), None, None, "MLX_PREFILL_DENSE"),
            (Some("1"), Some("0"), None, "MLX_PREFILL_DENSE_ROWS"),
            (Some("1"), Some("-3"), None, "MLX_PREFILL_DENSE_ROWS"),
            (Some("1"), Some("lots"), None, "MLX_PREFILL_DENSE_ROWS"),
            (Some("1"), None, Some("0"), "MLX_PREFILL_DENSE_BLOCK_MB"),
            (None, Some("x"), None, "MLX_PREFILL_DENSE_ROWS"),
        ] {
            let e = prompt_dense_setting(None, d, r, b).unwrap_err().to_string();
            assert!(
                e.starts_with(var) && e.contains("is not"),
                "{d:?} {r:?} {b:?}: {e}"
            );
        }
        for v in ["0", "x", "-1"] {
            let e = super::headroom_setting(Some(v)).unwrap_err().to_string();
            assert!(e.starts_with("MLX_PREFILL_DENSE_HEADROOM_MB"), "{e}");
        }
        assert_eq!(super::headroom_setting(None).unwrap(), None);
        assert_eq!(super::headroom_setting(Some("3")).unwrap(), Some(3 * MIB));
        let huge = (usize::MAX / 2).to_string();
        let e = prompt_dense_setting(None, Some("1"), None, Some(&huge))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("MLX_PREFILL_DENSE_BLOCK_MB"), "{e}");
    }
}
