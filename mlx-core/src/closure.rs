//! Rust closures handed to MLX as C callbacks (`mlxs_closure`), and the way their failures
//! travel back.
//!
//! A callback never lets a panic unwind into C++: the trampoline runs the closure inside
//! `catch_unwind`, keeps the panic payload (or the closure's `Err`) in a thread-local slot
//! and reports failure; the shim throws a C++ exception so that MLX unwinds its own state;
//! the shim entry point that started the transform returns a failing status with
//! `mlxs_last_error_is_callback()` set, and [`check_cb`] re-raises the panic with
//! `resume_unwind` or returns the original `Err`. MLX calls callbacks synchronously, on the
//! thread that called the transform, so the thread-local slot is the right hand-over.
//!
//! Two kinds of payload:
//! - *scoped* ([`Scoped`]): a borrowed closure, valid while the `Scoped` value lives. The
//!   payload MLX holds is only a cell with a pointer to the closure and the owning thread;
//!   dropping the `Scoped` clears the pointer first, so a (never expected) late call from
//!   MLX gets an error instead of a dangling reference, and a call from another thread is
//!   refused. Used by vjp, jvp, value_and_grad and compile, where MLX does not keep the
//!   function beyond the call (or beyond the owning handle).
//! - *owned* ([`owned_closure`]): a `Send + 'static` closure moved into the payload behind a
//!   mutex. Used by custom_vjp and checkpoint, whose functions live inside graph nodes (as
//!   long as any array of that graph) and may be called or dropped on any thread.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

use mlx_sys as sys;

use crate::array::{Array, VecHandle};
use crate::error::{Error, Result};
use crate::ffi::{self, check};

/// Why a callback failed: the closure panicked, or returned `Err`.
enum Failure {
    Panic(Box<dyn Any + Send + 'static>),
    Err(Error),
}

thread_local! {
    static PENDING: RefCell<Option<Failure>> = const { RefCell::new(None) };
    static THREAD_TOKEN: u8 = const { 0 };
}

fn store(f: Failure) {
    // A failure left over from an earlier call that MLX swallowed is replaced.
    // `try_with`: never panic inside a callback, even during thread teardown.
    let _ = PENDING.try_with(|p| *p.borrow_mut() = Some(f));
}

fn take_pending() -> Option<Failure> {
    PENDING.try_with(|p| p.borrow_mut().take()).ok().flatten()
}

/// A number unique to the current thread among live threads.
fn thread_token() -> usize {
    THREAD_TOKEN
        .try_with(|t| t as *const u8 as usize)
        .unwrap_or(usize::MAX)
}

/// `check` for shim calls that may run callbacks: a callback's panic resumes here, its
/// `Err` is returned as it was; an MLX error becomes `Error::Mlx` as usual.
pub(crate) fn check_cb(op: &'static str, status: c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: no preconditions; reads a thread-local flag of the shim.
    let from_callback = unsafe { sys::mlxs_last_error_is_callback() };
    let pending = take_pending();
    if !from_callback {
        return check(op, status);
    }
    match pending {
        Some(Failure::Panic(payload)) => resume_unwind(payload),
        Some(Failure::Err(e)) => Err(e),
        None => Err(Error::Callback(format!(
            "{op}: a callback failed but its error was lost ({})",
            ffi::last_error()
        ))),
    }
}

/// Copies the arrays of a borrowed `mlxs_vec` into new handles.
///
/// # Safety
/// `v` must be a live vector handle.
pub(crate) unsafe fn read_vec(op: &'static str, v: sys::mlxs_vec) -> Result<Vec<Array>> {
    // SAFETY: v is live (caller's contract).
    let n = unsafe { sys::mlxs_vec_size(v) };
    (0..n)
        .map(|i| {
            // SAFETY: v is live and i < n.
            crate::array::array_out(op, |o| unsafe { sys::mlxs_vec_get(o, v, i) })
        })
        .collect()
}

/// Takes ownership of a vector handle written by the shim and reads it.
///
/// # Safety
/// `v` must be an owned, live vector handle (it is freed here).
pub(crate) unsafe fn take_vec(op: &'static str, v: sys::mlxs_vec) -> Result<Vec<Array>> {
    let owned = VecHandle(v);
    // SAFETY: owned.0 is live until `owned` drops at the end of this function.
    unsafe { read_vec(op, owned.0) }
}

/// Pushes arrays onto a borrowed vector handle.
///
/// # Safety
/// `v` must be a live vector handle.
unsafe fn push_vec(op: &'static str, v: sys::mlxs_vec, arrays: &[Array]) -> Result<()> {
    for a in arrays {
        // SAFETY: v is live (caller's contract); a is a live array.
        check(op, unsafe { sys::mlxs_vec_push(v, a.as_raw()) })?;
    }
    Ok(())
}

/// Runs a callback body: panics and errors are stored for `check_cb`, the status returned.
fn run_callback(body: impl FnOnce() -> Result<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            store(Failure::Err(e));
            1
        }
        Err(payload) => {
            store(Failure::Panic(payload));
            1
        }
    }
}

