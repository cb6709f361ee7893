//! `cargo xtask <command>`: project automation.
//!
//! - `bindgen`: regenerate `mlx-sys/src/bindings.rs` from the shim's headers (needs libclang;
//!   nothing else in the build does). `bindgen --check` fails if the committed file is stale.
//! - `oracle [ARGS]`: makes sure the Python oracle (mlx-lm 0.32.2, mlx 0.32.4) is installed in
//!   `target/oracle-venv`, then runs its python with ARGS.
//! - `goldens [SET ...]`: regenerates golden files with `xtask/oracle/goldens_<SET>.py`.
//! - `port-check DIR [--ids 1,2,3]`: runs DIR's model through mlx-lm and through ours layer
//!   by layer and names the first layer and sub-step (norm, attention, MLP) that differs.
//!   Without DIR: every model type of mlx-lm's `models/` against `mlx models --json`; fails on
//!   a type neither served nor listed as not served with a reason.
//! - `bench [--quick | --full] [...]`: generation speed (prefill and decode tok/s) of this
//!   project against mlx-lm on the same models, alternating; see `bench.rs`.
//! - `fuzz [TARGET|all] [--runs N] [--seed S] [--start I] [--seconds T]`: the structure-aware
//!   fuzz targets of `mlx-fuzz` (release build, in-process, stable toolchain).
//! - `bench spec [...]`: `mlx generate` with and without prompt lookup (real SmolLM2-135M,
//!   a copy-edit prompt), alternating, ratio and `uptime` printed, table in
//!   `results/bench/spec-cli.md`; `--engine`: the engine-level loop
//!   (`results/bench/spec-cpu.md`).
//! - `bench serve [...]`: aggregate decode throughput of `mlx serve` against `mlx_lm.server`
//!   at 1, 4, 16 and 32 concurrent clients; see `bench_serve.rs`.
//! - `cpu-quality [--positions N] [--text FILE] [MODEL ...]`: the CPU decoder's quality gate
//!   (top-1 agreement and perplexity against the exact path) on the real SmolLM2-135M and
//!   Gemma 3 270M GGUFs.
//! - `bench train [...]`: LoRA training step time and peak memory of `mlx train` against
//!   `mlx_lm lora --train` at several sequence lengths; see `bench_train.rs`.
//! - `gpu pack|run`: builds the GPU recipe's bundle (`xtask/gpu/prepare_product*.sh`) under
//!   `.gpu/`, checks each device call's carried size, prints the device calls; see `gpu.rs`.
#![forbid(unsafe_code)]

mod bench;
mod bench_cpu;
mod bench_serve;
mod bench_spec;
mod bench_train;
mod bindings;
mod gpu;
mod oracle;
mod test_targets;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bindgen") => bindings::run(args.iter().any(|a| a == "--check")),
        Some("oracle") => oracle::python(&args[1..]),
        Some("goldens") => oracle::goldens(&args[1..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("train") => {
            bench_train::run(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("serve") => {
            bench_serve::run(&args[2..])
        }
        Some("bench") if args.get(1).map(String::as_str) == Some("spec") => {
            bench_spec::run(&args[2..])
        }
        Some("bench") => {
            let a = &args[1..];
            if a.iter().any(|a| a == "-h" || a == "--help") {
                println!("{}", bench::USAGE);
                Ok(())
            } else {
                bench::parse(a).and_then(|o| {
                    // Issue #31's CPU table: its own module (`bench.rs` parses the flags).
                    if o.device.as_deref() == Some("cpu") {
                        let started = std::time::Instant::now();
                        oracle::ensure().and_then(|py| bench_cpu::run(&o, &py, started))
                    } else {
                        bench::run(o)
                    }
                })
            }
        }
        Some("port-check") => oracle::port_check(&args[1..]),
        Some("fuzz") => fuzz(&args[1..]),
        Some("cpu-quality") => cpu_quality(&args[1..]),
        Some("gpu") => gpu::run(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask bindgen [--check] | oracle [ARGS] | goldens [SET ...] \
                 | port-check [DIR [--ids 1,2,3]] | bench [--quick | --full] [--help] \
                 | bench serve [--help] | bench spec [--help] | bench train [--help] | fuzz [TARGET|all] [--runs N] [--seed S] \
                 | cpu-quality [--positions N] [--text FILE] [smollm2] [gemma3] \
                 | gpu pack|run [--help]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo run --release -p mlx-fuzz -- ARGS` from the workspace root (work files under
/// `target/fuzz`).
fn fuzz(args: &[String]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .current_dir(bindings::workspace_root())
        .args(["run", "--release", "-q", "-p", "mlx-fuzz", "--"])
        .args(args)
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("fuzzing found problems or failed ({status})"))
    }
}

/// `cargo xtask cpu-quality [--positions N] [--text FILE] [MODEL ...]`: the CPU decoder's
/// quality gate (`mlx-engine/examples/cpu_quality.rs`, release build) on the real models
/// (default: smollm2 and gemma3, 2,000 positions of the King James Genesis fixture). Too slow
/// for the test suite: the exact path's CPU prefill runs at a few tokens a second.
fn cpu_quality(args: &[String]) -> Result<(), String> {
    let usage = "usage: cargo xtask cpu-quality [--positions N] [--text FILE] [smollm2] [gemma3]";
    let root = bindings::workspace_root();
    let mut n = "2000".to_string();
    let mut text = root.join("mlx-engine/tests/fixtures/genesis_kjv.txt");
    let mut models = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--positions" => n = bench::flag_value(&mut it, a, usage)?,
            "--text" => text = bench::flag_value(&mut it, a, usage)?.into(),
            "smollm2" | "gemma3" => models.push(a.clone()),
            o => return Err(format!("unknown argument {o}\n{usage}")),
        }
    }
    bench::flag_num("--positions", &n, usage)?;
    if models.is_empty() {
        models = vec!["smollm2".into(), "gemma3".into()];
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut failed = Vec::new();
    for m in &models {
        let status = std::process::Command::new(&cargo)
            .current_dir(&root)
            .args(["run", "--release", "-q", "-p", "mlx-engine", "--example"])
            .args(["cpu_quality", "--", m])
            .arg(&text)
            .arg(&n)
            .status()
            .map_err(|e| format!("running cargo: {e}"))?;
        if !status.success() {
            failed.push(m.clone());
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("the quality gate failed on {}", failed.join(", ")))
    }
}
