//! Greedy speculation on the CPU decoder (`mlx_engine::cpu_spec`): drafts verified in one
//! batched pass, the cache truncated past the accepted ones. On the llama-family fixtures the
//! output equals plain greedy decoding on the same decoder, for prompt lookup and for forced
//! accept patterns (every draft right, every draft wrong, mixed).

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::cpu_spec::{
    greedy, prompt_lookup_by_context, prompt_lookup_drafts, prompt_lookup_longest,
    speculative_greedy, speculative_greedy_with, DraftLength, LookupDrafter,
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

/// A verification pass with its rows' elementwise stages split over the workers
/// (`set_rows_split(true)`: the residual adds, the RMSNorms, SiLU x up and the final norm run
/// a row per worker claim) gives every row the bits of its one-token step, and so does the
/// pass with them on the caller (`false`), on the fixtures the CPU decoder runs (f32, f16 and
/// bf16 weights, 4- and 8-bit, biases, llama3 / yarn / linear RoPE, sliding windows the
/// context passes, Gemma's sandwich norms and GELU gate, q/k norms), 2 to 12 rows, at two and
/// three workers (tier: bit-identical).
#[test]
fn split_verify_rows_are_the_bits_of_one_token_steps() {
    let mut ran = Vec::new();
    for name in [
        "dense_f32",
        "dense_f16",
        "dense_bf16_mha",
        "dense_bf16_untied",
        "q4_g32",
        "q4_g64_f16",
        "q4_g64_untied",
        "q8_g64",
        "q8_g32_bf16",
        "linear_rope_sliding",
        "mistral_bias_llama3rope",
        "yarn_rope",
        "dense/gemma3_text",
        "dense/gemma3_text_q4",
        "dense/gemma2",
        "dense/qwen3",
        "dense/olmo2",
        "dense/smollm3_sliding",
    ] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../mlx-models/tests/models")
            .join(name);
        if !dir.join("config.json").exists() {
            continue;
        }
        let model = load_model_dir(&dir, &LoadOptions::default()).unwrap().0;
        if mlx_engine::cpu_decode::unsupported(model.as_ref()).is_some() {
            continue;
        }
        for threads in [2, 3] {
            let mut dec = CpuDecoder::new(model.as_ref(), threads, 64).unwrap();
            let vocab = dec.vocab();
            let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % vocab as u32).collect();
            let mut alone = Vec::new();
            dec.feed(PROMPT).unwrap();
            for &t in &tokens {
                alone.extend_from_slice(dec.feed(&[t]).unwrap());
            }
            for split in [true, false] {
                dec.set_rows_split(split);
                for n in 2..=tokens.len() {
                    dec.reset();
                    dec.feed(PROMPT).unwrap();
                    let got = dec.verify(&tokens[..n]).unwrap();
                    assert_eq!(got.len(), n * vocab);
                    for (r, (g, a)) in got
                        .chunks_exact(vocab)
                        .zip(alone.chunks_exact(vocab))
                        .enumerate()
                    {
                        let same = g.iter().zip(a).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(
                            same,
                            "{name}, {threads} workers, split {split}: row {r} of a pass of \
                             {n} differs from its one-token step"
                        );
                    }
                }
            }
        }
        ran.push(name);
    }
    eprintln!("split verify rows: {ran:?}");
    assert!(ran.len() >= 10, "only {ran:?} ran");
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

