//! Checks shared by the golden tests: for the tokenizer tests (`tokenizer_goldens.rs`,
//! `smollm2_tokenizer.rs`) reading the JSON goldens, collecting every mismatch before failing,
//! and the encode, decode, special-token and streaming comparisons both make against the
//! oracle; for the real-model tests (`smollm2_gguf_logits.rs`, `gemma3_gguf.rs`) the digest
//! comparison of a logits vector.
#![allow(dead_code)] // each test crate uses its own subset

use mlx_core::Array;
use mlx_engine::{ChatTemplateOptions, DetokenizerKind, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn s(v: &Value) -> &str {
    v.as_str().expect("string")
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| s(x).to_string())
        .collect()
}

/// Every mismatch of a test, reported together (the first 25) when it finishes.
#[derive(Default)]
pub struct Failures {
    failed: Vec<String>,
    total: usize,
}

impl Failures {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn check<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: impl FnOnce() -> String,
        got: T,
        want: T,
    ) {
        self.total += 1;
        if got != want {
            self.failed
                .push(format!("{}:\n   got {got:?}\n  want {want:?}", what()));
        }
    }

    pub fn fail(&mut self, msg: String) {
        self.total += 1;
        self.failed.push(msg);
    }

    pub fn finish(self, name: &str) {
        if !self.failed.is_empty() {
            panic!(
                "{name}: {} of {} checks failed:\n{}",
                self.failed.len(),
                self.total,
                self.failed
                    .iter()
                    .take(25)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        eprintln!("{name}: {} checks passed", self.total);
    }
}

/// BOS/EOS, vocabulary size, thinking tokens, the special-tokens map and the streaming
/// detokenizer kind, against mlx-lm's `TokenizerWrapper` (keys as the golden writers name them).
pub fn check_special_tokens(f: &mut Failures, tok: &Tokenizer, g: &Value) {
    f.check(
        || "bos_token".into(),
        tok.bos_token().map(str::to_string),
        g["bos_token"].as_str().map(str::to_string),
    );
    f.check(
        || "bos_token_id".into(),
        tok.bos_token_id(),
        g["bos_token_id"].as_u64().map(|x| x as u32),
    );
    f.check(
        || "eos_token".into(),
        tok.eos_token().map(str::to_string),
        g["eos_token"].as_str().map(str::to_string),
    );
    f.check(
        || "eos_token_ids".into(),
        tok.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        ids(&g["eos_token_ids"]),
    );
    f.check(
        || "vocab_size".into(),
        tok.vocab_size() as u64,
        g["vocab_size"].as_u64().unwrap(),
    );
    f.check(
        || "has_thinking".into(),
        tok.has_thinking(),
        g["has_thinking"].as_bool().unwrap(),
    );
    let want_map: Vec<(String, String)> = g["special_tokens_map"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), s(v).to_string()))
        .collect();
    f.check(
        || "special_tokens_map".into(),
        tok.special_tokens_map().to_vec(),
        want_map,
    );
    let kind = match tok.detokenizer_kind() {
        DetokenizerKind::Naive => "NaiveStreamingDetokenizer",
        DetokenizerKind::Spm { .. } => "SPMStreamingDetokenizer",
        DetokenizerKind::Bpe => "BPEStreamingDetokenizer",
    };
    f.check(|| "detokenizer".into(), kind, s(&g["detokenizer"]));
}

/// The golden's `encode` cases (ids with and without special tokens, the generate prompt rule,
/// token strings, decoding with and without special tokens) and its `decode` cases.
pub fn check_encode_decode(f: &mut Failures, tok: &Tokenizer, g: &Value) {
    for case in g["encode"].as_array().unwrap() {
        let text = s(&case["text"]);
        f.check(
            || format!("encode({text:?}, true)"),
            tok.encode(text, true).unwrap(),
            ids(&case["ids"]),
        );
        f.check(
            || format!("encode({text:?}, false)"),
            tok.encode(text, false).unwrap(),
            ids(&case["ids_no_special"]),
        );
        f.check(
            || format!("encode_prompt({text:?})"),
            tok.encode_prompt(text).unwrap(),
            ids(&case["prompt_ids"]),
        );
        let tokens: Vec<String> = ids(&case["ids_no_special"])
            .iter()
            .map(|&i| tok.id_to_token(i).unwrap_or_default())
            .collect();
        f.check(
            || format!("tokens of {text:?}"),
            tokens,
            strings(&case["tokens"]),
        );
        let with_special = ids(&case["ids"]);
        f.check(
            || format!("decode of {text:?}"),
            tok.decode(&with_special, false).unwrap(),
            s(&case["decode"]).to_string(),
        );
        f.check(
            || format!("decode(skip_special) of {text:?}"),
            tok.decode(&with_special, true).unwrap(),
            s(&case["decode_skip_special"]).to_string(),
        );
    }
    for case in g["decode"].as_array().unwrap() {
        let run = ids(&case["ids"]);
        f.check(
            || format!("decode({run:?})"),
            tok.decode(&run, false).unwrap(),
            s(&case["text"]).to_string(),
        );
        f.check(
            || format!("decode({run:?}, skip_special)"),
            tok.decode(&run, true).unwrap(),
            s(&case["text_skip_special"]).to_string(),
        );
    }
}

