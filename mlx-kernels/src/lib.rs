//! Fused kernels, each with a plain-ops reference and a stated parity tier.
//!
//! Every op here exists twice: a *reference* built from plain MLX ops in the order mlx-lm uses
//! them (runs on every back-end, the CPU build included), and a *fused* CUDA kernel built with
//! MLX's `cuda_kernel` (through [`mlx_core::kernels`]). A [`Path`] argument picks one; the
//! reference is always available, so the exact path never goes away.
//!
//! | op | module | fuses | tier of the fused path vs the reference |
//! | --- | --- | --- | --- |
//! | `add_rms_norm` | [`rms_norm`] | `h = x + r; rms_norm(h, w, eps)` (2 launches -> 1) | [`rms_norm::TIER`] |
//! | `swiglu` | [`swiglu`] | `silu(gate) * up` (3 launches -> 1) | [`swiglu::TIER`] |
//!
//! [`flash_attention`] is of another kind: tiled attention with an online softmax and its own
//! backward pass (a custom VJP), over plain MLX ops on every back-end, or over the CUDA kernels
//! of [`flash_cuda`] ([`flash_attention_with`] and a [`Path`]); its reference is the
//! materialised attention ([`attention_reference`]), its tier L3 with stated bounds on both
//! paths.
//!
//! [`graph_trellis`] holds the CUDA kernels of trellis-coded linears (decode, the fused
//! decode-and-dot, the Hadamard transforms with the op that follows) and their launch plans,
//! checked on the CPU emulator against `mlx_core::cpu::trellis` (L2 for decode and transforms,
//! L3 with a rounding bound for the product); the graph decoder launches them for a trellis
//! model under that model's switches (`graph_trellis::TrellisSwitches`, chosen by its width).
//!
//! Tiers (as in the project): L1 is bit-equality with the oracle (mlx-lm) for the same
//! weights, dtype and back-end; L2 is bit-equality of the fused kernel with its plain-ops
//! reference on the same back-end; L3 is agreement within a measured bound. The references
//! are L1 on CPU (`tests/reference.rs` against `cargo xtask goldens kernels`); the fused paths'
//! tiers are checked on the GPU by the `cuda` test set (`tests/cuda.rs`, `xtask/gpu/`).
//!
//! Inputs are validated before MLX sees them: both paths reject the same bad inputs with the
//! same [`mlx_core::Error::InvalidArgument`] naming the op, the argument and the problem.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;

use mlx_core::kernels::{CustomKernel, KernelBackend, KernelBuilder};
use mlx_core::{Array, Dtype, Error, Result};

pub mod flash_attention;
pub mod flash_cuda;
pub mod flash_spec;
pub mod graph_decode;
mod graph_profile;
pub mod graph_source;
pub mod graph_trellis;
pub mod rms_norm;
pub mod swiglu;

pub use flash_attention::{attention_reference, flash_attention, flash_attention_with};
pub use flash_spec::FlashSpec;
pub use rms_norm::add_rms_norm;
pub use swiglu::swiglu;

/// Which implementation of a fused op runs: the switch that keeps the exact path available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// Plain MLX ops in mlx-lm's order (every back-end; L1 on CPU).
    Reference,
    /// The fused CUDA kernel. Fails with a clear error where there is no CUDA back-end.
    Fused,
}

impl Path {
    /// [`Path::Fused`] where this libmlx runs CUDA kernels, else [`Path::Reference`].
    pub fn auto() -> Path {
        if KernelBackend::native() == Some(KernelBackend::Cuda) {
            Path::Fused
        } else {
            Path::Reference
        }
    }
}

/// How closely a fused kernel matches its plain-ops reference on the same back-end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tier {
    /// Bit-equal with the reference (L2).
    Exact,
    /// Within `max_ulps` units in the last place of the output dtype, elementwise (L3,
    /// with the bound measured on a CUDA device and stated where the kernel is defined).
    Bounded { max_ulps: u32 },
}

pub(crate) fn invalid(op: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        message: message.into(),
    }
}

/// Checks that `a` has a floating dtype MLX's CUDA kernels support.
pub(crate) fn check_float(op: &'static str, what: &str, a: &Array) -> Result<()> {
    match a.dtype() {
        Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 => Ok(()),
        other => Err(invalid(
            op,
            format!("{what} has dtype {other}; expected float32, float16 or bfloat16"),
        )),
    }
}

/// Checks that `a` has the dtype of `first` (named `first_name`).
pub(crate) fn check_same_dtype(
    op: &'static str,
    what: &str,
    a: &Array,
    first_name: &str,
    first: &Array,
) -> Result<()> {
    if a.dtype() == first.dtype() {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!(
                "{what} has dtype {}, {first_name} has {}; the fused op needs one dtype (cast first)",
                a.dtype(),
                first.dtype()
            ),
        ))
    }
}

/// Elements per 16-byte vector for `dtype`, as MLX's CUDA kernels read them.
pub(crate) fn n_reads(dtype: Dtype) -> i32 {
    (16 / dtype.size()) as i32
}

/// The process-wide kernels, built once each on first use (MLX compiles each dtype and
/// template instance once more, lazily, on its first launch).
static BUILT: Mutex<BTreeMap<&'static str, CustomKernel>> = Mutex::new(BTreeMap::new());

/// Runs `f` with the kernel `name`, building it with `make` the first time.
pub(crate) fn with_kernel<R>(
    name: &'static str,
    make: impl FnOnce() -> KernelBuilder,
    f: impl FnOnce(&CustomKernel) -> Result<R>,
) -> Result<R> {
    let op = "mlx_kernels";
    if KernelBackend::native() != Some(KernelBackend::Cuda) {
        return Err(Error::Mlx {
            op,
            message: format!(
                "kernel {name}: the fused path needs MLX's CUDA back-end with a GPU; \
                 use Path::Reference (or Path::auto()) here"
            ),
        });
    }
    let mut built = BUILT.lock().map_err(|_| Error::Mlx {
        op,
        message: "the kernel table's lock was poisoned by an earlier panic".into(),
    })?;
    if !built.contains_key(name) {
        let kernel = make().backend(KernelBackend::Cuda).build()?;
        built.insert(name, kernel);
    }
    match built.get(name) {
        Some(k) => f(k),
        None => Err(Error::Mlx {
            op,
            message: format!("kernel {name} vanished from the table"),
        }),
    }
}
