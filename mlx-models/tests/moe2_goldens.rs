//! L1 against mlx-lm 0.32.2 for the later mixture-of-experts rows of issue #32 (granitemoe,
//! minimax under both its names, ernie4_5_moe): tiny seeded models, in float32 and 4-bit,
//! written with their goldens by `cargo xtask goldens moe2` from mlx-lm's own model classes,
//! give logits equal to mlx-lm's to the last bit: prefill (SwitchGLU's sorted path), every
//! cached decode step (the unsorted path), and a cache-less forward.

use crate::model_check;

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn golden(name: &str) -> PathBuf {
    root()
        .join("goldens")
        .join(format!("moe2_{name}.safetensors"))
}

fn check_model(name: &str) -> Result<(), String> {
    model_check::check_model_full(&root().join("models/moe2").join(name), &golden(name))
}

fn check_all(models: &[&str]) {
    model_check::check_all(models, check_model);
}

#[test]
fn granitemoe_matches_mlx_lm_bit_for_bit() {
    check_all(&["granitemoe", "granitemoe_q4"]);
}

#[test]
fn minimax_matches_mlx_lm_bit_for_bit() {
    check_all(&["minimax", "minimax_m2_q4"]);
}

#[test]
fn ernie4_5_moe_matches_mlx_lm_bit_for_bit() {
    check_all(&["ernie4_5_moe", "ernie4_5_moe_q4"]);
}

#[test]
fn phimoe_matches_mlx_lm_bit_for_bit() {
    check_all(&["phimoe", "phimoe_q4"]);
}

#[test]
fn klear_matches_mlx_lm_bit_for_bit() {
    check_all(&["Klear", "Klear_q4"]);
}

#[test]
fn hunyuan_matches_mlx_lm_bit_for_bit() {
    check_all(&["hunyuan", "hunyuan_q4"]);
}

#[test]
fn lfm2_moe_matches_mlx_lm_bit_for_bit() {
    check_all(&["lfm2_moe", "lfm2_moe_q4"]);
}

#[test]
fn dbrx_matches_mlx_lm_bit_for_bit() {
    check_all(&["dbrx", "dbrx_q4"]);
}

#[test]
fn llama4_matches_mlx_lm_bit_for_bit() {
    check_all(&["llama4", "llama4_q4"]);
}

#[test]
fn mellum_matches_mlx_lm_bit_for_bit() {
    check_all(&["mellum", "mellum_q4"]);
}

#[test]
fn exaone_moe_matches_mlx_lm_bit_for_bit() {
    check_all(&["exaone_moe", "exaone_moe_q4"]);
}

#[test]
fn bailing_moe_matches_mlx_lm_bit_for_bit() {
    check_all(&["bailing_moe", "bailing_moe_q4"]);
}

#[test]
fn afmoe_matches_mlx_lm_bit_for_bit() {
    check_all(&["afmoe", "afmoe_q4"]);
}

#[test]
fn laguna_matches_mlx_lm_bit_for_bit() {
    check_all(&["laguna", "laguna_q4"]);
}

#[test]
fn phixtral_matches_mlx_lm_bit_for_bit() {
    check_all(&["phixtral", "phixtral_q4"]);
}

#[test]
fn mimo_v2_flash_matches_mlx_lm_bit_for_bit() {
    check_all(&["mimo_v2_flash", "mimo_v2_flash_q4"]);
}