/// Streams `run` token by token as `mlx_lm.generate` does: each step's segment, the final
/// flush's segment last, and the whole text.
pub fn stream(tok: &Tokenizer, run: &[u32]) -> (Vec<String>, String) {
    let mut detok = tok.detokenizer();
    let mut segments = Vec::new();
    for &t in run {
        detok.add_token(t);
        segments.push(detok.last_segment().unwrap());
    }
    detok.finalize().unwrap();
    segments.push(detok.last_segment().unwrap());
    (segments, detok.text().unwrap())
}

/// The golden's chat cases, rendered through [`options_from`]: the text and ids, the generate
/// prompt ids where the case has them, and errors where the oracle raised one. transformers'
/// `raise_exception` gives "TemplateError: <message>", which we keep word for word; other Jinja
/// errors only need to be errors (their wording is the engine's).
pub fn check_chat(f: &mut Failures, tok: &Tokenizer, cases: &Value) {
    for case in cases.as_array().expect("chat cases") {
        let label = s(&case["name"]).to_string();
        let messages = case["messages"].as_array().unwrap().clone();
        let opts = options_from(&case["kwargs"]);
        match (case.get("error"), tok.apply_chat_template(&messages, &opts)) {
            (Some(err), Err(e)) => {
                let want = s(err);
                let ok = !want.starts_with("TemplateError: ") || e.to_string().contains(want);
                f.check(|| format!("chat {label} error {e}, want {want}"), ok, true);
            }
            (Some(err), Ok(text)) => {
                f.fail(format!("chat {label}: rendered {text:?}, want error {err}"))
            }
            (None, Err(e)) => f.fail(format!("chat {label}: error {e}")),
            (None, Ok(text)) => {
                f.check(
                    || format!("chat {label} text"),
                    text.clone(),
                    s(&case["text"]).to_string(),
                );
                f.check(
                    || format!("chat {label} ids"),
                    tok.apply_chat_template_ids(&messages, &opts).unwrap(),
                    ids(&case["ids"]),
                );
                if let Some(prompt_ids) = case.get("prompt_ids") {
                    f.check(
                        || format!("chat {label} prompt ids"),
                        tok.encode_prompt(&text).unwrap(),
                        ids(prompt_ids),
                    );
                }
            }
        }
    }
}

/// `apply_chat_template` keyword arguments of a golden case as [`ChatTemplateOptions`].
pub fn options_from(kwargs: &Value) -> ChatTemplateOptions {
    let mut opts = ChatTemplateOptions::default();
    for (k, v) in kwargs.as_object().expect("kwargs") {
        match k.as_str() {
            "add_generation_prompt" => opts.add_generation_prompt = v.as_bool().unwrap_or(false),
            "continue_final_message" => {
                if v.as_bool() == Some(true) {
                    opts.continue_final_message = Some("content".into());
                } else if let Some(f) = v.as_str() {
                    opts.continue_final_message = Some(f.into());
                }
            }
            "tools" => opts.tools = v.as_array().cloned(),
            "documents" => opts.documents = v.as_array().cloned(),
            _ => {
                opts.kwargs.insert(k.clone(), v.clone());
            }
        }
    }
    opts
}

/// `Ok` when the sha256 of `a`'s bytes (a 1-d logits or log-probabilities vector) is
/// `want["sha256"]`; otherwise a report of ours against the oracle's values at its recorded
/// top entries (`want["top"]`: `[id, value]` pairs).
pub fn check_digest(what: &str, a: &Array, want: &Value) -> Result<(), String> {
    let bytes = a.to_bytes().map_err(|e| format!("{what}: {e}"))?;
    if format!("{:x}", Sha256::digest(&bytes)) == s(&want["sha256"]) {
        return Ok(());
    }
    let vals = a
        .astype(mlx_core::Dtype::Float32)
        .and_then(|v| v.to_vec::<f32>())
        .map_err(|e| format!("{what}: {e}"))?;
    let report: Vec<String> = want["top"]
        .as_array()
        .expect("top entries")
        .iter()
        .map(|t| {
            let id = t[0].as_u64().expect("id") as usize;
            format!("id {id}: mlx-lm {} ours {}", t[1], vals[id])
        })
        .collect();
    Err(format!(
        "{what}: differs from mlx-lm\n{}",
        report.join("\n")
    ))
}
