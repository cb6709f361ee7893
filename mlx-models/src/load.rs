//! Loading a model: an HF-style directory (`config.json` + `model*.safetensors`) through
//! MLX's lazy loader, strictly audited.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::io::load_safetensors;
use mlx_core::prelude::*;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::models::{build, LanguageModel};
use crate::weights::Weights;

/// Options for [`load_model_dir`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Cast every floating tensor (weights, norms, quantization scales and biases) to this
    /// dtype; `None` keeps the stored dtypes (mlx-lm's behaviour).
    pub dtype: Option<Dtype>,
}

/// The `model*.safetensors` files of a directory (mlx-lm's glob), sorted.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| ModelError::Io {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Reads every tensor of the directory's weight files (lazily: data is read on first use).
pub fn load_weights(dir: &Path) -> Result<BTreeMap<String, Array>> {
    let files = weight_files(dir)?;
    if files.is_empty() {
        return Err(ModelError::Io {
            path: dir.display().to_string(),
            message: "no model*.safetensors files".into(),
        });
    }
    let mut all = BTreeMap::new();
    for f in files {
        let (tensors, _) = load_safetensors(&f, None)?;
        all.extend(tensors);
    }
    Ok(all)
}

/// Loads the model in an HF-style directory.
pub fn load_model_dir(
    dir: &Path,
    opts: &LoadOptions,
) -> Result<(Box<dyn LanguageModel>, ModelConfig)> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let tensors = load_weights(dir)?;
    let weights = Weights::new(tensors, config.quantization.clone(), opts.dtype);
    let model = build(&config, weights)?;
    Ok((model, config))
}
