//! Issue #30's prefill switch, on the CPU: the prompt forward's quantized linears as
//! `x @ dequantize(w).T` by blocks ([`DensePrompt`], `GenerateOptions::graph_prompt_dense`).
//! Tier L3 against the exact forward on tiny seeded quantized models (logits within the bounds
//! below, greedy tokens equal); the engine turns it on for the prompt of a generation the graph
//! decoder decodes (here a stand-in that decodes with the model's exact MLX forward), never for
//! the MLX path, never for decode steps; without it the prompt's graphs are the exact path's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mlx_cache::{Cache, KVCache};
use mlx_core::{graph, ops, Array, Dtype};
use mlx_engine::generate::{generate_step, DensePrompt, EvalProbe, GenerateOptions};
use mlx_engine::graph::{GraphBackend, GraphStandIn};
use mlx_models::layers::{dense_prompt, with_dense_prompt};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn model(name: &str, dtype: Option<Dtype>) -> Box<dyn LanguageModel> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models")
        .join(name);
    load_model_dir(&dir, &LoadOptions { dtype }).unwrap().0
}

fn prompt(vocab: i32) -> Vec<i32> {
    (0..40).map(|i| (i * 7919 + 13) % vocab).collect()
}

fn floats(a: &Array) -> Vec<f32> {
    a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
}

/// Every position's logits of `ids` in chunks of `chunk` through one cache, then `steps`
/// greedy tokens one at a time, with `dense` for the chunks only (as the engine's prefill).
fn forward(
    m: &dyn LanguageModel,
    ids: &[i32],
    chunk: usize,
    steps: usize,
    dense: Option<DensePrompt>,
) -> (Vec<f32>, Vec<u32>) {
    let mut caches = m.make_cache();
    let mut logits = Vec::new();
    for c in ids.chunks(chunk) {
        let x = Array::from_slice(c, &[1, c.len() as i32]).unwrap();
        let l = with_dense_prompt(dense, || m.forward(&x, Some(&mut caches))).unwrap();
        logits.extend(floats(&l));
    }
    let vocab = m.vocab_size() as usize;
    let mut last = logits[logits.len() - vocab..].to_vec();
    let mut tokens = Vec::new();
    for _ in 0..steps {
        let t = (0..vocab)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        tokens.push(t);
        let x = Array::from_slice(&[t as i32], &[1, 1]).unwrap();
        last = floats(&m.forward(&x, Some(&mut caches)).unwrap());
    }
    (logits, tokens)
}

/// Tier L3: the prompt's logits with the dense linears (chunks of 16 rows, threshold 2 rows;
/// blocks of 4 KiB, so every linear of these models is split into several blocks, and of
/// 32 MiB, one block) within the bound of the exact forward's, and the greedy tokens after it
/// equal. Bounds, the largest difference over the largest logit: float32 1e-5 (measured: 0,
/// the CPU's products agree bit for bit here), bfloat16 6e-2 (measured: 0.030 for q4_g64
/// cast to bfloat16, 0.033 for q8_g32_bf16, either block size: a few bfloat16 roundings of
/// the linears' outputs carried through two layers).
#[test]
fn dense_prompt_logits_are_the_exact_forwards_within_the_bound() {
    for (name, dtype, bound) in [
        ("q4_g64_untied", None, 1e-5f32),
        ("q4_g64_untied", Some(Dtype::Bfloat16), 6e-2),
        ("q8_g32_bf16", None, 6e-2),
        ("q4_g32", None, 1e-5),
    ] {
        let m = model(name, dtype);
        let ids = prompt(m.vocab_size());
        let (want, want_tokens) = forward(m.as_ref(), &ids, 16, 8, None);
        for block in [4096, DensePrompt::DEFAULT_BLOCK_BYTES] {
            let d = DensePrompt::new(2, block).unwrap();
            let (got, tokens) = forward(m.as_ref(), &ids, 16, 8, Some(d));
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let diff = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            eprintln!("{name} {dtype:?} block {block}: {}", diff / scale);
            assert!(
                diff / scale <= bound,
                "{name} {dtype:?} block {block}: {} > {bound}",
                diff / scale
            );
            assert_eq!(tokens, want_tokens, "{name} {dtype:?} block {block}");
        }
    }
}

