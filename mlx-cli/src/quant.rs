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
use mlx_core::quantized::QuantMode;
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
    /// and projections, then clipped per group, block by block; model types llama, mistral,
    /// qwen2, qwen3 (mlx-lm's `llama_awq` recipe) and gemma3_text (`gemma3_text_awq`).
    #[command(allow_negative_numbers = true)]
    Awq(AwqArgs),
    /// Dynamic quantization (as `python -m mlx_lm.quant.dynamic_quant`): each quantizable
    /// module's sensitivity from the gradient of the low-bit model's KL divergence to the float
    /// model on calibration text, then the most sensitive modules at the high bits so that the
    /// model reaches `--target-bpw`. The sensitivities are written to
    /// `<model with / as _>_sensitivities.json` in the current directory (mlx-lm's file).
    #[command(allow_negative_numbers = true)]
    Dynamic(DynamicArgs),
    /// DWQ (as `python -m mlx_lm.quant.dwq`): the quantized model's scales and biases (and its
    /// other unfrozen arrays, the norms) distilled against the float model's logits with Adam,
    /// one pass over local training rows.
    #[command(allow_negative_numbers = true)]
    Dwq(DwqArgs),
}

#[derive(Args, Debug)]
pub struct DwqArgs {
    /// A model to distill from (the student is this model quantized to --bits/--group-size).
    #[arg(long, short = 'm')]
    pub model: String,
    /// An already quantized model (the student) to improve with DWQ.
    #[arg(long)]
    pub quantized_model: Option<String>,
    /// Path to save the quantized model.
    #[arg(long, default_value = "mlx_model")]
    pub mlx_path: String,
    /// Bits per weight for quantization.
    #[arg(long, default_value_t = 4)]
    pub bits: i32,
    /// Group size for quantization.
    #[arg(long, default_value_t = 64)]
    pub group_size: i32,
    /// Number of samples to use for training (the next 32 validate).
    #[arg(long, default_value_t = 2048)]
    pub num_samples: usize,
    #[arg(long, default_value_t = 1025)]
    pub max_seq_length: usize,
    #[arg(long, default_value_t = 123)]
    pub seed: u32,
    #[arg(long, default_value_t = 1e-6)]
    pub learning_rate: f64,
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    /// The training rows: a local JSONL file, or a directory with `train.jsonl` (mlx-lm loads
    /// a Hugging Face dataset's `train` split; give its rows here), in mlx-lm's `text`,
    /// `prompt`/`completion` or `messages` formats.
    #[arg(long)]
    pub data_path: String,
    /// Use gradient checkpointing to reduce memory use.
    #[arg(long)]
    pub grad_checkpoint: bool,
    /// Directory to save/load targets (the teacher's top-1024 logits per batch).
    #[arg(long)]
    pub target_dir: Option<String>,
    /// Compute the targets and exit.
    #[arg(long)]
    pub targets_only: bool,
    /// Pipeline parallel instead of data parallel (no effect in one process).
    #[arg(long)]
    pub pipeline: bool,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
}

#[derive(Args, Debug)]
pub struct DynamicArgs {
    /// The model directory (Hugging Face names are not fetched).
    #[arg(long, short = 'm')]
    pub model: String,
    /// Path to save the model.
    #[arg(long, default_value = "mlx_model")]
    pub mlx_path: String,
    #[arg(long, default_value_t = 123)]
    pub seed: u64,
    /// Path to a pre-computed sensitivity JSON file.
    #[arg(long)]
    pub sensitivities: Option<String>,
    /// Target bits per weight.
    #[arg(long, default_value_t = 5.0)]
    pub target_bpw: f64,
    #[arg(long, default_value_t = 4)]
    pub low_bits: i32,
    #[arg(long, default_value_t = 64)]
    pub low_group_size: i32,
    #[arg(long, default_value_t = 5)]
    pub high_bits: i32,
    #[arg(long, default_value_t = 64)]
    pub high_group_size: i32,
    /// Compute the perplexity of the base and quantized models.
    #[arg(long)]
    pub report_ppl: bool,
    /// Use gradient checkpointing to reduce memory use.
    #[arg(long)]
    pub grad_checkpoint: bool,
    /// What type to use to accumulate the gradients for the sensitivities.
    #[arg(long, default_value = "float32", value_parser = ["float32", "bfloat16"])]
    pub accumulation_dtype: String,
    /// The calibration text: a local plain-text file (mlx-lm downloads its own
    /// `calibration_v5.txt` into ~/.cache/mlx-lm/; give that file, or any text, here). Rows
    /// of 512 tokens, all of them, as mlx-lm's `load_data(tokenizer, -1, 512)`.
    #[arg(long)]
    pub data_path: String,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
}

