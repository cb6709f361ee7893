//! L1 against mlx-lm 0.32.2 for the MLA / DeepSeek V3 family (issue #32): tiny seeded models
//! (written with their goldens by `cargo xtask goldens mla` from mlx-lm's own model classes)
//! give logits equal to mlx-lm's to the last bit: prefill (MLA's expanded branch, SwitchGLU's
//! sorted path), every cached decode step (MLA's absorbed one-token branch), and a cache-less
//! forward. The CLI side (greedy ids, top-5 log-probabilities) is in mlx-cli's
//! `models_cli.rs`, over `cli_models_mla.json`.

use std::path::PathBuf;

use mlx_core::testing::Goldens;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::models::LanguageModel;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn check_loaded(name: &str, model: &dyn LanguageModel) -> Result<(), String> {
    let g = Goldens::load(
        root()
            .join("goldens")
            .join(format!("mla_{name}.safetensors")),
    )
    .map_err(|e| e.to_string())?;
    let err = |e: mlx_models::ModelError| e.to_string();
    let mut caches = model.make_cache();
    let prefill = g.case("prefill").map_err(|e| e.to_string())?;
    let input = prefill.input(0).map_err(|e| e.to_string())?;
    prefill
        .check(&[model.forward(input, Some(&mut caches)).map_err(err)?])
        .map_err(|e| format!("prefill: {e}"))?;
    let mut fed = Vec::new();
    for s in 0.. {
        let Ok(step) = g.case(&format!("step{s}")) else {
            break;
        };
        let input = step.input(0).map_err(|e| e.to_string())?;
        fed.push(input.to_vec::<i32>().map_err(|e| e.to_string())?[0]);
        step.check(&[model.forward(input, Some(&mut caches)).map_err(err)?])
            .map_err(|e| format!("step{s}: {e}"))?;
    }
    let full = g.case("full").map_err(|e| e.to_string())?;
    let input = full.input(0).map_err(|e| e.to_string())?;
    full.check(&[model.forward(input, None).map_err(err)?])
        .map_err(|e| format!("full: {e}"))?;
    let greedy: Vec<i32> = g.metadata()["greedy"]
        .split(',')
        .map(|x| x.parse().map_err(|_| format!("bad greedy id {x}")))
        .collect::<Result<_, _>>()?;
    if fed != greedy {
        return Err(format!("greedy ids {fed:?} vs {greedy:?}"));
    }
    Ok(())
}

fn check_model(name: &str) -> Result<(), String> {
    let dir = root().join("models").join("mla").join(name);
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    check_loaded(name, model.as_ref())
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
fn deepseek_v3_matches_mlx_lm_bit_for_bit() {
    check_all(&["deepseek_v3", "deepseek_v3_q8_bf16", "deepseek_v3_q4"]);
}

#[test]
fn kimi_k25_matches_mlx_lm_bit_for_bit() {
    check_all(&["kimi_k25", "kimi_k25_q4"]);
}

#[test]
fn glm4_moe_lite_matches_mlx_lm_bit_for_bit() {
    check_all(&["glm4_moe_lite", "glm4_moe_lite_q4"]);
}

#[test]
fn dots1_matches_mlx_lm_bit_for_bit() {
    check_all(&["dots1", "dots1_q4"]);
}

#[test]
fn deepseek_matches_mlx_lm_bit_for_bit() {
    check_all(&["deepseek", "deepseek_q4"]);
}

#[test]
fn deepseek_v2_matches_mlx_lm_bit_for_bit() {
    check_all(&["deepseek_v2", "deepseek_v2_q4"]);
}

#[test]
fn minicpm3_matches_mlx_lm_bit_for_bit() {
    check_all(&["minicpm3", "minicpm3_q4"]);
}

#[test]
fn mistral4_matches_mlx_lm_bit_for_bit() {
    check_all(&["mistral4", "mistral4_q4"]);
}

#[test]
fn longcat_flash_matches_mlx_lm_bit_for_bit() {
    check_all(&["longcat_flash", "longcat_flash_q4"]);
}

#[test]
fn deepseek_v32_and_glm_moe_dsa_match_mlx_lm_bit_for_bit() {
    check_all(&["deepseek_v32", "deepseek_v32_q4", "glm_moe_dsa"]);
}
