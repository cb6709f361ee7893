//! mlx-lm's `grad_checkpoint` for the dedicated ports' layers (`tuner/trainer.py`): each
//! layer's call becomes `mx.checkpoint(inner_fn)(layer.trainable_parameters(), x, ...)`, so
//! its intermediates are recomputed in the backward pass. The dense model has its own (it also
//! carries segment caches); a port layer's inputs are its hidden states, its adapters' arrays
//! (LoRA, DoRA) and, while it trains in full, its own arrays.

use std::sync::{Arc, Mutex};

use mlx_cache::{cache_from_state, Cache, ConcatenateKVCache, StateValue};
use mlx_core::prelude::*;
use mlx_core::transforms;

use crate::error::{ModelError, Result};
use crate::layers::{LayerParam, LinearMut, Walk, Walkable};

/// A port's decoder layer whose own arrays can enter its checkpoint: both lists come from
/// the layer's one [`Walkable::walk`].
pub(crate) trait LayerArrays: Walkable + Clone + Send + 'static {
    /// The layer's own arrays, always in the same order (their names are not used).
    fn arrays_mut(&mut self) -> Result<Vec<LayerParam<'_>>> {
        Walk::params_of(self, "")
    }
    /// The layer's linears and switch linears, always in the same order: the adapted ones'
    /// trainable arrays enter the checkpoint as inputs (else their gradients would not flow
    /// through it).
    fn linears(&mut self) -> Vec<LinearMut<'_>> {
        Walk::linears_of(self).into_iter().map(|(_, l)| l).collect()
    }
}

/// The trainable arrays of the layer's adapters, in [`LayerArrays::linears`] order.
fn adapter_arrays<L: LayerArrays>(layer: &mut L) -> Result<Vec<Array>> {
    let mut out = Vec::new();
    for l in layer.linears() {
        out.extend(l.adapter_parameters()?);
    }
    Ok(out)
}

/// Hands the adapters their arrays from `values` (as [`adapter_arrays`] ordered them).
fn set_adapter_arrays<L: LayerArrays>(layer: &mut L, values: &[Array]) -> Result<()> {
    let mut i = 0;
    for l in layer.linears() {
        let n = l.adapter_parameters()?.len();
        if n == 0 {
            continue;
        }
        let vals = values.get(i..i + n).ok_or_else(|| ModelError::Internal {
            what: "checkpoint".into(),
            problem: "missing adapter inputs".into(),
        })?;
        l.set_adapter_parameters(vals)?;
        i += n;
    }
    Ok(())
}

/// `forward(layer, x)` under `mx.checkpoint`; with `own` (the layer trains in full) the
/// layer's own arrays, quantized ones excepted, are inputs of the checkpoint too.
pub(crate) fn checkpointed<L, F>(layer: &L, x: &Array, own: bool, forward: F) -> Result<Array>
where
    L: LayerArrays,
    F: Fn(&L, &Array) -> Result<Array> + Send + 'static,
{
    let out = checkpointed_many(layer, std::slice::from_ref(x), own, move |l, xs| {
        let x = xs.first().ok_or_else(|| ModelError::Internal {
            what: "checkpoint".into(),
            problem: "no input".into(),
        })?;
        Ok(vec![forward(l, x)?])
    })?;
    out.into_iter().next().ok_or_else(|| ModelError::Internal {
        what: "checkpointed layer".into(),
        problem: "returned nothing".into(),
    })
}

