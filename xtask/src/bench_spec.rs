//! `cargo xtask bench spec [--rounds R] [--ngram N] [--draft K] [--max-tokens M] [--threads T]
//! [--out FILE.md]`: prompt-lookup speculation against plain greedy decoding on the CPU
//! decoder, real SmolLM2-135M-Instruct, same run, alternating (`mlx-engine/examples/
//! spec_bench.rs` in a release build). Writes the table to `results/bench/spec-cpu.md` unless
//! `--out` says otherwise.

use crate::bench::cargo;
use crate::bindings::workspace_root;

pub fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "cargo xtask bench spec [--rounds R] [--ngram N] [--draft K] [--max-tokens M] \
             [--threads T] [--out FILE.md]"
        );
        return Ok(());
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
