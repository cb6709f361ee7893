//! `mlx_lm.lora --train` as a library call: the options under mlx-lm's names and defaults
//! ([`RunConfig`], also what `adapter_config.json` holds), and [`train_model`], which does
//! what mlx-lm's `run` + `train_model` do, in the same order (numpy seed, load, datasets,
//! `mx.random.seed`, adapters, resume, config file, optimizer, `train`).

use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_models::LanguageModel;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::adapters::{load_adapter_weights, save_adapter_config};
use crate::attention::{with_flash_attention, FlashKernel};
use crate::data::{load_local_dataset, DataConfig, Dataset};
use crate::error::{io_err, Result, TrainError};
use crate::full::{load_resume, FullModel};
use crate::lora::{linear_to_lora_layers, LoraConfig};
use crate::loss::{chunked_loss, default_loss};
use crate::memory::MemoryLimit;
use crate::nprand::NumpyRandom;
use crate::objectives::{dpo_loss, orpo_loss, reference_logps};
use crate::optim::{build_schedule, LearningRate, Method, Optimizer, ScheduleConfig};
use crate::params::Params;
use crate::resume::{
    checkpoint_path, load_state, optimizer_path, peek_iteration, same_file, state_path, NoResume,
    Outputs, ResumeState,
};
use crate::tokenize;
use crate::trainer::{train, LossFn, TrainOutcome, TrainingArgs, TrainingCallback};

fn d_model() -> String {
    "Qwen/Qwen3-0.6b".into()
}
fn d_ftt() -> String {
    "lora".into()
}
fn d_opt() -> String {
    "adam".into()
}
fn d_data() -> String {
    "mlx-community/WikiSQL".into()
}
fn d_num_layers() -> i32 {
    16
}
fn d_batch() -> usize {
    4
}
fn d_iters() -> usize {
    1000
}
fn d_val_batches() -> i64 {
    25
}
fn d_lr() -> f64 {
    1e-5
}
fn d_report() -> usize {
    10
}
fn d_eval() -> usize {
    200
}
fn d_adapter_path() -> String {
    "adapters".into()
}
fn d_save_every() -> usize {
    100
}
fn d_test_batches() -> i64 {
    500
}
fn d_max_seq() -> usize {
    2048
}
fn d_one() -> usize {
    1
}
fn d_objective() -> String {
    "sft".into()
}
fn d_beta() -> f64 {
    0.1
}
fn yes() -> bool {
    true
}

