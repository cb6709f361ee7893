//! Safe Rust API over MLX 0.32.4.
//!
//! [`Array`] owns an MLX array handle; ops are free functions in [`ops`] (each with an
//! optional [`Stream`]) with method sugar on `Array`; every fallible call returns
//! [`Result`] carrying MLX's own message. Rust scalars combine with arrays as Python
//! scalars do in MLX (weak typing, see [`Scalar`]), because mlx-lm's numerics are Python's.
//!
//! ```
//! use mlx_core::prelude::*;
//!
//! # fn main() -> mlx_core::Result<()> {
//! let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let b = (&a.matmul(&a)? * 0.5)?;
//! assert_eq!(b.to_vec::<f32>()?, vec![3.5, 5.0, 7.5, 11.0]);
//! # Ok(()) }
//! ```
//!
//! Where libmlx comes from: `mlx-sys` fetches the pinned MLX wheel at build time (or uses
//! `MLX_DIR`); `cargo run` and `cargo test` find it without any environment variable.

mod array;
mod closure;
pub mod compile;
pub mod cpu;
mod device;
pub mod distributed;
mod dtype;
mod error;
pub mod fast;
mod ffi;
pub mod gpurt;
pub mod graph;
pub mod io;
pub mod kernels;
pub mod memory;
mod operators;
pub mod ops;
pub mod partial;
pub mod prelude;
pub mod quantized;
pub mod random;
mod scalar;
pub mod testing;
pub mod transforms;

pub use array::{async_eval, eval, Array};
pub use device::{synchronize, Device, DeviceType, Stream};
pub use dtype::{Complex64, Dtype, Element};
pub use error::{cap_listing, Error, Result, MAX_LISTED_PROBLEMS};
pub use scalar::Scalar;

/// The MLX version linked (`"0.32.4"`).
pub fn mlx_version() -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(mlx_sys::mlxs_version()) }
        .to_string_lossy()
        .into_owned()
}
