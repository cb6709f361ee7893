//! A WordPiece vocabulary read from GGUF metadata (`tokenizer.ggml.model = "bert"`): llama.cpp's
//! own test vocabulary for bge-small-en-v1.5 (`tests/fixtures/gguf/ggml-vocab-bert-bge.gguf`,
//! in llama.cpp's "phantom space" form) against transformers' tokenizer for that model, as
//! `cargo xtask goldens gguf_wpm` records it: ids with and without `[CLS]`/`[SEP]`, and the
//! decoded text, over llama.cpp's vocabulary test texts plus special tokens, accents, CJK,
//! emoji, digits, whitespace and control characters.

use std::path::PathBuf;

use mlx_engine::tokenizer_gguf::tokenizer_data;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

#[test]
fn bert_gguf_vocabulary_encodes_as_transformers() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("goldens/gguf_wpm.json")).unwrap(),
    )
    .unwrap();
    let path = root().join("fixtures/gguf/ggml-vocab-bert-bge.gguf");
    let header = mlx_core::io::read_gguf_header(&path).expect("reading the GGUF header");
    let data = tokenizer_data(&header.metadata).expect("GGUF tokenizer metadata");
    assert_eq!(data.model, "bert");
    let tok = data.build().expect("building the WordPiece tokenizer");
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut failures = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let with = tok.encode(text, true).unwrap();
        let plain = tok.encode(text, false).unwrap();
        if with != ids(&case["ids"]) {
            failures.push(format!(
                "{text:?}: ids {with:?}, want {:?}",
                ids(&case["ids"])
            ));
        }
        if plain != ids(&case["ids_plain"]) {
            failures.push(format!(
                "{text:?}: plain ids {plain:?}, want {:?}",
                ids(&case["ids_plain"])
            ));
        }
        let decoded = tok.decode(&with, true).unwrap();
        if decoded != case["decoded"].as_str().unwrap() {
            failures.push(format!(
                "{text:?}: decoded {decoded:?}, want {:?}",
                case["decoded"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bert_gguf_special_ids_out_of_range_are_refused() {
    let path = root().join("fixtures/gguf/ggml-vocab-bert-bge.gguf");
    let header = mlx_core::io::read_gguf_header(&path).unwrap();
    let mut data = tokenizer_data(&header.metadata).unwrap();
    data.sep_id = Some(1 << 20);
    let Err(e) = data.build() else {
        panic!("an out-of-range separator id was accepted")
    };
    let e = e.to_string();
    assert!(e.contains("seperator token id 1048576"), "{e}");
}
