//! `--fine-tune-type full`: mlx_lm.lora's `model.freeze()` followed by `layer.unfreeze()` for
//! the last `num_layers` decoder layers. Every array of those layers trains (linears' weights
//! and biases, norms), under its mlx-lm name (`model.layers.1.self_attn.q_proj.weight`);
//! `adapters.safetensors` then holds exactly those arrays.
//!
//! A quantized linear's own arrays (packed weight, scales, biases, bias) stay frozen: no
//! gradient reaches them. mlx-lm 0.32.2 on mlx 0.32.4 differs here: `unfreeze` unfreezes them
//! too and the first step fails with `[QuantizedMatmul::vjp] no gradient wrt the quantized
//! weights`; on a quantized base only the other arrays (norms) train here, as they would in
//! mlx-lm with `QuantizedLinear.unfreeze` keeping its own parameters frozen.
//!
//! The trainable arrays live in [`Params`] like adapter arrays do. [`FullModel`] wraps the
//! model and writes the current values into its layers before each forward pass (the base
//! values while [`Params::set_enabled`] is off, for DPO's reference; they are kept only for
//! DPO), so the training loop, checkpoints, resume and the objectives work unchanged.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use mlx_cache::Cache;
use mlx_core::prelude::*;
use mlx_models::layers::LayerParam;
use mlx_models::models::{OutputHead, Trainable};
use mlx_models::LanguageModel;

use crate::error::{Result, TrainError};
use crate::lora::selected_layers;
use crate::params::{read_checked, Params};

/// A decoder layer array's name, shape, dtype and whether it can train.
pub type LayerParamShape = (String, Vec<i32>, Dtype, bool);

/// Every array of the model's decoder layers, by name, with its shape, its dtype and whether
/// it can train (`false` for a quantized linear's arrays).
pub fn layer_parameter_shapes(model: &mut dyn LanguageModel) -> Result<Vec<LayerParamShape>> {
    Ok(layers(model)?
        .into_iter()
        .flatten()
        .map(|p| (p.name, p.value.shape(), p.value.dtype(), !p.quantized))
        .collect())
}

fn layers(model: &mut dyn LanguageModel) -> Result<Vec<Vec<LayerParam<'_>>>> {
    let model_type = model.model_type().to_string();
    let unsupported = || {
        TrainError::Config(format!(
            "model_type {model_type} does not support --fine-tune-type full"
        ))
    };
    let layers = match model.as_trainable_mut() {
        Some(t) => t.layer_parameters_mut()?,
        None => Vec::new(),
    };
    if layers.is_empty() {
        return Err(unsupported());
    }
    Ok(layers)
}

/// `len(model.layers)`: the decoder layers full fine-tuning selects from (gemma4_text's
/// `LanguageModel::num_layers` counts only the layers that own caches).
pub fn decoder_layer_count(model: &mut dyn LanguageModel) -> Result<usize> {
    Ok(layers(model)?.len())
}

/// What `model.freeze()` + `unfreeze()` of the last `num_layers` layers leaves trainable:
/// the current values of those layers' arrays (quantized linears' excepted).
pub fn trainable_parameters(model: &mut dyn LanguageModel, num_layers: i32) -> Result<ParamMap> {
    let layers = layers(model)?;
    let range = selected_layers(layers.len(), num_layers);
    let out: ParamMap = layers
        .into_iter()
        .enumerate()
        .filter(|(i, _)| range.contains(i))
        .flat_map(|(_, l)| l)
        .filter(|p| !p.quantized)
        .map(|p| (p.name, p.value.clone()))
        .collect();
    if out.is_empty() {
        return Err(TrainError::Config(
            "--fine-tune-type full: the selected layers have no trainable parameters".into(),
        ));
    }
    Ok(out)
}

