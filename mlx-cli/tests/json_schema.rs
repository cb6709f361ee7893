//! `mlx generate --json-schema FILE`: the reply is JSON valid against the schema, on the tiny
//! seeded llama (whose free reply is not JSON) greedy and sampled on both decoders, and on the
//! real SmolLM2-135M-Instruct GGUF (byte-level BPE vocabulary of 49,152 tokens), whose free
//! reply to the same prompt is not bare JSON; a bad schema file is an error naming the file.

use crate::support;
use support::mlx;

#[path = "../../mlx-engine/tests/support/schema_check.rs"]
mod schema_check;

use std::path::{Path, PathBuf};

use schema_check::{parse_valid, person_schema};
use serde_json::{json, Value};

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-engine/tests/fixtures/tiny_chat")
}

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx-json-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `mlx generate ... --json`'s text, decoder and finish reason.
fn generate(model: &str, extra: &[&str]) -> (String, String, String) {
    let mut args = vec!["generate", "--model", model, "--json"];
    args.extend(extra);
    let (code, out, err) = mlx(&args);
    assert_eq!(code, 0, "{args:?}: {err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    (
        v["text"].as_str().unwrap().to_string(),
        v["decoder"].as_str().unwrap().to_string(),
        v["finish_reason"].as_str().unwrap().to_string(),
    )
}

#[test]
fn replies_follow_the_schema_file_on_both_decoders_greedy_and_sampled() {
    let schema = person_schema();
    let file = write("person.json", &schema.to_string());
    let file = file.to_str().unwrap();
    let model = tiny();
    let model = model.to_str().unwrap();
    let (free, _, _) = generate(model, &["--max-tokens", "40"]);
    assert!(serde_json::from_str::<Value>(&free).is_err(), "{free:?}");
    for decoder in ["mlx", "cpu"] {
        for sampling in [
            &[][..],
            &["--temp", "1.0", "--seed", "4"][..],
            &["--temp", "0.7", "--top-p", "0.9", "--seed", "9"][..],
        ] {
            let mut extra = vec![
                "--max-tokens",
                "600",
                "--json-schema",
                file,
                "--decoder",
                decoder,
            ];
            extra.extend(sampling);
            let (text, used, finish) = generate(model, &extra);
            assert_eq!(used, decoder);
            parse_valid(&schema, &text).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
            assert_eq!(finish, "stop", "{extra:?}");
        }
    }
    // Without --json, the reply alone is printed: one line of valid JSON.
    let (code, out, err) = mlx(&[
        "generate",
        "--model",
        model,
        "--max-tokens",
        "600",
        "--json-schema",
        file,
        "--verbose",
        "false",
    ]);
    assert_eq!(code, 0, "{err}");
    parse_valid(&schema, out.trim()).unwrap();
}

#[test]
fn a_real_model_replies_in_the_schema() {
    let model = mlx_engine::fetch::smollm2_gguf().unwrap();
    let model = model.to_str().unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "color": {"enum": ["red", "green", "blue"]},
            "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20},
                        "maxItems": 3}
        },
        "required": ["name", "age", "color", "hobbies"],
        "additionalProperties": false
    });
    let file = write("smollm2.json", &schema.to_string());
    let prompt = "Invent a person. Reply in JSON with name, age, favourite color and hobbies.";
    let (text, _, finish) = generate(
        model,
        &[
            "--prompt",
            prompt,
            "--max-tokens",
            "120",
            "--decoder",
            "cpu",
            "--json-schema",
            file.to_str().unwrap(),
        ],
    );
    parse_valid(&schema, &text).unwrap();
    assert_eq!(finish, "stop", "{text:?}");
}

#[test]
fn a_bad_schema_file_is_an_error_naming_it() {
    let model = tiny();
    let model = model.to_str().unwrap();
    let cases = [
        (
            "bad_type.json",
            r#"{"type": "object", "properties": {"a": {"type": "nonsense"}}}"#,
            "nonsense",
        ),
        ("not_json.json", "{", "not valid JSON"),
        ("a_list.json", "[1, 2]", "must be an object"),
    ];
    for (name, text, needle) in cases {
        let p = write(name, text);
        let (code, _, err) = mlx(&[
            "generate",
            "--model",
            model,
            "--json-schema",
            p.to_str().unwrap(),
        ]);
        assert_ne!(code, 0, "{name}");
        assert!(err.contains(name) && err.contains(needle), "{name}: {err}");
    }
    let (code, _, err) = mlx(&[
        "generate",
        "--model",
        model,
        "--json-schema",
        "/nonexistent/s.json",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/s.json"), "{err}");
}
