//! File I/O through MLX's own loaders: safetensors (lazy, with metadata) and `.npy`.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::Path;

use mlx_sys as sys;

use crate::array::Array;
use crate::device::{raw, Stream};
use crate::error::{Error, Result};
use crate::ffi::{array_out, check};

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

/// Loads every tensor of a `.safetensors` file, lazily (data is read when evaluated), with
/// the file's metadata.
pub fn load_safetensors(
    path: impl AsRef<Path>,
    s: Option<&Stream>,
) -> Result<(ArrayMap, StringMap)> {
    let path = path.as_ref();
    require_file(path)?;
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
/// target and renamed into place, so a failure never leaves a half-written file behind.
pub fn save_safetensors<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (&'a str, &'a Array)>,
    metadata: &StringMap,
) -> Result<()> {
    let path = path.as_ref();
    let m = MapHandle::from_arrays("save_safetensors", arrays)?;
    let meta = StrMapHandle::from_map("save_safetensors", metadata)?;
    // MLX appends ".safetensors" to names without it, so the temporary keeps the suffix.
    let tmp = path.with_file_name(format!(
        ".{}.{}.partial.safetensors",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("out"),
        std::process::id()
    ));
    let p = c_path("save_safetensors", &tmp)?;
    // SAFETY: live handles, NUL-terminated path.
    let status = check("save_safetensors", unsafe {
        sys::mlxs_save_safetensors(p.as_ptr(), m.0, meta.0)
    });
    if let Err(e) = status {
        let _ = std::fs::remove_file(&tmp);
        return Err(with_path(e, path));
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::Io {
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
