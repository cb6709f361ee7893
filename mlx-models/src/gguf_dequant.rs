//! GGML tensor types dequantized to `f32` in plain Rust, bit for bit as gguf-py's
//! `gguf.quants.dequantize` (numpy, float32) computes them: the same half-to-float conversion
//! (numpy's, which keeps a signalling NaN's payload), the same products and differences in the
//! same order (`d * q`, `d * q - dm`, `x * d`, `(d * sc) * q`; no fused multiply-add).
//!
//! MLX 0.32.4's GGUF reader cannot load some types real files use (Q5_0 and Q5_1 fail in
//! `gguf_tensor_to_f16`) and turns others into `f16`; these functions read every type the
//! k-quant and legacy formats define, from the raw bytes of one tensor. Sizes are checked first:
//! wrong lengths are errors, never panics.

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

/// numpy's `float16 -> float32` (`npy_halfbits_to_floatbits`): exact, NaN payloads kept.
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exp = h & 0x7c00;
    let bits = match exp {
        0 => {
            let mut sig = h & 0x03ff;
            if sig == 0 {
                return f32::from_bits(sign);
            }
            // Subnormal: normalise.
            let mut e = 0u32;
            sig <<= 1;
            while sig & 0x0400 == 0 {
                sig <<= 1;
                e += 1;
            }
            sign + ((127 - 15 - e) << 23) + ((sig & 0x03ff) << 13)
        }
        0x7c00 => sign + 0x7f80_0000 + ((h & 0x03ff) << 13),
        _ => sign + (((h & 0x7fff) + 0x1_c000) << 13),
    };
    f32::from_bits(bits)
}

fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Dequantizes `data`, the bytes of a tensor of GGML type `ggml_type` holding `elements`
/// values, to `f32`. Errors (naming the type and the sizes) when the type is not one of
/// [`DEQUANTIZED_TYPES`], `elements` is not a whole number of blocks, or `data` does not hold
/// exactly those blocks.
pub fn dequantize(ggml_type: u32, data: &[u8], elements: usize) -> Result<Vec<f32>, String> {
    let Some((name, block, block_bytes)) = mlx_core::io::ggml_type_info(ggml_type) else {
        return Err(format!("unknown GGML type {ggml_type}"));
    };
    if !DEQUANTIZED_TYPES.iter().any(|(t, _)| *t == ggml_type) {
        return Err(format!("GGML type {name} cannot be dequantized here"));
    }
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    if elements % block != 0 {
        return Err(format!(
            "{elements} {name} values are not a whole number of {block}-value blocks"
        ));
    }
    let want = (elements / block)
        .checked_mul(block_bytes)
        .ok_or_else(|| format!("{elements} {name} values: size overflows"))?;
    if data.len() != want {
        return Err(format!(
            "{elements} {name} values need {want} bytes, got {}",
            data.len()
        ));
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
        2 => blocks.for_each(|(b, o)| q4_0(b, o)),
        3 => blocks.for_each(|(b, o)| q4_1(b, o)),
        6 => blocks.for_each(|(b, o)| q5_0(b, o)),
        7 => blocks.for_each(|(b, o)| q5_1(b, o)),
        8 => blocks.for_each(|(b, o)| q8_0(b, o)),
        10 => blocks.for_each(|(b, o)| q2_k(b, o)),
        11 => blocks.for_each(|(b, o)| q3_k(b, o)),
        12 => blocks.for_each(|(b, o)| q4_k(b, o, false)),
        13 => blocks.for_each(|(b, o)| q4_k(b, o, true)),
        39 => blocks.for_each(|(b, o)| mxfp4(b, o)),
        _ => blocks.for_each(|(b, o)| q6_k(b, o)),
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

fn q4_0(b: &[u8], o: &mut [f32]) {
    let d = half(b, 0);
    for (j, v) in o.iter_mut().enumerate() {
        *v = d * f32::from(nibble(&b[2..], j) as i8 - 8);
    }
}

fn q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, v) in o.iter_mut().enumerate() {
        *v = d * f32::from(nibble(&b[4..], j)) + m;
    }
}

