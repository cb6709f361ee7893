//! Attention masks, as mlx-lm 0.32.2 builds them (`models/base.py`, `models/cache.py`).

use mlx_core::prelude::*;

/// What attention should mask: nothing, the causal fast path (`"causal"` in mlx-lm, handled
/// inside `scaled_dot_product_attention`), or an explicit mask (boolean: `true` = attend).
#[derive(Clone, Debug)]
pub enum AttentionMask {
    None,
    Causal,
    Array(Array),
}

impl AttentionMask {
    pub fn is_none(&self) -> bool {
        matches!(self, AttentionMask::None)
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            AttentionMask::Array(a) => Some(a),
            _ => None,
        }
    }
}

fn int(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidArgument {
        op,
        message: format!("{v} exceeds i32"),
    })
}

/// `create_causal_mask(N, offset, window_size)`: a `(N, offset + N)` boolean mask.
pub fn create_causal_mask(n: usize, offset: usize, window_size: Option<usize>) -> Result<Array> {
    let (n, offset) = (
        int(n, "create_causal_mask")?,
        int(offset, "create_causal_mask")?,
    );
    let rinds = ops::arange(0.0, f64::from(offset + n), 1.0, Dtype::Int32, None)?;
    let linds = if offset != 0 {
        ops::arange(
            f64::from(offset),
            f64::from(offset + n),
            1.0,
            Dtype::Int32,
            None,
        )?
    } else {
        rinds.clone()
    };
    let linds = ops::expand_dims(&linds, &[1], None)?;
    let rinds = ops::expand_dims(&rinds, &[0], None)?;
    let mut mask = ops::greater_equal(&linds, &rinds, None)?;
    if let Some(w) = window_size {
        let upper = ops::add_scalar(&rinds, i64::from(int(w, "create_causal_mask")?), None)?;
        mask = ops::bitwise_and(&mask, &ops::less(&linds, &upper, None)?, None)?;
    }
    Ok(mask)
}

/// `cache.create_attention_mask(N, offset, return_array, window_size)` (the plain caches'
/// `make_mask`).
pub fn create_attention_mask(
    n: usize,
    offset: usize,
    return_array: bool,
    window_size: Option<usize>,
) -> Result<AttentionMask> {
    if window_size.is_some() {
        Ok(AttentionMask::Array(create_causal_mask(
            n,
            offset,
            window_size,
        )?))
    } else if n == 1 {
        Ok(AttentionMask::None)
    } else if return_array {
        Ok(AttentionMask::Array(create_causal_mask(
            n,
            offset,
            window_size,
        )?))
    } else {
        Ok(AttentionMask::Causal)
    }
}

/// The rule `base.create_attention_mask` applies when the cache has no `make_mask` of its own
/// (mlx-lm's `ChunkedKVCache`, `CacheList`): no mask for one token, an explicit mask at
/// offset 0 when asked for one or when the window is exceeded, the causal fast path otherwise.
pub fn fallback_mask(
    n: usize,
    window_size: Option<usize>,
    return_array: bool,
) -> Result<AttentionMask> {
    if n == 1 {
        Ok(AttentionMask::None)
    } else if return_array || window_size.is_some_and(|w| w != 0 && n > w) {
        Ok(AttentionMask::Array(create_causal_mask(n, 0, window_size)?))
    } else {
        Ok(AttentionMask::Causal)
    }
}
