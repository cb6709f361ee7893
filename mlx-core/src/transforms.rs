//! Function transforms: automatic differentiation (`vjp`, `jvp`, `value_and_grad`, `grad`,
//! over flat inputs or a parameter tree), `custom_vjp`, `checkpoint` and `stop_gradient`.
//! Compilation is in [`crate::compile`].
//!
//! The functions being transformed are Rust closures `Fn(&[Array]) -> Result<Vec<Array>>`
//! that MLX calls back while it traces them. A closure that panics or returns `Err` makes
//! the whole transform fail: MLX unwinds its own state, then the panic resumes in the caller
//! (the original payload, so `std::panic::catch_unwind` sees it) or the closure's own `Err`
//! comes back unchanged. Nothing leaks on either path, and later calls work as before.
//!
//! ```
//! use mlx_core::prelude::*;
//!
//! # fn main() -> mlx_core::Result<()> {
//! // d/dx sum(x^2 * y) = 2xy, with the sum written as a product with ones.
//! let f = |a: &[Array]| -> Result<Vec<Array>> {
//!     let ones = ops::ones(&[3, 1], Dtype::Float32, None)?;
//!     let p = ((&a[0] * &a[0])? * &a[1])?;
//!     Ok(vec![p.reshape(&[1, 3])?.matmul(&ones)?.reshape(&[])?])
//! };
//! let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3])?;
//! let y = Array::from_slice(&[1.0f32, 1.0, 0.5], &[3])?;
//! let (value, grads) = transforms::value_and_grad(f, &[0])(&[x, y])?;
//! assert_eq!(value[0].item::<f32>()?, 9.5);
//! assert_eq!(grads[0].to_vec::<f32>()?, vec![2.0, 4.0, 3.0]);
//! # Ok(()) }
//! ```
//!
//! # Which closures may be borrowed
//!
//! `vjp`, `jvp`, `value_and_grad`, `grad` and the tree variant call the closure only during
//! the call, so it may borrow anything (no `Send`, no `'static`). `custom_vjp` and
//! `checkpoint` put their functions into graph nodes that live as long as any array of the
//! graph and may be dropped (or, through a shared graph, called) on another thread, so those
//! closures must be `Send + 'static`; they are called under a mutex, and a re-entrant call
//! from inside the same function is refused with an error instead of a deadlock. Pass the
//! arrays such a function needs (weights, for instance) as inputs, as mlx-lm does for
//! gradient checkpointing, or move them into the closure.

use std::collections::BTreeMap;

use mlx_sys as sys;

use crate::array::{Array, VecHandle};
use crate::closure::{self, check_cb, take_vec, ArrayFn, Closure, Scoped, VjpFn};
use crate::error::{Error, Result};

/// Runs a shim transform that writes two vectors.
fn two_vecs(
    op: &'static str,
    f: impl FnOnce(*mut sys::mlxs_vec, *mut sys::mlxs_vec) -> std::os::raw::c_int,
) -> Result<(Vec<Array>, Vec<Array>)> {
    let (mut a, mut b): (sys::mlxs_vec, sys::mlxs_vec) =
        (std::ptr::null_mut(), std::ptr::null_mut());
    check_cb(op, f(&mut a, &mut b))?;
    // SAFETY: on success the shim wrote two owned vectors.
    let first = unsafe { take_vec(op, a) };
    // SAFETY: as above (taken even if the first read failed, so it is freed).
    let second = unsafe { take_vec(op, b) };
    Ok((first?, second?))
}

