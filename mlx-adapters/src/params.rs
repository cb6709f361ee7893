//! The trainable parameters, shared between the adapters inside a model and the training
//! loop. An adapter reads its arrays from here on every forward pass, so the loop can hand
//! the model tracers (for `value_and_grad`) or updated values without rebuilding it: the
//! equivalent of `model.update(params)` in mlx.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use mlx_core::prelude::*;

use crate::error::{Result, TrainError};

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
