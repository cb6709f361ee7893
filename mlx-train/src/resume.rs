//! Checkpoints that resume exactly, and a run that loses no file (not in mlx-lm, whose
//! `--resume-adapter-file` loads the weights only and numbers the run from 1 again).
//!
//! Beside `adapters.safetensors` (mlx-lm's format and content, unchanged) a run keeps, at
//! every checkpoint and at the end:
//! - `adapters.optimizer.safetensors`: the optimizer state under `optimizer.<name>` (`step`,
//!   `learning_rate`, `<param>.m`, ...), a gradient being accumulated under
//!   `grad_accum.<param>`, and MLX's global random key (`random_key`, which LoRA dropout
//!   draws from);
//! - `adapters.resume.json`: the iteration reached, the optimizer's step, numpy's generator
//!   (which orders the batches), the batch iterator's position, and the sha256 of both
//!   files. It is written last, each file through a partial file renamed into place, so a
//!   state whose hashes do not match its files (a run killed between them, or files written
//!   by another program since) is never used.
//!
//! `--resume-adapter-file X.safetensors` reads `X.optimizer.safetensors` and
//! `X.resume.json`: with both, the run continues the iteration count, the learning-rate
//! schedule, the optimizer's moments, the data order and a pending accumulated gradient, so
//! that it equals the uninterrupted run. Without them (a file from `mlx_lm.lora`, or a
//! numbered checkpoint, which has no state of its own) the optimizer starts fresh and the
//! iterations are numbered from 1, as mlx-lm does.
//!
//! What the state leaves out: the running sums of the loss report (a report after a resume
//! covers the resumed run's steps only).

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use mlx_core::io::{load_safetensors, save_safetensors, StringMap};
use mlx_core::prelude::*;
use serde::{Deserialize, Serialize};

use crate::data::BatchPosition;
use crate::error::{io_err, Result, TrainError};
use crate::nprand::NumpyRandom;
use crate::optim::Optimizer;

/// The largest resume state file read (its batch order grows with the data set).
pub const MAX_STATE_BYTES: u64 = 256 << 20;

const FORMAT: &str = "mlx-train resume state";
const VERSION: u32 = 1;

/// `X.optimizer.safetensors` for `X.safetensors`.
pub fn optimizer_path(adapter_file: &Path) -> PathBuf {
    sibling(adapter_file, "optimizer.safetensors")
}

/// `X.resume.json` for `X.safetensors`.
pub fn state_path(adapter_file: &Path) -> PathBuf {
    sibling(adapter_file, "resume.json")
}

fn sibling(adapter_file: &Path, ext: &str) -> PathBuf {
    let stem = adapter_file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("adapters");
    adapter_file.with_file_name(format!("{stem}.{ext}"))
}

/// The numbered checkpoint of iteration `it` beside `adapter_file`, as mlx-lm names it.
pub fn checkpoint_path(adapter_file: &Path, it: usize) -> PathBuf {
    adapter_file
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("{it:07}_adapters.safetensors"))
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    format: String,
    version: u32,
    /// The last iteration done.
    iteration: usize,
    /// The optimizer's step (updates made; iterations over the accumulation steps).
    optimizer_step: u64,
    numpy_key: Vec<u32>,
    numpy_pos: usize,
    batches: BatchPosition,
    adapters_sha256: String,
    optimizer_sha256: String,
}

