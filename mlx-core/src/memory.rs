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
