//! The engine's glue around the graph decoder (`generate_step` with `graph_decode`), on the
//! CPU: a stand-in decoder ([`GraphStandIn`]) that computes each step with the model's own MLX
//! forward over a cache copied from the prompt's, so that every token must equal the MLX
//! path's, bit for bit. It checks what the CUDA test (`graph_decode_cuda.rs`) cannot tell
//! apart from a kernel fault: the prompt's cache handed over, the first token, the decoder
//! built after the prompt ran, host sampling and logits processors fed the decoder's logits,
//! and the fall-back to the MLX path on a failed call, on non-finite values and on a failed
//! build.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mlx_cache::{Cache, KVCache};
use mlx_core::{ops, Array, Dtype};
use mlx_engine::generate::{generate_step, GenerateOptions, PromptProgress};
use mlx_engine::graph::{GraphBackend, GraphKeep, GraphStandIn, KeptDecoder};
use mlx_engine::sample::{LogitsProcessor, Sampler, SamplerSettings};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

/// What the stand-in does wrong, and what it saw.
#[derive(Default)]
struct Script {
    /// The `n`-th decoder step (0-based) fails as a CUDA call would.
    fail_at: Option<usize>,
    /// The `n`-th decoder step gives NaN values.
    nan_at: Option<usize>,
    /// The build fails.
    fail_build: bool,
    /// The first build fails (out of device memory), a second one works.
    fail_first_build: bool,
    /// The device bytes the stand-in says it holds outside MLX's allocator.
    device_bytes: usize,
    /// Events in order: "progress N" from the prompt, "build", "prefix N".
    log: Vec<String>,
}

struct StandIn<'a> {
    model: &'a dyn LanguageModel,
    caches: Vec<Box<dyn Cache>>,
    pending: Option<u32>,
    steps: usize,
    script: Arc<Mutex<Script>>,
}

fn err(message: &str) -> mlx_core::Error {
    mlx_core::Error::Mlx {
        op: "stand_in",
        message: message.into(),
    }
}

impl StandIn<'_> {
    /// The logits after `token` (bfloat16, as the model gives them) and the step's index.
    fn forward(&mut self, token: u32) -> mlx_core::Result<Array> {
        let step = self.steps;
        self.steps += 1;
        let s = self.script.lock().unwrap();
        if s.fail_at == Some(step) {
            return Err(err("injected failure"));
        }
        let nan = s.nan_at == Some(step);
        drop(s);
        let x = Array::from_slice(&[token as i32], &[1, 1])?;
        let logits = self
            .model
            .forward(&x, Some(&mut self.caches))
            .map_err(|e| err(&e.to_string()))?;
        let logits = ops::squeeze(&logits, &[1], None)?;
        if nan {
            let n = Array::from_slice(&[f32::NAN], &[1])?.astype(logits.dtype())?;
            return ops::multiply(&logits, &n, None);
        }
        Ok(logits)
    }
}

impl GraphBackend for StandIn<'_> {
    fn set_prefix(&mut self, kv: &[(Array, Array)]) -> mlx_core::Result<()> {
        let n = kv[0].0.shape()[2];
        self.script.lock().unwrap().log.push(format!("prefix {n}"));
        for (a, _) in kv {
            assert_eq!(a.dtype(), Dtype::Bfloat16, "the prompt's keys are bfloat16");
        }
        self.caches = kv
            .iter()
            .map(|(k, v)| {
                let mut c = KVCache::new();
                c.update_and_fetch(k, v).unwrap();
                Box::new(c) as Box<dyn Cache>
            })
            .collect();
        Ok(())
    }

    fn start(&mut self, first: u32, max_steps: usize) -> mlx_core::Result<()> {
        self.script
            .lock()
            .unwrap()
            .log
            .push(format!("start {first} {max_steps}"));
        self.pending = Some(first);
        Ok(())
    }

    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)> {
        let t = self.pending.take().expect("started");
        let (tok, lp) = greedy_pick(&self.forward(t)?)?;
        self.pending = Some(tok);
        Ok((tok, lp))
    }

    fn step_logits(&mut self, token: u32) -> mlx_core::Result<Vec<f32>> {
        self.forward(token)?.astype(Dtype::Float32)?.to_vec::<f32>()
    }

    fn inject_failure_after(&mut self, n: usize) {
        self.script.lock().unwrap().fail_at = Some(n);
    }

    fn feed_prompt(&mut self, tokens: &[u32]) -> mlx_core::Result<()> {
        self.script
            .lock()
            .unwrap()
            .log
            .push(format!("feed {}", tokens.len()));
        // One forward, as the MLX path runs a prompt of at most `prefill_step_size` tokens.
        self.caches = self.model.make_cache();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let x = Array::from_slice(&ids, &[1, ids.len() as i32])?;
        let logits = self
            .model
            .forward(&x, Some(&mut self.caches))
            .map_err(|e| err(&e.to_string()))?;
        logits.eval()
    }

    fn device_bytes(&self) -> usize {
        self.script.lock().unwrap().device_bytes
    }
}

fn stand_in(script: &Arc<Mutex<Script>>) -> GraphStandIn {
    let script = script.clone();
    GraphStandIn(Arc::new(move |model, _room| {
        let mut s = script.lock().unwrap();
        s.log.push("build".into());
        if s.fail_build {
            return Err(err("no device memory"));
        }
        if s.fail_first_build && s.log.iter().filter(|e| *e == "build").count() == 1 {
            return Err(err("no device memory"));
        }
        Ok(Box::new(StandIn {
            model,
            caches: Vec::new(),
            pending: None,
            steps: 0,
            script: script.clone(),
        }) as Box<dyn GraphBackend + '_>)
    }))
}

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn model() -> Box<dyn LanguageModel> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models/dense_bf16_mha");
    load_model_dir(&dir, &LoadOptions::default()).unwrap().0
}

fn prompt(vocab: i32) -> Vec<i32> {
    (0..40).map(|i| (i * 7919 + 13) % vocab).collect()
}

/// The tokens (and the fall-back's reason) of a generation, on the MLX path or through the
/// stand-in with `script`.
fn run(
    model: &dyn LanguageModel,
    base: &GenerateOptions,
    script: Option<Script>,
) -> (Vec<u32>, Vec<Option<f32>>, Option<String>, Vec<String>) {
    let script = script.map(|s| Arc::new(Mutex::new(s)));
    let mut opts = base.clone();
    if let Some(s) = &script {
        opts.graph_decode = true;
        opts.graph_stand_in = Some(stand_in(s));
        let s = s.clone();
        opts.prompt_progress = Some(PromptProgress(Arc::new(move |done, _| {
            s.lock().unwrap().log.push(format!("progress {done}"));
        })));
    }
    // The global key is the process's: one seeded generation at a time across the tests.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    mlx_core::random::seed(11).unwrap();
    let p = prompt(model.vocab_size());
    let mut g = generate_step(&p, model, None, opts).unwrap();
    let steps: Vec<_> = g.by_ref().map(|s| s.unwrap()).collect();
    let why = g.graph_fallback().map(str::to_string);
    let caches = g.into_cache();
    assert_eq!(
        caches[0].offset(),
        p.len() + steps.len(),
        "the caches hold every token returned"
    );
    let log = script.map_or(Vec::new(), |s| std::mem::take(&mut s.lock().unwrap().log));
    (
        steps.iter().map(|s| s.token).collect(),
        steps.iter().map(|s| s.logprob).collect(),
        why,
        log,
    )
}

fn base() -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(10),
        prefill_step_size: 16,
        ..GenerateOptions::default()
    }
}

