//! Loading a model: an HF-style directory (`config.json` + `model*.safetensors`) through
//! MLX's lazy loader, strictly audited.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::io::load_safetensors;
use mlx_core::prelude::*;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::models::{build_with_params, LanguageModel};
use crate::weights::{ParamShapes, Weights};

/// Options for [`load_model_dir`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Cast every floating tensor (weights, norms, quantization scales and biases) to this
    /// dtype; `None` keeps the stored dtypes (mlx-lm's behaviour).
    pub dtype: Option<Dtype>,
}

/// The `model*.safetensors` files of a directory (mlx-lm's glob), sorted.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    mlx_core::io::weight_files(dir).map_err(|e| match e {
        mlx_core::Error::Io { path, message } => ModelError::Io { path, message },
        e => e.into(),
    })
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
    load_model_dir_with_params(dir, opts).map(|(model, config, _)| (model, config))
}

/// [`load_model_dir`], also returning the parameters the model took (names after `sanitize`,
/// with their shapes).
pub fn load_model_dir_with_params(
    dir: &Path,
    opts: &LoadOptions,
) -> Result<(Box<dyn LanguageModel>, ModelConfig, ParamShapes)> {
    load_model_dir_mtp(dir, opts, false)
}

/// [`load_model_dir_with_params`]; with `mtp`, the checkpoint's multi-token-prediction layers
/// are loaded too ([`Weights::with_mtp`]; an error for a model that has none).
pub fn load_model_dir_mtp(
    dir: &Path,
    opts: &LoadOptions,
    mtp: bool,
) -> Result<(Box<dyn LanguageModel>, ModelConfig, ParamShapes)> {
    load_model_dir_as(dir, opts, mtp, false)
}

/// [`load_model_dir_mtp`]; with `keep_linear_scales`, the linear layers' quantization scales
/// and biases keep their stored dtype under `opts.dtype`'s cast ([`Weights::keep_linear_scales`]):
/// the loading for the CPU decoder, whose kernels read half-precision scales in place (an MLX
/// affine directory's float16 or bfloat16 scales; the exact path gets the same bits, as MLX's
/// `quantized_matmul` widens them to the input's dtype).
pub fn load_model_dir_as(
    dir: &Path,
    opts: &LoadOptions,
    mtp: bool,
    keep_linear_scales: bool,
) -> Result<(Box<dyn LanguageModel>, ModelConfig, ParamShapes)> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let tensors = load_weights(dir)?;
    let mut weights = Weights::new(tensors, config.quantization.clone(), opts.dtype).with_mtp(mtp);
    if keep_linear_scales {
        weights = weights.keep_linear_scales();
    }
    let (model, params) = build_with_params(&config, weights)?;
    if mtp && model.mtp().is_none() {
        return Err(crate::error::ModelError::Config(format!(
            "--mtp: {}: `{}` has no multi-token-prediction layers this loader knows (deepseek_v3, \
             glm4_moe_lite, qwen3_next and mimo checkpoints carry them)",
            dir.display(),
            config.model_type
        )));
    }
    Ok((model, config, params))
}

/// What `mlx info` prints about a model directory, without building the model.
#[derive(serde::Serialize, Clone, Debug)]
pub struct ModelInfo {
    /// `model_type` as written in `config.json`.
    pub model_type: String,
    /// The type that serves it (after `MODEL_REMAPPING`).
    pub architecture: String,
    pub serving: crate::models::Serving,
    /// The resolved descriptor (table rows).
    pub descriptor: Option<crate::models::Descriptor>,
    /// Parameters as mlx-lm counts them (`get_total_parameters`: packed quantized weights
    /// count as their unpacked size).
    pub parameters: u64,
    /// Tensor count per stored dtype.
    pub dtypes: BTreeMap<String, usize>,
    pub quantization: Option<crate::config::QuantConfig>,
    /// A GGUF file's tensor count per GGML type (`"Q4_1"`, `"Q8_0"`, `"F32"`, ...): its
    /// quantization is per tensor, not a config block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gguf_types: Option<BTreeMap<String, usize>>,
}

/// Reads `config.json` and the weight files' headers of `dir` and resolves its descriptor.
pub fn model_info(dir: &Path) -> Result<ModelInfo> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    // An unsupported type is named before the weights are looked for.
    crate::models::resolve(&config)?;
    let tensors = load_weights(dir)?;
    let group_size = config
        .quantization
        .as_ref()
        .map_or(64, |q| q.default.group_size.max(1) as u64);
    info_of(config, &tensors, group_size)
}

/// [`ModelInfo`] of a config and its tensors; `group_size` is the quantization group size a
/// packed weight's parameter count is inferred with.
pub(crate) fn info_of(
    config: ModelConfig,
    tensors: &BTreeMap<String, Array>,
    group_size: u64,
) -> Result<ModelInfo> {
    let descriptor = crate::models::resolve(&config)?;
    let serving = if descriptor.is_some() {
        crate::models::Serving::Table
    } else {
        crate::models::Serving::Dedicated
    };
    let mut dtypes = BTreeMap::new();
    let mut parameters = 0u64;
    for (name, a) in tensors {
        *dtypes.entry(a.dtype().name().to_string()).or_insert(0) += 1;
        let size: u64 = a.shape().iter().map(|&d| d.max(0) as u64).product();
        if let Some(module) = name
            .strip_suffix(".scales")
            .or(name.strip_suffix(".biases"))
        {
            if tensors.contains_key(&format!("{module}.scales")) {
                continue; // quantization side tables, not parameters
            }
        }
        match name
            .strip_suffix(".weight")
            .and_then(|m| tensors.get(&format!("{m}.scales")).map(|s| (m, s)))
        {
            Some((_, scales)) => {
                // Packed: infer bits as mlx-lm does (`weight.shape[-1] * 32 / in_dims`).
                let groups = scales.shape().last().copied().unwrap_or(0).max(0) as u64;
                let packed = a.shape().last().copied().unwrap_or(0).max(0) as u64;
                let rows = size / packed.max(1);
                parameters += rows * groups * group_size;
            }
            None => parameters += size,
        }
    }
    Ok(ModelInfo {
        model_type: config.model_type.clone(),
        architecture: config.architecture.clone(),
        serving,
        descriptor,
        parameters,
        dtypes,
        quantization: config.quantization.clone(),
        gguf_types: None,
    })
}

impl std::fmt::Display for ModelInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "model_type: {}", self.model_type)?;
        if self.architecture != self.model_type {
            writeln!(f, "served as: {}", self.architecture)?;
        }
        writeln!(f, "serving: {:?}", self.serving)?;
        writeln!(f, "parameters: {}", self.parameters)?;
        let dt: Vec<String> = self
            .dtypes
            .iter()
            .map(|(d, n)| format!("{d} ({n} tensors)"))
            .collect();
        writeln!(f, "dtypes: {}", dt.join(", "))?;
        match &self.quantization {
            Some(q) => writeln!(
                f,
                "quantization: {} bits, group size {}, mode {} ({} per-module entries)",
                q.default.bits,
                q.default.group_size,
                q.default.mode,
                q.overrides.len()
            )?,
            None => match &self.gguf_types {
                Some(types) => {
                    let t: Vec<String> = types
                        .iter()
                        .map(|(ty, n)| format!("{ty} ({n} tensors)"))
                        .collect();
                    writeln!(f, "quantization: GGUF types {}", t.join(", "))?
                }
                None => writeln!(f, "quantization: none")?,
            },
        }
        if let Some(d) = &self.descriptor {
            write!(f, "{}", d.summary())?;
        }
        Ok(())
    }
}
