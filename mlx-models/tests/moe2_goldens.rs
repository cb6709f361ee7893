//! L1 against mlx-lm 0.32.2 for the later mixture-of-experts rows of issue #32 (granitemoe,
//! minimax under both its names, ernie4_5_moe): tiny seeded models, in float32 and 4-bit,
//! written with their goldens by `cargo xtask goldens moe2` from mlx-lm's own model classes,
//! give logits equal to mlx-lm's to the last bit: prefill (SwitchGLU's sorted path), every
//! cached decode step (the unsorted path), and a cache-less forward.

use std::path::PathBuf;

use mlx_core::testing::Goldens;
use mlx_models::load::{load_model_dir, LoadOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn check_model(name: &str) -> Result<(), String> {
    let s = |e: &dyn std::fmt::Display| e.to_string();
    let (model, _) = load_model_dir(
        &root().join("models/moe2").join(name),
        &LoadOptions::default(),
    )
    .map_err(|e| s(&e))?;
    let g = Goldens::load(root().join(format!("goldens/moe2_{name}.safetensors")))
        .map_err(|e| s(&e))?;
    let mut caches = model.make_cache();
    let prefill = g.case("prefill").map_err(|e| s(&e))?;
    let input = prefill.input(0).map_err(|e| s(&e))?;
    prefill.check(&[model.forward(input, Some(&mut caches)).map_err(|e| s(&e))?])?;
    let mut fed = Vec::new();
    for step in 0.. {
        let Ok(case) = g.case(&format!("step{step}")) else {
            break;
        };
        let input = case.input(0).map_err(|e| s(&e))?;
        fed.push(input.to_vec::<i32>().map_err(|e| s(&e))?[0]);
        case.check(&[model.forward(input, Some(&mut caches)).map_err(|e| s(&e))?])?;
    }
    let full = g.case("full").map_err(|e| s(&e))?;
    let input = full.input(0).map_err(|e| s(&e))?;
    full.check(&[model.forward(input, None).map_err(|e| s(&e))?])?;
    let greedy: Vec<i32> = g.metadata()["greedy"]
        .split(',')
        .map(|x| x.parse().map_err(|_| format!("bad greedy id {x}")))
        .collect::<Result<_, _>>()?;
    if fed != greedy {
        return Err(format!("greedy ids {fed:?} vs {greedy:?}"));
    }
    Ok(())
}

fn check_all(models: &[&str]) {
    let failures: Vec<String> = models
        .iter()
        .filter_map(|m| check_model(m).err().map(|e| format!("{m}: {e}")))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} models differ:\n{}",
        failures.len(),
        models.len(),
        failures.join("\n")
    );
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
