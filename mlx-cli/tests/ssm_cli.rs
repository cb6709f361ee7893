//! Issue #32's state-space family through the CLI: on each tiny seeded fixture of
//! `xtask/oracle/goldens_ssm.py` (mlx-models/tests/models/ssm/, in its stored dtype),
//! `mlx generate --model DIR --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints
//! mlx-lm 0.32.2's `generate_step` greedy ids, chosen log-probabilities and per-step top-5 ids
//! and log-probabilities exactly (float32 bit patterns compared). Golden:
//! `mlx-cli/tests/goldens/cli_ssm.json` (`cargo xtask goldens ssm`).

use std::path::PathBuf;

use serde_json::Value;

use crate::cli_golden;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_ssm.json")).unwrap(),
    )
    .unwrap()
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
            cli_golden::check_case(&fixtures.join(name), name, case, &work)
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
const NEMOTRON_H: &[&str] = &[
    "nemotron_h",
    "nemotron_h_q4",
    "nemotron_h_bf16",
    "nemotron_h_moe",
    "nemotron_h_moe_q4",
];
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
