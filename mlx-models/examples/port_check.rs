//! This project's side of `cargo xtask port-check DIR`: runs the model in DIR through mlx-lm
//! (`xtask/oracle/port_check.py`, in the oracle venv) and through ours, layer by layer, and
//! names the first layer and sub-step whose hidden state differs, so adding a row to the
//! descriptor table is a short loop.
//!
//! ```text
//! cargo run -p mlx-models --example port_check -- DIR [--ids 1,17,42,...]
//! ```
//!
//! The oracle's python is `$MLX_ORACLE_VENV/bin/python`, else `target/oracle-venv/bin/python`
//! (`cargo xtask oracle` installs it). Taps, in execution order: `layers.<i>.in`, `.attn_in`
//! (the normed input of attention), `.attn`, `.mlp_in`, `.mlp`, `.out`, then `logits`. Exit
//! status 0 when every tap is bit-identical, 1 at the first difference, 2 on errors.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use mlx_core::io::load_safetensors;
use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn oracle_python() -> PathBuf {
    match std::env::var_os("MLX_ORACLE_VENV") {
        Some(v) => PathBuf::from(v).join("bin/python"),
        None => repo_root().join("target/oracle-venv/bin/python"),
    }
}

/// `(max |a - b|, equal bits)` of two arrays of the same shape, compared in f32.
fn compare(a: &Array, b: &Array) -> Result<(f32, bool), String> {
    if a.shape() != b.shape() {
        return Err(format!("shape {:?} vs {:?}", a.shape(), b.shape()));
    }
    if a.dtype() != b.dtype() {
        return Err(format!("dtype {:?} vs {:?}", a.dtype(), b.dtype()));
    }
    let equal =
        a.to_bytes().map_err(|e| e.to_string())? == b.to_bytes().map_err(|e| e.to_string())?;
    let f = |x: &Array| -> Result<Vec<f32>, String> {
        x.astype(Dtype::Float32)
            .and_then(|y| y.to_vec::<f32>())
            .map_err(|e| e.to_string())
    };
    let max = f(a)?
        .iter()
        .zip(f(b)?.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    Ok((max, equal))
}

fn run(dir: &Path, ids: &[i32]) -> Result<bool, String> {
    let out = std::env::temp_dir().join(format!("port_check_{}.safetensors", std::process::id()));
    let ids_arg = ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    let script = repo_root().join("xtask/oracle/port_check.py");
    let status = Command::new(oracle_python())
        .arg(&script)
        .arg(dir)
        .arg(&out)
        .arg(&ids_arg)
        .status()
        .map_err(|e| format!("could not run {}: {e}", oracle_python().display()))?;
    if !status.success() {
        return Err(format!("{} failed ({status})", script.display()));
    }
    let (oracle, meta) = load_safetensors(&out, None).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    let order: Vec<String> = meta
        .get("order")
        .map(|o| o.split(',').map(str::to_string).collect())
        .unwrap_or_default();

    let (model, _) = load_model_dir(dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    let input = Array::from_slice(ids, &[1, ids.len() as i32]).map_err(|e| e.to_string())?;
    let ours: BTreeMap<String, Array> = model
        .trace(&input)
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();

    for name in &order {
        let Some(want) = oracle.get(name) else {
            continue;
        };
        let Some(got) = ours.get(name) else {
            println!("{name}: recorded by mlx-lm, not by ours (the block's structure differs)");
            return Ok(false);
        };
        match compare(got, want) {
            Ok((_, true)) => {}
            Ok((max, false)) => {
                println!(
                    "first difference: {name} (max |ours - mlx-lm| = {max:e}); every earlier \
                     tap is bit-identical"
                );
                return Ok(false);
            }
            Err(e) => {
                println!("first difference: {name}: {e}");
                return Ok(false);
            }
        }
    }
    println!(
        "all {} taps bit-identical to mlx-lm ({} layers, logits included)",
        order.len(),
        model.num_layers()
    );
    Ok(true)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut dir = None;
    let mut ids: Vec<i32> = vec![1, 17, 42, 5, 9, 33, 2, 7];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ids" => match it.next().map(|s| {
                s.split(',')
                    .map(|x| x.trim().parse::<i32>())
                    .collect::<Result<Vec<_>, _>>()
            }) {
                Some(Ok(v)) if !v.is_empty() => ids = v,
                _ => {
                    eprintln!("port_check: --ids needs a comma-separated list of token ids");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("usage: port_check DIR [--ids 1,17,42,...]");
                return ExitCode::SUCCESS;
            }
            other if dir.is_none() => dir = Some(PathBuf::from(other)),
            other => {
                eprintln!("port_check: unexpected argument `{other}`");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("usage: port_check DIR [--ids 1,17,42,...]");
        return ExitCode::from(2);
    };
    match run(&dir, &ids) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("port_check: {e}");
            ExitCode::from(2)
        }
    }
}
