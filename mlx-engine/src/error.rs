//! Errors of `mlx-engine`.

use crate::tokenizer::TokenizerError;

/// What can go wrong tokenizing, sampling or generating.
#[derive(thiserror::Error, Debug)]
pub enum EngineError {
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// Loading or running the model failed.
    #[error(transparent)]
    Model(#[from] mlx_models::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The CPU decoder does not cover this model or these options (the reason).
    #[error("the CPU decoder does not apply: {0}")]
    CpuDecoderUnsupported(String),
    /// The GPU graph decoder does not cover this model or these options (the reason).
    #[error("the graph decoder does not apply: {0}")]
    GraphDecoderUnsupported(String),
    /// A model loader handed to the engine (the server's) failed: the model path as given and
    /// the loader's message (which names the file and the problem).
    #[error("{message}")]
    ModelLoad { path: String, message: String },
    /// The draft model of speculative decoding (`--draft-model PATH`) failed to load: the
    /// path and the loader's message.
    #[error("--draft-model {path}: {message}")]
    DraftModel { path: String, message: String },
    /// A sampler or logits-processor parameter out of its range: the parameter and the
    /// problem.
    #[error("sampler: {parameter}: {problem}")]
    Sampler { parameter: String, problem: String },
    /// Input the engine cannot take (an empty prompt, a token id outside the vocabulary): what
    /// was given and the problem.
    #[error("{what}: {problem}")]
    Input { what: String, problem: String },
    /// An engine option out of its range: the option and the problem.
    #[error("{option}: {problem}")]
    Options { option: String, problem: String },
    /// Caches the engine cannot run on (not plain KV caches for continuous batching, the wrong
    /// number for the compiled decoder, ...).
    #[error("{what}: {problem}")]
    Cache { what: String, problem: String },
    /// Structured output (a grammar or JSON schema) failed: the problem.
    #[error("structured output: {problem}")]
    Grammar { problem: String },
    /// A broken invariant of the engine (a thread gone, a step that returned nothing): a bug,
    /// never bad input.
    #[error("internal error: {what}: {problem}")]
    Internal { what: String, problem: String },
    /// An invalid argument or state not covered above.
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
