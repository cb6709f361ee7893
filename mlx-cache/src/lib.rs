//! The KV cache family, with mlx-lm 0.32.2's semantics (`mlx_lm/models/cache.py`) where mlx-lm
//! is right and specified, checked behaviour where it is not.
//!
//! Every cache implements [`Cache`]. Models never own caches: callers make them (one per
//! layer), pass them into the forward pass, and may trim, snapshot, save and load them.
//!
//! | kind | mlx-lm class | notes |
//! |---|---|---|
//! | [`KVCache`] | `KVCache` | grows in steps of 256, fetches views of the filled prefix |
//! | [`QuantizedKVCache`] | `QuantizedKVCache` | affine-quantized triples |
//! | [`RotatingKVCache`] | `RotatingKVCache` | sliding window with `keep`; checked [`RotatingKVCache::rollback`]; optional history so `trim` works after wrapping |
//! | [`RotatingQuantizedKVCache`] | none | what mlx-lm's `RotatingKVCache.to_quantized` refuses |
//! | [`TrellisKVCache`] | none | trellis-coded keys and values (2-4 bits), decoded for attention |
//! | [`ChunkedKVCache`] | `ChunkedKVCache` | |
//! | [`ConcatenateKVCache`] | `ConcatenateKVCache` | |
//! | [`ArraysCache`] | `ArraysCache` | recurrent state (conv + SSM), snapshot / restore |
//! | [`CacheList`] | `CacheList` | several caches for one layer |
//! | [`BatchKVCache`] | `BatchKVCache` | several sequences right-justified with left padding (continuous batching) |
//!
//! Trim semantics: [`Cache::trim`] removes up to `n` of the most recent tokens and returns how
//! many it removed. A cache that cannot be trimmed (a rotating cache that has wrapped, a
//! recurrent state) removes nothing, returns 0 and stays valid; mlx-lm's `trim_prompt_cache`
//! behaves the same, its raw `RotatingKVCache.trim` does not. With [`enable_rollback`], rotating
//! and recurrent caches keep what they need to go back up to `max_rollback` tokens exactly.
#![forbid(unsafe_code)]

mod arrays;
mod batch;
mod chunked;
mod concat;
mod kv;
mod list;
pub mod mask;
pub mod persist;
mod rotating;
mod seq;
mod state;
mod store;
mod trellis;

use std::any::Any;

use mlx_core::prelude::*;

pub use arrays::{ArraysCache, ArraysSnapshot};
pub use batch::BatchKVCache;
pub use chunked::ChunkedKVCache;
pub use concat::ConcatenateKVCache;
pub use kv::{KVCache, QuantizedKVCache};
pub use list::CacheList;
pub use mask::{create_attention_mask, create_causal_mask, AttentionMask};
pub use persist::{check_compatible, load_prompt_cache, save_prompt_cache};
pub use rotating::{RotatingKVCache, RotatingQuantizedKVCache};
pub use state::StateValue;
pub use store::{QTensor, QuantSpec, Store};
pub use trellis::{
    TrellisKVCache, TrellisKvSpec, DEFAULT_TRELLIS_KV_HISTORY, DEFAULT_TRELLIS_KV_L,
    DEFAULT_TRELLIS_KV_SINK, DEFAULT_TRELLIS_KV_WINDOW,
};

/// How a cache is quantized with `--kv-bits` (`--kv-mode`): mlx-lm's affine
/// [`QuantizedKVCache`], or the trellis code of [`TrellisKVCache`] (not in mlx-lm).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvMode {
    #[default]
    Affine,
    Trellis,
}

