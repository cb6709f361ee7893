#![allow(dead_code)] // each test crate uses its own subset
//! The L1 check shared by the model golden tests: a model directory written by an oracle
//! script gives mlx-lm's logits to the last bit for the prefill, every cached decode step and
//! a cache-less forward, and so the same greedy ids.

use std::path::Path;

use mlx_core::testing::Goldens;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

pub fn check_model(model_dir: &Path, golden: &Path) -> Result<(), String> {
    let (model, _) =
        load_model_dir(model_dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    check_loaded(model.as_ref(), golden)
}

/// [`check_model`] for a model already loaded (e.g. from a GGUF file).
pub fn check_loaded(model: &dyn LanguageModel, golden: &Path) -> Result<(), String> {
    let g = Goldens::load(golden).map_err(|e| e.to_string())?;
    let mut caches = model.make_cache();
    let prefill = g.case("prefill").map_err(|e| e.to_string())?;
    let logits = model
        .forward(prefill.input(0).unwrap(), Some(&mut caches))
        .map_err(|e| e.to_string())?;
    prefill
        .check(&[logits])
        .map_err(|e| format!("prefill: {e}"))?;
    for s in 0.. {
        let Ok(step) = g.case(&format!("step{s}")) else {
            break;
        };
        let logits = model
            .forward(step.input(0).unwrap(), Some(&mut caches))
            .map_err(|e| e.to_string())?;
        step.check(&[logits]).map_err(|e| format!("step{s}: {e}"))?;
    }
    // Absent where mlx-lm cannot run a cache-less multi-token forward (OLMo 1).
    if let Ok(full) = g.case("full") {
        let logits = model
            .forward(full.input(0).unwrap(), None)
            .map_err(|e| e.to_string())?;
        full.check(&[logits]).map_err(|e| format!("full: {e}"))?;
    }
    // Greedy ids follow from the logits; check them explicitly as well.
    let greedy: Vec<i32> = g.metadata()["greedy"]
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    let mut fed = Vec::new();
    for s in 0..greedy.len() {
        fed.push(
            g.case(&format!("step{s}"))
                .unwrap()
                .input(0)
                .unwrap()
                .to_vec::<i32>()
                .unwrap()[0],
        );
    }
    if fed != greedy {
        return Err(format!("greedy ids {fed:?} vs {greedy:?}"));
    }
    Ok(())
}
