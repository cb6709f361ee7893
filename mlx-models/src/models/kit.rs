//! The pieces every dedicated port repeated (issue #29): the config's positive-size checks,
//! the one-cache-per-layer check and mlx-lm's `create_attention_mask(h, cache[i])`, a list of
//! plain KV caches, and `sanitize`'s stacking of per-expert weights into a switch layer.

use mlx_cache::{ArraysCache, AttentionMask, Cache, KVCache, RotatingKVCache};
use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::weights::Weights;

mod attention;
pub(crate) use attention::{Attention, AttentionSpec, HeadGate, LayerNormQk, RopeAt, Score};

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
        Some(c) if c.len() != expected => Err(ModelError::Cache {
            what: "caches".into(),
            problem: format!("{} caches for {expected} {what}", c.len()),
        }),
        _ => Ok(()),
    }
}

/// A short port's `hidden_states` opening: the inputs are `(batch, seq)` token ids and the
/// caches, when given, `expected` ([`check_caches`]); returns the number of new positions.
pub(crate) fn new_positions(
    inputs: &Array,
    caches: Option<&[Box<dyn Cache>]>,
    expected: usize,
    what: &str,
) -> Result<usize> {
    check_inputs(inputs)?;
    check_caches(caches, expected, what)?;
    Ok(inputs.shape()[1] as usize)
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

/// The masks of a stack of attention and recurrent layers for `n` new positions, after
/// checking there is one cache per layer: the cache mask of the first attention layer
/// (`fa_idx`) and the array mask of the first recurrent layer (`ssm_idx`); without caches the
/// causal fallback and no recurrent mask.
pub(crate) fn hybrid_masks(
    caches: Option<&[Box<dyn Cache>]>,
    layers: usize,
    fa_idx: Option<usize>,
    ssm_idx: Option<usize>,
    n: usize,
) -> Result<(AttentionMask, Option<Array>)> {
    match caches {
        Some(c) => {
            check_caches(Some(c), layers, "layers")?;
            let fa = match fa_idx {
                Some(i) => c[i].make_mask(n, None, false)?,
                None => AttentionMask::None,
            };
            let ssm = match ssm_idx {
                Some(i) => c[i].make_mask(n, None, false)?.as_array().cloned(),
                None => None,
            };
            Ok((fa, ssm))
        }
        None => Ok((mlx_cache::mask::fallback_mask(n, None, false)?, None)),
    }
}

/// `n` plain `KVCache`s (mlx-lm's default `make_prompt_cache` for a model without
/// `make_cache`, or a `make_cache` that returns only those).
pub(crate) fn kv_caches(n: usize) -> Vec<Box<dyn Cache>> {
    (0..n)
        .map(|_| -> Box<dyn Cache> { Box::new(KVCache::new()) })
        .collect()
}

/// A `make_cache` of sliding and global layers: a `RotatingKVCache(window)` for each layer
/// flagged sliding, else a `KVCache` (also where the window is zero, which each port's load
/// rejects first).
pub(crate) fn sliding_caches(
    sliding: impl Iterator<Item = bool>,
    window: usize,
) -> Vec<Box<dyn Cache>> {
    sliding
        .map(|s| -> Box<dyn Cache> {
            match (s, RotatingKVCache::new(window, 0)) {
                (true, Ok(c)) => Box::new(c),
                _ => Box::new(KVCache::new()),
            }
        })
        .collect()
}

/// A hybrid model's `make_cache`: a `KVCache` for each attention layer, an
/// `ArraysCache(states)` for each recurrent one.
pub(crate) fn hybrid_caches(
    attention: impl Iterator<Item = bool>,
    states: usize,
) -> Vec<Box<dyn Cache>> {
    attention
        .map(|a| -> Box<dyn Cache> {
            if a {
                Box::new(KVCache::new())
            } else {
                Box::new(ArraysCache::new(states))
            }
        })
        .collect()
}

/// Multi-token-prediction layer `k` of `layers`, else an error naming both.
pub(crate) fn mtp_layer<T>(layers: &[T], k: usize) -> Result<&T> {
    layers.get(k).ok_or_else(|| ModelError::Input {
        what: format!("multi-token-prediction layer {k}"),
        problem: format!("out of range: the model has {}", layers.len()),
    })
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

/// `y.reshape(B, L, n, -1).transpose(0, 2, 1, 3)`: a projection's `(B, L, n * d)` as `n`
/// heads `(B, n, L, d)`.
pub(crate) fn split_heads(y: &Array, n: i32) -> Result<Array> {
    let s = y.shape();
    let y = ops::reshape(y, &[s[0], s[1], n, -1], None)?;
    Ok(ops::transpose(&y, &[0, 2, 1, 3], None)?)
}

/// `out.transpose(0, 2, 1, 3).reshape(B, L, -1)`: attention heads `(B, n, L, d)` joined back.
pub(crate) fn merge_heads(out: &Array) -> Result<Array> {
    let s = out.shape();
    let out = ops::transpose(out, &[0, 2, 1, 3], None)?;
    Ok(ops::reshape(&out, &[s[0], s[2], -1], None)?)
}

/// `cache.update_and_fetch(keys, values)` with a cache, the new keys and values without.
pub(crate) fn cached_kv(
    cache: Option<&mut Box<dyn Cache>>,
    keys: Array,
    values: Array,
) -> Result<mlx_cache::Kv> {
    match cache {
        Some(c) => Ok(c.update_and_fetch(&keys, &values)?),
        None => Ok(mlx_cache::Kv::Dense { keys, values }),
    }
}

/// The `LanguageModel` methods a short inference-only port writes the same way: `forward`
/// (its `hidden_states`, then its `head`), `forward_hidden`, and `model_type` / `vocab_size`
/// from its config field `$args` (the vocabulary under `$vocab`).
macro_rules! short_port_entry_points {
    ($args:ident, $vocab:ident) => {
        fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
            let h = self.hidden_states(inputs, caches)?;
            self.head(&h)
        }

        fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
            Some(self.hidden_states(inputs, None))
        }

        fn model_type(&self) -> &str {
            &self.$args.model_type
        }

        fn vocab_size(&self) -> i32 {
            self.$args.$vocab
        }
    };
}
pub(crate) use short_port_entry_points;