/// A stand-in for the graph decoder: each step is the model's exact MLX forward over the
/// prompt's cache as handed over; it notes whether a decode step ever saw the dense setting.
struct Follow<'a> {
    model: &'a dyn LanguageModel,
    caches: Vec<Box<dyn Cache>>,
    pending: Option<u32>,
    saw_dense: Arc<Mutex<bool>>,
}

impl Follow<'_> {
    fn logits(&mut self, token: u32) -> mlx_core::Result<Array> {
        if dense_prompt().is_some() {
            *self.saw_dense.lock().unwrap() = true;
        }
        let x = Array::from_slice(&[token as i32], &[1, 1])?;
        let l = self
            .model
            .forward(&x, Some(&mut self.caches))
            .map_err(|e| mlx_core::Error::Mlx {
                op: "follow",
                message: e.to_string(),
            })?;
        ops::squeeze(&l, &[1], None)
    }
}

impl GraphBackend for Follow<'_> {
    fn set_prefix(&mut self, kv: &[(Array, Array)]) -> mlx_core::Result<()> {
        self.caches = Vec::new();
        for (k, v) in kv {
            let mut c = KVCache::new();
            c.update_and_fetch(k, v).map_err(|e| mlx_core::Error::Mlx {
                op: "follow",
                message: e.to_string(),
            })?;
            self.caches.push(Box::new(c));
        }
        Ok(())
    }
    fn start(&mut self, first: u32, _max_steps: usize) -> mlx_core::Result<()> {
        self.pending = Some(first);
        Ok(())
    }
    fn next_token(&mut self) -> mlx_core::Result<(u32, f32)> {
        let t = self.pending.take().unwrap_or(0);
        let logits = self.logits(t)?;
        let lse = ops::logsumexp(&logits, &[0, 1], true, None)?;
        let lp = ops::subtract(&logits, &lse, None)?;
        let tok = ops::argmax(&lp, -1, false, None)?
            .astype(Dtype::Uint32)?
            .to_vec::<u32>()?[0];
        let p = lp.astype(Dtype::Float32)?.to_vec::<f32>()?[tok as usize];
        self.pending = Some(tok);
        Ok((tok, p))
    }
    fn step_logits(&mut self, token: u32) -> mlx_core::Result<Vec<f32>> {
        self.logits(token)?.astype(Dtype::Float32)?.to_vec::<f32>()
    }
    fn inject_failure_after(&mut self, _n: usize) {}
}

/// What a generation gave: its tokens, the first step's log-probabilities (the MLX forward's,
/// after the prompt), the primitive counts of each prompt chunk's graph, and whether a decode
/// step saw the dense setting.
struct Run {
    tokens: Vec<u32>,
    first: Vec<f32>,
    chunks: Vec<std::collections::BTreeMap<String, usize>>,
    saw_dense: bool,
}

