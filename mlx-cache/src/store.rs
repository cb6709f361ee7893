//! What a cache holds for keys (or values): a dense array, or an affine-quantized triple
//! (packed weight, scales, biases) as `mx.quantize` returns it. Every cache kind is written
//! once over [`Store`], so the quantized kinds cannot drift from the dense ones.

use mlx_core::prelude::*;
use mlx_core::quantized::{self, QuantMode};

use crate::seq;

/// Keys or values as a cache stores them.
#[derive(Clone, Debug)]
pub enum Store {
    Dense(Array),
    /// `(weight, scales, biases)` from affine quantization along the last axis.
    Quantized(QTensor),
}

/// An affine-quantized tensor: `mx.quantize`'s `(w, scales, biases)`.
#[derive(Clone, Debug)]
pub struct QTensor {
    pub weight: Array,
    pub scales: Array,
    pub biases: Array,
}

/// Quantization settings of a quantized cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
}

impl QuantSpec {
    /// Affine settings MLX accepts (1-6 or 8 bits, groups of 32, 64 or 128); anything else is
    /// refused here, before a first update would divide by zero inside the cache.
    pub fn new(group_size: i32, bits: i32) -> Result<QuantSpec> {
        QuantMode::Affine
            .check(group_size, bits)
            .map_err(|e| Error::InvalidArgument {
                op: "QuantizedKVCache",
                message: e.to_string(),
            })?;
        Ok(QuantSpec { group_size, bits })
    }

    /// [`QuantSpec::new`] from a prompt-cache file's integers (checked, not truncated).
    pub(crate) fn from_state(class: &'static str, group_size: i64, bits: i64) -> Result<QuantSpec> {
        let narrow = |what: &str, v: i64| {
            i32::try_from(v).map_err(|_| Error::InvalidArgument {
                op: "from_state",
                message: format!("{class}: {what} {v} is out of range"),
            })
        };
        QuantSpec::new(narrow("group_size", group_size)?, narrow("bits", bits)?).map_err(|e| {
            Error::InvalidArgument {
                op: "from_state",
                message: format!("{class}: {}", e.message()),
            }
        })
    }

    /// Quantizes `x` along its last axis as `mx.quantize(x, group_size, bits)` does.
    pub fn quantize(self, x: &Array) -> Result<QTensor> {
        let (weight, scales, biases) =
            quantized::quantize(x, self.group_size, self.bits, QuantMode::Affine, None)?;
        let biases = biases.ok_or_else(|| Error::Mlx {
            op: "quantize",
            message: "affine quantization returned no biases".into(),
        })?;
        Ok(QTensor {
            weight,
            scales,
            biases,
        })
    }
}

impl QTensor {
    pub fn arrays(&self) -> [&Array; 3] {
        [&self.weight, &self.scales, &self.biases]
    }

    fn try_map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<QTensor> {
        Ok(QTensor {
            weight: f(&self.weight)?,
            scales: f(&self.scales)?,
            biases: f(&self.biases)?,
        })
    }
}

