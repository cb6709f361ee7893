//! Segmented backward: the sequence is cut into segments; the forward pass runs them in order
//! with what the earlier segments left as (detached) inputs: the keys and values of the
//! attention layers (full or sliding-window) and the state of the recurrent ones
//! (convolutions, linear attention: lfm2, qwen3_next, qwen3_5). The backward pass runs one
//! `vjp` per segment in reverse, recomputing that segment's forward and carrying the
//! gradients of those keys, values and states to the segment before. Only one segment's
//! activations live at a time.
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

use mlx_cache::{ArraysCache, Cache, ConcatenateKVCache};
use mlx_core::prelude::*;
use mlx_models::LanguageModel;

use crate::error::{Result, TrainError};
use crate::loss::{chunked_ce_sum, cross_entropy, length_mask, no_hidden_states, shift};
use crate::params::Params;

/// What a layer carries from one segment to the next.
#[derive(Clone, Copy, Debug)]
enum Carry {
    /// Attention (full or sliding-window): the keys and values of every earlier position,
    /// in a `ConcatenateKVCache` (the window is the mask's business).
    Kv,
    /// A recurrent layer (`ArraysCache`): its state arrays, `slots` of them (the
    /// convolution's tail, the linear attention's state).
    State { slots: usize },
}

impl Carry {
    fn arrays(self) -> usize {
        match self {
            Carry::Kv => 2,
            Carry::State { slots } => slots,
        }
    }
}

/// The carries of `model`'s layers, from the caches it makes for generation.
fn carries(model: &dyn LanguageModel) -> Result<Vec<Carry>> {
    model
        .make_cache()
        .iter()
        .enumerate()
        .map(|(i, c)| match c.class_name() {
            "KVCache" | "RotatingKVCache" | "ConcatenateKVCache" => Ok(Carry::Kv),
            "ArraysCache" => match c.as_any().downcast_ref::<ArraysCache>() {
                Some(a) => Ok(Carry::State { slots: a.slots() }),
                None => Err(TrainError::Config("an ArraysCache of another type".into())),
            },
            other => Err(TrainError::Config(format!(
                "segmented backward: layer {i} of {} keeps a {other}, which cannot be carried \
                 across segments (attention layers and recurrent ArraysCache layers can)",
                model.model_type()
            ))),
        })
        .collect()
}

