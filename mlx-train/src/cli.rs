//! `mlx train`: mlx_lm.lora's options under the same names (`--model`, `--data`,
//! `--fine-tune-type`, `--num-layers`, ..., `-c config.yaml`), merged as mlx_lm.lora merges
//! them (command line over config file over `CONFIG_DEFAULTS`), plus `--objective`,
//! `--max-grad-norm` and `--log-file`. [`run`] trains with a progress line (loss, tokens/s)
//! on a terminal, a JSONL log, validation, checkpoints every `--save-every` steps, resume
//! from `--resume-adapter-file`, and `--test` evaluation. The `mlx` binary wires it in.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use mlx_models::LanguageModel;
use serde_json::{Map, Value};

use crate::adapters::load_adapters;
use crate::data::load_local_dataset;
use crate::error::{io_err, Result, TrainError};
use crate::nprand::NumpyRandom;
use crate::run::{objective_loss, train_model, RunConfig};
use crate::tokenize;
use crate::trainer::{evaluate, TrainReport, TrainingCallback, ValReport};

/// `println!` for the training's report lines, except that a failed write (a closed pipe:
/// `mlx train ... | head -3`) is ignored: training goes on and saves its adapters, where
/// `println!` would panic and lose the run.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// LoRA or QLoRA finetuning (the options of `mlx_lm.lora`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TrainArgs {
    /// The path to the local model directory.
    #[arg(long)]
    pub model: Option<String>,
    /// Do training (the default when `--test` is not given).
    #[arg(long)]
    pub train: bool,
    /// Directory with {train, valid, test}.jsonl files.
    #[arg(long)]
    pub data: Option<String>,
    /// Type of fine-tuning to perform: lora, dora, or full.
    #[arg(long, value_parser = ["lora", "dora", "full"])]
    pub fine_tune_type: Option<String>,
    /// Optimizer to use for training.
    #[arg(long, value_parser = ["adam", "adamw", "muon", "sgd", "adafactor"])]
    pub optimizer: Option<String>,
    /// Mask the prompt in the loss when training.
    #[arg(long)]
    pub mask_prompt: bool,
    /// Number of layers to fine-tune (-1: all).
    #[arg(long, allow_hyphen_values = true)]
    pub num_layers: Option<i32>,
    /// Minibatch size.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Iterations to train for.
    #[arg(long)]
    pub iters: Option<usize>,
    /// Number of validation batches, -1 uses the entire validation set.
    #[arg(long, allow_hyphen_values = true)]
    pub val_batches: Option<i64>,
    /// Adam learning rate.
    #[arg(long)]
    pub learning_rate: Option<f64>,
    /// Number of training steps between loss reporting.
    #[arg(long)]
    pub steps_per_report: Option<usize>,
    /// Number of training steps between validations.
    #[arg(long)]
    pub steps_per_eval: Option<usize>,
    /// Number of steps to accumulate gradients before an optimizer update.
    #[arg(long)]
    pub grad_accumulation_steps: Option<usize>,
    /// Load path to resume training from the given fine-tuned weights. With the state saved
    /// beside them (X.optimizer.safetensors, X.resume.json, written with every
    /// adapters.safetensors), the run continues the iteration count, the learning-rate
    /// schedule, the optimizer state and the data order; --iters counts the new iterations.
    #[arg(long)]
    pub resume_adapter_file: Option<String>,
    /// Replace files of an earlier run in --adapter-path (adapter_config.json, adapters,
    /// numbered checkpoints). Without it such a file is an error before training starts;
    /// a run resumed from ADAPTER_PATH/adapters.safetensors with its state continues that
    /// file and keeps its weights as the numbered checkpoint of their iteration.
    #[arg(long)]
    pub overwrite: bool,
    /// Save/load path for the fine-tuned weights.
    #[arg(long)]
    pub adapter_path: Option<String>,
    /// Save the model every N iterations.
    #[arg(long)]
    pub save_every: Option<usize>,
    /// Evaluate on the test set after training.
    #[arg(long)]
    pub test: bool,
    /// Number of test set batches, -1 uses the entire test set.
    #[arg(long, allow_hyphen_values = true)]
    pub test_batches: Option<i64>,
    /// Maximum sequence length.
    #[arg(long)]
    pub max_seq_length: Option<usize>,
    /// A YAML configuration file with the training options.
    #[arg(short = 'c', long)]
    pub config: Option<PathBuf>,
    /// Use gradient checkpointing to reduce memory use.
    #[arg(long)]
    pub grad_checkpoint: bool,
    /// The PRNG seed.
    #[arg(long)]
    pub seed: Option<u32>,
    /// Clear the allocator cache between steps if it grows past this size (bytes, or a size
    /// such as 500MB or 2G; default 0: clear whenever it holds anything).
    #[arg(long, value_parser = crate::run::parse_size)]
    pub clear_cache_threshold: Option<u64>,
    /// Services to report logs to (wandb, swanlab): not supported here (an error); the JSONL
    /// log holds the same reports.
    #[arg(long)]
    pub report_to: Option<String>,
    /// Project name for --report-to (recorded in adapter_config.json).
    #[arg(long)]
    pub project_name: Option<String>,
    /// Accepted for mlx_lm.lora's command lines; no model code is run from a model
    /// directory here, so it changes nothing (recorded in adapter_config.json).
    #[arg(long)]
    pub trust_remote_code: bool,
    /// Training objective: sft, or dpo / orpo on prompt/chosen/rejected data.
    #[arg(long, value_parser = ["sft", "dpo", "orpo"])]
    pub objective: Option<String>,
    /// DPO's beta or ORPO's lambda (default 0.1).
    #[arg(long)]
    pub beta: Option<f64>,
    /// Chunked cross-entropy: project logits this many positions at a time (SFT).
    #[arg(long)]
    pub ce_chunk_size: Option<i32>,
    /// Segmented backward: process the sequence in segments of this many tokens (SFT;
    /// composes with --grad-checkpoint and --ce-chunk-size).
    #[arg(long)]
    pub segment_length: Option<i32>,
    /// Clip gradients to this global norm before each update (off by default, as mlx-lm).
    #[arg(long)]
    pub max_grad_norm: Option<f64>,
    /// Flash attention with tiles of N tokens: the backward keeps no [L, L] probabilities.
    #[arg(long)]
    pub flash_block: Option<i32>,
    /// Which flash attention --flash-block runs: plain (MLX ops, the default), cuda (the
    /// CUDA kernels where MLX runs on an NVIDIA GPU), or sdpa (MLX's own SDPA with the
    /// queries padded to a multiple of 128 on CUDA, where its fused backward needs it; no
    /// --flash-block needed).
    #[arg(long, value_parser = ["plain", "cuda", "sdpa"])]
    pub flash_kernel: Option<String>,
    /// MLX's memory limit while training, in GB: past it, MLX waits for queued GPU work
    /// (and the buffers it holds) before scheduling more, trading some speed for a lower peak.
    #[arg(long)]
    pub memory_limit: Option<f64>,
    /// Where to write the JSONL log (default: ADAPTER_PATH/train_log.jsonl); appended to.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
}