/// What a checkpoint's state gives a resumed run.
pub struct ResumeState {
    /// Iterations already done: the resumed run starts at `iteration + 1`.
    pub iteration: usize,
    pub optimizer_step: u64,
    pub rng: NumpyRandom,
    pub batches: BatchPosition,
    /// The optimizer's arrays (`None` when its file is missing or does not match: the
    /// optimizer then starts fresh at `optimizer_step`).
    pub optimizer: Option<BTreeMap<String, Array>>,
    pub grad_accum: Option<ParamMap>,
    pub random_key: Option<Array>,
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Writes the state of a run at `iteration` beside `adapter_file` (which holds the weights
/// of that iteration already): the optimizer file, then the JSON.
pub fn save_state(
    adapter_file: &Path,
    iteration: usize,
    optimizer: &Optimizer,
    grad_accum: Option<&ParamMap>,
    rng: &NumpyRandom,
    batches: BatchPosition,
) -> Result<()> {
    let opt_file = optimizer_path(adapter_file);
    let mut arrays: Vec<(String, Array)> = optimizer
        .state_map()
        .into_iter()
        .map(|(k, v)| (format!("optimizer.{k}"), v))
        .collect();
    if let Some(g) = grad_accum {
        arrays.extend(
            g.iter()
                .map(|(k, v)| (format!("grad_accum.{k}"), v.clone())),
        );
    }
    arrays.push(("random_key".into(), mlx_core::random::state()?));
    save_safetensors(
        &opt_file,
        arrays.iter().map(|(k, v)| (k.as_str(), v)),
        &StringMap::new(),
    )?;
    let optimizer_step = optimizer.step().item::<u64>()?;
    let (numpy_key, numpy_pos) = rng.state();
    let state = StateFile {
        format: FORMAT.into(),
        version: VERSION,
        iteration,
        optimizer_step,
        numpy_key,
        numpy_pos,
        batches,
        adapters_sha256: sha256_file(adapter_file).map_err(|e| io_err(adapter_file, e))?,
        optimizer_sha256: sha256_file(&opt_file).map_err(|e| io_err(&opt_file, e))?,
    };
    let path = state_path(adapter_file);
    let text = serde_json::to_string(&state).map_err(|e| io_err(&path, e))?;
    mlx_core::partial::write_atomic(&path, text.as_bytes()).map_err(|e| io_err(&path, e))
}

/// Why a run starts without the state saved beside its adapter file (the note it prints):
/// the file at fault and the problem.
#[derive(Debug, thiserror::Error)]
pub enum NoResume {
    /// No `--resume-adapter-file` was given.
    #[error("not resuming")]
    NotResuming,
    /// The state file (its name) is not beside the adapter file.
    #[error("no {name} beside it")]
    Missing { name: String },
    /// A file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: larger than {MAX_STATE_BYTES} bytes", .path.display())]
    TooLarge { path: PathBuf },
    #[error("{}: invalid: {source}", .path.display())]
    Invalid {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: not a resume state this version reads", .path.display())]
    OtherVersion { path: PathBuf },
    /// The adapter file's hash is not the one the state was saved with.
    #[error("{} was written for other weights than {} holds now", .state.display(), .adapters.display())]
    OtherWeights { state: PathBuf, adapters: PathBuf },
}

/// The iteration a resume from `adapter_file` continues from, if its state says so and
/// matches the file (only the JSON and the adapter file's hash are read). `Err` says why
/// there is none, for the message.
pub fn peek_iteration(adapter_file: &Path) -> std::result::Result<usize, NoResume> {
    read_state_file(adapter_file).map(|s| s.iteration)
}

fn read_state_file(adapter_file: &Path) -> std::result::Result<StateFile, NoResume> {
    let path = state_path(adapter_file);
    if !path.exists() {
        return Err(NoResume::Missing { name: name(&path) });
    }
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_STATE_BYTES + 1).read_to_string(&mut text))
        .map_err(|source| NoResume::Read {
            path: path.clone(),
            source,
        })?;
    if text.len() as u64 > MAX_STATE_BYTES {
        return Err(NoResume::TooLarge { path });
    }
    let s: StateFile = serde_json::from_str(&text).map_err(|source| NoResume::Invalid {
        path: path.clone(),
        source,
    })?;
    if s.format != FORMAT || s.version != VERSION {
        return Err(NoResume::OtherVersion { path });
    }
    let h = sha256_file(adapter_file).map_err(|source| NoResume::Read {
        path: adapter_file.to_path_buf(),
        source,
    })?;
    if h != s.adapters_sha256 {
        return Err(NoResume::OtherWeights {
            state: path,
            adapters: adapter_file.to_path_buf(),
        });
    }
    Ok(s)
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reads the state saved beside `adapter_file` for a run over `params` (name to shape).
/// `Ok(None)` when there is none usable, with the reason in `notes`; a missing or foreign
/// optimizer file only drops the optimizer's arrays (noted too).
pub fn load_state(
    adapter_file: &Path,
    params: &ParamMap,
    notes: &mut Vec<String>,
) -> Result<Option<ResumeState>> {
    let s = match read_state_file(adapter_file) {
        Ok(s) => s,
        Err(why) => {
            notes.push(why.to_string());
            return Ok(None);
        }
    };
    let path = state_path(adapter_file);
    let rng = NumpyRandom::from_state(&s.numpy_key, s.numpy_pos).ok_or_else(|| {
        io_err(
            &path,
            "numpy_key/numpy_pos are not a generator state (624 words, position at most 624)",
        )
    })?;
    let mut state = ResumeState {
        iteration: s.iteration,
        optimizer_step: s.optimizer_step,
        rng,
        batches: s.batches,
        optimizer: None,
        grad_accum: None,
        random_key: None,
    };
    let opt_file = optimizer_path(adapter_file);
    match sha256_file(&opt_file) {
        Ok(h) if h == s.optimizer_sha256 => {}
        Ok(_) => {
            notes.push(format!(
                "{} does not match {}",
                opt_file.display(),
                path.display()
            ));
            return Ok(Some(state));
        }
        Err(e) => {
            notes.push(format!("{}: {e}", opt_file.display()));
            return Ok(Some(state));
        }
    }
    let (arrays, _) = load_safetensors(&opt_file, None).map_err(|e| io_err(&opt_file, e))?;
    let mut opt = BTreeMap::new();
    let mut accum = ParamMap::new();
    let bad = |m: String| io_err(&opt_file, m);
    for (k, a) in arrays {
        if let Some(rest) = k.strip_prefix("optimizer.") {
            check_optimizer_entry(rest, &a, params).map_err(|e| bad(e.to_string()))?;
            opt.insert(rest.to_string(), a);
        } else if let Some(p) = k.strip_prefix("grad_accum.") {
            match params.get(p) {
                Some(v) if v.shape() == a.shape() && a.dtype().is_floating() => {
                    accum.insert(p.to_string(), a);
                }
                _ => return Err(bad(format!("`{k}` does not fit a trainable parameter"))),
            }
        } else if k == "random_key" {
            if a.shape() != [2] || a.dtype() != Dtype::Uint32 {
                return Err(bad(
                    "`random_key` must be a uint32 array of shape [2]".into()
                ));
            }
            state.random_key = Some(a);
        } else {
            return Err(bad(format!("unknown entry `{k}`")));
        }
    }
    if !accum.is_empty() {
        if accum.len() != params.len() {
            return Err(bad(format!(
                "the accumulated gradient has {} of the {} trainable parameters",
                accum.len(),
                params.len()
            )));
        }
        state.grad_accum = Some(accum);
    }
    state.optimizer = Some(opt);
    Ok(Some(state))
}

/// Why an optimizer state entry was refused ([`check_optimizer_entry`]); the loader adds
/// the optimizer file.
#[derive(Clone, Debug, PartialEq)]
enum BadEntry {
    /// `step` or `learning_rate` that is not a scalar of its kind.
    NotScalar {
        key: String,
        dtype: Dtype,
        shape: Vec<i32>,
    },
    /// An entry with no `<param>.<leaf>` shape.
    Malformed(String),
    /// `<param>` is not a trainable parameter.
    NotTrainable { key: String, param: String },
    /// A leaf no optimizer here writes.
    UnknownLeaf(String),
    /// The array does not match its parameter.
    Shape {
        key: String,
        dtype: Dtype,
        shape: Vec<i32>,
        want: Vec<i32>,
    },
}

impl std::fmt::Display for BadEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadEntry::NotScalar { key, dtype, shape } => write!(
                f,
                "`optimizer.{key}` must be a scalar ({dtype}; shape {shape:?})"
            ),
            BadEntry::Malformed(k) => write!(f, "bad optimizer entry `{k}`"),
            BadEntry::NotTrainable { key, param } => write!(
                f,
                "optimizer entry `{key}`: `{param}` is not a trainable parameter"
            ),
            BadEntry::UnknownLeaf(k) => write!(f, "unknown optimizer entry `{k}`"),
            BadEntry::Shape {
                key,
                dtype,
                shape,
                want,
            } => write!(
                f,
                "optimizer entry `{key}`: {dtype} {shape:?}, expected a float array of shape \
                 {want:?}"
            ),
        }
    }
}

