//! The CPU decoder (`mlx_engine::cpu_decode`) against the exact path (the model's MLX
//! forward) on the llama-family descriptor fixtures: teacher-forced logits of a prompt that
//! spans several prefill blocks, then token-by-token decode steps through its cache.
//!
//! Tier L3: both compute in float32 (the fixtures are loaded as `--dtype auto` loads them on
//! the CPU), but the CPU decoder sums in its own order and fuses multiply-adds, so logits
//! differ by rounding. Bound: `|ours - exact| <= 2e-5 * (1 + max |exact|)` per position
//! (the largest difference measured on these fixtures was 1.0e-6 of that scale, AVX2; the
//! bound leaves room for another instruction set's summation order).

use std::path::PathBuf;

use mlx_core::cpu::Activations;
use mlx_core::prelude::*;
use mlx_engine::cpu_decode::{unsupported, CpuDecoder, KvDtype, BLOCK};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models")
        .join(name)
}

fn load(name: &str) -> Box<dyn LanguageModel> {
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    load_model_dir(&fixture(name), &opts)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .0
}

fn prompt(vocab: i32, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i as u64 * 2_654_435_761 + 17) % vocab as u64) as u32)
        .collect()
}

/// The exact path's logits `(n, vocab)` for `ids`, one forward without a cache.
fn exact(model: &dyn LanguageModel, ids: &[u32]) -> Vec<Vec<f32>> {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    let x = Array::from_slice(&v, &[1, v.len() as i32]).unwrap();
    let logits = model
        .forward(&x, None)
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap();
    let vocab = *logits.shape().last().unwrap() as usize;
    logits
        .to_vec::<f32>()
        .unwrap()
        .chunks(vocab)
        .map(<[f32]>::to_vec)
        .collect()
}

fn check(name: &str, what: &str, ours: &[f32], exact: &[f32]) {
    let scale = 1.0 + exact.iter().fold(0f32, |m, v| m.max(v.abs()));
    let bound = 2e-5 * scale;
    let worst = ours
        .iter()
        .zip(exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= bound,
        "{name} {what}: max |ours - exact| = {worst}, bound {bound}"
    );
}

const COVERED: &[&str] = &[
    "dense_f32",
    "dense_f16",
    "dense_bf16_mha",
    "dense_bf16_untied",
    "mistral_bias_llama3rope",
    "q4_g32",
    "q4_g64_untied",
    "q8_g32_bf16",
    "q8_g64",
    "dense/qwen2",
    "dense/qwen2_q4",
    "dense/qwen3",
    "dense/qwen3_bf16",
    // Sliding-window layers (a window of 6 over the 41-token prompt and the decode steps).
    "linear_rope_sliding",
    // Gemma 3: `(1 + w)` RMSNorms in the sandwich placement, per-head q/k norms, the
    // GELU-approx gate, the bfloat16-rounded embedding scale, `query_pre_attn_scalar`,
    // sliding layers (window 4) with their own rope base, a linearly scaled global rope,
    // and the tied head; dense, 4-bit, and the `gemma3` wrapper.
    "dense/gemma3_text",
    "dense/gemma3_text_q4",
    "dense/gemma3_wrapper",
];

/// Every covered fixture: teacher-forced logits of a prompt longer than one block, then
/// three single-token steps after a prefix, against the exact path.
#[test]
fn teacher_forced_logits_match_the_exact_path() {
    for &name in COVERED {
        let model = load(name);
        assert_eq!(unsupported(model.as_ref()), None, "{name}");
        let ids = prompt(model.vocab_size(), BLOCK + 9);
        let reference = exact(model.as_ref(), &ids);
        let mut dec = CpuDecoder::new(model.as_ref(), 2, 8).unwrap();
        // Float32 products here (the bound is float rounding's); the int8 activations of
        // the default are gated on the real model (`cpu_decode_smollm2.rs`).
        dec.set_activations(Activations::F32);
        dec.set_kv_dtype(KvDtype::F32);
        let mut seen = 0;
        dec.feed_all(&ids, &mut |i, l| {
            check(name, &format!("position {i}"), l, &reference[i]);
            seen += 1;
        })
        .unwrap();
        assert_eq!(seen, ids.len());
        // Decode: a prefix, then one token at a time through the cache (grown past its
        // initial room of 8).
        dec.reset();
        let split = ids.len() - 3;
        dec.feed(&ids[..split]).unwrap();
        for (i, &t) in ids.iter().enumerate().skip(split) {
            let l = dec.feed(&[t]).unwrap();
            check(name, &format!("step at {i}"), l, &reference[i]);
        }
        assert_eq!(dec.position(), ids.len());
    }
}

