//! MLX's allocator: active, peak and cache memory, limits.

use mlx_sys as sys;

use crate::error::Result;
use crate::ffi::{check, value_out};

/// Bytes held by live arrays.
pub fn active_memory() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_active_memory", |o| unsafe {
        sys::mlxs_get_active_memory(o)
    })
}

/// The most bytes held at once since start or the last [`reset_peak_memory`].
pub fn peak_memory() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_peak_memory", |o| unsafe {
        sys::mlxs_get_peak_memory(o)
    })
}

pub fn reset_peak_memory() -> Result<()> {
    // SAFETY: no arguments.
    check("reset_peak_memory", unsafe {
        sys::mlxs_reset_peak_memory()
    })
}

/// Bytes kept in MLX's buffer cache for reuse.
pub fn cache_memory() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_cache_memory", |o| unsafe {
        sys::mlxs_get_cache_memory(o)
    })
}

pub fn memory_limit() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_memory_limit", |o| unsafe {
        sys::mlxs_get_memory_limit(o)
    })
}

/// Sets the memory limit; returns the previous one.
pub fn set_memory_limit(limit: usize) -> Result<usize> {
    // SAFETY: plain values.
    value_out("set_memory_limit", |o| unsafe {
        sys::mlxs_set_memory_limit(o, limit)
    })
}

/// Sets the buffer-cache limit; returns the previous one.
pub fn set_cache_limit(limit: usize) -> Result<usize> {
    // SAFETY: plain values.
    value_out("set_cache_limit", |o| unsafe {
        sys::mlxs_set_cache_limit(o, limit)
    })
}

/// Sets the wired-memory limit (Metal only; an error elsewhere); returns the previous one.
pub fn set_wired_limit(limit: usize) -> Result<usize> {
    // SAFETY: plain values.
    value_out("set_wired_limit", |o| unsafe {
        sys::mlxs_set_wired_limit(o, limit)
    })
}

/// Frees the buffers held in the cache.
pub fn clear_cache() -> Result<()> {
    // SAFETY: no arguments.
    check("clear_cache", unsafe { sys::mlxs_clear_cache() })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    fn malloc_trim(pad: usize) -> std::os::raw::c_int;
}

/// Hands memory nobody holds back to the operating system: MLX's buffer cache
/// ([`clear_cache`]), then, with glibc, the free pages inside every `malloc` arena and the top
/// of the main one (`malloc_trim(0)`). MLX's CPU allocator is plain `malloc`, and glibc keeps
/// freed blocks below its (adaptive) mmap threshold in its arenas, so without the trim a
/// process keeps much of the peak of one large computation resident long after the arrays
/// are gone. (The free top of a thread's arena stays, up to glibc's trim threshold.) Returns
/// whether the trim released anything (always `false` without glibc).
pub fn release_free_memory() -> Result<bool> {
    clear_cache()?;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes a plain size, touches only the allocator's own state
        // under its own locks, and is safe to call from any thread at any time.
        let released = unsafe { malloc_trim(0) };
        Ok(released != 0)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        Ok(false)
    }
}
