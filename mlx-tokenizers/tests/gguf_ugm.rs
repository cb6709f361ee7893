//! A SentencePiece Unigram vocabulary read from GGUF metadata (`tokenizer.ggml.model = "t5"`,
//! llama.cpp's UGM): a small model trained by `cargo xtask goldens gguf_ugm` with T5's
//! settings (`nmt_nfkc` precompiled charsmap, dummy prefix, extra whitespace removed) and
//! written as llama.cpp's T5 converter writes it (`tests/fixtures/gguf/t5-ugm.gguf`), against
//! transformers' tokenizer for that model (whose ids the script checks equal SentencePiece's on
//! every text without a special token's spelling): ids with and without `</s>`, and the decoded
//! text, over texts that exercise the charsmap (NFKC, ligatures, full-width forms), whitespace
//! runs, unknown characters and special tokens.

#[path = "support/gguf_vocab.rs"]
mod gguf_vocab;

use std::path::PathBuf;

use mlx_tokenizers::tokenizer_gguf::tokenizer_data;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn data() -> mlx_tokenizers::GgufTokenizerData {
    let path = root().join("fixtures/gguf/t5-ugm.gguf");
    let header = mlx_core::io::read_gguf_header(&path).expect("reading the GGUF header");
    tokenizer_data(&header.metadata).expect("GGUF tokenizer metadata")
}

#[test]
fn t5_unigram_gguf_vocabulary_encodes_as_transformers() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("goldens/gguf_ugm.json")).unwrap(),
    )
    .unwrap();
    let data = data();
    assert_eq!(data.model, "t5");
    assert!(data
        .precompiled_charsmap
        .as_ref()
        .is_some_and(|m| !m.is_empty()));
    let tok = data.build().expect("building the Unigram tokenizer");
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let failures = gguf_vocab::case_failures(
        &golden,
        |text, special| tok.encode(text, special).unwrap(),
        |ids| tok.decode(ids, true).unwrap(),
        false,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn t5_unigram_gguf_errors_name_the_field() {
    let mut d = data();
    d.precompiled_charsmap = Some(vec![1, 2, 3]);
    let Err(e) = d.build() else {
        panic!("a broken charsmap was accepted")
    };
    let e = e.to_string();
    assert!(e.contains("tokenizer.ggml.precompiled_charsmap"), "{e}");

    let mut d = data();
    d.scores = Some(vec![0.0; 3]);
    let Err(e) = d.build() else {
        panic!("short scores were accepted")
    };
    let e = e.to_string();
    assert!(e.contains("tokenizer.ggml.scores has 3 entries"), "{e}");

    let mut d = data();
    d.unk_id = None;
    d.token_types = None;
    let Err(e) = d.build() else {
        panic!("no unknown token was accepted")
    };
    let e = e.to_string();
    assert!(e.contains("names no unknown token"), "{e}");
}
