//! Products (`matmul`, `addmm`, `outer`, `inner`, `tensordot`, `kron`), convolutions,
//! triangular masks, sorting and selection, the Hadamard transform.

use mlx_sys as sys;

use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::error::Result;

macro_rules! binary_ops {
    ($($name:ident => $sys:ident: $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $name(a: &Array, b: &Array, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handles; the shim writes an owned handle on success.
            array_out(stringify!($name), |o| unsafe {
                sys::$sys(o, a.as_raw(), b.as_raw(), raw(s))
            })
        }
    )*};
}

binary_ops! {
    matmul => mlxs_matmul: "Matrix product (batched, with broadcasting of batch dims; 1-D \
                            operands are promoted as in numpy).";
    outer => mlxs_outer: "Outer product of the flattened inputs.";
    inner => mlxs_inner: "Inner product over the last axes.";
    kron => mlxs_kron: "Kronecker product.";
}

/// `beta * c + alpha * (a @ b)` in one op (Python's defaults: `alpha = beta = 1.0`).
pub fn addmm(
    c: &Array,
    a: &Array,
    b: &Array,
    alpha: f32,
    beta: f32,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles.
    array_out("addmm", |o| unsafe {
        sys::mlxs_addmm(o, c.as_raw(), a.as_raw(), b.as_raw(), alpha, beta, raw(s))
    })
}

/// Contracts `axes_a` of `a` with `axes_b` of `b`.
pub fn tensordot(
    a: &Array,
    b: &Array,
    axes_a: &[i32],
    axes_b: &[i32],
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles; axes valid for their lengths.
    array_out("tensordot", |o| unsafe {
        sys::mlxs_tensordot(
            o,
            a.as_raw(),
            b.as_raw(),
            axes_a.as_ptr(),
            axes_a.len(),
            axes_b.as_ptr(),
            axes_b.len(),
            raw(s),
        )
    })
}

/// Contracts the last `n` axes of `a` with the first `n` of `b` (Python's `axes=n`).
pub fn tensordot_n(a: &Array, b: &Array, n: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles.
    array_out("tensordot", |o| unsafe {
        sys::mlxs_tensordot_n(o, a.as_raw(), b.as_raw(), n, raw(s))
    })
}

/// 1-D convolution (cross-correlation). `input` is `(N, L, C_in)`, `weight` is
/// `(C_out, K, C_in / groups)`; the result is `(N, L_out, C_out)`. Python's defaults:
/// `stride = 1, padding = 0, dilation = 1, groups = 1`.
pub fn conv1d(
    input: &Array,
    weight: &Array,
    stride: i32,
    padding: i32,
    dilation: i32,
    groups: i32,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles.
    array_out("conv1d", |o| unsafe {
        sys::mlxs_conv1d(
            o,
            input.as_raw(),
            weight.as_raw(),
            stride,
            padding,
            dilation,
            groups,
            raw(s),
        )
    })
}

/// 2-D convolution. `input` is `(N, H, W, C_in)`, `weight` is `(C_out, KH, KW, C_in / groups)`.
pub fn conv2d(
    input: &Array,
    weight: &Array,
    stride: (i32, i32),
    padding: (i32, i32),
    dilation: (i32, i32),
    groups: i32,
    s: Option<&Stream>,
) -> Result<Array> {
    let (st, pd, dl) = (
        [stride.0, stride.1],
        [padding.0, padding.1],
        [dilation.0, dilation.1],
    );
    // SAFETY: live handles; each pair is an array of 2.
    array_out("conv2d", |o| unsafe {
        sys::mlxs_conv2d(
            o,
            input.as_raw(),
            weight.as_raw(),
            st.as_ptr(),
            pd.as_ptr(),
            dl.as_ptr(),
            groups,
            raw(s),
        )
    })
}

/// The lower triangle of the last two axes (from diagonal `k` down), zeros above.
pub fn tril(a: &Array, k: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("tril", |o| unsafe {
        sys::mlxs_tril(o, a.as_raw(), k, raw(s))
    })
}

/// The upper triangle of the last two axes (from diagonal `k` up), zeros below.
pub fn triu(a: &Array, k: i32, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("triu", |o| unsafe {
        sys::mlxs_triu(o, a.as_raw(), k, raw(s))
    })
}

