//! The trainable parameters, shared between the adapters inside a model and the training
//! loop. An adapter reads its arrays from here on every forward pass, so the loop can hand
//! the model tracers (for `value_and_grad`) or updated values without rebuilding it: the
//! equivalent of `model.update(params)` in mlx.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use mlx_core::io::load_safetensors;
use mlx_core::prelude::*;

use crate::error::{io_err, Result, TrainError};

#[derive(Debug, Default)]
struct Inner {
    values: BTreeMap<String, Array>,
    training: bool,
    disabled: bool,
}

/// Named trainable arrays (`model.trainable_parameters()`, flattened with mlx's dotted
/// names) plus the train/eval mode (`model.train()` / `model.eval()`, for dropout).
#[derive(Clone, Debug, Default)]
pub struct Params(Arc<Mutex<Inner>>);

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-update; the map is whole.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a parameter; a name given twice is an error.
    pub fn insert(&self, name: &str, value: Array) -> Result<()> {
        let mut g = self.lock();
        if g.values.contains_key(name) {
            return Err(TrainError::Config(format!(
                "parameter {name} defined twice"
            )));
        }
        g.values.insert(name.to_string(), value);
        Ok(())
    }

    /// The current value of `name`.
    pub fn get(&self, name: &str) -> Result<Array> {
        self.lock()
            .values
            .get(name)
            .cloned()
            .ok_or_else(|| TrainError::Config(format!("no trainable parameter {name}")))
    }

    /// Every parameter, by name (sorted, as `tree_flatten` of a dict tree is not, but names
    /// are all that matter here).
    pub fn snapshot(&self) -> ParamMap {
        self.lock().values.clone()
    }

    /// Replaces the values of the given names (every name must exist).
    pub fn update(&self, values: &ParamMap) -> Result<()> {
        let mut g = self.lock();
        for (k, v) in values {
            match g.values.get_mut(k) {
                Some(slot) => *slot = v.clone(),
                None => return Err(TrainError::Config(format!("no trainable parameter {k}"))),
            }
        }
        Ok(())
    }

    pub fn names(&self) -> Vec<String> {
        self.lock().values.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.lock().values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn set_training(&self, training: bool) {
        self.lock().training = training;
    }

    pub fn training(&self) -> bool {
        self.lock().training
    }

    /// Switches every adapter off (the model computes as its base) or back on.
    pub fn set_enabled(&self, enabled: bool) {
        self.lock().disabled = !enabled;
    }

    pub fn enabled(&self) -> bool {
        !self.lock().disabled
    }
}

/// Reads an adapter file (LoRA/DoRA arrays, or a full fine-tune's layer arrays), checking each
/// tensor against `allowed` (name to shape and dtype) as mlx-lm's `load_adapters` does (every
/// problem listed together). A floating-point tensor may
/// replace one of another floating-point dtype (mlx-lm's `load_weights` keeps the file's);
/// any other dtype must match exactly (an integer array where the model holds floats, or a
/// float where it holds a quantized linear's packed weight, would only fail in the forward).
pub(crate) fn read_checked(
    path: &Path,
    allowed: &BTreeMap<String, (Vec<i32>, Dtype)>,
) -> Result<ParamMap> {
    let (weights, _) = load_safetensors(path, None).map_err(|e| io_err(path, e))?;
    let mut errors = Vec::new();
    for (name, w) in &weights {
        match allowed.get(name) {
            None => errors.push(format!("  {name}: not an adapter parameter in the model")),
            Some((shape, _)) if *shape != w.shape() => errors.push(format!(
                "  {name}: adapter shape {:?} does not match model parameter shape {:?}",
                w.shape(),
                shape
            )),
            Some((_, dtype))
                if w.dtype() != *dtype && !(w.dtype().is_floating() && dtype.is_floating()) =>
            {
                errors.push(format!(
                    "  {name}: adapter dtype {} does not suit model parameter dtype {dtype}",
                    w.dtype()
                ))
            }
            Some(_) => {}
        }
    }
    if !errors.is_empty() {
        return Err(io_err(
            path,
            format!("contains incompatible tensors:\n{}", errors.join("\n")),
        ));
    }
    Ok(weights)
}