/// The default float16 cache: half the bytes of a float32 one, and logits within a bound
/// of the exact path's (keys and values rounded to float16, relative error <= 2^-11 each;
/// bound `2e-3 * (1 + max |exact|)`; measured at most 5.9e-4 of that scale on these fixtures),
/// in the prompt blocks and the decode steps.
#[test]
fn the_f16_cache_halves_the_bytes_and_stays_near_the_exact_path() {
    for &name in COVERED {
        let model = load(name);
        let ids = prompt(model.vocab_size(), BLOCK + 9);
        let reference = exact(model.as_ref(), &ids);
        let mut dec = CpuDecoder::new(model.as_ref(), 2, 8).unwrap();
        dec.set_activations(Activations::F32);
        let mut worst = 0f32;
        let mut near = |l: &[f32], e: &[f32], what: String| {
            let scale = 1.0 + e.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = l
                .iter()
                .zip(e)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            worst = worst.max(d / scale);
            assert!(d <= 2e-3 * scale, "{name} {what}: {d} > 2e-3 * {scale}");
        };
        dec.feed_all(&ids, &mut |i, l| {
            near(l, &reference[i], format!("position {i}"))
        })
        .unwrap();
        dec.reset();
        let split = ids.len() - 3;
        dec.feed(&ids[..split]).unwrap();
        for (i, &t) in ids.iter().enumerate().skip(split) {
            let l = dec.feed(&[t]).unwrap().to_vec();
            near(&l, &reference[i], format!("step at {i}"));
        }
        eprintln!("{name}: f16 cache, worst |ours - exact| / scale = {worst:.2e}");
    }
    let model = load("q4_g32");
    let b = mlx_engine::cpu_decode::CpuBatch::new(model.as_ref(), 1).unwrap();
    let (c16, c32) = (b.new_cache(64), {
        let mut b = mlx_engine::cpu_decode::CpuBatch::new(model.as_ref(), 1).unwrap();
        b.set_kv_dtype(KvDtype::F32);
        b.new_cache(64)
    });
    assert_eq!(c16.dtype(), KvDtype::F16);
    assert_eq!(c32.dtype(), KvDtype::F32);
    assert_eq!(2 * c16.nbytes(), c32.nbytes());
}

/// Rows the decoder does not cover say why (the CLI prints it when `--decoder auto` falls
/// back), and building a decoder for them is that error.
#[test]
fn uncovered_models_name_the_reason() {
    for (name, needle) in [
        ("dense/gemma", "GeGluErf MLP"),
        ("dense/gemma2", "soft-capping"),
        ("dense/phi3", "fused q/k/v"),
        ("dense/internlm3", "RoPE"),
        ("dense/gpt2", "RMSNorm"),
        ("dense/smollm3_q4", "rotary"),
    ] {
        let model = load(name);
        let why = unsupported(model.as_ref()).unwrap_or_else(|| panic!("{name} is covered?"));
        assert!(why.contains(needle), "{name}: {why}");
        let err = CpuDecoder::new(model.as_ref(), 1, 8)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{name}: {err}");
    }
}

/// Token ids outside the vocabulary are an error, not a read out of bounds.
#[test]
fn out_of_vocabulary_ids_are_refused() {
    let model = load("q4_g32");
    let mut dec = CpuDecoder::new(model.as_ref(), 1, 8).unwrap();
    let err = dec
        .feed(&[model.vocab_size() as u32])
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the model's vocabulary"), "{err}");
    assert!(dec.feed(&[]).is_err());
    assert_eq!(dec.position(), 0);
}

/// Handing the prompt blocks' scratch back between a prompt and its decode steps (what `mlx
/// generate` does before its first step, issue #31's peak memory) changes no bit: a decoder
/// that releases it after every call gives the logits of one that never does, through a
/// prompt of more than one block, decode steps, and a second multi-token feed that makes the
/// scratch again (tier L2: the same kernels on the same inputs, compared exactly).
#[test]
fn releasing_the_prompt_scratch_changes_no_bit() {
    let name = COVERED[0];
    let model = load(name);
    let ids = prompt(model.vocab_size(), BLOCK + 13);
    let (a, b) = (BLOCK + 5, BLOCK + 8);
    let mut kept = CpuDecoder::new(model.as_ref(), 2, 4).unwrap();
    let mut released = CpuDecoder::new(model.as_ref(), 2, 4).unwrap();
    let run = |dec: &mut CpuDecoder<'_>, release: bool| -> Vec<Vec<f32>> {
        let mut out = vec![dec.feed(&ids[..a]).unwrap().to_vec()];
        for &t in &ids[a..b] {
            if release {
                dec.release_prompt_scratch();
            }
            out.push(dec.feed(&[t]).unwrap().to_vec());
        }
        out.push(dec.feed(&ids[b..]).unwrap().to_vec());
        if release {
            dec.release_prompt_scratch();
        }
        out.push(dec.feed(&ids[..1]).unwrap().to_vec());
        out
    };
    let want = run(&mut kept, false);
    let got = run(&mut released, true);
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert!(
            w.iter().zip(g).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}: call {i} differs"
        );
    }
    assert_eq!(kept.position(), released.position());
}
