//! Custom GPU kernels from source: one builder over `mx.fast.metal_kernel` and
//! `mx.fast.cuda_kernel`.
//!
//! ```
//! use mlx_core::kernels::{CustomKernel, KernelBackend, Launch};
//! use mlx_core::prelude::*;
//!
//! # fn main() -> mlx_core::Result<()> {
//! let built = CustomKernel::builder("myexp")
//!     .inputs(["inp"])
//!     .outputs(["out"])
//!     .source("uint elem = thread_position_in_grid.x; out[elem] = metal::exp(inp[elem]);")
//!     .build();
//! match built {
//!     Ok(kernel) => {
//!         let x = Array::from_slice(&[0.0f32, 1.0], &[2])?;
//!         let launch = Launch::new([2, 1, 1], [2, 1, 1]).output(&[2], Dtype::Float32);
//!         let _y = kernel.call(&[x], &launch, None)?;
//!     }
//!     // No Metal or CUDA back-end (the CPU build): use the plain-ops reference instead.
//!     Err(_) => assert!(KernelBackend::native().is_none()),
//! }
//! # Ok(()) }
//! ```
//!
//! # Back-ends
//!
//! [`KernelBuilder::build`] uses the back-end this libmlx runs on ([`KernelBackend::native`]):
//! Metal on Apple silicon, CUDA on the CUDA build with a GPU. On a build with neither (the
//! CPU build used on Linux by default) it returns `Error::Mlx` with op `"custom_kernel"` and a
//! message saying so: callers fall back to their plain-ops reference implementation (every
//! fused kernel in this project has one). Forcing a back-end with [`KernelBuilder::backend`]
//! gives MLX's own error instead, at build time for CUDA (`"[cuda_kernel] No CUDA
//! back-end."`) and at call time for Metal (`"[metal_kernel] No Metal back-end."`), exactly as
//! in Python. Options of one back-end only (`atomic_outputs`: Metal; `shared_memory`: CUDA)
//! are rejected on the other.

use std::ffi::CString;

use mlx_sys as sys;

use crate::array::{Array, VecHandle};
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::check;

/// The two kinds of source kernel MLX can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelBackend {
    /// Metal Shading Language (`mx.fast.metal_kernel`).
    Metal,
    /// CUDA C++ (`mx.fast.cuda_kernel`).
    Cuda,
}

impl KernelBackend {
    fn to_sys(self) -> sys::mlxs_kernel_backend {
        match self {
            KernelBackend::Metal => sys::mlxs_kernel_backend_MLXS_KERNEL_METAL,
            KernelBackend::Cuda => sys::mlxs_kernel_backend_MLXS_KERNEL_CUDA,
        }
    }

    /// Whether this libmlx has the back-end and a device for it.
    pub fn is_available(self) -> bool {
        // SAFETY: plain value.
        unsafe { sys::mlxs_kernel_backend_available(self.to_sys()) }
    }

    /// The back-end custom kernels run on here, if any (Metal first, then CUDA).
    pub fn native() -> Option<KernelBackend> {
        [KernelBackend::Metal, KernelBackend::Cuda]
            .into_iter()
            .find(|b| b.is_available())
    }
}

/// A template argument of a kernel call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateArg {
    Int(i32),
    Bool(bool),
    Dtype(Dtype),
}

/// Describes a kernel; [`KernelBuilder::build`] makes it.
#[derive(Debug, Clone)]
pub struct KernelBuilder {
    name: String,
    input_names: Vec<String>,
    output_names: Vec<String>,
    source: String,
    header: String,
    ensure_row_contiguous: bool,
    atomic_outputs: bool,
    shared_memory: i32,
    backend: Option<KernelBackend>,
}

/// A built kernel. Call it with [`CustomKernel::call`].
pub struct CustomKernel {
    raw: std::ptr::NonNull<sys::mlxs_kernel_>,
    name: String,
    backend: KernelBackend,
    n_inputs: usize,
    n_outputs: usize,
}

// SAFETY: the handle owns a C++ std::function over immutable kernel settings (names, source,
// options); MLX's kernel caches are its own business. Moving it between threads is fine.
unsafe impl Send for CustomKernel {}

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| {
        Error::invalid(
            "custom_kernel",
            format!("{what} contains a NUL byte: {s:?}"),
        )
    })
}

