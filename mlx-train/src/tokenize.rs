//! The only place that touches the tokenizer type: `mlx-tokenizers`' `Tokenizer` and chat
//! templates (no runtime needed); the model loader alone comes from `mlx-engine`.

use serde_json::Value;

use mlx_tokenizers::ChatTemplateOptions;
pub use mlx_tokenizers::Tokenizer;

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

/// The base model and its tokenizer through the one loader (`mlx_engine::load`): an HF
/// directory, a `.gguf` file or a Hub name, in its stored dtypes (as mlx-lm's `load`).
pub fn load_model(model: &str) -> Result<mlx_engine::load::Loaded> {
    use mlx_engine::load::{self, LoadError, LoadSpec, ModelRef};
    let to_train = |e: LoadError| match e {
        LoadError::Model(e) => TrainError::Model(e),
        LoadError::Mlx(e) => TrainError::Mlx(e),
        LoadError::Tokenizer { path, source } => TrainError::Io {
            path: path.display().to_string(),
            message: format!("loading the tokenizer: {source}"),
        },
        e @ LoadError::NotFound(_) => TrainError::Config(e.to_string()),
        e => TrainError::Io {
            path: model.to_string(),
            message: e.to_string(),
        },
    };
    let model = ModelRef::parse(Some(model)).map_err(to_train)?;
    load::load(&model, &LoadSpec::default(), &mut load::Quiet).map_err(to_train)
}

pub fn load(dir: &std::path::Path) -> Result<Tokenizer> {
    Tokenizer::from_dir(dir).map_err(|e| TrainError::Io {
        path: dir.display().to_string(),
        message: format!("loading the tokenizer: {e}"),
    })
}
