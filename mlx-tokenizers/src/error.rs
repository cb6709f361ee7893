//! The error of this crate's loaders, templates and detokenizers.

/// Errors from loading or using a tokenizer or chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Reading a file or running a helper program failed.
    #[error("tokenizer I/O: {0}")]
    Io(String),
    /// A configuration file is malformed or inconsistent.
    #[error("tokenizer config: {0}")]
    Config(String),
    /// The `tokenizers` backend reported an error.
    #[error("tokenizers: {0}")]
    Backend(String),
    /// A chat template failed to compile or render (including `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
    /// An argument is invalid (unknown name, unsupported option, ...).
    #[error("{0}")]
    Invalid(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TokenizerError>;
