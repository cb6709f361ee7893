//! Issue #32's later mixture-of-experts rows through the CLI: on each tiny seeded fixture of
//! `xtask/oracle/goldens_moe2.py` (mlx-models/tests/models/moe2/*, float32 and 4-bit),
//! `mlx generate --model DIR --prompt-ids ... --top-logprobs 5 --json --max-tokens 8` prints
//! mlx-lm 0.32.2's `generate_step` greedy ids, chosen log-probabilities and per-step top-5 ids
//! and log-probabilities exactly (float32 bit patterns compared).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::cli_golden;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(here().join("tests/goldens/cli_moe2.json")).unwrap(),
    )
    .unwrap()
}

/// Every fixture of `model_type`s `types` (as its config names them) against the golden.
fn check_types(types: &[&str]) {
    let golden = golden();
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("moe2_cli_{}", types[0]));
    std::fs::remove_dir_all(&work).ok();
    let models = here().join("../mlx-models/tests/models");
    let mut failures = Vec::new();
    let mut seen = 0;
    for (name, case) in golden["cases"].as_object().unwrap() {
        let config: Value = serde_json::from_str(
            &std::fs::read_to_string(models.join(name).join("config.json")).unwrap(),
        )
        .unwrap();
        if !types.contains(&config["model_type"].as_str().unwrap()) {
            continue;
        }
        seen += 1;
        if let Err(e) = cli_golden::check_case(&models.join(name), name, case, &work) {
            failures.push(format!("{name}: {e}"));
        }
    }
    std::fs::remove_dir_all(&work).ok();
    assert!(seen >= 2, "only {seen} fixtures of {types:?}");
    assert!(
        failures.is_empty(),
        "{} fixtures differ from mlx-lm:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn granitemoe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["granitemoe"]);
}

#[test]
fn minimax_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["minimax", "minimax_m2"]);
}

#[test]
fn ernie4_5_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["ernie4_5_moe"]);
}

#[test]
fn phimoe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["phimoe"]);
}

#[test]
fn klear_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["Klear"]);
}

#[test]
fn hunyuan_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["hunyuan"]);
}

#[test]
fn lfm2_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["lfm2_moe"]);
}

#[test]
fn dbrx_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["dbrx"]);
}

#[test]
fn llama4_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["llama4"]);
}

#[test]
fn mellum_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["mellum"]);
}

#[test]
fn exaone_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["exaone_moe"]);
}

#[test]
fn bailing_moe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["bailing_moe"]);
}

#[test]
fn afmoe_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["afmoe"]);
}

#[test]
fn laguna_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["laguna"]);
}

/// `mlx models` lists each of these types as served by a dedicated port.
#[test]
fn phixtral_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["phixtral"]);
}

#[test]
fn mimo_v2_flash_reproduces_mlx_lm_top5_through_the_cli() {
    check_types(&["mimo_v2_flash"]);
}

#[test]
fn mlx_models_lists_the_moe2_types() {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["models", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = listed.as_array().unwrap();
    for t in [
        "granitemoe",
        "minimax",
        "minimax_m2",
        "ernie4_5_moe",
        "phimoe",
        "Klear",
        "hunyuan",
        "lfm2_moe",
        "dbrx",
        "llama4",
        "mellum",
        "exaone_moe",
        "bailing_moe",
        "afmoe",
        "laguna",
        "phixtral",
        "mimo_v2_flash",
    ] {
        assert!(
            listed.iter().any(|e| e["model_type"] == t),
            "`mlx models` does not list {t}"
        );
    }
}
