//! mlx-lm's `ChunkedKVCache` and `ConcatenateKVCache`'s sibling for chunked attention.

use mlx_core::prelude::*;

use crate::kv::{kv_from_state, store_state, STEP};
use crate::mask::{fallback_mask, AttentionMask};
use crate::state::StateValue;
use crate::store::{zeros_for, Store};
use crate::{as_i32, seq_of, Cache, Kv};

/// mlx-lm's `ChunkedKVCache(chunk_size)`: a step buffer whose front is dropped by
/// [`ChunkedKVCache::maybe_trim_front`] to keep at most `chunk_size` tokens.
#[derive(Clone, Debug)]
pub struct ChunkedKVCache {
    keys: Option<Store>,
    values: Option<Store>,
    offset: usize,
    chunk_size: usize,
    start_position: usize,
}

fn i(v: usize) -> Result<i32> {
    as_i32(v, "ChunkedKVCache")
}

impl ChunkedKVCache {
    pub fn new(chunk_size: usize) -> Self {
        ChunkedKVCache {
            keys: None,
            values: None,
            offset: 0,
            chunk_size,
            start_position: 0,
        }
    }

    pub fn start_position(&self) -> usize {
        self.start_position
    }

    /// Keeps at most `chunk_size` valid tokens by dropping the oldest.
    pub fn maybe_trim_front(&mut self) -> Result<()> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(());
        };
        let valid = self.offset - self.start_position;
        if valid > self.chunk_size {
            let trim = valid - self.chunk_size;
            self.start_position += trim;
            let (k, v) = (k.slice(i(trim)?, i(valid)?)?, v.slice(i(trim)?, i(valid)?)?);
            self.keys = Some(k);
            self.values = Some(v);
        }
        Ok(())
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let c = "ChunkedKVCache";
        let mut it = state.list(c, 5)?.into_iter();
        let mut next = || {
            it.next().ok_or_else(|| Error::InvalidArgument {
                op: "from_state",
                message: c.into(),
            })
        };
        let (k, v) = (next()?, next()?);
        let (keys, values) = kv_from_state(k, v, c, false)?;
        let cache = ChunkedKVCache {
            keys,
            values,
            offset: next()?.usize(c)?,
            chunk_size: next()?.usize(c)?,
            start_position: next()?.usize(c)?,
        };
        // A file's numbers must describe its arrays: the cache subtracts and slices with them.
        let held = cache.keys.as_ref().map_or(0, |k| k.seq_len() as usize);
        if cache.start_position > cache.offset
            || cache.offset - cache.start_position > held
            || cache.chunk_size == 0
        {
            return Err(Error::InvalidArgument {
                op: "from_state",
                message: format!(
                    "{c}: offset {}, start_position {} and chunk_size {} do not fit the {held} \
                     cached positions",
                    cache.offset, cache.start_position, cache.chunk_size
                ),
            });
        }
        Ok(cache)
    }

    fn fetch(&self) -> Result<Kv> {
        let end = i(self.offset - self.start_position)?;
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Kv::from_stores(k.slice(0, end)?, v.slice(0, end)?, None),
            _ => Err(Error::InvalidArgument {
                op: "fetch",
                message: "the cache is empty".into(),
            }),
        }
    }
}

impl Cache for ChunkedKVCache {
    fn class_name(&self) -> &'static str {
        "ChunkedKVCache"
    }
    fn offset(&self) -> usize {
        self.offset
    }
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv> {
        let n = seq_of(keys, values, "update_and_fetch")?;
        let prev = self.offset - self.start_position;
        let capacity = self.keys.as_ref().map(|k| k.seq_len() as usize);
        if capacity.is_none_or(|c| prev + n > c) {
            let new_steps = i(n.div_ceil(STEP) * STEP)?;
            let (nk, nv) = (
                zeros_for(keys, new_steps, None)?,
                zeros_for(values, new_steps, None)?,
            );
            match (self.keys.take(), self.values.take()) {
                (Some(mut k), Some(mut v)) => {
                    if prev % STEP != 0 {
                        k = k.slice(0, i(prev)?)?;
                        v = v.slice(0, i(prev)?)?;
                    }
                    self.keys = Some(Store::concat(&[&k, &nk])?);
                    self.values = Some(Store::concat(&[&v, &nv])?);
                }
                _ => {
                    self.keys = Some(nk);
                    self.values = Some(nv);
                }
            }
        }
        self.offset += n;
        let end = i(self.offset - self.start_position)?;
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (
                k.update(&Store::Dense(keys.clone()), i(prev)?, end)?,
                v.update(&Store::Dense(values.clone()), i(prev)?, end)?,
            ),
            _ => {
                return Err(Error::InvalidArgument {
                    op: "update_and_fetch",
                    message: "missing buffers".into(),
                })
            }
        };
        self.keys = Some(k);
        self.values = Some(v);
        self.fetch()
    }
    fn fetch(&self) -> Result<Option<Kv>> {
        if self.keys.is_none() {
            return Ok(None);
        }
        ChunkedKVCache::fetch(self).map(Some)
    }
    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        // mlx-lm's ChunkedKVCache has no make_mask, so `base.create_attention_mask` falls back
        // to the cache-less rule (offset 0); models with chunked attention build their own.
        fallback_mask(n, window_size, return_array)
    }
    fn state(&self) -> StateValue {
        StateValue::List(vec![
            store_state(&self.keys),
            store_state(&self.values),
            StateValue::count(self.offset),
            StateValue::count(self.chunk_size),
            StateValue::count(self.start_position),
        ])
    }
    fn is_trimmable(&self) -> bool {
        true
    }
    fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset - self.start_position);
        self.offset -= n;
        n
    }
    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Store::nbytes) + self.values.as_ref().map_or(0, Store::nbytes)
    }
    fn is_empty(&self) -> bool {
        self.keys.is_none()
    }
}
