//! mlx-lm's `ArraysCache`: recurrent state for hybrid models (e.g. a conv state and an SSM
//! state per layer), plus snapshot / restore so a speculative step can be rolled back.
//!
//! Rollback beyond mlx-lm (its issue #1446: a recurrent state cannot be trimmed): a cache made
//! with [`ArraysCache::with_history`] keeps the state after each of the last `max_rollback`
//! tokens (the model records them with [`ArraysCache::checkpoint_steps`]), so
//! [`Cache::trim`] can restore the state at any of those positions exactly.

use std::collections::VecDeque;

use mlx_core::prelude::*;

use crate::mask::AttentionMask;
use crate::state::StateValue;
use crate::{Cache, Kv};

#[derive(Clone, Debug)]
pub struct ArraysCache {
    cache: Vec<Option<Array>>,
    left_padding: Option<Array>,
    lengths: Option<Array>,
    /// Tokens advanced through this cache (not part of mlx-lm's state).
    position: usize,
    history: Option<History>,
}

/// States at recent positions, oldest first; the newest is the current state.
#[derive(Clone, Debug)]
struct History {
    max_rollback: usize,
    checkpoints: VecDeque<(usize, Vec<Option<Array>>)>,
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
            position: 0,
            history: None,
        }
    }

    /// `size` empty slots, keeping the states of the last `max_rollback` tokens so that
    /// [`Cache::trim`] can undo up to that many.
    pub fn with_history(size: usize, max_rollback: usize) -> Self {
        let mut c = Self::new(size);
        c.set_max_rollback(max_rollback);
        c
    }

    /// Keep the states of the last `max_rollback` tokens from now on (0: none, mlx-lm's
    /// behaviour).
    pub fn set_max_rollback(&mut self, max_rollback: usize) {
        self.history = (max_rollback > 0).then(|| History {
            max_rollback,
            checkpoints: VecDeque::new(),
        });
    }

    /// Whether this cache keeps per-token states (then models record them).
    pub fn keeps_history(&self) -> bool {
        self.history.as_ref().is_some_and(|h| h.max_rollback > 0)
    }

    /// How many tokens back the history reaches at most (0 without history).
    pub fn max_rollback(&self) -> usize {
        self.history.as_ref().map_or(0, |h| h.max_rollback)
    }

    /// Tokens advanced so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// mlx-lm's `advance(N)`: moves lengths / left padding on, and the position.
    pub fn advance(&mut self, n: usize) -> Result<()> {
        let step = i32::try_from(n).map_err(|_| Error::InvalidArgument {
            op: "ArraysCache::advance",
            message: format!("{n} exceeds i32"),
        })?;
        if let Some(l) = &self.lengths {
            self.lengths = Some(ops::subtract_scalar(l, step, None)?);
        }
        if let Some(l) = &self.left_padding {
            self.left_padding = Some(ops::subtract_scalar(l, step, None)?);
        }
        self.position += n;
        Ok(())
    }

    /// Records the slots after each token of a call that starts at the current position
    /// (`steps[i]` = the state after token `i`), before the call writes its final state and
    /// advances. A no-op without history.
    pub fn checkpoint_steps(&mut self, steps: Vec<Vec<Option<Array>>>) -> Result<()> {
        let Some(h) = self.history.as_mut() else {
            return Ok(());
        };
        if let Some(bad) = steps.iter().find(|s| s.len() != self.cache.len()) {
            return Err(Error::InvalidArgument {
                op: "ArraysCache::checkpoint_steps",
                message: format!(
                    "{} slots recorded for {} slots",
                    bad.len(),
                    self.cache.len()
                ),
            });
        }
        if h.checkpoints.back().map(|(p, _)| *p) != Some(self.position) {
            h.checkpoints.clear();
            h.checkpoints.push_back((self.position, self.cache.clone()));
        }
        for (i, slots) in steps.into_iter().enumerate() {
            h.checkpoints.push_back((self.position + i + 1, slots));
        }
        let newest = h.checkpoints.back().map_or(0, |(p, _)| *p);
        while h
            .checkpoints
            .front()
            .is_some_and(|(p, _)| p + h.max_rollback < newest)
        {
            h.checkpoints.pop_front();
        }
        Ok(())
    }

    /// How many tokens [`Cache::trim`] can undo now.
    pub fn rollback_depth(&self) -> usize {
        match &self.history {
            Some(h) if h.checkpoints.back().map(|(p, _)| *p) == Some(self.position) => {
                h.checkpoints.front().map_or(0, |(p, _)| self.position - p)
            }
            _ => 0,
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
                Some(m) => ops::bitwise_and(&m, &in_length, None)?,
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
        let cache: Vec<Option<Array>> = next()?
            .into_list(c)?
            .into_iter()
            .map(|v| v.opt_array(c))
            .collect::<Result<_>>()?;
        for (i, a) in cache.iter().enumerate() {
            if let Some(a) = a {
                crate::kv::check_float(a, c, &format!("state arrays ({i})"))?;
            }
        }
        Ok(ArraysCache {
            cache,
            left_padding: next()?.opt_array(c)?,
            lengths: next()?.opt_array(c)?,
            position: 0,
            history: None,
        })
    }
}

impl Cache for ArraysCache {
    fn class_name(&self) -> &'static str {
        "ArraysCache"
    }
    /// mlx-lm's pipeline stages whose last layer is recurrent tie the send to
    /// `cache[-1][0]` (qwen3_next, qwen3_5).
    fn depend_on(&mut self, dep: &Array) -> Result<bool> {
        match self.cache.first_mut() {
            Some(Some(a)) => {
                *a = mlx_core::ops::depends(a, dep)?;
                Ok(true)
            }
            _ => Ok(false),
        }
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
    /// Only with history, and only while the current state is the newest recorded one.
    fn is_trimmable(&self) -> bool {
        self.rollback_depth() > 0
    }
    fn can_trim(&self, n: usize) -> bool {
        n == 0 || n <= self.rollback_depth()
    }
    /// Restores the state `n` tokens back when it was recorded (`n` at most
    /// [`ArraysCache::rollback_depth`]); otherwise removes nothing and returns 0.
    fn trim(&mut self, n: usize) -> usize {
        if n == 0 || n > self.rollback_depth() {
            return 0;
        }
        let target = self.position - n;
        let Some(h) = self.history.as_mut() else {
            return 0;
        };
        while h.checkpoints.back().is_some_and(|(p, _)| *p > target) {
            h.checkpoints.pop_back();
        }
        match h.checkpoints.back() {
            Some((p, slots)) if *p == target => {
                self.cache = slots.clone();
                self.position = target;
                n
            }
            _ => 0,
        }
    }
    fn nbytes(&self) -> usize {
        self.cache.iter().flatten().map(Array::nbytes).sum()
    }
    fn is_empty(&self) -> bool {
        self.cache.first().is_none_or(Option::is_none)
    }
}
