//! This project's side of `cargo xtask bench`: greedy generation speed of
//! [`mlx_engine::generate::generate_step`], measured exactly as `xtask/oracle/bench_mlx_lm.py`
//! measures mlx-lm 0.32.2.
//!
//! ```text
//! cargo run --release -p mlx-models --example bench_generate -- --model PATH|smollm2
//!     [--dtype float32|float16|bfloat16|keep] [--prompt-len 512] [--gen-len 32] [--seed 0]
//!     [--warmup 1] [--warmup-prompt-len N] [--warmup-gen-len N] [--trials 1]
//!     [--prefill-step-size 2048] [--device cpu|gpu] [--compiled auto|percall|off]
//!     [--step-timing N]
//! bench_generate --model smollm2 --resolve    # prints the fetched GGUF's path and exits
//! ```
//!
//! PATH is an HF-style directory or a llama `.gguf` file; `smollm2` fetches (or finds cached)
//! SmolLM2-135M-Instruct Q4_1 with [`mlx_engine::fetch::smollm2_gguf`]. `--dtype` casts every
//! floating tensor ([`LoadOptions::dtype`]); `keep` leaves the stored dtypes.
//!
//! The prompt is `--prompt-len` ids drawn with splitmix64 from `--seed`, modulo the vocabulary
//! size (the Python driver draws the same ids). Timing follows mlx-lm's `stream_generate`:
//! `prompt_tps` = prompt tokens / time from the call to the first token; `generation_tps` =
//! tokens generated / time from the first token to the last. Exactly `--gen-len` tokens are
//! generated (no EOS). After each trial the stream is synchronized, untimed (the pipelined step
//! started before the last token is drained). Warmup runs (default one, with the warmup
//! lengths, which default to the measured ones) come first and are not reported.
//!
//! Besides wall time, each phase's process CPU time (user + system, all threads, from
//! `/proc/self/stat` in clock ticks of 10 ms; `null` where there is none) is reported: on a
//! loaded machine it is much steadier than wall time.
//!
//! `--graph` adds `graph`: the primitive counts (MLX's `export_to_dot` labels) of the first
//! prefill chunk's and of the third decode step's graphs, from an extra untimed generation.
//!
//! `--compiled off` decodes uncompiled (default `auto`: the compiled step where the model has
//! one, made once per process and kept across trials with
//! [`mlx_engine::generate::generate_step_with_decoder`], so its segments are traced during the
//! warmup, as a server or chat session keeps it; `percall`: a new compiled step per trial, as
//! `generate_step` with [`CompiledDecode::Auto`] makes it, whose tracing then lands in each
//! trial's time to first token; `MLX_COMPILED_DECODE=off` is `off`; `generate_step` itself
//! defaults to off). `--step-timing N`
//! adds `step_timing`: after the prompt, `N` decode steps each timed in three phases, for the
//! compiled step and the uncompiled forward alike: building the step's graph (`build_ms`),
//! `async_eval` (`schedule_ms`) and waiting for the result (`sync_ms`); medians.
//!
//! `--decoder graph` decodes with [`mlx_kernels::graph_decode::GraphDecoder`] (CUDA only;
//! the model must be one `mlx_engine::graph` maps, built from the loaded model): the prompt goes through the model's MLX forward in
//! chunks of `--prefill-step-size` as mlx-lm's prefill does, the first token is its greedy
//! token, the prompt's KV cache is copied into the decoder (inside the generation time), and
//! the other tokens come from replaying the decoder's CUDA graph. `--graph-check N` instead
//! prints, for `N` teacher-forced steps after the prompt, how the decoder's logits compare
//! with the MLX forward's (`graph_check`: largest difference relative to the largest logit,
//! greedy agreement), and exits. `--graph-breakdown N` (with `--decoder graph`) adds
//! `breakdown`: after the trials, each part of the decoder's step (the q/k/v projections, the
//! attention, ...) replayed alone `N` times, microseconds a step and the GB/s of its weights.
//! `--graph-trace PATH` (with `--decoder graph`) writes, after the trials, the timeline of one
//! decode step (the fifth after a fresh prompt, [`GraphDecoder::trace_step`]; the timed trials
//! record nothing): a line a block of every q/k/v, attention and matrix-vector kernel,
//! `what block_x block_y sm entry waited prologue end first_data` (the
//! [`mlx_kernels::graph_decode::TraceRecord`] fields, times in ns of the GPU's global timer).
//!
//! Prints one JSON line on stdout.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mlx_core::graph;
use mlx_core::memory;
use mlx_core::prelude::*;
use mlx_engine::compiled::CompiledDecoder;
use mlx_engine::generate::{
    generate_step, generate_step_with_decoder, CompiledDecode, EvalProbe, GenerateOptions,
};
use mlx_engine::sample::Sampler;
use mlx_kernels::graph_decode::{compare_logits, GraphDecoder, GraphOptions};
use mlx_models::gguf::load_gguf_model;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;
use serde_json::{json, Value};