impl Store {
    /// The arrays, in mlx-lm's state order.
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Store::Dense(a) => vec![a],
            Store::Quantized(q) => q.arrays().to_vec(),
        }
    }

    pub fn nbytes(&self) -> usize {
        self.arrays().iter().map(|a| a.nbytes()).sum()
    }

    /// Length along the sequence axis.
    pub fn seq_len(&self) -> i32 {
        match self {
            Store::Dense(a) => seq::len(a),
            Store::Quantized(q) => seq::len(&q.weight),
        }
    }

    fn try_map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Store> {
        Ok(match self {
            Store::Dense(a) => Store::Dense(f(a)?),
            Store::Quantized(q) => Store::Quantized(q.try_map(f)?),
        })
    }

    /// `x[..., start:stop, :]` for each array.
    pub fn slice(&self, start: i32, stop: i32) -> Result<Store> {
        self.try_map(|a| seq::slice(a, start, stop))
    }

    /// Concatenation along the sequence axis; all parts must be of one kind.
    pub fn concat(parts: &[&Store]) -> Result<Store> {
        let dense: Option<Vec<&Array>> = parts
            .iter()
            .map(|p| match p {
                Store::Dense(a) => Some(a),
                Store::Quantized(_) => None,
            })
            .collect();
        if let Some(d) = dense {
            return Ok(Store::Dense(seq::concat(&d)?));
        }
        let quant: Option<Vec<&QTensor>> = parts
            .iter()
            .map(|p| match p {
                Store::Quantized(q) => Some(q),
                Store::Dense(_) => None,
            })
            .collect();
        let q = quant.ok_or_else(|| Error::InvalidArgument {
            op: "cache",
            message: "cannot concatenate dense and quantized cache contents".into(),
        })?;
        let cat = |f: fn(&QTensor) -> &Array| -> Result<Array> {
            seq::concat(&q.iter().map(|t| f(t)).collect::<Vec<_>>())
        };
        Ok(Store::Quantized(QTensor {
            weight: cat(|t| &t.weight)?,
            scales: cat(|t| &t.scales)?,
            biases: cat(|t| &t.biases)?,
        }))
    }

    /// `x[..., start:stop, :] = update` for each array.
    pub fn update(&self, update: &Store, start: i32, stop: i32) -> Result<Store> {
        match (self, update) {
            (Store::Dense(x), Store::Dense(y)) => Ok(Store::Dense(seq::update(x, y, start, stop)?)),
            (Store::Quantized(x), Store::Quantized(y)) => Ok(Store::Quantized(QTensor {
                weight: seq::update(&x.weight, &y.weight, start, stop)?,
                scales: seq::update(&x.scales, &y.scales, start, stop)?,
                biases: seq::update(&x.biases, &y.biases, start, stop)?,
            })),
            _ => Err(Error::InvalidArgument {
                op: "cache",
                message: "cannot write dense data into a quantized cache or the reverse".into(),
            }),
        }
    }

    /// Zeros along the sequence axis shaped like this store's other axes: `(B, H, n, *)`.
    pub fn zeros_like_seq(&self, n: i32) -> Result<Store> {
        self.try_map(|a| {
            let mut shape = a.shape();
            shape[seq::SEQ as usize] = n;
            ops::zeros(&shape, a.dtype(), None)
        })
    }

    /// Quantizes a dense store (identity on a quantized one with the same spec is not
    /// attempted: quantizing twice is an error).
    pub fn quantized(&self, spec: QuantSpec) -> Result<Store> {
        match self {
            Store::Dense(a) => Ok(Store::Quantized(spec.quantize(a)?)),
            Store::Quantized(_) => Err(Error::InvalidArgument {
                op: "to_quantized",
                message: "the cache is already quantized".into(),
            }),
        }
    }
}

/// Zeros of `(B, H, n, dim)` for new data `like` of shape `(B, H, S, dim)`, in the form the
/// cache stores: dense zeros of `like`'s dtype, or mlx-lm's `init_quant(dim)` triple
/// (`uint32` packed weights, scales and biases in `like`'s dtype).
pub(crate) fn zeros_for(like: &Array, n: i32, quant: Option<QuantSpec>) -> Result<Store> {
    let shape = like.shape();
    if shape.len() != 4 {
        return Err(Error::InvalidArgument {
            op: "update_and_fetch",
            message: format!("keys and values must be (batch, heads, seq, dim), got {shape:?}"),
        });
    }
    let (b, h, dim) = (shape[0], shape[1], shape[3]);
    match quant {
        None => Ok(Store::Dense(ops::zeros(
            &[b, h, n, dim],
            like.dtype(),
            None,
        )?)),
        Some(q) => {
            let el_per_int = 8 * 4 / q.bits;
            Ok(Store::Quantized(QTensor {
                weight: ops::zeros(&[b, h, n, dim / el_per_int], Dtype::Uint32, None)?,
                scales: ops::zeros(&[b, h, n, dim / q.group_size], like.dtype(), None)?,
                biases: ops::zeros(&[b, h, n, dim / q.group_size], like.dtype(), None)?,
            }))
        }
    }
}

/// New keys/values as the cache will store them.
pub(crate) fn incoming(x: &Array, quant: Option<QuantSpec>) -> Result<Store> {
    match quant {
        None => Ok(Store::Dense(x.clone())),
        Some(q) => Ok(Store::Quantized(q.quantize(x)?)),
    }
}