#[test]
fn greedy_tokens_are_the_mlx_paths_and_the_decoder_is_built_after_the_prompt() {
    let m = model();
    let (want, _, _, _) = run(m.as_ref(), &base(), None);
    let (got, lps, why, log) = run(m.as_ref(), &base(), Some(Script::default()));
    assert_eq!(got, want);
    assert_eq!(why, None);
    assert_eq!(lps[0], None, "the first token is the MLX forward's");
    assert!(lps[1..]
        .iter()
        .all(|l| l.is_some_and(|l| l.is_finite() && l <= 0.0)));
    // The prompt ran (chunks of 16 of its first 39 tokens) before the decoder was built, and
    // the decoder took the prompt's 40 positions.
    let at = log.iter().position(|e| e == "build").unwrap();
    assert!(log[..at].contains(&"progress 39".to_string()), "{log:?}");
    assert!(log[at..].contains(&"prefix 40".to_string()), "{log:?}");
}

/// The decoder starts from the MLX forward's first token before that token is handed out (its
/// first steps then run while the caller handles it, as mlx-lm queues its next step before it
/// yields a token); a caller that stops after that token gets the caches the MLX path leaves.
#[test]
fn the_decoder_starts_before_the_first_token_is_handed_out() {
    let m = model();
    let p = prompt(m.vocab_size());
    let first_only = |script: Option<&Arc<Mutex<Script>>>| {
        let mut opts = base();
        if let Some(s) = script {
            opts.graph_decode = true;
            opts.graph_stand_in = Some(stand_in(s));
        }
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        mlx_core::random::seed(11).unwrap();
        let mut g = generate_step(&p, m.as_ref(), None, opts).unwrap();
        let first = g.next().unwrap().unwrap().token;
        (first, g.into_cache()[0].offset())
    };
    let (want, mlx_offset) = first_only(None);
    let script = Arc::new(Mutex::new(Script::default()));
    let (got, offset) = first_only(Some(&script));
    assert_eq!(got, want);
    assert_eq!(
        mlx_offset,
        p.len() + 1,
        "the MLX path ran the first token's step"
    );
    assert_eq!(offset, mlx_offset, "the caches as the MLX path leaves them");
    let log = std::mem::take(&mut script.lock().unwrap().log);
    // Started from the first token, for the 9 tokens after it (max_tokens 10).
    assert!(log.contains(&"prefix 40".to_string()), "{log:?}");
    assert!(log.contains(&format!("start {want} 9")), "{log:?}");
    // max_tokens 1: nothing to start.
    let script = Arc::new(Mutex::new(Script::default()));
    let mut opts = GenerateOptions {
        max_tokens: Some(1),
        ..base()
    };
    opts.graph_decode = true;
    opts.graph_stand_in = Some(stand_in(&script));
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut g = generate_step(&p, m.as_ref(), None, opts).unwrap();
    assert_eq!(g.by_ref().count(), 1);
    // The caches as the MLX path leaves them (its step of the only token ran): that token
    // was pending for them.
    assert_eq!(g.into_cache()[0].offset(), p.len() + 1);
    let log = std::mem::take(&mut script.lock().unwrap().log);
    assert!(!log.iter().any(|e| e.starts_with("start")), "{log:?}");
}

#[test]
fn sampling_and_processors_on_the_host_take_the_decoders_logits() {
    let m = model();
    let settings = SamplerSettings {
        temp: 0.8,
        top_p: 0.95,
        min_p: 0.02,
        ..SamplerSettings::default()
    };
    let sampled = GenerateOptions {
        sampler: Sampler::new(settings),
        ..base()
    };
    let (want, _, _, _) = run(m.as_ref(), &sampled, None);
    let (got, _, why, _) = run(m.as_ref(), &sampled, Some(Script::default()));
    assert_eq!(why, None);
    assert_eq!(got, want, "seeded sampling from the decoder's logits");
    // A logits processor needs the decoded token ids (it failed with "no input ids").
    let penalised = GenerateOptions {
        logits_processors: vec![LogitsProcessor::Repetition {
            penalty: 1.3,
            context_size: 20,
        }],
        ..base()
    };
    let (want, _, _, _) = run(m.as_ref(), &penalised, None);
    let (got, _, why, _) = run(m.as_ref(), &penalised, Some(Script::default()));
    assert_eq!(why, None);
    assert_eq!(got, want, "repetition penalty over the decoder's logits");
}

#[test]
fn a_failed_call_non_finite_values_or_a_failed_build_hand_the_run_to_mlx() {
    let m = model();
    let sampled = GenerateOptions {
        sampler: Sampler::new(SamplerSettings {
            temp: 0.7,
            ..SamplerSettings::default()
        }),
        ..base()
    };
    for opts in [base(), sampled] {
        let (want, _, _, _) = run(m.as_ref(), &opts, None);
        let cases = [
            (
                Script {
                    fail_at: Some(3),
                    ..Script::default()
                },
                "injected failure",
            ),
            (
                Script {
                    nan_at: Some(4),
                    ..Script::default()
                },
                "non-finite",
            ),
            (
                Script {
                    nan_at: Some(0),
                    ..Script::default()
                },
                "non-finite",
            ),
            (
                Script {
                    fail_build: true,
                    ..Script::default()
                },
                "could not be built",
            ),
        ];
        for (script, says) in cases {
            let (got, _, why, _) = run(m.as_ref(), &opts, Some(script));
            assert_eq!(got, want, "{says}: the MLX path finishes the run");
            let why = why.expect("the fall-back is noted");
            assert!(why.contains(says), "{why}");
        }
        // A build short of device memory while MLX caches the prompt's freed buffers: the
        // cache is given back and the second build decodes the run.
        let (got, _, why, log) = run(
            m.as_ref(),
            &opts,
            Some(Script {
                fail_first_build: true,
                ..Script::default()
            }),
        );
        assert_eq!(got, want);
        assert_eq!(why, None, "{log:?}");
        assert_eq!(log.iter().filter(|e| *e == "build").count(), 2, "{log:?}");
        assert!(log.iter().any(|e| e.starts_with("prefix")), "{log:?}");
    }
}

/// `mlx chat`'s turns: the second generation continues the first's cache (the decoder copies
/// the whole cache in; `into_cache` brings the MLX caches up to the decoder's tokens), and
/// gives the MLX path's tokens.
#[test]
fn a_continued_prompt_cache_is_copied_in_whole() {
    let m = model();
    let two_turns = |graph: bool| -> (Vec<u32>, usize) {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let script = Arc::new(Mutex::new(Script::default()));
        let opts = || GenerateOptions {
            graph_decode: graph,
            graph_stand_in: graph.then(|| stand_in(&script)),
            ..base()
        };
        let p = prompt(m.vocab_size());
        let mut g = generate_step(&p, m.as_ref(), None, opts()).unwrap();
        let mut toks: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
        assert_eq!(g.uses_graph_decoder(), graph);
        let caches = g.into_cache();
        let mut g = generate_step(&p[..7], m.as_ref(), Some(caches), opts()).unwrap();
        toks.extend(g.by_ref().map(|s| s.unwrap().token));
        assert_eq!(g.uses_graph_decoder(), graph);
        assert_eq!(g.graph_fallback(), None);
        let offset = g.into_cache()[0].offset();
        if graph {
            let log = &script.lock().unwrap().log;
            assert!(log.contains(&"prefix 57".to_string()), "{log:?}");
        }
        (toks, offset)
    };
    let want = two_turns(false);
    assert_eq!(want.1, 40 + 10 + 7 + 10);
    assert_eq!(two_turns(true), want);
}

