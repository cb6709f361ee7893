//! Multi-token-prediction drafting (`--mtp`). The tiny seeded deepseek_v3 and qwen3_next
//! fixtures get MTP layers added here (seeded: a copy of their last layer as the MTP block,
//! random `eh_proj` / `fc`, unit norms), written to a temporary directory as a checkpoint
//! carries them. Without `--mtp` the strict loader refuses the extra tensors (mlx-lm's
//! behaviour); with it, speculation drafted by the MTP layers gives exactly plain greedy
//! decoding's tokens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_core::random;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::speculative::{speculative_generate_step, Drafter, SpecStats};
use mlx_models::load::{load_model_dir, load_model_dir_mtp, load_weights, LoadOptions};
use mlx_models::LanguageModel;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `src` (a tiny fixture) plus `num_nextn_predict_layers` = 1 and seeded MTP tensors, in `dst`.
pub fn with_mtp(src: &Path, dst: &Path, seed: u64) {
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let n = config["num_hidden_layers"].as_i64().unwrap();
    let dim = config["hidden_size"].as_i64().unwrap() as i32;
    config["num_nextn_predict_layers"] = Value::from(1);
    let mut w: BTreeMap<String, Array> = load_weights(src).unwrap();
    let key = random::key(seed).unwrap();
    // `[small noise | identity]`: the head sees mostly the target's hidden state, so its drafts
    // are sometimes right (partial acceptance exercises the rollback of its cache).
    let noise = random::normal(
        &[dim, 2 * dim],
        Dtype::Float32,
        None,
        Some(0.01),
        Some(&key),
        None,
    )
    .unwrap();
    let eye = ops::concatenate(
        &[
            &ops::zeros(&[dim, dim], Dtype::Float32, None).unwrap(),
            &ops::eye(dim, dim, 0, Dtype::Float32, None).unwrap(),
        ],
        1,
        None,
    )
    .unwrap();
    let proj = (&noise + &eye).unwrap();
    let ones = ops::ones(&[dim], Dtype::Float32, None).unwrap();
    let last = format!("model.layers.{}.", n - 1);
    let (block, extra): (String, Vec<(&str, &Array)>) = match config["model_type"].as_str() {
        Some("qwen3_next") => (
            // Qwen3-Next: `mtp.layers.0` is a full-attention layer (the fixture's last one).
            "mtp.layers.0.".into(),
            vec![
                ("mtp.fc.weight", &proj),
                ("mtp.pre_fc_norm_embedding.weight", &ones),
                ("mtp.pre_fc_norm_hidden.weight", &ones),
                ("mtp.norm.weight", &ones),
            ],
        ),
        _ => (
            format!("model.layers.{n}."),
            vec![
                ("enorm.weight", &ones),
                ("hnorm.weight", &ones),
                ("eh_proj.weight", &proj),
                ("shared_head.norm.weight", &ones),
            ],
        ),
    };
    let copies: Vec<(String, Array)> = w
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(&last)
                .map(|rest| (format!("{block}{rest}"), v.clone()))
        })
        .collect();
    assert!(!copies.is_empty());
    w.extend(copies);
    for (k, v) in extra {
        let name = if k.starts_with("mtp.") {
            k.to_string()
        } else {
            format!("{block}{k}")
        };
        w.insert(name, v.clone());
    }
    std::fs::create_dir_all(dst).unwrap();
    std::fs::write(
        dst.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    mlx_core::io::save_safetensors(
        dst.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &Default::default(),
    )
    .unwrap();
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

fn check(fixture: &str) {
    let src = repo().join("mlx-models/tests/models").join(fixture);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mtp_{}", fixture.replace('/', "_")));
    with_mtp(&src, &dir, 7);

    // Without --mtp: today's strict loader, which names the MTP tensors it did not consume.
    let e = match load_model_dir(&dir, &LoadOptions::default()) {
        Ok(_) => panic!("{fixture}: MTP tensors loaded without --mtp"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("eh_proj") || e.contains("mtp.fc"),
        "{fixture}: {e}"
    );
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
        assert_eq!(st.rounds + st.accepted, GEN, "{fixture}: {st:?}");
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
