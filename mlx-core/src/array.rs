//! [`Array`]: an owned handle to an MLX array (a node of the lazy graph).

use std::ptr::NonNull;

use mlx_sys as sys;

use crate::dtype::{Dtype, Element};
use crate::error::{Error, Result};
use crate::ffi::{self, check};

/// An MLX array. Lazy: ops build a graph, [`Array::eval`] (or reading data) computes it.
///
/// `Clone` is cheap: both values share the same node and data. `Drop` releases the handle.
pub struct Array {
    raw: NonNull<sys::mlxs_array_>,
}

// SAFETY: an MLX array is a reference-counted (atomically) node; moving a handle to another
// thread is fine. Arrays are not `Sync`: MLX does not support evaluating one graph from two
// threads at once.
unsafe impl Send for Array {}

impl Array {
    /// Takes ownership of a handle returned by the shim.
    ///
    /// # Safety
    /// `raw` must be null or an owned, live `mlxs_array` not owned by anything else.
    pub(crate) unsafe fn from_raw(op: &'static str, raw: sys::mlxs_array) -> Result<Array> {
        NonNull::new(raw)
            .map(|raw| Array { raw })
            .ok_or_else(|| Error::Mlx {
                op,
                message: "the shim returned a null array".into(),
            })
    }

    /// The raw handle, still owned by `self`.
    pub fn as_raw(&self) -> sys::mlxs_array {
        self.raw.as_ptr()
    }

