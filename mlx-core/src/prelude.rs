//! What a model or training loop usually needs in scope (`use mlx_core::prelude::*`).

pub use crate::compile::{compile, Compiled};
pub use crate::ops;
pub use crate::transforms::{
    self, checkpoint, custom_vjp, grad, jvp, stop_gradient, value_and_grad, value_and_grad_tree,
    vjp, Function, ParamMap,
};
pub use crate::{eval, Array, Device, Dtype, Error, Result, Scalar, Stream};
pub use crate::{fast, quantized, random};
pub use half::{bf16, f16};
