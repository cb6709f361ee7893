//! The continuous-batching engine against mlx-lm 0.32.2 (goldens from
//! `xtask/oracle/goldens_batch.py`): a request alone returns exactly what `stream_generate`
//! returns (L1), requests joining and leaving a running batch return their single-run tokens
//! with bit-equal log-probabilities (on the CPU backend),
//! a cancelled request frees its row, and a follow-up request reuses the cached prefix.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver};
use std::thread::JoinHandle;

use mlx_engine::batch::{BatchEvent, BatchRequest, Engine, EngineConfig};
use mlx_engine::stream::FinishReason;
use mlx_engine::Tokenizer;
use mlx_models::load::{load_model_dir, LoadOptions};
use serde_json::Value;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat")
}

fn golden() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/batch.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The engine and its thread. Dropping it drops the handle, then waits for the thread: no
/// engine thread may still be freeing MLX arrays while the test process exits (that raced
/// MLX's static destructors and corrupted the heap at exit).
struct Running {
    engine: Option<Engine>,
    thread: Option<JoinHandle<()>>,
}

impl std::ops::Deref for Running {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        self.engine.as_ref().expect("engine present until drop")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.engine.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start_with(config: EngineConfig) -> Running {
    let dir = fixture();
    let (engine, thread) = Engine::start(
        move || {
            let (model, _) = load_model_dir(&dir, &LoadOptions::default())?;
            Ok((model, Tokenizer::from_dir(&dir)?))
        },
        config,
    )
    .unwrap();
    Running {
        engine: Some(engine),
        thread: Some(thread),
    }
}

fn start(max_batch: usize, prompt_cache_entries: usize) -> Running {
    start_with(EngineConfig {
        max_batch,
        prompt_cache_entries,
        ..EngineConfig::default()
    })
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> BatchRequest {
    BatchRequest {
        prompt,
        max_tokens,
        sampler: Default::default(),
        processors: Default::default(),
        stop_strings: Vec::new(),
        logprobs: false,
        top_logprobs: 0,
        seed: None,
        timeout: None,
        num_draft_tokens: None,
        grammar: None,
    }
}

/// A token's log-probability and its step's top alternatives.
type TokenLogprobs = (Option<f32>, Vec<(u32, f32)>);

#[derive(Debug, Default)]
struct Outcome {
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
    cached_tokens: usize,
    logprobs: Vec<TokenLogprobs>,
}

fn submit(engine: &Engine, r: BatchRequest) -> Receiver<BatchEvent> {
    let (tx, rx) = channel();
    engine.submit(r, Box::new(tx)).unwrap();
    rx
}

/// Reads events until the request ends (or until `limit` tokens when given).
fn read(rx: &Receiver<BatchEvent>, out: &mut Outcome, limit: Option<usize>) {
    while limit.is_none_or(|l| out.tokens.len() < l) {
        match rx.recv().unwrap() {
            BatchEvent::Started { cached_tokens, .. } => out.cached_tokens = cached_tokens,
            BatchEvent::Token {
                token,
                text,
                logprob,
                top_logprobs,
            } => {
                out.tokens.push(token);
                out.text.push_str(&text);
                out.logprobs.push((logprob, top_logprobs));
            }
            BatchEvent::Done {
                text,
                finish_reason,
                ..
            } => {
                out.text.push_str(&text);
                out.finish = Some(finish_reason);
                return;
            }
            BatchEvent::Error(e) => panic!("engine error: {e}"),
        }
    }
}

fn run(engine: &Engine, r: BatchRequest) -> Outcome {
    let rx = submit(engine, r);
    let mut out = Outcome::default();
    read(&rx, &mut out, None);
    out
}

#[test]
fn a_request_alone_equals_mlx_lm_stream_generate() {
    let g = golden();
    let max = g["max_tokens"].as_u64().unwrap() as usize;
    let engine = start(1, 0);
    for c in g["cases"].as_array().unwrap() {
        let out = run(&engine, request(ids(&c["prompt"]), max));
        assert_eq!(out.tokens, ids(&c["tokens"]), "case {c}");
        assert_eq!(out.text, c["text"].as_str().unwrap());
        assert_eq!(out.finish.map(|f| f.as_str()), c["finish_reason"].as_str());
    }
}

#[test]
fn rows_joining_and_leaving_a_running_batch_keep_their_single_run_tokens() {
    let g = golden();
    let cases = g["cases"].as_array().unwrap();
    let engine = start(8, 0);
    // Different lengths, so that rows leave at different steps; the second half joins while
    // the first half is decoding.
    let lens: Vec<usize> = (0..cases.len()).map(|i| 8 + 2 * i).collect();
    let mut rxs = Vec::new();
    let mut outs: Vec<Outcome> = (0..cases.len()).map(|_| Outcome::default()).collect();
    let half = cases.len() / 2;
    let req = |c: &Value, n: usize| {
        let mut r = request(ids(&c["prompt"]), n);
        r.logprobs = true;
        r
    };
    for (i, c) in cases.iter().enumerate().take(half) {
        rxs.push(submit(&engine, req(c, lens[i])));
    }
    for (rx, out) in rxs.iter().zip(outs.iter_mut()) {
        read(rx, out, Some(3));
    }
    for (i, c) in cases.iter().enumerate().skip(half) {
        rxs.push(submit(&engine, req(c, lens[i])));
    }
    for (rx, out) in rxs.iter().zip(outs.iter_mut()) {
        read(rx, out, None);
    }
    let mut agree = 0;
    let mut total = 0;
    for (i, (c, out)) in cases.iter().zip(&outs).enumerate() {
        let want = &ids(&c["tokens"])[..lens[i]];
        total += want.len();
        agree += want.iter().zip(&out.tokens).filter(|(a, b)| a == b).count();
        assert_eq!(out.finish, Some(FinishReason::Length));
    }
    assert!(
        engine.stats().max_batch_seen.load(Ordering::Relaxed) > half,
        "the two halves never ran in one batch"
    );
    assert_eq!(
        agree, total,
        "batched greedy tokens agreeing with single runs"
    );
    // The log-probabilities of those tokens against the same requests run alone.
    let alone = start(1, 0);
    let (mut same_bits, mut n, mut max_diff) = (0, 0, 0f32);
    for (i, (c, out)) in cases.iter().zip(&outs).enumerate() {
        let single = run(&alone, req(c, lens[i]));
        for (a, b) in out.logprobs.iter().zip(&single.logprobs) {
            let (a, b) = (a.0.unwrap(), b.0.unwrap());
            n += 1;
            same_bits += usize::from(a.to_bits() == b.to_bits());
            max_diff = max_diff.max((a - b).abs());
        }
    }
    // On the CPU backend with this model the batched step is bit-exact with the single one.
    assert_eq!(
        same_bits, n,
        "batched vs alone: {same_bits}/{n} token log-probabilities bit-equal, max |diff| {max_diff:e}"
    );
}

#[test]
fn a_cancelled_request_leaves_the_batch_and_the_others_finish_unchanged() {
    let g = golden();
    let cases = g["cases"].as_array().unwrap();
    let engine = start(4, 0);
    let gone = submit(&engine, request(ids(&cases[0]["prompt"]), 1000));
    let mut first = Outcome::default();
    read(&gone, &mut first, Some(2));
    drop(gone);
    let keep = submit(&engine, request(ids(&cases[1]["prompt"]), 24));
    let mut out = Outcome::default();
    read(&keep, &mut out, None);
    assert_eq!(out.tokens, ids(&cases[1]["tokens"]));
    let again = run(&engine, request(ids(&cases[2]["prompt"]), 24));
    assert_eq!(again.tokens, ids(&cases[2]["tokens"]));
    // The cancelled row left: the engine goes idle long before its 1000 tokens (bounded
    // polling for the counter the engine thread updates after its step; no timing assertion).
    let stats = engine.stats();
    for _ in 0..1000 {
        if stats.active.load(Ordering::Relaxed) == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(stats.active.load(Ordering::Relaxed), 0);
    assert!(stats.decode_steps.load(Ordering::Relaxed) < 1000);
}

#[test]
fn a_follow_up_request_reuses_the_cached_prefix() {
    let g = golden();
    let c = &g["cases"][0];
    let engine = start(2, 4);
    let first = run(&engine, request(ids(&c["prompt"]), 10));
    assert_eq!(first.cached_tokens, 0);
    // The next turn: prompt, reply, and more.
    let mut next = ids(&c["prompt"]);
    next.extend(&first.tokens);
    next.extend([2, 0, 1, 40, 41]);
    let warm = run(&engine, request(next.clone(), 10));
    assert!(
        warm.cached_tokens >= ids(&c["prompt"]).len(),
        "reused {} tokens",
        warm.cached_tokens
    );
    let cold = run(&start(1, 0), request(next, 10));
    assert_eq!(warm.tokens, cold.tokens);
}

#[test]
fn stop_strings_and_logprobs() {
    let g = golden();
    let c = &g["cases"][4];
    let text = c["text"].as_str().unwrap();
    let stop: String = text.chars().skip(5).take(3).collect();
    let engine = start(2, 0);
    let mut r = request(ids(&c["prompt"]), 24);
    r.stop_strings = vec![stop.clone()];
    r.logprobs = true;
    r.top_logprobs = 3;
    let out = run(&engine, r);
    assert_eq!(out.finish, Some(FinishReason::Stop));
    assert_eq!(out.text, text[..text.find(&stop).unwrap()]);
    for (t, (lp, top)) in out.tokens.iter().zip(&out.logprobs) {
        // Greedy: the token is the most likely one.
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].0, *t);
        assert_eq!(Some(top[0].1), *lp);
        assert!(top[0].1 >= top[1].1 && top[1].1 >= top[2].1);
    }
}

/// Requests that join in the same step are prefilled together (left-padded to the longest, in
/// chunks), and each still returns its single-run tokens (mlx-lm's `stream_generate`, the
/// goldens) with log-probabilities bit-equal to the same request run alone.
#[test]
fn requests_joining_in_one_step_are_prefilled_together_and_keep_their_single_run_tokens() {
    let g = golden();
    let max = g["max_tokens"].as_u64().unwrap() as usize;
    let cases = g["cases"].as_array().unwrap();
    let req = |prompt: Vec<u32>| {
        let mut r = request(prompt, max);
        r.logprobs = true;
        r.top_logprobs = 2;
        r
    };
    // The golden prompts (lengths 5 to 60) plus a one-token prompt (nothing to prefill but its
    // last token).
    let mut prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["prompt"])).collect();
    prompts.push(vec![70]);
    let alone = start(1, 0);
    let singles: Vec<Outcome> = prompts
        .iter()
        .map(|p| run(&alone, req(p.clone())))
        .collect();
    for (c, s) in cases.iter().zip(&singles) {
        assert_eq!(s.tokens, ids(&c["tokens"]), "single run vs mlx-lm");
    }
    // Long prompts in chunks of 7 too, so chunk boundaries fall inside the padding.
    for step in [2048, 7] {
        let engine = start_with(EngineConfig {
            max_batch: 16,
            prompt_cache_entries: 0,
            prefill_step_size: step,
            ..EngineConfig::default()
        });
        let mut rxs = Vec::new();
        let group = prompts
            .iter()
            .map(|p| {
                let (tx, rx) = channel();
                rxs.push(rx);
                (
                    req(p.clone()),
                    Box::new(tx) as Box<dyn mlx_engine::batch::EventSink>,
                )
            })
            .collect();
        engine.submit_group(group).unwrap();
        let outs: Vec<Outcome> = rxs
            .iter()
            .map(|rx| {
                let mut out = Outcome::default();
                read(rx, &mut out, None);
                out
            })
            .collect();
        assert_eq!(engine.stats().batched_prefills.load(Ordering::Relaxed), 1);
        let (mut same, mut n) = (0, 0);
        for (i, (out, single)) in outs.iter().zip(&singles).enumerate() {
            assert_eq!(out.tokens, single.tokens, "step {step}, prompt {i}");
            assert_eq!(out.text, single.text);
            assert_eq!(out.finish, single.finish);
            for (a, b) in out.logprobs.iter().zip(&single.logprobs) {
                n += 1 + a.1.len();
                same += usize::from(a.0.unwrap().to_bits() == b.0.unwrap().to_bits());
                same +=
                    a.1.iter()
                        .zip(&b.1)
                        .filter(|(x, y)| x.0 == y.0 && x.1.to_bits() == y.1.to_bits())
                        .count();
            }
        }
        // On the CPU backend the padded, batched prefill is bit-exact with the single one.
        assert_eq!(
            same, n,
            "step {step}: {same}/{n} log-probabilities bit-equal"
        );
    }
}