/// Frees a boxed payload without ever unwinding into C++.
unsafe extern "C" fn free_box<T>(p: *mut c_void) {
    let dropped = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: p came from Box::<T>::into_raw and the shim frees each payload once.
        drop(unsafe { Box::from_raw(p.cast::<T>()) })
    }));
    if let Err(payload) = dropped {
        // Dropping the panic payload could panic again; leak it instead.
        std::mem::forget(payload);
    }
}

/// An owned `mlxs_closure` handle.
pub(crate) struct Closure {
    raw: NonNull<sys::mlxs_closure_>,
}

// SAFETY: the handle owns a C++ std::function whose captured state is either a scoped cell
// (atomics, checked against its owner thread on every call) or an owned cell (a Send closure
// behind a mutex); moving the handle between threads is fine. Not Sync: calls build MLX
// graphs, which is not supported from two threads at once.
unsafe impl Send for Closure {}

impl Closure {
    /// Takes ownership of a closure handle written by the shim.
    pub(crate) fn out(
        op: &'static str,
        f: impl FnOnce(*mut sys::mlxs_closure) -> c_int,
    ) -> Result<Closure> {
        let mut raw: sys::mlxs_closure = std::ptr::null_mut();
        check_cb(op, f(&mut raw))?;
        NonNull::new(raw)
            .map(|raw| Closure { raw })
            .ok_or_else(|| Error::Mlx {
                op,
                message: "the shim returned a null closure".into(),
            })
    }

    pub(crate) fn as_raw(&self) -> sys::mlxs_closure {
        self.raw.as_ptr()
    }

    /// Calls the closure.
    pub(crate) fn apply(&self, op: &'static str, inputs: &[Array]) -> Result<Vec<Array>> {
        let ins = VecHandle::from_arrays(op, inputs)?;
        let mut out: sys::mlxs_vec = std::ptr::null_mut();
        // SAFETY: live handles; on success `out` is an owned vector.
        check_cb(op, unsafe {
            sys::mlxs_closure_apply(&mut out, self.as_raw(), ins.0)
        })?;
        // SAFETY: owned vector written by the shim.
        unsafe { take_vec(op, out) }
    }
}

impl Drop for Closure {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { sys::mlxs_closure_free(self.as_raw()) }
    }
}

/// The signature of every array function handed to MLX.
pub(crate) trait ArrayFn: Fn(&[Array]) -> Result<Vec<Array>> {}
impl<F: Fn(&[Array]) -> Result<Vec<Array>>> ArrayFn for F {}

// ---- scoped closures ----

struct ScopedCell {
    f: AtomicPtr<c_void>,
    owner: ThreadId,
}

