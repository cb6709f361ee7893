//! The one error type of `mlx-core`.

/// Everything that can go wrong in `mlx-core`.
///
/// MLX's own messages are kept verbatim; they start with the C++ op in brackets
/// (`"[matmul] Last dimension of first input ..."`), and `op` names the Rust entry point.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// MLX raised an exception.
    #[error("{op}: {message}")]
    Mlx { op: &'static str, message: String },
    /// The Rust side rejected an argument before calling MLX.
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    /// A Rust callback handed to MLX (closure, custom VJP) failed with this error.
    #[error("callback failed: {0}")]
    Callback(String),
}

impl Error {
    pub(crate) fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            message: message.into(),
        }
    }

    /// The message without the op prefix.
    pub fn message(&self) -> &str {
        match self {
            Error::Mlx { message, .. } | Error::InvalidArgument { message, .. } => message,
            Error::Io { message, .. } => message,
            Error::Callback(m) => m,
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How many problems [`cap_listing`] keeps before summarising the rest as "and N more".
pub const MAX_LISTED_PROBLEMS: usize = 50;

/// `problems` sorted, the first [`MAX_LISTED_PROBLEMS`] kept and the rest counted: how a
/// loader lists everything wrong with a file at once without an unbounded message.
pub fn cap_listing(mut problems: Vec<String>) -> Vec<String> {
    problems.sort();
    if problems.len() > MAX_LISTED_PROBLEMS {
        let more = problems.len() - MAX_LISTED_PROBLEMS;
        problems.truncate(MAX_LISTED_PROBLEMS);
        problems.push(format!("... and {more} more"));
    }
    problems
}
