//! The batched CPU decoder (`mlx_engine::cpu_decode::CpuBatch`) and the continuous-batching
//! engine on it.
//!
//! Tier: bit-identical to the CPU decoder run alone. A row decoded in a batch, joining and
//! leaving while other rows run at other positions, gets the logits (compared bit for bit)
//! and so the greedy tokens that `CpuDecoder` gives the same sequence alone; the engine on
//! the CPU decoder gives each request the tokens and log-probabilities `generate_step` with
//! the CPU decoder gives it alone. (The CPU decoder itself is tier L3 against the exact path:
//! `tests/cpu_decode.rs`.)

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::thread::JoinHandle;

use mlx_core::cpu::Activations;
use mlx_core::prelude::*;
use mlx_engine::batch::{
    BatchEvent, BatchRequest, Engine, EngineConfig, EngineDecoder, PromptLookup,
};
use mlx_engine::cpu_decode::{CpuBatch, CpuCache, CpuDecoder};
use mlx_engine::generate::{generate_step, CpuDecode, GenerateOptions};
use mlx_engine::Tokenizer;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn model_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models")
        .join(name)
}

fn load(dir: &Path) -> Box<dyn LanguageModel> {
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    load_model_dir(dir, &opts)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .0
}

fn prompt(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + seed * 40_503 + 17) % vocab as u64) as u32)
        .collect()
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in l.iter().enumerate() {
        if *v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding alone: the logits (as bits) of the prompt and of each of `steps` tokens.
fn alone(model: &dyn LanguageModel, act: Activations, ids: &[u32], steps: usize) -> Vec<Vec<u32>> {
    let mut d = CpuDecoder::new(model, 2, 8).unwrap();
    d.set_activations(act);
    let mut out = Vec::new();
    let mut l = d.feed(ids).unwrap().to_vec();
    for _ in 0..steps {
        out.push(l.iter().map(|v| v.to_bits()).collect());
        let t = argmax(&l);
        l = d.feed(&[t]).unwrap().to_vec();
    }
    out
}

struct Row {
    cache: CpuCache,
    next: u32,
    seen: Vec<Vec<u32>>,
    want: Vec<Vec<u32>>,
}

/// Rows of different prompt lengths (one spanning several prefill blocks) join a running
/// batch at different steps and leave when their budget ends; every step of every row has
/// the logits of that row decoded alone.
#[test]
fn rows_joining_and_leaving_get_their_logits_alone() {
    for name in ["dense_f32", "q4_g32", "q8_g32_bf16", "dense_bf16_untied"] {
        let model = load(&model_fixture(name));
        let vocab = model.vocab_size() as usize;
        for act in [Activations::Int16, Activations::F32] {
            let mut batch = CpuBatch::new(model.as_ref(), 2).unwrap();
            batch.set_activations(act);
            // (prompt length, joins at step, tokens)
            let plan = [(5, 0, 9), (70, 0, 4), (1, 2, 7), (33, 3, 6), (12, 5, 5)];
            let mut rows: Vec<(usize, Row)> = Vec::new();
            let mut finished = 0;
            for step in 0..20 {
                for (k, &(len, at, n)) in plan.iter().enumerate() {
                    if at == step {
                        let ids = prompt(vocab, len, k as u64);
                        let mut cache = batch.new_cache(4);
                        let l = batch.prefill(&mut cache, &ids).unwrap().to_vec();
                        rows.push((
                            k,
                            Row {
                                cache,
                                next: argmax(&l),
                                seen: vec![l.iter().map(|v| v.to_bits()).collect()],
                                want: alone(model.as_ref(), act, &ids, n),
                            },
                        ));
                    }
                }
                if rows.is_empty() {
                    break;
                }
                let tokens: Vec<u32> = rows.iter().map(|(_, r)| r.next).collect();
                let mut caches: Vec<&mut CpuCache> =
                    rows.iter_mut().map(|(_, r)| &mut r.cache).collect();
                let logits = batch.step(&mut caches, &tokens).unwrap().to_vec();
                for ((_, r), l) in rows.iter_mut().zip(logits.chunks(vocab)) {
                    r.seen.push(l.iter().map(|v| v.to_bits()).collect());
                    r.next = argmax(l);
                }
                // Rows whose budget is spent leave; the others go on.
                rows.retain(|(k, r)| {
                    if r.seen.len() < r.want.len() {
                        return true;
                    }
                    for (i, (a, b)) in r.want.iter().zip(&r.seen).enumerate() {
                        assert!(
                            a == b,
                            "{name} {act:?} row {k} step {i}: not the logits alone"
                        );
                    }
                    finished += 1;
                    false
                });
            }
            assert_eq!(finished, plan.len(), "{name}: every row ran to its end");
        }
    }
}

#[test]
fn mismatched_steps_are_errors() {
    let model = load(&model_fixture("dense_f32"));
    let mut batch = CpuBatch::new(model.as_ref(), 1).unwrap();
    let mut c = batch.new_cache(4);
    assert!(batch.step(&mut [&mut c], &[1, 2]).is_err());
    assert!(batch.step(&mut [], &[]).is_err());
    let vocab = batch.vocab() as u32;
    let e = batch.step(&mut [&mut c], &[vocab]).unwrap_err().to_string();
    assert!(e.contains("vocabulary"), "{e}");
    assert!(batch.prefill(&mut c, &[]).is_err());
    // A cache of another model's shape is refused.
    let other = load(&model_fixture("dense_bf16_mha"));
    let mut oc = CpuBatch::new(other.as_ref(), 1).unwrap().new_cache(4);
    assert!(batch.step(&mut [&mut oc], &[1]).is_err());
}

// --- The engine on the CPU decoder ---

fn chat_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat")
}