/// mlx-lm's `_parse_size`: digits (with a decimal point) then an optional unit, `M` or `MB`
/// (10^6) or `G` or `GB` (10^9), in any case, spaces allowed before it; the bytes rounded
/// down. `"1.5G"` is 1,500,000,000.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale: u64 = match unit.trim().to_uppercase().as_str() {
        "" => 1,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{text}`: unknown size unit `{other}` (M, MB, G or GB)"
            ))
        }
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(format!("`{text}` is not a size such as 500MB or 2G"));
    }
    let too_big = || format!("`{text}` is too large a size");
    let w: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_big())?
    };
    let mut bytes = w.checked_mul(scale).ok_or_else(too_big)?;
    // The fraction, digit by digit, exactly (no float rounding): `int(Decimal * scale)`.
    let mut unit_part = scale;
    for d in frac.bytes() {
        unit_part /= 10;
        if unit_part == 0 {
            break;
        }
        bytes = bytes
            .checked_add(u64::from(d - b'0') * unit_part)
            .ok_or_else(too_big)?;
    }
    Ok(bytes)
}

fn size_or_bytes<'de, D>(d: D) -> std::result::Result<u64, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error;
    match Option::<Value>::deserialize(d)? {
        None => Ok(0),
        Some(Value::String(s)) => parse_size(&s).map_err(D::Error::custom),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            D::Error::custom(format!(
                "{n} is not a size in bytes (a whole number, 0 or more)"
            ))
        }),
        Some(other) => Err(D::Error::custom(format!(
            "{other} is not a size (bytes, or a string such as \"2G\")"
        ))),
    }
}

fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// mlx_lm.lora's options (`CONFIG_DEFAULTS`), by their config-file names. Unknown keys are
/// kept in `extra` (and written back to `adapter_config.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunConfig {
    #[serde(default = "d_model")]
    pub model: String,
    #[serde(default)]
    pub train: bool,
    #[serde(default = "d_ftt")]
    pub fine_tune_type: String,
    #[serde(default = "d_opt")]
    pub optimizer: String,
    #[serde(default)]
    pub optimizer_config: Map<String, Value>,
    #[serde(default = "d_data")]
    pub data: String,
    #[serde(default)]
    pub seed: u32,
    #[serde(default = "d_num_layers")]
    pub num_layers: i32,
    #[serde(default = "d_batch")]
    pub batch_size: usize,
    #[serde(default = "d_iters")]
    pub iters: usize,
    #[serde(default = "d_val_batches")]
    pub val_batches: i64,
    #[serde(default = "d_lr")]
    pub learning_rate: f64,
    #[serde(default = "d_report")]
    pub steps_per_report: usize,
    #[serde(default = "d_eval")]
    pub steps_per_eval: usize,
    #[serde(default)]
    pub resume_adapter_file: Option<String>,
    #[serde(default = "d_adapter_path")]
    pub adapter_path: String,
    #[serde(default = "d_save_every")]
    pub save_every: usize,
    #[serde(default)]
    pub test: bool,
    #[serde(default = "d_test_batches")]
    pub test_batches: i64,
    #[serde(default = "d_max_seq")]
    pub max_seq_length: usize,
    #[serde(default)]
    pub grad_checkpoint: bool,
    #[serde(default = "d_one")]
    pub grad_accumulation_steps: usize,
    #[serde(default)]
    pub lr_schedule: Option<ScheduleConfig>,
    /// `null` (what a full run's `adapter_config.json` holds) reads as the defaults.
    #[serde(default, deserialize_with = "null_as_default")]
    pub lora_parameters: LoraConfig,
    #[serde(default)]
    pub mask_prompt: bool,
    /// Clear MLX's allocator cache after each training step and each evaluation batch when it
    /// holds more than this many bytes (`0`: whenever it holds any). In a config file, a
    /// number of bytes or a size such as `"2G"` or `"500MB"` (see [`parse_size`]). mlx-lm
    /// 0.32.2 records the option but its `train_model` never passes it on, so it always
    /// clears at 0; here the value is honoured. It changes no values, only memory held.
    #[serde(default, deserialize_with = "size_or_bytes")]
    pub clear_cache_threshold: u64,
    /// mlx-lm's `report_to` (`wandb`, `swanlab`): not supported here, so anything but
    /// `null` is an error; the JSONL log records the same reports.
    #[serde(default)]
    pub report_to: Option<String>,
    /// mlx-lm's `project_name` for `report_to`; recorded only.
    #[serde(default)]
    pub project_name: Option<String>,
    /// mlx-lm's `trust_remote_code`; recorded only (no model code is ever run from a model
    /// directory here).
    #[serde(default)]
    pub trust_remote_code: bool,
    /// The `-c` config file the options came from, as mlx_lm.lora records it.
    #[serde(default)]
    pub config: Option<String>,
    /// Not in mlx-lm: the training objective, `sft`, `dpo` or `orpo` (the last two on
    /// `prompt`/`chosen`/`rejected` data).
    #[serde(default = "d_objective")]
    pub objective: String,
    /// Not in mlx-lm: DPO's beta or ORPO's lambda.
    #[serde(default = "d_beta")]
    pub beta: f64,
    /// Not in mlx-lm: project the logits this many positions at a time in the SFT loss
    /// (chunked cross-entropy; see [`crate::loss::chunked_loss`]).
    #[serde(default)]
    pub ce_chunk_size: Option<i32>,
    /// Not in mlx-lm: segmented backward with segments of this many tokens (SFT).
    #[serde(default)]
    pub segment_length: Option<i32>,
    /// Not in mlx-lm: clip gradients to this global norm.
    #[serde(default)]
    pub max_grad_norm: Option<f64>,
    /// Not in mlx-lm: flash attention with tiles of this many tokens (see
    /// [`crate::attention`]).
    #[serde(default)]
    pub flash_block: Option<i32>,
    /// Not in mlx-lm: which flash attention `flash_block` runs, `plain` (MLX ops, every
    /// back-end; the default) or `cuda` (the CUDA kernels of `mlx_kernels::flash_cuda` where
    /// MLX runs CUDA kernels and the head dims suit them, the plain path elsewhere); or `sdpa`
    /// (MLX's SDPA, queries padded for its fused CUDA backward; see `attention::padded_sdpa`).
    #[serde(default)]
    pub flash_kernel: Option<String>,
    /// Not in mlx-lm: MLX's memory limit while training, in GB (10^9 bytes); see
    /// [`crate::memory::MemoryLimit`].
    #[serde(default)]
    pub memory_limit: Option<f64>,
    /// Not in mlx-lm, and not recorded: whether the run may replace files that exist
    /// already and that it does not continue (see [`crate::resume::Outputs`]). `true` (as
    /// mlx-lm's `train`) unless set; `mlx train` sets it from `--overwrite`.
    #[serde(skip, default = "yes")]
    pub overwrite: bool,
    /// Not in mlx-lm's options, and not recorded: this process's place among data-parallel
    /// ranks (`mlx launch ... -- train` sets it from MLX's group; one process otherwise).
    #[serde(skip)]
    pub world: crate::data::World,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl RunConfig {
    /// The options as a JSON object (what `adapter_config.json` records).
    pub fn to_json(&self) -> Result<Map<String, Value>> {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut m)) => {
                if self.fine_tune_type == "full" {
                    // mlx_lm.lora sets `args.lora_parameters = None` before saving the config.
                    m.insert("lora_parameters".into(), Value::Null);
                }
                Ok(m)
            }
            Ok(_) => Err(TrainError::Config(
                "options do not serialize to an object".into(),
            )),
            Err(e) => Err(TrainError::Config(format!("serializing the options: {e}"))),
        }
    }

    /// Reads an `adapter_config.json` or a JSON config file.
    pub fn from_json_file(path: &Path) -> Result<RunConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
        serde_json::from_str(&text).map_err(|e| io_err(path, format!("invalid: {e}")))
    }

    pub fn data_config(&self) -> DataConfig {
        let s = |k: &str, d: &str| {
            self.extra
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or(d)
                .to_string()
        };
        DataConfig {
            mask_prompt: self.mask_prompt,
            prompt_feature: s("prompt_feature", "prompt"),
            completion_feature: s("completion_feature", "completion"),
            text_feature: s("text_feature", "text"),
            chat_feature: s("chat_feature", "messages"),
        }
    }

    pub fn training_args(&self) -> TrainingArgs {
        TrainingArgs {
            batch_size: self.batch_size,
            iters: self.iters,
            val_batches: self.val_batches,
            steps_per_report: self.steps_per_report,
            steps_per_eval: self.steps_per_eval,
            steps_per_save: self.save_every,
            max_seq_length: self.max_seq_length,
            adapter_file: PathBuf::from(&self.adapter_path).join("adapters.safetensors"),
            grad_accumulation_steps: self.grad_accumulation_steps,
            max_grad_norm: self.max_grad_norm,
            segment_length: self.segment_length,
            ce_chunk_size: self.ce_chunk_size,
            clear_cache_threshold: Some(self.clear_cache_threshold),
            // mlx-lm's step is compiled; DPO and ORPO (not in mlx-lm) read the reference
            // model through the disabled parameters, which a trace does not capture.
            compile: self.lora_parameters.dropout == 0.0 && self.objective == "sft",
            outputs: Outputs::new(self.overwrite, Vec::new()),
            world: self.world,
            ..TrainingArgs::default()
        }
    }

    /// The optimizer mlx-lm's `train_model` builds.
    pub fn build_optimizer(&self) -> Result<Optimizer> {
        let name = self.optimizer.to_lowercase();
        let cfg = match self.optimizer_config.get(&name) {
            None => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                return Err(TrainError::Config(format!(
                    "optimizer_config.{name} must be a mapping"
                )))
            }
        };
        let method = Method::from_config(&name, &cfg)?;
        let lr = match &self.lr_schedule {
            Some(s) => LearningRate::Scheduled(build_schedule(s)?),
            None => LearningRate::Constant(self.learning_rate),
        };
        Optimizer::new(method, lr)
    }

    /// The options' own consistency (no files read).
    pub fn validate(&self) -> Result<()> {
        match self.fine_tune_type.as_str() {
            "lora" | "dora" | "full" => {}
            other => {
                return Err(TrainError::Config(format!(
                    "Received unknown fine-tune-type {other}"
                )))
            }
        }
        if !["sft", "dpo", "orpo"].contains(&self.objective.as_str()) {
            return Err(TrainError::Config(format!(
                "unknown objective `{}` (sft, dpo, orpo)",
                self.objective
            )));
        }
        if self.ce_chunk_size.is_some_and(|c| c <= 0) {
            return Err(TrainError::Config("ce_chunk_size must be positive".into()));
        }
        if self.ce_chunk_size.is_some() && self.objective != "sft" {
            return Err(TrainError::Config(
                "ce_chunk_size applies to the sft objective only".into(),
            ));
        }
        if let Some(s) = self.segment_length {
            if s <= 0 {
                return Err(TrainError::Config("segment_length must be positive".into()));
            }
            if self.objective != "sft" {
                return Err(TrainError::Config(
                    "segment_length applies to the sft objective only".into(),
                ));
            }
        }
        if let Some(b) = self.flash_block {
            crate::attention::check_block(b)?;
        }
        crate::attention::FlashKernel::parse(self.flash_kernel.as_deref())?;
        if let Some(gb) = self.memory_limit {
            crate::memory::MemoryLimit::bytes(gb)?;
        }
        if !self.beta.is_finite() {
            return Err(TrainError::Config("beta must be finite".into()));
        }
        if let Some(hf) = self.extra.get("hf_dataset").filter(|v| !v.is_null()) {
            return Err(TrainError::Config(format!(
                "hf_dataset ({hf}): datasets from the Hugging Face hub are not fetched here; save \
                 its splits as train.jsonl, valid.jsonl and test.jsonl in a directory and pass \
                 that directory as --data"
            )));
        }
        if let Some(r) = self.report_to.as_deref().filter(|r| !r.trim().is_empty()) {
            return Err(TrainError::Config(format!(
                "report_to `{r}`: reporting to wandb or swanlab is not supported here; the \
                 JSONL log (--log-file, default ADAPTER_PATH/train_log.jsonl) holds the same \
                 reports"
            )));
        }
        self.lora_parameters.validate()
    }
}

