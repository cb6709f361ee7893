//! The pieces every dedicated port repeated (issue #29): the config's positive-size checks,
//! the one-cache-per-layer check and mlx-lm's `create_attention_mask(h, cache[i])`, a list of
//! plain KV caches, and `sanitize`'s stacking of per-expert weights into a switch layer.

use mlx_cache::{AttentionMask, Cache, KVCache};
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::weights::Weights;

/// Every `(field, value)` positive, else a config error naming `config.json`, the type and the
/// field.
pub(crate) fn check_positive(model_type: &str, fields: &[(&str, i32)]) -> Result<()> {
    match fields.iter().find(|(_, v)| *v <= 0) {
        Some((name, v)) => Err(ModelError::Config(format!(
            "config.json (`{model_type}`): field `{name}` must be positive, got {v}"
        ))),
        None => Ok(()),
    }
}

/// Caches, when given, must be `expected` (one per layer, or what the port's `make_cache`
/// returns; `what` names them in the error: "layers", "attention layers", ...).
pub(crate) fn check_caches(
    caches: Option<&[Box<dyn Cache>]>,
    expected: usize,
    what: &str,
) -> Result<()> {
    match caches {
        Some(c) if c.len() != expected => Err(ModelError::Other(format!(
            "{} caches for {expected} {what}",
            c.len()
        ))),
        _ => Ok(()),
    }
}

/// mlx-lm's `create_attention_mask(h, cache[index], window_size, return_array)` for `n` new
/// positions: that cache's own `make_mask`, or `base.create_attention_mask`'s rule without a
/// cache (no mask for one token; an explicit one when asked or past the window; else causal).
pub(crate) fn cache_mask(
    caches: Option<&[Box<dyn Cache>]>,
    index: usize,
    n: usize,
    window: Option<usize>,
    return_array: bool,
) -> Result<AttentionMask> {
    match caches.and_then(|c| c.get(index)) {
        Some(c) => Ok(c.make_mask(n, window, return_array)?),
        None => Ok(mlx_cache::mask::fallback_mask(n, window, return_array)?),
    }
}

/// `n` plain `KVCache`s (mlx-lm's default `make_prompt_cache` for a model without
/// `make_cache`, or a `make_cache` that returns only those).
pub(crate) fn kv_caches(n: usize) -> Vec<Box<dyn Cache>> {
    (0..n)
        .map(|_| -> Box<dyn Cache> { Box::new(KVCache::new()) })
        .collect()
}

/// `sanitize`'s expert stacking: for each `(from, to)` projection and each `key` (`weight`,
/// `scales`, ...) that expert 0 has (`{experts}.0.{from}.{key}`), the `n` tensors
/// `{experts}.{e}.{from}.{key}` are removed and stacked on a new first axis as
/// `{switch}.{to}.{key}`. A later expert missing is an error naming its tensor. Returns whether
/// anything was stacked.
pub(crate) fn stack_experts(
    w: &mut Weights,
    experts: &str,
    switch: &str,
    n: i32,
    projections: &[(&str, &str)],
    keys: &[&str],
) -> Result<bool> {
    let mut stacked = false;
    for (from, to) in projections {
        for k in keys {
            if !w.contains(&format!("{experts}.0.{from}.{k}")) {
                continue;
            }
            let mut parts = Vec::with_capacity(n.max(0) as usize);
            for e in 0..n {
                let name = format!("{experts}.{e}.{from}.{k}");
                parts.push(
                    w.remove(&name)
                        .ok_or_else(|| ModelError::Weights(vec![format!("missing: {name}")]))?,
                );
            }
            let refs: Vec<&Array> = parts.iter().collect();
            w.insert(format!("{switch}.{to}.{k}"), ops::stack(&refs, 0, None)?);
            stacked = true;
        }
    }
    Ok(stacked)
}

/// The same names for `from` and `to` (`gate_proj` -> `gate_proj`, ...).
pub(crate) const GLU_PROJECTIONS: [(&str, &str); 3] = [
    ("gate_proj", "gate_proj"),
    ("down_proj", "down_proj"),
    ("up_proj", "up_proj"),
];

/// A quantized or dense linear's tensors.
pub(crate) const LINEAR_KEYS: [&str; 3] = ["weight", "scales", "biases"];
