//! `RotatingKVCache` (mlx-lm) and `RotatingQuantizedKVCache` (ours): a sliding window of
//! `max_size` tokens of which the first `keep` are never evicted.
//!
//! Both are one mechanism, [`Rotating`], over dense or quantized [`Store`]s, ported line by line
//! from mlx-lm 0.32.2. Single-token writes go in place into a ring buffer; multi-token writes
//! first put the buffer in temporal order and concatenate. On top of mlx-lm:
//! - [`Cache::trim`] only trims while the cache is trimmable (before it wraps) and otherwise
//!   returns 0 leaving the cache untouched (mlx-lm's raw `trim` would corrupt the ring);
//! - [`RotatingKVCache::rollback`] removes the last `n` tokens right after a multi-token write
//!   even when wrapped (speculative decoding), checking its precondition;
//! - a cache with history ([`RotatingKVCache::set_max_rollback`]) keeps the whole ring as it
//!   was before each of its last writes (arrays are immutable: a snapshot shares them, and a
//!   kept array is never overwritten in place), so [`Cache::trim`] of up to `max_rollback`
//!   tokens restores exactly the cache that decoding `offset - n` tokens left, wrapped or not:
//!   the same rows in the same ring positions, `idx` and `offset`. Without history, or deeper
//!   than it, a wrapped cache refuses the trim (returns 0, unchanged): the evicted rows are gone.

use std::collections::VecDeque;

use mlx_core::prelude::*;

use crate::kv::{kv_from_state, store_state};
use crate::mask::{create_causal_mask, AttentionMask};
use crate::state::StateValue;
use crate::store::{incoming, zeros_for, QuantSpec, Store};
use crate::{as_i32, seq_of, Cache, Kv};

const STEP: usize = 256;

#[derive(Clone, Debug)]
pub(crate) struct Rotating {
    keys: Option<Store>,
    values: Option<Store>,
    offset: usize,
    max_size: usize,
    keep: usize,
    idx: usize,
    quant: Option<QuantSpec>,
    /// Tokens appended by the last write if it was a multi-token (concatenating) write and
    /// nothing has been written or trimmed since: what [`Rotating::rollback`] may remove.
    rollback_room: usize,
    /// The rows that write evicted (keys, values), put back if every new token is rolled back.
    rollback_dropped: Option<(Store, Store)>,
    history: Option<History>,
}

/// The recent writes, oldest first: each with the cache as it was before it and what it
/// wrote, so any position inside it can be rebuilt by writing a prefix again.
#[derive(Clone, Debug)]
struct History {
    max_rollback: usize,
    writes: VecDeque<Record>,
}

#[derive(Clone, Debug)]
struct Record {
    /// The cache before the write (without history).
    before: Rotating,
    keys: Array,
    values: Array,
    len: usize,
}

fn i(v: usize) -> Result<i32> {
    as_i32(v, "rotating cache")
}

impl Rotating {
    fn new(max_size: usize, keep: usize, quant: Option<QuantSpec>) -> Result<Self> {
        if max_size == 0 || keep >= max_size {
            return Err(Error::InvalidArgument {
                op: "RotatingKVCache",
                message: format!("need 0 <= keep < max_size, got keep {keep}, max_size {max_size}"),
            });
        }
        Ok(Rotating {
            keys: None,
            values: None,
            offset: 0,
            max_size,
            keep,
            idx: 0,
            quant,
            rollback_room: 0,
            rollback_dropped: None,
            history: None,
        })
    }

    /// This cache without its history (what a record keeps).
    fn clone_core(&self) -> Rotating {
        Rotating {
            keys: self.keys.clone(),
            values: self.values.clone(),
            offset: self.offset,
            max_size: self.max_size,
            keep: self.keep,
            idx: self.idx,
            quant: self.quant,
            rollback_room: self.rollback_room,
            rollback_dropped: self.rollback_dropped.clone(),
            history: None,
        }
    }

    /// Keep what undoing the last `max_rollback` tokens needs (0: nothing).
    fn set_max_rollback(&mut self, max_rollback: usize) {
        self.history = (max_rollback > 0).then(|| History {
            max_rollback,
            writes: VecDeque::new(),
        });
    }

