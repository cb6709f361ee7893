//! Prompt-lookup speculation against plain greedy decoding on the CPU decoder, same model, same
//! prompt, same run, alternating per round: the real SmolLM2-135M-Instruct (Q4_1 GGUF, as
//! `--dtype auto` loads it on the CPU) asked to copy-edit a passage (the reply repeats long
//! spans of the prompt). `cargo xtask bench spec` runs it in a release build;
//! `cargo run --release -p mlx-engine --example spec_bench -- [--rounds R] [--ngram N]
//! [--draft K] [--max-tokens M] [--threads T] [--out FILE.md]`.
//!
//! Each round times both runs' decode phase (from the first token, which the prompt gives, to
//! the return after the last), so decode rates are (tokens - 1) / that time. Medians over the rounds; the ratio is
//! speculative / plain decode tokens per second. Whether the two outputs were the same
//! tokens is reported per round.
//!
//! `--stream 1` also runs both, each round, through the text stream `mlx generate` runs
//! (`stream_generate` on the CPU decoder against `stream_generate_cpu_speculative`:
//! detokenizing, stop checks, log-probabilities) and reports the rate the command reports
//! (`generation_tps`), so the engine-level loop and the user's path are compared in one run.

use std::time::Instant;

use mlx_engine::chat_template::ChatTemplateOptions;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::cpu_spec::{
    greedy, longest_match, prompt_lookup_by_context, prompt_lookup_capped, prompt_lookup_drafts,
    prompt_lookup_longest, speculative_greedy_with, DraftLength, LookupDrafter, LOOKUP_DRAFTS,
    LOOKUP_SLACK,
};
use mlx_engine::load::{load, LoadSpec, ModelRef, Quiet};
use mlx_engine::speculative::prompt_lookup;
use mlx_engine::speculative::SpecStats;
use mlx_engine::stream::{stream_generate, stream_generate_cpu_speculative, StreamOptions};

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
#[allow(clippy::too_many_arguments)]
fn row(
    round: usize,
    p: f64,
    s: f64,
    cpu: f64,
    n: usize,
    st: &SpecStats,
    same: bool,
    load: &str,
) -> String {
    format!(
        "| {round} | {p:.1} | {s:.1} | {:.2}x | {cpu:.2}x | {n} | {} / {} | {} | {} | {load} |",
        s / p,
        st.accepted,
        st.drafted,
        st.rounds,
        if same { "yes" } else { "NO" }
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = arg("--rounds", 5);
    // The defaults: the library's policy (`cpu_spec::LookupDrafter`, what `mlx generate
    // --prompt-lookup-ngram 1` drafts with): any n-gram of one token or more, the occurrence
    // with the longest context, drafts up to that context's length plus `LOOKUP_SLACK`, at
    // most `LOOKUP_DRAFTS`, stopped where the output once left a copy, no adaptation. The
    // flags below vary it for experiments.
    let ngram: usize = arg("--ngram", 1);
    let k: usize = arg("--draft", LOOKUP_DRAFTS);
    let max_tokens: usize = arg("--max-tokens", 160);
    let threads: usize = arg("--threads", 0);
    let out_file: String = arg("--out", String::new());
    // 1: the number of drafts a round asks for adapts (`DraftLength`); 0: always `--draft`.
    let adaptive: usize = arg("--adaptive", 0);
    // 1: the lookup takes the occurrence with the longest context (`prompt_lookup_longest`);
    // 0: the most recent one (`prompt_lookup`).
    let longest: usize = arg("--longest", 1);
    // 1: drafts no longer than the matched context (`prompt_lookup_by_context`).
    let by_context: usize = arg("--by-context", 1);
    // With `--by-context 1`: drafts up to the matched context's length plus this many.
    let slack: usize = arg("--slack", LOOKUP_SLACK);
    // With `--by-context 1` and the library's slack: 1 drafts with `LookupDrafter` (the rule
    // plus its memory of divergences), 0 with the rule alone (`prompt_lookup_capped`).
    let memo: usize = arg("--memo", 1);
    let memo = memo != 0 && by_context != 0 && slack == LOOKUP_SLACK;
    // > 0: time one verification pass of 1..=N rows against a one-token step and exit.
    let cost: usize = arg("--cost", 0);

    let path = mlx_engine::fetch::smollm2_gguf()?;
    // As `mlx generate` loads it for the CPU decoder (`--dtype auto`, GGUF blocks and the
    // Q4_1 / Q8_0 half-precision scales kept): the same kernels as the command's.
    let spec = LoadSpec {
        dtype: "auto".into(),
        adapter_path: None,
        gguf_blocks: true,
        tokenizer_config: serde_json::Map::new(),
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
    if cost > 0 {
        return verify_cost(&mut dec, &prompt, cost, rounds);
    }
    // > 0: per-part profiles (`MLX_CPU_PROFILE=1`) of verification passes of 1..=N rows
    // (`--profile-from M`: M..=N), one fresh decoder a row count (each prints its profile when
    // dropped), then exit.
    let profile: usize = arg("--profile", 0);
    if profile > 0 {
        drop(dec);
        // `--profile-from M`: only the row counts M..=N (one row count alone, for a sampling
        // profiler such as `perf record` to attribute a process to it).
        let from: usize = arg("--profile-from", 1);
        for n in from.max(1)..=profile {
            let mut d = CpuDecoder::new(m.model.as_ref(), threads, prompt.len() + n + 8)?;
            profile_rows(&mut d, &prompt, n, rounds * 16)?;
        }
        return Ok(());
    }
    if arg("--simulate", 0usize) > 0 {
        // `--reply-json FILE`: the prompt and reply of an `mlx generate --json` run (its
        // `prompt_ids` and `tokens`, the EOS appended where it stopped) instead of this
        // prompt's plain reply.
        let json: String = arg("--reply-json", String::new());
        let (prompt, plain) = if json.is_empty() {
            let plain = greedy(&mut dec, &prompt, max_tokens, &mut |t| eos.contains(&t))?;
            (prompt, plain)
        } else {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
            let ids = |k: &str| -> Result<Vec<u32>, String> {
                v[k].as_array()
                    .ok_or(format!("{json}: no {k} array"))?
                    .iter()
                    .map(|t| {
                        t.as_u64()
                            .map(|t| t as u32)
                            .ok_or(format!("{json}: bad {k}"))
                    })
                    .collect()
            };
            let mut reply = ids("tokens")?;
            if v["finish_reason"] == "stop" {
                reply.extend(eos.iter().min());
            }
            (ids("prompt_ids")?, reply)
        };
        let costs: Vec<f64> = arg("--costs", String::new())
            .split(',')
            .filter_map(|c| c.trim().parse().ok())
            .collect();
        simulate(
            &prompt,
            &plain,
            max_tokens,
            arg("--alpha", 0.2f64),
            arg("--tile", 4usize),
            &costs,
        );
        return Ok(());
    }

    let stream = arg("--stream", 0usize) > 0;
    let mut stream_ratio = Vec::new();
    let (mut plain_rate, mut spec_rate, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let mut cpu_ratios = Vec::new();
    let mut rows = Vec::new();
    let mut last_text = String::new();
    for round in 0..rounds {
        let load_avg = std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string();
        // The decode phase alone: from the first token (the prompt's, before any decode step
        // or verification pass) to the return after the last.
        let mut first: Option<(Instant, f64)> = None;
        let plain = greedy(&mut dec, &prompt, max_tokens, &mut |t| {
            first.get_or_insert_with(|| (Instant::now(), cpu_seconds()));
            eos.contains(&t)
        })?;
        let (t, c) = first.take().ok_or("no token")?;
        let (plain_s, plain_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);

        let mut drafter = LookupDrafter::new(ngram);
        let mut lookup = |h: &[u32], n: usize| {
            if memo {
                drafter.propose(h, n)
            } else if by_context != 0 {
                prompt_lookup_capped(h, ngram, n, slack)
            } else if longest != 0 {
                prompt_lookup_longest(h, ngram, n)
            } else {
                prompt_lookup(h, ngram, n)
            }
        };
        let mut len = DraftLength::new(k, adaptive != 0);
        let (spec_out, st) = speculative_greedy_with(
            &mut dec,
            &prompt,
            max_tokens,
            &mut len,
            &mut lookup,
            &mut |t| {
                first.get_or_insert_with(|| (Instant::now(), cpu_seconds()));
                eos.contains(&t)
            },
        )?;
        let (t, c) = first.take().ok_or("no token")?;
        let (spec_s, spec_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
        // CPU time of the process's threads (less sensitive to other load than wall time).
        let cpu_ratio = plain_cpu / spec_cpu.max(1e-9) * (spec_out.len() - 1) as f64
            / (plain.len() - 1).max(1) as f64;
        cpu_ratios.push(cpu_ratio);

        let p = (plain.len() - 1) as f64 / plain_s.max(1e-9);
        let s = (spec_out.len() - 1) as f64 / spec_s.max(1e-9);
        plain_rate.push(p);
        spec_rate.push(s);
        ratio.push(s / p);
        let same = plain == spec_out;
        let line = row(round, p, s, cpu_ratio, plain.len(), &st, same, &load_avg);
        println!("{line}");
        rows.push(line);
        last_text = m.tokenizer.decode(&spec_out, true)?;
        if stream {
            let run = |spec: bool| -> Result<(f64, Vec<u32>), Box<dyn std::error::Error>> {
                let opts = StreamOptions {
                    generate: mlx_engine::generate::GenerateOptions {
                        max_tokens: Some(max_tokens),
                        cpu_decode: Some(mlx_engine::generate::CpuDecode { threads }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let (model, tok) = (m.model.as_ref(), &m.tokenizer);
                let s = if spec {
                    stream_generate_cpu_speculative(model, tok, &prompt, ngram, k, opts)?
                } else {
                    stream_generate(model, tok, &prompt, None, opts)?
                };
                let (mut rate, mut toks) = (0.0, Vec::new());
                for r in s {
                    let r = r?;
                    rate = r.generation_tps;
                    toks.extend(r.token);
                }
                Ok((rate, toks))
            };
            let (p, pt) = run(false)?;
            let (s, st) = run(true)?;
            stream_ratio.push(s / p);
            println!(
                "stream | {round} | {p:.1} | {s:.1} | {:.2}x | {} | {} |",
                s / p,
                pt.len(),
                if pt == st && pt == plain { "yes" } else { "NO" }
            );
        }
    }
    if stream {
        println!(
            "through the text stream (`generation_tps`): median ratio {:.2}x",
            median(&mut stream_ratio)
        );
    }
    let (p, s, r, cr) = (
        median(&mut plain_rate),
        median(&mut spec_rate),
        median(&mut ratio),
        median(&mut cpu_ratios),
    );
    let summary = format!(
        "median over {rounds} rounds: plain {p:.1} tok/s, prompt lookup {s:.1} tok/s, ratio \
         {r:.2}x; by CPU time {cr:.2}x"
    );
    println!("{summary}");
    if !out_file.is_empty() {
        let md = format!(
            "# Prompt-lookup speculation on the CPU decoder\n\n\
             `cargo xtask bench spec` (`mlx-engine/examples/spec_bench.rs`), release build, \
             SmolLM2-135M-Instruct Q4_1 GGUF (loaded as `mlx generate` loads it for the CPU \
             decoder: half-precision scales, the CPU decoder's int16 activations), {} \
             threads, prompt {} tokens (a copy-edit request over a passage with repeated spans, ChatML), at most {max_tokens} tokens, greedy, stop at EOS; prompt \
             lookup n-gram {ngram}, up to {k} draft tokens (adaptive: {}, longest-context lookup: {}, \
             drafts capped by the matched context plus {slack}: {}, stopped where a copy diverged \
             before: {memo}) verified in one batched pass; plain = \
             the same decoder one token a step. Rounds alternate the two; decode rate = \
             (tokens - 1) / (time from the first token to the last).\n\n\
             The CPU-time ratio is plain's CPU seconds a decoded token over speculation's (every \
             thread of the process, from `/proc/self/task/*/schedstat`): what the run costs in \
             work, less sensitive than wall time to other load on the machine.\n\n\
             | round | plain tok/s | lookup tok/s | ratio | CPU-time ratio | tokens | accepted / \
             drafted | passes | same tokens | load |\n|---|---|---|---|---|---|---|---|---|---|\n{}\n\n\
             **{summary}** (target >= 1.8x).\n\nThe reply (speculative run, last round):\n\n\
             ```text\n{last_text}\n```\n",
            dec.threads(),
            prompt.len(),
            adaptive != 0,
            longest != 0,
            by_context != 0,
            rows.join("\n")
        );
        std::fs::write(&out_file, md)?;
        println!("wrote {out_file}");
    }
    Ok(())
}

/// The cost of one verification pass of `n` rows (`n = 1..=max`) after the prompt, in
/// one-token steps: wall time (fastest of `rounds * 8` passes) and CPU time of the process's
/// threads (median), the cache rolled back after each; beside it the teacher-forcing block
/// (`feed_all`: the prompt's kernels, the head a row at a time) that verification ran before.
fn verify_cost(
    dec: &mut CpuDecoder<'_>,
    prompt: &[u32],
    max: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    dec.reset();
    dec.feed(prompt)?;
    let base = dec.position();
    let tokens: Vec<u32> = prompt[prompt.len() / 2..]
        .iter()
        .copied()
        .cycle()
        .take(max)
        .collect();
    let (mut one, mut one_cpu) = (f64::INFINITY, f64::INFINITY);
    for n in 1..=max {
        let time = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| {
            let (mut best, mut cpu) = (f64::INFINITY, Vec::new());
            for _ in 0..rounds.max(1) * 8 {
                let (t, c) = (Instant::now(), cpu_seconds());
                f()?;
                best = best.min(t.elapsed().as_secs_f64());
                cpu.push(cpu_seconds() - c);
            }
            Ok::<_, Box<dyn std::error::Error>>((best, median(&mut cpu)))
        };
        let (best, cpu) = time(&mut || {
            dec.verify(&tokens[..n])?;
            dec.truncate(base);
            Ok(())
        })?;
        let (block, block_cpu) = time(&mut || {
            dec.feed_all(&tokens[..n], &mut |_, _| {})?;
            dec.truncate(base);
            Ok(())
        })?;
        if n == 1 {
            (one, one_cpu) = (best, cpu);
        }
        println!(
            "verify {n} rows: {:.2} ms = {:.2} steps wall, {:.2} by CPU time; feed_all block \
             {:.2} steps wall, {:.2} by CPU time",
            best * 1e3,
            best / one,
            cpu / one_cpu,
            block / one,
            block_cpu / one_cpu
        );
    }
    Ok(())
}

/// `passes` verification passes of `n` rows after the prompt (the cache rolled back after each)
/// on `dec`, whose `MLX_CPU_PROFILE` table (printed to stderr when it is dropped) is then that
/// of `n`-row passes alone (the prompt's blocks are not profiled).
fn profile_rows(
    dec: &mut CpuDecoder<'_>,
    prompt: &[u32],
    n: usize,
    passes: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    dec.feed(prompt)?;
    let base = dec.position();
    let tokens: Vec<u32> = prompt[prompt.len() / 2..]
        .iter()
        .copied()
        .cycle()
        .take(n)
        .collect();
    let t = Instant::now();
    for _ in 0..passes {
        dec.verify(&tokens)?;
        dec.truncate(base);
    }
    eprintln!(
        "profile {n} rows: {passes} passes, {:.3} ms a pass",
        t.elapsed().as_secs_f64() * 1e3 / passes as f64
    );
    Ok(())
}

/// CPU time of every thread of this process so far, in seconds (the first field of each
/// `/proc/self/task/*/schedstat`, nanoseconds on the CPU); 0 where that is not readable.
fn cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut ns = 0u64;
    for e in dir.flatten() {
        if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 * 1e-9
}

/// Draft policies replayed against the plain greedy reply (a draft is accepted up to its first
/// token that differs from the reply): passes, rows verified and the cost in one-token steps.
/// A pass of `r` rows costs `costs[r - 1]` where `--costs c1,c2,...` gives measured costs
/// (past the list, its last step's increment per row), else `(1 - alpha) * ceil(r / tile) +
/// alpha * r` (the products run `tile` rows a pass over each weight block); plain decoding
/// costs one step a token. Lookups: most recent occurrence (`recent`), longest context
/// (`longest`), longest context with drafts capped by its length (`context`; `ctx-1`,
/// `ctx+1`, `ctx+2`: the cap one less, one or two more than the matched length), and
/// `oracle`: `longest`'s drafts cut to the part the reply accepts (the bound for these
/// lookups: no policy drafting from them does better). As `CpuSpecSteps` does, a round asks
/// for at most the `max_tokens` left, not the reply's length (the last round, which meets the
/// EOS, drafts as any other).
fn simulate(
    prompt: &[u32],
    reply: &[u32],
    max_tokens: usize,
    alpha: f64,
    tile: usize,
    costs: &[f64],
) {
    let cost_of = |r: usize| -> f64 {
        if costs.is_empty() {
            return (1.0 - alpha) * r.div_ceil(tile.max(1)) as f64 + alpha * r as f64;
        }
        if r <= costs.len() {
            return costs[r - 1];
        }
        let n = costs.len();
        let inc = if n > 1 {
            costs[n - 1] - costs[n - 2]
        } else {
            alpha
        };
        costs[n - 1] + inc * (r - n) as f64
    };
    acceptance(prompt, reply);
    println!("ngram lookup adaptive k | passes rows cost speedup");
    let mut best: Vec<(f64, String)> = Vec::new();
    for ngram in 1..=4 {
        for lookup in [
            "recent", "longest", "context", "ctx-1", "ctx+1", "ctx+2", "oracle",
        ] {
            for adaptive in [false, true] {
                for k in [1, 2, 3, 4, 5, 6, 8, 12] {
                    let mut len = DraftLength::new(k, adaptive);
                    let mut history = prompt.to_vec();
                    let (mut passes, mut rows, mut done) = (0usize, 0usize, 0usize);
                    let mut cost = 0.0;
                    while done < reply.len() {
                        // The pending token reply[done] goes in with the drafts.
                        history.push(reply[done]);
                        done += 1;
                        if done == reply.len() {
                            // The last token (EOS or `max_tokens`) ends the stream: no pass.
                            break;
                        }
                        let want = len.want(max_tokens.saturating_sub(done));
                        let mut drafts = match lookup {
                            "recent" => prompt_lookup(&history, ngram, want),
                            "context" => prompt_lookup_by_context(&history, ngram, want),
                            "ctx-1" | "ctx+1" | "ctx+2" => {
                                let slack: isize = lookup[3..].parse().unwrap_or(0);
                                longest_match(&history, ngram).map_or_else(Vec::new, |(l, from)| {
                                    let n = (l as isize + slack).max(0) as usize;
                                    let end = (from + n.min(want)).min(history.len());
                                    history[from..end].to_vec()
                                })
                            }
                            _ => prompt_lookup_longest(&history, ngram, want),
                        };
                        if lookup == "oracle" {
                            let keep = drafts
                                .iter()
                                .zip(&reply[done..])
                                .take_while(|(a, b)| a == b)
                                .count();
                            drafts.truncate(keep);
                        }
                        let n = drafts
                            .iter()
                            .zip(&reply[done..])
                            .take_while(|(a, b)| a == b)
                            .count();
                        len.update(drafts.len(), n);
                        passes += 1;
                        rows += 1 + drafts.len();
                        cost += cost_of(1 + drafts.len());
                        history.extend_from_slice(&reply[done..done + n]);
                        done += n;
                    }
                    let line = format!(
                        "{ngram} {lookup} {adaptive} {k} | {passes} {rows} {cost:.1} {:.2}x",
                        reply.len() as f64 / cost
                    );
                    println!("{line}");
                    best.push((reply.len() as f64 / cost, line));
                }
            }
        }
    }
    best.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("best:");
    for (_, l) in best.iter().take(8) {
        println!("{l}");
    }
}

/// The acceptance curve the policies trade against: decoding `reply` by the library's policy
/// (`prompt_lookup_drafts`, n-gram 1, 4 drafts), at each round the longest-context lookup's
/// first 8 tokens checked against the reply, counted per matched-context length (1, 2-3,
/// 4-7, 8+) and draft place as accepted / reached (reached: every draft before it accepted).
fn acceptance(prompt: &[u32], reply: &[u32]) {
    let bucket = |l: usize| match l {
        0..=1 => 0,
        2..=3 => 1,
        4..=7 => 2,
        _ => 3,
    };
    let mut tab = [[(0usize, 0usize); 8]; 4];
    let mut history = prompt.to_vec();
    let mut done = 0;
    while done < reply.len() {
        history.push(reply[done]);
        done += 1;
        if let Some((l, from)) = longest_match(&history, 1) {
            let end = (from + 8).min(history.len());
            for (i, &t) in history[from..end].iter().enumerate() {
                let Some(&want) = reply.get(done + i) else {
                    break;
                };
                tab[bucket(l)][i].1 += 1;
                if t != want {
                    break;
                }
                tab[bucket(l)][i].0 += 1;
            }
        }
        let drafts = prompt_lookup_drafts(&history, 1, 4);
        let n = drafts
            .iter()
            .zip(&reply[done..])
            .take_while(|(a, b)| a == b)
            .count();
        history.extend_from_slice(&reply[done..done + n]);
        done += n;
    }
    println!("acceptance by matched length (accepted / reached), drafts 1..8:");
    for (name, row) in ["1", "2-3", "4-7", "8+"].iter().zip(&tab) {
        let cells: Vec<String> = row.iter().map(|(a, r)| format!("{a}/{r}")).collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
}
