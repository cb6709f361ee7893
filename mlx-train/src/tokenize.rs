//! The only place that touches the tokenizer type (it moves to `mlx-engine`; the rename is
//! one line here).

use serde_json::Value;

use mlx_engine::ChatTemplateOptions;
pub use mlx_engine::Tokenizer;

use crate::error::{Result, TrainError};

fn tok_err(e: impl std::fmt::Display) -> TrainError {
    TrainError::Config(format!("tokenizer: {e}"))
}

/// `tokenizer.encode(text)` (special tokens added as the tokenizer's post-processor says).
pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    tok.encode(text, true).map_err(tok_err)
}

pub fn eos_token_id(tok: &Tokenizer) -> Option<u32> {
    tok.eos_token_id()
}

/// `tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=...)`,
/// tokenized.
pub fn chat_ids(
    tok: &Tokenizer,
    messages: &[Value],
    tools: Option<&Vec<Value>>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>> {
    let mut opts = ChatTemplateOptions::generation(add_generation_prompt);
    opts.tools = tools.cloned();
    tok.apply_chat_template_ids(messages, &opts)
        .map_err(tok_err)
}

pub fn load(dir: &std::path::Path) -> Result<Tokenizer> {
    Tokenizer::from_dir(dir).map_err(|e| TrainError::Io {
        path: dir.display().to_string(),
        message: format!("loading the tokenizer: {e}"),
    })
}