/// The prompt-lookup policy every entry point drafts with (`prompt_lookup_drafts`): the
/// longest-context occurrence, drafts up to its matched length, at most `k` (4 by default).
#[test]
fn the_lookup_policy_drafts_no_further_than_its_match() {
    // "1 2 3 4" matches four tokens back (then 7 against 8): up to four drafts.
    let h = [7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4, 9];
    let h = &h[..12];
    assert_eq!(prompt_lookup_drafts(h, 1, 8), vec![5, 6, 8, 1]);
    assert_eq!(prompt_lookup_drafts(h, 1, 3), vec![5, 6, 8]);
    assert_eq!(prompt_lookup_drafts(h, 4, 8), vec![5, 6, 8, 1]);
    assert!(prompt_lookup_drafts(h, 5, 8).is_empty());
    // A one-token match drafts one token; none past the end of the history.
    assert_eq!(prompt_lookup_drafts(&[4, 5, 6, 4], 1, 8), vec![5]);
    assert_eq!(prompt_lookup_drafts(&[4, 4], 1, 8), vec![4]);
    assert!(prompt_lookup_drafts(&[1, 2, 3], 1, 4).is_empty());
    assert!(prompt_lookup_drafts(h, 1, 0).is_empty());
    assert!(prompt_lookup_drafts(h, 0, 4).is_empty());
    assert_eq!(mlx_engine::cpu_spec::LOOKUP_DRAFTS, 4);
}

/// The drafter (`LookupDrafter`): the rule of `prompt_lookup_drafts` until a copy diverges;
/// then a later draft copied across the position where the output left the copy stops before
/// it. Source "1 3 4 5 6 7"; the output copies "3 4 5" and writes 9 where the source has 6;
/// later it writes "1 3 4 5", whose longest match is the source again.
#[test]
fn the_lookup_drafter_stops_where_a_copy_diverged() {
    let prompt = [1, 3, 4, 5, 6, 7, 0];
    let mut h: Vec<u32> = prompt.to_vec();
    h.extend([2, 3, 4, 5]);
    let mut d = LookupDrafter::new(1);
    // No divergence seen yet: the rule's drafts (a match of three: up to three).
    assert_eq!(d.propose(&h, 4), prompt_lookup_drafts(&h, 1, 4));
    assert_eq!(d.propose(&h, 4), vec![6, 7, 0]);
    // The pass kept none of them: the output wrote 9 where the copy (position 4) had 6.
    h.push(9);
    assert!(d.propose(&h, 4).is_empty(), "nothing before 9 to copy");
    assert_eq!(d.diverged(), vec![4]);
    h.extend([8, 1, 3, 4, 5]);
    // "1 3 4 5" matches the source four tokens back: the rule drafts 6 7 0 2 from position
    // 4, the drafter stops before position 4.
    assert_eq!(prompt_lookup_drafts(&h, 1, 4), vec![6, 7, 0, 2]);
    assert!(d.propose(&h, 4).is_empty());
    // A copy that the output followed teaches nothing.
    let mut g: Vec<u32> = vec![6, 7, 0, 2, 9, 6, 7];
    let mut e = LookupDrafter::new(1);
    assert_eq!(e.propose(&g, 4), vec![0, 2]);
    g.extend([0, 2, 9]);
    assert_eq!(e.propose(&g, 4), vec![6, 7, 0, 2]);
    assert!(e.diverged().is_empty());
    // A divergence inside a draft marks the first position not followed only.
    let mut f = LookupDrafter::new(1);
    let mut x: Vec<u32> = vec![4, 1, 2, 3, 5, 4, 1];
    assert_eq!(f.propose(&x, 4), vec![2, 3]);
    x.extend([2, 3]);
    assert_eq!(f.propose(&x, 4), vec![5, 4, 1, 2]);
    x.extend([5, 8]);
    f.propose(&x, 4);
    assert_eq!(f.diverged(), vec![5]);
    // A shorter history is another generation: the memory starts afresh.
    assert_eq!(d.propose(&h[..11], 4), prompt_lookup_drafts(&h[..11], 1, 4));
    assert!(d.diverged().is_empty());
    // k 0 and n-gram 0 draft nothing.
    assert!(LookupDrafter::new(1).propose(&h, 0).is_empty());
    assert!(LookupDrafter::new(0).propose(&h, 4).is_empty());
}

