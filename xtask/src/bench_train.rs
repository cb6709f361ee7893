//! `cargo xtask bench train`: LoRA training step time and peak memory of `mlx train` against
//! mlx-lm's tuner (`python -m mlx_lm lora --train`) on the same model, data and machine, at
//! several sequence lengths, batch 1, rank 8 (mlx-lm's default LoRA parameters), or full
//! fine-tuning (`--fine-tune-type full`).
//!
//! Both sides get the same flags and print the same report line per step (`Iter N: ... It/sec
//! X, ... Peak mem Y GB`: mlx-lm's CLI through `xtask/oracle/bench_train_mlx_lm.py`, which
//! runs `mlx_lm.lora.main` with a callback printing its train reports); a run's step time is the median of `1 / It/sec` over the steps after
//! the first (which compiles kernels and warms the allocator), its peak the largest `Peak mem`
//! (MLX's peak since the process started: weights included). Each sequence is exactly `LEN`
//! tokens (longer rows truncated by `--max-seq-length LEN`, as both tuners do). Ours runs in
//! the variants given (`plain`, `flash` = `--flash-block B`, `ckpt` = `--grad-checkpoint`,
//! `seg` = `--segment-length S`, `ce` = `--ce-chunk-size C`, combined with `+`, e.g. the
//! memory variant `ckpt+seg+ce`), mlx-lm in `plain` and `ckpt`. A run that fails (out of
//! memory, an MLX error) or outlives `--timeout` seconds (then killed) is a row with its last
//! error line.
//!
//! The model is a name from `xtask/oracle/bench_models.py` (seeded random weights: default
//! `llama-small-f32` for the CPU, `llama-8b-q4` on the GPU) or a directory; the tokenizer of
//! the tiny test llama is copied next to it when it has none.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

use crate::bench::{cargo, loadavg, median, resolve_model_dir};
use crate::bindings::workspace_root;
use crate::oracle;

const USAGE: &str = "usage: cargo xtask bench train [--model NAME|DIR] [--lengths 128,512]
    [--iters N] [--num-layers N] [--fine-tune-type lora|dora|full] [--ours plain,flash,...]
    [--mlx-lm plain,ckpt] [--flash-block B] [--segment-length S] [--ce-chunk-size C]
    [--memory-limit GB] [--timeout SECS] [--ours-bin PATH] [--models-dir DIR] [--json FILE]
  variants: plain | flash | flashk | sdpa | ckpt | seg | ce | lim, joined with + (e.g. ckpt+ce);
            flashk: --flash-block with --flash-kernel cuda; sdpa: --flash-kernel sdpa;
            lim: --memory-limit GB (default 12)
  mlx-lm: plain | ckpt
  --timeout SECS: kill a run after SECS seconds (default 600) and record it as failed
  --ours-bin PATH: a prebuilt `mlx` (or anything taking `train ARGS`), e.g. built here against
                   MLX's CUDA wheel for a GPU machine; default: cargo build --release -p mlx-cli";