    /// Records a write before it happens, dropping records no trim within `max_rollback` needs.
    fn remember(&mut self, keys: &Array, values: &Array, len: usize) {
        let before = self.clone_core();
        let Some(h) = self.history.as_mut() else {
            return;
        };
        h.writes.push_back(Record {
            before,
            keys: keys.clone(),
            values: values.clone(),
            len,
        });
        let newest = self.offset + len;
        while h
            .writes
            .front()
            .is_some_and(|r| r.before.offset + r.len + h.max_rollback <= newest)
        {
            h.writes.pop_front();
        }
    }

    /// The recorded write that position `offset - n` falls in (at its start or inside it).
    fn record_for(&self, n: usize) -> Option<usize> {
        if n == 0 {
            return None;
        }
        let target = self.offset.checked_sub(n)?;
        let h = self.history.as_ref()?;
        h.writes
            .iter()
            .rposition(|r| r.before.offset <= target && target < r.before.offset + r.len)
    }

    /// The cache that writing everything up to `offset - n` would have left: the cache before
    /// the write that position falls in, then that write's first tokens written again (the same
    /// call a direct decode makes, so the same ring, `idx` and bits).
    fn rebuilt(&self, n: usize) -> Option<Rotating> {
        let at = self.record_for(n)?;
        let h = self.history.as_ref()?;
        let r = h.writes.get(at)?;
        let mut c = r.before.clone_core();
        c.history = Some(History {
            max_rollback: h.max_rollback,
            writes: h.writes.iter().take(at).cloned().collect(),
        });
        let m = self.offset - n - r.before.offset;
        if m > 0 {
            let m = i32::try_from(m).ok()?;
            let k = ops::slice_axis(&r.keys, 2, 0, m, None).ok()?;
            let v = ops::slice_axis(&r.values, 2, 0, m, None).ok()?;
            c.update(&k, &v).ok()?;
        }
        Some(c)
    }

    /// `_trim`: drop `trim_size` tokens after the first `keep`, then append.
    fn trim_store(&self, trim_size: i64, v: &Store, append: Option<&Store>) -> Result<Store> {
        let mut parts = Vec::new();
        if trim_size > 0 {
            let len = v.seq_len();
            parts.push(v.slice(0, i(self.keep)?)?);
            parts.push(v.slice(i(trim_size as usize + self.keep)?.min(len), len)?);
        } else {
            parts.push(v.clone());
        }
        if let Some(a) = append {
            parts.push(a.clone());
        }
        Store::concat(&parts.iter().collect::<Vec<_>>())
    }

    /// `_temporal_order`: the buffer rearranged into temporal order, unused tail cut off.
    fn temporal_order(&self, v: &Store) -> Result<Store> {
        let len = v.seq_len() as usize;
        if self.idx == len {
            Ok(v.clone())
        } else if self.idx < self.offset {
            let (keep, idx) = (i(self.keep)?, i(self.idx)?);
            Store::concat(&[
                &v.slice(0, keep)?,
                &v.slice(idx, i(len)?)?,
                &v.slice(keep, idx)?,
            ])
        } else {
            v.slice(0, i(self.idx)?)
        }
    }

