//! Fine-tuning with mlx-lm's tuner semantics, bit for bit on CPU: LoRA and DoRA adapters
//! over dense or quantized linears ([`lora`]), mlx-lm's data formats and batching
//! ([`data`]), `default_loss` ([`loss`]), `mlx.optimizers` ([`optim`]), the training loop
//! ([`trainer`]), full fine-tuning of the last layers ([`full`]), adapter files in mlx-lm's
//! format and fusing ([`adapters`]); DPO and ORPO
//! ([`objectives`]); `mlx_lm.lora`'s options and run ([`run`], [`cli`]).
//!
//! Memory options: per-layer gradient checkpointing (`Trainable::set_grad_checkpoint`,
//! `--grad-checkpoint`), a chunked cross-entropy ([`loss::chunked_loss`]), the segmented
//! backward ([`segmented`]) and flash attention ([`attention`], `mlx_kernels::flash_attention`).
//!
//! ```no_run
//! use mlx_train::run::{train_model, RunConfig};
//! use mlx_train::trainer::NoCallback;
//!
//! # fn main() -> mlx_train::Result<()> {
//! // mlx_lm.lora --train --model DIR --data DIR --iters 10
//! let config: RunConfig = serde_json::from_value(serde_json::json!({
//!     "model": "path/to/model", "data": "path/to/data", "train": true, "iters": 10,
//! }))
//! .map_err(|e| mlx_train::TrainError::Config(e.to_string()))?;
//! train_model(&config, &mut NoCallback)?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod attention;
pub mod cli;
pub mod data;
pub mod dwq;
pub mod loss;
pub mod memory;
pub mod nprand;
pub mod objectives;
pub mod optim;
pub mod resume;
pub mod run;
pub mod segmented;
pub mod tokenize;
pub mod trainer;

// The adapters, their parameter store and the error type live in `mlx-adapters` (inference
// uses them without the trainer); their module paths stay the same here.
pub use error::{Result, TrainError};
pub use mlx_adapters::{adapters, error, full, lora, params};
pub use params::Params;
