//! `mlx perplexity` (as `mlx_lm.perplexity`): the perplexity of a model on a dataset and its
//! standard error, with mlx-lm's sampling of the data (`np.random.seed(seed)`, a permutation
//! of the records, their tokens concatenated and cut into `--num-samples` rows of
//! `--sequence-length`), its batches and its figures. Data comes from a local file: a JSONL
//! file (or a directory holding `train.jsonl`) in any of mlx-lm's dataset formats (`text`,
//! `messages`, `prompt`/`completion`), or a plain-text file (one `text` record).

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use mlx_core::prelude::*;
use mlx_engine::load::{LoadError, LoadSpec, ModelRef};
use mlx_train::data::{create_dataset, read_jsonl, DataConfig};
use mlx_train::nprand::NumpyRandom;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// The model: an HF-style directory, a .gguf file or a Hugging Face name, loaded as
    /// every command loads it (its stored dtypes, as mlx-lm's `load`).
    #[arg(long)]
    pub model: String,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
    /// Batch size for evaluation.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Sequence length for evaluation.
    #[arg(long, default_value_t = 512)]
    pub sequence_length: usize,
    /// Number of samples to use (-1 for all available).
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    pub num_samples: i64,
    /// The data: a local .jsonl file (mlx-lm's dataset formats), a directory holding
    /// train.jsonl, or a plain-text file.
    #[arg(long)]
    pub data_path: String,
    /// Random seed for data sampling.
    #[arg(long, default_value_t = 123)]
    pub seed: u32,
    /// Print the results as one JSON object (the figures at full precision).
    #[arg(long)]
    pub json: bool,
    /// Which forward scores the tokens: `mlx` (mlx_lm.perplexity's own forward, L1; on the
    /// CPU backend its dense products run through the wheel's reference BLAS, ~1 GFLOP/s) or
    /// `cpu` (the CPU decoder, float32 activations and cache: L3, a different summation
    /// order, tens of times faster; the figure is within the bound `tests/perplexity.rs`
    /// states).
    #[arg(long, default_value = "mlx", value_parser = ["mlx", "cpu"])]
    pub decoder: String,
}

impl PerplexityArgs {
    /// Checks that need no model.
    pub fn check(&self) -> Result<(), String> {
        if self.batch_size == 0 {
            return Err("--batch-size must be at least 1".into());
        }
        if self.sequence_length < 2 {
            return Err("--sequence-length must be at least 2".into());
        }
        if self.num_samples == 0 || self.num_samples < -1 {
            return Err("--num-samples must be positive or -1 (all)".into());
        }
        data_file(&self.data_path).map(|_| ())?;
        if let ModelRef::Path(p) = crate::model::model_path(Some(&self.model))? {
            if p.is_dir() && !p.join("config.json").is_file() {
                return Err(format!(
                    "--model {}: not a model directory (no config.json)",
                    self.model
                ));
            }
        }
        Ok(())
    }
}

/// The file the data comes from, and whether it is plain text.
fn data_file(path: &str) -> Result<(PathBuf, bool), String> {
    let p = Path::new(path);
    if p.is_dir() {
        let f = p.join("train.jsonl");
        if f.is_file() {
            return Ok((f, false));
        }
        return Err(format!(
            "--data-path {path}: the directory holds no train.jsonl"
        ));
    }
    if !p.is_file() {
        return Err(format!(
            "--data-path {path}: no such file (Hugging Face datasets are not fetched: give a local \
             .jsonl or text file)"
        ));
    }
    let jsonl = p.extension().is_some_and(|e| e == "jsonl" || e == "json");
    Ok((p.to_path_buf(), !jsonl))
}

