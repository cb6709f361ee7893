//! Random numbers (`mlx.core.random`), reproducing Python's draws exactly.
//!
//! Every sampler takes an optional PRNG `key` (from [`key`] / [`split`]). Without one it
//! draws the next key from the global sequence, which works as in MLX's Python binding:
//! [`seed`] resets the state to `key(seed)`, and each keyless call splits the state once
//! (`state, key = split(state)`). So after `random::seed(s)` the same sequence of keyless
//! calls gives the same values as `mx.random.seed(s)` and the same calls in Python.
//!
//! The global state belongs to the process (as Python's does), not to a thread: draws from
//! several threads interleave in whatever order they happen. Each keyless draw splits the
//! state and evaluates the split (the new state and the draw's key) before releasing the
//! global key's lock, and [`set_state`] evaluates the key it stores: the state is never a lazy
//! node that two threads share, so keyless draws may be built and evaluated from any thread,
//! at the same time (a lazy split once made concurrent evaluation crash inside MLX, issue #29).
//! The split's values do not depend on when it is evaluated, so seeded sequences are the ones
//! Python gives. (MLX's C++ default sequence avoids the question by being per thread, which
//! is why it is not used here.) Inside a function being traced by `compile`, where the state
//! is a placeholder, nothing is evaluated. [`state`] and [`set_state`] read and replace the
//! state (Python's `mx.random.state[0]`), e.g. to thread it through a compiled function.
//!
//! Scalar bounds and parameters ([`ScalarOrArray`]) become arrays as Python numbers do
//! there: an integer is `int32` (`int64` when it does not fit), a float `float32`, a bool
//! `bool`.

use std::borrow::Cow;
use std::sync::{Mutex, MutexGuard, PoisonError};

use mlx_sys as sys;

use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::check;
use crate::scalar::Scalar;

/// A number or an array: the `scalar | array` parameters of Python's samplers.
#[derive(Debug, Clone, Copy)]
pub enum ScalarOrArray<'a> {
    Scalar(Scalar),
    Array(&'a Array),
}

impl<'a> ScalarOrArray<'a> {
    /// The array Python's binding makes of this value (`to_array(v)`).
    fn to_array(self) -> Result<Cow<'a, Array>> {
        Ok(match self {
            ScalarOrArray::Array(a) => Cow::Borrowed(a),
            ScalarOrArray::Scalar(Scalar::Bool(b)) => Cow::Owned(Array::scalar(b)?),
            ScalarOrArray::Scalar(Scalar::Float(v)) => {
                Cow::Owned(Array::from_f32(v, Dtype::Float32)?)
            }
            ScalarOrArray::Scalar(Scalar::Int(v)) => {
                let dtype = if i32::try_from(v).is_ok() {
                    Dtype::Int32
                } else {
                    Dtype::Int64
                };
                Cow::Owned(Array::from_int(v, dtype)?)
            }
        })
    }
}

macro_rules! scalar_or_array_from {
    ($($t:ty),*) => {$(
        impl From<$t> for ScalarOrArray<'_> {
            fn from(v: $t) -> Self {
                ScalarOrArray::Scalar(v.into())
            }
        }
    )*};
}
scalar_or_array_from!(f32, f64, i32, i64, bool);

impl From<Scalar> for ScalarOrArray<'_> {
    fn from(v: Scalar) -> Self {
        ScalarOrArray::Scalar(v)
    }
}

impl<'a> From<&'a Array> for ScalarOrArray<'a> {
    fn from(a: &'a Array) -> Self {
        ScalarOrArray::Array(a)
    }
}

/// The process-wide lock of the global key: [`seed`], [`state`], [`set_state`],
/// [`next_key`] and every keyless draw hold it, so threads that seed or draw at once take
/// turns (seeding from several threads at once once crashed the process, issue #29).
static GLOBAL_KEY: Mutex<()> = Mutex::new(());

fn global_key_lock() -> MutexGuard<'static, ()> {
    // The lock guards no data of its own: a panic while it was held leaves nothing to repair.
    GLOBAL_KEY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The global key's lock when a draw has no `key` of its own (it splits the global one).
fn keyless_guard(key: Option<&Array>) -> Option<MutexGuard<'static, ()>> {
    key.is_none().then(global_key_lock)
}

fn opt_raw(a: Option<&Array>) -> sys::mlxs_array {
    a.map_or(std::ptr::null_mut(), Array::as_raw)
}

/// A PRNG key (`uint32`, shape `[2]`) from a seed.
pub fn key(seed: u64) -> Result<Array> {
    // SAFETY: plain value in, owned handle out.
    array_out("random_key", |o| unsafe { sys::mlxs_random_key(o, seed) })
}

