//! Continuous batching: one engine thread owns the model (and every MLX array), requests join
//! a running batch between decode steps and leave it when they finish or their client goes
//! away, as mlx-lm's `BatchGenerator` does.
//!
//! - [`BatchKVCache`] (in `mlx-cache`): mlx-lm's batched KV cache, rows right-justified with left
//!   padding, rope at per-row offsets, an explicit padded causal mask.
//! - [`engine`]: the engine thread, its bounded queue and the events a request receives.
//!
//! A new request is prefilled alone (the same chunked prefill as
//! [`crate::generate::generate_step`], optionally continuing a cached prefix from
//! [`crate::prompt_cache::PromptCache`]); its cache then joins the batch and every later token
//! comes from one batched decode step. Prefill chunks and embeddings run one bounded slice at
//! a time between decode steps, so no request stalls the running ones.

pub mod engine;
pub mod lockstep;
mod profile;

pub use engine::{
    BatchEvent, BatchRequest, EmbedReply, Engine, EngineConfig, EngineDecoder, EngineStats,
    EventSink, KvOptions, PromptLookup, SubmitError,
};
pub use mlx_cache::BatchKVCache;