/// The `LanguageModel` entry points of a port whose `hidden_states(inputs, caches)` runs its
/// layers and whose `head(h)` projects: `forward` (the two in turn), `forward_hidden` and
/// `forward_hidden_cached`; with `tied lm_head, embed` the head is
/// [`project`](crate::models::project) (the `lm_head` linear, or the `embed` embedding when
/// the head is tied; the port writes no `head`), and `output_head` is that projection.
macro_rules! hidden_state_entry_points {
    () => {
        fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
            let out = self.hidden_states(inputs, caches)?;
            self.head(&out)
        }

        $crate::models::kit::hidden_state_entry_points!(@hidden);
    };
    (tied $lm_head:ident, $embed:ident) => {
        fn forward(&self, inputs: &Array, caches: Option<&mut [Box<dyn Cache>]>) -> Result<Array> {
            let out = self.hidden_states(inputs, caches)?;
            $crate::models::project(self.$lm_head.as_ref(), &self.$embed, &out)
        }

        $crate::models::kit::hidden_state_entry_points!(@hidden);

        fn output_head(&self) -> Option<$crate::models::OutputHead> {
            Some($crate::models::OutputHead::of(
                self.$lm_head.as_ref(),
                &self.$embed,
            ))
        }
    };
    (@hidden) => {
        fn forward_hidden(&self, inputs: &Array) -> Option<Result<Array>> {
            Some(self.hidden_states(inputs, None))
        }

        fn forward_hidden_cached(
            &self,
            inputs: &Array,
            caches: &mut [Box<dyn Cache>],
        ) -> Option<Result<Array>> {
            Some(self.hidden_states(inputs, Some(caches)))
        }
    };
}
pub(crate) use hidden_state_entry_points;

