//! `mlx benchmark` (as `mlx_lm.benchmark`): random prompt ids drawn as mlx-lm draws them
//! (`mx.random.seed(0)` before loading, then `randint(0, vocab_size, (batch, prompt_tokens))`),
//! a warm-up, then `--num-trials` timed generations of exactly `--generation-tokens` tokens
//! (EOS ignored) through `stream_generate`, each trial's prompt and generation tokens/s and
//! peak memory, and their averages, printed in mlx-lm's format.
//!
//! Peak memory is counted as mlx-lm's benchmark counts it: each trial reports the process's
//! peak since start (mlx-lm: `mx.get_peak_memory()`, never reset, so the load and the warm-up
//! are in every trial's figure and a trial never reports less than the one before), and the
//! average is over the trials. With the graph decoder the figure also holds the decoder's own
//! device buffers, beside MLX's peak of the time they were held
//! (`mlx_core::memory::device_peak_memory`); the decoder kept between the trials waits
//! parked, its KV cache's memory given back, through each next prompt
//! (`mlx_engine::graph::GraphKeep`).

use std::time::{Duration, Instant};

use clap::Args;
use mlx_core::prelude::*;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::stream::{stream_generate, StreamOptions};

use crate::common::{DecoderArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchmarkArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Length of prompt.
    #[arg(long, short = 'p', default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Length of completion.
    #[arg(long, short = 'g', default_value_t = 1024)]
    pub generation_tokens: usize,
    /// Batch size (only 1 for now).
    #[arg(long, short = 'b', default_value_t = 1)]
    pub batch_size: usize,
    /// Number of timing trials.
    #[arg(long, short = 'n', default_value_t = 5)]
    pub num_trials: usize,
    /// Step size for prefill processing.
    #[arg(long, default_value_t = 2048)]
    pub prefill_step_size: usize,
    /// Delay between each test in seconds.
    #[arg(long, default_value_t = 0)]
    pub delay: u64,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
    #[command(flatten)]
    pub decoder: DecoderArgs,
    /// Print each trial and the averages as JSON lines.
    #[arg(long)]
    pub json: bool,
}

impl BenchmarkArgs {
    pub fn check(&self) -> Result<(), String> {
        if self.batch_size != 1 {
            return Err(format!(
                "--batch-size {}: only batch size 1 is benchmarked for now (mlx_lm.benchmark's \
                 batch_generate path is not ported)",
                self.batch_size
            ));
        }
        if self.prompt_tokens == 0 || self.generation_tokens == 0 {
            return Err("--prompt-tokens and --generation-tokens must be at least 1".into());
        }
        if self.num_trials == 0 {
            return Err("--num-trials must be at least 1".into());
        }
        if self.prefill_step_size == 0 {
            return Err("--prefill-step-size must be at least 1".into());
        }
        crate::model::model_path(self.model.model.as_deref()).map(|_| ())
    }
}

struct Trial {
    prompt_tps: f64,
    generation_tps: f64,
    peak_memory: f64,
}

pub fn run(a: &BenchmarkArgs) -> Result<(), String> {
    let mut m = crate::model::load(&a.model)?;
    // mlx_lm.benchmark seeds 0 before loading; the prompts are drawn after the model's
    // construction advanced the key.
    m.seed(0).map_err(|e| e.to_string())?;
    // Empty to avoid early stopping.
    m.tokenizer.set_eos_token_ids([]);
    let vocab = m.model.vocab_size();
    let e = |e: mlx_core::Error| e.to_string();
    let ids = mlx_core::random::randint(
        0,
        vocab,
        &[a.batch_size as i32, a.prompt_tokens as i32],
        Dtype::Int32,
        None,
        None,
    )
    .map_err(e)?;
    let prompt: Vec<u32> = ids.to_vec::<i32>().map_err(e)?[..a.prompt_tokens]
        .iter()
        .map(|&t| t as u32)
        .collect();
    let generate = GenerateOptions {
        max_tokens: Some(a.generation_tokens),
        prefill_step_size: a.prefill_step_size,
        ..GenerateOptions::default()
    };
    let decoder = a
        .decoder
        .pick(m.model.as_ref(), &generate, &a.model.dtype, false, Ok(()))?;
    // One graph decoder for the warm-up and every trial (built in the warm-up), as MLX's
    // kernels are compiled in the warm-up.
    let keep = mlx_engine::graph::GraphKeep::new();
    let bench = |generate: &GenerateOptions| -> Result<Trial, String> {
        let mut generate = generate.clone();
        decoder.apply(&mut generate);
        generate.graph_keep = Some(keep.clone());
        let opts = StreamOptions {
            generate,
            ..StreamOptions::default()
        };
        let stream = stream_generate(m.model.as_ref(), &m.tokenizer, &prompt, None, opts)
            .map_err(|e| e.to_string())?;
        let mut last = None;
        for r in stream {
            last = Some(r.map_err(|e| e.to_string())?);
        }
        let r = last.ok_or("no response")?;
        Ok(Trial {
            prompt_tps: r.prompt_tps,
            generation_tps: r.generation_tps,
            peak_memory: r.peak_memory_bytes as f64 / 1e9,
        })
    };
    if a.json {
        crate::common::out(format_args!("{}", serde_json::json!({ "prompt": prompt })))?;
    } else {
        crate::common::out(format_args!("Running warmup.."))?;
    }
    bench(&generate)?;
    crate::common::out(format_args!(
        "Timing with prompt_tokens={}, generation_tokens={}, batch_size={}.",
        a.prompt_tokens, a.generation_tokens, a.batch_size
    ))?;
    let mut trials = Vec::new();
    for i in 0..a.num_trials {
        if a.delay > 0 {
            std::thread::sleep(Duration::from_secs(a.delay));
        }
        let tic = Instant::now();
        let t = bench(&generate)?;
        let total = tic.elapsed().as_secs_f64();
        if a.json {
            crate::common::out(format_args!(
                "{}",
                serde_json::json!({"trial": i + 1, "prompt_tps": t.prompt_tps,
                    "generation_tps": t.generation_tps, "peak_memory": t.peak_memory,
                    "total_time": total})
            ))?;
        } else {
            crate::common::out(format_args!(
                "Trial {}:  prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}, total_time={total:.3}",
                i + 1,
                t.prompt_tps,
                t.generation_tps,
                t.peak_memory
            ))?;
        }
        trials.push(t);
    }
    let n = a.num_trials as f64;
    let avg = |f: fn(&Trial) -> f64| trials.iter().map(f).sum::<f64>() / n;
    let (p, g, mem) = (
        avg(|t| t.prompt_tps),
        avg(|t| t.generation_tps),
        avg(|t| t.peak_memory),
    );
    if a.json {
        crate::common::out(format_args!(
            "{}",
            serde_json::json!({"averages": {"prompt_tps": p, "generation_tps": g, "peak_memory": mem},
                "decoder": decoder.name, "decoder_note": decoder.note})
        ))?;
    } else {
        crate::common::out(format_args!(
            "Averages: prompt_tps={p:.3}, generation_tps={g:.3}, peak_memory={mem:.3}"
        ))?;
    }
    Ok(())
}