/// A continued prompt cache the decoder cannot take (here rotating ones) is refused up front,
/// naming it (`mlx generate --decoder auto` stays on MLX for such a cache file).
#[test]
fn a_continued_cache_of_another_kind_is_refused() {
    let m = model();
    let caches: Vec<Box<dyn Cache>> = (0..m.num_layers())
        .map(|_| Box::new(mlx_cache::RotatingKVCache::new(64, 4).unwrap()) as Box<dyn Cache>)
        .collect();
    let script = Arc::new(Mutex::new(Script::default()));
    let opts = GenerateOptions {
        graph_decode: true,
        graph_stand_in: Some(stand_in(&script)),
        ..base()
    };
    let p = prompt(m.vocab_size());
    let e = generate_step(&p, m.as_ref(), Some(caches), opts)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("RotatingKVCache"), "{e}");
}

/// The CUDA test's sequence of generations on one model (`graph_decode_cuda.rs`,
/// `engine_backend`: greedy, a failed decoder, top-k 1, then seeded sampling on both paths) on
/// the stand-in: each generation finishes its work before the next seeds, so every seeded
/// run repeats itself and the MLX path's, whatever ran before it.
#[test]
fn seeded_runs_repeat_after_greedy_failed_and_top_k_runs() {
    let m = model();
    let warm = GenerateOptions {
        sampler: Sampler::new(SamplerSettings {
            temp: 0.8,
            top_p: 0.95,
            min_p: 0.02,
            ..SamplerSettings::default()
        }),
        ..base()
    };
    let mlx1 = run(m.as_ref(), &warm, None).0;
    let greedy = run(m.as_ref(), &base(), Some(Script::default())).0;
    let failed = run(
        m.as_ref(),
        &base(),
        Some(Script {
            fail_at: Some(3),
            ..Script::default()
        }),
    );
    assert_eq!(failed.0, greedy);
    assert!(failed.2.is_some());
    let top1 = GenerateOptions {
        sampler: Sampler::new(SamplerSettings {
            temp: 1.0,
            top_k: 1,
            ..SamplerSettings::default()
        }),
        ..base()
    };
    assert_eq!(run(m.as_ref(), &top1, Some(Script::default())).0, greedy);
    let x = run(m.as_ref(), &warm, Some(Script::default()));
    let y = run(m.as_ref(), &warm, Some(Script::default()));
    assert_eq!((x.2.as_deref(), y.2.as_deref()), (None, None));
    let mlx2 = run(m.as_ref(), &warm, None).0;
    assert_eq!(mlx1, mlx2, "the MLX path, seeded");
    assert_eq!(x.0, mlx1, "the stand-in's seeded run is the MLX path's");
    assert_eq!(y.0, x.0, "seeded");
}

#[test]
fn the_decoders_own_device_bytes_are_counted_in_the_runs_peak() {
    // MLX's peak memory does not see the buffers a graph decoder allocates itself (its own
    // layout of the weights, its cache): the run reports them, and the stream's peak adds
    // them.
    let m = model();
    let p = prompt(m.vocab_size());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = Arc::new(Mutex::new(Script {
        device_bytes: 3 << 30,
        ..Script::default()
    }));
    let mut opts = base();
    opts.graph_decode = true;
    opts.graph_stand_in = Some(stand_in(&script));
    let mut g = generate_step(&p, m.as_ref(), None, opts).unwrap();
    assert_eq!(
        g.graph_device_bytes(),
        3 << 30,
        "counted once the decoder is built"
    );
    g.by_ref().for_each(|s| drop(s.unwrap()));
    assert_eq!(g.graph_device_bytes(), 3 << 30);
    // The run's peak holds the decoder's bytes beside MLX's live bytes of the time they were
    // held (at least the model's weights), never beside more than MLX's peak.
    let peak = g.device_peak().unwrap().expect("a graph run's peak");
    let mlx = mlx_core::memory::peak_memory().unwrap();
    assert!(peak > 3 << 30, "{peak}");
    assert!(peak <= mlx + (3 << 30), "{peak} against MLX's {mlx}");
    let mut plain = generate_step(&p, m.as_ref(), None, base()).unwrap();
    plain.by_ref().for_each(|s| drop(s.unwrap()));
    assert_eq!(plain.graph_device_bytes(), 0, "the MLX path holds none");
    assert_eq!(
        plain.device_peak().unwrap(),
        None,
        "MLX's peak is the whole of it"
    );
}

/// A trellis-coded model converted from the untied dense fixture (3 bits, L 8), in a folder
/// of its own (removed by the caller).
/// The MLX path's greedy pick from a step's `logits` `(1, 1, vocab)`: the argmax of the
/// log-probabilities in the logits' dtype, and its log-probability.
fn greedy_pick(logits: &Array) -> mlx_core::Result<(u32, f32)> {
    let lse = ops::logsumexp(logits, &[0, 1], true, None)?;
    let lp = ops::subtract(logits, &lse, None)?;
    let tok = ops::argmax(&lp, -1, false, None)?
        .astype(Dtype::Uint32)?
        .to_vec::<u32>()?[0];
    let lp = lp.astype(Dtype::Float32)?.to_vec::<f32>()?[tok as usize];
    Ok((tok, lp))
}

fn trellis_model(tag: &str) -> (Box<dyn LanguageModel>, PathBuf) {
    use mlx_models::config::TrellisParams;
    use mlx_models::convert::{convert, ConvertOptions};
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models/dense_bf16_untied");
    let dst = std::env::temp_dir().join(format!("graph_glue_{tag}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    let copts = ConvertOptions {
        quantize: true,
        q_bits: Some(3),
        q_group_size: Some(32),
        trellis: Some(TrellisParams {
            trellis_l: 8,
            seed: 0,
            trellis_code: Default::default(),
        }),
        ..ConvertOptions::default()
    };
    convert(&src, &dst, &copts, &mut |_| {}).unwrap();
    let m = load_model_dir(&dst, &LoadOptions::default()).unwrap().0;
    (m, dst)
}

/// A trellis-coded model's prompt goes through the decoder (`feed_prompt`, then its last
/// token's logits), not through MLX's path (issue #34: no GPU kernel there): the tokens are
/// the MLX path's (the stand-in runs the prompt as one forward, as the MLX path does with
/// chunks of 64), no MLX cache is copied in, and `into_cache` brings the MLX caches up to
/// every token.
#[test]
fn a_trellis_models_prompt_goes_through_the_decoder() {
    let (m, dst) = trellis_model("trellis");
    let opts = GenerateOptions {
        prefill_step_size: 64,
        ..base()
    };
    let (want, _, _, _) = run(m.as_ref(), &opts, None);
    let (got, _, why, log) = run(m.as_ref(), &opts, Some(Script::default()));
    assert_eq!(why, None);
    assert_eq!(got, want);
    assert_eq!(log[0], "build", "{log:?}");
    assert!(log.contains(&"feed 39".to_string()), "{log:?}");
    assert!(!log.iter().any(|e| e.starts_with("prefix")), "{log:?}");
    // A build that fails leaves the prompt to the MLX path.
    let (got, _, why, _) = run(
        m.as_ref(),
        &opts,
        Some(Script {
            fail_build: true,
            ..Script::default()
        }),
    );
    assert_eq!(got, want);
    assert!(why.is_some_and(|w| w.contains("could not be built")));
    // The last prompt token's step fails: the MLX path runs the whole prompt.
    let (got, _, why, _) = run(
        m.as_ref(),
        &opts,
        Some(Script {
            fail_at: Some(0),
            ..Script::default()
        }),
    );
    assert_eq!(got, want);
    assert!(why.is_some_and(|w| w.contains("injected failure")));
    let _ = std::fs::remove_dir_all(&dst);
}

/// What a kept stand-in does wrong, and what it saw.
#[derive(Default)]
struct KeepScript {
    /// Device bytes it holds always (its step buffers, copied weights) and those of its
    /// cache, given back while parked.
    small: usize,
    cache: usize,
    /// Parking fails (a CUDA call): the decoder is not kept.
    fail_park: bool,
    /// The driver cannot park: the decoder is kept whole.
    cannot_park: bool,
    /// Taking the cache's memory again fails: the decoder is dropped, a new one built.
    fail_unpark: bool,
    /// Events in order: "build", "park", "unpark", "prefix N", "progress N (held B)".
    log: Vec<String>,
    /// MLX's peak in the last prompt's window, read once its chunks are in (after
    /// [`PROMPT_SPIKE`]).
    prompt_peak: usize,
}

/// Bytes the prompt's progress callback allocates through MLX (and frees) once the prompt's
/// chunks are in, as a long prompt's activations would: MLX's peak in the prompt's window
/// then stands this far above its peak while the decoder decodes, so that a run's peak that
/// added the decoder's cache to the prompt's window is told apart from one that did not.
const PROMPT_SPIKE: usize = 64 << 20;

/// A stand-in that can be kept between generations (`GraphKeep`): it borrows nothing of the
/// model (so it outlives a generation) and decodes a fixed sequence (each token the last plus
/// one); it reports its cache's bytes only while it is not parked, and refuses to step while
/// parked, as the CUDA decoder does.
struct KeptStandIn {
    vocab: u32,
    capacity: usize,
    next: u32,
    parked: bool,
    script: Arc<Mutex<KeepScript>>,
}

impl KeptStandIn {
    fn usable(&self) -> mlx_core::Result<()> {
        if self.parked {
            return Err(err("parked: the cache's memory was given back"));
        }
        Ok(())
    }
}

impl GraphBackend for KeptStandIn {
    fn set_prefix(&mut self, kv: &[(Array, Array)]) -> mlx_core::Result<()> {
        self.usable()?;
        let n = kv[0].0.shape()[2];
        self.script.lock().unwrap().log.push(format!("prefix {n}"));
        Ok(())
    }
    fn start(&mut self, first: u32, _max_steps: usize) -> mlx_core::Result<()> {
        self.usable()?;
        self.next = first;
        Ok(())
    }
    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)> {
        self.usable()?;
        self.next = (self.next + 1) % self.vocab;
        Ok((self.next, -0.5))
    }
    fn step_logits(&mut self, token: u32) -> mlx_core::Result<Vec<f32>> {
        self.usable()?;
        let mut l = vec![0.0f32; self.vocab as usize];
        l[((token + 1) % self.vocab) as usize] = 10.0;
        Ok(l)
    }
    fn inject_failure_after(&mut self, _n: usize) {}
    fn device_bytes(&self) -> usize {
        let s = self.script.lock().unwrap();
        s.small + if self.parked { 0 } else { s.cache }
    }
    fn into_kept(self: Box<Self>) -> Option<Box<dyn KeptDecoder>> {
        Some(self)
    }
}

