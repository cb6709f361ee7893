//! Rollback for every cache kind the new rows use: decoding k tokens, trimming j and decoding
//! on gives logits bit-for-bit equal to decoding the k - j tokens directly. Hybrids (which
//! mlx-lm cannot trim, its issue #1446) use caches from `make_cache_with_rollback`: the Gated
//! DeltaNet hybrid (ArraysCache conv + recurrent state, KVCache) and LFM2 (ArraysCache conv
//! state, KVCache). gpt_oss and gemma4_text use their own caches (KVCache and
//! RotatingKVCache, trimmable until the window wraps; gemma4's KV-shared layers have none).

use std::path::PathBuf;

use mlx_cache::{trim_prompt_cache, Cache};
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;
use mlx_models::config::ModelConfig;
use mlx_models::load::{load_model_dir, load_weights, LoadOptions};
use mlx_models::models::{lfm2, qwen3_next, LanguageModel};
use mlx_models::weights::Weights;
use proptest::prelude::*;

type MakeCache = Box<dyn Fn(usize) -> Vec<Box<dyn Cache>>>;

fn load(name: &str) -> (Box<dyn LanguageModel>, MakeCache) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/models")
        .join(name);
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = || Weights::new(load_weights(&dir).unwrap(), None, None);
    match name {
        "gpt_oss_q4" | "gemma4_text" => {
            let (m, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
            let (m2, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
            (m, Box::new(move |_| m2.make_cache()))
        }
        "lfm2" => {
            let mut w = weights();
            let m = lfm2::Model::load(&config, &mut w).unwrap();
            w.finish().unwrap();
            let mut w2 = weights();
            let m2 = lfm2::Model::load(&config, &mut w2).unwrap();
            (
                Box::new(m),
                Box::new(move |n| m2.make_cache_with_rollback(n)),
            )
        }
        _ => {
            let mut w = weights();
            let m = qwen3_next::Model::load(&config, &mut w).unwrap();
            w.finish().unwrap();
            let mut w2 = weights();
            let m2 = qwen3_next::Model::load(&config, &mut w2).unwrap();
            (
                Box::new(m),
                Box::new(move |n| m2.make_cache_with_rollback(n)),
            )
        }
    }
}

fn step(model: &dyn LanguageModel, caches: &mut [Box<dyn Cache>], ids: &[i32]) -> Array {
    let x = Array::from_slice(ids, &[1, ids.len() as i32]).unwrap();
    let y = model.forward(&x, Some(caches)).unwrap();
    y.eval().unwrap();
    y
}

const PROMPT: &[i32] = &[3, 17, 99, 5, 42, 7, 120, 64];
const MAX_ROLLBACK: usize = 6;

fn check(
    model: &dyn LanguageModel,
    make: &MakeCache,
    prompt: &[i32],
    decoded: &[i32],
    back: usize,
    then: &[i32],
) -> Result<(), TestCaseError> {
    // Decode k tokens one at a time, roll back j, decode on.
    let mut caches = make(MAX_ROLLBACK);
    step(model, &mut caches, prompt);
    for &t in decoded {
        step(model, &mut caches, &[t]);
    }
    prop_assert_eq!(trim_prompt_cache(&mut caches, back), back);
    let kept = &decoded[..decoded.len() - back];
    // Decoding the k - j tokens directly.
    let mut fresh = make(MAX_ROLLBACK);
    step(model, &mut fresh, prompt);
    for &t in kept {
        step(model, &mut fresh, &[t]);
    }
    for (a, b) in caches.iter().zip(&fresh) {
        prop_assert_eq!(a.offset(), b.offset());
    }
    for &t in then {
        let got = step(model, &mut caches, &[t]);
        let want = step(model, &mut fresh, &[t]);
        assert_bit_equal(&got, &want).map_err(TestCaseError::fail)?;
    }
    Ok(())
}

/// `prompt_len` keeps rotating caches short of their window.
fn property(name: &str, prompt_len: usize) {
    let (model, make) = load(name);
    let vocab = model.vocab_size();
    let cfg = ProptestConfig {
        cases: 6,
        ..ProptestConfig::default()
    };
    proptest!(cfg, |(
        decoded in prop::collection::vec(0..vocab, 1..=MAX_ROLLBACK),
        back_frac in 0.0f64..=1.0,
        then in prop::collection::vec(0..vocab, 1..3),
    )| {
        let back = ((decoded.len() as f64) * back_frac).round() as usize;
        check(model.as_ref(), &make, &PROMPT[..prompt_len], &decoded, back, &then)?;
    });
}

#[test]
fn gated_deltanet_hybrid_rolls_back_bit_for_bit() {
    property("qwen3_next", PROMPT.len());
}

#[test]
fn lfm2_rolls_back_bit_for_bit() {
    property("lfm2", PROMPT.len());
}

#[test]
fn gpt_oss_rolls_back_bit_for_bit() {
    // Window 16: 8 + 6 + 2 tokens stay inside it.
    property("gpt_oss_q4", PROMPT.len());
}

#[test]
fn gemma4_text_rolls_back_bit_for_bit() {
    // Window 8: 1 + 6 tokens before the rotating caches could wrap.
    property("gemma4_text", 1);
}

#[test]
fn rollback_is_refused_beyond_the_kept_history_and_without_it() {
    let (model, make) = load("qwen3_next");
    let mut caches = make(2);
    step(model.as_ref(), &mut caches, PROMPT);
    for t in [1, 2, 3] {
        step(model.as_ref(), &mut caches, &[t]);
    }
    let before: Vec<usize> = caches.iter().map(|c| c.offset()).collect();
    assert_eq!(trim_prompt_cache(&mut caches, 3), 0, "only 2 tokens kept");
    let after: Vec<usize> = caches.iter().map(|c| c.offset()).collect();
    assert_eq!(before, after, "a refused trim changes nothing");
    assert_eq!(trim_prompt_cache(&mut caches, 2), 2);
    // mlx-lm's plain caches: not trimmable, as in mlx-lm.
    let mut plain = model.make_cache();
    step(model.as_ref(), &mut plain, PROMPT);
    assert_eq!(trim_prompt_cache(&mut plain, 1), 0);
}

/// Speculative verification feeds several draft tokens in one call and rolls back the
/// rejected ones: the recurrent state restored from inside the call must be the one the
/// accepted tokens lead to, so the next logits equal those after feeding only the accepted
/// tokens (in one call).
#[test]
fn rollback_inside_a_multi_token_call() {
    for name in ["qwen3_next", "lfm2"] {
        let (model, make) = load(name);
        let draft = [11, 22, 33, 44, 55];
        for back in 1..draft.len() {
            let mut caches = make(MAX_ROLLBACK);
            step(model.as_ref(), &mut caches, PROMPT);
            step(model.as_ref(), &mut caches, &draft);
            assert_eq!(trim_prompt_cache(&mut caches, back), back);
            let got = step(model.as_ref(), &mut caches, &[7]);
            let mut fresh = make(MAX_ROLLBACK);
            step(model.as_ref(), &mut fresh, PROMPT);
            step(model.as_ref(), &mut fresh, &draft[..draft.len() - back]);
            let want = step(model.as_ref(), &mut fresh, &[7]);
            assert_bit_equal(&got, &want)
                .unwrap_or_else(|e| panic!("{name}, {back} rolled back: {e}"));
        }
    }
}
