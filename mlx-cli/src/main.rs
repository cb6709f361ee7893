//! `mlx`: generate text and chat with a language model on MLX, with results identical to
//! mlx-lm's (see the workspace README).
#![forbid(unsafe_code)]

mod args;
mod model;
mod progress;

use std::io::{BufRead, Write};
use std::process::ExitCode;

use mlx_engine::chat::ChatSession;
use mlx_engine::chat_template::ChatTemplateOptions;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::sample::{Sampler, SamplerSettings};
use mlx_engine::stream::{stream_generate, FinishReason, StreamOptions};
use serde_json::{json, Value};

use crate::args::Args;

fn stream_options(a: &Args) -> StreamOptions {
    StreamOptions {
        generate: GenerateOptions {
            max_tokens: Some(a.max_tokens),
            sampler: Sampler::new(SamplerSettings {
                temp: a.temp,
                top_p: a.top_p,
                min_p: a.min_p,
                top_k: a.top_k,
                ..SamplerSettings::default()
            }),
            ..GenerateOptions::default()
        },
        stop_strings: a.stop.clone(),
        top_logprobs: a.top_logprobs,
    }
}

fn prompt_ids(a: &Args, m: &model::Loaded) -> Result<Vec<u32>, String> {
    if let Some(ids) = &a.prompt_ids {
        return Ok(ids.clone());
    }
    let mut text = a
        .prompt
        .clone()
        .unwrap_or_else(|| "hello".into())
        .replace("\\n", "\n")
        .replace("\\t", "\t");
    if text == "-" {
        text.clear();
        std::io::stdin()
            .lock()
            .read_line(&mut text)
            .map_err(|e| format!("reading stdin: {e}"))?;
    }
    let tok = &m.tokenizer;
    let use_template = !a.no_chat_template && tok.has_chat_template();
    if use_template {
        let mut messages: Vec<Value> = Vec::new();
        if let Some(s) = &a.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": text}));
        text = tok
            .apply_chat_template(&messages, &ChatTemplateOptions::generation(true))
            .map_err(|e| e.to_string())?;
    }
    tok.encode(&text, !use_template).map_err(|e| e.to_string())
}

fn generate(a: &Args) -> Result<(), String> {
    let m = model::load(a)?;
    let ids = prompt_ids(a, &m)?;
    if let Some(s) = a.seed {
        mlx_core::random::seed(s).map_err(|e| e.to_string())?;
    }
    let stream = stream_generate(
        m.model.as_ref(),
        &m.tokenizer,
        &ids,
        None,
        stream_options(a),
    )
    .map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    if !a.json {
        writeln!(out, "==========").ok();
    }
    let (mut tokens, mut logprobs, mut tops, mut text) =
        (Vec::new(), Vec::new(), Vec::new(), String::new());
    let mut last = None;
    for r in stream {
        let r = r.map_err(|e| e.to_string())?;
        if a.json {
            if let (Some(t), Some(lp)) = (r.token, r.logprob) {
                tokens.push(t);
                logprobs.push(f64::from(lp));
                tops.push(
                    r.top_logprobs
                        .iter()
                        .map(|(i, v)| json!([i, f64::from(*v)]))
                        .collect::<Vec<_>>(),
                );
            }
        } else {
            write!(out, "{}", r.text).ok();
            out.flush().ok();
        }
        text.push_str(&r.text);
        last = Some(r);
    }
    let Some(r) = last else {
        return Err("generation produced no output".into());
    };
    if a.json {
        let mut obj = json!({
            "prompt_ids": ids,
            "tokens": tokens,
            "logprobs": logprobs,
            "text": text,
            "prompt_tps": r.prompt_tps,
            "generation_tps": r.generation_tps,
            "peak_memory_bytes": r.peak_memory_bytes,
            "dtype": m.dtype_name,
            "finish_reason": r.finish_reason.unwrap_or(FinishReason::Length).as_str(),
        });
        if a.top_logprobs > 0 {
            obj["top_logprobs"] = Value::Array(tops.into_iter().map(Value::Array).collect());
        }
        writeln!(out, "{obj}").ok();
    } else {
        writeln!(out).ok();
        writeln!(out, "==========").ok();
        if r.generation_tokens == 0 && text.is_empty() {
            writeln!(out, "No text generated for this prompt").ok();
        }
        writeln!(
            out,
            "Prompt: {} tokens, {:.3} tokens-per-sec",
            r.prompt_tokens, r.prompt_tps
        )
        .ok();
        writeln!(
            out,
            "Generation: {} tokens, {:.3} tokens-per-sec",
            r.generation_tokens, r.generation_tps
        )
        .ok();
        writeln!(
            out,
            "Peak memory: {:.3} GB",
            r.peak_memory_bytes as f64 / 1e9
        )
        .ok();
    }
    Ok(())
}

fn chat(a: &Args) -> Result<(), String> {
    let m = model::load(a)?;
    if !m.tokenizer.has_chat_template() {
        return Err("this model's tokenizer has no chat template; use `mlx generate`".into());
    }
    if let Some(s) = a.seed {
        mlx_core::random::seed(s).map_err(|e| e.to_string())?;
    }
    let mut session = ChatSession::new(
        m.model.as_ref(),
        &m.tokenizer,
        a.system.as_deref(),
        stream_options(a),
    );
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!("[chat] type a message; an empty line or Ctrl-D quits");
    loop {
        write!(out, ">> ").ok();
        out.flush().ok();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            break;
        }
        let (_, stats) = session
            .send(line, |r| {
                let mut o = std::io::stdout();
                write!(o, "{}", r.text).ok();
                o.flush().ok();
            })
            .map_err(|e| e.to_string())?;
        writeln!(out).ok();
        eprintln!(
            "[chat] prompt {} tokens ({} run, {} reused from the cache), {:.3} tokens-per-sec; generation {} tokens, {:.3} tokens-per-sec",
            stats.prompt_tokens,
            stats.prefilled,
            stats.prompt_tokens - stats.prefilled,
            stats.prompt_tps,
            stats.generated,
            stats.generation_tps
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match args::parse(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let r = if a.command == "chat" {
        chat(&a)
    } else {
        generate(&a)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
