//! Rollback of hybrid models' caches (which mlx-lm cannot trim, its issue #1446): with caches
//! from `make_cache_with_rollback`, decoding k tokens, trimming j and decoding on gives logits
//! bit-for-bit equal to decoding the k - j tokens directly, for the Gated DeltaNet hybrid
//! (ArraysCache conv + recurrent state, KVCache) and LFM2 (ArraysCache conv state, KVCache).

use std::path::PathBuf;

use mlx_cache::{trim_prompt_cache, Cache};
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;
use mlx_models::config::ModelConfig;
use mlx_models::load::load_weights;
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
    decoded: &[i32],
    back: usize,
    then: &[i32],
) -> Result<(), TestCaseError> {
    // Decode k tokens one at a time, roll back j, decode on.
    let mut caches = make(MAX_ROLLBACK);
    step(model, &mut caches, PROMPT);
    for &t in decoded {
        step(model, &mut caches, &[t]);
    }
    prop_assert_eq!(trim_prompt_cache(&mut caches, back), back);
    let kept = &decoded[..decoded.len() - back];
    // Decoding the k - j tokens directly.
    let mut fresh = make(MAX_ROLLBACK);
    step(model, &mut fresh, PROMPT);
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

fn property(name: &str) {
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
        check(model.as_ref(), &make, &decoded, back, &then)?;
    });
}

#[test]
fn gated_deltanet_hybrid_rolls_back_bit_for_bit() {
    property("qwen3_next");
}

#[test]
fn lfm2_rolls_back_bit_for_bit() {
    property("lfm2");
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
