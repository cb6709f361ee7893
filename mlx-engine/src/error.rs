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
    /// An invalid argument or state (a sampler parameter, an empty prompt, ...).
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