/// One segment: `(sum of masked cross-entropy, every layer's carry after it)` from the
/// adapter parameters and the carries before it.
struct Segment<'a> {
    model: &'a dyn LanguageModel,
    params: &'a Params,
    names: &'a [String],
    carries: &'a [Carry],
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
        let mut carried = xs[n..].iter().cloned();
        let mut next = || {
            carried
                .next()
                .ok_or_else(|| TrainError::Config("segment: missing carried arrays".into()))
        };
        let mut caches: Vec<Box<dyn Cache>> = Vec::with_capacity(self.carries.len());
        for carry in self.carries {
            caches.push(match *carry {
                Carry::Kv if self.first => Box::new(ConcatenateKVCache::new()),
                Carry::Kv => {
                    let (k, v) = (next()?, next()?);
                    Box::new(ConcatenateKVCache::holding(k, v)?)
                }
                Carry::State { slots } => {
                    let mut c = ArraysCache::new(slots);
                    if !self.first {
                        for s in 0..slots {
                            c.set(s, next()?)?;
                        }
                    }
                    Box::new(c)
                }
            });
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
        for (l, (carry, c)) in self.carries.iter().zip(&caches).enumerate() {
            match carry {
                Carry::Kv => match c.fetch()? {
                    Some(mlx_cache::Kv::Dense { keys, values }) => {
                        out.push(keys);
                        out.push(values);
                    }
                    _ => {
                        return Err(TrainError::Config(format!(
                            "segment: layer {l} left no dense keys and values"
                        )))
                    }
                },
                Carry::State { slots } => {
                    let a = c.as_any().downcast_ref::<ArraysCache>();
                    for s in 0..*slots {
                        out.push(a.and_then(|a| a.get(s)).cloned().ok_or_else(|| {
                            TrainError::Config(format!(
                                "segment: layer {l} left its state slot {s} empty"
                            ))
                        })?);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// `default_loss` and its adapter gradients, computed segment by segment (`segment` target
/// positions each), the cross-entropy in chunks of `ce_chunk` positions when given. Attention
/// layers (full or sliding-window) carry their keys and values across segment boundaries,
/// recurrent layers (`ArraysCache`: convolutions, linear attention) their state, and the
/// gradients of both flow back across them.
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
    let carries = carries(model)?;
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
            carries: &carries,
            inputs: inputs.slice(&[0, s], &[b, e], &[1, 1])?,
            targets: targets.slice(&[0, s], &[b, e], &[1, 1])?,
            mask: mask.slice(&[0, s], &[b, e], &[1, 1])?,
            first,
            ce_chunk,
        })
    };
    let result = (|| -> Result<(Array, ParamMap)> {
        // Forward: keep the latest carries (detached) and the loss sums. Each segment's output
        // holds the keys and values of every position so far, so the earlier ones are freed
        // as the next segment replaces them; the recurrent states entering each segment are
        // kept for the backward pass (they are small and do not grow with the sequence).
        let mut carried: Vec<Array> = Vec::new();
        let mut entering: Vec<Vec<Array>> = Vec::with_capacity(bounds.len());
        let mut total: Option<Array> = None;
        for (i, &(s, e)) in bounds.iter().enumerate() {
            let sg = seg(s, e, i == 0)?;
            let mut xs = pvals.clone();
            xs.extend(carried.iter().cloned());
            entering.push(recurrent_only(&carries, &carried));
            let out = sg.run(&xs)?;
            let mut it = out.into_iter();
            let ce = it
                .next()
                .ok_or_else(|| TrainError::Config("empty segment".into()))?;
            let new_carried: Vec<Array> = it
                .map(|a| a.stop_gradient())
                .collect::<mlx_core::Result<_>>()?;
            let mut keep = new_carried.clone();
            keep.push(ce.clone());
            eval(&keep)?;
            total = Some(match total {
                None => ce,
                Some(a) => (&a + &ce)?,
            });
            carried = new_carried;
        }
        let total = total.ok_or_else(|| TrainError::Config("empty sequence".into()))?;
        let loss = (&total / &ntoks)?;
        // Backward, last segment first.
        let seed = (&Array::from_f32(1.0, Dtype::Float32)? / &ntoks)?;
        let mut cot_carried: Vec<Array> = carried
            .iter()
            .map(|a| ops::zeros_like(a, None))
            .collect::<mlx_core::Result<_>>()?;
        let mut grads: Option<Vec<Array>> = None;
        for (i, &(s, e)) in bounds.iter().enumerate().rev() {
            let sg = seg(s, e, i == 0)?;
            // This segment's inputs: the first `s` positions of the final keys and values
            // (slices share the final arrays' memory) and the recurrent states recorded
            // when it ran forward.
            let mut primals = pvals.clone();
            if i > 0 {
                let mut at = 0;
                let mut states = entering[i].iter();
                for carry in &carries {
                    match carry {
                        Carry::Kv => {
                            for a in &carried[at..at + 2] {
                                let (b, h, d) = (a.dim(0)?, a.dim(1)?, a.dim(3)?);
                                primals.push(a.slice(
                                    &[0, 0, 0, 0],
                                    &[b, h, s, d],
                                    &[1, 1, 1, 1],
                                )?);
                            }
                        }
                        Carry::State { slots } => {
                            for _ in 0..*slots {
                                primals.push(states.next().cloned().ok_or_else(|| {
                                    TrainError::Config("segment: a state went missing".into())
                                })?);
                            }
                        }
                    }
                    at += carry.arrays();
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
            cots.extend(cot_carried.iter().cloned());
            let (_, vjps) = transforms::vjp(f, &primals, &cots)
                .map_err(|e| failure.take().unwrap_or(TrainError::Mlx(e)))?;
            let n = names.len();
            let g: Vec<Array> = vjps[..n].to_vec();
            cot_carried = vjps[n..].to_vec();
            grads = Some(match grads {
                None => g,
                Some(acc) => acc
                    .iter()
                    .zip(&g)
                    .map(|(a, x)| a + x)
                    .collect::<mlx_core::Result<_>>()?,
            });
            let mut keep = grads.clone().unwrap_or_default();
            keep.extend(cot_carried.iter().cloned());
            eval(&keep)?;
        }
        let grads = grads.unwrap_or_default();
        Ok((loss, names.iter().cloned().zip(grads).collect()))
    })();
    params.update(&current)?;
    let (loss, grads) = result?;
    Ok((loss, ntoks, grads))
}

/// The recurrent layers' arrays among `carried` (laid out by `carries`; empty before the
/// first segment).
fn recurrent_only(carries: &[Carry], carried: &[Array]) -> Vec<Array> {
    if carried.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = 0;
    for c in carries {
        if let Carry::State { slots } = c {
            out.extend_from_slice(&carried[at..at + slots]);
        }
        at += c.arrays();
    }
    out
}
