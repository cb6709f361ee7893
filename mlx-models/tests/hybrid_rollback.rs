//! Rollback for every cache kind the new rows use: decoding k tokens, trimming j and decoding
//! on gives logits bit-for-bit equal to decoding the k - j tokens directly. Every model's caches
//! come from `LanguageModel::make_cache_with_rollback` (mlx-lm cannot trim a recurrent state,
//! its issue #1446, nor a rotating cache that has wrapped): the Gated DeltaNet hybrid
//! (ArraysCache conv + recurrent state, KVCache), LFM2 (ArraysCache conv state, KVCache),
//! gpt_oss and gemma3_text (KVCache and RotatingKVCache on the sliding layers) and gemma4_text
//! (the same, its KV-shared layers have none), with the rotating caches both short of their
//! window and wrapped; recurrent_gemma, rwkv7, gear and plamo2 (their ArraysCache states beside
//! rotating and plain KV caches); kimi_linear, bailing_moe_v3, kimi_k3, bailing_moe_linear
//! and bailing_hybrid (KDA and GLA states beside MLA and plain KV caches).

use std::path::PathBuf;

use mlx_cache::{trim_prompt_cache, Cache};
use mlx_core::prelude::*;
use mlx_core::testing::assert_bit_equal;
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::models::LanguageModel;
use proptest::prelude::*;

fn load(name: &str) -> Box<dyn LanguageModel> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/models")
        .join(name);
    load_model_dir(&dir, &LoadOptions::default()).unwrap().0
}

fn step(model: &dyn LanguageModel, caches: &mut [Box<dyn Cache>], ids: &[i32]) -> Array {
    let x = Array::from_slice(ids, &[1, ids.len() as i32]).unwrap();
    let y = model.forward(&x, Some(caches)).unwrap();
    y.eval().unwrap();
    y
}

const PROMPT: &[i32] = &[3, 17, 99, 5, 42, 7, 120, 64, 11, 90, 23, 8, 77, 31];
const MAX_ROLLBACK: usize = 6;

fn check(
    model: &dyn LanguageModel,
    prompt: &[i32],
    decoded: &[i32],
    back: usize,
    then: &[i32],
) -> Result<(), TestCaseError> {
    // Decode k tokens one at a time, roll back j, decode on.
    let mut caches = model.make_cache_with_rollback(MAX_ROLLBACK);
    step(model, &mut caches, prompt);
    for &t in decoded {
        step(model, &mut caches, &[t]);
    }
    prop_assert_eq!(trim_prompt_cache(&mut caches, back), back);
    let kept = &decoded[..decoded.len() - back];
    // Decoding the k - j tokens directly.
    let mut fresh = model.make_cache_with_rollback(MAX_ROLLBACK);
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

/// The first `prompt_len` ids of [`PROMPT`] (inside the vocabulary) as the prompt.
fn property(name: &str, prompt_len: usize) {
    let model = load(name);
    let vocab = model.vocab_size();
    let prompt: Vec<i32> = PROMPT[..prompt_len].iter().map(|t| t % vocab).collect();
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
        check(model.as_ref(), &prompt, &decoded, back, &then)?;
    });
}

#[test]
fn gated_deltanet_hybrid_rolls_back_bit_for_bit() {
    property("qwen3_next", 8);
}

#[test]
fn lfm2_rolls_back_bit_for_bit() {
    property("lfm2", 8);
}

#[test]
fn gpt_oss_rolls_back_bit_for_bit() {
    // Window 16: 8 + 6 + 2 tokens stay inside it.
    property("gpt_oss_q4", 8);
}

#[test]
fn gpt_oss_rolls_back_bit_for_bit_after_its_window_wrapped() {
    // Window 16: 14 + up to 6 tokens wrap the sliding layers' rings.
    property("gpt_oss_q4", 14);
}

#[test]
fn gemma4_text_rolls_back_bit_for_bit() {
    // Window 8: 1 + 6 tokens before the rotating caches could wrap.
    property("gemma4_text", 1);
}

#[test]
fn gemma4_text_rolls_back_bit_for_bit_after_its_window_wrapped() {
    // Window 8: a prompt of 8 wraps at the first decoded token.
    property("gemma4_text", 8);
}

#[test]
fn gemma3_text_rolls_back_bit_for_bit_after_its_window_wrapped() {
    // A descriptor row with mlx-lm's `make_cache`: window 4, so every case has wrapped.
    property("dense/gemma3_text", 8);
}

#[test]
fn recurrent_gemma_rolls_back_bit_for_bit_after_its_window_wrapped() {
    // RG-LRU and conv state in ArraysCaches, local attention with a window of 6.
    property("dense2/recurrent_gemma", 8);
}

#[test]
fn rwkv7_rolls_back_bit_for_bit() {
    // Token shifts and the WKV state: three slots per layer.
    property("dense2/rwkv7", 8);
}

