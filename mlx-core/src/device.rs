//! Devices and streams.

use std::ptr::NonNull;

use mlx_sys as sys;

use crate::error::{Error, Result};
use crate::ffi::{check, value_out};

/// The kind of device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    Cpu,
    Gpu,
}

/// A device: a kind and an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    pub kind: DeviceType,
    pub index: i32,
}

struct DeviceHandle(sys::mlxs_device);

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::mlxs_device_free(self.0) }
    }
}

fn kind_to_sys(k: DeviceType) -> sys::mlxs_device_type {
    match k {
        DeviceType::Cpu => sys::mlxs_device_type::MLXS_CPU,
        DeviceType::Gpu => sys::mlxs_device_type::MLXS_GPU,
    }
}

impl Device {
    pub const fn cpu() -> Device {
        Device {
            kind: DeviceType::Cpu,
            index: 0,
        }
    }

    pub const fn gpu() -> Device {
        Device {
            kind: DeviceType::Gpu,
            index: 0,
        }
    }

    fn handle(self) -> Result<DeviceHandle> {
        let mut raw: sys::mlxs_device = std::ptr::null_mut();
        // SAFETY: plain values in, owned handle out.
        check("device", unsafe {
            sys::mlxs_device_new(&mut raw, kind_to_sys(self.kind), self.index)
        })?;
        Ok(DeviceHandle(raw))
    }

    /// # Safety
    /// `raw` must be a live device handle.
    unsafe fn from_handle(raw: sys::mlxs_device) -> Device {
        // SAFETY: per the contract.
        let (t, index) = unsafe {
            (
                sys::mlxs_device_get_type(raw),
                sys::mlxs_device_get_index(raw),
            )
        };
        let kind = match t {
            sys::mlxs_device_type::MLXS_GPU => DeviceType::Gpu,
            sys::mlxs_device_type::MLXS_CPU => DeviceType::Cpu,
        };
        Device { kind, index }
    }

    /// MLX's current default device (the GPU where the backend has one, else the CPU).
    pub fn default_device() -> Result<Device> {
        let mut raw: sys::mlxs_device = std::ptr::null_mut();
        // SAFETY: owned handle out.
        check("default_device", unsafe {
            sys::mlxs_default_device(&mut raw)
        })?;
        let h = DeviceHandle(raw);
        // SAFETY: live handle.
        Ok(unsafe { Device::from_handle(h.0) })
    }

    /// Makes this device the default for ops without an explicit stream.
    pub fn set_default(self) -> Result<()> {
        let h = self.handle()?;
        // SAFETY: live handle.
        check("set_default_device", unsafe {
            sys::mlxs_set_default_device(h.0)
        })
    }

    /// Whether the running backend has this device.
    pub fn is_available(self) -> Result<bool> {
        let h = self.handle()?;
        // SAFETY: live handle.
        value_out("is_available", |out| unsafe {
            sys::mlxs_device_is_available(out, h.0)
        })
    }

    /// Number of devices of a kind.
    pub fn count(kind: DeviceType) -> Result<i32> {
        // SAFETY: plain out value.
        value_out("device_count", |out| unsafe {
            sys::mlxs_device_count(out, kind_to_sys(kind))
        })
    }
}

/// A stream of work on a device. Pass `Some(&stream)` to an op to run it there.
#[derive(Debug)]
pub struct Stream {
    raw: NonNull<sys::mlxs_stream_>,
}

// SAFETY: a stream handle is a small value (index, device); MLX's default-stream streams may
// be used from any thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    fn from_out(op: &'static str, raw: sys::mlxs_stream) -> Result<Stream> {
        NonNull::new(raw)
            .map(|raw| Stream { raw })
            .ok_or_else(|| Error::Mlx {
                op,
                message: "the shim returned a null stream".into(),
            })
    }

    /// The raw handle, still owned by `self`.
    pub fn as_raw(&self) -> sys::mlxs_stream {
        self.raw.as_ptr()
    }

    /// The default stream of `device` on this thread.
    pub fn default_for(device: Device) -> Result<Stream> {
        let h = device.handle()?;
        let mut raw: sys::mlxs_stream = std::ptr::null_mut();
        // SAFETY: live device handle; owned stream out.
        check("default_stream", unsafe {
            sys::mlxs_default_stream(&mut raw, h.0)
        })?;
        Self::from_out("default_stream", raw)
    }

    /// The CPU's default stream.
    pub fn cpu() -> Result<Stream> {
        Self::default_for(Device::cpu())
    }

    /// A new stream on `device`.
    pub fn new(device: Device) -> Result<Stream> {
        let h = device.handle()?;
        let mut raw: sys::mlxs_stream = std::ptr::null_mut();
        // SAFETY: live device handle; owned stream out.
        check("new_stream", unsafe { sys::mlxs_new_stream(&mut raw, h.0) })?;
        Self::from_out("new_stream", raw)
    }

    /// The device this stream runs on.
    pub fn device(&self) -> Result<Device> {
        let mut raw: sys::mlxs_device = std::ptr::null_mut();
        // SAFETY: live handle; owned device out.
        check("stream_device", unsafe {
            sys::mlxs_stream_device(&mut raw, self.as_raw())
        })?;
        let h = DeviceHandle(raw);
        // SAFETY: live handle.
        Ok(unsafe { Device::from_handle(h.0) })
    }

    /// MLX's index of this stream.
    pub fn index(&self) -> i32 {
        // SAFETY: live handle.
        unsafe { sys::mlxs_stream_index(self.as_raw()) }
    }

    /// Makes this stream the default for its device on this thread.
    pub fn set_default(&self) -> Result<()> {
        // SAFETY: live handle.
        check("set_default_stream", unsafe {
            sys::mlxs_set_default_stream(self.as_raw())
        })
    }

    /// Waits until the work queued on this stream is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: live handle.
        check("synchronize", unsafe {
            sys::mlxs_synchronize(self.as_raw())
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::mlxs_stream_free(self.as_raw()) }
    }
}

/// Waits until the default stream's work is done.
pub fn synchronize() -> Result<()> {
    // SAFETY: null means the default stream.
    check("synchronize", unsafe {
        sys::mlxs_synchronize(std::ptr::null_mut())
    })
}

/// The raw stream for an optional stream argument (null: the default stream).
pub(crate) fn raw(s: Option<&Stream>) -> sys::mlxs_stream {
    s.map_or(std::ptr::null_mut(), Stream::as_raw)
}
