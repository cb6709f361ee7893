//! L1 against mlx-lm 0.32.2 for the MLA / DeepSeek V3 family (issue #32): tiny seeded models
//! (written with their goldens by `cargo xtask goldens mla` from mlx-lm's own model classes)
//! give logits equal to mlx-lm's to the last bit: prefill (MLA's expanded branch, SwitchGLU's
//! sorted path), every cached decode step (MLA's absorbed one-token branch), and a cache-less
//! forward. The CLI side (greedy ids, top-5 log-probabilities) is in mlx-cli's
//! `models_cli.rs`, over `cli_models_mla.json`.

use crate::model_check;

use std::path::PathBuf;

use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::models::LanguageModel;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn golden(name: &str) -> PathBuf {
    root()
        .join("goldens")
        .join(format!("mla_{name}.safetensors"))
}

fn check_model(name: &str) -> Result<(), String> {
    model_check::check_model_full(&root().join("models/mla").join(name), &golden(name))
}

fn check_loaded(name: &str, model: &dyn LanguageModel) -> Result<(), String> {
    model_check::check_loaded_full(model, &golden(name))
}

fn check_all(models: &[&str]) {
    model_check::check_all(models, check_model);
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
fn longcat_flash_ngram_matches_mlx_lm_bit_for_bit() {
    check_all(&["longcat_flash_ngram", "longcat_flash_ngram_q4"]);
}

#[test]
fn kimi_vl_matches_mlx_lm_bit_for_bit() {
    check_all(&["kimi_vl", "kimi_vl_q4"]);
}

#[test]
fn glm4_moe_matches_mlx_lm_bit_for_bit() {
    check_all(&["glm4_moe", "glm4_moe_q4"]);
}

/// solar_open: glm4_moe's model under solar_open's arguments (their defaults in the f32 row).
#[test]
fn solar_open_matches_mlx_lm_bit_for_bit() {
    check_all(&["solar_open", "solar_open_q4"]);
}

#[test]
fn youtu_llm_matches_mlx_lm_bit_for_bit() {
    check_all(&["youtu_llm", "youtu_llm_q4"]);
}

#[test]
fn deepseek_v32_and_glm_moe_dsa_match_mlx_lm_bit_for_bit() {
    check_all(&["deepseek_v32", "deepseek_v32_q4", "glm_moe_dsa"]);
}

/// The fixture `name` rewritten as a Hugging Face checkpoint stores it: each attention's
/// `embed_q` / `unembed_out` joined back into one `kv_b_proj` and the stacked experts split per
/// expert (`experts.<e>.<proj>.weight`), in a temporary directory.
fn as_hf_checkpoint(name: &str, experts: i32) -> PathBuf {
    use mlx_core::prelude::*;
    let src = root().join("models").join("mla").join(name);
    let (arrays, _) = mlx_core::io::load_safetensors(src.join("model.safetensors"), None).unwrap();
    let mut out: Vec<(String, Array)> = Vec::new();
    for (k, v) in arrays.iter() {
        if let Some(p) = k.strip_suffix(".embed_q.weight") {
            // embed_q (H, kv_lora, nope) -> (H, nope, kv_lora); unembed_out (H, v, kv_lora).
            let wk = ops::swapaxes(v, -1, -2, None).unwrap();
            let wv = &arrays[&format!("{p}.unembed_out.weight")];
            let joined = ops::concatenate(&[&wk, wv], 1, None).unwrap();
            let kv_lora = joined.shape()[2];
            let kv_b = ops::reshape(&joined, &[-1, kv_lora], None).unwrap();
            out.push((format!("{p}.kv_b_proj.weight"), kv_b));
        } else if k.ends_with(".unembed_out.weight") {
            // Joined into kv_b_proj with its embed_q.
        } else if let Some((p, proj)) = k.split_once(".mlp.switch_mlp.") {
            for e in 0..experts {
                let one = ops::slice_axis(v, 0, e, e + 1, None).unwrap();
                let one = ops::squeeze(&one, &[0], None).unwrap();
                out.push((format!("{p}.mlp.experts.{e}.{proj}"), one));
            }
        } else {
            out.push((k.clone(), v.clone()));
        }
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("mla_hf_{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    mlx_core::io::save_safetensors(
        dir.join("model.safetensors"),
        out.iter().map(|(k, v)| (k.as_str(), v)),
        &Default::default(),
    )
    .unwrap();
    dir
}

/// `sanitize`: a checkpoint with `kv_b_proj` and per-expert weights loads into the same model
/// (the split and the stacking only move values, so the goldens still hold bit for bit).
#[test]
fn hf_checkpoints_with_kv_b_proj_and_per_expert_weights_load_and_match() {
    for name in ["deepseek_v3", "glm4_moe_lite"] {
        let dir = as_hf_checkpoint(name, 8);
        let (model, _) =
            load_model_dir(&dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_loaded(name, model.as_ref()).unwrap_or_else(|e| panic!("{name}: {e}"));
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Configs mlx-lm cannot run are refused with the field named, not a panic.
#[test]
fn bad_configs_name_the_field() {
    let cases = [
        (
            "deepseek_v2",
            "mla/deepseek_v2",
            "rope_scaling",
            "rope_scaling",
        ),
        (
            "deepseek_v3",
            "mla/deepseek_v3",
            "topk_method",
            "topk_method",
        ),
        ("minicpm3", "mla/minicpm3", "rope_scaling", "rope_scaling"),
        (
            "mistral4",
            "mla/mistral4",
            "rope_parameters",
            "rope_parameters",
        ),
        (
            "longcat_flash",
            "mla/longcat_flash",
            "mla_scale_q_lora",
            "mla_scale_q_lora",
        ),
    ];
    for (t, fixture, field, needle) in cases {
        let src = root().join("models").join(fixture);
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        let obj = config.as_object_mut().unwrap();
        match field {
            "topk_method" => {
                obj.insert(field.into(), serde_json::Value::from("greedy"));
            }
            "mla_scale_q_lora" => {
                obj.insert(field.into(), serde_json::Value::from(false));
            }
            _ => {
                obj.remove(field);
            }
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("mla_bad_{t}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        let err = match load_model_dir(&dir, &LoadOptions::default()) {
            Ok(_) => panic!("{t}: a config without a valid `{field}` loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(needle), "{t}: {err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
