//! `mlx chat`: `mlx_lm.chat` — each line is a turn rendered as `[system?, user]` and appended to
//! one growing cache; `q` quits, `r` resets the cache, `h` shows the commands. Seed 0 and 256
//! tokens by default, as mlx-lm. The reply streams to stdout; with `--json` each turn prints one
//! JSON object instead (`text`, `tokens`, `generation_tokens`, `finish_reason`).

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;
use mlx_engine::chat::{ChatSpeculation, Conversation};
use mlx_engine::generate::GenerateOptions;
use mlx_engine::sample::{Sampler, SamplerSettings};
use mlx_engine::stream::StreamOptions;
use serde_json::json;

use crate::common::{
    self, DecoderArgs, ModelArgs, SpecArgs, SpecSource, DEFAULT_PREFILL_STEP_SIZE,
};
use crate::model;

/// `mlx_lm.chat`'s flags.
#[derive(Args, Debug, Clone)]
#[command(args_override_self = true)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temp: f64,
    /// Sampling top-p (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Probability of XTC sampling to happen each next token.
    #[arg(long, default_value_t = 0.0)]
    pub xtc_probability: f64,
    /// Threshold the probs of each next token candidate to be sampled by XTC.
    #[arg(long, default_value_t = 0.1)]
    pub xtc_threshold: f64,
    /// PRNG seed (seeded before the model is built, as mlx-lm).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Set the maximum key-value cache size.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_kv_size: Option<u64>,
    /// Number of prompt tokens to process at a time.
    #[arg(long, default_value_t = DEFAULT_PREFILL_STEP_SIZE as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_step_size: u64,
    /// Maximum number of tokens to generate per turn (-1: no limit).
    #[arg(
        long,
        short = 'm',
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    pub max_tokens: i64,
    /// System prompt to be used for the chat template.
    #[arg(long, alias = "system")]
    pub system_prompt: Option<String>,
    /// One JSON object per turn on stdout instead of the streamed reply.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub decoder: DecoderArgs,
    /// Print which decoder runs the model (and why `--decoder auto` fell back) on standard
    /// error (`false`/`f`, any case, turns it off).
    #[arg(long, default_value = "false", value_parser = common::str2bool, value_name = "BOOL",
          action = clap::ArgAction::Set)]
    pub verbose: bool,
    /// Constrain every reply to JSON valid against the JSON schema in FILE.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<String>,
}

const HELP: &str = "  commands    q exit   r reset   h help";

