//! The one error type of the adapters and of the trainer built on them (`mlx-train`
//! re-exports it).

/// Everything that can go wrong while preparing data, building adapters or training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    #[error(transparent)]
    Model(#[from] mlx_models::ModelError),
    /// Bad training data: the file, the line (1-based, 0 when not about a line) and why.
    #[error("{file}{}: {message}", if *.line > 0 { format!(":{}", .line) } else { String::new() })]
    Data {
        file: String,
        line: usize,
        message: String,
    },
    /// A bad option or configuration value (the option named in the message).
    #[error("{0}")]
    Config(String),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;

pub fn io_err(path: &std::path::Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}
