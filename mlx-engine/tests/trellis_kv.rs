//! The trellis KV cache (`--kv-mode trellis`, `mlx_cache::TrellisKVCache`) on the exact path:
//! perplexity teacher-forced through the cache (chunked prefill: each chunk's attention reads
//! the decoded codes of every earlier token and of its own), against the plain cache.
//!
//! The fast test runs the tiny llama fixture through `generate_step` with `--kv-bits 3
//! --kv-mode trellis`. The real-model gate is `#[ignore]`d (minutes): SmolLM2-135M with float16
//! weights dequantized from its GGUF, float32 activations, 4,096 tokens of KJV Exodus
//! (`results/quant/exodus_kjv_1-16.txt`) in one context, chunks of 64 (near decoding, where
//! each query reads its last 256 tokens exactly; in chunks of 512 the miss is larger); the 3-bit trellis
//! cache's perplexity must be within 1% of the plain cache's. Run it with (OpenBLAS preloaded,
//! else MLX's reference BLAS takes ~10x longer):
//!
//! ```text
//! mlx convert --hf-path SmolLM2-135M-Instruct.Q4_1.gguf -d --dtype float16 --mlx-path DIR
//! TRELLIS_KV_MODEL=DIR LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \
//!   cargo test -p mlx-engine --test trellis_kv -- --ignored --nocapture
//! ```
//!
//! Measured (`results/quant/2026-12-04-trellis-kv/`): the default 3-bit cache (L 12, sink 32,
//! window 256) 0.60% above the plain cache in chunks of 64; L 8 / sink 4 / window 128 was 1.86%
//! there and 9.5% in chunks of 512.
//!
//! `TRELLIS_KV_TOKENS` (default 4096), `TRELLIS_KV_CHUNK` (64) and `TRELLIS_KV_BITS` (3)
//! change the run; `TRELLIS_KV_ROWS` (e.g. `3:8:0:0:0:0,3:12:4:1:0:64`: bits, L, exact
//! sink tokens, per-channel normalization of keys and of values (0/1), exact recent window of
//! each extra row) adds rows, printed and not gated; `TRELLIS_KV_NO_GATE=1` runs only the plain row and those.

use std::path::PathBuf;

use mlx_cache::{Cache, KvMode, TrellisKVCache, TrellisKvSpec};
use mlx_core::prelude::*;
use mlx_engine::generate::{
    generate_step, make_prompt_cache, maybe_quantize_kv_cache, GenerateOptions,
};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

/// Summed negative log-likelihood of `ids[1..]` and the count, feeding `ids[..n-1]` through
/// `caches` in chunks of `chunk`.
fn nll(
    model: &dyn LanguageModel,
    ids: &[i32],
    chunk: usize,
    caches: &mut [Box<dyn Cache>],
) -> (f64, usize) {
    let vocab = model.vocab_size() as usize;
    let inputs = &ids[..ids.len() - 1];
    let (mut sum, mut count) = (0.0f64, 0usize);
    for (c, part) in inputs.chunks(chunk).enumerate() {
        let x = Array::from_slice(part, &[1, part.len() as i32]).unwrap();
        let logits = model
            .forward(&x, Some(caches))
            .unwrap()
            .to_vec_f32()
            .unwrap();
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            let target = ids[c * chunk + i + 1] as usize;
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) as f64;
            let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            sum += lse - row[target] as f64;
            count += 1;
        }
    }
    (sum, count)
}

fn caches(model: &dyn LanguageModel, mode: Option<(KvMode, i32)>) -> Vec<Box<dyn Cache>> {
    let mut c = make_prompt_cache(model, None).unwrap();
    if let Some((mode, bits)) = mode {
        maybe_quantize_kv_cache(&mut c, 0, 64, Some(bits), mode).unwrap();
    }
    c
}

fn plain_layers(model: &dyn LanguageModel) -> usize {
    make_prompt_cache(model, None).unwrap().len()
}

fn tiny() -> Box<dyn LanguageModel> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models/dense_f32");
    load_model_dir(&dir, &LoadOptions::default()).unwrap().0
}

