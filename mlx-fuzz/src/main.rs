//! `mlx-fuzz [TARGET|all] [--runs N] [--seed S] [--start I] [--seconds T] [--work DIR]`: runs
//! the fuzz targets and prints, per target, executions and findings. Exits 1 on a finding.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use mlx_fuzz::targets::TARGETS;
use mlx_fuzz::{run, RunOptions};

const USAGE: &str =
    "usage: mlx-fuzz [TARGET|all] [--runs N] [--seed S] [--start I] [--seconds T] [--work DIR]";

fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut opts = RunOptions {
        progress_every: 10_000,
        ..Default::default()
    };
    let mut target = "all".to_string();
    let mut work = PathBuf::from("target/fuzz");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = |what: &str| -> u64 {
            match it.next().and_then(|v| v.parse().ok()) {
                Some(v) => v,
                None => {
                    eprintln!("{what} needs a number\n{USAGE}");
                    std::process::exit(2)
                }
            }
        };
        match a.as_str() {
            "--runs" => opts.runs = num("--runs"),
            "--seed" => opts.seed = num("--seed"),
            "--start" => opts.start = num("--start"),
            "--seconds" => opts.time_limit = Some(Duration::from_secs(num("--seconds"))),
            "--work" => match it.next() {
                Some(d) => work = PathBuf::from(d),
                None => {
                    eprintln!("--work needs a directory\n{USAGE}");
                    std::process::exit(2)
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}\ntargets: {}", TARGETS.join(", "));
                return;
            }
            t if !t.starts_with('-') => target = t.to_string(),
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                std::process::exit(2)
            }
        }
    }
    let targets: Vec<&str> = if target == "all" {
        TARGETS.to_vec()
    } else {
        vec![target.as_str()]
    };
    let mut found = false;
    for t in targets {
        match run(t, &work, &opts) {
            Ok(r) => {
                println!("{r}");
                for (i, m) in &r.findings {
                    println!("  input {i} (seed {}): {m}", opts.seed);
                }
                found |= !r.findings.is_empty();
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2)
            }
        }
    }
    if found {
        std::process::exit(1);
    }
}
