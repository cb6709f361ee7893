//! `mlx quant gptq` and `mlx quant awq` (as `python -m mlx_lm.quant.gptq` / `.awq`): learned
//! quantization with calibration text from a local file. mlx-lm's `load_data` reads a fixed text it downloads
//! (`~/.cache/mlx-lm/calibration_v5.txt`); here `--data-path` names the text (that file, or any
//! other), tokenized whole with the model's tokenizer (special tokens added, as
//! `tokenizer.encode`), cut into rows of `--sequence-length`, and `--num-samples` rows taken
//! in the order of `mx.random.permutation` under `--seed` after the global key draws mlx-lm's
//! `load` takes (what `mx.random.seed(seed)` before `load` gives there).

use std::path::Path;

use clap::{Args, Subcommand};
use mlx_core::prelude::*;
use mlx_models::awq::{awq, AwqOptions};
use mlx_models::convert::Progress;
use mlx_models::gptq::{gptq, GptqOptions};
use mlx_models::load::{load_model_dir_with_params, LoadOptions};

#[derive(Args, Debug)]
pub struct QuantArgs {
    #[command(subcommand)]
    pub method: QuantMethod,
}

#[derive(Subcommand, Debug)]
pub enum QuantMethod {
    /// GPTQ (as `python -m mlx_lm.quant.gptq`): Hessian-aware rounding of every linear layer
    /// from calibration text; the other quantizable modules (embeddings) take plain affine
    /// quantization at the fallback bits.
    #[command(allow_negative_numbers = true)]
    Gptq(GptqArgs),
    /// AWQ (as `python -m mlx_lm.quant.awq`): activation-aware scales folded into the norms
    /// and projections, then clipped per group, block by block; llama-class models (mlx-lm's
    /// `llama_awq` recipe: model types llama and mistral).
    #[command(allow_negative_numbers = true)]
    Awq(AwqArgs),
}

#[derive(Args, Debug)]
pub struct AwqArgs {
    /// The model directory (Hugging Face names are not fetched).
    #[arg(long, short = 'm')]
    pub model: String,
    /// Where to write the quantized model.
    #[arg(long, default_value = "mlx_model")]
    pub mlx_path: String,
    #[arg(long, default_value_t = 4)]
    pub bits: i32,
    #[arg(long, default_value_t = 64)]
    pub group_size: i32,
    #[arg(long, default_value_t = 4)]
    pub embed_bits: i32,
    #[arg(long, default_value_t = 32)]
    pub embed_group_size: i32,
    #[arg(long, default_value_t = 128)]
    pub num_samples: i64,
    #[arg(long, default_value_t = 512)]
    pub sequence_length: i64,
    #[arg(long, default_value_t = 20)]
    pub n_grid: i32,
    #[arg(long, default_value_t = 123)]
    pub seed: u64,
    /// The calibration text: a local plain-text file (mlx-lm downloads its own
    /// `calibration_v5.txt` into ~/.cache/mlx-lm/; give that file, or any text, here).
    #[arg(long)]
    pub data_path: String,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
}

#[derive(Args, Debug)]
pub struct GptqArgs {
    /// The model directory (Hugging Face names are not fetched).
    #[arg(long, short = 'm')]
    pub model: String,
    /// Where to write the quantized model.
    #[arg(long, default_value = "mlx_model")]
    pub mlx_path: String,
    /// Quantization bits for GPTQ layers (2, 4 or 8).
    #[arg(long, default_value_t = 4)]
    pub bits: i32,
    /// Quantization group size for GPTQ layers.
    #[arg(long, default_value_t = 64)]
    pub group_size: i32,
    /// Quantization bits for non-GPTQ layers.
    #[arg(long, default_value_t = 6)]
    pub fallback_bits: i32,
    /// Quantization group size for non-GPTQ layers.
    #[arg(long, default_value_t = 64)]
    pub fallback_group_size: i32,
    /// Number of samples from the calibration data, use -1 for all.
    #[arg(long, default_value_t = -1)]
    pub num_samples: i64,
    /// Sequence length for the calibration data.
    #[arg(long, default_value_t = 512)]
    pub sequence_length: i64,
    #[arg(long, default_value_t = 123)]
    pub seed: u64,
    /// The calibration text: a local plain-text file (mlx-lm downloads its own
    /// `calibration_v5.txt` into ~/.cache/mlx-lm/; give that file, or any text, here).
    #[arg(long)]
    pub data_path: String,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
}

impl QuantArgs {
    /// Checks that need no model.
    pub fn check(&self) -> Result<(), String> {
        let (model, data_path, sequence_length, num_samples, mlx_path) = match &self.method {
            QuantMethod::Gptq(a) => (
                &a.model,
                &a.data_path,
                a.sequence_length,
                a.num_samples,
                &a.mlx_path,
            ),
            QuantMethod::Awq(a) => (
                &a.model,
                &a.data_path,
                a.sequence_length,
                a.num_samples,
                &a.mlx_path,
            ),
        };
        check_common(model, data_path, sequence_length, num_samples, mlx_path)
    }
}