/// The cache methods of a port whose `make_cache` returns one cache per entry of its `layers`:
/// `make_cache` as written in the call (its doc comments kept), `defines_make_cache` true, and
/// `num_layers` the number of `layers`.
macro_rules! layer_caches {
    ($(#[$doc:meta])* fn make_cache(&$self:ident) $body:block) => {
        $(#[$doc])*
        fn make_cache(&$self) -> Vec<Box<dyn Cache>> $body

        fn defines_make_cache(&self) -> bool {
            true
        }

        fn num_layers(&self) -> usize {
            self.layers.len()
        }
    };
}
pub(crate) use layer_caches;

/// `Trainable::layer_adaptables_mut` and `layer_parameters_mut` of a port whose decoder layers
/// (`self.$layers`, under `layers_path()`) are [`Walkable`](crate::layers::Walkable): both
/// lists come from each layer's one walk.
macro_rules! walked_layers {
    ($layers:ident) => {
        fn layer_adaptables_mut(&mut self) -> Vec<Vec<(String, $crate::layers::LinearMut<'_>)>> {
            self.$layers
                .iter_mut()
                .map(|l| $crate::layers::Walk::linears_of(l))
                .collect()
        }

        fn layer_parameters_mut(
            &mut self,
        ) -> $crate::error::Result<Vec<Vec<$crate::layers::LayerParam<'_>>>> {
            let root = self.layers_path();
            self.$layers
                .iter_mut()
                .enumerate()
                .map(|(i, l)| $crate::layers::Walk::params_of(l, &format!("{root}.{i}")))
                .collect()
        }
    };
}
pub(crate) use walked_layers;

/// `head_dim ** -0.5` as the ports compute it (in f64, then f32).
pub(crate) fn head_scale(hd: i32) -> f32 {
    f64::from(hd).powf(-0.5) as f32
}

/// A hybrid layer's recurrent cache and KV cache.
pub(crate) type LayerCaches<'a> = (Option<&'a mut ArraysCache>, Option<&'a mut Box<dyn Cache>>);

/// The two caches of hybrid layer `i`'s `CacheList` (an `ArraysCache`, then a KV cache), as
/// baichuan_m1 and falcon_h1 hold them; both `None` without a cache.
pub(crate) fn split_recurrent_cache(
    c: Option<&mut Box<dyn Cache>>,
    i: usize,
) -> Result<LayerCaches<'_>> {
    let Some(c) = c else {
        return Ok((None, None));
    };
    let wrong = || ModelError::Cache {
        what: format!("layer {i}"),
        problem: "needs a CacheList of an ArraysCache and a KV cache".into(),
    };
    let list = c
        .as_any_mut()
        .downcast_mut::<mlx_cache::CacheList>()
        .ok_or_else(wrong)?;
    match list.caches_mut() {
        [recurrent, kv] => {
            let recurrent = recurrent
                .as_any_mut()
                .downcast_mut::<ArraysCache>()
                .ok_or_else(wrong)?;
            Ok((Some(recurrent), Some(kv)))
        }
        _ => Err(wrong()),
    }
}

/// A port's `hidden_states` opening: the token ids checked ([`check_inputs`]) and embedded,
/// with the number of new positions.
pub(crate) fn embed_inputs(
    inputs: &Array,
    embed: &crate::layers::Embedding,
) -> Result<(Array, usize)> {
    check_inputs(inputs)?;
    let h = embed.forward(inputs)?;
    let n = h.shape().get(1).copied().unwrap_or(0) as usize;
    Ok((h, n))
}

/// `model_type` and `vocab_size` inside a port's `impl LanguageModel`: the port's own fields
/// of those names, or with `$cfg` its config field's.
macro_rules! own_type_and_vocab {
    () => {
        fn model_type(&self) -> &str {
            &self.model_type
        }

        fn vocab_size(&self) -> i32 {
            self.vocab_size
        }
    };
    ($cfg:ident) => {
        fn model_type(&self) -> &str {
            &self.$cfg.model_type
        }

        fn vocab_size(&self) -> i32 {
            self.$cfg.vocab_size
        }
    };
}
pub(crate) use own_type_and_vocab;

/// The token ids a model's `forward` accepts: `(batch, seq)` of an integer type.
pub(crate) fn check_inputs(inputs: &Array) -> Result<()> {
    if inputs.ndim() != 2 || !inputs.dtype().is_integer() {
        return Err(ModelError::Input {
            what: "inputs".into(),
            problem: format!(
                "must be (batch, seq) integer token ids, got shape {:?} of {:?}",
                inputs.shape(),
                inputs.dtype()
            ),
        });
    }
    Ok(())
}