/// `dynamic_quant`'s fixed calibration row length.
const DYNAMIC_SEQUENCE_LENGTH: i64 = 512;

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
            QuantMethod::Dwq(a) => return check_dwq(a),
            QuantMethod::Dynamic(a) => {
                if let Some(p) = a.sensitivities.as_deref() {
                    if !Path::new(p).is_file() {
                        return Err(format!("--sensitivities {p}: no such file"));
                    }
                }
                (
                    &a.model,
                    &a.data_path,
                    DYNAMIC_SEQUENCE_LENGTH,
                    -1,
                    &a.mlx_path,
                )
            }
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
    let draws = mlx_engine::seed::construction_draws(&config, &params);
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
        QuantMethod::Dynamic(a) => return run_dynamic(a),
        QuantMethod::Dwq(a) => return run_dwq(a),
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
        QuantMethod::Dynamic(_) | QuantMethod::Dwq(_) => unreachable!("handled above"),
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

/// `mx.random.seed(seed)` after `load` (dynamic quant seeds after loading: no construction
/// draws), then `load_data(tokenizer, -1, 512)` on the local text.
fn rows_after_load(
    tok: &mlx_engine::Tokenizer,
    text: &str,
    seed: u64,
    data_path: &str,
) -> Result<Array, String> {
    mlx_engine::seed::seed_as_mlx_lm(seed, 0).map_err(|e| e.to_string())?;
    calibration_rows(tok, text, -1, DYNAMIC_SEQUENCE_LENGTH)
        .map_err(|e| format!("--data-path {data_path}: {e}"))
}

/// `python -m mlx_lm.quant.dynamic_quant`'s `main`.
fn run_dynamic(a: &DynamicArgs) -> Result<(), String> {
    use mlx_models::dynamic_quant as dq;
    let dir = Path::new(&a.model);
    let at = |e: mlx_models::ModelError| format!("{}: {e}", a.model);
    let opts = dq::DynamicOptions {
        target_bpw: a.target_bpw,
        low_bits: a.low_bits,
        low_group_size: a.low_group_size,
        high_bits: a.high_bits,
        high_group_size: a.high_group_size,
        accumulation_dtype: if a.accumulation_dtype == "bfloat16" {
            Dtype::Bfloat16
        } else {
            Dtype::Float32
        },
        grad_checkpoint: a.grad_checkpoint,
        ..dq::DynamicOptions::default()
    };
    opts.validate().map_err(|e| e.to_string())?;
    let src = dq::Source::load(dir).map_err(at)?;
    let tok = mlx_engine::Tokenizer::from_dir(dir).map_err(|e| format!("{}: {e}", a.model))?;
    let text = std::fs::read_to_string(&a.data_path)
        .map_err(|e| format!("--data-path {}: {e}", a.data_path))?;
    let mut progress = crate::convert::ProgressView::new("");
    let sensitivities = match &a.sensitivities {
        None => {
            let data = rows_after_load(&tok, &text, a.seed, &a.data_path)?;
            let s = dq::estimate_sensitivities(&src, &data, &opts, &mut |p| progress.show(p))
                .map_err(at)?;
            progress.finish();
            let file = format!("{}_sensitivities.json", a.model.replace('/', "_"));
            std::fs::write(&file, dq::sensitivities_json(&s))
                .map_err(|e| format!("{file}: {e}"))?;
            s.into_iter().collect()
        }
        Some(p) => {
            dq::read_sensitivities(Path::new(p)).map_err(|e| format!("--sensitivities {e}"))?
        }
    };
    let data = rows_after_load(&tok, &text, a.seed, &a.data_path)?;
    let e = |e: mlx_models::ModelError| e.to_string();
    if a.report_ppl {
        let (m, _) = mlx_models::load::load_model_dir(dir, &LoadOptions::default()).map_err(at)?;
        let ppl = dq::eval_ppl(m.as_ref(), &data).map_err(e)?;
        crate::common::say!("Original PPL: {ppl:.3}");
    }
    let threshold = dq::estimate_threshold(&src, &sensitivities, &opts).map_err(at)?;
    let high = dq::high_modules(&src, &sensitivities, threshold);
    drop(src);
    let report = dq::quantize_and_save(dir, Path::new(&a.mlx_path), high, &opts, &mut |p| {
        progress.show(p)
    })
    .map_err(at)?;
    progress.finish();
    if a.report_ppl {
        let (m, _) =
            mlx_models::load::load_model_dir(Path::new(&a.mlx_path), &LoadOptions::default())
                .map_err(|e| format!("{}: {e}", a.mlx_path))?;
        let ppl = dq::eval_ppl(m.as_ref(), &data).map_err(e)?;
        crate::common::say!("Quantized PPL: {ppl:.3}");
    }
    let peak = mlx_core::memory::peak_memory().map_err(|e| e.to_string())?;
    crate::common::say!("Peak memory used: {:.3}GB", peak as f64 / 1e9);
    eprintln!(
        "[mlx] wrote {} tensors to {} ({})",
        report.tensors,
        a.mlx_path,
        report.files.join(", ")
    );
    Ok(())
}

