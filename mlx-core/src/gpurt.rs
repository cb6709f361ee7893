//! A small CUDA runtime of our own beside MLX: kernels compiled from CUDA C source with NVRTC,
//! device buffers, launches, and CUDA graphs captured once and replayed.
//!
//! MLX schedules every primitive of a step on the host (microseconds each on its CUDA
//! back-end), so a decode step of around a thousand primitives costs milliseconds of host time
//! whatever the GPU does (`results/gpu/README.md`). A
//! graph captured here is replayed by one driver call. This module is the safe, owning side;
//! the kernels themselves live where they are used (`mlx-kernels`' graph decoder).
//!
//! Built with the `cuda` feature only (the shim's `gpurt.cpp` too); without it the types are
//! here but [`GpuRuntime::new`] is an error naming the feature. The driver (`libcuda.so.1`)
//! and NVRTC are loaded at run time, so a `cuda` build links without them; without a driver
//! or a GPU, [`GpuRuntime::new`] returns an error saying so and [`GpuRuntime::available`] is
//! `false`. The runtime uses device 0's primary context, the one
//! MLX's CUDA back-end uses.
//!
//! Checks made before the driver sees anything: buffer indices and byte ranges (every copy and
//! every buffer argument), argument counts (each kernel's declared arity, and where the driver
//! can tell, the kernel's own parameter list, all of whose parameters must be 8 bytes:
//! pointers, `long long` and `double`), block sizes, and no copies or allocations while a
//! graph is being captured. What a kernel does with the pointers it is given is the kernel's
//! contract: this is the same trust as [`crate::kernels::CustomKernel`].

#[cfg(feature = "cuda")]
use std::ffi::CString;

#[cfg(feature = "cuda")]
use mlx_sys as sys;

use crate::array::Array;
use crate::error::{Error, Result};
#[cfg(feature = "cuda")]
use crate::ffi::{check, StringHandle};

/// A device buffer of a [`GpuRuntime`] (an index; meaningless for another runtime, whose
/// checks reject it if out of range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer(u32);

/// A kernel of a [`GpuRuntime`], in the order given to [`GpuRuntime::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernel(u32);

/// A module of kernels of a [`GpuRuntime`]: the one compiled by [`GpuRuntime::new`]
/// ([`Module::FIRST`]), or one more added by [`GpuRuntime::add_module`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Module(u32);

impl Module {
    /// The module [`GpuRuntime::new`] compiled.
    pub const FIRST: Module = Module(0);
}

/// A captured, instantiated CUDA graph of a [`GpuRuntime`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Graph(u32);

/// A read queued with [`GpuRuntime::read_begin`].
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a queued read holds one of 16 slots until read_end"]
pub struct Ticket(u64);

/// A kernel argument: every parameter of a kernel launched here is 8 bytes wide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A pointer into a buffer, `offset` bytes from its start.
    Buf(Buffer, usize),
    /// A `long long`.
    I64(i64),
    /// A `double`.
    F64(f64),
}

/// The most bytes one [`GpuRuntime::read_begin`] moves.
pub const MAX_READ_BYTES: usize = 1 << 20;

/// The runtime: one stream, its modules of kernels, its buffers and graphs. Dropping it waits
/// for its stream and frees everything it allocated.
#[cfg(feature = "cuda")]
pub struct GpuRuntime {
    raw: sys::mlxs_gpurt,
    kernels: Vec<String>,
    /// Where each module's kernels start in `kernels` (module i: from `modules[i]` to the
    /// next module's start).
    modules: Vec<usize>,
    /// The sources of copies queued by [`GpuRuntime::copy_from_arrays_queued`], kept alive
    /// (and, held twice, never written in place by MLX) until a wait covers them: each with
    /// the number of reads begun before it was queued ([`GpuRuntime::read_end`] of a later
    /// read lets it go; so do the calls that wait for the whole stream: `synchronize`,
    /// `upload`, `download`).
    held: Vec<(u64, Array)>,
    /// Reads begun so far.
    reads: u64,
}