unsafe extern "C" fn scoped_call<F: ArrayFn>(
    payload: *mut c_void,
    inputs: sys::mlxs_vec,
    outputs: sys::mlxs_vec,
) -> c_int {
    run_callback(|| {
        // SAFETY: payload is the ScopedCell this trampoline was registered with; the shim
        // keeps it alive while it can call us.
        let cell = unsafe { &*payload.cast::<ScopedCell>() };
        if std::thread::current().id() != cell.owner {
            return Err(Error::Callback(
                "a Rust closure was called by MLX from another thread than the one that \
                 handed it over"
                    .into(),
            ));
        }
        let f = cell.f.load(Ordering::Acquire).cast::<F>();
        if f.is_null() {
            return Err(Error::Callback(
                "a Rust closure was called by MLX after the call that lent it returned".into(),
            ));
        }
        // SAFETY: non-null means the Scoped that lent &F is alive on this (its) thread.
        let f = unsafe { &*f };
        // SAFETY: inputs and outputs are live vectors lent by the shim for this call.
        let ins = unsafe { read_vec("closure", inputs) }?;
        let outs = f(&ins)?;
        // SAFETY: see above.
        unsafe { push_vec("closure", outputs, &outs) }
    })
}

/// A closure handle lending `&'f F` to MLX for the lifetime of this value.
pub(crate) struct Scoped<'f> {
    closure: Closure,
    cell: *const ScopedCell,
    _f: PhantomData<&'f ()>,
}

impl<'f> Scoped<'f> {
    pub(crate) fn new<F: ArrayFn + 'f>(f: &'f F) -> Result<Scoped<'f>> {
        // SAFETY: the borrow keeps `f` alive for 'f, which outlives the returned value.
        unsafe { Self::from_ptr(f) }
    }

    /// [`Scoped::new`] from a pointer.
    ///
    /// # Safety
    /// `f` must stay valid (and not be mutated) until the returned value is dropped.
    pub(crate) unsafe fn from_ptr<F: ArrayFn + 'f>(f: *const F) -> Result<Scoped<'f>> {
        let cell = Box::into_raw(Box::new(ScopedCell {
            f: AtomicPtr::new(f.cast_mut().cast()),
            owner: std::thread::current().id(),
        }));
        // SAFETY: the trampoline matches the payload type; the shim owns the payload from
        // here on (and frees it with free_box, also on failure).
        let closure = Closure::out("closure", |o| unsafe {
            sys::mlxs_closure_new(
                o,
                Some(scoped_call::<F>),
                cell.cast(),
                Some(free_box::<ScopedCell>),
            )
        })?;
        Ok(Scoped {
            closure,
            cell,
            _f: PhantomData,
        })
    }

    pub(crate) fn closure(&self) -> &Closure {
        &self.closure
    }
}

impl Drop for Scoped<'_> {
    fn drop(&mut self) {
        // SAFETY: the cell is owned by the closure's payload, which `self.closure` (still
        // alive here) keeps alive.
        unsafe { &*self.cell }
            .f
            .store(std::ptr::null_mut(), Ordering::Release);
        // `self.closure` drops after this, possibly freeing the cell.
    }
}

// ---- owned closures ----

/// A `Send` closure that may be called from any thread: calls are serialised by the
/// mutex; a re-entrant call on the thread already inside is refused (it would deadlock).
struct OwnedCell<F> {
    f: Mutex<F>,
    inside: AtomicUsize,
}

impl<F> OwnedCell<F> {
    fn new(f: F) -> Self {
        OwnedCell {
            f: Mutex::new(f),
            inside: AtomicUsize::new(0),
        }
    }

    fn with<R>(&self, body: impl FnOnce(&F) -> Result<R>) -> Result<R> {
        let me = thread_token();
        if self.inside.load(Ordering::Acquire) == me {
            return Err(Error::Callback(
                "a custom_vjp/checkpoint function was called re-entrantly from inside itself"
                    .into(),
            ));
        }
        // A panic in an earlier call poisons the mutex; `F: Fn` has no state to protect.
        let guard = self.f.lock().unwrap_or_else(|e| e.into_inner());
        self.inside.store(me, Ordering::Release);
        struct Reset<'a>(&'a AtomicUsize);
        impl Drop for Reset<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _reset = Reset(&self.inside);
        body(&guard)
    }
}