impl KeptDecoder for KeptStandIn {
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn is_broken(&self) -> bool {
        false
    }
    fn park(&mut self) -> mlx_core::Result<bool> {
        let mut s = self.script.lock().unwrap();
        s.log.push("park".into());
        if s.fail_park {
            return Err(err("cuMemUnmap failed"));
        }
        if s.cannot_park {
            return Ok(false);
        }
        self.parked = true;
        Ok(true)
    }
    fn unpark(&mut self) -> mlx_core::Result<()> {
        let mut s = self.script.lock().unwrap();
        s.log.push("unpark".into());
        if s.fail_unpark {
            return Err(err("cuMemCreate: out of memory"));
        }
        self.parked = false;
        Ok(())
    }
}

/// `generate_step` options that build a [`KeptStandIn`] and keep it in `keep`; the prompt's
/// progress is logged with the device bytes the slot holds at that moment.
fn kept_opts(script: &Arc<Mutex<KeepScript>>, keep: &GraphKeep) -> GenerateOptions {
    let mut opts = base();
    opts.graph_decode = true;
    opts.graph_keep = Some(keep.clone());
    let s = script.clone();
    opts.graph_stand_in = Some(GraphStandIn(Arc::new(move |model, room| {
        s.lock().unwrap().log.push("build".into());
        Ok(Box::new(KeptStandIn {
            vocab: model.vocab_size() as u32,
            capacity: room,
            next: 0,
            parked: false,
            script: s.clone(),
        }) as Box<dyn GraphBackend + '_>)
    })));
    let (s, k) = (script.clone(), keep.clone());
    opts.prompt_progress = Some(PromptProgress(Arc::new(move |done, total| {
        let held = k.device_bytes();
        let mut s = s.lock().unwrap();
        s.log.push(format!("progress {done} (held {held})"));
        if done + 1 == total {
            let spike = ops::zeros(&[(PROMPT_SPIKE / 4) as i32], Dtype::Float32, None).unwrap();
            spike.eval().unwrap();
            drop(spike);
            s.prompt_peak = mlx_core::memory::window_peak(0).unwrap();
        }
    })));
    opts
}

/// One generation with `opts`: its tokens, the decoder's bytes once built, its device peak.
fn kept_run(m: &dyn LanguageModel, opts: GenerateOptions) -> (Vec<u32>, usize, usize) {
    let p = prompt(m.vocab_size());
    let mut g = generate_step(&p, m, None, opts).unwrap();
    let bytes = g.graph_device_bytes();
    let toks: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
    assert_eq!(g.graph_fallback(), None);
    let peak = g.device_peak().unwrap().expect("a graph run's peak");
    (toks, bytes, peak)
}

/// Issue #30's peak: a decoder kept between generations (`mlx benchmark`'s trials) waits
/// parked, its cache's memory given back, so the next prompt runs beside its small state only;
/// the next generation takes it again (no new build) and decodes as before.
#[test]
fn a_kept_decoder_waits_parked_through_the_next_prompt() {
    let m = model();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (small, cache) = (1 << 20, 3 << 30);
    let script = Arc::new(Mutex::new(KeepScript {
        small,
        cache,
        ..KeepScript::default()
    }));
    let keep = GraphKeep::new();
    let (a, bytes_a, _) = kept_run(m.as_ref(), kept_opts(&script, &keep));
    assert_eq!(bytes_a, small + cache, "decoding, it holds its cache");
    assert!(keep.holds());
    assert_eq!(keep.device_bytes(), small, "parked: its small state only");
    let first = std::mem::take(&mut script.lock().unwrap().log);
    assert_eq!(
        first.iter().filter(|e| *e == "build").count(),
        1,
        "{first:?}"
    );
    assert_eq!(first.last().map(String::as_str), Some("park"), "{first:?}");
    // The first prompt ran with nothing kept.
    assert!(
        first.contains(&"progress 39 (held 0)".to_string()),
        "{first:?}"
    );

    let (b, bytes_b, peak_b) = kept_run(m.as_ref(), kept_opts(&script, &keep));
    assert_eq!(b, a, "the kept decoder decodes as the new one did");
    assert_eq!(bytes_b, small + cache, "taken again, it holds its cache");
    let second = std::mem::take(&mut script.lock().unwrap().log);
    assert!(
        !second.contains(&"build".to_string()),
        "no rebuild: {second:?}"
    );
    // The prompt ran beside the parked decoder; its cache's memory was taken back after it,
    // before the prefix was copied in; parked again at the end.
    let at = |what: &str| second.iter().position(|e| e.starts_with(what)).unwrap();
    assert!(
        second.contains(&format!("progress 39 (held {small})")),
        "{second:?}"
    );
    assert!(at("progress 39") < at("unpark"), "{second:?}");
    assert!(at("unpark") < at("prefix"), "{second:?}");
    assert_eq!(
        second.last().map(String::as_str),
        Some("park"),
        "{second:?}"
    );
    assert_eq!(keep.device_bytes(), small);
    // The run's peak counts the cache in the windows it was held (decoding), not beside the
    // prompt's peak: below the prompt's MLX peak (raised by PROMPT_SPIKE) plus the whole
    // decoder, by about the spike (it was at most MLX's peak plus the whole decoder, which a
    // peak that added the cache to the prompt's window met too); at least the decoder beside
    // the model's weights.
    let mlx = mlx_core::memory::peak_memory().unwrap();
    let prompt_peak = script.lock().unwrap().prompt_peak;
    assert!(prompt_peak >= PROMPT_SPIKE, "{prompt_peak}");
    assert!(peak_b > small + cache, "{peak_b}");
    assert!(
        peak_b + PROMPT_SPIKE / 2 <= prompt_peak + small + cache,
        "{peak_b}: the cache counted beside the prompt's MLX peak {prompt_peak}"
    );
    assert!(
        peak_b <= mlx + small + cache,
        "{peak_b} against MLX's {mlx}"
    );
}

/// A kept decoder whose cache's memory cannot be taken again is dropped and a new one built
/// (the run decodes as usual); one that fails to park is not kept; a driver that cannot park
/// keeps it whole, as before parking existed.
#[test]
fn a_kept_decoder_that_cannot_park_or_unpark_falls_back() {
    let m = model();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (small, cache) = (1 << 20, 1 << 30);
    let script = Arc::new(Mutex::new(KeepScript {
        small,
        cache,
        ..KeepScript::default()
    }));
    let keep = GraphKeep::new();
    let (a, _, _) = kept_run(m.as_ref(), kept_opts(&script, &keep));
    script.lock().unwrap().fail_unpark = true;
    let (b, bytes, _) = kept_run(m.as_ref(), kept_opts(&script, &keep));
    assert_eq!(b, a);
    assert_eq!(bytes, small + cache);
    let log = std::mem::take(&mut script.lock().unwrap().log);
    let at = |what: &str| log.iter().rposition(|e| e == what).unwrap();
    assert!(
        at("unpark") < at("build"),
        "a new decoder after the failed one: {log:?}"
    );
    assert!(keep.holds(), "the new one is kept");

    let mut s = script.lock().unwrap();
    s.fail_unpark = false;
    s.fail_park = true;
    drop(s);
    let (c, _, _) = kept_run(m.as_ref(), kept_opts(&script, &keep));
    assert_eq!(c, a);
    assert!(!keep.holds(), "a decoder that failed to park is not kept");
    assert_eq!(keep.device_bytes(), 0);

    let mut s = script.lock().unwrap();
    s.fail_park = false;
    s.cannot_park = true;
    drop(s);
    kept_run(m.as_ref(), kept_opts(&script, &keep));
    assert!(keep.holds());
    assert_eq!(
        keep.device_bytes(),
        small + cache,
        "a driver that cannot park: kept whole"
    );
    script.lock().unwrap().log.clear();
    let (d, _, _) = kept_run(m.as_ref(), kept_opts(&script, &keep));
    assert_eq!(d, a);
    let log = std::mem::take(&mut script.lock().unwrap().log);
    assert!(!log.contains(&"build".to_string()), "{log:?}");
    assert!(
        log.contains(&format!("progress 39 (held {})", small + cache)),
        "{log:?}"
    );
}

/// `mlx chat`'s turns on a trellis model (`Conversation` keeps a `HeldCaches`): the first
/// turn's prompt ran on the decoder, so handing its caches back runs nothing through MLX's
/// path (they stay empty, every token pending; `into_cache` would replay them all through the
/// MLX forward, about the MLX path's prompt cost); the next turn takes the pending tokens as
/// the head of its prompt, which goes through the decoder too (no MLX cache copied in), and
/// gives the MLX path's tokens for the whole conversation as one prompt. A model whose prompt
/// runs on MLX's path (the dense fixture) syncs first, as before, and the MLX path and the
/// CPU decoder leave nothing pending.
#[test]
fn a_trellis_conversation_is_not_replayed_through_mlx() {
    use mlx_engine::held::Plan;
    let (m, dst) = trellis_model("trellis_chat");
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = Arc::new(Mutex::new(Script::default()));
    let opts = |graph: bool| GenerateOptions {
        prefill_step_size: 64,
        graph_decode: graph,
        graph_stand_in: graph.then(|| stand_in(&script)),
        ..base()
    };
    let p = prompt(m.vocab_size());
    let mut g = generate_step(&p, m.as_ref(), None, opts(true)).unwrap();
    let first: Vec<i32> = g.by_ref().map(|s| s.unwrap().token as i32).collect();
    assert!(g.uses_graph_decoder());
    let held = g.into_held_cache();
    assert_eq!(
        held.cached(),
        0,
        "no MLX forward ran: the caches hold nothing"
    );
    let history: Vec<i32> = p.iter().chain(&first).copied().collect();
    assert_eq!(held.pending(), &history[..], "every token is pending");
    assert_eq!(held.plan(), Plan::Prepend);
    script.lock().unwrap().log.clear();

    let next: Vec<u32> = p[..7].iter().map(|&t| t as u32).collect();
    let (caches, joined) = held.continue_with(m.as_ref(), &next).unwrap();
    assert_eq!(
        caches[0].offset(),
        0,
        "still nothing run through MLX's path"
    );
    let joined: Vec<i32> = joined.iter().map(|&t| t as i32).collect();
    let whole: Vec<i32> = history.iter().chain(&p[..7]).copied().collect();
    assert_eq!(joined, whole);
    let mut g = generate_step(&joined, m.as_ref(), Some(caches), opts(true)).unwrap();
    let second: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
    assert_eq!(g.graph_fallback(), None);
    let log = std::mem::take(&mut script.lock().unwrap().log);
    assert!(
        log.contains(&format!("feed {}", whole.len() - 1)),
        "the next turn's prompt on the decoder: {log:?}"
    );
    assert!(!log.iter().any(|e| e.starts_with("prefix")), "{log:?}");
    // The caches a caller does use (a prompt-cache file) are still brought up to every token.
    assert_eq!(g.into_cache()[0].offset(), whole.len() + second.len());
    // The MLX path over the same conversation as one prompt (one chunk, as the stand-in feeds
    // it): the same tokens.
    let mut mlx = generate_step(&whole, m.as_ref(), None, opts(false)).unwrap();
    let want: Vec<u32> = mlx.by_ref().map(|s| s.unwrap().token).collect();
    assert_eq!(second, want);
    assert_eq!(mlx.into_held_cache().plan(), Plan::AsIs, "the MLX path");
    let _ = std::fs::remove_dir_all(&dst);

    // The dense fixture's prompt runs on MLX's path: its generated tokens are pending, and a
    // continuation runs them through the MLX forward first (the caches as `into_cache`'s).
    let d = model();
    let p = prompt(d.vocab_size());
    let dense = |graph: bool| GenerateOptions {
        graph_decode: graph,
        graph_stand_in: graph.then(|| stand_in(&script)),
        ..base()
    };
    let mut g = generate_step(&p, d.as_ref(), None, dense(true)).unwrap();
    let n = g.by_ref().count();
    let held = g.into_held_cache();
    assert_eq!(held.plan(), Plan::SyncFirst);
    assert_eq!(held.tokens(), p.len() + n);
    let (caches, prompt2) = held.continue_with(d.as_ref(), &next).unwrap();
    assert_eq!(prompt2, next);
    assert_eq!(
        caches[0].offset(),
        p.len() + n,
        "synced before the next turn"
    );
}

/// `graph::reusable`: the kept positions are the common head of what the decoder holds and the
/// prompt, short of the prompt's last token.
#[test]
fn a_kept_decoder_reuses_the_common_head_short_of_the_last_token() {
    use mlx_engine::graph::reusable;
    assert_eq!(reusable(&[], &[1, 2, 3]), 0);
    assert_eq!(reusable(&[1, 2], &[1, 2, 3, 4]), 2, "all it holds");
    assert_eq!(
        reusable(&[1, 2, 9, 9], &[1, 2, 3, 4]),
        2,
        "rewound past a change"
    );
    assert_eq!(
        reusable(&[1, 2, 3, 4], &[1, 2, 3, 4]),
        3,
        "the last token runs"
    );
    assert_eq!(
        reusable(&[1, 2, 3, 4, 5], &[1, 2, 3]),
        2,
        "a shorter prompt"
    );
    assert_eq!(reusable(&[7], &[1, 2]), 0, "another conversation");
    assert_eq!(reusable(&[1], &[1]), 0);
    assert_eq!(reusable(&[1], &[]), 0);
}

/// What a [`ChatStandIn`] did, and what it is told to do wrong.
#[derive(Default)]
struct ChatScript {
    /// Events in order: "build N" (its room), "feed N", "resume K N", "prefix N",
    /// "start", "park", "unpark".
    log: Vec<String>,
    /// Prompt tokens it ran before the prompt's last (`feed_prompt`, `resume`: one step each).
    prompt_steps: usize,
    /// The `n`-th `next_token` from now fails as a CUDA call would.
    fail_after: Option<usize>,
}

/// A conversation's decoder on the CPU: a copy of the model of its own (it is kept between
/// generations, so it borrows nothing), run one token a step through its own MLX caches, as
/// the CUDA decoder runs its steps; it holds its positions across generations, and `resume`
/// trims them to the kept ones and runs the rest. Greedy picks as [`StandIn`]'s.
struct ChatStandIn {
    model: Box<dyn LanguageModel>,
    caches: Vec<Box<dyn Cache>>,
    capacity: usize,
    pending: Option<u32>,
    parked: bool,
    script: Arc<Mutex<ChatScript>>,
}

impl ChatStandIn {
    fn position_now(&self) -> usize {
        self.caches.first().map_or(0, |c| c.offset())
    }

    /// The logits after `token` at the current position (bfloat16, `[1, vocab]`).
    fn forward(&mut self, token: u32) -> mlx_core::Result<Array> {
        if self.parked {
            return Err(err("parked: the cache's memory was given back"));
        }
        if self.position_now() >= self.capacity {
            return Err(err("the cache is full"));
        }
        let x = Array::from_slice(&[token as i32], &[1, 1])?;
        let logits = self
            .model
            .forward(&x, Some(&mut self.caches))
            .map_err(|e| err(&e.to_string()))?;
        let logits = ops::squeeze(&logits, &[1], None)?;
        logits.eval()?;
        Ok(logits)
    }

    fn run(&mut self, tokens: &[u32]) -> mlx_core::Result<()> {
        for &t in tokens {
            self.forward(t)?;
        }
        self.script.lock().unwrap().prompt_steps += tokens.len();
        Ok(())
    }
}

impl GraphBackend for ChatStandIn {
    fn set_prefix(&mut self, kv: &[(Array, Array)]) -> mlx_core::Result<()> {
        let n = kv[0].0.shape()[2];
        self.script.lock().unwrap().log.push(format!("prefix {n}"));
        self.caches = kv
            .iter()
            .map(|(k, v)| {
                let mut c = KVCache::new();
                c.update_and_fetch(k, v).unwrap();
                Box::new(c) as Box<dyn Cache>
            })
            .collect();
        Ok(())
    }
    fn start(&mut self, first: u32, _max_steps: usize) -> mlx_core::Result<()> {
        self.script.lock().unwrap().log.push("start".into());
        self.pending = Some(first);
        Ok(())
    }
    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)> {
        {
            let mut s = self.script.lock().unwrap();
            match s.fail_after {
                Some(0) => {
                    s.fail_after = None;
                    return Err(err("injected failure"));
                }
                Some(n) => s.fail_after = Some(n - 1),
                None => {}
            }
        }
        let t = self.pending.take().expect("started");
        let (tok, lp) = greedy_pick(&self.forward(t)?)?;
        self.pending = Some(tok);
        Ok((tok, lp))
    }
    fn step_logits(&mut self, token: u32) -> mlx_core::Result<Vec<f32>> {
        self.forward(token)?.astype(Dtype::Float32)?.to_vec::<f32>()
    }
    fn inject_failure_after(&mut self, _n: usize) {}
    fn feed_prompt(&mut self, tokens: &[u32]) -> mlx_core::Result<()> {
        self.script
            .lock()
            .unwrap()
            .log
            .push(format!("feed {}", tokens.len()));
        self.caches = self.model.make_cache();
        self.run(tokens)
    }
    fn position(&self) -> Option<usize> {
        Some(self.position_now())
    }
    fn resume(&mut self, keep: usize, tokens: &[u32]) -> mlx_core::Result<()> {
        if !tokens.is_empty() {
            self.script
                .lock()
                .unwrap()
                .log
                .push(format!("resume {keep} {}", tokens.len()));
        }
        let held = self.position_now();
        assert!(keep <= held, "resume at {keep} of {held}");
        for c in self.caches.iter_mut() {
            assert_eq!(c.trim(held - keep), held - keep);
        }
        self.pending = None;
        self.run(tokens)
    }
    fn into_kept(self: Box<Self>) -> Option<Box<dyn KeptDecoder>> {
        Some(self)
    }
}