#[cfg(feature = "cuda")]
// SAFETY: the handle is owned by this value alone, and every shim call makes the runtime's
// context current on the calling thread first, so it may move between threads (not be shared:
// no Sync).
unsafe impl Send for GpuRuntime {}

#[cfg(feature = "cuda")]
impl std::fmt::Debug for GpuRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRuntime")
            .field("kernels", &self.kernels)
            .field("allocated", &self.allocated())
            .finish()
    }
}

#[cfg(feature = "cuda")]
fn op_err(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::invalid(op, e.to_string())
}

#[cfg(feature = "cuda")]
impl GpuRuntime {
    /// Whether a CUDA driver loads and sees a device.
    pub fn available() -> bool {
        // SAFETY: no arguments; never fails.
        unsafe { sys::mlxs_gpurt_available() }
    }

    /// Compiles `source` (CUDA C++, `extern "C"` kernels, no includes needed) for device 0 and
    /// loads `kernels`, each `(name, number of 8-byte parameters)`.
    pub fn new(source: &str, kernels: &[(&str, u32)]) -> Result<Self> {
        let src = CString::new(source).map_err(|e| op_err("gpurt_new", e))?;
        let names: Vec<CString> = kernels
            .iter()
            .map(|(n, _)| CString::new(*n).map_err(|e| op_err("gpurt_new", e)))
            .collect::<Result<_>>()?;
        let ptrs: Vec<*const std::os::raw::c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let arities: Vec<u32> = kernels.iter().map(|(_, a)| *a).collect();
        let mut raw: sys::mlxs_gpurt = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; n_kernels matches both arrays.
        check("gpurt_new", unsafe {
            sys::mlxs_gpurt_new(
                &mut raw,
                src.as_ptr(),
                ptrs.as_ptr(),
                arities.as_ptr(),
                kernels.len(),
            )
        })?;
        Ok(GpuRuntime {
            raw,
            kernels: kernels.iter().map(|(n, _)| n.to_string()).collect(),
            modules: vec![0],
            held: Vec::new(),
            reads: 0,
        })
    }