unsafe extern "C" fn owned_call<F: ArrayFn + Send>(
    payload: *mut c_void,
    inputs: sys::mlxs_vec,
    outputs: sys::mlxs_vec,
) -> c_int {
    run_callback(|| {
        // SAFETY: payload is the OwnedCell<F> registered with this trampoline, alive while
        // the shim can call us.
        let cell = unsafe { &*payload.cast::<OwnedCell<F>>() };
        // SAFETY: live vectors lent by the shim for this call.
        let ins = unsafe { read_vec("closure", inputs) }?;
        let outs = cell.with(|f| f(&ins))?;
        // SAFETY: see above.
        unsafe { push_vec("closure", outputs, &outs) }
    })
}

/// A closure handle owning `f` (dropped, on whatever thread, when MLX lets go of it).
pub(crate) fn owned_closure<F: ArrayFn + Send + 'static>(f: F) -> Result<Closure> {
    let cell = Box::into_raw(Box::new(OwnedCell::new(f)));
    // SAFETY: the trampoline matches the payload type; the shim owns the payload from here
    // on (and frees it with free_box, also on failure).
    Closure::out("closure", |o| unsafe {
        sys::mlxs_closure_new(
            o,
            Some(owned_call::<F>),
            cell.cast(),
            Some(free_box::<OwnedCell<F>>),
        )
    })
}

/// The signature of a custom VJP: (primals, cotangents, outputs) -> one VJP per primal.
pub(crate) trait VjpFn: Fn(&[Array], &[Array], &[Array]) -> Result<Vec<Array>> {}
impl<F: Fn(&[Array], &[Array], &[Array]) -> Result<Vec<Array>>> VjpFn for F {}

unsafe extern "C" fn owned_vjp_call<B: VjpFn + Send>(
    payload: *mut c_void,
    primals: sys::mlxs_vec,
    cotangents: sys::mlxs_vec,
    outputs: sys::mlxs_vec,
    vjps: sys::mlxs_vec,
) -> c_int {
    run_callback(|| {
        // SAFETY: payload is the OwnedCell<B> registered with this trampoline.
        let cell = unsafe { &*payload.cast::<OwnedCell<B>>() };
        // SAFETY: live vectors lent by the shim for this call.
        let (p, c, o) = unsafe {
            (
                read_vec("custom_vjp", primals)?,
                read_vec("custom_vjp", cotangents)?,
                read_vec("custom_vjp", outputs)?,
            )
        };
        let r = cell.with(|b| b(&p, &c, &o))?;
        if r.len() != p.len() {
            return Err(Error::Callback(format!(
                "custom_vjp: the backward function returned {} arrays for {} primals",
                r.len(),
                p.len()
            )));
        }
        // SAFETY: see above.
        unsafe { push_vec("custom_vjp", vjps, &r) }
    })
}

/// `mx::custom_vjp(fun, backward)` with `backward` owned by the result.
pub(crate) fn custom_vjp_closure<B: VjpFn + Send + 'static>(
    fun: &Closure,
    backward: B,
) -> Result<Closure> {
    let cell = Box::into_raw(Box::new(OwnedCell::new(backward)));
    // SAFETY: live closure handle; the trampoline matches the payload type; the shim owns
    // the payload from here on (frees it with free_box, also on failure).
    Closure::out("custom_vjp", |o| unsafe {
        sys::mlxs_custom_vjp(
            o,
            fun.as_raw(),
            Some(owned_vjp_call::<B>),
            cell.cast(),
            Some(free_box::<OwnedCell<B>>),
        )
    })
}
