//! Greedy speculation on the CPU decoder (`mlx_engine::cpu_spec`): drafts verified in one
//! batched pass, the cache truncated past the accepted ones. On the llama-family fixtures the
//! output equals plain greedy decoding on the same decoder, for prompt lookup and for forced
//! accept patterns (every draft right, every draft wrong, mixed).

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::cpu_spec::{
    greedy, prompt_lookup_by_context, prompt_lookup_longest, speculative_greedy,
    speculative_greedy_with, DraftLength,
};
use mlx_engine::speculative::prompt_lookup;
use mlx_models::load::{load_model_dir, LoadOptions};

const PROMPT: &[u32] = &[3, 17, 59, 5, 42, 7, 60, 64, 11, 90, 3, 17, 59, 5];
const GEN: usize = 40;

#[test]
fn cpu_speculation_equals_plain_greedy() {
    for name in ["dense_f32", "q4_g32"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../mlx-models/tests/models")
            .join(name);
        let opts = LoadOptions {
            dtype: Some(Dtype::Float32),
        };
        let model = load_model_dir(&dir, &opts).unwrap().0;
        let mut dec = CpuDecoder::new(model.as_ref(), 2, 64).unwrap();
        let reference = greedy(&mut dec, PROMPT, GEN, &mut |_| false).unwrap();
        assert_eq!(reference.len(), GEN);
        let vocab = model.vocab_size() as u32;
        for k in [1, 3, 6] {
            let mut lookup = |h: &[u32], n: usize| prompt_lookup(h, 1, n);
            let (got, st) =
                speculative_greedy(&mut dec, PROMPT, GEN, k, &mut lookup, &mut |_| false).unwrap();
            assert_eq!(got, reference, "{name} lookup k {k}");
            assert!(st.accepted <= st.drafted);
            for pattern in [&[true][..], &[false], &[true, true, false, true, false]] {
                let mut draw = 0;
                let mut forced = |h: &[u32], n: usize| -> Vec<u32> {
                    let at = h.len() - PROMPT.len();
                    (0..n)
                        .map_while(|j| reference.get(at + j))
                        .map(|&t| {
                            let ok = pattern[draw % pattern.len()];
                            draw += 1;
                            if ok {
                                t
                            } else {
                                (t + 1) % vocab
                            }
                        })
                        .collect()
                };
                let (got, st) =
                    speculative_greedy(&mut dec, PROMPT, GEN, k, &mut forced, &mut |_| false)
                        .unwrap();
                assert_eq!(got, reference, "{name} k {k} pattern {pattern:?}");
                if pattern == [true] {
                    // Every draft right: one pass per k + 1 tokens.
                    assert_eq!(st.accepted, st.drafted, "{st:?}");
                    assert!(st.rounds <= GEN.div_ceil(k + 1), "{st:?}");
                }
            }
        }
        // A stop condition ends both the same way.
        let stop_at = reference[GEN / 2];
        let a = greedy(&mut dec, PROMPT, GEN, &mut |t| t == stop_at).unwrap();
        let mut lookup = |h: &[u32], n: usize| prompt_lookup(h, 1, n);
        let (b, _) =
            speculative_greedy(&mut dec, PROMPT, GEN, 4, &mut lookup, &mut |t| t == stop_at)
                .unwrap();
        assert_eq!(a, b);
        assert!(speculative_greedy(&mut dec, &[], GEN, 4, &mut lookup, &mut |_| false).is_err());
    }
}

