//! One CLI golden case, as every family's CLI test checks it: the fixture (config and
//! weights) copied beside the word-level tokenizer, `mlx generate --prompt-ids ... --max-tokens
//! 8 --top-logprobs 5 --json --dtype stored`, and its greedy ids, chosen log-probabilities and
//! per-step top-5 compared with mlx-lm's `generate_step` as float32 bit patterns. Included by
//! path (`#[path = "support/cli_golden.rs"] mod cli_golden;`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A float printed by the CLI (an f32 widened to f64) as its float32 bit pattern.
fn f32_bits(v: &Value) -> Option<u32> {
    Some((v.as_f64()? as f32).to_bits())
}

/// The fixture `fixture` (a folder with config.json and model.safetensors) copied into
/// `work/<name>` with the word-level tokenizer beside it.
pub fn prepare(fixture: &Path, name: &str, work: &Path) -> Result<PathBuf, String> {
    let dir = work.join(name.replace('/', "_"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let tok = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/wordlevel");
    for (from, file) in [
        (fixture, "config.json"),
        (fixture, "model.safetensors"),
        (tok.as_path(), "tokenizer.json"),
        (tok.as_path(), "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(file), dir.join(file))
            .map_err(|e| format!("copying {}: {e}", from.join(file).display()))?;
    }
    Ok(dir)
}

/// Runs the CLI on the fixture `fixture` (golden case `name`) and compares with `case`; `Err`
/// describes the first difference.
pub fn check_case(fixture: &Path, name: &str, case: &Value, work: &Path) -> Result<(), String> {
    let dir = prepare(fixture, name, work)?;
    let ids: Vec<String> = case["prompt_ids"]
        .as_array()
        .ok_or("golden: prompt_ids")?
        .iter()
        .map(|v| v.to_string())
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args(["--prompt-ids", &ids.join(",")])
        .args(["--max-tokens", "8", "--top-logprobs", "5", "--json"])
        .args(["--dtype", "stored"])
        .output()
        .map_err(|e| format!("running mlx: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mlx failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let got: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("output is not JSON: {e}"))?;
    if got["tokens"] != case["tokens"] {
        return Err(format!(
            "greedy ids {} != mlx-lm's {}",
            got["tokens"], case["tokens"]
        ));
    }
    let steps = case["tokens"].as_array().map_or(0, Vec::len);
    for s in 0..steps {
        let ours = f32_bits(&got["logprobs"][s]);
        let want = case["logprobs"][s][1].as_u64().map(|b| b as u32);
        if ours.is_none() || ours != want {
            return Err(format!(
                "step {s}: chosen logprob {} != mlx-lm's {}",
                got["logprobs"][s], case["logprobs"][s][0]
            ));
        }
        let ours_top: Vec<(Option<u64>, Option<u32>)> = got["top_logprobs"][s]
            .as_array()
            .ok_or(format!("step {s}: no top_logprobs"))?
            .iter()
            .map(|p| (p[0].as_u64(), f32_bits(&p[1])))
            .collect();
        let want_top: Vec<(Option<u64>, Option<u32>)> = case["top_logprobs"][s]
            .as_array()
            .ok_or("golden: top_logprobs")?
            .iter()
            .map(|p| (p[0].as_u64(), p[2].as_u64().map(|b| b as u32)))
            .collect();
        if ours_top != want_top {
            return Err(format!(
                "step {s}: top-5 {} != mlx-lm's {}",
                got["top_logprobs"][s], case["top_logprobs"][s]
            ));
        }
    }
    Ok(())
}
