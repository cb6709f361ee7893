//! Trellis-coded linears on the GPU (`graph_trellis.cu`, `"mode": "trellis"`; the format is
//! [`mlx_core::cpu::trellis`]'s): the kernels' source and the host's launch plan of one
//! linear, [`TrellisPlan`]. A linear `y = su * H_r (Wt (H_c (sv * x)))` is three launches:
//! `trellis_input` (the optional RMSNorm, the signs and the input's Hadamard blocks, float32
//! out), `trellis_matvec` (the fused decode-and-dot: each weight's 1MAD code computed in
//! registers from its own window of the row's words) and `trellis_output` (the output's
//! Hadamard blocks and signs, bfloat16 rounding, then the op that follows: bias, residual add,
//! SwiGLU with the gate's output, or float32 logits). `trellis_matvec_in` is the product with
//! `trellis_input` in its prologue (one launch for two, bit-equal to them), and
//! `trellis_matvec_out` with `trellis_output` in its epilogue (the last block to finish a
//! Hadamard block of rows transforms it; bit-equal to the two launches). `trellis_decode`
//! writes the decoded matrix, the device twin of `cpu::trellis::decode_row`. Six codes run:
//! `1mad` (each code computed), `1mad8` (at `L` 8 each code one load from a table of the
//! 256 states' codes in shared memory, a copy a lane: [`uses_lut`]), `1mad8h` (at `L` 12
//! the same table at each state's hashed index, `mad8h_index`: one multiply a weight more),
//! and the S-box codes `1mad8s`, `gauss8s` and `gauss7s` (at `L` 12 two loads a weight: the
//! AES S-box of the state's top byte from a table of its 256 entries, then the code at the
//! index from the code's table, each in shared memory a copy a lane: [`lut_floats_with`]);
//! [`l_arg`] carries the code in every launch.
//!
//! # Tier
//!
//! Checked on the CPU by `xtask/gpu/trellis_emulate.py` (the source run as C++ against
//! `examples/trellis_reference.rs`'s Rust references at SmolLM2-135M's shapes):
//! `trellis_decode`, `trellis_input` (without the norm) and `trellis_output` are L2, bit-exact
//! against `decode_row` and `fwht_blocks`, and `trellis_matvec_in` is bit-equal to
//! `trellis_input` then `trellis_matvec`; `trellis_matvec` sums in its own order (L3 against
//! the float64 product of the decoded matrix, within the rounding bound written in the
//! script; L2 on small integer inputs, whose sums are exact in any order), and so is the whole
//! linear against the CPU decoder's `TrellisView::matvec`.
//!
//! [`crate::graph_decode::GraphDecoder`] launches `trellis_qkv` (q, k and v in one launch:
//! the input norm, signs and Hadamard blocks in its prologue; the output transform, RoPE and
//! the cache write in its epilogue), `trellis_gate_up` (SwiGLU in its epilogue) and
//! `trellis_linear` (one launch a linear: `trellis_matvec_in`'s prologue and
//! `trellis_matvec_out`'s epilogue) for a trellis model; `trellis_rope_qkv` and two
//! `trellis_linear` launches are their plain twins, bit-equal on the emulator
//! (`xtask/gpu/trellis_step_emulate.py`, which also checks the step against the model's MLX
//! forward).

use mlx_core::cpu::trellis::{hadamard_block, TrellisCode, TrellisError, TrellisSpec};
use mlx_core::gpurt::{Arg, Buffer, GpuRuntime, Kernel};

/// The kernels' CUDA source, appended to [`crate::graph_source::SOURCE`] (whose helpers it
/// uses) for a model with trellis-coded linears.
pub const TRELLIS_SOURCE: &str = include_str!("graph_trellis.cu");

/// The hidden width from which a model's trellis kernels take [`TrellisSwitches::WIDE`]
/// (1,024-thread fused blocks, the aliased epilogue buffer and the pipelined product) by
/// default. On an H100 (`results/gpu/2026-12-06-s37-h100`, `mlx benchmark --decoder graph`) those
/// switches took the Llama-3.1-8B-shaped trellis-3 default model (hidden 4,096) from 86.4 to
/// 132.8 tok/s and SmolLM2-135M's (hidden 576) from 629.9 to 514.5. An SM holds one 1,024-thread
/// block, so a launch covers as many SMs as its grid has blocks: the launches over the hidden
/// state's rows (o and down; q at Llama's shapes) take 128 blocks of the H100's 132 at 4,096,
/// 9 to 18 at 576, and 48 to 64 at Llama-3.2-1B's and 3B's 2,048 and 3,072 (`xtask/gpu/
/// trellis_cost.py`'s grids), where the 256-thread default's grids fill every SM. So the wide
/// switches start at the one measured width where they paid; the widths between 576 and 4,096
/// are not measured (one device row there would move this constant).
pub const WIDE_HIDDEN: usize = 4096;

/// The trellis kernels' switches of one model: the source's defines ([`TrellisSwitches::source`]),
/// the launches' threads and grids ([`TrellisSwitches::threads`],
/// [`TrellisSwitches::qkv_flat`]) and their shared memory
/// ([`TrellisSwitches::epilogue_shared_bytes`], [`TrellisSwitches::lut_floats`]) all read this
/// one value, chosen once from the model's shape ([`TrellisSwitches::from_env`]), so the kernels
/// and their launches cannot disagree. Every choice computes the same bits (the emulators'
/// checks); only the speed differs.
///
/// | field | define | variable | by shape |
/// |---|---|---|---|
/// | `threads` | `TRELLIS_FUSED_THREADS` | `MLX_GRAPH_TRELLIS_THREADS` (256, 512, 1024) | 1,024 from [`WIDE_HIDDEN`], else 256 |
/// | `alias` | `TRELLIS_ALIAS` | `MLX_GRAPH_TRELLIS_ALIAS` | on from [`WIDE_HIDDEN`] |
/// | `pipe` | `TRELLIS_PIPE` | `MLX_GRAPH_TRELLIS_PIPE` | on from [`WIDE_HIDDEN`] |
/// | `split` | `TRELLIS_QKV_FLAT` (with wider blocks too) | `MLX_GRAPH_TRELLIS_SPLIT` | off |
/// | `states` | `TRELLIS_STATES` | `MLX_GRAPH_TRELLIS_STATES` | off (not run on a device) |
/// | `pair` | `TRELLIS_PAIR` | `MLX_GRAPH_TRELLIS_PAIR` | off (not run on a device) |
/// | `prefetch` | `TRELLIS_PREFETCH 0` when off | `MLX_GRAPH_TRELLIS_PREFETCH` | on |
/// | `rows2` | `TRELLIS_ROWS2` | `MLX_GRAPH_TRELLIS_ROWS2` | off |
///
/// A variable set to `1` turns its switch on, `0` off (`THREADS`: `256`, `512` or `1024`);
/// unset, or any other value (ignored, as the graph decoder's other switches ignore theirs),
/// leaves the shape's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrellisSwitches {
    /// Threads a block of the decoder's fused kernels (`trellis_linear`, `trellis_qkv`,
    /// `trellis_gate_up`): 256 ([`TRELLIS_THREADS`]), 512 or 1,024. At 1,024 an SM holds one
    /// block, which stages the transformed input and fills the tables once for 32 warps (the
    /// same bits: graph_trellis.cu's `TRELLIS_FUSED_THREADS`).
    pub threads: u32,
    /// The output transform's Hadamard buffer of the kernels with it in their epilogue
    /// (`trellis_linear`, `trellis_matvec_out`, `trellis_qkv`, `trellis_gate_up`) at the start
    /// of their dynamic shared memory instead of a static 16 KiB, so that their launches take
    /// [`TrellisSwitches::epilogue_shared_bytes`].
    pub alias: bool,
    /// The product's next block of words loaded before the current one's codes.
    pub pipe: bool,
    /// `trellis_qkv` on a flat grid even at 256 threads ([`TrellisSwitches::qkv_flat`]).
    pub split: bool,
    /// The S-box codes' (`1mad8s`, `gauss8s`, `gauss7s`) fast paths at `L` 12 read each
    /// weight's code from one table of the 4,096 states' codes (bytes, four a word, 32 copies:
    /// [`STATE_WORDS`]) instead of the S-box then the code's table: one shared-memory load a
    /// weight instead of two. Its plans take the bigger table ([`TrellisSwitches::lut_floats`]);
    /// 128 KiB of tables leave an SM one block, so it wants 1,024 threads.
    pub states: bool,
    /// The product's lanes load two blocks' words before decoding either.
    pub pair: bool,
    /// The L2 prefetches before the PDL wait (hints; off: `TRELLIS_PREFETCH 0`).
    pub prefetch: bool,
    /// 1mad8's table path two rows a lane (more registers).
    pub rows2: bool,
}

impl TrellisSwitches {
    /// Every switch at the kernels' own defaults: the source without a define (256-thread
    /// fused blocks, the prefetches on).
    pub const PLAIN: TrellisSwitches = TrellisSwitches {
        threads: TRELLIS_THREADS,
        alias: false,
        pipe: false,
        split: false,
        states: false,
        pair: false,
        prefetch: true,
        rows2: false,
    };

    /// [`TrellisSwitches::PLAIN`] with 1,024-thread fused blocks, `alias` and `pipe`: the
    /// choice from [`WIDE_HIDDEN`].
    pub const WIDE: TrellisSwitches = TrellisSwitches {
        threads: 1024,
        alias: true,
        pipe: true,
        ..TrellisSwitches::PLAIN
    };