/// A model ready to train: the model with its adapters, their parameters, the data and
/// numpy's global generator as `run` leaves them.
pub struct Prepared {
    pub model: Box<dyn LanguageModel>,
    pub params: Params,
    pub train: Dataset,
    pub valid: Dataset,
    pub test: Dataset,
    pub rng: NumpyRandom,
    /// The state saved with `resume_adapter_file`, when there is a usable one.
    pub resume: Option<ResumeState>,
    /// The files the run may write (`adapter_config.json` already written).
    pub outputs: Outputs,
}

/// The adapter file a run writes (`adapter_path/adapters.safetensors`).
pub fn adapter_file(config: &RunConfig) -> PathBuf {
    PathBuf::from(&config.adapter_path).join("adapters.safetensors")
}

/// Where a run starts and what it may replace, decided before anything is loaded or
/// written: the iteration a resume continues from (when its state says so), the files the
/// run continues, and, unless `overwrite`, an error naming the first file of an earlier
/// run that this one would replace.
pub fn plan_outputs(config: &RunConfig) -> Result<(std::result::Result<usize, NoResume>, Outputs)> {
    let file = adapter_file(config);
    let config_file = PathBuf::from(&config.adapter_path).join("adapter_config.json");
    let start = match &config.resume_adapter_file {
        Some(f) => peek_iteration(Path::new(f)),
        None => Err(NoResume::NotResuming),
    };
    let continues = config
        .resume_adapter_file
        .as_deref()
        .is_some_and(|f| same_file(Path::new(f), &file));
    let continued = match (continues, &start) {
        // Resuming from the adapter file with its state: the run carries that file, its
        // state and its config forward (the file's weights are kept as the numbered
        // checkpoint of their iteration, see `keep_resumed_weights`).
        (true, Ok(_)) => vec![
            file.clone(),
            optimizer_path(&file),
            state_path(&file),
            config_file.clone(),
        ],
        _ => Vec::new(),
    };
    let mut continued = continued;
    // A config beside no adapters (a run that stopped before its first save) describes
    // nothing: replacing it loses nothing.
    let has_adapters = file.exists()
        || std::fs::read_dir(&config.adapter_path).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with("_adapters.safetensors")
            })
        });
    if !has_adapters {
        continued.push(config_file.clone());
    }
    let outputs = Outputs::new(config.overwrite, continued);
    if config.overwrite {
        return Ok((start, outputs));
    }
    for f in [
        &config_file,
        &file,
        &optimizer_path(&file),
        &state_path(&file),
    ] {
        outputs.check(f).map_err(|e| match (&e, continues) {
            (TrainError::Io { path, .. }, true) if *f == file => TrainError::Io {
                path: path.clone(),
                message: format!(
                    "resuming into the directory it came from, this run would replace it, and \
                     its iteration is not known ({}) to keep it as a numbered checkpoint; pass \
                     --overwrite to replace it, or choose another --adapter-path",
                    start
                        .as_ref()
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                ),
            },
            _ => e,
        })?;
    }
    // The numbered checkpoints this run will write.
    let first = *start.as_ref().unwrap_or(&0);
    let last = first.saturating_add(config.iters);
    let save = config.save_every.max(1);
    if let Ok(entries) = std::fs::read_dir(&config.adapter_path) {
        let mut clashes: Vec<usize> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let it = name.to_str()?.strip_suffix("_adapters.safetensors")?;
                (it.len() == 7 && it.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| it.parse::<usize>().ok())?
            })
            .filter(|&it| it > first && it <= last && it % save == 0)
            .collect();
        clashes.sort_unstable();
        if let Some(&it) = clashes.first() {
            outputs.check(&checkpoint_path(&file, it))?;
        }
    }
    Ok((start, outputs))
}

