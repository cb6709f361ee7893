//! File I/O through MLX's own loaders: safetensors (lazy, with metadata), GGUF (lazy, with
//! typed metadata) and `.npy`.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::Path;

use mlx_sys as sys;

use crate::array::{array_out, Array};
use crate::device::{raw, Stream};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::{check, value_out};

/// Tensors by name, in sorted order.
pub type ArrayMap = BTreeMap<String, Array>;
/// Metadata by key, in sorted order.
pub type StringMap = BTreeMap<String, String>;

pub(crate) fn c_path(op: &'static str, path: &Path) -> Result<CString> {
    let s = path
        .to_str()
        .ok_or_else(|| Error::invalid(op, format!("path {} is not UTF-8", path.display())))?;
    CString::new(s).map_err(|_| Error::invalid(op, format!("path {s:?} contains a NUL byte")))
}

fn c_string(op: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(op, format!("{s:?} contains a NUL byte")))
}

fn require_file(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(Error::Io {
            path: path.display().to_string(),
            message: "not a file".into(),
        }),
        Err(e) => Err(Error::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }),
    }
}

/// An owned `mlxs_map`.
pub(crate) struct MapHandle(pub(crate) sys::mlxs_map);

impl MapHandle {
    pub(crate) fn from_arrays<'a>(
        op: &'static str,
        arrays: impl IntoIterator<Item = (&'a str, &'a Array)>,
    ) -> Result<Self> {
        // SAFETY: no preconditions; owned handle.
        let m = MapHandle(unsafe { sys::mlxs_map_new() });
        for (k, a) in arrays {
            let k = c_string(op, k)?;
            // SAFETY: live handles, NUL-terminated key.
            check(op, unsafe {
                sys::mlxs_map_insert(m.0, k.as_ptr(), a.as_raw())
            })?;
        }
        Ok(m)
    }

    pub(crate) fn to_map(&self, op: &'static str) -> Result<ArrayMap> {
        // SAFETY: live handle.
        let n = unsafe { sys::mlxs_map_size(self.0) };
        let mut out = ArrayMap::new();
        for i in 0..n {
            // SAFETY: i < size: the key pointer is valid while the map is unchanged; copied.
            let key = unsafe { CStr::from_ptr(sys::mlxs_map_key(self.0, i)) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: live handle, index in range.
            let value = array_out(op, |o| unsafe { sys::mlxs_map_value(o, self.0, i) })?;
            out.insert(key, value);
        }
        Ok(out)
    }
}

impl Drop for MapHandle {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::mlxs_map_free(self.0) }
    }
}

/// An owned `mlxs_strmap`.
pub(crate) struct StrMapHandle(pub(crate) sys::mlxs_strmap);

impl StrMapHandle {
    pub(crate) fn from_map(op: &'static str, map: &StringMap) -> Result<Self> {
        // SAFETY: no preconditions; owned handle.
        let m = StrMapHandle(unsafe { sys::mlxs_strmap_new() });
        for (k, v) in map {
            let (k, v) = (c_string(op, k)?, c_string(op, v)?);
            // SAFETY: live handle, NUL-terminated strings.
            check(op, unsafe {
                sys::mlxs_strmap_insert(m.0, k.as_ptr(), v.as_ptr())
            })?;
        }
        Ok(m)
    }

    pub(crate) fn to_map(&self) -> StringMap {
        // SAFETY: live handle.
        let n = unsafe { sys::mlxs_strmap_size(self.0) };
        (0..n)
            .map(|i| {
                // SAFETY: i < size; pointers valid while the map is unchanged; copied.
                unsafe {
                    (
                        CStr::from_ptr(sys::mlxs_strmap_key(self.0, i))
                            .to_string_lossy()
                            .into_owned(),
                        CStr::from_ptr(sys::mlxs_strmap_value(self.0, i))
                            .to_string_lossy()
                            .into_owned(),
                    )
                }
            })
            .collect()
    }
}

impl Drop for StrMapHandle {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::mlxs_strmap_free(self.0) }
    }
}