/// Rows sharing one logit bias get it in one batched application: their tokens and
/// log-probabilities stay those of the same requests run alone.
#[test]
fn a_logit_bias_shared_by_every_row_keeps_single_run_results() {
    let g = golden();
    let cases = g["cases"].as_array().unwrap();
    let req = |c: &Value| {
        let mut r = request(ids(&c["prompt"]), 12);
        r.logprobs = true;
        r.processors.logit_bias = vec![(2, -100.0), (70, 3.5), (71, -1.25)];
        r
    };
    let alone = start(1, 0);
    let singles: Vec<Outcome> = cases.iter().map(|c| run(&alone, req(c))).collect();
    let engine = start(16, 0);
    let mut rxs = Vec::new();
    let group = cases
        .iter()
        .map(|c| {
            let (tx, rx) = channel();
            rxs.push(rx);
            (
                req(c),
                Box::new(tx) as Box<dyn mlx_engine::batch::EventSink>,
            )
        })
        .collect();
    engine.submit_group(group).unwrap();
    for (rx, single) in rxs.iter().zip(&singles) {
        let mut out = Outcome::default();
        read(rx, &mut out, None);
        assert_eq!(out.tokens, single.tokens);
        let bits = |o: &Outcome| -> Vec<u32> {
            o.logprobs.iter().map(|l| l.0.unwrap().to_bits()).collect()
        };
        assert_eq!(bits(&out), bits(single));
    }
    assert!(engine.stats().max_batch_seen.load(Ordering::Relaxed) > 1);
}