/// A Q5 block's 5-bit quant `j`: the nibble plus bit `j` of the 32-bit high mask.
fn five_bits(qh: &[u8], qs: &[u8], j: usize) -> u8 {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    nibble(qs, j) | ((((h >> j) & 1) as u8) << 4)
}

fn q5_0(b: &[u8], o: &mut [f32]) {
    let d = half(b, 0);
    for (j, v) in o.iter_mut().enumerate() {
        *v = d * f32::from(five_bits(&b[2..6], &b[6..], j) as i8 - 16);
    }
}

fn q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, v) in o.iter_mut().enumerate() {
        *v = d * f32::from(five_bits(&b[4..8], &b[8..], j)) + m;
    }
}

fn q8_0(b: &[u8], o: &mut [f32]) {
    let d = half(b, 0);
    for (v, &x) in o.iter_mut().zip(&b[2..]) {
        *v = f32::from(x as i8) * d;
    }
}

fn q2_k(b: &[u8], o: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (half(b, 80), half(b, 82));
    for (p, v) in o.iter_mut().enumerate() {
        let (h, s, k) = (p / 128, (p % 128) / 32, p % 32);
        let q = (qs[32 * h + k] >> (2 * s)) & 3;
        let sc = scales[p / 16];
        let dl = d * f32::from(sc & 0x0f);
        let ml = dmin * f32::from(sc >> 4);
        *v = dl * f32::from(q) - ml;
    }
}

fn q3_k(b: &[u8], o: &mut [f32]) {
    let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
    let d = half(b, 108);
    let mut dl = [0f32; 16];
    for (i, x) in dl.iter_mut().enumerate() {
        let low = (scales[i % 8] >> (4 * (i / 8))) & 0x0f;
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        *x = d * f32::from((low | (high << 4)) as i8 - 32);
    }
    for (p, v) in o.iter_mut().enumerate() {
        let (h, s, k) = (p / 128, (p % 128) / 32, p % 32);
        let ql = (qs[32 * h + k] >> (2 * s)) & 3;
        let qh = ((hmask[p % 32] >> (p / 32)) & 1) ^ 1;
        *v = dl[p / 16] * f32::from(ql as i8 - (qh << 2) as i8);
    }
}

/// Q4_K's and Q5_K's eight 6-bit scales and mins, packed in 12 bytes.
fn scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for i in 0..4 {
        sc[i] = s[i] & 0x3f;
        sc[i + 4] = (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30);
        m[i] = s[4 + i] & 0x3f;
        m[i + 4] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
    }
    (sc, m)
}

/// Q4_K, or Q5_K (`five`: a 32-byte high-bit mask before the nibbles).
fn q4_k(b: &[u8], o: &mut [f32], five: bool) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (sc, m) = scale_min(&b[4..16]);
    let (qh, qs) = if five {
        (&b[16..48], &b[48..176])
    } else {
        (&b[16..16], &b[16..144])
    };
    for (j, sub) in o.chunks_exact_mut(32).enumerate() {
        let dj = d * f32::from(sc[j]);
        let dm = dmin * f32::from(m[j]);
        let (c, s) = (j / 2, j % 2);
        for (k, v) in sub.iter_mut().enumerate() {
            let mut q = (qs[32 * c + k] >> (4 * s)) & 0x0f;
            if five {
                q |= ((qh[k] >> j) & 1) << 4;
            }
            *v = dj * f32::from(q) - dm;
        }
    }
}

fn q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for (p, v) in o.iter_mut().enumerate() {
        let (h, r) = (p / 128, p % 128);
        let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
        let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
        let q = (low | (high << 4)) as i8 - 32;
        let dl = d * f32::from(scales[p / 16] as i8);
        *v = dl * f32::from(q);
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