/// The vector-Jacobian product: `(f(primals), cotangents · ∂f/∂primals)`, one VJP per
/// primal. `cotangents` has one array per output of `f`, shaped like it.
pub fn vjp<F: Fn(&[Array]) -> Result<Vec<Array>>>(
    f: F,
    primals: &[Array],
    cotangents: &[Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    let scoped = Scoped::new(&f)?;
    let p = VecHandle::from_arrays("vjp", primals)?;
    let c = VecHandle::from_arrays("vjp", cotangents)?;
    // SAFETY: live handles; the shim writes two owned vectors on success.
    two_vecs("vjp", |o, v| unsafe {
        sys::mlxs_vjp(o, v, scoped.closure().as_raw(), p.0, c.0)
    })
}

/// The Jacobian-vector product: `(f(primals), ∂f/∂primals · tangents)`, one JVP per output.
/// `tangents` has one array per primal, shaped like it.
pub fn jvp<F: Fn(&[Array]) -> Result<Vec<Array>>>(
    f: F,
    primals: &[Array],
    tangents: &[Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    let scoped = Scoped::new(&f)?;
    let p = VecHandle::from_arrays("jvp", primals)?;
    let t = VecHandle::from_arrays("jvp", tangents)?;
    // SAFETY: live handles; the shim writes two owned vectors on success.
    two_vecs("jvp", |o, v| unsafe {
        sys::mlxs_jvp(o, v, scoped.closure().as_raw(), p.0, t.0)
    })
}

fn check_argnums(op: &'static str, argnums: &[usize], n_inputs: usize) -> Result<Vec<i32>> {
    if argnums.is_empty() {
        return Err(Error::invalid(
            op,
            "gradient with respect to no argument requested",
        ));
    }
    let mut seen = argnums.to_vec();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid(
            op,
            format!("duplicate argument index {}", w[0]),
        ));
    }
    if let Some(&bad) = seen.last().filter(|&&m| m >= n_inputs) {
        return Err(Error::invalid(
            op,
            format!(
                "can't compute the gradient of argument index {bad}: the function is called \
                 with only {n_inputs} inputs"
            ),
        ));
    }
    seen.iter()
        .map(|&i| i32::try_from(i).map_err(|_| Error::invalid(op, "argument index too large")))
        .collect()
}