/// The checks both methods share, before any model is read.
fn check_common(
    model: &str,
    data_path: &str,
    sequence_length: i64,
    num_samples: i64,
    mlx_path: &str,
) -> Result<(), String> {
    if !Path::new(model).join("config.json").is_file() {
        return Err(format!(
            "--model {model}: not a model directory (no config.json)"
        ));
    }
    if !Path::new(data_path).is_file() {
        return Err(format!(
            "--data-path {data_path}: no such file (calibration text is read from a local file)"
        ));
    }
    if sequence_length < 1 {
        return Err("--sequence-length must be at least 1".into());
    }
    if num_samples == 0 || num_samples < -1 {
        return Err("--num-samples must be positive or -1 (all)".into());
    }
    if Path::new(mlx_path).exists() {
        return Err(format!("--mlx-path {mlx_path}: already exists"));
    }
    Ok(())
}

/// mlx-lm's `load_data` on a local text: the token rows `(samples, sequence_length)`.
/// The global key must be where mlx-lm's is (seeded, then advanced by `load`'s draws).
pub fn calibration_rows(
    tok: &mlx_engine::Tokenizer,
    text: &str,
    num_samples: i64,
    sequence_length: i64,
) -> Result<Array, String> {
    let e = |e: mlx_core::Error| e.to_string();
    let ids = tok.encode(text, true).map_err(|e| e.to_string())?;
    let rows = ids.len() as i64 / sequence_length;
    if rows == 0 {
        return Err(format!(
            "the calibration text has {} tokens, fewer than one --sequence-length ({sequence_length})",
            ids.len()
        ));
    }
    let ids: Vec<i32> = ids[..(rows * sequence_length) as usize]
        .iter()
        .map(|&t| t as i32)
        .collect();
    let tokens = Array::from_slice(&ids, &[rows as i32, sequence_length as i32]).map_err(e)?;
    // `mx.random.permutation(n)`: a permutation of `arange(n)`.
    let n = ops::arange(0.0, rows as f64, 1.0, Dtype::Int32, None).map_err(e)?;
    let mut segments = mlx_core::random::permutation(&n, 0, None, None).map_err(e)?;
    if num_samples > 0 && num_samples < rows {
        segments = segments
            .slice(&[0], &[num_samples as i32], &[1])
            .map_err(e)?;
    }
    ops::take(&tokens, &segments, 0, None).map_err(e)
}

/// `mx.random.seed(seed)`, `load` (whose module construction draws from the key), then
/// `load_data` on the local text.
fn seeded_data(
    model: &str,
    seed: u64,
    data_path: &str,
    num_samples: i64,
    sequence_length: i64,
) -> Result<Array, String> {
    let dir = Path::new(model);
    let (m, config, params) = load_model_dir_with_params(dir, &LoadOptions::default())
        .map_err(|e| format!("{model}: {e}"))?;
    drop(m);
    let draws = mlx_engine::seed::construction_draws(&config, &params)
        .map_err(|e| format!("{model}: {e}"))?;
    mlx_engine::seed::seed_as_mlx_lm(seed, draws).map_err(|e| e.to_string())?;
    let tok = mlx_engine::Tokenizer::from_dir(dir).map_err(|e| format!("{model}: {e}"))?;
    let text =
        std::fs::read_to_string(data_path).map_err(|e| format!("--data-path {data_path}: {e}"))?;
    calibration_rows(&tok, &text, num_samples, sequence_length)
        .map_err(|e| format!("--data-path {data_path}: {e}"))
}

pub fn run(q: &QuantArgs) -> Result<(), String> {
    let (model, mlx_path) = match &q.method {
        QuantMethod::Gptq(a) => (&a.model, &a.mlx_path),
        QuantMethod::Awq(a) => (&a.model, &a.mlx_path),
    };
    let dir = Path::new(model);
    let mut progress = crate::convert::ProgressView::new("");
    let mut on_progress = |p: Progress<'_>| progress.show(p);
    let report = match &q.method {
        QuantMethod::Gptq(a) => {
            let data = seeded_data(
                model,
                a.seed,
                &a.data_path,
                a.num_samples,
                a.sequence_length,
            )?;
            let opts = GptqOptions {
                bits: a.bits,
                group_size: a.group_size,
                fallback_bits: a.fallback_bits,
                fallback_group_size: a.fallback_group_size,
                ..GptqOptions::default()
            };
            gptq(dir, Path::new(mlx_path), &data, &opts, &mut on_progress)
        }
        QuantMethod::Awq(a) => {
            let data = seeded_data(
                model,
                a.seed,
                &a.data_path,
                a.num_samples,
                a.sequence_length,
            )?;
            let opts = AwqOptions {
                bits: a.bits,
                group_size: a.group_size,
                embed_bits: a.embed_bits,
                embed_group_size: a.embed_group_size,
                n_grid: a.n_grid,
            };
            awq(dir, Path::new(mlx_path), &data, &opts, &mut on_progress)
        }
    }
    .map_err(|e| format!("{model}: {e}"))?;
    progress.finish();
    eprintln!(
        "[mlx] wrote {} tensors to {} ({})",
        report.tensors,
        mlx_path,
        report.files.join(", ")
    );
    Ok(())
}