macro_rules! axis_ops {
    ($($name:ident => $sys:ident: $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $name(a: &Array, axis: i32, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handle.
            array_out(stringify!($name), |o| unsafe {
                sys::$sys(o, a.as_raw(), axis, raw(s))
            })
        }
    )*};
}

axis_ops! {
    sort => mlxs_sort: "Sorted copy along `axis` (Python's default -1).";
    argsort => mlxs_argsort: "Indices (uint32) that sort along `axis`; stable.";
}

macro_rules! kaxis_ops {
    ($($name:ident => $sys:ident: $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $name(a: &Array, k: i32, axis: i32, s: Option<&Stream>) -> Result<Array> {
            // SAFETY: live handle.
            array_out(stringify!($name), |o| unsafe {
                sys::$sys(o, a.as_raw(), k, axis, raw(s))
            })
        }
    )*};
}

kaxis_ops! {
    partition => mlxs_partition: "A copy where the element at `kth` along `axis` is where a \
        sort would put it, smaller ones before it and larger ones after (in unspecified order).";
    argpartition => mlxs_argpartition: "Indices (uint32) that [`partition`] along `axis`.";
    topk => mlxs_topk: "The `k` largest elements along `axis` (in unspecified order).";
}

/// `mx.hadamard_transform(a, scale)`: the Walsh-Hadamard transform over the last axis (its
/// size `m * 2^k` with `m` in 1, 12, 20 or 28), times `scale` (`None`: `1 / sqrt(size)`, as
/// in Python).
pub fn hadamard_transform(a: &Array, scale: Option<f32>, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handle.
    array_out("hadamard_transform", |o| unsafe {
        sys::mlxs_hadamard_transform(o, a.as_raw(), scale.is_some(), scale.unwrap_or(0.0), raw(s))
    })
}

/// Checks what `mx.linalg.cholesky` / `cholesky_inv` need: float32, at least 2-D, square in
/// the last two axes.
fn check_square_f32(op: &'static str, a: &Array) -> Result<()> {
    let sh = a.shape();
    if a.dtype() != crate::dtype::Dtype::Float32 {
        return Err(crate::error::Error::invalid(
            op,
            format!("needs a float32 matrix, not {:?}", a.dtype()),
        ));
    }
    if sh.len() < 2 || sh[sh.len() - 1] != sh[sh.len() - 2] {
        return Err(crate::error::Error::invalid(
            op,
            format!("needs square matrices in the last two axes, not shape {sh:?}"),
        ));
    }
    Ok(())
}

/// `mx.linalg.cholesky(a, upper)`: the lower (or upper) Cholesky factor of the symmetric
/// positive definite float32 matrices in `a`'s last two axes. MLX runs it on the CPU only
/// (LAPACK `potrf`): pass a CPU stream when the default device is a GPU.
pub fn cholesky(a: &Array, upper: bool, s: Option<&Stream>) -> Result<Array> {
    check_square_f32("cholesky", a)?;
    // SAFETY: live handle.
    array_out("cholesky", |o| unsafe {
        sys::mlxs_linalg_cholesky(o, a.as_raw(), upper, raw(s))
    })
}

/// `mx.linalg.cholesky_inv(l, upper)`: the inverse of `A` from its Cholesky factor `l`
/// (lower, or upper when `upper`); CPU only, as [`cholesky`].
pub fn cholesky_inv(l: &Array, upper: bool, s: Option<&Stream>) -> Result<Array> {
    check_square_f32("cholesky_inv", l)?;
    // SAFETY: live handle.
    array_out("cholesky_inv", |o| unsafe {
        sys::mlxs_linalg_cholesky_inv(o, l.as_raw(), upper, raw(s))
    })
}

/// `mx.einsum(subscripts, *operands)`: MLX's own contraction path and products.
pub fn einsum(subscripts: &str, operands: &[&Array], s: Option<&Stream>) -> Result<Array> {
    if operands.is_empty() {
        return Err(crate::error::Error::invalid(
            "einsum",
            "needs at least one operand",
        ));
    }
    let sub = super::c_string("einsum", subscripts)?;
    let v = super::vec_of("einsum", operands)?;
    // SAFETY: live vector handle, NUL-terminated string alive across the call.
    array_out("einsum", |o| unsafe {
        sys::mlxs_einsum(o, sub.as_ptr(), v.0, raw(s))
    })
}
