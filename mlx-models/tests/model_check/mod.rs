#![allow(dead_code)] // each test crate uses its own subset
//! The L1 check shared by the model golden tests: a model directory written by an oracle
//! script gives mlx-lm's logits to the last bit for the prefill, every cached decode step, a
//! chunked prefill (where the golden has one), a cache-less forward, and so the same greedy
//! ids.

use std::path::Path;

use mlx_core::prelude::*;
use mlx_core::testing::Goldens;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

pub fn check_model(model_dir: &Path, golden: &Path) -> Result<(), String> {
    let (model, _) =
        load_model_dir(model_dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    check_loaded(model.as_ref(), golden)
}

/// [`check_model`] for a model already loaded (e.g. from a GGUF file). The cache-less `full`
/// case may be absent (OLMo 1: mlx-lm cannot run a cache-less multi-token forward).
pub fn check_loaded(model: &dyn LanguageModel, golden: &Path) -> Result<(), String> {
    check(model, golden, false)
}

/// [`check_model`] with the `full` case required.
pub fn check_model_full(model_dir: &Path, golden: &Path) -> Result<(), String> {
    let (model, _) =
        load_model_dir(model_dir, &LoadOptions::default()).map_err(|e| e.to_string())?;
    check(model.as_ref(), golden, true)
}

/// [`check_loaded`] with the `full` case required.
pub fn check_loaded_full(model: &dyn LanguageModel, golden: &Path) -> Result<(), String> {
    check(model, golden, true)
}

/// Every name's check (`check(name)`), failures listed together.
pub fn check_all(names: &[&str], check: impl Fn(&str) -> Result<(), String>) {
    let failures: Vec<String> = names
        .iter()
        .filter_map(|m| check(m).err().map(|e| format!("{m}: {e}")))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} models differ:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

fn check(model: &dyn LanguageModel, golden: &Path, need_full: bool) -> Result<(), String> {
    let g = Goldens::load(golden).map_err(|e| e.to_string())?;
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
    if g.case("chunk0").is_ok() {
        // Chunked prefill, the cache state evaluated after each chunk (generate_step's way).
        let mut caches = model.make_cache();
        for prefix in ["chunk", "chunkstep"] {
            for c in 0.. {
                let Ok(case) = g.case(&format!("{prefix}{c}")) else {
                    break;
                };
                let input = case.input(0).map_err(|e| e.to_string())?;
                let logits = model.forward(input, Some(&mut caches)).map_err(err)?;
                let states: Vec<Array> = caches
                    .iter()
                    .flat_map(|c| c.state().into_arrays())
                    .collect();
                mlx_core::eval(&states).map_err(|e| e.to_string())?;
                case.check(&[logits])
                    .map_err(|e| format!("{prefix}{c}: {e}"))?;
            }
        }
    }
    match g.case("full") {
        Ok(full) => {
            let input = full.input(0).map_err(|e| e.to_string())?;
            full.check(&[model.forward(input, None).map_err(err)?])
                .map_err(|e| format!("full: {e}"))?;
        }
        Err(e) if need_full => return Err(e.to_string()),
        Err(_) => {}
    }
    // Greedy ids follow from the logits; check them explicitly as well.
    let greedy: Vec<i32> = g.metadata()["greedy"]
        .split(',')
        .map(|x| x.parse().map_err(|_| format!("bad greedy id {x}")))
        .collect::<Result<_, _>>()?;
    if fed != greedy {
        return Err(format!("greedy ids {fed:?} vs {greedy:?}"));
    }
    Ok(())
}