/// `load_data`: the token rows, `[samples, sequence_length]`.
fn load_data(
    tok: &mlx_engine::Tokenizer,
    path: &str,
    num_samples: i64,
    sequence_length: usize,
    rng: &mut NumpyRandom,
) -> Result<(Vec<i32>, usize), String> {
    let (file, text) = data_file(path)?;
    let rows = if text {
        let t = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut m = serde_json::Map::new();
        m.insert("text".into(), t.into());
        vec![m]
    } else {
        read_jsonl(&file).map_err(|e| e.to_string())?
    };
    let name = file.display().to_string();
    let dataset =
        create_dataset(&rows, tok, &DataConfig::default(), &name).map_err(|e| e.to_string())?;
    if dataset.is_empty() {
        return Err(format!("{name}: no records"));
    }
    let perm = rng.permutation(dataset.len());
    let want = if num_samples > 0 {
        Some(sequence_length * num_samples as usize)
    } else {
        None
    };
    let mut data: Vec<i32> = Vec::new();
    let mut i = 0;
    loop {
        if want.is_some_and(|w| data.len() >= w) {
            break;
        }
        let Some(&idx) = perm.get(i) else {
            if want.is_none() {
                break;
            }
            return Err(format!(
                "{name}: the records hold {} tokens, fewer than --num-samples x --sequence-length = {}",
                data.len(),
                want.unwrap_or(0)
            ));
        };
        i += 1;
        data.extend(dataset.examples[idx].tokens.iter().map(|&t| t as i32));
    }
    let mut rows = data.len() / sequence_length;
    if num_samples > 0 {
        rows = rows.min(num_samples as usize);
    }
    if rows == 0 {
        return Err(format!(
            "{name}: fewer tokens ({}) than one --sequence-length ({sequence_length})",
            data.len()
        ));
    }
    data.truncate(rows * sequence_length);
    Ok((data, rows))
}

/// The figures of one evaluation.
pub struct Perplexity {
    pub perplexity: f64,
    pub standard_error: f64,
}

/// `eval_ppl`: per-token cross-entropy over the batches, then `exp(mean)` and the delta
/// approximation of its standard error.
fn eval_ppl(
    model: &dyn mlx_models::LanguageModel,
    data: &[i32],
    rows: usize,
    len: usize,
    batch_size: usize,
) -> Result<Perplexity, String> {
    let e = |e: mlx_core::Error| e.to_string();
    let num_batches = rows.div_ceil(batch_size);
    let mut losses = Vec::with_capacity(num_batches);
    for (i, s) in (0..rows).step_by(batch_size).enumerate() {
        let b = batch_size.min(rows - s);
        let batch =
            Array::from_slice(&data[s * len..(s + b) * len], &[b as i32, len as i32]).map_err(e)?;
        let l = len as i32;
        let inputs = batch
            .slice(&[0, 0], &[b as i32, l - 1], &[1, 1])
            .map_err(e)?;
        let targets = batch.slice(&[0, 1], &[b as i32, l], &[1, 1]).map_err(e)?;
        let logits = model
            .forward(&inputs, None)
            .map_err(|e| e.to_string())?
            .astype(Dtype::Float32)
            .map_err(e)?;
        let loss = mlx_train::loss::cross_entropy(&logits, &targets).map_err(|e| e.to_string())?;
        mlx_core::eval([&loss]).map_err(e)?;
        losses.push(loss.flatten(0, -1).map_err(e)?);
        eprint!("  Processed {}/{num_batches} batches...\r", i + 1);
    }
    eprintln!();
    let refs: Vec<&Array> = losses.iter().collect();
    let all = ops::concatenate(&refs, 0, None).map_err(e)?;
    let mean_loss = f64::from(all.mean_all(false).map_err(e)?.item::<f32>().map_err(e)?);
    let ppl = mean_loss.exp();
    let var = ops::var_all(&all, false, 1, None).map_err(e)?;
    let std_dev = f64::from(var.sqrt().map_err(e)?.item::<f32>().map_err(e)?);
    let n = all.size();
    let se = std_dev / (n as f64).sqrt();
    Ok(Perplexity {
        perplexity: ppl,
        standard_error: ppl * se,
    })
}

/// `eval_ppl` on the CPU decoder (`--decoder cpu`, L3): each row teacher-forced from an empty
/// cache, float32 products and keys/values; each token's cross-entropy `logsumexp - logit`
/// and the figures in float64.
fn eval_ppl_cpu(
    model: &dyn mlx_models::LanguageModel,
    data: &[i32],
    rows: usize,
    len: usize,
) -> Result<Perplexity, String> {
    use mlx_engine::cpu_decode::{CpuDecoder, KvDtype};
    let e = |e: mlx_engine::EngineError| format!("--decoder cpu: {e}");
    let mut dec = CpuDecoder::new(model, 0, len).map_err(e)?;
    dec.set_activations(mlx_core::cpu::Activations::F32);
    dec.set_kv_dtype(KvDtype::F32);
    let mut losses: Vec<f64> = Vec::with_capacity(rows * (len - 1));
    for r in 0..rows {
        let row: Vec<u32> = data[r * len..(r + 1) * len]
            .iter()
            .map(|&t| t as u32)
            .collect();
        dec.reset();
        dec.feed_all(&row[..len - 1], &mut |i, l| {
            let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let s: f64 = l.iter().map(|&v| (v as f64 - m).exp()).sum();
            losses.push(m + s.ln() - l[row[i + 1] as usize] as f64);
        })
        .map_err(e)?;
        eprint!("  Processed {}/{rows} rows...\r", r + 1);
    }
    eprintln!();
    let n = losses.len() as f64;
    let mean = losses.iter().sum::<f64>() / n;
    let var = losses.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / (n - 1.0);
    let ppl = mean.exp();
    Ok(Perplexity {
        perplexity: ppl,
        standard_error: ppl * var.sqrt() / n.sqrt(),
    })
}