    /// The kernel named `name` of the first module ([`Module::FIRST`]).
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        self.kernel_in(Module::FIRST, name)
    }

    /// The kernel named `name` of `module`.
    pub fn kernel_in(&self, module: Module, name: &str) -> Result<Kernel> {
        let m = module.0 as usize;
        let (Some(&start), end) = (
            self.modules.get(m),
            self.modules
                .get(m + 1)
                .copied()
                .unwrap_or(self.kernels.len()),
        ) else {
            return Err(Error::invalid(
                "gpurt_kernel",
                format!("no module {m} (the runtime has {})", self.modules.len()),
            ));
        };
        self.kernels[start..end]
            .iter()
            .position(|k| k == name)
            .map(|i| Kernel((start + i) as u32))
            .ok_or_else(|| {
                Error::invalid(
                    "gpurt_kernel",
                    format!("no kernel named {name} in module {m}"),
                )
            })
    }

    /// Compiles `source` as one more module of this runtime (as [`GpuRuntime::new`] compiles
    /// its first: NVRTC, or the on-disk cache) and loads `kernels` from it. The module's
    /// kernels use the runtime's buffers, stream and graphs; their names may repeat other
    /// modules' ([`GpuRuntime::kernel_in`] picks by module). Not while a graph is being
    /// captured. On failure the runtime is as it was, less the time spent.
    pub fn add_module(&mut self, source: &str, kernels: &[(&str, u32)]) -> Result<Module> {
        let src = CString::new(source).map_err(|e| op_err("gpurt_add_module", e))?;
        let names: Vec<CString> = kernels
            .iter()
            .map(|(n, _)| CString::new(*n).map_err(|e| op_err("gpurt_add_module", e)))
            .collect::<Result<_>>()?;
        let ptrs: Vec<*const std::os::raw::c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let arities: Vec<u32> = kernels.iter().map(|(_, a)| *a).collect();
        let mut first = 0u32;
        // SAFETY: live handle; every pointer is valid for the call; n_kernels matches both
        // arrays; first receives a u32.
        check("gpurt_add_module", unsafe {
            sys::mlxs_gpurt_add_module(
                self.raw,
                src.as_ptr(),
                ptrs.as_ptr(),
                arities.as_ptr(),
                kernels.len(),
                &mut first,
            )
        })?;
        if first as usize != self.kernels.len() {
            return Err(Error::invalid(
                "gpurt_add_module",
                format!(
                    "the shim put the module's kernels at {first}, expected {}",
                    self.kernels.len()
                ),
            ));
        }
        self.modules.push(self.kernels.len());
        self.kernels
            .extend(kernels.iter().map(|(n, _)| n.to_string()));
        Ok(Module(self.modules.len() as u32 - 1))
    }

    /// The device's name and architecture, e.g. `NVIDIA H200 (sm_90)`.
    pub fn device_name(&self) -> Result<String> {
        let mut s = StringHandle::null();
        // SAFETY: live handle; s receives an owned string.
        check("gpurt_device_name", unsafe {
            sys::mlxs_gpurt_device_name(self.raw, &mut s.0)
        })?;
        Ok(s.text())
    }

    /// A zeroed device buffer.
    pub fn alloc(&mut self, bytes: usize) -> Result<Buffer> {
        let mut b = 0u32;
        // SAFETY: live handle; b is a valid out-pointer.
        check("gpurt_alloc", unsafe {
            sys::mlxs_gpurt_alloc(self.raw, bytes, &mut b)
        })?;
        Ok(Buffer(b))
    }

    /// A device buffer holding a copy of `data`.
    pub fn alloc_from(&mut self, data: &[u8]) -> Result<Buffer> {
        let buf = self.alloc(data.len())?;
        self.upload(buf, 0, data)?;
        Ok(buf)
    }

    /// Bytes allocated on the device by this runtime.
    pub fn allocated(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_gpurt_allocated(self.raw) }
    }

    /// The runtime's one parkable region: a zeroed buffer of each of `sizes` (bytes, each >
    /// 0), in one range of device addresses whose memory [`GpuRuntime::park`] gives back to
    /// the device and [`GpuRuntime::unpark`] takes again at the same addresses (CUDA's
    /// virtual memory management), so that graphs captured over these buffers stay valid
    /// across a park. The region's memory is the sum of the sizes (each rounded up to 256
    /// bytes) rounded up to the driver's granularity (2 MiB on an H100):
    /// [`GpuRuntime::parkable_bytes`]. Where the driver has no virtual memory management the
    /// buffers are plain ones and [`GpuRuntime::park`] is an error. One region a runtime.
    pub fn alloc_parkable(&mut self, sizes: &[usize]) -> Result<Vec<Buffer>> {
        let mut first = 0u32;
        // SAFETY: live handle; sizes is valid for sizes.len() reads; first is a valid
        // out-pointer.
        check("gpurt_alloc_parkable", unsafe {
            sys::mlxs_gpurt_alloc_parkable(self.raw, sizes.as_ptr(), sizes.len(), &mut first)
        })?;
        Ok((0..sizes.len() as u32).map(|i| Buffer(first + i)).collect())
    }

    /// Gives the parkable region's memory back to the device after the stream's work is
    /// done; [`GpuRuntime::allocated`] no longer counts it. Until [`GpuRuntime::unpark`],
    /// launches, copies and reads touching the region's buffers are errors, and so is every
    /// graph replay. Parking a parked runtime only waits for the stream.
    pub fn park(&mut self) -> Result<()> {
        // SAFETY: live handle.
        check("gpurt_park", unsafe { sys::mlxs_gpurt_park(self.raw) })?;
        // The shim waited for the whole stream: the queued copies are done.
        self.held.clear();
        Ok(())
    }

    /// Takes device memory for the parkable region again, at the same addresses, zeroed (its
    /// contents from before the park are gone). Unparking a runtime that is not parked does
    /// nothing.
    pub fn unpark(&mut self) -> Result<()> {
        // SAFETY: live handle.
        check("gpurt_unpark", unsafe { sys::mlxs_gpurt_unpark(self.raw) })
    }

    /// The parkable region's device bytes, parked or not (0: none, or plain buffers).
    pub fn parkable_bytes(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_gpurt_parkable_bytes(self.raw) }
    }

    /// Whether the parkable region is parked.
    pub fn parked(&self) -> bool {
        // SAFETY: live handle.
        unsafe { sys::mlxs_gpurt_parked(self.raw) }
    }

    /// A buffer that is `src`'s own device memory, without a copy: the array (evaluated
    /// first) must be row-contiguous where MLX's CUDA back-end holds it, and 256-byte aligned.
    /// The runtime keeps the array alive until it is dropped and never writes or frees that
    /// memory ([`GpuRuntime::upload`] and [`GpuRuntime::copy_from_array`] into it are
    /// errors); its bytes count in [`GpuRuntime::borrowed`], not [`GpuRuntime::allocated`].
    /// Fails where MLX runs without a GPU, or the array is laid out otherwise: copy instead.
    pub fn borrow_array(&mut self, src: &Array) -> Result<Buffer> {
        let mut b = 0u32;
        // SAFETY: live handles; b is a valid out-pointer; the shim checks the array's layout.
        check("gpurt_borrow_array", unsafe {
            sys::mlxs_gpurt_borrow_array(self.raw, src.as_raw(), &mut b)
        })?;
        Ok(Buffer(b))
    }

    /// Bytes of MLX arrays' memory this runtime's buffers borrow ([`GpuRuntime::borrow_array`]).
    pub fn borrowed(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_gpurt_borrowed(self.raw) }
    }

    /// Copies `data` into `buffer` at byte `offset` (waits for the copy).
    pub fn upload(&mut self, buffer: Buffer, offset: usize, data: &[u8]) -> Result<()> {
        // SAFETY: data is valid for data.len() bytes of reads; the shim checks the range.
        check("gpurt_upload", unsafe {
            sys::mlxs_gpurt_upload(self.raw, buffer.0, offset, data.as_ptr().cast(), data.len())
        })?;
        // The shim waited for the whole stream: the queued copies are done.
        self.held.clear();
        Ok(())
    }

    /// Copies an MLX array's bytes into `buffer` on the device, without the host: as `height`
    /// rows of `width` bytes, row r to byte `offset + r * dst_pitch` (the array, made
    /// row-contiguous here if it is not, must hold exactly `width * height` bytes). The array
    /// is evaluated first; the copy is waited for. Fails where MLX runs without a GPU (its
    /// arrays are then in host memory: [`GpuRuntime::upload`] their bytes instead).
    pub fn copy_from_array(
        &mut self,
        buffer: Buffer,
        offset: usize,
        dst_pitch: usize,
        src: &Array,
        width: usize,
        height: usize,
    ) -> Result<()> {
        // A row-major copy where the array is a view (a reshape of a strided view copies).
        let flat = src.reshape(&[-1])?;
        // SAFETY: live handles; the shim checks the array's layout and size and both ranges.
        check("gpurt_copy_from_array", unsafe {
            sys::mlxs_gpurt_copy_from_array(
                self.raw,
                buffer.0,
                offset,
                dst_pitch,
                flat.as_raw(),
                width,
                height,
            )
        })
    }

    /// [`GpuRuntime::copy_from_array`] for several arrays, each `(buffer, offset, dst_pitch,
    /// array, width, height)`, queued on the stream and not waited for: the arrays are
    /// evaluated together (one wait for MLX), the copies queued in order, and the arrays
    /// held by the runtime until a later wait on its stream covers the copies (the next
    /// [`GpuRuntime::read_end`] of a read begun after them, or a call that waits for the
    /// whole stream: [`GpuRuntime::synchronize`], [`GpuRuntime::upload`],
    /// [`GpuRuntime::download`]).
    /// Work queued after them (kernels, graphs) sees the copied bytes.
    pub fn copy_from_arrays_queued(
        &mut self,
        copies: &[(Buffer, usize, usize, &Array, usize, usize)],
    ) -> Result<()> {
        // Row-major copies where an array is a view (a reshape of a strided view copies).
        let flats: Vec<Array> = copies
            .iter()
            .map(|c| c.3.reshape(&[-1]))
            .collect::<Result<_>>()?;
        crate::array::eval(flats.iter())?;
        for (c, flat) in copies.iter().zip(flats) {
            let (buffer, offset, dst_pitch, _, width, height) = *c;
            // SAFETY: live handles; the shim checks the array's layout and size and both
            // ranges; `flat` is held below until a wait covers the copy.
            check("gpurt_copy_from_array", unsafe {
                sys::mlxs_gpurt_copy_from_array_queued(
                    self.raw,
                    buffer.0,
                    offset,
                    dst_pitch,
                    flat.as_raw(),
                    width,
                    height,
                )
            })?;
            self.held.push((self.reads, flat));
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of `buffer` from byte `offset` (after everything queued).
    pub fn download(&mut self, buffer: Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        // SAFETY: out is valid for out.len() bytes of writes; the shim checks the range.
        check("gpurt_download", unsafe {
            sys::mlxs_gpurt_download(
                self.raw,
                buffer.0,
                offset,
                out.as_mut_ptr().cast(),
                out.len(),
            )
        })?;
        // The shim waited for the whole stream: the queued copies are done.
        self.held.clear();
        Ok(())
    }

    /// Raises `kernel`'s dynamic shared memory limit to `bytes`.
    pub fn set_shared_limit(&mut self, kernel: Kernel, bytes: u32) -> Result<()> {
        // SAFETY: live handle; the shim checks the kernel index.
        check("gpurt_set_shared_limit", unsafe {
            sys::mlxs_gpurt_set_shared_limit(self.raw, kernel.0, bytes)
        })
    }

    /// Queues a launch on the runtime's stream (or records it, while capturing).
    pub fn launch(
        &mut self,
        kernel: Kernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<()> {
        let raw_args: Vec<sys::mlxs_gpurt_arg> = args
            .iter()
            .map(|a| match *a {
                Arg::Buf(b, off) => sys::mlxs_gpurt_arg {
                    kind: sys::mlxs_gpurt_arg_kind_MLXS_GPURT_ARG_BUFFER,
                    buffer: b.0,
                    value: off as u64,
                },
                Arg::I64(v) => sys::mlxs_gpurt_arg {
                    kind: sys::mlxs_gpurt_arg_kind_MLXS_GPURT_ARG_BITS,
                    buffer: 0,
                    value: v as u64,
                },
                Arg::F64(v) => sys::mlxs_gpurt_arg {
                    kind: sys::mlxs_gpurt_arg_kind_MLXS_GPURT_ARG_BITS,
                    buffer: 0,
                    value: v.to_bits(),
                },
            })
            .collect();
        // SAFETY: grid, block and args are valid for their lengths; the shim checks counts,
        // indices and ranges.
        check("gpurt_launch", unsafe {
            sys::mlxs_gpurt_launch(
                self.raw,
                kernel.0,
                grid.as_ptr(),
                block.as_ptr(),
                shared_bytes,
                raw_args.as_ptr(),
                raw_args.len(),
            )
        })
    }

    /// How many blocks of `kernel` the device holds at once (its SMs times the occupancy for
    /// `block_threads` threads and `shared_bytes` of dynamic shared memory): a larger grid
    /// runs in more than one wave.
    pub fn resident_blocks(
        &self,
        kernel: Kernel,
        block_threads: u32,
        shared_bytes: u32,
    ) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: live handle; n is a valid out-pointer; the shim checks the kernel index.
        check("gpurt_resident_blocks", unsafe {
            sys::mlxs_gpurt_resident_blocks(self.raw, kernel.0, block_threads, shared_bytes, &mut n)
        })?;
        Ok(n)
    }

    /// The device's streaming multiprocessors.
    pub fn sm_count(&self) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: live handle; n is a valid out-pointer.
        check("gpurt_sm_count", unsafe {
            sys::mlxs_gpurt_sm_count(self.raw, &mut n)
        })?;
        Ok(n)
    }

    /// Whether later launches allow programmatic dependent launch: a kernel's blocks may start
    /// once the kernel before it executes `griddepcontrol.launch_dependents`, so every kernel
    /// launched this way must execute `griddepcontrol.wait` before reading what the kernel
    /// before it wrote. Needs a CUDA 12 driver.
    pub fn set_programmatic_launch(&mut self, on: bool) -> Result<()> {
        // SAFETY: live handle.
        check("gpurt_set_programmatic_launch", unsafe {
            sys::mlxs_gpurt_set_programmatic_launch(self.raw, on)
        })
    }

    /// Records launches into a graph until [`GpuRuntime::capture_end`]. If `f` fails, the
    /// capture is ended and dropped, and `f`'s error returned.
    pub fn capture<F>(&mut self, f: F) -> Result<Graph>
    where
        F: FnOnce(&mut GpuRuntime) -> Result<()>,
    {
        // SAFETY: live handle.
        check("gpurt_capture_begin", unsafe {
            sys::mlxs_gpurt_capture_begin(self.raw)
        })?;
        let recorded = f(self);
        let mut g = 0u32;
        // SAFETY: live handle; g is a valid out-pointer.
        let ended = check("gpurt_capture_end", unsafe {
            sys::mlxs_gpurt_capture_end(self.raw, &mut g)
        });
        recorded?;
        ended?;
        Ok(Graph(g))
    }

    /// Queues `times` replays of `graph`.
    pub fn replay(&mut self, graph: Graph, times: u32) -> Result<()> {
        // SAFETY: live handle; the shim checks the graph index.
        check("gpurt_replay", unsafe {
            sys::mlxs_gpurt_graph_launch(self.raw, graph.0, times)
        })
    }

    /// Queues a copy of `bytes` (at most [`MAX_READ_BYTES`]) of `buffer` into a pinned slot,
    /// after everything queued so far; [`GpuRuntime::read_end`] waits for it. At most 16 reads
    /// are in flight.
    pub fn read_begin(&mut self, buffer: Buffer, offset: usize, bytes: usize) -> Result<Ticket> {
        let mut t = 0u64;
        // SAFETY: live handle; t is a valid out-pointer; the shim checks the range.
        check("gpurt_read_begin", unsafe {
            sys::mlxs_gpurt_read_begin(self.raw, buffer.0, offset, bytes, &mut t)
        })?;
        self.reads += 1;
        Ok(Ticket(t))
    }

    /// Waits for a queued read and copies it into `out`, whose length must be the read's.
    pub fn read_end(&mut self, ticket: Ticket, out: &mut [u8]) -> Result<()> {
        // SAFETY: out is valid for out.len() bytes of writes; the shim checks the length.
        check("gpurt_read_end", unsafe {
            sys::mlxs_gpurt_read_end(self.raw, ticket.0, out.as_mut_ptr().cast(), out.len())
        })?;
        // Tickets count from 1 in the order reads begin: the copies queued before this read
        // began are done.
        self.held.retain(|(before, _)| *before >= ticket.0);
        Ok(())
    }

    /// Waits for everything queued on the runtime's stream.
    pub fn synchronize(&mut self) -> Result<()> {
        // SAFETY: live handle.
        check("gpurt_synchronize", unsafe {
            sys::mlxs_gpurt_synchronize(self.raw)
        })?;
        self.held.clear();
        Ok(())
    }
}

