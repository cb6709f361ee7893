//! Adapters as mlx-lm's tuner writes and reads them: LoRA and DoRA layers over the model's
//! linears, embeddings and MoE experts (`lora`), their shared parameter store (`params`),
//! `adapters.safetensors` + `adapter_config.json` loaded, applied, saved and fused into the
//! base (`adapters`), and a full fine-tune's layer weights (`full`). Inference (`mlx_engine`'s
//! loader) uses it without the trainer; `mlx-train` builds on it.
#![forbid(unsafe_code)]

pub mod adapters;
pub mod error;
pub mod full;
pub mod lora;
pub mod params;

pub use error::{Result, TrainError};
pub use params::Params;
