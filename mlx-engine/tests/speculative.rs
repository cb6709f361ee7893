//! Speculative decoding. L1 against mlx-lm 0.32.2's `speculative_generate_step` (through its
//! `stream_generate` with a draft model, `xtask/oracle/goldens_spec.py`): a 2-layer tiny llama
//! and a 1-layer draft cut from it give the same tokens, `from_draft` marks and
//! log-probabilities, bit for bit, greedy and seeded, with logits processors, and drafts
//! partly accepted. Then rollback beyond mlx-lm: hybrids (recurrent state), rotating caches
//! past their window and quantized caches speculate with exactly the output of plain greedy
//! decoding, over random accept patterns; prompt lookup likewise.

use std::path::{Path, PathBuf};

use mlx_core::random;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::sample::{make_logits_processors, ProcessorSettings, Sampler, SamplerSettings};
use mlx_engine::speculative::{check_draft_tokenizer, Drafter};
use mlx_engine::stream::{stream_generate_speculative, StreamOptions};
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

fn load(dir: &Path) -> Box<dyn LanguageModel> {
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
        for (i, (a, b)) in lps
            .iter()
            .zip(c["logprobs"].as_array().unwrap())
            .enumerate()
        {
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
    let e = check_draft_tokenizer(&target, &other)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Draft model tokenizer does not match"), "{e}");
    check_draft_tokenizer(&target, &target).unwrap();
}

fn model_dir(name: &str) -> PathBuf {
    repo().join("mlx-models/tests/models").join(name)
}

const PROMPT: &[u32] = &[3, 17, 59, 5, 42, 7, 60, 64, 11, 90];
const GEN: usize = 20;

/// Plain greedy decoding (`generate_step`).
fn plain(model: &dyn LanguageModel, opts: &GenerateOptions) -> Vec<u32> {
    let ids: Vec<i32> = PROMPT.iter().map(|&t| t as i32).collect();
    mlx_engine::generate::generate_step(&ids, model, None, opts.clone())
        .unwrap()
        .map(|s| s.unwrap().token)
        .collect()
}

fn speculative(
    model: &dyn LanguageModel,
    drafter: Drafter<'_>,
    k: usize,
    opts: &GenerateOptions,
) -> (Vec<u32>, mlx_engine::speculative::SpecStats) {
    let ids: Vec<i32> = PROMPT.iter().map(|&t| t as i32).collect();
    let mut g = mlx_engine::speculative::speculative_generate_step(
        &ids,
        model,
        None,
        drafter,
        k,
        opts.clone(),
    )
    .unwrap();
    let out: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
    (out, g.stats())
}

fn greedy_opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(GEN),
        ..GenerateOptions::default()
    }
}

/// A drafter that proposes the reference continuation where `accept` says so and a wrong
/// token elsewhere: every accept pattern, on every cache kind.
fn forced<'a>(reference: &'a [u32], accept: &'a [bool], vocab: u32) -> Drafter<'a> {
    let mut draw = 0usize;
    Drafter::Custom(Box::new(move |h: &[u32], k: usize| {
        let at = h.len() - PROMPT.len();
        (0..k)
            .map_while(|j| reference.get(at + j))
            .map(|&t| {
                let ok = accept[draw % accept.len()];
                draw += 1;
                if ok {
                    t
                } else {
                    (t + 1) % vocab
                }
            })
            .collect()
    }))
}

/// Speculative greedy output equals plain greedy output for `model` over random accept
/// patterns and draft lengths (rollback of every cache the model uses).
fn equals_plain(model: &dyn LanguageModel, opts: GenerateOptions) {
    let reference = plain(model, &opts);
    assert_eq!(reference.len(), GEN);
    let vocab = model.vocab_size() as u32;
    let cfg = ProptestConfig {
        cases: 5,
        ..ProptestConfig::default()
    };
    let (accepted, drafted) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    proptest!(cfg, |(accept in prop::collection::vec(any::<bool>(), 1..12), k in 1usize..5)| {
        let (got, st) = speculative(model, forced(&reference, &accept, vocab), k, &opts);
        prop_assert_eq!(&got, &reference, "k {} accept {:?}", k, accept);
        accepted.set(accepted.get() + st.accepted);
        drafted.set(drafted.get() + st.drafted);
    });
    let (accepted, drafted) = (accepted.get(), drafted.get());
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
}

#[test]
fn hybrids_speculate_exactly_over_random_accept_patterns() {
    for name in ["qwen3_next", "qwen3_5", "lfm2"] {
        eprintln!("{name}");
        equals_plain(load(&model_dir(name)).as_ref(), greedy_opts());
    }
}

#[test]
fn rotating_caches_speculate_exactly_past_their_window() {
    // Windows of 4 and 8: prompt 10 + 20 tokens wrap every ring.
    for name in ["dense/gemma3_text", "gemma4_text", "gpt_oss"] {
        eprintln!("{name}");
        equals_plain(load(&model_dir(name)).as_ref(), greedy_opts());
    }
}

