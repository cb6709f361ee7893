//! `stream_generate`'s last response as mlx-lm's: it carries the last token and the
//! `finish_reason` (`length` on the max-th token; on EOS the EOS token with its logprob,
//! counted in `generation_tokens`), and `max_tokens == 0` is an error. Uses the tiny 4-bit
//! model and word-level tokenizer of mlx-cli's parity tests (mlx-lm's greedy run on this prompt
//! ends on EOS after two words: mlx-cli/tests/goldens/cli.json, `greedy_no_seed`).

use std::path::PathBuf;

use mlx_engine::generate::GenerateOptions;
use mlx_engine::stream::{stream_generate, FinishReason, GenerationResponse, StreamOptions};
use mlx_engine::{ChatTemplateOptions, Tokenizer};
use mlx_models::load::{load_model_dir, LoadOptions};

fn opts(max: Option<usize>) -> StreamOptions {
    StreamOptions {
        generate: GenerateOptions {
            max_tokens: max,
            ..GenerateOptions::default()
        },
        ..StreamOptions::default()
    }
}

#[test]
fn the_last_response_carries_the_last_token_and_the_reason() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-cli/tests/models/q4_g32");
    let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    // As `mlx_lm.generate` builds it: the chat template with the generation prompt.
    let prompt = tok
        .apply_chat_template_ids(
            &[serde_json::json!({"role": "user", "content": "hello , what is the big red sun ?"})],
            &ChatTemplateOptions::generation(true),
        )
        .unwrap();
    let run = |max| -> Vec<GenerationResponse> {
        stream_generate(model.as_ref(), &tok, &prompt, None, opts(max))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    // Two words, then EOS (well before the limit).
    let rs = run(Some(50));
    assert_eq!(rs.len(), 3);
    let last = rs.last().unwrap();
    let eos = tok.eos_token_id().unwrap();
    assert_eq!(last.token, Some(eos));
    assert!(last.logprob.is_some_and(f32::is_finite));
    assert_eq!(last.generation_tokens, 3);
    assert_eq!(last.finish_reason, Some(FinishReason::Stop));
    assert!(rs[..2].iter().all(|r| r.finish_reason.is_none()));
    let text: String = rs.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(text, "leaf .");
    // The max-th token ends the stream with `length`, in the same response.
    let rs = run(Some(2));
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[1].finish_reason, Some(FinishReason::Length));
    assert_eq!(rs[1].generation_tokens, 2);
    assert_eq!(rs[1].token, run(Some(50))[1].token);
    // One token: its rate is a measured figure (mlx-lm times it where it yields), not one
    // token over a zero duration (~4e307).
    let rs = run(Some(1));
    assert_eq!(rs.len(), 1);
    let tps = rs[0].generation_tps;
    assert!(tps.is_finite() && tps > 0.0 && tps < 1e12, "{tps}");
    // 0 is an error, as in mlx-lm.
    let err = stream_generate(model.as_ref(), &tok, &prompt, None, opts(Some(0)))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("must be non-zero"), "{err}");
}
