//! Trellis-coded weights (QTIP-style): a tail-biting bit-shift trellis, `k` bits a weight, an
//! `L`-bit state window decoded by the 1MAD computed code, random-sign block Hadamard
//! incoherence and a scale per row.
//!
//! Layout. A matrix `(rows, cols)` is cut along each row into blocks of `block` weights. A
//! block is a cyclic bit stream of `block * k` bits, stored most significant bit first in
//! `u32` words (`block * k / 32` words a block, so a row takes `cols * k / 32` words, the
//! shape of an affine `k`-bit weight). Weight `t` of a block is the code of the `L`-bit window
//! of that stream ending at bit `(t + 1) * k` (cyclically: the first windows wrap around to
//! the stream's end, which is what makes the trellis tail-biting). Consecutive windows share
//! `L - k` bits: the state goes `s -> ((s << k) | b) & (2^L - 1)`.
//!
//! The code of a state is QTIP's 1MAD: `x = s * 34038481 + 76625530 (mod 2^32)`, the sum of
//! the four bytes of `x` minus 510, divided by 147.800537109375 (an approximately Gaussian
//! value of unit variance).
//!
//! The stored matrix is `Wt = H_r diag(su) W diag(sv) H_c` (H: orthonormal Walsh-Hadamard
//! blocks, `su`/`sv`: random signs drawn from a seed), quantized row by row after dividing by
//! the row's RMS; the row's scale is then refitted by least squares to the codes chosen. So
//! `W x = su * H_r (Wt (H_c (sv * x)))`.
//!
//! The encoder is a Viterbi search over the `2^L` states per weight (two passes a block: an
//! unconstrained pass over the rotated block fixes the wrap-around bits, then a pass
//! constrained to them), on every core.

use std::cell::{RefCell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// 1MAD's multiplier.
pub const MAD_A: u32 = 34_038_481;
/// 1MAD's addend.
pub const MAD_B: u32 = 76_625_530;
/// 1MAD's divisor (the byte sum's standard deviation).
pub const MAD_SCALE: f32 = 147.800_54;

/// 1MAD's divisor for [`TrellisCode::Mad8`]'s int8 codes: `127 / 510` of [`MAD_SCALE`], so a
/// state's int8 code over it is close to its 1MAD value.
pub const MAD8_SCALE: f32 = MAD_SCALE * 127.0 / 510.0;

/// The computed code a state decodes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TrellisCode {
    /// QTIP's 1MAD: the byte sum minus 510 over [`MAD_SCALE`] (config name `1mad`).
    #[default]
    Mad,
    /// 1MAD rounded to int8: `round(c * 127 / 510)` of the 1MAD integer `c = sum - 510`
    /// (half away from zero, in `-127..=127`) over [`MAD8_SCALE`] (config name `1mad8`). The
    /// encoder and every decoder use these values, so the CPU decoder's int8 kernel
    /// (`vpermt2b` lookups straight into `vpdpbusd`) is exact against its plain reference.
    Mad8,
    /// 1mad8 of a hashed 8-bit index (config name `1mad8h`, `L` 9..=16): the state's top
    /// byte plus its bottom byte, mod 256 ([`mad8h_index`]), is the 8-bit state whose
    /// [`TrellisCode::Mad8`] code the state takes. An `L`-bit trellis (12 by default) with a
    /// 256-entry table: the CPU decoder's int8 kernel looks it up like 1mad8's, from two
    /// 8-bit windows and a byte add.
    Mad8H,
    /// 1mad8 of an S-box-hashed 8-bit index (config name `1mad8s`, `L` 9..=16): the AES
    /// S-box of the state's top byte plus its bottom byte, mod 256 ([`mad8s_index`]). The
    /// nonlinear byte map keeps the index sequence along a path from being a shift register
    /// of its own (1mad8h's sum is linear mod 256). The CPU decoder's table kernels apply
    /// the S-box to the top-byte windows with one GFNI `vgf2p8affineinvqb`.
    Mad8S,
    /// A stratified 256-entry Gaussian table at 1mad8s's index (config name `gauss8s`, `L`
    /// 9..=16): [`GAUSS8_TABLE`] at [`mad8s_index`], over [`GAUSS8_SCALE`]. Where `L >= 8 + k`
    /// (the new bits stay out of the S-boxed top byte), the index's successors of a state are
    /// 8 (at 3 bits) consecutive entries mod 256, and the table puts
    /// one quantile of each eighth of the Gaussian in any 8 consecutive entries (of each
    /// quarter in any 4, of each sixteenth in any 16): every state's branches span the
    /// distribution, as in trellis-coded quantization's set partitioning. The same kernels
    /// (and cost) as 1mad8s; only the table differs.
    Gauss8S,
    /// gauss8s's design with 128 entries (config name `gauss7s`, `L` 9..=16): [`GAUSS7_TABLE`]
    /// at the low 7 bits of [`mad8s_index`], over [`GAUSS7_SCALE`]. The int8 kernel looks a
    /// 7-bit index up with one `vpermt2b` (which reads only those bits) where a 256-entry
    /// table takes two, a mask and a blend; the other table kernels read the 128 entries
    /// twice over as a 256-entry table.
    Gauss7S,
}

/// [`TrellisCode::Gauss8S`]'s int8 codes, from their definition
/// (`results/quant/2026-12-06-s34-trelidx/gauss8s_table.py`, tested): entry `i` takes the
/// Gaussian quantile `q(i) = Phi^-1((p(i) + 0.5) / 256)` of position `p(i) = 16 class(i) +
/// rank(i)`, where with `r = i % 16`, `class(i) = 4 (r % 4) + 2 ((r / 4) % 2) + r / 8` and
/// `rank(i)` is the rank of entry `i`'s 1MAD byte sum among the 16 entries `j = i (mod 16)`
/// (ties: the smaller `j` first); the code is `round(127 q(i) / q_max)`, half away from zero,
/// `q_max = Phi^-1(255.5 / 256)`.
pub const GAUSS8_TABLE: [i8; 256] = [
    -103, -27, 3, 34, -43, -12, 16, 59, -65, -16, 10, 43, -33, -6, 29, 70, -127, -28, 0, 33, -45,
    -13, 15, 51, -67, -17, 8, 41, -38, -6, 27, 77, -81, -24, 2, 32, -46, -9, 20, 55, -59, -18, 12,
    48, -34, -3, 27, 111, -70, -25, 1, 31, -48, -10, 15, 52, -61, -21, 11, 46, -36, -4, 22, 97,
    -73, -26, 4, 31, -41, -8, 17, 62, -62, -19, 13, 45, -31, -1, 25, 127, -75, -22, 7, 36, -41,
    -12, 17, 60, -64, -20, 13, 44, -32, -5, 24, 86, -77, -23, 2, 34, -43, -8, 21, 65, -56, -16, 9,
    50, -31, -2, 28, 81, -68, -22, 6, 39, -39, -7, 21, 57, -57, -17, 8, 49, -39, -7, 23, 68, -83,
    -29, 1, 32, -50, -14, 19, 54, -60, -21, 8, 47, -35, -3, 23, 73, -89, -25, 5, 37, -49, -11, 18,
    64, -54, -19, 7, 39, -37, -4, 22, 71, -93, -27, 3, 30, -49, -11, 14, 61, -63, -20, 11, 40, -32,
    -2, 25, 89, -97, -23, 6, 35, -42, -12, 17, 67, -55, -15, 10, 43, -30, -5, 24, 83, -111, -28, 2,
    33, -44, -13, 16, 57, -57, -17, 9, 42, -33, -2, 28, 79, -79, -24, 5, 38, -46, -9, 20, 56, -52,
    -14, 12, 49, -34, 0, 29, 75, -86, -29, 5, 37, -47, -10, 19, 53, -53, -18, 12, 46, -36, -1, 26,
    103, -71, -26, 4, 36, -40, -8, 18, 63, -51, -15, 14, 41, -37, -5, 26, 93,
];

/// [`TrellisCode::Gauss7S`]'s int8 codes: [`GAUSS8_TABLE`]'s definition with 128 entries
/// (`results/quant/2026-12-06-s34-trelidx/gauss8s_table.py 128`, tested): entry `i` takes
/// `q(i) = Phi^-1((p(i) + 0.5) / 128)`, `p(i) = 8 class(i) + rank(i)` (`rank(i)` among the 8
/// entries `j = i (mod 16)` of 128), the code `round(127 q(i) / q_max)`, `q_max =
/// Phi^-1(127.5 / 128)`.
pub const GAUSS7_TABLE: [i8; 128] = [
    -108, -30, 4, 39, -47, -14, 18, 64, -69, -16, 11, 44, -36, -5, 32, 78, -127, -32, 0, 36, -51,
    -15, 17, 56, -72, -18, 9, 43, -40, -6, 29, 82, -99, -27, 2, 35, -52, -11, 21, 60, -60, -20, 13,
    51, -38, -2, 28, 108, -78, -28, 1, 34, -54, -12, 16, 58, -62, -23, 12, 49, -39, -3, 24, 99,
    -82, -29, 5, 33, -44, -9, 20, 69, -64, -21, 15, 47, -34, 0, 27, 127, -86, -25, 7, 40, -46, -13,
    19, 66, -66, -22, 14, 46, -35, -4, 26, 92, -92, -26, 3, 38, -49, -10, 22, 72, -56, -17, 10, 54,
    -33, -1, 30, 86, -75, -24, 6, 42, -43, -8, 23, 62, -58, -19, 8, 52, -42, -7, 25, 75,
];

/// [`TrellisCode::Gauss7S`]'s divisor: `127 / (1.1 q_max)` (the values are 1.1 times the
/// quantiles, the best scale of the Gaussian MSE screen at 3 bits).
pub const GAUSS7_SCALE: f32 = 43.402_864;

/// [`TrellisCode::Gauss8S`]'s divisor: `127 / (1.05 q_max)` (the values are 1.05 times the
/// quantiles, the best scale of the Gaussian MSE screen at 3 bits).
pub const GAUSS8_SCALE: f32 = 41.915_344;

/// The AES S-box ([`TrellisCode::Mad8S`]'s byte map): the inverse in GF(2^8) mod
/// `x^8 + x^4 + x^3 + x + 1` (0 to 0), then the AES affine map plus `0x63`.
pub const SBOX: [u8; 256] = sbox_table();

const fn gf_mul(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        let hi = a & 0x80;
        a <<= 1;
        if hi != 0 {
            a ^= 0x1B;
        }
        b >>= 1;
    }
    p
}

const fn sbox_table() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut x = 0usize;
    while x < 256 {
        // The inverse by search (`x * y == 1`), 0 for 0.
        let mut inv = 0u8;
        let mut y = 1usize;
        while x != 0 && y < 256 {
            if gf_mul(x as u8, y as u8) == 1 {
                inv = y as u8;
            }
            y += 1;
        }
        let b = inv;
        t[x] = b ^ b.rotate_left(1) ^ b.rotate_left(2) ^ b.rotate_left(3) ^ b.rotate_left(4) ^ 0x63;
        x += 1;
    }
    t
}

/// [`TrellisCode::Mad8S`]'s table index of an `l`-bit state: the [`SBOX`] of its top 8 bits
/// plus its low 8 bits, mod 256 (`l` in 9..=16).
#[inline(always)]
pub fn mad8s_index(l: u32, state: u32) -> u32 {
    (u32::from(SBOX[((state >> (l - 8)) & 0xFF) as usize]) + state) & 0xFF
}

/// [`TrellisCode::Mad8H`]'s table index of an `l`-bit state: its top 8 bits plus its low 8
/// bits, mod 256 (`l` in 9..=16, as [`TrellisSpec::check`] requires of the code; a smaller
/// `l` is taken as 8).
#[inline(always)]
pub fn mad8h_index(l: u32, state: u32) -> u32 {
    ((state >> (l.max(8) - 8)) + state) & 0xFF
}

impl TrellisCode {
    /// The config name (`trellis_code`).
    pub fn name(self) -> &'static str {
        match self {
            TrellisCode::Mad => "1mad",
            TrellisCode::Mad8 => "1mad8",
            TrellisCode::Mad8H => "1mad8h",
            TrellisCode::Mad8S => "1mad8s",
            TrellisCode::Gauss8S => "gauss8s",
            TrellisCode::Gauss7S => "gauss7s",
        }
    }

    /// The code of a config name.
    pub fn from_name(name: &str) -> Option<TrellisCode> {
        match name {
            "1mad" => Some(TrellisCode::Mad),
            "1mad8" => Some(TrellisCode::Mad8),
            "1mad8h" => Some(TrellisCode::Mad8H),
            "1mad8s" => Some(TrellisCode::Mad8S),
            "gauss8s" => Some(TrellisCode::Gauss8S),
            "gauss7s" => Some(TrellisCode::Gauss7S),
            _ => None,
        }
    }

    /// The integer code of an `l`-bit state (its value times [`TrellisCode::divisor`]).
    #[inline(always)]
    pub fn int(self, l: u32, state: u32) -> i32 {
        match self {
            TrellisCode::Mad => mad_sum(state) - 510,
            TrellisCode::Mad8 => mad8_int(state),
            TrellisCode::Mad8H => mad8_int(mad8h_index(l, state)),
            TrellisCode::Mad8S => mad8_int(mad8s_index(l, state)),
            TrellisCode::Gauss8S => i32::from(GAUSS8_TABLE[mad8s_index(l, state) as usize]),
            TrellisCode::Gauss7S => {
                i32::from(GAUSS7_TABLE[(mad8s_index(l, state) & 0x7F) as usize])
            }
        }
    }

    /// The integer code of a hashed code's 8-bit table index (its table kernels' entry).
    fn table_int(self, index: u32) -> i32 {
        match self {
            TrellisCode::Gauss8S => i32::from(GAUSS8_TABLE[(index & 0xFF) as usize]),
            TrellisCode::Gauss7S => i32::from(GAUSS7_TABLE[(index & 0x7F) as usize]),
            _ => mad8_int(index),
        }
    }

    /// What the integer codes are divided by.
    pub fn divisor(self) -> f32 {
        match self {
            TrellisCode::Mad => MAD_SCALE,
            TrellisCode::Mad8 | TrellisCode::Mad8H | TrellisCode::Mad8S => MAD8_SCALE,
            TrellisCode::Gauss8S => GAUSS8_SCALE,
            TrellisCode::Gauss7S => GAUSS7_SCALE,
        }
    }

    /// The value of an `l`-bit state: [`TrellisCode::int`] over [`TrellisCode::divisor`] (for
    /// [`TrellisCode::Mad`] the bits of [`code_1mad`]).
    #[inline(always)]
    pub fn value(self, l: u32, state: u32) -> f32 {
        self.int(l, state) as f32 / self.divisor()
    }
}

/// 1mad8's integer code of a state: the 1MAD integer `c` rounded to `c * 127 / 510`, half
/// away from zero.
#[inline(always)]
fn mad8_int(state: u32) -> i32 {
    let c = mad_sum(state) - 510;
    let r = (c.abs() * 127 + 255) / 510;
    if c < 0 {
        -r
    } else {
        r
    }
}

/// 1MAD's byte sum of a state (`0..=1020`).
#[inline(always)]
fn mad_sum(state: u32) -> i32 {
    let x = state.wrapping_mul(MAD_A).wrapping_add(MAD_B);
    let y = (x & 0x00FF_00FF) + ((x >> 8) & 0x00FF_00FF);
    ((y & 0xFFFF) + (y >> 16)) as i32
}

/// A trellis code's shape: `k` bits a weight, an `l`-bit state, blocks of `block` weights,
/// and the code the states decode to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrellisSpec {
    pub k: u32,
    pub l: u32,
    pub block: usize,
    pub code: TrellisCode,
}

impl TrellisSpec {
    /// Whether the code hashes an `L`-bit state (`L` 9..=16) into an 8-bit table:
    /// [`TrellisCode::Mad8H`], [`TrellisCode::Mad8S`], [`TrellisCode::Gauss8S`] and
    /// [`TrellisCode::Gauss7S`].
    pub fn hashed(&self) -> bool {
        matches!(
            self.code,
            TrellisCode::Mad8H | TrellisCode::Mad8S | TrellisCode::Gauss8S | TrellisCode::Gauss7S
        )
    }

    /// Whether the hashed index puts the top byte through the AES S-box ([`mad8s_index`]).
    fn sboxed(&self) -> bool {
        matches!(
            self.code,
            TrellisCode::Mad8S | TrellisCode::Gauss8S | TrellisCode::Gauss7S
        )
    }

    /// Checks the shape: `k` in 2..=4, `l` in `k + 1..=16`, a block whose bit count is a
    /// whole number of words and at least `l` bits.
    pub fn check(&self) -> Result<(), TrellisError> {
        if !(2..=4).contains(&self.k) {
            return Err(TrellisError::Bits { k: self.k });
        }
        if self.l <= self.k || self.l > 16 {
            return Err(TrellisError::StateBits {
                k: self.k,
                l: self.l,
            });
        }
        if self.block == 0 || (self.block * self.k as usize) % 32 != 0 {
            return Err(TrellisError::BlockWords {
                block: self.block,
                k: self.k,
            });
        }
        if self.block * (self.k as usize) < self.l as usize || self.block > 4096 {
            return Err(TrellisError::BlockSize {
                block: self.block,
                min: (self.l as usize).div_ceil(self.k as usize),
            });
        }
        // 1mad8's codes are decoded only by the table kernels (`LutPlan`); anything else would
        // run the scalar fallback, far slower than `1mad`.
        if self.code == TrellisCode::Mad8 && self.lut_span().is_none() {
            return Err(TrellisError::Mad8Shape {
                l: self.l,
                block: self.block,
                k: self.k,
            });
        }
        // 1mad8h's likewise (`L` 9..=16, the same blocks as 1mad8's).
        if self.hashed() && (self.l < 9 || self.lut_span().is_none()) {
            return Err(TrellisError::Mad8HShape {
                code: self.code.name(),
                l: self.l,
                block: self.block,
                k: self.k,
            });
        }
        Ok(())
    }

    /// Words a block takes.
    pub fn block_words(&self) -> usize {
        self.block * self.k as usize / 32
    }

    /// The weights a step of the table kernels (`LutPlan`) reads, where they apply to this
    /// shape: 8-bit states (or [`TrellisCode::Mad8H`]'s 8-bit indices), whole groups of 64
    /// weights (one block of a multiple of 64, or two blocks of 32, whose words lie one after
    /// the other) of at most 16 words.
    fn lut_span(&self) -> Option<usize> {
        let span = self.block.max(64);
        let fits = (self.l <= 8 || self.hashed())
            && span % self.block == 0
            && span % 64 == 0
            && span / self.block * self.block_words() <= 16;
        fits.then_some(span)
    }

    /// Checks that `(rows, cols)` can be coded: `cols` a multiple of the block (and, for the
    /// table codes, of their kernels' step: blocks of 32 are read two at a time).
    pub fn check_shape(&self, rows: usize, cols: usize) -> Result<(), TrellisError> {
        self.check()?;
        if rows == 0 || cols == 0 || cols % self.block != 0 {
            return Err(TrellisError::Shape {
                rows,
                cols,
                block: self.block,
            });
        }
        if self.code == TrellisCode::Mad8 || self.hashed() {
            if let Some(span) = self.lut_span() {
                if cols % span != 0 {
                    return Err(TrellisError::TableCols {
                        code: self.code.name(),
                        cols,
                        span,
                    });
                }
            }
        }
        Ok(())
    }

    /// Bit offset (in the block's stream) of the first bit of weight `t`'s window.
    pub fn window_start(&self, t: usize) -> usize {
        let bits = self.block * self.k as usize;
        ((t + 1) * self.k as usize + bits - self.l as usize) % bits
    }
}

/// What a trellis code's shape, a matrix or a kernel's buffers got wrong: the operation, the
/// parameter and the numbers.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum TrellisError {
    /// `k` outside 2..=4.
    #[error("trellis bits must be 2, 3 or 4, got {k}")]
    Bits { k: u32 },
    /// The state width `L` outside `k + 1..=16`.
    #[error("trellis state bits L must be in {}..=16, got {l}", .k + 1)]
    StateBits { k: u32, l: u32 },
    /// A block whose bits are not whole 32-bit words.
    #[error("trellis block of {block} weights at {k} bits is not a whole number of 32-bit words")]
    BlockWords { block: usize, k: u32 },
    /// A block shorter than the state or longer than 4096 weights.
    #[error("trellis block of {block} weights is outside {min}..=4096")]
    BlockSize { block: usize, min: usize },
    /// The `1mad8` code outside its kernel's shapes.
    #[error(
        "trellis_code 1mad8 needs trellis_l <= 8 and a block of 32 or a multiple of 64 of at most \
         512 bits, got L {l} and a block of {block} at {k} bits (use trellis_code 1mad otherwise)"
    )]
    Mad8Shape { l: u32, block: usize, k: u32 },
    /// The `1mad8h` code with fewer than 9 state bits, or outside its kernel's blocks.
    #[error(
        "trellis_code {code} needs trellis_l in 9..=16 (it hashes the state's top and bottom \
         bytes) and a block of 32 or a multiple of 64 of at most 512 bits, got L {l} and a \
         block of {block} at {k} bits (use trellis_code 1mad8 at L 8 or less, or 1mad)"
    )]
    Mad8HShape {
        code: &'static str,
        l: u32,
        block: usize,
        k: u32,
    },
    /// A table code's matrix whose rows are not whole steps of its kernels.
    #[error(
        "trellis_code {code} reads rows {span} weights at a time: a row of {cols} weights is not \
         a whole number of them (use blocks of 64, or trellis_code 1mad)"
    )]
    TableCols {
        code: &'static str,
        cols: usize,
        span: usize,
    },
    /// A matrix whose rows cannot be cut into blocks.
    #[error("a ({rows}, {cols}) matrix cannot be cut into trellis blocks of {block}")]
    Shape {
        rows: usize,
        cols: usize,
        block: usize,
    },
    /// [`quantize`] / [`encode_rows`] (`op`): the values do not fill the matrix.
    #[error("trellis {op}: {values} values for a ({rows}, {cols}) matrix")]
    Values {
        op: &'static str,
        values: usize,
        rows: usize,
        cols: usize,
    },
    /// [`quantize`] / [`encode_rows`] (`op`): a NaN or infinity at this row and column.
    #[error("trellis {op}: a non-finite value at ({row}, {col})")]
    NonFinite {
        op: &'static str,
        row: usize,
        col: usize,
    },
    /// [`quantize_ldlq`]: the weights or the Hessian do not fit the matrix.
    #[error(
        "trellis LDLQ: {weights} weights and a Hessian of {hessian} values for a ({rows}, {cols}) matrix"
    )]
    LdlqSizes {
        weights: usize,
        hessian: usize,
        rows: usize,
        cols: usize,
    },
    /// [`quantize_ldlq`]: a NaN or infinity among the weights or the Hessian.
    #[error("trellis LDLQ: a non-finite weight or Hessian value")]
    LdlqNonFinite,
    /// [`quantize_ldlq`]: the (damped) Hessian's Cholesky factor fails at this column.
    #[error("trellis LDLQ: the Hessian is not positive definite at column {column}")]
    NotPositiveDefinite { column: usize },
    /// [`decode`]: the buffers do not fit the matrix.
    #[error(
        "trellis decode: {words} words, {scales} scales, {outputs} outputs for a ({rows}, {cols}) matrix"
    )]
    DecodeSizes {
        words: usize,
        scales: usize,
        outputs: usize,
        rows: usize,
        cols: usize,
    },
    /// [`TrellisMatvec`]: the row range overflows `usize`.
    #[error("trellis matvec: row range overflows")]
    RowRangeOverflow,
    /// [`TrellisMatvec`]: the words, scales or input are too short for the rows asked.
    #[error(
        "trellis matvec: rows {r0}..{end} of {cols}-wide rows need {needed} words, {end} scales \
         and {cols} inputs, got {words}, {scales} and {inputs}"
    )]
    MatvecSizes {
        r0: usize,
        end: usize,
        cols: usize,
        needed: usize,
        words: usize,
        scales: usize,
        inputs: usize,
    },
    /// [`TrellisView::new`]: the pieces do not fit each other.
    #[error(
        "trellis view: a ({rows}, {cols}) matrix needs {needed} words, {rows} scales and a plan \
         of {cols} columns, got {words}, {scales} and {plan_cols}"
    )]
    ViewSizes {
        rows: usize,
        cols: usize,
        needed: usize,
        words: usize,
        scales: usize,
        plan_cols: usize,
    },
    /// [`TrellisView::matvec`]: the input, scratch or output length is wrong.
    #[error("trellis matvec: ({rows}, {cols}) with {inputs} inputs, {scratch} scratch and {outputs} outputs")]
    ViewMatvecSizes {
        rows: usize,
        cols: usize,
        inputs: usize,
        scratch: usize,
        outputs: usize,
    },
}

/// The 1MAD code of a state.
#[inline(always)]
pub fn code_1mad(state: u32) -> f32 {
    let x = state.wrapping_mul(MAD_A).wrapping_add(MAD_B);
    // Byte sum: pairs of bytes in 16-bit lanes, then the two lanes.
    let y = (x & 0x00FF_00FF) + ((x >> 8) & 0x00FF_00FF);
    let s = (y & 0xFFFF) + (y >> 16);
    (s as i32 - 510) as f32 / MAD_SCALE
}

/// The state of weight `t` read from a block's words.
#[inline(always)]
fn window(spec: &TrellisSpec, words: &[u32], t: usize) -> u32 {
    let start = spec.window_start(t);
    let a = start / 32;
    let off = start % 32;
    let nw = words.len();
    let hi = u64::from(words[a]);
    let lo = u64::from(words[(a + 1) % nw]);
    let v = ((hi << 32) | lo) >> (64 - off - spec.l as usize);
    (v as u32) & ((1u32 << spec.l) - 1)
}

/// Decodes a block's states (the plain reference of the layout).
pub fn block_states(spec: &TrellisSpec, words: &[u32]) -> Vec<u32> {
    (0..spec.block).map(|t| window(spec, words, t)).collect()
}

/// Packs a block's consistent state path into its words.
fn pack_block(spec: &TrellisSpec, states: &[u32], out: &mut [u32]) {
    out.iter_mut().for_each(|w| *w = 0);
    let k = spec.k as usize;
    let kmask = (1u32 << k) - 1;
    for (t, &s) in states.iter().enumerate() {
        let b = s & kmask;
        for j in 0..k {
            let bit = (b >> (k - 1 - j)) & 1;
            let i = t * k + j;
            out[i / 32] |= bit << (31 - i % 32);
        }
    }
}

/// Seeded random signs (`+1.0` / `-1.0`), splitmix64 from `seed`.
pub fn signs(seed: u64, n: usize) -> Vec<f32> {
    let mut z = seed;
    let mut out = Vec::with_capacity(n);
    let mut bits = 0u64;
    for i in 0..n {
        if i % 64 == 0 {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            bits = x ^ (x >> 31);
        }
        out.push(if (bits >> (i % 64)) & 1 == 1 {
            -1.0
        } else {
            1.0
        });
    }
    out
}

/// The seed of one layer's signs: the model's seed mixed with the layer's path (FNV-1a), so
/// every layer draws its own signs.
pub fn layer_seed(seed: u64, path: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    seed ^ h
}

/// The Hadamard block size for a dimension: its largest power-of-two divisor (at most 4096).
pub fn hadamard_block(n: usize) -> usize {
    if n == 0 {
        return 1;
    }
    (1usize << n.trailing_zeros()).min(4096)
}

/// In-place orthonormal Walsh-Hadamard transform of each consecutive `block` of `x`
/// (Sylvester order, scaled by `1/sqrt(block)`). Blocks of 16 or more take AVX-512 where the
/// CPU has it: the same butterflies in the same order, so the same bits as the portable loop
/// (the CPU decoder runs two of these per trellis product).
pub fn fwht_blocks(x: &mut [f32], block: usize) {
    #[cfg(target_arch = "x86_64")]
    if block >= 16 && block.is_power_of_two() && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F is present and `block` is a power of two of at least 16.
        unsafe { fwht_blocks_avx512(x, block) };
        return;
    }
    fwht_blocks_portable(x, block);
}

/// [`fwht_blocks`]'s portable loop (the reference of its SIMD path).
pub fn fwht_blocks_portable(x: &mut [f32], block: usize) {
    let scale = 1.0 / (block as f32).sqrt();
    for chunk in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < block {
            for i in (0..block).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (chunk[j], chunk[j + h]);
                    chunk[j] = a + b;
                    chunk[j + h] = a - b;
                }
            }
            h *= 2;
        }
        chunk.iter_mut().for_each(|v| *v *= scale);
    }
}

