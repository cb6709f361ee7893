//! Architectures. Each is a port of `mlx_lm/models/<model_type>.py` with the same structure
//! (args, attention, MLP, block, inner model, outer model, sanitize) and op order.

pub mod llama;

use mlx_cache::Cache;
use mlx_core::prelude::*;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{Embedding, Linear};
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

    /// The linears of each decoder layer (`model.layers`), under their path inside the layer
    /// as mlx-lm names the modules (`self_attn.q_proj`), in the order the Python module
    /// declares them; adapters (LoRA, DoRA) wrap or replace them in place. Empty when the
    /// architecture does not support adapters.
    fn layer_linears_mut(&mut self) -> Vec<Vec<(&'static str, &mut Linear)>> {
        Vec::new()
    }

    /// The hidden states before the output projection (`forward` is
    /// `output_head().forward(forward_hidden(...))`), for losses that project them in chunks.
    /// `None` when the architecture does not split its forward.
    fn forward_hidden(&self, _inputs: &Array) -> Option<Result<Array>> {
        None
    }

    /// Recompute each decoder layer in the backward pass instead of keeping its
    /// activations (mlx-lm's `grad_checkpoint`, applied to every layer). Adapter
    /// parameters enter each checkpoint as inputs, so their gradients are unchanged.
    /// Returns whether the architecture supports it.
    fn set_grad_checkpoint(&mut self, _on: bool) -> bool {
        false
    }

    /// The output projection that turns [`LanguageModel::forward_hidden`] into logits.
    fn output_head(&self) -> Option<OutputHead> {
        None
    }
}

/// A model's output projection: its own `lm_head`, or the tied input embedding.
#[derive(Clone, Debug)]
pub enum OutputHead {
    Linear(Linear),
    Tied(Embedding),
}

impl OutputHead {
    pub fn forward(&self, h: &Array) -> Result<Array> {
        match self {
            OutputHead::Linear(l) => l.forward(h),
            OutputHead::Tied(e) => e.as_linear(h),
        }
    }
}

/// Builds the model named by `config.architecture` from `weights`, strictly: every problem
/// with the weights is reported together.
pub fn build(config: &ModelConfig, mut weights: Weights) -> Result<Box<dyn LanguageModel>> {
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
