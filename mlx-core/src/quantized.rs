//! Quantization: [`quantize`], [`dequantize`], [`quantized_matmul`], and the gathered
//! matmuls of mixture-of-experts layers ([`gather_qmm`], [`gather_mm`]).
//!
//! `group_size` and `bits` take `impl Into<Option<i32>>`: a number, or `None` for the mode's
//! default (affine: 64 and 4; mxfp4: 32 and 4; mxfp8: 32 and 8; nvfp4: 16 and 4), as in
//! Python where they default to `None`.

use std::ffi::CStr;

use mlx_sys as sys;

use crate::array::{array_out, Array, VecHandle};
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::check;

/// A quantization mode of MLX 0.32.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QuantMode {
    /// Per-group scale and bias, 1 to 8 bits, groups of 32, 64 or 128 (scales and biases in
    /// the input's dtype).
    #[default]
    Affine,
    /// E2M1 values with an E8M0 scale per 32 (no bias).
    Mxfp4,
    /// E4M3 values with an E8M0 scale per 32 (no bias).
    Mxfp8,
    /// E2M1 values with an E4M3 scale per 16 (no bias), optionally a global scale.
    Nvfp4,
}

impl QuantMode {
    /// MLX's name for the mode (`"affine"`, `"mxfp4"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }

    /// The mode called `name` in MLX (and in mlx-lm's `quantization.mode`).
    pub fn from_name(name: &str) -> Option<QuantMode> {
        Some(match name {
            "affine" => QuantMode::Affine,
            "mxfp4" => QuantMode::Mxfp4,
            "mxfp8" => QuantMode::Mxfp8,
            "nvfp4" => QuantMode::Nvfp4,
            _ => return None,
        })
    }

    fn c_name(self) -> &'static CStr {
        match self {
            QuantMode::Affine => c"affine",
            QuantMode::Mxfp4 => c"mxfp4",
            QuantMode::Mxfp8 => c"mxfp8",
            QuantMode::Nvfp4 => c"nvfp4",
        }
    }

    /// Whether quantizing in this mode returns biases.
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }

    /// Checks `group_size` and `bits` against what MLX 0.32.4 accepts for this mode (affine:
    /// 1-6 or 8 bits in groups of 32, 64 or 128; mxfp4: 4 bits / 32; nvfp4: 4 / 16; mxfp8:
    /// 8 / 32), so a bad value is refused before any array is quantized or unpacked (MLX
    /// itself divides by the bit width on some paths). The message names the bad parameter.
    pub fn check(self, group_size: i32, bits: i32) -> std::result::Result<(), QuantParamError> {
        let (groups, bit_widths): (&'static [i32], &'static [i32]) = match self {
            QuantMode::Affine => (&[32, 64, 128], &[1, 2, 3, 4, 5, 6, 8]),
            QuantMode::Mxfp4 => (&[32], &[4]),
            QuantMode::Mxfp8 => (&[32], &[8]),
            QuantMode::Nvfp4 => (&[16], &[4]),
        };
        if !bit_widths.contains(&bits) {
            return Err(QuantParamError::Bits {
                mode: self,
                bits,
                expected: bit_widths,
            });
        }
        if !groups.contains(&group_size) {
            return Err(QuantParamError::GroupSize {
                mode: self,
                group_size,
                expected: groups,
            });
        }
        Ok(())
    }
}

/// Why [`QuantMode::check`] refuses a bit width or group size: the parameter, its value, the
/// mode and the values the mode takes.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum QuantParamError {
    #[error("bits {bits} is not supported by {mode} quantization (expected one of {expected:?})")]
    Bits {
        mode: QuantMode,
        bits: i32,
        expected: &'static [i32],
    },
    #[error(
        "group_size {group_size} is not supported by {mode} quantization (expected one of {expected:?})"
    )]
    GroupSize {
        mode: QuantMode,
        group_size: i32,
        expected: &'static [i32],
    },
}

impl std::fmt::Display for QuantMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn opt_raw(a: Option<&Array>) -> sys::mlxs_array {
    a.map_or(std::ptr::null_mut(), Array::as_raw)
}

/// `None` -> 0 (the shim's "default"); a given value must be positive.
fn param(op: &'static str, what: &str, v: Option<i32>) -> Result<i32> {
    match v {
        None => Ok(0),
        Some(x) if x > 0 => Ok(x),
        Some(x) => Err(Error::invalid(
            op,
            format!("{what} must be positive, got {x}"),
        )),
    }
}

pub(crate) fn vec_to_arrays(op: &'static str, v: &VecHandle) -> Result<Vec<Array>> {
    // SAFETY: live vector handle.
    let n = unsafe { sys::mlxs_vec_size(v.0) };
    (0..n)
        .map(|i| {
            // SAFETY: live handle, index in range; owned handle out.
            array_out(op, |o| unsafe { sys::mlxs_vec_get(o, v.0, i) })
        })
        .collect()
}

fn quantize_impl(
    op: &'static str,
    w: &Array,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
    global_scale: Option<&Array>,
    s: Option<&Stream>,
) -> Result<(Array, Array, Option<Array>)> {
    let (gs, b) = (
        param(op, "group_size", group_size)?,
        param(op, "bits", bits)?,
    );
    let mut out: sys::mlxs_vec = std::ptr::null_mut();
    // SAFETY: live handles (global_scale may be null), static NUL-terminated mode; on success
    // an owned vector handle is written.
    check(op, unsafe {
        sys::mlxs_quantize(
            &mut out,
            w.as_raw(),
            gs,
            b,
            mode.c_name().as_ptr(),
            opt_raw(global_scale),
            raw(s),
        )
    })?;
    let v = VecHandle(out);
    let mut arrays = vec_to_arrays(op, &v)?.into_iter();
    match (arrays.next(), arrays.next(), arrays.next()) {
        (Some(wq), Some(scales), biases) => Ok((wq, scales, biases)),
        _ => Err(Error::Mlx {
            op,
            message: "quantize returned fewer than two arrays".into(),
        }),
    }
}