/// [`fwht_blocks`] on AVX-512: the butterflies of spans 1, 2, 4 and 8 inside each vector of
/// 16 (a lane permutation, an add and a masked subtract: lane `j` without bit `h` gets
/// `x[j] + x[j + h]`, lane `j + h` gets `x[j] - x[j + h]`, as the portable loop), then the
/// wider spans between vectors, the scale multiplied after the last one.
///
/// # Safety
/// The CPU has AVX-512 F; `block` is a power of two of at least 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fwht_blocks_avx512(x: &mut [f32], block: usize) {
    use std::arch::x86_64::*;
    const PARTNER: [[i32; 16]; 4] = {
        let mut p = [[0i32; 16]; 4];
        let mut s = 0;
        while s < 4 {
            let mut j = 0;
            while j < 16 {
                p[s][j] = (j ^ (1 << s)) as i32;
                j += 1;
            }
            s += 1;
        }
        p
    };
    const UPPER: [__mmask16; 4] = [0xAAAA, 0xCCCC, 0xF0F0, 0xFF00];
    let scale = 1.0 / (block as f32).sqrt();
    let sv = _mm512_set1_ps(scale);
    let n = x.len() / block * block;
    let p = x.as_mut_ptr();
    // SAFETY (whole body): every access is below `n <= x.len()`: vectors of 16 at offsets that
    // are multiples of 16 (`block` is), and partner offsets `j + h < i + 2h <= block`.
    unsafe {
        let idx: [__m512i; 4] =
            std::array::from_fn(|s| _mm512_loadu_si512(PARTNER[s].as_ptr() as *const _));
        let mut o = 0;
        while o < n {
            let mut v = _mm512_loadu_ps(p.add(o));
            for (s, &m) in UPPER.iter().enumerate() {
                let q = _mm512_permutexvar_ps(idx[s], v);
                v = _mm512_mask_sub_ps(_mm512_add_ps(v, q), m, q, v);
            }
            if block == 16 {
                v = _mm512_mul_ps(v, sv);
            }
            _mm512_storeu_ps(p.add(o), v);
            o += 16;
        }
        for b0 in (0..n).step_by(block) {
            let mut h = 16;
            while h < block {
                let last = 2 * h == block;
                for i in (b0..b0 + block).step_by(2 * h) {
                    for j in (i..i + h).step_by(16) {
                        let a = _mm512_loadu_ps(p.add(j));
                        let b = _mm512_loadu_ps(p.add(j + h));
                        let (mut s0, mut s1) = (_mm512_add_ps(a, b), _mm512_sub_ps(a, b));
                        if last {
                            s0 = _mm512_mul_ps(s0, sv);
                            s1 = _mm512_mul_ps(s1, sv);
                        }
                        _mm512_storeu_ps(p.add(j), s0);
                        _mm512_storeu_ps(p.add(j + h), s1);
                    }
                }
                h *= 2;
            }
        }
    }
}

/// The normalized Hadamard matrix of `block` (row-major), the plain-ops path's operand.
pub fn hadamard_matrix(block: usize) -> Vec<f32> {
    let mut m = vec![0.0f32; block * block];
    for r in 0..block {
        m[r * block + r] = 1.0;
        fwht_blocks(&mut m[r * block..(r + 1) * block], block);
    }
    m
}

/// Applies the incoherence transform to a row-major `(rows, cols)` matrix in place:
/// `H_r diag(su) W diag(sv) H_c`.
pub fn incoherent(w: &mut [f32], rows: usize, cols: usize, su: &[f32], sv: &[f32]) {
    let (br, bc) = (hadamard_block(rows), hadamard_block(cols));
    for r in 0..rows {
        let row = &mut w[r * cols..(r + 1) * cols];
        for (v, s) in row.iter_mut().zip(sv) {
            *v *= su[r] * s;
        }
        fwht_blocks(row, bc);
    }
    // Columns: transpose, transform, transpose back.
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    for c in 0..cols {
        fwht_blocks(&mut t[c * rows..(c + 1) * rows], br);
    }
    for r in 0..rows {
        for c in 0..cols {
            w[r * cols + c] = t[c * rows + r];
        }
    }
}

/// One Viterbi pass over `x` (one block). `overlap`: the `L - k` wrap-around bits the first
/// state's top and the last state's bottom must equal. Returns the state path and its error.
/// `codes` is the 1MAD table of all `2^L` states; `cost`, `next`, `arg` are scratch.
struct Scratch {
    cost: Vec<f32>,
    next: Vec<f32>,
    best: Vec<f32>,
    wide: Vec<u32>,
    arg: Vec<u8>,
}

impl Scratch {
    fn new(spec: &TrellisSpec) -> Scratch {
        let n = 1usize << spec.l;
        let g = 1usize << (spec.l - spec.k);
        Scratch {
            cost: vec![0.0; n],
            next: vec![0.0; n],
            best: vec![0.0; g],
            wide: vec![0; g],
            arg: vec![0; g * spec.block],
        }
    }
}

#[inline(always)]
fn viterbi_step_k<const FAN: usize>(
    w: f32,
    codes: &[f32],
    cost: &[f32],
    best: &mut [f32],
    wide: &mut [u32],
    arg: &mut [u8],
    next: &mut [f32],
) {
    // Predecessors of state s' = (p << (L-k)) | (s' >> k): the same index of 2^k slices.
    let g = best.len();
    best.copy_from_slice(&cost[..g]);
    wide.iter_mut().for_each(|a| *a = 0);
    for p in 1..FAN {
        let slice = &cost[p * g..(p + 1) * g];
        for ((b, a), &c) in best.iter_mut().zip(wide.iter_mut()).zip(slice) {
            let lt = c < *b;
            *b = if lt { c } else { *b };
            *a = if lt { p as u32 } else { *a };
        }
    }
    for (a, &v) in arg.iter_mut().zip(wide.iter()) {
        *a = v as u8;
    }
    // Squared errors over the whole state range (flat, vectorized), then each group's best
    // added to its FAN states (written per group so the compiler does not vectorize across
    // groups with gathers).
    if FAN >= 16 {
        for (o, &c) in next.iter_mut().zip(codes) {
            let d = w - c;
            *o = d * d;
        }
        for (out, &b) in next.chunks_exact_mut(FAN).zip(best.iter()) {
            add_group::<FAN>(out.try_into().expect("chunk of FAN"), b);
        }
        return;
    }
    for ((out, code), &b) in next
        .chunks_exact_mut(FAN)
        .zip(codes.chunks_exact(FAN))
        .zip(best.iter())
    {
        let out: &mut [f32; FAN] = out.try_into().expect("chunk of FAN");
        let code: &[f32; FAN] = code.try_into().expect("chunk of FAN");
        for j in 0..FAN {
            let d = w - code[j];
            out[j] = b + d * d;
        }
    }
}

