//! mlx-lm's `grad_checkpoint` for the dedicated ports' layers (`tuner/trainer.py`): each
//! layer's call becomes `mx.checkpoint(inner_fn)(layer.trainable_parameters(), x, ...)`, so
//! its intermediates are recomputed in the backward pass. The dense model has its own (it also
//! carries adapters and segment caches); the ports train in full only, so a layer's inputs
//! are its hidden states and, while it trains, its own arrays.

use mlx_core::prelude::*;
use mlx_core::transforms;

use crate::error::{ModelError, Result};
use crate::layers::LayerParam;

/// A port's decoder layer whose own arrays can enter its checkpoint.
pub(crate) trait LayerArrays: Clone + Send + 'static {
    /// The layer's own arrays, always in the same order (their names are not used).
    fn arrays_mut(&mut self) -> Result<Vec<LayerParam<'_>>>;
}

/// `forward(layer, x)` under `mx.checkpoint`; with `own` (the layer trains in full) the
/// layer's own arrays, quantized ones excepted, are inputs of the checkpoint too.
pub(crate) fn checkpointed<L, F>(layer: &L, x: &Array, own: bool, forward: F) -> Result<Array>
where
    L: LayerArrays,
    F: Fn(&L, &Array) -> Result<Array> + Send + 'static,
{
    let mut inputs = vec![x.clone()];
    let mut block = layer.clone();
    if own {
        let arrays = block.arrays_mut()?;
        inputs.extend(
            arrays
                .into_iter()
                .filter(|p| !p.quantized)
                .map(|p| p.value.clone()),
        );
    }
    let f = transforms::checkpoint(move |xs: &[Array]| -> mlx_core::Result<Vec<Array>> {
        let cb = |e: ModelError| mlx_core::Error::Callback(e.to_string());
        let (x, own_values) = xs
            .split_first()
            .ok_or_else(|| mlx_core::Error::Callback("checkpoint: no input".into()))?;
        let mut block = block.clone();
        if own {
            let arrays = block.arrays_mut().map_err(cb)?;
            let slots: Vec<_> = arrays.into_iter().filter(|p| !p.quantized).collect();
            if slots.len() != own_values.len() {
                return Err(mlx_core::Error::Callback(format!(
                    "checkpoint: {} layer arrays for {} inputs",
                    slots.len(),
                    own_values.len()
                )));
            }
            for (p, v) in slots.into_iter().zip(own_values) {
                *p.value = v.clone();
            }
        }
        Ok(vec![forward(&block, x).map_err(cb)?])
    })?;
    f.call(&inputs)?
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::Other("checkpointed layer returned nothing".into()))
}