    /// The choice for a model of hidden width `hidden`, no variable read:
    /// [`TrellisSwitches::WIDE`] from [`WIDE_HIDDEN`], else [`TrellisSwitches::PLAIN`].
    pub fn by_shape(hidden: usize) -> TrellisSwitches {
        if hidden >= WIDE_HIDDEN {
            TrellisSwitches::WIDE
        } else {
            TrellisSwitches::PLAIN
        }
    }

    /// `self` with each switch whose variable `var` gives as `1`/`0` (`THREADS`: `256`,
    /// `512`, `1024`) forced on/off (to that width); unset or any other value keeps `self`'s.
    pub fn overridden(self, var: impl Fn(&str) -> Option<String>) -> TrellisSwitches {
        let flag = |key: &str, now: bool| match var(key).as_deref() {
            Some("1") => true,
            Some("0") => false,
            _ => now,
        };
        TrellisSwitches {
            threads: match var("MLX_GRAPH_TRELLIS_THREADS").as_deref() {
                Some("256") => 256,
                Some("512") => 512,
                Some("1024") => 1024,
                _ => self.threads,
            },
            alias: flag("MLX_GRAPH_TRELLIS_ALIAS", self.alias),
            pipe: flag("MLX_GRAPH_TRELLIS_PIPE", self.pipe),
            split: flag("MLX_GRAPH_TRELLIS_SPLIT", self.split),
            states: flag("MLX_GRAPH_TRELLIS_STATES", self.states),
            pair: flag("MLX_GRAPH_TRELLIS_PAIR", self.pair),
            prefetch: flag("MLX_GRAPH_TRELLIS_PREFETCH", self.prefetch),
            rows2: flag("MLX_GRAPH_TRELLIS_ROWS2", self.rows2),
        }
    }

    /// The switches of a model of hidden width `hidden`: the shape's choice
    /// ([`TrellisSwitches::by_shape`]) under the environment's `MLX_GRAPH_TRELLIS_*` variables
    /// ([`TrellisSwitches::overridden`]). The graph decoder reads it once, when it is built
    /// ([`crate::graph_decode::GraphSpec::trellis_switches`]).
    pub fn from_env(hidden: usize) -> TrellisSwitches {
        TrellisSwitches::by_shape(hidden).overridden(|k| std::env::var(k).ok())
    }

    /// Whether the decoder launches `trellis_qkv` on a flat grid (its slices' blocks in
    /// proportion to their rows: [`qkv_kv_blocks`]) instead of three equal slices: `split`, or
    /// fused blocks wider than [`TRELLIS_THREADS`] (one a multiprocessor: equal slices would
    /// leave q's third of the GPU with four times the others' rows at Llama-3-8B's shapes).
    pub fn qkv_flat(&self) -> bool {
        self.split || self.threads > TRELLIS_THREADS
    }

    /// The defines [`TrellisSwitches::source`] puts before the kernels (after `TRELLIS_V_L`),
    /// in this order; none for [`TrellisSwitches::PLAIN`].
    pub fn defines(&self) -> String {
        let mut define = String::new();
        if !self.prefetch {
            define.push_str("#define TRELLIS_PREFETCH 0\n");
        }
        if self.rows2 {
            define.push_str("#define TRELLIS_ROWS2 1\n");
        }
        if self.alias {
            define.push_str("#define TRELLIS_ALIAS 1\n");
        }
        if self.pipe {
            define.push_str("#define TRELLIS_PIPE 1\n");
        }
        if self.threads != TRELLIS_THREADS {
            define.push_str(&format!("#define TRELLIS_FUSED_THREADS {}\n", self.threads));
        }
        if self.qkv_flat() {
            define.push_str("#define TRELLIS_QKV_FLAT 1\n");
        }
        if self.states {
            define.push_str("#define TRELLIS_STATES 1\n");
        }
        if self.pair {
            define.push_str("#define TRELLIS_PAIR 1\n");
        }
        define
    }

    /// [`TRELLIS_SOURCE`] as the graph decoder compiles it: with `v` (the value projections'
    /// spec where it differs from the rest's: [`crate::graph_decode::GraphSpec::trellis_v`]),
    /// `TRELLIS_V_L` defined first as its [`l_arg`] (`trellis_qkv`'s v slice decodes with it;
    /// without, the one-spec model's source); then [`TrellisSwitches::defines`]. With
    /// [`TrellisSwitches::PLAIN`] and no `v`, [`TRELLIS_SOURCE`] itself. [`TrellisGpu`] (the
    /// `cuda` test set's kernel check) compiles its plan's switches' source.
    pub fn source(&self, v: Option<&TrellisSpec>) -> String {
        let v = v.map_or(String::new(), |v| {
            format!("#define TRELLIS_V_L {}\n", l_arg(v))
        });
        format!("{v}{}{TRELLIS_SOURCE}", self.defines())
    }

    /// The dynamic shared memory of a launch with the output transform in its epilogue: the
    /// plan's `bytes` (the tables and the padded input), and with `alias` at least the widest
    /// output Hadamard block it transforms, `hb_rows` floats (the buffer then lies over them).
    pub fn epilogue_shared_bytes(&self, bytes: u32, hb_rows: usize) -> u32 {
        if self.alias {
            bytes.max(4 * hb_rows as u32)
        } else {
            bytes
        }
    }

    /// [`lut_floats_with`] under `states`.
    pub fn lut_floats(&self, spec: &TrellisSpec) -> usize {
        lut_floats_with(spec, self.states)
    }
}

/// k's and v's blocks each of a flat `trellis_qkv` grid of `total` blocks (at least 3) over
/// `q_rows` and `kv_rows` rows: their share of the rows, at least one; q takes the rest
/// (graph_trellis.cu's `trellis_qkv_kv_blocks`, which the kernel computes from its grid).
pub fn qkv_kv_blocks(total: u32, q_rows: usize, kv_rows: usize) -> u32 {
    let bk = u64::from(total) * kv_rows as u64 / (q_rows as u64 + 2 * kv_rows as u64);
    (bk as u32).max(1)
}

/// Words of the states' table ([`TrellisSwitches::states`]; `TRELLIS_STATE_WORDS`): 4,096 byte codes, four a
/// word, 32 copies of each word (128 KiB).
pub const STATE_WORDS: usize = 1024 * 32;

/// The kernels and their parameter counts (every parameter 8 bytes wide, as the runtime
/// checks).
pub const TRELLIS_KERNELS: [(&str, u32); 10] = [
    ("trellis_decode", 8),
    ("trellis_input", 9),
    ("trellis_matvec", 10),
    ("trellis_output", 9),
    ("trellis_matvec_in", 16),
    ("trellis_matvec_out", 18),
    ("trellis_linear", 24),
    ("trellis_rope_qkv", 11),
    ("trellis_qkv", 32),
    ("trellis_gate_up", 21),
];

/// Threads a block of every trellis kernel (`TRELLIS_THREADS` in the source).
pub const TRELLIS_THREADS: u32 = 256;
/// The largest Hadamard block the transforms hold in shared memory (`TRELLIS_MAX_HB`; the cap
/// of [`hadamard_block`]).
pub const TRELLIS_MAX_HB: usize = 4096;
/// Segments an epilogue's counting round takes at most (`TRELLIS_ROUND`: the size of its list
/// of completed Hadamard blocks).
pub const TRELLIS_ROUND: u32 = 128;
/// The static shared memory of the kernels with the output transform in their epilogue
/// (`trellis_linear`, `trellis_qkv`, `trellis_gate_up`, `trellis_matvec_out`): the Hadamard
/// buffer, the norm's reductions, the list of completed Hadamard blocks and its length, with
/// room for alignment; on top of a plan's dynamic bytes.
pub const STATIC_SHARED: u32 =
    4 * TRELLIS_MAX_HB as u32 + 4 * (TRELLIS_THREADS / 32) + 4 * TRELLIS_ROUND + 16;
/// The most dynamic shared memory a block of `trellis_matvec` may take: the H100's and
/// H200's 227 KiB a block (opted in), less `trellis_matvec_out`'s static 16 KiB Hadamard
/// buffer and its reductions.
pub const TRELLIS_MAX_SHARED: u32 = (227 - 17) * 1024;

/// `trellis_output`'s modes (graph_decode.cu's `MODE_RES`, `MODE_SWIGLU`, `MODE_F32`, and
/// `TRELLIS_RAW`): `0` writes the bfloat16 output.
pub const OUT_RES: i64 = 2;
pub const OUT_SWIGLU: i64 = 4;
pub const OUT_F32: i64 = 8;
/// With [`OUT_F32`]: the transform's float32 values, not rounded to bfloat16 (the L2 check's).
pub const OUT_RAW: i64 = 32;
/// Add the bias (bfloat16, one a row) after the rounding.
pub const OUT_BIAS: i64 = 64;

/// Where the kernels' `L` argument carries the code, above the state's bits
/// (`TRELLIS_CODE_SHIFT`): [`l_arg`].
pub const CODE_SHIFT: u32 = 8;
/// Floats of 1mad8's code table in shared memory (`TRELLIS_LUT_FLOATS`: the 256 states' codes,
/// 32 copies, one a lane), at the start of the product kernels' dynamic shared memory, before
/// the input (its address a constant: one LDS a lookup).
pub const LUT_FLOATS: usize = 8192;