#[inline(never)]
fn add_group<const FAN: usize>(out: &mut [f32; FAN], b: f32) {
    for o in out.iter_mut() {
        *o += b;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn viterbi_step(
    k: usize,
    w: f32,
    codes: &[f32],
    cost: &[f32],
    best: &mut [f32],
    wide: &mut [u32],
    arg: &mut [u8],
    next: &mut [f32],
) {
    match k {
        2 => viterbi_step_k::<4>(w, codes, cost, best, wide, arg, next),
        3 => viterbi_step_k::<8>(w, codes, cost, best, wide, arg, next),
        _ => viterbi_step_k::<16>(w, codes, cost, best, wide, arg, next),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn viterbi_step_avx2(
    k: usize,
    w: f32,
    codes: &[f32],
    cost: &[f32],
    best: &mut [f32],
    wide: &mut [u32],
    arg: &mut [u8],
    next: &mut [f32],
) {
    viterbi_step(k, w, codes, cost, best, wide, arg, next)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn viterbi_step_avx512(
    k: usize,
    w: f32,
    codes: &[f32],
    cost: &[f32],
    best: &mut [f32],
    wide: &mut [u32],
    arg: &mut [u8],
    next: &mut [f32],
) {
    if arg.len() % 16 != 0 {
        return viterbi_step(k, w, codes, cost, best, wide, arg, next);
    }
    // SAFETY: this function's own features (the caller checked them); `arg.len()` is a
    // multiple of 16 (checked above).
    unsafe {
        match k {
            2 => acs_avx512::<4, 2>(w, codes, cost, arg, next),
            3 => acs_avx512::<8, 3>(w, codes, cost, arg, next),
            _ => acs_avx512::<16, 4>(w, codes, cost, arg, next),
        }
    }
}

/// [`viterbi_step_k`] on 16 groups a pass (the same operations in the same order, so the
/// same bits): the add-compare-select of 16 groups at once (each group's `FAN`
/// predecessors are the same lane of `FAN` contiguous slices: a strided min over whole
/// vectors), its arguments narrowed to bytes, then the groups' `16 * FAN` successors
/// written while the 16 minima are in a register (each successor's minimum by a lane
/// permute). `arg.len()` (the number of groups) must be a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn acs_avx512<const FAN: usize, const SHIFT: u32>(
    w: f32,
    codes: &[f32],
    cost: &[f32],
    arg: &mut [u8],
    next: &mut [f32],
) {
    use std::arch::x86_64::*;
    let g = arg.len();
    assert!(g % 16 == 0 && cost.len() == g * FAN && codes.len() == g * FAN);
    assert!(next.len() == g * FAN);
    let wv = _mm512_set1_ps(w);
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // SAFETY (all loads and stores): `i0 + 16 <= g`, `p < FAN`, so `p * g + i0 + 16 <=
    // FAN * g = cost.len()`; `base + 16 * FAN = (i0 + 16) * FAN <= codes.len() = next.len()`;
    // `i0 + 16 <= arg.len()` (asserted above). The intrinsics need AVX-512 F/BW, enabled here.
    unsafe {
        let mut idx = [_mm512_setzero_si512(); FAN];
        for (m, v) in idx.iter_mut().enumerate() {
            *v = _mm512_srli_epi32::<SHIFT>(_mm512_add_epi32(
                lane,
                _mm512_set1_epi32(16 * m as i32),
            ));
        }
        let (cp, kp, np) = (cost.as_ptr(), codes.as_ptr(), next.as_mut_ptr());
        for i0 in (0..g).step_by(16) {
            let mut best = _mm512_loadu_ps(cp.add(i0));
            let mut a = _mm512_setzero_si512();
            for p in 1..FAN {
                let c = _mm512_loadu_ps(cp.add(p * g + i0));
                let lt = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(c, best);
                best = _mm512_mask_mov_ps(best, lt, c);
                a = _mm512_mask_mov_epi32(a, lt, _mm512_set1_epi32(p as i32));
            }
            _mm_storeu_si128(
                arg.as_mut_ptr().add(i0) as *mut __m128i,
                _mm512_cvtepi32_epi8(a),
            );
            let base = i0 * FAN;
            for (m, ix) in idx.iter().enumerate() {
                let b = _mm512_permutexvar_ps(*ix, best);
                let d = _mm512_sub_ps(wv, _mm512_loadu_ps(kp.add(base + 16 * m)));
                _mm512_storeu_ps(np.add(base + 16 * m), _mm512_add_ps(b, _mm512_mul_ps(d, d)));
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn step(
    isa: super::Isa,
    k: usize,
    w: f32,
    codes: &[f32],
    cost: &[f32],
    best: &mut [f32],
    wide: &mut [u32],
    arg: &mut [u8],
    next: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` found AVX-512 F/BW/VL (and AVX2, FMA) on this CPU.
        super::Isa::Avx512 => unsafe {
            viterbi_step_avx512(k, w, codes, cost, best, wide, arg, next)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` found AVX2 and FMA on this CPU.
        super::Isa::Avx2 => unsafe { viterbi_step_avx2(k, w, codes, cost, best, wide, arg, next) },
        _ => viterbi_step(k, w, codes, cost, best, wide, arg, next),
    }
}

fn viterbi(
    isa: super::Isa,
    spec: &TrellisSpec,
    x: &[f32],
    overlap: Option<u32>,
    codes: &[f32],
    s: &mut Scratch,
) -> Vec<u32> {
    let (k, l) = (spec.k as usize, spec.l as usize);
    let n = 1usize << l;
    let g = 1usize << (l - k);
    let gmask = (g - 1) as u32;
    let t_len = x.len();
    // The first weight's costs: every state, or (constrained) only the `2^k` states whose
    // top `L - k` bits are the overlap, a contiguous run.
    match overlap {
        None => {
            for (c, &code) in s.cost.iter_mut().zip(codes) {
                let d = x[0] - code;
                *c = d * d;
            }
        }
        Some(o) => {
            s.cost.iter_mut().for_each(|c| *c = f32::INFINITY);
            let run = (o as usize) << k..((o as usize) + 1) << k;
            for (c, &code) in s.cost[run.clone()].iter_mut().zip(&codes[run]) {
                let d = x[0] - code;
                *c = d * d;
            }
        }
    }
    for (t, &xt) in x.iter().enumerate().skip(1) {
        let arg = &mut s.arg[t * g..(t + 1) * g];
        step(
            isa,
            k,
            xt,
            codes,
            &s.cost,
            &mut s.best,
            &mut s.wide,
            arg,
            &mut s.next,
        );
        std::mem::swap(&mut s.cost, &mut s.next);
    }
    // The lowest final cost (the first state on ties): over every state, or (constrained)
    // over the `2^k` states whose low `L - k` bits are the overlap, `g` apart.
    let mut last = 0u32;
    let mut lowest = f32::INFINITY;
    let (first, stride) = match overlap {
        None => (0, 1),
        Some(o) => ((o & gmask) as usize, g),
    };
    for st in (first..n).step_by(stride) {
        if s.cost[st] < lowest {
            lowest = s.cost[st];
            last = st as u32;
        }
    }
    let mut path = vec![0u32; t_len];
    path[t_len - 1] = last;
    for t in (1..t_len).rev() {
        let cur = path[t];
        let p = u32::from(s.arg[t * g + (cur >> k) as usize]);
        path[t - 1] = (p << (l - k)) | (cur >> k);
    }
    path
}

/// Encodes one block of (normalized) weights: the tail-biting path's words.
fn encode_block(
    isa: super::Isa,
    spec: &TrellisSpec,
    x: &[f32],
    codes: &[f32],
    s: &mut Scratch,
    out: &mut [u32],
) {
    let t_len = x.len();
    let half = t_len / 2;
    // Rotated so original weight 0 sits at position `half`.
    let rolled: Vec<f32> = (0..t_len).map(|i| x[(i + t_len - half) % t_len]).collect();
    let free = viterbi(isa, spec, &rolled, None, codes, s);
    let overlap = free[half] >> spec.k;
    let path = viterbi(isa, spec, x, Some(overlap), codes, s);
    pack_block(spec, &path, out);
}

/// The 1MAD table of every `L`-bit state.
pub fn code_table(l: u32) -> Vec<f32> {
    (0..1u32 << l).map(code_1mad).collect()
}

/// The table of every `L`-bit state's value under the spec's code.
pub fn spec_code_table(spec: &TrellisSpec) -> Vec<f32> {
    (0..1u32 << spec.l)
        .map(|s| spec.code.value(spec.l, s))
        .collect()
}

/// The checks [`quantize`] and [`encode_rows`] (named `op`) make of their input: a shape the
/// spec codes, `rows * cols` values, every one finite.
fn check_values(
    spec: &TrellisSpec,
    op: &'static str,
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Result<(), TrellisError> {
    spec.check_shape(rows, cols)?;
    if w.len() != rows * cols {
        return Err(TrellisError::Values {
            op,
            values: w.len(),
            rows,
            cols,
        });
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(TrellisError::NonFinite {
            op,
            row: i / cols,
            col: i % cols,
        });
    }
    Ok(())
}

/// Trellis-quantizes a row-major `(rows, cols)` matrix: incoherence with the signs of
/// `seed`, per-row normalization, Viterbi on `threads` threads, least-squares row scales.
/// Returns `(words (rows, cols * k / 32), scales (rows))`.
pub fn quantize(
    spec: &TrellisSpec,
    w: &[f32],
    rows: usize,
    cols: usize,
    seed: u64,
    threads: usize,
) -> Result<(Vec<u32>, Vec<f32>), TrellisError> {
    check_values(spec, "quantize", w, rows, cols)?;
    let (su, sv) = layer_signs(seed, rows, cols);
    let mut wt = w.to_vec();
    incoherent(&mut wt, rows, cols, &su, &sv);
    encode_rows(spec, &wt, rows, cols, threads)
}

/// Trellis-codes the rows of a row-major `(rows, cols)` matrix as they are (no incoherence
/// transform here: [`quantize`] applies its own first, the trellis KV cache its per-token
/// one): each row divided by its RMS, Viterbi on `threads` threads, then a least-squares
/// scale per row. Returns `(words (rows, cols * k / 32), scales (rows))`; a row's code
/// depends on that row only.
pub fn encode_rows(
    spec: &TrellisSpec,
    wt: &[f32],
    rows: usize,
    cols: usize,
    threads: usize,
) -> Result<(Vec<u32>, Vec<f32>), TrellisError> {
    check_values(spec, "encode", wt, rows, cols)?;
    let rms: Vec<f32> = wt
        .chunks_exact(cols)
        .map(|r| {
            let ss: f64 = r.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            ((ss / cols as f64).sqrt() as f32).max(f32::MIN_POSITIVE)
        })
        .collect();
    let codes = spec_code_table(spec);
    let wpr = cols * spec.k as usize / 32;
    let mut words = vec![0u32; rows * wpr];
    let isa = super::Isa::detect();
    let threads = threads.max(1).min(rows);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let bw = spec.block_words();
    {
        // Rows handed out one at a time; each thread writes only the rows it took.
        let slots: Vec<std::sync::Mutex<&mut [u32]>> = words
            .chunks_exact_mut(wpr)
            .map(std::sync::Mutex::new)
            .collect();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    let mut scratch = Scratch::new(spec);
                    let mut x = vec![0.0f32; spec.block];
                    loop {
                        let r = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if r >= rows {
                            break;
                        }
                        let mut out = slots[r].lock().unwrap_or_else(|e| e.into_inner());
                        for (b, chunk) in wt[r * cols..(r + 1) * cols]
                            .chunks_exact(spec.block)
                            .enumerate()
                        {
                            for (xi, &v) in x.iter_mut().zip(chunk) {
                                *xi = v / rms[r];
                            }
                            encode_block(
                                isa,
                                spec,
                                &x,
                                &codes,
                                &mut scratch,
                                &mut out[b * bw..(b + 1) * bw],
                            );
                        }
                    }
                });
            }
        });
    }
    // Least-squares scale of each row over the codes chosen.
    let mut scales = vec![0.0f32; rows];
    let mut dec = vec![0.0f32; cols];
    for r in 0..rows {
        decode_row(spec, &words[r * wpr..(r + 1) * wpr], 1.0, &mut dec);
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for (&c, &v) in dec.iter().zip(&wt[r * cols..(r + 1) * cols]) {
            num += f64::from(c) * f64::from(v);
            den += f64::from(c) * f64::from(c);
        }
        scales[r] = if den > 0.0 { (num / den) as f32 } else { 0.0 };
    }
    Ok((words, scales))
}

/// The unit block-lower factor of `h` (`n x n`, row-major, symmetric positive definite) for
/// blocks of `b`: `h = (I + A) D (I + A)^T` with `A` strictly block-lower and `D` block
/// diagonal; returns `I + A` (row-major, f64). From the Cholesky factor `C` (`h = C C^T`):
/// `I + A = C blockdiag(C_jj)^-1`.
fn block_ldl(h: &[f64], n: usize, b: usize) -> Result<Vec<f64>, TrellisError> {
    let mut c = vec![0.0f64; n * n];
    for j in 0..n {
        let mut d = h[j * n + j];
        for k in 0..j {
            d -= c[j * n + k] * c[j * n + k];
        }
        if d <= 0.0 || !d.is_finite() {
            return Err(TrellisError::NotPositiveDefinite { column: j });
        }
        let d = d.sqrt();
        c[j * n + j] = d;
        for i in j + 1..n {
            let mut v = h[i * n + j];
            for k in 0..j {
                v -= c[i * n + k] * c[j * n + k];
            }
            c[i * n + j] = v / d;
        }
    }
    // Right-multiply each column block by the inverse of its diagonal block (lower
    // triangular): solve X C_jj = C_(:, j) for the rows below the block, row by row.
    let mut out = vec![0.0f64; n * n];
    for j0 in (0..n).step_by(b) {
        for i in j0..n {
            // x C_jj = r, C_jj lower triangular: back-substitute from the last column.
            let mut x = vec![0.0f64; b];
            for col in (0..b).rev() {
                let mut v = c[i * n + j0 + col];
                for (k, &xk) in x.iter().enumerate().skip(col + 1) {
                    v -= xk * c[(j0 + k) * n + j0 + col];
                }
                x[col] = v / c[(j0 + col) * n + j0 + col];
            }
            out[i * n + j0..i * n + j0 + b].copy_from_slice(&x);
        }
    }
    Ok(out)
}

/// Trellis-quantizes a row-major `(rows, cols)` matrix with LDLQ (QuIP/QTIP's Hessian-aware
/// rounding): `hessian` is the `(cols, cols)` second moment `E[x x^T]` of the layer's inputs
/// (row-major, original basis). The Hessian is taken to the incoherent basis and damped by 1%
/// of its mean diagonal; each row's blocks are coded from the last to the first, each block's
/// target being its weights plus the errors of the blocks already coded fed back through the
/// block LDL factor, so the error the layer's outputs see (`tr(E H E^T)`), not the weights'
/// error, is what the code minimizes. Each row's scale is then refitted to the codes chosen
/// under the same (damped) Hessian: `s = c^T H w / c^T H c` (`c` the row's unit-scale codes),
/// the scalar that minimizes `(w - s c)^T H (w - s c)`, so the refit never raises the error
/// the feedback minimized (the coding used the row's RMS). Same layout and outputs as
/// [`quantize`].
#[allow(clippy::too_many_arguments)]
pub fn quantize_ldlq(
    spec: &TrellisSpec,
    w: &[f32],
    rows: usize,
    cols: usize,
    seed: u64,
    threads: usize,
    hessian: &[f32],
) -> Result<(Vec<u32>, Vec<f32>), TrellisError> {
    spec.check_shape(rows, cols)?;
    if w.len() != rows * cols || hessian.len() != cols * cols {
        return Err(TrellisError::LdlqSizes {
            weights: w.len(),
            hessian: hessian.len(),
            rows,
            cols,
        });
    }
    if w.iter().chain(hessian).any(|v| !v.is_finite()) {
        return Err(TrellisError::LdlqNonFinite);
    }
    let (su, sv) = layer_signs(seed, rows, cols);
    let mut wt = w.to_vec();
    incoherent(&mut wt, rows, cols, &su, &sv);
    let mut hp = hessian.to_vec();
    incoherent(&mut hp, cols, cols, &sv, &sv);
    let mut h: Vec<f64> = hp.iter().map(|&v| f64::from(v)).collect();
    let mean_diag = (0..cols).map(|i| h[i * cols + i]).sum::<f64>() / cols as f64;
    let damp_frac = std::env::var("MLX_TRELLIS_DAMP")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(0.01);
    let damp = damp_frac * mean_diag.max(f64::MIN_POSITIVE);
    for i in 0..cols {
        h[i * cols + i] += damp;
    }
    // The blocks' coding order (the last coded first): as stored, or with
    // `MLX_TRELLIS_ORDER=act` the blocks sorted by their share of the Hessian's trace
    // (`tr H_jj`), the largest coded first (GPTQ's act-order, by blocks). `perm[p]`: the
    // stored block at position `p`; the Hessian and the rows are permuted to that order, the
    // codes written back to their stored blocks.
    let (b, nb) = (spec.block, cols / spec.block);
    let mut perm: Vec<usize> = (0..nb).collect();
    if std::env::var("MLX_TRELLIS_ORDER").is_ok_and(|v| v == "act") {
        let tr: Vec<f64> = (0..nb)
            .map(|j| (j * b..(j + 1) * b).map(|i| h[i * cols + i]).sum())
            .collect();
        perm.sort_by(|&a, &c| tr[a].total_cmp(&tr[c]));
    }
    let src = |i: usize| perm[i / b] * b + i % b;
    if perm.iter().enumerate().any(|(p, &q)| p != q) {
        let hq = h.clone();
        for i in 0..cols {
            for j in 0..cols {
                h[i * cols + j] = hq[src(i) * cols + src(j)];
            }
        }
        let wq = wt.clone();
        for r in 0..rows {
            for i in 0..cols {
                wt[r * cols + i] = wq[r * cols + src(i)];
            }
        }
    }
    let lf = block_ldl(&h, cols, spec.block)?;
    // Transposed, so the feedback of a column reads a contiguous run.
    let mut lt = vec![0.0f64; cols * cols];
    for i in 0..cols {
        for j in 0..cols {
            lt[j * cols + i] = lf[i * cols + j];
        }
    }
    let rms: Vec<f32> = wt
        .chunks_exact(cols)
        .map(|r| {
            let ss: f64 = r.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            ((ss / cols as f64).sqrt() as f32).max(f32::MIN_POSITIVE)
        })
        .collect();
    let codes = spec_code_table(spec);
    let wpr = cols * spec.k as usize / 32;
    let mut words = vec![0u32; rows * wpr];
    let isa = super::Isa::detect();
    let threads = threads.max(1).min(rows);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let bw = spec.block_words();
    let grid: &[f32] = &ldlq_grid();
    // `MLX_TRELLIS_SCALE=unbiased`: each row's scale refitted so that its coded row's
    // component along the row is the row (`s = w'Hw / c'Hw`) instead of least squares, which
    // shrinks every output by the row's error (results/quant/2026-12-05-s30-trellis/).
    let unbiased = std::env::var("MLX_TRELLIS_SCALE").is_ok_and(|v| v == "unbiased");
    // Each row's refitted scale (f32 bits), written by the thread that coded the row.
    let fitted: Vec<std::sync::atomic::AtomicU32> = rms
        .iter()
        .map(|v| std::sync::atomic::AtomicU32::new(v.to_bits()))
        .collect();
    {
        let slots: Vec<std::sync::Mutex<&mut [u32]>> = words
            .chunks_exact_mut(wpr)
            .map(std::sync::Mutex::new)
            .collect();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    let mut scratch = Scratch::new(spec);
                    let mut x = vec![0.0f32; b];
                    let mut dec = vec![0.0f32; b];
                    let mut err = vec![0.0f64; cols];
                    let mut coded = vec![0.0f64; cols];
                    let mut row64 = vec![0.0f64; cols];
                    let mut cand = vec![0u32; wpr];
                    loop {
                        let r = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if r >= rows {
                            break;
                        }
                        let mut out = slots[r].lock().unwrap_or_else(|e| e.into_inner());
                        let row = &wt[r * cols..(r + 1) * cols];
                        for (o, &v) in row64.iter_mut().zip(row) {
                            *o = f64::from(v);
                        }
                        // The row coded at each candidate scale (`rms` times the grid's
                        // factors); kept: the codes whose refitted scale leaves the least
                        // output error `w'Hw - (c'Hw)^2 / c'Hc`.
                        let mut best = f64::INFINITY;
                        for &g in grid {
                            let sc = rms[r] * g;
                            err.iter_mut().for_each(|e| *e = 0.0);
                            for j in (0..nb).rev() {
                                let j0 = j * b;
                                for (c, xi) in x.iter_mut().enumerate() {
                                    let fb = &lt[(j0 + c) * cols + j0 + b..(j0 + c + 1) * cols];
                                    let t = f64::from(row[j0 + c]) + dot(&err[j0 + b..], fb);
                                    *xi = (t / f64::from(sc)) as f32;
                                }
                                let bo = &mut cand[perm[j] * bw..(perm[j] + 1) * bw];
                                encode_block(isa, spec, &x, &codes, &mut scratch, bo);
                                decode_row(spec, bo, sc, &mut dec);
                                for (((e, cd), &v), &d) in err[j0..j0 + b]
                                    .iter_mut()
                                    .zip(&mut coded[j0..j0 + b])
                                    .zip(&row[j0..j0 + b])
                                    .zip(&dec)
                                {
                                    *e = f64::from(v) - f64::from(d);
                                    *cd = f64::from(d);
                                }
                            }
                            // The scale under the damped Hessian: `c^T H w / c^T H c`, with
                            // `c` the coded row at scale `sc` (so the ratio multiplies `sc`).
                            let (mut num, mut den, mut whw) = (0.0f64, 0.0f64, 0.0f64);
                            for ((hr, &ci), &wi) in h.chunks_exact(cols).zip(&coded).zip(&row64) {
                                let (hc, hw) = two_dots(hr, &coded, &row64);
                                num += ci * hw;
                                den += ci * hc;
                                whw += wi * hw;
                            }
                            // Least squares `c'Hw / c'Hc` (error `w'Hw - (c'Hw)^2 / c'Hc`), or
                            // unbiased `w'Hw / c'Hw` (error `w'Hw (w'Hw c'Hc / (c'Hw)^2 - 1)`).
                            let fit = if den > 0.0 && num > 0.0 {
                                if unbiased {
                                    whw / num
                                } else {
                                    num / den
                                }
                            } else {
                                1.0
                            };
                            let e = if den > 0.0 && num > 0.0 {
                                whw - 2.0 * fit * num + fit * fit * den
                            } else {
                                whw
                            };
                            if e < best || best == f64::INFINITY {
                                best = e;
                                out.copy_from_slice(&cand);
                                let s = ((f64::from(sc) * fit) as f32).to_bits();
                                fitted[r].store(s, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
    }
    let scales = fitted
        .iter()
        .map(|v| f32::from_bits(v.load(std::sync::atomic::Ordering::Relaxed)))
        .collect();
    Ok((words, scales))
}

/// The factors of the rows' RMS at which LDLQ codes each row (the best kept):
/// `MLX_TRELLIS_GRID` (comma-separated; an experiment's knob), else 1 alone.
fn ldlq_grid() -> Vec<f32> {
    std::env::var("MLX_TRELLIS_GRID")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|f| f.trim().parse::<f32>().ok())
                .filter(|f| f.is_finite() && *f > 0.0)
                .collect::<Vec<_>>()
        })
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| vec![1.0])
}

/// `a . b` in eight running sums (so the loop vectorizes): LDLQ's feedback.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut s = [0.0f64; 8];
    let n = a.len().min(b.len()) / 8 * 8;
    for (x, y) in a[..n].chunks_exact(8).zip(b[..n].chunks_exact(8)) {
        for j in 0..8 {
            s[j] += x[j] * y[j];
        }
    }
    let mut t: f64 = s.iter().sum();
    for (x, y) in a[n..].iter().zip(&b[n..]) {
        t += x * y;
    }
    t
}

/// `(h . c, h . w)` in eight running sums each (so the loop vectorizes): the refit's two
/// products of a Hessian row.
fn two_dots(h: &[f64], c: &[f64], w: &[f64]) -> (f64, f64) {
    let (mut a, mut b) = ([0.0f64; 8], [0.0f64; 8]);
    let n = h.len() / 8 * 8;
    for ((hh, cc), ww) in h[..n]
        .chunks_exact(8)
        .zip(c[..n].chunks_exact(8))
        .zip(w[..n].chunks_exact(8))
    {
        for j in 0..8 {
            a[j] += hh[j] * cc[j];
            b[j] += hh[j] * ww[j];
        }
    }
    let (mut sa, mut sb): (f64, f64) = (a.iter().sum(), b.iter().sum());
    for i in n..h.len() {
        sa += h[i] * c[i];
        sb += h[i] * w[i];
    }
    (sa, sb)
}

/// A layer's sign vectors `(su (rows), sv (cols))` from its seed.
pub fn layer_signs(seed: u64, rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>) {
    (signs(seed, rows), signs(seed ^ 0x5555_5555_5555_5555, cols))
}

/// Decodes one row's words into `out` (`cols` values): `scale * code(state)`.
pub fn decode_row(spec: &TrellisSpec, words: &[u32], scale: f32, out: &mut [f32]) {
    let bw = spec.block_words();
    let k = spec.k as usize;
    let l = spec.l;
    let mask = (1u32 << l) - 1;
    for (bwords, bout) in words.chunks_exact(bw).zip(out.chunks_exact_mut(spec.block)) {
        // The first state from its window, then k new bits a weight, sequentially.
        let mut state = window(spec, bwords, 0);
        bout[0] = spec.code.value(l, state) * scale;
        let mut bitpos = k; // next bit of the stream
        for o in bout.iter_mut().skip(1) {
            let a = bitpos / 32;
            let off = bitpos % 32;
            let v = if off + k <= 32 {
                (bwords[a] >> (32 - off - k)) & ((1 << k) - 1)
            } else {
                let hi = u64::from(bwords[a]);
                let lo = u64::from(bwords[(a + 1) % bw]);
                ((((hi << 32) | lo) >> (64 - off - k)) as u32) & ((1 << k) - 1)
            };
            state = ((state << k) | v) & mask;
            *o = spec.code.value(l, state) * scale;
            bitpos += k;
        }
    }
}

/// Decodes a whole `(rows, cols)` matrix (`scales` per row) on up to `threads` threads.
pub fn decode(
    spec: &TrellisSpec,
    words: &[u32],
    scales: &[f32],
    rows: usize,
    cols: usize,
    threads: usize,
    out: &mut [f32],
) -> Result<(), TrellisError> {
    spec.check_shape(rows, cols)?;
    let wpr = cols * spec.k as usize / 32;
    if words.len() != rows * wpr || scales.len() != rows || out.len() != rows * cols {
        return Err(TrellisError::DecodeSizes {
            words: words.len(),
            scales: scales.len(),
            outputs: out.len(),
            rows,
            cols,
        });
    }
    let threads = threads.max(1).min(rows);
    let per = rows.div_ceil(threads);
    std::thread::scope(|scope| {
        for (i, chunk) in out.chunks_mut(per * cols).enumerate() {
            let r0 = i * per;
            scope.spawn(move || {
                for (j, row) in chunk.chunks_exact_mut(cols).enumerate() {
                    let r = r0 + j;
                    decode_row(spec, &words[r * wpr..(r + 1) * wpr], scales[r], row);
                }
            });
        }
    });
    Ok(())
}

/// Per-weight read positions of a block: `(word, next word, right shift)` of each window.
fn window_table(spec: &TrellisSpec) -> (Vec<u32>, Vec<u32>, Vec<u64>) {
    let bw = spec.block_words();
    let (mut a, mut a1, mut sh) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..spec.block {
        let start = spec.window_start(t);
        a.push((start / 32) as u32);
        a1.push(((start / 32 + 1) % bw) as u32);
        sh.push((64 - start % 32 - spec.l as usize) as u64);
    }
    (a, a1, sh)
}

#[inline(always)]
fn block_dot(words: &[u32], a: &[u32], a1: &[u32], sh: &[u64], mask: u64, x: &[f32]) -> f32 {
    // Sixteen partial sums (one vector lane each), so the loop vectorizes.
    let mut lanes = [0.0f32; 16];
    let n = x.len() / 16 * 16;
    for c in (0..n).step_by(16) {
        for (j, lane) in lanes.iter_mut().enumerate() {
            let t = c + j;
            let hi = u64::from(words[a[t] as usize]);
            let lo = u64::from(words[a1[t] as usize]);
            let state = ((((hi << 32) | lo) >> sh[t]) & mask) as u32;
            *lane += code_1mad(state) * x[t];
        }
    }
    let mut acc: f32 = lanes.iter().sum();
    for t in n..x.len() {
        let hi = u64::from(words[a[t] as usize]);
        let lo = u64::from(words[a1[t] as usize]);
        let state = ((((hi << 32) | lo) >> sh[t]) & mask) as u32;
        acc += code_1mad(state) * x[t];
    }
    acc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn block_dot_avx512(
    words: &[u32],
    a: &[u32],
    a1: &[u32],
    sh: &[u64],
    mask: u64,
    x: &[f32],
) -> f32 {
    block_dot(words, a, a1, sh, mask, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_dot_avx2(
    words: &[u32],
    a: &[u32],
    a1: &[u32],
    sh: &[u64],
    mask: u64,
    x: &[f32],
) -> f32 {
    block_dot(words, a, a1, sh, mask, x)
}

/// Fused decode and product for one input: `y[r] = scale[r] * sum_c code(state_rc) * x[c]`
/// over the rows `r0..r0 + y.len()` (the trellis matrix-vector kernel; `x` is the already
/// transformed input `H_c (sv * x)`). Each weight's state is read from its own window, so the
/// loop has no carried dependency and runs on the widest vectors the CPU has.
pub fn matvec_rows(
    spec: &TrellisSpec,
    words: &[u32],
    scales: &[f32],
    cols: usize,
    x: &[f32],
    r0: usize,
    y: &mut [f32],
) {
    let wpr = cols * spec.k as usize / 32;
    if spec.code != TrellisCode::Mad {
        // This first kernel computes 1MAD only: other codes decode the row and dot it.
        let mut dec = vec![0.0f32; cols];
        for (i, yo) in y.iter_mut().enumerate() {
            let r = r0 + i;
            decode_row(spec, &words[r * wpr..(r + 1) * wpr], 1.0, &mut dec);
            *yo = dec.iter().zip(x).map(|(a, b)| a * b).sum::<f32>() * scales[r];
        }
        return;
    }
    let bw = spec.block_words();
    let (a, a1, sh) = window_table(spec);
    let mask = (1u64 << spec.l) - 1;
    let isa = super::Isa::detect();
    for (i, yo) in y.iter_mut().enumerate() {
        let r = r0 + i;
        let row = &words[r * wpr..(r + 1) * wpr];
        let mut acc = 0.0f32;
        for (b, xb) in x.chunks_exact(spec.block).enumerate() {
            let bwords = &row[b * bw..(b + 1) * bw];
            acc += match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::detect` found AVX-512 F/BW/VL (and AVX2, FMA) on this CPU.
                super::Isa::Avx512 => unsafe { block_dot_avx512(bwords, &a, &a1, &sh, mask, xb) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::detect` found AVX2 and FMA on this CPU.
                super::Isa::Avx2 => unsafe { block_dot_avx2(bwords, &a, &a1, &sh, mask, xb) },
                _ => block_dot(bwords, &a, &a1, &sh, mask, xb),
            };
        }
        *yo = acc * scales[r];
    }
}

/// The fused decode-and-dot kernel of one trellis matrix, prepared once (its read plan):
/// `y[r] = scale[r] * sum_c code(state_rc) * x[c]`, `x` the already transformed input
/// `H_c (sv * x)`. Each weight's `L`-bit window is read independently of its neighbours: for
/// each position of a block the plan names the word holding the window's high bits, the word
/// holding its low bits and the right shift of their 64-bit concatenation that brings the
/// window to the bottom. On AVX-512 (VBMI2 + VNNI) sixteen windows at a time are gathered from
/// the block's words held in one register (`vpermd`), funnel-shifted (`vpshrdvd`; with VBMI
/// one `vpermd` and a `vpmultishiftqb` instead, [`GatherPlan`]), coded
/// (`vpmulld`, then `vpdpbusd` sums the four bytes minus 510 in one instruction) and
/// multiply-added to the input; elsewhere the same plan runs in portable Rust. The integer code
/// `byte sum - 510` is summed against `x` and divided by 1MAD's divisor once a row, so a
/// product differs from the decoded matrix's by rounding only.
#[derive(Clone, Debug)]
pub struct TrellisMatvec {
    spec: TrellisSpec,
    cols: usize,
    hi: Vec<u32>,
    lo: Vec<u32>,
    sh: Vec<u32>,
    simd: bool,
    /// The window-gather path's read plan on AVX-512 VBMI ([`GatherPlan`]), where it applies.
    gather: Option<GatherPlan>,
    /// The table path's plan (`L <= 8`, or [`TrellisCode::Mad8H`]; blocks of 32 or a multiple
    /// of 64 weights, AVX-512 VBMI).
    lut: Option<LutPlan>,
    /// Whether [`TrellisMatvec::rows`] and [`TrellisMatvec::par`] give the table path int16
    /// inputs (`vpdpwssd`, L3) rather than float32 ones (exact up to the summation order, the
    /// default). The CPU decoder's products choose by their context's activations instead.
    int16: bool,
}

/// The window-gather path's plan with AVX-512 VBMI: per 16 weights of a block, the dword
/// permutation (`vpermd`) that puts in each 64-bit lane `q` the two words holding the windows
/// of weights `2q` and `2q + 1` (high word first, in the lane's upper half), and the bit
/// offsets from which `vpmultishiftqb` takes each 32-bit lane's four bytes, so that each lane's
/// low `L` bits are its weight's window: one `vpermd` and one `vpmultishiftqb` (port 5) where
/// the plain plan takes two `vpermd` and a `vpshrdvd` (port 0, which the code's `vpmulld`,
/// `vpdpbusd` and `vcvtdq2ps` also need). The states, so the codes and every product's bits,
/// are the plain plan's.
#[derive(Clone, Debug)]
struct GatherPlan {
    idx: Vec<u32>,
    ctrl: Vec<u8>,
}

impl GatherPlan {
    /// The plan for `spec` (blocks of a multiple of 16 weights, at most 16 words), where every
    /// pair's windows lie within its lane's 64 bits.
    fn new(spec: &TrellisSpec) -> Option<GatherPlan> {
        let (k, l, block, bw) = (
            spec.k as usize,
            spec.l as usize,
            spec.block,
            spec.block_words(),
        );
        let bits = block * k;
        if block % 16 != 0 || bw > 16 {
            return None;
        }
        let (mut idx, mut ctrl) = (Vec::with_capacity(block), Vec::with_capacity(4 * block));
        for t in (0..block).step_by(2) {
            let a = spec.window_start(t) / 32;
            // Lane `q`'s low dword the next word, its high dword word `a`.
            idx.push(((a + 1) % bw) as u32);
            idx.push(a as u32);
            for tt in [t, t + 1] {
                // The window's first bit from word `a`'s first, cyclically: at lane bit
                // `63 - s`, its lowest at `64 - s - L`.
                let s = (spec.window_start(tt) + bits - 32 * a) % bits;
                if s + l > 64 {
                    return None;
                }
                let off = 64 - s - l;
                for m in 0..4 {
                    ctrl.push(((off + 8 * m) % 64) as u8);
                }
            }
        }
        Some(GatherPlan { idx, ctrl })
    }
}

/// The plan of the table path (`L <= 8`, or [`TrellisCode::Mad8H`]): per group of 64 weights
/// of a block, the dword permutation that puts in each 64-bit lane `q` the two words holding
/// the windows of weights `8q..8q + 8` (high word first, in the lane's upper half), and the 64
/// bit offsets from which `vpmultishiftqb` takes each weight's 8-bit window (1mad8h: its
/// state's bottom byte, and in `ctrl_top` its top byte, which one `vpaddb` adds into the
/// table index); the code of every 8-bit state (index) as two byte tables (the bytes of the
/// code as a 16-bit integer); the order in which the kernel meets a group's weights
/// ([`lut_order`]), so the input is permuted to it once a call.
#[derive(Clone, Debug)]
struct LutPlan {
    /// Weights a kernel step reads at once: the block, or 64 (two blocks of 32).
    span: usize,
    /// The words of `span` weights (at most 16).
    span_words: usize,
    idx: Vec<u32>,
    ctrl: Vec<u8>,
    /// [`TrellisCode::Mad8H`]: the offsets of each weight's top byte (the `L`-bit window's
    /// first 8 bits), in `ctrl`'s order; empty for the other codes.
    ctrl_top: Vec<u8>,
    /// [`TrellisCode::Mad8S`]: the top bytes go through the AES S-box (GFNI) before the add.
    sbox: bool,
    /// [`TrellisCode::Gauss7S`]: the tables' top halves repeat their bottom halves (a 7-bit
    /// index), so the int8 kernel looks up with one `vpermt2b`.
    half: bool,
    lo: [u8; 256],
    hi: [u8; 256],
    /// [`TrellisCode::Mad8`]'s codes plus 128 (the int8 kernel's unsigned operand).
    w8: [u8; 256],
    /// The int8 kernel's two-step plan, where it applies ([`PairPlan::new`]).
    pair: Option<PairPlan>,
}

/// The int8 kernel's plan for two steps of 64 weights at once (steps of one group, whose two
/// steps' words fit the 16 a load holds, and 16 consecutive windows of a block within 8
/// whole bytes of its stream: 2 and 3 bits a weight): one `vpermb` puts in each 64-bit lane
/// `q` the 8 stream bytes holding the windows of weights `16q..16q + 16` (first byte in the
/// lane's top, so the stream runs down from bit 63), and two `vpmultishiftqb` take the
/// first and the last 8 of them; where one `vpermd` a step fed one `vpmultishiftqb`. The
/// kernel meets the 128 weights in [`PairPlan::order`], so the input is permuted to it once a
/// product ([`Split::pl`]).
#[derive(Clone, Debug)]
struct PairPlan {
    /// The byte of the two steps' words each byte of the lanes takes.
    bytes: [u8; 64],
    /// The bit offsets of the two `vpmultishiftqb`.
    ctrl: [[u8; 64]; 2],
    /// [`TrellisCode::Mad8H`]: the offsets of the top bytes (as [`LutPlan::ctrl_top`]).
    ctrl_top: [[u8; 64]; 2],
    /// Position `i` of the kernel's 128 inputs holds weight `order[i]` of the two steps.
    order: [u8; 128],
}

impl PairPlan {
    /// The plan for steps of 64 weights (`span_words` words) of `spec`, where it applies.
    fn new(spec: &TrellisSpec, span: usize, span_words: usize) -> Option<PairPlan> {
        let (k, l, block) = (spec.k as usize, spec.l as usize, spec.block);
        let bw = spec.block_words();
        let bits = block * k;
        if span != 64 || 2 * span_words > 16 || block % 16 != 0 || bits % 8 != 0 {
            return None;
        }
        let mut plan = PairPlan {
            bytes: [0; 64],
            ctrl: [[0; 64]; 2],
            ctrl_top: [[0; 64]; 2],
            order: [0; 128],
        };
        for q in 0..8 {
            let (blk, t0) = (16 * q / block, 16 * q % block);
            let b0 = spec.window_start(t0) / 8;
            for m in 0..8 {
                // Lane byte `m` holds stream byte `b0 + 7 - m` (cyclically in the block): a
                // word's stream bytes lie in memory last first.
                let j = (b0 + 7 - m) % (bits / 8);
                plan.bytes[8 * q + m] = (4 * (blk * bw + j / 4) + 3 - j % 4) as u8;
            }
            for h in 0..2 {
                for j in 0..8 {
                    let t = t0 + 8 * h + j;
                    // The window's first bit, from stream byte `b0`'s first: at lane bit
                    // `63 - p`, its lowest at `64 - p - L`.
                    let p = (spec.window_start(t) + bits - 8 * b0) % bits;
                    if p + l > 64 {
                        return None;
                    }
                    plan.ctrl[h][8 * q + j] = (64 - p - l) as u8;
                    if spec.hashed() {
                        plan.ctrl_top[h][8 * q + j] = (64 - p - 8) as u8;
                    }
                    plan.order[64 * h + 8 * q + j] = (16 * q + 8 * h + j) as u8;
                }
            }
        }
        Some(plan)
    }
}

/// Position `i` of a group of 64 weights as the table kernel meets them: four vectors of 16,
/// the weights `4d`, `4d + 2`, `4d + 1` and `4d + 3` (`d` = 0..16; the low and high 16-bit
/// halves of each 32-bit lane of the even and the odd weights' codes).
fn lut_order(i: usize) -> usize {
    const OFF: [usize; 4] = [0, 2, 1, 3];
    4 * (i % 16) + OFF[i / 16]
}

/// The table path's input, prepared once a product: permuted to the kernel's order
/// ([`lut_order`] within each group of 64), into `out` (`x.len()` long).
fn lut_input_into(x: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend((0..x.len()).map(|i| x[i / 64 * 64 + lut_order(i % 64)]));
}

/// Position `i` of a group of 64 weights in the int16 table kernel's input: the even codes'
/// 32 words (weights `4d`, `4d + 2`, `d` = 0..16, as `vpdpwssd` pairs them), then the odd
/// codes' (`4d + 1`, `4d + 3`).
const fn lut_order16(i: usize) -> usize {
    let (half, j) = (i / 32, i % 32);
    4 * (j / 2) + 2 * (j % 2) + half
}

/// [`lut_order16`] of each position of a group of 64.
const ORDER16: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = lut_order16(i) as u8;
        i += 1;
    }
    t
};

/// The bound on an int16 input value: `x` is rounded to `round(x / d)`, `d = max |x| / 32767`.
const X16_MAX: f32 = 32767.0;

/// How many weights the int16 kernels sum in 32-bit integers before adding to the float sum:
/// a lane takes 2 products of at most `510 * 32767` a group of 64, so 2048 weights stay below
/// `2^31` (64 products, 1.07e9).
const X16_FLUSH: usize = 2048;

/// A product's input as the table path reads it, made once a product: float32 in
/// [`lut_order`] (exact inputs), or int16 in [`lut_order16`] with its step `d`
/// (`x ~= d * q`, `d = max |x| / 32767`, codes rounded half away from zero).
#[derive(Clone, Debug)]
enum Prepared {
    F32(Vec<f32>),
    I16(Vec<i16>, f32),
    /// [`TrellisCode::Mad8`]'s and [`TrellisCode::Mad8H`]'s int8 kernel input
    /// ([`split_input_into`]).
    S8(Split),
}

/// The int8 kernel's input ([`TrellisCode::Mad8`], [`TrellisCode::Mad8H`]): `x ~= d * q` with
/// `q = round(x / d)`, `d = max |x| / 32639` (half away from zero, natural order), as two
/// signed bytes `q = 256 * hi + lo` (`lo` in `-128..=127`, so `hi` stays in `-127..=127`),
/// and `sum q` (the kernel's weights are the codes plus 128: it takes `128 * sum q` off).
#[derive(Clone, Debug, Default)]
struct Split {
    lo: Vec<i8>,
    hi: Vec<i8>,
    sum: i64,
    d: f32,
    /// `lo` and `hi` in [`PairPlan::order`] within each whole 128 values (the rest as they
    /// are), where the kernel's plan has a [`PairPlan`]; else empty.
    pl: Vec<i8>,
    ph: Vec<i8>,
}

/// How far ahead of its step the int16 table kernels (and the int8 one's prompt twin) prefetch
/// the words (1 KB). A 3-bit step of 128 weights reads 48 bytes, so out-of-order execution
/// alone ran ~10 lines ahead and the weights streamed from memory slower than affine-4's; at
/// 1 KB they stream faster (results/quant/2026-12-05-s30-trellis-cpu/pf_ab.txt).
const PREFETCH_WORDS: usize = 256;

/// How far ahead the int8 kernel ([`TrellisMatvec::rows_lut8`], the decoder's trellis-3
/// `1mad8` path) prefetches: 2 KB. Against 1 KB in the same binary, through `mlx generate`
/// on a loaded machine, 2 KB gave the faster decode in 10 of 14 rounds (median +4.7%), 4 KB
/// +5.7% (8 rounds), 512 B -10.6%
/// (results/quant/2026-12-05-s31-trellis-cpu/README.md).
const PREFETCH_WORDS_I8: usize = 512;

/// Experiment knobs of the int8 kernel (read once): `MLX_CPU_TRELLIS_PF` = words ahead it
/// prefetches (default [`PREFETCH_WORDS_I8`]), `MLX_CPU_TRELLIS_CHUNK` = rows a work item of
/// [`matmul_jobs`] (default [`CHUNK`], 1 to 1024), `MLX_CPU_TRELLIS_ROWS2=0`: one row a
/// pass (no two-row loop). None changes a bit.
fn trellis_knobs() -> (usize, usize, bool) {
    static K: std::sync::OnceLock<(usize, usize, bool)> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let get = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        (
            get("MLX_CPU_TRELLIS_PF", PREFETCH_WORDS_I8),
            get("MLX_CPU_TRELLIS_CHUNK", CHUNK).clamp(1, 1024),
            get("MLX_CPU_TRELLIS_ROWS2", 1) != 0,
        )
    })
}

/// The window-gather path's knob (read once): `MLX_CPU_TRELLIS_MS=0` keeps its plain plan
/// (two `vpermd` and a `vpshrdvd` a 16 weights) instead of the [`GatherPlan`]. It changes no
/// bit.
fn gather_knob() -> bool {
    static K: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *K.get_or_init(|| std::env::var("MLX_CPU_TRELLIS_MS").as_deref() != Ok("0"))
}

/// The bound on the int8 kernel's input values (`256 * 127 + 127`).
const X8_MAX: f32 = 32639.0;

/// How many weights the int8 kernel sums in 32-bit lanes before adding them into 64-bit
/// sums: a lane takes 4 products of at most `255 * 32639` a group of 64, so 2048 weights
/// (32 groups) stay below `2^31` (1.07e9).
const X8_WINDOW: usize = 2048;

/// [`Split`] of `x` into `out` (its buffers reused): the int16 rounding of
/// [`lut_input16_portable`] (at [`X8_MAX`]) in natural order, split into bytes. The AVX-512
/// BW twin where the CPU has it ([`split_input_avx512`], the same bits).
fn split_input_into(x: &[f32], out: &mut Split) {
    let d = abs_max(x) / X8_MAX;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    out.lo.resize(x.len(), 0);
    out.hi.resize(x.len(), 0);
    out.d = d;
    #[cfg(target_arch = "x86_64")]
    if x.len() % 64 == 0
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: AVX-512 F/BW are present; `x`, `lo` and `hi` are whole groups of 64 of one
        // length.
        out.sum = unsafe { split_input_avx512(x, inv, &mut out.lo, &mut out.hi) };
        return;
    }
    out.sum = split_input_portable(x, inv, &mut out.lo, &mut out.hi);
}

/// [`Split::pl`] and [`Split::ph`] of `sp` for `pair` (emptied without one): each whole 128
/// of `lo` and `hi` permuted to [`PairPlan::order`], the rest copied. Two `vpermt2b` per 128
/// bytes where the CPU has AVX-512 VBMI (the same bytes).
fn pair_order_into(pair: Option<&PairPlan>, sp: &mut Split) {
    let Some(pair) = pair else {
        sp.pl.clear();
        sp.ph.clear();
        return;
    };
    let n = sp.lo.len();
    sp.pl.resize(n, 0);
    sp.ph.resize(n, 0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
    {
        // SAFETY: the features are present; each buffer is `n` long.
        unsafe {
            pair_order_avx512(pair, &sp.lo, &mut sp.pl);
            pair_order_avx512(pair, &sp.hi, &mut sp.ph);
        }
        return;
    }
    for (src, dst) in [(&sp.lo, &mut sp.pl), (&sp.hi, &mut sp.ph)] {
        let whole = n / 128 * 128;
        for (d, s) in dst[..whole]
            .chunks_exact_mut(128)
            .zip(src.chunks_exact(128))
        {
            for (o, &i) in d.iter_mut().zip(pair.order.iter()) {
                *o = s[i as usize];
            }
        }
        dst[whole..].copy_from_slice(&src[whole..]);
    }
}

/// [`pair_order_into`]'s permutation of `src` into `dst` on AVX-512 VBMI.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VBMI; `src.len() == dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair_order_avx512(pair: &PairPlan, src: &[i8], dst: &mut [i8]) {
    use std::arch::x86_64::*;
    let whole = src.len() / 128 * 128;
    // SAFETY (whole body): the loads and stores lie below `whole <= src.len() == dst.len()`.
    unsafe {
        let i0 = _mm512_loadu_si512(pair.order.as_ptr() as *const _);
        let i1 = _mm512_loadu_si512(pair.order.as_ptr().add(64) as *const _);
        for c in (0..whole).step_by(128) {
            let a = _mm512_loadu_si512(src.as_ptr().add(c) as *const _);
            let b = _mm512_loadu_si512(src.as_ptr().add(c + 64) as *const _);
            _mm512_storeu_si512(
                dst.as_mut_ptr().add(c) as *mut _,
                _mm512_permutex2var_epi8(a, i0, b),
            );
            _mm512_storeu_si512(
                dst.as_mut_ptr().add(c + 64) as *mut _,
                _mm512_permutex2var_epi8(a, i1, b),
            );
        }
    }
    dst[whole..].copy_from_slice(&src[whole..]);
}

/// One value of [`split_input_into`]: `(lo, hi)` with `256 * hi + lo = q`.
#[inline(always)]
fn split_one(v: f32) -> (i8, i8, i32) {
    let r = v + 0.5f32.copysign(v);
    // Saturating at the bound (NaN gives 0), then truncated toward zero.
    let q = (r.clamp(-X8_MAX, X8_MAX) as i32).clamp(-32639, 32639);
    let lo = ((q + 128) & 255) - 128;
    (lo as i8, ((q - lo) >> 8) as i8, q)
}

