//! Architectures. Each is a port of `mlx_lm/models/<model_type>.py` with the same structure
//! (args, attention, MLP, block, inner model, outer model, sanitize) and op order.

pub mod llama;

use mlx_cache::Cache;
use mlx_core::prelude::*;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::Weights;

/// A causal language model: token ids in, logits out. Models never own caches.
pub trait LanguageModel: Send {
    /// `inputs` of shape `(batch, seq)` (int32) to logits `(batch, seq, vocab)`. With
    /// `caches` (one per layer, from [`LanguageModel::make_cache`] or loaded), keys and values
    /// are appended and attention covers everything cached; without, the whole sequence is
    /// attended causally.
    fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array>;

    /// Fresh caches, one per layer, of the kinds this architecture uses.
    fn make_cache(&self) -> Vec<Box<dyn Cache>>;

    /// Whether the mlx-lm model class defines `make_cache` (then `make_prompt_cache` ignores
    /// `max_kv_size`, as mlx-lm does); otherwise [`LanguageModel::make_cache`] is the default
    /// of plain caches.
    fn defines_make_cache(&self) -> bool;

    fn num_layers(&self) -> usize;

    /// The `model_type` this was built from.
    fn model_type(&self) -> &str;

    /// Vocabulary size (last dimension of the logits).
    fn vocab_size(&self) -> i32;
}

/// Builds the model named by `config.architecture` from `weights`, strictly: every problem
/// with the weights is reported together.
pub fn build(config: &ModelConfig, mut weights: Weights) -> Result<Box<dyn LanguageModel>> {
    check_layer_count(config, &weights)?;
    let model: Box<dyn LanguageModel> = match config.architecture.as_str() {
        "llama" => Box::new(llama::Model::load(config, &mut weights)?),
        other => {
            return Err(crate::ModelError::UnsupportedModelType {
                model_type: other.to_string(),
                supported: crate::config::SUPPORTED_MODEL_TYPES
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            })
        }
    };
    weights.finish()?;
    Ok(model)
}

/// Refuses a `num_hidden_layers` past the layers the files hold tensors for before any layer
/// is built: such a model would only fail with every tensor of every missing layer listed, after
/// building them all (a `num_hidden_layers` of a million once used 17 GB doing so).
fn check_layer_count(config: &ModelConfig, weights: &Weights) -> Result<()> {
    let Some(v) = config.raw.get("num_hidden_layers") else {
        return Ok(());
    };
    let n = v
        .as_i64()
        .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
        .ok_or_else(|| {
            ModelError::Config(format!(
                "`num_hidden_layers` must be a non-negative 32-bit integer, got {v}"
            ))
        })?;
    let present = weights.layers_present("model.layers.");
    if n as usize > present {
        return Err(ModelError::Weights(vec![format!(
            "num_hidden_layers (GGUF: llama.block_count) is {n} but the weights hold tensors for \
             {present} layers: \
             model.layers.{present} to model.layers.{} are missing",
            n - 1
        )]));
    }
    Ok(())
}