/// `forward(layer, inputs)` under `mx.checkpoint`, for a layer with several array inputs and
/// outputs (gemma4_text's shared keys and values, per-layer inputs); with `own`, the layer's
/// own arrays (quantized ones excepted) follow `inputs` as inputs of the checkpoint.
pub(crate) fn checkpointed_many<L, F>(
    layer: &L,
    inputs: &[Array],
    own: bool,
    forward: F,
) -> Result<Vec<Array>>
where
    L: LayerArrays,
    F: Fn(&L, &[Array]) -> Result<Vec<Array>> + Send + 'static,
{
    let n = inputs.len();
    let mut all = inputs.to_vec();
    let mut block = layer.clone();
    let adapters = adapter_arrays(&mut block)?;
    let n_adapters = adapters.len();
    all.extend(adapters);
    if own {
        let arrays = block.arrays_mut()?;
        all.extend(
            arrays
                .into_iter()
                .filter(|p| !p.quantized)
                .map(|p| p.value.clone()),
        );
    }
    let f = transforms::checkpoint(move |xs: &[Array]| -> mlx_core::Result<Vec<Array>> {
        let cb = |e: ModelError| mlx_core::Error::Callback(e.to_string());
        let (args, rest) = xs.split_at(n.min(xs.len()));
        let (adapters, own_values) = rest.split_at(n_adapters.min(rest.len()));
        let mut block = block.clone();
        set_adapter_arrays(&mut block, adapters).map_err(cb)?;
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
        forward(&block, args).map_err(cb)
    })?;
    Ok(f.call(&all)?)
}

/// One layer of a port's layer stack, as every port's loop runs it: `forward(layer, h, cache)`
/// directly, or under `mx.checkpoint` when the model trains with `grad_checkpoint` (`own`:
/// the layer trains in full), with or without the segmented backward's cache.
pub(crate) fn layer_step<L, F>(
    layer: &L,
    h: &Array,
    cache: Option<&mut Box<dyn Cache>>,
    checkpoint: Option<bool>,
    forward: F,
) -> Result<Array>
where
    L: LayerArrays,
    F: Fn(&L, &Array, Option<&mut Box<dyn Cache>>) -> Result<Array> + Send + 'static,
{
    match (cache, checkpoint) {
        (None, Some(own)) => checkpointed(layer, h, own, move |l, x| forward(l, x, None)),
        (Some(c), Some(own)) => {
            checkpointed_cached(layer, h, own, c, move |l, x, c| forward(l, x, Some(c)))
        }
        (cache, None) => forward(layer, h, cache),
    }
}

/// The one layer loop of the ports: `step(i, layer, h, cache)` over each layer in turn, `h`
/// threaded through, layer `i` given the `i`-th of `caches` (the caller checked there is one
/// per layer); the per-layer mixer dispatch is the port's `step`. [`layer_stack`] is this loop
/// with each step under `mx.checkpoint` when the model trains; ports whose layers have no
/// walk (inference only: no adapters, no checkpoints) run it directly.
pub(crate) fn layer_loop<L>(
    layers: &[L],
    mut h: Array,
    mut caches: Option<&mut [Box<dyn Cache>]>,
    mut step: impl FnMut(usize, &L, &Array, Option<&mut Box<dyn Cache>>) -> Result<Array>,
) -> Result<Array> {
    for (i, layer) in layers.iter().enumerate() {
        let cache = caches.as_deref_mut().map(|c| &mut c[i]);
        h = step(i, layer, &h, cache)?;
    }
    Ok(h)
}

/// A port's layer stack: each layer over `h` in turn ([`layer_loop`]) through [`layer_step`],
/// under `mx.checkpoint` when the model trains with `grad_checkpoint` (`own`: the layers that
/// train in full); `forward_of(i)` is layer `i`'s forward (it owns what it needs: masks,
/// index).
pub(crate) fn layer_stack<L, F>(
    layers: &[L],
    h: Array,
    caches: Option<&mut [Box<dyn Cache>]>,
    grad_checkpoint: bool,
    own: &std::ops::Range<usize>,
    forward_of: impl Fn(usize) -> F,
) -> Result<Array>
where
    L: LayerArrays,
    F: Fn(&L, &Array, Option<&mut Box<dyn Cache>>) -> Result<Array> + Send + 'static,
{
    layer_loop(layers, h, caches, |i, layer, h, cache| {
        let ckpt = grad_checkpoint.then(|| own.contains(&i));
        layer_step(layer, h, cache, ckpt, forward_of(i))
    })
}

/// A cache state's tree with its arrays taken out (their places marked).
enum StateShape {
    Array,
    Leaf(StateValue),
    List(Vec<StateShape>),
}