    fn update_concat(&mut self, keys: &Array, values: &Array, s: usize) -> Result<(Store, Store)> {
        let (k_new, v_new) = (incoming(keys, self.quant)?, incoming(values, self.quant)?);
        match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                let k = self.temporal_order(&k)?;
                let v = self.temporal_order(&v)?;
                self.idx = k.seq_len() as usize;
                // The largest size is max_size + S - 1 so every token gets max_size context.
                let trim_size = self.idx as i64 - self.max_size as i64 + 1;
                self.rollback_dropped = if trim_size > 0 {
                    let (a, b) = (i(self.keep)?, i(self.keep + trim_size as usize)?);
                    Some((k.slice(a, b)?, v.slice(a, b)?))
                } else {
                    None
                };
                self.keys = Some(self.trim_store(trim_size, &k, Some(&k_new))?);
                self.values = Some(self.trim_store(trim_size, &v, Some(&v_new))?);
            }
            _ => {
                self.keys = Some(k_new);
                self.values = Some(v_new);
                self.rollback_dropped = None;
            }
        }
        self.offset += s;
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (k.clone(), v.clone()),
            _ => return Err(missing()),
        };
        self.idx = k.seq_len() as usize;
        self.rollback_room = s;
        Ok((k, v))
    }

    fn update_in_place(
        &mut self,
        keys: &Array,
        values: &Array,
        s: usize,
    ) -> Result<(Store, Store)> {
        let prev = self.offset;
        let grow = match &self.keys {
            None => true,
            Some(k) => {
                let len = k.seq_len() as usize;
                prev >= len && len < self.max_size
            }
        };
        if grow {
            let new_size = i(STEP.min(self.max_size.saturating_sub(prev)))?;
            let (nk, nv) = (
                zeros_for(keys, new_size, self.quant)?,
                zeros_for(values, new_size, self.quant)?,
            );
            match (self.keys.take(), self.values.take()) {
                (Some(k), Some(v)) => {
                    self.keys = Some(Store::concat(&[&k, &nk])?);
                    self.values = Some(Store::concat(&[&v, &nv])?);
                }
                _ => {
                    self.keys = Some(nk);
                    self.values = Some(nv);
                }
            }
            self.idx = prev;
        }
        let (mut k, mut v) = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(missing()),
        };
        let trim_size = k.seq_len() as i64 - self.max_size as i64;
        if trim_size > 0 {
            k = self.trim_store(trim_size, &k, None)?;
            v = self.trim_store(trim_size, &v, None)?;
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = self.keep;
        }
        let (start, stop) = (i(self.idx)?, i(self.idx + s)?);
        k = k.update(&incoming(keys, self.quant)?, start, stop)?;
        v = v.update(&incoming(values, self.quant)?, start, stop)?;
        self.keys = Some(k);
        self.values = Some(v);
        self.offset += s;
        self.idx += s;
        self.rollback_room = 0;
        self.rollback_dropped = None;
        self.fetch()
    }

    fn update(&mut self, keys: &Array, values: &Array) -> Result<(Store, Store)> {
        let s = seq_of(keys, values, "update_and_fetch")?;
        self.remember(keys, values, s);
        if s == 1 {
            self.update_in_place(keys, values, s)
        } else {
            self.update_concat(keys, values, s)
        }
    }

    fn fetch(&self) -> Result<(Store, Store)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => {
                if (self.offset as i64) < i64::from(k.seq_len()) {
                    let o = i(self.offset)?;
                    Ok((k.slice(0, o)?, v.slice(0, o)?))
                } else {
                    Ok((k.clone(), v.clone()))
                }
            }
            _ => Err(missing()),
        }
    }

    /// mlx-lm's rule (not wrapped yet), or recorded writes to go back through.
    fn is_trimmable(&self) -> bool {
        self.offset < self.max_size || self.history.as_ref().is_some_and(|h| !h.writes.is_empty())
    }

    /// Whether `trim(n)` acts now: exactly, from the records, or as mlx-lm before wrapping.
    fn can_trim(&self, n: usize) -> bool {
        n == 0 || self.record_for(n).is_some() || self.offset < self.max_size
    }

    fn trim(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        if let Some(c) = self.rebuilt(n) {
            *self = c;
            return n;
        }
        if self.offset >= self.max_size {
            return 0;
        }
        let n = n.min(self.offset).min(self.idx);
        self.offset -= n;
        self.idx -= n;
        self.rollback_room = 0;
        self.rollback_dropped = None;
        self.forget_after(self.offset);
        n
    }

    /// Drops the records of writes that end after `offset`: they no longer lead here.
    fn forget_after(&mut self, offset: usize) {
        if let Some(h) = self.history.as_mut() {
            while h
                .writes
                .back()
                .is_some_and(|r| r.before.offset + r.len > offset)
            {
                h.writes.pop_back();
            }
        }
    }

    fn rollback(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n > self.rollback_room {
            return Err(Error::InvalidArgument {
                op: "rollback",
                message: format!(
                    "cannot roll back {n} tokens: only the tokens of the last multi-token write \
                     can be rolled back, and {} remain from it",
                    self.rollback_room
                ),
            });
        }
        // After a concatenating write the buffer is in temporal order with the new tokens at
        // the end and idx == its length, so dropping the tail undoes exactly those tokens.
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(missing()),
        };
        let len = k.seq_len() as usize;
        let keep_len = i(len - n)?;
        let (mut k, mut v) = (k.slice(0, keep_len)?, v.slice(0, keep_len)?);
        self.rollback_room -= n;
        if self.rollback_room == 0 {
            // Nothing of the write is left: put back the rows it evicted, so the cache holds
            // exactly what it held before (in temporal order). With at least one new token
            // left, the window already holds max_size tokens, as a direct write would.
            if let Some((dk, dv)) = self.rollback_dropped.take() {
                let keep = i(self.keep)?;
                k = Store::concat(&[&k.slice(0, keep)?, &dk, &k.slice(keep, keep_len)?])?;
                v = Store::concat(&[&v.slice(0, keep)?, &dv, &v.slice(keep, keep_len)?])?;
            }
        }
        self.idx = k.seq_len() as usize;
        self.keys = Some(k);
        self.values = Some(v);
        self.offset -= n;
        self.forget_after(self.offset);
        Ok(())
    }

    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        if n > 1 {
            let window = window_size.filter(|w| *w != 0).unwrap_or(self.max_size);
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window || return_array {
                Ok(AttentionMask::Array(create_causal_mask(
                    n,
                    offset,
                    Some(window),
                )?))
            } else {
                Ok(AttentionMask::Causal)
            }
        } else {
            let Some(window) = window_size else {
                return Ok(AttentionMask::None);
            };
            if self.offset >= window && self.max_size > window {
                let idx = if self.idx >= self.max_size {
                    0
                } else {
                    self.idx
                };
                let mask_size = if self.offset < self.max_size {
                    self.offset + 1
                } else {
                    self.max_size
                };
                let ar = ops::arange(0.0, mask_size as f64, 1.0, Dtype::Int32, None)?;
                let mask = ops::greater_equal(
                    &ar,
                    &Scalar::Int((mask_size - window) as i64).to_array_like(Dtype::Int32)?,
                    None,
                )?;
                Ok(AttentionMask::Array(roll(&mask, idx + 1)?))
            } else {
                Ok(AttentionMask::None)
            }
        }
    }

    fn state(&self) -> Vec<StateValue> {
        vec![
            store_state(&self.keys),
            store_state(&self.values),
            StateValue::count(self.offset),
            StateValue::count(self.keep),
            StateValue::count(self.max_size),
            StateValue::count(self.idx),
        ]
    }

    fn from_state(
        items: Vec<StateValue>,
        class: &'static str,
        quant: Option<QuantSpec>,
    ) -> Result<Self> {
        let mut it = items.into_iter();
        let mut next = || {
            it.next().ok_or_else(|| Error::InvalidArgument {
                op: "from_state",
                message: class.into(),
            })
        };
        let (k, v) = (next()?, next()?);
        let (keys, values) = kv_from_state(k, v, class, quant.is_some())?;
        let offset = next()?.usize(class)?;
        let keep = next()?.usize(class)?;
        let max_size = next()?.usize(class)?;
        let idx = next()?.usize(class)?;
        Ok(Rotating {
            keys,
            values,
            offset,
            max_size,
            keep,
            idx,
            quant,
            rollback_room: 0,
            rollback_dropped: None,
            history: None,
        })
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Store::nbytes) + self.values.as_ref().map_or(0, Store::nbytes)
    }

    /// The held tokens in temporal order (oldest first), for inspection and tests.
    fn temporal(&self) -> Result<Option<(Store, Store)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok(Some((self.temporal_order(k)?, self.temporal_order(v)?))),
            _ => Ok(None),
        }
    }
}

