//! Segmented backward: the sequence is cut into segments; the forward pass runs them in order
//! with the keys and values of the earlier segments as (detached) inputs, keeping only those
//! keys and values; the backward pass runs one `vjp` per segment in reverse, recomputing
//! that segment's forward and carrying the keys' and values' gradients to the segment
//! before. Only one segment's activations live at a time.
//!
//! With one segment the loss and gradients are `default_loss`'s bit for bit. With several,
//! attention and the gradient sums run in another order (stated bound: relative 1e-5).
//!
//! It composes with the other memory options: with the model's gradient checkpointing on,
//! each layer of a segment is a checkpoint (its cache's keys and values enter as inputs), and
//! with `ce_chunk` the segment's logits are projected and reduced a chunk at a time
//! ([`chunked_ce_sum`]). What stays alive between segments is one copy of the keys and values
//! of every layer (the earlier segments' inputs are slices of it, not copies) and, in the
//! backward pass, their gradients.

use mlx_cache::{Cache, ConcatenateKVCache, StateValue};
use mlx_core::prelude::*;
use mlx_models::LanguageModel;

use crate::error::{Result, TrainError};
use crate::loss::{chunked_ce_sum, cross_entropy, length_mask, no_hidden_states, shift};
use crate::params::Params;

/// One segment: `(sum of masked cross-entropy, full keys and values per layer)` from the
/// adapter parameters and the earlier keys and values.
struct Segment<'a> {
    model: &'a dyn LanguageModel,
    params: &'a Params,
    names: &'a [String],
    inputs: Array,
    targets: Array,
    mask: Array,
    first: bool,
    ce_chunk: Option<i32>,
}

impl Segment<'_> {
    fn run(&self, xs: &[Array]) -> Result<Vec<Array>> {
        let n = self.names.len();
        let map: ParamMap = self
            .names
            .iter()
            .cloned()
            .zip(xs[..n].iter().cloned())
            .collect();
        self.params.update(&map)?;
        let layers = self.model.num_layers();
        let mut caches: Vec<Box<dyn Cache>> = Vec::with_capacity(layers);
        for l in 0..layers {
            let c = if self.first {
                ConcatenateKVCache::new()
            } else {
                let (k, v) = (xs[n + 2 * l].clone(), xs[n + 2 * l + 1].clone());
                ConcatenateKVCache::from_state(StateValue::List(vec![
                    StateValue::Array(k),
                    StateValue::Array(v),
                ]))?
            };
            caches.push(Box::new(c));
        }
        let ce = match self.ce_chunk {
            None => {
                let logits = self.model.forward(&self.inputs, Some(&mut caches))?;
                let ce = (&cross_entropy(&logits, &self.targets)? * &self.mask)?;
                ce.astype(Dtype::Float32)?.sum_all(false)?
            }
            Some(chunk) => {
                let unsupported = || no_hidden_states(self.model);
                let h = self
                    .model
                    .forward_hidden_cached(&self.inputs, &mut caches)
                    .ok_or_else(unsupported)??;
                let head = self.model.output_head().ok_or_else(unsupported)?;
                chunked_ce_sum(&head, &h, &self.targets, &self.mask, chunk)?
            }
        };
        let mut out = vec![ce];
        for c in &caches {
            match c.fetch()? {
                Some(mlx_cache::Kv::Dense { keys, values }) => {
                    out.push(keys);
                    out.push(values);
                }
                _ => return Err(TrainError::Config("segment left no dense keys".into())),
            }
        }
        Ok(out)
    }
}