/// Seeds the global PRNG (`mx.random.seed`).
pub fn seed(seed: u64) -> Result<()> {
    let _global = global_key_lock();
    // SAFETY: plain value.
    check("random_seed", unsafe { sys::mlxs_random_seed(seed) })
}

/// The global PRNG state: the key the next keyless draw splits (`mx.random.state[0]`).
pub fn state() -> Result<Array> {
    let _global = global_key_lock();
    // SAFETY: owned handle out.
    array_out("random_state", |o| unsafe { sys::mlxs_random_state(o) })
}

/// Replaces the global PRNG state with `key` (a `uint32` array of shape `[2]`).
pub fn set_state(key: &Array) -> Result<()> {
    let _global = global_key_lock();
    // SAFETY: live handle.
    check("random_set_state", unsafe {
        sys::mlxs_random_set_state(key.as_raw())
    })
}

/// Advances the global state and returns the key that a keyless sampler would have used.
pub fn next_key() -> Result<Array> {
    let _global = global_key_lock();
    // SAFETY: owned handle out.
    array_out("random_next_key", |o| unsafe {
        sys::mlxs_random_next_key(o)
    })
}

/// Splits `key` into `num` keys, shape `[num, 2]` (`mx.random.split`).
pub fn split(key: &Array, num: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("random_split", |o| unsafe {
        sys::mlxs_random_split(o, key.as_raw(), num, raw(s))
    })
}

/// Random bits: `uint32` (width 4), `uint16` (2) or `uint8` (1) of `shape`.
pub fn bits(shape: &[i32], width: i32, key: Option<&Array>, s: Option<&Stream>) -> Result<Array> {
    let _global = keyless_guard(key);
    // SAFETY: shape valid for its length; live key or null.
    array_out("random_bits", |o| unsafe {
        sys::mlxs_random_bits(o, shape.as_ptr(), shape.len(), width, opt_raw(key), raw(s))
    })
}

/// Uniform samples in `[low, high)` of `shape` (broadcast with the bounds) and floating
/// `dtype` (`mx.random.uniform`).
pub fn uniform<'a>(
    low: impl Into<ScalarOrArray<'a>>,
    high: impl Into<ScalarOrArray<'a>>,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let (low, high) = (low.into(), high.into());
    let (low, high) = (low.to_array()?, high.to_array()?);
    let _global = keyless_guard(key);
    // SAFETY: live handles; shape valid for its length.
    array_out("random_uniform", |o| unsafe {
        sys::mlxs_random_uniform(
            o,
            low.as_raw(),
            high.as_raw(),
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            opt_raw(key),
            raw(s),
        )
    })
}

/// Normal samples (`mx.random.normal`). `loc` and `scale` default to 0 and 1; as in Python,
/// a given value is applied even when it is 0 or 1 (it becomes a `dtype` scalar).
pub fn normal(
    shape: &[i32],
    dtype: Dtype,
    loc: Option<f32>,
    scale: Option<f32>,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    // Python: `to_array(loc, dtype)`: a float becomes a dtype scalar (float32 if dtype is not
    // floating).
    let as_param = |v: f32| {
        Array::from_f32(
            v,
            if dtype.is_floating() {
                dtype
            } else {
                Dtype::Float32
            },
        )
    };
    let loc = loc.map(as_param).transpose()?;
    let scale = scale.map(as_param).transpose()?;
    let _global = keyless_guard(key);
    // SAFETY: live handles (optional ones may be null); shape valid for its length.
    array_out("random_normal", |o| unsafe {
        sys::mlxs_random_normal(
            o,
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            opt_raw(loc.as_ref()),
            opt_raw(scale.as_ref()),
            opt_raw(key),
            raw(s),
        )
    })
}

/// Integers uniform in `[low, high)` (`mx.random.randint`), of integer `dtype`.
pub fn randint<'a>(
    low: impl Into<ScalarOrArray<'a>>,
    high: impl Into<ScalarOrArray<'a>>,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let (low, high) = (low.into(), high.into());
    let (low, high) = (low.to_array()?, high.to_array()?);
    let _global = keyless_guard(key);
    // SAFETY: live handles; shape valid for its length.
    array_out("random_randint", |o| unsafe {
        sys::mlxs_random_randint(
            o,
            low.as_raw(),
            high.as_raw(),
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            opt_raw(key),
            raw(s),
        )
    })
}

