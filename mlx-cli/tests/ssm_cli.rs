//! Issue #32's state-space family through the CLI: on each tiny seeded fixture of
//! `xtask/oracle/goldens_ssm.py` (mlx-models/tests/models/ssm/, in its stored dtype),
//! `mlx generate --model DIR --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints
//! mlx-lm 0.32.2's `generate_step` greedy ids, chosen log-probabilities and per-step top-5 ids
//! and log-probabilities exactly (float32 bit patterns compared). Golden:
//! `mlx-cli/tests/goldens/cli_ssm.json` (`cargo xtask goldens ssm`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_ssm.json")).unwrap(),
    )
    .unwrap()
}

/// A float printed by the CLI (an f32 widened to f64) as its float32 bit pattern.
fn f32_bits(v: &Value) -> Option<u32> {
    Some((v.as_f64()? as f32).to_bits())
}

/// The fixture copied into `work` with the word-level tokenizer beside it.
fn prepare(fixtures: &Path, name: &str, work: &Path) -> Result<PathBuf, String> {
    let dir = work.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let tok = here().join("tests/models/wordlevel");
    for (from, file) in [
        (fixtures.join(name), "config.json"),
        (fixtures.join(name), "model.safetensors"),
        (tok.clone(), "tokenizer.json"),
        (tok.clone(), "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(file), dir.join(file))
            .map_err(|e| format!("copying {}: {e}", from.join(file).display()))?;
    }
    Ok(dir)
}

fn check(fixtures: &Path, name: &str, case: &Value, work: &Path) -> Result<(), String> {
    let dir = prepare(fixtures, name, work)?;
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

/// Runs the golden's cases `names` (each test names its type's fixtures; together they cover
/// every case of the golden, see [`every_golden_case_is_run`]).
fn check_cases(test: &str, names: &[&str]) {
    let g = golden();
    let fixtures = here()
        .join("../mlx-models/tests/models")
        .join(g["fixture_dir"].as_str().unwrap());
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(test);
    std::fs::remove_dir_all(&work).ok();
    let cases: Vec<(&String, &Value)> = g["cases"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(n, _)| names.contains(&n.as_str()))
        .collect();
    assert_eq!(cases.len(), names.len(), "golden cases for {names:?}");
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(name, case)| {
            check(&fixtures, name, case, &work)
                .err()
                .map(|e| format!("{name}: {e}"))
        })
        .collect();
    std::fs::remove_dir_all(&work).ok();
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ from mlx-lm:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

const MAMBA: &[&str] = &["mamba", "mamba_q4", "falcon_mamba_bf16"];
const MAMBA2: &[&str] = &["mamba2", "mamba2_q4", "mamba2_bf16"];
const NEMOTRON_H: &[&str] = &["nemotron_h", "nemotron_h_q4", "nemotron_h_bf16"];
const JAMBA: &[&str] = &["jamba", "jamba_q4", "jamba_bf16"];
const BAICHUAN_M1: &[&str] = &["baichuan_m1", "baichuan_m1_q4", "baichuan_m1_bf16"];
const OLMO_HYBRID: &[&str] = &["olmo_hybrid", "olmo_hybrid_q4", "olmo_hybrid_bf16"];
const FALCON_H1: &[&str] = &["falcon_h1", "falcon_h1_q4", "falcon_h1_bf16"];
const GRANITE: &[&str] = &[
    "granitemoehybrid",
    "granitemoehybrid_q4",
    "granitemoehybrid_bf16",
];

#[test]
fn every_golden_case_is_run() {
    let g = golden();
    let mut cases: Vec<&str> = g["cases"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut run: Vec<&str> = [
        MAMBA,
        MAMBA2,
        NEMOTRON_H,
        GRANITE,
        FALCON_H1,
        JAMBA,
        BAICHUAN_M1,
        OLMO_HYBRID,
    ]
    .concat();
    cases.sort_unstable();
    run.sort_unstable();
    assert_eq!(cases, run);
}

#[test]
fn mamba_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_mamba", MAMBA);
}

#[test]
fn mamba2_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_mamba2", MAMBA2);
}

#[test]
fn nemotron_h_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_nemotron_h", NEMOTRON_H);
}

#[test]
fn granitemoehybrid_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_granitemoehybrid", GRANITE);
}

#[test]
fn falcon_h1_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_falcon_h1", FALCON_H1);
}

#[test]
fn jamba_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_jamba", JAMBA);
}

#[test]
fn baichuan_m1_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_baichuan_m1", BAICHUAN_M1);
}

#[test]
fn olmo_hybrid_reproduces_mlx_lm_top5_through_the_cli() {
    check_cases("ssm_cli_olmo_hybrid", OLMO_HYBRID);
}