    /// An array of `shape` holding a copy of `data` (row-major).
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let expected = shape_numel("from_slice", shape)?;
        if expected != data.len() {
            return Err(Error::invalid(
                "from_slice",
                format!(
                    "shape {shape:?} needs {expected} elements, got {}",
                    data.len()
                ),
            ));
        }
        let nbytes = std::mem::size_of_val(data);
        // SAFETY: data is valid for nbytes; shape for shape.len() elements; T's layout is
        // exactly T::DTYPE's element layout (sealed Element trait).
        array_out("from_slice", |out| unsafe {
            sys::mlxs_array_from_data(
                out,
                data.as_ptr().cast(),
                nbytes,
                shape.as_ptr(),
                shape.len(),
                T::DTYPE.to_sys(),
            )
        })
    }

    /// A 1-D array holding a copy of `data`.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Result<Array> {
        let n = i32::try_from(data.len())
            .map_err(|_| Error::invalid("from_vec", "more than i32::MAX elements"))?;
        Self::from_slice(&data, &[n])
    }

    /// A 0-d array holding `value`.
    pub fn scalar<T: Element>(value: T) -> Result<Array> {
        Self::from_slice(&[value], &[])
    }

    /// A 0-d array of `dtype` built from an `f32`, the way MLX's Python binding builds a
    /// Python float (the value is converted from `f32` to `dtype`).
    pub fn from_f32(value: f32, dtype: Dtype) -> Result<Array> {
        // SAFETY: plain values.
        array_out("from_f32", |out| unsafe {
            sys::mlxs_array_from_float(out, value, dtype.to_sys())
        })
    }

    /// A 0-d array of `dtype` built from an `f64` (converted to `dtype`).
    pub fn from_f64(value: f64, dtype: Dtype) -> Result<Array> {
        // SAFETY: plain values.
        array_out("from_f64", |out| unsafe {
            sys::mlxs_array_from_double(out, value, dtype.to_sys())
        })
    }

    /// A 0-d array of `dtype` built from an integer (converted to `dtype`).
    pub fn from_int(value: i64, dtype: Dtype) -> Result<Array> {
        // SAFETY: plain values.
        array_out("from_int", |out| unsafe {
            sys::mlxs_array_from_int(out, value, dtype.to_sys())
        })
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_array_ndim(self.as_raw()) }
    }

    /// The shape.
    pub fn shape(&self) -> Vec<i32> {
        let n = self.ndim();
        if n == 0 {
            return Vec::new();
        }
        // SAFETY: the shim returns a pointer to ndim dims owned by the live array; we copy.
        unsafe { std::slice::from_raw_parts(sys::mlxs_array_shape(self.as_raw()), n) }.to_vec()
    }

    /// The size of dimension `axis`; negative axes count from the end.
    pub fn dim(&self, axis: i32) -> Result<i32> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let ax = if axis < 0 { axis + n } else { axis };
        if ax < 0 || ax >= n {
            return Err(Error::invalid(
                "dim",
                format!("axis {axis} out of range for shape {shape:?}"),
            ));
        }
        Ok(shape[ax as usize])
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_array_size(self.as_raw()) }
    }

    /// Bytes of data (size * itemsize).
    pub fn nbytes(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_array_nbytes(self.as_raw()) }
    }

    /// Bytes per element.
    pub fn itemsize(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_array_itemsize(self.as_raw()) }
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        // SAFETY: live handle.
        Dtype::from_sys(unsafe { sys::mlxs_array_dtype(self.as_raw()) })
    }

    /// Whether the array has been evaluated.
    pub fn is_evaluated(&self) -> bool {
        // SAFETY: live handle.
        unsafe { sys::mlxs_array_is_available(self.as_raw()) }
    }

    /// Identity of the graph node: equal for clones of one array.
    pub fn id(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlxs_array_id(self.as_raw()) }
    }

    /// Computes the array.
    pub fn eval(&self) -> Result<()> {
        // SAFETY: live handle.
        check("eval", unsafe { sys::mlxs_array_eval(self.as_raw()) })
    }

    /// Evaluates and copies the elements out, row-major. `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::invalid(
                "to_vec",
                format!("array has dtype {}, asked for {}", self.dtype(), T::DTYPE),
            ));
        }
        let mut v = vec![T::default(); self.size()];
        let nbytes = std::mem::size_of_val(v.as_slice());
        // SAFETY: v is valid for nbytes of writes and T matches the dtype's layout.
        check("to_vec", unsafe {
            sys::mlxs_array_to_data(self.as_raw(), v.as_mut_ptr().cast(), nbytes)
        })?;
        Ok(v)
    }

    /// Evaluates a floating-point array and copies its elements out as `f32`, row-major:
    /// float16 and bfloat16 are widened exactly on the host. Unlike `astype(Float32)` then
    /// [`Array::to_vec`], this adds no node to the graph, so it waits for this array only, not
    /// for work queued on its stream after it (a pipelined decode keeps its overlap).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        match self.dtype() {
            Dtype::Float32 => self.to_vec::<f32>(),
            Dtype::Bfloat16 => Ok(self
                .to_vec::<half::bf16>()?
                .into_iter()
                .map(f32::from)
                .collect()),
            Dtype::Float16 => Ok(self
                .to_vec::<half::f16>()?
                .into_iter()
                .map(f32::from)
                .collect()),
            d => Err(Error::invalid(
                "to_vec_f32",
                format!("array has dtype {d}, not float32, float16 or bfloat16"),
            )),
        }
    }

    /// Evaluates and copies the raw element bytes out, row-major, whatever the dtype.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.nbytes()];
        // SAFETY: v is valid for nbytes bytes of writes.
        check("to_bytes", unsafe {
            sys::mlxs_array_to_data(self.as_raw(), v.as_mut_ptr().cast(), v.len())
        })?;
        Ok(v)
    }

    /// A borrowed, zero-copy view of the array's elements in host memory, row-major: evaluates
    /// the array, then checks that `T` is its dtype and that it is row-contiguous (a strided
    /// or broadcast view is refused; [`Array::to_vec`] copies those). The view lives as long as
    /// the borrow of `self`: the handle keeps the buffer alive, and MLX never writes an array's
    /// buffer in place (donation) while another handle to it exists. Meant for the CPU
    /// backend's host buffers, which CPU kernels read directly (`crate::cpu`).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if T::DTYPE != self.dtype() {
            return Err(Error::invalid(
                "as_slice",
                format!("array has dtype {}, asked for {}", self.dtype(), T::DTYPE),
            ));
        }
        let mut data: *const std::ffi::c_void = std::ptr::null();
        let mut nbytes = 0usize;
        // SAFETY: live handle; both outputs are valid for one write.
        check("as_slice", unsafe {
            sys::mlxs_array_data_view(self.as_raw(), &mut data, &mut nbytes)
        })?;
        let n = self.size();
        if nbytes != n * std::mem::size_of::<T>() {
            return Err(Error::invalid(
                "as_slice",
                format!(
                    "array holds {nbytes} bytes, {n} elements need {}",
                    n * std::mem::size_of::<T>()
                ),
            ));
        }
        if n == 0 {
            return Ok(&[]);
        }
        if data.is_null() || (data as usize) % std::mem::align_of::<T>() != 0 {
            return Err(Error::invalid(
                "as_slice",
                "the array's data pointer is null or misaligned for the element type",
            ));
        }
        // SAFETY: the shim checked the array is evaluated and row-contiguous, so `data` points
        // to `n` initialized elements of T's layout (sealed Element trait, dtype checked above),
        // aligned (checked), owned by the array's buffer, which `self` keeps alive and which
        // nothing writes while this handle exists.
        Ok(unsafe { std::slice::from_raw_parts(data.cast::<T>(), n) })
    }

    /// The single element of a one-element array. `T` must match the dtype.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::invalid(
                "item",
                format!(
                    "array of shape {:?} has {} elements, not 1",
                    self.shape(),
                    self.size()
                ),
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }
}