const USAGE: &str =
    "usage: bench_generate --model PATH|smollm2 [--dtype float32|float16|bfloat16|keep]
    [--prompt-len 512] [--gen-len 32] [--seed 0] [--warmup 1] [--warmup-prompt-len N]
    [--warmup-gen-len N] [--trials 1] [--prefill-step-size 2048] [--device cpu|gpu] [--digests]
    [--compiled auto|percall|off] [--step-timing N] [--graph] [--decoder mlx|graph|cpu]
    [--threads N] (the CPU decoder's threads; 0: all cores)
    [--graph-check N] [--graph-breakdown N]
  bench_generate --model smollm2 --resolve   (prints the fetched GGUF's path)
Prints one JSON line: prompt_tps, generation_tps (mlx-lm stream_generate's definitions),
times, CPU times, peak memory per trial, and the last trial's greedy tokens. --digests adds
`logprob_digests`: per step, the first 16 hex digits of the sha256 of the whole log-probability
vector as little-endian float32 (bench_mlx_lm.py writes the same), to find where two runs part;
it costs time, so do not time such a run.";

type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    model: String,
    dtype: String,
    prompt_len: usize,
    gen_len: usize,
    seed: u64,
    warmup: usize,
    warmup_prompt_len: Option<usize>,
    warmup_gen_len: Option<usize>,
    trials: usize,
    prefill_step_size: usize,
    device: Option<String>,
    resolve: bool,
    digests: bool,
    graph: bool,
    compiled: Compiled,
    step_timing: usize,
    graph_decoder: bool,
    /// `--decoder cpu`: the CPU decoder (`GenerateOptions::cpu_decode`) on `--threads`.
    cpu_decoder: bool,
    threads: usize,
    graph_check: usize,
    graph_breakdown: u32,
    graph_trace: Option<PathBuf>,
}

/// `--compiled`: which decode step the trials use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compiled {
    Off,
    /// One compiled step for the process, reused by every trial.
    Auto,
    /// A new compiled step per trial (`generate_step` with `CompiledDecode::Auto`).
    PerCall,
}

fn parse_args() -> BoxResult<Args> {
    let mut a = Args {
        model: String::new(),
        dtype: "float32".into(),
        prompt_len: 512,
        gen_len: 32,
        seed: 0,
        warmup: 1,
        warmup_prompt_len: None,
        warmup_gen_len: None,
        trials: 1,
        prefill_step_size: 2048,
        device: None,
        resolve: false,
        digests: false,
        graph: false,
        compiled: match std::env::var("MLX_COMPILED_DECODE").as_deref() {
            Ok("off") | Ok("0") => Compiled::Off,
            _ => Compiled::Auto,
        },
        step_timing: 0,
        graph_decoder: false,
        cpu_decoder: false,
        threads: 0,
        graph_check: 0,
        graph_breakdown: 0,
        graph_trace: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--resolve" {
            a.resolve = true;
            continue;
        }
        if flag == "--digests" {
            a.digests = true;
            continue;
        }
        if flag == "--graph" {
            a.graph = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| -> BoxResult<usize> {
            v.parse().map_err(|e| format!("{flag} {v}: {e}").into())
        };
        match flag.as_str() {
            "--model" => a.model = value,
            "--dtype" => a.dtype = value,
            "--prompt-len" => a.prompt_len = num(&value)?,
            "--gen-len" => a.gen_len = num(&value)?,
            "--seed" => a.seed = num(&value)? as u64,
            "--warmup" => a.warmup = num(&value)?,
            "--warmup-prompt-len" => a.warmup_prompt_len = Some(num(&value)?),
            "--warmup-gen-len" => a.warmup_gen_len = Some(num(&value)?),
            "--trials" => a.trials = num(&value)?,
            "--prefill-step-size" => a.prefill_step_size = num(&value)?,
            "--device" => a.device = Some(value),
            "--compiled" => {
                a.compiled = match value.as_str() {
                    "auto" | "on" => Compiled::Auto,
                    "percall" => Compiled::PerCall,
                    "off" => Compiled::Off,
                    v => return Err(format!("--compiled {v}: auto|percall|off").into()),
                }
            }
            "--step-timing" => a.step_timing = num(&value)?,
            "--decoder" => {
                (a.graph_decoder, a.cpu_decoder) = match value.as_str() {
                    "mlx" => (false, false),
                    "graph" => (true, false),
                    "cpu" => (false, true),
                    v => return Err(format!("--decoder {v}: mlx|graph|cpu").into()),
                }
            }
            "--threads" => a.threads = num(&value)?,
            "--graph-check" => a.graph_check = num(&value)?,
            "--graph-trace" => a.graph_trace = Some(PathBuf::from(value)),
            "--graph-breakdown" => {
                a.graph_breakdown = u32::try_from(num(&value)?)
                    .map_err(|_| format!("--graph-breakdown {value}: too large"))?
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if a.model.is_empty() {
        return Err("--model PATH|smollm2 is required".into());
    }
    if a.graph_decoder && (a.digests || a.graph || a.step_timing > 0) {
        return Err(
            "--decoder graph measures the graph decoder only: it takes no --digests, --graph \
             or --step-timing (they measure MLX's decode)"
                .into(),
        );
    }
    if (a.graph_breakdown > 0 || a.graph_trace.is_some()) && !a.graph_decoder {
        return Err("--graph-breakdown and --graph-trace need --decoder graph".into());
    }
    if a.prompt_len == 0 || a.gen_len == 0 {
        return Err("--prompt-len and --gen-len must be positive".into());
    }
    Ok(a)
}

/// splitmix64 from `seed`, each output modulo `vocab` (as `bench_mlx_lm.py`).
fn prompt_ids(n: usize, seed: u64, vocab: u64) -> Vec<i32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z % vocab) as i32
        })
        .collect()
}