/// An optimizer state entry (`step`, `learning_rate`, `<param>.<leaf>`) checked against the
/// trainable parameters before MLX sees it.
fn check_optimizer_entry(
    k: &str,
    a: &Array,
    params: &ParamMap,
) -> std::result::Result<(), BadEntry> {
    let scalar = a.ndim() == 0;
    match k {
        "step" if scalar && !a.dtype().is_floating() => return Ok(()),
        "learning_rate" if scalar && a.dtype().is_floating() => return Ok(()),
        "step" | "learning_rate" => {
            return Err(BadEntry::NotScalar {
                key: k.to_string(),
                dtype: a.dtype(),
                shape: a.shape(),
            })
        }
        _ => {}
    }
    let (p, leaf) = k
        .rsplit_once('.')
        .ok_or_else(|| BadEntry::Malformed(k.to_string()))?;
    let param = params.get(p).ok_or_else(|| BadEntry::NotTrainable {
        key: k.to_string(),
        param: p.to_string(),
    })?;
    let s = param.shape();
    let n = s.len();
    let want: Vec<i32> = match leaf {
        "m" | "v" | "exp_avg" => s.clone(),
        "exp_avg_sq" if n < 2 => s.clone(),
        "exp_avg_sq_row" if n >= 2 => s[..n - 1].to_vec(),
        "exp_avg_sq_col" if n >= 2 => [&s[..n - 2], &s[n - 1..]].concat(),
        _ => return Err(BadEntry::UnknownLeaf(k.to_string())),
    };
    if a.shape() != want || !a.dtype().is_floating() {
        return Err(BadEntry::Shape {
            key: k.to_string(),
            dtype: a.dtype(),
            shape: a.shape(),
            want,
        });
    }
    Ok(())
}