impl CustomKernel {
    /// Starts describing a kernel called `name` (defaults as in MLX: no header,
    /// `ensure_row_contiguous = true`, `atomic_outputs = false`, `shared_memory = 0`).
    pub fn builder(name: impl Into<String>) -> KernelBuilder {
        KernelBuilder {
            name: name.into(),
            input_names: Vec::new(),
            output_names: Vec::new(),
            source: String::new(),
            header: String::new(),
            ensure_row_contiguous: true,
            atomic_outputs: false,
            shared_memory: 0,
            backend: None,
        }
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The back-end it was built for.
    pub fn backend(&self) -> KernelBackend {
        self.backend
    }

    /// Runs the kernel on `inputs` (one per input name, in order) with the launch settings.
    /// Returns one array per output name.
    pub fn call(
        &self,
        inputs: &[Array],
        launch: &Launch,
        s: Option<&Stream>,
    ) -> Result<Vec<Array>> {
        let op = "custom_kernel";
        if inputs.len() != self.n_inputs {
            return Err(Error::invalid(
                op,
                format!(
                    "kernel {} has {} inputs, called with {}",
                    self.name,
                    self.n_inputs,
                    inputs.len()
                ),
            ));
        }
        if launch.output_shapes.len() != self.n_outputs {
            return Err(Error::invalid(
                op,
                format!(
                    "kernel {} has {} outputs, the launch describes {}",
                    self.name,
                    self.n_outputs,
                    launch.output_shapes.len()
                ),
            ));
        }
        let ins = VecHandle::from_arrays(op, inputs)?;
        let flat: Vec<i32> = launch.output_shapes.iter().flatten().copied().collect();
        let ndims: Vec<usize> = launch.output_shapes.iter().map(Vec::len).collect();
        let dtypes: Vec<sys::mlxs_dtype> =
            launch.output_dtypes.iter().map(|d| d.to_sys()).collect();
        let names: Vec<CString> = launch
            .template
            .iter()
            .map(|(n, _)| cstring("template argument name", n))
            .collect::<Result<_>>()?;
        let targs: Vec<sys::mlxs_template_arg> = launch
            .template
            .iter()
            .zip(&names)
            .map(|((_, v), n)| {
                let (kind, value) = match *v {
                    TemplateArg::Int(i) => (sys::mlxs_template_kind_MLXS_TEMPLATE_INT, i),
                    TemplateArg::Bool(b) => {
                        (sys::mlxs_template_kind_MLXS_TEMPLATE_BOOL, i32::from(b))
                    }
                    TemplateArg::Dtype(d) => (
                        sys::mlxs_template_kind_MLXS_TEMPLATE_DTYPE,
                        d.to_sys() as i32,
                    ),
                };
                sys::mlxs_template_arg {
                    name: n.as_ptr(),
                    kind,
                    value,
                }
            })
            .collect();
        let mut out: sys::mlxs_vec = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the length passed with it (shapes: the sum of
        // ndims; grid/threadgroup: 3); `names` outlives the call; live handles.
        check(op, unsafe {
            sys::mlxs_kernel_apply(
                &mut out,
                self.raw.as_ptr(),
                ins.0,
                flat.as_ptr(),
                ndims.as_ptr(),
                dtypes.as_ptr(),
                dtypes.len(),
                launch.grid.as_ptr(),
                launch.threadgroup.as_ptr(),
                targs.as_ptr(),
                targs.len(),
                launch.init_value.is_some(),
                launch.init_value.unwrap_or(0.0),
                launch.verbose,
                raw(s),
            )
        })?;
        // SAFETY: on success the shim wrote an owned vector.
        unsafe { crate::closure::take_vec(op, out) }
    }
}

impl Drop for CustomKernel {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { sys::mlxs_kernel_free(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for CustomKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomKernel")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .finish()
    }
}

impl KernelBuilder {
    /// Names of the inputs, as the source refers to them.
    pub fn inputs<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.input_names = names.into_iter().map(Into::into).collect();
        self
    }
    /// Names of the outputs, as the source refers to them.
    pub fn outputs<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.output_names = names.into_iter().map(Into::into).collect();
        self
    }
    /// The body of the kernel (MLX writes the signature).
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }
    /// Code placed before the kernel (includes, helper functions).
    pub fn header(mut self, header: impl Into<String>) -> Self {
        self.header = header.into();
        self
    }
    /// Copy inputs to row-contiguous layout before the call (default true).
    pub fn ensure_row_contiguous(mut self, yes: bool) -> Self {
        self.ensure_row_contiguous = yes;
        self
    }
    /// Outputs are device atomics (Metal only; default false).
    pub fn atomic_outputs(mut self, yes: bool) -> Self {
        self.atomic_outputs = yes;
        self
    }
    /// Dynamic shared memory in bytes (CUDA only; default 0).
    pub fn shared_memory(mut self, bytes: i32) -> Self {
        self.shared_memory = bytes;
        self
    }
    /// Builds for this back-end instead of the native one.
    pub fn backend(mut self, backend: KernelBackend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Builds the kernel. On a libmlx without a kernel back-end, an `Error::Mlx` (see the
    /// module docs): fall back to the plain-ops reference.
    pub fn build(&self) -> Result<CustomKernel> {
        let op = "custom_kernel";
        let backend = match self.backend.or_else(KernelBackend::native) {
            Some(b) => b,
            None => {
                return Err(Error::Mlx {
                    op,
                    message: format!(
                        "[custom_kernel] cannot build kernel {}: this MLX build has no Metal or \
                         CUDA back-end (CPU only); use the plain-ops reference implementation",
                        self.name
                    ),
                })
            }
        };
        if self.source.is_empty() {
            return Err(Error::invalid(
                op,
                format!("kernel {} has no source", self.name),
            ));
        }
        let name = cstring("kernel name", &self.name)?;
        let ins: Vec<CString> = self
            .input_names
            .iter()
            .map(|n| cstring("input name", n))
            .collect::<Result<_>>()?;
        let outs: Vec<CString> = self
            .output_names
            .iter()
            .map(|n| cstring("output name", n))
            .collect::<Result<_>>()?;
        let in_ptrs: Vec<*const std::os::raw::c_char> = ins.iter().map(|c| c.as_ptr()).collect();
        let out_ptrs: Vec<*const std::os::raw::c_char> = outs.iter().map(|c| c.as_ptr()).collect();
        let source = cstring("kernel source", &self.source)?;
        let header = cstring("kernel header", &self.header)?;
        let mut raw: sys::mlxs_kernel = std::ptr::null_mut();
        // SAFETY: all strings are NUL-terminated and outlive the call; the pointer arrays are
        // valid for the lengths passed.
        check(op, unsafe {
            sys::mlxs_kernel_new(
                &mut raw,
                backend.to_sys(),
                name.as_ptr(),
                in_ptrs.as_ptr(),
                in_ptrs.len(),
                out_ptrs.as_ptr(),
                out_ptrs.len(),
                source.as_ptr(),
                header.as_ptr(),
                self.ensure_row_contiguous,
                self.atomic_outputs,
                self.shared_memory,
            )
        })?;
        let raw = std::ptr::NonNull::new(raw).ok_or_else(|| Error::Mlx {
            op,
            message: "the shim returned a null kernel".into(),
        })?;
        Ok(CustomKernel {
            raw,
            name: self.name.clone(),
            backend,
            n_inputs: self.input_names.len(),
            n_outputs: self.output_names.len(),
        })
    }
}

/// How to run a kernel: grid, threadgroup, template arguments, outputs, init value.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    grid: [i32; 3],
    threadgroup: [i32; 3],
    template: Vec<(String, TemplateArg)>,
    output_shapes: Vec<Vec<i32>>,
    output_dtypes: Vec<Dtype>,
    init_value: Option<f32>,
    verbose: bool,
}

impl Launch {
    /// A launch over `grid` threads in threadgroups (blocks) of `threadgroup`.
    pub fn new(grid: [i32; 3], threadgroup: [i32; 3]) -> Self {
        Launch {
            grid,
            threadgroup,
            template: Vec::new(),
            output_shapes: Vec::new(),
            output_dtypes: Vec::new(),
            init_value: None,
            verbose: false,
        }
    }
    /// Adds the next output: its shape and dtype.
    pub fn output(mut self, shape: &[i32], dtype: Dtype) -> Self {
        self.output_shapes.push(shape.to_vec());
        self.output_dtypes.push(dtype);
        self
    }
    /// Adds a template argument.
    pub fn template(mut self, name: impl Into<String>, value: TemplateArg) -> Self {
        self.template.push((name.into(), value));
        self
    }
    /// Fills the outputs with `value` before the kernel runs (otherwise uninitialised).
    pub fn init_value(mut self, value: f32) -> Self {
        self.init_value = Some(value);
        self
    }
    /// Prints the generated source when the kernel is built.
    pub fn verbose(mut self, yes: bool) -> Self {
        self.verbose = yes;
        self
    }
}
