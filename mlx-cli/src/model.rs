//! `--model`, `--dtype` and `--adapter-path` through the one loader (`mlx_engine::load`),
//! with a download bar and `[mlx]` notes on stderr.

use std::path::Path;

use mlx_engine::fetch::FetchProgress;
use mlx_engine::load::{self, LoadEvents, LoadSpec, ModelRef};

pub use mlx_engine::load::Loaded;

use crate::common::ModelArgs;
use crate::progress::DownloadBar;

/// The CLI's [`LoadEvents`]: a download bar and notes on stderr.
#[derive(Default)]
pub struct Stderr {
    bar: Option<DownloadBar>,
}

impl LoadEvents for Stderr {
    fn progress(&mut self, p: &FetchProgress) {
        self.bar.get_or_insert_with(DownloadBar::new).update(p);
    }
    fn progress_done(&mut self) {
        if let Some(mut bar) = self.bar.take() {
            bar.finish();
        }
    }
    fn note(&mut self, line: &str) {
        eprintln!("[mlx] {line}");
    }
}

/// `--model` as given, checked: an existing path, else a Hub name. Touches neither the
/// network nor the model's files.
pub fn model_path(model: Option<&str>) -> Result<ModelRef, String> {
    ModelRef::parse(model).map_err(|e| e.to_string())
}

/// Loads `--model` as the flags say, adapters included.
pub fn load(a: &ModelArgs) -> Result<Loaded, String> {
    load_with(a, false)
}

/// [`load`]; with `mtp`, the checkpoint's multi-token-prediction layers too (`--mtp`).
pub fn load_with(a: &ModelArgs, mtp: bool) -> Result<Loaded, String> {
    load_for(a, mtp, false)
}

/// [`load_with`]; with `gguf_blocks`, a GGUF file's GGML-block weights kept as blocks for the
/// CPU decoder ([`LoadSpec::gguf_blocks`]; see [`crate::common::DecoderArgs::may_pick_cpu`]).
pub fn load_for(a: &ModelArgs, mtp: bool, gguf_blocks: bool) -> Result<Loaded, String> {
    if a.adapter_path.is_some() && std::env::var_os(crate::launch::ENV_BACKEND).is_some() {
        return Err(
            "--adapter-path: adapters are not supported in a launched (sharded) model yet".into(),
        );
    }
    let spec = LoadSpec {
        dtype: a.dtype.clone(),
        adapter_path: a
            .adapter_path
            .as_deref()
            .map(Path::new)
            .map(Path::to_path_buf),
        gguf_blocks,
    };
    let mut m = load::load_mtp(
        &model_path(a.model.as_deref())?,
        &spec,
        &mut Stderr::default(),
        mtp,
    )
    .map_err(|e| e.to_string())?;
    // In a rank of `mlx launch`: tensor parallel, as mlx-lm's `sharded_load`.
    crate::launch::shard_if_launched(m.model.as_mut())?;
    Ok(m)
}