/// [`split_input_into`]'s portable loop (the reference of its SIMD twin); returns `sum q`.
fn split_input_portable(x: &[f32], inv: f32, lo: &mut [i8], hi: &mut [i8]) -> i64 {
    let mut sum = 0i64;
    for ((&v, l), h) in x.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
        let (a, b, q) = split_one(v * inv);
        *l = a;
        *h = b;
        sum += i64::from(q);
    }
    sum
}

/// [`split_input_portable`] on AVX-512 BW, bit for bit: the same product and rounding add,
/// NaN lanes zeroed and the rest clamped to [`X8_MAX`] before a truncating conversion, then
/// the bytes by integer ops; `sum q` in 64-bit lanes.
///
/// # Safety
/// The CPU has AVX-512 F and BW; `x`, `lo` and `hi` have one length, a multiple of 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn split_input_avx512(x: &[f32], inv: f32, lo: &mut [i8], hi: &mut [i8]) -> i64 {
    use std::arch::x86_64::*;
    // SAFETY (whole body): every load and store lies below `x.len()` (the caller's contract).
    unsafe {
        let vinv = _mm512_set1_ps(inv);
        let half = _mm512_castps_si512(_mm512_set1_ps(0.5));
        let sign = _mm512_set1_epi32(i32::MIN);
        let (vlo, vhi) = (_mm512_set1_ps(-X8_MAX), _mm512_set1_ps(X8_MAX));
        let c128 = _mm512_set1_epi32(128);
        let c255 = _mm512_set1_epi32(255);
        let mut acc = _mm512_setzero_si512();
        for g in (0..x.len()).step_by(16) {
            let v = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(g)), vinv);
            let sv = _mm512_or_si512(half, _mm512_and_si512(_mm512_castps_si512(v), sign));
            let r = _mm512_add_ps(v, _mm512_castsi512_ps(sv));
            let ord = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
            let c = _mm512_min_ps(_mm512_max_ps(r, vlo), vhi);
            let q = _mm512_maskz_cvttps_epi32(ord, c);
            let l = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(q, c128), c255), c128);
            let h = _mm512_srai_epi32::<8>(_mm512_sub_epi32(q, l));
            _mm_storeu_si128(lo.as_mut_ptr().add(g) as *mut _, _mm512_cvtepi32_epi8(l));
            _mm_storeu_si128(hi.as_mut_ptr().add(g) as *mut _, _mm512_cvtepi32_epi8(h));
            acc = _mm512_add_epi64(acc, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(q)));
            acc = _mm512_add_epi64(
                acc,
                _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(q)),
            );
        }
        _mm512_reduce_add_epi64(acc)
    }
}

/// `max |x|` (NaN values ignored, as `f32::max` does), in 16 lanes so the compiler
/// vectorizes it (`max` is exact, so the lanes' order changes no bit).
fn abs_max(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, &v) in lanes.iter_mut().zip(c) {
            *a = a.max(v.abs());
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0.0f32, |a, v| a.max(v.abs()));
    lanes.iter().fold(tail, |a, &v| a.max(v))
}

/// The int16 table path's input ([`Prepared`]'s `q` and `d`; `x` whole groups of 64, as the
/// table path's columns are) into `q` (`x.len()` long); returns `d`. Part of a product's
/// input transform (on one worker while the others run other jobs' rows), so it takes the
/// AVX-512 BW twin where the CPU has it ([`lut_input16_avx512`], the same bits);
/// [`lut_input16_portable`] is its reference: the rounding is `v + 0.5 * sign(v)` truncated
/// (half away from zero; the cast saturates at the int16 range, NaN gives 0).
fn lut_input16_into(x: &[f32], q: &mut [i16]) -> f32 {
    let d = abs_max(x) / X16_MAX;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    #[cfg(target_arch = "x86_64")]
    if x.len() % 64 == 0
        && q.len() == x.len()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: AVX-512 F/BW are present; `x` and `q` are whole groups of 64 of one length.
        unsafe { lut_input16_avx512(x, inv, q) };
        return d;
    }
    lut_input16_portable(x, inv, q);
    d
}

/// [`lut_input16_into`]'s portable loop: `q[i]` = `x`'s value at [`lut_order16`] of `i`
/// within its group of 64, times `inv`, rounded half away from zero (saturating).
fn lut_input16_portable(x: &[f32], inv: f32, q: &mut [i16]) {
    for (qc, xc) in q.chunks_exact_mut(64).zip(x.chunks_exact(64)) {
        for (o, &j) in qc.iter_mut().zip(ORDER16.iter()) {
            let v = xc[j as usize] * inv;
            *o = (v + 0.5f32.copysign(v)) as i16;
        }
    }
}

/// [`lut_input16_portable`] on AVX-512 BW, bit for bit: per group of 64 the same products and
/// sums, NaN lanes zeroed and the rest clamped to the int16 range before a truncating
/// conversion (what Rust's saturating cast gives), then two `vpermt2w` into [`lut_order16`].
///
/// # Safety
/// The CPU has AVX-512 F and BW; `x.len() == q.len()`, a multiple of 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn lut_input16_avx512(x: &[f32], inv: f32, q: &mut [i16]) {
    use std::arch::x86_64::*;
    const IDX: [[u16; 32]; 2] = {
        let mut t = [[0u16; 32]; 2];
        let mut i = 0;
        while i < 64 {
            t[i / 32][i % 32] = ORDER16[i] as u16;
            i += 1;
        }
        t
    };
    // SAFETY (whole body): every load and store lies in groups of 64 below `x.len()` =
    // `q.len()` (the caller's contract).
    unsafe {
        let lo_idx = _mm512_loadu_si512(IDX[0].as_ptr() as *const _);
        let hi_idx = _mm512_loadu_si512(IDX[1].as_ptr() as *const _);
        let vinv = _mm512_set1_ps(inv);
        let half = _mm512_castps_si512(_mm512_set1_ps(0.5));
        let sign = _mm512_set1_epi32(i32::MIN);
        let (lo, hi) = (_mm512_set1_ps(-32768.0), _mm512_set1_ps(32767.0));
        let conv = |p: *const f32| {
            let v = _mm512_mul_ps(_mm512_loadu_ps(p), vinv);
            // `0.5` with `v`'s sign (`copysign`), in integer ops (AVX-512 F has no float
            // bitwise ones).
            let sv = _mm512_or_si512(half, _mm512_and_si512(_mm512_castps_si512(v), sign));
            let r = _mm512_add_ps(v, _mm512_castsi512_ps(sv));
            let ord = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
            let c = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
            _mm512_cvtepi32_epi16(_mm512_maskz_cvttps_epi32(ord, c))
        };
        for g in (0..x.len()).step_by(64) {
            let p = x.as_ptr().add(g);
            let a = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(conv(p)), conv(p.add(16)));
            let b =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(conv(p.add(32))), conv(p.add(48)));
            let o = q.as_mut_ptr().add(g);
            _mm512_storeu_si512(o as *mut _, _mm512_permutex2var_epi16(a, lo_idx, b));
            _mm512_storeu_si512(o.add(32) as *mut _, _mm512_permutex2var_epi16(a, hi_idx, b));
        }
    }
}

impl LutPlan {
    /// Whether the plan hashes each index from two windows (1mad8h: `ctrl_top` is filled).
    fn hashed(&self) -> bool {
        !self.ctrl_top.is_empty()
    }

    /// Whether each index byte is whole as looked up (8-bit states, or 1mad8h's byte sum), so
    /// no `L` mask is applied.
    fn full(&self, l: u32) -> bool {
        l == 8 || self.hashed()
    }

    fn new(spec: &TrellisSpec, cols: usize) -> Option<LutPlan> {
        let (bw, l) = (spec.block_words(), spec.l as usize);
        let span = spec.lut_span().filter(|span| cols % span == 0)?;
        let span_words = span / spec.block * bw;
        let bits = spec.block * spec.k as usize;
        let hash = spec.hashed();
        let (mut idx, mut ctrl, mut ctrl_top) = (Vec::new(), Vec::new(), Vec::new());
        for u in 0..span / 8 {
            // The 8 weights lie in one block (a block is a multiple of 32 weights here);
            // `base`: that block's first word in the step's words, `a`: its word (in the
            // block) holding the first weight's window start.
            let (blk, t0) = (8 * u / spec.block, 8 * u % spec.block);
            let base = blk * bw;
            let a = spec.window_start(t0) / 32;
            idx.push((base + (a + 1) % bw) as u32);
            idx.push((base + a) as u32);
            for t in t0..t0 + 8 {
                // Offset of the window's first bit from word `a`'s first bit, cyclically; in
                // the lane `(w[a] << 32) | w[a + 1]` that bit sits at 63 - s, the window's
                // lowest at 64 - s - L.
                let s = (spec.window_start(t) + bits - 32 * a) % bits;
                if s + l > 64 {
                    return None;
                }
                ctrl.push((64 - s - l) as u8);
                if hash {
                    // The top byte: the window's first 8 bits, its lowest at 64 - s - 8.
                    ctrl_top.push((64 - s - 8) as u8);
                }
            }
        }
        let (mut lo, mut hi) = ([0u8; 256], [0u8; 256]);
        let mut w8 = [0u8; 256];
        // The code of each table entry: an `L`-bit state's, or 1mad8h's 8-bit index's.
        let entries = if hash { 256 } else { 1u32 << l };
        for st in 0..entries {
            let c = if hash {
                spec.code.table_int(st)
            } else {
                spec.code.int(spec.l, st)
            };
            let [b0, b1] = (c as i16).to_le_bytes();
            lo[st as usize] = b0;
            hi[st as usize] = b1;
            // The int8 kernel's operand: the code plus 128 as an unsigned byte.
            w8[st as usize] = (c + 128).clamp(0, 255) as u8;
        }
        Some(LutPlan {
            span,
            span_words,
            idx,
            ctrl,
            ctrl_top,
            sbox: spec.sboxed(),
            half: spec.code == TrellisCode::Gauss7S,
            lo,
            hi,
            w8,
            pair: if matches!(spec.code, TrellisCode::Mad8) || hash {
                PairPlan::new(spec, span, span_words)
            } else {
                None
            },
        })
    }
}

/// How many input rows (a prompt's) [`matmul_jobs`] runs through the trellis kernel at once.
const PROMPT_INPUTS: usize = 4;

/// Whether the table path's instructions (AVX-512 VBMI on top of [`simd_available`]) exist.
pub fn lut_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // GFNI: 1mad8s's S-box (every CPU with VBMI but Cannon Lake has it).
        simd_available()
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("gfni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The table kernel's 64 codes of group `$g` of a block whose words are `$wv`, as two vectors
/// of 16-bit integers: the even weights' (`4d`, `4d + 2` in each 32-bit lane) and the odd
/// weights' (`4d + 1`, `4d + 3`) (one `vpermd`, one `vpmultishiftqb`, four `vpermt2b` and two
/// blends, then shifts and bitwise selects). Expanded inside the `unsafe`, AVX-512 VBMI
/// bodies of [`TrellisMatvec`]'s table kernels.
/// The AES S-box of every byte of `$v` where `$sbox` ([`TrellisCode::Mad8S`]'s top bytes):
/// one GFNI `vgf2p8affineinvqb` (the inverse in GF(2^8), then the affine map and `0x63`), as
/// [`SBOX`] (tested); `$v` itself otherwise. Expanded inside the `unsafe` table kernels.
#[cfg(target_arch = "x86_64")]
macro_rules! sbox_bytes {
    ($sbox:expr, $v:expr) => {{
        let v = $v;
        if $sbox {
            _mm512_gf2p8affineinv_epi64_epi8::<0x63>(
                v,
                _mm512_set1_epi64(0xF1E3_C78F_1F3E_7CF8_u64 as i64),
            )
        } else {
            v
        }
    }};
}

#[cfg(target_arch = "x86_64")]
macro_rules! lut_words {
    ($lut:expr, $g:expr, $wv:expr, $full:expr, $hash:expr, $bmask:expr, $low_bytes:expr, $t:expr) => {{
        let (l0, l1, l2, l3, h0, h1, h2, h3) = $t;
        let idx = _mm512_loadu_si512($lut.idx.as_ptr().add(16 * $g) as *const _);
        let ctrl = _mm512_loadu_si512($lut.ctrl.as_ptr().add(64 * $g) as *const _);
        let data = _mm512_permutexvar_epi32(idx, $wv);
        let st = _mm512_multishift_epi64_epi8(ctrl, data);
        // 1mad8h: the index is the bottom byte plus the top byte.
        let st = if $hash {
            let top = _mm512_loadu_si512($lut.ctrl_top.as_ptr().add(64 * $g) as *const _);
            _mm512_add_epi8(
                st,
                sbox_bytes!($lut.sbox, _mm512_multishift_epi64_epi8(top, data)),
            )
        } else {
            st
        };
        // With L = 8 (or 1mad8h's indices) the 8-bit windows are the states.
        let st = if $full {
            st
        } else {
            _mm512_and_si512(st, $bmask)
        };
        let top = _mm512_movepi8_mask(st);
        let lo = _mm512_mask_blend_epi8(
            top,
            _mm512_permutex2var_epi8(l0, st, l1),
            _mm512_permutex2var_epi8(l2, st, l3),
        );
        let hi = _mm512_mask_blend_epi8(
            top,
            _mm512_permutex2var_epi8(h0, st, h1),
            _mm512_permutex2var_epi8(h2, st, h3),
        );
        // 16-bit codes of the even weights (low byte from `lo`, high from `hi` moved up) and
        // of the odd ones (`lo` moved down, `hi` in place).
        let even = _mm512_ternarylogic_epi32::<0xCA>($low_bytes, lo, _mm512_slli_epi16::<8>(hi));
        let odd = _mm512_ternarylogic_epi32::<0xCA>($low_bytes, _mm512_srli_epi16::<8>(lo), hi);
        [even, odd]
    }};
}

/// [`lut_words!`]'s codes as four vectors of 32-bit integers in [`lut_order`].
#[cfg(target_arch = "x86_64")]
macro_rules! lut_codes {
    ($lut:expr, $g:expr, $wv:expr, $full:expr, $hash:expr, $bmask:expr, $low_bytes:expr, $t:expr) => {{
        let [even, odd] = lut_words!($lut, $g, $wv, $full, $hash, $bmask, $low_bytes, $t);
        // Each 32-bit lane's low and high halves, sign-extended: weights 4d, 4d + 2, 4d + 1,
        // 4d + 3.
        [
            _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(even)),
            _mm512_srai_epi32::<16>(even),
            _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(odd)),
            _mm512_srai_epi32::<16>(odd),
        ]
    }};
}

/// The window-gather path's row loop (the body of [`TrellisMatvec`]'s `rows_avx512_*`): for
/// each row, each block's words in one register (`$wv`), and for each 16 weights at `$c` the
/// expression `$windows` (16 lanes, each with its weight's window in the low `L` bits); masked
/// to `L` bits, coded (`vpmulld`, then `vpdpbusd` sums the four bytes minus 510) and
/// multiply-added to the input in two accumulators alternately. Expanded inside the callers'
/// `unsafe`, AVX-512 bodies.
#[cfg(target_arch = "x86_64")]
macro_rules! gather_rows {
    ($self:expr, $words:expr, $scales:expr, $x:expr, $r0:expr, $y:expr, |$wv:ident, $c:ident| $windows:expr) => {{
        let spec = &$self.spec;
        let wpr = $self.cols * spec.k as usize / 32;
        let bw = spec.block_words();
        let nb = $self.cols / spec.block;
        let wmask: __mmask16 = ((1u32 << bw) - 1) as u16;
        let mad_a = _mm512_set1_epi32(MAD_A as i32);
        let mad_b = _mm512_set1_epi32(MAD_B as i32);
        let ones = _mm512_set1_epi32(0x0101_0101);
        let minus = _mm512_set1_epi32(-510);
        let lmask = _mm512_set1_epi32(((1u32 << spec.l) - 1) as i32);
        // The loads read the row's `nb * bw` words (whole vectors only where 16 words lie
        // within `words`, else masked lanes are not read), the plan's `block` entries and
        // `x`'s `nb * block` values, all sized by `check`.
        for (i, yo) in $y.iter_mut().enumerate() {
            let row = $words.as_ptr().add(($r0 + i) * wpr);
            let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for b in 0..nb {
                // A whole vector where the words go on that far (a masked load runs several
                // times slower when the weights stream from memory).
                let at = ($r0 + i) * wpr + b * bw;
                let $wv = if at + 16 <= $words.len() {
                    _mm512_loadu_si512(row.add(b * bw) as *const _)
                } else {
                    _mm512_maskz_loadu_epi32(wmask, row.add(b * bw) as *const i32)
                };
                let xb = $x.as_ptr().add(b * spec.block);
                let mut $c = 0;
                while $c < spec.block {
                    let st = _mm512_and_si512($windows, lmask);
                    let v = _mm512_add_epi32(_mm512_mullo_epi32(st, mad_a), mad_b);
                    let code = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(minus, v, ones));
                    let xv = _mm512_loadu_ps(xb.add($c));
                    if ($c / 16) % 2 == 0 {
                        acc0 = _mm512_fmadd_ps(code, xv, acc0);
                    } else {
                        acc1 = _mm512_fmadd_ps(code, xv, acc1);
                    }
                    $c += 16;
                }
            }
            *yo = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
                * ($scales[$r0 + i] / spec.code.divisor());
        }
    }};
}

impl TrellisMatvec {
    /// The plan for `cols`-wide rows of `spec` on the best path this CPU runs.
    pub fn new(spec: &TrellisSpec, cols: usize) -> Result<TrellisMatvec, TrellisError> {
        Self::with_simd(spec, cols, true)
    }

    /// As [`TrellisMatvec::new`]; `simd = false` forces the portable path (the SIMD path's
    /// reference in tests).
    pub fn with_simd(
        spec: &TrellisSpec,
        cols: usize,
        simd: bool,
    ) -> Result<TrellisMatvec, TrellisError> {
        spec.check_shape(1, cols)?;
        let bw = spec.block_words();
        let l = spec.l as usize;
        let (mut hi, mut lo, mut sh) = (Vec::new(), Vec::new(), Vec::new());
        for t in 0..spec.block {
            let start = spec.window_start(t);
            let (a, off) = (start / 32, start % 32);
            hi.push(a as u32);
            if off + l <= 32 {
                lo.push(a as u32);
                sh.push((32 - off - l) as u32);
            } else {
                lo.push(((a + 1) % bw) as u32);
                sh.push((64 - off - l) as u32);
            }
        }
        Ok(TrellisMatvec {
            spec: *spec,
            cols,
            hi,
            lo,
            sh,
            // The window-gather path computes 1MAD arithmetically.
            simd: simd
                && spec.code == TrellisCode::Mad
                && bw <= 16
                && spec.block % 16 == 0
                && simd_available(),
            gather: if simd && spec.code == TrellisCode::Mad && lut_available() && gather_knob() {
                GatherPlan::new(spec)
            } else {
                None
            },
            lut: if simd && lut_available() {
                LutPlan::new(spec, cols)
            } else {
                None
            },
            int16: false,
        })
    }

    /// The table path with int16 inputs in [`TrellisMatvec::rows`] and
    /// [`TrellisMatvec::par`] (as the CPU decoder runs it with int16 activations).
    pub fn int16_inputs(mut self) -> TrellisMatvec {
        self.int16 = true;
        self
    }

    /// Whether the table path runs with int16 inputs.
    pub fn is_int16(&self) -> bool {
        self.lut.is_some() && self.int16
    }

    /// Without the table path (`L <= 8`): the window-gather SIMD path only, for comparison.
    pub fn without_table(mut self) -> TrellisMatvec {
        self.lut = None;
        self
    }

    /// Whether the table path runs.
    pub fn is_table(&self) -> bool {
        self.lut.is_some()
    }

    /// Whether the AVX-512 path runs.
    pub fn is_simd(&self) -> bool {
        self.simd
    }

    fn check(
        &self,
        words: &[u32],
        scales: &[f32],
        x: &[f32],
        r0: usize,
        n: usize,
    ) -> Result<(), TrellisError> {
        let wpr = self.cols * self.spec.k as usize / 32;
        let end = r0.checked_add(n).ok_or(TrellisError::RowRangeOverflow)?;
        if x.len() != self.cols || words.len() < end * wpr || scales.len() < end {
            return Err(TrellisError::MatvecSizes {
                r0,
                end,
                cols: self.cols,
                needed: end * wpr,
                words: words.len(),
                scales: scales.len(),
                inputs: x.len(),
            });
        }
        Ok(())
    }

    /// Rows `r0..r0 + y.len()` of the product on this thread.
    pub fn rows(
        &self,
        words: &[u32],
        scales: &[f32],
        x: &[f32],
        r0: usize,
        y: &mut [f32],
    ) -> Result<(), TrellisError> {
        self.check(words, scales, x, r0, y.len())?;
        #[cfg(target_arch = "x86_64")]
        if self.lut.is_some() {
            self.rows_prepared(words, scales, x, self.prepare(x).as_ref(), r0, y);
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: `simd` is set only where `simd_available` found AVX-512 F/BW/VBMI2/VNNI,
            // and `check` sized the words, scales and input for these rows; the plan's word
            // indices are below the block's word count (at most 16).
            unsafe { self.rows_avx512(words, scales, x, r0, y) };
            return Ok(());
        }
        self.rows_portable(words, scales, x, r0, y);
        Ok(())
    }

    /// The whole product `y = W x` (`y.len()` rows), rows shared among the pool's workers.
    pub fn par(
        &self,
        pool: &super::ThreadPool,
        words: &[u32],
        scales: &[f32],
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), TrellisError> {
        let rows = y.len();
        self.check(words, scales, x, 0, rows)?;
        // The table path's input is permuted once, not once a chunk of rows.
        let prepared = self.prepare(x);
        const CHUNK: usize = 16;
        let next = std::sync::atomic::AtomicUsize::new(0);
        let out = super::SharedOut::new(y);
        pool.run(&|_, _| loop {
            let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let r0 = c * CHUNK;
            if r0 >= rows {
                break;
            }
            let n = CHUNK.min(rows - r0);
            // SAFETY: chunk `c` is taken by exactly one worker (the atomic counter), so the
            // range is touched by that worker only, within the pool run.
            let ys = unsafe { out.range(r0, n) };
            self.rows_prepared(words, scales, x, prepared.as_ref(), r0, ys);
        });
        Ok(())
    }

    /// The table path's input for `x` ([`Prepared`]; int16 where [`TrellisMatvec::int16_inputs`]
    /// asked for them), when the table path runs.
    fn prepare(&self, x: &[f32]) -> Option<Prepared> {
        let mut p = None;
        self.prepare_into(x, self.int16, &mut p);
        p
    }

    /// As [`TrellisMatvec::prepare`] into `out` (its buffers reused), int16 inputs where
    /// `int16`.
    fn prepare_into(&self, x: &[f32], int16: bool, out: &mut Option<Prepared>) {
        if self.lut.is_none() {
            *out = None;
            return;
        }
        if int16 && (self.spec.code == TrellisCode::Mad8 || self.spec.hashed()) {
            let pair = self.lut.as_ref().and_then(|l| l.pair.as_ref());
            match out {
                Some(Prepared::S8(sp)) => {
                    split_input_into(x, sp);
                    pair_order_into(pair, sp);
                }
                o => {
                    let mut sp = Split::default();
                    split_input_into(x, &mut sp);
                    pair_order_into(pair, &mut sp);
                    *o = Some(Prepared::S8(sp));
                }
            }
            return;
        }
        match (int16, out) {
            (true, Some(Prepared::I16(q, d))) => {
                q.resize(x.len(), 0);
                *d = lut_input16_into(x, q);
            }
            (false, Some(Prepared::F32(f))) => lut_input_into(x, f),
            (true, o) => {
                let mut q = vec![0i16; x.len()];
                let d = lut_input16_into(x, &mut q);
                *o = Some(Prepared::I16(q, d));
            }
            (false, o) => {
                let mut f = Vec::new();
                lut_input_into(x, &mut f);
                *o = Some(Prepared::F32(f));
            }
        }
    }