fn resolve_model(model: &str) -> BoxResult<PathBuf> {
    if model == "smollm2" {
        Ok(mlx_engine::fetch::smollm2_gguf()?)
    } else {
        Ok(PathBuf::from(model))
    }
}

fn load(path: &Path, dtype: &str) -> BoxResult<Box<dyn LanguageModel>> {
    let dtype = match dtype {
        "keep" => None,
        "float32" => Some(Dtype::Float32),
        "float16" => Some(Dtype::Float16),
        "bfloat16" => Some(Dtype::Bfloat16),
        other => return Err(format!("--dtype {other}: float32|float16|bfloat16|keep").into()),
    };
    let opts = LoadOptions { dtype };
    let model = if path.extension().is_some_and(|e| e == "gguf") {
        load_gguf_model(path, &opts)?.0
    } else {
        load_model_dir(path, &opts)?.0
    };
    Ok(model)
}

/// This process's CPU time (user + system, all threads) in seconds, from `/proc/self/stat`
/// (clock ticks, taken as the universal Linux value of 100 per second); `None` elsewhere.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn diff(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? - b?)
}

/// The first 16 hex digits of the sha256 of `logprobs` as little-endian float32.
fn digest(logprobs: &mlx_core::Array) -> BoxResult<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for x in logprobs.astype(Dtype::Float32)?.to_vec::<f32>()? {
        h.update(x.to_le_bytes());
    }
    Ok(format!("{:x}", h.finalize())[..16].to_string())
}

