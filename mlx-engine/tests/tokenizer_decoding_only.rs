//! `Tokenizer::keep_decoding_only` (issue #31's peak memory: `mlx generate` drops the backend
//! tokenizer once the prompt is encoded): what is left streams the same text, byte for byte,
//! answers the id lookups as the backend did, and refuses to encode or decode.
//! Real GGUF tokenizers: SmolLM2-135M's byte-level BPE and Gemma 3 270M's SentencePiece.

use crate::common;

use common::stream;
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_engine::Tokenizer;

/// As the loader builds it: from the header alone.
fn build(path: std::path::PathBuf) -> Tokenizer {
    let header = mlx_models::gguf::read_gguf_header_of(&path).expect("GGUF header");
    tokenizer_data(&header.metadata)
        .expect("tokenizer metadata")
        .build()
        .expect("build tokenizer")
}

const TEXTS: &[&str] = &[
    "Hello, world! How are you today?",
    " leading space and  two spaces\n\nnew lines\tand a tab",
    "Ünïcödé: 日本語のテキスト, emoji 👨\u{200d}👩\u{200d}👧 and e\u{301}",
    "numbers 1234567890 3.14159 -42",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "<start_of_turn>user\nGemma's turn markers<end_of_turn>",
    "code: fn main() { println!(\"{}\", 1 + 2); }",
    "",
];

fn check(full: Tokenizer) {
    let mut slim = full.clone();
    // A clone shares the backend: nothing would be freed.
    assert!(!slim.keep_decoding_only());
    assert!(!slim.is_decoding_only());
    let full_vocab = full.vocab();
    let mut ids_of = Vec::new();
    for t in TEXTS {
        ids_of.push(full.encode(t, true).unwrap());
        ids_of.push(full.encode_prompt(t).unwrap());
    }
    // The first and last ids in order, and ids past the vocabulary.
    let n = full.vocab_size() as u32;
    ids_of.push((0..1500).chain(n - 300..n + 3).collect());
    let before: Vec<_> = ids_of.iter().map(|ids| stream(&full, ids)).collect();
    let tokens: Vec<Option<String>> = (0..n + 3).map(|i| full.id_to_token(i)).collect();
    let eos = full.eos_token_ids().clone();
    drop(full);

    assert!(slim.keep_decoding_only());
    assert!(slim.is_decoding_only());
    let after: Vec<_> = ids_of.iter().map(|ids| stream(&slim, ids)).collect();
    assert_eq!(before, after, "the streamed text changed");
    assert_eq!(slim.vocab_size() as u32, n);
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(&slim.id_to_token(i as u32), t, "id {i}");
    }
    assert_eq!(slim.vocab(), full_vocab);
    for (t, &id) in full_vocab.iter().step_by(997) {
        assert_eq!(slim.token_to_id(t), Some(id), "{t:?}");
    }
    assert_eq!(slim.token_to_id("no such token \u{1}"), None);
    assert_eq!(slim.eos_token_ids(), &eos);
    let err = slim.encode("hello", false).unwrap_err().to_string();
    assert!(err.contains("keeps only its decoding tables"), "{err}");
    assert!(slim.decode(&[1, 2], false).is_err());
    assert!(slim.to_hf_json().is_err());
    assert_eq!(slim.backend().get_vocab_size(true), 0);
    // Twice is a no-op.
    assert!(!slim.keep_decoding_only());
}

#[test]
fn smollm2_bpe_streams_the_same_bytes_decoding_only() {
    let t = build(mlx_engine::fetch::smollm2_gguf().unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(t.detokenizer_kind(), mlx_engine::DetokenizerKind::Bpe);
    check(t);
}

#[test]
fn gemma3_spm_streams_the_same_bytes_decoding_only() {
    let t = build(mlx_engine::fetch::gemma3_270m_gguf().unwrap_or_else(|e| panic!("{e}")));
    assert!(matches!(
        t.detokenizer_kind(),
        mlx_engine::DetokenizerKind::Spm { .. }
    ));
    check(t);
}