/// Floats of the tables at the start of a plan's dynamic shared memory (`trellis_lut_floats`):
/// none where the product computes its codes; 1mad8's table ([`LUT_FLOATS`]) for 1mad8 and
/// 1mad8h; for the S-box codes the S-box (256 entries, 32 copies: [`LUT_FLOATS`]) then the
/// code table (256 entries, 32 copies; gauss7s's 128); with `states`
/// ([`TrellisSwitches::states`]), the S-box codes' table of every state's code
/// ([`STATE_WORDS`]).
pub fn lut_floats_with(spec: &TrellisSpec, states: bool) -> usize {
    if !uses_lut(spec) {
        return 0;
    }
    match spec.code {
        TrellisCode::Mad8S | TrellisCode::Gauss8S | TrellisCode::Gauss7S if states => STATE_WORDS,
        TrellisCode::Mad | TrellisCode::Mad8 | TrellisCode::Mad8H => LUT_FLOATS,
        TrellisCode::Mad8S | TrellisCode::Gauss8S => LUT_FLOATS + 256 * 32,
        TrellisCode::Gauss7S => LUT_FLOATS + 128 * 32,
    }
}

/// The kernels' `L` argument for `spec`: the state's bits, and the code above them (0 for 1mad,
/// 1 for 1mad8, 2 for 1mad8h, 3 for 1mad8s, 4 for gauss8s, 5 for gauss7s), so every launch of
/// a trellis matrix says how its states decode.
pub fn l_arg(spec: &TrellisSpec) -> i64 {
    let code = match spec.code {
        TrellisCode::Mad => 0,
        TrellisCode::Mad8 => 1,
        TrellisCode::Mad8H => 2,
        TrellisCode::Mad8S => 3,
        TrellisCode::Gauss8S => 4,
        TrellisCode::Gauss7S => 5,
    };
    i64::from(spec.l) | code << CODE_SHIFT
}

/// Whether the product reads tables in shared memory (`trellis_uses_lut`): 1mad8's fast paths
/// (`L` 8: its 256 codes), 1mad8h's (`L` 12, the same table at each state's hashed index) and
/// the S-box codes' (`L` 12: the S-box and the code's table), blocks of 32 or 64.
pub fn uses_lut(spec: &TrellisSpec) -> bool {
    let l = match spec.code {
        TrellisCode::Mad => return false,
        TrellisCode::Mad8 => 8,
        TrellisCode::Mad8H | TrellisCode::Mad8S | TrellisCode::Gauss8S | TrellisCode::Gauss7S => 12,
    };
    spec.l == l && matches!(spec.block, 32 | 64)
}

/// Multiprocessors [`lanes_per_row`] assumes when the device's count is not known (the H100
/// SXM's and H200's).
pub const DEFAULT_SMS: u32 = 132;

/// Whether `spec` takes `trellis_matvec`'s unrolled path: blocks of 32 with `L` 8 (the
/// quantizer's 3-bit choice) or blocks of 64 with `L` 12 (the config's defaults), and the
/// table paths ([`uses_lut`]: 1mad8's blocks of 32 or 64 with `L` 8, the hashed codes' with
/// `L` 12).
/// Any other shape runs the general path (each window read through L1), with the same results.
pub fn is_fast(spec: &TrellisSpec) -> bool {
    match spec.code {
        TrellisCode::Mad => matches!((spec.block, spec.l), (32, 8) | (64, 12)),
        TrellisCode::Mad8
        | TrellisCode::Mad8H
        | TrellisCode::Mad8S
        | TrellisCode::Gauss8S
        | TrellisCode::Gauss7S => uses_lut(spec),
    }
}

/// Lanes of a warp that share one row of `trellis_matvec` (1 to 32, a power of two): the
/// fast path gives each lane whole blocks, so fewer lanes a row waste fewer of them on a row of
/// few blocks, but leave fewer warps to fill the GPU. Chosen to maximise the lanes' share of
/// useful blocks times the share of `4 * sms` warps the grid fills (ties: more lanes). The
/// general path strides over single weights: 32.
pub fn lanes_per_row(spec: &TrellisSpec, rows: usize, cols: usize, sms: u32) -> u32 {
    if !is_fast(spec) || spec.block == 0 {
        return 32;
    }
    let nb = (cols / spec.block).max(1);
    let want = 4.0 * f64::from(sms.max(1));
    let mut best = (32u32, -1.0f64);
    for g in [32u32, 16, 8, 4, 2, 1] {
        let gu = g as usize;
        let eff = nb as f64 / (nb.div_ceil(gu) * gu) as f64;
        let fill = (rows as f64 * f64::from(g) / 32.0 / want).min(1.0);
        let score = eff * fill;
        if score > best.1 + 1e-12 {
            best = (g, score);
        }
    }
    best.0
}

/// Why `trellis_qkv` cannot run value projections of spec `v` beside q and k of spec `qk`
/// (one launch: v's slice takes its own code and `L` from `TRELLIS_V_L`, everything else from
/// the launch's arguments, which are q's and k's): `None` where it can. The bits (the rows'
/// words, the offsets of the side-by-side parts) and the blocks (the input's padding in shared
/// memory) must be q's and k's, and so must [`is_fast`] (then v's lanes a row, which the launch
/// passes as k's, are k's: [`lanes_per_row`] of the same shape).
pub fn v_spec_problem(qk: &TrellisSpec, v: &TrellisSpec) -> Option<String> {
    if v.k != qk.k {
        return Some(format!(
            "{} bits, q/k's {}: trellis_qkv's parts share their bits",
            v.k, qk.k
        ));
    }
    if v.block != qk.block {
        return Some(format!(
            "blocks of {}, q/k's {}: trellis_qkv's parts share their blocks",
            v.block, qk.block
        ));
    }
    if is_fast(v) != is_fast(qk) {
        let path = |s: &TrellisSpec| if is_fast(s) { "unrolled" } else { "general" };
        return Some(format!(
            "code {} L {} takes the {} path, q/k's ({} L {}) the {}: trellis_qkv's parts share \
             their lanes a row",
            v.code.name(),
            v.l,
            path(v),
            qk.code.name(),
            qk.l,
            path(qk)
        ));
    }
    None
}

/// Floats of padding a 32 inputs in `trellis_matvec`'s shared input (`trellis_pad`).
fn pad(block: usize) -> usize {
    if block == 32 {
        2
    } else {
        1
    }
}

/// How one trellis-coded `(rows, cols)` linear launches (checked against the kernels' limits
/// before the GPU is touched).
#[derive(Debug, Clone, PartialEq)]
pub struct TrellisPlan {
    pub spec: TrellisSpec,
    pub rows: usize,
    pub cols: usize,
    /// The output's and the input's Hadamard blocks.
    pub hb_rows: usize,
    pub hb_cols: usize,
    /// Their `1 / sqrt(block)` factors as the CPU's transform computes them (float32).
    pub hscale_rows: f32,
    pub hscale_cols: f32,
    /// `trellis_matvec`'s lanes a row ([`lanes_per_row`]).
    pub lanes_per_row: u32,
    /// `trellis_matvec`'s dynamic shared memory (the tables where the product reads them,
    /// [`TrellisSwitches::lut_floats`], then the padded float32 input).
    pub shared_bytes: u32,
    /// The model's switches the plan was made under (the tables' size; [`TrellisGpu`]
    /// compiles and launches its kernels with them).
    pub switches: TrellisSwitches,
}

/// Why a trellis matrix has no CUDA plan ([`TrellisPlan::new`]): the matrix's shape and
/// numbers, and which limit of the kernels it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrellisPlanError {
    /// The code's parameters or the matrix's shape ([`TrellisSpec::check_shape`]).
    Shape(TrellisError),
    /// A side of `2^31` or more.
    Size { rows: usize, cols: usize },
    /// The padded float32 input does not fit `trellis_matvec`'s shared memory.
    SharedMemory { cols: usize, bytes: usize },
    /// A code the CUDA kernels do not decode (none now: every [`TrellisCode`] has a path; kept
    /// for a code added to the CPU first).
    Code(TrellisCode),
}

impl std::fmt::Display for TrellisPlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrellisPlanError::Shape(e) => write!(f, "{e}"),
            TrellisPlanError::Size { rows, cols } => {
                write!(f, "a ({rows}, {cols}) trellis matrix: not 31-bit sizes")
            }
            TrellisPlanError::SharedMemory { cols, bytes } => write!(
                f,
                "a trellis matrix of {cols} inputs: its input takes {bytes} bytes of shared \
                 memory, more than {TRELLIS_MAX_SHARED}"
            ),
            TrellisPlanError::Code(c) => write!(
                f,
                "trellis_code {} has no CUDA path (use --decoder cpu or mlx, or convert with \
                 1mad, 1mad8 or 1mad8h)",
                c.name()
            ),
        }
    }
}

impl std::error::Error for TrellisPlanError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TrellisPlanError::Shape(e) => Some(e),
            _ => None,
        }
    }
}

