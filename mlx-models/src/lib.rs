//! Layers, architectures and loading, ported from mlx-lm 0.32.2 so that logits match it bit
//! for bit. Weights in, logits out: tokenizers, chat templates, sampling and generation live in
//! `mlx-engine`.
//!
//! - [`config`]: `config.json`, `MODEL_REMAPPING`, the `quantization` block.
//! - [`weights`]: strict loading (missing, unexpected and mis-shaped tensors reported together).
//! - [`layers`]: `Linear` (dense or quantized, with bias), `Embedding`, `RmsNorm`,
//!   `LayerNorm`, rotary embeddings (`Rope::initialize` = `initialize_rope`), MLPs, attention.
//! - [`models`]: the architectures (the descriptor table [`models::descriptor`] run by [`models::dense`], and dedicated ports) behind [`models::LanguageModel`].
//! - [`load`]: HF-style directories; [`gguf`]: GGUF files.
//! - [`embed`]: sentence embeddings (last-token pooling, L2-normalised).
//!
//! Models never own caches: `forward` takes the caches made by `make_cache` (or loaded).
#![forbid(unsafe_code)]

pub mod awq;
pub mod config;
pub mod convert;
pub mod dynamic_quant;
pub mod embed;
mod error;
pub mod gguf;
pub mod gguf_dequant;
pub mod gptq;
pub mod layers;
mod learned;
pub mod load;
pub mod models;
pub mod pyjson;
pub mod shard;
pub mod weights;

pub use error::{ModelError, Parallelism, Result};
pub use models::LanguageModel;