impl KeptDecoder for ChatStandIn {
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn is_broken(&self) -> bool {
        false
    }
    fn park(&mut self) -> mlx_core::Result<bool> {
        self.script.lock().unwrap().log.push("park".into());
        self.caches = self.model.make_cache();
        self.parked = true;
        Ok(true)
    }
    fn unpark(&mut self) -> mlx_core::Result<()> {
        self.script.lock().unwrap().log.push("unpark".into());
        self.parked = false;
        Ok(())
    }
}

/// A stand-in function building [`ChatStandIn`]s over a copy of the model in `dir`.
fn chat_stand_in(dir: &std::path::Path, script: &Arc<Mutex<ChatScript>>) -> GraphStandIn {
    let (dir, script) = (dir.to_path_buf(), script.clone());
    GraphStandIn(Arc::new(move |_model, room| {
        script.lock().unwrap().log.push(format!("build {room}"));
        let model = load_model_dir(&dir, &LoadOptions::default())
            .map_err(|e| err(&e.to_string()))?
            .0;
        let caches = model.make_cache();
        Ok(Box::new(ChatStandIn {
            model,
            caches,
            capacity: room,
            pending: None,
            parked: false,
            script: script.clone(),
        }) as Box<dyn GraphBackend + '_>)
    }))
}

/// The character-level ChatML tokenizer of 128 ids (the trellis fixture's vocabulary).
fn tiny_chat_tokenizer() -> mlx_engine::Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat");
    mlx_engine::Tokenizer::from_dir(&dir).unwrap()
}

