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
    /// A bad value of one named option or configuration field: the field
    /// (`optimizer_config.adam.betas`, `batch_size`) and what is wrong with it.
    #[error("{field} {problem}")]
    Option { field: String, problem: String },
    /// An option a section does not have: the section (`optimizer_config.muon`) and the name.
    #[error("{section}: unknown option `{option}`")]
    UnknownOption { section: String, option: String },
    /// A layer already wrapped by an adapter asked to take a LoRA adapter again: its path.
    #[error("{path} is already adapted; cannot convert it to LoRA again")]
    AlreadyAdapted { path: String },
    /// A field of a file that is missing or wrong: the file (`config.json`), the field
    /// (`quantization.group_size`) and the problem.
    #[error("{file}: {field} {problem}")]
    FileField {
        file: String,
        field: String,
        problem: String,
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

impl TrainError {
    /// [`TrainError::Option`] for `field`.
    pub fn option(field: impl Into<String>, problem: impl Into<String>) -> Self {
        TrainError::Option {
            field: field.into(),
            problem: problem.into(),
        }
    }
}