/// Ends a trial and gives its figures, as mlx-lm's `stream_generate` defines them: the
/// generation time runs from `gen_start` (the first token) to now, before the stream is
/// drained; `extra_bytes` (device memory MLX does not see) is added to MLX's peak.
fn finish_trial(
    prompt_len: usize,
    n_tokens: usize,
    prompt_time: f64,
    gen_start: Instant,
    [cpu0, cpu1]: [Option<f64>; 2],
    extra_bytes: usize,
) -> BoxResult<Value> {
    let gen_time = gen_start.elapsed().as_secs_f64();
    let cpu2 = cpu_seconds();
    mlx_core::synchronize()?;
    Ok(json!({
        "prompt_tps": prompt_len as f64 / prompt_time,
        "generation_tps": n_tokens as f64 / gen_time,
        "prompt_time_s": prompt_time,
        "generation_time_s": gen_time,
        "prompt_cpu_s": diff(cpu1, cpu0),
        "generation_cpu_s": diff(cpu2, cpu1),
        "peak_memory_gb": (memory::peak_memory()? + extra_bytes) as f64 / 1e9,
    }))
}

/// One generation, timed as mlx-lm's `stream_generate` times it; with `digests`, also each
/// step's log-probability digest.
fn trial(
    model: &dyn LanguageModel,
    prompt: &[i32],
    gen_len: usize,
    a: &Args,
    decoder: Option<&CompiledDecoder>,
    mut digests: Option<&mut Vec<String>>,
    eval_probe: Option<EvalProbe>,
) -> BoxResult<(Value, Vec<u32>)> {
    let opts = GenerateOptions {
        max_tokens: Some(gen_len),
        sampler: Sampler::greedy(),
        prefill_step_size: a.prefill_step_size,
        compiled_decode: match a.compiled {
            Compiled::Off => CompiledDecode::Off,
            Compiled::Auto | Compiled::PerCall => CompiledDecode::Auto,
        },
        eval_probe,
        cpu_decode: a
            .cpu_decoder
            .then_some(mlx_engine::generate::CpuDecode { threads: a.threads }),
        ..GenerateOptions::default()
    };
    let mut tokens = Vec::with_capacity(gen_len);
    memory::reset_peak_memory()?;
    let cpu0 = cpu_seconds();
    let mut cpu1 = None;
    let mut tic = Instant::now();
    let mut prompt_time = 0.0;
    let steps = match decoder {
        Some(d) => generate_step_with_decoder(prompt, model, None, opts, d)?,
        None => generate_step(prompt, model, None, opts)?,
    };
    for (n, step) in steps.enumerate() {
        let step = step?;
        if n == 0 {
            prompt_time = tic.elapsed().as_secs_f64();
            cpu1 = cpu_seconds();
            tic = Instant::now();
        }
        tokens.push(step.token);
        if let Some(d) = digests.as_deref_mut() {
            d.push(digest(&step.logprobs)?);
        }
        if n + 1 == gen_len {
            break;
        }
    }
    let r = finish_trial(
        prompt.len(),
        tokens.len(),
        prompt_time,
        tic,
        [cpu0, cpu1],
        0,
    )?;
    Ok((r, tokens))
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).map_or(0.0, |m| m * 1e3)
}