/// Before a run that continues `adapter_file` (resumed from it, at iteration `it`) replaces
/// it: its weights stay as the numbered checkpoint of that iteration (a hard link, else a
/// copy), unless that checkpoint exists already.
fn keep_resumed_weights(adapter_file: &Path, it: usize, outputs: &mut Outputs) -> Result<()> {
    let keep = checkpoint_path(adapter_file, it);
    if std::fs::symlink_metadata(&keep).is_ok() {
        return Ok(());
    }
    outputs.claim(&keep)?;
    if std::fs::hard_link(adapter_file, &keep).is_err() {
        std::fs::copy(adapter_file, &keep).map_err(|e| io_err(&keep, e))?;
    }
    Ok(())
}

/// `run` up to `train`: seeds, loads the model, tokenizer and data, wraps the linears
/// (after `mx.random.seed(seed)`), loads `resume_adapter_file`, and writes
/// `adapter_config.json` into `adapter_path`.
pub fn prepare(config: &RunConfig) -> Result<Prepared> {
    config.validate()?;
    let (start, mut outputs) = plan_outputs(config)?;
    let rng = NumpyRandom::new(config.seed);
    let loaded = tokenize::load_model(&config.model)?;
    let (mut model, tok) = (loaded.model, loaded.tokenizer);
    let data_dir = Path::new(&config.data);
    let (train_set, valid, test) = load_local_dataset(data_dir, &tok, &config.data_config())?;
    let preference = config.objective != "sft";
    for (name, set) in [("train", &train_set), ("valid", &valid), ("test", &test)] {
        if set
            .examples
            .iter()
            .any(|e| e.rejected.is_some() != preference)
        {
            return Err(io_err(
                &data_dir.join(format!("{name}.jsonl")),
                if preference {
                    format!(
                        "--objective {} needs prompt/chosen/rejected rows",
                        config.objective
                    )
                } else {
                    "prompt/chosen/rejected rows need --objective dpo or orpo".to_string()
                },
            ));
        }
    }
    if train_set.is_empty() {
        return Err(io_err(
            data_dir,
            "Training set not found or empty. Must provide training set for fine-tuning.",
        ));
    }
    random::seed(u64::from(config.seed))?;
    // `len(model.layers)`.
    let n_layers = if config.fine_tune_type == "full" {
        crate::full::decoder_layer_count(model.as_mut())?
    } else {
        let adaptable = model
            .as_trainable_mut()
            .map_or(0, |t| t.layer_adaptables_mut().len());
        match adaptable {
            0 => model.num_layers(),
            n => n,
        }
    };
    if config.num_layers > n_layers as i32 {
        return Err(TrainError::Config(format!(
            "Requested to train {} layers but the model only has {n_layers} layers.",
            config.num_layers,
        )));
    }
    let params = Params::new();
    if config.fine_tune_type == "full" {
        // DPO's reference runs the model with `params` disabled: the untrained layers.
        let keep_base = config.objective == "dpo";
        model = Box::new(FullModel::new(
            model,
            config.num_layers,
            &params,
            keep_base,
        )?);
    } else {
        linear_to_lora_layers(
            model.as_mut(),
            config.num_layers,
            &config.lora_parameters,
            config.fine_tune_type == "dora",
            &params,
        )?;
    }
    if config.grad_checkpoint
        && !model
            .as_trainable_mut()
            .is_some_and(|t| t.set_grad_checkpoint(true))
    {
        return Err(TrainError::Config(format!(
            "--grad-checkpoint is not supported for model_type {}",
            model.model_type()
        )));
    }
    let mut resume = None;
    if let Some(f) = &config.resume_adapter_file {
        if config.fine_tune_type == "full" {
            load_resume(model.as_mut(), Path::new(f), &params)?;
        } else {
            load_adapter_weights(Path::new(f), &params)?;
        }
        let mut notes = Vec::new();
        resume = load_state(Path::new(f), &params.snapshot(), &mut notes)?;
        match (&resume, &start) {
            (Some(r), Ok(it)) if r.iteration == *it => {}
            (None, Err(_)) => {}
            _ => {
                return Err(io_err(
                    Path::new(f),
                    "its resume state changed while the run was starting",
                ))
            }
        }
        let why = notes.join("; ");
        match &resume {
            None => eprintln!(
                "{f}: no saved training state ({why}): the optimizer starts fresh and the \
                 iterations are numbered from 1, as mlx_lm.lora does."
            ),
            Some(r) if r.optimizer.is_none() => eprintln!(
                "{f}: no saved optimizer state ({why}): continuing at iteration {} with a \
                 fresh optimizer at step {}.",
                r.iteration + 1,
                r.optimizer_step
            ),
            Some(r) => eprintln!(
                "{f}: continuing at iteration {} with the saved optimizer state.",
                r.iteration + 1
            ),
        }
    }
    let adapter_path = Path::new(&config.adapter_path);
    std::fs::create_dir_all(adapter_path).map_err(|e| io_err(adapter_path, e))?;
    // Data-parallel ranks other than 0 write nothing (they share rank 0's files).
    if config.world.rank == 0 {
        if let (Some(r), Some(f)) = (&resume, &config.resume_adapter_file) {
            let file = adapter_file(config);
            if same_file(Path::new(f), &file) {
                keep_resumed_weights(&file, r.iteration, &mut outputs)?;
            }
        }
        let config_file = adapter_path.join("adapter_config.json");
        outputs.claim(&config_file)?;
        save_adapter_config(&config_file, &config.to_json()?)?;
    }
    Ok(Prepared {
        model,
        params,
        train: train_set,
        valid,
        test,
        rng,
        resume,
        outputs,
    })
}