pub fn run(a: &PerplexityArgs) -> Result<(), String> {
    let mut rng = NumpyRandom::new(a.seed);
    mlx_core::random::seed(u64::from(a.seed)).map_err(|e| e.to_string())?;
    crate::common::out(format_args!("Loading model from {}...", a.model))?;
    // The one loader, as mlx_lm.perplexity's `load`: stored dtypes, no adapters.
    let loaded = mlx_engine::load::load(
        &crate::model::model_path(Some(&a.model))?,
        &LoadSpec::default(),
        &mut crate::model::Stderr::default(),
    )
    .map_err(|e| match e {
        LoadError::Model(e) => format!("{}: {e}", a.model),
        LoadError::Tokenizer { source, .. } => format!("{}: {source}", a.model),
        e => e.to_string(),
    })?;
    // mlx-lm's `get_total_parameters`, as `mlx info` counts it (from the weight files'
    // headers: packed quantized weights at their unpacked size).
    if let Ok(info) = mlx_engine::load::model_info(&loaded.path) {
        crate::common::out(format_args!(
            "Model loaded: {:.1}M parameters",
            info.parameters as f64 / 1e6
        ))?;
    }
    let (model, tok) = (loaded.model, loaded.tokenizer);
    crate::common::out(format_args!("\nLoading dataset..."))?;
    crate::common::out(format_args!("  Sequence length: {}", a.sequence_length))?;
    let (data, rows) = load_data(
        &tok,
        &a.data_path,
        a.num_samples,
        a.sequence_length,
        &mut rng,
    )?;
    crate::common::out(format_args!("  Loaded {rows} samples"))?;
    crate::common::out(format_args!(
        "\nEvaluating perplexity with batch size {}...",
        a.batch_size
    ))?;
    let start = Instant::now();
    let r = if a.decoder == "cpu" {
        eval_ppl_cpu(model.as_ref(), &data, rows, a.sequence_length)?
    } else {
        eval_ppl(model.as_ref(), &data, rows, a.sequence_length, a.batch_size)?
    };
    let secs = start.elapsed().as_secs_f64();
    let tokens_evaluated = rows * (a.sequence_length - 1);
    let peak = mlx_core::memory::peak_memory().unwrap_or(0) as f64 / 1e9;
    if a.json {
        let j = serde_json::json!({
            "model": a.model,
            "perplexity": r.perplexity,
            "standard_error": r.standard_error,
            "samples": rows,
            "tokens": data.len(),
            "tokens_evaluated": tokens_evaluated,
            "seconds": secs,
            "peak_memory_gb": peak,
        });
        crate::common::out(format_args!("{j}"))?;
        return Ok(());
    }
    crate::common::out(format_args!("\n{}", "=".repeat(60)))?;
    crate::common::out(format_args!("EVALUATION RESULTS"))?;
    crate::common::out(format_args!("{}", "=".repeat(60)))?;
    crate::common::out(format_args!("Model: {}", a.model))?;
    crate::common::out(format_args!(
        "Perplexity: {:.3} ± {:.3}",
        r.perplexity, r.standard_error
    ))?;
    crate::common::out(format_args!("Evaluation time: {secs:.2} seconds"))?;
    crate::common::out(format_args!("Peak memory: {peak:.2} GB"))?;
    crate::common::out(format_args!(
        "Tokens per second: {:.0}",
        tokens_evaluated as f64 / secs
    ))?;
    crate::common::out(format_args!("\nDataset statistics:"))?;
    crate::common::out(format_args!("  Total samples: {rows}"))?;
    crate::common::out(format_args!("  Total tokens: {}", data.len()))?;
    Ok(())
}