#[test]
fn gear_rolls_back_bit_for_bit_after_its_window_wrapped() {
    // Conv-mixer states, a sliding window of 4 and a full-attention layer.
    property("dense2/gear", 8);
}

#[test]
fn plamo2_rolls_back_bit_for_bit() {
    // Mamba conv and SSM states (the scan over each kept prefix) beside KV caches.
    property("dense2/plamo2", 8);
}

#[test]
fn kda_hybrids_roll_back_bit_for_bit() {
    // Three conv states and the per-channel gated delta state beside MLA caches.
    property("dense2/kimi_linear", 8);
    property("dense2/bailing_moe_v3", 8);
    // kimi_k3: one fused conv state and the gated delta state in a two-slot ArraysCache,
    // with attention residuals and a latent MoE.
    property("dense2/kimi_k3", 8);
    property("dense2/kimi_k3_flat", 8);
}

#[test]
fn gated_linear_attention_hybrids_roll_back_bit_for_bit() {
    // The GLA state step by step (bailing_moe_linear) and chunked over each kept prefix
    // (bailing_hybrid) beside KV and MLA caches.
    property("dense2/bailing_moe_linear", 8);
    property("dense2/bailing_hybrid", 8);
}

#[test]
fn rollback_is_refused_beyond_the_kept_history_and_without_it() {
    let prompt = &PROMPT[..8];
    for name in ["qwen3_next", "dense/gemma3_text"] {
        let model = load(name);
        let prompt: Vec<i32> = prompt.iter().map(|t| t % model.vocab_size()).collect();
        let mut caches = model.make_cache_with_rollback(2);
        step(model.as_ref(), &mut caches, &prompt);
        for t in [1, 2, 3] {
            step(model.as_ref(), &mut caches, &[t]);
        }
        let before: Vec<usize> = caches.iter().map(|c| c.offset()).collect();
        assert_eq!(
            trim_prompt_cache(&mut caches, 3),
            0,
            "{name}: only 2 tokens kept"
        );
        let after: Vec<usize> = caches.iter().map(|c| c.offset()).collect();
        assert_eq!(before, after, "{name}: a refused trim changes nothing");
        assert_eq!(trim_prompt_cache(&mut caches, 2), 2, "{name}");
        // mlx-lm's caches: a recurrent state or a wrapped ring is not trimmable, as in mlx-lm.
        let mut plain = model.make_cache();
        step(model.as_ref(), &mut plain, &prompt);
        step(model.as_ref(), &mut plain, &[1]);
        assert_eq!(trim_prompt_cache(&mut plain, 1), 0, "{name}");
    }
}

/// Speculative verification feeds several draft tokens in one call and rolls back the
/// rejected ones: the state restored from inside the call (recurrent state, or a wrapped ring)
/// must be the one the accepted tokens lead to, so the next logits equal those after feeding
/// only the accepted tokens (in one call). With one accepted token that call is a one-token
/// call, whose projections are matrix-vector products: on gemma3_text's shapes their bits differ
/// from the same row of the draft call's matrix product (matmul, not the cache: the cache-level
/// property in mlx-cache covers that case exactly), so the rotating rows keep two or more.
#[test]
fn rollback_inside_a_multi_token_call() {
    for (name, min_accepted) in [
        ("qwen3_next", 1),
        ("lfm2", 1),
        ("dense/gemma3_text", 2),
        ("gemma4_text", 2),
        ("dense2/kimi_linear", 2),
        ("dense2/bailing_moe_v3", 2),
        ("dense2/kimi_k3", 2),
        ("dense2/bailing_moe_linear", 2),
        // Not bailing_hybrid: its chunked recurrence's outputs depend on the call's length
        // (the chunk size and its centring), so the later layers' caches of a 5-token call
        // differ in the last bits from those of a 4-token one, as in mlx-lm; its state is
        // restored exactly (the single-token property above).
    ] {
        let model = load(name);
        let prompt: Vec<i32> = PROMPT[..8].iter().map(|t| t % model.vocab_size()).collect();
        let draft = [11, 22, 33, 44, 55];
        for back in 1..=draft.len() - min_accepted {
            let mut caches = model.make_cache_with_rollback(MAX_ROLLBACK);
            step(model.as_ref(), &mut caches, &prompt);
            step(model.as_ref(), &mut caches, &draft);
            assert_eq!(trim_prompt_cache(&mut caches, back), back, "{name}");
            let got = step(model.as_ref(), &mut caches, &[7]);
            let mut fresh = model.make_cache_with_rollback(MAX_ROLLBACK);
            step(model.as_ref(), &mut fresh, &prompt);
            step(model.as_ref(), &mut fresh, &draft[..draft.len() - back]);
            let want = step(model.as_ref(), &mut fresh, &[7]);
            assert_bit_equal(&got, &want)
                .unwrap_or_else(|e| panic!("{name}, {back} rolled back: {e}"));
        }
    }
}
