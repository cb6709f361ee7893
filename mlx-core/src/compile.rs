//! `compile`: trace a function once per input signature, simplify and fuse its graph, and
//! replay the trace on later calls (`mx.compile`).
//!
//! ```
//! use mlx_core::prelude::*;
//!
//! # fn main() -> mlx_core::Result<()> {
//! let f = compile(|a: &[Array]| Ok(vec![((&a[0] * 2.0)?.exp()? + 1.0)?]), true)?;
//! for n in [2, 3, 7] {
//!     let x = ops::arange(0.0, n as f64, 1.0, Dtype::Float32, None)?;
//!     f.call(&[x])?;
//! }
//! assert_eq!(f.trace_count(), 1); // shapeless: one trace serves every shape
//! # Ok(()) }
//! ```
//!
//! # When the closure runs
//!
//! The closure runs when MLX traces it: on the first call, and again for every new input
//! signature (shapes and dtypes; with `shapeless`, ranks and dtypes). [`Compiled::trace_count`]
//! counts those runs, so a retrace shows as a step in the count. The closure also runs on
//! every call when compilation is off ([`disable_compile`], `MLX_DISABLE_COMPILE`) and when the
//! compiled function is called inside another transform on tracer inputs (inside
//! `value_and_grad`, or inside another compiled function's trace); the count includes those.
//!
//! Like `mx.compile`, the closure should be pure: arrays it captures are constants of the
//! trace (a later change to a captured array is not seen), and side effects happen only
//! while tracing.
//!
//! # Threads
//!
//! MLX 0.32.4 keeps compile caches per thread (`detail::compile_cache()`): a compiled
//! function's traces live in the cache of the thread that created it, and dropping it erases
//! them from that cache. [`Compiled`] is therefore neither `Send` nor `Sync`: create and use
//! it on one thread (make one per thread if several threads need it). The closure itself
//! needs no `Send`/`Sync` bound and may borrow (`Compiled<'f>`).

use std::cell::Cell;
use std::marker::PhantomData;
use std::rc::Rc;

use mlx_sys as sys;

use crate::array::Array;
use crate::closure::{Closure, Scoped};
use crate::error::Result;
use crate::ffi::check;

type Traced<'f> = Box<dyn Fn(&[Array]) -> Result<Vec<Array>> + 'f>;

/// A compiled function (see the module docs). Call it with [`Compiled::call`].
pub struct Compiled<'f> {
    // Field order is drop order: the compiled handle first (its compile key erases the cache
    // entries), then the lent closure (disarmed, then released), then the closure itself.
    compiled: Closure,
    _scoped: Scoped<'f>,
    _traced: Box<Traced<'f>>,
    traces: Rc<Cell<usize>>,
    shapeless: bool,
    // !Send + !Sync (per-thread compile caches).
    _not_send: PhantomData<*const ()>,
}

/// Compiles `f`. `shapeless`: one trace serves inputs of any shape with the same ranks and
/// dtypes (only for functions whose graph does not depend on shapes, as in MLX).
pub fn compile<'f, F>(f: F, shapeless: bool) -> Result<Compiled<'f>>
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + 'f,
{
    let traces = Rc::new(Cell::new(0usize));
    let counter = Rc::clone(&traces);
    let traced: Box<Traced<'f>> = Box::new(Box::new(move |inputs: &[Array]| {
        counter.set(counter.get() + 1);
        f(inputs)
    }));
    // SAFETY: `traced` is boxed, so the pointer stays valid while `Compiled` lives (moving
    // `Compiled` moves the box, not its contents); `scoped` is dropped (disarmed) before
    // `traced` (field order).
    let scoped: Scoped<'f> = unsafe { Scoped::from_ptr(traced.as_ref() as *const Traced<'f>) }?;
    // SAFETY: live closure handle; the shim writes an owned handle on success.
    let compiled = Closure::out("compile", |o| unsafe {
        sys::mlxs_compile(o, scoped.closure().as_raw(), shapeless)
    })?;
    Ok(Compiled {
        compiled,
        _scoped: scoped,
        _traced: traced,
        traces,
        shapeless,
        _not_send: PhantomData,
    })
}

impl Compiled<'_> {
    /// Calls the compiled function.
    pub fn call(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.compiled.apply("compile", inputs)
    }

    /// How many times the closure has run (traces; see the module docs).
    pub fn trace_count(&self) -> usize {
        self.traces.get()
    }

    /// Whether this function was compiled shapeless.
    pub fn is_shapeless(&self) -> bool {
        self.shapeless
    }
}

impl std::fmt::Debug for Compiled<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("shapeless", &self.shapeless)
            .field("traces", &self.traces.get())
            .finish()
    }
}

/// Turns compilation off for the whole process (as `MLX_DISABLE_COMPILE` does): every
/// compiled function, including those compiled earlier, runs its closure on each call until
/// [`enable_compile`]; traces made before are kept and replayed again afterwards.
pub fn disable_compile() -> Result<()> {
    // SAFETY: no preconditions.
    check("disable_compile", unsafe { sys::mlxs_disable_compile() })
}

/// Turns compilation back on (overrides `MLX_DISABLE_COMPILE`).
pub fn enable_compile() -> Result<()> {
    // SAFETY: no preconditions.
    check("enable_compile", unsafe { sys::mlxs_enable_compile() })
}
