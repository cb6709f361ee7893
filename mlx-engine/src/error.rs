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
    /// The prompt holds no token; `hint` completes the message (mlx-lm's wording, where the
    /// entry point has one).
    #[error("the prompt is empty: give at least one token{hint}")]
    EmptyPrompt { hint: String },
    /// An option that must be positive is not.
    #[error("{option} must be positive")]
    NotPositive { option: String },
    /// mlx-lm's `max_tokens == 0` refusal.
    #[error("Maximum number of tokens must be non-zero (use -1 for no limit).")]
    ZeroMaxTokens,
    /// Options that do not combine (the message names both and what to use instead).
    #[error("{0}")]
    Conflict(String),
    /// A decoder (`decoder`: the CPU decoder, the compiled decoder) handed to an entry point
    /// (`context`) with another model than the one it was built for.
    #[error("{context}: the {decoder} was made for another model than this {model_type} model")]
    DecoderMismatch {
        context: String,
        decoder: String,
        model_type: String,
    },
    /// The model's logits at generated token `token` are NaN or infinite (`lse`: their
    /// log-sum-exp): corrupt weights or inputs.
    #[error(
        "the model's logits at generated token {token} are not finite (their log-sum-exp is \
         {lse}); the weights or the inputs are corrupt"
    )]
    NonFiniteLogits { token: usize, lse: f32 },
    /// The model lacks what an engine feature needs (its output head, its hidden states):
    /// its `model_type` and the problem.
    #[error("`{model_type}` {problem}")]
    ModelLacks { model_type: String, problem: String },
    /// A drafter of speculative decoding (block drafter, MTP head) cannot be built or run:
    /// what (the drafter, or its weights file) and the problem.
    #[error("{what}: {problem}")]
    Draft { what: String, problem: String },
    /// The draft model's vocabulary differs from the model's (mlx-lm's wording).
    #[error(
        "Draft model tokenizer does not match model tokenizer: the draft's vocabulary has \
         {draft} tokens, the model's {model} (speculative decoding needs the same vocabulary)"
    )]
    DraftVocabMismatch { draft: usize, model: usize },
    /// The draft model's vocabulary is larger than the model's.
    #[error(
        "the draft model's vocabulary ({draft} tokens) is larger than the model's ({model}): \
         its tokens could not be verified"
    )]
    DraftVocabTooLarge { draft: i32, model: i32 },
    /// Speculative decoding got a prompt cache it cannot roll back (its class name).
    #[error("Speculative decoding requires a trimmable prompt cache (got {class})")]
    UntrimmableCache { class: String },
    /// Embedding one text of a batch failed: its index and the cause.
    #[error("embed: text {index}: {source}")]
    EmbedText {
        index: usize,
        source: Box<EngineError>,
    },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
