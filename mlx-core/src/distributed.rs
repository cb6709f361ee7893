//! MLX's distributed layer (`mlx.core.distributed`): process groups and collectives.
//!
//! The transport is MLX's own: the `ring` backend (TCP, works on CPU over loopback), `mpi`
//! where an MPI library is present, `nccl` in CUDA builds. [`init`] reads the environment
//! MLX's backends expect; for `ring`: `MLX_RANK` (this process's rank) and `MLX_HOSTFILE` (a
//! JSON file holding, per rank, a list of `"ip:port"` addresses), which is what
//! `mlx launch` (and Python's `mlx.launch`) set up. Without that environment, a non-strict
//! init gives the singleton group (rank 0 of 1) on which every collective is the identity.
//!
//! Collectives are lazy ops like any other: `all_sum(&x, None, None)?` builds a graph node
//! and the communication happens when it is evaluated. Every rank of a group must evaluate
//! the same collectives in the same order. Errors carry MLX's message.

use std::ffi::CString;

use mlx_sys as sys;

use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::{check, value_out};

/// Which of MLX's backends [`init`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The first available one (MLX's `"any"`).
    Any,
    /// TCP ring (`MLX_RANK`, `MLX_HOSTFILE`).
    Ring,
    /// MPI (`mpirun`'s environment).
    Mpi,
    /// NCCL (CUDA builds only).
    Nccl,
}

impl Backend {
    /// MLX's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Any => "any",
            Backend::Ring => "ring",
            Backend::Mpi => "mpi",
            Backend::Nccl => "nccl",
        }
    }

    /// Parses MLX's name (`any`, `ring`, `mpi`, `nccl`).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "any" => Backend::Any,
            "ring" => Backend::Ring,
            "mpi" => Backend::Mpi,
            "nccl" => Backend::Nccl,
            other => {
                return Err(Error::invalid(
                    "distributed::Backend::parse",
                    format!("unknown backend {other:?} (expected any, ring, mpi or nccl)"),
                ))
            }
        })
    }

    fn c_name(self) -> CString {
        CString::new(self.name()).expect("backend names have no NUL")
    }
}

/// Whether `backend` can be used in this build of MLX.
pub fn is_available(backend: Backend) -> Result<bool> {
    let name = backend.c_name();
    // SAFETY: a live NUL-terminated string; the shim writes a bool.
    value_out("distributed::is_available", |o| unsafe {
        sys::mlxs_distributed_is_available(o, name.as_ptr())
    })
}

/// A group of processes that communicate (MLX's `distributed::Group`).
pub struct Group {
    raw: sys::mlxs_group,
}

// SAFETY: the handle owns a `shared_ptr` to MLX's group implementation, which MLX itself
// uses from its communication threads; the handle is never aliased mutably.
unsafe impl Send for Group {}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { sys::mlxs_group_free(self.raw) }
    }
}

fn group_out(
    op: &'static str,
    f: impl FnOnce(*mut sys::mlxs_group) -> std::os::raw::c_int,
) -> Result<Group> {
    let mut out: sys::mlxs_group = std::ptr::null_mut();
    check(op, f(&mut out))?;
    if out.is_null() {
        return Err(Error::Mlx {
            op,
            message: "the shim returned a null group".into(),
        });
    }
    Ok(Group { raw: out })
}

/// Initializes `backend` and returns the group of every process it discovers. With
/// `strict` false a backend that cannot start gives the singleton group instead of an
/// error (MLX's `init(strict=False)`).
pub fn init(strict: bool, backend: Backend) -> Result<Group> {
    let name = backend.c_name();
    // SAFETY: a live NUL-terminated string; the shim writes an owned group handle.
    group_out("distributed::init", |o| unsafe {
        sys::mlxs_distributed_init(o, strict, name.as_ptr())
    })
}

impl Group {
    /// This process's rank in the group.
    pub fn rank(&self) -> i32 {
        // SAFETY: a live group handle; the shim writes an int. Cannot fail for a live handle.
        value_out("Group::rank", |o| unsafe {
            sys::mlxs_group_rank(o, self.raw)
        })
        .unwrap_or(0)
    }

