//! Errors of `mlx-models`.

/// What can go wrong loading or running a model.
#[derive(thiserror::Error, Debug)]
pub enum ModelError {
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// A malformed or inconsistent `config.json` (or GGUF hyper-parameters).
    #[error("invalid model config: {0}")]
    Config(String),
    /// A `model_type` no port and no descriptor row serves; `remapped_to` is what mlx-lm's
    /// `MODEL_REMAPPING` runs it as, when it remaps it.
    #[error(
        "unsupported model_type `{model_type}`{}; supported: {}",
        remapped_to.as_ref().map(|r| format!(" (mlx-lm runs it as `{r}`)")).unwrap_or_default(),
        supported.join(", ")
    )]
    UnsupportedModelType {
        model_type: String,
        remapped_to: Option<String>,
        supported: Vec<String>,
    },
    /// Weights that do not match the model: every problem, sorted.
    #[error("weights do not match the model:\n  {}", .0.join("\n  "))]
    Weights(Vec<String>),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    /// Values handed back for a model's parameters that do not fit them: the parameter path
    /// (`model.layers.0.self_attn.q_proj`) and the problem.
    #[error("{path}: {problem}")]
    Parameters { path: String, problem: String },
    /// A reference model of full fine-tuning was asked for, but the base weights were not kept.
    #[error("full fine-tuning: the base weights were not kept for a reference model")]
    BaseWeightsNotKept,
    /// An adapter wrapped around the model (`mlx-adapters`) failed; its own typed error is the
    /// source (downcast it to `mlx_adapters::TrainError`).
    #[error(transparent)]
    Adapter(Box<dyn std::error::Error + Send + Sync>),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
