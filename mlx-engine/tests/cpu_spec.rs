//! Greedy speculation on the CPU decoder (`mlx_engine::cpu_spec`): drafts verified in one
//! batched pass, the cache truncated past the accepted ones. On the llama-family fixtures the
//! output equals plain greedy decoding on the same decoder, for prompt lookup and for forced
//! accept patterns (every draft right, every draft wrong, mixed).

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_engine::cpu_decode::CpuDecoder;
use mlx_engine::cpu_spec::{greedy, speculative_greedy};
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
