//! The one chokepoint for calls into `mlx-sys`: status checks, out-handles, error messages.

use std::ffi::CStr;

use mlx_sys as sys;

use crate::array::Array;
use crate::error::{Error, Result};

/// MLX's message for the last failure on this thread.
pub(crate) fn last_error() -> String {
    // SAFETY: mlxs_last_error returns a NUL-terminated thread-local string that stays valid
    // until the next failing shim call on this thread; we copy it immediately.
    unsafe { CStr::from_ptr(sys::mlxs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Turns a shim status into a `Result`.
pub(crate) fn check(op: &'static str, status: std::os::raw::c_int) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Mlx {
            op,
            message: last_error(),
        })
    }
}

/// Calls a shim function that writes one array handle, and takes ownership of it.
pub(crate) fn array_out(
    op: &'static str,
    f: impl FnOnce(*mut sys::mlxs_array) -> std::os::raw::c_int,
) -> Result<Array> {
    let mut out: sys::mlxs_array = std::ptr::null_mut();
    check(op, f(&mut out))?;
    // SAFETY: on success the shim wrote a fresh, owned, non-null handle.
    unsafe { Array::from_raw(op, out) }
}

/// Calls a shim function that writes one value of plain type.
pub(crate) fn value_out<T: Default>(
    op: &'static str,
    f: impl FnOnce(*mut T) -> std::os::raw::c_int,
) -> Result<T> {
    let mut out = T::default();
    check(op, f(&mut out))?;
    Ok(out)
}

/// An owned `mlxs_vec`, freed on drop.
pub(crate) struct VecHandle(pub(crate) sys::mlxs_vec);

impl VecHandle {
    pub(crate) fn new() -> Self {
        // SAFETY: mlxs_vec_new has no preconditions and returns an owned handle.
        VecHandle(unsafe { sys::mlxs_vec_new() })
    }

    pub(crate) fn from_arrays<'a>(
        op: &'static str,
        arrays: impl IntoIterator<Item = &'a Array>,
    ) -> Result<Self> {
        let v = Self::new();
        for a in arrays {
            // SAFETY: both handles are live.
            check(op, unsafe { sys::mlxs_vec_push(v.0, a.as_raw()) })?;
        }
        Ok(v)
    }

    /// The arrays held, as new owned handles (the vector keeps its own).
    pub(crate) fn to_arrays(&self, op: &'static str) -> Result<Vec<Array>> {
        // SAFETY: live vector handle.
        let n = unsafe { sys::mlxs_vec_size(self.0) };
        (0..n)
            .map(|i| {
                // SAFETY: live vector handle; i < size; the shim writes an owned handle.
                array_out(op, |o| unsafe { sys::mlxs_vec_get(o, self.0, i) })
            })
            .collect()
    }
}

/// Calls a shim function that writes one vector handle (a multi-output op), and returns its
/// arrays.
pub(crate) fn vec_out(
    op: &'static str,
    f: impl FnOnce(*mut sys::mlxs_vec) -> std::os::raw::c_int,
) -> Result<Vec<Array>> {
    let mut out: sys::mlxs_vec = std::ptr::null_mut();
    check(op, f(&mut out))?;
    if out.is_null() {
        return Err(Error::Mlx {
            op,
            message: "the shim returned a null vector".into(),
        });
    }
    // On success the shim wrote a fresh, owned handle; VecHandle frees it.
    VecHandle(out).to_arrays(op)
}

impl Drop for VecHandle {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { sys::mlxs_vec_free(self.0) }
    }
}

/// An owned `mlxs_string`, freed on drop.
pub(crate) struct StringHandle(pub(crate) sys::mlxs_string);

impl StringHandle {
    /// A null handle for a shim function to write into.
    pub(crate) fn null() -> Self {
        StringHandle(std::ptr::null_mut())
    }

    /// The text (invalid UTF-8 replaced); empty for a null handle.
    pub(crate) fn text(&self) -> String {
        if self.0.is_null() {
            return String::new();
        }
        // SAFETY: a live string handle; the data pointer is valid and NUL-terminated while
        // the handle lives, and is copied before it is freed.
        unsafe { CStr::from_ptr(sys::mlxs_string_data(self.0)) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for StringHandle {
    fn drop(&mut self) {
        // SAFETY: we own the handle (or it is null, which the shim ignores).
        unsafe { sys::mlxs_string_free(self.0) }
    }
}
