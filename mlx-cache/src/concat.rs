//! mlx-lm's `ConcatenateKVCache`: every write concatenates.
//!
//! One deliberate difference: mlx-lm's `trim` only lowers `offset`, so the trimmed tokens are
//! still returned by `keys_and_values` and come back on the next write (its offset is reset
//! from the array length). Here `trim` removes them, so offset always equals the tokens held.

use mlx_core::prelude::*;

use crate::mask::{create_attention_mask, AttentionMask};
use crate::state::StateValue;
use crate::{seq, seq_of, Cache, Kv};

#[derive(Clone, Debug, Default)]
pub struct ConcatenateKVCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

impl ConcatenateKVCache {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let c = "ConcatenateKVCache";
        let mut it = state.list(c, 2)?.into_iter();
        let keys = it.next().map_or(Ok(None), |v| v.opt_array(c))?;
        let values = it.next().map_or(Ok(None), |v| v.opt_array(c))?;
        for (a, what) in [(&keys, "keys"), (&values, "values")] {
            if let Some(a) = a {
                crate::kv::check_float(a, c, what)?;
            }
        }
        let offset = keys.as_ref().map_or(0, |k| seq::len(k) as usize);
        Ok(ConcatenateKVCache {
            keys,
            values,
            offset,
        })
    }

    /// A cache already holding `keys` and `values` (`from_state` of the two).
    pub fn holding(keys: Array, values: Array) -> Result<Self> {
        Self::from_state(StateValue::List(vec![
            StateValue::Array(keys),
            StateValue::Array(values),
        ]))
    }
}

impl Cache for ConcatenateKVCache {
    fn class_name(&self) -> &'static str {
        "ConcatenateKVCache"
    }
    fn offset(&self) -> usize {
        self.offset
    }
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv> {
        seq_of(keys, values, "update_and_fetch")?;
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (seq::concat(&[k, keys])?, seq::concat(&[v, values])?),
            _ => (keys.clone(), values.clone()),
        };
        self.offset = seq::len(&k) as usize;
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok(Kv::Dense { keys: k, values: v })
    }
    fn fetch(&self) -> Result<Option<Kv>> {
        Ok(match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Some(Kv::Dense {
                keys: k.clone(),
                values: v.clone(),
            }),
            _ => None,
        })
    }
    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        create_attention_mask(n, self.offset, return_array, window_size)
    }
    fn state(&self) -> StateValue {
        StateValue::List(vec![
            StateValue::opt(&self.keys),
            StateValue::opt(&self.values),
        ])
    }
    fn is_trimmable(&self) -> bool {
        true
    }
    fn trim(&mut self, n: usize) -> usize {
        let n = n.min(self.offset);
        if n == 0 {
            return 0;
        }
        let keep = self.offset - n;
        let cut = |a: &Option<Array>| -> Option<Array> {
            a.as_ref().and_then(|a| seq::slice(a, 0, keep as i32).ok())
        };
        match (cut(&self.keys), cut(&self.values)) {
            (Some(k), Some(v)) => {
                self.keys = Some(k);
                self.values = Some(v);
                self.offset = keep;
                n
            }
            // Slicing failed (cannot happen for a well-formed cache): trim nothing.
            _ => 0,
        }
    }
    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, Array::nbytes) + self.values.as_ref().map_or(0, Array::nbytes)
    }
    fn is_empty(&self) -> bool {
        self.keys.is_none()
    }
}