/// A cache state as its shape and its arrays, depth first.
fn split_state(state: StateValue) -> (StateShape, Vec<Array>) {
    fn walk(v: StateValue, out: &mut Vec<Array>) -> StateShape {
        match v {
            StateValue::Array(a) => {
                out.push(a);
                StateShape::Array
            }
            StateValue::List(items) => {
                StateShape::List(items.into_iter().map(|i| walk(i, out)).collect())
            }
            leaf => StateShape::Leaf(leaf),
        }
    }
    let mut arrays = Vec::new();
    let shape = walk(state, &mut arrays);
    (shape, arrays)
}

/// The state of `shape` with `arrays` put back in order.
fn fill_state(shape: &StateShape, arrays: &[Array]) -> Result<StateValue> {
    fn walk(s: &StateShape, it: &mut std::slice::Iter<'_, Array>) -> Result<StateValue> {
        Ok(match s {
            StateShape::Array => StateValue::Array(
                it.next()
                    .ok_or_else(|| ModelError::Internal {
                        what: "checkpoint".into(),
                        problem: "missing cache arrays".into(),
                    })?
                    .clone(),
            ),
            StateShape::Leaf(v) => v.clone(),
            StateShape::List(items) => {
                StateValue::List(items.iter().map(|i| walk(i, it)).collect::<Result<_>>()?)
            }
        })
    }
    let mut it = arrays.iter();
    let v = walk(shape, &mut it)?;
    if it.next().is_some() {
        return Err(ModelError::Internal {
            what: "checkpoint".into(),
            problem: "more cache arrays than the cache holds".into(),
        });
    }
    Ok(v)
}

/// [`checkpointed`] for a layer writing one of training's caches (the segmented backward's
/// `ConcatenateKVCache` of keys and values, or `ArraysCache` of recurrent state): the arrays
/// the cache holds enter the checkpoint, the arrays it holds afterwards come out of it, and
/// the cache is rebuilt from those, so the checkpointed function stays pure. Any other cache
/// (generation's) runs the layer as it is, with no checkpoint.
pub(crate) fn checkpointed_cached<L, F>(
    layer: &L,
    x: &Array,
    own: bool,
    cache: &mut Box<dyn Cache>,
    forward: F,
) -> Result<Array>
where
    L: LayerArrays,
    F: Fn(&L, &Array, &mut Box<dyn Cache>) -> Result<Array> + Send + 'static,
{
    let class = cache.class_name();
    if !matches!(class, "ConcatenateKVCache" | "ArraysCache") {
        return forward(layer, x, cache);
    }
    let (before, prev) = split_state(cache.state());
    let after: Arc<Mutex<Option<StateShape>>> = Arc::new(Mutex::new(None));
    let after_in = Arc::clone(&after);
    let mut inputs = vec![x.clone()];
    inputs.extend(prev);
    let out = checkpointed_many(layer, &inputs, own, move |l, xs| {
        let (x, prev) = xs.split_first().ok_or_else(|| ModelError::Internal {
            what: "checkpoint".into(),
            problem: "no input".into(),
        })?;
        let mut c = cache_from_state(class, fill_state(&before, prev)?)?;
        let h = forward(l, x, &mut c)?;
        let (shape, arrays) = split_state(c.state());
        if let Ok(mut slot) = after_in.lock() {
            *slot = Some(shape);
        }
        let mut out = vec![h];
        out.extend(arrays);
        Ok(out)
    })?;
    let shape = after
        .lock()
        .ok()
        .and_then(|mut s| s.take())
        .ok_or_else(|| ModelError::Internal {
            what: "checkpoint".into(),
            problem: "the layer did not run".into(),
        })?;
    let (h, arrays) = out.split_first().ok_or_else(|| ModelError::Internal {
        what: "checkpointed layer".into(),
        problem: "returned nothing".into(),
    })?;
    *cache = cache_from_state(class, fill_state(&shape, arrays)?)?;
    Ok(h.clone())
}

/// A `ConcatenateKVCache` holding `kv` (keys, then values), or an empty one.
pub(crate) fn concat_cache(kv: &[Array]) -> Result<ConcatenateKVCache> {
    match kv {
        [k, v] => Ok(ConcatenateKVCache::holding(k.clone(), v.clone())?),
        [] => Ok(ConcatenateKVCache::new()),
        _ => Err(ModelError::Internal {
            what: "a concatenating cache".into(),
            problem: "holds keys and values".into(),
        }),
    }
}