/// Fuse fine-tuned adapters into the base model (the options of `mlx_lm.fuse`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct FuseArgs {
    /// The path to the local model directory (a GGUF base cannot be fused: the fused model
    /// is written as a safetensors directory).
    #[arg(long, default_value = "mlx_model")]
    pub model: String,
    /// The path to save the fused model.
    #[arg(long, default_value = "fused_model")]
    pub save_path: String,
    /// Path to the trained adapter weights and config.
    #[arg(long, default_value = "adapters")]
    pub adapter_path: String,
    /// Generate a dequantized model.
    #[arg(long)]
    pub dequantize: bool,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
}

/// `mlx fuse`.
pub fn run_fuse(args: &FuseArgs) -> Result<()> {
    mlx_core::partial::cleanup_on_interrupt();
    crate::adapters::fuse_model_dir(
        Path::new(&args.model),
        Path::new(&args.adapter_path),
        Path::new(&args.save_path),
        args.dequantize,
    )?;
    say!("Saved the fused model to {}.", args.save_path);
    Ok(())
}

/// For a standalone binary: `#[derive(Parser)] struct Cli { #[command(flatten)] args: TrainArgs }`.
impl TrainArgs {
    /// The options after mlx_lm.lora's merge: command line, then `-c` file, then defaults.
    pub fn resolve(&self) -> Result<RunConfig> {
        // JSON has no NaN or infinity (they would become `null`, read as "not given").
        for (name, v) in [
            ("--learning-rate", self.learning_rate),
            ("--beta", self.beta),
            ("--max-grad-norm", self.max_grad_norm),
            ("--memory-limit", self.memory_limit),
        ] {
            if let Some(v) = v.filter(|v| !v.is_finite()) {
                return Err(TrainError::Config(format!(
                    "{name} must be a finite number, got {v}"
                )));
            }
        }
        let mut map = match &self.config {
            Some(p) => read_config_file(p)?,
            None => Map::new(),
        };
        let mut set = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                map.insert(k.to_string(), v);
            }
        };
        let s = |v: &Option<String>| v.clone().map(Value::from);
        let flag = |b: bool| b.then_some(Value::Bool(true));
        set("model", s(&self.model));
        set("train", flag(self.train));
        set("data", s(&self.data));
        set("fine_tune_type", s(&self.fine_tune_type));
        set("optimizer", s(&self.optimizer));
        set("mask_prompt", flag(self.mask_prompt));
        set("num_layers", self.num_layers.map(Value::from));
        set("batch_size", self.batch_size.map(Value::from));
        set("iters", self.iters.map(Value::from));
        set("val_batches", self.val_batches.map(Value::from));
        set("learning_rate", self.learning_rate.map(Value::from));
        set("steps_per_report", self.steps_per_report.map(Value::from));
        set("steps_per_eval", self.steps_per_eval.map(Value::from));
        set(
            "grad_accumulation_steps",
            self.grad_accumulation_steps.map(Value::from),
        );
        set("resume_adapter_file", s(&self.resume_adapter_file));
        set("adapter_path", s(&self.adapter_path));
        set("save_every", self.save_every.map(Value::from));
        set("test", flag(self.test));
        set("test_batches", self.test_batches.map(Value::from));
        set("max_seq_length", self.max_seq_length.map(Value::from));
        set("grad_checkpoint", flag(self.grad_checkpoint));
        set("seed", self.seed.map(Value::from));
        set(
            "clear_cache_threshold",
            self.clear_cache_threshold.map(Value::from),
        );
        set("report_to", s(&self.report_to));
        set("project_name", s(&self.project_name));
        set("trust_remote_code", flag(self.trust_remote_code));
        set(
            "config",
            self.config
                .as_ref()
                .map(|p| Value::from(p.display().to_string())),
        );
        set("objective", s(&self.objective));
        set("beta", self.beta.map(Value::from));
        set("ce_chunk_size", self.ce_chunk_size.map(Value::from));
        set("segment_length", self.segment_length.map(Value::from));
        set("max_grad_norm", self.max_grad_norm.map(Value::from));
        set("flash_block", self.flash_block.map(Value::from));
        set("flash_kernel", s(&self.flash_kernel));
        set("memory_limit", self.memory_limit.map(Value::from));
        // `null` in a config file means "not given" (mlx_lm.lora's `args.get(k) is None`).
        map.retain(|_, v| !v.is_null());
        let what = self
            .config
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "options".into());
        let mut config: RunConfig =
            serde_json::from_value(Value::Object(map.clone())).map_err(|e| {
                // Name the option at fault: the first one that fails on its own.
                let field = map.iter().find_map(|(k, v)| {
                    let one = Map::from_iter([(k.clone(), v.clone())]);
                    serde_json::from_value::<RunConfig>(Value::Object(one))
                        .err()
                        .map(|e| format!("option `{k}`: {e}"))
                });
                TrainError::Config(format!(
                    "{what}: {}",
                    field.unwrap_or_else(|| e.to_string())
                ))
            })?;
        config.overwrite = self.overwrite;
        Ok(config)
    }
}

