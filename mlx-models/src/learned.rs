//! What the learned quantizers ([`crate::gptq`], [`crate::awq`]) share: the checks of the
//! output path and the calibration rows, loading the float model's files, and writing the
//! result (each rewritten tensor spliced into the model's parameter list where its weight was,
//! `compute_bits_per_weight`, the config's quantization block, mlx-lm's `save`).

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::prelude::*;
use serde_json::{Map, Value};

use crate::config::ModelConfig;
use crate::convert::{
    bits_per_weight_of, load_config_dict, save, ConvertReport, LayerQuant, Progress,
};
use crate::error::{ModelError, Result};
use crate::load::load_weights;

/// An option's problem, named as the command line names it.
pub(crate) fn bad(option: &str, problem: String) -> ModelError {
    ModelError::Convert {
        option: option.into(),
        problem,
    }
}

/// A free output path and `(samples, sequence length)` calibration ids.
pub(crate) fn check_run(dst: &Path, data: &Array) -> Result<()> {
    if dst.exists() {
        return Err(bad(
            "--mlx-path",
            format!("{} already exists", dst.display()),
        ));
    }
    if data.ndim() != 2 || data.shape()[0] == 0 {
        return Err(bad(
            "calibration data",
            format!(
                "needs (samples, sequence length) ids, not {:?}",
                data.shape()
            ),
        ));
    }
    Ok(())
}

/// The float model's files: `load_config`'s dict, the parsed config and the tensors.
pub(crate) struct Source {
    pub(crate) config: Map<String, Value>,
    pub(crate) model_config: ModelConfig,
    pub(crate) tensors: BTreeMap<String, Array>,
}

pub(crate) fn load_source(src: &Path, progress: &mut dyn FnMut(Progress<'_>)) -> Result<Source> {
    if !src.is_dir() {
        return Err(bad(
            "--model",
            format!("{}: not a model directory", src.display()),
        ));
    }
    progress(Progress::Info("Loading".into()));
    Ok(Source {
        config: load_config_dict(src)?,
        model_config: ModelConfig::from_file(&src.join("config.json"))?,
        tensors: load_weights(src)?,
    })
}

/// Writes the quantized model: `parameters` (mlx-lm's names, in load order) with each entry
/// of `replaced` (keyed by the name it replaces) in place of that tensor, `qblock` as the
/// config's `quantization`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn splice_and_save(
    src: &Path,
    dst: &Path,
    parameters: Vec<(String, Array)>,
    mut replaced: BTreeMap<String, Vec<(String, Array)>>,
    quantized: &BTreeMap<String, LayerQuant>,
    mut config: Map<String, Value>,
    qblock: Map<String, Value>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertReport> {
    let mut params = Vec::with_capacity(parameters.len() + 2 * replaced.len());
    for (n, a) in parameters {
        match replaced.remove(&n) {
            Some(parts) => params.extend(parts),
            None => params.push((n, a)),
        }
    }
    if let Some(n) = replaced.keys().next() {
        return Err(ModelError::Internal {
            what: n.clone(),
            problem: "a rewritten tensor has no place in the model's parameters".into(),
        });
    }
    let bpw = bits_per_weight_of(&params, quantized);
    progress(Progress::Info(format!(
        "Quantized model with {bpw:.3} bits per weight."
    )));
    config.insert("quantization".into(), Value::Object(qblock));
    let report = save(Some(src), dst, &params, quantized, config, &[], progress)?;
    Ok(ConvertReport {
        bits_per_weight: Some(bpw),
        ..report
    })
}