impl TrellisPlan {
    /// The plan of a `(rows, cols)` matrix of `spec` on a GPU of `sms` multiprocessors under
    /// the model's `switches`; `Err` names the problem.
    pub fn new(
        spec: &TrellisSpec,
        rows: usize,
        cols: usize,
        sms: u32,
        switches: &TrellisSwitches,
    ) -> std::result::Result<TrellisPlan, TrellisPlanError> {
        spec.check_shape(rows, cols)
            .map_err(TrellisPlanError::Shape)?;
        if rows >= 1 << 31 || cols >= 1 << 31 {
            return Err(TrellisPlanError::Size { rows, cols });
        }
        let (hb_rows, hb_cols) = (hadamard_block(rows), hadamard_block(cols));
        let input = (cols + pad(spec.block) * cols.div_ceil(32)) * 4;
        // The tables first, then the input (`trellis_lut`, `trellis_xs_base`).
        let bytes = 4 * switches.lut_floats(spec) + input;
        if bytes > TRELLIS_MAX_SHARED as usize {
            return Err(TrellisPlanError::SharedMemory { cols, bytes });
        }
        Ok(TrellisPlan {
            spec: *spec,
            rows,
            cols,
            hb_rows,
            hb_cols,
            hscale_rows: 1.0 / (hb_rows as f32).sqrt(),
            hscale_cols: 1.0 / (hb_cols as f32).sqrt(),
            lanes_per_row: lanes_per_row(spec, rows, cols, sms),
            shared_bytes: bytes as u32,
            switches: *switches,
        })
    }

    /// `trellis_input`'s grid: a block per Hadamard block of the input, `sequences` rows.
    pub fn input_grid(&self, sequences: u32) -> (u32, u32) {
        ((self.cols / self.hb_cols) as u32, sequences)
    }

    /// `trellis_matvec`'s grid: enough blocks for every row group, at most `resident` (the
    /// blocks the GPU holds at once; the warps stride over the rest).
    pub fn matvec_grid(&self, sequences: u32, resident: u32) -> (u32, u32) {
        let rows_per_block = (TRELLIS_THREADS as usize / 32) * (32 / self.lanes_per_row as usize);
        let blocks = self
            .rows
            .div_ceil(rows_per_block)
            .min(resident.max(1) as usize);
        (blocks as u32, sequences)
    }

    /// The grid of a fused kernel's launch of `threads` a block (`trellis_linear`:
    /// [`TrellisSwitches::threads`]): enough blocks for every row group, at most `resident`.
    pub fn fused_grid(&self, threads: u32, sequences: u32, resident: u32) -> (u32, u32) {
        let rows_per_block = (threads as usize / 32) * (32 / self.lanes_per_row as usize);
        let blocks = self
            .rows
            .div_ceil(rows_per_block)
            .min(resident.max(1) as usize);
        (blocks as u32, sequences)
    }

    /// `trellis_output`'s grid: a block per Hadamard block of the output.
    pub fn output_grid(&self, sequences: u32) -> (u32, u32) {
        ((self.rows / self.hb_rows) as u32, sequences)
    }

    /// Bytes of the coded weights (`rows * cols * k / 8`) and the row scales (float32).
    pub fn weight_bytes(&self) -> usize {
        self.rows * self.cols * self.spec.k as usize / 8 + 4 * self.rows
    }
}

fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// [`TrellisGpu`]'s kernels and device buffers (indices: copied into launches and captures).
#[derive(Debug, Clone, Copy)]
struct Parts {
    kernels: [Kernel; 7],
    words: Buffer,
    scales: Buffer,
    su: Buffer,
    sv: Buffer,
    /// Scratch: the input (bfloat16), the norm's weights, xh, z, the output, the decoded matrix.
    x: Buffer,
    normw: Buffer,
    xh: Buffer,
    z: Buffer,
    y: Buffer,
    dec: Buffer,
    /// `trellis_matvec_out`'s counts, one a Hadamard block of rows (zero between launches).
    counts: Buffer,
}

/// One trellis-coded linear on the GPU, each kernel launched alone: the `cuda` test set's
/// device check of the kernels against `mlx_core::cpu::trellis`, and their timing. The words,
/// float32 scales and signs are uploaded once; inputs and outputs go through host slices. One
/// sequence.
pub struct TrellisGpu {
    rt: GpuRuntime,
    plan: TrellisPlan,
    parts: Parts,
}

fn invalid(op: &'static str, msg: String) -> mlx_core::Error {
    mlx_core::Error::InvalidArgument { op, message: msg }
}

impl TrellisGpu {
    /// Compiles the kernels (after the graph decoder's source, whose helpers they use) and
    /// uploads one matrix: `words` (`rows * cols * k / 32`), `scales` (`rows`), the signs `su`
    /// (`rows`) and `sv` (`cols`), as `plan` shapes them.
    pub fn new(
        plan: TrellisPlan,
        words: &[u32],
        scales: &[f32],
        su: &[f32],
        sv: &[f32],
    ) -> mlx_core::Result<TrellisGpu> {
        let (rows, cols) = (plan.rows, plan.cols);
        let wpr = cols * plan.spec.k as usize / 32;
        let sizes = (words.len(), scales.len(), su.len(), sv.len());
        if sizes != (rows * wpr, rows, rows, cols) {
            return Err(invalid(
                "TrellisGpu::new",
                format!(
                    "a ({rows}, {cols}) matrix needs {} words, {rows} scales, {rows} and {cols} \
                     signs; got {sizes:?}",
                    rows * wpr
                ),
            ));
        }
        let source = format!(
            "{}{}",
            crate::graph_source::SOURCE,
            plan.switches.source(None)
        );
        let mut rt = GpuRuntime::new(&source, &TRELLIS_KERNELS)?;
        let kernels = [
            rt.kernel("trellis_decode")?,
            rt.kernel("trellis_input")?,
            rt.kernel("trellis_matvec")?,
            rt.kernel("trellis_output")?,
            rt.kernel("trellis_matvec_in")?,
            rt.kernel("trellis_matvec_out")?,
            rt.kernel("trellis_linear")?,
        ];
        // trellis_matvec_out's static Hadamard buffer, reductions and list come on top; with
        // TRELLIS_ALIAS the epilogues' buffer lies in the dynamic memory (epilogue_shared_bytes).
        let epilogue = plan
            .switches
            .epilogue_shared_bytes(plan.shared_bytes, plan.hb_rows);
        if epilogue + STATIC_SHARED > 48 * 1024 {
            for k in [kernels[2], kernels[4]] {
                rt.set_shared_limit(k, plan.shared_bytes)?;
            }
            for k in [kernels[5], kernels[6]] {
                rt.set_shared_limit(k, epilogue)?;
            }
        }
        let wb: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let parts = Parts {
            kernels,
            words: rt.alloc_from(&wb)?,
            scales: rt.alloc_from(&bytes_f32(scales))?,
            su: rt.alloc_from(&bytes_f32(su))?,
            sv: rt.alloc_from(&bytes_f32(sv))?,
            x: rt.alloc(2 * cols)?,
            normw: rt.alloc(2 * cols)?,
            xh: rt.alloc(4 * cols)?,
            z: rt.alloc(4 * rows)?,
            y: rt.alloc(4 * rows)?,
            dec: rt.alloc(4 * rows * cols)?,
            counts: rt.alloc_from(&vec![0u8; 4 * (rows / plan.hb_rows)])?,
        };
        Ok(TrellisGpu { rt, plan, parts })
    }

    pub fn plan(&self) -> &TrellisPlan {
        &self.plan
    }

    fn download(&mut self, b: Buffer, n: usize) -> mlx_core::Result<Vec<f32>> {
        self.rt.synchronize()?;
        let mut out = vec![0u8; 4 * n];
        self.rt.download(b, 0, &mut out)?;
        Ok(floats(&out))
    }

    /// `trellis_decode`: the decoded matrix (`rows * cols`, row-major).
    pub fn decode(&mut self) -> mlx_core::Result<Vec<f32>> {
        let (p, q) = (&self.plan, self.parts);
        let (rows, cols) = (p.rows, p.cols);
        let grid = (rows * (cols / p.spec.block))
            .div_ceil(TRELLIS_THREADS as usize)
            .min(1 << 16) as u32;
        let args = [
            Arg::Buf(q.words, 0),
            Arg::Buf(q.scales, 0),
            Arg::Buf(q.dec, 0),
            Arg::I64(rows as i64),
            Arg::I64(cols as i64),
            Arg::I64(i64::from(p.spec.k)),
            Arg::I64(l_arg(&p.spec)),
            Arg::I64(p.spec.block as i64),
        ];
        let threads = [TRELLIS_THREADS, 1, 1];
        self.rt
            .launch(q.kernels[0], [grid, 1, 1], threads, 0, &args)?;
        self.download(q.dec, rows * cols)
    }

    /// `trellis_input`: `xh` from the bfloat16 input `x` (its bits), first normed with
    /// `norm` (the weights' bfloat16 bits, epsilon) where given.
    pub fn input(&mut self, x: &[u16], norm: Option<(&[u16], f64)>) -> mlx_core::Result<Vec<f32>> {
        self.upload_input("TrellisGpu::input", x, norm)?;
        let (p, q) = (&self.plan, self.parts);
        let cols = p.cols;
        let (gx, gy) = p.input_grid(1);
        let eps = norm.map(|n| n.1);
        let args = [
            Arg::Buf(q.x, 0),
            Arg::Buf(q.normw, 0),
            Arg::Buf(q.sv, 0),
            Arg::Buf(q.xh, 0),
            Arg::I64(cols as i64),
            Arg::I64(p.hb_cols as i64),
            Arg::F64(f64::from(p.hscale_cols)),
            Arg::I64(i64::from(eps.is_some())),
            Arg::F64(eps.unwrap_or(0.0)),
        ];
        let threads = [TRELLIS_THREADS, 1, 1];
        self.rt
            .launch(q.kernels[1], [gx, gy, 1], threads, 0, &args)?;
        self.download(q.xh, cols)
    }