#[cfg(feature = "cuda")]
impl Drop for GpuRuntime {
    fn drop(&mut self) {
        // SAFETY: we own the handle; it is not used after this.
        unsafe { sys::mlxs_gpurt_free(self.raw) }
    }
}

/// Without the `cuda` feature the runtime and its shim are not built: a runtime cannot be
/// made ([`GpuRuntime::new`] says why, [`GpuRuntime::available`] is `false`), so none of its
/// methods can be reached.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub struct GpuRuntime {
    never: std::convert::Infallible,
}

#[cfg(not(feature = "cuda"))]
#[allow(unused_variables, clippy::missing_errors_doc)]
impl GpuRuntime {
    /// Always `false`: this build has no CUDA runtime.
    pub fn available() -> bool {
        false
    }

    /// Always an error naming the missing `cuda` feature.
    pub fn new(source: &str, kernels: &[(&str, u32)]) -> Result<Self> {
        Err(Error::invalid(
            "gpurt_new",
            "[gpurt] no CUDA driver in this build: it was built without the `cuda` feature \
             (cargo build --features cuda)",
        ))
    }

    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        match self.never {}
    }

    pub fn kernel_in(&self, module: Module, name: &str) -> Result<Kernel> {
        match self.never {}
    }

    pub fn add_module(&mut self, source: &str, kernels: &[(&str, u32)]) -> Result<Module> {
        match self.never {}
    }

    pub fn device_name(&self) -> Result<String> {
        match self.never {}
    }

    pub fn alloc(&mut self, bytes: usize) -> Result<Buffer> {
        match self.never {}
    }

    pub fn alloc_from(&mut self, data: &[u8]) -> Result<Buffer> {
        match self.never {}
    }

    pub fn allocated(&self) -> usize {
        match self.never {}
    }

    pub fn alloc_parkable(&mut self, sizes: &[usize]) -> Result<Vec<Buffer>> {
        match self.never {}
    }

    pub fn park(&mut self) -> Result<()> {
        match self.never {}
    }

    pub fn unpark(&mut self) -> Result<()> {
        match self.never {}
    }

    pub fn parkable_bytes(&self) -> usize {
        match self.never {}
    }

    pub fn parked(&self) -> bool {
        match self.never {}
    }

    pub fn borrow_array(&mut self, src: &Array) -> Result<Buffer> {
        match self.never {}
    }

    pub fn borrowed(&self) -> usize {
        match self.never {}
    }

    pub fn upload(&mut self, buffer: Buffer, offset: usize, data: &[u8]) -> Result<()> {
        match self.never {}
    }

    pub fn copy_from_array(
        &mut self,
        buffer: Buffer,
        offset: usize,
        dst_pitch: usize,
        src: &Array,
        width: usize,
        height: usize,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn copy_from_arrays_queued(
        &mut self,
        copies: &[(Buffer, usize, usize, &Array, usize, usize)],
    ) -> Result<()> {
        match self.never {}
    }

    pub fn download(&mut self, buffer: Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        match self.never {}
    }

    pub fn set_shared_limit(&mut self, kernel: Kernel, bytes: u32) -> Result<()> {
        match self.never {}
    }

    pub fn launch(
        &mut self,
        kernel: Kernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &[Arg],
    ) -> Result<()> {
        match self.never {}
    }

    pub fn resident_blocks(
        &self,
        kernel: Kernel,
        block_threads: u32,
        shared_bytes: u32,
    ) -> Result<u32> {
        match self.never {}
    }

    pub fn sm_count(&self) -> Result<u32> {
        match self.never {}
    }

    pub fn set_programmatic_launch(&mut self, on: bool) -> Result<()> {
        match self.never {}
    }

    pub fn capture<F>(&mut self, f: F) -> Result<Graph>
    where
        F: FnOnce(&mut GpuRuntime) -> Result<()>,
    {
        match self.never {}
    }

    pub fn replay(&mut self, graph: Graph, times: u32) -> Result<()> {
        match self.never {}
    }

    pub fn read_begin(&mut self, buffer: Buffer, offset: usize, bytes: usize) -> Result<Ticket> {
        match self.never {}
    }

    pub fn read_end(&mut self, ticket: Ticket, out: &mut [u8]) -> Result<()> {
        match self.never {}
    }

    pub fn synchronize(&mut self) -> Result<()> {
        match self.never {}
    }
}