/// `n` synchronous decode steps after `prompt`, each split into graph building, scheduling
/// (`async_eval`) and waiting (medians in ms; see the module docs).
fn step_timing(
    model: &dyn LanguageModel,
    prompt: &[i32],
    n: usize,
    compiled: bool,
) -> BoxResult<Value> {
    let decoder = if compiled {
        match CompiledDecoder::new(model)? {
            Some(d) => Some(d),
            None => return Ok(Value::Null),
        }
    } else {
        None
    };
    let mut caches = model.make_cache();
    let x = mlx_core::Array::from_slice(prompt, &[1, prompt.len() as i32])?;
    let logits = model.forward(&x, Some(&mut caches))?;
    logits.eval()?;
    let mut token = ops::argmax(&logits, -1, false, None)?;
    let n1 = token.dim(1)?;
    token = ops::slice_axis(&token, 1, n1 - 1, n1, None)?;
    let (mut build, mut sched, mut sync) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n + 2 {
        let t0 = Instant::now();
        let logits = match &decoder {
            Some(d) => d.step(&token, &caches)?.commit(&mut caches)?,
            None => model.forward(&token, Some(&mut caches))?,
        };
        let next = ops::argmax(&logits, -1, false, None)?;
        let t1 = Instant::now();
        mlx_core::async_eval([&next])?;
        let t2 = Instant::now();
        next.eval()?;
        let t3 = Instant::now();
        build.push((t1 - t0).as_secs_f64());
        sched.push((t2 - t1).as_secs_f64());
        sync.push((t3 - t2).as_secs_f64());
        token = next;
    }
    // The first two steps trace (compiled) and warm up: left out.
    let skip = |v: Vec<f64>| median_ms(v.into_iter().skip(2).collect());
    Ok(json!({
        "steps": n,
        "build_ms": skip(build),
        "schedule_ms": skip(sched),
        "sync_ms": skip(sync),
    }))
}

/// One layer's cached keys and values.
type LayerKv = (mlx_core::Array, mlx_core::Array);

/// The prompt through the model's MLX forward as mlx-lm's `generate_step` prefills it (all
/// but the last token in chunks of `step`, each chunk's cache evaluated; then the last token
/// alone), keeping the caches; returns the greedy token after the prompt (the argmax of the
/// log-probabilities, as mlx-lm's sampler takes it) and the caches' keys and values.
fn prefill_mlx(
    model: &dyn LanguageModel,
    prompt: &[i32],
    step: usize,
) -> BoxResult<(u32, Vec<LayerKv>)> {
    let mut caches = model.make_cache();
    let mut rest = prompt;
    while rest.len() > 1 {
        let n = step.max(1).min(rest.len() - 1);
        let x = mlx_core::Array::from_slice(&rest[..n], &[1, n as i32])?;
        model.forward(&x, Some(&mut caches))?;
        let kv = cache_kv(&caches)?;
        mlx_core::eval(kv.iter().flat_map(|(k, v)| [k, v]))?;
        rest = &rest[n..];
    }
    let x = mlx_core::Array::from_slice(rest, &[1, rest.len() as i32])?;
    let logits = model.forward(&x, Some(&mut caches))?;
    let n = logits.dim(1)?;
    let last = ops::slice_axis(&logits, 1, n - 1, n, None)?;
    let lp = ops::subtract(&last, &last.logsumexp(&[-1], true)?, None)?;
    let tok = ops::argmax(&lp, -1, false, None)?;
    tok.eval()?;
    let first = tok.astype(Dtype::Uint32)?.to_vec::<u32>()?[0];
    Ok((first, cache_kv(&caches)?))
}

fn cache_kv(caches: &[Box<dyn mlx_cache::Cache>]) -> BoxResult<Vec<LayerKv>> {
    caches
        .iter()
        .map(|c| match c.fetch()? {
            Some(mlx_cache::Kv::Dense { keys, values }) => Ok((keys, values)),
            _ => Err(format!(
                "the graph decoder needs plain KV caches, got {}",
                c.class_name()
            )
            .into()),
        })
        .collect()
}

