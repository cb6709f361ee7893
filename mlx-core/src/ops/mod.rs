//! Array operations as free functions, one per MLX op, each taking an optional stream
//! (`None`: the default stream of the default device). Methods on [`Array`] call these.
//!
//! Semantics (argument defaults, result dtypes) are those of MLX's Python binding, which is
//! what mlx-lm sees. Where Python takes `axis=None` to mean "every axis" or "the flattened
//! array", the Rust API has a separate function (`sum_all`, `transpose_all`, `squeeze_all`,
//! `take_flat`, ...), and an empty axis list means "no axes", as in Python.
//!
//! Scalars: Python numbers are *weak* (they take the array's dtype), so every elementwise
//! binary op has a `*_scalar` form (`array op scalar`) and a `scalar_*` form
//! (`scalar op array`) that build the scalar with [`Scalar::to_array_like`](crate::Scalar::to_array_like). Passing an
//! `Array` made from a Rust number to the plain form gives C++'s strong behaviour instead.
//!
//! The submodules group the ops by family; everything is re-exported here, so callers write
//! `ops::sum`, `ops::concatenate`, ... .

use mlx_sys as sys;

use crate::array::{Array, VecHandle};
use crate::error::{Error, Result};

mod creation;
mod elementwise;
mod index;
mod linalg;
mod methods;
mod reduce;
mod shape;

pub use creation::*;
pub use elementwise::*;
pub use index::*;
pub use linalg::*;
pub use reduce::*;
pub use shape::*;

/// The raw handle of an optional array (null for `None`).
pub(crate) fn opt_raw(a: Option<&Array>) -> sys::mlxs_array {
    a.map_or(std::ptr::null_mut(), Array::as_raw)
}

/// A shim vector holding `arrays` (shared handles).
pub(crate) fn vec_of(op: &'static str, arrays: &[&Array]) -> Result<VecHandle> {
    VecHandle::from_arrays(op, arrays.iter().copied())
}

/// Fails unless every list has the length of the first (`what` names them).
pub(crate) fn same_len(op: &'static str, what: &str, lens: &[usize]) -> Result<()> {
    if lens.windows(2).all(|w| w[0] == w[1]) {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("{what} must have the same length, got lengths {lens:?}"),
        ))
    }
}

/// Owned C string for a string argument.
pub(crate) fn c_string(op: &'static str, s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| Error::invalid(op, format!("{s:?} contains a NUL byte")))
}