/// Writes `values` into the model's layers by name (`model.load_weights(..., strict=False)`
/// restricted to the layers). Every name must be a layer array of the model.
pub fn write_layer_parameters(model: &mut dyn LanguageModel, values: &ParamMap) -> Result<()> {
    let mut seen = BTreeSet::new();
    for p in layers(model)?.into_iter().flatten() {
        if let Some(v) = values.get(&p.name) {
            *p.value = v.clone();
            seen.insert(p.name);
        }
    }
    match values.keys().find(|k| !seen.contains(*k)) {
        Some(k) => Err(TrainError::Config(format!(
            "{k}: not a parameter of the model's decoder layers"
        ))),
        None => Ok(()),
    }
}

/// A full fine-tune's `adapters.safetensors`, checked against every array of the model's
/// decoder layers.
pub(crate) fn read_full_weights(model: &mut dyn LanguageModel, path: &Path) -> Result<ParamMap> {
    let allowed = layer_parameter_shapes(model)?
        .into_iter()
        .map(|(k, shape, dtype, _)| (k, (shape, dtype)))
        .collect();
    read_checked(path, &allowed)
}

/// `--resume-adapter-file` of a full run, as mlx-lm's `model.load_weights(file, strict=False)`:
/// the trained arrays go into `params`, arrays of the layers that do not train into the model
/// (every name must be an array of the decoder layers, with its shape).
pub fn load_resume(model: &mut dyn LanguageModel, path: &Path, params: &Params) -> Result<()> {
    let weights = read_full_weights(model, path)?;
    let trained = params.snapshot();
    let (ours, frozen): (ParamMap, ParamMap) = weights
        .into_iter()
        .partition(|(k, _)| trained.contains_key(k));
    params.update(&ours)?;
    write_layer_parameters(model, &frozen)
}

/// A model whose last `num_layers` layers train in full: [`trainable_parameters`] go into
/// `params`, and every forward pass first writes their current values into the model.
pub struct FullModel {
    inner: Mutex<Box<dyn LanguageModel>>,
    params: Params,
    /// The untrained values, kept only for a reference model (`Params` disabled: DPO).
    base: Option<ParamMap>,
    /// What the trained slots hold between forwards (one 0-d array), so that the model
    /// keeps no stale values (or tracers) alive once `params` moves on.
    placeholders: ParamMap,
    /// The layers that train.
    layers: std::ops::Range<usize>,
    model_type: String,
    vocab_size: i32,
    num_layers: usize,
    defines_make_cache: bool,
}

impl FullModel {
    /// `keep_base`: keep the untrained values for forwards with `params` disabled (one more
    /// copy of the trained layers; mlx-lm's tuner keeps none).
    pub fn new(
        mut model: Box<dyn LanguageModel>,
        num_layers: i32,
        params: &Params,
        keep_base: bool,
    ) -> Result<FullModel> {
        let base = trainable_parameters(model.as_mut(), num_layers)?;
        let layers = selected_layers(decoder_layer_count(model.as_mut())?, num_layers);
        for (k, v) in &base {
            params.insert(k, v.clone())?;
        }
        let empty = Array::from_f32(0.0, Dtype::Float32)?;
        let placeholders: ParamMap = base.keys().map(|k| (k.clone(), empty.clone())).collect();
        write_layer_parameters(model.as_mut(), &placeholders)?;
        Ok(FullModel {
            model_type: model.model_type().to_string(),
            vocab_size: model.vocab_size(),
            num_layers: model.num_layers(),
            defines_make_cache: model.defines_make_cache(),
            inner: Mutex::new(model),
            params: params.clone(),
            base: keep_base.then_some(base),
            placeholders,
            layers,
        })
    }

    /// The model with the trained values in place.
    pub fn into_inner(self) -> Result<Box<dyn LanguageModel>> {
        let values = self.params.snapshot();
        // A poisoned lock only means another thread panicked mid-forward; values are rewritten.
        let mut model = self.inner.into_inner().unwrap_or_else(|p| p.into_inner());
        write_layer_parameters(model.as_mut(), &values)?;
        Ok(model)
    }