fn trial_graph(
    model: &dyn LanguageModel,
    dec: &mut GraphDecoder,
    prompt: &[i32],
    gen_len: usize,
    a: &Args,
) -> BoxResult<(Value, Vec<u32>)> {
    let mut tokens = Vec::with_capacity(gen_len);
    memory::reset_peak_memory()?;
    let cpu0 = cpu_seconds();
    let tic = Instant::now();
    let (first, kv) = prefill_mlx(model, prompt, a.prefill_step_size)?;
    let prompt_time = tic.elapsed().as_secs_f64();
    let cpu1 = cpu_seconds();
    let tic = Instant::now();
    tokens.push(first);
    dec.set_prefix(&kv)?;
    let prefix_s = tic.elapsed().as_secs_f64();
    dec.generate(first, gen_len - 1, |t| tokens.push(t))?;
    let bytes = dec.device_bytes();
    let mut r = finish_trial(
        prompt.len(),
        tokens.len(),
        prompt_time,
        tic,
        [cpu0, cpu1],
        bytes,
    )?;
    // Of the generation time: copying the prompt's cache into the decoder.
    r["graph_prefix_s"] = json!(prefix_s);
    Ok((r, tokens))
}

/// Writes the timeline of the fifth decode step after `prompt` to `path`; returns the records.
fn graph_trace(
    model: &dyn LanguageModel,
    dec: &mut GraphDecoder,
    prompt: &[i32],
    a: &Args,
    path: &Path,
) -> BoxResult<usize> {
    let (first, kv) = prefill_mlx(model, prompt, a.prefill_step_size)?;
    dec.set_prefix(&kv)?;
    let mut last = first;
    dec.generate(first, 4, |t| last = t)?;
    let records = dec.trace_step(last)?;
    let mut text = String::new();
    for r in &records {
        let [t0, t1, t2, t3] = r.times;
        text += &format!(
            "{} {} {} {} {t0} {t1} {t2} {t3} {}\n",
            r.what, r.block.0, r.block.1, r.sm, r.first_data
        );
    }
    std::fs::write(path, text).map_err(|e| format!("--graph-trace {}: {e}", path.display()))?;
    Ok(records.len())
}

/// Teacher-forced comparison of the graph decoder with the model's MLX forward: both get
/// the MLX forward's greedy token at every step.
fn graph_check(
    model: &dyn LanguageModel,
    dec: &mut GraphDecoder,
    prompt: &[i32],
    steps: usize,
) -> BoxResult<Value> {
    let mut caches = model.make_cache();
    let x = mlx_core::Array::from_slice(prompt, &[1, prompt.len() as i32])?;
    let logits = model.forward(&x, Some(&mut caches))?;
    let n = logits.dim(1)?;
    let last = ops::slice_axis(&logits, 1, n - 1, n, None)?;
    let mut token = ops::argmax(&last, -1, false, None)?
        .astype(Dtype::Uint32)?
        .to_vec::<u32>()?[0];
    let kv = cache_kv(&caches)?;
    dec.set_prefix(&kv)?;
    let (mut worst, mut agree, mut sum_rel) = (0f32, 0usize, 0f64);
    let mut per_step = Vec::new();
    for _ in 0..steps {
        let x = mlx_core::Array::from_slice(&[token as i32], &[1, 1])?;
        let reference = model
            .forward(&x, Some(&mut caches))?
            .astype(Dtype::Float32)?
            .to_vec::<f32>()?;
        let ours = dec.step_logits(token)?;
        let c = compare_logits(&reference, &ours);
        let (rel, ri, oi) = (c.rel_diff, c.reference_token, c.ours_token);
        worst = worst.max(rel);
        sum_rel += rel as f64;
        agree += usize::from(ri == oi);
        per_step.push(json!({"rel": rel, "mlx": ri, "ours": oi}));
        token = ri as u32;
    }
    let (bound_rel, bound_agree) = mlx_kernels::graph_decode::TEACHER_FORCED_BOUNDS;
    let agreement = agree as f64 / steps.max(1) as f64;
    Ok(json!({
        "steps": steps,
        "max_rel_diff": worst,
        "mean_rel_diff": sum_rel / steps.max(1) as f64,
        "greedy_agreement": agreement,
        "within_bounds": worst <= bound_rel && agreement >= bound_agree as f64,
        "bounds": [bound_rel, bound_agree],
        "per_step": per_step,
    }))
}