/// `default_loss` and its adapter gradients, computed segment by segment (`segment` target
/// positions each), the cross-entropy in chunks of `ce_chunk` positions when given. Only for
/// models whose layers all use plain KV caches (full attention).
pub fn segmented_loss_and_grad(
    model: &dyn LanguageModel,
    params: &Params,
    batch: &Array,
    lengths: &Array,
    segment: i32,
    ce_chunk: Option<i32>,
) -> Result<(Array, Array, ParamMap)> {
    if segment <= 0 {
        return Err(TrainError::Config(format!(
            "segment length must be positive, got {segment}"
        )));
    }
    if model
        .make_cache()
        .iter()
        .any(|c| c.class_name() != "KVCache")
    {
        return Err(TrainError::Config(format!(
            "segmented backward needs full attention in every layer ({} has other caches)",
            model.model_type()
        )));
    }
    let (inputs, targets) = shift(batch)?;
    let (b, t) = (targets.dim(0)?, targets.dim(1)?);
    let mask = length_mask(lengths, t)?;
    let ntoks = mask.sum_all(false)?;
    let current = params.snapshot();
    let names: Vec<String> = current.keys().cloned().collect();
    let pvals: Vec<Array> = current.values().cloned().collect();
    let bounds: Vec<(i32, i32)> = (0..t)
        .step_by(segment as usize)
        .map(|s| (s, (s + segment).min(t)))
        .collect();
    let seg = |s: i32, e: i32, first: bool| -> Result<Segment<'_>> {
        Ok(Segment {
            model,
            params,
            names: &names,
            inputs: inputs.slice(&[0, s], &[b, e], &[1, 1])?,
            targets: targets.slice(&[0, s], &[b, e], &[1, 1])?,
            mask: mask.slice(&[0, s], &[b, e], &[1, 1])?,
            first,
            ce_chunk,
        })
    };
    let result = (|| -> Result<(Array, ParamMap)> {
        // Forward: keep the latest keys/values (detached) and the loss sums. Each segment's
        // output holds the keys and values of every position so far, so the earlier ones are
        // freed as the next segment replaces them.
        let mut kv: Vec<Array> = Vec::new();
        let mut total: Option<Array> = None;
        for (i, &(s, e)) in bounds.iter().enumerate() {
            let sg = seg(s, e, i == 0)?;
            let mut xs = pvals.clone();
            xs.extend(kv.iter().cloned());
            let out = sg.run(&xs)?;
            let mut it = out.into_iter();
            let ce = it
                .next()
                .ok_or_else(|| TrainError::Config("empty segment".into()))?;
            let new_kv: Vec<Array> = it
                .map(|a| a.stop_gradient())
                .collect::<mlx_core::Result<_>>()?;
            let mut keep = new_kv.clone();
            keep.push(ce.clone());
            eval(&keep)?;
            total = Some(match total {
                None => ce,
                Some(a) => (&a + &ce)?,
            });
            kv = new_kv;
        }
        let total = total.ok_or_else(|| TrainError::Config("empty sequence".into()))?;
        let loss = (&total / &ntoks)?;
        // Backward, last segment first.
        let seed = (&Array::from_f32(1.0, Dtype::Float32)? / &ntoks)?;
        let mut cot_kv: Vec<Array> = kv
            .iter()
            .map(|a| ops::zeros_like(a, None))
            .collect::<mlx_core::Result<_>>()?;
        let mut grads: Option<Vec<Array>> = None;
        for (i, &(s, e)) in bounds.iter().enumerate().rev() {
            let sg = seg(s, e, i == 0)?;
            // This segment's input keys and values: the first `s` positions of the final ones
            // (slices share the final arrays' memory).
            let mut primals = pvals.clone();
            if i > 0 {
                for a in &kv {
                    let (b, h, d) = (a.dim(0)?, a.dim(1)?, a.dim(3)?);
                    primals.push(a.slice(&[0, 0, 0, 0], &[b, h, s, d], &[1, 1, 1, 1])?);
                }
            }
            let failure = std::cell::RefCell::new(None);
            let f = |xs: &[Array]| -> mlx_core::Result<Vec<Array>> {
                sg.run(xs).map_err(|e| {
                    let m = e.to_string();
                    *failure.borrow_mut() = Some(e);
                    mlx_core::Error::Callback(m)
                })
            };
            let mut cots = vec![seed.clone()];
            cots.extend(cot_kv.iter().cloned());
            let (_, vjps) = transforms::vjp(f, &primals, &cots)
                .map_err(|e| failure.take().unwrap_or(TrainError::Mlx(e)))?;
            let n = names.len();
            let g: Vec<Array> = vjps[..n].to_vec();
            cot_kv = vjps[n..].to_vec();
            grads = Some(match grads {
                None => g,
                Some(acc) => acc
                    .iter()
                    .zip(&g)
                    .map(|(a, x)| a + x)
                    .collect::<mlx_core::Result<_>>()?,
            });
            let mut keep = grads.clone().unwrap_or_default();
            keep.extend(cot_kv.iter().cloned());
            eval(&keep)?;
        }
        let grads = grads.unwrap_or_default();
        Ok((loss, names.iter().cloned().zip(grads).collect()))
    })();
    params.update(&current)?;
    let (loss, grads) = result?;
    Ok((loss, ntoks, grads))
}
