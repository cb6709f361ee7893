//! GGML tensor types dequantized to `f32` in plain Rust, bit for bit as gguf-py's
//! `gguf.quants.dequantize` (numpy, float32) computes them: the same half-to-float conversion
//! (numpy's, which keeps a signalling NaN's payload), the same products and differences in the
//! same order (`d * q`, `d * q - dm`, `x * d`, `(d * sc) * q`; no fused multiply-add).
//!
//! MLX 0.32.4's GGUF reader cannot load some types real files use (Q5_0 and Q5_1 fail in
//! `gguf_tensor_to_f16`) and turns others into `f16`; these functions read every type the
//! k-quant and legacy formats define, from the raw bytes of one tensor (the block formats
//! through mlx-core's block decoder, `cpu::kquant::dequantize_row`, which the CPU kernels'
//! embedding lookup and plain reference share). Sizes are checked first:
//! wrong lengths are errors, never panics.

use mlx_core::cpu::kquant::{dequantize_row, GgmlType};

/// The GGML type ids this module dequantizes, with their names.
pub const DEQUANTIZED_TYPES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (30, "BF16"),
    (39, "MXFP4"),
];

/// numpy's `float16 -> float32` (`npy_halfbits_to_floatbits`): exact, NaN payloads kept
/// (mlx-core's, which the block decoder reads its factors with).
pub use mlx_core::cpu::kquant::f16_to_f32;

fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Why [`dequantize`] refused a tensor (the type by its GGML name, and the sizes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DequantError {
    /// A type id GGML does not define.
    UnknownType(u32),
    /// A type not in [`DEQUANTIZED_TYPES`].
    NotDequantized(&'static str),
    /// `elements` is not a whole number of `block`-value blocks.
    PartialBlock {
        name: &'static str,
        elements: usize,
        block: usize,
    },
    /// The byte size of `elements` values overflows.
    Overflow { name: &'static str, elements: usize },
    /// `data` does not hold exactly the blocks.
    Size {
        name: &'static str,
        elements: usize,
        want: usize,
        got: usize,
    },
}

impl std::fmt::Display for DequantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DequantError::UnknownType(t) => write!(f, "unknown GGML type {t}"),
            DequantError::NotDequantized(name) => {
                write!(f, "GGML type {name} cannot be dequantized here")
            }
            DequantError::PartialBlock {
                name,
                elements,
                block,
            } => write!(
                f,
                "{elements} {name} values are not a whole number of {block}-value blocks"
            ),
            DequantError::Overflow { name, elements } => {
                write!(f, "{elements} {name} values: size overflows")
            }
            DequantError::Size {
                name,
                elements,
                want,
                got,
            } => write!(f, "{elements} {name} values need {want} bytes, got {got}"),
        }
    }
}

impl std::error::Error for DequantError {}

/// Dequantizes `data`, the bytes of a tensor of GGML type `ggml_type` holding `elements`
/// values, to `f32`. Errors (naming the type and the sizes) when the type is not one of
/// [`DEQUANTIZED_TYPES`], `elements` is not a whole number of blocks, or `data` does not hold
/// exactly those blocks.
pub fn dequantize(ggml_type: u32, data: &[u8], elements: usize) -> Result<Vec<f32>, DequantError> {
    let Some((name, block, block_bytes)) = mlx_core::io::ggml_type_info(ggml_type) else {
        return Err(DequantError::UnknownType(ggml_type));
    };
    if !DEQUANTIZED_TYPES.iter().any(|(t, _)| *t == ggml_type) {
        return Err(DequantError::NotDequantized(name));
    }
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    if elements % block != 0 {
        return Err(DequantError::PartialBlock {
            name,
            elements,
            block,
        });
    }
    let want = (elements / block)
        .checked_mul(block_bytes)
        .ok_or(DequantError::Overflow { name, elements })?;
    if data.len() != want {
        return Err(DequantError::Size {
            name,
            elements,
            want,
            got: data.len(),
        });
    }
    let mut out = vec![0f32; elements];
    let blocks = data
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block));
    match ggml_type {
        0 => blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        1 => blocks.for_each(|(b, o)| o[0] = half(b, 0)),
        30 => blocks.for_each(|(b, o)| {
            o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }),
        39 => blocks.for_each(|(b, o)| mxfp4(b, o)),
        // The block formats: mlx-core's decoder (gguf-py's formulas in its order).
        id => match GgmlType::from_id(id) {
            Some(ty) => dequantize_row(ty, data, &mut out),
            None => return Err(DequantError::NotDequantized(name)),
        },
    }
    Ok(out)
}

/// The low (`k < 16`) or high nibble of a 32-value block's packed quants.
fn nibble(qs: &[u8], j: usize) -> u8 {
    (qs[j % 16] >> (4 * (j / 16))) & 0x0f
}

/// MXFP4 (gpt-oss): an E8M0 exponent byte as half its power of two (`e8m0_to_fp32_half`),
/// then 32 E2M1 codes as doubled values, low nibbles first; `d * q`.
fn mxfp4(b: &[u8], o: &mut [f32]) {
    const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
    let e = u32::from(b[0]);
    let d = f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e - 1) << 23
    });
    for (j, v) in o.iter_mut().enumerate() {
        *v = d * f32::from(KVALUES[usize::from(nibble(&b[1..], j))]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversion_matches_numpy() {
        for (h, f) in [
            (0x3c00u16, 0x3f80_0000u32),
            (0x0001, 0x3380_0000),
            (0x8200, 0xb800_0000),
            (0x7c00, 0x7f80_0000),
            (0x7c01, 0x7f80_2000),
            (0xfc01, 0xff80_2000),
            (0x7e00, 0x7fc0_0000),
            (0x8000, 0x8000_0000),
        ] {
            assert_eq!(f16_to_f32(h).to_bits(), f, "{h:#x}");
        }
    }
}
