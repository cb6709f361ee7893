//! Sampling exactness of speculative decoding, per drafter (prompt lookup, draft model, block
//! drafter, MTP): with a temperature, the tokens emitted are distributed as the target's own
//! samples. Many seeded generations of two tokens; the second token (the first position where
//! every drafter's drafts can be accepted: MTP and block drafters see no hidden state before
//! the first verification) is compared with the target's exact distribution there,
//! `sum_a p(a) p(. | prompt, a)`, by a chi-square test (bins of expected count under 5 merged;
//! critical value at p = 0.001, Wilson-Hilferty). Seeded, so the outcome is fixed. The
//! statistic's power: samples at another temperature fail it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::sample::{Sampler, SamplerSettings};
use mlx_engine::speculative::{speculative_generate_step, BlockDrafter, Drafter};
use mlx_models::load::{load_model_dir, load_model_dir_mtp, LoadOptions};
use mlx_models::LanguageModel;

#[path = "support/mtp_fixture.rs"]
mod mtp_fixture;

const PROMPT: &[i32] = &[3, 17, 59, 5, 42, 7, 60, 64, 11, 90, 17, 59, 5, 42, 7];
const TEMP: f64 = 0.6;
const SAMPLES: usize = 600;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load(dir: &str) -> Box<dyn LanguageModel> {
    load_model_dir(&repo().join(dir), &LoadOptions::default())
        .unwrap()
        .0
}

fn opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(2),
        sampler: Sampler::new(SamplerSettings {
            temp: TEMP,
            ..SamplerSettings::default()
        }),
        ..GenerateOptions::default()
    }
}

/// The target's sampling distribution (`softmax(logprobs / temp)`) after `ids`.
fn target_probs(m: &dyn LanguageModel, ids: &[i32]) -> Vec<f64> {
    let x = Array::from_slice(ids, &[1, ids.len() as i32]).unwrap();
    let logits = m.forward(&x, None).unwrap();
    let n = logits.dim(1).unwrap();
    let row = ops::slice_axis(&logits, 1, n - 1, n, None).unwrap();
    let l: Vec<f64> = row
        .astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(|v| f64::from(v) / TEMP)
        .collect();
    let max = l.iter().copied().fold(f64::MIN, f64::max);
    let z: f64 = l.iter().map(|v| (v - max).exp()).sum();
    l.iter().map(|v| (v - max).exp() / z).collect()
}

/// Chi-square statistic and degrees of freedom of `counts` against `probs`, bins of expected
/// count under 5 merged into one.
fn chi_square(counts: &BTreeMap<u32, usize>, probs: &[f64], n: usize) -> (f64, usize) {
    let (mut stat, mut bins) = (0.0, 0usize);
    let (mut rest_obs, mut rest_exp) = (0.0, 0.0);
    for (t, &p) in probs.iter().enumerate() {
        let e = p * n as f64;
        let o = *counts.get(&(t as u32)).unwrap_or(&0) as f64;
        if e < 5.0 {
            rest_obs += o;
            rest_exp += e;
        } else {
            stat += (o - e) * (o - e) / e;
            bins += 1;
        }
    }
    if rest_exp > 0.0 {
        stat += (rest_obs - rest_exp) * (rest_obs - rest_exp) / rest_exp.max(1e-9);
        bins += 1;
    }
    (stat, bins.saturating_sub(1).max(1))
}

/// The chi-square critical value at p = 0.001 (Wilson-Hilferty).
fn critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// The target's exact distribution of the second token: `sum_a p(a) p(. | prompt, a)`, the
/// second factor from one batched forward over every first token `a`.
fn second_token_probs(m: &dyn LanguageModel) -> Vec<f64> {
    let p0 = target_probs(m, PROMPT);
    let v = p0.len();
    let mut ids = Vec::with_capacity(v * (PROMPT.len() + 1));
    for a in 0..v {
        ids.extend_from_slice(PROMPT);
        ids.push(a as i32);
    }
    let x = Array::from_slice(&ids, &[v as i32, PROMPT.len() as i32 + 1]).unwrap();
    let logits = m.forward(&x, None).unwrap();
    let n = logits.dim(1).unwrap();
    let rows: Vec<f32> = ops::slice_axis(&logits, 1, n - 1, n, None)
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut p1 = vec![0f64; v];
    for (a, row) in rows.chunks(v).enumerate() {
        let l: Vec<f64> = row.iter().map(|&x| f64::from(x) / TEMP).collect();
        let max = l.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = l.iter().map(|x| (x - max).exp()).sum();
        for (t, x) in l.iter().enumerate() {
            p1[t] += p0[a] * (x - max).exp() / z;
        }
    }
    p1
}