    /// `trellis_matvec`: `z` from `xh`, `lanes` lanes a row (the plan's where `None`).
    pub fn matvec(&mut self, xh: &[f32], lanes: Option<u32>) -> mlx_core::Result<Vec<f32>> {
        if xh.len() != self.plan.cols {
            let msg = format!("{} inputs expected", self.plan.cols);
            return Err(invalid("TrellisGpu::matvec", msg));
        }
        self.rt.upload(self.parts.xh, 0, &bytes_f32(xh))?;
        let resident = self.resident()?;
        launch_matvec(&mut self.rt, &self.plan, &self.parts, lanes, resident)?;
        self.download(self.parts.z, self.plan.rows)
    }

    /// `trellis_matvec_in`: `z` from the bfloat16 input `x` (its bits), normed with `norm`
    /// where given, the input transform in the product's prologue (the plan's lanes a row).
    pub fn matvec_in(
        &mut self,
        x: &[u16],
        norm: Option<(&[u16], f64)>,
    ) -> mlx_core::Result<Vec<f32>> {
        self.upload_input("TrellisGpu::matvec_in", x, norm)?;
        let (cols, q) = (self.plan.cols, self.parts);
        let resident = self.resident()?;
        let p = &self.plan;
        let (gx, gy) = p.matvec_grid(1, resident);
        let eps = norm.map(|n| n.1);
        let args = [
            Arg::Buf(q.words, 0),
            Arg::Buf(q.scales, 0),
            Arg::Buf(q.x, 0),
            Arg::Buf(q.normw, 0),
            Arg::Buf(q.sv, 0),
            Arg::Buf(q.z, 0),
            Arg::I64(p.rows as i64),
            Arg::I64(cols as i64),
            Arg::I64(i64::from(p.spec.k)),
            Arg::I64(l_arg(&p.spec)),
            Arg::I64(p.spec.block as i64),
            Arg::I64(i64::from(p.lanes_per_row)),
            Arg::I64(p.hb_cols as i64),
            Arg::F64(f64::from(p.hscale_cols)),
            Arg::I64(i64::from(eps.is_some())),
            Arg::F64(eps.unwrap_or(0.0)),
        ];
        let threads = [TRELLIS_THREADS, 1, 1];
        let shared = p.shared_bytes;
        self.rt
            .launch(q.kernels[4], [gx, gy, 1], threads, shared, &args)?;
        self.download(q.z, p.rows)
    }

    /// `trellis_matvec_out` in float32 (`raw`: unrounded): `y` from `xh`, the output transform
    /// in the product's epilogue (the plan's lanes a row).
    pub fn matvec_out(&mut self, xh: &[f32], raw: bool) -> mlx_core::Result<Vec<f32>> {
        if xh.len() != self.plan.cols {
            let msg = format!("{} inputs expected", self.plan.cols);
            return Err(invalid("TrellisGpu::matvec_out", msg));
        }
        let q = self.parts;
        self.rt.upload(q.xh, 0, &bytes_f32(xh))?;
        let shared = self
            .plan
            .switches
            .epilogue_shared_bytes(self.plan.shared_bytes, self.plan.hb_rows);
        let resident = self
            .rt
            .resident_blocks(q.kernels[5], TRELLIS_THREADS, shared)?;
        let p = &self.plan;
        let (gx, gy) = p.matvec_grid(1, resident);
        let mode = OUT_F32 | if raw { OUT_RAW } else { 0 };
        let args = [
            Arg::Buf(q.words, 0),
            Arg::Buf(q.scales, 0),
            Arg::Buf(q.xh, 0),
            Arg::Buf(q.z, 0),
            Arg::Buf(q.counts, 0),
            Arg::Buf(q.su, 0),
            Arg::Buf(q.x, 0),
            Arg::Buf(q.x, 0),
            Arg::Buf(q.y, 0),
            Arg::I64(p.rows as i64),
            Arg::I64(p.cols as i64),
            Arg::I64(i64::from(p.spec.k)),
            Arg::I64(l_arg(&p.spec)),
            Arg::I64(p.spec.block as i64),
            Arg::I64(i64::from(p.lanes_per_row)),
            Arg::I64(p.hb_rows as i64),
            Arg::F64(f64::from(p.hscale_rows)),
            Arg::I64(mode),
        ];
        let threads = [TRELLIS_THREADS, 1, 1];
        self.rt
            .launch(q.kernels[5], [gx, gy, 1], threads, shared, &args)?;
        self.download(q.y, p.rows)
    }

    /// Checks and uploads a bfloat16 input `x` (its bits) and, where given, the norm's weights,
    /// for `trellis_input` and `trellis_matvec_in`.
    fn upload_input(
        &mut self,
        op: &'static str,
        x: &[u16],
        norm: Option<(&[u16], f64)>,
    ) -> mlx_core::Result<()> {
        let (cols, q) = (self.plan.cols, self.parts);
        if x.len() != cols || norm.is_some_and(|(w, _)| w.len() != cols) {
            return Err(invalid(
                op,
                format!("{cols} inputs and norm weights expected"),
            ));
        }
        let halves = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|h| h.to_le_bytes()).collect() };
        self.rt.upload(q.x, 0, &halves(x))?;
        if let Some((w, _)) = norm {
            self.rt.upload(q.normw, 0, &halves(w))?;
        }
        Ok(())
    }

    fn resident(&self) -> mlx_core::Result<u32> {
        let k = self.parts.kernels[2];
        self.rt
            .resident_blocks(k, TRELLIS_THREADS, self.plan.shared_bytes)
    }

    /// `trellis_output` in float32: `y` from `z` (`raw`: the transform's own values; else
    /// rounded to bfloat16 values).
    pub fn output(&mut self, z: &[f32], raw: bool) -> mlx_core::Result<Vec<f32>> {
        let (p, q) = (&self.plan, self.parts);
        if z.len() != p.rows {
            return Err(invalid(
                "TrellisGpu::output",
                format!("{} rows expected", p.rows),
            ));
        }
        self.rt.upload(q.z, 0, &bytes_f32(z))?;
        let (gx, gy) = p.output_grid(1);
        let mode = OUT_F32 | if raw { OUT_RAW } else { 0 };
        let args = [
            Arg::Buf(q.z, 0),
            Arg::Buf(q.su, 0),
            Arg::Buf(q.x, 0),
            Arg::Buf(q.x, 0),
            Arg::Buf(q.y, 0),
            Arg::I64(p.rows as i64),
            Arg::I64(p.hb_rows as i64),
            Arg::F64(f64::from(p.hscale_rows)),
            Arg::I64(mode),
        ];
        let threads = [TRELLIS_THREADS, 1, 1];
        self.rt
            .launch(q.kernels[3], [gx, gy, 1], threads, 0, &args)?;
        self.download(q.y, p.rows)
    }

    /// Seconds one `trellis_matvec` launch takes on the input last given: `reps` launches
    /// captured in one CUDA graph, replayed once to warm up, then once timed. Every launch
    /// reads the same matrix, so one that fits the L2 cache (an 8B layer's at 3 bits does) is
    /// read from there: this times the kernel's arithmetic ceiling, not DRAM streaming.
    pub fn time_matvec(&mut self, reps: u32, lanes: Option<u32>) -> mlx_core::Result<f64> {
        let resident = self.resident()?;
        let (plan, parts) = (self.plan.clone(), self.parts);
        let reps = reps.max(1);
        let g = self.rt.capture(|rt| {
            (0..reps).try_for_each(|_| launch_matvec(rt, &plan, &parts, lanes, resident))
        })?;
        self.rt.replay(g, 1)?;
        self.rt.synchronize()?;
        let t = std::time::Instant::now();
        self.rt.replay(g, 1)?;
        self.rt.synchronize()?;
        Ok(t.elapsed().as_secs_f64() / f64::from(reps))
    }

    /// Seconds one whole `trellis_linear` launch takes (the graph decoder's launch of a linear:
    /// the input's norm, signs and Hadamard blocks in every block's prologue, the product, the
    /// output transform by the block completing each Hadamard block of rows; float32 out) on
    /// the bfloat16 input last given to [`TrellisGpu::input`] or [`TrellisGpu::matvec_in`], timed
    /// as [`TrellisGpu::time_matvec`] times the product alone: set beside it, the difference
    /// is what the transforms and the completion add to a linear.
    pub fn time_linear(&mut self, reps: u32) -> mlx_core::Result<f64> {
        let (p, q) = (self.plan.clone(), self.parts);
        let k = q.kernels[6];
        let shared = p.switches.epilogue_shared_bytes(p.shared_bytes, p.hb_rows);
        let threads = p.switches.threads;
        let resident = self.rt.resident_blocks(k, threads, shared)?;
        let (gx, gy) = p.fused_grid(threads, 1, resident);
        let args = [
            Arg::Buf(q.words, 0),
            Arg::Buf(q.scales, 0),
            Arg::Buf(q.x, 0),
            Arg::Buf(q.normw, 0),
            Arg::Buf(q.sv, 0),
            Arg::Buf(q.z, 0),
            Arg::Buf(q.counts, 0),
            Arg::Buf(q.su, 0),
            Arg::Buf(q.su, 0),
            Arg::Buf(q.x, 0),
            Arg::Buf(q.y, 0),
            Arg::I64(p.rows as i64),
            Arg::I64(p.cols as i64),
            Arg::I64(i64::from(p.spec.k)),
            Arg::I64(l_arg(&p.spec)),
            Arg::I64(p.spec.block as i64),
            Arg::I64(i64::from(p.lanes_per_row)),
            Arg::I64(p.hb_cols as i64),
            Arg::F64(f64::from(p.hscale_cols)),
            Arg::I64(1),
            Arg::F64(1e-5),
            Arg::I64(p.hb_rows as i64),
            Arg::F64(f64::from(p.hscale_rows)),
            Arg::I64(OUT_F32),
        ];
        let threads = [threads, 1, 1];
        let reps = reps.max(1);
        let g = self.rt.capture(|rt| {
            (0..reps).try_for_each(|_| rt.launch(k, [gx, gy, 1], threads, shared, &args))
        })?;
        self.rt.replay(g, 1)?;
        self.rt.synchronize()?;
        let t = std::time::Instant::now();
        self.rt.replay(g, 1)?;
        self.rt.synchronize()?;
        Ok(t.elapsed().as_secs_f64() / f64::from(reps))
    }
}