struct Running {
    engine: Option<Engine>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.engine.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start(max_batch: usize, decoder: EngineDecoder) -> Running {
    let dir = chat_fixture();
    let (engine, thread) = Engine::start(
        move || {
            let (model, _) = load_model_dir(&dir, &LoadOptions::default())?;
            Ok((model, Tokenizer::from_dir(&dir)?))
        },
        EngineConfig {
            max_batch,
            decoder,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    Running {
        engine: Some(engine),
        thread: Some(thread),
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> BatchRequest {
    BatchRequest {
        prompt,
        max_tokens,
        sampler: Default::default(),
        processors: Default::default(),
        stop_strings: Vec::new(),
        logprobs: true,
        top_logprobs: 0,
        seed: None,
        timeout: None,
        num_draft_tokens: None,
        grammar: None,
    }
}

/// Tokens and log-probabilities (bits) until the request ends.
fn read(rx: &Receiver<BatchEvent>) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    loop {
        match rx.recv().unwrap() {
            BatchEvent::Token { token, logprob, .. } => {
                out.push((token, logprob.unwrap().to_bits()))
            }
            BatchEvent::Done { .. } => return out,
            BatchEvent::Error(e) => panic!("{e}"),
            BatchEvent::Started { .. } => {}
        }
    }
}

/// `generate_step` with the CPU decoder, alone: tokens and log-probabilities (bits).
fn generate_alone(
    model: &dyn LanguageModel,
    eos: &[u32],
    ids: &[u32],
    n: usize,
) -> Vec<(u32, u32)> {
    let p: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    let opts = GenerateOptions {
        max_tokens: Some(n),
        cpu_decode: Some(CpuDecode { threads: 2 }),
        ..Default::default()
    };
    let mut out = Vec::new();
    for s in generate_step(&p, model, None, opts).unwrap() {
        let s = s.unwrap();
        let lp = s
            .logprobs
            .astype(Dtype::Float32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[s.token as usize];
        out.push((s.token, lp.to_bits()));
        if eos.contains(&s.token) {
            // The engine counts EOS but does not send it as a token.
            out.pop();
            break;
        }
    }
    out
}

/// Requests of different lengths and budgets run together on the CPU decoder, one joining
/// while the others decode and each leaving at its own end: each gets what `generate_step`
/// with the CPU decoder gives it alone. The engine says which decoder runs.
#[test]
fn engine_rows_on_the_cpu_decoder_get_their_tokens_alone() {
    let dir = chat_fixture();
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let eos: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    let vocab = model.vocab_size() as usize;
    let reqs = [(7, 12), (40, 5), (2, 16), (19, 9)];
    let want: Vec<Vec<(u32, u32)>> = reqs
        .iter()
        .enumerate()
        .map(|(k, &(len, n))| {
            generate_alone(model.as_ref(), &eos, &prompt(vocab, len, k as u64), n)
        })
        .collect();
    let running = start(8, EngineDecoder::Cpu { threads: 2 });
    let engine = running.engine.as_ref().unwrap();
    assert!(engine.uses_cpu_decoder(), "{}", engine.decoder());
    let mut rxs = Vec::new();
    for (k, &(len, n)) in reqs.iter().enumerate() {
        let (tx, rx) = channel();
        engine
            .submit(request(prompt(vocab, len, k as u64), n), Box::new(tx))
            .unwrap();
        rxs.push(rx);
        if k == 2 {
            // The last one joins a running batch.
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
    }
    for (k, rx) in rxs.iter().enumerate() {
        assert_eq!(read(rx), want[k], "request {k}");
    }
    assert!(
        engine
            .stats()
            .max_batch_seen
            .load(std::sync::atomic::Ordering::Relaxed)
            > 1,
        "the requests were batched"
    );
}

/// `auto` takes the CPU decoder on the CPU backend; `mlx` keeps the exact path; `cpu` where
/// it cannot run (here: with `--kv-bits`) fails to start with the reason.
#[test]
fn the_decoder_choice_is_reported() {
    let running = start(4, EngineDecoder::Auto { threads: 1 });
    let d = running.engine.as_ref().unwrap().decoder().to_string();
    assert!(d.starts_with("cpu ("), "{d}");
    drop(running);
    let running = start(4, EngineDecoder::Mlx);
    let d = running.engine.as_ref().unwrap().decoder().to_string();
    assert!(d.starts_with("mlx"), "{d}");
    drop(running);
    let dir = chat_fixture();
    let kv = mlx_engine::batch::KvOptions {
        max_kv_size: None,
        kv_bits: Some(4),
        kv_group_size: 64,
        quantized_kv_start: 0,
        kv_mode: mlx_cache::KvMode::Affine,
    };
    let r = Engine::start(
        move || {
            let (model, _) = load_model_dir(&dir, &LoadOptions::default())?;
            Ok((model, Tokenizer::from_dir(&dir)?))
        },
        EngineConfig {
            kv: Some(kv),
            decoder: EngineDecoder::Cpu { threads: 1 },
            ..EngineConfig::default()
        },
    );
    let e = r
        .err()
        .expect("--decoder cpu with --kv-bits is refused")
        .to_string();
    assert!(e.contains("--kv-bits"), "{e}");
}

/// A follow-up continuing a finished request reuses its CPU cache in whole prefill blocks
/// (`cached_tokens`), and gets what it gets alone: the reused blocks were prefilled as a
/// full prefill cuts them.
#[test]
fn a_follow_up_reuses_whole_blocks_of_a_finished_request() {
    let dir = chat_fixture();
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let eos: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    let vocab = model.vocab_size() as usize;
    let running = start(4, EngineDecoder::Cpu { threads: 2 });
    let engine = running.engine.as_ref().unwrap();
    let run = |p: Vec<u32>, n: usize| {
        let (tx, rx) = channel();
        engine.submit(request(p, n), Box::new(tx)).unwrap();
        let mut cached = None;
        let mut out = Vec::new();
        loop {
            match rx.recv().unwrap() {
                BatchEvent::Started { cached_tokens, .. } => cached = Some(cached_tokens),
                BatchEvent::Token { token, logprob, .. } => {
                    out.push((token, logprob.unwrap().to_bits()))
                }
                BatchEvent::Done { .. } => return (cached.unwrap(), out),
                BatchEvent::Error(e) => panic!("{e}"),
            }
        }
    };
    let first = prompt(vocab, 70, 9);
    let (cached, reply) = run(first.clone(), 6);
    assert_eq!(cached, 0);
    let mut second = first.clone();
    second.extend(reply.iter().map(|t| t.0));
    second.extend(prompt(vocab, 10, 3));
    let (cached, reply2) = run(second.clone(), 8);
    assert_eq!(cached, 64, "two whole blocks of the 70-token prompt");
    assert_eq!(reply2, generate_alone(model.as_ref(), &eos, &second, 8));
    let hits = engine
        .stats()
        .prompt_cache_hits
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(hits, 1);
}

/// `mlx serve --prompt-lookup-ngram`: with the CPU decoder running the batch, a greedy request
/// runs alone by prompt lookup (no batched decode step) and gets plain greedy decoding's
/// tokens; a sampled one is batched as before.
#[test]
fn prompt_lookup_requests_keep_greedy_tokens() {
    let dir = chat_fixture();
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let eos: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    let vocab = model.vocab_size() as usize;
    let d = dir.clone();
    let (engine, thread) = Engine::start(
        move || {
            let (model, _) = load_model_dir(&d, &LoadOptions::default())?;
            Ok((model, Tokenizer::from_dir(&d)?))
        },
        EngineConfig {
            decoder: EngineDecoder::Cpu { threads: 2 },
            prompt_lookup: Some(PromptLookup {
                ngram: 1,
                num_draft_tokens: 4,
            }),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let running = Running {
        engine: Some(engine),
        thread: Some(thread),
    };
    let engine = running.engine.as_ref().unwrap();
    let mut p = prompt(vocab, 12, 5);
    p.extend(p.clone());
    let (tx, rx) = channel();
    engine.submit(request(p.clone(), 24), Box::new(tx)).unwrap();
    let got: Vec<u32> = read(&rx).iter().map(|t| t.0).collect();
    let want: Vec<u32> = generate_alone(model.as_ref(), &eos, &p, 24)
        .iter()
        .map(|t| t.0)
        .collect();
    assert_eq!(got, want);
    let steps = || {
        engine
            .stats()
            .decode_steps
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(
        steps(),
        0,
        "the greedy request ran by prompt lookup, not batched"
    );
    let mut sampled = request(p, 4);
    sampled.sampler.temp = 0.7;
    sampled.seed = Some(1);
    let (tx, rx) = channel();
    engine.submit(sampled, Box::new(tx)).unwrap();
    read(&rx);
    assert!(steps() > 0, "a sampled request is batched");
}