fn check_dwq(a: &DwqArgs) -> Result<(), String> {
    if let Some(q) = &a.quantized_model {
        if !Path::new(q).join("config.json").is_file() {
            return Err(format!(
                "--quantized-model {q}: not a model directory (no config.json)"
            ));
        }
    }
    if !Path::new(&a.model).join("config.json").is_file() {
        return Err(format!(
            "--model {}: not a model directory (no config.json)",
            a.model
        ));
    }
    if !Path::new(&a.data_path).exists() {
        return Err(format!(
            "--data-path {}: no such file or directory (training rows are read locally)",
            a.data_path
        ));
    }
    if a.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    if a.max_seq_length < 2 {
        return Err("--max-seq-length must be at least 2".into());
    }
    if !(a.learning_rate.is_finite() && a.learning_rate >= 0.0) {
        return Err("--learning-rate must be a non-negative number".into());
    }
    QuantMode::Affine
        .check(a.group_size, a.bits)
        .map_err(|m| format!("--bits/--group-size: {m}"))?;
    if Path::new(&a.mlx_path).exists() && !a.targets_only {
        return Err(format!("--mlx-path {}: already exists", a.mlx_path));
    }
    Ok(())
}

/// `python -m mlx_lm.quant.dwq`'s `main` (one process).
fn run_dwq(a: &DwqArgs) -> Result<(), String> {
    use mlx_train::dwq::{self, DwqEvent, DwqOptions};
    let dir = Path::new(&a.model);
    let opts = DwqOptions {
        bits: a.bits,
        group_size: a.group_size,
        num_samples: a.num_samples,
        max_seq_length: a.max_seq_length,
        seed: a.seed,
        learning_rate: a.learning_rate,
        batch_size: a.batch_size,
        grad_checkpoint: a.grad_checkpoint,
        ..DwqOptions::default()
    };
    // `mx.random.seed(args.seed)` (nothing in DWQ draws from it on this path).
    mlx_core::random::seed(u64::from(a.seed)).map_err(|e| e.to_string())?;
    let tok = mlx_train::tokenize::load(dir).map_err(|e| e.to_string())?;
    let file = if Path::new(&a.data_path).is_dir() {
        Path::new(&a.data_path).join("train.jsonl")
    } else {
        Path::new(&a.data_path).to_path_buf()
    };
    let rows = mlx_train::data::read_jsonl(&file).map_err(|e| e.to_string())?;
    let (train, valid) = dwq::load_data(&tok, &rows, &file.display().to_string(), &opts)
        .map_err(|e| e.to_string())?;
    let mut progress = crate::convert::ProgressView::new("");
    let mut on_event = |e: DwqEvent<'_>| match e {
        DwqEvent::Trainable { trainable, total } => {
            let (t, n) = (trainable as f64 / 1e6, total as f64 / 1e6);
            crate::common::say!(
                "Trainable parameters: {:.3}% ({t:.3}M/{n:.3}M)",
                t * 100.0 / n
            );
        }
        DwqEvent::Validation { it, loss } => {
            crate::common::say!("Validation: it={it}, loss={loss:.3}")
        }
        DwqEvent::Step { it, loss, tokens } => {
            eprintln!("[mlx] step {} loss={loss:.4} tokens={tokens}", it + 1)
        }
        DwqEvent::Convert(p) => {
            if !matches!(p, Progress::Info(_)) {
                progress.show(p)
            }
        }
    };
    // `--pipeline` shards over a group of several processes only: in one it changes nothing.
    let sources = dwq::DwqSources {
        quantized_model: a.quantized_model.as_deref().map(Path::new),
        target_dir: a.target_dir.as_deref().map(Path::new),
        targets_only: a.targets_only,
    };
    let report = dwq::dwq_with(
        dir,
        Path::new(&a.mlx_path),
        &train,
        &valid,
        &opts,
        &sources,
        &mut on_event,
    )
    .map_err(|e| format!("{}: {e}", a.model))?;
    progress.finish();
    let Some(report) = report else {
        return Ok(());
    };
    eprintln!(
        "[mlx] wrote {} tensors to {} ({})",
        report.tensors,
        a.mlx_path,
        report.files.join(", ")
    );
    Ok(())
}
