//! Chunked prefill in `generate_step` evaluates every cache's state after each chunk (mlx-lm's
//! `mx.eval([c.state for c in prompt_cache])`), recurrent `ArraysCache` state included, so the
//! lazy graph does not grow with the prompt. On the recurrent hybrids a long prompt prefilled 3
//! tokens at a time gives the same greedy ids and log-probabilities, bit for bit, as one chunk.

use std::path::PathBuf;

use mlx_core::testing::assert_bit_equal;
use mlx_engine::generate::{generate_step, GenerateOptions, Step};
use mlx_models::load::{load_model_dir, LoadOptions};

fn run(model: &dyn mlx_models::LanguageModel, prompt: &[i32], step: usize) -> Vec<Step> {
    let opts = GenerateOptions {
        max_tokens: Some(4),
        prefill_step_size: step,
        ..GenerateOptions::default()
    };
    generate_step(prompt, model, None, opts)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn small_prefill_steps_equal_one_chunk_on_recurrent_hybrids() {
    let prompt: Vec<i32> = (0..61).map(|i| (7 * i + 3) % 96).collect();
    for name in ["qwen3_next", "qwen3_5", "lfm2"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../mlx-models/tests/models")
            .join(name);
        let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
        let whole = run(model.as_ref(), &prompt, 2048);
        let chunked = run(model.as_ref(), &prompt, 3);
        assert_eq!(whole.len(), 4);
        for (i, (a, b)) in whole.iter().zip(&chunked).enumerate() {
            assert_eq!(a.token, b.token, "{name}: token {i}");
            assert_bit_equal(&a.logprobs, &b.logprobs)
                .unwrap_or_else(|e| panic!("{name}: step {i}: {e}"));
        }
    }
}
