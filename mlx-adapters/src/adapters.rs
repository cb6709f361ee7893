//! Adapter files in mlx-lm's format (`adapters.safetensors` with the trainable parameters
//! under mlx's flattened names, `adapter_config.json` with `fine_tune_type`, `num_layers`
//! and `lora_parameters`), `load_adapters` as mlx-lm's (LoRA, DoRA, and full fine-tunes,
//! whose file holds layer weights), and fusing (`mlx_lm.fuse`).

use std::collections::BTreeMap;
use std::path::Path;

use mlx_core::io::{save_safetensors, StringMap};
use mlx_core::prelude::*;
use mlx_core::quantized::QuantMode;
use mlx_models::layers::{Embedding, Linear, LinearMut, QuantizedWeight, SwitchLinear};
use mlx_models::load::{load_model_dir, load_weights, LoadOptions};
use mlx_models::models::TopModuleMut;
use mlx_models::LanguageModel;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{io_err, Result, TrainError};
use crate::full::{read_full_weights, write_layer_parameters};
use crate::lora::{
    as_lora, as_lora_embedding, linear_to_lora_layers, LoraConfig, LoraSwitchLinear,
};
use crate::params::{read_checked, Params};

/// The fields of `adapter_config.json` that matter when loading (the file holds every
/// training option; the rest is ignored, as mlx-lm does).
#[derive(Clone, Debug, Deserialize)]
pub struct AdapterConfig {
    #[serde(default = "default_type")]
    pub fine_tune_type: String,
    pub num_layers: i32,
    #[serde(default)]
    pub lora_parameters: Option<LoraConfig>,
}

fn default_type() -> String {
    "lora".into()
}

impl AdapterConfig {
    pub fn read(path: &Path) -> Result<AdapterConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
        let c: AdapterConfig =
            serde_json::from_str(&text).map_err(|e| io_err(path, format!("invalid: {e}")))?;
        match c.fine_tune_type.as_str() {
            "lora" | "dora" | "full" => {}
            other => return Err(io_err(path, format!("unknown fine_tune_type `{other}`"))),
        }
        if c.lora_parameters.is_none() && !c.is_full() {
            return Err(io_err(path, "missing field `lora_parameters`"));
        }
        Ok(c)
    }

    /// A full fine-tune: the file holds layer weights, not adapters.
    pub fn is_full(&self) -> bool {
        self.fine_tune_type == "full"
    }
}

/// Writes every trainable parameter (`mx.save_safetensors(file, dict(tree_flatten(...)))`).
pub fn save_adapter_weights(path: &Path, params: &Params) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    }
    let snap = params.snapshot();
    save_safetensors(
        path,
        snap.iter().map(|(k, v)| (k.as_str(), v)),
        &StringMap::new(),
    )?;
    Ok(())
}

/// Writes `adapter_config.json` from the run's options (a JSON object; keys sorted as
/// mlx-lm's `save_config` sorts them).
pub fn save_adapter_config(path: &Path, options: &serde_json::Map<String, Value>) -> Result<()> {
    let sorted: BTreeMap<&String, &Value> = options.iter().collect();
    let text = serde_json::to_string_pretty(&sorted)
        .map_err(|e| io_err(path, format!("serializing: {e}")))?;
    mlx_core::partial::write_atomic(path, text.as_bytes()).map_err(|e| io_err(path, e))
}

/// Reads adapter weights and puts them into `params` (every name must be one of them, with
/// its shape).
pub fn load_adapter_weights(path: &Path, params: &Params) -> Result<()> {
    let allowed = params
        .snapshot()
        .into_iter()
        .map(|(k, v)| (k, (v.shape(), v.dtype())))
        .collect();
    params.update(&read_checked(path, &allowed)?)
}

/// `load_adapters(model, adapter_path)`: wraps the model's linears as the adapter's config
/// says (drawing the same init mlx-lm draws) and loads the trained weights; a full
/// fine-tune's weights replace the layers' own (the returned [`Params`] is then empty).
pub fn load_adapters(model: &mut dyn LanguageModel, dir: &Path) -> Result<Params> {
    if !dir.exists() {
        return Err(io_err(dir, "The adapter path does not exist"));
    }
    let config = AdapterConfig::read(&dir.join("adapter_config.json"))?;
    let params = Params::new();
    let file = dir.join("adapters.safetensors");
    if config.is_full() {
        // The layers' own weights, replaced in place: nothing to adapt, nothing drawn.
        let weights = read_full_weights(model, &file)?;
        write_layer_parameters(model, &weights)?;
        return Ok(params);
    }
    let lora = config.lora_parameters.clone().unwrap_or_default();
    linear_to_lora_layers(
        model,
        config.num_layers,
        &lora,
        config.fine_tune_type == "dora",
        &params,
    )?;
    load_adapter_weights(&file, &params)?;
    Ok(params)
}