    /// Rows `r0..r0 + y.len()` with the input already prepared ([`TrellisMatvec::prepare`]);
    /// the sizes were checked by the caller (for all rows).
    fn rows_prepared(
        &self,
        words: &[u32],
        scales: &[f32],
        x: &[f32],
        prepared: Option<&Prepared>,
        r0: usize,
        y: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(lut), Some(input)) = (&self.lut, prepared) {
            // SAFETY: `lut` is set only where `lut_available` found AVX-512
            // F/BW/VBMI/VBMI2/VNNI, and the caller checked the words, scales and input for
            // these rows (`prepare` made the input `cols` long); the plan's word indices are
            // below the step's word count (at most 16).
            unsafe {
                match input {
                    Prepared::I16(q, d) => self.rows_lut16(lut, words, scales, q, *d, r0, y),
                    Prepared::F32(f) => self.rows_lut(lut, words, scales, f, r0, y),
                    Prepared::S8(sp) => self.rows_lut8(lut, words, scales, sp, r0, y),
                }
            };
            return;
        }
        let _ = prepared;
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: `simd` is set only where `simd_available` found AVX-512 F/BW/VBMI2/VNNI,
            // and the caller checked the sizes for these rows; the plan's word indices are
            // below the block's word count (at most 16).
            unsafe { self.rows_avx512(words, scales, x, r0, y) };
            return;
        }
        self.rows_portable(words, scales, x, r0, y);
    }

    /// [`TrellisMatvec::rows_prepared`] for [`PROMPT_INPUTS`] inputs at once (the table path
    /// reads each group's words and makes its codes once for all of them); every input's rows
    /// get the bits they get alone. `out(t, i, v)`: input `t`'s value of row `r0 + i`.
    #[allow(clippy::too_many_arguments)]
    fn rows_prepared_multi(
        &self,
        words: &[u32],
        scales: &[f32],
        x: [&[f32]; PROMPT_INPUTS],
        prepared: [Option<&Prepared>; PROMPT_INPUTS],
        r0: usize,
        n: usize,
        out: &mut dyn FnMut(usize, usize, f32),
    ) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(lut), [Some(a), Some(b), Some(c), Some(d)]) = (&self.lut, prepared) {
            match [a, b, c, d] {
                [Prepared::I16(qa, da), Prepared::I16(qb, db), Prepared::I16(qc, dc), Prepared::I16(qd, dd)] =>
                {
                    let q = [&qa[..], &qb[..], &qc[..], &qd[..]];
                    // SAFETY: as in `rows_prepared`: `lut` is set only where the
                    // instructions exist, and the caller checked the sizes for these rows
                    // and inputs.
                    unsafe {
                        self.rows_lut16_multi(
                            lut,
                            words,
                            scales,
                            q,
                            [*da, *db, *dc, *dd],
                            r0,
                            n,
                            out,
                        )
                    };
                    return;
                }
                [Prepared::S8(sa), Prepared::S8(sb), Prepared::S8(sc), Prepared::S8(sd)] => {
                    // SAFETY: as above.
                    unsafe {
                        self.rows_lut8_multi(lut, words, scales, [sa, sb, sc, sd], r0, n, out)
                    };
                    return;
                }
                [Prepared::F32(fa), Prepared::F32(fb), Prepared::F32(fc), Prepared::F32(fd)] => {
                    let f = [&fa[..], &fb[..], &fc[..], &fd[..]];
                    // SAFETY: as above.
                    unsafe { self.rows_lut_multi(lut, words, scales, f, r0, n, out) };
                    return;
                }
                // Mixed inputs (never made by one call): one at a time below.
                _ => {}
            }
        }
        let mut y = vec![0.0f32; n];
        for (t, (xt, pt)) in x.into_iter().zip(prepared).enumerate() {
            self.rows_prepared(words, scales, xt, pt, r0, &mut y);
            for (i, &v) in y.iter().enumerate() {
                out(t, i, v);
            }
        }
    }

    fn rows_portable(&self, words: &[u32], scales: &[f32], x: &[f32], r0: usize, y: &mut [f32]) {
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        let bw = spec.block_words();
        let mask = (1u32 << spec.l) - 1;
        for (i, yo) in y.iter_mut().enumerate() {
            let row = &words[(r0 + i) * wpr..(r0 + i + 1) * wpr];
            let mut lanes = [0.0f32; 16];
            for (bwords, xb) in row.chunks_exact(bw).zip(x.chunks_exact(spec.block)) {
                for (t, &xt) in xb.iter().enumerate() {
                    let both = (u64::from(bwords[self.hi[t] as usize]) << 32)
                        | u64::from(bwords[self.lo[t] as usize]);
                    let state = ((both >> self.sh[t]) as u32) & mask;
                    lanes[t % 16] += spec.code.int(spec.l, state) as f32 * xt;
                }
            }
            *yo = lanes.iter().sum::<f32>() * (scales[r0 + i] / spec.code.divisor());
        }
    }

    /// The table path: per group of 64 weights one `vpermd` (the words of each lane), one
    /// `vpmultishiftqb` (64 8-bit states; 1mad8h: a second one and a `vpaddb`, the indices),
    /// four `vpermt2b` and two blends (the code's two bytes from 256-entry tables): six
    /// shuffles. The bytes become 16-bit codes and those 32-bit
    /// lanes by shifts and bitwise selects (no shuffle), then four conversions and FMAs against
    /// the input permuted to that order ([`lut_order`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,gfni")]
    unsafe fn rows_lut(
        &self,
        lut: &LutPlan,
        words: &[u32],
        scales: &[f32],
        xp: &[f32],
        r0: usize,
        y: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        // A step: `lut.span` weights (one block, or two of 32) in `bw` words.
        let bw = lut.span_words;
        let nb = self.cols / lut.span;
        let groups = lut.span / 64;
        let wmask: __mmask16 = ((1u32 << bw) - 1) as u16;
        let bmask = _mm512_set1_epi8(((1u32 << spec.l) - 1) as u8 as i8);
        let (hash, full) = (lut.hashed(), lut.full(spec.l));
        let low_bytes = _mm512_set1_epi16(0x00FF);
        // SAFETY: the loads read the row's `nb * bw` words (whole vectors only where 16 words
        // lie within `words`, else masked lanes are not read), the plan's `groups * 16`
        // indices and `groups * 64` offsets, the 256-byte tables and `xp`'s `nb * block`
        // values.
        unsafe {
            let tl = |i: usize| _mm512_loadu_si512(lut.lo.as_ptr().add(64 * i) as *const _);
            let th = |i: usize| _mm512_loadu_si512(lut.hi.as_ptr().add(64 * i) as *const _);
            let tables = (tl(0), tl(1), tl(2), tl(3), th(0), th(1), th(2), th(3));
            for (i, yo) in y.iter_mut().enumerate() {
                let row = words.as_ptr().add((r0 + i) * wpr);
                let mut acc = [_mm512_setzero_ps(); 4];
                for b in 0..nb {
                    // A whole vector where the words go on that far (a masked load runs
                    // several times slower when the weights stream from memory).
                    let at = (r0 + i) * wpr + b * bw;
                    let wv = if at + 16 <= words.len() {
                        _mm512_loadu_si512(row.add(b * bw) as *const _)
                    } else {
                        _mm512_maskz_loadu_epi32(wmask, row.add(b * bw) as *const i32)
                    };
                    for g in 0..groups {
                        let codes = lut_codes!(lut, g, wv, full, hash, bmask, low_bytes, tables);
                        let xg = xp.as_ptr().add(b * lut.span + 64 * g);
                        for (q, c) in codes.into_iter().enumerate() {
                            let xv = _mm512_loadu_ps(xg.add(16 * q));
                            acc[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), xv, acc[q]);
                        }
                    }
                }
                let sum =
                    _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
                *yo = _mm512_reduce_add_ps(sum) * (scales[r0 + i] / spec.code.divisor());
            }
        }
    }

    /// [`TrellisMatvec::rows_lut`] for [`PROMPT_INPUTS`] inputs at once (a prompt's rows):
    /// each group's words are read and its codes made once for all of them; each input has
    /// its own accumulators in [`TrellisMatvec::rows_lut`]'s order, so its outputs have the
    /// bits it gets alone. `out(t, i, v)`: input `t`'s value of row `r0 + i`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,gfni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_lut_multi(
        &self,
        lut: &LutPlan,
        words: &[u32],
        scales: &[f32],
        xp: [&[f32]; PROMPT_INPUTS],
        r0: usize,
        n: usize,
        out: &mut dyn FnMut(usize, usize, f32),
    ) {
        use std::arch::x86_64::*;
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        // A step: `lut.span` weights (one block, or two of 32) in `bw` words.
        let bw = lut.span_words;
        let nb = self.cols / lut.span;
        let groups = lut.span / 64;
        let wmask: __mmask16 = ((1u32 << bw) - 1) as u16;
        let bmask = _mm512_set1_epi8(((1u32 << spec.l) - 1) as u8 as i8);
        let (hash, full) = (lut.hashed(), lut.full(spec.l));
        let low_bytes = _mm512_set1_epi16(0x00FF);
        // SAFETY: as in `rows_lut`, each input holding `nb * block` values.
        unsafe {
            let tl = |i: usize| _mm512_loadu_si512(lut.lo.as_ptr().add(64 * i) as *const _);
            let th = |i: usize| _mm512_loadu_si512(lut.hi.as_ptr().add(64 * i) as *const _);
            let tables = (tl(0), tl(1), tl(2), tl(3), th(0), th(1), th(2), th(3));
            for i in 0..n {
                let row = words.as_ptr().add((r0 + i) * wpr);
                let mut acc = [[_mm512_setzero_ps(); 4]; PROMPT_INPUTS];
                for b in 0..nb {
                    let at = (r0 + i) * wpr + b * bw;
                    let wv = if at + 16 <= words.len() {
                        _mm512_loadu_si512(row.add(b * bw) as *const _)
                    } else {
                        _mm512_maskz_loadu_epi32(wmask, row.add(b * bw) as *const i32)
                    };
                    for g in 0..groups {
                        let codes = lut_codes!(lut, g, wv, full, hash, bmask, low_bytes, tables);
                        let cf = [
                            _mm512_cvtepi32_ps(codes[0]),
                            _mm512_cvtepi32_ps(codes[1]),
                            _mm512_cvtepi32_ps(codes[2]),
                            _mm512_cvtepi32_ps(codes[3]),
                        ];
                        for (a, x) in acc.iter_mut().zip(xp) {
                            let xg = x.as_ptr().add(b * lut.span + 64 * g);
                            for (q, &c) in cf.iter().enumerate() {
                                a[q] = _mm512_fmadd_ps(c, _mm512_loadu_ps(xg.add(16 * q)), a[q]);
                            }
                        }
                    }
                }
                for (t, a) in acc.iter().enumerate() {
                    let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
                    out(
                        t,
                        i,
                        _mm512_reduce_add_ps(sum) * (scales[r0 + i] / spec.code.divisor()),
                    );
                }
            }
        }
    }

    /// [`TrellisMatvec::rows_lut`] with int16 inputs (`xq`, step `d`: [`lut_input16`]): the
    /// 16-bit codes of [`lut_words!`] go straight into `vpdpwssd` against the input's pairs
    /// (two instructions a group of 64 where the float path takes six shifts, four conversions
    /// and four FMAs); the 32-bit sums go to a float sum every [`X16_FLUSH`] weights. Tier L3:
    /// the product differs from the exact one by the input's rounding, at most
    /// `sum |w| * d / 2` (tested), as the CPU decoder's affine kernels' int16 inputs.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,gfni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_lut16(
        &self,
        lut: &LutPlan,
        words: &[u32],
        scales: &[f32],
        xq: &[i16],
        d: f32,
        r0: usize,
        y: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        let bw = lut.span_words;
        let nb = self.cols / lut.span;
        let groups = lut.span / 64;
        let flush = (X16_FLUSH / lut.span).max(1);
        let wmask: __mmask16 = ((1u32 << bw) - 1) as u16;
        let bmask = _mm512_set1_epi8(((1u32 << spec.l) - 1) as u8 as i8);
        let (hash, full) = (lut.hashed(), lut.full(spec.l));
        let low_bytes = _mm512_set1_epi16(0x00FF);
        // SAFETY: as in `rows_lut`; `xq` holds `nb * span` values.
        unsafe {
            let tl = |i: usize| _mm512_loadu_si512(lut.lo.as_ptr().add(64 * i) as *const _);
            let th = |i: usize| _mm512_loadu_si512(lut.hi.as_ptr().add(64 * i) as *const _);
            let tables = (tl(0), tl(1), tl(2), tl(3), th(0), th(1), th(2), th(3));
            for (i, yo) in y.iter_mut().enumerate() {
                let row = words.as_ptr().add((r0 + i) * wpr);
                let mut accf = _mm512_setzero_ps();
                let (mut a0, mut a1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for b in 0..nb {
                    // As `rows_lut8_g`: words ahead (never dereferenced).
                    _mm_prefetch::<_MM_HINT_T0>(
                        row.wrapping_add(b * bw + PREFETCH_WORDS) as *const i8
                    );
                    let at = (r0 + i) * wpr + b * bw;
                    let wv = if at + 16 <= words.len() {
                        _mm512_loadu_si512(row.add(b * bw) as *const _)
                    } else {
                        _mm512_maskz_loadu_epi32(wmask, row.add(b * bw) as *const i32)
                    };
                    for g in 0..groups {
                        let [even, odd] =
                            lut_words!(lut, g, wv, full, hash, bmask, low_bytes, tables);
                        let xg = xq.as_ptr().add(b * lut.span + 64 * g);
                        a0 = _mm512_dpwssd_epi32(a0, even, _mm512_loadu_si512(xg as *const _));
                        a1 = _mm512_dpwssd_epi32(
                            a1,
                            odd,
                            _mm512_loadu_si512(xg.add(32) as *const _),
                        );
                    }
                    if (b + 1) % flush == 0 || b + 1 == nb {
                        accf = _mm512_add_ps(accf, _mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)));
                        a0 = _mm512_setzero_si512();
                        a1 = _mm512_setzero_si512();
                    }
                }
                *yo = _mm512_reduce_add_ps(accf) * (scales[r0 + i] / spec.code.divisor() * d);
            }
        }
    }

    /// [`TrellisMatvec::rows_lut16`] for [`PROMPT_INPUTS`] inputs at once: each group's codes
    /// made once for all of them, each input with its own sums in the one-input kernel's
    /// order, so its outputs have the bits it gets alone.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,gfni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_lut16_multi(
        &self,
        lut: &LutPlan,
        words: &[u32],
        scales: &[f32],
        xq: [&[i16]; PROMPT_INPUTS],
        d: [f32; PROMPT_INPUTS],
        r0: usize,
        n: usize,
        out: &mut dyn FnMut(usize, usize, f32),
    ) {
        use std::arch::x86_64::*;
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        let bw = lut.span_words;
        let nb = self.cols / lut.span;
        let groups = lut.span / 64;
        let flush = (X16_FLUSH / lut.span).max(1);
        let wmask: __mmask16 = ((1u32 << bw) - 1) as u16;
        let bmask = _mm512_set1_epi8(((1u32 << spec.l) - 1) as u8 as i8);
        let (hash, full) = (lut.hashed(), lut.full(spec.l));
        let low_bytes = _mm512_set1_epi16(0x00FF);
        // SAFETY: as in `rows_lut16`, each input holding `nb * span` values.
        unsafe {
            let tl = |i: usize| _mm512_loadu_si512(lut.lo.as_ptr().add(64 * i) as *const _);
            let th = |i: usize| _mm512_loadu_si512(lut.hi.as_ptr().add(64 * i) as *const _);
            let tables = (tl(0), tl(1), tl(2), tl(3), th(0), th(1), th(2), th(3));
            for i in 0..n {
                let row = words.as_ptr().add((r0 + i) * wpr);
                let mut accf = [_mm512_setzero_ps(); PROMPT_INPUTS];
                let mut acc = [[_mm512_setzero_si512(); 2]; PROMPT_INPUTS];
                for b in 0..nb {
                    let at = (r0 + i) * wpr + b * bw;
                    let wv = if at + 16 <= words.len() {
                        _mm512_loadu_si512(row.add(b * bw) as *const _)
                    } else {
                        _mm512_maskz_loadu_epi32(wmask, row.add(b * bw) as *const i32)
                    };
                    for g in 0..groups {
                        let [even, odd] =
                            lut_words!(lut, g, wv, full, hash, bmask, low_bytes, tables);
                        for (a, x) in acc.iter_mut().zip(xq) {
                            let xg = x.as_ptr().add(b * lut.span + 64 * g);
                            a[0] =
                                _mm512_dpwssd_epi32(a[0], even, _mm512_loadu_si512(xg as *const _));
                            a[1] = _mm512_dpwssd_epi32(
                                a[1],
                                odd,
                                _mm512_loadu_si512(xg.add(32) as *const _),
                            );
                        }
                    }
                    if (b + 1) % flush == 0 || b + 1 == nb {
                        for (f, a) in accf.iter_mut().zip(acc.iter_mut()) {
                            *f =
                                _mm512_add_ps(*f, _mm512_cvtepi32_ps(_mm512_add_epi32(a[0], a[1])));
                            *a = [_mm512_setzero_si512(); 2];
                        }
                    }
                }
                for (t, f) in accf.iter().enumerate() {
                    out(
                        t,
                        i,
                        _mm512_reduce_add_ps(*f) * (scales[r0 + i] / spec.code.divisor() * d[t]),
                    );
                }
            }
        }
    }

    /// [`TrellisCode::Mad8`]'s int8 kernel (`L <= 8`, int16 activations): per group of 64
    /// weights one `vpermd` and one `vpmultishiftqb` (the 64 states, in natural order as
    /// [`lut_words!`] makes them; [`TrellisCode::Mad8H`]: a second `vpmultishiftqb` takes the
    /// top bytes and one `vpaddb` adds them into the 64 table indices), two `vpermt2b` and a
    /// blend (the codes plus 128 as unsigned
    /// bytes from one 256-byte table), then two `vpdpbusd` against the input's low and high
    /// bytes ([`Split`]): four shuffles where [`TrellisMatvec::rows_lut16`] takes six, and
    /// one multiply-add where it takes two. Where the shape has a [`PairPlan`] (3-bit blocks
    /// of 32 or 64 among them), two groups share one `vpermb` instead: three and a half
    /// shuffles a group. The loop is [`TrellisMatvec::rows_lut8_g`]'s, one copy a group count
    /// and `L = 8` or not. The 32-bit lanes sum `(c + 128) * q` exactly
    /// (`(high << 8) + low`, [`X8_WINDOW`] weights at most), then into 64-bit sums; the row's
    /// exact integer `sum c * q` (less `128 * sum q`) times `scale / divisor * d` is the
    /// output. Tier L2 against [`TrellisMatvec::rows_split_portable`] (the same integer, the
    /// same float ops); L3 against the float32 product by the input's rounding, as
    /// [`TrellisMatvec::rows_lut16`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,gfni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_lut8(
        &self,
        lut: &LutPlan,
        words: &[u32],
        scales: &[f32],
        sp: &Split,
        r0: usize,
        y: &mut [f32],
    ) {
        // The kernel for the plan's group count (`span / 64`, with `span` at most 16 words
        // of at least 2 bits a weight, so 1 to 4) and these flags.
        macro_rules! by_groups {
            ($full:literal, $hash:literal, $sbox:literal, $half:literal) => {
                match lut.span / 64 {
                    1 => self.rows_lut8_g::<1, $full, $hash, $sbox, $half>(
                        lut, words, scales, sp, r0, y,
                    ),
                    2 => self.rows_lut8_g::<2, $full, $hash, $sbox, $half>(
                        lut, words, scales, sp, r0, y,
                    ),
                    3 => self.rows_lut8_g::<3, $full, $hash, $sbox, $half>(
                        lut, words, scales, sp, r0, y,
                    ),
                    _ => self.rows_lut8_g::<4, $full, $hash, $sbox, $half>(
                        lut, words, scales, sp, r0, y,
                    ),
                }
            };
        }
        // SAFETY (each arm): the caller's contract, passed on. A hashed index is whole as
        // looked up (FULL); only the S-box index has a half table (gauss7s).
        unsafe {
            match (lut.full(self.spec.l), lut.hashed(), lut.sbox, lut.half) {
                (_, true, true, true) => by_groups!(true, true, true, true),
                (_, true, true, false) => by_groups!(true, true, true, false),
                (_, true, false, _) => by_groups!(true, true, false, false),
                (true, false, ..) => by_groups!(true, false, false, false),
                (false, false, ..) => by_groups!(false, false, false, false),
            }
        }
    }

    /// [`TrellisMatvec::rows_lut8`] for `G` groups of 64 weights a step (`FULL`: `L = 8`, the
    /// windows are the states), its loop bare for the compiler: the plan's permutations and
    /// offsets in registers, every step of a row but the matrix's last loaded whole (the
    /// words past a row are the next row's), and for `G = 1` two steps an iteration into two
    /// sets of sums; with the two-step plan, two rows a pass (their shuffle chains
    /// interleaved, the input's bytes loaded once for both, one reduction for both). The
    /// 32-bit sums are exact (wrapping, each lane's true sum below `2^31` within a window of
    /// [`X8_WINDOW`] weights), so how the groups are spread over the sets, and which rows
    /// share a pass, changes no bit.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,gfni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_lut8_g<
        const G: usize,
        const FULL: bool,
        const HASH: bool,
        const SBOX: bool,
        const HALF: bool,
    >(
        &self,
        lut: &LutPlan,
        words: &[u32],
        scales: &[f32],
        sp: &Split,
        r0: usize,
        y: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        let bw = lut.span_words;
        let nb = self.cols / lut.span;
        // Steps (spans) a window of 32-bit sums takes: even for `G = 1` (32).
        let window = (X8_WINDOW / lut.span).max(1);
        let wmask: __mmask16 = ((1u32 << bw) - 1) as u16;
        let wmask2: __mmask16 = ((1u32 << (2 * bw).min(16)) - 1) as u16;
        let corr = 128 * sp.sum;
        let f = spec.code.divisor();
        let pf = trellis_knobs().0;
        // SAFETY: as in `rows_lut`; `sp.lo` and `sp.hi` (and `pl`, `ph` where the two-step
        // plan runs) hold `nb * span` values, the plan `G * 16` indices and `G * 64` offsets;
        // a masked load of two steps reads only the row's words.
        unsafe {
            let bmask = _mm512_set1_epi8(((1u32 << spec.l) - 1) as u8 as i8);
            let tw = |i: usize| _mm512_loadu_si512(lut.w8.as_ptr().add(64 * i) as *const _);
            let (t0, t1, t2, t3) = (tw(0), tw(1), tw(2), tw(3));
            let idx: [__m512i; G] = std::array::from_fn(|g| {
                _mm512_loadu_si512(lut.idx.as_ptr().add(16 * g) as *const _)
            });
            let ctrl: [__m512i; G] = std::array::from_fn(|g| {
                _mm512_loadu_si512(lut.ctrl.as_ptr().add(64 * g) as *const _)
            });
            // 1mad8h's top-byte offsets (`HASH`: `ctrl_top` holds `G * 64`).
            let ctrl_top: [__m512i; G] = std::array::from_fn(|g| {
                if HASH {
                    _mm512_loadu_si512(lut.ctrl_top.as_ptr().add(64 * g) as *const _)
                } else {
                    _mm512_setzero_si512()
                }
            });
            // The 8-bit windows of `data` at the offsets `c` (and, for 1mad8h, the top bytes
            // at `t` added: the table indices).
            let windows = |c: __m512i, t: __m512i, data: __m512i| {
                let st = _mm512_multishift_epi64_epi8(c, data);
                if HASH {
                    _mm512_add_epi8(st, sbox_bytes!(SBOX, _mm512_multishift_epi64_epi8(t, data)))
                } else {
                    st
                }
            };
            // The unsigned code bytes of the windows `st`.
            let lookup = |st: __m512i| {
                // A 7-bit index (the table's halves alike): `vpermt2b` reads only those bits.
                if HALF {
                    return _mm512_permutex2var_epi8(t0, st, t1);
                }
                let st = if FULL {
                    st
                } else {
                    _mm512_and_si512(st, bmask)
                };
                let top = _mm512_movepi8_mask(st);
                _mm512_mask_blend_epi8(
                    top,
                    _mm512_permutex2var_epi8(t0, st, t1),
                    _mm512_permutex2var_epi8(t2, st, t3),
                )
            };
            // The unsigned code bytes of group `g` of the step whose words are `wv`.
            let codes = |wv: __m512i, g: usize| {
                let data = _mm512_permutexvar_epi32(idx[g], wv);
                lookup(windows(ctrl[g], ctrl_top[g], data))
            };
            // The two-step plan (steps of one group) and its permuted input.
            let pair = lut
                .pair
                .as_ref()
                .filter(|_| G == 1 && sp.pl.len() == sp.lo.len());
            let ld = |a: &[u8]| _mm512_loadu_si512(a.as_ptr() as *const _);
            let (pb, pc0, pc1) = match pair {
                Some(pp) => (ld(&pp.bytes), ld(&pp.ctrl[0]), ld(&pp.ctrl[1])),
                None => (bmask, bmask, bmask),
            };
            let (pt0, pt1) = match pair {
                Some(pp) if HASH => (ld(&pp.ctrl_top[0]), ld(&pp.ctrl_top[1])),
                _ => (bmask, bmask),
            };
            let (xlo, xhi) = match pair {
                Some(_) => (sp.pl.as_ptr(), sp.ph.as_ptr()),
                None => (sp.lo.as_ptr(), sp.hi.as_ptr()),
            };
            let xl = |o: usize| _mm512_loadu_si512(xlo.add(o) as *const _);
            let xh = |o: usize| _mm512_loadu_si512(xhi.add(o) as *const _);
            // A window's four sets of 32-bit sums as eight exact 64-bit lanes.
            let widen = |lo0: __m512i, hi0: __m512i, lo1: __m512i, hi1: __m512i| {
                let lanes = _mm512_add_epi32(
                    _mm512_add_epi32(_mm512_slli_epi32::<8>(_mm512_add_epi32(hi0, hi1)), lo0),
                    lo1,
                );
                _mm512_add_epi64(
                    _mm512_cvtepi32_epi64(_mm512_castsi512_si256(lanes)),
                    _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(lanes)),
                )
            };
            // Rows a pass: two where the two-step plan runs (two independent chains of
            // shuffles and sums, the input's bytes loaded once for both, one reduction for
            // both), each row's exact integer sum as the one-row loop's, so the same bits.
            let mut i = 0;
            if G == 1 && pair.is_some() && trellis_knobs().2 {
                while i + 1 < y.len() {
                    let at = (r0 + i) * wpr;
                    // Both rows' steps load whole: the second row's last 16-word load ends
                    // inside `words`, and every load of the first row ends before it.
                    if at + wpr + nb * bw + 16 - bw > words.len() {
                        break;
                    }
                    let ra = words.as_ptr().add(at);
                    let rb = ra.add(wpr);
                    let ld_a = |b: usize| _mm512_loadu_si512(ra.add(b * bw) as *const _);
                    let ld_b = |b: usize| _mm512_loadu_si512(rb.add(b * bw) as *const _);
                    let (mut ta, mut tb) = (0i64, 0i64);
                    let mut b = 0;
                    while b < nb {
                        let end = (b + window).min(nb);
                        let z = _mm512_setzero_si512();
                        let (mut la0, mut ha0, mut la1, mut ha1) = (z, z, z, z);
                        let (mut lb0, mut hb0, mut lb1, mut hb1) = (z, z, z, z);
                        while b + 2 <= end {
                            // As the one-row loop's: the words `pf` ahead of each row's
                            // step (hints; the wrapping address is never read).
                            _mm_prefetch::<_MM_HINT_T0>(ra.wrapping_add(b * bw + pf) as *const i8);
                            _mm_prefetch::<_MM_HINT_T0>(rb.wrapping_add(b * bw + pf) as *const i8);
                            let da = _mm512_permutexvar_epi8(pb, ld_a(b));
                            let db = _mm512_permutexvar_epi8(pb, ld_b(b));
                            let o = b * 64;
                            let (x0l, x0h, x1l, x1h) = (xl(o), xh(o), xl(o + 64), xh(o + 64));
                            let ca = lookup(windows(pc0, pt0, da));
                            let cb = lookup(windows(pc1, pt1, da));
                            la0 = _mm512_dpbusd_epi32(la0, ca, x0l);
                            ha0 = _mm512_dpbusd_epi32(ha0, ca, x0h);
                            la1 = _mm512_dpbusd_epi32(la1, cb, x1l);
                            ha1 = _mm512_dpbusd_epi32(ha1, cb, x1h);
                            let ca = lookup(windows(pc0, pt0, db));
                            let cb = lookup(windows(pc1, pt1, db));
                            lb0 = _mm512_dpbusd_epi32(lb0, ca, x0l);
                            hb0 = _mm512_dpbusd_epi32(hb0, ca, x0h);
                            lb1 = _mm512_dpbusd_epi32(lb1, cb, x1l);
                            hb1 = _mm512_dpbusd_epi32(hb1, cb, x1h);
                            b += 2;
                        }
                        if b < end {
                            let (xlb, xhb) = (xl(b * 64), xh(b * 64));
                            let ca = codes(ld_a(b), 0);
                            la0 = _mm512_dpbusd_epi32(la0, ca, xlb);
                            ha0 = _mm512_dpbusd_epi32(ha0, ca, xhb);
                            let cb = codes(ld_b(b), 0);
                            lb0 = _mm512_dpbusd_epi32(lb0, cb, xlb);
                            hb0 = _mm512_dpbusd_epi32(hb0, cb, xhb);
                            b += 1;
                        }
                        // The two rows' eight 64-bit lanes each, interleaved and folded: row
                        // a's total in lane 0, row b's in lane 1 (exact integer sums).
                        let (wa, wb) = (widen(la0, ha0, la1, ha1), widen(lb0, hb0, lb1, hb1));
                        let s = _mm512_add_epi64(
                            _mm512_unpacklo_epi64(wa, wb),
                            _mm512_unpackhi_epi64(wa, wb),
                        );
                        let s = _mm256_add_epi64(
                            _mm512_castsi512_si256(s),
                            _mm512_extracti64x4_epi64::<1>(s),
                        );
                        let s = _mm_add_epi64(
                            _mm256_castsi256_si128(s),
                            _mm256_extracti128_si256::<1>(s),
                        );
                        ta += _mm_cvtsi128_si64(s);
                        tb += _mm_extract_epi64::<1>(s);
                    }
                    y[i] = (ta - corr) as f32 * (scales[r0 + i] / f * sp.d);
                    y[i + 1] = (tb - corr) as f32 * (scales[r0 + i + 1] / f * sp.d);
                    i += 2;
                }
            }
            for (i, yo) in y.iter_mut().enumerate().skip(i) {
                let at = (r0 + i) * wpr;
                let row = words.as_ptr().add(at);
                // Steps whose 16-word load stays inside `words`; the rest load masked.
                let whole = if at + nb * bw + 16 - bw <= words.len() {
                    nb
                } else {
                    (words.len().saturating_sub(at + 16) / bw + 1).min(nb)
                        * usize::from(at + 16 <= words.len())
                };
                let load = |b: usize| {
                    if b < whole {
                        _mm512_loadu_si512(row.add(b * bw) as *const _)
                    } else {
                        _mm512_maskz_loadu_epi32(wmask, row.add(b * bw) as *const i32)
                    }
                };
                // The words `pf` past step `b`'s (the next rows' where the row
                // ends; a prefetch reads nothing and cannot fault, hence the wrapping address).
                let ahead = |b: usize| {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(b * bw + pf) as *const i8)
                };
                // Steps `b` and `b + 1` (both in the row).
                let load2 = |b: usize| {
                    if b < whole {
                        _mm512_loadu_si512(row.add(b * bw) as *const _)
                    } else {
                        _mm512_maskz_loadu_epi32(wmask2, row.add(b * bw) as *const i32)
                    }
                };
                let mut total = 0i64;
                let mut b = 0;
                while b < nb {
                    let end = (b + window).min(nb);
                    let (mut lo0, mut hi0) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    let (mut lo1, mut hi1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    if G == 1 && pair.is_some() {
                        // Two steps a load: one `vpermb`, two `vpmultishiftqb` (windows start
                        // even, so the permuted input's pairs of steps line up).
                        while b + 2 <= end {
                            ahead(b);
                            let data = _mm512_permutexvar_epi8(pb, load2(b));
                            let ca = lookup(windows(pc0, pt0, data));
                            let cb = lookup(windows(pc1, pt1, data));
                            let o = b * 64;
                            lo0 = _mm512_dpbusd_epi32(lo0, ca, xl(o));
                            hi0 = _mm512_dpbusd_epi32(hi0, ca, xh(o));
                            lo1 = _mm512_dpbusd_epi32(lo1, cb, xl(o + 64));
                            hi1 = _mm512_dpbusd_epi32(hi1, cb, xh(o + 64));
                            b += 2;
                        }
                        if b < end {
                            let c = codes(load(b), 0);
                            lo0 = _mm512_dpbusd_epi32(lo0, c, xl(b * 64));
                            hi0 = _mm512_dpbusd_epi32(hi0, c, xh(b * 64));
                            b += 1;
                        }
                    } else if G == 1 {
                        while b + 2 <= end {
                            ahead(b);
                            let (wa, wb) = (load(b), load(b + 1));
                            let (ca, cb) = (codes(wa, 0), codes(wb, 0));
                            let o = b * 64;
                            lo0 = _mm512_dpbusd_epi32(lo0, ca, xl(o));
                            hi0 = _mm512_dpbusd_epi32(hi0, ca, xh(o));
                            lo1 = _mm512_dpbusd_epi32(lo1, cb, xl(o + 64));
                            hi1 = _mm512_dpbusd_epi32(hi1, cb, xh(o + 64));
                            b += 2;
                        }
                        if b < end {
                            let c = codes(load(b), 0);
                            lo0 = _mm512_dpbusd_epi32(lo0, c, xl(b * 64));
                            hi0 = _mm512_dpbusd_epi32(hi0, c, xh(b * 64));
                            b += 1;
                        }
                    } else {
                        while b < end {
                            ahead(b);
                            let wv = load(b);
                            for g in 0..G {
                                let c = codes(wv, g);
                                let o = b * lut.span + 64 * g;
                                if g % 2 == 0 {
                                    lo0 = _mm512_dpbusd_epi32(lo0, c, xl(o));
                                    hi0 = _mm512_dpbusd_epi32(hi0, c, xh(o));
                                } else {
                                    lo1 = _mm512_dpbusd_epi32(lo1, c, xl(o));
                                    hi1 = _mm512_dpbusd_epi32(hi1, c, xh(o));
                                }
                            }
                            b += 1;
                        }
                    }
                    // Exact (wrapping) 32-bit lanes: each is at most 2048 / 16 products.
                    total += _mm512_reduce_add_epi64(widen(lo0, hi0, lo1, hi1));
                }
                *yo = (total - corr) as f32 * (scales[r0 + i] / f * sp.d);
            }
        }
    }

    /// [`TrellisMatvec::rows_lut8`] for [`PROMPT_INPUTS`] inputs at once: each group's code
    /// bytes made once for all of them, each input with its own exact sums, so its outputs
    /// have the bits it gets alone. `out(t, i, v)`: input `t`'s value of row `r0 + i`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,gfni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_lut8_multi(
        &self,
        lut: &LutPlan,
        words: &[u32],
        scales: &[f32],
        sp: [&Split; PROMPT_INPUTS],
        r0: usize,
        n: usize,
        out: &mut dyn FnMut(usize, usize, f32),
    ) {
        use std::arch::x86_64::*;
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        let bw = lut.span_words;
        let nb = self.cols / lut.span;
        let groups = lut.span / 64;
        let window = (X8_WINDOW / lut.span).max(1);
        let wmask: __mmask16 = ((1u32 << bw) - 1) as u16;
        let bmask = _mm512_set1_epi8(((1u32 << spec.l) - 1) as u8 as i8);
        let (hash, full) = (lut.hashed(), lut.full(spec.l));
        let f = spec.code.divisor();
        // SAFETY: as in `rows_lut8`, each input holding `nb * span` values.
        unsafe {
            let tw = |i: usize| _mm512_loadu_si512(lut.w8.as_ptr().add(64 * i) as *const _);
            let (t0, t1, t2, t3) = (tw(0), tw(1), tw(2), tw(3));
            let idx: [__m512i; 4] = std::array::from_fn(|g| {
                if g < groups {
                    _mm512_loadu_si512(lut.idx.as_ptr().add(16 * g) as *const _)
                } else {
                    _mm512_setzero_si512()
                }
            });
            let ctrl: [__m512i; 4] = std::array::from_fn(|g| {
                if g < groups {
                    _mm512_loadu_si512(lut.ctrl.as_ptr().add(64 * g) as *const _)
                } else {
                    _mm512_setzero_si512()
                }
            });
            let ctrl_top: [__m512i; 4] = std::array::from_fn(|g| {
                if hash && g < groups {
                    _mm512_loadu_si512(lut.ctrl_top.as_ptr().add(64 * g) as *const _)
                } else {
                    _mm512_setzero_si512()
                }
            });
            for i in 0..n {
                let row = words.as_ptr().add((r0 + i) * wpr);
                let mut total = [0i64; PROMPT_INPUTS];
                let mut b = 0;
                while b < nb {
                    let end = (b + window).min(nb);
                    // Per input: low and high sums of the even and the odd groups, as
                    // `rows_lut8` keeps them.
                    let mut acc = [[_mm512_setzero_si512(); 4]; PROMPT_INPUTS];
                    while b < end {
                        _mm_prefetch::<_MM_HINT_T0>(
                            row.wrapping_add(b * bw + PREFETCH_WORDS) as *const i8
                        );
                        let at = (r0 + i) * wpr + b * bw;
                        let wv = if at + 16 <= words.len() {
                            _mm512_loadu_si512(row.add(b * bw) as *const _)
                        } else {
                            _mm512_maskz_loadu_epi32(wmask, row.add(b * bw) as *const i32)
                        };
                        for g in 0..groups {
                            let data = _mm512_permutexvar_epi32(idx[g], wv);
                            let st = _mm512_multishift_epi64_epi8(ctrl[g], data);
                            // 1mad8h: the bottom byte plus the top byte.
                            let st = if hash {
                                _mm512_add_epi8(
                                    st,
                                    sbox_bytes!(
                                        lut.sbox,
                                        _mm512_multishift_epi64_epi8(ctrl_top[g], data)
                                    ),
                                )
                            } else {
                                st
                            };
                            let st = if full {
                                st
                            } else {
                                _mm512_and_si512(st, bmask)
                            };
                            let top = _mm512_movepi8_mask(st);
                            let w = _mm512_mask_blend_epi8(
                                top,
                                _mm512_permutex2var_epi8(t0, st, t1),
                                _mm512_permutex2var_epi8(t2, st, t3),
                            );
                            let o = b * lut.span + 64 * g;
                            let j = 2 * ((b * groups + g) % 2);
                            for (a, x) in acc.iter_mut().zip(sp) {
                                let xl = _mm512_loadu_si512(x.lo.as_ptr().add(o) as *const _);
                                let xh = _mm512_loadu_si512(x.hi.as_ptr().add(o) as *const _);
                                a[j] = _mm512_dpbusd_epi32(a[j], w, xl);
                                a[j + 1] = _mm512_dpbusd_epi32(a[j + 1], w, xh);
                            }
                        }
                        b += 1;
                    }
                    for (t, a) in total.iter_mut().zip(&acc) {
                        // The same lanes as `rows_lut8`'s: exact, so the same sums.
                        let lanes = _mm512_add_epi32(
                            _mm512_add_epi32(
                                _mm512_slli_epi32::<8>(_mm512_add_epi32(a[1], a[3])),
                                a[0],
                            ),
                            a[2],
                        );
                        let wide = _mm512_add_epi64(
                            _mm512_cvtepi32_epi64(_mm512_castsi512_si256(lanes)),
                            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(lanes)),
                        );
                        *t += _mm512_reduce_add_epi64(wide);
                    }
                }
                for (t, x) in sp.iter().enumerate() {
                    let v = (total[t] - 128 * x.sum) as f32 * (scales[r0 + i] / f * x.d);
                    out(t, i, v);
                }
            }
        }
    }

    /// [`TrellisMatvec::rows_lut8`]'s plain reference: each weight's state from its window,
    /// its int8 code, the exact integer `sum c * q` of the row in 64 bits, then the same float
    /// ops.
    #[cfg(test)]
    fn rows_split_portable(
        &self,
        words: &[u32],
        scales: &[f32],
        sp: &Split,
        r0: usize,
        y: &mut [f32],
    ) {
        let spec = &self.spec;
        let wpr = self.cols * spec.k as usize / 32;
        let bw = spec.block_words();
        let f = spec.code.divisor();
        for (i, yo) in y.iter_mut().enumerate() {
            let row = &words[(r0 + i) * wpr..(r0 + i + 1) * wpr];
            let mut total = 0i64;
            for (b, bwords) in row.chunks_exact(bw).enumerate() {
                for (t, s) in block_states(spec, bwords).into_iter().enumerate() {
                    let c = b * spec.block + t;
                    let q = 256 * i64::from(sp.hi[c]) + i64::from(sp.lo[c]);
                    total += i64::from(spec.code.int(spec.l, s)) * q;
                }
            }
            *yo = total as f32 * (scales[r0 + i] / f * sp.d);
        }
    }

    /// The window-gather path's rows: [`TrellisMatvec::rows_avx512_ms`] where the plan has
    /// a [`GatherPlan`], else [`TrellisMatvec::rows_avx512_plain`]. The same states, codes and
    /// float operations in the same order either way, so the same bits.
    ///
    /// # Safety
    /// `simd` is set (AVX-512 F/BW/VBMI2/VNNI exist) and the caller checked the sizes for
    /// these rows.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx512(
        &self,
        words: &[u32],
        scales: &[f32],
        x: &[f32],
        r0: usize,
        y: &mut [f32],
    ) {
        // SAFETY: the caller's contract; `gather` is set only where `lut_available` found
        // AVX-512 VBMI on top of `simd_available`'s set.
        unsafe {
            match &self.gather {
                Some(g) => self.rows_avx512_ms(g, words, scales, x, r0, y),
                None => self.rows_avx512_plain(words, scales, x, r0, y),
            }
        }
    }

    /// The window-gather rows with the plain plan: per 16 weights two `vpermd` (the words
    /// holding each window's high and low bits) and a funnel shift (`vpshrdvd`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni")]
    unsafe fn rows_avx512_plain(
        &self,
        words: &[u32],
        scales: &[f32],
        x: &[f32],
        r0: usize,
        y: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        // SAFETY: the plan's word indices are below the block's word count (at most 16), and
        // its offsets `c..c + 16` below the block.
        unsafe {
            gather_rows!(self, words, scales, x, r0, y, |wv, c| {
                let hi = _mm512_loadu_si512(self.hi.as_ptr().add(c) as *const _);
                let lo = _mm512_loadu_si512(self.lo.as_ptr().add(c) as *const _);
                let sh = _mm512_loadu_si512(self.sh.as_ptr().add(c) as *const _);
                let whi = _mm512_permutexvar_epi32(hi, wv);
                let wlo = _mm512_permutexvar_epi32(lo, wv);
                _mm512_shrdv_epi32(wlo, whi, sh)
            })
        }
    }

    /// The window-gather rows with the [`GatherPlan`]: per 16 weights one `vpermd` and one
    /// `vpmultishiftqb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,avx512vnni")]
    unsafe fn rows_avx512_ms(
        &self,
        g: &GatherPlan,
        words: &[u32],
        scales: &[f32],
        x: &[f32],
        r0: usize,
        y: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        // SAFETY: the plan holds `block` word indices (each below the block's word count, at
        // most 16) and `4 * block` offsets, read 16 and 64 at `c`, `4c` (`c + 16 <= block`).
        unsafe {
            gather_rows!(self, words, scales, x, r0, y, |wv, c| {
                let idx = _mm512_loadu_si512(g.idx.as_ptr().add(c) as *const _);
                let ctrl = _mm512_loadu_si512(g.ctrl.as_ptr().add(4 * c) as *const _);
                _mm512_multishift_epi64_epi8(ctrl, _mm512_permutexvar_epi32(idx, wv))
            })
        }
    }
}

