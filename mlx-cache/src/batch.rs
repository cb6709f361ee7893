//! `BatchKVCache`, ported from mlx-lm 0.32.2 `models/cache.py`: one dense key/value buffer for
//! several sequences, right-justified at a shared index with per-row left padding, so that a
//! decode step runs every sequence in one forward pass. Rows join ([`BatchKVCache::extend`])
//! and leave ([`BatchKVCache::filter`]) between steps.
//!
//! mlx-lm keeps `offset` and `left_padding` as arrays; here they are host integers (they only
//! change between steps) and become arrays where the model needs them: rope's per-row offsets
//! ([`Cache::offsets`]) and the mask.

use crate::{AttentionMask, Cache, Kv, StateValue};
use mlx_core::prelude::*;

/// Growth step of the buffers, as in mlx-lm (`BatchKVCache.step`).
const STEP: i32 = 256;

fn err(message: String) -> Error {
    Error::InvalidArgument {
        op: "BatchKVCache",
        message,
    }
}

fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{v} exceeds i32")))
}

/// mlx-lm's `BatchKVCache` (dense keys and values only).
#[derive(Clone, Debug)]
pub struct BatchKVCache {
    keys: Option<Array>,
    values: Option<Array>,
    left_padding: Vec<i32>,
    idx: i32,
}

impl BatchKVCache {
    /// An empty cache for rows left-padded by `left_padding`.
    pub fn new(left_padding: &[i32]) -> Self {
        BatchKVCache {
            keys: None,
            values: None,
            left_padding: left_padding.to_vec(),
            idx: 0,
        }
    }

    /// One row holding what a single-sequence cache holds (no padding).
    pub fn from_single(cache: &dyn Cache) -> Result<Self> {
        match cache.fetch()? {
            None => Ok(Self::new(&[0])),
            Some(Kv::Dense { keys, values }) => {
                let s = keys.shape();
                if s.len() != 4 || s[0] != 1 {
                    return Err(err(format!(
                        "expected one sequence of (1, heads, seq, dim) keys, got {s:?}"
                    )));
                }
                Ok(BatchKVCache {
                    idx: s[2],
                    keys: Some(keys),
                    values: Some(values),
                    left_padding: vec![0],
                })
            }
            Some(Kv::Quantized { .. }) => Err(err(
                "quantized caches cannot join a batch (BatchKVCache is dense)".into(),
            )),
        }
    }

    /// Rows in the batch.
    pub fn batch_size(&self) -> usize {
        self.left_padding.len()
    }