/// A fused layer's arrays under their names (`weight`, `scales`, `biases`).
pub type FusedArrays = Vec<(&'static str, Array)>;

/// The fused layers of an adapted model: `(module path, [(array name, array)])`, the
/// arrays (`weight`, or a quantized layer's `weight`, `scales`, `biases`) that replace the
/// base's; linears and MoE experts' switch linears alike.
pub fn fused_layers(
    model: &mut dyn LanguageModel,
    dequantize: bool,
) -> Result<Vec<(String, FusedArrays)>> {
    fn quantized(q: QuantizedWeight) -> FusedArrays {
        let mut v = vec![("weight", q.weight), ("scales", q.scales)];
        v.extend(q.biases.map(|b| ("biases", b)));
        v
    }
    let still_adapted =
        |path: &str| TrainError::Config(format!("{path}: fused layer still adapted"));
    let fused_linear = |lin: &Linear| -> Result<Option<(String, FusedArrays)>> {
        let Some(a) = as_lora(lin) else {
            return Ok(None);
        };
        let t = match a.fuse(dequantize)? {
            Linear::Dense { weight, .. } => vec![("weight", weight)],
            Linear::Quantized { weight, .. } => quantized(weight),
            Linear::Adapted(_) => return Err(still_adapted(a.path())),
            Linear::Trellis { .. } => {
                return Err(TrainError::Config(format!(
                    "{}: fusing into a trellis-coded linear is not supported (fuse with -d)",
                    a.path()
                )))
            }
            Linear::Ggml { .. } => {
                return Err(TrainError::Config(format!(
                    "{}: fusing into GGML blocks is not supported (fuse with -d)",
                    a.path()
                )))
            }
        };
        Ok(Some((a.path().to_string(), t)))
    };
    let mut out = Vec::new();
    let Some(model) = model.as_trainable_mut() else {
        return Ok(out);
    };
    for layer in model.layer_adaptables_mut() {
        for (_, lin) in layer {
            match lin {
                LinearMut::Linear(lin) => out.extend(fused_linear(lin)?),
                LinearMut::Switch(SwitchLinear::Adapted(a)) => {
                    if let Some(a) = a.as_any().downcast_ref::<LoraSwitchLinear>() {
                        let t = match a.fuse(dequantize)? {
                            SwitchLinear::Dense { weight, .. } => vec![("weight", weight)],
                            SwitchLinear::Quantized { weight, .. } => quantized(weight),
                            SwitchLinear::Adapted(_) => return Err(still_adapted(a.path())),
                        };
                        out.push((a.path().to_string(), t));
                    }
                }
                LinearMut::Switch(_) => {}
            }
        }
    }
    for (_, module) in model.top_modules_mut() {
        match module {
            TopModuleMut::Linear(lin) => out.extend(fused_linear(lin)?),
            TopModuleMut::Embedding(e) => {
                if let Some(a) = as_lora_embedding(e) {
                    let t = match a.fuse(dequantize)? {
                        Embedding::Dense(w) => vec![("weight", w)],
                        Embedding::Quantized(q) => quantized(q),
                        Embedding::Ggml(g) => vec![("weight", g.dequantize()?)],
                        Embedding::Adapted(_) => return Err(still_adapted(a.path())),
                    };
                    out.push((a.path().to_string(), t));
                }
            }
        }
    }
    Ok(out)
}

/// The quantization of `path` per a config's `quantization` block (a per-layer entry wins
/// over the global `group_size`/`bits`/`mode`).
fn quant_of(q: &Map<String, Value>, path: &str) -> Result<(i32, i32, QuantMode)> {
    let layer = q.get(path).and_then(Value::as_object);
    let get = |k: &str| layer.and_then(|l| l.get(k)).or_else(|| q.get(k));
    let int = |k: &str| {
        get(k)
            .and_then(Value::as_i64)
            .map(|v| v as i32)
            .ok_or_else(|| TrainError::FileField {
                file: "config.json".into(),
                field: format!("quantization.{k}"),
                problem: "missing".into(),
            })
    };
    let mode = match get("mode").and_then(Value::as_str).unwrap_or("affine") {
        "affine" => QuantMode::Affine,
        "mxfp4" => QuantMode::Mxfp4,
        "nvfp4" => QuantMode::Nvfp4,
        "mxfp8" => QuantMode::Mxfp8,
        other => {
            return Err(TrainError::Config(format!(
                "config.json: unknown quantization mode `{other}`"
            )))
        }
    };
    Ok((int("group_size")?, int("bits")?, mode))
}

/// `mlx_lm.fuse --model MODEL --adapter-path ADAPTERS --save-path OUT [--dequantize]`: a
/// normal model directory whose adapted linears carry the update, re-quantized as the base
/// was, or with `dequantize` every quantized tensor dequantized (`dequantize_model`) and the
/// quantization dropped from `config.json`. The other files (tokenizer) are copied.
pub fn fuse_model_dir(
    model_dir: &Path,
    adapter_dir: &Path,
    out_dir: &Path,
    dequantize: bool,
) -> Result<()> {
    if model_dir.is_file()
        && model_dir
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Err(io_err(
            model_dir,
            "fusing into a GGUF base is not supported: the fused model is written as a \
             safetensors model directory (config.json, model.safetensors, tokenizer.json) and \
             a GGUF file has none of them to copy or rewrite. Give --model the same model as an \
             HF-style directory, or use the adapters unfused: mlx generate/chat/serve --model \
             FILE.gguf --adapter-path ADAPTERS",
        ));
    }
    let (mut model, _) = load_model_dir(model_dir, &LoadOptions::default())?;
    load_adapters(model.as_mut(), adapter_dir)?;
    let fused = fused_layers(model.as_mut(), dequantize)?;
    let mut tensors = load_weights(model_dir)?;
    if AdapterConfig::read(&adapter_dir.join("adapter_config.json"))?.is_full() {
        // `load(model, adapter_path)` then `save`: the trained arrays replace the base's.
        let file = adapter_dir.join("adapters.safetensors");
        tensors.extend(read_full_weights(model.as_mut(), &file)?);
    }
    for (path, arrays) in fused {
        if !tensors.contains_key(&format!("{path}.weight")) {
            return Err(io_err(
                model_dir,
                format!("no `{path}.weight` to fuse into (the weights are not in mlx-lm's layout)"),
            ));
        }
        for suffix in ["weight", "scales", "biases"] {
            tensors.remove(&format!("{path}.{suffix}"));
        }
        for (suffix, a) in arrays {
            tensors.insert(format!("{path}.{suffix}"), a);
        }
    }
    let config_path = model_dir.join("config.json");
    let config_text = std::fs::read_to_string(&config_path).map_err(|e| io_err(&config_path, e))?;
    let mut config: Map<String, Value> = serde_json::from_str(&config_text)
        .map_err(|e| io_err(&config_path, format!("invalid JSON: {e}")))?;
    if dequantize {
        let q = config
            .get("quantization")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let quantized: Vec<String> = tensors
            .keys()
            .filter_map(|k| k.strip_suffix(".scales").map(str::to_string))
            .collect();
        for path in quantized {
            let (gs, bits, mode) = quant_of(&q, &path)?;
            let w = tensors.remove(&format!("{path}.weight"));
            let scales = tensors.remove(&format!("{path}.scales"));
            let biases = tensors.remove(&format!("{path}.biases"));
            let (Some(w), Some(scales)) = (w, scales) else {
                return Err(TrainError::Config(format!(
                    "{path}: scales without a weight"
                )));
            };
            let deq =
                quantized::dequantize(&w, &scales, biases.as_ref(), gs, bits, mode, None, None)?;
            tensors.insert(format!("{path}.weight"), deq);
        }
        config.remove("quantization");
        config.remove("quantization_config");
    }
    // mlx-lm's `save`, as `mlx convert` writes (the same bytes as mlx_lm.fuse's directory).
    eval(tensors.values())?;
    mlx_models::convert::save_tensors(model_dir, out_dir, tensors, config)?;
    Ok(())
}