/// The chat tests' options: 6 tokens a turn, prompts in chunks of 64, the graph decoder's
/// stand-in over `dst` logging to `script`, `sampler` (greedy when `None`) and `keep`.
fn chat_options(
    dst: &std::path::Path,
    script: &Arc<Mutex<ChatScript>>,
    sampler: Option<&Sampler>,
    keep: Option<&GraphKeep>,
) -> mlx_engine::stream::StreamOptions {
    mlx_engine::stream::StreamOptions {
        generate: GenerateOptions {
            max_tokens: Some(6),
            prefill_step_size: 64,
            sampler: sampler.cloned().unwrap_or_else(Sampler::greedy),
            graph_decode: true,
            graph_stand_in: Some(chat_stand_in(dst, script)),
            graph_keep: keep.cloned(),
            ..GenerateOptions::default()
        },
        ..mlx_engine::stream::StreamOptions::default()
    }
}

/// The tokens of a fresh run of `prompt` with `opts` (no kept decoder: a new one).
fn fresh_tokens(
    m: &dyn LanguageModel,
    tok: &mlx_engine::Tokenizer,
    prompt: &[u32],
    opts: mlx_engine::stream::StreamOptions,
) -> Vec<u32> {
    mlx_engine::stream::stream_generate(m, tok, prompt, None, opts)
        .unwrap()
        .map(|r| r.unwrap().token.unwrap())
        .collect()
}