impl KvMode {
    /// `"affine"` or `"trellis"`.
    pub fn parse(s: &str) -> Result<KvMode> {
        match s {
            "affine" => Ok(KvMode::Affine),
            "trellis" => Ok(KvMode::Trellis),
            other => Err(Error::InvalidArgument {
                op: "kv_mode",
                message: format!("unknown KV cache mode {other:?} (known: affine, trellis)"),
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvMode::Affine => "affine",
            KvMode::Trellis => "trellis",
        }
    }

    /// Checks `bits` (and for affine `group_size`) as the cache of this mode will.
    pub fn check(self, group_size: i32, bits: i32) -> Result<()> {
        match self {
            KvMode::Affine => QuantSpec::new(group_size, bits).map(|_| ()),
            KvMode::Trellis => TrellisKvSpec::new(bits, DEFAULT_TRELLIS_KV_L).map(|_| ()),
        }
    }
}

/// Keys and values as a cache returns them for attention.
#[derive(Clone, Debug)]
pub enum Kv {
    Dense {
        keys: Array,
        values: Array,
    },
    /// Quantized triples; attention must use quantized matmuls (mlx-lm's
    /// `quantized_scaled_dot_product_attention`).
    Quantized {
        keys: QTensor,
        values: QTensor,
        spec: QuantSpec,
    },
}

impl Kv {
    pub(crate) fn from_stores(keys: Store, values: Store, spec: Option<QuantSpec>) -> Result<Kv> {
        match (keys, values, spec) {
            (Store::Dense(keys), Store::Dense(values), _) => Ok(Kv::Dense { keys, values }),
            (Store::Quantized(keys), Store::Quantized(values), Some(spec)) => {
                Ok(Kv::Quantized { keys, values, spec })
            }
            _ => Err(Error::InvalidArgument {
                op: "cache",
                message: "inconsistent cache contents (dense and quantized mixed)".into(),
            }),
        }
    }

    /// All arrays, keys first (a quantized tensor as weight, scales, biases).
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Kv::Dense { keys, values } => vec![keys, values],
            Kv::Quantized { keys, values, .. } => {
                keys.arrays().into_iter().chain(values.arrays()).collect()
            }
        }
    }
}

/// What every cache gets from being `Clone + 'static` (a blanket impl, nothing to write):
/// copying behind a `Box<dyn Cache>` and downcasting to the concrete kind.
pub trait CacheObject {
    /// A copy that evolves independently (arrays are immutable, so this is cheap).
    fn boxed_clone(&self) -> Box<dyn Cache>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Cache + Clone + 'static> CacheObject for T {
    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// One layer's cache.
pub trait Cache: CacheObject + Send + std::fmt::Debug {
    /// The mlx-lm class name (used in prompt-cache files).
    fn class_name(&self) -> &'static str;

    /// Tokens seen so far (mlx-lm's `offset`): the position of the next token.
    fn offset(&self) -> usize;

    /// One position per batch row (int32, `(batch,)`) when rows differ, as mlx-lm's batched
    /// caches (`BatchKVCache`) keep an array `offset`; rope then uses these instead of
    /// [`Cache::offset`]. `None` for the single-sequence caches.
    fn offsets(&self) -> Option<Array> {
        None
    }

    /// Tokens held (mlx-lm's `size()`), e.g. at most `max_size` for a rotating cache.
    fn size(&self) -> usize {
        0
    }

    /// Appends `keys`/`values` of shape `(batch, kv_heads, seq, head_dim)` and returns what
    /// attention should use.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<Kv>;

    /// What the last `update_and_fetch` returned, without writing (mlx-lm's
    /// `keys_and_values`); `None` when nothing was written or the cache holds no keys/values.
    fn fetch(&self) -> Result<Option<Kv>>;

    /// The mask for `n` new tokens (mlx-lm's `make_mask`).
    fn make_mask(
        &self,
        n: usize,
        window_size: Option<usize>,
        return_array: bool,
    ) -> Result<AttentionMask>;

    /// mlx-lm's `state` (arrays plus meta state), as a tree.
    fn state(&self) -> StateValue;

    /// Whether [`Cache::trim`] can remove tokens now.
    fn is_trimmable(&self) -> bool;

    /// Removes up to `n` of the most recent tokens; returns how many were removed (0 when the
    /// cache is not trimmable, leaving it unchanged).
    fn trim(&mut self, n: usize) -> usize;

    /// Whether [`Cache::trim`] of `n` tokens would act now (a recurrent cache can only go back
    /// exactly to a recorded position, so this depends on `n`).
    fn can_trim(&self, _n: usize) -> bool {
        self.is_trimmable()
    }

    /// Makes the cached keys depend on `dep` (MLX's `depends`), so that evaluating the cache
    /// evaluates `dep` first: mlx-lm's pipeline stages tie their `send` to the last layer's
    /// cache this way (`cache[-1].keys = mx.depends(cache[-1].keys, h)`). `false`, changing
    /// nothing, for kinds that cannot (and for an empty cache).
    fn depend_on(&mut self, _dep: &Array) -> Result<bool> {
        Ok(false)
    }