struct Options {
    model: String,
    lengths: Vec<usize>,
    iters: usize,
    num_layers: i32,
    fine_tune_type: String,
    ours: Vec<String>,
    theirs: Vec<String>,
    flash_block: usize,
    segment_length: usize,
    ce_chunk: usize,
    memory_limit_gb: f64,
    timeout_s: u64,
    ours_bin: Option<PathBuf>,
    models_dir: PathBuf,
    json: Option<PathBuf>,
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        model: "llama-small-f32".into(),
        lengths: vec![128, 512],
        iters: 5,
        num_layers: 16,
        fine_tune_type: "lora".into(),
        ours: list("plain,flash,ckpt+flash"),
        theirs: list("plain,ckpt"),
        flash_block: 512,
        segment_length: 2048,
        ce_chunk: 1024,
        memory_limit_gb: 12.0,
        timeout_s: 600,
        ours_bin: None,
        models_dir: workspace_root().join("target").join("bench-models"),
        json: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || crate::bench::flag_value(&mut it, flag, USAGE);
        let num = |v: String| crate::bench::flag_num(flag, &v, USAGE);
        match flag.as_str() {
            "--model" => o.model = value()?,
            "--lengths" => {
                o.lengths = list(&value()?)
                    .into_iter()
                    .map(num)
                    .collect::<Result<_, _>>()?
            }
            "--iters" => o.iters = num(value()?)?.max(2),
            "--num-layers" => {
                let v = value()?;
                o.num_layers = v.parse().map_err(|e| format!("--num-layers {v}: {e}"))?
            }
            "--fine-tune-type" => o.fine_tune_type = value()?,
            "--ours" => o.ours = list(&value()?),
            "--mlx-lm" => o.theirs = list(&value()?),
            "--flash-block" => o.flash_block = num(value()?)?.max(1),
            "--segment-length" => o.segment_length = num(value()?)?.max(1),
            "--ce-chunk-size" => o.ce_chunk = num(value()?)?.max(1),
            "--memory-limit" => {
                let v = value()?;
                o.memory_limit_gb = match v.parse::<f64>() {
                    Ok(g) if g.is_finite() && g > 0.0 => g,
                    _ => return Err(format!("--memory-limit {v}: a positive number of GB")),
                }
            }
            "--timeout" => o.timeout_s = num(value()?)?.max(1) as u64,
            "--ours-bin" => o.ours_bin = Some(PathBuf::from(value()?)),
            "--models-dir" => o.models_dir = PathBuf::from(value()?),
            "--json" => o.json = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    for v in &o.ours {
        for part in v.split('+') {
            if ![
                "plain", "flash", "flashk", "sdpa", "ckpt", "seg", "ce", "lim",
            ]
            .contains(&part)
            {
                return Err(format!("unknown variant {part} in {v}\n{USAGE}"));
            }
        }
    }
    for v in &o.theirs {
        if !["plain", "ckpt"].contains(&v.as_str()) {
            return Err(format!("unknown mlx-lm variant {v}\n{USAGE}"));
        }
    }
    Ok(o)
}

/// `train.jsonl` and `valid.jsonl` whose rows are each well over `len` tokens long.
fn write_data(dir: &Path, len: usize) -> Result<(), String> {
    const WORDS: &[&str] = &[
        "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "red", "ball", "while",
        "birds", "sang", "over", "green", "hills", "near", "small", "rivers", "fish", "swim",
    ];
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let row = |seed: usize| {
        let text: Vec<&str> = (0..len + 16)
            .map(|i| WORDS[(i * 7 + seed * 13 + i * i) % WORDS.len()])
            .collect();
        json!({ "text": text.join(" ") }).to_string()
    };
    for (name, rows) in [("train.jsonl", 4), ("valid.jsonl", 1)] {
        let body: Vec<String> = (0..rows).map(row).collect();
        let path = dir.join(name);
        std::fs::write(&path, body.join("\n") + "\n")
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Copies the tiny test llama's tokenizer next to a bench model that has none.
fn ensure_tokenizer(model: &Path) -> Result<(), String> {
    let src = workspace_root().join("mlx-train/tests/models/dense");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if !model.join(f).is_file() {
            std::fs::copy(src.join(f), model.join(f))
                .map_err(|e| format!("copying {f} into {}: {e}", model.display()))?;
        }
    }
    Ok(())
}

/// One run's figures: step time (s) and peak memory (GB), or why it failed.
#[derive(Default, Clone)]
struct Figures {
    step_s: Option<f64>,
    peak_gb: Option<f64>,
    error: Option<String>,
    steps: Vec<f64>,
    /// The run's whole wall time (model load and every step).
    wall_s: f64,
}

/// Reads `Iter N: ... It/sec X, ... Peak mem Y GB` lines.
fn figures(stdout: &str) -> Figures {
    let mut f = Figures::default();
    let mut peak = 0f64;
    for line in stdout.lines().filter(|l| l.contains("Train loss")) {
        let field = |name: &str| -> Option<f64> {
            let rest = &line[line.find(name)? + name.len()..];
            rest.trim_start()
                .split(|c: char| c == ',' || c.is_whitespace())
                .next()?
                .parse()
                .ok()
        };
        let iter = line
            .strip_prefix("Iter ")
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(p) = field("Peak mem") {
            peak = peak.max(p);
        }
        if let (Some(i), Some(ips)) = (iter, field("It/sec")) {
            if i >= 2 && ips > 0.0 {
                f.steps.push(1.0 / ips);
            }
        }
    }
    if !f.steps.is_empty() {
        f.step_s = Some(median(&f.steps));
        f.peak_gb = Some(peak);
    }
    f
}

/// Runs `cmd` with its output in files under `scratch`, killed after `timeout_s` seconds.
fn run_one(mut cmd: Command, what: &str, scratch: &Path, timeout_s: u64) -> Figures {
    eprintln!("bench train: {what}");
    let failed = |e: String| Figures {
        error: Some(e),
        ..Figures::default()
    };
    let (out_path, err_path) = (scratch.join("run.stdout"), scratch.join("run.stderr"));
    let files = std::fs::create_dir_all(scratch).and_then(|_| {
        Ok((
            std::fs::File::create(&out_path)?,
            std::fs::File::create(&err_path)?,
        ))
    });
    let (fo, fe) = match files {
        Ok(f) => f,
        Err(e) => return failed(format!("{}: {e}", scratch.display())),
    };
    let started = Instant::now();
    let mut child = match cmd.stdin(Stdio::null()).stdout(fo).stderr(fe).spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("could not start: {e}")),
    };
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if started.elapsed().as_secs() >= timeout_s => {
                let _ = child.kill();
                timed_out = true;
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(200)),
            Err(_) => break None,
        }
    };
    let out = std::process::Output {
        status: status.unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            std::process::ExitStatus::from_raw(-1)
        }),
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut f = figures(&stdout);
    f.wall_s = started.elapsed().as_secs_f64();
    if !out.status.success() || f.step_s.is_none() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .chars()
            .take(160)
            .collect::<String>();
        f.error = Some(if timed_out {
            format!("killed after {timeout_s} s: {last}")
        } else {
            format!("{}: {last}", out.status)
        });
    }
    eprintln!(
        "bench train: {what}: {} s/step, peak {} GB, {:.0} s in all{}",
        f.step_s.map_or("-".into(), |s| format!("{s:.3}")),
        f.peak_gb.map_or("-".into(), |p| format!("{p:.3}")),
        f.wall_s,
        f.error
            .as_ref()
            .map_or(String::new(), |e| format!(" ({e})"))
    );
    f
}