    /// `f` on the model, its layers holding the current values (the base ones with adapters
    /// off); the graph `f` builds holds them, the model only for the call.
    fn synced<T>(&self, f: impl FnOnce(&dyn LanguageModel) -> T) -> mlx_models::Result<T> {
        let values = match (self.params.enabled(), &self.base) {
            (true, _) => self.params.snapshot(),
            (false, Some(base)) => base.clone(),
            (false, None) => return Err(mlx_models::ModelError::BaseWeightsNotKept),
        };
        let err = crate::lora::model_err;
        let mut g = self.lock();
        write_layer_parameters(g.as_mut(), &values).map_err(err)?;
        let r = f(g.as_ref());
        write_layer_parameters(g.as_mut(), &self.placeholders).map_err(err)?;
        Ok(r)
    }

    /// The wrapped model as it stands.
    fn lock(&self) -> MutexGuard<'_, Box<dyn LanguageModel>> {
        // A poisoned lock only means another thread panicked mid-forward; values are rewritten.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn inner_mut(&mut self) -> &mut Box<dyn LanguageModel> {
        self.inner.get_mut().unwrap_or_else(|p| p.into_inner())
    }
}

impl LanguageModel for FullModel {
    fn forward(
        &self,
        inputs: &Array,
        caches: Option<&mut [Box<dyn Cache>]>,
    ) -> mlx_models::Result<Array> {
        self.synced(|m| m.forward(inputs, caches))?
    }

    fn make_cache(&self) -> Vec<Box<dyn Cache>> {
        self.lock().make_cache()
    }

    fn defines_make_cache(&self) -> bool {
        self.defines_make_cache
    }

    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    fn trace(&self, inputs: &Array) -> mlx_models::Result<Vec<(String, Array)>> {
        self.synced(|m| m.trace(inputs))?
    }

    fn forward_hidden(&self, inputs: &Array) -> Option<mlx_models::Result<Array>> {
        self.synced(|m| m.forward_hidden(inputs))
            .unwrap_or_else(|e| Some(Err(e)))
    }

    fn output_head(&self) -> Option<OutputHead> {
        // The head is outside the decoder layers: never trained here.
        self.lock().output_head()
    }

    fn as_trainable_mut(&mut self) -> Option<&mut dyn Trainable> {
        Some(self)
    }
}

/// The wrapped model's parameter access (its `layers_path` is not forwarded: `model.layers`).
impl Trainable for FullModel {
    fn layer_adaptables_mut(&mut self) -> Vec<Vec<(String, mlx_models::layers::LinearMut<'_>)>> {
        match self.inner_mut().as_trainable_mut() {
            Some(t) => t.layer_adaptables_mut(),
            None => Vec::new(),
        }
    }

    fn top_modules_mut(&mut self) -> Vec<(String, mlx_models::models::TopModuleMut<'_>)> {
        match self.inner_mut().as_trainable_mut() {
            Some(t) => t.top_modules_mut(),
            None => Vec::new(),
        }
    }

    fn set_grad_checkpoint(&mut self, on: bool) -> bool {
        let range = if on { self.layers.clone() } else { 0..0 };
        match self.inner_mut().as_trainable_mut() {
            Some(t) => t.set_checkpoint_layer_params(range) && t.set_grad_checkpoint(on),
            None => false,
        }
    }

    /// The layers with the current values written in.
    fn layer_parameters_mut(&mut self) -> mlx_models::Result<Vec<Vec<LayerParam<'_>>>> {
        let values = self.params.snapshot();
        let inner = self.inner_mut();
        write_layer_parameters(inner.as_mut(), &values).map_err(crate::lora::model_err)?;
        match inner.as_trainable_mut() {
            Some(t) => t.layer_parameters_mut(),
            None => Ok(Vec::new()),
        }
    }
}