    /// Padding of each row.
    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// `filter(batch_indices)`: keeps the given rows (in that order), then drops the padding
    /// columns every remaining row has.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if let Some(&bad) = keep.iter().find(|&&i| i >= self.left_padding.len()) {
            return Err(err(format!(
                "row {bad} out of range for a batch of {}",
                self.left_padding.len()
            )));
        }
        let rows: Vec<i32> = keep.iter().map(|&i| to_i32(i)).collect::<Result<_>>()?;
        let idx = Array::from_slice(&rows, &[rows.len() as i32])?;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            self.keys = Some(ops::take(k, &idx, 0, None)?);
            self.values = Some(ops::take(v, &idx, 0, None)?);
        }
        self.left_padding = keep.iter().map(|&i| self.left_padding[i]).collect();
        let min_left = self.left_padding.iter().copied().min().unwrap_or(0);
        if min_left > 0 {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                let end = k.dim(2)?;
                self.keys = Some(ops::slice_axis(k, 2, min_left, end, None)?);
                self.values = Some(ops::slice_axis(v, 2, min_left, end, None)?);
            }
            self.idx -= min_left;
            for p in &mut self.left_padding {
                *p -= min_left;
            }
        }
        Ok(())
    }

    /// `extend(other)`: appends `other`'s rows, padding both so that they are right-justified
    /// at the larger index.
    pub fn extend(&mut self, other: &BatchKVCache) -> Result<()> {
        if self.keys.is_none() && other.keys.is_none() {
            self.left_padding.extend_from_slice(&other.left_padding);
            return Ok(());
        }
        let max_idx = self.idx.max(other.idx);
        let template = match (&self.keys, &self.values, &other.keys, &other.values) {
            (Some(k), Some(v), _, _) | (_, _, Some(k), Some(v)) => {
                (k.shape(), v.shape(), k.dtype())
            }
            _ => return Err(err("keys without values".into())),
        };
        let (ks, vs, dtype) = template;
        let (h, d, m) = (ks[1], ks[3], vs[3]);
        let len = |c: &BatchKVCache| c.keys.as_ref().map_or(Ok(0), |k| k.dim(2));
        let max_size = len(self)?.max(len(other)?);
        let zero = Array::from_int(0, dtype)?;
        let pad = |c: &BatchKVCache| -> Result<(Array, Array, Vec<i32>)> {
            let rows = to_i32(c.batch_size())?;
            let (mut k, mut v) = match (&c.keys, &c.values) {
                (Some(k), Some(v)) => (k.clone(), v.clone()),
                _ => (
                    ops::zeros(&[rows, h, 0, d], dtype, None)?,
                    ops::zeros(&[rows, h, 0, m], dtype, None)?,
                ),
            };
            let left = max_idx - c.idx;
            let mut right = max_size - k.dim(2)? - left;
            if right < 0 {
                let end = k.dim(2)? + right;
                k = ops::slice_axis(&k, 2, 0, end, None)?;
                v = ops::slice_axis(&v, 2, 0, end, None)?;
                right = 0;
            }
            if left != 0 || right != 0 {
                k = ops::pad(&k, &[2], &[left], &[right], &zero, "constant", None)?;
                v = ops::pad(&v, &[2], &[left], &[right], &zero, "constant", None)?;
            }
            Ok((k, v, c.left_padding.iter().map(|p| p + left).collect()))
        };
        let (k1, v1, p1) = pad(self)?;
        let (k2, v2, p2) = pad(other)?;
        self.keys = Some(ops::concatenate(&[&k1, &k2], 0, None)?);
        self.values = Some(ops::concatenate(&[&v1, &v2], 0, None)?);
        self.left_padding = p1.into_iter().chain(p2).collect();
        self.idx = max_idx;
        Ok(())
    }

    fn filled(&self) -> Result<Option<Kv>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok(Some(Kv::Dense {
                keys: ops::slice_axis(k, 2, 0, self.idx, None)?,
                values: ops::slice_axis(v, 2, 0, self.idx, None)?,
            })),
            _ => Ok(None),
        }
    }

    fn left_padding_array(&self) -> Result<Array> {
        Array::from_slice(&self.left_padding, &[to_i32(self.left_padding.len())?])
    }
}