/// The files a run may write, checked before each write: a file that exists and that this
/// run did not write is refused (naming it) unless `overwrite` or the run continues it.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub overwrite: bool,
    /// Files the run continues (the adapter file it resumes from, with its state and config).
    pub continued: Vec<PathBuf>,
    written: HashSet<PathBuf>,
}

impl Outputs {
    pub fn new(overwrite: bool, continued: Vec<PathBuf>) -> Outputs {
        Outputs {
            overwrite,
            continued,
            written: HashSet::new(),
        }
    }

    /// Whether `path` may be written now (and notes that this run writes it).
    pub fn claim(&mut self, path: &Path) -> Result<()> {
        self.check(path)?;
        self.written.insert(path.to_path_buf());
        Ok(())
    }

    /// [`Outputs::claim`] without noting it.
    pub fn check(&self, path: &Path) -> Result<()> {
        if self.overwrite
            || self.written.contains(path)
            || self.continued.iter().any(|c| c == path)
            || std::fs::symlink_metadata(path).is_err()
        {
            return Ok(());
        }
        Err(TrainError::Io {
            path: path.display().to_string(),
            message: "exists already (from an earlier run) and this run would replace it; pass \
                      --overwrite to replace it, or choose another --adapter-path"
                .into(),
        })
    }
}

/// Whether `a` and `b` name the same file (both existing), else the same path.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
