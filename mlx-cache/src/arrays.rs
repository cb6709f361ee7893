//! mlx-lm's `ArraysCache`: recurrent state for hybrid models (e.g. a conv state and an SSM
//! state per layer), plus snapshot / restore so a speculative step can be rolled back.

use mlx_core::prelude::*;

use crate::mask::AttentionMask;
use crate::state::StateValue;
use crate::{Cache, Kv};

#[derive(Clone, Debug)]
pub struct ArraysCache {
    cache: Vec<Option<Array>>,
    left_padding: Option<Array>,
    lengths: Option<Array>,
}

/// A saved copy of an [`ArraysCache`]'s state (arrays are immutable: this is cheap).
#[derive(Clone, Debug)]
pub struct ArraysSnapshot(ArraysCache);

impl ArraysCache {
    /// `size` empty slots.
    pub fn new(size: usize) -> Self {
        ArraysCache {
            cache: vec![None; size],
            left_padding: None,
            lengths: None,
        }
    }

    /// With left padding per batch row (mlx-lm's `left_padding`).
    pub fn with_left_padding(size: usize, left_padding: &[i32]) -> Result<Self> {
        let mut c = Self::new(size);
        if !left_padding.is_empty() {
            c.left_padding = Some(Array::from_slice(
                left_padding,
                &[left_padding.len() as i32],
            )?);
        }
        Ok(c)
    }

    /// Number of state slots.
    pub fn slots(&self) -> usize {
        self.cache.len()
    }

    pub fn get(&self, i: usize) -> Option<&Array> {
        self.cache.get(i).and_then(Option::as_ref)
    }

    pub fn set(&mut self, i: usize, value: Array) -> Result<()> {
        let n = self.cache.len();
        let slot = self
            .cache
            .get_mut(i)
            .ok_or_else(|| Error::InvalidArgument {
                op: "ArraysCache::set",
                message: format!("slot {i} out of range for {n} slots"),
            })?;
        *slot = Some(value);
        Ok(())
    }

    pub fn snapshot(&self) -> ArraysSnapshot {
        ArraysSnapshot(self.clone())
    }

    /// Restores a snapshot taken from a cache with the same number of slots.
    pub fn restore(&mut self, snapshot: &ArraysSnapshot) -> Result<()> {
        if snapshot.0.cache.len() != self.cache.len() {
            return Err(Error::InvalidArgument {
                op: "ArraysCache::restore",
                message: format!(
                    "snapshot has {} slots, cache has {}",
                    snapshot.0.cache.len(),
                    self.cache.len()
                ),
            });
        }
        *self = snapshot.0.clone();
        Ok(())
    }

    /// The SSM mask for `n` new tokens (mlx-lm's `ArraysCache.make_mask`).
    pub fn ssm_mask(&self, n: usize) -> Result<Option<Array>> {
        let pos = ops::arange(0.0, n as f64, 1.0, Dtype::Int32, None)?;
        let mut mask = None;
        if let Some(lp) = &self.left_padding {
            mask = Some(ops::greater_equal(
                &pos,
                &ops::expand_dims(lp, &[1], None)?,
                None,
            )?);
        }
        if let Some(len) = &self.lengths {
            let in_length = ops::less(&pos, &ops::expand_dims(len, &[1], None)?, None)?;
            mask = Some(match mask {
                None => in_length,
                Some(m) => ops::logical_and(&m, &in_length, None)?,
            });
        }
        Ok(mask)
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let c = "ArraysCache";
        let mut it = state.list(c, 3)?.into_iter();
        let mut next = || {
            it.next().ok_or_else(|| Error::InvalidArgument {
                op: "from_state",
                message: c.into(),
            })
        };
        let cache = next()?
            .into_list(c)?
            .into_iter()
            .map(|v| v.opt_array(c))
            .collect::<Result<_>>()?;
        Ok(ArraysCache {
            cache,
            left_padding: next()?.opt_array(c)?,
            lengths: next()?.opt_array(c)?,
        })
    }
}

impl Cache for ArraysCache {
    fn class_name(&self) -> &'static str {
        "ArraysCache"
    }
    fn offset(&self) -> usize {
        0
    }
    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<Kv> {
        Err(Error::InvalidArgument {
            op: "ArraysCache::update_and_fetch",
            message: "an ArraysCache holds recurrent state; read and write it with get/set".into(),
        })
    }
    fn fetch(&self) -> Result<Option<Kv>> {
        Ok(None)
    }
    fn make_mask(
        &self,
        n: usize,
        _window_size: Option<usize>,
        _return_array: bool,
    ) -> Result<AttentionMask> {
        Ok(self
            .ssm_mask(n)?
            .map_or(AttentionMask::None, AttentionMask::Array))
    }
    fn state(&self) -> StateValue {
        StateValue::List(vec![
            StateValue::List(self.cache.iter().map(StateValue::opt).collect()),
            StateValue::opt(&self.left_padding),
            StateValue::opt(&self.lengths),
        ])
    }
    fn is_trimmable(&self) -> bool {
        false
    }
    fn trim(&mut self, _n: usize) -> usize {
        0
    }
    fn nbytes(&self) -> usize {
        self.cache.iter().flatten().map(Array::nbytes).sum()
    }
    fn is_empty(&self) -> bool {
        self.cache.first().is_none_or(Option::is_none)
    }
}