/// Runs a checked command line (the sampler flags were checked by `check`).
pub fn run(a: &ChatArgs) -> Result<(), String> {
    // GGML blocks kept for the CPU decoder where it will likely run, as `generate` does (a
    // draft model's exact speculation stays on MLX under `auto`).
    let blocks = a
        .decoder
        .loads_gguf_blocks(&a.model.dtype, a.spec.draft_model.is_some());
    let m = model::load_for(&a.model, false, blocks)?;
    if !m.tokenizer.has_chat_template() {
        return Err("this model's tokenizer has no chat template; use `mlx generate`".into());
    }
    let spec = a.spec.load(&m, &a.model.dtype)?;
    match &spec {
        Some(sp) => sp.seed(&m, a.seed)?,
        None => m.seed(a.seed).map_err(|e| e.to_string())?,
    }
    let grammar = crate::generate::json_schema_grammar(a.json_schema.as_deref(), &m)?;
    let mut special: Vec<i32> = m
        .tokenizer
        .encode("\n", true)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|t| t as i32)
        .collect();
    special.extend(m.tokenizer.eos_token_ids().iter().map(|&t| t as i32));
    let mut opts = StreamOptions {
        generate: GenerateOptions {
            max_tokens: common::max_tokens(a.max_tokens),
            sampler: Sampler::new(SamplerSettings {
                temp: a.temp,
                top_p: a.top_p,
                xtc_probability: a.xtc_probability,
                xtc_threshold: a.xtc_threshold,
                xtc_special_tokens: special,
                ..SamplerSettings::default()
            }),
            max_kv_size: a.max_kv_size.map(|n| n as usize),
            prefill_step_size: a.prefill_step_size as usize,
            grammar,
            ..GenerateOptions::default()
        },
        ..StreamOptions::default()
    };
    let decoder = if let Some(SpecSource::Lookup(_)) = &spec {
        // Prompt lookup speculates on the CPU decoder where it would run and decoding is greedy.
        let greedy = if a.temp != 0.0 {
            Err(format!("--temp {}", a.temp))
        } else if opts.generate.grammar.is_some() {
            Err("--json-schema".into())
        } else {
            Ok(())
        };
        a.decoder.pick_for_prompt_lookup(
            m.model.as_ref(),
            &opts.generate,
            &a.model.dtype,
            false,
            greedy,
        )?
    } else {
        a.decoder.pick_unless_speculative(
            spec.is_some(),
            m.model.as_ref(),
            &opts.generate,
            &a.model.dtype,
            false,
            Ok(()),
        )?
    };
    decoder.apply(&mut opts.generate);
    if decoder.graph {
        // One decoder for every turn: built (kernels, weights, capture) in the first. A
        // trellis model's decoder keeps the conversation in its cache: each turn runs only its
        // new tokens.
        opts.generate.graph_keep = Some(mlx_engine::graph::GraphKeep::for_conversation());
    }
    if a.verbose {
        eprintln!("[mlx] {}", decoder.note);
    }
    let mut conv = Conversation::new(
        m.model.as_ref(),
        &m.tokenizer,
        a.system_prompt.as_deref(),
        opts,
    )
    .map_err(|e| e.to_string())?;
    if let Some(sp) = &spec {
        let (draft, ngram) =
            match sp {
                SpecSource::Draft(d) => (Some(d.model.as_ref()), 0),
                SpecSource::Lookup(n) => (None, *n),
                SpecSource::Mtp => return Err(
                    "--mtp: mlx chat does not draft with MTP layers yet (mlx generate --mtp does)"
                        .into(),
                ),
            };
        conv = conv
            .with_speculation(ChatSpeculation {
                draft,
                ngram,
                num_draft_tokens: a.spec.num_draft_tokens(),
            })
            .map_err(|e| e.to_string())?;
    }
    let tty = std::io::stdin().is_terminal();
    let mut out = std::io::stdout();
    if !a.json {
        writeln!(
            out,
            "[mlx chat] model {}  max tokens {}",
            a.model.model.as_deref().unwrap_or("SmolLM2-135M-Instruct"),
            a.max_tokens
        )
        .ok();
        writeln!(out, "{HELP}").ok();
    }
    let stdin = std::io::stdin();
    loop {
        if tty {
            write!(out, "› ").ok();
            out.flush().ok();
        }
        // Under `mlx launch`, rank 0 reads and every rank runs the same turn.
        let line = crate::launch::shared_line(|| {
            let mut line = String::new();
            let n = stdin
                .lock()
                .read_line(&mut line)
                .map_err(|e| format!("reading standard input: {e}"))?;
            Ok((n > 0).then_some(line))
        })?;
        let Some(line) = line else {
            break;
        };
        let query = line.strip_suffix('\n').unwrap_or(&line);
        let query = query.strip_suffix('\r').unwrap_or(query);
        match query {
            "q" => {
                if !a.json {
                    writeln!(out, "bye").ok();
                }
                break;
            }
            "r" => {
                conv.reset().map_err(|e| e.to_string())?;
                if !a.json {
                    writeln!(out, "  reset context cleared").ok();
                }
                continue;
            }
            "h" => {
                if !a.json {
                    writeln!(out, "{HELP}").ok();
                }
                continue;
            }
            _ => {}
        }
        let mut text = String::new();
        let mut tokens = Vec::new();
        let json = a.json;
        let last = conv
            .turn(query, |r| {
                text.push_str(&r.text);
                tokens.extend(r.token);
                if !json {
                    let mut o = std::io::stdout();
                    write!(o, "{}", r.text).ok();
                    o.flush().ok();
                }
            })
            .map_err(|e| e.to_string())?;
        if let Some(why) = conv.graph_fallback() {
            eprintln!("[mlx] warning: {why}");
        }
        if a.json {
            let mut obj = json!({
                "text": text,
                "tokens": tokens,
                "generation_tokens": last.generation_tokens,
                "finish_reason": last.finish_reason.map(|f| f.as_str()),
                "cached_tokens": conv.cached_tokens(),
                "decoder": decoder.name,
            });
            if let Some(why) = conv.graph_fallback() {
                obj["graph_fallback"] = json!(why);
            }
            if let Some(st) = conv.spec_stats() {
                obj["draft_tokens"] = json!(st.drafted);
                obj["accepted_draft_tokens"] = json!(st.accepted);
            }
            writeln!(out, "{obj}").ok();
        } else {
            writeln!(out).ok();
            writeln!(
                out,
                "  {} tokens · {:.1} tok/s · prompt {:.1} tok/s · peak {:.2} GB",
                last.generation_tokens,
                last.generation_tps,
                last.prompt_tps,
                last.peak_memory_bytes as f64 / 1e9
            )
            .ok();
            if let Some(st) = conv.spec_stats() {
                writeln!(out, "  {}", SpecSource::report(&st)).ok();
            }
        }
    }
    Ok(())
}