/// The `model*.safetensors` files of a directory (mlx-lm's glob), sorted: the weight files
/// every loader of the project reads.
pub fn weight_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::Io {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mut files: Vec<std::path::PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Loads every tensor of a `.safetensors` file, lazily (data is read when evaluated), with
/// the file's metadata.
pub fn load_safetensors(
    path: impl AsRef<Path>,
    s: Option<&Stream>,
) -> Result<(ArrayMap, StringMap)> {
    let path = path.as_ref();
    require_file(path)?;
    safetensors_check::check(path)?;
    let p = c_path("load_safetensors", path)?;
    let mut arrays: sys::mlxs_map = std::ptr::null_mut();
    let mut meta: sys::mlxs_strmap = std::ptr::null_mut();
    // SAFETY: NUL-terminated path; owned handles out on success.
    check("load_safetensors", unsafe {
        sys::mlxs_load_safetensors(&mut arrays, &mut meta, p.as_ptr(), raw(s))
    })
    .map_err(|e| with_path(e, path))?;
    let (arrays, meta) = (MapHandle(arrays), StrMapHandle(meta));
    Ok((arrays.to_map("load_safetensors")?, meta.to_map()))
}

/// Writes tensors and metadata to a `.safetensors` file. The file is written beside the
/// target and renamed into place, so a failure never leaves a half-written file behind
/// (see [`crate::partial`]: partials of killed writers are removed here, and an interrupt
/// removes this one once `partial::cleanup_on_interrupt` was called).
pub fn save_safetensors<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (&'a str, &'a Array)>,
    metadata: &StringMap,
) -> Result<()> {
    let path = path.as_ref();
    let m = MapHandle::from_arrays("save_safetensors", arrays)?;
    let meta = StrMapHandle::from_map("save_safetensors", metadata)?;
    // MLX appends ".safetensors" to names without it, so the temporary keeps the suffix.
    crate::partial::remove_stale_partials(path);
    let tmp = crate::partial::PartialGuard::new(path, ".safetensors");
    let p = c_path("save_safetensors", tmp.path())?;
    // SAFETY: live handles, NUL-terminated path.
    check("save_safetensors", unsafe {
        sys::mlxs_save_safetensors(p.as_ptr(), m.0, meta.0)
    })
    .map_err(|e| with_path(e, path))?;
    tmp.commit(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Loads a `.npy` file.
pub fn load_npy(path: impl AsRef<Path>, s: Option<&Stream>) -> Result<Array> {
    let path = path.as_ref();
    require_file(path)?;
    let p = c_path("load_npy", path)?;
    // SAFETY: NUL-terminated path.
    array_out("load_npy", |o| unsafe {
        sys::mlxs_load_npy(o, p.as_ptr(), raw(s))
    })
    .map_err(|e| with_path(e, path))
}

/// Saves one array as `.npy`.
pub fn save_npy(path: impl AsRef<Path>, a: &Array) -> Result<()> {
    let path = path.as_ref();
    let p = c_path("save_npy", path)?;
    // SAFETY: live handle, NUL-terminated path.
    check("save_npy", unsafe {
        sys::mlxs_save_npy(p.as_ptr(), a.as_raw())
    })
    .map_err(|e| with_path(e, path))
}

/// Adds the path to an MLX error that may not name it.
fn with_path(e: Error, path: &Path) -> Error {
    match e {
        Error::Mlx { op, message } if !message.contains(&*path.to_string_lossy()) => Error::Mlx {
            op,
            message: format!("{message} (file {})", path.display()),
        },
        other => other,
    }
}

// ---------------------------------------------------------------------------------------
// GGUF
// ---------------------------------------------------------------------------------------

/// A GGUF metadata value as MLX loads it.
#[derive(Debug, Clone)]
pub enum GgufValue {
    /// A value MLX does not represent.
    None,
    /// Numbers and booleans: a scalar is a 0-d array (its GGUF type gives the dtype, e.g.
    /// `uint32`), a number list a 1-d array.
    Array(Array),
    /// A string.
    String(String),
    /// A list of strings (e.g. `tokenizer.ggml.tokens`).
    Strings(Vec<String>),
}

impl GgufValue {
    fn kind(&self) -> &'static str {
        match self {
            GgufValue::None => "none",
            GgufValue::Array(_) => "an array",
            GgufValue::String(_) => "a string",
            GgufValue::Strings(_) => "a string list",
        }
    }
}

/// GGUF metadata by key, with typed getters. The getters fail with a message naming the key
/// when it is missing or holds another kind of value; [`GgufMetadata::get`] is the
/// non-failing lookup for optional keys.
#[derive(Debug, Clone, Default)]
pub struct GgufMetadata {
    values: BTreeMap<String, GgufValue>,
}

impl GgufMetadata {
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.values.get(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// Inserts or replaces a value.
    pub fn insert(&mut self, key: impl Into<String>, value: GgufValue) {
        self.values.insert(key.into(), value);
    }

    /// Takes `key`'s value out, if present.
    pub fn remove(&mut self, key: &str) -> Option<GgufValue> {
        self.values.remove(key)
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Keys and values in sorted key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &GgufValue)> {
        self.values.iter()
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.values.keys()
    }

    /// The underlying map.
    pub fn into_inner(self) -> BTreeMap<String, GgufValue> {
        self.values
    }

    fn need(&self, key: &str) -> Result<&GgufValue> {
        self.values
            .get(key)
            .ok_or_else(|| Error::invalid("gguf_metadata", format!("no key {key:?}")))
    }

    fn wrong(key: &str, want: &str, got: &GgufValue) -> Error {
        Error::invalid(
            "gguf_metadata",
            format!("{key:?} is {}, not {want}", got.kind()),
        )
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.need(key)? {
            GgufValue::String(s) => Ok(s),
            other => Err(Self::wrong(key, "a string", other)),
        }
    }

    /// A string-list value.
    pub fn get_strings(&self, key: &str) -> Result<&[String]> {
        match self.need(key)? {
            GgufValue::Strings(v) => Ok(v),
            other => Err(Self::wrong(key, "a string list", other)),
        }
    }

    /// An array value (numbers or booleans, any shape).
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        match self.need(key)? {
            GgufValue::Array(a) => Ok(a),
            other => Err(Self::wrong(key, "an array", other)),
        }
    }

    fn scalar(&self, key: &str) -> Result<&Array> {
        let a = self.get_array(key)?;
        if a.ndim() != 0 {
            return Err(Error::invalid(
                "gguf_metadata",
                format!("{key:?} is an array of shape {:?}, not a scalar", a.shape()),
            ));
        }
        Ok(a)
    }

    fn integer(&self, key: &str) -> Result<i128> {
        let a = self.scalar(key)?;
        Ok(match a.dtype() {
            Dtype::Bool => i128::from(a.item::<bool>()?),
            Dtype::Uint8 => a.item::<u8>()?.into(),
            Dtype::Uint16 => a.item::<u16>()?.into(),
            Dtype::Uint32 => a.item::<u32>()?.into(),
            Dtype::Uint64 => a.item::<u64>()?.into(),
            Dtype::Int8 => a.item::<i8>()?.into(),
            Dtype::Int16 => a.item::<i16>()?.into(),
            Dtype::Int32 => a.item::<i32>()?.into(),
            Dtype::Int64 => a.item::<i64>()?.into(),
            d => {
                return Err(Error::invalid(
                    "gguf_metadata",
                    format!("{key:?} is a {d} scalar, not an integer"),
                ))
            }
        })
    }

    /// A non-negative integer scalar (any integer dtype).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.integer(key)?;
        u64::try_from(v)
            .map_err(|_| Error::invalid("gguf_metadata", format!("{key:?} = {v} is not a u64")))
    }

    /// An integer scalar (any integer dtype) that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        let v = self.integer(key)?;
        i64::try_from(v)
            .map_err(|_| Error::invalid("gguf_metadata", format!("{key:?} = {v} is not an i64")))
    }

    /// A floating-point scalar as `f32` (MLX loads GGUF floats as `float32`).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let a = self.scalar(key)?;
        match a.dtype() {
            Dtype::Float32 => a.item::<f32>(),
            Dtype::Float16 => Ok(a.item::<half::f16>()?.to_f32()),
            Dtype::Bfloat16 => Ok(a.item::<half::bf16>()?.to_f32()),
            d => Err(Error::invalid(
                "gguf_metadata",
                format!("{key:?} is a {d} scalar, not a float"),
            )),
        }
    }

    /// A boolean scalar.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let a = self.scalar(key)?;
        match a.dtype() {
            Dtype::Bool => a.item::<bool>(),
            d => Err(Error::invalid(
                "gguf_metadata",
                format!("{key:?} is a {d} scalar, not a bool"),
            )),
        }
    }
}

