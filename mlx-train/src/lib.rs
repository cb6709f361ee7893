//! Fine-tuning with mlx-lm's tuner semantics, bit for bit on CPU: LoRA and DoRA adapters
//! over dense or quantized linears ([`lora`]), mlx-lm's data formats and batching
//! ([`data`]), `default_loss` ([`loss`]), `mlx.optimizers` ([`optim`]), the training loop
//! ([`trainer`]), adapter files in mlx-lm's format and fusing ([`adapters`]).
#![forbid(unsafe_code)]

pub mod adapters;
pub mod cli;
pub mod data;
mod error;
pub mod lora;
pub mod loss;
pub mod nprand;
pub mod objectives;
pub mod optim;
pub mod params;
pub mod run;
pub mod tokenize;
pub mod trainer;

pub use error::{Result, TrainError};
pub use params::Params;
