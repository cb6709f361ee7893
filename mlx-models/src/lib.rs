//! Layers, architectures, loading, tokenizer, chat templates and generation.
//!
//! Today this crate holds the text side: [`tokenizer::Tokenizer`] (Hugging Face
//! `tokenizer.json` with mlx-lm's special-token and EOS handling), [`tokenizer_gguf`] (a
//! tokenizer built from GGUF metadata), [`tokenizer_stream`] (streaming detokenizers) and
//! [`chat_template`] (Jinja chat templates rendered as transformers renders them).
#![forbid(unsafe_code)]

pub mod chat_template;
pub mod tokenizer;
pub mod tokenizer_gguf;
pub mod tokenizer_stream;
#[doc(hidden)]
pub mod tokenizer_testdata;

pub use chat_template::{ChatTemplate, ChatTemplateOptions, ChatTemplates};
pub use tokenizer::{Tokenizer, TokenizerError};
pub use tokenizer_gguf::GgufTokenizerData;
pub use tokenizer_stream::{DetokenizerKind, StreamingDetokenizer};