/// `mx.value_and_grad` on flat inputs, called once.
fn value_and_grad_once<F: ArrayFn>(
    f: &F,
    argnums: &[usize],
    inputs: &[Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    let sorted = check_argnums("value_and_grad", argnums, inputs.len())?;
    let scoped = Scoped::new(f)?;
    let ins = VecHandle::from_arrays("value_and_grad", inputs)?;
    // SAFETY: live handles; argnums valid for its length; two owned vectors on success.
    let (values, grads) = two_vecs("value_and_grad", |v, g| unsafe {
        sys::mlxs_value_and_grad(
            v,
            g,
            scoped.closure().as_raw(),
            sorted.as_ptr(),
            sorted.len(),
            ins.0,
        )
    })?;
    if grads.len() != sorted.len() {
        return Err(Error::Mlx {
            op: "value_and_grad",
            message: format!("{} gradients for {} arguments", grads.len(), sorted.len()),
        });
    }
    // MLX returns the gradients in increasing argument order; give them in `argnums` order.
    let by_index: BTreeMap<usize, Array> = sorted.iter().map(|&i| i as usize).zip(grads).collect();
    let grads = argnums.iter().map(|i| by_index[i].clone()).collect();
    Ok((values, grads))
}

/// A function computing `(f(inputs), ∂f(inputs)[0] / ∂inputs[argnums[i]])`, as
/// `mlx.core.value_and_grad` does.
///
/// The first output of `f` is the value differentiated: it must have a single element (a
/// scalar loss). Further outputs are returned as they are, through `stop_gradient` (auxiliary
/// values). The gradients come in the order of `argnums`; duplicate or out-of-range indices
/// are an `InvalidArgument` error.
pub fn value_and_grad<F: Fn(&[Array]) -> Result<Vec<Array>>>(
    f: F,
    argnums: &[usize],
) -> impl Fn(&[Array]) -> Result<(Vec<Array>, Vec<Array>)> {
    let argnums = argnums.to_vec();
    move |inputs: &[Array]| value_and_grad_once(&f, &argnums, inputs)
}

/// A function computing the gradients of [`value_and_grad`] only.
pub fn grad<F: Fn(&[Array]) -> Result<Vec<Array>>>(
    f: F,
    argnums: &[usize],
) -> impl Fn(&[Array]) -> Result<Vec<Array>> {
    let vg = value_and_grad(f, argnums);
    move |inputs: &[Array]| vg(inputs).map(|(_, g)| g)
}

/// Parameters by name, as a model's trainable parameters are handed to a loss.
pub type ParamMap = BTreeMap<String, Array>;

/// `value_and_grad` over a parameter tree: `f(params, others)` where `params` are the
/// trainable parameters (differentiated) and `others` the rest of the inputs (data, frozen
/// weights; not differentiated). Returns the outputs of `f` and one gradient per parameter,
/// under the same names. This is what LoRA training uses: `mlx.nn.value_and_grad(model, loss)`
/// differentiates w.r.t. `model.trainable_parameters()` the same way.
pub fn value_and_grad_tree<F>(
    f: F,
) -> impl Fn(&ParamMap, &[Array]) -> Result<(Vec<Array>, ParamMap)>
where
    F: Fn(&ParamMap, &[Array]) -> Result<Vec<Array>>,
{
    move |params: &ParamMap, others: &[Array]| {
        if params.is_empty() {
            return Err(Error::invalid(
                "value_and_grad_tree",
                "no parameters to differentiate",
            ));
        }
        let names: Vec<&String> = params.keys().collect();
        let n = names.len();
        let flat = |a: &[Array]| -> Result<Vec<Array>> {
            let tree: ParamMap = names
                .iter()
                .map(|k| (*k).clone())
                .zip(a[..n].iter().cloned())
                .collect();
            f(&tree, &a[n..])
        };
        let inputs: Vec<Array> = params.values().chain(others).cloned().collect();
        let argnums: Vec<usize> = (0..n).collect();
        let (values, grads) = value_and_grad_once(&flat, &argnums, &inputs)?;
        let grads = names.into_iter().cloned().zip(grads).collect();
        Ok((values, grads))
    }
}

/// An MLX function object made by [`custom_vjp`] or [`checkpoint`]: call it like the
/// function it wraps; it also works inside other transforms (and `compile`).
///
/// `Send` (it can move to another thread with the arrays it works on) but not `Sync`:
/// building one MLX graph from two threads at once is not supported.
pub struct Function {
    closure: Closure,
}

impl Function {
    /// Calls the function.
    pub fn call(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.closure.apply("call", inputs)
    }
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Function")
    }
}

/// `forward`, with `backward` as its vector-Jacobian product (`mx.custom_function` with a
/// `vjp`): when a transform differentiates through it, MLX calls
/// `backward(primals, cotangents, outputs)`, which returns one array per primal.
/// See the module docs for why both closures are `Send + 'static`.
pub fn custom_vjp<F, B>(forward: F, backward: B) -> Result<Function>
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + 'static,
    B: Fn(&[Array], &[Array], &[Array]) -> Result<Vec<Array>> + Send + 'static,
{
    fn build<B: VjpFn + Send + 'static>(fwd: Closure, backward: B) -> Result<Function> {
        Ok(Function {
            closure: closure::custom_vjp_closure(&fwd, backward)?,
        })
    }
    build(closure::owned_closure(forward)?, backward)
}

/// `f`, recomputed during the backward pass instead of keeping its intermediate arrays
/// (`mx.checkpoint`): less memory, one more forward pass. Gradients are the same.
pub fn checkpoint<F>(f: F) -> Result<Function>
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + 'static,
{
    let inner = closure::owned_closure(f)?;
    // SAFETY: live closure handle; the result is owned.
    let closure = Closure::out("checkpoint", |o| unsafe {
        sys::mlxs_checkpoint(o, inner.as_raw())
    })?;
    Ok(Function { closure })
}

/// The identity, with a zero gradient (re-exported from [`crate::ops`]).
pub use crate::ops::stop_gradient;
