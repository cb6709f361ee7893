//! L1 against mlx-lm 0.32.2: tiny seeded llama-family models (written with their goldens by
//! `cargo xtask goldens llama`) give logits equal to mlx-lm's to the last bit: prefill, every
//! cached decode step, and a cache-less forward.

use std::path::PathBuf;

use crate::model_check;

use mlx_core::prelude::*;
use mlx_models::load::{load_model_dir, LoadOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

const MODELS: &[&str] = &[
    "dense_f32",
    "dense_f16",
    "dense_bf16_untied",
    "dense_bf16_mha",
    "q4_g32",
    "q4_g64_untied",
    "q8_g32_bf16",
    "q8_g64",
    "mistral_bias_llama3rope",
    "linear_rope_sliding",
    "yarn_rope",
];

fn check_model(name: &str) -> Result<(), String> {
    model_check::check_model(
        &root().join("models").join(name),
        &root()
            .join("goldens")
            .join(format!("llama_{name}.safetensors")),
    )
}

#[test]
fn tiny_llamas_match_mlx_lm_bit_for_bit() {
    model_check::check_all(MODELS, check_model);
}

#[test]
fn cached_decode_equals_one_full_forward() {
    // Not bit-exact by construction (different matmul shapes), but the last position's argmax
    // and values must agree closely: a smoke test of the cache plumbing.
    let (model, _) =
        load_model_dir(&root().join("models/dense_f32"), &LoadOptions::default()).unwrap();
    let ids: Vec<i32> = vec![1, 5, 9, 33, 2, 77, 12];
    let all = Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap();
    let full = model.forward(&all, None).unwrap();
    let mut caches = model.make_cache();
    let mut last = None;
    for &t in &ids {
        last = Some(
            model
                .forward(
                    &Array::from_slice(&[t], &[1, 1]).unwrap(),
                    Some(&mut caches),
                )
                .unwrap(),
        );
    }
    let step = last
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let n = ids.len() as i32;
    let full_last = ops::slice_axis(&full, 1, n - 1, n, None)
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let max_diff = step
        .iter()
        .zip(&full_last)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max_diff < 1e-4, "max |diff| {max_diff}");
}