/// Queues `trellis_matvec` (`xh` to `z`) with `lanes` lanes a row (the plan's where `None`),
/// at most `resident` blocks.
fn launch_matvec(
    rt: &mut GpuRuntime,
    p: &TrellisPlan,
    q: &Parts,
    lanes: Option<u32>,
    resident: u32,
) -> mlx_core::Result<()> {
    let lpr = lanes.unwrap_or(p.lanes_per_row);
    if !lpr.is_power_of_two() || lpr > 32 {
        let msg = format!("{lpr} lanes a row: a power of two up to 32");
        return Err(invalid("TrellisGpu::matvec", msg));
    }
    let mut p = p.clone();
    p.lanes_per_row = lpr;
    let (gx, gy) = p.matvec_grid(1, resident);
    let args = [
        Arg::Buf(q.words, 0),
        Arg::Buf(q.scales, 0),
        Arg::Buf(q.xh, 0),
        Arg::Buf(q.z, 0),
        Arg::I64(p.rows as i64),
        Arg::I64(p.cols as i64),
        Arg::I64(i64::from(p.spec.k)),
        Arg::I64(l_arg(&p.spec)),
        Arg::I64(p.spec.block as i64),
        Arg::I64(i64::from(lpr)),
    ];
    let threads = [TRELLIS_THREADS, 1, 1];
    rt.launch(q.kernels[2], [gx, gy, 1], threads, p.shared_bytes, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: TrellisSwitches = TrellisSwitches::PLAIN;

    fn spec(k: u32, l: u32, block: usize) -> TrellisSpec {
        TrellisSpec {
            k,
            l,
            block,
            code: TrellisCode::Mad,
        }
    }

    #[test]
    fn mad8h_plans_carry_the_code_and_the_table() {
        let m8h = |k, l, block| TrellisSpec {
            code: TrellisCode::Mad8H,
            ..spec(k, l, block)
        };
        assert_eq!(l_arg(&m8h(3, 12, 64)), 12 | 2 << CODE_SHIFT);
        // Its fast paths (L 12, blocks of 32 and 64) read 1mad8's table, before the input; the
        // general path (other L, blocks of 128) computes each code.
        for (s, fast) in [
            (m8h(3, 12, 64), true),
            (m8h(3, 12, 32), true),
            (m8h(2, 12, 64), true),
            (m8h(4, 12, 32), true),
            (m8h(3, 16, 64), false),
            (m8h(2, 9, 64), false),
            (m8h(3, 12, 128), false),
        ] {
            assert_eq!(is_fast(&s), fast, "{s:?}");
            assert_eq!(uses_lut(&s), fast, "{s:?}");
            let p = TrellisPlan::new(&s, 576, 1536, DEFAULT_SMS, &PLAIN).unwrap();
            let input = (1536 + pad(s.block) * 48) * 4;
            let want = if fast { 4 * LUT_FLOATS + input } else { input };
            assert_eq!(p.shared_bytes as usize, want, "{s:?}");
            assert_eq!(p.lanes_per_row, lanes_per_row(&s, 576, 1536, DEFAULT_SMS));
        }
        // The 8B's down (14,336 inputs) fits with the table.
        assert!(TrellisPlan::new(&m8h(3, 12, 64), 4096, 14336, DEFAULT_SMS, &PLAIN).is_ok());
        // The shape's own check still refuses L 8.
        assert!(matches!(
            TrellisPlan::new(&m8h(3, 8, 64), 64, 256, DEFAULT_SMS, &PLAIN),
            Err(TrellisPlanError::Shape(_))
        ));
    }

    #[test]
    fn sbox_plans_carry_the_code_and_the_tables() {
        // 1mad8s, gauss8s and gauss7s: the code above the state's bits; at L 12 in blocks of 32
        // or 64 the product reads the S-box and the code's table (gauss7s's 128 entries), before
        // the input; other shapes take the general path (each code computed).
        for (code, n, entries) in [
            (TrellisCode::Mad8S, 3, 256),
            (TrellisCode::Gauss8S, 4, 256),
            (TrellisCode::Gauss7S, 5, 128),
        ] {
            let s = |k, l, block| TrellisSpec {
                code,
                ..spec(k, l, block)
            };
            assert_eq!(l_arg(&s(3, 12, 64)), 12 | n << CODE_SHIFT);
            for (sp, fast) in [
                (s(3, 12, 64), true),
                (s(3, 12, 32), true),
                (s(2, 12, 64), true),
                (s(4, 12, 32), true),
                (s(3, 16, 64), false),
                (s(2, 9, 64), false),
                (s(3, 12, 128), false),
            ] {
                assert_eq!(is_fast(&sp), fast, "{sp:?}");
                assert_eq!(uses_lut(&sp), fast, "{sp:?}");
                let p = TrellisPlan::new(&sp, 576, 1536, DEFAULT_SMS, &PLAIN).unwrap();
                let input = (1536 + pad(sp.block) * 48) * 4;
                let tables = if fast { LUT_FLOATS + 32 * entries } else { 0 };
                assert_eq!(lut_floats_with(&sp, false), tables, "{sp:?}");
                // MLX_GRAPH_TRELLIS_STATES=1: one table of the 4,096 states' byte codes.
                let states = if fast { STATE_WORDS } else { 0 };
                assert_eq!(lut_floats_with(&sp, true), states, "{sp:?}");
                assert_eq!(PLAIN.lut_floats(&sp), tables, "{sp:?}");
                assert_eq!(p.shared_bytes as usize, 4 * tables + input, "{sp:?}");
                // A plan under the states' switch takes its table.
                let on = TrellisSwitches {
                    states: true,
                    ..PLAIN
                };
                assert_eq!(on.lut_floats(&sp), states, "{sp:?}");
                let ps = TrellisPlan::new(&sp, 576, 1536, DEFAULT_SMS, &on).unwrap();
                assert_eq!(ps.shared_bytes as usize, 4 * states + input, "{sp:?}");
            }
            // The 8B's down (14,336 inputs) fits with both tables, and with the states' table.
            assert!(TrellisPlan::new(&s(3, 12, 64), 4096, 14336, DEFAULT_SMS, &PLAIN).is_ok());
            let down = 4 * STATE_WORDS + (14336 + 14336 / 32) * 4;
            assert!(down <= TRELLIS_MAX_SHARED as usize, "{down}");
        }
    }

    /// The integers of a `static __device__ const` array of the source.
    fn source_array(name: &str) -> Vec<i64> {
        let start = TRELLIS_SOURCE
            .find(&format!(" {name}["))
            .unwrap_or_else(|| panic!("{name} is not in the source"));
        let body = &TRELLIS_SOURCE[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
        body.split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: {v}")))
            .collect()
    }

    #[test]
    fn the_sbox_codes_tables_are_the_cpus() {
        use mlx_core::cpu::trellis::{GAUSS7_TABLE, GAUSS8_TABLE, SBOX};
        let want = |v: &[i64]| v.to_vec();
        assert_eq!(source_array("TRELLIS_SBOX"), want(&SBOX.map(i64::from)));
        assert_eq!(
            source_array("TRELLIS_GAUSS8"),
            want(&GAUSS8_TABLE.map(i64::from))
        );
        assert_eq!(
            source_array("TRELLIS_GAUSS7"),
            want(&GAUSS7_TABLE.map(i64::from))
        );
        for (name, v) in [
            ("TRELLIS_GAUSS8_SCALE", mlx_core::cpu::trellis::GAUSS8_SCALE),
            ("TRELLIS_GAUSS7_SCALE", mlx_core::cpu::trellis::GAUSS7_SCALE),
        ] {
            assert!(
                TRELLIS_SOURCE.contains(&format!("#define {name} {:?}f", f64::from(v))),
                "{name}"
            );
        }
    }

    fn define(name: &str) -> i64 {
        let all = format!("{}{TRELLIS_SOURCE}", crate::graph_source::SOURCE);
        let line = all
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("#define {name}"));
        let v = line
            .split_whitespace()
            .nth(2)
            .unwrap()
            .trim_end_matches('u');
        v.parse().unwrap_or_else(|_| panic!("#define {name}: {v}"))
    }

    #[test]
    fn the_constants_are_the_sources() {
        assert_eq!(define("TRELLIS_THREADS"), i64::from(TRELLIS_THREADS));
        assert_eq!(define("TRELLIS_MAX_HB"), TRELLIS_MAX_HB as i64);
        assert_eq!(define("MODE_RES"), OUT_RES);
        assert_eq!(define("MODE_SWIGLU"), OUT_SWIGLU);
        assert_eq!(define("MODE_F32"), OUT_F32);
        assert_eq!(define("TRELLIS_RAW"), OUT_RAW);
        assert_eq!(define("TRELLIS_BIAS"), OUT_BIAS);
        assert_eq!(
            define("TRELLIS_MAD_A"),
            i64::from(mlx_core::cpu::trellis::MAD_A)
        );
        assert_eq!(
            define("TRELLIS_MAD_B"),
            i64::from(mlx_core::cpu::trellis::MAD_B)
        );
        assert!(TRELLIS_SOURCE.contains(&format!(
            "#define TRELLIS_MAD_SCALE {:?}f",
            f64::from(mlx_core::cpu::trellis::MAD_SCALE)
        )));
        assert!(TRELLIS_SOURCE.contains(&format!(
            "#define TRELLIS_MAD8_SCALE {:?}f",
            f64::from(mlx_core::cpu::trellis::MAD8_SCALE)
        )));
        assert_eq!(define("TRELLIS_CODE_SHIFT"), i64::from(CODE_SHIFT));
        assert_eq!(define("TRELLIS_LUT_FLOATS"), LUT_FLOATS as i64);
        assert_eq!(define("TRELLIS_STATE_WORDS"), STATE_WORDS as i64);
        assert_eq!(define("TRELLIS_ROUND"), i64::from(TRELLIS_ROUND));
        // The largest dynamic share leaves room for the static buffers in the 227 KiB a block.
        const { assert!(TRELLIS_MAX_SHARED + STATIC_SHARED <= 227 * 1024) };
        assert_eq!(hadamard_block(1 << 20), TRELLIS_MAX_HB);
    }

    #[test]
    fn every_kernel_is_declared_with_its_arity() {
        let source = TRELLIS_SOURCE;
        for (name, arity) in TRELLIS_KERNELS {
            assert!(
                !crate::graph_source::SOURCE.contains(&format!(" {name}(")),
                "{name} is only in its own source"
            );
            let start = source
                .match_indices(&format!(" {name}("))
                .map(|(i, _)| i)
                .find(|&i| {
                    source[..i]
                        .rsplit('\n')
                        .next()
                        .unwrap()
                        .contains("__global__ void")
                })
                .unwrap_or_else(|| panic!("{name} is not in the source"));
            let params = &source[start..][..source[start..].find(')').unwrap()];
            assert_eq!(params.matches(',').count() + 1, arity as usize, "{name}");
        }
    }

    #[test]
    fn lanes_fill_the_blocks_and_the_gpu() {
        let s = spec(3, 8, 32);
        // SmolLM2-135M: 576 inputs are 18 blocks, 1,536 are 48.
        assert_eq!(lanes_per_row(&s, 576, 576, DEFAULT_SMS), 32);
        assert_eq!(lanes_per_row(&s, 576, 1536, DEFAULT_SMS), 32);
        // Llama-3-8B's shapes: 128 and 448 blocks, whole rounds at 32 lanes.
        assert_eq!(lanes_per_row(&s, 4096, 4096, DEFAULT_SMS), 32);
        assert_eq!(lanes_per_row(&s, 4096, 14336, DEFAULT_SMS), 32);
        // Many rows of few blocks: fewer lanes a row waste fewer.
        assert_eq!(lanes_per_row(&s, 1 << 16, 96, DEFAULT_SMS), 1);
        assert_eq!(lanes_per_row(&s, 1 << 16, 576, DEFAULT_SMS), 2);
        // The general path strides over weights.
        assert_eq!(lanes_per_row(&spec(2, 16, 64), 16, 576, DEFAULT_SMS), 32);
        for rows in [1, 7, 192, 576, 4096] {
            for cols in [32, 96, 576, 1536] {
                let g = lanes_per_row(&s, rows, cols, DEFAULT_SMS);
                assert!(g.is_power_of_two() && g <= 32, "{rows} {cols}: {g}");
            }
        }
    }

    #[test]
    fn mad8_plans_carry_the_code_and_the_table() {
        let m8 = |k, l, block| TrellisSpec {
            code: TrellisCode::Mad8,
            ..spec(k, l, block)
        };
        // The code rides above the state's bits of the kernels' L argument.
        assert_eq!(l_arg(&spec(3, 8, 32)), 8);
        assert_eq!(l_arg(&m8(3, 8, 32)), 8 | 1 << CODE_SHIFT);
        // 1mad8's fast paths (L 8, blocks of 32 and 64) read the table, before the input; the
        // general path (L 6, blocks of 128) does not.
        for (s, fast) in [
            (m8(3, 8, 32), true),
            (m8(3, 8, 64), true),
            (m8(2, 6, 64), false),
            (m8(2, 8, 128), false),
        ] {
            assert_eq!(is_fast(&s), fast);
            assert_eq!(uses_lut(&s), fast);
            let p = TrellisPlan::new(&s, 576, 1536, DEFAULT_SMS, &PLAIN).unwrap();
            let input = (1536 + pad(s.block) * 48) * 4;
            let want = if fast { 4 * LUT_FLOATS + input } else { input };
            assert_eq!(p.shared_bytes as usize, want, "{s:?}");
        }
        // 1mad at L 8 in blocks of 64 keeps the general path.
        assert!(!is_fast(&spec(3, 8, 64)) && !uses_lut(&spec(3, 8, 32)));
        // The 8B's down (14,336 inputs) fits with the table.
        assert!(TrellisPlan::new(&m8(3, 8, 32), 4096, 14336, DEFAULT_SMS, &PLAIN).is_ok());
    }

    #[test]
    fn flat_qkv_grids_split_by_rows() {
        // Llama-3-8B's q (4096 rows) and k, v (1024 each) on 132 blocks: 22 each for k and v,
        // 88 for q (four times k's, as the rows); SmolLM2-135M's 576 and 192 rows: 26 and 80.
        assert_eq!(qkv_kv_blocks(132, 4096, 1024), 22);
        assert_eq!(qkv_kv_blocks(132, 576, 192), 26);
        // At least one block a slice, q's share never below one (kv's share is under a half).
        for total in 3..64 {
            for (q, kv) in [(4096, 1024), (64, 32), (32, 4096), (576, 192)] {
                let bk = qkv_kv_blocks(total, q, kv);
                assert!(bk >= 1 && total > 2 * bk, "{total} {q} {kv}");
            }
        }
    }

    #[test]
    fn plans_check_the_shape_before_the_gpu() {
        let p = TrellisPlan::new(&spec(3, 8, 32), 576, 1536, DEFAULT_SMS, &PLAIN).unwrap();
        assert_eq!((p.hb_rows, p.hb_cols), (64, 512));
        assert_eq!(p.hscale_cols, 1.0 / (512f32).sqrt());
        assert_eq!(p.shared_bytes as usize, (1536 + 2 * 48) * 4);
        assert_eq!(p.input_grid(1), (3, 1));
        assert_eq!(p.output_grid(2), (9, 2));
        assert_eq!(p.matvec_grid(1, 1000), (72, 1));
        assert_eq!(p.matvec_grid(1, 4), (4, 1));
        // A fused launch of 1024 threads takes 32 rows a block (32 lanes a row): 18 blocks.
        assert_eq!(p.fused_grid(1024, 1, 1000), (18, 1));
        assert_eq!(
            p.fused_grid(TRELLIS_THREADS, 1, 1000),
            p.matvec_grid(1, 1000)
        );
        assert_eq!(p.weight_bytes(), 576 * 1536 * 3 / 8 + 4 * 576);
        assert!(is_fast(&p.spec));
        assert!(is_fast(&spec(2, 12, 64)) && !is_fast(&spec(2, 16, 64)));
        for (s, rows, cols, what) in [
            (spec(3, 8, 32), 576, 100, "cannot be cut"),
            (spec(5, 8, 32), 576, 576, "bits must be"),
            (spec(3, 8, 32), 4, 1 << 16, "shared memory"),
            (spec(3, 8, 32), 1 << 31, 32, "31-bit"),
        ] {
            let e = TrellisPlan::new(&s, rows, cols, DEFAULT_SMS, &PLAIN)
                .unwrap_err()
                .to_string();
            assert!(e.contains(what), "{e}");
        }
    }

    /// The hybrid's source (`TRELLIS_V_L` = v's [`l_arg`], read only by `trellis_qkv`), and a
    /// one-spec model's: the source unchanged, so the same kernels as before.
    #[test]
    fn value_projections_code_is_a_define_only_where_it_differs() {
        let g7 = TrellisSpec {
            code: TrellisCode::Gauss7S,
            ..spec(3, 12, 64)
        };
        let mad = spec(3, 12, 64);
        // PLAIN's source is the kernels' own; the hybrid's adds its one line first, whatever
        // the switches.
        assert_eq!(PLAIN.source(None), TRELLIS_SOURCE);
        for sw in [PLAIN, TrellisSwitches::WIDE] {
            assert_eq!(
                sw.source(Some(&mad)),
                format!("#define TRELLIS_V_L 12\n{}", sw.source(None))
            );
        }
        // The define is read in trellis_qkv alone, before anything uses L.
        let uses: Vec<usize> = TRELLIS_SOURCE
            .match_indices("TRELLIS_V_L")
            .map(|(i, _)| i)
            .collect();
        let qkv = TRELLIS_SOURCE
            .find(
                "__global__ void __launch_bounds__(TRELLIS_FUSED_THREADS, \
                 TRELLIS_FUSED_MIN_BLOCKS) trellis_qkv(",
            )
            .unwrap();
        let body = qkv + TRELLIS_SOURCE[qkv..].find(") {").unwrap();
        let code = uses.iter().filter(|&&i| i > body).collect::<Vec<_>>();
        assert_eq!(code.len(), 2, "#ifdef and the assignment");
        // v's slice (zsl, from the grid) takes its L before the first use of L.
        let set = "#ifdef TRELLIS_V_L\n  if (zsl == 2) L = TRELLIS_V_L;\n#endif\n";
        let at = body + TRELLIS_SOURCE[body..].find(set).unwrap();
        let first_use = body + TRELLIS_SOURCE[body..].find("(L, block)").unwrap();
        assert!(at < first_use);
        assert!(!TRELLIS_SOURCE[body..at].contains(" L"));
        // Which value projections' specs trellis_qkv pairs with gauss7s's q and k.
        assert_eq!(v_spec_problem(&g7, &mad), None);
        for (code, ok) in [
            (TrellisCode::Mad8H, true),
            (TrellisCode::Gauss8S, true),
            (TrellisCode::Mad8, false),
        ] {
            let v = TrellisSpec { code, ..g7 };
            assert_eq!(v_spec_problem(&g7, &v).is_none(), ok, "{}", code.name());
        }
        assert!(v_spec_problem(&g7, &spec(2, 12, 64))
            .unwrap()
            .contains("2 bits, q/k's 3"));
        assert!(v_spec_problem(&g7, &spec(3, 12, 32))
            .unwrap()
            .contains("blocks of 32"));
        assert!(v_spec_problem(&g7, &spec(3, 10, 64))
            .unwrap()
            .contains("general path"));
        // The plans' shared memory: gauss7s's tables take more than 1mad's none, with the
        // same input, so the launch takes gauss7s's.
        let (pq, pv) = (
            TrellisPlan::new(&g7, 64, 512, DEFAULT_SMS, &PLAIN).unwrap(),
            TrellisPlan::new(&mad, 64, 512, DEFAULT_SMS, &PLAIN).unwrap(),
        );
        assert_eq!(
            pq.shared_bytes - pv.shared_bytes,
            4 * PLAIN.lut_floats(&g7) as u32
        );
        assert!(PLAIN.lut_floats(&g7) >= LUT_FLOATS + 128 * 32);
        assert_eq!(pq.lanes_per_row, pv.lanes_per_row);
    }

    /// Each variable's value as `overridden` reads it (a map instead of the environment).
    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (format!("MLX_GRAPH_TRELLIS_{k}"), v.to_string()))
            .collect();
        move |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn switches_are_chosen_by_the_hidden_width() {
        let wide = TrellisSwitches::WIDE;
        // SmolLM2-135M (576), Gemma 3 270M (640), Llama-3.2-1B and 3B (2,048, 3,072), Qwen2.5-7B
        // (3,584): the kernels' own defaults; from Llama-3.1-8B's 4,096: 1,024 threads, ALIAS
        // and PIPE.
        for h in [64, 576, 640, 1536, 2048, 3072, 3584, 4095] {
            assert_eq!(TrellisSwitches::by_shape(h), PLAIN, "{h}");
        }
        for h in [WIDE_HIDDEN, 4096, 5120, 8192] {
            assert_eq!(TrellisSwitches::by_shape(h), wide, "{h}");
        }
        assert_eq!(
            (wide.threads, wide.alias, wide.pipe, wide.split),
            (1024, true, true, false)
        );
        // STATES and PAIR are off for every shape (not run on a device yet); the prefetches
        // on, ROWS2 off.
        for sw in [PLAIN, wide] {
            assert!(!sw.states && !sw.pair && sw.prefetch && !sw.rows2);
        }
        // The flat qkv grid comes with wider blocks, or SPLIT.
        assert!(!PLAIN.qkv_flat() && wide.qkv_flat());
        let split = TrellisSwitches {
            split: true,
            ..PLAIN
        };
        assert!(split.qkv_flat());
        // Unset: the shape's choice.
        for h in [576, 4096] {
            let by = TrellisSwitches::by_shape(h);
            assert_eq!(by.overridden(vars(&[])), by);
        }
    }

    #[test]
    fn variables_override_the_shapes_choice() {
        let (small, large) = (
            TrellisSwitches::by_shape(576),
            TrellisSwitches::by_shape(4096),
        );
        // =1 forces on, =0 off, whatever the shape.
        let on = [("THREADS", "1024"), ("ALIAS", "1"), ("PIPE", "1")];
        let off = [("THREADS", "256"), ("ALIAS", "0"), ("PIPE", "0")];
        assert_eq!(small.overridden(vars(&on)), TrellisSwitches::WIDE);
        assert_eq!(large.overridden(vars(&off)), PLAIN);
        assert_eq!(large.overridden(vars(&on)), TrellisSwitches::WIDE);
        assert_eq!(small.overridden(vars(&off)), PLAIN);
        // One variable moves its switch alone.
        let no_alias = large.overridden(vars(&[("ALIAS", "0")]));
        assert_eq!(
            no_alias,
            TrellisSwitches {
                alias: false,
                ..TrellisSwitches::WIDE
            }
        );
        assert_eq!(large.overridden(vars(&[("THREADS", "512")])).threads, 512);
        for (key, pick) in [
            (
                "STATES",
                (|s: &TrellisSwitches| s.states) as fn(&TrellisSwitches) -> bool,
            ),
            ("PAIR", |s| s.pair),
            ("SPLIT", |s| s.split),
            ("ROWS2", |s| s.rows2),
        ] {
            for base in [small, large] {
                assert!(pick(&base.overridden(vars(&[(key, "1")]))), "{key}");
                assert!(!pick(&base.overridden(vars(&[(key, "0")]))), "{key}");
            }
        }
        assert!(!large.overridden(vars(&[("PREFETCH", "0")])).prefetch);
        // Any other value is ignored (the decoder's other switches' convention): the shape's
        // choice stays.
        for bad in ["", "2", "on", "true", "yes", " 1", "1024"] {
            for base in [small, large] {
                let got = base.overridden(vars(&[
                    ("ALIAS", bad),
                    ("PIPE", bad),
                    ("STATES", bad),
                    ("PAIR", bad),
                    ("SPLIT", bad),
                    ("PREFETCH", bad),
                    ("ROWS2", bad),
                ]));
                assert_eq!(got, base, "{bad:?}");
            }
        }
        for bad in ["", "0", "1", "128", "2048", "768", "big"] {
            for base in [small, large] {
                assert_eq!(base.overridden(vars(&[("THREADS", bad)])), base, "{bad:?}");
            }
        }
    }

    /// The source, shared memory and launches of one choice read the same fields: the shape's
    /// choice at 4,096 is the same source as the old global switches forced at 576, and
    /// PLAIN's is the kernels' own.
    #[test]
    fn a_choice_gives_one_source_and_its_shared_memory() {
        let wide = TrellisSwitches::WIDE;
        let forced = TrellisSwitches::by_shape(576).overridden(vars(&[
            ("THREADS", "1024"),
            ("ALIAS", "1"),
            ("PIPE", "1"),
        ]));
        assert_eq!(
            forced.source(None),
            TrellisSwitches::by_shape(4096).source(None)
        );
        assert_eq!(
            wide.defines(),
            "#define TRELLIS_ALIAS 1\n#define TRELLIS_PIPE 1\n#define TRELLIS_FUSED_THREADS \
             1024\n#define TRELLIS_QKV_FLAT 1\n"
        );
        assert_eq!(PLAIN.defines(), "");
        // Every switch on: the defines in the order the kernels have always taken them.
        let all = TrellisSwitches {
            threads: 512,
            alias: true,
            pipe: true,
            split: true,
            states: true,
            pair: true,
            prefetch: false,
            rows2: true,
        };
        let order = [
            "TRELLIS_PREFETCH 0",
            "TRELLIS_ROWS2 1",
            "TRELLIS_ALIAS 1",
            "TRELLIS_PIPE 1",
            "TRELLIS_FUSED_THREADS 512",
            "TRELLIS_QKV_FLAT 1",
            "TRELLIS_STATES 1",
            "TRELLIS_PAIR 1",
        ];
        let want: String = order.iter().map(|d| format!("#define {d}\n")).collect();
        assert_eq!(all.defines(), want);
        // ALIAS: the epilogue's buffer in the dynamic memory, at least the widest output block.
        assert_eq!(wide.epilogue_shared_bytes(1000, 4096), 4 * 4096);
        assert_eq!(wide.epilogue_shared_bytes(20000, 64), 20000);
        assert_eq!(PLAIN.epilogue_shared_bytes(1000, 4096), 1000);
        // A plan carries its switches; STATES sizes its tables.
        let g7 = TrellisSpec {
            code: TrellisCode::Gauss7S,
            ..spec(3, 12, 64)
        };
        let p = TrellisPlan::new(&g7, 4096, 14336, DEFAULT_SMS, &wide).unwrap();
        assert_eq!(p.switches, wide);
        let st = TrellisSwitches {
            states: true,
            ..wide
        };
        let ps = TrellisPlan::new(&g7, 4096, 14336, DEFAULT_SMS, &st).unwrap();
        assert_eq!(
            ps.shared_bytes - p.shared_bytes,
            4 * (STATE_WORDS - LUT_FLOATS - 128 * 32) as u32
        );
    }
}
