//! The one chokepoint for calls into `mlx-sys`: status checks, plain out-values, strings,
//! error messages. The array and array-vector out-handles (`array_out`, `vec_out`,
//! `VecHandle`) are `crate::array`'s, beside `Array::from_raw`.

use std::ffi::CStr;

use mlx_sys as sys;

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

/// Calls a shim function that writes one value of plain type.
pub(crate) fn value_out<T: Default>(
    op: &'static str,
    f: impl FnOnce(*mut T) -> std::os::raw::c_int,
) -> Result<T> {
    let mut out = T::default();
    check(op, f(&mut out))?;
    Ok(out)
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
