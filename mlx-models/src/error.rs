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
    /// A model that cannot be split over ranks as asked (`mlx launch`): the subject (a
    /// parameter path, the model type, a rank or a layer count) and the problem.
    #[error("{kind} parallelism: {what}: {problem}")]
    Parallel {
        kind: Parallelism,
        what: String,
        problem: String,
    },
    /// Caches of the wrong kind or number for the model (or a layer that needs dense keys and
    /// values given a quantized cache): the layer or model, and what it needs.
    #[error("{what}: {problem}")]
    Cache { what: String, problem: String },
    /// Inputs the model cannot take: token ids of the wrong shape, a position past the
    /// model's table, an empty text, a layer or segment index out of range.
    #[error("{what}: {problem}")]
    Input { what: String, problem: String },
    /// A tensor of the wrong shape or dtype for its place: its name and the problem.
    #[error("{name}: {problem}")]
    Tensor { name: String, problem: String },
    /// A feature this model or layer does not have (tracing, gradient checkpointing with
    /// cross-layer attention, attention sinks on quantized attention, ...).
    #[error("{what}: {problem}")]
    Unsupported { what: String, problem: String },
    /// `mlx convert` options or destinations that cannot be used: the option (or the model
    /// type, or the file) and the problem.
    #[error("{option}: {problem}")]
    Convert { option: String, problem: String },
    /// A broken invariant of this crate (a compiled function or checkpointed layer handing
    /// back fewer arrays than it was built to): a bug, never bad input.
    #[error("internal error: {what}: {problem}")]
    Internal { what: String, problem: String },
}

/// Which way a model is split over ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallelism {
    /// Each layer's weights split over the ranks (`shard`).
    Tensor,
    /// The layers split into stages, one per rank (`pipeline`).
    Pipeline,
}

impl std::fmt::Display for Parallelism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Parallelism::Tensor => "tensor",
            Parallelism::Pipeline => "pipeline",
        })
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