fn common_args(model: &Path, data: &Path, len: usize, o: &Options, adapters: &Path) -> Vec<String> {
    [
        "--model",
        &model.display().to_string(),
        "--train",
        "--data",
        &data.display().to_string(),
        "--batch-size",
        "1",
        "--iters",
        &o.iters.to_string(),
        "--num-layers",
        &o.num_layers.to_string(),
        "--fine-tune-type",
        &o.fine_tune_type,
        "--max-seq-length",
        &len.to_string(),
        "--steps-per-report",
        "1",
        "--steps-per-eval",
        "1000000",
        "--val-batches",
        "1",
        "--save-every",
        "1000000",
        "--adapter-path",
        &adapters.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let o = parse(args)?;
    let started = Instant::now();
    let py = oracle::ensure()?;
    let load_before = loadavg();
    let ours_bin = match &o.ours_bin {
        Some(b) => b.clone(),
        None => {
            eprintln!("bench train: building mlx (--release)");
            let mut build = cargo();
            build.args(["build", "--quiet", "--release", "--package", "mlx-cli"]);
            let st = build.status().map_err(|e| format!("building mlx: {e}"))?;
            if !st.success() {
                return Err(format!("building mlx failed ({st})"));
            }
            workspace_root().join("target/release/mlx")
        }
    };
    let model = resolve_model_dir(&o.model, &o.models_dir, &py)?;
    ensure_tokenizer(&model)?;
    let scratch = o.models_dir.join("train-bench");
    let mut rows: Vec<(usize, String, Figures)> = Vec::new();
    for &len in &o.lengths {
        let data = scratch.join(format!("data-{len}"));
        write_data(&data, len)?;
        let adapters = scratch.join("adapters");
        for v in &o.theirs {
            let mut c = Command::new(&py);
            c.arg(workspace_root().join("xtask/oracle/bench_train_mlx_lm.py"))
                .args(common_args(&model, &data, len, &o, &adapters))
                .current_dir(workspace_root());
            if v == "ckpt" {
                c.arg("--grad-checkpoint");
            }
            let f = run_one(
                c,
                &format!("{len} tokens, mlx-lm {v}"),
                &scratch,
                o.timeout_s,
            );
            rows.push((len, format!("mlx-lm {v}"), f));
        }
        for v in &o.ours {
            let mut c = Command::new(&ours_bin);
            c.arg("train")
                .args(common_args(&model, &data, len, &o, &adapters))
                .current_dir(workspace_root());
            for part in v.split('+') {
                match part {
                    "flash" => {
                        c.args(["--flash-block", &o.flash_block.to_string()]);
                    }
                    "flashk" => {
                        c.args(["--flash-block", &o.flash_block.to_string()]);
                        c.args(["--flash-kernel", "cuda"]);
                    }
                    "sdpa" => {
                        c.args(["--flash-kernel", "sdpa"]);
                    }
                    "lim" => {
                        c.args(["--memory-limit", &o.memory_limit_gb.to_string()]);
                    }
                    "ckpt" => {
                        c.arg("--grad-checkpoint");
                    }
                    "seg" => {
                        c.args(["--segment-length", &o.segment_length.to_string()]);
                    }
                    "ce" => {
                        c.args(["--ce-chunk-size", &o.ce_chunk.to_string()]);
                    }
                    _ => {}
                }
            }
            let f = run_one(c, &format!("{len} tokens, ours {v}"), &scratch, o.timeout_s);
            rows.push((len, format!("ours {v}"), f));
        }
    }

    println!(
        "| tokens | run | s/step | peak GB | step vs mlx-lm plain | step vs mlx-lm ckpt | note |\n|---:|---|---:|---:|---:|---:|---|"
    );
    for (len, name, f) in &rows {
        let ratio = |base: &str| {
            let b = rows
                .iter()
                .find(|(l, n, _)| l == len && n == base)
                .and_then(|(_, _, f)| f.step_s);
            match (f.step_s, b) {
                (Some(s), Some(b)) => format!("{:.2}x", s / b),
                _ => "-".into(),
            }
        };
        println!(
            "| {len} | {name} | {} | {} | {} | {} | {} |",
            f.step_s.map_or("-".into(), |s| format!("{s:.3}")),
            f.peak_gb.map_or("-".into(), |p| format!("{p:.3}")),
            ratio("mlx-lm plain"),
            ratio("mlx-lm ckpt"),
            f.error.clone().unwrap_or_default().replace('|', "/")
        );
    }
    println!();
    println!(
        "model {}, batch 1, {} on {} layers, {} steps per run; \
         s/step = median of 1 / It/sec over steps 2..{}; peak = MLX's peak memory of the \
         process (weights included); flash block {}, segment {}, CE chunk {}, memory limit \
         (lim) {} GB; runs killed after {} s.",
        o.model,
        match o.fine_tune_type.as_str() {
            "full" => "full fine-tuning".to_string(),
            t => format!("{} rank 8 (mlx-lm's defaults)", t.to_uppercase()),
        },
        o.num_layers,
        o.iters,
        o.iters,
        o.flash_block,
        o.segment_length,
        o.ce_chunk,
        o.memory_limit_gb,
        o.timeout_s
    );
    println!(
        "load average (1/5/15 min) before: {load_before}, after: {}; total {:.0} s.",
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &o.json {
        let runs: Vec<Value> = rows
            .iter()
            .map(|(len, name, f)| {
                json!({"tokens": len, "run": name, "step_s": f.step_s, "peak_gb": f.peak_gb,
                       "steps": f.steps, "wall_s": f.wall_s, "error": f.error})
            })
            .collect();
        std::fs::write(
            path,
            format!("{}\n", json!({ "model": o.model, "runs": runs })),
        )
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}