impl Clone for Array {
    fn clone(&self) -> Self {
        let mut out: sys::mlxs_array = std::ptr::null_mut();
        // SAFETY: live handle. This can only fail if allocating the handle fails.
        let status = unsafe { sys::mlxs_array_clone(&mut out, self.as_raw()) };
        match NonNull::new(out) {
            Some(raw) if status == 0 => Array { raw },
            _ => panic!(
                "out of memory cloning an array handle: {}",
                ffi::last_error()
            ),
        }
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: we own the handle and drop it once.
        unsafe { sys::mlxs_array_free(self.as_raw()) }
    }
}

impl std::fmt::Display for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = ffi::StringHandle::null();
        // SAFETY: live handle; on success s.0 is an owned string, freed by StringHandle.
        match check("display", unsafe {
            sys::mlxs_array_tostring(&mut s.0, self.as_raw())
        }) {
            Ok(()) => f.write_str(&s.text()),
            Err(e) => write!(f, "<array: {e}>"),
        }
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Array(shape={:?}, dtype={})", self.shape(), self.dtype())
    }
}

/// Evaluates several arrays together (one graph traversal).
pub fn eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    let v = VecHandle::from_arrays("eval", arrays)?;
    // SAFETY: live vector handle.
    check("eval", unsafe { sys::mlxs_eval(v.0) })
}

/// Starts evaluating arrays without waiting for the result.
pub fn async_eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    let v = VecHandle::from_arrays("async_eval", arrays)?;
    // SAFETY: live vector handle.
    check("async_eval", unsafe { sys::mlxs_async_eval(v.0) })
}

pub(crate) fn shape_numel(op: &'static str, shape: &[i32]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| acc.checked_mul(d))
            .ok_or_else(|| Error::invalid(op, format!("invalid shape {shape:?}")))
    })
}

/// Calls a shim function that writes one array handle, and takes ownership of it.
pub(crate) fn array_out(
    op: &'static str,
    f: impl FnOnce(*mut sys::mlxs_array) -> std::os::raw::c_int,
) -> Result<Array> {
    let mut out: sys::mlxs_array = std::ptr::null_mut();
    check(op, f(&mut out))?;
    // SAFETY: on success the shim wrote a fresh, owned, non-null handle.
    unsafe { Array::from_raw(op, out) }
}

/// An owned `mlxs_vec`, freed on drop.
pub(crate) struct VecHandle(pub(crate) sys::mlxs_vec);

impl VecHandle {
    pub(crate) fn new() -> Self {
        // SAFETY: mlxs_vec_new has no preconditions and returns an owned handle.
        VecHandle(unsafe { sys::mlxs_vec_new() })
    }

    pub(crate) fn from_arrays<'a>(
        op: &'static str,
        arrays: impl IntoIterator<Item = &'a Array>,
    ) -> Result<Self> {
        let v = Self::new();
        for a in arrays {
            // SAFETY: both handles are live.
            check(op, unsafe { sys::mlxs_vec_push(v.0, a.as_raw()) })?;
        }
        Ok(v)
    }

    /// The arrays held, as new owned handles (the vector keeps its own).
    pub(crate) fn to_arrays(&self, op: &'static str) -> Result<Vec<Array>> {
        // SAFETY: live vector handle.
        let n = unsafe { sys::mlxs_vec_size(self.0) };
        (0..n)
            .map(|i| {
                // SAFETY: live vector handle; i < size; the shim writes an owned handle.
                array_out(op, |o| unsafe { sys::mlxs_vec_get(o, self.0, i) })
            })
            .collect()
    }
}

/// Calls a shim function that writes one vector handle (a multi-output op), and returns its
/// arrays.
pub(crate) fn vec_out(
    op: &'static str,
    f: impl FnOnce(*mut sys::mlxs_vec) -> std::os::raw::c_int,
) -> Result<Vec<Array>> {
    let mut out: sys::mlxs_vec = std::ptr::null_mut();
    check(op, f(&mut out))?;
    if out.is_null() {
        return Err(Error::Mlx {
            op,
            message: "the shim returned a null vector".into(),
        });
    }
    // On success the shim wrote a fresh, owned handle; VecHandle frees it.
    VecHandle(out).to_arrays(op)
}

impl Drop for VecHandle {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { sys::mlxs_vec_free(self.0) }
    }
}
