//! The chat session reuses the prompt cache between turns: the second turn runs the model only
//! on the new part of the conversation, and the reply equals a cold run's (greedy).

use mlx_core::prelude::*;
use mlx_engine::chat::ChatSession;
use mlx_engine::chat_template::ChatTemplateOptions;
use mlx_engine::generate::GenerateOptions;
use mlx_engine::stream::{stream_generate, StreamOptions};
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_models::gguf::load_gguf_model;
use mlx_models::load::LoadOptions;
use serde_json::json;

fn opts(max: usize) -> StreamOptions {
    StreamOptions {
        generate: GenerateOptions {
            max_tokens: Some(max),
            ..GenerateOptions::default()
        },
        ..StreamOptions::default()
    }
}

#[test]
fn second_turn_prefills_only_the_new_turn_and_matches_a_cold_run() {
    let path = mlx_engine::fetch::smollm2_gguf().unwrap();
    let (model, g) = load_gguf_model(
        &path,
        &LoadOptions {
            dtype: Some(Dtype::Float32),
        },
    )
    .unwrap();
    let tok = tokenizer_data(&g.metadata).unwrap().build().unwrap();
    let mut chat = ChatSession::new(model.as_ref(), &tok, None, opts(6));
    let (r1, s1) = chat.send("Name a color.", |_| {}).unwrap();
    assert_eq!(s1.prefilled, s1.prompt_tokens, "first turn runs everything");
    let (r2, s2) = chat.send("And a fruit?", |_| {}).unwrap();
    assert!(
        s2.prefilled < s2.prompt_tokens / 2,
        "second turn ran {} of {} tokens",
        s2.prefilled,
        s2.prompt_tokens
    );

    // A cold run of the same conversation gives the same reply.
    let messages = vec![
        json!({"role": "user", "content": "Name a color."}),
        json!({"role": "assistant", "content": r1}),
        json!({"role": "user", "content": "And a fruit?"}),
    ];
    let ids = tok
        .apply_chat_template_ids(&messages, &ChatTemplateOptions::generation(true))
        .unwrap();
    assert_eq!(ids.len(), s2.prompt_tokens);
    let cold: String = stream_generate(model.as_ref(), &tok, &ids, None, opts(6))
        .unwrap()
        .map(|r| r.unwrap().text)
        .collect();
    assert_eq!(r2, cold);
}