/// A user turn `q` rendered alone by the tiny chat template, with the generation prompt.
fn render_user(tok: &mlx_engine::Tokenizer, q: &str) -> Vec<u32> {
    tok.apply_chat_template_ids(
        &[serde_json::json!({"role": "user", "content": q})],
        &mlx_engine::chat_template::ChatTemplateOptions::generation(true),
    )
    .unwrap()
}

/// One `Conversation` turn: its tokens (the EOS token too) and its last response.
fn chat_turn(
    conv: &mut mlx_engine::chat::Conversation<'_>,
    query: &str,
) -> (Vec<u32>, mlx_engine::stream::GenerationResponse) {
    let mut toks = Vec::new();
    let last = conv
        .turn(query, |r| toks.extend(r.token))
        .unwrap_or_else(|e| panic!("turn {query:?}: {e}"));
    (toks, last)
}

/// Issue #34's chat: `mlx chat`'s turns on a trellis model (`Conversation`, its decoder kept
/// in a conversation's slot) run each turn's new tokens only. The decoder, kept with its cache
/// between turns, holds the conversation so far: the next turn keeps those positions and runs
/// the tokens after them (its prompt, and the last reply's last token, which a greedy run never
/// steps). Every turn's tokens are those of a fresh run of the whole conversation on a new
/// decoder (the same tokens at the same positions, one step each), greedy and seeded, and the
/// MLX caches never run a token. Three turns, then a reset.
#[test]
fn a_trellis_chat_runs_only_each_turns_new_tokens() {
    use mlx_engine::chat::Conversation;
    let (m, dst) = trellis_model("chat_keep");
    let tok = tiny_chat_tokenizer();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = Arc::new(Mutex::new(ChatScript::default()));
    let opts = |sampler: &Sampler, keep: Option<&GraphKeep>| {
        chat_options(&dst, &script, Some(sampler), keep)
    };
    let render = |q: &str| render_user(&tok, q);
    let greedy = Sampler::new(SamplerSettings::default());
    let seeded = Sampler::new(SamplerSettings {
        temp: 0.8,
        top_p: 0.95,
        ..SamplerSettings::default()
    });
    for (name, sampler) in [("greedy", &greedy), ("seeded", &seeded)] {
        let keep = GraphKeep::for_conversation();
        let mut conv =
            Conversation::new(m.as_ref(), &tok, None, opts(sampler, Some(&keep))).unwrap();
        // The whole conversation so far (every prompt, reply and EOS token).
        let mut history: Vec<u32> = Vec::new();
        for (turn, q) in ["Hi there.", "And then?", "Bye!"].iter().enumerate() {
            let prompt = render(q);
            let whole: Vec<u32> = history.iter().chain(&prompt).copied().collect();
            script.lock().unwrap().log.clear();
            script.lock().unwrap().prompt_steps = 0;
            mlx_core::random::seed(5 + turn as u64).unwrap();
            let (got, last) = chat_turn(&mut conv, q);
            assert_eq!(conv.graph_fallback(), None, "{name} turn {turn}");
            let log = std::mem::take(&mut script.lock().unwrap().log);
            let ran = script.lock().unwrap().prompt_steps;
            // What the decoder held of the conversation: all of it after a seeded turn (each
            // token is stepped before it is handed out); all but the last token after a
            // greedy one (the last token read is never stepped).
            let held = match (turn, name) {
                (0, _) => 0,
                (_, "greedy") => history.len() - 1,
                _ => history.len(),
            };
            assert_eq!(
                ran + 1,
                whole.len() - held,
                "{name} turn {turn}: the decoder ran the tokens after those it held: {log:?}"
            );
            assert_eq!(last.prompt_tokens, whole.len() - held, "{name} turn {turn}");
            eprintln!(
                "{name} turn {turn}: conversation {} tokens, the decoder ran {} of them \
                 (without the kept decoder: {})",
                whole.len(),
                whole.len() - held,
                whole.len()
            );
            if turn == 0 {
                // Room to spare: half again this turn's (prompt, 6 tokens, 2), rounded up
                // to 256 positions.
                let room = whole.len() + 6 + 2;
                let spare = (room + room / 2).next_multiple_of(256);
                assert_eq!(log[0], format!("build {spare}"), "{log:?}");
                assert!(
                    log.contains(&format!("feed {}", whole.len() - 1)),
                    "{log:?}"
                );
            } else {
                assert!(!log.iter().any(|e| e.starts_with("build")), "{log:?}");
                assert!(!log.iter().any(|e| e.starts_with("feed")), "{log:?}");
                assert!(
                    log.contains(&format!("resume {held} {}", whole.len() - 1 - held)),
                    "{name} turn {turn}: {log:?}"
                );
            }
            assert!(!log.iter().any(|e| e.starts_with("prefix")), "{log:?}");
            assert!(!log.contains(&"park".to_string()), "kept holding: {log:?}");
            history = whole.iter().chain(&got).copied().collect();
            assert_eq!(conv.cached_tokens(), history.len(), "{name} turn {turn}");
            assert_eq!(
                keep.held_tokens(),
                history[..history.len() - (held_after(name))]
            );

            // A fresh run of the whole conversation on a new decoder: the same tokens.
            script.lock().unwrap().log.clear();
            mlx_core::random::seed(5 + turn as u64).unwrap();
            let fresh: Vec<u32> = fresh_tokens(m.as_ref(), &tok, &whole, opts(sampler, None));
            let log = std::mem::take(&mut script.lock().unwrap().log);
            assert!(
                log.contains(&format!("feed {}", whole.len() - 1)),
                "{log:?}"
            );
            assert_eq!(
                got, fresh,
                "{name} turn {turn}: a fresh run of the conversation"
            );
        }
        // A reset conversation: the decoder keeps the positions its new prompt shares with
        // what it holds (the template's head), forgets the rest, and runs the prompt's rest;
        // the tokens are a fresh run's.
        conv.reset().unwrap();
        let prompt = render("Hello.");
        let shared = mlx_engine::graph::reusable(
            &history[..history.len() - held_after(name)],
            &prompt.iter().map(|&t| t as i32).collect::<Vec<_>>(),
        );
        assert!(shared > 0 && shared + 3 < prompt.len(), "{shared}");
        script.lock().unwrap().prompt_steps = 0;
        mlx_core::random::seed(9).unwrap();
        let (again, _) = chat_turn(&mut conv, "Hello.");
        assert_eq!(
            script.lock().unwrap().prompt_steps,
            prompt.len() - 1 - shared
        );
        assert_eq!(conv.cached_tokens(), prompt.len() + again.len());
        mlx_core::random::seed(9).unwrap();
        let fresh: Vec<u32> = fresh_tokens(m.as_ref(), &tok, &prompt, opts(sampler, None));
        assert_eq!(again, fresh, "{name}: after the reset");
    }
    let _ = std::fs::remove_dir_all(&dst);
}

/// Tokens at the end of a turn's history its decoder does not hold: a greedy run's last.
fn held_after(sampling: &str) -> usize {
    usize::from(sampling == "greedy")
}