fn run(a: &Args) -> BoxResult<()> {
    let path = resolve_model(&a.model)?;
    if a.resolve {
        println!("{}", path.display());
        return Ok(());
    }
    match a.device.as_deref() {
        None => {}
        Some("cpu") => Device::cpu().set_default()?,
        Some("gpu") => Device::gpu().set_default()?,
        Some(other) => return Err(format!("--device {other}: cpu|gpu").into()),
    }
    let t = Instant::now();
    let model = load(&path, &a.dtype)?;
    let load_s = t.elapsed().as_secs_f64();
    let vocab = model.vocab_size() as u64;
    let prompt = prompt_ids(a.prompt_len, a.seed, vocab);
    let wp = a
        .warmup_prompt_len
        .unwrap_or(a.prompt_len)
        .min(a.prompt_len);
    let wg = a.warmup_gen_len.unwrap_or(a.gen_len).max(1);
    let mut graph_dec = None;
    if a.graph_decoder || a.graph_check > 0 {
        let t = Instant::now();
        // MLX_GRAPH_PDL=0: plain launches instead of programmatic dependent launch;
        // MLX_GRAPH_ROWS=4: four rows a warp in the matrix-vector products;
        // MLX_GRAPH_BATCH=N: N chunks a row in flight; MLX_GRAPH_EARLY=N: N of them loaded
        // before the wait; MLX_GRAPH_BLOCKS=N: at most N matrix-vector blocks a multiprocessor.
        let env_u32 = |name: &str| -> BoxResult<Option<u32>> {
            match std::env::var(name) {
                Ok(v) => Ok(Some(v.parse().map_err(|e| format!("{name} {v}: {e}"))?)),
                Err(_) => Ok(None),
            }
        };
        let opts = GraphOptions {
            programmatic_launch: std::env::var("MLX_GRAPH_PDL").map_or(true, |v| v != "0"),
            rows_per_warp: env_u32("MLX_GRAPH_ROWS")?
                .unwrap_or(GraphOptions::default().rows_per_warp),
            chunks_in_flight: env_u32("MLX_GRAPH_BATCH")?,
            chunks_before_wait: env_u32("MLX_GRAPH_EARLY")?,
            blocks_per_sm: env_u32("MLX_GRAPH_BLOCKS")?,
            ..GraphOptions::default()
        };
        let cap = a.prompt_len + a.gen_len.max(a.graph_check) + 1;
        // The loaded model's own description and arrays (no second load).
        let (spec, weights) = mlx_engine::graph::map_model(model.as_ref())?;
        let dec = GraphDecoder::with_options(spec, &weights, cap, &opts)?;
        eprintln!(
            "graph decoder: {} on {} (programmatic launch {}), {:.2} GB on the device, loaded in \
             {:.1} s",
            path.display(),
            dec.device_name()?,
            dec.programmatic_launch(),
            dec.device_bytes() as f64 / 1e9,
            t.elapsed().as_secs_f64()
        );
        graph_dec = Some(dec);
    }
    if let (true, Some(dec)) = (a.graph_check > 0, graph_dec.as_mut()) {
        let check = graph_check(model.as_ref(), dec, &prompt, a.graph_check)?;
        println!("{}", json!({ "graph_check": check }));
        return Ok(());
    }
    let decoder = match (a.compiled, a.graph_decoder) {
        (_, true) => None,
        (Compiled::Auto, false) => CompiledDecoder::new(model.as_ref())?,
        (Compiled::Off | Compiled::PerCall, false) => None,
    };
    for _ in 0..a.warmup {
        match graph_dec.as_mut() {
            Some(dec) => {
                trial_graph(model.as_ref(), dec, &prompt[..wp], wg, a)?;
            }
            None => {
                trial(
                    model.as_ref(),
                    &prompt[..wp],
                    wg,
                    a,
                    decoder.as_ref(),
                    None,
                    None,
                )?;
            }
        }
    }
    let mut trials = Vec::new();
    let mut tokens = Vec::new();
    let mut digests = Vec::new();
    for _ in 0..a.trials {
        digests.clear();
        let d = a.digests.then_some(&mut digests);
        let (r, t) = match graph_dec.as_mut() {
            Some(dec) => trial_graph(model.as_ref(), dec, &prompt, a.gen_len, a)?,
            None => trial(
                model.as_ref(),
                &prompt,
                a.gen_len,
                a,
                decoder.as_ref(),
                d,
                None,
            )?,
        };
        trials.push(r);
        tokens = t;
    }
    let device = Device::default_device()?;
    let mut out = json!({
        "impl": "mlx-rs",
        "version": env!("CARGO_PKG_VERSION"),
        "device": format!("{device:?}"),
        "model": std::fs::canonicalize(&path).unwrap_or(path).display().to_string(),
        "dtype": a.dtype,
        "prompt_len": a.prompt_len,
        "gen_len": a.gen_len,
        "seed": a.seed,
        "load_s": load_s,
        "trials": trials,
        "tokens": tokens,
    });
    out["compiled"] = json!(format!("{:?}", a.compiled));
    if let (true, Some(dec)) = (a.graph_decoder, graph_dec.as_mut()) {
        out["decoder"] = json!("graph");
        out["programmatic_launch"] = json!(dec.programmatic_launch());
        out["rows_per_warp"] = json!(dec.rows_per_warp());
        out["chunks_in_flight"] = json!(dec.chunks_in_flight());
        if let Some(path) = &a.graph_trace {
            let n = graph_trace(model.as_ref(), dec, &prompt, a, path)?;
            out["trace_records"] = json!(n);
        }
        if a.graph_breakdown > 0 {
            let parts = dec.kernel_breakdown(a.graph_breakdown)?;
            out["breakdown"] = json!(parts
                .iter()
                .map(|p| json!({
                    "part": p.part.name(),
                    "kernels": p.kernels,
                    "us": p.us_per_step,
                    "gb_s": p.bytes_per_step as f64 / p.us_per_step / 1e3,
                }))
                .collect::<Vec<_>>());
        }
    }
    if a.digests {
        out["logprob_digests"] = json!(digests);
    }
    if a.graph {
        // An untimed extra generation of 3 tokens: the graphs of the first prefill chunk and
        // of the third step (the first decode steps may trace the compiled step).
        type Seen = Vec<(&'static str, BTreeMap<String, usize>)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let sink = Arc::clone(&seen);
        let probe = EvalProbe(Arc::new(move |what, arrays| {
            if let Ok(dot) = graph::to_dot(arrays.iter().copied()) {
                if let Ok(mut v) = sink.lock() {
                    v.push((what, graph::primitive_counts(&dot)));
                }
            }
        }));
        trial(
            model.as_ref(),
            &prompt,
            3,
            a,
            decoder.as_ref(),
            None,
            Some(probe),
        )?;
        let seen = seen.lock().map_err(|_| "graph probe poisoned")?;
        let pick = |what: &str, nth: usize| {
            seen.iter()
                .filter(|(w, _)| *w == what)
                .nth(nth)
                .map(|(_, c)| json!({"nodes": c.values().sum::<usize>(), "by_kind": c}))
        };
        out["graph"] = json!({"prefill": pick("prefill", 0), "step": pick("step", 2)});
    }
    if a.step_timing > 0 {
        out["step_timing"] = json!({
            "uncompiled": step_timing(model.as_ref(), &prompt, a.step_timing, false)?,
            "compiled": step_timing(model.as_ref(), &prompt, a.step_timing, true)?,
        });
    }
    println!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|a| run(&a));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_generate: {e}");
            ExitCode::FAILURE
        }
    }
}