/// Whether this CPU runs [`TrellisMatvec`]'s AVX-512 path (F, BW, VL, VBMI2, VNNI).
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vbmi2")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded stream of random 32-bit words (an LCG's high halves): any stream is a path.
    fn lcg_words(seed: u64) -> impl FnMut() -> u32 {
        let mut z = seed;
        move || {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (z >> 32) as u32
        }
    }

    fn gauss(n: usize, seed: u64) -> Vec<f32> {
        // Box-Muller over a splitmix stream.
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((x ^ (x >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u, v) = (next().max(1e-12), next());
                ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
            })
            .collect()
    }

    #[test]
    #[allow(clippy::excessive_precision)]
    fn code_matches_qtip_formula() {
        for s in [0u32, 1, 2, 255, 4096, 65535] {
            let x = (u64::from(s) * 34038481 + 76625530) & 0xFFFF_FFFF;
            let sum = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + ((x >> 24) & 255);
            let want = (sum as i64 - 510) as f32 / 147.800537109375;
            assert_eq!(code_1mad(s).to_bits(), want.to_bits());
        }
    }

    #[test]
    fn windows_and_sequential_decode_agree_and_tail_bite() {
        for (k, l) in [(2, 8), (3, 10), (4, 16), (3, 16)] {
            let spec = TrellisSpec {
                k,
                l,
                block: 32,
                code: TrellisCode::Mad,
            };
            spec.check().unwrap();
            let x = gauss(32, 7);
            let codes = code_table(l);
            let mut s = Scratch::new(&spec);
            let mut words = vec![0u32; spec.block_words()];
            encode_block(
                crate::cpu::Isa::detect(),
                &spec,
                &x,
                &codes,
                &mut s,
                &mut words,
            );
            let states = block_states(&spec, &words);
            for t in 0..32 {
                let prev = states[(t + 31) % 32];
                assert_eq!(
                    states[t] >> k,
                    prev & ((1 << (l - k)) - 1),
                    "k={k} l={l} t={t}"
                );
            }
            let mut dec = vec![0.0; 32];
            decode_row(&spec, &words, 1.0, &mut dec);
            for t in 0..32 {
                assert_eq!(dec[t].to_bits(), code_1mad(states[t]).to_bits());
            }
        }
    }

    /// A plain Viterbi (every state, every predecessor, no scratch reuse) with the
    /// encoder's tie rules: the lowest predecessor index, the lowest final state.
    fn viterbi_plain(spec: &TrellisSpec, x: &[f32], overlap: Option<u32>) -> Vec<u32> {
        let (k, l) = (spec.k, spec.l);
        let (n, g) = (1usize << l, 1u32 << (l - k));
        let codes = code_table(l);
        let mut cost: Vec<f32> = (0..n as u32)
            .map(|st| match overlap {
                Some(o) if st >> k != o => f32::INFINITY,
                _ => (x[0] - codes[st as usize]) * (x[0] - codes[st as usize]),
            })
            .collect();
        let mut args = vec![vec![0u32; n]; x.len()];
        for t in 1..x.len() {
            let mut next = vec![0.0f32; n];
            for s2 in 0..n as u32 {
                let (mut best, mut arg) = (f32::INFINITY, 0u32);
                for p in 0..1u32 << k {
                    let c = cost[((p << (l - k)) | (s2 >> k)) as usize];
                    if p == 0 || c < best {
                        (best, arg) = (c, p);
                    }
                }
                let d = x[t] - codes[s2 as usize];
                next[s2 as usize] = best + d * d;
                args[t][s2 as usize] = arg;
            }
            cost = next;
        }
        let mut last = 0u32;
        let mut lowest = f32::INFINITY;
        for st in 0..n as u32 {
            if overlap.is_none_or(|o| st & (g - 1) == o) && cost[st as usize] < lowest {
                (lowest, last) = (cost[st as usize], st);
            }
        }
        let mut path = vec![last; x.len()];
        for t in (1..x.len()).rev() {
            let cur = path[t];
            path[t - 1] = (args[t][cur as usize] << (l - k)) | (cur >> k);
        }
        path
    }

    #[test]
    fn encoder_equals_a_plain_viterbi() {
        for (k, l) in [(2, 6), (2, 8), (3, 8), (4, 8), (3, 10), (4, 10)] {
            let spec = TrellisSpec {
                k,
                l,
                block: 64,
                code: TrellisCode::Mad,
            };
            let codes = code_table(l);
            let mut s = Scratch::new(&spec);
            for seed in 0..2 {
                let x = gauss(64, 200 + seed);
                let half = 32;
                let rolled: Vec<f32> = (0..64).map(|i| x[(i + 64 - half) % 64]).collect();
                let overlap = viterbi_plain(&spec, &rolled, None)[half] >> k;
                let path = viterbi_plain(&spec, &x, Some(overlap));
                let mut want = vec![0u32; spec.block_words()];
                pack_block(&spec, &path, &mut want);
                for isa in [crate::cpu::Isa::detect(), crate::cpu::Isa::Scalar] {
                    let mut got = vec![0u32; spec.block_words()];
                    encode_block(isa, &spec, &x, &codes, &mut s, &mut got);
                    assert_eq!(got, want, "k={k} l={l} seed={seed} {isa:?}");
                }
            }
        }
    }

    #[test]
    fn viterbi_simd_path_gives_the_portable_path() {
        // The add-compare-select on 16 groups a pass against the portable step: the same
        // words for every shape the SIMD step takes (and one it hands back, L - k < 4).
        let isa = crate::cpu::Isa::detect();
        for (k, l) in [
            (2, 6),
            (2, 8),
            (3, 8),
            (4, 8),
            (2, 12),
            (3, 12),
            (4, 12),
            (3, 14),
        ] {
            let spec = TrellisSpec {
                k,
                l,
                block: 64,
                code: TrellisCode::Mad,
            };
            let codes = code_table(l);
            let mut s = Scratch::new(&spec);
            for seed in 0..3 {
                let x = gauss(64, 100 + seed);
                let (mut a, mut b) = (vec![0u32; spec.block_words()], vec![0; spec.block_words()]);
                encode_block(isa, &spec, &x, &codes, &mut s, &mut a);
                encode_block(crate::cpu::Isa::Scalar, &spec, &x, &codes, &mut s, &mut b);
                assert_eq!(a, b, "k={k} l={l} seed={seed}");
            }
        }
    }

    #[test]
    fn gaussian_error_falls_with_bits() {
        // A Gaussian source: mean squared error per weight at k = 2, 3, 4 (L = 12).
        let x = gauss(4 * 256, 11);
        let mut mse = Vec::new();
        for k in [2u32, 3, 4] {
            let spec = TrellisSpec {
                k,
                l: 12,
                block: 256,
                code: TrellisCode::Mad,
            };
            let (words, scales) = quantize(&spec, &x, 4, 256, 3, 2).unwrap();
            let mut out = vec![0.0; x.len()];
            decode(&spec, &words, &scales, 4, 256, 2, &mut out).unwrap();
            // Undo the incoherence to compare in the original basis.
            let (su, sv) = layer_signs(3, 4, 256);
            let mut back = out.clone();
            // H is its own inverse: W = diag(su) H_r Wt H_c diag(sv).
            let mut t = vec![0.0; back.len()];
            for r in 0..4 {
                for c in 0..256 {
                    t[c * 4 + r] = back[r * 256 + c];
                }
            }
            for c in 0..256 {
                fwht_blocks(&mut t[c * 4..(c + 1) * 4], hadamard_block(4));
            }
            for r in 0..4 {
                for c in 0..256 {
                    back[r * 256 + c] = t[c * 4 + r];
                }
                fwht_blocks(&mut back[r * 256..(r + 1) * 256], 256);
                for c in 0..256 {
                    back[r * 256 + c] *= su[r] * sv[c];
                }
            }
            let e: f32 = back
                .iter()
                .zip(&x)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                / x.len() as f32;
            mse.push(e);
        }
        // Lloyd-Max scalar quantizers reach 0.118 / 0.0345 / 0.0095 at 2 / 3 / 4 bits.
        assert!(mse[0] < 0.118, "{mse:?}");
        assert!(mse[1] < 0.0345, "{mse:?}");
        assert!(mse[2] < 0.0095, "{mse:?}");
    }

    #[test]
    fn fwht_simd_path_gives_the_portable_bits() {
        for block in [1usize, 2, 8, 16, 32, 64, 128, 512, 4096] {
            let x = gauss(3 * block.max(64), block as u64);
            let (mut a, mut b) = (x.clone(), x.clone());
            fwht_blocks(&mut a, block);
            fwht_blocks_portable(&mut b, block);
            let same = a.iter().zip(&b).all(|(u, v)| u.to_bits() == v.to_bits());
            assert!(same, "block {block}");
        }
    }

    #[test]
    fn one_dispatch_for_several_trellis_jobs_gives_each_its_own_bits() {
        use crate::cpu::{matmul_t, Activations, CpuContext, Isa, MatJob, Matrix};
        let spec = TrellisSpec {
            k: 3,
            l: 8,
            block: 64,
            code: TrellisCode::Mad,
        };
        // Five inputs: four through the several-input kernel, one alone; float32 and int16
        // activations (each against the plan that takes those inputs alone).
        let (cols, m) = (128, 5);
        for act in [Activations::F32, Activations::Int16] {
            let mut ctx = CpuContext::with_isa(2, Isa::detect()).unwrap();
            ctx.activations = act;
            let coded: Vec<_> = [64usize, 48]
                .iter()
                .map(|&rows| {
                    let w = gauss(rows * cols, rows as u64);
                    let (words, scales) = quantize(&spec, &w, rows, cols, rows as u64, 2).unwrap();
                    let (su, sv) = layer_signs(rows as u64, rows, cols);
                    (words, scales, su, sv)
                })
                .collect();
            let plan = TrellisMatvec::new(&spec, cols).unwrap();
            let plan = if act == Activations::F32 {
                plan
            } else {
                plan.int16_inputs()
            };
            let views: Vec<TrellisView> = coded
                .iter()
                .map(|(w, s, su, sv)| TrellisView::new(w, s, su, sv, &plan).unwrap())
                .collect();
            let mats: Vec<Matrix> = views.iter().map(|&v| Matrix::trellis(v)).collect();
            let x = gauss(m * cols, 9);
            let (mut y0, mut y1) = (vec![0.0; m * 64], vec![0.0; m * 48]);
            let mut jobs = [
                MatJob {
                    w: &mats[0],
                    bias: None,
                    out: &mut y0,
                },
                MatJob {
                    w: &mats[1],
                    bias: None,
                    out: &mut y1,
                },
            ];
            matmul_t(&ctx, &x, m, &mut jobs).unwrap();
            for (v, got) in views.iter().zip([&y0, &y1]) {
                let rows = v.rows();
                let mut xh = vec![0.0; cols];
                for r in 0..m {
                    let mut want = vec![0.0; rows];
                    v.matvec(&ctx.pool, &x[r * cols..(r + 1) * cols], &mut xh, &mut want)
                        .unwrap();
                    let same = want
                        .iter()
                        .zip(&got[r * rows..(r + 1) * rows])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{act:?}: {rows} rows, input {r}");
                }
            }
        }
    }

    #[test]
    fn int16_input_preparation_simd_gives_the_portable_bits() {
        // Gaussian values, a loud one, and the edge cases (NaN, infinities, past the int16
        // range, half steps, signed zeros), at several steps `inv`.
        let mut x = gauss(512, 77);
        x[3] = 40.0;
        x[64] = f32::NAN;
        x[65] = f32::INFINITY;
        x[66] = f32::NEG_INFINITY;
        x[67] = -0.0;
        x[68] = 0.0;
        x[69] = 1e30;
        x[70] = -1e30;
        for inv in [0.0f32, 1.0, 819.1, 32767.0 / 40.0, 1e9, f32::INFINITY] {
            for v in [10.5f32, -10.5, 32767.5, -32768.5, 32766.5, 0.5, -0.5] {
                x[71] = v / inv.max(1e-30);
                let mut a = vec![0i16; x.len()];
                lut_input16_portable(&x, inv, &mut a);
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx512bw") {
                    let mut c = vec![0i16; x.len()];
                    // SAFETY: AVX-512 F/BW present; equal lengths, a multiple of 64.
                    unsafe { lut_input16_avx512(&x, inv, &mut c) };
                    assert_eq!(a, c, "inv {inv}, v {v}");
                }
            }
        }
        // The dispatching entry: the same step and values as the portable loop.
        let x = gauss(576, 78);
        let mut q = vec![0i16; 576];
        let d = lut_input16_into(&x, &mut q);
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        assert_eq!(d.to_bits(), (amax / X16_MAX).to_bits());
        let mut want = vec![0i16; 576];
        lut_input16_portable(&x, 1.0 / d, &mut want);
        assert_eq!(q, want);
    }

    #[test]
    fn trellis_calls_with_biases_odd_hadamard_blocks_and_one_thread_give_each_its_bits() {
        use crate::cpu::{matmul_t, Activations, CpuContext, Floats, Isa, MatJob, Matrix};
        // Every code: 1mad8's and 1mad8h.s and 1mad8s.s int16 calls run the int8 kernel.
        for (code, l, block) in [
            (TrellisCode::Mad, 8, 32),
            (TrellisCode::Mad8, 8, 32),
            (TrellisCode::Mad8H, 12, 64),
            (TrellisCode::Mad8H, 12, 32),
            (TrellisCode::Mad8S, 12, 64),
            (TrellisCode::Gauss8S, 12, 64),
            (TrellisCode::Gauss7S, 12, 64),
        ] {
            let spec = TrellisSpec {
                k: 3,
                l,
                block,
                code,
            };
            // Rows 40 and 24: Hadamard blocks of 8, so a chunk of 16 rows spans two and a block
            // two chunks; 3 jobs (as q, k, v); one and two threads; one input row and six.
            let cols = 128;
            let shapes = [64usize, 40, 24];
            let coded: Vec<_> = shapes
                .iter()
                .map(|&rows| {
                    let w = gauss(rows * cols, rows as u64 + 3);
                    let (words, scales) = quantize(&spec, &w, rows, cols, rows as u64, 2).unwrap();
                    let (su, sv) = layer_signs(rows as u64 + 1, rows, cols);
                    (words, scales, su, sv)
                })
                .collect();
            let bias: Vec<f32> = gauss(40, 5);
            for threads in [1, 2] {
                for act in [Activations::F32, Activations::Int16] {
                    let mut ctx = CpuContext::with_isa(threads, Isa::detect()).unwrap();
                    ctx.activations = act;
                    let plan = TrellisMatvec::new(&spec, cols).unwrap();
                    let plan = if act == Activations::F32 {
                        plan
                    } else {
                        plan.int16_inputs()
                    };
                    let views: Vec<TrellisView> = coded
                        .iter()
                        .map(|(w, s, su, sv)| TrellisView::new(w, s, su, sv, &plan).unwrap())
                        .collect();
                    let mats: Vec<Matrix> = views.iter().map(|&v| Matrix::trellis(v)).collect();
                    for m in [1usize, 6] {
                        let x = gauss(m * cols, 9 + m as u64);
                        let mut ys: Vec<Vec<f32>> =
                            shapes.iter().map(|&r| vec![0.0; m * r]).collect();
                        let [y0, y1, y2] = &mut ys[..] else {
                            unreachable!()
                        };
                        let mut jobs = [
                            MatJob {
                                w: &mats[0],
                                bias: None,
                                out: y0,
                            },
                            MatJob {
                                w: &mats[1],
                                bias: Some(Floats::F32(&bias)),
                                out: y1,
                            },
                            MatJob {
                                w: &mats[2],
                                bias: None,
                                out: y2,
                            },
                        ];
                        matmul_t(&ctx, &x, m, &mut jobs).unwrap();
                        for (j, (v, got)) in views.iter().zip(&ys).enumerate() {
                            let rows = v.rows();
                            let mut xh = vec![0.0; cols];
                            for r in 0..m {
                                let mut want = vec![0.0; rows];
                                v.matvec(
                                    &ctx.pool,
                                    &x[r * cols..(r + 1) * cols],
                                    &mut xh,
                                    &mut want,
                                )
                                .unwrap();
                                if j == 1 {
                                    for (o, b) in want.iter_mut().zip(&bias) {
                                        *o += b;
                                    }
                                }
                                let same = want
                                    .iter()
                                    .zip(&got[r * rows..(r + 1) * rows])
                                    .all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(
                                    same,
                                    "{spec:?} {threads} threads {act:?} m {m}: job {j}, row {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn int16_table_path_sums_long_rows_within_its_bound() {
        // Rows past the int16 kernels' 32-bit flush (2048 weights), an input with one loud
        // value (a coarse step): the L3 bound of the fused path's test still holds.
        let spec = TrellisSpec {
            k: 3,
            l: 8,
            block: 32,
            code: TrellisCode::Mad,
        };
        let (rows, cols) = (3, 4160);
        let w = gauss(rows * cols, 41);
        let (words, scales) = quantize(&spec, &w, rows, cols, 2, 2).unwrap();
        let mut dense = vec![0.0; w.len()];
        decode(&spec, &words, &scales, rows, cols, 1, &mut dense).unwrap();
        let mut x = gauss(cols, 42);
        x[77] = 40.0;
        let fast = TrellisMatvec::new(&spec, cols).unwrap().int16_inputs();
        let mut y = vec![0.0; rows];
        fast.rows(&words, &scales, &x, 0, &mut y).unwrap();
        let step = 40.0 / 32767.0;
        for r in 0..rows {
            let d = &dense[r * cols..(r + 1) * cols];
            let want: f64 = d
                .iter()
                .zip(&x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let norm: f64 = d
                .iter()
                .zip(&x)
                .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                .sum();
            let wabs: f64 = d.iter().map(|&a| f64::from(a).abs()).sum();
            let bound = if fast.is_int16() {
                wabs * step / 2.0 + 1e-5 * norm
            } else {
                1e-5 * norm
            };
            let got = f64::from(y[r]);
            assert!(
                (got - want).abs() <= bound,
                "row {r}: {got} vs {want} (bound {bound})"
            );
        }
    }

    #[test]
    fn mad8_code_is_1mad_rounded_to_int8() {
        for s in 0..1u32 << 16 {
            let c = TrellisCode::Mad.int(16, s);
            let r = TrellisCode::Mad8.int(16, s);
            assert!((-127..=127).contains(&r), "state {s}: {r}");
            let exact = f64::from(c) * 127.0 / 510.0;
            assert!(
                (f64::from(r) - exact).abs() <= 0.5,
                "state {s}: {r} vs {exact}"
            );
            assert_eq!(
                TrellisCode::Mad.value(16, s).to_bits(),
                code_1mad(s).to_bits(),
                "state {s}"
            );
        }
        assert_eq!(TrellisCode::from_name("1mad8"), Some(TrellisCode::Mad8));
        assert_eq!(
            TrellisCode::from_name(TrellisCode::Mad.name()),
            Some(TrellisCode::Mad)
        );
        assert_eq!(TrellisCode::from_name("2mad"), None);
        // 1mad8 only where its int8 kernel runs: 8-bit states, blocks of 32 or whole 64s.
        let spec = |l, block| TrellisSpec {
            k: 3,
            l,
            block,
            code: TrellisCode::Mad8,
        };
        assert!(spec(8, 32).check().is_ok());
        assert!(spec(8, 128).check().is_ok());
        for (l, block) in [(12, 32), (9, 64), (8, 256)] {
            let e = spec(l, block).check().unwrap_err();
            assert!(
                matches!(e, TrellisError::Mad8Shape { .. }) && e.to_string().contains("trellis_l"),
                "L {l}, block {block}: {e}"
            );
        }
        assert!(TrellisSpec {
            code: TrellisCode::Mad,
            ..spec(12, 256)
        }
        .check()
        .is_ok());
    }

    #[test]
    fn mad8h_code_is_1mad8_of_the_hashed_index() {
        // The index is the top byte plus the bottom byte mod 256; at L 12 and 16 every index
        // has the same number of states (16 and 256), so the 256 codes are used evenly.
        for l in [12u32, 16] {
            let mut count = vec![0u32; 256];
            for s in 0..1u32 << l {
                let i = mad8h_index(l, s);
                assert_eq!(i, ((s >> (l - 8)) + (s & 0xFF)) % 256);
                assert_eq!(
                    TrellisCode::Mad8H.int(l, s),
                    TrellisCode::Mad8.int(8, i),
                    "L {l} state {s}"
                );
                assert_eq!(
                    TrellisCode::Mad8H.value(l, s).to_bits(),
                    TrellisCode::Mad8.value(8, i).to_bits()
                );
                count[i as usize] += 1;
            }
            assert!(count.iter().all(|&c| c == 1 << (l - 8)), "L {l}");
        }
        // A state's 2^k successors take 2^k different indices (the new bits enter the bottom
        // byte only).
        for s in 0..1u32 << 12 {
            let mut seen: Vec<u32> = (0..8)
                .map(|b| mad8h_index(12, ((s << 3) | b) & 0xFFF))
                .collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 8, "state {s}");
        }
        assert_eq!(TrellisCode::from_name("1mad8h"), Some(TrellisCode::Mad8H));
        assert_eq!(TrellisCode::Mad8H.name(), "1mad8h");
        let spec = |l| TrellisSpec {
            k: 3,
            l,
            block: 64,
            code: TrellisCode::Mad8H,
        };
        for l in [9, 12, 16] {
            assert!(spec(l).check().is_ok(), "L {l}");
        }
        let e = spec(8).check().unwrap_err();
        assert!(
            matches!(e, TrellisError::Mad8HShape { l: 8, .. }) && e.to_string().contains("9..=16"),
            "{e}"
        );
        // The table and the row decoder agree with the code (the MLX path reads the table).
        let sp = spec(12);
        let table = spec_code_table(&sp);
        let w = gauss(4 * 128, 17);
        let (words, scales) = quantize(&sp, &w, 4, 128, 5, 1).unwrap();
        let mut out = vec![0.0f32; 128];
        decode_row(&sp, &words[..128 * 3 / 32], scales[0], &mut out);
        let states = block_states(&sp, &words[..sp.block_words()]);
        for (t, &st) in states.iter().enumerate() {
            assert_eq!(out[t].to_bits(), (table[st as usize] * scales[0]).to_bits());
        }
    }

    /// A table plan's 64 index bytes of group `g` of a step's words, as the kernels make them
    /// (`vpermd`, `vpmultishiftqb`, for 1mad8h a second one and `vpaddb`), in portable Rust.
    fn plan_indices(lut: &LutPlan, w: &[u32], g: usize) -> [u8; 64] {
        let mut out = [0u8; 64];
        for q in 0..8 {
            let hi = u64::from(w[lut.idx[16 * g + 2 * q + 1] as usize]);
            let lane = (hi << 32) | u64::from(w[lut.idx[16 * g + 2 * q] as usize]);
            for j in 0..8 {
                let at = 64 * g + 8 * q + j;
                let mut b = lane.rotate_right(u32::from(lut.ctrl[at])) as u8;
                if lut.hashed() {
                    let t = lane.rotate_right(u32::from(lut.ctrl_top[at])) as u8;
                    b = b.wrapping_add(if lut.sbox { SBOX[t as usize] } else { t });
                }
                out[8 * q + j] = b;
            }
        }
        out
    }

    /// The two-step plan's 128 index bytes of two steps' words (`vpermb`, then the offsets of
    /// both halves), in [`PairPlan::order`], in portable Rust.
    fn pair_indices(pp: &PairPlan, w: &[u32], hash: bool, sbox: bool) -> [u8; 128] {
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = [0u8; 128];
        for q in 0..8 {
            let mut lane = 0u64;
            for m in 0..8 {
                lane |= u64::from(bytes[pp.bytes[8 * q + m] as usize]) << (8 * m);
            }
            for h in 0..2 {
                for j in 0..8 {
                    let at = 8 * q + j;
                    let mut b = lane.rotate_right(u32::from(pp.ctrl[h][at])) as u8;
                    if hash {
                        let t = lane.rotate_right(u32::from(pp.ctrl_top[h][at])) as u8;
                        b = b.wrapping_add(if sbox { SBOX[t as usize] } else { t });
                    }
                    out[64 * h + at] = b;
                }
            }
        }
        out
    }

    /// The hashed codes' table index of an `l`-bit state.
    fn hashed_index(code: TrellisCode, l: u32, s: u32) -> u32 {
        match code {
            TrellisCode::Mad8S | TrellisCode::Gauss8S | TrellisCode::Gauss7S => mad8s_index(l, s),
            _ => mad8h_index(l, s),
        }
    }

    #[test]
    fn sbox_table_is_the_aes_sbox_and_the_gfni_instruction() {
        // FIPS-197's values, a permutation, and (where the CPU has GFNI) the one instruction
        // the table kernels use (`vgf2p8affineinvqb` with the AES matrix and 0x63) on all 256
        // bytes.
        assert_eq!(
            (SBOX[0x00], SBOX[0x01], SBOX[0x53], SBOX[0xFF]),
            (0x63, 0x7C, 0xED, 0x16)
        );
        let mut seen = [false; 256];
        for &v in SBOX.iter() {
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&b| b));
        #[cfg(target_arch = "x86_64")]
        {
            if !(std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("gfni"))
            {
                return;
            }
            #[target_feature(enable = "avx512f,avx512bw,gfni")]
            unsafe fn gfni(x: &[u8; 256]) -> [u8; 256] {
                use std::arch::x86_64::*;
                let mut out = [0u8; 256];
                // SAFETY: 256 bytes in and out, four vectors of 64.
                unsafe {
                    for i in 0..4 {
                        let v = _mm512_loadu_si512(x.as_ptr().add(64 * i) as *const _);
                        let s = sbox_bytes!(true, v);
                        _mm512_storeu_si512(out.as_mut_ptr().add(64 * i) as *mut _, s);
                    }
                }
                out
            }
            let x: [u8; 256] = std::array::from_fn(|i| i as u8);
            // SAFETY: the CPU has AVX-512 F and GFNI (checked above).
            let got = unsafe { gfni(&x) };
            assert_eq!(got, SBOX);
        }
    }

    #[test]
    fn mad8s_code_is_1mad8_of_the_sbox_index() {
        // The index is the S-box of the top byte plus the bottom byte mod 256. Unlike
        // 1mad8h's, the states do not spread evenly over the indices where the two bytes
        // overlap (L < 16): at L 12 every index has 8 to 29 states (16 on average), at L 9
        // 32 indices none; at L 16 each has 256. A state's 8 successors (L 12, k 3) take 8
        // different indices, and the table and the row decoder agree with the code.
        for l in [9u32, 12, 16] {
            let mut count = vec![0u32; 256];
            for s in 0..1u32 << l {
                let i = mad8s_index(l, s);
                let top = (s >> (l - 8)) & 0xFF;
                assert_eq!(i, (u32::from(SBOX[top as usize]) + (s & 0xFF)) % 256);
                assert_eq!(TrellisCode::Mad8S.int(l, s), TrellisCode::Mad8.int(8, i));
                count[i as usize] += 1;
            }
            let (lo, hi) = (count.iter().min(), count.iter().max());
            let want = match l {
                9 => (Some(&0), Some(&7)),
                12 => (Some(&8), Some(&29)),
                _ => (Some(&256), Some(&256)),
            };
            assert_eq!((lo, hi), want, "L {l}");
        }
        for s in 0..1u32 << 12 {
            let mut seen: Vec<u32> = (0..8)
                .map(|b| mad8s_index(12, ((s << 3) | b) & 0xFFF))
                .collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 8, "state {s}");
        }
        assert_eq!(TrellisCode::from_name("1mad8s"), Some(TrellisCode::Mad8S));
        assert_eq!(TrellisCode::Mad8S.name(), "1mad8s");
        let spec = |l| TrellisSpec {
            k: 3,
            l,
            block: 64,
            code: TrellisCode::Mad8S,
        };
        let e = spec(8).check().unwrap_err();
        assert!(
            matches!(e, TrellisError::Mad8HShape { l: 8, .. }) && e.to_string().contains("1mad8s"),
            "{e}"
        );
        let sp = spec(12);
        let table = spec_code_table(&sp);
        let w = gauss(4 * 128, 17);
        let (words, scales) = quantize(&sp, &w, 4, 128, 5, 1).unwrap();
        let mut out = vec![0.0f32; 128];
        decode_row(&sp, &words[..128 * 3 / 32], scales[0], &mut out);
        let states = block_states(&sp, &words[..sp.block_words()]);
        for (t, &st) in states.iter().enumerate() {
            assert_eq!(out[t].to_bits(), (table[st as usize] * scales[0]).to_bits());
        }
    }

    /// The standard normal quantile (Acklam's rational approximation, relative error below
    /// 1.2e-9).
    fn normal_quantile(p: f64) -> f64 {
        const A: [f64; 6] = [
            -3.969683028665376e1,
            2.209460984245205e2,
            -2.759285104469687e2,
            1.38357751867269e2,
            -3.066479806614716e1,
            2.506628277459239,
        ];
        const B: [f64; 5] = [
            -5.447609879822406e1,
            1.615858368580409e2,
            -1.556989798598866e2,
            6.680131188771972e1,
            -1.328068155288572e1,
        ];
        const C: [f64; 6] = [
            -7.784894002430293e-3,
            -3.223964580411365e-1,
            -2.400758277161838,
            -2.549732539343734,
            4.374664141464968,
            2.938163982698783,
        ];
        const D: [f64; 4] = [
            7.784695709041462e-3,
            3.224671290700398e-1,
            2.445134137142996,
            3.754408661907416,
        ];
        if p > 0.5 {
            return -normal_quantile(1.0 - p);
        }
        if p < 0.02425 {
            let q = (-2.0 * p.ln()).sqrt();
            (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
                / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
        } else {
            let (q, r) = (p - 0.5, (p - 0.5) * (p - 0.5));
            (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
                / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
        }
    }

    /// A stratified Gaussian table is its definition ([`GAUSS8_TABLE`]'s doc, `n` entries,
    /// values `mult` times the quantiles): every int8 code is the rounded quantile (none
    /// within 1e-4 of a rounding boundary, so the approximate quantile decides nothing), the
    /// divisor `127 / (mult q_max)`; and its set partition: any 2^j consecutive entries (mod
    /// `n`) hold one quantile of each 2^j-th of the distribution (j = 2, 3, 4).
    fn check_gauss_table(table: &[i8], scale: f32, mult: f64) {
        let n = table.len();
        let qmax = normal_quantile((n as f64 - 0.5) / n as f64);
        let mut pos = vec![0usize; n];
        for (i, p) in pos.iter_mut().enumerate() {
            let r = i % 16;
            let class = 4 * (r % 4) + 2 * ((r / 4) % 2) + r / 8;
            let mut peers: Vec<u32> = (0..n as u32).filter(|j| *j as usize % 16 == r).collect();
            peers.sort_by_key(|&j| (mad_sum(j), j));
            *p = n / 16 * class + peers.iter().position(|&j| j as usize == i).unwrap();
            let v = 127.0 * normal_quantile((*p as f64 + 0.5) / n as f64) / qmax;
            assert!((v.abs().fract() - 0.5).abs() > 1e-4, "entry {i}: {v}");
            assert_eq!(i32::from(table[i]), v.round() as i32, "entry {i}");
        }
        assert_eq!(scale, (127.0 / (mult * qmax)) as f32);
        // The positions are the n quantiles once each, the codes in their order.
        let mut by_pos = vec![0i8; n];
        for (i, &p) in pos.iter().enumerate() {
            by_pos[p] = table[i];
        }
        assert!(by_pos.windows(2).all(|w| w[0] <= w[1]));
        for m in [4usize, 8, 16] {
            for base in 0..n {
                let mut parts: Vec<usize> = (0..m).map(|b| pos[(base + b) % n] / (n / m)).collect();
                parts.sort_unstable();
                assert_eq!(parts, (0..m).collect::<Vec<_>>(), "{m} from {base}");
            }
        }
    }

    #[test]
    fn gauss_codes_are_their_stratified_tables_at_the_sbox_index() {
        check_gauss_table(&GAUSS8_TABLE, GAUSS8_SCALE, 1.05);
        check_gauss_table(&GAUSS7_TABLE, GAUSS7_SCALE, 1.1);
        // Where a state's 2^k successors read consecutive indices (the top byte holds none of
        // the new bits: L >= 8 + k), their codes span the distribution (above); each code is
        // its table at 1mad8s's index (gauss7s: its low 7 bits) on every state.
        for l in 9..=16u32 {
            for s in 0..1u32 << l {
                let i = mad8s_index(l, s);
                for (code, want, div) in [
                    (TrellisCode::Gauss8S, GAUSS8_TABLE[i as usize], GAUSS8_SCALE),
                    (
                        TrellisCode::Gauss7S,
                        GAUSS7_TABLE[(i & 0x7F) as usize],
                        GAUSS7_SCALE,
                    ),
                ] {
                    assert_eq!(code.int(l, s), i32::from(want));
                    assert_eq!(
                        code.value(l, s).to_bits(),
                        (f32::from(want) / div).to_bits()
                    );
                }
            }
            for k in 2..=4u32 {
                if l < 8 + k {
                    continue;
                }
                for p in 0..1u32 << (l - k) {
                    let first = mad8s_index(l, p << k);
                    for b in 0..1u32 << k {
                        assert_eq!(mad8s_index(l, (p << k) | b), (first + b) % 256);
                    }
                }
            }
        }
        for (code, name) in [
            (TrellisCode::Gauss8S, "gauss8s"),
            (TrellisCode::Gauss7S, "gauss7s"),
        ] {
            assert_eq!(TrellisCode::from_name(name), Some(code));
            assert_eq!(code.name(), name);
            let spec = TrellisSpec {
                k: 3,
                l: 8,
                block: 64,
                code,
            };
            let e = spec.check().unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
    }

    #[test]
    fn mad8h_window_plans_give_the_hashed_indices() {
        // Every 1mad8h shape: a table plan exactly where `check` accepts it, and its windows
        // (the bottom byte, where 1mad8 at L 8 reads, plus the top byte, L - 8 bits earlier,
        // wrapping around the block for the first weights) give each weight the index of its
        // state, on random words; the two-step plan's too where it applies. Pure plans, so
        // this runs on any CPU.
        let mut next = lcg_words(5);
        let mut plans = 0;
        // 1mad8h, 1mad8s (its top bytes through the S-box) and gauss8s (1mad8s's index).
        for (code, k) in [
            TrellisCode::Mad8H,
            TrellisCode::Mad8S,
            TrellisCode::Gauss8S,
            TrellisCode::Gauss7S,
        ]
        .into_iter()
        .flat_map(|c| (2..=4u32).map(move |k| (c, k)))
        {
            for l in 9..=16u32 {
                for block in [32usize, 64, 96, 128, 192, 256] {
                    let spec = TrellisSpec { k, l, block, code };
                    let cols = 2 * block.max(64);
                    let Some(lut) = LutPlan::new(&spec, cols) else {
                        let e = spec.check().unwrap_err();
                        assert!(
                            matches!(e, TrellisError::Mad8HShape { .. })
                                && e.to_string().contains("trellis_l"),
                            "{spec:?}: {e}"
                        );
                        continue;
                    };
                    assert!(spec.check().is_ok(), "{spec:?}");
                    assert_eq!(lut.ctrl_top.len(), lut.ctrl.len());
                    // The table: 1mad8's code of each index (gauss8s: its own table).
                    for i in 0..256u32 {
                        let c = match code {
                            TrellisCode::Gauss8S => i32::from(GAUSS8_TABLE[i as usize]),
                            TrellisCode::Gauss7S => i32::from(GAUSS7_TABLE[(i & 0x7F) as usize]),
                            _ => TrellisCode::Mad8.int(8, i),
                        };
                        assert_eq!(i32::from(lut.w8[i as usize]), c + 128);
                        let v = i16::from_le_bytes([lut.lo[i as usize], lut.hi[i as usize]]);
                        assert_eq!(i32::from(v), c);
                    }
                    plans += 1;
                    let (bw, sw) = (spec.block_words(), lut.span_words);
                    for _ in 0..3 {
                        // Two steps' words (the pair plan reads two).
                        let w: Vec<u32> = (0..2 * sw).map(|_| next()).collect();
                        let want: Vec<u8> = w
                            .chunks_exact(bw)
                            .flat_map(|b| block_states(&spec, b))
                            .map(|s| hashed_index(code, l, s) as u8)
                            .collect();
                        for step in 0..2 {
                            let ws = &w[step * sw..(step + 1) * sw];
                            for g in 0..lut.span / 64 {
                                let got = plan_indices(&lut, ws, g);
                                let at = step * lut.span + 64 * g;
                                assert_eq!(&got[..], &want[at..at + 64], "{spec:?} group {g}");
                            }
                        }
                        if let Some(pp) = &lut.pair {
                            let got = pair_indices(pp, &w, true, lut.sbox);
                            for (i, &o) in pp.order.iter().enumerate() {
                                assert_eq!(got[i], want[o as usize], "{spec:?} pair {i}");
                            }
                        }
                    }
                    // The default's shapes (3 bits, blocks of 32 and 64) have the two-step plan.
                    if k == 3 && block <= 64 {
                        assert!(lut.pair.is_some(), "{spec:?}");
                    }
                }
            }
        }
        assert!(plans >= 4 * 3 * 8 * 3, "{plans} plans");
    }

    /// [`TrellisMatvec::rows_lut`]'s plain twin: each weight's code from its state, the same
    /// fused multiply-adds into the same four sets of 16 lanes ([`lut_order`]), the same sums
    /// and reduction, so the kernel's bits.
    #[cfg(target_arch = "x86_64")]
    fn rows_lut_twin(plan: &TrellisMatvec, words: &[u32], scales: &[f32], x: &[f32]) -> Vec<f32> {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        unsafe fn reduce(v: &[f32; 16]) -> f32 {
            // SAFETY: 16 values.
            unsafe { _mm512_reduce_add_ps(_mm512_loadu_ps(v.as_ptr())) }
        }
        let (spec, cols) = (&plan.spec, plan.cols);
        let span = plan.lut.as_ref().unwrap().span;
        let wpr = cols * spec.k as usize / 32;
        let bw = spec.block_words();
        (0..scales.len())
            .map(|r| {
                let codes: Vec<i32> = words[r * wpr..(r + 1) * wpr]
                    .chunks_exact(bw)
                    .flat_map(|b| block_states(spec, b))
                    .map(|s| spec.code.int(spec.l, s))
                    .collect();
                let mut acc = [[0.0f32; 16]; 4];
                for b in 0..cols / span {
                    for g in 0..span / 64 {
                        for (q, a) in acc.iter_mut().enumerate() {
                            for (d, v) in a.iter_mut().enumerate() {
                                let c = b * span + 64 * g + lut_order(16 * q + d);
                                *v = (codes[c] as f32).mul_add(x[c], *v);
                            }
                        }
                    }
                }
                let sum: [f32; 16] =
                    std::array::from_fn(|d| (acc[0][d] + acc[1][d]) + (acc[2][d] + acc[3][d]));
                // SAFETY: the table path ran, so the CPU has AVX-512 F.
                let total = unsafe { reduce(&sum) };
                total * (scales[r] / spec.code.divisor())
            })
            .collect()
    }

    #[test]
    fn mad8h_table_kernels_give_their_reference_bits() {
        // L2: every table path the CPU decoder takes for a 1mad8h matrix (float32 inputs,
        // int16 inputs through the int8 kernel; one row and the two-row loop, an odd row
        // count; the prompt's several-input kernels; one and two threads) equals its plain
        // reference bit for bit: L 12 (the default) and others, blocks of 64 and 32, rows past
        // the int8 kernel's 32-bit window (2048 weights). Random words: any stream is a path.
        let mut next = lcg_words(9);
        // 1mad8h and 1mad8s (the GFNI S-box on the top bytes).
        for (code, (k, l, block, cols)) in [
            TrellisCode::Mad8H,
            TrellisCode::Mad8S,
            TrellisCode::Gauss8S,
            TrellisCode::Gauss7S,
        ]
        .into_iter()
        .flat_map(|c| {
            [
                (3u32, 12u32, 64usize, 576usize),
                (3, 12, 32, 576),
                (3, 12, 64, 4224),
                (3, 9, 64, 192),
                (3, 16, 32, 640),
                (2, 12, 64, 256),
                (4, 13, 32, 128),
                (3, 14, 128, 384),
                (2, 12, 192, 384),
                (2, 12, 256, 512),
            ]
            .map(|shape| (c, shape))
        }) {
            let spec = TrellisSpec { k, l, block, code };
            let rows = 7;
            let words: Vec<u32> = (0..rows * cols * k as usize / 32).map(|_| next()).collect();
            let scales: Vec<f32> = (0..rows).map(|r| 0.25 + r as f32 / 16.0).collect();
            let exact = TrellisMatvec::new(&spec, cols).unwrap();
            if !lut_available() {
                // No table path on this CPU: the portable fallback.
                assert!(!exact.is_table());
                return;
            }
            assert!(exact.is_table(), "{spec:?}");
            let int8 = exact.clone().int16_inputs();
            let xs: Vec<Vec<f32>> = (0..PROMPT_INPUTS)
                .map(|t| {
                    let mut x = gauss(cols, 90 + t as u64);
                    x[3 * t + 1] = 25.0;
                    x
                })
                .collect();
            let pool2 = crate::cpu::ThreadPool::new(2).unwrap();
            let pool1 = crate::cpu::ThreadPool::new(1).unwrap();
            for (name, plan) in [("f32", &exact), ("int8", &int8)] {
                let mut multi = vec![vec![0.0f32; rows]; PROMPT_INPUTS];
                let prepared: Vec<Option<Prepared>> = xs.iter().map(|x| plan.prepare(x)).collect();
                plan.rows_prepared_multi(
                    &words,
                    &scales,
                    std::array::from_fn(|t| &xs[t][..]),
                    std::array::from_fn(|t| prepared[t].as_ref()),
                    0,
                    rows,
                    &mut |t, i, v| multi[t][i] = v,
                );
                for (t, x) in xs.iter().enumerate() {
                    let want = match prepared[t].as_ref() {
                        Some(Prepared::S8(sp)) => {
                            let mut w = vec![0.0; rows];
                            plan.rows_split_portable(&words, &scales, sp, 0, &mut w);
                            w
                        }
                        Some(Prepared::F32(_)) => rows_lut_twin(plan, &words, &scales, x),
                        _ => panic!("{spec:?} {name}: not a table input"),
                    };
                    let mut got = vec![0.0; rows];
                    plan.rows(&words, &scales, x, 0, &mut got).unwrap();
                    // Rows from 3 on (the one-row loop for the first: an odd start).
                    let mut tail = vec![0.0; rows - 3];
                    plan.rows(&words, &scales, x, 3, &mut tail).unwrap();
                    let (mut p1, mut p2) = (vec![0.0; rows], vec![0.0; rows]);
                    plan.par(&pool1, &words, &scales, x, &mut p1).unwrap();
                    plan.par(&pool2, &words, &scales, x, &mut p2).unwrap();
                    for r in 0..rows {
                        let w = want[r].to_bits();
                        let ctx = format!("{spec:?} {cols} {name} input {t} row {r}");
                        assert_eq!(got[r].to_bits(), w, "{ctx}: rows");
                        assert_eq!(multi[t][r].to_bits(), w, "{ctx}: several inputs");
                        assert_eq!(p1[r].to_bits(), w, "{ctx}: one thread");
                        assert_eq!(p2[r].to_bits(), w, "{ctx}: two threads");
                        if r >= 3 {
                            assert_eq!(tail[r - 3].to_bits(), w, "{ctx}: from row 3");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn split_input_simd_gives_the_portable_bits() {
        let mut x = gauss(256, 61);
        x[3] = f32::NAN;
        x[5] = f32::INFINITY;
        x[6] = f32::NEG_INFINITY;
        x[9] = -0.0;
        x[200] = 1e30;
        for inv in [0.0f32, 1.0, 255.5, 1e4, 3e5] {
            let (mut l0, mut h0) = (vec![0i8; 256], vec![0i8; 256]);
            let s0 = split_input_portable(&x, inv, &mut l0, &mut h0);
            for (i, (&l, &h)) in l0.iter().zip(&h0).enumerate() {
                let (_, _, q) = split_one(x[i] * inv);
                assert_eq!(256 * i32::from(h) + i32::from(l), q, "{i} at {inv}");
                assert!(h > i8::MIN, "{i} at {inv}");
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
                let (mut l1, mut h1) = (vec![0i8; 256], vec![0i8; 256]);
                // SAFETY: the features were checked; the buffers are 256 long.
                let s1 = unsafe { split_input_avx512(&x, inv, &mut l1, &mut h1) };
                assert_eq!((s0, &l0, &h0), (s1, &l1, &h1), "at {inv}");
            }
        }
    }

    #[test]
    fn int8_kernel_gives_its_reference_bits_and_the_product_within_its_bound() {
        // L2: the int8 kernel (1mad8, int16 inputs) equals its plain reference bit for bit,
        // past the 32-bit window (2048 weights), at L 8 and 7, 2/3/4 bits, blocks of 32 and
        // 64; L3: within the input rounding's bound of the float32 product.
        for (k, l, block, cols) in [
            (3u32, 8u32, 32usize, 576usize),
            (3, 8, 32, 4160),
            (2, 8, 64, 1536),
            (4, 7, 32, 640),
            (3, 8, 64, 192),
            // The two-step pair path at L < 8 and blocks of 128.
            (3, 7, 32, 576),
            (2, 6, 64, 1536),
            (3, 8, 128, 640),
        ] {
            let spec = TrellisSpec {
                k,
                l,
                block,
                code: TrellisCode::Mad8,
            };
            let rows = 5;
            let w = gauss(rows * cols, 71 + cols as u64);
            let (words, scales) = quantize(&spec, &w, rows, cols, 2, 2).unwrap();
            let mut dense = vec![0.0; w.len()];
            decode(&spec, &words, &scales, rows, cols, 1, &mut dense).unwrap();
            let mut x = gauss(cols, 72);
            x[11] = 30.0;
            let plan = TrellisMatvec::new(&spec, cols).unwrap().int16_inputs();
            let Some(Prepared::S8(sp)) = plan.prepare(&x) else {
                // No table path on this CPU: nothing of the int8 kernel to test.
                assert!(!lut_available());
                return;
            };
            let mut want = vec![0.0; rows];
            plan.rows_split_portable(&words, &scales, &sp, 0, &mut want);
            let mut got = vec![0.0; rows];
            plan.rows(&words, &scales, &x, 0, &mut got).unwrap();
            for r in 0..rows {
                assert_eq!(
                    got[r].to_bits(),
                    want[r].to_bits(),
                    "{spec:?} {cols}: row {r}"
                );
                let d = &dense[r * cols..(r + 1) * cols];
                let exact: f64 = d
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let wabs: f64 = d.iter().map(|&a| f64::from(a).abs()).sum();
                let norm: f64 = d
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                    .sum();
                let bound = wabs * f64::from(sp.d) / 2.0 + 1e-5 * norm;
                let g = f64::from(got[r]);
                assert!(
                    (g - exact).abs() <= bound,
                    "{spec:?} {cols}: row {r}: {g} vs {exact} (bound {bound})"
                );
            }
            // The float32 table path reads the same codes: the decoded product up to the
            // summation order.
            let exact_plan = TrellisMatvec::new(&spec, cols).unwrap();
            let mut yf = vec![0.0; rows];
            exact_plan.rows(&words, &scales, &x, 0, &mut yf).unwrap();
            for r in 0..rows {
                let d = &dense[r * cols..(r + 1) * cols];
                let exact: f64 = d
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let norm: f64 = d
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                    .sum();
                assert!(
                    (f64::from(yf[r]) - exact).abs() <= 1e-5 * norm,
                    "{spec:?} row {r}"
                );
            }
        }
    }

    #[test]
    fn matvec_equals_decoded_product() {
        let spec = TrellisSpec {
            k: 3,
            l: 10,
            block: 64,
            code: TrellisCode::Mad,
        };
        let w = gauss(8 * 128, 5);
        let (words, scales) = quantize(&spec, &w, 8, 128, 9, 2).unwrap();
        let mut dense = vec![0.0; w.len()];
        decode(&spec, &words, &scales, 8, 128, 1, &mut dense).unwrap();
        let x = gauss(128, 6);
        let mut y = vec![0.0; 8];
        matvec_rows(&spec, &words, &scales, 128, &x, 0, &mut y);
        for r in 0..8 {
            let want: f32 = dense[r * 128..(r + 1) * 128]
                .iter()
                .zip(&x)
                .map(|(a, b)| a * b)
                .sum();
            assert!(
                (y[r] - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{r}: {} vs {want}",
                y[r]
            );
        }
    }

    /// L2: the window-gather path's multishift plan ([`GatherPlan`]) gives the plain plan's
    /// bits (the same states and the same float operations), on every row (the last ones read
    /// their words masked) of random streams (every bit pattern is a valid stream).
    #[test]
    fn gather_plan_gives_the_plain_plans_bits() {
        let mut next = lcg_words(11);
        for (k, l, block) in [
            (3, 12, 64),
            (2, 12, 64),
            (4, 12, 64),
            (3, 10, 32),
            (3, 16, 96),
            (2, 16, 256),
            (4, 16, 128),
            (2, 9, 32),
        ] {
            let spec = TrellisSpec {
                k,
                l,
                block,
                code: TrellisCode::Mad,
            };
            let (rows, cols) = (7, 3 * block);
            let words: Vec<u32> = (0..rows * cols * k as usize / 32).map(|_| next()).collect();
            let scales: Vec<f32> = (0..rows).map(|r| 0.5 + r as f32 / 8.0).collect();
            let x = gauss(cols, 31);
            let fast = TrellisMatvec::new(&spec, cols).unwrap();
            assert_eq!(
                fast.gather.is_some(),
                fast.simd && lut_available() && gather_knob()
            );
            let mut plain = fast.clone();
            plain.gather = None;
            let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
            fast.rows(&words, &scales, &x, 0, &mut a).unwrap();
            plain.rows(&words, &scales, &x, 0, &mut b).unwrap();
            for r in 0..rows {
                assert_eq!(
                    a[r].to_bits(),
                    b[r].to_bits(),
                    "k={k} l={l} block={block} row {r}"
                );
            }
        }
    }

    #[test]
    fn fused_matvec_paths_agree_with_the_decoded_product() {
        for (k, l, block) in [
            (2, 8, 64),
            (3, 8, 64),
            (4, 8, 64),
            (3, 8, 32),
            (2, 7, 32),
            (4, 8, 32),
            (3, 6, 128),
            (2, 8, 192),
            (4, 7, 64),
            (3, 12, 64),
            (4, 16, 128),
            (2, 16, 256),
            (3, 16, 96),
        ] {
            let spec = TrellisSpec {
                k,
                l,
                block,
                code: TrellisCode::Mad,
            };
            let (rows, cols) = (5, 2 * block);
            let w = gauss(rows * cols, 21);
            let (words, scales) = quantize(&spec, &w, rows, cols, 4, 2).unwrap();
            let mut dense = vec![0.0; w.len()];
            decode(&spec, &words, &scales, rows, cols, 1, &mut dense).unwrap();
            let x = gauss(cols, 22);
            let portable = TrellisMatvec::with_simd(&spec, cols, false).unwrap();
            let fast = TrellisMatvec::new(&spec, cols).unwrap();
            assert_eq!(
                fast.is_table(),
                l <= 8 && (block % 64 == 0 || block == 32) && lut_available()
            );
            let gather = fast.clone().without_table();
            let exact = fast.clone();
            let fast = fast.int16_inputs();
            assert!(!exact.is_int16());
            assert_eq!(fast.is_int16(), fast.is_table());
            let (mut y0, mut y1, mut y2) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; rows]);
            let (mut y3, mut y4) = (vec![0.0; rows], vec![0.0; rows]);
            portable.rows(&words, &scales, &x, 0, &mut y0).unwrap();
            fast.rows(&words, &scales, &x, 0, &mut y1).unwrap();
            gather.rows(&words, &scales, &x, 0, &mut y3).unwrap();
            exact.rows(&words, &scales, &x, 0, &mut y4).unwrap();
            // The int16 inputs' step: each input is off by at most half of it.
            let step = f64::from(x.iter().fold(0.0f32, |a, v| a.max(v.abs()))) / 32767.0;
            let pool = crate::cpu::ThreadPool::new(2).unwrap();
            fast.par(&pool, &words, &scales, &x, &mut y2).unwrap();

            for r in 0..rows {
                let want: f64 = dense[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let norm: f64 = dense[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                    .sum();
                for y in [y0[r], y3[r], y4[r]] {
                    assert!(
                        (f64::from(y) - want).abs() <= 1e-5 * norm,
                        "k={k} l={l} block={block} row {r}: {y} vs {want}"
                    );
                }
                // The fast path: int16 inputs where the table path runs (L3: the inputs'
                // rounding, at most half a step each, through the row's weights).
                let wabs: f64 = dense[r * cols..(r + 1) * cols]
                    .iter()
                    .map(|&a| f64::from(a).abs())
                    .sum();
                let bound = if fast.is_int16() {
                    wabs * step / 2.0 + 1e-5 * norm
                } else {
                    1e-5 * norm
                };
                let got = f64::from(y1[r]);
                assert!(
                    (got - want).abs() <= bound,
                    "k={k} l={l} block={block} row {r}, fast path: {got} vs {want} (bound {bound})"
                );
                assert_eq!(y1[r].to_bits(), y2[r].to_bits());
            }
        }
        let spec = TrellisSpec {
            k: 3,
            l: 8,
            block: 64,
            code: TrellisCode::Mad,
        };
        let m = TrellisMatvec::new(&spec, 128).unwrap();
        let mut y = vec![0.0; 2];
        assert!(m.rows(&[0; 12], &[1.0; 2], &[0.0; 128], 1, &mut y).is_err());
        assert!(m.rows(&[0; 24], &[1.0; 2], &[0.0; 100], 0, &mut y).is_err());
    }

    #[test]
    fn ldlq_lowers_the_output_error_on_correlated_inputs() {
        // Inputs with a few loud channels and correlated neighbours: H = X^T X / n.
        let (rows, cols, n) = (8, 128, 512);
        let w = gauss(rows * cols, 31);
        let z = gauss(n * cols, 32);
        let mut x = vec![0.0f32; n * cols];
        for t in 0..n {
            for c in 0..cols {
                let loud = if c % 37 == 5 { 20.0 } else { 1.0 };
                let prev = if c > 0 { z[t * cols + c - 1] } else { 0.0 };
                x[t * cols + c] = loud * (z[t * cols + c] + 0.8 * prev);
            }
        }
        let mut h = vec![0.0f32; cols * cols];
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            for (hr, &xi) in h.chunks_exact_mut(cols).zip(xt) {
                for (hv, &xj) in hr.iter_mut().zip(xt) {
                    *hv += xi * xj / n as f32;
                }
            }
        }
        let out_err = |words: &[u32], scales: &[f32], spec: &TrellisSpec| {
            let mut dec = vec![0.0; rows * cols];
            decode(spec, words, scales, rows, cols, 1, &mut dec).unwrap();
            let (su, sv) = layer_signs(3, rows, cols);
            let mut wt = w.clone();
            incoherent(&mut wt, rows, cols, &su, &sv);
            let mut hp = h.clone();
            incoherent(&mut hp, cols, cols, &sv, &sv);
            let mut e = 0.0f64;
            for r in 0..rows {
                let d: Vec<f64> = (0..cols)
                    .map(|c| f64::from(wt[r * cols + c] - dec[r * cols + c]))
                    .collect();
                for (hr, &di) in hp.chunks_exact(cols).zip(&d) {
                    for (&hv, &dj) in hr.iter().zip(&d) {
                        e += di * f64::from(hv) * dj;
                    }
                }
            }
            e
        };
        for k in [2u32, 3] {
            let spec = TrellisSpec {
                k,
                l: 8,
                block: 64,
                code: TrellisCode::Mad,
            };
            let (w0, s0) = quantize(&spec, &w, rows, cols, 3, 2).unwrap();
            let (w1, s1) = quantize_ldlq(&spec, &w, rows, cols, 3, 2, &h).unwrap();
            let (plain, ldlq) = (out_err(&w0, &s0, &spec), out_err(&w1, &s1, &spec));
            assert!(ldlq < 0.8 * plain, "{k} bits: LDLQ {ldlq} vs plain {plain}");
            // The refitted row scales minimize the output error: a row's scale moved by 5%
            // either way (the same codes) raises it.
            for r in [0, rows - 1] {
                for f in [0.95f32, 1.05] {
                    let mut s2 = s1.clone();
                    s2[r] *= f;
                    let moved = out_err(&w1, &s2, &spec);
                    assert!(moved > ldlq, "{k} bits, row {r} x {f}: {moved} vs {ldlq}");
                }
            }
        }
        let spec = TrellisSpec {
            k: 2,
            l: 8,
            block: 64,
            code: TrellisCode::Mad,
        };
        assert!(quantize_ldlq(&spec, &w, rows, cols, 3, 2, &h[1..]).is_err());
        let mut bad = h.clone();
        bad[0] = f32::NAN;
        assert!(quantize_ldlq(&spec, &w, rows, cols, 3, 2, &bad).is_err());
    }

    #[test]
    fn bad_shapes_are_errors() {
        let spec = TrellisSpec {
            k: 5,
            l: 16,
            block: 64,
            code: TrellisCode::Mad,
        };
        assert!(spec.check().is_err());
        let spec = TrellisSpec {
            k: 3,
            l: 16,
            block: 10,
            code: TrellisCode::Mad,
        };
        assert!(spec.check().is_err());
        let spec = TrellisSpec {
            k: 2,
            l: 16,
            block: 64,
            code: TrellisCode::Mad,
        };
        assert!(quantize(&spec, &[0.0; 100], 1, 100, 0, 1).is_err());
        assert!(quantize(&spec, &[f32::NAN; 64], 1, 64, 0, 1).is_err());
        // The table codes in blocks of 32 read two blocks a step: a row of an odd number of
        // blocks has no table kernel, so it is refused rather than run on the scalar path.
        for (code, l) in [
            (TrellisCode::Mad8, 8),
            (TrellisCode::Mad8H, 12),
            (TrellisCode::Mad8S, 12),
            (TrellisCode::Gauss8S, 12),
            (TrellisCode::Gauss7S, 12),
        ] {
            let spec = TrellisSpec {
                k: 3,
                l,
                block: 32,
                code,
            };
            assert!(spec.check_shape(4, 128).is_ok());
            let e = spec.check_shape(4, 96).unwrap_err();
            assert!(
                matches!(
                    e,
                    TrellisError::TableCols {
                        cols: 96,
                        span: 64,
                        ..
                    }
                ) && e.to_string().contains(code.name()),
                "{e}"
            );
            assert!(quantize(&spec, &[0.5; 4 * 96], 4, 96, 0, 1).is_err());
        }
        assert!(TrellisSpec {
            k: 3,
            l: 12,
            block: 32,
            code: TrellisCode::Mad,
        }
        .check_shape(4, 96)
        .is_ok());
    }
}

/// A trellis-coded linear as the CPU decoder reads it (borrowed, never copied): the stored
/// `Wt`'s words and row scales, the layer's signs and the fused kernel's plan, so that
/// `x W^T = su * H_r (Wt (H_c (sv * x)))` per input row (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct TrellisView<'a> {
    words: &'a [u32],
    scales: &'a [f32],
    su: &'a [f32],
    sv: &'a [f32],
    plan: &'a TrellisMatvec,
}

impl<'a> TrellisView<'a> {
    /// Checks the pieces against each other: `su` has the rows, `sv` and the plan the columns.
    pub fn new(
        words: &'a [u32],
        scales: &'a [f32],
        su: &'a [f32],
        sv: &'a [f32],
        plan: &'a TrellisMatvec,
    ) -> Result<TrellisView<'a>, TrellisError> {
        let (rows, cols) = (su.len(), sv.len());
        plan.spec.check_shape(rows, cols)?;
        let wpr = cols * plan.spec.k as usize / 32;
        if plan.cols != cols || words.len() != rows * wpr || scales.len() != rows {
            return Err(TrellisError::ViewSizes {
                rows,
                cols,
                needed: rows * wpr,
                words: words.len(),
                scales: scales.len(),
                plan_cols: plan.cols,
            });
        }
        Ok(TrellisView {
            words,
            scales,
            su,
            sv,
            plan,
        })
    }

    pub fn rows(&self) -> usize {
        self.su.len()
    }

    pub fn cols(&self) -> usize {
        self.sv.len()
    }

    /// `y = W x` for one input row (`x`: `cols`, `y`: `rows`), `xh` (`cols`) as scratch: the
    /// input transform here, the fused decode-and-dot kernel's rows shared among the pool's
    /// workers, the output transform here.
    pub fn matvec(
        &self,
        pool: &super::ThreadPool,
        x: &[f32],
        xh: &mut [f32],
        y: &mut [f32],
    ) -> Result<(), TrellisError> {
        let (rows, cols) = (self.rows(), self.cols());
        if x.len() != cols || xh.len() != cols || y.len() != rows {
            return Err(TrellisError::ViewMatvecSizes {
                rows,
                cols,
                inputs: x.len(),
                scratch: xh.len(),
                outputs: y.len(),
            });
        }
        self.input_transform(x, xh);
        self.plan.par(pool, self.words, self.scales, xh, y)?;
        self.output_transform(y);
        Ok(())
    }

    /// `xh = H_c (sv * x)` (both `cols` long).
    fn input_transform(&self, x: &[f32], xh: &mut [f32]) {
        for ((o, &v), &s) in xh.iter_mut().zip(x).zip(self.sv) {
            *o = v * s;
        }
        fwht_blocks(xh, hadamard_block(self.cols()));
    }

    /// `y = su * H_r y` (`rows` long).
    fn output_transform(&self, y: &mut [f32]) {
        fwht_blocks(y, hadamard_block(self.rows()));
        for (o, &s) in y.iter_mut().zip(self.su) {
            *o *= s;
        }
    }

    /// [`TrellisView::output_transform`] of one Hadamard block of rows: `y` holds rows
    /// `r0..r0 + y.len()`, `y.len()` the block (the blocks are independent, so the same bits).
    fn output_block(&self, y: &mut [f32], r0: usize) {
        fwht_blocks(y, y.len());
        for (o, &s) in y.iter_mut().zip(&self.su[r0..]) {
            *o *= s;
        }
    }

    /// Element `(r, c)` of the logical matrix (an embedding row's value; slow: it decodes the
    /// Hadamard blocks that hold it).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        let (rows, cols) = (self.rows(), self.cols());
        let (br, bc) = (hadamard_block(rows), hadamard_block(cols));
        let (r0, c0) = (r / br * br, c / bc * bc);
        let wpr = cols * self.plan.spec.k as usize / 32;
        let mut dec = vec![0.0f32; cols];
        // Column c of H_c's block, row r of H_r's block (symmetric, so rows).
        let hc = hadamard_matrix(bc);
        let hr = hadamard_matrix(br);
        let mut sum = 0.0f64;
        for i in 0..br {
            let row = r0 + i;
            decode_row(
                &self.plan.spec,
                &self.words[row * wpr..(row + 1) * wpr],
                self.scales[row],
                &mut dec,
            );
            let inner: f64 = (0..bc)
                .map(|j| f64::from(dec[c0 + j]) * f64::from(hc[j * bc + (c - c0)]))
                .sum();
            sum += f64::from(hr[(r - r0) * br + i]) * inner;
        }
        (sum as f32) * self.su[r] * self.sv[c]
    }
}

/// One transformed input of a [`matmul_jobs`] call (a trellis job's `H_c (sv * x)` for one
/// input row, and the table path's input made from it): written once by the worker that
/// claimed it, then `ready` set (release); read by every worker after it sees `ready`
/// (acquire).
struct Slot {
    ready: AtomicBool,
    x: UnsafeCell<Vec<f32>>,
    p: UnsafeCell<Option<Prepared>>,
}

// SAFETY: `x` and `p` are written only by the one worker that claimed the slot (an atomic
// counter hands each slot out once a pool run) before it sets `ready` with release ordering,
// and read only after `ready` is seen set with acquire ordering, until the run ends.
unsafe impl Sync for Slot {}

impl Slot {
    fn new() -> Slot {
        Slot {
            ready: AtomicBool::new(false),
            x: UnsafeCell::new(Vec::new()),
            p: UnsafeCell::new(None),
        }
    }
}

/// A call's reusable buffers (the caller thread's, so a decode step allocates nothing): the
/// slots and the per-Hadamard-block counts of finished rows.
#[derive(Default)]
struct CallScratch {
    slots: Vec<Slot>,
    done: Vec<AtomicUsize>,
}

thread_local! {
    static SCRATCH: RefCell<CallScratch> = RefCell::new(CallScratch::default());
}

/// Rows of a trellis job's output a work item computes: 32, the affine products' largest
/// block (`cpu::batch`); 16 left each item's claim, plan set-up and Hadamard-block count a
/// larger share of its time (results/quant/2026-12-05-s30-trellis-cpu/chunk_ab.txt).
const CHUNK: usize = 32;

/// Waits (spinning, then yielding) until `slot` is ready. The slot was claimed by a worker
/// inside this pool run that finishes it without waiting on anything.
#[inline]
fn wait_ready(slot: &Slot) {
    let mut i = 0u32;
    while !slot.ready.load(Ordering::Acquire) {
        if i < 4096 {
            std::hint::spin_loop();
            i += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// [`super::matmul_t`] / [`super::matmul_t_each`] for a call holding a trellis matrix (checked
/// by the caller): the other jobs through `matmul_t` one at a time; then per input row (a
/// prompt's rows [`PROMPT_INPUTS`] at a time, each group's codes made once for all of them)
/// one pool run over the trellis jobs (q, k and v, or gate and up, share it) in which
/// - the workers first take the jobs' input transforms (signs, Hadamard blocks, the table
///   path's input) one job and input row each;
/// - then chunks of [`CHUNK`] rows (each worker its own region first, [`super::Regions`]),
///   each waiting for its job's transformed input;
/// - the worker that finishes the last rows of a Hadamard block of an output applies that
///   block's output transform (and the bias).
///
/// Every output gets the bits [`TrellisView::matvec`] gives it alone. `pf(b, blocks)` runs
/// before work item `b` of `blocks` (the decoder's KV prefetch hint).
pub(super) fn matmul_jobs(
    ctx: &super::CpuContext,
    x: &[f32],
    m: usize,
    jobs: &mut [super::MatJob<'_, '_>],
    pf: Option<&(dyn Fn(usize, usize) + Sync)>,
) -> crate::Result<()> {
    let op = "cpu::matmul_t (trellis)";
    let mut trellis: Vec<(usize, TrellisView<'_>)> = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter_mut().enumerate() {
        match j.w.trellis_view() {
            Some(t) => trellis.push((i, t)),
            None => super::matmul_t(ctx, x, m, std::slice::from_mut(j))?,
        }
    }
    let Some(&(_, first)) = trellis.first() else {
        return Ok(());
    };
    let chunk = trellis_knobs().1;
    let cols = first.cols();
    // The table path's inputs: int16 unless the context asks for float32 activations.
    let int16 = !matches!(ctx.activations, super::Activations::F32);
    const MT: usize = PROMPT_INPUTS;
    let nt = trellis.len();
    // Per trellis job: its first chunk, its first Hadamard-block counter (of MT inputs).
    let (mut chunk0, mut done0) = (vec![0usize; nt + 1], vec![0usize; nt + 1]);
    for (k, &(i, t)) in trellis.iter().enumerate() {
        let rows = t.rows();
        let bad = t.cols() != cols || x.len() < m * cols || jobs[i].out.len() < m * rows;
        if bad {
            return Err(crate::Error::invalid(
                op,
                format!(
                    "a ({rows}, {}) trellis matrix with {} inputs of {cols} and {} outputs",
                    t.cols(),
                    x.len(),
                    jobs[i].out.len()
                ),
            ));
        }
        if let Some(b) = jobs[i].bias {
            if b.len() != rows {
                return Err(crate::Error::invalid(
                    op,
                    format!("bias of {} for {rows} rows", b.len()),
                ));
            }
        }
        t.plan
            .check(t.words, t.scales, &x[..cols], 0, rows)
            .map_err(|e| crate::Error::invalid(op, e.to_string()))?;
        chunk0[k + 1] = chunk0[k] + rows.div_ceil(chunk);
        done0[k + 1] = done0[k] + MT * (rows / hadamard_block(rows));
    }
    let chunks = chunk0[nt];
    SCRATCH.with(|cell| {
        // A nested call (never made: the pool runs one job at a time) gets fresh buffers.
        let mut fresh = CallScratch::default();
        let mut guard = cell.try_borrow_mut();
        let sc = match guard.as_mut() {
            Ok(g) => &mut **g,
            Err(_) => &mut fresh,
        };
        while sc.slots.len() < nt * MT {
            sc.slots.push(Slot::new());
        }
        while sc.done.len() < done0[nt] {
            sc.done.push(AtomicUsize::new(0));
        }
        let (slots, done) = (&mut sc.slots[..nt * MT], &sc.done[..done0[nt]]);
        for s in slots.iter_mut() {
            s.x.get_mut().resize(cols, 0.0);
        }
        let slots = &*slots;
        let outs: Vec<super::SharedOut> = jobs
            .iter_mut()
            .map(|j| super::SharedOut::new(j.out))
            .collect();
        let outs = &outs[..];
        let biases: Vec<Option<super::Floats<'_>>> = jobs.iter().map(|j| j.bias).collect();
        let threads = ctx.pool.threads();
        // Input rows go MT at a time (a prompt), the rest one at a time; slot `k * MT + u`
        // holds job `k`'s transformed input row `r + u`.
        let mut r = 0;
        while r < m {
            let mt = if m - r >= MT { MT } else { 1 };
            for s in slots {
                s.ready.store(false, Ordering::Relaxed);
            }
            for c in done {
                c.store(0, Ordering::Relaxed);
            }
            let next_slot = AtomicUsize::new(0);
            let regions = super::Regions::new(chunks, threads);
            let trellis = &trellis;
            let (chunk0, done0, biases) = (&chunk0, &done0, &biases);
            ctx.pool.run(&|worker, _| {
                // The input transforms: one job and input row a claim.
                loop {
                    let s = next_slot.fetch_add(1, Ordering::Relaxed);
                    if s >= nt * mt {
                        break;
                    }
                    let (k, u) = (s / mt, s % mt);
                    let t = &trellis[k].1;
                    let slot = &slots[k * MT + u];
                    // SAFETY: slot `k * MT + u` is claimed by this worker alone (the atomic
                    // counter) and nobody reads it before `ready`.
                    let (xs, ps) = unsafe { (&mut *slot.x.get(), &mut *slot.p.get()) };
                    t.input_transform(&x[(r + u) * cols..(r + u + 1) * cols], xs);
                    t.plan.prepare_into(xs, int16, ps);
                    slot.ready.store(true, Ordering::Release);
                }
                // The rows.
                while let Some(c) = regions.claim(worker) {
                    if let Some(f) = pf {
                        f(c, chunks);
                    }
                    let k = chunk0.partition_point(|&c0| c0 <= c) - 1;
                    let (i, t) = trellis[k];
                    let rows = t.rows();
                    let r0 = (c - chunk0[k]) * chunk;
                    let n = chunk.min(rows - r0);
                    for u in 0..mt {
                        wait_ready(&slots[k * MT + u]);
                    }
                    // SAFETY (the reads below): every slot of job `k` is ready (acquire), and
                    // no worker writes it again in this run.
                    let xs = |u: usize| unsafe { (*slots[k * MT + u].x.get()).as_slice() };
                    let ps = |u: usize| unsafe { (*slots[k * MT + u].p.get()).as_ref() };
                    let out = outs[i];
                    if mt == MT {
                        t.plan.rows_prepared_multi(
                            t.words,
                            t.scales,
                            std::array::from_fn(xs),
                            std::array::from_fn(ps),
                            r0,
                            n,
                            // SAFETY: chunk `c` is claimed by exactly one worker (the regions)
                            // and the chunks of one job cover disjoint row ranges of its
                            // outputs, which outlive the pool run.
                            &mut |u, j, v| unsafe { out.write((r + u) * rows + r0 + j, v) },
                        );
                    } else {
                        // SAFETY: as above.
                        let ys = unsafe { out.range(r * rows + r0, n) };
                        t.plan
                            .rows_prepared(t.words, t.scales, xs(0), ps(0), r0, ys);
                    }
                    // Count the rows into their Hadamard blocks; the worker that completes a
                    // block transforms it (acquire-release: it sees every worker's rows).
                    let hb = hadamard_block(rows);
                    let nhb = rows / hb;
                    let mut a = r0;
                    while a < r0 + n {
                        let b = (a / hb + 1) * hb;
                        let e = b.min(r0 + n);
                        for u in 0..mt {
                            let cnt = &done[done0[k] + u * nhb + a / hb];
                            if cnt.fetch_add(e - a, Ordering::AcqRel) + (e - a) == hb {
                                let lo = (r + u) * rows + b - hb;
                                // SAFETY: all `hb` rows of this block are written (the count)
                                // and only this worker completed it, so nobody else touches
                                // them in this run.
                                let yb = unsafe { out.range(lo, hb) };
                                t.output_block(yb, b - hb);
                                if let Some(bias) = biases[i] {
                                    for (j, o) in yb.iter_mut().enumerate() {
                                        *o += bias.get(b - hb + j);
                                    }
                                }
                            }
                        }
                        a = e;
                    }
                }
            });
            r += mt;
        }
    });
    Ok(())
}
