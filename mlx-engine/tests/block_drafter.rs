//! Block drafting from the target's hidden states ([`BlockDrafter`], the shape of DFlash-style
//! drafters): one pass proposes a block of tokens from the last kept position's final hidden
//! state. No trained drafter of this kind is reachable here, so the drafters are synthetic:
//! distilled by least squares on hidden states the tiny seeded target produced (a few dozen
//! positions), or random. Whatever they propose, greedy output equals plain decoding's; the
//! acceptance of the distilled one on positions it was not fitted on is printed.

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::speculative::{speculative_generate_step, BlockDrafter, Drafter, SpecStats};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn model(name: &str) -> Box<dyn LanguageModel> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models")
        .join(name);
    load_model_dir(&dir, &LoadOptions::default()).unwrap().0
}

const PROMPT: &[i32] = &[3, 17, 59, 5, 42, 7, 60, 64, 11, 90];
const GEN: usize = 48;

fn opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(GEN),
        ..GenerateOptions::default()
    }
}

fn plain(m: &dyn LanguageModel) -> Vec<u32> {
    mlx_engine::generate::generate_step(PROMPT, m, None, opts())
        .unwrap()
        .map(|s| s.unwrap().token)
        .collect()
}

fn speculate(m: &dyn LanguageModel, d: BlockDrafter, k: usize) -> (Vec<u32>, SpecStats) {
    let mut g = speculative_generate_step(PROMPT, m, None, Drafter::Hidden(Box::new(d)), k, opts())
        .unwrap();
    let out: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
    (out, g.stats())
}

/// The target's final hidden states `(t, hidden)` over `tokens`.
fn states(m: &dyn LanguageModel, tokens: &[u32]) -> Array {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    let x = Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap();
    let h = m.forward_hidden(&x).unwrap().unwrap();
    let d = h.dim(2).unwrap();
    h.reshape(&[ids.len() as i32, d]).unwrap()
}

#[test]
fn a_distilled_block_drafter_keeps_greedy_output() {
    let m = model("dense_f32");
    let reference = plain(m.as_ref());
    assert_eq!(reference.len(), GEN);
    // Fitted on the prompt and the first half of the output only.
    let mut seen: Vec<u32> = PROMPT.iter().map(|&t| t as u32).collect();
    seen.extend_from_slice(&reference[..GEN / 2]);
    let block = 4;
    let proj = BlockDrafter::distill(&states(m.as_ref(), &seen), block, 1e-3).unwrap();
    let (mut accepted, mut drafted) = (0, 0);
    for k in 1..=block {
        let d = BlockDrafter::new(m.as_ref(), proj.clone()).unwrap();
        assert_eq!(d.block(), block);
        let (got, st) = speculate(m.as_ref(), d, k);
        assert_eq!(got, reference, "k {k}");
        assert_eq!(st.rounds + st.accepted, GEN);
        eprintln!(
            "distilled block drafter, k={k}: {}/{} drafts accepted ({:.1}%), {} passes for {GEN} \
             tokens",
            st.accepted,
            st.drafted,
            100.0 * st.acceptance(),
            st.rounds
        );
        accepted += st.accepted;
        drafted += st.drafted;
    }
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
}

#[test]
fn block_drafters_load_and_keep_hybrid_greedy_output() {
    // A random block drafter on a hybrid (recurrent state rolled back after each rejection).
    let m = model("qwen3_next");
    let reference = plain(m.as_ref());
    let key = mlx_core::random::key(3).unwrap();
    let proj =
        mlx_core::random::normal(&[3 * 32, 32], Dtype::Float32, None, None, Some(&key), None)
            .unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("block_drafter");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("drafter.safetensors");
    mlx_core::io::save_safetensors(&file, [("proj.weight", &proj)], &Default::default()).unwrap();
    let d = BlockDrafter::load(m.as_ref(), &file).unwrap();
    assert_eq!(d.block(), 3);
    let (got, st) = speculate(m.as_ref(), d, 3);
    assert_eq!(got, reference);
    assert!(st.drafted > 0);

    // Bad weights are refused with the tensor and shape named.
    let bad = ops::zeros(&[5, 32], Dtype::Float32, None).unwrap();
    let e = BlockDrafter::new(m.as_ref(), bad)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("proj.weight") && e.contains("[5, 32]"), "{e}");
    let d = BlockDrafter::new(
        m.as_ref(),
        ops::zeros(&[8, 4], Dtype::Float32, None).unwrap(),
    )
    .unwrap();
    // A drafter for another hidden size: an error at its first observation, not a panic.
    let e = match speculative_generate_step(
        PROMPT,
        m.as_ref(),
        None,
        Drafter::Hidden(Box::new(d)),
        2,
        opts(),
    ) {
        Err(e) => e.to_string(),
        Ok(mut g) => g
            .find_map(|s| s.err())
            .map(|e| e.to_string())
            .unwrap_or_default(),
    };
    assert!(e.contains("hidden size 4"), "{e}");
}
