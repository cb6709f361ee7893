//! Prompt-lookup speculation against plain greedy decoding on the CPU decoder, same model, same
//! prompt, same run, alternating per round: the real SmolLM2-135M-Instruct (Q4_1 GGUF, as
//! `--dtype auto` loads it on the CPU) asked to copy-edit a passage (the reply repeats long
//! spans of the prompt). `cargo xtask bench spec` runs it in a release build;
//! `cargo run --release -p mlx-engine --example spec_bench -- [--rounds R] [--ngram N]
//! [--draft K] [--max-tokens M] [--threads T] [--out FILE.md]`.
//!
//! Each round times both runs end to end (prefill included) and the prefill alone, so decode
//! rates are (tokens - 1) / (total - prefill). Medians over the rounds; the ratio is
//! speculative / plain decode tokens per second. Whether the two outputs were the same
//! tokens is reported per round.

use std::time::Instant;

use mlx_engine::chat_template::ChatTemplateOptions;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::cpu_spec::{greedy, speculative_greedy};
use mlx_engine::load::{load, LoadSpec, ModelRef, Quiet};
use mlx_engine::speculative::prompt_lookup;
use mlx_engine::speculative::SpecStats;

const PASSAGE: &str = "The city council met on Tuesday evening to discuss the new budget for \
the public library. The council agreed that the public library needs more funding for books, \
for computers and for longer opening hours. The mayor said that the public library is the \
heart of the city and that every child in the city should have a library card. The council \
will vote on the new budget for the public library next Tuesday evening.";

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One round as a Markdown table row.
fn row(round: usize, p: f64, s: f64, n: usize, st: &SpecStats, same: bool, load: &str) -> String {
    format!(
        "| {round} | {p:.1} | {s:.1} | {:.2}x | {n} | {} / {} | {} | {} | {load} |",
        s / p,
        st.accepted,
        st.drafted,
        st.rounds,
        if same { "yes" } else { "NO" }
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = arg("--rounds", 5);
    let ngram: usize = arg("--ngram", 3);
    let k: usize = arg("--draft", 8);
    let max_tokens: usize = arg("--max-tokens", 160);
    let threads: usize = arg("--threads", 0);
    let out_file: String = arg("--out", String::new());

    let path = mlx_engine::fetch::smollm2_gguf()?;
    let spec = LoadSpec {
        dtype: "f32".into(),
        adapter_path: None,
    };
    let m = load(&ModelRef::Path(path.clone()), &spec, &mut Quiet)?;
    let messages = vec![serde_json::json!({
        "role": "user",
        "content": format!(
            "Copy the following text exactly, but replace every \"public library\" with \
             \"city library\":\n\n{PASSAGE}"
        ),
    })];
    let prompt = m.tokenizer.apply_chat_template_ids(
        &messages,
        &ChatTemplateOptions {
            add_generation_prompt: true,
            ..Default::default()
        },
    )?;
    let eos = m.tokenizer.eos_token_ids().clone();
    let mut dec = CpuDecoder::new(m.model.as_ref(), threads, prompt.len() + max_tokens + k + 8)?;

    let (mut plain_rate, mut spec_rate, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = Vec::new();
    let mut last_text = String::new();
    for round in 0..rounds {
        let load_avg = std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string();
        // The prefill alone (the same for both runs).
        dec.reset();
        let t = Instant::now();
        dec.feed(&prompt)?;
        let prefill = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let plain = greedy(&mut dec, &prompt, max_tokens, &mut |t| eos.contains(&t))?;
        let plain_s = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let mut lookup = |h: &[u32], n: usize| prompt_lookup(h, ngram, n);
        let (spec_out, st) =
            speculative_greedy(&mut dec, &prompt, max_tokens, k, &mut lookup, &mut |t| {
                eos.contains(&t)
            })?;
        let spec_s = t.elapsed().as_secs_f64();

        let p = (plain.len() - 1) as f64 / (plain_s - prefill).max(1e-9);
        let s = (spec_out.len() - 1) as f64 / (spec_s - prefill).max(1e-9);
        plain_rate.push(p);
        spec_rate.push(s);
        ratio.push(s / p);
        let same = plain == spec_out;
        let line = row(round, p, s, plain.len(), &st, same, &load_avg);
        println!("{line}");
        rows.push(line);
        last_text = m.tokenizer.decode(&spec_out, true)?;
    }
    let (p, s, r) = (
        median(&mut plain_rate),
        median(&mut spec_rate),
        median(&mut ratio),
    );
    let summary = format!(
        "median over {rounds} rounds: plain {p:.1} tok/s, prompt lookup {s:.1} tok/s, ratio {r:.2}x"
    );
    println!("{summary}");
    if !out_file.is_empty() {
        let md = format!(
            "# Prompt-lookup speculation on the CPU decoder\n\n\
             `cargo xtask bench spec` (`mlx-engine/examples/spec_bench.rs`), release build, \
             SmolLM2-135M-Instruct Q4_1 GGUF (`--dtype f32`, the CPU decoder's int16 \
             activations), {} threads, prompt {} tokens (a copy-edit request over a passage with \
             repeated spans, ChatML), at most {max_tokens} tokens, greedy, stop at EOS; prompt \
             lookup n-gram {ngram}, up to {k} draft tokens verified in one batched pass; plain = \
             the same decoder one token a step. Rounds alternate the two; decode rate = \
             (tokens - 1) / (total - prefill).\n\n\
             | round | plain tok/s | lookup tok/s | ratio | tokens | accepted / drafted | \
             passes | same tokens | load |\n|---|---|---|---|---|---|---|---|---|\n{}\n\n\
             **{summary}** (target >= 1.8x).\n\nThe reply (speculative run, last round):\n\n\
             ```text\n{last_text}\n```\n",
            dec.threads(),
            prompt.len(),
            rows.join("\n")
        );
        std::fs::write(&out_file, md)?;
        println!("wrote {out_file}");
    }
    Ok(())
}
