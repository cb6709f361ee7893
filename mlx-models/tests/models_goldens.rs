//! L1 against mlx-lm 0.32.2 for the mixture-of-experts and hybrid rows: tiny seeded models
//! (written with their goldens by `cargo xtask goldens models` from mlx-lm's own model
//! classes) give logits equal to mlx-lm's to the last bit: prefill (SwitchGLU's sorted path),
//! every cached decode step (the unsorted path), and a cache-less forward.

use crate::model_check;

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_core::testing::Goldens;
use mlx_models::config::ModelConfig;
use mlx_models::load::{load_model_dir, load_weights, LoadOptions};
use mlx_models::models::{qwen3_next, LanguageModel};
use mlx_models::weights::Weights;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn golden(name: &str) -> PathBuf {
    root()
        .join("goldens")
        .join(format!("models_{name}.safetensors"))
}

fn check_model(name: &str) -> Result<(), String> {
    model_check::check_model_full(&root().join("models").join(name), &golden(name))
}

fn check_loaded(name: &str, model: &dyn LanguageModel) -> Result<(), String> {
    model_check::check_loaded_full(model, &golden(name))
}

fn check_all(models: &[&str]) {
    model_check::check_all(models, check_model);
}

#[test]
fn moe_rows_match_mlx_lm_bit_for_bit() {
    check_all(&[
        "qwen3_moe",
        "qwen3_moe_q4",
        "qwen3_moe_q8_bf16",
        "qwen2_moe",
        "mixtral",
        "olmoe",
        "olmoe_q8",
        "gpt_oss",
        "gpt_oss_q4",
        "gpt_oss_q8_bf16",
    ]);
}

#[test]
fn gated_deltanet_hybrids_match_mlx_lm_bit_for_bit() {
    check_all(&[
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_bf16",
        "qwen3_5_q4",
        "qwen3_5_moe",
    ]);
}

#[test]
fn lfm2_matches_mlx_lm_bit_for_bit() {
    check_all(&["lfm2", "lfm2_bf16"]);
}

#[test]
fn gemma4_text_matches_mlx_lm_bit_for_bit() {
    check_all(&["gemma4_text", "gemma4_text_bf16", "gemma4_text_kv_eq"]);
}

/// The kernel path (MLX's fused `fast::gated_delta_update`) on the CPU backend gives the same
/// bits as mlx-lm's plain-ops path in float32, so it passes the same goldens. (In bf16 it
/// rounds differently: `gated_delta_parity.rs` bounds that.)
#[test]
fn fused_gated_delta_is_bit_identical_on_cpu_in_f32() {
    let mut failures = Vec::new();
    for name in ["qwen3_next", "qwen3_5", "qwen3_5_moe"] {
        let dir = root().join("models").join(name);
        let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let mut w = Weights::new(load_weights(&dir).unwrap(), None, None);
        let mut model = qwen3_next::Model::load(&config, &mut w).unwrap();
        w.finish().unwrap();
        model.use_fast_gated_delta(true);
        if let Err(e) = check_loaded(name, &model) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Sentence embeddings (last-token pooling, L2-normalised) equal the oracle's, built from
/// mlx-lm's inner model, bit for bit.
#[test]
fn embeddings_match_bit_for_bit() {
    use mlx_models::embed::embed;
    let mut failures = Vec::new();
    for name in ["qwen3_moe", "qwen3_5", "lfm2", "gemma4_text"] {
        let (model, _) =
            load_model_dir(&root().join("models").join(name), &LoadOptions::default()).unwrap();
        let g = Goldens::load(root().join(format!("goldens/models_{name}.safetensors"))).unwrap();
        let case = g.case("embed").unwrap();
        let texts: Vec<Vec<u32>> = (0..2)
            .map(|i| {
                let ids = case.input(i).unwrap().to_vec::<i32>().unwrap();
                ids.into_iter().map(|t| t as u32).collect()
            })
            .collect();
        let got = embed(model.as_ref(), &texts).unwrap();
        if let Err(e) = case.check(&[got]) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `embed` checks what it is given before the model sees it, and names the model type when
/// the architecture has no hidden-state entry.
#[test]
fn embed_errors_are_clear() {
    use mlx_models::embed::embed;
    let (model, _) =
        load_model_dir(&root().join("models/qwen3_moe"), &LoadOptions::default()).unwrap();
    let err = |r: mlx_models::Result<Array>| r.unwrap_err().to_string();
    assert!(err(embed(model.as_ref(), &[])).contains("no texts"));
    assert!(err(embed(model.as_ref(), &[vec![1], vec![]])).contains("text 1 has no tokens"));
    let e = err(embed(model.as_ref(), &[vec![1, 128]]));
    assert!(
        e.contains("token id 128") && e.contains("vocabulary"),
        "{e}"
    );

    /// A model without `forward_hidden`.
    struct NoHidden;
    impl LanguageModel for NoHidden {
        fn forward(
            &self,
            inputs: &Array,
            _caches: Option<&mut [Box<dyn mlx_cache::Cache>]>,
        ) -> mlx_models::Result<Array> {
            Ok(inputs.clone())
        }
        fn make_cache(&self) -> Vec<Box<dyn mlx_cache::Cache>> {
            Vec::new()
        }
        fn defines_make_cache(&self) -> bool {
            false
        }
        fn num_layers(&self) -> usize {
            0
        }
        fn model_type(&self) -> &str {
            "no_hidden_type"
        }
        fn vocab_size(&self) -> i32 {
            8
        }
    }
    let e = err(embed(&NoHidden, &[vec![1]]));
    assert!(e.contains("`no_hidden_type`"), "{e}");
}