/// A CUDA failure mid-conversation (the kept decoder's third token of the second turn): the
/// MLX path finishes the turn with the conversation's whole history (every earlier turn's
/// tokens, which the MLX caches had never run, go through its forward then), the failed
/// decoder is not kept, and the next turn continues the MLX caches (only its prompt runs
/// there; a new decoder takes their prefix). Each turn's tokens are a fresh run's of the whole
/// conversation.
#[test]
fn a_failure_mid_chat_hands_the_whole_history_to_mlx() {
    use mlx_engine::chat::Conversation;
    let (m, dst) = trellis_model("chat_fail");
    let tok = tiny_chat_tokenizer();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = Arc::new(Mutex::new(ChatScript::default()));
    let opts = |keep: Option<&GraphKeep>| chat_options(&dst, &script, None, keep);
    let render = |q: &str| render_user(&tok, q);
    let keep = GraphKeep::for_conversation();
    let mut conv = Conversation::new(m.as_ref(), &tok, None, opts(Some(&keep))).unwrap();
    let mut history: Vec<u32> = Vec::new();
    for (turn, q) in ["Hi there.", "And then?", "Bye!"].iter().enumerate() {
        let whole: Vec<u32> = history.iter().chain(&render(q)).copied().collect();
        script.lock().unwrap().log.clear();
        script.lock().unwrap().fail_after = (turn == 1).then_some(2);
        let (got, last) = chat_turn(&mut conv, q);
        script.lock().unwrap().fail_after = None;
        let log = std::mem::take(&mut script.lock().unwrap().log);
        assert_eq!(got.len(), last.generation_tokens, "turn {turn}");
        match turn {
            0 => assert_eq!(conv.graph_fallback(), None),
            1 => {
                let why = conv.graph_fallback().unwrap_or_default();
                assert!(why.contains("injected"), "{why}");
                assert!(got.len() > 3 || last.finish_reason.is_some());
                assert!(!keep.holds(), "a failed decoder is not kept");
            }
            _ => {
                assert_eq!(conv.graph_fallback(), None);
                // The MLX caches held the history: a new decoder took their prefix (the
                // history and this turn's prompt, which ran on MLX's path).
                assert!(log.iter().any(|e| e.starts_with("build")), "{log:?}");
                assert!(log.contains(&format!("prefix {}", whole.len())), "{log:?}");
                assert!(!log.iter().any(|e| e.starts_with("feed")), "{log:?}");
            }
        }
        history = whole.iter().chain(&got).copied().collect();
        assert_eq!(conv.cached_tokens(), history.len(), "turn {turn}");
        let fresh: Vec<u32> = fresh_tokens(m.as_ref(), &tok, &whole, opts(None));
        assert_eq!(got, fresh, "turn {turn}: a fresh run of the conversation");
    }
    let _ = std::fs::remove_dir_all(&dst);
}

/// `ChatSession` (the whole conversation rendered each turn) on a trellis model: the MLX
/// caches are not filled after a turn (no MLX forward of the conversation); the next turn's
/// rendered conversation goes to the kept decoder, which keeps the positions it shares with
/// it (rewinding past the reply where the template renders it otherwise) and runs the rest.
/// The replies are a fresh run's of the rendered conversation.
#[test]
fn a_trellis_chat_session_keeps_its_decoder() {
    use mlx_engine::chat::ChatSession;
    use mlx_engine::chat_template::ChatTemplateOptions;
    use mlx_engine::stream::stream_generate;
    let (m, dst) = trellis_model("chat_session");
    let tok = tiny_chat_tokenizer();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = Arc::new(Mutex::new(ChatScript::default()));
    let opts = |keep: Option<&GraphKeep>| chat_options(&dst, &script, None, keep);
    let keep = GraphKeep::for_conversation();
    let mut chat = ChatSession::new(m.as_ref(), &tok, None, opts(Some(&keep)));
    for (turn, q) in ["Hi there.", "And then?", "Bye!"].iter().enumerate() {
        let mut messages = chat.messages().to_vec();
        messages.push(serde_json::json!({"role": "user", "content": q}));
        let tokens = tok
            .apply_chat_template_ids(&messages, &ChatTemplateOptions::generation(true))
            .unwrap();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let reuse = mlx_engine::graph::reusable(&keep.held_tokens(), &ids);
        script.lock().unwrap().log.clear();
        let (reply, stats) = chat.send(q, |_| {}).unwrap();
        let log = std::mem::take(&mut script.lock().unwrap().log);
        assert_eq!(stats.prompt_tokens, tokens.len());
        assert_eq!(
            stats.prefilled,
            tokens.len() - reuse,
            "turn {turn}: {log:?}"
        );
        if turn > 0 {
            assert!(reuse > 0, "turn {turn}");
            assert!(!log.iter().any(|e| e.starts_with("build")), "{log:?}");
            assert!(
                log.contains(&format!("resume {reuse} {}", tokens.len() - 1 - reuse)),
                "{log:?}"
            );
        }
        assert!(!log.iter().any(|e| e.starts_with("prefix")), "{log:?}");
        let cold: String = stream_generate(m.as_ref(), &tok, &tokens, None, opts(None))
            .unwrap()
            .map(|r| r.unwrap().text)
            .collect();
        assert_eq!(reply, cold, "turn {turn}");
    }
    let _ = std::fs::remove_dir_all(&dst);
}

/// A conversation that outgrows its kept decoder (the first turn's decoder has room for 256
/// positions, the second turn needs more): the second turn builds a new one,
/// with half again its room (rounded to 256), feeds it the whole conversation, and its tokens
/// are a fresh run's of the whole conversation.
#[test]
fn a_conversation_that_outgrows_its_decoder_builds_a_larger_one() {
    use mlx_engine::chat::Conversation;
    let (m, dst) = trellis_model("chat_grow");
    let tok = tiny_chat_tokenizer();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = Arc::new(Mutex::new(ChatScript::default()));
    // As many tokens a turn as leave the first turn's spare room at 256 positions.
    let most = 168 - render_user(&tok, "Hi there.").len();
    let opts = |keep: Option<&GraphKeep>| {
        let mut o = chat_options(&dst, &script, None, keep);
        o.generate.max_tokens = Some(most);
        o
    };
    let keep = GraphKeep::for_conversation();
    let mut conv = Conversation::new(m.as_ref(), &tok, None, opts(Some(&keep))).unwrap();
    let mut history: Vec<u32> = Vec::new();
    // The kept decoder's positions, and how many turns built a larger one.
    let (mut capacity, mut grew) = (0, 0);
    for (turn, q) in ["Hi there.", "And then?", "Go on.", "Bye!"]
        .iter()
        .enumerate()
    {
        let whole: Vec<u32> = history
            .iter()
            .chain(&render_user(&tok, q))
            .copied()
            .collect();
        script.lock().unwrap().log.clear();
        let (got, _) = chat_turn(&mut conv, q);
        assert_eq!(conv.graph_fallback(), None, "turn {turn}");
        let log = std::mem::take(&mut script.lock().unwrap().log);
        let room = whole.len() + most + 2;
        if turn == 0 || room > capacity {
            let spare = (room + room / 2).next_multiple_of(256);
            assert!(turn > 0 || spare == 256, "{log:?}");
            assert_eq!(log[0], format!("build {spare}"), "turn {turn}: {log:?}");
            assert!(
                log.contains(&format!("feed {}", whole.len() - 1)),
                "turn {turn}: the whole conversation goes to the new decoder: {log:?}"
            );
            grew += usize::from(turn > 0);
            capacity = spare;
        } else {
            assert!(
                !log.iter().any(|e| e.starts_with("build")),
                "turn {turn}: {log:?}"
            );
        }
        let fresh: Vec<u32> = fresh_tokens(m.as_ref(), &tok, &whole, opts(None));
        assert_eq!(got, fresh, "turn {turn}: a fresh run of the conversation");
        history = whole.iter().chain(&got).copied().collect();
    }
    assert!(
        grew > 0,
        "no turn outgrew its decoder ({} positions)",
        history.len()
    );
    let _ = std::fs::remove_dir_all(&dst);
}
