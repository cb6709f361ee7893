//! Speculative decoding. L1 against mlx-lm 0.32.2's `speculative_generate_step` (through its
//! `stream_generate` with a draft model, `xtask/oracle/goldens_spec.py`): a 2-layer tiny llama
//! and a 1-layer draft cut from it give the same tokens, `from_draft` marks and
//! log-probabilities, bit for bit, greedy and seeded, with logits processors, and drafts
//! partly accepted. Then rollback beyond mlx-lm: hybrids (recurrent state), rotating caches
//! past their window and quantized caches speculate with exactly the output of plain greedy
//! decoding, over random accept patterns; prompt lookup likewise.

use std::path::PathBuf;

use mlx_core::random;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::sample::{make_logits_processors, ProcessorSettings, Sampler, SamplerSettings};
use mlx_engine::speculative::{check_draft_tokenizer, Drafter};
use mlx_engine::stream::{stream_generate, stream_generate_speculative, StreamOptions};
use mlx_engine::Tokenizer;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;
use proptest::prelude::*;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cli_model(name: &str) -> PathBuf {
    repo().join("mlx-cli/tests/models").join(name)
}

fn load(dir: &PathBuf) -> Box<dyn LanguageModel> {
    load_model_dir(dir, &LoadOptions::default()).unwrap().0
}

fn goldens() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/speculative.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn opts(c: &Value) -> StreamOptions {
    let s = &c["sampler"];
    let g = |k: &str, d: f64| s.get(k).and_then(Value::as_f64).unwrap_or(d);
    let sampler = Sampler::new(SamplerSettings {
        temp: g("temp", 0.0),
        top_p: g("top_p", 0.0),
        min_p: g("min_p", 0.0),
        top_k: g("top_k", 0.0) as i32,
        ..SamplerSettings::default()
    });
    let p = &c["processors"];
    let pf = |k: &str| p.get(k).and_then(Value::as_f64);
    let logit_bias = p
        .get("logit_bias")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap() as f32))
                .collect()
        })
        .unwrap_or_default();
    let logits_processors = make_logits_processors(&ProcessorSettings {
        logit_bias,
        repetition_penalty: pf("repetition_penalty"),
        presence_penalty: pf("presence_penalty"),
        frequency_penalty: pf("frequency_penalty"),
        ..ProcessorSettings::default()
    })
    .unwrap();
    StreamOptions {
        generate: GenerateOptions {
            max_tokens: Some(c["max_tokens"].as_u64().unwrap() as usize),
            sampler,
            logits_processors,
            ..GenerateOptions::default()
        },
        ..StreamOptions::default()
    }
}

#[test]
fn draft_model_speculation_equals_mlx_lm() {
    let target_dir = cli_model("dense_f32");
    let target = load(&target_dir);
    let draft = load(&cli_model("dense_f32_draft"));
    let tok = Tokenizer::from_dir(&target_dir).unwrap();
    let g = goldens();
    let (mut accepted, mut drafted) = (0, 0);
    for c in g["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let prompt: Vec<u32> = c["prompt"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        if let Some(s) = c["seed"].as_u64() {
            random::seed(s).unwrap();
        }
        let stream = stream_generate_speculative(
            target.as_ref(),
            &tok,
            &prompt,
            None,
            Drafter::Model {
                model: draft.as_ref(),
                cache: None,
            },
            c["num_draft_tokens"].as_u64().unwrap() as usize,
            opts(c),
        )
        .unwrap();
        let mut stream = stream;
        let (mut tokens, mut marks, mut lps) = (Vec::new(), Vec::new(), Vec::new());
        let mut finish = None;
        for r in stream.by_ref() {
            let r = r.unwrap();
            tokens.push(u64::from(r.token.unwrap()));
            marks.push(r.from_draft);
            lps.push(r.logprob.unwrap());
            finish = r.finish_reason;
        }
        let want_tokens: Vec<u64> = c["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let want_marks: Vec<bool> = c["from_draft"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_bool().unwrap())
            .collect();
        assert_eq!(tokens, want_tokens, "{name}: tokens");
        assert_eq!(marks, want_marks, "{name}: from_draft");
        for (i, (a, b)) in lps.iter().zip(c["logprobs"].as_array().unwrap()).enumerate() {
            let b = b.as_f64().unwrap() as f32;
            assert_eq!(a.to_bits(), b.to_bits(), "{name}: logprob {i}: {a} vs {b}");
        }
        assert_eq!(
            finish.map(|f| f.as_str()),
            c["finish_reason"].as_str(),
            "{name}: finish reason"
        );
        let st = stream.spec_stats().unwrap();
        accepted += st.accepted;
        drafted += st.drafted;
    }
    // Partial acceptance: some drafts kept, some rejected.
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let target = Tokenizer::from_dir(cli_model("dense_f32")).unwrap();
    let other = Tokenizer::from_dir(repo().join("mlx-train/tests/models/dense")).unwrap();
    assert_ne!(target.vocab_size(), other.vocab_size());
    let e = check_draft_tokenizer(&target, &other).unwrap_err().to_string();
    assert!(e.contains("Draft model tokenizer does not match"), "{e}");
    check_draft_tokenizer(&target, &target).unwrap();
}