    /// Bytes held.
    fn nbytes(&self) -> usize;

    /// Nothing written yet.
    fn is_empty(&self) -> bool;
}

impl Clone for Box<dyn Cache> {
    fn clone(&self) -> Self {
        self.boxed_clone()
    }
}

/// Whether every cache can be trimmed (mlx-lm's `can_trim_prompt_cache`).
pub fn can_trim_prompt_cache(caches: &[Box<dyn Cache>]) -> bool {
    caches.iter().all(|c| c.is_trimmable())
}

/// Trims every cache by `n` if all can be trimmed; returns the tokens trimmed (mlx-lm's
/// `trim_prompt_cache`): 0 and no change otherwise. A recurrent cache with history must be able
/// to go back exactly `n` tokens ([`Cache::can_trim`]), or nothing is trimmed.
pub fn trim_prompt_cache(caches: &mut [Box<dyn Cache>], n: usize) -> usize {
    if caches.is_empty() || !caches.iter().all(|c| c.can_trim(n)) {
        return 0;
    }
    // Every cache is trimmed; the first one's count is reported, as in mlx-lm.
    let trimmed: Vec<usize> = caches.iter_mut().map(|c| c.trim(n)).collect();
    trimmed[0]
}

/// Makes every cache able to undo up to `max_rollback` tokens exactly with [`Cache::trim`]
/// (beyond mlx-lm, which cannot trim a wrapped rotating cache or a recurrent state): rotating
/// caches keep their earlier rings ([`RotatingKVCache::set_max_rollback`]), recurrent caches
/// their per-token states ([`ArraysCache::set_max_rollback`]; the model records them), the
/// members of a [`CacheList`] likewise. Plain KV caches are trimmable already. Call it on fresh
/// caches, before the first write.
pub fn enable_rollback(caches: &mut [Box<dyn Cache>], max_rollback: usize) {
    for c in caches {
        let any = c.as_mut().as_any_mut();
        if let Some(r) = any.downcast_mut::<RotatingKVCache>() {
            r.set_max_rollback(max_rollback);
        } else if let Some(r) = any.downcast_mut::<RotatingQuantizedKVCache>() {
            r.set_max_rollback(max_rollback);
        } else if let Some(a) = any.downcast_mut::<ArraysCache>() {
            a.set_max_rollback(max_rollback);
        } else if let Some(l) = any.downcast_mut::<CacheList>() {
            enable_rollback(l.caches_mut(), max_rollback);
        }
    }
}

/// The cache classes a prompt-cache file may hold, each named once: [`KNOWN_CLASSES`] and
/// [`cache_from_state`] come from this one list (a class name is its type's name, as in
/// mlx-lm).
macro_rules! cache_classes {
    ($($class:ident),* $(,)?) => {
        /// The cache classes [`cache_from_state`] rebuilds (what a prompt-cache file may hold).
        pub const KNOWN_CLASSES: &[&str] = &[$(stringify!($class)),*];

        /// Builds a cache from its mlx-lm class name and state (mlx-lm's `from_state`).
        pub fn cache_from_state(class: &str, state: StateValue) -> Result<Box<dyn Cache>> {
            Ok(match class {
                $(stringify!($class) => Box::new($class::from_state(state)?),)*
                other => {
                    return Err(Error::InvalidArgument {
                        op: "cache_from_state",
                        message: format!(
                            "unknown cache class {other:?} (known: {})",
                            KNOWN_CLASSES.join(", ")
                        ),
                    })
                }
            })
        }
    };
}

cache_classes!(
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    RotatingQuantizedKVCache,
    ChunkedKVCache,
    ConcatenateKVCache,
    ArraysCache,
    CacheList,
    TrellisKVCache,
);

pub(crate) fn as_i32(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidArgument {
        op,
        message: format!("{v} exceeds i32"),
    })
}

pub(crate) fn seq_of(keys: &Array, values: &Array, op: &'static str) -> Result<usize> {
    let (k, v) = (keys.shape(), values.shape());
    if k.len() != 4 || v.len() != 4 || k[..3] != v[..3] {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "keys and values must be (batch, heads, seq, dim) with equal leading dims; got {k:?} and {v:?}"
            ),
        });
    }
    Ok(k[2] as usize)
}
