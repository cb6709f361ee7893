//! L1 against mlx-lm 0.32.2 for the state-space family (issue #32): tiny seeded models written
//! with their goldens by `cargo xtask goldens ssm` (`xtask/oracle/goldens_ssm.py`, mlx-lm's own
//! model classes, `quantize_model` and `load_model`) give logits equal to mlx-lm's to the last
//! bit: prefill, every cached decode step, a chunked prefill with the cache state evaluated
//! after each chunk (generate_step's way) then the same steps, and a cache-less forward. Then
//! the recurrent caches' rollback contract: decoding k tokens, trimming j and decoding on
//! equals decoding the k - j tokens directly, bit for bit (mlx-lm cannot trim them at all).

use crate::model_check;

use std::path::PathBuf;

use mlx_cache::{trim_prompt_cache, Cache};
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::models::LanguageModel;
use proptest::prelude::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn golden(name: &str) -> PathBuf {
    root()
        .join("goldens/ssm")
        .join(format!("{name}.safetensors"))
}

fn check_model(name: &str) -> Result<(), String> {
    model_check::check_model_full(&root().join("models/ssm").join(name), &golden(name))
}

fn check_all(models: &[&str]) {
    model_check::check_all(models, check_model);
}

fn load(name: &str) -> Box<dyn LanguageModel> {
    load_model_dir(
        &root().join("models/ssm").join(name),
        &LoadOptions::default(),
    )
    .unwrap()
    .0
}

#[test]
fn mamba_matches_mlx_lm_bit_for_bit() {
    check_all(&["mamba", "mamba_q4", "falcon_mamba_bf16"]);
}

#[test]
fn mamba2_matches_mlx_lm_bit_for_bit() {
    check_all(&["mamba2", "mamba2_q4", "mamba2_bf16"]);
}

fn step(model: &dyn LanguageModel, caches: &mut [Box<dyn Cache>], ids: &[i32]) -> Array {
    let x = Array::from_slice(ids, &[1, ids.len() as i32]).unwrap();
    let y = model.forward(&x, Some(caches)).unwrap();
    y.eval().unwrap();
    y
}

const MAX_ROLLBACK: usize = 4;

/// Decode `decoded` one at a time (or, with `verify`, as one call, the way speculative
/// decoding verifies drafts), trim `back`, decode `then`; compare with decoding the kept
/// tokens directly.
fn check_rollback(
    model: &dyn LanguageModel,
    decoded: &[i32],
    back: usize,
    then: &[i32],
    verify: bool,
) -> Result<(), TestCaseError> {
    let prompt = [3, 17, 99, 5, 42, 7];
    let mut caches = model.make_cache_with_rollback(MAX_ROLLBACK);
    step(model, &mut caches, &prompt);
    if verify {
        step(model, &mut caches, decoded);
    } else {
        for &t in decoded {
            step(model, &mut caches, &[t]);
        }
    }
    prop_assert_eq!(trim_prompt_cache(&mut caches, back), back);
    let kept = &decoded[..decoded.len() - back];
    let mut fresh = model.make_cache_with_rollback(MAX_ROLLBACK);
    step(model, &mut fresh, &prompt);
    if verify && !kept.is_empty() {
        step(model, &mut fresh, kept);
    } else if !verify {
        for &t in kept {
            step(model, &mut fresh, &[t]);
        }
    }
    for &t in then {
        let got = step(model, &mut caches, &[t]);
        let want = step(model, &mut fresh, &[t]);
        assert_bit_equal(&got, &want).map_err(TestCaseError::fail)?;
    }
    Ok(())
}

fn rollback_property(name: &str) {
    let model = load(name);
    let vocab = model.vocab_size();
    let cfg = ProptestConfig {
        cases: 4,
        ..ProptestConfig::default()
    };
    proptest!(cfg, |(
        decoded in prop::collection::vec(0..vocab, 1..=MAX_ROLLBACK),
        back_frac in 0.0f64..=1.0,
        then in prop::collection::vec(0..vocab, 1..3),
        verify in any::<bool>(),
    )| {
        let back = ((decoded.len() as f64) * back_frac).round() as usize;
        check_rollback(model.as_ref(), &decoded, back, &then, verify)?;
    });
    // Without history the recurrent caches refuse any trim, as mlx-lm's do.
    let mut caches = model.make_cache();
    step(model.as_ref(), &mut caches, &[1, 2, 3]);
    assert_eq!(trim_prompt_cache(&mut caches, 1), 0);
}

#[test]
fn mamba_rolls_back_bit_for_bit() {
    rollback_property("mamba");
}

#[test]
fn mamba2_rolls_back_bit_for_bit() {
    rollback_property("mamba2");
}

#[test]
fn nemotron_h_matches_mlx_lm_bit_for_bit() {
    check_all(&["nemotron_h", "nemotron_h_q4", "nemotron_h_bf16"]);
}

#[test]
fn nemotron_h_moe_blocks_match_mlx_lm_bit_for_bit() {
    check_all(&["nemotron_h_moe", "nemotron_h_moe_q4"]);
}

#[test]
fn nemotron_h_rolls_back_bit_for_bit() {
    rollback_property("nemotron_h");
}

#[test]
fn granitemoehybrid_matches_mlx_lm_bit_for_bit() {
    check_all(&[
        "granitemoehybrid",
        "granitemoehybrid_q4",
        "granitemoehybrid_bf16",
    ]);
}

#[test]
fn granitemoehybrid_rolls_back_bit_for_bit() {
    rollback_property("granitemoehybrid_bf16");
}

#[test]
fn falcon_h1_matches_mlx_lm_bit_for_bit() {
    check_all(&["falcon_h1", "falcon_h1_q4", "falcon_h1_bf16"]);
}

#[test]
fn falcon_h1_rolls_back_bit_for_bit() {
    rollback_property("falcon_h1");
}

#[test]
fn jamba_matches_mlx_lm_bit_for_bit() {
    check_all(&["jamba", "jamba_q4", "jamba_bf16"]);
}

#[test]
fn jamba_rolls_back_bit_for_bit() {
    rollback_property("jamba");
}

#[test]
fn baichuan_m1_matches_mlx_lm_bit_for_bit() {
    check_all(&["baichuan_m1", "baichuan_m1_q4", "baichuan_m1_bf16"]);
}

#[test]
fn baichuan_m1_rolls_back_bit_for_bit() {
    rollback_property("baichuan_m1");
}

#[test]
fn olmo_hybrid_matches_mlx_lm_bit_for_bit() {
    check_all(&["olmo_hybrid", "olmo_hybrid_q4", "olmo_hybrid_bf16"]);
}

#[test]
fn olmo_hybrid_rolls_back_bit_for_bit() {
    rollback_property("olmo_hybrid");
}

#[test]
fn a_config_written_by_python_with_infinity_loads() {
    // transformers writes Mamba 2's default `time_step_limit` as `[0.0, Infinity]`.
    let src = root().join("models/ssm/mamba2");
    let dir = std::env::temp_dir().join(format!("mlx_ssm_inf_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    v["time_step_limit"] = serde_json::json!("__LIMIT__");
    let text = serde_json::to_string_pretty(&v)
        .unwrap()
        .replace("\"__LIMIT__\"", "[0.0, Infinity]");
    std::fs::write(dir.join("config.json"), text).unwrap();
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let ids = Array::from_slice(&[1i32, 2, 3], &[1, 3]).unwrap();
    let logits = model.forward(&ids, None).unwrap();
    let all_finite = logits
        .astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|x| x.is_finite());
    assert!(all_finite);
    let _ = std::fs::remove_dir_all(&dir);
}