/// Greedy identity with the drafter: on the fixtures, speculation drafting with
/// `LookupDrafter` (a prompt whose spans the output copies and leaves) gives plain greedy
/// decoding's tokens for 1-6 drafts a pass.
#[test]
fn the_lookup_drafter_keeps_greedy_output() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models/q4_g32");
    let opts = LoadOptions {
        dtype: Some(Dtype::Float32),
    };
    let model = load_model_dir(&dir, &opts).unwrap().0;
    let mut dec = CpuDecoder::new(model.as_ref(), 2, 96).unwrap();
    let reference = greedy(&mut dec, PROMPT, GEN, &mut |_| false).unwrap();
    for k in 1..=6 {
        let mut d = LookupDrafter::new(1);
        let mut lookup = |h: &[u32], n: usize| d.propose(h, n);
        let (got, st) =
            speculative_greedy(&mut dec, PROMPT, GEN, k, &mut lookup, &mut |_| false).unwrap();
        assert_eq!(got, reference, "k {k}");
        assert!(st.accepted <= st.drafted);
    }
}

/// A small deterministic generator (xorshift64*), for the property test below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Property: over random texts with repeated spans (random tokens, spans of them copied again,
/// as edits and summaries repeat their source), what `mlx generate --prompt-lookup-ngram`
/// streams (`stream_generate_cpu_speculative`: the library's lookup policy, its text stream)
/// is plain greedy decoding's stream on the CPU decoder: the same tokens, log-probability
/// bits, text and finish reason, for n-grams 1-3 and 1-8 drafts.
#[test]
fn prompt_lookup_streams_plain_greedy_over_random_texts() {
    use mlx_engine::generate::{CpuDecode, GenerateOptions};
    use mlx_engine::stream::{stream_generate, stream_generate_cpu_speculative, StreamOptions};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat");
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let tok = mlx_engine::Tokenizer::from_dir(&dir).unwrap();
    let vocab = model.vocab_size() as usize;
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut drafted = 0;
    for case in 0..12 {
        let mut prompt: Vec<u32> = (0..4 + rng.below(12))
            .map(|_| rng.below(vocab) as u32)
            .collect();
        for _ in 0..1 + rng.below(3) {
            let from = rng.below(prompt.len());
            let len = 1 + rng.below(prompt.len() - from);
            let span = prompt[from..from + len].to_vec();
            prompt.extend(span);
            prompt.push(rng.below(vocab) as u32);
        }
        let max_tokens = 8 + rng.below(32);
        let (ngram, k) = (1 + case % 3, 1 + rng.below(8));
        let opts = StreamOptions {
            generate: GenerateOptions {
                max_tokens: Some(max_tokens),
                cpu_decode: Some(CpuDecode { threads: 2 }),
                ..Default::default()
            },
            ..Default::default()
        };
        let plain = collect(
            &mut stream_generate(model.as_ref(), &tok, &prompt, None, opts.clone()).unwrap(),
        );
        let mut s =
            stream_generate_cpu_speculative(model.as_ref(), &tok, &prompt, ngram, k, opts).unwrap();
        let spec = collect(&mut s);
        drafted += s.spec_stats().unwrap().drafted;
        assert_eq!(
            spec, plain,
            "case {case}: prompt {prompt:?} ngram {ngram} k {k}"
        );
        // What a conversation continues: the cache holds the prompt and every token streamed
        // (the last one fed though its pass never ran), nothing verified past them.
        let (dec, held) = s.into_cpu_speculation().unwrap();
        let mut want = prompt.clone();
        want.extend(spec.iter().filter_map(|r| r.0));
        assert_eq!(held, want, "case {case}");
        assert_eq!(dec.position(), want.len(), "case {case}");
    }
    assert!(drafted > 0, "no case drafted");
}

type Streamed = (
    Option<u32>,
    Option<u32>,
    String,
    Option<mlx_engine::stream::FinishReason>,
);

fn collect(s: &mut mlx_engine::stream::TextStream<'_>) -> Vec<Streamed> {
    s.map(|r| {
        let r = r.unwrap();
        (
            r.token,
            r.logprob.map(f32::to_bits),
            r.text,
            r.finish_reason,
        )
    })
    .collect()
}
