//! A cache of prompt caches for repeated prefixes (the role of mlx-lm's `LRUPromptCache`):
//! a request reuses the stored cache sharing the longest common prefix with its tokens,
//! trimmed to that prefix with mlx-cache's trim semantics; entries are evicted least recently
//! used first, to stay under a byte budget and an entry count.

use mlx_cache::{can_trim_prompt_cache, trim_prompt_cache, Cache};

struct Entry {
    tokens: Vec<u32>,
    caches: Vec<Box<dyn Cache>>,
    nbytes: usize,
    used: u64,
}

/// Stored prompt caches keyed by the tokens they hold.
pub struct PromptCache {
    entries: Vec<Entry>,
    max_entries: usize,
    max_bytes: usize,
    clock: u64,
}

/// What [`PromptCache::fetch`] found: caches holding `reused` tokens of the request, so only
/// `tokens[reused..]` need a forward pass.
pub struct Reuse {
    pub caches: Vec<Box<dyn Cache>>,
    pub reused: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        PromptCache {
            entries: Vec::new(),
            max_entries,
            max_bytes,
            clock: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held by all entries.
    pub fn nbytes(&self) -> usize {
        self.entries.iter().map(|e| e.nbytes).sum()
    }

    /// Caches for `tokens`, reusing the longest usable common prefix (at least one token of
    /// `tokens` is always left to process). `None` when nothing can be reused.
    pub fn fetch(&mut self, tokens: &[u32]) -> Option<Reuse> {
        if tokens.len() < 2 {
            return None;
        }
        self.clock += 1;
        let limit = tokens.len() - 1;
        let mut order: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (common_prefix(&e.tokens, tokens).min(limit), i))
            .filter(|(p, _)| *p > 0)
            .collect();
        order.sort_by_key(|o| std::cmp::Reverse(o.0));
        for (prefix, i) in order {
            let e = &mut self.entries[i];
            let excess = e.tokens.len() - prefix;
            let mut caches: Vec<Box<dyn Cache>> = e.caches.clone();
            if excess > 0
                && (!can_trim_prompt_cache(&caches)
                    || trim_prompt_cache(&mut caches, excess) != excess)
            {
                continue;
            }
            e.used = self.clock;
            return Some(Reuse {
                caches,
                reused: prefix,
            });
        }
        None
    }

    /// Stores `caches`, which hold exactly `tokens`, then evicts least recently used entries
    /// beyond the limits.
    pub fn insert(&mut self, tokens: Vec<u32>, caches: Vec<Box<dyn Cache>>) {
        self.clock += 1;
        self.entries.retain(|e| e.tokens != tokens);
        let nbytes = caches.iter().map(|c| c.nbytes()).sum();
        self.entries.push(Entry {
            tokens,
            caches,
            nbytes,
            used: self.clock,
        });
        while self.entries.len() > self.max_entries
            || (self.nbytes() > self.max_bytes && self.entries.len() > 1)
        {
            let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) else {
                break;
            };
            self.entries.remove(i);
        }
        if self.nbytes() > self.max_bytes {
            self.entries.clear();
        }
    }
}