impl Cache for BatchKVCache {
    fn class_name(&self) -> &'static str {
        "BatchKVCache"
    }

    /// The shared index (mlx-lm's `_idx`); per-row positions are [`Cache::offsets`].
    fn offset(&self) -> usize {
        self.idx.max(0) as usize
    }

    fn offsets(&self) -> Option<Array> {
        let o: Vec<i32> = self.left_padding.iter().map(|p| self.idx - p).collect();
        Array::from_slice(&o, &[o.len() as i32]).ok()
    }

    fn size(&self) -> usize {
        self.offset()
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv> {
        let (ks, vs) = (keys.shape(), values.shape());
        if ks.len() != 4 || vs.len() != 4 || ks[..3] != vs[..3] {
            return Err(err(format!(
                "keys and values must be (batch, heads, seq, dim); got {ks:?} and {vs:?}"
            )));
        }
        if ks[0] as usize != self.batch_size() {
            return Err(err(format!(
                "{} rows given to a batch of {}",
                ks[0],
                self.batch_size()
            )));
        }
        let prev = self.idx;
        let n = ks[2];
        let capacity = self.keys.as_ref().map(|k| k.dim(2)).transpose()?;
        if capacity.is_none_or(|c| prev + n > c) {
            let n_steps = (STEP + n - 1) / STEP;
            let new_k = ops::zeros(&[ks[0], ks[1], n_steps * STEP, ks[3]], keys.dtype(), None)?;
            let new_v = ops::zeros(&[vs[0], vs[1], n_steps * STEP, vs[3]], values.dtype(), None)?;
            match (self.keys.take(), self.values.take()) {
                (Some(mut k), Some(mut v)) => {
                    if prev % STEP != 0 {
                        k = ops::slice_axis(&k, 2, 0, prev, None)?;
                        v = ops::slice_axis(&v, 2, 0, prev, None)?;
                    }
                    self.keys = Some(ops::concatenate(&[&k, &new_k], 2, None)?);
                    self.values = Some(ops::concatenate(&[&v, &new_v], 2, None)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        self.idx += n;
        let write = |buf: &Array, x: &Array| -> Result<Array> {
            let s = buf.shape();
            ops::slice_update(
                buf,
                x,
                &[0, 0, prev, 0],
                &[s[0], s[1], self.idx, s[3]],
                &[1, 1, 1, 1],
                None,
            )
        };
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (k, v) = (write(k, keys)?, write(v, values)?);
            self.keys = Some(k);
            self.values = Some(v);
        }
        self.filled()?
            .ok_or_else(|| err("cache buffers missing".into()))
    }

    fn fetch(&self) -> Result<Option<Kv>> {
        self.filled()
    }

    /// `create_causal_mask(N, offset=_idx, left_padding=..., window_size=...)`: always an
    /// explicit `(batch, 1, N, _idx + N)` mask.
    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        _return_array: bool,
    ) -> Result<AttentionMask> {
        let offset = self.offset();
        let mask = crate::create_causal_mask(n, offset, window_size)?;
        let total = to_i32(offset + n)?;
        let rinds = ops::expand_dims(
            &ops::arange(0.0, f64::from(total), 1.0, Dtype::Int32, None)?,
            &[0],
            None,
        )?;
        let lp = ops::expand_dims(&self.left_padding_array()?, &[1, 2, 3], None)?;
        let keep = ops::less_equal(&lp, &rinds, None)?;
        Ok(AttentionMask::Array(ops::bitwise_and(&mask, &keep, None)?))
    }

    fn state(&self) -> StateValue {
        let arr = |a: &Option<Array>| a.clone().map_or(StateValue::None, StateValue::Array);
        let offsets = self.offsets().map_or(StateValue::None, StateValue::Array);
        let lp = self
            .left_padding_array()
            .map_or(StateValue::None, StateValue::Array);
        StateValue::List(vec![
            arr(&self.keys),
            arr(&self.values),
            offsets,
            lp,
            StateValue::Int(i64::from(self.idx)),
        ])
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset());
        self.idx -= n as i32;
        n
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Array::nbytes) + self.values.as_ref().map_or(0, Array::nbytes)
    }

    fn is_empty(&self) -> bool {
        self.keys.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KVCache;

    fn single(len: i32, fill: f32) -> KVCache {
        let mut c = KVCache::new();
        let k = ops::full(
            &[1, 2, len, 4],
            &Array::scalar(fill).unwrap(),
            Dtype::Float32,
            None,
        )
        .unwrap();
        c.update_and_fetch(&k, &k).unwrap();
        c
    }

    #[test]
    fn rows_join_right_justified_and_leave_without_common_padding() {
        let mut b = BatchKVCache::from_single(&single(3, 1.0)).unwrap();
        b.extend(&BatchKVCache::from_single(&single(5, 2.0)).unwrap())
            .unwrap();
        assert_eq!(b.left_padding(), &[2, 0]);
        assert_eq!(b.offset(), 5);
        assert_eq!(b.offsets().unwrap().to_vec::<i32>().unwrap(), vec![3, 5]);
        // Row 0's padding is masked, its tokens are not.
        let AttentionMask::Array(m) = b.make_mask(1, None, false).unwrap() else {
            panic!("a batch always has an explicit mask");
        };
        assert_eq!(m.shape(), vec![2, 1, 1, 6]);
        assert_eq!(
            m.to_vec::<bool>().unwrap(),
            vec![false, false, true, true, true, true, true, true, true, true, true, true]
        );
        let Some(Kv::Dense { keys, .. }) = b.fetch().unwrap() else {
            panic!("dense keys expected");
        };
        let row0: Vec<f32> = ops::slice(&keys, &[0, 0, 0, 0], &[1, 1, 5, 1], &[1, 1, 1, 1], None)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(row0, vec![0.0, 0.0, 1.0, 1.0, 1.0]);
        // One step for both rows, then the longer row leaves: row 0 keeps its 4 tokens and
        // the padding nobody needs is dropped.
        let k = ops::zeros(&[2, 2, 1, 4], Dtype::Float32, None).unwrap();
        b.update_and_fetch(&k, &k).unwrap();
        b.filter(&[0]).unwrap();
        assert_eq!(b.left_padding(), &[0]);
        assert_eq!(b.offset(), 4);
        assert_eq!(b.offsets().unwrap().to_vec::<i32>().unwrap(), vec![4]);
        assert!(b.filter(&[3]).is_err());
    }
}