/// What the engine thread did, in its order: tokens of the running row, the other requests'
/// events and the embeddings reply.
type Log = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, BatchEvent)>>>;

/// A sink writing into the shared log; once `stop` is set it reports its client gone.
struct LogSink {
    name: &'static str,
    log: Log,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl mlx_engine::batch::EventSink for LogSink {
    fn send(&mut self, event: BatchEvent) -> bool {
        self.log.lock().unwrap().push((self.name, event));
        !self.stop.load(Ordering::SeqCst)
    }
    fn is_closed(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

fn logged(log: &Log, name: &str) -> Vec<BatchEvent> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(n, _)| *n == name)
        .map(|(_, e)| e.clone())
        .collect()
}

/// Large work does not stall a running row: a long prompt's prefill and many embedding inputs
/// run one slice at a time (a prefill chunk of `prefill_step_size` positions, embedding inputs
/// of at most that many tokens together), each followed by a decode step of the running row,
/// so the row gets a token after every slice. The results are those of the same work done at
/// once: the long prompt's tokens and log-probabilities as when it runs alone, the embeddings
/// bit-equal to one `embed` call over every input.
#[test]
fn large_work_runs_in_slices_between_the_decode_steps_of_a_running_row() {
    let step = 16;
    let config = EngineConfig {
        max_batch: 4,
        prompt_cache_entries: 0,
        prefill_step_size: step,
        ..EngineConfig::default()
    };
    let engine = start_with(config.clone());
    let log: Log = Default::default();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sink = |name| {
        Box::new(LogSink {
            name,
            log: log.clone(),
            stop: stop.clone(),
        })
    };
    // The running row never ends by itself (EOS suppressed, a large budget).
    let mut running = request(vec![5, 6, 7], 100_000);
    running.processors.logit_bias = vec![(2, -100.0)];
    engine.submit(running, sink("running")).unwrap();
    for _ in 0..1000 {
        if logged(&log, "running").len() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stats = engine.stats();
    let slices_before = stats.slices.load(Ordering::SeqCst);
    let tokens_before = logged(&log, "running").len();
    // 20 chunks of prefill; 40 embedding inputs of 3 to 30 tokens (several short ones per
    // slice, each long one alone).
    let long_prompt: Vec<u32> = (0..20 * step + 1)
        .map(|i| 3 + (i * 7 % 120) as u32)
        .collect();
    let mut long = request(long_prompt.clone(), 4);
    long.logprobs = true;
    engine.submit(long.clone(), sink("long")).unwrap();
    let inputs: Vec<Vec<i32>> = (0..40)
        .map(|i| {
            (0..3 + (i * 11) % 28)
                .map(|j| 3 + (i + j) * 5 % 120)
                .collect()
        })
        .collect();
    let (tx, embedded) = channel();
    let reply_log = log.clone();
    engine
        .submit_embed(
            inputs.clone(),
            Box::new(move |r| {
                reply_log
                    .lock()
                    .unwrap()
                    .push(("embed", BatchEvent::Error(String::new())));
                tx.send(r).unwrap();
            }),
        )
        .unwrap();
    let rows = embedded.recv().unwrap().unwrap();
    for _ in 0..2000 {
        if logged(&log, "long")
            .iter()
            .any(|e| matches!(e, BatchEvent::Done { .. }))
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let slices = stats.slices.load(Ordering::SeqCst) - slices_before;
    // The running row's tokens while the large work ran: one after every slice.
    let during = {
        let log = log.lock().unwrap();
        let end = log
            .iter()
            .rposition(|(n, e)| {
                *n == "embed" || (*n == "long" && matches!(e, BatchEvent::Done { .. }))
            })
            .unwrap();
        log[..end].iter().filter(|(n, _)| *n == "running").count() - tokens_before
    };
    stop.store(true, Ordering::SeqCst);
    let short_inputs = inputs.iter().filter(|x| x.len() <= step).count();
    assert!(
        slices >= 20 + 40 - short_inputs,
        "{slices} slices: the work was not cut"
    );
    assert!(
        during + 1 >= slices,
        "the running row got {during} tokens during {slices} slices of large work"
    );

    // The long prompt's result is the one it has alone.
    let mut out = Outcome::default();
    for e in logged(&log, "long") {
        match e {
            BatchEvent::Token { token, logprob, .. } => {
                out.tokens.push(token);
                out.logprobs.push((logprob, Vec::new()));
            }
            BatchEvent::Error(e) => panic!("engine error: {e}"),
            _ => {}
        }
    }
    let alone = run(&start_with(config), long);
    assert_eq!(out.tokens, alone.tokens);
    let bits =
        |o: &Outcome| -> Vec<u32> { o.logprobs.iter().map(|l| l.0.unwrap().to_bits()).collect() };
    assert_eq!(bits(&out), bits(&alone));

    // The embeddings are one `embed` call's rows, bit for bit.
    let (model, _) = load_model_dir(&fixture(), &LoadOptions::default()).unwrap();
    let ids: Vec<Vec<u32>> = inputs
        .iter()
        .map(|r| r.iter().map(|&t| t as u32).collect())
        .collect();
    let want = mlx_models::embed::to_vecs(&mlx_models::embed::embed(model.as_ref(), &ids).unwrap())
        .unwrap();
    let bits = |rows: &[Vec<f32>]| -> Vec<Vec<u32>> {
        rows.iter()
            .map(|r| r.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    assert_eq!(bits(&rows), bits(&want));
    assert_eq!(stats.queued_tokens.load(Ordering::SeqCst), 0);
}

/// `max_queued_tokens` caps the prompt and embedding tokens waiting or under way: past it a
/// submission is refused, naming the count; one request is accepted whatever its size when
/// nothing is queued; the count goes back to zero when the work is done.
#[test]
fn queued_tokens_are_capped() {
    let engine = start_with(EngineConfig {
        max_batch: 2,
        prefill_step_size: 8,
        max_queued_tokens: 100,
        ..EngineConfig::default()
    });
    // 4000 tokens in 400 slices: far more than the cap, accepted as nothing is queued.
    let inputs: Vec<Vec<i32>> = (0..400).map(|i| vec![3 + i % 100; 10]).collect();
    let (tx, embedded) = channel();
    engine
        .submit_embed(
            inputs,
            Box::new(move |r| {
                tx.send(r).unwrap();
            }),
        )
        .unwrap();
    let (tx, _rx) = channel();
    match engine.submit(request(vec![5, 6, 7], 2), Box::new(tx)) {
        Err(mlx_engine::batch::SubmitError::TooManyTokens { tokens, limit, .. }) => {
            assert_eq!((tokens, limit), (3, 100));
        }
        other => panic!("expected TooManyTokens, got {other:?}"),
    }
    assert_eq!(embedded.recv().unwrap().unwrap().len(), 400);
    let stats = engine.stats();
    for _ in 0..1000 {
        if stats.queued_tokens.load(Ordering::SeqCst) == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(stats.queued_tokens.load(Ordering::SeqCst), 0);
    let out = run(&engine, request(vec![5, 6, 7], 2));
    assert_eq!(out.tokens.len(), 2);
}

/// `submit_n`: one prefill, then a row per choice. Greedy choices are each the request's
/// single-run reply (mlx-lm's tokens); sampled ones differ from each other, and a seeded
/// request repeats them.
#[test]
fn n_choices_share_one_prefill_and_decode_as_rows_of_their_own() {
    let engine = start(8, 0);
    let g = golden();
    let case = &g["cases"][0];
    let max = g["max_tokens"].as_u64().unwrap() as usize;
    let run = |r: BatchRequest, n: usize| -> Vec<Outcome> {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        let sinks: Vec<Box<dyn mlx_engine::batch::EventSink>> = txs
            .into_iter()
            .map(|tx| Box::new(tx) as Box<dyn mlx_engine::batch::EventSink>)
            .collect();
        engine.submit_n(r, sinks).unwrap();
        rxs.iter()
            .map(|rx| {
                let mut out = Outcome::default();
                read(rx, &mut out, None);
                out
            })
            .collect()
    };
    let greedy = run(request(ids(&case["prompt"]), max), 3);
    for o in &greedy {
        assert_eq!(o.tokens, ids(&case["tokens"]));
    }
    assert_eq!(
        engine.stats().prefilled_tokens.load(Ordering::Relaxed),
        ids(&case["prompt"]).len()
    );
    let mut sampled = request(ids(&case["prompt"]), 12);
    sampled.sampler.temp = 1.0;
    sampled.seed = Some(5);
    let a = run(sampled.clone(), 3);
    let b = run(sampled, 3);
    let tokens = |v: &[Outcome]| v.iter().map(|o| o.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&a), tokens(&b), "a seeded request repeats");
    assert!(a[0].tokens != a[1].tokens || a[1].tokens != a[2].tokens);
}

/// A model whose caches have no batched form (Gemma 3's rotating sliding-window caches) runs
/// its requests one at a time over its own caches: requests sent together each get the tokens
/// and log-probabilities they get alone, not an error.
#[test]
fn a_model_with_rotating_caches_serves_requests_sent_together() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlx-cli/tests/models/gemma3_text");
    let (engine, thread) = Engine::start(
        move || {
            let (model, _) = load_model_dir(&dir, &LoadOptions::default())?;
            Ok((model, Tokenizer::from_dir(&dir)?))
        },
        EngineConfig {
            max_batch: 4,
            prompt_cache_entries: 4,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let engine = Running {
        engine: Some(engine),
        thread: Some(thread),
    };
    let prompts: [Vec<u32>; 3] = [vec![5, 9, 13, 2, 7], vec![11, 3], vec![4, 4, 8, 15, 16, 23]];
    let req = |p: &Vec<u32>| BatchRequest {
        logprobs: true,
        top_logprobs: 2,
        ..request(p.clone(), 6)
    };
    let alone: Vec<Outcome> = prompts.iter().map(|p| run(&engine, req(p))).collect();
    let rxs: Vec<_> = prompts.iter().map(|p| submit(&engine, req(p))).collect();
    for (rx, a) in rxs.iter().zip(&alone) {
        let mut out = Outcome::default();
        read(rx, &mut out, None);
        assert_eq!(out.tokens, a.tokens);
        assert_eq!(out.tokens.len(), 6);
        for (x, y) in out.logprobs.iter().zip(&a.logprobs) {
            assert_eq!(x.0.map(f32::to_bits), y.0.map(f32::to_bits));
        }
    }
}

/// Records `EngineStats::active` as each event is sent (on the engine thread, in its order).
struct ActiveSink {
    stats: std::sync::Arc<mlx_engine::batch::EngineStats>,
    seen: std::sync::mpsc::Sender<(bool, usize)>,
}

impl mlx_engine::batch::EventSink for ActiveSink {
    fn send(&mut self, event: BatchEvent) -> bool {
        let done = matches!(event, BatchEvent::Done { .. } | BatchEvent::Error(_));
        let _ = self
            .seen
            .send((done, self.stats.active.load(Ordering::SeqCst)));
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// A row is counted as active before its client hears of it: a client holding the response
/// head or a token that asks `/health` sees its row (it once read 0 between the first token
/// and the engine loop's count, and a test took a live stream for a cut one). Alone and with
/// requests prefilled together.
#[test]
fn a_row_is_counted_active_before_its_first_event() {
    let engine = start_with(EngineConfig {
        max_batch: 4,
        prompt_cache_entries: 0,
        ..EngineConfig::default()
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = || {
        Box::new(ActiveSink {
            stats: engine.stats().clone(),
            seen: tx.clone(),
        }) as Box<dyn mlx_engine::batch::EventSink>
    };
    engine.submit(request(vec![5, 6, 7], 4), sink()).unwrap();
    for p in [vec![8, 9], vec![10, 11, 12, 13], vec![14]] {
        engine.submit(request(p, 3), sink()).unwrap();
    }
    drop(tx);
    let mut done = 0;
    for (is_done, active) in rx.iter().take(200) {
        if is_done {
            done += 1;
        } else {
            assert!(active >= 1, "an event went out with no active row counted");
        }
        if done == 4 {
            break;
        }
    }
    assert_eq!(done, 4);
}

/// The engine's warm-up (`EngineConfig::warm_up`, on by default where the graph decoder runs
/// the batch; forced here on the MLX path) leaves nothing behind: the statistics are zero, the
/// prompt cache is empty (no request finds a cached prefix), and the requests' tokens,
/// texts and log-probabilities are bit for bit those of an engine that did not warm up.
#[test]
fn the_warm_up_changes_no_request() {
    let g = golden();
    let cases = g["cases"].as_array().unwrap();
    let warm = start_with(EngineConfig {
        max_batch: 4,
        prompt_cache_entries: 4,
        warm_up: Some(true),
        ..EngineConfig::default()
    });
    let cold = start_with(EngineConfig {
        max_batch: 4,
        prompt_cache_entries: 4,
        warm_up: Some(false),
        ..EngineConfig::default()
    });
    let s = warm.stats();
    for (what, v) in [
        ("decode_steps", &s.decode_steps),
        ("prefilled_tokens", &s.prefilled_tokens),
        ("batched_prefills", &s.batched_prefills),
        ("decoded_rows", &s.decoded_rows),
        ("active", &s.active),
        ("queued_tokens", &s.queued_tokens),
    ] {
        assert_eq!(v.load(Ordering::Relaxed), 0, "{what} after the warm-up");
    }
    // The warm-up's own prompts (1, 2, 3, ...), then the golden cases batched with a logit
    // bias and log-probabilities.
    let mut reqs = vec![request(vec![1, 2, 3, 4, 5], 6)];
    for c in cases.iter().take(3) {
        let mut r = request(ids(&c["prompt"]), 10);
        r.logprobs = true;
        r.processors.logit_bias = vec![(0, -100.0)];
        reqs.push(r);
    }
    let go = |engine: &Engine| -> Vec<Outcome> {
        let rxs: Vec<_> = reqs.iter().map(|r| submit(engine, r.clone())).collect();
        rxs.iter()
            .map(|rx| {
                let mut out = Outcome::default();
                read(rx, &mut out, None);
                out
            })
            .collect()
    };
    let (a, b) = (go(&warm), go(&cold));
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        assert_eq!(a.cached_tokens, 0, "request {i} found a cached prefix");
        assert_eq!(a.tokens, b.tokens, "request {i}");
        assert_eq!(a.text, b.text, "request {i}");
        let bits = |o: &Outcome| -> Vec<Option<u32>> {
            o.logprobs.iter().map(|l| l.0.map(f32::to_bits)).collect()
        };
        assert_eq!(bits(a), bits(b), "request {i}: log-probabilities");
    }
}
