//! The compiled, transactional decode step.
//!
//! A model that offers [`SegmentedDecode`] (the dense descriptor model for sequential
//! blocks) is cut into `layers + 1` shape-stable segments; each is traced once with
//! [`mlx_core::compile`], with the position offset as an int32 array input, so one trace of
//! each serves every decode step. Between segments, each layer's cache write and attention
//! run uncompiled through the cache's own `update_and_fetch` and the model's own attention:
//! those are the parts whose shapes grow with the cache, and keeping them outside keeps the
//! step bit-exact with the uncompiled forward on the CPU (mlx-lm's sliced cache; a
//! fixed-capacity masked buffer would change the reduction lengths of the softmax and of
//! the `scores @ values` product, and with them the bits).
//!
//! The step is transactional: [`CompiledDecoder::step`] takes the caches by shared
//! reference, writes into copies (cache arrays are immutable, so a copy shares the buffers
//! and MLX cannot update them in place while the originals hold them) and returns them
//! staged in a [`StagedStep`]; [`StagedStep::commit`] adopts them. On any error the caller's
//! caches are exactly as before, and the caller can run the step uncompiled.

use mlx_cache::Cache;
use mlx_core::prelude::*;
use mlx_models::models::SegmentedDecode;
use mlx_models::LanguageModel;

use crate::error::{EngineError, Result};

/// Called with the layer index after each layer's cache write and attention are staged
/// (fault injection in tests: an `Err` fails the step there).
pub type FaultHook = Box<dyn Fn(usize) -> Result<()>>;

/// The compiled decode step of one model (see the module docs). Not `Send`: MLX keeps
/// compile caches per thread, so make and use it on one thread.
pub struct CompiledDecoder<'m> {
    model: &'m dyn SegmentedDecode,
    segments: Vec<Compiled<'m>>,
    fault: Option<FaultHook>,
}

/// A step whose new cache contents are staged, not yet adopted.
pub struct StagedStep {
    logits: Array,
    caches: Vec<Box<dyn Cache>>,
}

impl StagedStep {
    /// The step's logits `(B, T, vocab)`.
    pub fn logits(&self) -> &Array {
        &self.logits
    }

    /// Adopts the staged caches into `caches` (the ones the step was given) and returns the
    /// logits.
    pub fn commit(self, caches: &mut [Box<dyn Cache>]) -> Result<Array> {
        if caches.len() != self.caches.len() {
            return Err(EngineError::Internal {
                what: "compiled decode commit".into(),
                problem: format!(
                    "{} staged caches for {} caches",
                    self.caches.len(),
                    caches.len()
                ),
            });
        }
        for (slot, staged) in caches.iter_mut().zip(self.caches) {
            *slot = staged;
        }
        Ok(self.logits)
    }
}

impl<'m> CompiledDecoder<'m> {
    /// The compiled step of `model`, or `None` where the model cannot be cut into segments.
    /// Nothing is traced until the first step.
    pub fn new(model: &'m dyn LanguageModel) -> Result<Option<Self>> {
        let Some(seg) = model.segmented() else {
            return Ok(None);
        };
        let segments = (0..=seg.num_layers())
            .map(|i| {
                compile(
                    move |xs: &[Array]| {
                        seg.segment(i, xs)
                            .map_err(|e| mlx_core::Error::Callback(e.to_string()))
                    },
                    false,
                )
            })
            .collect::<mlx_core::Result<Vec<_>>>()?;
        Ok(Some(CompiledDecoder {
            model: seg,
            segments,
            fault: None,
        }))
    }

    /// Whether this is the compiled step of `model` (the same model, not one like it): its
    /// traces hold that model's weights.
    pub fn is_for(&self, model: &dyn LanguageModel) -> bool {
        model
            .segmented()
            .is_some_and(|m| std::ptr::addr_eq(m, self.model))
    }

    /// Sets (or clears) the fault-injection hook.
    #[doc(hidden)]
    pub fn set_fault_hook(&mut self, hook: Option<FaultHook>) {
        self.fault = hook;
    }

    /// How many times each segment has been traced (one each after the first step; more
    /// means a retrace, e.g. for a new batch size or dtype).
    pub fn trace_counts(&self) -> Vec<usize> {
        self.segments.iter().map(|s| s.trace_count()).collect()
    }

    fn call(&self, i: usize, inputs: &[Array]) -> Result<Vec<Array>> {
        let want = if i == self.model.num_layers() { 1 } else { 4 };
        let out = self.segments[i].call(inputs)?;
        if out.len() != want {
            return Err(EngineError::Internal {
                what: format!("decode segment {i}"),
                problem: format!("returned {} arrays, expected {want}", out.len()),
            });
        }
        Ok(out)
    }

    /// One forward of `ids` `(B, T)` through copies of `caches` (one per layer, as
    /// `LanguageModel::forward` takes them); the caches themselves are not touched.
    pub fn step(&self, ids: &Array, caches: &[Box<dyn Cache>]) -> Result<StagedStep> {
        let layers = self.model.num_layers();
        if caches.len() != layers {
            return Err(EngineError::Cache {
                what: "compiled decode".into(),
                problem: format!("{} caches for {layers} layers", caches.len()),
            });
        }
        if ids.ndim() != 2 {
            return Err(EngineError::Input {
                what: "compiled decode".into(),
                problem: format!(
                    "token ids must be (batch, seq), got shape {:?}",
                    ids.shape()
                ),
            });
        }
        if caches.iter().any(|c| c.offsets().is_some()) {
            return Err(EngineError::Cache {
                what: "compiled decode".into(),
                problem: "batched caches (per-row offsets) are not supported".into(),
            });
        }
        let offset = caches.first().map_or(0, |c| c.offset());
        let offset = i32::try_from(offset).map_err(|_| EngineError::Input {
            what: "compiled decode".into(),
            problem: format!("offset {offset} does not fit an int32"),
        })?;
        let offset = Array::from_int(offset.into(), Dtype::Int32)?;
        let n = ids.dim(1)? as usize;
        let masks = self.model.masks(caches, n)?;
        let mut staged = Vec::with_capacity(layers);
        let mut out = self.call(0, &[ids.astype(Dtype::Int32)?, offset.clone()])?;
        for (i, (cache, mask)) in caches.iter().zip(&masks).enumerate() {
            let [x, q, k, v]: [Array; 4] = out.try_into().map_err(|_| EngineError::Internal {
                what: "compiled decode".into(),
                problem: "a decode segment returned the wrong number of arrays".into(),
            })?;
            let mut c = cache.boxed_clone();
            let kv = c.update_and_fetch(&k, &v)?;
            let a = self.model.attend(i, &q, &kv, mask)?;
            staged.push(c);
            if let Some(hook) = &self.fault {
                hook(i)?;
            }
            out = self.call(i + 1, &[x, a, offset.clone()])?;
        }
        let logits = out.pop().ok_or_else(|| EngineError::Internal {
            what: "compiled decode".into(),
            problem: "a decode segment returned the wrong number of arrays".into(),
        })?;
        Ok(StagedStep {
            logits,
            caches: staged,
        })
    }
}
