//! mlx-lm's `CacheList`: several caches serving one layer.

use mlx_core::prelude::*;

use crate::mask::{fallback_mask, AttentionMask};
use crate::state::StateValue;
use crate::{cache_from_state, Cache, Kv};

#[derive(Clone, Debug)]
pub struct CacheList {
    caches: Vec<Box<dyn Cache>>,
}

impl CacheList {
    pub fn new(caches: Vec<Box<dyn Cache>>) -> Self {
        CacheList { caches }
    }

    pub fn caches(&self) -> &[Box<dyn Cache>] {
        &self.caches
    }

    pub fn caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        &mut self.caches
    }

    pub fn from_state(state: StateValue) -> Result<Self> {
        let c = "CacheList";
        let caches = state
            .into_list(c)?
            .into_iter()
            .map(|pair| {
                let mut it = pair.list(c, 2)?.into_iter();
                let (s, class) = match (it.next(), it.next()) {
                    (Some(s), Some(class)) => (s, class.string(c)?),
                    _ => {
                        return Err(Error::InvalidArgument {
                            op: "from_state",
                            message: c.into(),
                        })
                    }
                };
                cache_from_state(&class, s)
            })
            .collect::<Result<_>>()?;
        Ok(CacheList { caches })
    }
}

impl Cache for CacheList {
    fn class_name(&self) -> &'static str {
        "CacheList"
    }
    fn offset(&self) -> usize {
        self.caches.first().map_or(0, |c| c.offset())
    }
    fn size(&self) -> usize {
        self.caches.iter().map(|c| c.size()).max().unwrap_or(0)
    }
    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<Kv> {
        Err(Error::InvalidArgument {
            op: "CacheList::update_and_fetch",
            message: "a CacheList is used through its member caches (caches_mut)".into(),
        })
    }
    fn fetch(&self) -> Result<Option<Kv>> {
        Ok(None)
    }
    /// deepseek_v32's pipeline stages tie the send to `cache[-1][0].keys`: the first member.
    fn depend_on(&mut self, dep: &Array) -> Result<bool> {
        match self.caches.first_mut() {
            Some(c) => c.depend_on(dep),
            None => Ok(false),
        }
    }
    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask> {
        // mlx-lm's CacheList has no make_mask; models mask per member cache.
        fallback_mask(n, window_size, return_array)
    }
    fn state(&self) -> StateValue {
        StateValue::List(
            self.caches
                .iter()
                .map(|c| {
                    StateValue::List(vec![c.state(), StateValue::Str(c.class_name().to_string())])
                })
                .collect(),
        )
    }
    fn is_trimmable(&self) -> bool {
        self.caches.iter().all(|c| c.is_trimmable())
    }
    fn can_trim(&self, n: usize) -> bool {
        self.caches.iter().all(|c| c.can_trim(n))
    }
    fn trim(&mut self, n: usize) -> usize {
        if !self.can_trim(n) {
            return 0;
        }
        self.caches
            .iter_mut()
            .map(|c| c.trim(n))
            .last()
            .unwrap_or(0)
    }
    fn nbytes(&self) -> usize {
        self.caches.iter().map(|c| c.nbytes()).sum()
    }
    fn is_empty(&self) -> bool {
        self.caches.first().is_none_or(|c| c.is_empty())
    }
}