/// `mx.roll(x, shift)` for a 1-D array.
fn roll(x: &Array, shift: usize) -> Result<Array> {
    let n = x.size();
    if n == 0 {
        return Ok(x.clone());
    }
    let s = i(shift % n)?;
    if s == 0 {
        return Ok(x.clone());
    }
    let n = i(n)?;
    ops::concatenate(
        &[
            &ops::slice_axis(x, 0, n - s, n, None)?,
            &ops::slice_axis(x, 0, 0, n - s, None)?,
        ],
        0,
        None,
    )
}

fn missing() -> Error {
    Error::InvalidArgument {
        op: "rotating cache",
        message: "the cache is empty".into(),
    }
}

macro_rules! rotating_cache {
    ($name:ident, $class:literal) => {
        impl Cache for $name {
            fn class_name(&self) -> &'static str {
                $class
            }
            fn offset(&self) -> usize {
                self.0.offset
            }
            /// mlx-lm's pipeline stages set `cache[-1].keys = mx.depends(keys, h)` on a
            /// rotating cache too (ministral3's sliding layers).
            fn depend_on(&mut self, dep: &Array) -> Result<bool> {
                match &mut self.0.keys {
                    Some(Store::Dense(k)) => {
                        *k = mlx_core::ops::depends(k, dep)?;
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            }
            fn size(&self) -> usize {
                self.0.offset.min(self.0.max_size)
            }
            fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv> {
                let (k, v) = self.0.update(keys, values)?;
                Kv::from_stores(k, v, self.0.quant)
            }
            fn fetch(&self) -> Result<Option<Kv>> {
                if self.0.keys.is_none() {
                    return Ok(None);
                }
                let (k, v) = self.0.fetch()?;
                Kv::from_stores(k, v, self.0.quant).map(Some)
            }
            fn make_mask(
                &self,
                n: usize,
                window_size: Option<usize>,
                return_array: bool,
            ) -> Result<AttentionMask> {
                self.0.make_mask(n, window_size, return_array)
            }
            fn state(&self) -> StateValue {
                let mut s = self.0.state();
                if let Some(q) = self.0.quant {
                    s.push(StateValue::Int(q.group_size.into()));
                    s.push(StateValue::Int(q.bits.into()));
                }
                StateValue::List(s)
            }
            fn is_trimmable(&self) -> bool {
                self.0.is_trimmable()
            }
            fn trim(&mut self, n: usize) -> usize {
                self.0.trim(n)
            }
            fn can_trim(&self, n: usize) -> bool {
                self.0.can_trim(n)
            }
            fn nbytes(&self) -> usize {
                self.0.nbytes()
            }
            fn is_empty(&self) -> bool {
                self.0.keys.is_none()
            }
        }

        impl $name {
            /// Removes the last `n` tokens, allowed only right after a multi-token write of at
            /// least `n` tokens (speculative decoding rejecting drafts), wrapped or not.
            /// Anything else is an `Err` and leaves the cache unchanged.
            pub fn rollback(&mut self, n: usize) -> Result<()> {
                self.0.rollback(n)
            }

            /// The tokens held, oldest first: `(keys, values)`, or `None` when empty.
            pub fn temporal(&self) -> Result<Option<(Store, Store)>> {
                self.0.temporal()
            }

            pub fn max_size(&self) -> usize {
                self.0.max_size
            }

            /// Keep what [`Cache::trim`] needs to undo up to `max_rollback` tokens exactly,
            /// also after the ring has wrapped (0: mlx-lm's behaviour, the default). Each kept
            /// step holds one earlier copy of the ring.
            pub fn set_max_rollback(&mut self, max_rollback: usize) {
                self.0.set_max_rollback(max_rollback);
            }

            pub fn keep(&self) -> usize {
                self.0.keep
            }
        }
    };
}

/// mlx-lm's `RotatingKVCache(max_size, keep)`.
#[derive(Clone, Debug)]
pub struct RotatingKVCache(Rotating);

impl RotatingKVCache {
    pub fn new(max_size: usize, keep: usize) -> Result<Self> {
        Ok(RotatingKVCache(Rotating::new(max_size, keep, None)?))
    }

    /// The same window with quantized contents (mlx-lm raises here).
    pub fn to_quantized(&self, group_size: i32, bits: i32) -> Result<RotatingQuantizedKVCache> {
        let spec = QuantSpec::new(group_size, bits)?;
        let q = |s: &Option<Store>| s.as_ref().map(|s| s.quantized(spec)).transpose();
        let mut r = self.0.clone_core();
        r.keys = q(&self.0.keys)?;
        r.values = q(&self.0.values)?;
        r.quant = Some(spec);
        Ok(RotatingQuantizedKVCache(r))
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        Ok(RotatingKVCache(Rotating::from_state(
            state.list("RotatingKVCache", 6)?,
            "RotatingKVCache",
            None,
        )?))
    }
}

/// A rotating cache whose contents are affine-quantized; not in mlx-lm. Its state is
/// `RotatingKVCache`'s followed by `group_size` and `bits`.
#[derive(Clone, Debug)]
pub struct RotatingQuantizedKVCache(Rotating);

impl RotatingQuantizedKVCache {
    pub fn new(max_size: usize, keep: usize, group_size: i32, bits: i32) -> Result<Self> {
        Ok(RotatingQuantizedKVCache(Rotating::new(
            max_size,
            keep,
            Some(QuantSpec::new(group_size, bits)?),
        )?))
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let c = "RotatingQuantizedKVCache";
        let mut items = state.list(c, 8)?;
        let bits = items.pop().map_or(Ok(0), |v| v.int(c))?;
        let group_size = items.pop().map_or(Ok(0), |v| v.int(c))?;
        Ok(RotatingQuantizedKVCache(Rotating::from_state(
            items,
            c,
            Some(QuantSpec::from_state(c, group_size, bits)?),
        )?))
    }
}

rotating_cache!(RotatingKVCache, "RotatingKVCache");
rotating_cache!(RotatingQuantizedKVCache, "RotatingQuantizedKVCache");
