//! Weak scalars: Rust numbers that combine with arrays the way Python numbers do in MLX.
//!
//! In MLX's C++ API a scalar is a strong `float32`/`int32` array, so `bf16 * 2.0f` is `f32`.
//! In Python (and so in mlx-lm) a Python scalar is *weak*: it takes the array's dtype.
//! [`Scalar::to_array_like`] reproduces the Python binding's rules (`to_array` in
//! `python/src/convert.cpp`): a float takes the other operand's dtype when that is floating,
//! else `float32`; an int takes the other operand's dtype (`int32` for a bool array);
//! a bool takes the other operand's dtype (`True` next to `f16` is a `1.0` of `f16`). The value passes through `f32` (floats) or `i32`-range ints first,
//! as in Python.

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// A Rust scalar used as the other operand of an array op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f32),
}

impl Scalar {
    /// The dtype this scalar takes next to an array of dtype `other`.
    pub fn dtype_like(self, other: Dtype) -> Dtype {
        match self {
            Scalar::Bool(_) => other,
            Scalar::Int(_) if other == Dtype::Bool => Dtype::Int32,
            Scalar::Int(_) => other,
            Scalar::Float(_) if other.is_floating() => other,
            Scalar::Float(_) => Dtype::Float32,
        }
    }

    /// A 0-d array for this scalar next to an array of dtype `other` (Python's weak rules).
    pub fn to_array_like(self, other: Dtype) -> Result<Array> {
        let dtype = self.dtype_like(other);
        match self {
            Scalar::Bool(b) if dtype == Dtype::Bool => Array::scalar(b),
            Scalar::Bool(b) => Array::from_int(i64::from(b), dtype),
            Scalar::Float(v) => Array::from_f32(v, dtype),
            Scalar::Int(v) => {
                if dtype.is_integer() && dtype.size() < 4 {
                    let (lo, hi) = int_range(dtype);
                    if v < lo || v > hi {
                        return Err(Error::invalid(
                            "scalar",
                            format!("integer {v} does not fit in {dtype}"),
                        ));
                    }
                }
                Array::from_int(v, dtype)
            }
        }
    }

    /// A 0-d array for this scalar on its own (`bool`, `int32`, `float32`).
    pub fn to_array(self) -> Result<Array> {
        match self {
            Scalar::Bool(b) => Array::scalar(b),
            Scalar::Int(v) => Array::from_int(v, Dtype::Int32),
            Scalar::Float(v) => Array::from_f32(v, Dtype::Float32),
        }
    }
}

fn int_range(d: Dtype) -> (i64, i64) {
    match d {
        Dtype::Int8 => (i8::MIN.into(), i8::MAX.into()),
        Dtype::Int16 => (i16::MIN.into(), i16::MAX.into()),
        Dtype::Uint8 => (0, u8::MAX.into()),
        Dtype::Uint16 => (0, u16::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(v)
    }
}
/// Converted to `f32` first, as a Python float is.
impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v as f32)
    }
}
impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(v.into())
    }
}
impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}
impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}
