//! Element types: [`Dtype`] (every MLX dtype) and the Rust types that map onto them.

use mlx_sys as sys;

/// An MLX element type. The discriminants follow MLX's `Dtype::Val` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
    Complex64,
}

impl Dtype {
    /// Every dtype, in MLX's order.
    pub const ALL: [Dtype; 14] = [
        Dtype::Bool,
        Dtype::Uint8,
        Dtype::Uint16,
        Dtype::Uint32,
        Dtype::Uint64,
        Dtype::Int8,
        Dtype::Int16,
        Dtype::Int32,
        Dtype::Int64,
        Dtype::Float16,
        Dtype::Float32,
        Dtype::Float64,
        Dtype::Bfloat16,
        Dtype::Complex64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
            Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
        }
    }

    /// Real floating point (f16, bf16, f32, f64): what MLX calls `floating`.
    pub fn is_floating(self) -> bool {
        matches!(
            self,
            Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64
        )
    }

    /// Signed or unsigned integer (not bool).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            Dtype::Uint8
                | Dtype::Uint16
                | Dtype::Uint32
                | Dtype::Uint64
                | Dtype::Int8
                | Dtype::Int16
                | Dtype::Int32
                | Dtype::Int64
        )
    }

    /// The name MLX's Python binding uses (`"bfloat16"`, `"int32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Uint8 => "uint8",
            Dtype::Uint16 => "uint16",
            Dtype::Uint32 => "uint32",
            Dtype::Uint64 => "uint64",
            Dtype::Int8 => "int8",
            Dtype::Int16 => "int16",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::Float16 => "float16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Complex64 => "complex64",
        }
    }

    /// Parses the names [`Dtype::name`] gives, plus the short forms `f32`, `f16`, `bf16`.
    pub fn from_name(name: &str) -> Option<Dtype> {
        let short = match name {
            "f16" => Some(Dtype::Float16),
            "f32" => Some(Dtype::Float32),
            "f64" => Some(Dtype::Float64),
            "bf16" => Some(Dtype::Bfloat16),
            _ => None,
        };
        short.or_else(|| Dtype::ALL.into_iter().find(|d| d.name() == name))
    }

    pub(crate) fn to_sys(self) -> sys::mlxs_dtype {
        use sys::mlxs_dtype::*;
        match self {
            Dtype::Bool => MLXS_BOOL,
            Dtype::Uint8 => MLXS_UINT8,
            Dtype::Uint16 => MLXS_UINT16,
            Dtype::Uint32 => MLXS_UINT32,
            Dtype::Uint64 => MLXS_UINT64,
            Dtype::Int8 => MLXS_INT8,
            Dtype::Int16 => MLXS_INT16,
            Dtype::Int32 => MLXS_INT32,
            Dtype::Int64 => MLXS_INT64,
            Dtype::Float16 => MLXS_FLOAT16,
            Dtype::Float32 => MLXS_FLOAT32,
            Dtype::Float64 => MLXS_FLOAT64,
            Dtype::Bfloat16 => MLXS_BFLOAT16,
            Dtype::Complex64 => MLXS_COMPLEX64,
        }
    }

    pub(crate) fn from_sys(d: sys::mlxs_dtype) -> Dtype {
        use sys::mlxs_dtype::*;
        match d {
            MLXS_BOOL => Dtype::Bool,
            MLXS_UINT8 => Dtype::Uint8,
            MLXS_UINT16 => Dtype::Uint16,
            MLXS_UINT32 => Dtype::Uint32,
            MLXS_UINT64 => Dtype::Uint64,
            MLXS_INT8 => Dtype::Int8,
            MLXS_INT16 => Dtype::Int16,
            MLXS_INT32 => Dtype::Int32,
            MLXS_INT64 => Dtype::Int64,
            MLXS_FLOAT16 => Dtype::Float16,
            MLXS_FLOAT32 => Dtype::Float32,
            MLXS_FLOAT64 => Dtype::Float64,
            MLXS_BFLOAT16 => Dtype::Bfloat16,
            MLXS_COMPLEX64 => Dtype::Complex64,
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A complex number with `f32` parts, laid out as MLX's `complex64_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Complex64 {
    pub re: f32,
    pub im: f32,
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type whose values are laid out exactly like one MLX element of [`Element::DTYPE`].
///
/// Sealed: implemented for `bool`, the integer types, `half::f16`, `half::bf16`, `f32`, `f64`
/// and [`Complex64`].
pub trait Element: sealed::Sealed + Copy + Default + 'static {
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )*};
}

element!(
    bool => Bool,
    u8 => Uint8,
    u16 => Uint16,
    u32 => Uint32,
    u64 => Uint64,
    i8 => Int8,
    i16 => Int16,
    i32 => Int32,
    i64 => Int64,
    half::f16 => Float16,
    f32 => Float32,
    f64 => Float64,
    half::bf16 => Bfloat16,
    Complex64 => Complex64,
);
