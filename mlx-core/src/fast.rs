//! MLX's fused ops (`mlx.core.fast`): RMS and layer normalization, rotary position
//! embeddings, scaled dot-product attention, and the gated delta recurrence.
//!
//! Each function calls the C++ op the way MLX's Python binding does, so results are those of
//! `mx.fast.*` bit for bit (an integer RoPE offset is passed as an `int32` array, as Python
//! passes it; an array mask uses mask mode `"array"`).

use mlx_sys as sys;

use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::Result;

fn opt_raw(a: Option<&Array>) -> sys::mlxs_array {
    a.map_or(std::ptr::null_mut(), Array::as_raw)
}

/// RMS normalization over the last axis: `x / sqrt(mean(x^2) + eps) * weight`
/// (`mx.fast.rms_norm`). Without `weight` there is no scaling.
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles (weight may be null); owned handle out.
    array_out("rms_norm", |o| unsafe {
        sys::mlxs_fast_rms_norm(o, x.as_raw(), opt_raw(weight), eps, raw(s))
    })
}

/// Layer normalization over the last axis (`mx.fast.layer_norm`); `weight` and `bias` are
/// optional.
pub fn layer_norm(
    x: &Array,
    weight: Option<&Array>,
    bias: Option<&Array>,
    eps: f32,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles (weight and bias may be null); owned handle out.
    array_out("layer_norm", |o| unsafe {
        sys::mlxs_fast_layer_norm(o, x.as_raw(), opt_raw(weight), opt_raw(bias), eps, raw(s))
    })
}

/// The position offset of [`rope`]: a number, or an array (a scalar or one offset per batch
/// element).
#[derive(Debug, Clone, Copy)]
pub enum RopeOffset<'a> {
    Int(i32),
    Array(&'a Array),
}

impl From<i32> for RopeOffset<'_> {
    fn from(v: i32) -> Self {
        RopeOffset::Int(v)
    }
}

impl<'a> From<&'a Array> for RopeOffset<'a> {
    fn from(a: &'a Array) -> Self {
        RopeOffset::Array(a)
    }
}

/// Rotary position embedding of the first `dims` features of the last axis
/// (`mx.fast.rope`). Exactly one of `base` and `freqs` is given; positions are
/// `scale * (offset + i)` along the second-to-last axis. `traditional` rotates consecutive
/// pairs instead of the two halves.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: RopeOffset<'_>,
    freqs: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    // Python's binding turns an int offset into an int32 array (`to_array`).
    let owned;
    let offset = match offset {
        RopeOffset::Int(v) => {
            owned = Array::from_int(v.into(), Dtype::Int32)?;
            &owned
        }
        RopeOffset::Array(a) => a,
    };
    // SAFETY: live handles (freqs may be null); owned handle out.
    array_out("rope", |o| unsafe {
        sys::mlxs_fast_rope(
            o,
            x.as_raw(),
            dims,
            traditional,
            base.is_some(),
            base.unwrap_or(0.0),
            scale,
            offset.as_raw(),
            opt_raw(freqs),
            raw(s),
        )
    })
}

/// The mask of [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy, Default)]
pub enum SdpaMask<'a> {
    /// No mask.
    #[default]
    None,
    /// Causal, aligned to the lower right (the last query sees every key).
    Causal,
    /// A boolean mask (`true` keeps) or an additive mask, broadcastable to
    /// `[B, N_q, T_q, T_kv]`.
    Array(&'a Array),
}

impl<'a> From<&'a Array> for SdpaMask<'a> {
    fn from(a: &'a Array) -> Self {
        SdpaMask::Array(a)
    }
}

/// `softmax(q @ k^T * scale + mask) @ v` over heads (`mx.fast.scaled_dot_product_attention`).
/// `q` is `[B, N_q, T_q, D]`, `k` and `v` are `[B, N_kv, T_kv, D]` with `N_q` a multiple of
/// `N_kv` (grouped-query attention without tiling). `sinks`, one per query head, adds a
/// logit to the softmax that attends to nothing.
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: SdpaMask<'_>,
    sinks: Option<&Array>,
    s: Option<&Stream>,
) -> Result<Array> {
    let (mode, arr) = match mask {
        SdpaMask::None => (c"", None),
        SdpaMask::Causal => (c"causal", None),
        SdpaMask::Array(a) => (c"array", Some(a)),
    };
    // SAFETY: live handles (mask and sinks may be null); NUL-terminated mode; owned out.
    array_out("scaled_dot_product_attention", |o| unsafe {
        sys::mlxs_fast_scaled_dot_product_attention(
            o,
            q.as_raw(),
            k.as_raw(),
            v.as_raw(),
            scale,
            mode.as_ptr(),
            opt_raw(arr),
            opt_raw(sinks),
            raw(s),
        )
    })
}

/// The gated delta rule recurrence of Qwen3-Next / Qwen3.5 (`mx.fast.gated_delta_update`):
/// `q`, `k` `[B, T, Hk, Dk]`, `v` `[B, T, Hv, Dv]`, `gates` `[B, T, Hv]` (or `[B, T, Hv, Dk]`),
/// `beta` `[B, T, Hv]`, optional `initial_state` `[B, Hv, Dv, Dk]` (zeros) and `mask`
/// `[B, T]`. Returns `(y [B, T, Hv, Dv], final_state)`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    gates: &Array,
    beta: &Array,
    initial_state: Option<&Array>,
    mask: Option<&Array>,
    s: Option<&Stream>,
) -> Result<(Array, Array)> {
    let op = "gated_delta_update";
    // SAFETY: live handles (initial_state and mask may be null); owned vector out.
    let mut out = crate::array::vec_out(op, |o| unsafe {
        sys::mlxs_fast_gated_delta_update(
            o,
            q.as_raw(),
            k.as_raw(),
            v.as_raw(),
            gates.as_raw(),
            beta.as_raw(),
            opt_raw(initial_state),
            opt_raw(mask),
            raw(s),
        )
    })?;
    match (out.pop(), out.pop(), out.is_empty()) {
        (Some(state), Some(y), true) => Ok((y, state)),
        _ => Err(crate::Error::Mlx {
            op,
            message: "expected two outputs (y, state)".into(),
        }),
    }
}