#[test]
fn quantized_caches_speculate_exactly() {
    // dense_f32's weights read with 2 heads of 64 / 1 KV head: head_dim 32, which the
    // quantized cache's group size 32 needs.
    let dir = std::env::temp_dir().join(format!("mlx-spec-h32-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = model_dir("dense_f32");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["num_attention_heads"] = 2.into();
    config["num_key_value_heads"] = 1.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let model = load(&dir);
    std::fs::remove_dir_all(&dir).ok();
    // Quantized from the start, and switching mid-generation.
    for start in [0, 14] {
        equals_plain(
            model.as_ref(),
            GenerateOptions {
                kv_bits: Some(8),
                kv_group_size: 32,
                quantized_kv_start: start,
                ..greedy_opts()
            },
        );
    }
}

#[test]
fn draft_models_with_recurrent_state_roll_back_too() {
    // A hybrid target with the dense draft, and the dense target with a hybrid draft.
    let dense = load(&cli_model("dense_f32"));
    let draft = load(&cli_model("dense_f32_draft"));
    let hybrid = load(&model_dir("qwen3_next"));
    let lfm2 = load(&model_dir("lfm2"));
    for (target, d) in [
        (hybrid.as_ref(), draft.as_ref()),
        (dense.as_ref(), lfm2.as_ref()),
        (dense.as_ref(), hybrid.as_ref()),
    ] {
        let want = plain(target, &greedy_opts());
        for k in [1, 3, 4] {
            let (got, _) = speculative(
                target,
                Drafter::Model {
                    model: d,
                    cache: None,
                },
                k,
                &greedy_opts(),
            );
            assert_eq!(
                got,
                want,
                "{} with {} k {k}",
                target.model_type(),
                d.model_type()
            );
        }
    }
}

/// deepseek_v41's `LayerCache`s cannot go back (nor can mlx-lm's): speculative decoding on
/// fresh caches is refused, as mlx-lm refuses it, instead of keeping rejected drafts.
#[test]
fn speculation_refuses_caches_that_cannot_roll_back() {
    let model = load(&model_dir("dense2/deepseek_v41"));
    let ids: Vec<i32> = PROMPT.iter().map(|&t| t as i32).collect();
    let err = match mlx_engine::speculative::speculative_generate_step(
        &ids,
        model.as_ref(),
        None,
        Drafter::PromptLookup { ngram: 1 },
        3,
        GenerateOptions::default(),
    ) {
        Ok(_) => panic!("speculated over LayerCaches"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("requires a trimmable") && err.contains("LayerCache"),
        "{err}"
    );
}

#[test]
fn prompt_lookup_equals_plain_greedy() {
    // dense2/gemma3n: its KV-shared layers read rotating caches that roll back.
    for name in [
        "dense_f32",
        "qwen3_next",
        "dense/gemma3_text",
        "dense2/gemma3n",
    ] {
        let model = load(&model_dir(name));
        let opts = GenerateOptions {
            max_tokens: Some(40),
            ..GenerateOptions::default()
        };
        let ids: Vec<i32> = PROMPT.iter().map(|&t| t as i32).collect();
        let want: Vec<u32> =
            mlx_engine::generate::generate_step(&ids, model.as_ref(), None, opts.clone())
                .unwrap()
                .map(|s| s.unwrap().token)
                .collect();
        for (ngram, k) in [(1, 3), (2, 4), (3, 2)] {
            let mut g = mlx_engine::speculative::speculative_generate_step(
                &ids,
                model.as_ref(),
                None,
                Drafter::PromptLookup { ngram },
                k,
                opts.clone(),
            )
            .unwrap();
            let got: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
            assert_eq!(got, want, "{name} ngram {ngram} k {k}");
            if ngram == 1 {
                // Tiny random models repeat themselves: lookup finds drafts.
                assert!(g.stats().drafted > 0, "{name}: {:?}", g.stats());
            }
        }
    }
}

#[test]
fn the_batch_engine_runs_speculative_requests_alone_with_mlx_lm_tokens() {
    use mlx_engine::batch::{BatchEvent, BatchRequest, Engine, EngineConfig};
    let target = cli_model("dense_f32");
    let (engine, thread) = Engine::start_with_draft(
        move || {
            let (model, _) = load_model_dir(&target, &LoadOptions::default())?;
            let (draft, _) =
                load_model_dir(&cli_model("dense_f32_draft"), &LoadOptions::default())?;
            Ok((model, Tokenizer::from_dir(&target)?, Some(draft)))
        },
        EngineConfig::default(),
    )
    .unwrap();
    let g = goldens();
    let case = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "greedy_k2")
        .unwrap()
        .clone();
    let want: Vec<u32> = case["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let prompt: Vec<u32> = case["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut rxs = Vec::new();
    // A plain request and two speculative ones submitted together: same greedy tokens.
    for k in [None, Some(2), Some(4)] {
        let (tx, rx) = std::sync::mpsc::channel();
        engine
            .submit(
                BatchRequest {
                    prompt: prompt.clone(),
                    max_tokens: want.len(),
                    sampler: Default::default(),
                    processors: Default::default(),
                    stop_strings: Vec::new(),
                    logprobs: true,
                    top_logprobs: 0,
                    seed: None,
                    timeout: None,
                    num_draft_tokens: k,
                    grammar: None,
                },
                Box::new(tx),
            )
            .unwrap();
        rxs.push((k, rx));
    }
    for (k, rx) in rxs {
        let mut tokens = Vec::new();
        let mut done = false;
        for ev in rx.iter() {
            match ev {
                BatchEvent::Token { token, logprob, .. } => {
                    assert!(logprob.is_some());
                    tokens.push(token);
                }
                BatchEvent::Done {
                    completion_tokens, ..
                } => {
                    assert_eq!(completion_tokens, want.len());
                    done = true;
                    break;
                }
                BatchEvent::Error(e) => panic!("{k:?}: {e}"),
                BatchEvent::Started { .. } => {}
            }
        }
        assert!(done, "{k:?}");
        assert_eq!(tokens, want, "num_draft_tokens {k:?}");
    }
    drop(engine);
    thread.join().unwrap();
}