fn run(m: &dyn LanguageModel, graph_decode: bool, dense: Option<DensePrompt>) -> Run {
    let chunks: Arc<Mutex<Vec<_>>> = Arc::default();
    let sink = chunks.clone();
    let saw = Arc::new(Mutex::new(false));
    let saw_in = saw.clone();
    let opts = GenerateOptions {
        max_tokens: Some(8),
        prefill_step_size: 16,
        graph_decode,
        graph_stand_in: graph_decode.then(|| {
            GraphStandIn(Arc::new(move |model, _room| {
                Ok(Box::new(Follow {
                    model,
                    caches: Vec::new(),
                    pending: None,
                    saw_dense: saw_in.clone(),
                }) as Box<dyn GraphBackend + '_>)
            }))
        }),
        graph_prompt_dense: dense,
        eval_probe: Some(EvalProbe(Arc::new(move |what, arrays| {
            if what == "prefill" {
                let dot = graph::to_dot(arrays.iter().copied()).unwrap();
                sink.lock().unwrap().push(graph::primitive_counts(&dot));
            }
        }))),
        ..GenerateOptions::default()
    };
    let ids = prompt(m.vocab_size());
    let mut g = generate_step(&ids, m, None, opts).unwrap();
    let steps: Vec<_> = g.by_ref().map(|s| s.unwrap()).collect();
    assert_eq!(g.graph_fallback(), None);
    let chunks = chunks.lock().unwrap().clone();
    let saw_dense = *saw.lock().unwrap();
    Run {
        tokens: steps.iter().map(|s| s.token).collect(),
        first: floats(&steps[0].logprobs),
        chunks,
        saw_dense,
    }
}

/// The engine: with the graph decoder and `graph_prompt_dense`, the prompt's chunks run the
/// dense linears (no `QuantizedMatmul` left in their graphs) and the tokens equal the exact
/// path's, the first step's log-probabilities within the bound; decode steps never see the
/// setting. The MLX path ignores the option; the graph decoder without it runs the exact
/// path's prompt graphs and first step, bit for bit.
#[test]
fn the_engine_runs_the_dense_prompt_only_for_the_graph_decoder() {
    // The switch's variables would override the option: this test sets none.
    for v in [
        "MLX_PREFILL_DENSE",
        "MLX_PREFILL_DENSE_ROWS",
        "MLX_PREFILL_DENSE_BLOCK_MB",
    ] {
        assert!(std::env::var_os(v).is_none(), "{v} is set");
    }
    let m = model("q4_g64_untied", Some(Dtype::Bfloat16));
    let d = DensePrompt::new(2, 4096).unwrap();
    let exact = run(m.as_ref(), false, None);
    assert_eq!(exact.chunks.len(), 3, "chunks of 16, 16 and 7 tokens");
    for c in &exact.chunks {
        assert!(c.contains_key("QuantizedMatmul"), "{c:?}");
    }
    // The MLX path: the option is not read.
    let mlx = run(m.as_ref(), false, Some(d));
    assert_eq!(mlx.chunks, exact.chunks);
    assert_eq!(mlx.first, exact.first);
    assert_eq!(mlx.tokens, exact.tokens);
    // The graph decoder without the option: the exact prompt, bit for bit.
    let off = run(m.as_ref(), true, None);
    assert_eq!(off.chunks, exact.chunks);
    assert_eq!(off.first, exact.first);
    assert_eq!(off.tokens, exact.tokens);
    assert!(!off.saw_dense);
    // With it: dense linears in every chunk (the 16-, 16- and 7-row chunks, threshold 2;
    // MLX's CPU `dequantize` is built of shifts and products, its GPU one a primitive).
    let on = run(m.as_ref(), true, Some(d));
    assert_eq!(on.chunks.len(), 3);
    let matmuls = |c: &std::collections::BTreeMap<String, usize>| c.get("Matmul").copied();
    for (c, e) in on.chunks.iter().zip(&exact.chunks) {
        assert!(!c.contains_key("QuantizedMatmul"), "{c:?}");
        assert!(matmuls(c) > matmuls(e), "dense: {c:?}\nexact: {e:?}");
    }
    assert!(!on.saw_dense, "decode steps run without the setting");
    assert_eq!(on.tokens, exact.tokens);
    let diff = on
        .first
        .iter()
        .zip(&exact.first)
        .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    eprintln!("first step's log-probabilities: {diff}");
    // Log-probabilities (bfloat16) of the first token's step: bound 0.2 nats (measured:
    // 0.094, three bfloat16 steps at the log-probabilities' magnitude).
    assert!(
        diff <= 0.2,
        "first step's log-probabilities differ by {diff}"
    );
    // A threshold above every chunk's rows: the exact graphs again.
    let high = run(m.as_ref(), true, Some(DensePrompt::new(17, 4096).unwrap()));
    assert_eq!(high.chunks, exact.chunks);
    assert_eq!(high.first, exact.first);
}