/// Booleans that are `true` with probability `p` (`mx.random.bernoulli`); the output has
/// `shape`, or `p`'s shape when `None`.
pub fn bernoulli<'a>(
    p: impl Into<ScalarOrArray<'a>>,
    shape: Option<&[i32]>,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let p = p.into();
    let p = p.to_array()?;
    let sh = shape.unwrap_or(&[]);
    let _global = keyless_guard(key);
    // SAFETY: live handles; shape valid for its length.
    array_out("random_bernoulli", |o| unsafe {
        sys::mlxs_random_bernoulli(
            o,
            p.as_raw(),
            shape.is_some(),
            sh.as_ptr(),
            sh.len(),
            opt_raw(key),
            raw(s),
        )
    })
}

/// Normal samples truncated to `(lower, upper)` (`mx.random.truncated_normal`); the output
/// has `shape`, or the bounds' broadcast shape when `None`.
pub fn truncated_normal<'a>(
    lower: impl Into<ScalarOrArray<'a>>,
    upper: impl Into<ScalarOrArray<'a>>,
    shape: Option<&[i32]>,
    dtype: Dtype,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let (lower, upper) = (lower.into(), upper.into());
    let (lower, upper) = (lower.to_array()?, upper.to_array()?);
    let sh = shape.unwrap_or(&[]);
    let _global = keyless_guard(key);
    // SAFETY: live handles; shape valid for its length.
    array_out("random_truncated_normal", |o| unsafe {
        sys::mlxs_random_truncated_normal(
            o,
            lower.as_raw(),
            upper.as_raw(),
            shape.is_some(),
            sh.as_ptr(),
            sh.len(),
            dtype.to_sys(),
            opt_raw(key),
            raw(s),
        )
    })
}

/// Standard Gumbel samples (`mx.random.gumbel`).
pub fn gumbel(
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let _global = keyless_guard(key);
    // SAFETY: shape valid for its length; live key or null.
    array_out("random_gumbel", |o| unsafe {
        sys::mlxs_random_gumbel(
            o,
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            opt_raw(key),
            raw(s),
        )
    })
}

/// One sample (a `uint32` index) from each categorical distribution given by unnormalized
/// `logits` along `axis`, which is removed (`mx.random.categorical(logits, axis)`).
pub fn categorical(
    logits: &Array,
    axis: i32,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let _global = keyless_guard(key);
    // SAFETY: live handles.
    array_out("random_categorical", |o| unsafe {
        sys::mlxs_random_categorical(o, logits.as_raw(), axis, opt_raw(key), raw(s))
    })
}

/// `num_samples` samples from each distribution, in a new last axis
/// (`categorical(..., num_samples=n)`).
pub fn categorical_n(
    logits: &Array,
    axis: i32,
    num_samples: i32,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    if num_samples < 0 {
        return Err(Error::invalid(
            "random_categorical",
            format!("num_samples must not be negative, got {num_samples}"),
        ));
    }
    let _global = keyless_guard(key);
    // SAFETY: live handles.
    array_out("random_categorical", |o| unsafe {
        sys::mlxs_random_categorical_n(o, logits.as_raw(), axis, num_samples, opt_raw(key), raw(s))
    })
}

/// Samples of `shape`, which must broadcast with `logits` without `axis`
/// (`categorical(..., shape=...)`).
pub fn categorical_shape(
    logits: &Array,
    axis: i32,
    shape: &[i32],
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let _global = keyless_guard(key);
    // SAFETY: live handles; shape valid for its length.
    array_out("random_categorical", |o| unsafe {
        sys::mlxs_random_categorical_shape(
            o,
            logits.as_raw(),
            axis,
            shape.as_ptr(),
            shape.len(),
            opt_raw(key),
            raw(s),
        )
    })
}

/// Laplace samples (`mx.random.laplace`).
pub fn laplace(
    shape: &[i32],
    dtype: Dtype,
    loc: f32,
    scale: f32,
    key: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let _global = keyless_guard(key);
    // SAFETY: shape valid for its length; live key or null.
    array_out("random_laplace", |o| unsafe {
        sys::mlxs_random_laplace(
            o,
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            loc,
            scale,
            opt_raw(key),
            raw(s),
        )
    })
}

/// `x` randomly permuted along `axis` (`mx.random.permutation(x, axis)`).
pub fn permutation(x: &Array, axis: i32, key: Option<&Array>, s: Option<&Stream>) -> Result<Array> {
    let _global = keyless_guard(key);
    // SAFETY: live handles.
    array_out("random_permutation", |o| unsafe {
        sys::mlxs_random_permutation(o, x.as_raw(), axis, opt_raw(key), raw(s))
    })
}