/// The largest training config file read (a config is a few hundred bytes; `-c /dev/zero`
/// must not read forever).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A YAML (or JSON, a subset) file of options.
fn read_config_file(path: &Path) -> Result<Map<String, Value>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| io_err(path, e))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(io_err(
            path,
            format!("larger than {MAX_CONFIG_BYTES} bytes; not a training config"),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        io_err(
            path,
            format!(
                "not UTF-8 text (bad byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    let v: Value =
        serde_yaml_ng::from_str(&text).map_err(|e| io_err(path, format!("invalid YAML: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        Value::Null => Ok(Map::new()),
        _ => Err(io_err(path, "expected a mapping of option names to values")),
    }
}

/// The reports of a run: a progress line on a terminal, a line per report on stdout, and
/// the JSONL log.
struct Reporter {
    log: Option<std::fs::File>,
    log_path: PathBuf,
    first: usize,
    iters: usize,
    tty: bool,
    tokens: i64,
    started: std::time::Instant,
    error: Option<TrainError>,
}

impl Reporter {
    fn write(&mut self, v: Value) {
        if let Some(f) = &mut self.log {
            if let Err(e) = writeln!(f, "{v}") {
                self.error.get_or_insert(io_err(&self.log_path, e));
                self.log = None;
            }
        }
    }
}

impl TrainingCallback for Reporter {
    fn on_start(&mut self, first: usize, last: usize) {
        self.first = first;
        self.write(serde_json::json!({"event": "start", "iteration": first, "last": last}));
    }

    fn on_step(&mut self, it: usize, loss: f32, tokens: i64) {
        self.tokens += tokens;
        if self.tty {
            let tps = self.tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
            let width = 30;
            let done = (width * (it + 1).saturating_sub(self.first) / self.iters.max(1)).min(width);
            eprint!(
                "\rtrain [{}{}] {it}/{} loss {loss:.3} {tps:.0} tok/s ",
                "#".repeat(done),
                "-".repeat(width - done),
                self.first + self.iters.saturating_sub(1)
            );
            let _ = std::io::stderr().flush();
        }
    }

    fn on_train_loss_report(&mut self, r: &TrainReport) {
        if self.tty {
            eprintln!();
        }
        say!(
            "Iter {}: Train loss {:.3}, Learning Rate {:.3e}, It/sec {:.3}, Tokens/sec {:.3}, \
             Trained Tokens {}, Peak mem {:.3} GB",
            r.iteration,
            r.train_loss,
            r.learning_rate,
            r.iterations_per_second,
            r.tokens_per_second,
            r.trained_tokens,
            r.peak_memory
        );
        let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("event".into(), "train".into());
        }
        self.write(v);
    }

    fn on_val_loss_report(&mut self, r: &ValReport) {
        if self.tty {
            eprintln!();
        }
        say!(
            "Iter {}: Val loss {:.3}, Val took {:.3}s",
            r.iteration + 1,
            r.val_loss,
            r.val_time
        );
        let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("event".into(), "val".into());
        }
        self.write(v);
    }

    fn on_save(&mut self, it: usize, path: &Path) {
        if self.tty {
            eprintln!();
        }
        say!("Iter {it}: Saved adapter weights to {}.", path.display());
        self.write(serde_json::json!({"event": "save", "iteration": it, "path": path.display().to_string()}));
    }
}

/// `mlx train`: trains (unless only `--test` is given) and evaluates with `--test`.
pub fn run(args: &TrainArgs) -> Result<()> {
    run_in(args, crate::data::World::single())
}

/// [`run`] as rank `world.rank` of `world.size` data-parallel processes (`mlx launch -n N
/// -- train ...`): the batch size must divide by the world size; only rank 0 writes the
/// adapters, checkpoints and log.
pub fn run_in(args: &TrainArgs, world: crate::data::World) -> Result<()> {
    let mut config = args.resolve()?;
    config.world = world;
    let train = config.train || !config.test;
    if train {
        // Ctrl-C during a checkpoint leaves no partial file.
        mlx_core::partial::cleanup_on_interrupt();
        // A file of an earlier run this one would replace: an error before anything loads.
        let _ = crate::run::plan_outputs(&config)?;
        let adapter_path = PathBuf::from(&config.adapter_path);
        std::fs::create_dir_all(&adapter_path).map_err(|e| io_err(&adapter_path, e))?;
        let log_path = args
            .log_file
            .clone()
            .unwrap_or_else(|| adapter_path.join("train_log.jsonl"));
        // Appended to: a resumed run's reports follow the earlier run's.
        let log = if config.world.rank == 0 {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|e| io_err(&log_path, e))?;
            Some(f)
        } else {
            None
        };
        let mut rep = Reporter {
            log,
            log_path,
            first: 1,
            iters: config.iters,
            tty: std::io::stderr().is_terminal(),
            tokens: 0,
            started: std::time::Instant::now(),
            error: None,
        };
        let (mut p, _) = train_model(&config, &mut rep)?;
        if let Some(e) = rep.error.take() {
            return Err(e);
        }
        say!(
            "Saved final weights to {}.",
            adapter_path.join("adapters.safetensors").display()
        );
        if config.test {
            test(&config, p.model.as_ref(), &p.params, &p.test, &mut p.rng)?;
        }
    } else {
        let loaded = tokenize::load_model(&config.model)?;
        let (mut model, tok) = (loaded.model, loaded.tokenizer);
        let params = load_adapters(model.as_mut(), Path::new(&config.adapter_path))?;
        let (_, _, test_set) =
            load_local_dataset(Path::new(&config.data), &tok, &config.data_config())?;
        let mut rng = NumpyRandom::new(config.seed);
        test(&config, model.as_ref(), &params, &test_set, &mut rng)?;
    }
    Ok(())
}

fn test(
    config: &RunConfig,
    model: &dyn LanguageModel,
    params: &crate::Params,
    test_set: &crate::data::Dataset,
    rng: &mut NumpyRandom,
) -> Result<()> {
    if test_set.is_empty() {
        return Err(TrainError::Config(
            "Test set not found or empty. Must provide test set for evaluation.".into(),
        ));
    }
    let loss = objective_loss(config, params)?;
    let test_loss = evaluate(
        model,
        params,
        test_set,
        config.batch_size,
        config.test_batches,
        config.max_seq_length,
        loss.as_ref(),
        rng,
        Some(config.clear_cache_threshold),
        config.world,
    )?;
    say!("Test loss {test_loss:.3}, Test ppl {:.3}.", test_loss.exp());
    Ok(())
}