/// The loss of `config.objective`: mlx-lm's `default_loss`, DPO or ORPO.
pub fn objective_loss(config: &RunConfig, params: &Params) -> Result<Box<LossFn>> {
    let beta = config.beta;
    Ok(match config.objective.as_str() {
        "sft" => match config.ce_chunk_size {
            Some(c) => Box::new(move |m: &dyn LanguageModel, b: &Array, l: &Array| {
                chunked_loss(m, b, l, c)
            }),
            None => Box::new(|m: &dyn LanguageModel, b: &Array, l: &Array| default_loss(m, b, l)),
        },
        "dpo" => {
            let params = params.clone();
            Box::new(move |m: &dyn LanguageModel, b: &Array, l: &Array| {
                let r = reference_logps(m, &params, b, l)?;
                dpo_loss(m, b, l, &r, beta)
            })
        }
        "orpo" => {
            Box::new(move |m: &dyn LanguageModel, b: &Array, l: &Array| orpo_loss(m, b, l, beta))
        }
        other => return Err(TrainError::Config(format!("unknown objective `{other}`"))),
    })
}

/// `mlx_lm.lora --train`: [`prepare`], then [`train`] with the objective's loss.
pub fn train_model(
    config: &RunConfig,
    callback: &mut dyn TrainingCallback,
) -> Result<(Prepared, TrainOutcome)> {
    let mut p = prepare(config)?;
    let mut optimizer = config.build_optimizer()?;
    let mut args = config.training_args();
    args.outputs = p.outputs.clone();
    if let Some(r) = p.resume.take() {
        args.start_iteration = r.iteration;
        let mut saved = r.optimizer;
        if let Some(state) = &mut saved {
            // The current options' learning rate (a constant, or the schedule at the
            // restored step) rather than the saved one.
            state.remove("learning_rate");
            let names: std::collections::BTreeSet<String> = state.keys().cloned().collect();
            if names.len() == 1 {
                // Only the step: no update was made yet, the state is a fresh one.
                saved = None;
            } else if names != optimizer.state_names(&p.params.snapshot())? {
                eprintln!(
                    "the saved optimizer state is not that of --optimizer {} over these \
                     parameters: the optimizer starts fresh at step {}.",
                    config.optimizer, r.optimizer_step
                );
                saved = None;
            }
        }
        match saved {
            Some(state) => optimizer.load_state_map(&state)?,
            None => optimizer.set_step(r.optimizer_step)?,
        }
        p.rng = r.rng;
        // Data that changed since (another number of batches) starts a fresh batch order,
        // drawn from the restored generator.
        let mut check =
            crate::data::BatchIter::new(&p.train, config.batch_size, config.max_seq_length, true)?;
        if check.restore(&r.batches) {
            args.resume_batches = Some(r.batches);
        } else {
            eprintln!(
                "the training data has {} batches of {} now, the saved batch order {}: \
                 starting a fresh order.",
                check.num_batches(),
                config.batch_size,
                r.batches.num_batches
            );
        }
        args.resume_grad_accum = r.grad_accum;
        if let Some(k) = &r.random_key {
            random::set_state(k)?;
        }
    }
    let loss = objective_loss(config, &p.params)?;
    let kernel = FlashKernel::parse(config.flash_kernel.as_deref())?;
    let _limit = MemoryLimit::set(config.memory_limit)?;
    let outcome = with_flash_attention(config.flash_block, kernel, || {
        train(
            p.model.as_ref(),
            &p.params,
            optimizer,
            &p.train,
            &p.valid,
            &args,
            loss.as_ref(),
            &mut p.rng,
            callback,
        )
    })?;
    Ok((p, outcome))
}