    /// The number of processes in the group.
    pub fn size(&self) -> i32 {
        // SAFETY: as in rank.
        value_out("Group::size", |o| unsafe {
            sys::mlxs_group_size(o, self.raw)
        })
        .unwrap_or(1)
    }

    /// Splits the group: processes passing the same `color` form a new group, ranked by
    /// `key` (`None`: by their rank here). Backends without split support (the ring in MLX
    /// 0.32.4) return MLX's error.
    pub fn split(&self, color: i32, key: Option<i32>) -> Result<Group> {
        // SAFETY: a live group handle; the shim writes an owned group handle.
        group_out("Group::split", |o| unsafe {
            sys::mlxs_group_split(o, self.raw, color, key.unwrap_or(-1))
        })
    }

    fn as_raw(&self) -> sys::mlxs_group {
        self.raw
    }
}

fn graw(g: Option<&Group>) -> sys::mlxs_group {
    g.map_or(std::ptr::null_mut(), Group::as_raw)
}

/// The element-wise sum of `x` over the group (`None`: the global group).
pub fn all_sum(x: &Array, group: Option<&Group>, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles (or null for the defaults).
    array_out("distributed::all_sum", |o| unsafe {
        sys::mlxs_distributed_all_sum(o, x.as_raw(), graw(group), raw(s))
    })
}

/// The element-wise maximum of `x` over the group.
pub fn all_max(x: &Array, group: Option<&Group>, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles (or null for the defaults).
    array_out("distributed::all_max", |o| unsafe {
        sys::mlxs_distributed_all_max(o, x.as_raw(), graw(group), raw(s))
    })
}

/// The element-wise minimum of `x` over the group.
pub fn all_min(x: &Array, group: Option<&Group>, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles (or null for the defaults).
    array_out("distributed::all_min", |o| unsafe {
        sys::mlxs_distributed_all_min(o, x.as_raw(), graw(group), raw(s))
    })
}

/// Every rank's `x` concatenated along the first axis, in rank order.
pub fn all_gather(x: &Array, group: Option<&Group>, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles (or null for the defaults).
    array_out("distributed::all_gather", |o| unsafe {
        sys::mlxs_distributed_all_gather(o, x.as_raw(), graw(group), raw(s))
    })
}

/// The sum over the group, scattered: rank r keeps the r-th slice of the first axis.
pub fn sum_scatter(x: &Array, group: Option<&Group>, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles (or null for the defaults).
    array_out("distributed::sum_scatter", |o| unsafe {
        sys::mlxs_distributed_sum_scatter(o, x.as_raw(), graw(group), raw(s))
    })
}

/// Sends `x` to rank `dst`; the returned array must be evaluated for the send to happen.
pub fn send(x: &Array, dst: i32, group: Option<&Group>, s: Option<&Stream>) -> Result<Array> {
    // SAFETY: live handles (or null for the defaults).
    array_out("distributed::send", |o| unsafe {
        sys::mlxs_distributed_send(o, x.as_raw(), dst, graw(group), raw(s))
    })
}

/// Receives an array of `shape` and `dtype` from rank `src`.
pub fn recv(
    shape: &[i32],
    dtype: Dtype,
    src: i32,
    group: Option<&Group>,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: the shape slice is live for the call; handles live (or null).
    array_out("distributed::recv", |o| unsafe {
        sys::mlxs_distributed_recv(
            o,
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            src,
            graw(group),
            raw(s),
        )
    })
}

/// Receives an array shaped and typed like `like` from rank `src`.
pub fn recv_like(
    like: &Array,
    src: i32,
    group: Option<&Group>,
    s: Option<&Stream>,
) -> Result<Array> {
    // SAFETY: live handles (or null for the defaults).
    array_out("distributed::recv_like", |o| unsafe {
        sys::mlxs_distributed_recv_like(o, like.as_raw(), src, graw(group), raw(s))
    })
}