/// Seeded two-token generations with `drafter`; the second token's counts against the
/// target's exact distribution.
fn run<'m>(name: &str, target: &'m dyn LanguageModel, mut drafter: impl FnMut() -> Drafter<'m>) {
    let p1 = second_token_probs(target);
    mlx_core::random::seed(1234).unwrap();
    let mut counts = BTreeMap::new();
    let (mut accepted, mut drafted) = (0, 0);
    for _ in 0..SAMPLES {
        let mut g = speculative_generate_step(PROMPT, target, None, drafter(), 3, opts()).unwrap();
        let toks: Vec<u32> = g.by_ref().map(|s| s.unwrap().token).collect();
        drafted += g.stats().drafted;
        accepted += g.stats().accepted;
        assert_eq!(toks.len(), 2);
        *counts.entry(toks[1]).or_insert(0) += 1;
    }
    let (stat, df) = chi_square(&counts, &p1, SAMPLES);
    eprintln!(
        "{name}: {SAMPLES} samples, {accepted} of {drafted} drafts accepted, chi2 {stat:.1} on \
         {df} df (critical {:.1} at p = 0.001)",
        critical(df)
    );
    assert!(drafted > 0 && accepted > 0, "{name}: {accepted}/{drafted}");
    assert!(stat < critical(df), "{name}: chi2 {stat:.1} on {df} df");
}

/// One test: the global random key is process-wide.
#[test]
fn every_drafter_samples_as_the_target() {
    let target = load("mlx-models/tests/models/dense_f32");
    run("prompt lookup", target.as_ref(), || Drafter::PromptLookup {
        ngram: 1,
    });
    let draft = load("mlx-cli/tests/models/dense_f32_draft");
    run("draft model", target.as_ref(), || Drafter::Model {
        model: draft.as_ref(),
        cache: None,
    });

    // A block drafter distilled on the target's hidden states over the prompt.
    let x = Array::from_slice(PROMPT, &[1, PROMPT.len() as i32]).unwrap();
    let h = target.forward_hidden(&x).unwrap().unwrap();
    let d = h.dim(2).unwrap();
    let states = h.reshape(&[PROMPT.len() as i32, d]).unwrap();
    let proj = BlockDrafter::distill(&states, 3, 1e-3).unwrap();
    run("block drafter", target.as_ref(), || {
        Drafter::Hidden(Box::new(
            BlockDrafter::new(target.as_ref(), proj.clone()).unwrap(),
        ))
    });

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("spec_sampling_mtp");
    mtp_fixture::with_mtp(&repo().join("mlx-models/tests/models/qwen3_next"), &dir, 7);
    let (mtp_model, _, _) = load_model_dir_mtp(&dir, &LoadOptions::default(), true).unwrap();
    run("mtp", mtp_model.as_ref(), || Drafter::Mtp);

    the_test_rejects_a_wrong_distribution();
}

fn the_test_rejects_a_wrong_distribution() {
    // Power check: samples of another distribution (the target's at temperature 1 instead of
    // 0.6, drawn with the same sampler path) fail the same statistic.
    let target = load("mlx-models/tests/models/dense_f32");
    let p = target_probs(target.as_ref(), PROMPT);
    let x = Array::from_slice(PROMPT, &[1, PROMPT.len() as i32]).unwrap();
    let logits = target.forward(&x, None).unwrap();
    let n = logits.dim(1).unwrap();
    let row = ops::slice_axis(&logits, 1, n - 1, n, None).unwrap();
    let row = ops::squeeze(&row, &[1], None).unwrap();
    let lse = ops::logsumexp(&row, &[-1], true, None).unwrap();
    let lp = ops::subtract(&row, &lse, None).unwrap();
    mlx_core::random::seed(99).unwrap();
    let s = Sampler::new(SamplerSettings {
        temp: 1.0,
        ..SamplerSettings::default()
    });
    let mut counts = BTreeMap::new();
    let n = 600;
    for _ in 0..n {
        let t = s.sample(&lp).unwrap().astype(Dtype::Uint32).unwrap();
        *counts.entry(t.to_vec::<u32>().unwrap()[0]).or_insert(0) += 1;
    }
    let (stat, df) = chi_square(&counts, &p, n);
    assert!(stat > critical(df), "chi2 {stat:.1} on {df} df");
}