/// Every row of a verification pass (`CpuDecoder::verify`, 1 to 9 rows: past the four-row
/// tiles of the integer kernels) has the bits of its logits fed one token at a time, and the
/// cache continues the same afterwards (tier: bit-identical).
#[test]
fn verify_rows_are_the_bits_of_one_token_steps() {
    for name in ["dense_f32", "q4_g32", "q8_g64"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../mlx-models/tests/models")
            .join(name);
        if !dir.exists() {
            continue;
        }
        let opts = LoadOptions {
            dtype: Some(Dtype::Float32),
        };
        let model = load_model_dir(&dir, &opts).unwrap().0;
        let mut dec = CpuDecoder::new(model.as_ref(), 2, 16).unwrap();
        let vocab = dec.vocab();
        let tokens: Vec<u32> = (0..10).map(|i| (i * 37 + 5) % vocab as u32).collect();
        let mut alone = Vec::new();
        dec.feed(PROMPT).unwrap();
        for &t in &tokens {
            alone.extend_from_slice(dec.feed(&[t]).unwrap());
        }
        for n in 1..=9 {
            dec.reset();
            dec.feed(PROMPT).unwrap();
            let got = dec.verify(&tokens[..n]).unwrap().to_vec();
            assert_eq!(got.len(), n * vocab);
            let same = got
                .iter()
                .zip(&alone[..n * vocab])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{name}: a pass of {n} rows differs from one-token steps"
            );
            // Rolled back to fewer rows, the cache continues as one-token feeding does.
            let keep = n / 2;
            dec.truncate(PROMPT.len() + keep);
            let next = dec.feed(&[tokens[keep]]).unwrap();
            let want = &alone[keep * vocab..(keep + 1) * vocab];
            assert!(next
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        assert!(dec.verify(&[]).is_err());
        assert!(dec.verify(&[vocab as u32]).is_err());
    }
}

/// The longest-context lookup drafts from the occurrence whose preceding tokens match most,
/// not the most recent one; ties go to the most recent; nothing without a match.
#[test]
fn longest_context_lookup_prefers_the_matching_context() {
    // "7 8 9" occurs after "1 2" (start) and after "5 6" (later); the history ends "1 2 7 8 9".
    let h = [1, 2, 7, 8, 9, 30, 31, 5, 6, 7, 8, 9, 40, 41, 1, 2, 7, 8, 9];
    assert_eq!(prompt_lookup_longest(&h, 3, 2), vec![30, 31]);
    assert_eq!(prompt_lookup(&h, 3, 2), vec![40, 41]);
    // A tie (one token of context each): the most recent.
    let h = [3, 7, 8, 50, 3, 7, 8, 60, 3, 7, 8];
    assert_eq!(prompt_lookup_longest(&h, 2, 1), vec![60]);
    // Drafts stop at the end of the history; no match or no room: none.
    assert_eq!(prompt_lookup_longest(&[4, 5, 4], 1, 8), vec![5, 4]);
    assert!(prompt_lookup_longest(&[1, 2, 3], 1, 4).is_empty());
    assert!(prompt_lookup_longest(&[1, 1], 2, 4).is_empty());
    assert!(prompt_lookup_longest(&[1, 1, 1], 0, 4).is_empty());
}

/// Drafts capped by the matched context: as many tokens as the match is long, at most `k`,
/// from the same occurrence `prompt_lookup_longest` picks.
#[test]
fn context_capped_lookup_drafts_no_further_than_its_match() {
    // "1 2 3 4" matches four tokens back (then 7 against 8).
    let h = [7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4];
    assert_eq!(prompt_lookup_longest(&h, 1, 8), vec![5, 6, 8, 1, 2, 3, 4]);
    assert_eq!(prompt_lookup_by_context(&h, 1, 8), vec![5, 6, 8, 1]);
    assert_eq!(prompt_lookup_by_context(&h, 3, 2), vec![5, 6]);
    // A one-token match drafts one token.
    assert_eq!(prompt_lookup_by_context(&[4, 5, 4], 1, 8), vec![5]);
    assert!(prompt_lookup_by_context(&[1, 2, 3], 1, 4).is_empty());
    assert!(prompt_lookup_by_context(&h, 1, 0).is_empty());
}

/// The adaptive draft length: more after a round fully accepted, one past the accepted after
/// a miss, within [1, max]; fixed when not adaptive; and greedy output unchanged by it.
#[test]
fn adaptive_draft_length_keeps_greedy_output() {
    let mut l = DraftLength::new(8, true);
    assert_eq!(l.want(100), 8);
    assert_eq!(l.want(3), 3);
    l.update(8, 2);
    assert_eq!(l.want(100), 3);
    l.update(3, 3);
    assert_eq!(l.want(100), 5);
    l.update(5, 0);
    assert_eq!(l.want(100), 1);
    l.update(0, 0);
    assert_eq!(l.want(100), 1);
    l.update(1, 1);
    assert_eq!(l.want(100), 3);
    for _ in 0..5 {
        l.update(8, 8);
    }
    assert_eq!(l.want(100), 8);
    let mut fixed = DraftLength::new(4, false);
    fixed.update(4, 0);
    assert_eq!(fixed.want(100), 4);

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models/q4_g32");
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let model = load_model_dir(&dir, &opts).unwrap().0;
    let mut dec = CpuDecoder::new(model.as_ref(), 2, 64).unwrap();
    let reference = greedy(&mut dec, PROMPT, GEN, &mut |_| false).unwrap();
    let mut lookup = |h: &[u32], n: usize| prompt_lookup_longest(h, 1, n);
    let mut len = DraftLength::new(6, true);
    let (got, st) =
        speculative_greedy_with(&mut dec, PROMPT, GEN, &mut len, &mut lookup, &mut |_| false)
            .unwrap();
    assert_eq!(got, reference);
    assert!(st.drafted > 0, "{st:?}");
}

/// A draft model on its own CPU decoder (`CpuDraft`, what `--draft-model` with `--decoder cpu`
/// runs): the target's greedy output is plain greedy decoding's, for a 1-layer draft cut from
/// the target (drafts partly accepted), the target itself (all accepted) and a draft of other
/// weights, for every draft length; a draft with a larger vocabulary never drafts ids the
/// target cannot take.
#[test]
fn draft_model_speculation_equals_plain_greedy() {
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models");
    let load = |dir: PathBuf| {
        let opts = LoadOptions {
            dtype: Some(Dtype::Float32),
        };
        load_model_dir(&dir, &opts).unwrap().0
    };
    let draft_dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-cli/tests/models/dense_f32_draft");
    let drafts = [
        load(draft_dir),
        load(models.join("dense_f32")),
        load(models.join("q4_g32")),
    ];
    for target_name in ["dense_f32", "q4_g32"] {
        let target = load(models.join(target_name));
        let mut dec = CpuDecoder::new(target.as_ref(), 2, 64).unwrap();
        let reference = greedy(&mut dec, PROMPT, GEN, &mut |_| false).unwrap();
        for (di, draft) in drafts.iter().enumerate() {
            for k in [1, 3, 5] {
                let ddec = CpuDecoder::new(draft.as_ref(), 2, 64).unwrap();
                // di 0 also drafts under a smaller "target vocabulary": its ids past it stop
                // the drafts.
                let vocab = if di == 0 && k == 3 { 40 } else { dec.vocab() };
                let mut d = mlx_engine::cpu_spec::CpuDraft::new(ddec, vocab);
                let mut seen_past = false;
                let mut propose = |h: &[u32], n: usize| {
                    let p = d.propose(h, n);
                    seen_past |= p.iter().any(|&t| t as usize >= vocab);
                    p
                };
                let (got, st) =
                    speculative_greedy(&mut dec, PROMPT, GEN, k, &mut propose, &mut |_| false)
                        .unwrap();
                assert!(!seen_past, "draft {di} k {k}: an id past the vocabulary");
                assert_eq!(got, reference, "target {target_name} draft {di} k {k}");
                assert!(d.error().is_none(), "{:?}", d.error());
                if di == 1 && target_name == "dense_f32" {
                    // The target as its own draft: every draft accepted.
                    assert_eq!(st.accepted, st.drafted, "k {k}: {st:?}");
                    assert!(st.rounds <= GEN.div_ceil(k + 1), "k {k}: {st:?}");
                } else if di == 0 && vocab == dec.vocab() {
                    assert!(st.drafted > 0, "{st:?}");
                }
            }
        }
    }
}
