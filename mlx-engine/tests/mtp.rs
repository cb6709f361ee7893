//! Multi-token-prediction drafting (`--mtp`). The tiny seeded deepseek_v3, qwen3_next and
//! mimo fixtures get MTP layers added here (seeded: a copy of their last layer as the MTP
//! block, random `eh_proj` / `fc` / `input_proj`, unit norms), written to a temporary
//! directory as a checkpoint carries them. Without `--mtp` the loader does what mlx-lm does
//! (the strict loader refuses deepseek_v3's and qwen3_next's extra tensors; mimo's `sanitize`
//! drops them); with it, speculation drafted by the MTP layers gives exactly plain greedy
//! decoding's tokens.

use std::path::PathBuf;

use mlx_engine::generate::GenerateOptions;
use mlx_engine::speculative::{speculative_generate_step, Drafter, SpecStats};
use mlx_models::load::{load_model_dir, load_model_dir_mtp, LoadOptions};
use mlx_models::LanguageModel;

#[path = "support/mtp_fixture.rs"]
mod mtp_fixture;
use mtp_fixture::with_mtp;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

const PROMPT: &[i32] = &[3, 17, 59, 5, 42, 7, 60, 64, 11, 90, 3, 17, 59];
const GEN: usize = 24;

fn opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(GEN),
        ..GenerateOptions::default()
    }
}

fn plain(model: &dyn LanguageModel) -> Vec<u32> {
    mlx_engine::generate::generate_step(PROMPT, model, None, opts())
        .unwrap()
        .map(|s| s.unwrap().token)
        .collect()
}

fn mtp(model: &dyn LanguageModel, k: usize) -> (Vec<u32>, SpecStats) {
    let mut g = speculative_generate_step(PROMPT, model, None, Drafter::Mtp, k, opts()).unwrap();
    let out: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
    (out, g.stats())
}

/// What loading the MTP checkpoint without `--mtp` does (mlx-lm's behaviour).
enum WithoutMtp {
    /// The strict loader refuses the MTP tensors, naming them.
    Refused,
    /// `sanitize` drops them: the model loads and decodes as the fixture without them.
    Dropped,
}

fn check(fixture: &str) {
    let expect = if fixture == "dense/mimo" {
        WithoutMtp::Dropped
    } else {
        WithoutMtp::Refused
    };
    check_with(fixture, expect)
}

fn check_with(fixture: &str, without: WithoutMtp) {
    let src = repo().join("mlx-models/tests/models").join(fixture);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mtp_{}", fixture.replace('/', "_")));
    with_mtp(&src, &dir, 7);

    let without_mtp = load_model_dir(&dir, &LoadOptions::default());
    match without {
        // Without --mtp: the strict loader, which names the MTP tensors it did not consume.
        WithoutMtp::Refused => {
            let e = match without_mtp {
                Ok(_) => panic!("{fixture}: MTP tensors loaded without --mtp"),
                Err(e) => e.to_string(),
            };
            assert!(
                e.contains("eh_proj") || e.contains("mtp.fc"),
                "{fixture}: {e}"
            );
        }
        WithoutMtp::Dropped => {
            let m = without_mtp.unwrap().0;
            assert!(
                m.mtp().is_none(),
                "{fixture}: MTP layers loaded without --mtp"
            );
        }
    }
    // A model without MTP layers refuses --mtp, naming why.
    let e = match load_model_dir_mtp(&src, &LoadOptions::default(), true) {
        Ok(_) => panic!("{fixture}: --mtp accepted without MTP layers"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("--mtp"), "{e}");

    let plain_model = load_model_dir(&src, &LoadOptions::default()).unwrap().0;
    let reference = plain(plain_model.as_ref());
    assert_eq!(reference.len(), GEN);
    let (model, _, _) = load_model_dir_mtp(&dir, &LoadOptions::default(), true).unwrap();
    assert!(model.mtp().is_some());
    // The main model is untouched by loading its MTP layers.
    assert_eq!(plain(model.as_ref()), reference, "{fixture}");
    let (mut drafted, mut accepted) = (0, 0);
    for k in 1..=4 {
        let (got, st) = mtp(model.as_ref(), k);
        assert_eq!(got, reference, "{fixture}: --mtp --num-draft-tokens {k}");
        assert!(st.accepted <= st.drafted);
        // Every round yields its accepted drafts and the target's token, except that a last
        // round whose drafts reach `max_tokens` all accepted makes one token past it.
        let made = st.rounds + st.accepted;
        assert!(made == GEN || made == GEN + 1, "{fixture}: {st:?}");
        eprintln!(
            "{fixture} k={k}: {}/{} drafts accepted, {} passes",
            st.accepted, st.drafted, st.rounds
        );
        drafted += st.drafted;
        accepted += st.accepted;
    }
    // Some drafts are accepted, most are not: both paths of the head's cache run.
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
    // A plain drafter refuses a model loaded without MTP layers.
    let e = speculative_generate_step(PROMPT, plain_model.as_ref(), None, Drafter::Mtp, 2, opts())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--mtp"), "{e}");
}

#[test]
fn deepseek_v3_mtp_drafts_give_plain_greedy_output() {
    check("mla/deepseek_v3");
}

#[test]
fn qwen3_next_mtp_drafts_give_plain_greedy_output() {
    check("qwen3_next");
}

#[test]
fn mimo_mtp_drafts_give_plain_greedy_output() {
    check("dense/mimo");
}