impl<'a> IntoIterator for &'a GgufMetadata {
    type Item = (&'a String, &'a GgufValue);
    type IntoIter = std::collections::btree_map::Iter<'a, String, GgufValue>;
    fn into_iter(self) -> Self::IntoIter {
        self.values.iter()
    }
}

impl FromIterator<(String, GgufValue)> for GgufMetadata {
    fn from_iter<T: IntoIterator<Item = (String, GgufValue)>>(iter: T) -> Self {
        GgufMetadata {
            values: iter.into_iter().collect(),
        }
    }
}

/// An owned `mlxs_gguf_meta`.
struct GgufMetaHandle(sys::mlxs_gguf_meta);

impl Drop for GgufMetaHandle {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::mlxs_gguf_meta_free(self.0) }
    }
}

/// Copies `len` bytes at `data` into a `String` (GGUF strings are UTF-8; invalid bytes are
/// replaced with U+FFFD).
///
/// # Safety
/// `data` must be valid for reads of `len` bytes (or `len` is 0).
unsafe fn gguf_string(data: *const std::os::raw::c_char, len: usize) -> String {
    if len == 0 || data.is_null() {
        return String::new();
    }
    // SAFETY: per the contract.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

impl GgufMetaHandle {
    fn new() -> Self {
        // SAFETY: no preconditions; owned handle.
        GgufMetaHandle(unsafe { sys::mlxs_gguf_meta_new() })
    }

    fn to_metadata(&self, op: &'static str) -> Result<GgufMetadata> {
        let m = self.0;
        // SAFETY: live handle.
        let n = unsafe { sys::mlxs_gguf_meta_size(m) };
        let mut out = BTreeMap::new();
        for i in 0..n {
            // SAFETY: i < size: the key pointer is valid while the map is unchanged; copied.
            let key = unsafe { CStr::from_ptr(sys::mlxs_gguf_meta_key(m, i)) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: live handle, index in range.
            let kind = unsafe { sys::mlxs_gguf_meta_kind(m, i) };
            let value = match kind {
                sys::mlxs_gguf_kind_MLXS_GGUF_ARRAY => GgufValue::Array(array_out(op, |o| {
                    // SAFETY: live handle, index in range, kind checked.
                    unsafe { sys::mlxs_gguf_meta_array(o, m, i) }
                })?),
                sys::mlxs_gguf_kind_MLXS_GGUF_STRING => {
                    let (mut data, mut len) = (std::ptr::null(), 0usize);
                    // SAFETY: live handle, index in range, kind checked; out pointers valid.
                    check(op, unsafe {
                        sys::mlxs_gguf_meta_string(&mut data, &mut len, m, i)
                    })?;
                    // SAFETY: the shim returned len readable bytes, valid while m lives.
                    GgufValue::String(unsafe { gguf_string(data, len) })
                }
                sys::mlxs_gguf_kind_MLXS_GGUF_STRINGS => {
                    // SAFETY: live handle, index in range, kind checked.
                    let count =
                        value_out(op, |o| unsafe { sys::mlxs_gguf_meta_strings_len(o, m, i) })?;
                    let mut v = Vec::with_capacity(count);
                    for j in 0..count {
                        let (mut data, mut len) = (std::ptr::null(), 0usize);
                        // SAFETY: live handle, indices in range; out pointers valid.
                        check(op, unsafe {
                            sys::mlxs_gguf_meta_strings_get(&mut data, &mut len, m, i, j)
                        })?;
                        // SAFETY: the shim returned len readable bytes, valid while m lives.
                        v.push(unsafe { gguf_string(data, len) });
                    }
                    GgufValue::Strings(v)
                }
                _ => GgufValue::None,
            };
            out.insert(key, value);
        }
        Ok(GgufMetadata { values: out })
    }

    fn from_metadata(op: &'static str, meta: &GgufMetadata) -> Result<Self> {
        let h = GgufMetaHandle::new();
        for (k, v) in meta {
            let key = c_string(op, k)?;
            let status = match v {
                // SAFETY: live handle, NUL-terminated key.
                GgufValue::None => unsafe { sys::mlxs_gguf_meta_insert_none(h.0, key.as_ptr()) },
                // SAFETY: live handles, NUL-terminated key.
                GgufValue::Array(a) => unsafe {
                    sys::mlxs_gguf_meta_insert_array(h.0, key.as_ptr(), a.as_raw())
                },
                // SAFETY: the string's bytes are valid for its length; copied by the shim.
                GgufValue::String(s) => unsafe {
                    sys::mlxs_gguf_meta_insert_string(h.0, key.as_ptr(), s.as_ptr().cast(), s.len())
                },
                GgufValue::Strings(list) => {
                    let ptrs: Vec<*const std::os::raw::c_char> =
                        list.iter().map(|s| s.as_ptr().cast()).collect();
                    let lens: Vec<usize> = list.iter().map(String::len).collect();
                    // SAFETY: ptrs[j] is valid for lens[j] bytes; both vectors hold n items;
                    // the shim copies them.
                    unsafe {
                        sys::mlxs_gguf_meta_insert_strings(
                            h.0,
                            key.as_ptr(),
                            ptrs.as_ptr(),
                            lens.as_ptr(),
                            list.len(),
                        )
                    }
                }
            };
            check(op, status)?;
        }
        Ok(h)
    }
}

/// Loads every tensor of a `.gguf` file (lazily) and its metadata, as `mx.load(path,
/// return_metadata=True)` does.
///
/// Tensor names are the file's. `Q4_0`, `Q4_1` and `Q8_0` tensors come back as MLX affine
/// quantized triples with group size 32 (bits 4 or 8): `<prefix>.weight` (`uint32`),
/// `<prefix>.scales` and `<prefix>.biases` (`float16`), where `<prefix>` is the name without
/// `.weight`; `F32`/`F16` tensors keep their dtype; other quantized types are dequantized to
/// `float16`.
///
/// Before MLX reads the file, its header is checked here, so that files that would crash
/// MLX 0.32.4's GGUF reader are errors instead: a `FLOAT64` metadata value in a file with
/// tensors, and tensors of more than 8 dimensions. A missing, truncated or malformed file is
/// an error naming the file.
pub fn load_gguf(path: impl AsRef<Path>, s: Option<&Stream>) -> Result<(ArrayMap, GgufMetadata)> {
    let op = "load_gguf";
    let path = path.as_ref();
    require_file(path)?;
    gguf_check::check(path)?;
    let p = c_path(op, path)?;
    let mut arrays: sys::mlxs_map = std::ptr::null_mut();
    let mut meta: sys::mlxs_gguf_meta = std::ptr::null_mut();
    // SAFETY: NUL-terminated path; owned handles out on success.
    check(op, unsafe {
        sys::mlxs_load_gguf(&mut arrays, &mut meta, p.as_ptr(), raw(s))
    })
    .map_err(|e| with_path(e, path))?;
    let (arrays, meta) = (MapHandle(arrays), GgufMetaHandle(meta));
    Ok((arrays.to_map(op)?, meta.to_metadata(op)?))
}

/// Writes tensors and metadata to a `.gguf` file (MLX's writer: float and integer tensors
/// only, no quantized GGUF types). Written beside the target and renamed into place.
pub fn save_gguf<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (&'a str, &'a Array)>,
    metadata: &GgufMetadata,
) -> Result<()> {
    let op = "save_gguf";
    let path = path.as_ref();
    let m = MapHandle::from_arrays(op, arrays)?;
    let meta = GgufMetaHandle::from_metadata(op, metadata)?;
    // MLX appends ".gguf" to names without it, so the temporary keeps the suffix.
    crate::partial::remove_stale_partials(path);
    let tmp = crate::partial::PartialGuard::new(path, ".gguf");
    let p = c_path(op, tmp.path())?;
    // SAFETY: live handles, NUL-terminated path.
    check(op, unsafe { sys::mlxs_save_gguf(p.as_ptr(), m.0, meta.0) })
        .map_err(|e| with_path(e, path))?;
    tmp.commit(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Why a GGUF or safetensors header is refused before MLX reads the file (see
/// [`check_gguf_header`], [`check_safetensors_header`]). The loaders wrap it with the file's
/// path.
#[derive(Debug)]
pub enum HeaderError {
    /// The bytes could not be read (the reader's own error).
    Read(std::io::Error),
    /// The header breaks the format: the message names the field (metadata key, tensor, its
    /// `dtype`/`shape`/`data_offsets`, an entry) and the problem.
    Format(String),
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Read(e) => e.fmt(f),
            HeaderError::Format(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for HeaderError {}

impl From<std::io::Error> for HeaderError {
    fn from(e: std::io::Error) -> Self {
        HeaderError::Read(e)
    }
}

/// A [`HeaderError::Format`] of `format!`'s arguments.
macro_rules! bad {
    ($($t:tt)*) => {
        HeaderError::Format(format!($($t)*))
    };
}

/// Checks the header of GGUF data (`len` bytes read from `r`), without MLX: what
/// [`load_gguf`] runs before MLX sees a file. The message names the field and the problem.
pub fn check_gguf_header<R: std::io::Read + std::io::Seek>(
    r: R,
    len: u64,
) -> std::result::Result<(), HeaderError> {
    let mut r = gguf_check::Reader {
        r: std::io::BufReader::with_capacity(1 << 16, r),
        pos: 0,
        len,
    };
    gguf_check::scan(&mut r)
}

/// One tensor of a GGUF file as its header describes it (validated by [`read_gguf_header`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGUF's dimension order: `dims[0]` varies fastest (the reverse of a row-major shape).
    pub dims: Vec<u64>,
    /// The GGML type id (`0` = F32, `1` = F16, `8` = Q8_0, `12` = Q4_K, ...).
    pub ggml_type: u32,
    /// The GGML type's name (`"Q4_K"`).
    pub type_name: &'static str,
    /// Where the tensor's bytes start, from the beginning of the file.
    pub offset: u64,
    /// How many bytes it has.
    pub bytes: u64,
}

/// A GGUF file's header read in Rust, without MLX: its metadata (the values MLX's loader
/// gives: numbers and booleans as 0-d or 1-d arrays of their GGUF type, strings, string lists)
/// and its tensors in file order, every offset and size checked against the file as
/// [`check_gguf_header`] checks them. For readers of tensor types MLX cannot load.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    pub metadata: GgufMetadata,
    pub tensors: Vec<GgufTensorInfo>,
}

/// Reads and validates the header of the GGUF file at `path` (see [`GgufHeader`]); errors
/// name the file, the field and the problem.
pub fn read_gguf_header(path: impl AsRef<Path>) -> Result<GgufHeader> {
    let path = path.as_ref();
    require_file(path)?;
    let io_err = |message: String| Error::Io {
        path: path.display().to_string(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| io_err(e.to_string()))?;
    let len = file.metadata().map_err(|e| io_err(e.to_string()))?.len();
    let mut r = gguf_check::Reader {
        r: std::io::BufReader::with_capacity(1 << 16, file),
        pos: 0,
        len,
    };
    let mut values = BTreeMap::new();
    let tensors = gguf_check::scan_collect(&mut r, Some(&mut values)).map_err(|m| {
        Error::InvalidArgument {
            op: "read_gguf_header",
            message: format!("{}: {m}", path.display()),
        }
    })?;
    Ok(GgufHeader {
        metadata: GgufMetadata { values },
        tensors,
    })
}

/// `(name, elements per block, bytes per block)` of GGML tensor type `t`, for the types
/// MLX's GGUF reader knows and those only [`read_gguf_header`] accepts (MXFP4); `None` for
/// others.
pub fn ggml_type_info(t: u32) -> Option<(&'static str, u64, u64)> {
    gguf_check::tensor_type(t).or_else(|| gguf_check::rust_only_tensor_type(t))
}

/// A reading pass over a GGUF header (metadata and tensor infos, not the data) that rejects
/// what MLX 0.32.4's reader cannot survive or would load wrongly: versions other than 2 and
/// 3, unknown metadata or tensor types (gguflib stops listing tensors at the first unknown
/// type, so every later tensor would silently be missing), duplicate tensor names, shapes
/// MLX cannot represent, data offsets that are misaligned, overlap or run past the file.
mod gguf_check {
    use std::collections::{BTreeMap, BTreeSet};
    use std::fs::File;
    use std::io::{BufReader, Read, Seek};
    use std::path::Path;

    use super::{GgufTensorInfo, GgufValue, HeaderError};
    use crate::array::Array;
    use crate::error::{Error, Result};

    const UINT32: u32 = 4;
    const STRING: u32 = 8;
    const ARRAY: u32 = 9;
    const FLOAT64: u32 = 12;
    /// GGUF_TENSOR_MAX_DIM of the gguflib that MLX vendors (it asserts, aborting the process).
    const MAX_DIMS: u32 = 8;
    const DEFAULT_ALIGNMENT: u64 = 32;

    pub(super) struct Reader<R> {
        pub(super) r: BufReader<R>,
        pub(super) pos: u64,
        pub(super) len: u64,
    }

    impl<R: Read + Seek> Reader<R> {
        fn need(&self, n: u64, what: &str) -> std::result::Result<(), HeaderError> {
            if self.pos.checked_add(n).is_none_or(|end| end > self.len) {
                Err(bad!(
                    "{what} at byte {} extends past the end of the file ({} bytes); \
                     truncated or corrupt?",
                    self.pos,
                    self.len
                ))
            } else {
                Ok(())
            }
        }
        fn bytes<const N: usize>(
            &mut self,
            what: &str,
        ) -> std::result::Result<[u8; N], HeaderError> {
            self.need(N as u64, what)?;
            let mut b = [0u8; N];
            self.r.read_exact(&mut b)?;
            self.pos += N as u64;
            Ok(b)
        }
        fn u32(&mut self, what: &str) -> std::result::Result<u32, HeaderError> {
            Ok(u32::from_le_bytes(self.bytes::<4>(what)?))
        }
        fn u64(&mut self, what: &str) -> std::result::Result<u64, HeaderError> {
            Ok(u64::from_le_bytes(self.bytes::<8>(what)?))
        }
        fn skip(&mut self, n: u64, what: &str) -> std::result::Result<(), HeaderError> {
            self.need(n, what)?;
            let off = i64::try_from(n).map_err(|_| bad!("{what}: size {n} too large"))?;
            self.r.seek_relative(off)?;
            self.pos += n;
            Ok(())
        }
        /// A length-prefixed string, which must be UTF-8 (GGUF's rule; MLX would hand the bytes
        /// on as they are and Python's loader refuses them).
        fn string(&mut self, what: &str) -> std::result::Result<String, HeaderError> {
            self.string_or(|| what.to_string())
        }
        /// [`Reader::string`] where `what` is only built for an error (a vocabulary has
        /// hundreds of thousands of entries).
        fn string_or(
            &mut self,
            what: impl Fn() -> String,
        ) -> std::result::Result<String, HeaderError> {
            let at = self.pos;
            let n = self.u64(&what())?;
            self.need(n, &what())?;
            let n = usize::try_from(n).map_err(|_| bad!("{}: length {n} too large", what()))?;
            let mut b = vec![0u8; n];
            self.r.read_exact(&mut b)?;
            self.pos += n as u64;
            String::from_utf8(b).map_err(|e| not_utf8(&what(), at, e.utf8_error().valid_up_to()))
        }
        /// Skips a length-prefixed string, checking that it is UTF-8 without holding it.
        fn skip_string(
            &mut self,
            what: impl Fn() -> String,
        ) -> std::result::Result<(), HeaderError> {
            let at = self.pos;
            let n = self.u64(&what())?;
            self.need(n, &what())?;
            let mut buf = vec![0u8; (n as usize).min(1 << 16)];
            // Bytes of a character split across two reads, carried to the next.
            let mut carry = 0usize;
            let mut left = n;
            let mut done = 0u64;
            while left > 0 {
                let k = (buf.len() - carry).min(left as usize);
                self.r.read_exact(&mut buf[carry..carry + k])?;
                self.pos += k as u64;
                left -= k as u64;
                let chunk = &buf[..carry + k];
                match std::str::from_utf8(chunk) {
                    Ok(_) => carry = 0,
                    Err(e) if e.error_len().is_none() && left > 0 => {
                        let valid = e.valid_up_to();
                        done += valid as u64;
                        carry = chunk.len() - valid;
                        buf.copy_within(valid..valid + carry, 0);
                        continue;
                    }
                    Err(e) => {
                        return Err(not_utf8(
                            &what(),
                            at,
                            (done + e.valid_up_to() as u64) as usize,
                        ))
                    }
                }
                done += chunk.len() as u64;
            }
            Ok(())
        }
    }

    fn not_utf8(what: &str, at: u64, valid: usize) -> HeaderError {
        bad!(
            "{what} (the string at byte {at} of the file) is not valid UTF-8 (from its byte \
             {valid} on)"
        )
    }

    fn scalar_size(t: u32) -> Option<u64> {
        Some(match t {
            0 | 1 | 7 => 1, // u8, i8, bool
            2 | 3 => 2,     // u16, i16
            4..=6 => 4,     // u32, i32, f32
            10..=12 => 8,   // u64, i64, f64
            _ => return None,
        })
    }

    /// `(name, elements per block, bytes per block)` of the GGML tensor types gguflib knows.
    pub(super) fn tensor_type(t: u32) -> Option<(&'static str, u64, u64)> {
        Some(match t {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 36),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            30 => ("BF16", 1, 2),
            _ => return None,
        })
    }

    /// `(name, elements per block, bytes per block)` of the GGML tensor types that MLX's
    /// gguflib does not know but [`super::read_gguf_header`] reads (the tensors are then
    /// dequantized in Rust, never handed to MLX): MXFP4 (gpt-oss's experts).
    pub(super) fn rust_only_tensor_type(t: u32) -> Option<(&'static str, u64, u64)> {
        Some(match t {
            39 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }

    pub(super) fn scan<R: Read + Seek>(r: &mut Reader<R>) -> std::result::Result<(), HeaderError> {
        scan_collect(r, None).map(|_| ())
    }

    /// A metadata value as MLX's loader gives it: numbers and booleans as arrays of their
    /// GGUF type (0-d for a scalar, 1-d for a list), strings, string lists.
    fn read_value<R: Read + Seek>(
        r: &mut Reader<R>,
        t: u32,
        what: &str,
    ) -> std::result::Result<GgufValue, HeaderError> {
        if t == STRING {
            return Ok(GgufValue::String(r.string(what)?));
        }
        let (et, count, scalar) = if t == ARRAY {
            let et = r.u32(what)?;
            (et, r.u64(what)?, false)
        } else {
            (t, 1, true)
        };
        if et == STRING {
            let mut v = Vec::new();
            for j in 0..count {
                v.push(r.string_or(|| format!("{what}, entry {j},"))?);
            }
            return Ok(GgufValue::Strings(v));
        }
        if et == ARRAY {
            return Err(bad!("{what} is a nested array, which MLX does not load"));
        }
        let size = scalar_size(et).ok_or_else(|| bad!("{what} has unknown type {et}"))?;
        let total = size
            .checked_mul(count)
            .ok_or_else(|| bad!("{what}: {count} elements is too many"))?;
        r.need(total, what)?;
        let n = usize::try_from(count).map_err(|_| bad!("{what}: too many elements"))?;
        let mut b = vec![0u8; n * size as usize];
        r.r.read_exact(&mut b)?;
        r.pos += total;
        let shape: Vec<i32> = if scalar {
            Vec::new()
        } else {
            vec![i32::try_from(n).map_err(|_| bad!("{what}: too many elements"))?]
        };
        macro_rules! numbers {
            ($t:ty) => {{
                let v: Vec<$t> = b
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                    .collect();
                Array::from_slice(&v, &shape)
            }};
        }
        let a = match et {
            0 => numbers!(u8),
            1 => numbers!(i8),
            2 => numbers!(u16),
            3 => numbers!(i16),
            4 => numbers!(u32),
            5 => numbers!(i32),
            6 => numbers!(f32),
            7 => Array::from_slice(&b.iter().map(|&x| x != 0).collect::<Vec<_>>(), &shape),
            10 => numbers!(u64),
            11 => numbers!(i64),
            _ => numbers!(f64),
        };
        a.map(GgufValue::Array).map_err(|e| bad!("{what}: {e}"))
    }

    /// [`scan`], also collecting the metadata values into `values` when given; returns the
    /// tensor infos in file order with absolute offsets.
    pub(super) fn scan_collect<R: Read + Seek>(
        r: &mut Reader<R>,
        mut values: Option<&mut BTreeMap<String, GgufValue>>,
    ) -> std::result::Result<Vec<GgufTensorInfo>, HeaderError> {
        if &r.bytes::<4>("the magic number")? != b"GGUF" {
            return Err(bad!("not a GGUF file (no GGUF magic number)"));
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(bad!(
                "GGUF version {version} is not supported (expected 2 or 3)"
            ));
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        let mut alignment = DEFAULT_ALIGNMENT;
        for _ in 0..n_kv {
            let key = r.string("a metadata key")?;
            let t = r.u32("a metadata type")?;
            let what = format!("metadata value {key:?}");
            if t == FLOAT64 && n_tensors > 0 {
                return Err(bad!(
                    "metadata value {key:?} is a FLOAT64, which MLX 0.32.4's GGUF reader \
                     cannot skip in a file with tensors (it would crash)"
                ));
            }
            if key == "general.alignment" {
                if t != UINT32 {
                    return Err(bad!(
                        "{what} must be a UINT32 (type {UINT32}), not type {t}"
                    ));
                }
                let a = u64::from(r.u32(&what)?);
                if a == 0 || !a.is_power_of_two() {
                    return Err(bad!("{what} is {a}, not a power of two"));
                }
                alignment = a;
                if let Some(v) = values.as_deref_mut() {
                    let a = Array::from_slice(&[a as u32], &[]).map_err(|e| bad!("{e}"))?;
                    v.insert(key, GgufValue::Array(a));
                }
            } else if let Some(v) = values.as_deref_mut() {
                let value = read_value(r, t, &what)?;
                v.insert(key, value);
            } else if t == STRING {
                r.skip_string(|| what.clone())?;
            } else if t == ARRAY {
                let et = r.u32(&what)?;
                let count = r.u64(&what)?;
                if et == FLOAT64 {
                    return Err(bad!(
                        "metadata value {key:?} is a FLOAT64 array, which MLX 0.32.4's GGUF \
                         reader cannot read (it would crash)"
                    ));
                }
                if et == STRING {
                    for j in 0..count {
                        r.skip_string(|| format!("{what}, entry {j},"))?;
                    }
                } else if et == ARRAY {
                    return Err(bad!(
                        "metadata value {key:?} is a nested array, which MLX does not load"
                    ));
                } else {
                    let size = scalar_size(et)
                        .ok_or_else(|| bad!("{what} has unknown element type {et}"))?;
                    let total = size
                        .checked_mul(count)
                        .ok_or_else(|| bad!("{what}: {count} elements is too many"))?;
                    r.skip(total, &what)?;
                }
            } else {
                let size = scalar_size(t).ok_or_else(|| bad!("{what} has unknown type {t}"))?;
                r.skip(size, &what)?;
            }
        }
        let mut names = BTreeSet::new();
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string("a tensor name")?;
            let what = format!("tensor {name:?}");
            let ndim = r.u32(&what)?;
            if ndim > MAX_DIMS {
                return Err(bad!(
                    "tensor {name:?} has {ndim} dimensions; MLX's GGUF reader supports at most \
                     {MAX_DIMS}"
                ));
            }
            let mut dims = Vec::with_capacity(ndim as usize);
            for _ in 0..ndim {
                dims.push(r.u64(&what)?);
            }
            let t = r.u32(&what)?;
            let offset = r.u64(&what)?;
            // Types only Rust reads pass only where Rust reads the file (`values` collected).
            let rust_only = rust_only_tensor_type(t).filter(|_| values.is_some());
            let (type_name, block, block_bytes) = match (tensor_type(t), rust_only) {
                (Some(info), _) | (None, Some(info)) => info,
                (None, None) => {
                    return Err(match rust_only_tensor_type(t) {
                        Some((n, _, _)) => bad!(
                            "tensor {name:?} has GGML type {n} ({t}), which MLX's GGUF reader \
                             cannot load"
                        ),
                        None => bad!("tensor {name:?} has unknown GGML type {t}"),
                    })
                }
            };
            if let Some(d) = dims.iter().find(|&&d| d > i32::MAX as u64) {
                return Err(bad!(
                    "tensor {name:?} has dimension {d}, past MLX's limit of {}",
                    i32::MAX
                ));
            }
            let elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| bad!("tensor {name:?} has too many elements ({dims:?})"))?;
            if dims.first().is_some_and(|d0| d0 % block != 0) {
                return Err(bad!(
                    "tensor {name:?}: a {type_name} tensor's first dimension must be a multiple \
                     of {block}, got {dims:?}"
                ));
            }
            let bytes = (elements / block)
                .checked_mul(block_bytes)
                .ok_or_else(|| bad!("tensor {name:?} is too large"))?;
            if !names.insert(name.clone()) {
                return Err(bad!("tensor {name:?} appears more than once"));
            }
            infos.push(GgufTensorInfo {
                name,
                dims,
                ggml_type: t,
                type_name,
                offset,
                bytes,
            });
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let data_len = r.len.saturating_sub(data_start);
        let mut sorted: Vec<&GgufTensorInfo> = infos.iter().collect();
        sorted.sort_by_key(|t| t.offset);
        let mut end_of_previous: Option<(u64, &str)> = None;
        for t in sorted {
            if t.offset % alignment != 0 {
                return Err(bad!(
                    "tensor {:?}: data offset {} is not a multiple of the alignment {alignment}",
                    t.name,
                    t.offset
                ));
            }
            let end =
                t.offset
                    .checked_add(t.bytes)
                    .filter(|&e| e <= data_len)
                    .ok_or_else(|| {
                        bad!(
                        "tensor {:?}: its {} bytes at data offset {} run past the end of the file \
                     (the data section holds {data_len} bytes); truncated or corrupt?",
                        t.name, t.bytes, t.offset
                    )
                    })?;
            if let Some((prev_end, prev)) = end_of_previous {
                if t.offset < prev_end {
                    return Err(bad!(
                        "tensors {prev:?} and {:?} share bytes (data offset {} is before the \
                         end of the previous tensor at {prev_end})",
                        t.name,
                        t.offset
                    ));
                }
            }
            end_of_previous = Some((end, &t.name));
        }
        for t in &mut infos {
            t.offset += data_start;
        }
        Ok(infos)
    }

    pub(super) fn check(path: &Path) -> Result<()> {
        let io_err = |message: String| Error::Io {
            path: path.display().to_string(),
            message,
        };
        let file = File::open(path).map_err(|e| io_err(e.to_string()))?;
        let len = file.metadata().map_err(|e| io_err(e.to_string()))?.len();
        super::check_gguf_header(file, len).map_err(|m| Error::InvalidArgument {
            op: "load_gguf",
            message: format!("{}: {m}", path.display()),
        })
    }
}

/// Checks the header of safetensors data (`len` bytes read from `r`), without MLX: what
/// [`load_safetensors`] runs before MLX sees a file. The message names the tensor, the field
/// and the problem.
pub fn check_safetensors_header<R: std::io::Read>(
    r: R,
    len: u64,
) -> std::result::Result<(), HeaderError> {
    safetensors_check::scan(r, len)
}

/// The safetensors header rules MLX 0.32.4 does not enforce itself: dimensions past 2^31 - 1
/// (MLX keeps 32-bit dimensions and would truncate them), byte ranges that disagree with the
/// shape and dtype, that run past the file, or that two tensors share; unknown dtypes; a
/// header larger than the file or than the format's 100 MB limit.
mod safetensors_check {
    use std::fs::File;
    use std::io::Read;
    use std::path::Path;

    use super::HeaderError;

    use serde_json::Value;

    use crate::error::{Error, Result};

    /// The safetensors format's limit on the JSON header.
    const MAX_HEADER: u64 = 100_000_000;

    fn dtype_size(d: &str) -> Option<u64> {
        Some(match d {
            "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
            "U16" | "I16" | "F16" | "BF16" => 2,
            "U32" | "I32" | "F32" => 4,
            "U64" | "I64" | "F64" | "C64" => 8,
            _ => return None,
        })
    }

    pub(super) fn scan<R: Read>(mut r: R, len: u64) -> std::result::Result<(), HeaderError> {
        let mut n = [0u8; 8];
        if len < 8 {
            return Err(bad!(
                "{len} bytes is too short for a safetensors file (no header length)"
            ));
        }
        r.read_exact(&mut n)?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER || n > len - 8 {
            return Err(bad!(
                "header length {n} is larger than the file ({len} bytes) or the format's \
                 limit of {MAX_HEADER} bytes; truncated or not a safetensors file?"
            ));
        }
        let mut header = vec![0u8; n as usize];
        r.read_exact(&mut header)?;
        let header: Value = serde_json::from_slice(&header)
            .map_err(|e| bad!("the header is not valid JSON: {e}"))?;
        let obj = header
            .as_object()
            .ok_or_else(|| bad!("the header is not a JSON object"))?;
        let data_len = len - 8 - n;
        let mut ranges: Vec<(u64, u64, &str)> = Vec::with_capacity(obj.len());
        for (name, info) in obj {
            if name == "__metadata__" {
                // MLX writes `null` when there is no metadata.
                let ok = info.is_null()
                    || info
                        .as_object()
                        .is_some_and(|m| m.values().all(Value::is_string));
                if !ok {
                    return Err(bad!(
                        "`__metadata__` must map strings to strings (or be null)"
                    ));
                }
                continue;
            }
            let field = |f: &str| {
                info.get(f)
                    .ok_or_else(|| bad!("tensor {name:?} has no `{f}`"))
            };
            let dtype = field("dtype")?
                .as_str()
                .ok_or_else(|| bad!("tensor {name:?}: `dtype` is not a string"))?;
            let size = dtype_size(dtype)
                .ok_or_else(|| bad!("tensor {name:?}: unknown `dtype` {dtype:?}"))?;
            let shape = field("shape")?
                .as_array()
                .ok_or_else(|| bad!("tensor {name:?}: `shape` is not a list"))?;
            let mut elements: u64 = 1;
            for d in shape {
                let d = d.as_u64().ok_or_else(|| {
                    bad!("tensor {name:?}: `shape` entry {d} is not a non-negative integer")
                })?;
                if d > i32::MAX as u64 {
                    return Err(bad!(
                        "tensor {name:?}: `shape` dimension {d} is past MLX's limit of {}",
                        i32::MAX
                    ));
                }
                elements = elements
                    .checked_mul(d)
                    .ok_or_else(|| bad!("tensor {name:?}: `shape` {shape:?} is too large"))?;
            }
            let offsets = field("data_offsets")?
                .as_array()
                .filter(|o| o.len() == 2)
                .ok_or_else(|| bad!("tensor {name:?}: `data_offsets` is not [begin, end]"))?;
            let (Some(begin), Some(end)) = (offsets[0].as_u64(), offsets[1].as_u64()) else {
                return Err(bad!(
                    "tensor {name:?}: `data_offsets` must hold non-negative integers"
                ));
            };
            if begin > end || end > data_len {
                return Err(bad!(
                    "tensor {name:?}: `data_offsets` [{begin}, {end}] lie outside the {data_len} \
                     data bytes of the file; truncated or corrupt?"
                ));
            }
            let expected = elements
                .checked_mul(size)
                .ok_or_else(|| bad!("tensor {name:?}: `shape` {shape:?} is too large"))?;
            if end - begin != expected {
                return Err(bad!(
                    "tensor {name:?}: `data_offsets` [{begin}, {end}] span {} bytes, but a \
                     {dtype} tensor of shape {shape:?} needs {expected}",
                    end - begin
                ));
            }
            ranges.push((begin, end, name));
        }
        ranges.sort();
        for w in ranges.windows(2) {
            let ((_, prev_end, prev), (begin, _, name)) = (w[0], w[1]);
            if begin < prev_end {
                return Err(bad!(
                    "tensors {prev:?} and {name:?} share bytes (`data_offsets` overlap)"
                ));
            }
        }
        // What the format itself requires, by its reference implementation: the tensors' byte
        // ranges tile the data from its start, with no holes (checked after ours, whose
        // messages name the field).
        serde_json::from_value::<safetensors::tensor::Metadata>(header)
            .map_err(|e| bad!("the header breaks the safetensors format: {e}"))?;
        Ok(())
    }

    pub(super) fn check(path: &Path) -> Result<()> {
        let io_err = |message: String| Error::Io {
            path: path.display().to_string(),
            message,
        };
        let file = File::open(path).map_err(|e| io_err(e.to_string()))?;
        let len = file.metadata().map_err(|e| io_err(e.to_string()))?.len();
        scan(std::io::BufReader::new(file), len).map_err(|m| Error::InvalidArgument {
            op: "load_safetensors",
            message: format!("{}: {m}", path.display()),
        })
    }
}