/// Quantizes `w` along its last axis (`mx.quantize`): `(w_q, scales, biases)`, with biases
/// only for [`QuantMode::Affine`]. `w_q` packs the values into `uint32`.
pub fn quantize(
    w: &Array,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: QuantMode,
    s: Option<&Stream>,
) -> Result<(Array, Array, Option<Array>)> {
    quantize_impl("quantize", w, group_size.into(), bits.into(), mode, None, s)
}

/// [`quantize`] with a per-tensor `float32` global scale (`global_scale=` in Python; nvfp4).
pub fn quantize_with_global_scale(
    w: &Array,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: QuantMode,
    global_scale: &Array,
    s: Option<&Stream>,
) -> Result<(Array, Array, Option<Array>)> {
    quantize_impl(
        "quantize",
        w,
        group_size.into(),
        bits.into(),
        mode,
        Some(global_scale),
        s,
    )
}

#[allow(clippy::too_many_arguments)]
fn dequantize_impl(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: Option<i32>,
    bits: Option<i32>,
    mode: QuantMode,
    global_scale: Option<&Array>,
    dtype: Option<Dtype>,
    s: Option<&Stream>,
) -> Result<Array> {
    let op = "dequantize";
    let (gs, b) = (
        param(op, "group_size", group_size)?,
        param(op, "bits", bits)?,
    );
    let dt = dtype.unwrap_or(Dtype::Float32);
    // SAFETY: live handles (biases and global_scale may be null), static NUL-terminated mode.
    array_out(op, |o| unsafe {
        sys::mlxs_dequantize(
            o,
            w.as_raw(),
            scales.as_raw(),
            opt_raw(biases),
            gs,
            b,
            mode.c_name().as_ptr(),
            opt_raw(global_scale),
            dtype.is_some(),
            dt.to_sys(),
            raw(s),
        )
    })
}

/// Undoes [`quantize`] (`mx.dequantize`). The output dtype is `dtype`, or when `None` the
/// scales' dtype (affine) or `bfloat16` (the floating-point modes), as in MLX.
#[allow(clippy::too_many_arguments)]
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: QuantMode,
    dtype: Option<Dtype>,
    s: Option<&Stream>,
) -> Result<Array> {
    dequantize_impl(
        w,
        scales,
        biases,
        group_size.into(),
        bits.into(),
        mode,
        None,
        dtype,
        s,
    )
}

/// [`dequantize`] with the global scale used to quantize (nvfp4).
#[allow(clippy::too_many_arguments)]
pub fn dequantize_with_global_scale(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: QuantMode,
    global_scale: &Array,
    dtype: Option<Dtype>,
    s: Option<&Stream>,
) -> Result<Array> {
    dequantize_impl(
        w,
        scales,
        biases,
        group_size.into(),
        bits.into(),
        mode,
        Some(global_scale),
        dtype,
        s,
    )
}

/// `x @ dequantize(w).T` (`transpose`) or `x @ dequantize(w)` without materializing the
/// dequantized matrix (`mx.quantized_matmul`).
#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: QuantMode,
    s: Option<&Stream>,
) -> Result<Array> {
    let op = "quantized_matmul";
    let (gs, b) = (
        param(op, "group_size", group_size.into())?,
        param(op, "bits", bits.into())?,
    );
    // SAFETY: live handles (biases may be null), static NUL-terminated mode.
    array_out(op, |o| unsafe {
        sys::mlxs_quantized_matmul(
            o,
            x.as_raw(),
            w.as_raw(),
            scales.as_raw(),
            opt_raw(biases),
            transpose,
            gs,
            b,
            mode.c_name().as_ptr(),
            raw(s),
        )
    })
}

/// Quantized matmul with matrix-level gather (`mx.gather_qmm`): the batch dimensions of `x`
/// and of the quantized `w` (with its `scales` and `biases`) are picked by `lhs_indices` and
/// `rhs_indices` (flat indices over the batch dimensions; `None` takes them in order).
/// `sorted_indices` allows a faster path when the indices are sorted.
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: QuantMode,
    sorted_indices: bool,
    s: Option<&Stream>,
) -> Result<Array> {
    let op = "gather_qmm";
    let (gs, b) = (
        param(op, "group_size", group_size.into())?,
        param(op, "bits", bits.into())?,
    );
    // SAFETY: live handles (optional ones may be null), static NUL-terminated mode.
    array_out(op, |o| unsafe {
        sys::mlxs_gather_qmm(
            o,
            x.as_raw(),
            w.as_raw(),
            scales.as_raw(),
            opt_raw(biases),
            opt_raw(lhs_indices),
            opt_raw(rhs_indices),
            transpose,
            gs,
            b,
            mode.c_name().as_ptr(),
            std::ptr::null_mut(),
            sorted_indices,
            raw(s),
        )
    })
}

/// Matmul with matrix-level gather (`mx.gather_mm`): `a[lhs] @ b[rhs]` over flat batch
/// indices, without materializing the gathered operands. MLX's CPU backend runs it for
/// `float32` only.
pub fn gather_mm(
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    sorted_indices: bool,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles (indices may be null).
    array_out("gather_mm", |o| unsafe {
        sys::mlxs_gather_mm(
            o,
            a.as_raw(),
            b.as_raw(),
            opt_raw(lhs_indices),
            opt_raw(rhs_indices),
            sorted_indices,
            raw(s),
        )
    })
}
