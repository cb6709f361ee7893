//! What the GGUF tokenizer tests share: a `tokenizer.json`'s byte-level BPE vocabulary as GGUF
//! metadata hands it over, and the check of a golden's encode/decode cases. Included by path
//! (`#[path = "support/gguf_vocab.rs"] mod gguf_vocab;`); each test uses its part.
#![allow(dead_code)]

use serde_json::Value;

/// `tokenizer.json`'s vocabulary as GGUF's `tokenizer.ggml.tokens`, `token_type` and `merges`:
/// one token an id (the vocabulary's and the added tokens', `len` the largest id plus one),
/// type 1 (normal) but 3 (control) for a special added token and 4 (user-defined) for another,
/// the merges as `"a b"` strings.
pub fn tokens_types_merges(json: &Value) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let added = json["added_tokens"].as_array().unwrap();
    let n = vocab
        .values()
        .map(|v| v.as_u64().unwrap())
        .chain(added.iter().map(|a| a["id"].as_u64().unwrap()))
        .max()
        .unwrap() as usize
        + 1;
    let mut tokens = vec![String::new(); n];
    let mut types = vec![1i32; n];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = a["content"].as_str().unwrap().to_string();
        types[id] = if a["special"].as_bool().unwrap() {
            3
        } else {
            4
        };
    }
    let merges = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            _ => panic!("bad merge"),
        })
        .collect();
    (tokens, types, merges)
}

/// The golden's `cases` (`text`, `ids` with the special tokens, `ids_plain` without,
/// `decoded`) against a tokenizer's `encode(text, add_special)` and `decode(ids)`, where the
/// ids decoded are those with the special tokens (`decode_with`) or the plain ones: every
/// difference as a line.
pub fn case_failures(
    golden: &Value,
    encode: impl Fn(&str, bool) -> Vec<u32>,
    decode: impl Fn(&[u32]) -> String,
    decode_with: bool,
) -> Vec<String> {
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
        let with = encode(text, true);
        let plain = encode(text, false);
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
        let decoded = decode(if decode_with { &with } else { &plain });
        if decoded != case["decoded"].as_str().unwrap() {
            failures.push(format!(
                "{text:?}: decoded {decoded:?}, want {:?}",
                case["decoded"]
            ));
        }
    }
    failures
}