/// The tiny llama (head_dim 16, coded padded to 32 at 3 bits) teacher-forced through a trellis
/// cache without its exact window: every layer's cache is a `TrellisKVCache`, chunking changes nothing (a token's code
/// depends on the token and the first write's center only, and the first chunk is the same),
/// and the perplexity stays near the plain cache's. Then `generate_step` with the options.
#[test]
fn trellis_cache_runs_the_tiny_model_and_stays_near_the_plain_cache() {
    let model = tiny();
    let ids: Vec<i32> = (0..97).map(|i| (i * 37 + 11) % 128).collect();
    let mut plain = caches(model.as_ref(), None);
    let (p, n) = nll(model.as_ref(), &ids, 32, &mut plain);
    // Every token past the sink read from its code (no exact window), so coding shows.
    let coded = |bits: i32| -> Vec<Box<dyn Cache>> {
        let spec = TrellisKvSpec::new(bits, 8).unwrap().with_window(0, 0);
        (0..plain_layers(model.as_ref()))
            .map(|_| Box::new(TrellisKVCache::with_spec(spec)) as Box<dyn Cache>)
            .collect()
    };
    for bits in [2, 3, 4] {
        let mut t = coded(bits);
        let (q, m) = nll(model.as_ref(), &ids, 32, &mut t);
        assert_eq!(n, m);
        assert!(t.iter().all(|c| c.class_name() == "TrellisKVCache"));
        assert!(t.iter().all(|c| c.offset() == ids.len() - 1));
        let (pp, pq) = ((p / n as f64).exp(), (q / n as f64).exp());
        eprintln!("tiny: plain {pp:.4}, trellis-{bits} {pq:.4}");
        assert!(
            (pq / pp - 1.0).abs() < [0.0, 0.0, 0.2, 0.05, 0.02][bits as usize],
            "{bits} bits: {pq} vs {pp}"
        );
        // Same first chunk, then other chunk sizes: the same codes, the same logits.
        let mut u = coded(bits);
        let first = Array::from_slice(&ids[..32], &[1, 32]).unwrap();
        model.forward(&first, Some(&mut u)).unwrap();
        let rest: Vec<i32> = ids[32..ids.len() - 1].to_vec();
        let mut last = None;
        for part in rest.chunks(7) {
            let x = Array::from_slice(part, &[1, part.len() as i32]).unwrap();
            last = Some(model.forward(&x, Some(&mut u)).unwrap());
        }
        let x = Array::from_slice(&ids[64..96], &[1, 32]).unwrap();
        let mut v = coded(bits);
        model
            .forward(
                &Array::from_slice(&ids[..32], &[1, 32]).unwrap(),
                Some(&mut v),
            )
            .unwrap();
        model
            .forward(
                &Array::from_slice(&ids[32..64], &[1, 32]).unwrap(),
                Some(&mut v),
            )
            .unwrap();
        let whole = model.forward(&x, Some(&mut v)).unwrap();
        let tail = ops::slice_axis(&whole, 1, 31, 32, None).unwrap();
        let last = last.unwrap();
        let n_last = last.shape()[1];
        let last = ops::slice_axis(&last, 1, n_last - 1, n_last, None).unwrap();
        mlx_core::testing::assert_bit_equal(&last, &tail).unwrap();
    }
    // maybe_quantize_kv_cache turns the plain caches into trellis ones of the default spec.
    let t = caches(model.as_ref(), Some((KvMode::Trellis, 3)));
    assert!(t.iter().all(|c| c
        .as_any()
        .downcast_ref::<TrellisKVCache>()
        .is_some_and(
            |c| c.spec() == TrellisKvSpec::new(3, mlx_cache::DEFAULT_TRELLIS_KV_L).unwrap()
        )));
    // Through generate_step, quantizing from the start.
    let opts = GenerateOptions {
        max_tokens: Some(6),
        kv_bits: Some(3),
        kv_mode: KvMode::Trellis,
        quantized_kv_start: 0,
        ..GenerateOptions::default()
    };
    let steps: Vec<_> = generate_step(&ids[..20], model.as_ref(), None, opts)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(steps.len(), 6);
    // Bad settings are errors before anything runs.
    for (bits, mode) in [(5, KvMode::Trellis), (1, KvMode::Trellis)] {
        let opts = GenerateOptions {
            kv_bits: Some(bits),
            kv_mode: mode,
            ..GenerateOptions::default()
        };
        assert!(generate_step(&ids[..4], model.as_ref(), None, opts).is_err());
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The real-model gate (see the module documentation for the command).
#[test]
#[ignore = "minutes: SmolLM2-135M over 4,096 tokens twice; set TRELLIS_KV_MODEL"]
fn smollm2_trellis3_cache_within_one_percent_at_4k() {
    let dir = std::env::var("TRELLIS_KV_MODEL")
        .expect("TRELLIS_KV_MODEL: a directory made by `mlx convert -d --dtype float16` from the SmolLM2 GGUF");
    let tokens = env_usize("TRELLIS_KV_TOKENS", 4096);
    let chunk = env_usize("TRELLIS_KV_CHUNK", 64);
    let bits = env_usize("TRELLIS_KV_BITS", 3) as i32;
    let gate = std::env::var("TRELLIS_KV_NO_GATE").is_err();
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (model, _) = load_model_dir(std::path::Path::new(&dir), &opts).unwrap();
    let tok = mlx_tokenizers::Tokenizer::from_dir(&dir).unwrap();
    let text_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../results/quant/exodus_kjv_1-16.txt");
    let text = std::fs::read_to_string(&text_path).unwrap();
    let ids: Vec<i32> = tok
        .encode(&text, false)
        .unwrap()
        .into_iter()
        .map(|t| t as i32)
        .collect();
    assert!(ids.len() > tokens, "the text has {} tokens", ids.len());
    let ids = &ids[..tokens + 1];
    let mut rows = Vec::new();
    let mut kinds = vec![("plain".to_string(), None)];
    if gate {
        kinds.push((format!("trellis-{bits}"), Some((KvMode::Trellis, bits))));
    }
    for (name, mode) in kinds {
        let t = std::time::Instant::now();
        let mut c = caches(model.as_ref(), mode);
        let (s, n) = nll(model.as_ref(), ids, chunk, &mut c);
        let ppl = (s / n as f64).exp();
        let bytes: usize = c.iter().map(|c| c.nbytes()).sum();
        eprintln!(
            "{name}: {n} positions, context {tokens}, chunks of {chunk}: perplexity {ppl:.4}, \
             cache {bytes} bytes, {:.0} s",
            t.elapsed().as_secs_f64()
        );
        rows.push(ppl);
    }
    for row in std::env::var("TRELLIS_KV_ROWS")
        .unwrap_or_default()
        .split(',')
    {
        let f: Vec<usize> = row.split(':').filter_map(|v| v.parse().ok()).collect();
        let [b, l, sink, nk, nv, window] = f[..] else {
            continue;
        };
        let mut spec = TrellisKvSpec::new(b as i32, l as u32)
            .unwrap()
            .with_sink(sink)
            .with_window(window, 0);
        spec.norm_keys = nk == 1;
        spec.norm_values = nv == 1;
        let t = std::time::Instant::now();
        let mut c: Vec<Box<dyn Cache>> = (0..plain_layers(model.as_ref()))
            .map(|_| Box::new(TrellisKVCache::with_spec(spec)) as Box<dyn Cache>)
            .collect();
        let (s, n) = nll(model.as_ref(), ids, chunk, &mut c);
        let ppl = (s / n as f64).exp();
        eprintln!(
            "trellis bits {b} L {l} sink {sink} norm keys {nk} values {nv} window {window}: perplexity {ppl:.4} ({:+.3}% vs plain), {:.0} s",
            (ppl / rows[0] - 1.0) * 100.0,
            t.elapsed().as_secs_f64()
        );
    }
    if !gate {
        return;
    }
    let gap = rows[1] / rows[0] - 1.0;
    eprintln!("trellis-{bits} vs plain: {:+.3}%", gap * 100.0);
    assert!(gap.abs() <= 0.01, "gap {:.3}% > 1%", gap * 100.0);
}
