//! The graph decoder: a llama decode step as a CUDA graph of our own kernels, captured once and
//! replayed for every token ([`GraphDecoder`]).
//!
//! Why: MLX 0.32.4's CUDA back-end spends microseconds of host time scheduling each
//! primitive, and a decode step of a llama is around a thousand primitives, so MLX's decode
//! speed is bound by the host whatever the GPU could do (`results/gpu/README.md`). Here one step is
//! 5 kernels a layer (`graph_decode.cu`): RMSNorm fused into the projections that follow it;
//! q/k/v as one product whose epilogue applies RoPE and writes the cache (the kernel takes q's
//! and k's rows in an order where a warp's two rows are a rotation pair); attention split over
//! the sequence, combined by the last block of each head; the output projection with the
//! residual add; gate/up as one product, their rows taken alternately, with SiLU-multiply in its
//! epilogue; the down projection
//! with the residual add. With per-head q/k norms (qwen3) the q/k/v matrix writes its rows
//! unrotated and one more kernel a layer (`graph_qk_norm.cu`, compiled only for such a model)
//! norms each head and rotates it in place (OLMo 2's over the whole q and k projections: one
//! block a projection, `qk_norm_full_rope`). Then the final norm with the LM head, and a
//! greedy argmax over the log-probabilities (as mlx-lm's sampler; two kernels over blocks of
//! 2,048 logits, the log-sum-exp combined by the last block) that advances the step state on
//! the device. The whole step is one CUDA graph ([`mlx_core::gpurt`]); the host replays it and
//! reads tokens back, pipelined.
//!
//! What it covers: the knobs of [`GraphSpec`] (llama-like rows, Qwen 3's and OLMo 2's q/k
//! norms, Gemma's sandwich norms and OLMo 2's post norms alone, GeGLU, embedding scale,
//! sliding layers and soft-caps; granite's residual multiplier and logits scaling; mixtures
//! of experts, [`GraphMoe`]: qwen3_moe's and mixtral's routers, the chosen experts' products
//! read in place from the stacked weights (`graph_moe.cu`), one sequence a step). Every weight
//! is read as the model holds it, in MLX's own device buffers (no second copy: issue #30's
//! peak memory; [`GraphDecoder::borrowed_bytes`]), where MLX runs on the GPU and the array is
//! evaluated, row-contiguous and aligned; else copied;
//! bfloat16 weights, or MLX affine quantization (4 or 8 bits, groups of 32, 64 or 128) with
//! bfloat16 scales, or trellis-coded layer linears ([`GraphSpec::trellis`], the value
//! projections' own code where they have one, [`GraphSpec::trellis_v`]: one sequence,
//! dense pre-norm SwiGLU layers; `graph_trellis.cu`'s `trellis_qkv`, `trellis_gate_up` and
//! `trellis_linear`, 5 launches a layer with attention; an untied head coded with them, the
//! embedding affine); head size 16-128; greedy decoding; one sequence. The prompt is processed
//! by MLX (the model's own forward, which is exact) and its KV cache copied in with
//! [`GraphDecoder::set_prefix`] (device to device where MLX runs on the GPU); or fed through
//! the decoder with [`GraphDecoder::feed`].
//!
//! # Tier
//!
//! L3 against the model's MLX forward (the plain-ops reference, itself L1 with mlx-lm on the
//! CPU): the kernels round to bfloat16 where MLX rounds (after every op) but sum in their own
//! order, so logits differ by bfloat16 ulps. On MLX's CUDA back-end there is no exact oracle
//! anyway (MLX is not deterministic run to run there past a few hundred cached tokens). The
//! `cuda` test set checks teacher-forced logits against the MLX forward with the bounds in
//! [`TEACHER_FORCED_BOUNDS`]. The exact path stays the default everywhere: this decoder is
//! only used when asked for (`bench_generate --decoder graph`).
//!
//! # Robustness
//!
//! Everything in the model directory is checked before the GPU is touched: the config's
//! fields, every tensor's name, dtype and shape (missing, mis-shaped and unused tensors are
//! listed together), token ids against the vocabulary, the cache's capacity. A failed CUDA
//! call poisons the decoder (every later call returns the first error); the caller's MLX
//! caches are never touched (the prefix is copied).
//!
//! # Measuring
//!
//! [`GraphDecoder::kernel_breakdown`] times each part of the step replayed alone;
//! [`GraphDecoder::trace_step`] records one step's timeline, block by block
//! (`xtask/gpu/trace_summary.py` summarises it). Neither changes a result.

use std::collections::VecDeque;

use mlx_core::cap_listing;
use mlx_core::cpu::trellis::TrellisSpec;
use mlx_core::gpurt::{Arg, Buffer, GpuRuntime, Graph, Kernel, Module};

use crate::graph_profile::StepProfile;
use crate::graph_trellis::{
    l_arg, TrellisPlan, TrellisSwitches, DEFAULT_SMS, OUT_BIAS, OUT_F32, OUT_RES, TRELLIS_KERNELS,
};
use mlx_core::{ops, Array, Dtype, Error, Result};

pub use crate::graph_source::SOURCE;

/// Qwen 3's per-head q/k norms (`qk_norm_rope`) and OLMo 2's over the whole projections
/// (`qk_norm_full_rope`), appended to [`SOURCE`] only for a model with them
/// ([`GraphSpec::qk_norm`]), so the other rows compile what they always did.
pub const QK_NORM_SOURCE: &str = include_str!("graph_qk_norm.cu");
const QK_NORM_KERNEL: (&str, u32) = ("qk_norm_rope", 12);
/// OLMo 2's q/k norms over the whole projections ([`GraphSpec::qk_norm_full`]), in the same
/// source.
const QK_NORM_FULL_KERNEL: (&str, u32) = ("qk_norm_full_rope", 13);

/// Gemma's sandwich norms (`norm_add`), appended to [`SOURCE`] only for a model with them
/// ([`GraphSpec::sandwich`]).
pub const GEMMA_SOURCE: &str = include_str!("graph_gemma.cu");
const GEMMA_KERNEL: (&str, u32) = ("norm_add", 5);

/// Mixture-of-experts layers (`moe_route`, `matvec_experts`, `moe_combine`), appended to
/// [`SOURCE`] only for a model with them ([`GraphSpec::moe`]).
pub const MOE_SOURCE: &str = include_str!("graph_moe.cu");
const MOE_KERNELS: [(&str, u32); 3] =
    [("moe_route", 8), ("matvec_experts", 21), ("moe_combine", 5)];
/// The most experts a router chooses from (`MOE_MAX_EXPERTS` in the source) and the most it
/// chooses (one warp's lanes).
pub const MOE_MAX_EXPERTS: usize = 1024;
pub const MOE_MAX_TOP_K: usize = 32;

const KERNELS: &[(&str, u32)] = &[
    ("embed", 19),
    ("matvec", 18),
    ("matvec_qkv", 29),
    ("attention", 18),
    ("matvec_attn_out", 17),
    ("argmax_partial", 5),
    ("argmax_pick", 8),
];
/// `matvec` for the normed products of tensor-core tiles at level 2 of [`mma_late_norm`]
/// (`matvec_norm`: `matvec`'s arguments), in the step source's kernels only there
/// ([`matvec_norm_in`]).
const MATVEC_NORM_KERNEL: (&str, u32) = ("matvec_norm", 18);
const MODE_NORM: i64 = 1;
const MODE_RES: i64 = 2;
const MODE_SWIGLU: i64 = 4;
const MODE_F32: i64 = 8;
const MODE_GELU: i64 = 16;
/// matvec_experts' gpt_oss SwiGLU (`graph_moe.cu`, `MOE_OAI`).
const MODE_OAI: i64 = 32;
/// matvec's biased output (`MV_OUT_BIAS`): the bias in B1's slot ([`Lin::out_bias`]).
const MODE_BIAS: i64 = 64;
/// The kernels' `bits` for MLX's mxfp4 weights (`BITS_MXFP4` in `graph_decode.cu`: 4-bit e2m1
/// codes, a uint8 e8m0 scale a group of 32, no biases); [`GraphMoe::mxfp4`]'s experts.
pub const BITS_MXFP4: usize = 0x104;

/// The width in bits the inputs of a product of `bits` are laid out for (mxfp4 codes multiply
/// them unscaled, as bfloat16 weights do).
fn layout_bits(bits: usize) -> usize {
    if bits == BITS_MXFP4 {
        16
    } else {
        bits
    }
}
const ATTN_CHUNK: usize = 64;
/// Attention widths (heads x head_dim) up to which, with one sequence a step, the output
/// projection combines the attention's partial outputs in its prologue (`matvec_attn_out`)
/// instead of the attention's last block a head (one serial round trip through L2 less a
/// layer; the same bits). Each of its blocks then reads every head's partials: at 8B widths
/// (4,096) that would be ~40 MB of L2 reads a layer, so large models keep the last-block
/// combine. Opt-in (`MLX_GRAPH_ATTN_COMBINE=output`; bit-equal on the emulator,
/// results/gpu/2026-12-05-s32-small; slower on an H100 at 135M, results/gpu/2026-12-06-s39-h100).
const ATTN_OUT_MAX_WIDTH: usize = 1_024;
/// Chunks of partial outputs `matvec_attn_out`'s blocks stage at once (`ATTN_OUT_CHUNKS`).
const ATTN_OUT_CHUNKS: usize = 12;
/// The greedy sampler's blocks: threads, and logits a block (`ARGMAX_THREADS`,
/// `ARGMAX_SLICE` in the source).
const ARGMAX_THREADS: u32 = 256;
const ARGMAX_SLICE: usize = 2048;
const MV_THREADS: u32 = 256;
/// Warps a block of the matrix-vector kernels (`MV_WARPS` in the source).
const MV_WARPS: usize = MV_THREADS as usize / 32;

/// Bounds the `cuda` test set holds the decoder to, against the model's MLX forward on the
/// same GPU, teacher-forced over a prompt and a continuation: the largest logit difference
/// relative to the largest logit magnitude, and the share of steps whose greedy token equals
/// the MLX forward's. Random bench models have many near-ties among bfloat16 logits.
pub const TEACHER_FORCED_BOUNDS: (f32, f32) = (0.05, 0.9);

/// A model with experts, a teacher-forced step over [`TEACHER_FORCED_BOUNDS`]: a routing near
/// tie, not a wrong kernel, when either
/// - the decoder's router chose within this of a tie in some layer ([`router_margin`] of
///   [`GraphDecoder::router_logits`]: bfloat16 rounding alone can pick other experts than the
///   MLX forward's there), or
/// - the decoder is within the bound of the model's float32 forward on the CPU and the MLX
///   forward is not (the MLX forward picked other experts).
///
/// The `cuda` test lists such steps apart, at most [`ROUTER_NEAR_TIES`] of a row's 24 (the
/// measurements: results/gpu/2026-12-06-s37-gptoss).
pub const ROUTER_NEAR_TIE: f32 = 0.03;
/// At most this many of a row's teacher-forced steps may be routing near ties.
pub const ROUTER_NEAR_TIES: usize = 3;

/// A router's top-k margin, relative: the k-th largest logit less the (k+1)-th, over the
/// largest logit magnitude (1 for fewer than k + 1 logits).
pub fn router_margin(logits: &[f32], k: usize) -> f32 {
    if k == 0 || logits.len() <= k {
        return 1.0;
    }
    let mut g = logits.to_vec();
    g.sort_by(|a, b| b.total_cmp(a));
    let scale = g.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    (g[k - 1] - g[k]) / scale
}

/// How [`GraphDecoder::load_with`] builds the step. The settings change speed, not results
/// (each lane sums its chunks in the same order whatever they are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphOptions {
    /// Launch the step's kernels with programmatic dependent launch: each kernel's blocks
    /// start, and load their first weights, while the kernel before it finishes (default
    /// true; off where the driver cannot).
    pub programmatic_launch: bool,
    /// Rows of a weight matrix one warp computes at once, sharing each input load: 2
    /// (default) or 4 (slower for whole one-row steps, though faster for some matrices alone:
    /// `results/gpu/README.md`; faster for tiles of several rows: speculation's verify target
    /// runs 4 by default, `results/gpu/2026-12-06-s40-h100/`).
    pub rows_per_warp: u32,
    /// 16-byte chunks of each of its rows a lane keeps in flight: 1 to 8, with at most 16
    /// loads a lane (`rows_per_warp` times this). Default `8 / rows_per_warp`.
    pub chunks_in_flight: Option<u32>,
    /// Of those, how many a lane loads before waiting for the previous kernel (1 to
    /// `chunks_in_flight`; default all); the rest follow the prologue. Loads queued ahead of
    /// the prologue's input reads delay them.
    pub chunks_before_wait: Option<u32>,
    /// At most this many blocks of a matrix-vector kernel on a multiprocessor (1 or more;
    /// default: as many as fit). Fewer leave room for the next kernel's blocks to start
    /// early and load their first weights.
    pub blocks_per_sm: Option<u32>,
    /// Sequences a step decodes (batched decode, 1 to [`MAX_SEQUENCES`]; default 1): each
    /// its own row with its own position and cache slot ([`GraphDecoder::step_rows_greedy`]).
    /// The matrix-vector kernels read each weight once for a tile of up to
    /// [`TILE_SEQUENCES`] rows (fewer where the inputs fill the shared memory:
    /// [`GraphDecoder::max_sequences`]); more rows take several tiles a kernel, and may be
    /// rounded up to whole tiles ([`GraphDecoder::sequences`]). The single-sequence calls use
    /// row 0.
    pub sequences: u32,
    /// At most this many sequences a tile (default: as many as fit, up to
    /// [`TILE_SEQUENCES`]); for testing the tiles.
    pub tile_sequences: Option<u32>,
    /// Tiles of at least this many sequences multiply 4-bit weights in groups of 64 on the
    /// tensor cores (mma.sync m16n8k16, `mv_run_mma` in the source; `None`, the default:
    /// never, until the tiles have run on a device (they were checked on the emulator only,
    /// results/gpu/2026-12-04-s25-run11); [`MMA_MIN_SEQUENCES`] is the threshold to try). Their sums run in another order than the
    /// single-row kernels': a row of such a tile is within [`TEACHER_FORCED_BOUNDS`] of the
    /// sequence decoded alone (tier L3), not bit-equal as in smaller tiles.
    pub tensor_cores_from: Option<u32>,
    /// One cache slot for all the rows (default false: one a row): the decoder then verifies
    /// (speculation's [`GraphDecoder::verify_greedy`], whose rows share row 0's slot) and
    /// decodes row 0 alone, and refuses batched decode's other rows
    /// ([`GraphDecoder::set_row_prefix`], [`GraphDecoder::step_rows_greedy`]). Saves the
    /// other rows' caches (K x the cache of one sequence for a target verifying K drafts).
    pub one_cache_slot: bool,
    /// The matrix-vector kernels' `__launch_bounds__` minimum of blocks a multiprocessor
    /// (`MV_MIN_BLOCKS`: the compiler keeps a thread's registers within 65,536 / (256 x
    /// this)), 1 to 4; default (`None`): 2 with one sequence a tile or with tensor-core tiles
    /// of a 4-bit model in groups of 64, 1 with several sequences on the FFMA kernels. For A/B
    /// runs of the verify rows' occupancy; the rows' bits do not depend on it.
    pub min_blocks_per_sm: Option<u32>,
    /// Whether the output projection combines the attention's partial outputs in its
    /// prologue (`matvec_attn_out`) instead of the attention's last block a head: the same
    /// bits, one serial round trip through L2 less a layer. `None` (the default): with
    /// `MLX_GRAPH_ATTN_COMBINE=output`, where [`attn_combine_in_output`] allows it (one
    /// sequence a step, small attention widths), else never (opt-in: slower on an H100 at
    /// 135M); `Some(false)`: never; `Some(true)`: wherever one sequence a step allows it
    /// (for testing).
    pub attn_combine_in_output: Option<bool>,
    /// A batched step launches kernels sized to the rows it has (default true): a step whose
    /// rows lie in a window of m rows (lowest to highest) runs, from the window's first row,
    /// the fewest tiles that hold m rows (as many as [`GraphOptions::sequences`] takes), each
    /// of the fewest rows that spread m over them
    /// (kernels compiled for that many rows, one NVRTC module a width, on first use or by
    /// [`GraphDecoder::prepare_rows`]; [`GraphDecoder::tile_for`] names the choice). A lone
    /// row thus runs the one-row kernels. false: every step runs the tiles of
    /// `tile_sequences` rows up to the last one holding a row that steps. The single-sequence
    /// calls (row 0) take the one-row kernels too. Rows of FFMA tiles are bit-equal to the
    /// sequence decoded alone whatever the width; a width of at least `tensor_cores_from`
    /// rows runs the tensor-core tiles (L3). Speculation's verify groups and a decoder of
    /// one cache slot keep the full tiles.
    pub fit_rows: bool,
    /// Wide tensor-core tiles (default true): where tiles of 4-bit weights in groups of 64
    /// run on the tensor cores ([`GraphOptions::tensor_cores_from`]), a tile takes up to
    /// [`MMA_TILE_SEQUENCES`] rows (one pass over the weights for 16 serve rows instead of 3
    /// tiles of 6 at 8B; the inputs past the shared memory staged in chunks of K), and with
    /// [`GraphOptions::fit_rows`] a step's tensor-core tile is its rows rounded up to a
    /// multiple of 8 (mma.sync's 8 columns: 8 rows cost what 4 do), so a 16-row decoder
    /// runs widths 1, 2, 3, 8 and 16 only. Every row of a wide tile is bit-equal to the same
    /// row of a narrower tensor-core tile (each column of mma.sync is its own sum). false:
    /// session 33's tiles (at most [`TILE_SEQUENCES`] rows, as many as fit), for A/B runs
    /// (`MLX_GRAPH_WIDE_TILES=0` in the batch engine).
    pub wide_tiles: bool,
    /// One-row steps as one persistent kernel ([`GraphDecoder::persistent_step`]): `None`
    /// (the default): with `MLX_GRAPH_PERSIST=1` or `2`, else never; `Some(on)`: as given (for
    /// testing). Where the step does not qualify, the kernels run either way. The same bits.
    pub persistent_step: Option<bool>,
}

/// The most sequences a [`GraphDecoder`] decodes a step.
pub const MAX_SEQUENCES: u32 = 64;
/// The most sequences one launch of a matrix-vector kernel takes (`NB` in the source; past it
/// the sums no longer fit the registers).
pub const TILE_SEQUENCES: u32 = 8;
/// The most sequences one launch of a tensor-core tile takes ([`GraphOptions::wide_tiles`]:
/// two of mma.sync's 8-column tiles over the same decoded codes).
pub const MMA_TILE_SEQUENCES: u32 = 16;
/// The smallest tile worth running on the tensor cores
/// ([`GraphOptions::tensor_cores_from`], off unless set): from about 4 rows the FFMA kernels are compute bound
/// (results/gpu/2026-12-04-s23-run9).
pub const MMA_MIN_SEQUENCES: u32 = 4;

/// The kernels a step of a decoder's first rows runs ([`GraphDecoder::tile_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileSet {
    /// Rows a launch of a matrix-vector kernel takes (`NB` of the kernels compiled for it).
    pub rows_per_tile: usize,
    /// Launches a kernel (tiles); `rows_per_tile x tiles` rows run, those past the ones that
    /// step idle.
    pub tiles: usize,
    /// Whether the tiles multiply the 4-bit weights in groups of 64 on the tensor cores (a
    /// row's logits then within [`TEACHER_FORCED_BOUNDS`] of the sequence decoded alone, L3;
    /// otherwise bit-equal to it).
    pub tensor_cores: bool,
}

impl Default for GraphOptions {
    fn default() -> Self {
        GraphOptions {
            programmatic_launch: true,
            rows_per_warp: 2,
            chunks_in_flight: None,
            chunks_before_wait: None,
            blocks_per_sm: None,
            sequences: 1,
            tile_sequences: None,
            tensor_cores_from: None,
            one_cache_slot: false,
            min_blocks_per_sm: None,
            attn_combine_in_output: None,
            fit_rows: true,
            wide_tiles: true,
            persistent_step: None,
        }
    }
}

/// One block's record in a step's timeline ([`GraphDecoder::trace_step`]); times are the
/// GPU's global timer in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// 1: q/k/v, 2: attention, 3: another matrix-vector product; then the mode (bits 8-15;
    /// for attention 1 marks a head's combining block) and the input width (bits 16-).
    pub what: u64,
    pub block: (u32, u32),
    pub sm: u32,
    /// Entry, after waiting for the previous kernel, after the prologue, end.
    pub times: [u64; 4],
    /// Matrix-vector kernels: when thread 0's first weights (loaded before the wait) were
    /// there, waited for after the prologue; 0 for attention.
    pub first_data: u64,
}

/// A timeline as text, a line a block: `what block_x block_y sm entry waited prologue end
/// first_data` (what `MLX_GRAPH_TRACE` writes and `xtask/gpu/trace_summary.py` reads).
pub fn trace_lines(records: &[TraceRecord]) -> String {
    let mut text = String::new();
    for r in records {
        let [t0, t1, t2, t3] = r.times;
        text += &format!(
            "{} {} {} {} {t0} {t1} {t2} {t3} {}\n",
            r.what, r.block.0, r.block.1, r.sm, r.first_data
        );
    }
    text
}

/// Room for records in a timeline (64 MiB of device memory, allocated on the first
/// [`GraphDecoder::trace_step`]).
const TRACE_RECORDS: usize = 1 << 20;

/// One teacher-forced step compared: the largest logit difference relative to the largest
/// reference logit magnitude, and both sides' greedy tokens (first index of the maximum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepComparison {
    /// max |reference - ours| / max |reference|.
    pub rel_diff: f32,
    /// The reference's greedy token.
    pub reference_token: usize,
    /// The decoder's greedy token.
    pub ours_token: usize,
}

/// A class of the step's kernels, for [`GraphDecoder::kernel_breakdown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The embedding row.
    Embed,
    /// RMSNorm + q/k/v projection with RoPE and the cache write (one a layer; with q/k norms,
    /// two: the projection, then the per-head norms and RoPE).
    Qkv,
    /// Attention over the cache (one a layer).
    Attention,
    /// The output projection with the residual (one a layer).
    Output,
    /// RMSNorm + gate/up projection with SiLU-multiply (one a layer).
    GateUp,
    /// The down projection with the residual (one a layer).
    Down,
    /// The final norm and the LM head.
    Head,
    /// Greedy sampling and the state's advance.
    Argmax,
}

impl Part {
    /// Every part, in step order.
    pub const ALL: [Part; 8] = [
        Part::Embed,
        Part::Qkv,
        Part::Attention,
        Part::Output,
        Part::GateUp,
        Part::Down,
        Part::Head,
        Part::Argmax,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Part::Embed => "embed",
            Part::Qkv => "qkv",
            Part::Attention => "attention",
            Part::Output => "o_proj",
            Part::GateUp => "gate_up",
            Part::Down => "down",
            Part::Head => "head",
            Part::Argmax => "argmax",
        }
    }
}

/// One part of the step timed alone: a graph of only its kernels, replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartTime {
    /// Which kernels.
    pub part: Part,
    /// Kernels of that part in a step.
    pub kernels: usize,
    /// Microseconds a step spends in them, replayed alone.
    pub us_per_step: f64,
    /// Bytes of weights (or of the KV cache, for attention) they read a step.
    pub bytes_per_step: usize,
}

/// Compares one step's logits (the MLX forward's, the decoder's).
pub fn compare_logits(reference: &[f32], ours: &[f32]) -> StepComparison {
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |b, (i, &x)| {
                if x > b.1 {
                    (i, x)
                } else {
                    b
                }
            })
            .0
    };
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let d = reference
        .iter()
        .zip(ours)
        .fold(0f32, |m, (r, o)| m.max((r - o).abs()));
    // `f32::max` drops NaN: a non-finite value on either side is an infinite difference, not
    // none.
    let finite = reference.iter().chain(ours).all(|x| x.is_finite());
    let d = if reference.len() == ours.len() && finite {
        d
    } else {
        f32::INFINITY
    };
    StepComparison {
        rel_diff: if d.is_finite() { d / scale } else { d },
        reference_token: argmax(reference),
        ours_token: argmax(ours),
    }
}

/// A layer's rotary embedding as the decoder applies it (built from the model's own RoPE).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphRope {
    /// Rotation pairs (2i, 2i + 1) instead of (i, i + dims / 2).
    pub traditional: bool,
    /// The inverse frequencies of the rotated pairs: `dims / 2` of them (RoPE's `dims`, at most
    /// the head size; partial rotary rotates fewer than `head_dim / 2` pairs). MLX's
    /// `fast.rope` computes them as `base ** (-2i / dims)` for a base, or `1 / freqs[i]` for
    /// a frequency table (llama3, yarn, longrope).
    pub inv_freq: Vec<f32>,
    /// Positions are multiplied by this first (RoPE's `scale`: linear scaling).
    pub position_scale: f32,
    /// The rotated features are multiplied by this (yarn's `mscale`; 1 otherwise).
    pub output_scale: f32,
}

impl GraphRope {
    /// MLX's `nn.RoPE(dims, traditional, base, scale)`: `base ** (-2i / dims)` as MLX's
    /// kernel computes it (`exp2(-i / (dims / 2) * log2(base))`).
    pub fn from_base(dims: usize, traditional: bool, base: f32, scale: f32) -> Self {
        let half = dims / 2;
        let lb = base.log2();
        GraphRope {
            traditional,
            inv_freq: (0..half)
                .map(|i| (-(i as f32 / half as f32) * lb).exp2())
                .collect(),
            position_scale: scale,
            output_scale: 1.0,
        }
    }

    /// `fast.rope(..., freqs=freqs)`: the inverse frequencies are `1 / freqs`.
    pub fn from_freqs(traditional: bool, freqs: &[f32], output_scale: f32) -> Self {
        GraphRope {
            traditional,
            inv_freq: freqs.iter().map(|f| 1.0 / f).collect(),
            position_scale: 1.0,
            output_scale,
        }
    }

    /// Rotated pairs a head.
    pub fn pairs(&self) -> usize {
        self.inv_freq.len()
    }
}

/// How a mixture-of-experts router chooses its experts and weighs them, as the row's mlx-lm
/// block orders it (`moe_route` in `graph_moe.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphRouter {
    /// qwen3_moe: the softmax of the logits (bfloat16), its `top_k` largest, with `norm`
    /// divided by their sum (`norm_topk_prob`).
    SoftmaxTopK { norm: bool },
    /// mixtral: the `top_k` largest logits, the softmax over them.
    TopKSoftmax,
}

/// The experts of a mixture-of-experts model ([`GraphSpec::moe`]): per token, the router
/// picks `top_k` of `experts` SwiGLU experts of width `intermediate` and sums their outputs,
/// weighted. One sequence a step (each sequence would route to its own experts).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphMoe {
    pub experts: usize,
    pub top_k: usize,
    /// An expert's width.
    pub intermediate: usize,
    pub router: GraphRouter,
    /// Per layer: experts (`true`), or a dense MLP of [`GraphSpec::intermediate`] (qwen3_moe's
    /// `mlp_only_layers`).
    pub layers: Vec<bool>,
    /// The routers' quantization, (group size, bits), where it is their own (mlx-lm's convert
    /// quantizes qwen3_moe's routers to 8 bits, the rest to 4); `None`: bfloat16 routers.
    pub router_quant: Option<(usize, usize)>,
    /// gpt_oss's experts: each expert's biases (the stacked projections' `bias`, `[experts,
    /// rows]`), the router's bias, and the clamped SwiGLU (`swiglu_oai`): `MOE_OAI` and
    /// matvec's `MODE_BIAS` for the router.
    pub oai: bool,
    /// The experts are MLX mxfp4 (e2m1 codes, uint8 e8m0 scales a group of 32, no biases),
    /// whatever [`GraphSpec::quant`] says of the other linears (gpt_oss's checkpoint: mxfp4
    /// experts, the rest bfloat16). `MV_FP4` compiles the decode into `matvec_experts`.
    pub mxfp4: bool,
}

impl GraphMoe {
    /// The experts' quantization as the kernels take it: `(32, BITS_MXFP4)` for mxfp4, else
    /// the model's.
    fn expert_quant(&self, spec_quant: Option<(usize, usize)>) -> Option<(usize, usize)> {
        if self.mxfp4 {
            Some((32, BITS_MXFP4))
        } else {
            spec_quant
        }
    }
}

/// What the decoder runs: a pre-norm decoder-only transformer (RMSNorm, attention with RoPE
/// and grouped-query heads, SwiGLU), as described by the loaded model (mlx-engine builds it
/// from the model's descriptor row and its arrays: `mlx_engine::graph`). Nothing here reads a
/// file: the weights are the loaded model's arrays ([`GraphWeights`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphSpec {
    /// The model's `model_type` (for messages).
    pub model_type: String,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    /// RMSNorm's epsilon.
    pub eps: f32,
    /// The attention's softmax scale (`head_dim ** -0.5`, or the model's own).
    pub attn_scale: f32,
    /// The rotary embedding (one table for every layer that rotates).
    pub rope: GraphRope,
    /// Per layer: whether it applies the rotary embedding (SmolLM3's NoPE layers do not).
    pub rope_layers: Vec<bool>,
    /// The LM head is the embedding.
    pub tied: bool,
    /// q, k and v have biases (qwen2).
    pub qkv_bias: bool,
    /// q and k are RMS-normed per head (over `head_dim`, weights [`GraphLayer::q_norm`] and
    /// [`GraphLayer::k_norm`], this spec's `eps`) before RoPE (qwen3).
    pub qk_norm: bool,
    /// With [`GraphSpec::qk_norm`]: the norms span the whole projection (OLMo 2: q's over
    /// `heads * head_dim`, k's over `kv_heads * head_dim`, weights of those sizes), not each
    /// head.
    pub qk_norm_full: bool,
    /// MLX affine quantization of every linear and the embedding: (group size, bits); `None`:
    /// bfloat16 weights.
    pub quant: Option<(usize, usize)>,
    /// The embedding is multiplied by this bfloat16 value (Gemma's `sqrt(hidden)`; 1: none).
    pub embed_scale: f32,
    /// Gemma's sandwich norms: the attention's and the MLP's outputs are RMS-normed
    /// ([`GraphLayer::post_attn_norm`], [`GraphLayer::post_mlp_norm`]) before the residual
    /// adds; the pre-MLP norm is [`GraphLayer::post_norm`].
    pub sandwich: bool,
    /// With [`GraphSpec::sandwich`]: no pre-norms (OLMo 2's post-norm blocks): the attention
    /// and the MLP read the hidden state as it is, and only the post norms apply
    /// ([`GraphLayer::input_norm`] and [`GraphLayer::post_norm`] are not read).
    pub post_only: bool,
    /// The gated MLP's activation is `gelu_approx` (Gemma's GeGLU), not SiLU.
    pub gelu: bool,
    /// Per layer: a sliding-window layer (empty: none), which attends to the last
    /// [`GraphSpec::sliding_window`] positions (0: all) and rotates with
    /// [`GraphSpec::local_rope`] where there is one (Gemma 3's local base).
    pub sliding: Vec<bool>,
    pub sliding_window: usize,
    pub local_rope: Option<GraphRope>,
    /// gemma2's soft-caps (bfloat16 values; 0: none): of the attention scores, of the logits.
    pub attn_softcap: f32,
    /// gpt_oss's attention sinks: each layer's per-head sink logit ([`GraphLayer::sinks`])
    /// joins its head's softmax with no value (`attention` compiled with `ATTN_SINKS` 1).
    pub attn_sinks: bool,
    /// The output projection has a bias (gpt_oss; [`GraphLinear::bias`] of
    /// [`GraphLayer::o`], `[hidden]`): matvec adds it (`MV_OUT_BIAS`, `MODE_BIAS`), and the
    /// attention combines its own partials (no `matvec_attn_out`).
    pub o_bias: bool,
    pub final_softcap: f32,
    /// granite's residual multiplier (a bfloat16 value; 0: none): each attention and MLP
    /// output is multiplied by it before its residual add.
    pub residual_scale: f32,
    /// granite's logits scaling (a bfloat16 value; 0: none): the logits are divided by it.
    pub logit_div: f32,
    /// The experts of a mixture-of-experts model (qwen3_moe, mixtral); `None`: dense.
    pub moe: Option<GraphMoe>,
    /// Every linear of the layers trellis-coded with this spec ([`GraphTrellis`]; the
    /// embedding and head keep [`GraphSpec::quant`]); `None`: none is.
    pub trellis: Option<TrellisSpec>,
    /// The attention value projections' (`v_proj`) trellis spec where it differs from
    /// [`GraphSpec::trellis`] (`mlx convert --q-trellis-v-code`; every layer's the same): its
    /// own code and `L`, the same bits and blocks and the same lanes a row
    /// ([`crate::graph_trellis::v_spec_problem`]). `trellis_qkv`'s v slice decodes with it
    /// (`TRELLIS_V_L`, defined only for such a model: a one-spec model compiles the same
    /// kernels). `None`: v takes [`GraphSpec::trellis`].
    pub trellis_v: Option<TrellisSpec>,
}

impl GraphSpec {
    /// The trellis kernels' switches for this model: chosen by its hidden width, each
    /// `MLX_GRAPH_TRELLIS_*` variable overriding ([`TrellisSwitches::from_env`]). The decoder
    /// reads it once, when it is built, and compiles, sizes and launches its trellis kernels
    /// with that one value (a model without trellis-coded linears compiles no trellis kernel:
    /// its source does not depend on it).
    pub fn trellis_switches(&self) -> TrellisSwitches {
        TrellisSwitches::from_env(self.hidden)
    }

    /// Why the decoder cannot run this spec (`Err` names the field and the problem).
    pub fn check(&self) -> std::result::Result<(), String> {
        let s = self;
        for (k, n) in [
            ("hidden", s.hidden),
            ("layers", s.layers),
            ("heads", s.heads),
            ("kv_heads", s.kv_heads),
            ("head_dim", s.head_dim),
            ("intermediate", s.intermediate),
            ("vocab", s.vocab),
        ] {
            if n == 0 || n >= 1 << 31 {
                return Err(format!("{k} {n}: not a positive 31-bit size"));
            }
        }
        if !(s.eps.is_finite() && s.eps > 0.0) {
            return Err(format!("eps {}: not a positive number", s.eps));
        }
        if !(s.attn_scale.is_finite() && s.attn_scale > 0.0) {
            return Err(format!(
                "attn_scale {}: not a positive number",
                s.attn_scale
            ));
        }
        if s.heads % s.kv_heads != 0 {
            return Err(format!(
                "heads {} and kv_heads {}: not a multiple",
                s.heads, s.kv_heads
            ));
        }
        if ![16, 32, 64, 128].contains(&s.head_dim) {
            return Err(format!(
                "head_dim {}: the graph decoder runs head sizes 16, 32, 64 and 128",
                s.head_dim
            ));
        }
        let r = &s.rope;
        if r.pairs() == 0 || 2 * r.pairs() > s.head_dim {
            return Err(format!(
                "rope: {} rotated pairs for a head of {}",
                r.pairs(),
                s.head_dim
            ));
        }
        if r.traditional && 2 * r.pairs() != s.head_dim {
            return Err("rope: traditional partial rotary is not supported".into());
        }
        let finite = r.inv_freq.iter().all(|f| f.is_finite())
            && r.position_scale.is_finite()
            && r.output_scale.is_finite();
        if !finite {
            return Err("rope: a frequency or scale is not finite".into());
        }
        if s.rope_layers.len() != s.layers {
            return Err(format!(
                "rope_layers: {} entries for {} layers",
                s.rope_layers.len(),
                s.layers
            ));
        }
        if !s.sliding.is_empty() && s.sliding.len() != s.layers {
            return Err(format!(
                "sliding: {} entries for {} layers",
                s.sliding.len(),
                s.layers
            ));
        }
        if let Some(l) = &s.local_rope {
            if l.pairs() == 0 || 2 * l.pairs() > s.head_dim {
                return Err(format!(
                    "local_rope: {} rotated pairs for a head of {}",
                    l.pairs(),
                    s.head_dim
                ));
            }
            if l.traditional != r.traditional {
                return Err("local_rope: traditional where the rope is not, or back".into());
            }
            if r.traditional && 2 * l.pairs() != s.head_dim {
                return Err("local_rope: traditional partial rotary is not supported".into());
            }
            let finite = l.inv_freq.iter().all(|f| f.is_finite())
                && l.position_scale.is_finite()
                && l.output_scale.is_finite();
            if !finite {
                return Err("local_rope: a frequency or scale is not finite".into());
            }
        }
        for (k, v) in [
            ("embed_scale", s.embed_scale),
            ("attn_softcap", s.attn_softcap),
            ("final_softcap", s.final_softcap),
            ("residual_scale", s.residual_scale),
            ("logit_div", s.logit_div),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{k} {v}: not a finite number of at least 0"));
            }
        }
        if s.final_softcap > 0.0 && s.logit_div > 0.0 {
            return Err("final_softcap and logit_div: one or the other".into());
        }
        if s.post_only && !s.sandwich {
            return Err("post_only without sandwich norms (its post norms)".into());
        }
        if s.qk_norm_full && !s.qk_norm {
            return Err("qk_norm_full without qk_norm".into());
        }
        if s.sandwich && s.residual_scale > 0.0 {
            return Err("residual_scale with sandwich norms is not supported".into());
        }
        if s.embed_scale == 0.0 {
            return Err("embed_scale 0: must be positive (1 for none)".into());
        }
        if s.sliding_window > 1 << 24 {
            return Err(format!(
                "sliding_window {}: at most 16777216",
                s.sliding_window
            ));
        }
        if let Some((gs, bits)) = s.quant {
            if ![32, 64, 128].contains(&gs) || ![4, 8].contains(&bits) {
                return Err(format!(
                    "quantization: group size {gs}, bits {bits}; the graph decoder runs groups \
                     of 32, 64 or 128 with 4 or 8 bits"
                ));
            }
        }
        if let Some(m) = &s.moe {
            if !(1..=MOE_MAX_EXPERTS).contains(&m.experts) {
                return Err(format!(
                    "moe: {} experts; the graph decoder routes over 1 to {MOE_MAX_EXPERTS}",
                    m.experts
                ));
            }
            if m.top_k == 0 || m.top_k > m.experts.min(MOE_MAX_TOP_K) {
                return Err(format!(
                    "moe: {} experts a token of {}; at most {MOE_MAX_TOP_K}",
                    m.top_k, m.experts
                ));
            }
            if m.layers.len() != s.layers {
                return Err(format!(
                    "moe: {} layer entries for {} layers",
                    m.layers.len(),
                    s.layers
                ));
            }
            if s.sandwich || s.residual_scale > 0.0 {
                return Err("moe: with sandwich norms or a residual multiplier".into());
            }
            if let Some((gs, bits)) = m.router_quant {
                if ![32, 64, 128].contains(&gs) || ![4, 8].contains(&bits) || s.hidden % gs != 0 {
                    return Err(format!(
                        "moe: router quantization group size {gs}, bits {bits}; the graph \
                         decoder runs groups of 32, 64 or 128 dividing hidden with 4 or 8 bits"
                    ));
                }
            }
            let (gs, align) = match m.expert_quant(s.quant) {
                Some((gs, _)) => (gs, 32),
                None => (1, 8),
            };
            let i = m.intermediate;
            if m.mxfp4 && s.hidden % 32 != 0 {
                return Err(format!(
                    "moe: mxfp4 experts over hidden {}: not a multiple of 32",
                    s.hidden
                ));
            }
            if i == 0 || i % align != 0 || i % gs != 0 {
                return Err(format!(
                    "moe: expert width {i}: not a positive multiple of {}",
                    align.max(gs)
                ));
            }
        }
        if s.trellis_v.is_some() && s.trellis.is_none() {
            return Err(
                "trellis_v: a value projections' trellis spec in a model whose other linears \
                 are not trellis-coded"
                    .into(),
            );
        }
        if s.trellis.is_some() {
            for (on, what) in [
                (s.moe.is_some(), "experts"),
                (s.o_bias, "an output-projection bias"),
                (s.qk_norm, "q/k norms"),
                (s.sandwich, "sandwich norms"),
                (s.gelu, "GeGLU"),
                (s.residual_scale > 0.0, "a residual multiplier"),
                (
                    s.final_softcap > 0.0 || s.logit_div > 0.0,
                    "a logit soft-cap or scaling",
                ),
            ] {
                if on {
                    return Err(format!(
                        "trellis-coded linears with {what}: the graph decoder's trellis step \
                         runs dense pre-norm SwiGLU layers"
                    ));
                }
            }
        }
        // matvec_qkv indexes its rows in 32 bits.
        if s.qkv_rows() > i32::MAX as usize {
            return Err(format!(
                "heads {}, kv_heads {} and head_dim {}: too many attention rows",
                s.heads, s.kv_heads, s.head_dim
            ));
        }
        let (gs, align) = match s.quant {
            Some((gs, _)) => (gs, 32),
            None => (1, 8),
        };
        for (k, n) in [
            ("hidden", s.hidden),
            ("intermediate", s.intermediate),
            ("heads * head_dim", s.heads * s.head_dim),
        ] {
            if n % align != 0 || n % gs != 0 {
                return Err(format!("{k} {n}: not a multiple of {}", align.max(gs)));
            }
        }
        Ok(())
    }

    /// The kernels' `gs` and `bits` arguments: the quantization, or (1, 16) for bfloat16.
    fn group_and_bits(&self) -> (usize, usize) {
        self.quant.unwrap_or((1, 16))
    }

    /// The codes' widths the mat-vecs dispatch on (`graph_decode.cu`'s `MV_BITS` mask: 1 << 4,
    /// 1 << 8, and 1 << 16 for bfloat16, the dispatch's default case): the linears' and the
    /// embedding's (a tied head), the routers' and the experts' (mxfp4 experts take their own
    /// path, outside the dispatch).
    fn matvec_bits(&self) -> u32 {
        let bit = |q: Option<(usize, usize)>| match q.map_or(16, |(_, b)| b) {
            4 => 1 << 4,
            8 => 1 << 8,
            _ => 1 << 16,
        };
        let mut mask = bit(self.quant);
        if let Some(moe) = &self.moe {
            mask |= bit(moe.router_quant);
            if !moe.mxfp4 {
                mask |= bit(moe.expert_quant(self.quant));
            }
        }
        mask
    }

    /// Whether the tensor-core tiles take these weights: 4 bits in groups of 64.
    fn tensor_core_weights(&self) -> bool {
        self.group_and_bits() == (64, 4)
    }

    fn qkv_rows(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Whether layer `i` routes to experts.
    pub fn moe_layer(&self, i: usize) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| m.layers.get(i).copied().unwrap_or(false))
    }

    /// The (input width, bits) of every matrix-vector launch a step makes that takes its
    /// input through shared memory (the routers' and experts' included).
    fn mv_inputs(&self) -> Vec<(usize, usize)> {
        let bits = self.group_and_bits().1;
        let mut v = vec![
            (self.hidden, bits),
            (self.intermediate, bits),
            (self.heads * self.head_dim, bits),
        ];
        if let Some(m) = &self.moe {
            let eb = layout_bits(m.expert_quant(self.quant).map_or(16, |q| q.1));
            v.push((self.hidden, m.router_quant.map_or(16, |q| q.1)));
            v.push((self.hidden, eb));
            v.push((m.top_k * m.intermediate, eb));
        }
        v
    }

    /// The most shared memory one sequence's input takes in a matrix-vector launch.
    fn mv_shared_per_sequence(&self) -> u32 {
        self.mv_inputs()
            .into_iter()
            .map(|(k, bits)| mv_shared_bytes(k, bits))
            .max()
            .unwrap_or(0)
    }
}

/// A linear layer's (or the embedding's) arrays, as the loaded model holds them: a bfloat16
/// weight `[n, k]`, or MLX affine codes `[n, k * bits / 32]` (uint32) with bfloat16 `scales`
/// and `biases` `[n, k / group]`, or trellis codes `[n, k * bits / 32]` (uint32) with the
/// row scales `[n, 1]` in `scales` and the signs in `trellis`; and an optional bfloat16
/// `bias` `[n]`.
#[derive(Debug, Clone)]
pub struct GraphLinear {
    pub weight: Array,
    pub scales: Option<Array>,
    pub biases: Option<Array>,
    pub bias: Option<Array>,
    /// A trellis-coded linear's spec and signs ([`GraphSpec::trellis`]).
    pub trellis: Option<GraphTrellis>,
}

/// A trellis-coded linear's (`mlx_core::cpu::trellis`) spec and random signs as the loaded
/// model made them (`TrellisWeight::signs`): `su` float32 `[n]` (rows), `sv` float32 `[k]`.
#[derive(Debug, Clone)]
pub struct GraphTrellis {
    pub spec: TrellisSpec,
    pub su: Array,
    pub sv: Array,
}

/// One layer's arrays.
#[derive(Debug, Clone)]
pub struct GraphLayer {
    /// The pre-attention and pre-MLP norms' weights `[hidden]` (with [`GraphSpec::post_only`]
    /// not read: `mlx_engine::graph` passes the post norms' handles).
    pub input_norm: Array,
    pub post_norm: Array,
    /// q's and k's RMSNorm weights ([`GraphSpec::qk_norm`]): `[head_dim]` per head, or the
    /// projections' widths with [`GraphSpec::qk_norm_full`].
    pub q_norm: Option<Array>,
    pub k_norm: Option<Array>,
    /// The sandwich post-norms' weights `[hidden]` ([`GraphSpec::sandwich`]): after the
    /// attention, after the MLP.
    pub post_attn_norm: Option<Array>,
    pub post_mlp_norm: Option<Array>,
    pub q: GraphLinear,
    pub k: GraphLinear,
    pub v: GraphLinear,
    pub o: GraphLinear,
    /// The MLP's projections; in a layer with experts ([`GraphSpec::moe`]), the experts'
    /// stacked ones as the model holds them (`[experts, width, hidden]` and
    /// `[experts, hidden, width]`, and their scales and biases likewise).
    pub gate: GraphLinear,
    pub up: GraphLinear,
    pub down: GraphLinear,
    /// The router (`[experts, hidden]`) of a layer with experts; `None` elsewhere.
    pub router: Option<GraphLinear>,
    /// The attention sinks' logits, bfloat16 `[heads]` ([`GraphSpec::attn_sinks`]).
    pub sinks: Option<Array>,
}

/// The loaded model's arrays the decoder reads (clones of its handles: no copy of the data).
#[derive(Debug, Clone)]
pub struct GraphWeights {
    pub embed: GraphLinear,
    /// The untied LM head (`None` when [`GraphSpec::tied`]).
    pub head: Option<GraphLinear>,
    pub final_norm: Array,
    pub layers: Vec<GraphLayer>,
}

impl GraphWeights {
    /// Checks every array's shape and dtype against `spec`; every problem is listed at once.
    /// Trellis linears' plans are checked under the model's switches
    /// ([`GraphSpec::trellis_switches`]).
    pub fn check(&self, spec: &GraphSpec) -> std::result::Result<(), String> {
        self.check_with(spec, &spec.trellis_switches())
    }

    /// [`GraphWeights::check`] with the trellis switches given (the decoder's, chosen once).
    fn check_with(
        &self,
        spec: &GraphSpec,
        sw: &TrellisSwitches,
    ) -> std::result::Result<(), String> {
        fn want(p: &mut Vec<String>, name: &str, a: &Array, shape: &[usize], dt: Dtype) {
            let sh: Vec<i32> = shape.iter().map(|&n| n as i32).collect();
            if a.shape() != sh.as_slice() || a.dtype() != dt {
                p.push(format!(
                    "{name}: {:?} {}, expected {sh:?} {dt}",
                    a.shape(),
                    a.dtype()
                ));
            }
        }
        #[allow(clippy::too_many_arguments)]
        fn lin(
            p: &mut Vec<String>,
            s: &GraphSpec,
            name: &str,
            l: &GraphLinear,
            n: usize,
            k: usize,
            bias: bool,
        ) {
            lin_q(p, s.quant, &[], name, l, n, k, bias)
        }
        /// A linear of `quant`, its arrays with the leading dimensions `lead` (the experts).
        #[allow(clippy::too_many_arguments)]
        fn lin_q(
            p: &mut Vec<String>,
            quant: Option<(usize, usize)>,
            lead: &[usize],
            name: &str,
            l: &GraphLinear,
            n: usize,
            k: usize,
            bias: bool,
        ) {
            let shape =
                |last: usize| -> Vec<usize> { lead.iter().copied().chain([n, last]).collect() };
            let rows: Vec<usize> = lead.iter().copied().chain([n]).collect();
            if l.trellis.is_some() {
                p.push(format!(
                    "{name}: trellis-coded, the rest of the model's linears are not (a mix)"
                ));
                return;
            }
            match quant {
                // MLX mxfp4: 8 codes a uint32, a uint8 scale a group of 32, no biases.
                Some((32, BITS_MXFP4)) => {
                    want(
                        p,
                        &format!("{name}.weight"),
                        &l.weight,
                        &shape(k / 8),
                        Dtype::Uint32,
                    );
                    match &l.scales {
                        Some(a) => want(
                            p,
                            &format!("{name}.scales"),
                            a,
                            &shape(k / 32),
                            Dtype::Uint8,
                        ),
                        None => p.push(format!("{name}: no scales")),
                    }
                    if l.biases.is_some() {
                        p.push(format!("{name}: mxfp4 with biases"));
                    }
                }
                None => {
                    want(
                        p,
                        &format!("{name}.weight"),
                        &l.weight,
                        &shape(k),
                        Dtype::Bfloat16,
                    );
                    if l.scales.is_some() || l.biases.is_some() {
                        p.push(format!("{name}: quantized where bfloat16 is expected"));
                    }
                }
                Some((gs, bits)) => {
                    let sh = shape(k * bits / 32);
                    want(p, &format!("{name}.weight"), &l.weight, &sh, Dtype::Uint32);
                    for (part, a) in [("scales", &l.scales), ("biases", &l.biases)] {
                        match a {
                            Some(a) => want(
                                p,
                                &format!("{name}.{part}"),
                                a,
                                &shape(k / gs),
                                Dtype::Bfloat16,
                            ),
                            None => p.push(format!("{name}: no {part}")),
                        }
                    }
                }
            }
            match (&l.bias, bias) {
                (Some(b), true) => want(p, &format!("{name}.bias"), b, &rows, Dtype::Bfloat16),
                (None, false) => {}
                (Some(_), false) => p.push(format!("{name}: a bias is not supported")),
                (None, true) => p.push(format!("{name}: no bias")),
            }
        }
        /// A layer's linear: trellis-coded where the spec says so, else as `lin`.
        #[allow(clippy::too_many_arguments)]
        fn layer_lin(
            p: &mut Vec<String>,
            s: &GraphSpec,
            sw: &TrellisSwitches,
            name: &str,
            l: &GraphLinear,
            n: usize,
            k: usize,
            bias: bool,
        ) {
            match s.trellis {
                Some(t) => trellis_lin(p, &t, sw, name, l, n, k, bias),
                None => lin(p, s, name, l, n, k, bias),
            }
        }
        let s = spec;
        let mut p = Vec::new();
        let (h, d) = (s.hidden, s.head_dim);
        lin(&mut p, s, "embed_tokens", &self.embed, s.vocab, h, false);
        match (&self.head, s.tied) {
            // The converter trellis-codes an untied head with the layers.
            (Some(l), false) => match s.trellis {
                Some(t) if l.trellis.is_some() => {
                    trellis_lin(&mut p, &t, sw, "lm_head", l, s.vocab, h, false)
                }
                _ => lin(&mut p, s, "lm_head", l, s.vocab, h, false),
            },
            (None, true) => {}
            (Some(_), true) => p.push("lm_head: given for a tied model".into()),
            (None, false) => p.push("lm_head: missing".into()),
        }
        if self.layers.len() != s.layers {
            p.push(format!(
                "{} layers of weights, the spec has {}",
                self.layers.len(),
                s.layers
            ));
        }
        for (i, l) in self.layers.iter().enumerate() {
            let n = |x: &str| format!("layers.{i}.{x}");
            let b = s.qkv_bias;
            layer_lin(&mut p, s, sw, &n("q_proj"), &l.q, s.heads * d, h, b);
            layer_lin(&mut p, s, sw, &n("k_proj"), &l.k, s.kv_heads * d, h, b);
            match (s.trellis, s.trellis_v) {
                // The value projections' own spec (`trellis_qkv`'s v slice), if the kernels
                // can pair it with q's and k's.
                (Some(t), Some(v)) => match crate::graph_trellis::v_spec_problem(&t, &v) {
                    Some(why) => p.push(format!(
                        "{}: trellis spec {v:?} beside q/k's {t:?}: {why}",
                        n("v_proj")
                    )),
                    None => trellis_lin(&mut p, &v, sw, &n("v_proj"), &l.v, s.kv_heads * d, h, b),
                },
                _ => layer_lin(&mut p, s, sw, &n("v_proj"), &l.v, s.kv_heads * d, h, b),
            }
            layer_lin(&mut p, s, sw, &n("o_proj"), &l.o, h, s.heads * d, s.o_bias);
            match (&s.moe, &l.router) {
                (Some(m), Some(r)) if s.moe_layer(i) => {
                    let e = [m.experts];
                    let iw = m.intermediate;
                    let eq = m.expert_quant(s.quant);
                    lin_q(
                        &mut p,
                        m.router_quant,
                        &[],
                        &n("router"),
                        r,
                        m.experts,
                        h,
                        m.oai,
                    );
                    lin_q(
                        &mut p,
                        eq,
                        &e,
                        &n("experts.gate_proj"),
                        &l.gate,
                        iw,
                        h,
                        m.oai,
                    );
                    lin_q(&mut p, eq, &e, &n("experts.up_proj"), &l.up, iw, h, m.oai);
                    lin_q(
                        &mut p,
                        eq,
                        &e,
                        &n("experts.down_proj"),
                        &l.down,
                        h,
                        iw,
                        m.oai,
                    );
                }
                (_, Some(_)) => p.push(format!("{}: a router in a dense layer", n("router"))),
                (Some(_), None) if s.moe_layer(i) => p.push(format!("{}: missing", n("router"))),
                _ => {
                    layer_lin(
                        &mut p,
                        s,
                        sw,
                        &n("gate_proj"),
                        &l.gate,
                        s.intermediate,
                        h,
                        false,
                    );
                    layer_lin(
                        &mut p,
                        s,
                        sw,
                        &n("up_proj"),
                        &l.up,
                        s.intermediate,
                        h,
                        false,
                    );
                    layer_lin(
                        &mut p,
                        s,
                        sw,
                        &n("down_proj"),
                        &l.down,
                        h,
                        s.intermediate,
                        false,
                    );
                }
            }
            want(
                &mut p,
                &n("input_norm"),
                &l.input_norm,
                &[h],
                Dtype::Bfloat16,
            );
            want(&mut p, &n("post_norm"), &l.post_norm, &[h], Dtype::Bfloat16);
            match (&l.sinks, s.attn_sinks) {
                (Some(a), true) => want(&mut p, &n("sinks"), a, &[s.heads], Dtype::Bfloat16),
                (None, false) => {}
                (Some(_), false) => p.push(format!("{}: given, the spec has none", n("sinks"))),
                (None, true) => p.push(format!("{}: missing", n("sinks"))),
            }
            // Per head, or over the whole projection (qk_norm_full).
            let (qn, kn) = match s.qk_norm_full {
                true => (s.heads * d, s.kv_heads * d),
                false => (d, d),
            };
            for (x, a, len) in [("q_norm", &l.q_norm, qn), ("k_norm", &l.k_norm, kn)] {
                match (a, s.qk_norm) {
                    (Some(a), true) => want(&mut p, &n(x), a, &[len], Dtype::Bfloat16),
                    (None, false) => {}
                    (Some(_), false) => {
                        p.push(format!("{}: given, the spec has no q/k norm", n(x)))
                    }
                    (None, true) => p.push(format!("{}: missing", n(x))),
                }
            }
            for (x, a) in [
                ("post_attn_norm", &l.post_attn_norm),
                ("post_mlp_norm", &l.post_mlp_norm),
            ] {
                match (a, s.sandwich) {
                    (Some(a), true) => want(&mut p, &n(x), a, &[h], Dtype::Bfloat16),
                    (None, false) => {}
                    (Some(_), false) => {
                        p.push(format!("{}: given, the spec has no sandwich norms", n(x)))
                    }
                    (None, true) => p.push(format!("{}: missing", n(x))),
                }
            }
        }
        want(&mut p, "norm", &self.final_norm, &[h], Dtype::Bfloat16);
        if p.is_empty() {
            return Ok(());
        }
        let n = p.len();
        Err(format!(
            "{n} weight problem(s): {}",
            cap_listing(p).join("; ")
        ))
    }
}

/// [`GraphWeights::check`] of a trellis-coded layer linear of `spec`: the words `[n, k * bits
/// / 32]` (uint32), the row scales `[n, 1]` (bfloat16 or float32), the signs (float32 `[n]` and
/// `[k]`), no affine biases, and the kernels' plan ([`TrellisPlan::new`]: shape, code, shared
/// memory).
#[allow(clippy::too_many_arguments)]
fn trellis_lin(
    p: &mut Vec<String>,
    spec: &TrellisSpec,
    sw: &TrellisSwitches,
    name: &str,
    l: &GraphLinear,
    n: usize,
    k: usize,
    bias: bool,
) {
    let Some(t) = &l.trellis else {
        p.push(format!(
            "{name}: not trellis-coded, the rest of the model's linears are (a mix)"
        ));
        return;
    };
    if t.spec != *spec {
        p.push(format!(
            "{name}: trellis spec {:?}, the model's others {spec:?}",
            t.spec
        ));
        return;
    }
    if let Err(e) = TrellisPlan::new(spec, n, k, DEFAULT_SMS, sw) {
        p.push(format!("{name}: {e}"));
        return;
    }
    let dims = |a: &Array| -> Vec<usize> { a.shape().iter().map(|&x| x as usize).collect() };
    let words = k * spec.k as usize / 32;
    if dims(&l.weight) != [n, words] || l.weight.dtype() != Dtype::Uint32 {
        p.push(format!(
            "{name}.weight: {:?} {}, expected [{n}, {words}] uint32",
            l.weight.shape(),
            l.weight.dtype()
        ));
    }
    match &l.scales {
        Some(a) if dims(a) == [n, 1] && matches!(a.dtype(), Dtype::Bfloat16 | Dtype::Float32) => {}
        Some(a) => p.push(format!(
            "{name}.scales: {:?} {}, expected [{n}, 1] bfloat16 or float32",
            a.shape(),
            a.dtype()
        )),
        None => p.push(format!("{name}: no scales")),
    }
    if l.biases.is_some() {
        p.push(format!("{name}: affine biases on a trellis-coded linear"));
    }
    for (what, a, len) in [("su", &t.su, n), ("sv", &t.sv, k)] {
        if dims(a) != [len] || a.dtype() != Dtype::Float32 {
            p.push(format!(
                "{name}.{what}: {:?} {}, expected [{len}] float32",
                a.shape(),
                a.dtype()
            ));
        }
    }
    match (&l.bias, bias) {
        (Some(b), true) if dims(b) == [n] && b.dtype() == Dtype::Bfloat16 => {}
        (Some(b), true) => p.push(format!(
            "{name}.bias: {:?} {}, expected [{n}] bfloat16",
            b.shape(),
            b.dtype()
        )),
        (None, false) => {}
        (Some(_), false) => p.push(format!("{name}: a bias is not supported")),
        (None, true) => p.push(format!("{name}: no bias")),
    }
}

/// A linear layer's (or the embedding's) device tensors, as the model holds them: the words of
/// each part (one; gate and up; q, k and v: the kernels' `Wts`, the unused ones repeating part
/// 0), and with quantized weights each part's scales and biases (MLX's own arrays).
#[derive(Debug, Clone, Copy)]
struct Lin {
    w: [Buffer; 3],
    sb: Option<([Buffer; 3], [Buffer; 3])>,
    /// q/k/v: the RoPE pairs a head that the kernel pairs by index (`WMAP_QKV`); 0 where the
    /// host has paired the rows in a copy, or they need no pairing.
    pairs: usize,
    n: usize,
    k: usize,
    /// The kernels' `gs` and `bits` for it: its quantization, or (1, 16) for bfloat16 (the
    /// spec's, or a router's own).
    gs: usize,
    bits: usize,
    /// A biased output projection's or router's bias `[n]` (gpt_oss): matvec adds it
    /// (`MODE_BIAS`, in B1's slot).
    out_bias: Option<Buffer>,
}

#[derive(Debug)]
struct Layer {
    in_norm: Buffer,
    post_norm: Buffer,
    qkv: Lin,
    /// q/k/v biases in the q/k/v rows' order, or none.
    qkv_bias: Option<Buffer>,
    /// Rotated pairs a head in this layer (0: no RoPE).
    nrot: usize,
    /// Where this layer's RoPE table sits in the step's (bytes: 0, or the local table's).
    rope_off: usize,
    /// The attention window (0: every position).
    window: usize,
    /// The sandwich post-norms (after the attention, after the MLP).
    post_norms: Option<(Buffer, Buffer)>,
    /// q's and k's per-head norm weights (qwen3): RoPE then runs in `qk_norm_rope`, after
    /// the norm, not in matvec_qkv.
    qk_norm: Option<(Buffer, Buffer)>,
    /// The attention sinks' logits (gpt_oss), a head each.
    sinks: Option<Buffer>,
    o: Lin,
    /// Gate/up interleaved and down; with experts, every expert's (`experts` times the rows,
    /// each expert's gate/up interleaved), read through the router's choice.
    gu: Lin,
    down: Lin,
    /// The router of a layer with experts.
    router: Option<Lin>,
    /// gpt_oss's experts' biases (`GraphMoe::oai`): gate's and up's `[experts * width]`,
    /// down's `[experts * hidden]`.
    expert_bias: Option<[Buffer; 3]>,
    /// The router's logits of a layer with experts (bfloat16, experts), this layer's own (a
    /// step buffer): what [`GraphDecoder::router_logits`] reads back after a step.
    gates: Option<Buffer>,
    kc: Buffer,
    vc: Buffer,
    /// A layer of trellis-coded linears ([`GraphSpec::trellis`]): its linears, launched by
    /// `record_trellis_attention` and `record_trellis_mlp` (`qkv`, `o`, `gu` and `down` above
    /// then only describe the words for `part_load`).
    trellis: Option<TrellisLayer>,
}

#[derive(Debug)]
struct Activations {
    h: Buffer,
    qkv: Buffer,
    attn: Buffer,
    act: Buffer,
    /// A projection's output before its sandwich post-norm (hidden; sandwich models).
    y: Buffer,
    logits: Buffer,
    state: Buffer,
    tokens: Buffer,
    po: Buffer,
    pml: Buffer,
    counters: Buffer,
    /// The step's RoPE tables: cosines then sines of the head_dim / 2 pairs; then the local
    /// RoPE's (sliding layers), the same.
    rope: Buffer,
    /// RoPE's inverse frequencies (float32, one a rotated pair), and the local RoPE's.
    inv_freq: Buffer,
    inv_freq2: Buffer,
    /// The greedy sampler's per-block maxima and sums, then the log-sum-exp and the largest
    /// log-probability (floats), and its counters and pick (4 ints).
    am_part: Buffer,
    am_ctl: Buffer,
    /// Each row's logit bias (float32, vocab a row; zeros unless set_row_bias set one),
    /// added where the greedy sampler reads the logits.
    bias: Buffer,
    /// Mixture-of-experts layers: the router's logits (bfloat16, experts), the chosen experts
    /// (int32, top_k) and their weights (float32, top_k), the experts' outputs (bfloat16,
    /// top_k x hidden); a word each in a dense model.
    gates: Buffer,
    sel: Buffer,
    wts: Buffer,
    ey: Buffer,
}

/// A model's decode step as a replayed CUDA graph. See the module docs.
pub struct GraphDecoder {
    rt: GpuRuntime,
    /// The model on the device and how its step is launched.
    step: Step,
    pos: usize,
    graph: Graph,
    /// Rows whose logit bias is set (not all zeros).
    row_bias: Vec<bool>,
    /// The step over the first n tiles only (n = 1 .. tiles - 1; `graph` runs them all).
    tile_graphs: Vec<Graph>,
    /// [`GraphOptions::fit_rows`]: the kernels compiled so far, by rows a tile (the
    /// constructor's, then the narrower ones' modules), and the step's graphs over them, by
    /// (rows a tile, tiles, first row).
    modules: Vec<(usize, Module)>,
    fitted: Vec<((usize, usize, usize), Graph)>,
    /// Graphs of one part each, captured on the first breakdown.
    part_graphs: Vec<(Part, Graph)>,
    /// The step recording its timeline, and the timeline's buffer (on the first trace).
    traced: Option<(Graph, Buffer)>,
    batch: u32,
    broken: Option<String>,
    /// Each row's cached positions (batched decode; `None`: idle).
    row_pos: Vec<Option<usize>>,
    /// Reads of sampled tokens queued by [`GraphDecoder::next_token`], oldest first.
    pending: VecDeque<mlx_core::gpurt::Ticket>,
    /// Steps queued so far in the current run of [`GraphDecoder::next_token`] (the position
    /// the next queued step writes is `queued_to`).
    queued_to: usize,
    /// Where the current run began, and the position it stops queueing at.
    start_pos: usize,
    limit: usize,
    /// [`GraphDecoder::inject_failure_after`]'s count.
    fail_after: Option<usize>,
    /// How long [`GraphDecoder::with_options`] took, by part.
    build: BuildTimes,
    /// `MLX_GRAPH_STEP_PROFILE`'s accounts ([`crate::graph_profile`]); `None`: off.
    profile: Option<Box<StepProfile>>,
    /// [`GraphDecoder::copied_bytes`].
    copied: usize,
}

/// Where a [`GraphDecoder`]'s construction spent its time (wall clock, seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BuildTimes {
    /// The kernels: NVRTC's compilation, or the cubin read from the on-disk cache, and the
    /// module's load ([`mlx_core::gpurt::GpuRuntime::new`]).
    pub kernels_s: f64,
    /// The weights laid out on the device, the cache and activation buffers allocated.
    pub weights_s: f64,
    /// The step captured as a CUDA graph.
    pub capture_s: f64,
}

impl std::fmt::Debug for GraphDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphDecoder")
            .field("shape", &self.step.shape)
            .field("capacity", &self.step.capacity)
            .field("position", &self.pos)
            .finish()
    }
}

impl Drop for GraphDecoder {
    fn drop(&mut self) {
        // MLX_GRAPH_STEP_PROFILE: a run still open (stopped early) prints its line.
        if let Some(p) = self.profile.as_deref_mut() {
            p.report();
        }
    }
}

fn invalid(op: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        message: msg.into(),
    }
}

/// Each head's first `2 * pairs` rows of `a` (`[heads * d, cols]`) reordered so that rows
/// 2i and 2i + 1 are rows i and i + pairs (a RoPE rotation pair); the rest keep their order.
/// MLX ops: on a GPU build the reordering runs on the device.
pub fn pair_rope_rows(a: &Array, heads: usize, d: usize, pairs: usize) -> Result<Array> {
    let cols = a.size() / (heads * d).max(1);
    let (h, d, p, c) = (heads as i32, d as i32, pairs as i32, cols as i32);
    let x = a.reshape(&[h, d, c])?;
    let rot = ops::slice_axis(&x, 1, 0, 2 * p, None)?.reshape(&[h, 2, p, c])?;
    let rot = ops::transpose(&rot, &[0, 2, 1, 3], None)?.reshape(&[h, 2 * p, c])?;
    let out = if 2 * p == d {
        rot
    } else {
        let rest = ops::slice_axis(&x, 1, 2 * p, d, None)?;
        ops::concatenate(&[&rot, &rest], 1, None)?
    };
    out.reshape(&[h * d, c])
}

/// Copies an array into a new device buffer: device to device where MLX runs on the GPU,
/// through host memory otherwise. The array itself is left as it is.
fn put(rt: &mut GpuRuntime, a: &Array) -> Result<Buffer> {
    let a = ops::contiguous(a, false, None)?;
    a.eval()?;
    let n = a.nbytes();
    if mlx_core::Device::gpu().is_available()? {
        let b = rt.alloc(n)?;
        rt.copy_from_array(b, 0, n, &a, n, 1)?;
        Ok(b)
    } else {
        rt.alloc_from(&a.to_bytes()?)
    }
}

/// A weight the kernels read as the model holds it: MLX's own device buffer where MLX runs on
/// the GPU and the array is row-contiguous and aligned (no copy: issue #30's peak memory),
/// else a copy ([`put`]). Not for trellis words: MLX's path reads them on the host (its CPU
/// kernel), which moves MLX's buffer. `MLX_GRAPH_COPY_WEIGHTS=1` copies every weight (the former
/// behaviour, for A/B runs). The runtime keeps the array alive and refuses a launch if MLX
/// moves its memory (a host read), so the step fails and the run goes on on MLX's path.
fn share(rt: &mut GpuRuntime, a: &Array) -> Result<Buffer> {
    let copy = std::env::var("MLX_GRAPH_COPY_WEIGHTS").is_ok_and(|v| v == "1");
    if !copy && mlx_core::Device::gpu().is_available()? {
        match rt.borrow_array(a) {
            Ok(b) => return Ok(b),
            Err(e) if std::env::var("MLX_GRAPH_MEMORY").is_ok_and(|v| v == "1") => {
                eprintln!("[graph memory] a weight {:?} is copied: {e}", a.shape());
            }
            Err(_) => {}
        }
    }
    put(rt, a)
}

/// How a linear layer's tensors are laid out on the device.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// One tensor as it is.
    Plain,
    /// Two tensors whose rows the kernel reads interleaved (gate, up: `WMAP_PAIR`).
    Interleave,
    /// q, k, v one after the other, q's and k's rows paired for RoPE (`pairs` a head, 0 for
    /// none: traditional RoPE's pairs are side by side already).
    Qkv { pairs: usize },
}

impl Lin {
    /// One part's words, unquantized as far as the kernels' `Wts` go (a trellis linear's).
    fn words(w: Buffer, n: usize, k: usize, bits: usize) -> Lin {
        Lin {
            w: [w; 3],
            sb: None,
            pairs: 0,
            n,
            k,
            gs: 1,
            bits,
            out_bias: None,
        }
    }

    /// Part `i`'s words, scales and biases as the kernels' `Wts` parameters (`dummy` for the
    /// scales and biases of bfloat16 weights, which have none).
    fn word(&self, i: usize) -> Arg {
        Arg::Buf(self.w[i], 0)
    }
    fn scale(&self, i: usize, dummy: Buffer) -> Arg {
        Arg::Buf(self.sb.map_or(dummy, |(s, _)| s[i]), 0)
    }
    fn bias(&self, i: usize, dummy: Buffer) -> Arg {
        Arg::Buf(self.sb.map_or(dummy, |(_, b)| b[i]), 0)
    }
}

/// Uploads a linear layer made of `parts` (q, k, v; gate, up; or one) laid out as `layout`,
/// quantized as the spec says.
fn upload_lin(
    rt: &mut GpuRuntime,
    s: &GraphSpec,
    parts: &[&GraphLinear],
    layout: Layout,
) -> Result<(Lin, Option<Buffer>)> {
    upload_lin_q(rt, s, s.quant, parts, layout)
}

/// A layer's stacked experts (`[experts, n, c]` arrays) as one linear of `experts * n` rows:
/// views of the model's arrays, reshaped.
fn flat_experts(l: &GraphLinear) -> Result<GraphLinear> {
    let flat = |a: &Array| -> Result<Array> {
        let sh = a.shape();
        match sh.as_slice() {
            [e, n, c] => a.reshape(&[e * n, *c]),
            _ => Err(invalid(
                "graph_decoder",
                format!("experts: {sh:?}, expected [experts, rows, columns]"),
            )),
        }
    };
    Ok(GraphLinear {
        weight: flat(&l.weight)?,
        scales: l.scales.as_ref().map(flat).transpose()?,
        biases: l.biases.as_ref().map(flat).transpose()?,
        bias: None,
        trellis: None,
    })
}

/// [`upload_lin`] with the linear's own quantization `quant`. Each part's words, scales and
/// biases are read in MLX's own buffers where they can be ([`share`]); q's and k's rows are
/// paired for RoPE by the kernel (`WMAP_QKV`), except for an odd number of pairs (a row group
/// of four would straddle the pairs' end), where the host pairs them in a copy. Only the q/k/v
/// biases (a vector) are laid out anew.
fn upload_lin_q(
    rt: &mut GpuRuntime,
    s: &GraphSpec,
    quant: Option<(usize, usize)>,
    parts: &[&GraphLinear],
    layout: Layout,
) -> Result<(Lin, Option<Buffer>)> {
    let missing = || invalid("graph_decoder", "a weight part is missing");
    let d = s.head_dim;
    let heads = [s.heads, s.kv_heads, s.kv_heads];
    // Pairs the host lays out in a copy (`host`), pairs the kernel maps (`kernel`).
    let (host, kernel) = match layout {
        Layout::Qkv { pairs } if pairs % 2 == 1 => (pairs, 0),
        Layout::Qkv { pairs } => (0, pairs),
        _ => (0, 0),
    };
    let place = |rt: &mut GpuRuntime, j: usize, a: &Array| -> Result<Buffer> {
        if host > 0 && j < 2 {
            put(rt, &pair_rope_rows(a, heads[j], d, host)?)
        } else {
            share(rt, a)
        }
    };
    let mut w = Vec::with_capacity(3);
    let mut sc = Vec::with_capacity(3);
    let mut bi = Vec::with_capacity(3);
    let mut n = 0;
    for (j, l) in parts.iter().enumerate() {
        n += l.weight.shape().first().copied().unwrap_or(0) as usize;
        w.push(place(rt, j, &l.weight)?);
        if let Some((_, bits)) = quant {
            let scales = place(rt, j, l.scales.as_ref().ok_or_else(missing)?)?;
            sc.push(scales);
            // mxfp4 has no biases: the kernels never read B (its slots repeat the scales).
            bi.push(if bits == BITS_MXFP4 {
                scales
            } else {
                place(rt, j, l.biases.as_ref().ok_or_else(missing)?)?
            });
        }
    }
    let k = {
        let cols = parts[0].weight.shape().get(1).copied().unwrap_or(0) as usize;
        match quant {
            Some((_, BITS_MXFP4)) => cols * 8,
            Some((_, bits)) => cols * 32 / bits,
            None => cols,
        }
    };
    let three = |v: &[Buffer]| [v[0], v[v.len().min(2) - 1], v[v.len() - 1]];
    let sb = quant.map(|_| (three(&sc), three(&bi)));
    // The q/k/v biases in the rows' order (q's and k's paired as their rows).
    let bias = if parts.iter().all(|l| l.bias.is_some()) {
        let mut laid = Vec::with_capacity(parts.len());
        for (j, l) in parts.iter().enumerate() {
            let b = l.bias.as_ref().ok_or_else(missing)?.reshape(&[-1, 1])?;
            let pairs = host.max(kernel);
            laid.push(if layout != Layout::Plain && j < 2 && pairs > 0 {
                pair_rope_rows(&b, heads[j], d, pairs)?
            } else {
                b
            });
        }
        let refs: Vec<&Array> = laid.iter().collect();
        Some(put(rt, &ops::concatenate(&refs, 0, None)?)?)
    } else {
        None
    };
    Ok((
        Lin {
            w: three(&w),
            sb,
            pairs: kernel,
            n,
            k,
            gs: quant.map_or(1, |q| q.0),
            bits: quant.map_or(16, |q| q.1),
            out_bias: None,
        },
        bias,
    ))
}

/// A trellis-coded linear on the device: the loaded model's words and signs, its row scales
/// as float32, and its launch plan.
#[derive(Debug, Clone, Copy)]
struct TLin {
    words: Buffer,
    scales: Buffer,
    su: Buffer,
    sv: Buffer,
    bias: Option<Buffer>,
    /// `trellis_linear`'s counts (one int a Hadamard block of rows; zero between launches).
    counts: Buffer,
    rows: usize,
    cols: usize,
    hb_rows: usize,
    hb_cols: usize,
    hscale_rows: f32,
    hscale_cols: f32,
    lanes_per_row: u32,
    shared_bytes: u32,
}

/// A trellis layer's q, k and v side by side for `trellis_qkv` (one launch): the words, row
/// scales, signs `su` and biases in `[q; k; v]` row order, the three input sign vectors in
/// turn, the counts of each matrix's Hadamard blocks of rows in turn; `q` and `k` describe the
/// launch (rows, lanes, Hadamard blocks; v's are k's; `q.shared_bytes` is the launch's, the
/// larger of q's and v's where v has its own spec: [`upload_tqkv`]).
#[derive(Debug, Clone, Copy)]
struct TQkv {
    words: Buffer,
    scales: Buffer,
    su: Buffer,
    sv: Buffer,
    bias: Option<Buffer>,
    counts: Buffer,
    q: TLinShape,
    k: TLinShape,
}

/// A trellis linear's launch shape ([`TrellisPlan`]'s).
#[derive(Debug, Clone, Copy)]
struct TLinShape {
    rows: usize,
    cols: usize,
    hb_rows: usize,
    hb_cols: usize,
    hscale_rows: f32,
    hscale_cols: f32,
    lanes_per_row: u32,
    shared_bytes: u32,
}

/// A layer's trellis-coded linears and the step's trellis scratch (shared by every layer).
#[derive(Debug, Clone, Copy)]
struct TrellisLayer {
    spec: TrellisSpec,
    qkv: TQkv,
    o: TLin,
    /// Gate and up side by side for `trellis_gate_up` (`qkv`'s layout; `k` describes up).
    gu: TQkv,
    down: TLin,
    /// The products before the output transform (float32, the widest output), and the gate's
    /// output (bfloat16, intermediate), which the up projection's SwiGLU reads.
    z: Buffer,
    g: Buffer,
}

/// Uploads one trellis-coded linear (`TrellisPlan::new` checked it in `GraphWeights::check`).
fn upload_tlin(
    rt: &mut GpuRuntime,
    spec: &TrellisSpec,
    sw: &TrellisSwitches,
    l: &GraphLinear,
) -> Result<TLin> {
    let (t, scales) = match (&l.trellis, &l.scales) {
        (Some(t), Some(s)) => (t, s),
        _ => {
            return Err(invalid(
                "graph_decoder",
                "a trellis linear's parts are missing",
            ))
        }
    };
    let sh = l.weight.shape();
    let rows = sh.first().copied().unwrap_or(0) as usize;
    let cols = t.sv.size();
    let plan = TrellisPlan::new(spec, rows, cols, rt.sm_count()?, sw)
        .map_err(|e| invalid("graph_decoder", e.to_string()))?;
    Ok(TLin {
        words: put(rt, &l.weight)?,
        scales: put(rt, &scales.astype(Dtype::Float32)?)?,
        su: put(rt, &t.su)?,
        sv: put(rt, &t.sv)?,
        bias: l.bias.as_ref().map(|b| put(rt, b)).transpose()?,
        counts: rt.alloc_from(&vec![0u8; 4 * (rows / plan.hb_rows)])?,
        rows,
        cols,
        hb_rows: plan.hb_rows,
        hb_cols: plan.hb_cols,
        hscale_rows: plan.hscale_rows,
        hscale_cols: plan.hscale_cols,
        lanes_per_row: plan.lanes_per_row,
        shared_bytes: plan.shared_bytes,
    })
}

/// The launch shape of a `(rows, cols)` trellis matrix of `spec` under the model's switches.
fn tlin_shape(
    rt: &GpuRuntime,
    (spec, sw): (&TrellisSpec, &TrellisSwitches),
    rows: usize,
    cols: usize,
) -> Result<TLinShape> {
    let plan = TrellisPlan::new(spec, rows, cols, rt.sm_count()?, sw)
        .map_err(|e| invalid("graph_decoder", e.to_string()))?;
    Ok(TLinShape {
        rows,
        cols,
        hb_rows: plan.hb_rows,
        hb_cols: plan.hb_cols,
        hscale_rows: plan.hscale_rows,
        hscale_cols: plan.hscale_cols,
        lanes_per_row: plan.lanes_per_row,
        shared_bytes: plan.shared_bytes,
    })
}

/// A trellis layer's q, k and v side by side on the device ([`TQkv`]): the loaded arrays
/// concatenated by rows (the signs `sv` in turn), as the affine q/k/v are. With `v_spec` (the
/// value projections' own spec, [`GraphSpec::trellis_v`]; the kernels then decode v's slice
/// with `TRELLIS_V_L`), the launch's dynamic shared memory is the larger of q's plan's and
/// v's (their tables differ; the input is the same); v's lanes a row are k's
/// ([`crate::graph_trellis::v_spec_problem`] held).
fn upload_tqkv(
    rt: &mut GpuRuntime,
    (spec, sw): (&TrellisSpec, &TrellisSwitches),
    v_spec: Option<&TrellisSpec>,
    parts: [&GraphLinear; 3],
) -> Result<TQkv> {
    let mut t = upload_tcat(rt, (spec, sw), &parts)?;
    if let Some(v) = v_spec {
        let vs = tlin_shape(rt, (v, sw), t.k.rows, t.q.cols)?;
        if vs.lanes_per_row != t.k.lanes_per_row {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "trellis v_proj {v:?}: {} lanes a row, k_proj's {}",
                    vs.lanes_per_row, t.k.lanes_per_row
                ),
            ));
        }
        t.q.shared_bytes = t.q.shared_bytes.max(vs.shared_bytes);
    }
    Ok(t)
}

/// Trellis linears of one input side by side on the device ([`TQkv`]): q, k, v (v of k's
/// shape), or gate and up (`k` then describes up). Counts: each part's Hadamard blocks of rows
/// in turn for three parts; one set, shared by both, for two (`trellis_gate_up` counts a
/// block of rows over gate and up).
fn upload_tcat(
    rt: &mut GpuRuntime,
    (spec, sw): (&TrellisSpec, &TrellisSwitches),
    parts: &[&GraphLinear],
) -> Result<TQkv> {
    let missing = || invalid("graph_decoder", "a trellis linear's parts are missing");
    let mut ts = Vec::with_capacity(3);
    for p in parts {
        match (&p.trellis, &p.scales) {
            (Some(t), Some(s)) => ts.push((t, s)),
            _ => return Err(missing()),
        }
    }
    let rows = |p: &GraphLinear| p.weight.shape().first().copied().unwrap_or(0) as usize;
    let cols = ts[0].0.sv.size();
    let (q, k) = (
        tlin_shape(rt, (spec, sw), rows(parts[0]), cols)?,
        tlin_shape(rt, (spec, sw), rows(parts[1]), cols)?,
    );
    let last = rows(parts[parts.len() - 1]);
    let same = if parts.len() == 3 { k.rows } else { q.rows };
    if last != same || ts.iter().any(|t| t.0.sv.size() != cols) {
        return Err(invalid(
            "graph_decoder",
            "trellis q/k/v or gate/up: v's rows are not k's, up's not gate's, or their inputs \
             differ",
        ));
    }
    let cat = |xs: Vec<Array>| -> Result<Array> {
        let refs: Vec<&Array> = xs.iter().collect();
        ops::concatenate(&refs, 0, None)
    };
    let words = cat(parts.iter().map(|p| p.weight.clone()).collect())?;
    let scales = cat(ts
        .iter()
        .map(|t| t.1.astype(Dtype::Float32))
        .collect::<Result<_>>()?)?;
    let su = cat(ts.iter().map(|t| t.0.su.clone()).collect())?;
    let sv = cat(ts.iter().map(|t| t.0.sv.clone()).collect())?;
    let bias = match parts
        .iter()
        .map(|p| p.bias.clone())
        .collect::<Option<Vec<_>>>()
    {
        Some(b) => Some(put(rt, &cat(b)?)?),
        None => None,
    };
    let counts = if parts.len() == 3 {
        q.rows / q.hb_rows + 2 * (k.rows / k.hb_rows)
    } else {
        q.rows / q.hb_rows
    };
    Ok(TQkv {
        words: put(rt, &words)?,
        scales: put(rt, &scales)?,
        su: put(rt, &su)?,
        sv: put(rt, &sv)?,
        bias,
        counts: rt.alloc_from(&vec![0u8; 4 * counts])?,
        q,
        k,
    })
}

/// A trellis layer's linears on the device, and `Lin`s describing their words (rows, inputs,
/// bits) for the parts' byte counts.
fn upload_trellis_layer(
    rt: &mut GpuRuntime,
    (spec, v_spec, sw): (&TrellisSpec, Option<&TrellisSpec>, &TrellisSwitches),
    l: &GraphLayer,
    z: Buffer,
    g: Buffer,
) -> Result<(TrellisLayer, [Lin; 4])> {
    let t = TrellisLayer {
        spec: *spec,
        qkv: upload_tqkv(rt, (spec, sw), v_spec, [&l.q, &l.k, &l.v])?,
        o: upload_tlin(rt, spec, sw, &l.o)?,
        gu: upload_tcat(rt, (spec, sw), &[&l.gate, &l.up])?,
        down: upload_tlin(rt, spec, sw, &l.down)?,
        z,
        g,
    };
    let lin = |w: &TLin, n: usize| Lin::words(w.words, n, w.cols, spec.k as usize);
    let q = TLin {
        words: t.qkv.words,
        rows: t.qkv.q.rows + 2 * t.qkv.k.rows,
        cols: t.qkv.q.cols,
        ..t.o
    };
    let lins = [
        lin(&q, q.rows),
        lin(&t.o, t.o.rows),
        lin(
            &TLin {
                words: t.gu.words,
                rows: 2 * t.gu.q.rows,
                cols: t.gu.q.cols,
                ..t.o
            },
            2 * t.gu.q.rows,
        ),
        lin(&t.down, t.down.rows),
    ];
    Ok((t, lins))
}

impl GraphDecoder {
    /// Whether a CUDA driver and a GPU are there.
    pub fn available() -> bool {
        GpuRuntime::available()
    }

    /// A decoder for the model `spec` describes, over its loaded arrays `weights`, for up to
    /// `capacity` cached positions, with the default [`GraphOptions`]: compiles the kernels,
    /// lays the weights out on the device and captures the step.
    pub fn new(spec: GraphSpec, weights: &GraphWeights, capacity: usize) -> Result<Self> {
        Self::with_options(spec, weights, capacity, &GraphOptions::default())
    }

    /// [`GraphDecoder::new`] with options. The spec and every array are checked before the
    /// GPU is touched.
    pub fn with_options(
        spec: GraphSpec,
        weights: &GraphWeights,
        capacity: usize,
        opts: &GraphOptions,
    ) -> Result<Self> {
        if ![2, 4].contains(&opts.rows_per_warp) {
            return Err(invalid(
                "graph_decoder",
                format!("rows_per_warp {}: must be 2 or 4", opts.rows_per_warp),
            ));
        }
        let rows = opts.rows_per_warp as usize;
        let batch = opts.chunks_in_flight.unwrap_or(8 / opts.rows_per_warp);
        if !(1..=8).contains(&batch) || batch * opts.rows_per_warp > 16 {
            return Err(invalid(
                "graph_decoder",
                format!("chunks_in_flight {batch}: must be 1 to 8, and at most 16 / rows_per_warp"),
            ));
        }
        let early = opts.chunks_before_wait.unwrap_or(batch);
        if !(1..=batch).contains(&early) {
            return Err(invalid(
                "graph_decoder",
                format!("chunks_before_wait {early}: must be 1 to chunks_in_flight ({batch})"),
            ));
        }
        if spec.moe.is_some() && opts.sequences > 1 {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "sequences {}: a mixture-of-experts model decodes one sequence a step in \
                     the graph decoder (each sequence routes to its own experts; batched \
                     expert products are not written yet)",
                    opts.sequences
                ),
            ));
        }
        if spec.trellis.is_some() && opts.sequences > 1 {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "sequences {}: a model of trellis-coded linears decodes one sequence a step \
                     in the graph decoder (its kernels take one input row)",
                    opts.sequences
                ),
            ));
        }
        if !(1..=MAX_SEQUENCES).contains(&opts.sequences) {
            return Err(invalid(
                "graph_decoder",
                format!("sequences {}: must be 1 to {MAX_SEQUENCES}", opts.sequences),
            ));
        }
        // Tiles of nb rows: as few tiles as the kernels' limit allows, the rows spread evenly;
        // up to MMA_TILE_SEQUENCES where they run on the tensor cores (wide_tiles).
        let want = opts.sequences as usize;
        let mma_from = opts.tensor_cores_from.unwrap_or(u32::MAX);
        let ffma_max = Self::max_sequences(&spec);
        let wide_from = wide_from(&spec, opts.wide_tiles, mma_from, ffma_max);
        let (nb, tiles, per_tile) = tile_shape(want, ffma_max, opts.tile_sequences, wide_from);
        let total = nb * tiles;
        if opts.one_cache_slot && tiles > 1 {
            // On session 30's H100, speculation at K = 8 (two tiles) in one slot failed a
            // launch's bounds check; one tile's rows in one slot passed.
            return Err(invalid(
                "graph_decoder",
                format!(
                    "one_cache_slot: {want} rows make {tiles} tiles; one slot takes one tile \
                     ({per_tile} rows for this model)"
                ),
            ));
        }
        if let Some(m) = opts.min_blocks_per_sm.filter(|m| !(1..=4).contains(m)) {
            return Err(invalid(
                "graph_decoder",
                format!("min_blocks_per_sm {m}: must be 1 to 4"),
            ));
        }
        if opts.blocks_per_sm == Some(0) {
            return Err(invalid(
                "graph_decoder",
                "blocks_per_sm 0: must be at least 1",
            ));
        }
        let what = |e: String| invalid("graph_decoder", format!("`{}`: {e}", spec.model_type));
        spec.check().map_err(what)?;
        // The trellis kernels' switches, chosen once: the source, the plans' shared memory and
        // the launches all take this value.
        let trellis = spec.trellis_switches();
        weights.check_with(&spec, &trellis).map_err(what)?;
        if capacity == 0 || capacity > (1 << 24) {
            return Err(invalid(
                "graph_decoder",
                format!("capacity {capacity}: must be 1 to 16777216 positions"),
            ));
        }
        let capacity = capacity.div_ceil(ATTN_CHUNK) * ATTN_CHUNK;
        let mma = nb as u32 >= mma_from;
        let params = SourceParams {
            rows,
            batch,
            early,
            min_blocks: opts.min_blocks_per_sm,
            persist: opts.persistent_step.unwrap_or_else(persist),
            trellis,
            mv_wide: mv_wide(),
            late_norm: mma_late_norm(),
            mv_bits: mv_bits_only(),
        };
        let t0 = std::time::Instant::now();
        let wide = wide_from.is_some_and(|f| nb >= f);
        let (source, kernels) = step_source(&spec, &params, nb, mma, wide);
        let mut rt = GpuRuntime::new(&source, &kernels)?;
        let kernels_s = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let s = &spec;
        let (h, d, i_sz) = (s.hidden, s.head_dim, s.intermediate);
        let w = weights;
        let (embed, _) = upload_lin(&mut rt, s, &[&w.embed], Layout::Plain)?;
        // A trellis-coded head (an untied head the converter coded with the layers).
        let trellis_head = match (&w.head, &s.trellis) {
            (Some(l), Some(t)) if !s.tied && l.trellis.is_some() => {
                Some(upload_tlin(&mut rt, t, &params.trellis, l)?)
            }
            _ => None,
        };
        let head = match (&w.head, &trellis_head) {
            (_, Some(t)) => Lin::words(
                t.words,
                t.rows,
                t.cols,
                s.trellis.map_or(16, |t| t.k as usize),
            ),
            (Some(l), None) if !s.tied => upload_lin(&mut rt, s, &[l], Layout::Plain)?.0,
            _ => embed,
        };
        let final_norm = put(&mut rt, &w.final_norm)?;
        // One cache slot a sequence (or one for all: `one_cache_slot`).
        let slots = if opts.one_cache_slot { 1 } else { total };
        let kv_bytes = slots * s.kv_heads * capacity * d * 2;
        // A trellis model's scratch (one sequence): the products before the output transform
        // and the gate's output.
        let trellis_scratch = match s.trellis {
            Some(_) => {
                let widest = [s.qkv_rows(), h, 2 * i_sz, s.vocab]
                    .into_iter()
                    .max()
                    .unwrap_or(h);
                Some((rt.alloc(widest * 4)?, rt.alloc(i_sz * 2)?))
            }
            None => None,
        };
        // Every layer's keys and values in the runtime's parkable region: a decoder kept
        // between generations gives their memory back while it waits (issue #30's peak:
        // [`GraphDecoder::park`]).
        let kv_bufs = rt.alloc_parkable(&vec![kv_bytes; 2 * w.layers.len()])?;
        let mut layers = Vec::with_capacity(s.layers);
        for (i, (l, rotates)) in w.layers.iter().zip(&s.rope_layers).enumerate() {
            let sliding = s.sliding.get(i).copied().unwrap_or(false);
            let (rope, rope_off) = match &s.local_rope {
                Some(r) if sliding => (r, 2 * (d / 2) * 4),
                _ => (&s.rope, 0),
            };
            let pairs = if s.rope.traditional { 0 } else { rope.pairs() };
            // With q/k norms the rows keep their order: qk_norm_rope rotates after the norm.
            let layout = Layout::Qkv {
                pairs: if *rotates && !s.qk_norm { pairs } else { 0 },
            };
            let post_norms = match (&l.post_attn_norm, &l.post_mlp_norm) {
                (Some(a), Some(m)) if s.sandwich => Some((put(&mut rt, a)?, put(&mut rt, m)?)),
                _ => None,
            };
            let qk_norm = match (&l.q_norm, &l.k_norm) {
                (Some(q), Some(k)) if s.qk_norm => Some((put(&mut rt, q)?, put(&mut rt, k)?)),
                _ => None,
            };
            let tl = match (&s.trellis, trellis_scratch) {
                (Some(ts), Some((z, g))) => Some(upload_trellis_layer(
                    &mut rt,
                    (ts, s.trellis_v.as_ref(), &params.trellis),
                    l,
                    z,
                    g,
                )?),
                _ => None,
            };
            let (qkv, qkv_bias) = match &tl {
                Some((_, x)) => (x[0], None),
                None => upload_lin(&mut rt, s, &[&l.q, &l.k, &l.v], layout)?,
            };
            // A layer with experts: its router, and the experts' stacked projections as one
            // linear each (gate/up interleaved within each expert).
            let mut expert_bias = None;
            let (gu, down, router) = match (&s.moe, &l.router) {
                (Some(m), Some(r)) if s.moe_layer(i) => {
                    let (g, u) = (flat_experts(&l.gate)?, flat_experts(&l.up)?);
                    let eq = m.expert_quant(s.quant);
                    let (mut router, router_bias) =
                        upload_lin_q(&mut rt, s, m.router_quant, &[r], Layout::Plain)?;
                    if m.oai {
                        router.out_bias = router_bias;
                        let flat = |rt: &mut GpuRuntime, l: &GraphLinear| -> Result<Buffer> {
                            let b = l.bias.as_ref().ok_or_else(|| {
                                invalid("graph_decoder", "gpt_oss experts without biases")
                            })?;
                            put(rt, &b.reshape(&[-1])?)
                        };
                        expert_bias = Some([
                            flat(&mut rt, &l.gate)?,
                            flat(&mut rt, &l.up)?,
                            flat(&mut rt, &l.down)?,
                        ]);
                    }
                    (
                        upload_lin_q(&mut rt, s, eq, &[&g, &u], Layout::Interleave)?.0,
                        upload_lin_q(&mut rt, s, eq, &[&flat_experts(&l.down)?], Layout::Plain)?.0,
                        Some(router),
                    )
                }
                _ => match &tl {
                    Some((_, x)) => (x[2], x[3], None),
                    None => (
                        upload_lin(&mut rt, s, &[&l.gate, &l.up], Layout::Interleave)?.0,
                        upload_lin(&mut rt, s, &[&l.down], Layout::Plain)?.0,
                        None,
                    ),
                },
            };
            let sinks = match &l.sinks {
                Some(a) if s.attn_sinks => Some(put(&mut rt, a)?),
                _ => None,
            };
            layers.push(Layer {
                sinks,
                in_norm: put(&mut rt, &l.input_norm)?,
                post_norm: put(&mut rt, &l.post_norm)?,
                qkv,
                qkv_bias,
                nrot: if *rotates { rope.pairs() } else { 0 },
                rope_off,
                window: if sliding { s.sliding_window } else { 0 },
                post_norms,
                qk_norm,
                o: match &tl {
                    Some((_, x)) => x[1],
                    None => {
                        let (mut o, bias) = upload_lin(&mut rt, s, &[&l.o], Layout::Plain)?;
                        if s.o_bias {
                            o.out_bias = bias;
                        }
                        o
                    }
                },
                gu,
                down,
                router,
                expert_bias,
                gates: None,
                kc: kv_bufs[2 * i],
                vc: kv_bufs[2 * i + 1],
                trellis: tl.map(|x| x.0),
            });
        }
        let bytes = |r: &GraphRope| -> Vec<u8> {
            r.inv_freq.iter().flat_map(|f| f.to_le_bytes()).collect()
        };
        let inv = bytes(&s.rope);
        // A model without a local RoPE passes the table again (nrot2 0: never read).
        let inv2 = bytes(s.local_rope.as_ref().unwrap_or(&s.rope));
        let ns = capacity / ATTN_CHUNK;
        // Every buffer holds one row a sequence (row b at b times a row's size).
        // With experts, the chosen experts' activations side by side (NB is 1).
        let (moe_e, moe_k, moe_i) = s
            .moe
            .as_ref()
            .map_or((1, 1, 0), |m| (m.experts, m.top_k, m.intermediate));
        let before_acts = rt.allocated();
        for l in layers.iter_mut().filter(|l| l.router.is_some()) {
            l.gates = Some(rt.alloc(moe_e.max(2) * 2)?);
        }
        let acts = Activations {
            h: rt.alloc(total * h * 2)?,
            qkv: rt.alloc(total * s.qkv_rows() * 2)?,
            attn: rt.alloc(total * s.heads * d * 2)?,
            act: rt.alloc(total * i_sz.max(moe_k * moe_i) * 2)?,
            y: rt.alloc(total * h * 2)?,
            logits: rt.alloc(total * s.vocab * 4)?,
            state: rt.alloc(total * 16)?,
            tokens: rt.alloc(total * capacity * 8)?,
            po: rt.alloc(total * s.heads * ns * d * 4)?,
            pml: rt.alloc(total * s.heads * ns * 2 * 4)?,
            counters: rt.alloc(total * s.heads * 4)?,
            rope: rt.alloc(total * 2 * d * 4)?,
            inv_freq: rt.alloc_from(&inv)?,
            inv_freq2: rt.alloc_from(&inv2)?,
            am_part: rt.alloc(total * (2 * s.vocab.div_ceil(ARGMAX_SLICE) + 2) * 4)?,
            am_ctl: rt.alloc(total * 16)?,
            bias: rt.alloc(total * s.vocab * 4)?,
            gates: rt.alloc(moe_e.max(2) * 2)?,
            sel: rt.alloc(moe_k * 4)?,
            wts: rt.alloc(moe_k * 4)?,
            ey: rt.alloc(if s.moe.is_some() { moe_k * h * 2 } else { 4 })?,
        };
        // Issue #30's peak memory: what the decoder holds beyond the loaded model, by kind
        // (the KV cache as the parkable region holds it: rounded up to the driver's
        // granularity; as plain buffers where the driver cannot park).
        let kv = match rt.parkable_bytes() {
            0 => 2 * s.layers * kv_bytes,
            n => n,
        };
        let scratch = s.trellis.map_or(0, |_| {
            [s.qkv_rows(), h, 2 * i_sz, s.vocab]
                .into_iter()
                .max()
                .unwrap_or(h)
                * 4
                + i_sz * 2
        });
        // Weights (and norms, the q/k/v bias) copied rather than read in MLX's buffers.
        let copied = before_acts.saturating_sub(kv + scratch);
        if std::env::var("MLX_GRAPH_MEMORY").is_ok_and(|v| v == "1") {
            let acts_b = rt.allocated() - before_acts;
            eprintln!(
                "[graph memory] `{}`: weights copied {copied} B, weights read in MLX's buffers {} B, \
                 KV cache {kv} B ({capacity} positions x {total} rows; {}), step buffers \
                 {acts_b} B, trellis scratch {scratch} B; allocated {} B (CUDA graphs and \
                 NVRTC's module not counted)",
                s.model_type,
                rt.borrowed(),
                if rt.parkable_bytes() > 0 {
                    "parkable"
                } else {
                    "not parkable: no virtual memory management here, or it refused the region"
                },
                rt.allocated()
            );
            if s.trellis.is_some() {
                // The one choice the source, the plans and the launches took (the device
                // logs' record of it).
                eprintln!(
                    "[graph memory] `{}`: trellis switches for hidden {h}: {:?}",
                    s.model_type, params.trellis
                );
            }
        }
        let max_k = s.mv_inputs().into_iter().map(|x| x.0).max().unwrap_or(h);
        let wide = wide_from.is_some_and(|f| nb >= f);
        let chunk = wide
            .then(|| mma_chunk(s, nb, opts.min_blocks_per_sm))
            .flatten();
        let shared = mv_staged_per_sequence(s, chunk) * nb as u32;
        let static_shared = if wide {
            mma_static_shared(mma_async())
        } else {
            MV_STATIC_SHARED
        };
        if shared + static_shared > MV_SHARED_MAX {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "`{}`: {nb} sequences need {shared} bytes of shared memory for inputs of \
                     width {max_k}, more than the {MV_SHARED_MAX} a block may take: decode \
                     fewer sequences a step",
                    spec.model_type
                ),
            ));
        }
        mv_shared_opt_in(&mut rt, Module::FIRST, &spec, nb, chunk, &kernels)?;
        if s.trellis.is_some() {
            trellis_shared_limit(&mut rt, &params.trellis, &layers, trellis_head)?;
        }
        let mv_cap = match opts.blocks_per_sm.or_else(blocks_per_sm_env) {
            Some(b) => b.saturating_mul(rt.sm_count()?),
            None => u32::MAX,
        };
        let pdl = opts.programmatic_launch && rt.set_programmatic_launch(true).is_ok();
        let attn_in_output = attn_combine_in_output(&spec, nb, tiles, opts.attn_combine_in_output);
        if attn_in_output {
            // 8-bit codes take the most (a sum a 16-byte chunk of 16 inputs).
            let k = rt.kernel("matvec_attn_out")?;
            rt.set_shared_limit(k, attn_out_shared_bytes(&spec, capacity, 8))?;
        }
        let mut step = Step {
            shape: spec,
            capacity,
            acts,
            layers,
            embed,
            head,
            trellis_head,
            final_norm,
            pdl,
            rows,
            mv_cap,
            nb,
            tiles,
            mma,
            attn_in_output,
            mma_from,
            params,
            fit_rows: opts.fit_rows && !opts.one_cache_slot && nb * tiles > 1,
            wide_from,
            persist: Err(String::new()),
        };
        let weights_s = t1.elapsed().as_secs_f64();
        let t2 = std::time::Instant::now();
        let full = step.full_set();
        step.persist = persist_status(&mut rt, &step, full);
        // Asked for (MLX_GRAPH_PERSIST=1): one line says whether the step took it (the device
        // logs' record of it; GraphDecoder::persistent_step says the same).
        if step.params.persist {
            match &step.persist {
                Ok(p) => eprintln!(
                    "[graph persist] `{}`: persistent step of {} blocks, {} phases, {} B of \
                     shared memory a block; defines: {}; chunks in flight: {}",
                    step.shape.model_type,
                    p.grid,
                    p.phases,
                    p.shared,
                    persist_define(true)
                        .trim_end()
                        .replace("#define ", "")
                        .replace('\n', ", "),
                    persist_chunks(step.rows).map_or("the default".to_string(), |c| c.to_string())
                ),
                Err(why) => eprintln!(
                    "[graph persist] `{}`: {why}{}",
                    step.shape.model_type,
                    if persist_trace_path().is_some() {
                        " (MLX_GRAPH_PERSIST_TRACE: no trace without the persistent step)"
                    } else {
                        ""
                    }
                ),
            }
        }
        // Asked about (MLX_GRAPH_MMA_PAIR set, to anything): one line says whether the
        // constructor's tiles take the items of two rows blocks, or why not (the device logs'
        // record of it).
        if std::env::var_os("MLX_GRAPH_MMA_PAIR").is_some() {
            let mma4 = step.mma && step.shape.tensor_core_weights();
            let wide = step.wide(step.nb);
            eprintln!(
                "[graph mma pair] `{}`: {}",
                step.shape.model_type,
                match mma_pair_in(step.nb, wide, mma4, mma_pair()) {
                    Ok(()) => format!(
                        "tiles of {} rows sum two rows blocks an item (MMA_PAIR; the ring {}, \
                         banks {})",
                        step.nb,
                        if mma_async() { "on" } else { "off" },
                        if mma_banks() { "on" } else { "off" }
                    ),
                    Err(why) => format!("{why}; the tiles' item of one rows block"),
                }
            );
        }
        let graph = match rt.capture(|rt| record_step(rt, &step, full, None, None)) {
            Ok(g) => g,
            Err(_) if pdl => {
                // A driver that cannot capture programmatic launches: plain launches.
                step.pdl = false;
                rt.set_programmatic_launch(false)?;
                rt.capture(|rt| record_step(rt, &step, full, None, None))?
            }
            Err(e) => return Err(e),
        };
        // Graphs of the first 1 .. tiles - 1 tiles: a step runs the tiles up to the last one
        // holding a row that steps.
        let mut tile_graphs = Vec::with_capacity(tiles.saturating_sub(1));
        for n in 1..tiles {
            let set = Set { tiles: n, ..full };
            tile_graphs.push(rt.capture(|rt| record_step(rt, &step, set, None, None))?);
        }
        let profile = StepProfile::from_env(&step.shape.model_type);
        Ok(GraphDecoder {
            rt,
            step,
            pos: 0,
            graph,
            tile_graphs,
            modules: vec![(nb, Module::FIRST)],
            fitted: Vec::new(),
            part_graphs: Vec::new(),
            traced: None,
            batch,
            broken: None,
            pending: VecDeque::new(),
            row_pos: vec![None; slots],
            row_bias: vec![false; total],
            queued_to: 0,
            start_pos: 0,
            limit: 0,
            fail_after: None,
            copied,
            build: BuildTimes {
                kernels_s,
                weights_s,
                capture_s: t2.elapsed().as_secs_f64(),
            },
            profile,
        })
    }

    /// Where the construction spent its time.
    pub fn build_times(&self) -> BuildTimes {
        self.build
    }

    /// Whether an earlier CUDA call failed (the decoder is then unusable).
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// The model's description.
    pub fn spec(&self) -> &GraphSpec {
        &self.step.shape
    }

    /// Positions the cache holds (the requested capacity rounded up to a multiple of 64).
    pub fn capacity(&self) -> usize {
        self.step.capacity
    }

    /// Positions cached so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Whether the step's kernels run with programmatic dependent launch.
    pub fn programmatic_launch(&self) -> bool {
        self.step.pdl
    }

    /// The persistent step (`MLX_GRAPH_PERSIST=1`): `Ok(blocks)` where the step runs as one
    /// persistent kernel of that many blocks (one launch a step), `Err(why)` where
    /// it does not (the switch off, or a step it does not take: the kernels as without it).
    pub fn persistent_step(&self) -> std::result::Result<u32, String> {
        self.step
            .persist
            .as_ref()
            .map(|p| p.grid)
            .map_err(Clone::clone)
    }

    /// 16-byte chunks of each row a lane keeps in flight in the matrix-vector products.
    pub fn chunks_in_flight(&self) -> u32 {
        self.batch
    }

    /// Rows a warp computes at once in the matrix-vector products.
    pub fn rows_per_warp(&self) -> u32 {
        self.step.rows as u32
    }

    /// Device bytes held (copied weights, the cache unless parked, activations).
    pub fn device_bytes(&self) -> usize {
        self.rt.allocated()
    }

    /// Gives the KV cache's device memory back while the decoder waits between generations
    /// (a kept decoder, `mlx_engine::graph::GraphKeep`): what is queued finishes first, and
    /// the cache is forgotten (position 0, every row idle). The kernels, the weights' layout,
    /// the step buffers and the captured graphs stay; until [`GraphDecoder::unpark`], a step
    /// is an error. `Ok(false)`: this driver cannot park (no virtual memory management), the
    /// decoder holds its cache as before. Parking a parked decoder does nothing.
    pub fn park(&mut self) -> Result<bool> {
        if self.rt.parkable_bytes() == 0 {
            return Ok(false);
        }
        self.guard(|me| {
            me.drain()?;
            me.rt.synchronize()?;
            me.rt.park()?;
            me.pos = 0;
            me.limit = 0;
            me.row_pos.iter_mut().for_each(|r| *r = None);
            Ok(true)
        })
    }

    /// Takes the KV cache's device memory again after [`GraphDecoder::park`], at the same
    /// device addresses (the captured graphs stay valid), zeroed. Not parked: nothing to do.
    pub fn unpark(&mut self) -> Result<()> {
        self.guard(|me| me.rt.unpark())
    }

    /// Whether the KV cache's memory is given back ([`GraphDecoder::park`]).
    pub fn parked(&self) -> bool {
        self.rt.parkable_bytes() > 0 && self.rt.parked()
    }

    /// The KV cache's device bytes when it can be parked (the region the driver maps,
    /// rounded up to its granularity); 0 where it cannot.
    pub fn parkable_bytes(&self) -> usize {
        self.rt.parkable_bytes()
    }

    /// Bytes of the model's weights the decoder reads in MLX's own buffers (no copy;
    /// [`GpuRuntime::borrow_array`]); not in [`GraphDecoder::device_bytes`].
    pub fn borrowed_bytes(&self) -> usize {
        self.rt.borrowed()
    }

    /// Bytes of the model's tensors the decoder holds as copies (a weight that could not be
    /// read in MLX's buffers, the norms' weights, the q/k/v bias laid out in the rows' order);
    /// part of [`GraphDecoder::device_bytes`], beside the KV cache and the step's buffers.
    pub fn copied_bytes(&self) -> usize {
        self.copied
    }

    /// The GPU's name.
    pub fn device_name(&self) -> Result<String> {
        self.rt.device_name()
    }

    fn ok(&self) -> Result<()> {
        match &self.broken {
            Some(e) => Err(invalid(
                "graph_decoder",
                format!("an earlier CUDA call failed, the decoder is unusable: {e}"),
            )),
            None => Ok(()),
        }
    }

    fn guard<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.ok()?;
        let r = f(self);
        if let Err(e) = &r {
            if matches!(e, Error::Mlx { .. }) {
                self.broken = Some(e.to_string());
            }
        }
        r
    }

    fn check_token(&self, token: u32) -> Result<()> {
        if token as usize >= self.step.shape.vocab {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "token id {token} outside the vocabulary of {}",
                    self.step.shape.vocab
                ),
            ));
        }
        Ok(())
    }

    fn check_room(&self, n: usize) -> Result<()> {
        if n > self.step.capacity - self.pos {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "{n} more positions do not fit: {} of {} are used",
                    self.pos, self.step.capacity
                ),
            ));
        }
        Ok(())
    }

    /// Forgets the cache (position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Copies a prompt's KV cache in: per layer, keys and values `[1, kv_heads, n, head_dim]`
    /// bfloat16 (what an MLX `KVCache` fetches after the prompt). The position becomes `n`.
    pub fn set_prefix(&mut self, kv: &[(Array, Array)]) -> Result<()> {
        let t = self.profile.is_some().then(std::time::Instant::now);
        self.pos = 0;
        self.pos = self.copy_prefix(0, kv)?;
        if let (Some(p), Some(t)) = (self.profile.as_deref_mut(), t) {
            p.prefix(t);
        }
        Ok(())
    }

    /// Copies a prompt's KV cache into row `row`'s cache slot; returns its length.
    fn copy_prefix(&mut self, row: usize, kv: &[(Array, Array)]) -> Result<usize> {
        let s = &self.step.shape;
        if kv.len() != s.layers {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "set_prefix: {} layers of cache, the model has {}",
                    kv.len(),
                    s.layers
                ),
            ));
        }
        let n = kv
            .first()
            .map_or(0, |(k, _)| k.shape().get(2).copied().unwrap_or(0)) as usize;
        if n > self.step.capacity {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "set_prefix: {n} positions, the capacity is {}",
                    self.step.capacity
                ),
            ));
        }
        let want = [1, s.kv_heads as i32, n as i32, s.head_dim as i32];
        for (l, (k, v)) in kv.iter().enumerate() {
            for (what, a) in [("keys", k), ("values", v)] {
                if a.shape() != want || a.dtype() != Dtype::Bfloat16 {
                    return Err(invalid(
                        "graph_decoder",
                        format!(
                            "set_prefix: layer {l} {what} are {:?} {}, expected {want:?} bfloat16",
                            a.shape(),
                            a.dtype()
                        ),
                    ));
                }
            }
        }
        self.drain()?;
        self.limit = 0;
        let s = &self.step.shape;
        let (cap, d, nkv) = (self.step.capacity, s.head_dim, s.kv_heads);
        let bufs: Vec<(Buffer, Buffer)> = self.step.layers.iter().map(|l| (l.kc, l.vc)).collect();
        let slot = row * nkv * cap * d * 2;
        let row = n * d * 2;
        // Where MLX holds the cache on the GPU (its CUDA build), device to device: each head's
        // n rows to the head's slot. (The host path below moves the cache through host memory,
        // down and up again: 67 MB each way for a Llama-3-8B cache of 512 positions.)
        if mlx_core::Device::gpu().is_available()? {
            // Every layer's arrays evaluated at once (one wait for MLX's stream) and the copies
            // queued on the decoder's stream, not waited for one by one: the steps queued after
            // them see them (the runtime holds the arrays until a wait covers the copies).
            let copies: Vec<_> = bufs
                .iter()
                .zip(kv)
                .flat_map(|(&(kb, vb), (k, v))| [(kb, k), (vb, v)])
                .map(|(b, a)| (b, slot, cap * d * 2, a, row, nkv))
                .collect();
            return self.guard(|me| {
                me.rt.copy_from_arrays_queued(&copies)?;
                Ok(n)
            });
        }
        let host: Vec<(Vec<u8>, Vec<u8>)> = kv
            .iter()
            .map(|(k, v)| Ok((k.to_bytes()?, v.to_bytes()?)))
            .collect::<Result<_>>()?;
        self.guard(|me| {
            for ((kb, vb), (kh, vh)) in bufs.iter().zip(&host) {
                for hd in 0..nkv {
                    let at = slot + hd * cap * d * 2;
                    me.rt.upload(*kb, at, &kh[hd * row..(hd + 1) * row])?;
                    me.rt.upload(*vb, at, &vh[hd * row..(hd + 1) * row])?;
                }
            }
            Ok(n)
        })
    }

    fn set_state(&mut self, token: u32) -> Result<()> {
        self.drain()?;
        self.limit = self.pos;
        self.upload_states(&[(0, token, self.pos)])
    }

    /// Writes the step state of every row: `(row, token, position)` for the rows that step,
    /// the others idle (position -1).
    fn upload_states(&mut self, rows: &[(usize, u32, usize)]) -> Result<()> {
        self.upload_group(rows, false)
    }

    /// [`Self::upload_states`]; with `group`, the rows are one verify group: row r's place
    /// in it is r (the rows share row 0's cache slot: [`GraphDecoder::verify_greedy`]).
    fn upload_group(&mut self, rows: &[(usize, u32, usize)], group: bool) -> Result<()> {
        let n = self.sequences();
        let mut st = vec![0u8; 16 * n];
        for r in 0..n {
            st[16 * r + 4..16 * r + 8].copy_from_slice(&(-1i32).to_le_bytes());
        }
        for &(r, token, pos) in rows {
            st[16 * r..16 * r + 4].copy_from_slice(&(token as i32).to_le_bytes());
            st[16 * r + 4..16 * r + 8].copy_from_slice(&(pos as i32).to_le_bytes());
            // A row of a verify group: its place in the group (the rows before it share the
            // cache slot of the group's first row, row 0: `verify_greedy`).
            if group {
                st[16 * r + 12..16 * r + 16].copy_from_slice(&(r as i32).to_le_bytes());
            }
        }
        self.rt.upload(self.step.acts.state, 0, &st)
    }

    /// The most sequences one launch of a matrix-vector kernel takes for the model `spec`
    /// describes: the kernels hold each sequence's input in shared memory (at most
    /// [`TILE_SEQUENCES`]).
    pub fn max_sequences(spec: &GraphSpec) -> u32 {
        // Mixture-of-experts and trellis-coded models decode one sequence a step
        // (`with_options` refuses more).
        if spec.moe.is_some() || spec.trellis.is_some() {
            return 1;
        }
        let per = spec.mv_shared_per_sequence().max(1);
        ((MV_SHARED_MAX - MV_STATIC_SHARED) / per).clamp(1, TILE_SEQUENCES)
    }

    /// Whether this decoder's tiles multiply the model's weights on the tensor cores
    /// ([`GraphOptions::tensor_cores_from`]; 4-bit weights in groups of 64).
    pub fn tensor_cores(&self) -> bool {
        self.step.mma && self.step.shape.tensor_core_weights()
    }

    /// Sequences a step (rows; [`GraphOptions::sequences`] rounded up to whole tiles).
    pub fn sequences(&self) -> usize {
        self.step.nb * self.step.tiles
    }

    /// Row `row`'s cached positions, or `None` when the row is free.
    pub fn row_position(&self, row: usize) -> Option<usize> {
        self.row_pos.get(row).copied().flatten()
    }

    /// A free row (batched decode), if there is one.
    pub fn free_row(&self) -> Option<usize> {
        self.row_pos.iter().position(|p| p.is_none())
    }

    /// Frees row `row`: its sequence leaves the batch (its cache slot is reused by the next
    /// sequence given the row).
    pub fn release_row(&mut self, row: usize) {
        if let Some(p) = self.row_pos.get_mut(row) {
            *p = None;
        }
    }

    /// Sets row `row`'s logit bias for the greedy sampler (`step_rows_greedy`, whose tokens
    /// and log-probabilities are then those of the biased logits: each `(token, bias)` added
    /// as a bfloat16 value to the bfloat16 logit, the sum rounded to bfloat16, as mlx-lm's
    /// `logit_bias` processor, `logits.at[:, ids].add(values)`, does; a token given twice
    /// takes its last bias). Empty: no bias. Kept until set again (a row's
    /// next sequence sets its own). `step_rows_logits` returns the logits without it.
    pub fn set_row_bias(&mut self, row: usize, bias: &[(u32, f32)]) -> Result<()> {
        self.check_row(row)?;
        for &(t, _) in bias {
            self.check_token(t)?;
        }
        if bias.is_empty() && !self.row_bias[row] {
            return Ok(());
        }
        let vocab = self.step.shape.vocab;
        let mut dense = vec![0f32; vocab];
        for &(t, v) in bias {
            dense[t as usize] = bf16_round(v);
        }
        let bytes: Vec<u8> = dense.iter().flat_map(|v| v.to_le_bytes()).collect();
        let buf = self.step.acts.bias;
        self.guard(|me| me.rt.upload(buf, row * vocab * 4, &bytes))?;
        self.row_bias[row] = !bias.is_empty();
        Ok(())
    }

    /// Starts a sequence in row `row` from a prompt's KV cache (as [`GraphDecoder::set_prefix`]
    /// takes it; none for an empty prefix): the row's position becomes the prompt's length.
    pub fn set_row_prefix(&mut self, row: usize, kv: &[(Array, Array)]) -> Result<()> {
        self.check_row(row)?;
        let n = self.copy_prefix(row, kv)?;
        self.row_pos[row] = Some(n);
        Ok(())
    }

    fn check_row(&self, row: usize) -> Result<()> {
        if row >= self.sequences() {
            return Err(invalid(
                "graph_decoder",
                format!("row {row}: the decoder has {} rows", self.sequences()),
            ));
        }
        // Rows past the cache slots (`one_cache_slot`) verify only.
        if row >= self.row_pos.len() {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "row {row}: the decoder's {} rows share one cache slot (made to verify: \
                     GraphOptions::one_cache_slot), so only row 0 decodes a sequence",
                    self.sequences()
                ),
            ));
        }
        Ok(())
    }

    /// The graph that runs the tiles up to the last one holding one of `rows` (the rows that
    /// step; every tile past it is idle).
    fn graph_for(&self, rows: impl Iterator<Item = usize>) -> Graph {
        let n = rows.map(|r| r / self.step.nb + 1).max().unwrap_or(1);
        self.tile_graphs
            .get(n.wrapping_sub(1))
            .copied()
            .unwrap_or(self.graph)
    }

    /// The kernels a step runs whose rows lie in a window of `rows` rows (from its lowest
    /// row to its highest; 1 to [`GraphDecoder::sequences`]): with
    /// [`GraphOptions::fit_rows`], the fewest tiles that hold them, each of the fewest rows
    /// that spread them, from the window's first row; otherwise the constructor's tiles from
    /// row 0 up to the one holding row `rows - 1` (for a window that starts at row 0).
    pub fn tile_for(&self, rows: usize) -> TileSet {
        let rows = rows.clamp(1, self.sequences());
        let (nb, tiles) = if self.step.fit_rows {
            self.step.fit(rows)
        } else {
            (self.step.nb, rows.div_ceil(self.step.nb))
        };
        TileSet {
            rows_per_tile: nb,
            tiles,
            tensor_cores: self.step.tensor_cores(nb),
        }
    }

    /// The kernel modules (one a tile width) and step graphs this decoder holds: the
    /// constructor's, and the narrower sets compiled and captured since
    /// ([`GraphDecoder::prepare_rows`]).
    pub fn prepared(&self) -> (usize, usize) {
        (
            self.modules.len(),
            1 + self.tile_graphs.len() + self.fitted.len(),
        )
    }

    /// Compiles the kernels and captures the step graphs that steps of up to `rows` rows run
    /// ([`GraphOptions::fit_rows`]; every count from 1 to `rows`, at most
    /// [`GraphDecoder::sequences`]), so that no step pays NVRTC or a capture later. Without
    /// `fit_rows`, nothing to do. Returns how many kernel modules were compiled (or read from
    /// the on-disk cache).
    pub fn prepare_rows(&mut self, rows: usize) -> Result<usize> {
        let before = self.modules.len();
        let rows = rows.min(self.sequences());
        self.guard(|me| {
            // Every window of rows within the first `rows`: lo .. lo + m.
            for (lo, hi) in windows(rows) {
                me.fitted_graph(lo, hi)?;
            }
            Ok(())
        })?;
        Ok(self.modules.len() - before)
    }

    /// The graph a step of rows `lo .. hi` runs (the rows that step lie there): the tiles
    /// [`GraphDecoder::tile_for`] gives for `hi - lo` rows, from row `lo` (or from as far
    /// below it as the rows end: the window stays within the decoder's rows). Compiled and
    /// captured on first use.
    fn fitted_graph(&mut self, lo: usize, hi: usize) -> Result<Graph> {
        let hi = hi.max(lo + 1);
        if !self.step.fit_rows {
            return Ok(self.graph_for(std::iter::once(hi - 1)));
        }
        let Some(key) = self.step.fitted_key(lo, hi) else {
            let (nb, tiles) = self.step.fit(hi - lo);
            return Ok(self.graph_for(std::iter::once(tiles * nb - 1)));
        };
        let (nb, tiles, first) = key;
        if let Some(&(_, g)) = self.fitted.iter().find(|(k, _)| *k == key) {
            return Ok(g);
        }
        let module = match self.modules.iter().find(|(w, _)| *w == nb) {
            Some(&(_, m)) => m,
            None => {
                let mma = nb as u32 >= self.step.mma_from;
                let wide = self.step.wide(nb);
                let (source, kernels) =
                    step_source(&self.step.shape, &self.step.params, nb, mma, wide);
                let module = self.rt.add_module(&source, &kernels)?;
                let chunk = self.step.chunk(nb);
                mv_shared_opt_in(&mut self.rt, module, &self.step.shape, nb, chunk, &kernels)?;
                self.modules.push((nb, module));
                module
            }
        };
        let set = Set {
            nb,
            tiles,
            module,
            first_row: first,
        };
        let step = &self.step;
        let graph = self
            .rt
            .capture(|rt| record_step(rt, step, set, None, None))?;
        self.fitted.push((key, graph));
        Ok(graph)
    }

    /// The graph of a batched step of `rows`: the tiles that hold the window from its lowest
    /// row to its highest.
    fn rows_graph(&mut self, rows: &[(usize, u32, usize)]) -> Result<Graph> {
        let lo = rows.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = rows.iter().map(|r| r.0 + 1).max().unwrap_or(1);
        self.fitted_graph(lo, hi)
    }

    /// Checks a batched step's rows: each given once, started, with room for one position.
    fn check_rows(&self, rows: &[(usize, u32)]) -> Result<Vec<(usize, u32, usize)>> {
        let mut seen = vec![false; self.sequences()];
        let mut out = Vec::with_capacity(rows.len());
        for &(r, t) in rows {
            self.check_row(r)?;
            self.check_token(t)?;
            if std::mem::replace(&mut seen[r], true) {
                return Err(invalid("graph_decoder", format!("row {r} is given twice")));
            }
            let Some(pos) = self.row_pos[r] else {
                return Err(invalid(
                    "graph_decoder",
                    format!("row {r} has no sequence (set_row_prefix starts one)"),
                ));
            };
            if pos >= self.step.capacity {
                return Err(invalid(
                    "graph_decoder",
                    format!(
                        "row {r}: the cache is full: {pos} positions are in use, its capacity \
                         is {}",
                        self.step.capacity
                    ),
                ));
            }
            out.push((r, t, pos));
        }
        Ok(out)
    }

    /// One batched step: each `(row, token)` goes in at its row's position (the other rows
    /// stay as they are); returns each given row's logits (bfloat16 values as float32), in
    /// the order given. Teacher-forced: the rows' next tokens are the caller's.
    pub fn step_rows_logits(&mut self, rows: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        let states = self.check_rows(rows)?;
        let vocab = self.step.shape.vocab;
        self.guard(|me| {
            me.drain()?;
            me.limit = me.pos;
            me.upload_states(&states)?;
            let graph = me.rows_graph(&states)?;
            me.rt.replay(graph, 1)?;
            let mut out = Vec::with_capacity(states.len());
            for &(r, _, pos) in &states {
                let mut b = vec![0u8; vocab * 4];
                me.rt.download(me.step.acts.logits, r * vocab * 4, &mut b)?;
                out.push(
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                );
                me.row_pos[r] = Some(pos + 1);
            }
            Ok(out)
        })
    }

    /// One batched greedy step: each `(row, token)` goes in at its row's position; returns
    /// each given row's greedy next token and its log-probability, in the order given.
    pub fn step_rows_greedy(&mut self, rows: &[(usize, u32)]) -> Result<Vec<(u32, f32)>> {
        let states = self.check_rows(rows)?;
        let cap = self.step.capacity;
        self.guard(|me| {
            me.drain()?;
            me.limit = me.pos;
            me.upload_states(&states)?;
            let graph = me.rows_graph(&states)?;
            me.rt.replay(graph, 1)?;
            let mut out = Vec::with_capacity(states.len());
            for &(r, _, pos) in &states {
                // The row's first sampled slot (its step count starts at 0).
                let mut b = [0u8; 8];
                me.rt.download(me.step.acts.tokens, r * cap * 8, &mut b)?;
                out.push((
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    f32::from_le_bytes([b[4], b[5], b[6], b[7]]),
                ));
                me.row_pos[r] = Some(pos + 1);
            }
            Ok(out)
        })
    }

    /// Verification (speculative decoding): `tokens` go in at the current position and the
    /// ones after it, `tokens[i]` at position + i, as one batched step whose rows share the
    /// sequence's cache (rows 0 .. n each attend to the keys of the rows before them, written
    /// in the same step); returns each row's greedy next token and its log-probability, as n
    /// single steps would ([`GraphDecoder::step_logits`] one token at a time: the same bits
    /// where the rows run on the FFMA kernels, i.e. unless the tensor-core tiles are on). The
    /// position advances by n; [`GraphDecoder::rewind`] drops the rejected rows' positions.
    /// At most [`GraphDecoder::sequences`] tokens.
    pub fn verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<(u32, f32)>> {
        let b = self.verify_rows(tokens)?;
        let cap = self.step.capacity;
        self.guard(|me| {
            me.rt.replay(me.graph_for(0..b.len()), 1)?;
            let mut out = Vec::with_capacity(b.len());
            for r in 0..b.len() {
                let mut t = [0u8; 8];
                me.rt.download(me.step.acts.tokens, r * cap * 8, &mut t)?;
                out.push((
                    u32::from_le_bytes([t[0], t[1], t[2], t[3]]),
                    f32::from_le_bytes([t[4], t[5], t[6], t[7]]),
                ));
            }
            me.pos += b.len();
            Ok(out)
        })
    }

    /// [`GraphDecoder::verify_greedy`] returning each row's logits (bfloat16 values as
    /// float32) instead: teacher-forced.
    pub fn verify_logits(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let b = self.verify_rows(tokens)?;
        let vocab = self.step.shape.vocab;
        self.guard(|me| {
            me.rt.replay(me.graph_for(0..b.len()), 1)?;
            let mut out = Vec::with_capacity(b.len());
            for r in 0..b.len() {
                let mut l = vec![0u8; vocab * 4];
                me.rt.download(me.step.acts.logits, r * vocab * 4, &mut l)?;
                out.push(
                    l.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                );
            }
            me.pos += b.len();
            Ok(out)
        })
    }

    /// Checks a verify group and uploads its states (rows 0 .. n at consecutive positions).
    fn verify_rows(&mut self, tokens: &[u32]) -> Result<Vec<(usize, u32, usize)>> {
        if tokens.is_empty() || tokens.len() > self.sequences() {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "verify: {} tokens, the decoder verifies 1 to {} a step",
                    tokens.len(),
                    self.sequences()
                ),
            ));
        }
        for &t in tokens {
            self.check_token(t)?;
        }
        self.check_room(tokens.len())?;
        let rows: Vec<(usize, u32, usize)> = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| (i, t, self.pos + i))
            .collect();
        self.guard(|me| {
            me.drain()?;
            me.limit = me.pos;
            me.upload_group(&rows, true)
        })?;
        Ok(rows)
    }

    /// Moves the position back to `pos` (at most the current one): the cached positions from
    /// `pos` on are forgotten (the next steps overwrite them). Speculative decoding's rollback
    /// of rejected drafts.
    pub fn rewind(&mut self, pos: usize) -> Result<()> {
        if pos > self.pos {
            return Err(invalid(
                "graph_decoder",
                format!("rewind to {pos}: only {} positions are cached", self.pos),
            ));
        }
        self.guard(|me| {
            me.drain()?;
            me.limit = pos;
            me.pos = pos;
            Ok(())
        })
    }

    /// Runs one step on `token` at the current position (teacher-forced) and returns the
    /// step's logits (bfloat16 values as float32).
    pub fn step_logits(&mut self, token: u32) -> Result<Vec<f32>> {
        self.check_token(token)?;
        self.check_room(1)?;
        let vocab = self.step.shape.vocab;
        self.guard(|me| {
            me.set_state(token)?;
            let graph = me.fitted_graph(0, 1)?;
            me.rt.replay(graph, 1)?;
            me.pos += 1;
            let mut b = vec![0u8; vocab * 4];
            me.rt.download(me.step.acts.logits, 0, &mut b)?;
            Ok(b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
    }

    /// The last step's router logits (bfloat16 values as float32), one `Vec` of `experts` a
    /// layer with experts, in layer order (empty for a model without experts): the choice
    /// the step made, for a test to see how near a tie its top-k was.
    pub fn router_logits(&mut self) -> Result<Vec<Vec<f32>>> {
        let e = self.step.shape.moe.as_ref().map_or(0, |m| m.experts);
        let bufs: Vec<Buffer> = self.step.layers.iter().filter_map(|l| l.gates).collect();
        let mut out = Vec::with_capacity(bufs.len());
        for b in bufs {
            let mut raw = vec![0u8; e * 2];
            self.rt.download(b, 0, &mut raw)?;
            out.push(
                raw.chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
            );
        }
        Ok(out)
    }

    /// Times each [`Part`] of the step alone: a graph of only that part's kernels (captured
    /// once, on the first call), replayed `reps` times at the current position (which must
    /// leave room for one more a row of the first tile), host time per replay. With several
    /// rows a tile, the first tile's rows step as one verify group (row r at the position
    /// plus r, in row 0's cache slot, as [`GraphDecoder::verify_greedy`] runs them; the other
    /// tiles' rows idle). The parts' sum exceeds a whole step's time by what a step overlaps
    /// (programmatic launch) and falls short by the dependencies between parts. The
    /// decoder's state (token, position, cache contents up to the position) is kept.
    pub fn kernel_breakdown(&mut self, reps: u32) -> Result<Vec<PartTime>> {
        if reps == 0 {
            return Err(invalid("kernel_breakdown", "reps must be at least 1"));
        }
        // The parts write the cache at the decoder's positions (the next ones a step
        // writes), which must exist; the device's own position may lag behind it (after
        // set_prefix).
        let rows = self.step.nb;
        self.check_room(rows)?;
        self.guard(|me| {
            let n = me.sequences();
            let mut saved = vec![0u8; 16 * n];
            me.rt.download(me.step.acts.state, 0, &mut saved)?;
            let mut state = saved.clone();
            let token: [u8; 4] = [saved[0], saved[1], saved[2], saved[3]];
            for r in 0..n {
                let (pos, group) = if r < rows {
                    ((me.pos + r) as i32, r as i32)
                } else {
                    (-1, 0)
                };
                let st = &mut state[16 * r..16 * r + 16];
                st[..4].copy_from_slice(&token);
                st[4..8].copy_from_slice(&pos.to_le_bytes());
                st[8..12].copy_from_slice(&0i32.to_le_bytes());
                st[12..].copy_from_slice(&group.to_le_bytes());
            }
            if me.part_graphs.is_empty() {
                for part in Part::ALL {
                    let g = me.rt.capture(|rt| {
                        record_step(rt, &me.step, me.step.full_set(), Some(part), None)
                    })?;
                    me.part_graphs.push((part, g));
                }
            }
            let mut out = Vec::new();
            for (part, g) in me.part_graphs.clone() {
                // At the decoder's position: attention reads the cache up to it (its query is
                // whatever the last step left), q/k/v writes only there, where the next step
                // writes anyway.
                me.rt.upload(me.step.acts.state, 0, &state)?;
                me.rt.replay(g, 1)?;
                me.rt.synchronize()?;
                let t = std::time::Instant::now();
                me.rt.replay(g, reps)?;
                me.rt.synchronize()?;
                let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(reps);
                let (kernels, bytes) = me.part_load(part);
                out.push(PartTime {
                    part,
                    kernels,
                    us_per_step: us,
                    bytes_per_step: bytes,
                });
            }
            me.rt.upload(me.step.acts.state, 0, &saved)?;
            me.rt.synchronize()?;
            Ok(out)
        })
    }

    /// Runs one step on `token` at the current position (teacher-forced, as
    /// [`GraphDecoder::step_logits`]) through a copy of the step that also records its
    /// timeline: one [`TraceRecord`] a block of every q/k/v, attention and matrix-vector
    /// kernel, ordered by entry time. The replayed step itself records nothing. The first
    /// call captures that copy and allocates its 64 MiB buffer.
    pub fn trace_step(&mut self, token: u32) -> Result<Vec<TraceRecord>> {
        self.check_token(token)?;
        self.check_room(1)?;
        self.guard(|me| {
            let (graph, buf) = match me.traced {
                Some(t) => t,
                None => {
                    let buf = me.rt.alloc((TRACE_RECORDS + 1) * 64)?;
                    let g = me.rt.capture(|rt| {
                        record_step(rt, &me.step, me.step.full_set(), None, Some(buf))
                    })?;
                    me.traced = Some((g, buf));
                    (g, buf)
                }
            };
            let mut head = [0u8; 16];
            head[8..].copy_from_slice(&(TRACE_RECORDS as u64).to_le_bytes());
            me.rt.upload(buf, 0, &head)?;
            me.set_state(token)?;
            me.rt.replay(graph, 1)?;
            me.pos += 1;
            me.rt.synchronize()?;
            me.rt.download(buf, 0, &mut head)?;
            let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
            let n = (word(&head[..8]) as usize).min(TRACE_RECORDS);
            let mut raw = vec![0u8; n * 64];
            me.rt.download(buf, 64, &mut raw)?;
            let mut out: Vec<TraceRecord> = raw
                .chunks_exact(64)
                .map(|r| {
                    let w: Vec<u64> = r.chunks_exact(8).map(word).collect();
                    TraceRecord {
                        what: w[0],
                        block: (w[1] as u32, (w[1] >> 32) as u32),
                        sm: w[2] as u32,
                        times: [w[3], w[4], w[5], w[6]],
                        first_data: w[7],
                    }
                })
                .collect();
            out.sort_by_key(|r| r.times[0]);
            Ok(out)
        })
    }

    /// Kernels a step launches for `part`, and the bytes of weights (of cache, for
    /// attention) they read.
    fn part_load(&self, part: Part) -> (usize, usize) {
        let s = &self.step.shape;
        let bits = s.group_and_bits().1;
        let lin_bytes = |l: &Lin| {
            let scales = match l.bits {
                16 => 0,
                BITS_MXFP4 => l.n * (l.k / l.gs),
                _ => 2 * 2 * l.n * (l.k / l.gs),
            };
            // mxfp4: 4-bit codes.
            let bits = if l.bits == BITS_MXFP4 { 4 } else { l.bits };
            l.n * l.k * bits / 8 + scales
        };
        // A layer with experts reads top_k of its experts' rows, and its router.
        let (top_k, experts) = s.moe.as_ref().map_or((1, 1), |m| (m.top_k, m.experts));
        let mlp_bytes = |l: &Layer, lin: &Lin| match l.router {
            Some(_) => lin_bytes(lin) / experts * top_k,
            None => lin_bytes(lin),
        };
        // Kernels a layer's gate/up and down parts launch: with experts, the router, the
        // choice and the experts' gate/up; the experts' down and the weighted sum.
        let moe_layers = self
            .step
            .layers
            .iter()
            .filter(|l| l.router.is_some())
            .count();
        let layers = |f: &dyn Fn(&Layer) -> usize| -> (usize, usize) {
            (self.step.layers.len(), self.step.layers.iter().map(f).sum())
        };
        match part {
            Part::Embed => (1, s.hidden * bits / 8),
            Part::Qkv => {
                // With q/k norms, two kernels a layer (qk_norm_rope reads its 2 head_dim
                // weights, or the projections' widths).
                let qkn = self
                    .step
                    .layers
                    .iter()
                    .filter(|l| l.qk_norm.is_some())
                    .count();
                let per = if s.qk_norm_full {
                    s.heads + s.kv_heads
                } else {
                    2
                };
                let (n, bytes) = layers(&|l| lin_bytes(&l.qkv));
                (n + qkn, bytes + qkn * 2 * per * s.head_dim)
            }
            Part::Attention => layers(&|_| 2 * s.kv_heads * (self.pos + 1) * s.head_dim * 2),
            Part::Output | Part::Down => {
                // With sandwich norms, norm_add after each (reading its hidden weights).
                let sw = self.step.layers.iter().filter(|l| l.post_norms.is_some());
                let (nsw, swb) = (sw.clone().count(), sw.count() * 2 * s.hidden);
                let (n, bytes) = if part == Part::Output {
                    layers(&|l| lin_bytes(&l.o))
                } else {
                    let (n, b) = layers(&|l| mlp_bytes(l, &l.down));
                    (n + moe_layers, b)
                };
                (n + nsw, bytes + swb)
            }
            Part::GateUp => {
                let (n, b) =
                    layers(&|l| mlp_bytes(l, &l.gu) + l.router.as_ref().map_or(0, &lin_bytes));
                (n + 2 * moe_layers, b)
            }
            Part::Head => (1, lin_bytes(&self.step.head)),
            Part::Argmax => (2, s.vocab * 4),
        }
    }

    /// Feeds `tokens` through the decoder (a prompt, without MLX), keeping nothing but the
    /// cache.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        for &t in tokens {
            self.check_token(t)?;
        }
        self.check_room(tokens.len())?;
        self.guard(|me| {
            for &t in tokens {
                me.set_state(t)?;
                let graph = me.fitted_graph(0, 1)?;
                me.rt.replay(graph, 1)?;
                me.pos += 1;
            }
            me.rt.synchronize()
        })
    }

    /// Greedy decoding: `first` (the last token sampled, not yet cached) goes in at the
    /// current position, and `n` tokens come out, each handed to `on_token` as soon as it is
    /// read back (the GPU runs up to 8 steps ahead of the reads).
    pub fn generate(&mut self, first: u32, n: usize, mut on_token: impl FnMut(u32)) -> Result<()> {
        self.check_room(n)?;
        self.start(first, n)?;
        for _ in 0..n {
            on_token(self.next_token()?.0);
        }
        Ok(())
    }

    /// Starts greedy decoding: `first` (the last token sampled, not yet cached) goes in at
    /// the current position; [`GraphDecoder::next_token`] then returns up to `max_steps`
    /// tokens. Reads still queued from an earlier run are dropped first.
    ///
    /// The first steps are queued now (up to 8, as [`GraphDecoder::next_token`] keeps them),
    /// so that the device computes them while the caller handles the token before `first`.
    pub fn start(&mut self, first: u32, max_steps: usize) -> Result<()> {
        self.check_token(first)?;
        self.trace_once(first);
        self.persist_trace_once(first);
        let t = self.profile.is_some().then(std::time::Instant::now);
        self.guard(|me| {
            me.drain()?;
            me.set_state(first)?;
            me.start_pos = me.pos;
            me.queued_to = me.pos;
            me.limit = me.pos.saturating_add(max_steps).min(me.step.capacity);
            Ok(())
        })?;
        self.print_breakdown_once();
        self.profile_step_once();
        self.guard(|me| me.queue_ahead())?;
        if let (Some(p), Some(t)) = (self.profile.as_deref_mut(), t) {
            p.start(t);
        }
        Ok(())
    }

    /// Queues the current run's steps (a graph replay and the read of its token each) until
    /// [`READ_AHEAD`] reads are in flight or every step of the run is queued.
    fn queue_ahead(&mut self) -> Result<()> {
        while self.pending.len() < READ_AHEAD && self.queued_to < self.limit {
            let t = self.profile.is_some().then(std::time::Instant::now);
            let graph = self.fitted_graph(0, 1)?;
            self.rt.replay(graph, 1)?;
            if let (Some(p), Some(t)) = (self.profile.as_deref_mut(), t) {
                p.launched(t);
            }
            let t = self.profile.is_some().then(std::time::Instant::now);
            let slot = self.queued_to - self.start_pos;
            let ticket = self.rt.read_begin(self.step.acts.tokens, slot * 8, 8)?;
            self.pending.push_back(ticket);
            if let (Some(p), Some(t)) = (self.profile.as_deref_mut(), t) {
                p.read_queued(t);
            }
            self.queued_to += 1;
        }
        Ok(())
    }

    /// `MLX_GRAPH_PERSIST_TRACE=PATH` with the persistent step taken: the first run of the
    /// process (`mlx benchmark`'s warm-up) replays the step on `first` at the run's position
    /// [`PS_TRACE_STEPS`] times (the run's own first step then computes it again, the same
    /// values), writes the last one's trace to PATH (`%p`: the process id; a line a block and
    /// phase: `phase kind block sm entry arrival departure` in ns of %globaltimer, then the three
    /// as clock64) and its summary ([`persist_trace_summary`]) to stderr.
    fn persist_trace_once(&mut self, first: u32) {
        static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let Some(path) = persist_trace_path() else {
            return;
        };
        let Ok(p) = &self.step.persist else {
            return;
        };
        let (Some(buf), grid, kinds) = (p.trace, p.grid as usize, p.kinds.clone()) else {
            return;
        };
        if self.check_room(1).is_err() || DONE.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let pos = self.pos;
        let words = (kinds.len() + 1) * grid * PS_TW;
        let r = self.guard(|me| {
            let graph = me.fitted_graph(0, 1)?;
            for _ in 0..PS_TRACE_STEPS {
                me.set_state(first)?;
                me.rt.replay(graph, 1)?;
            }
            me.rt.synchronize()?;
            let mut raw = vec![0u8; words * 8];
            me.rt.download(buf, 0, &mut raw)?;
            Ok(raw)
        });
        self.pos = pos;
        let raw = match r {
            Ok(raw) => raw,
            Err(e) => {
                eprintln!("[graph persist trace] failed: {e}");
                return;
            }
        };
        let w: Vec<u64> = raw
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect();
        let labels = persist_phase_labels(&kinds);
        let mut text = format!(
            "# persistent step trace: {} phases, {grid} blocks; phase kind block sm entry \
             arrival departure (ns) entry_clk arrival_clk departure_clk (the last row: the end)\n",
            kinds.len()
        );
        for i in 0..=kinds.len() {
            let label = labels.get(i).map_or("end", |l| l.as_str());
            for b in 0..grid {
                let r = &w[(i * grid + b) * PS_TW..][..PS_TW];
                text += &format!(
                    "{i} {label} {b} {} {} {} {} {} {} {}\n",
                    r[3], r[0], r[1], r[2], r[4], r[5], r[6]
                );
            }
        }
        let path = trace_file(&path);
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("[graph persist trace] {}: {e}", path.display());
        }
        for line in persist_trace_summary(&kinds, grid, &w).lines() {
            eprintln!("[graph persist trace] {line}");
        }
    }

    /// `MLX_GRAPH_TRACE=PATH`: the first run of the process (`mlx benchmark`'s warm-up)
    /// writes the timeline of its first step ([`GraphDecoder::trace_step`] on `first` at the
    /// run's position, which the run's own first step then computes again, the same values)
    /// to PATH (`%p` in it replaced by the process id), a line a block: `what block_x
    /// block_y sm entry waited prologue end first_data` (`xtask/gpu/trace_summary.py` reads
    /// it).
    fn trace_once(&mut self, first: u32) {
        static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let Some(path) = std::env::var_os("MLX_GRAPH_TRACE").filter(|p| !p.is_empty()) else {
            return;
        };
        if self.check_room(1).is_err() || DONE.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let pos = self.pos;
        let r = self.trace_step(first);
        self.pos = pos;
        let path = trace_file(&path);
        match r {
            Ok(records) => match std::fs::write(&path, trace_lines(&records)) {
                Ok(()) => eprintln!(
                    "[graph trace] `{}`: {} records at position {pos} to {}",
                    self.step.shape.model_type,
                    records.len(),
                    path.display()
                ),
                Err(e) => eprintln!("[graph trace] {}: {e}", path.display()),
            },
            Err(e) => eprintln!("[graph trace] failed: {e}"),
        }
    }

    /// `MLX_GRAPH_STEP_PROFILE`: the first run of the process (`mlx benchmark`'s warm-up)
    /// also times the whole step replayed back to back, without reads, from the run's state
    /// (at most 32 steps, within the run's room): the device's own time a step, for the
    /// profile's lines. The state is put back; the positions those steps wrote are written
    /// again by the run's own steps before any step reads them.
    fn profile_step_once(&mut self) {
        static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if self.profile.is_none() || self.limit < self.pos + 2 {
            return;
        }
        if DONE.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let reps = (self.limit - self.pos).min(32) as u32;
        let bytes = 16 * self.sequences();
        let r = self.guard(|me| {
            let mut saved = vec![0u8; bytes];
            me.rt.download(me.step.acts.state, 0, &mut saved)?;
            let g = me.fitted_graph(0, 1)?;
            me.rt.replay(g, 1)?;
            me.rt.synchronize()?;
            let t = std::time::Instant::now();
            me.rt.replay(g, reps - 1)?;
            me.rt.synchronize()?;
            let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(reps - 1);
            me.rt.upload(me.step.acts.state, 0, &saved)?;
            Ok(us)
        });
        match (r, self.profile.as_deref_mut()) {
            (Ok(us), Some(p)) => p.step_alone_us = Some(us),
            (Err(e), _) => eprintln!("[graph step profile] the step alone: failed: {e}"),
            _ => {}
        }
    }

    /// `MLX_GRAPH_BREAKDOWN=REPS`: the first run of the process prints
    /// [`GraphDecoder::kernel_breakdown`] (each part's time a step, replayed alone `REPS`
    /// times) to stderr, for device calls that measure through `mlx benchmark` (issue #30).
    fn print_breakdown_once(&mut self) {
        // Once a process for each count of rows a tile (bit nb).
        static DONE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let Some(reps) = env_count("MLX_GRAPH_BREAKDOWN") else {
            return;
        };
        let bit = 1u64 << self.step.nb.min(63);
        if DONE.fetch_or(bit, std::sync::atomic::Ordering::Relaxed) & bit != 0 {
            return;
        }
        match self.kernel_breakdown(reps) {
            Ok(parts) => {
                let total: f64 = parts.iter().map(|p| p.us_per_step).sum();
                for p in &parts {
                    eprintln!(
                        "[graph breakdown] `{}` rows {} {:?}: {} kernels, {:.1} us a step, {} B \
                         read ({:.0} GB/s)",
                        self.step.shape.model_type,
                        self.step.nb,
                        p.part,
                        p.kernels,
                        p.us_per_step,
                        p.bytes_per_step,
                        p.bytes_per_step as f64 / p.us_per_step.max(1e-9) / 1e3
                    );
                }
                eprintln!(
                    "[graph breakdown] rows {} parts' sum {total:.1} us a step",
                    self.step.nb
                );
            }
            Err(e) => eprintln!("[graph breakdown] failed: {e}"),
        }
    }

    /// The next greedy token of a run begun with [`GraphDecoder::start`] and its
    /// log-probability (as mlx-lm's sampler computes it: the log-softmax of the bfloat16
    /// logits, rounded to bfloat16). Up to 8 steps are queued ahead of the reads. Past the
    /// cache's capacity, or past the run's `max_steps`, an error says so.
    pub fn next_token(&mut self) -> Result<(u32, f32)> {
        let entered = self.profile.as_deref_mut().map(StepProfile::enter);
        let r = self.next_token_inner();
        if let (Some(p), Some(e), Ok(_)) = (self.profile.as_deref_mut(), entered, &r) {
            p.exit(e);
            // The run's last token: its line.
            if self.queued_to >= self.limit && self.pending.is_empty() {
                p.report();
            }
        }
        r
    }

    fn next_token_inner(&mut self) -> Result<(u32, f32)> {
        self.guard(|me| {
            match me.fail_after {
                Some(0) => {
                    return Err(Error::Mlx {
                        op: "gpurt_replay",
                        message: "[gpurt] a failure injected by inject_failure_after".into(),
                    })
                }
                Some(n) => me.fail_after = Some(n - 1),
                None => {}
            }
            me.queue_ahead()?;
            let Some(t) = me.pending.pop_front() else {
                return Err(invalid(
                    "graph_decoder",
                    if me.pos >= me.step.capacity {
                        format!(
                            "the cache is full: {} positions are in use, its capacity is {}",
                            me.pos, me.step.capacity
                        )
                    } else {
                        format!(
                            "next_token: the run's {} steps are done",
                            me.limit - me.start_pos
                        )
                    },
                ));
            };
            let mut buf = [0u8; 8];
            let w = me.profile.is_some().then(std::time::Instant::now);
            me.rt.read_end(t, &mut buf)?;
            if let (Some(p), Some(w)) = (me.profile.as_deref_mut(), w) {
                p.waited(w);
            }
            me.pos += 1;
            let token = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let logprob = f32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
            Ok((token, logprob))
        })
    }

    /// Makes the `n`-th [`GraphDecoder::next_token`] from now fail as a failed CUDA call does
    /// (the decoder is then unusable): for testing callers' fall-back.
    pub fn inject_failure_after(&mut self, n: usize) {
        self.fail_after = Some(n);
    }

    /// Waits for the reads a run left queued (steps computed but not taken).
    fn drain(&mut self) -> Result<()> {
        // A run that ended before its last step (a stop token): its profile line.
        if let Some(p) = self.profile.as_deref_mut() {
            p.report();
        }
        let mut buf = [0u8; 8];
        while let Some(t) = self.pending.pop_front() {
            self.rt.read_end(t, &mut buf)?;
        }
        Ok(())
    }
}

/// Steps [`GraphDecoder::next_token`] keeps queued ahead of its reads.
const READ_AHEAD: usize = 8;

/// Launches a step's kernels in order, with programmatic dependent launch where it helps: a
/// kernel whose predecessor's grid runs in more than one wave is launched plainly (launched
/// early, its waiting blocks would take the slots the predecessor's later waves need).
struct Recorder<'a> {
    step: &'a Step,
    /// Record only this part's kernels (a breakdown), or all.
    only: Option<Part>,
    /// The timeline's buffer (GraphDecoder::trace_step), or none.
    trace: Option<Buffer>,
    prev_multi_wave: bool,
    /// Tiles recorded: the first `tiles` of the set's (rows past them do not run).
    tiles: usize,
    /// Rows a tile, and the module of the kernels compiled for them.
    nb: usize,
    module: Module,
    /// The first tile's first row.
    first_row: usize,
    /// The persistent step's phases' kernels (matvec, matvec_qkv, attention, matvec_attn_out,
    /// embed, argmax_partial, argmax_pick) where they are collected or replaced, else none.
    phase_kernels: Option<[Kernel; 7]>,
    /// Collect the phases instead of launching anything (persist_build), or none.
    collect: Option<Vec<Phase>>,
    /// Leave the phases to the persistent step (launched in their place, after the last).
    persist: bool,
}

impl Recorder<'_> {
    /// The kernels' timeline argument: the buffer, or a null pointer.
    fn trace_arg(&self) -> Arg {
        self.trace.map_or(Arg::I64(0), |b| Arg::Buf(b, 0))
    }

    /// The recorded set's kernel `name`.
    fn kernel(&self, rt: &GpuRuntime, name: &str) -> Result<Kernel> {
        rt.kernel_in(self.module, name)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        rt: &mut GpuRuntime,
        part: Part,
        k: Kernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[Arg],
    ) -> Result<()> {
        if self.only.is_some_and(|p| p != part) {
            return Ok(());
        }
        let kind = self
            .phase_kernels
            .and_then(|ks| ks.iter().position(|&x| x == k))
            .map(|i| PS_PHASES[i].1);
        // Collecting, a launch of a kernel that is not a phase (`NOT_A_PHASE`) is kept in its
        // place, so that the persistent step is refused rather than run out of order.
        if let Some(c) = &mut self.collect {
            c.push(Phase {
                kind: kind.unwrap_or(NOT_A_PHASE),
                grid: [grid[0], grid[1]],
                shared,
                args: args.to_vec(),
            });
        }
        if self.collect.is_some() || (self.persist && kind.is_some()) {
            return Ok(());
        }
        if self.step.pdl {
            rt.set_programmatic_launch(!self.prev_multi_wave)?;
        }
        rt.launch(k, grid, block, shared, args)?;
        let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
        let resident = rt.resident_blocks(k, block.iter().product(), shared)?;
        self.prev_multi_wave = blocks > resident as u64;
        Ok(())
    }
}

/// `v` rounded to bfloat16 (to nearest, ties to even; NaN stays NaN), as a float32.
fn bf16_round(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let b = v.to_bits();
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}

/// Blocks for a matrix-vector kernel over `n` rows, `rows` a warp: at most one wave of
/// `resident` blocks (the warps stride over the rest, streaming).
fn mv_blocks(n: usize, rows: usize, resident: u32) -> u32 {
    (n.div_ceil(rows).div_ceil(MV_WARPS) as u32).clamp(1, resident.max(1))
}

/// Dynamic shared memory of a matrix-vector kernel over inputs of width `k`: the input as
/// bfloat16 (rounded up to 64 values, its 16-byte slots swizzled within 64-byte groups), then
/// with quantized weights one float32 sum per 16-byte chunk of codes (`128 / bits` inputs).
/// Rounded up to 16 bytes: with several sequences, sequence b's sits at b times this
/// (`mv_row_bytes` in the source).
fn mv_shared_bytes(k: usize, bits: usize) -> u32 {
    let sums = if bits == 16 { 0 } else { k / (128 / bits) * 4 };
    (k.next_multiple_of(64) * 2 + sums).next_multiple_of(16) as u32
}

/// The dynamic shared memory a block may opt in to on sm_90 (227 KiB).
const MV_SHARED_MAX: u32 = 227 * 1024;
/// A bound on the matrix-vector kernels' static shared memory (the tensor-core tiles' partial
/// sums, 4.6 KiB with 8 sequences, 9.9 KiB with 16; under 1 KiB without them).
const MV_STATIC_SHARED: u32 = 11 * 1024;
/// The shared memory of a multiprocessor (sm_90: 228 KiB, 1 KiB of it reserved a block).
const SM_SHARED: u32 = 228 * 1024;
/// The static shared memory of the wide tensor-core tiles' cp.async ring (`MMA_ASYNC` in the
/// source: 8 warps x 6 slots x 640 bytes), besides [`MV_STATIC_SHARED`].
const MMA_RING_SHARED: u32 = 8 * 6 * 640;

/// Whether wide tensor-core tiles stream their weights through the cp.async ring (on by
/// default; `MLX_GRAPH_MMA_ASYNC=0` turns it off: the H100 ran 16 rows at 106.1 steps/s with it
/// against 92.9 without, `results/gpu/2026-12-06-s37-h100`). Read where the step source's
/// defines are chosen and where the tiles' shared memory is sized, so the decoder, `mlx` and
/// the tests alike take it from their environment. The products are bit-equal either way.
fn mma_async() -> bool {
    switch_on("MLX_GRAPH_MMA_ASYNC")
}

/// Whether the wide tensor-core tiles place their staged inputs, chunk sums and partial sums
/// in distinct shared-memory banks (`MMA_BANKS` in the source; `MLX_GRAPH_MMA_BANKS=1`, off by
/// default): at 8B every sequence's staged input is a multiple of 128 bytes long, so an item's
/// B-fragment reads take twice their passes, its chunk sums four times and the epilogue's
/// partial sums eight (`results/gpu/2026-12-06-s37-mmagap`). Read where the step source's
/// defines are chosen, so the decoder, `mlx` and the tests alike take it from their
/// environment. Only addresses move: the products are bit-equal either way, and neither the
/// dynamic shared memory nor the static bound changes.
fn mma_banks() -> bool {
    std::env::var("MLX_GRAPH_MMA_BANKS").is_ok_and(|v| v == "1")
}

/// The step source's define for [`mma_banks`] (`on`: wide tiles of 4-bit weights in groups of
/// 64), empty otherwise (`MMA_BANKS 0`: the tiles' placement as before the switch).
fn mma_banks_define(on: bool) -> &'static str {
    if on {
        "#define MMA_BANKS 1\n"
    } else {
        ""
    }
}

/// Which tensor-core tiles' normed products apply the norm's 1 / rms to their sums at the
/// epilogue (`MMA_LATE_NORM` in the source; [`late_norm_level`] of `MLX_GRAPH_MMA_LATE_NORM`):
/// 1 (the default), `matvec_qkv`'s; 2, also gate/up's and the head's, launched as
/// `matvec_norm` in `matvec`'s place; 0, none. Where all of K is staged, the prologue weights
/// the raw inputs by the norm's weights and sums their squares in one pass over the staged
/// inputs instead of two (session 47's timeline: the normed products' prologues 16.5-18.3 us a
/// block at 16 rows against 7.3 for the output projection's, `results/gpu/2026-12-07-s47`).
/// `matvec`'s machine code stays instruction for instruction as without it at either level.
/// On an H100 (`results/gpu/2026-12-07-s50`), the 8B's 16-row step: level 0 117.1 steps/s
/// (median of three), level 1 118.7 (+1.4%), level 2 116.9; its 5-row tile 166.4, 167.7
/// (+0.8%), 164.2: so level 1 is the default, with `batched_equals_single` and
/// `wide_tiles_equal_narrow_tiles` passing under it there. The products' bits change (tier L3,
/// as the tiles already are against the single-row kernels); every tile width takes it alike,
/// so wide and narrow tiles stay bit-equal. Read once when the decoder is built
/// ([`SourceParams::late_norm`]), so that its tiles' sources and their launches agree, and
/// `mlx`, `mlx serve` and the test binaries take it from their environment.
fn mma_late_norm() -> u8 {
    late_norm_level(std::env::var("MLX_GRAPH_MMA_LATE_NORM").ok().as_deref())
}

/// `MLX_GRAPH_MMA_LATE_NORM`'s level: `0`, `1` or `2`; unset or any other value, the default 1.
fn late_norm_level(v: Option<&str>) -> u8 {
    match v.map(str::trim) {
        Some("0") => 0,
        Some("2") => 2,
        _ => 1,
    }
}

/// Whether every module of the decoder compiles `mv_run` for the model's codes' widths only
/// ([`GraphSpec::matvec_bits`], `MV_BITS`), not for all three (4 and 8 bits, bfloat16): on
/// unless `MLX_GRAPH_MV_BITS=0` ([`mv_bits_on`]). At one width a module is about a third of the
/// code and NVRTC compiles it in a third to a fifth of the time (the one-row module 19.7 ->
/// 6.6 s, the 5-row FFMA tile 56.0 -> 11.5 s on the 2-core build machine), which is what a
/// first `mlx generate` and `mlx serve`'s warm-up wait for on a GPU. The products compiled are
/// the same source, so the same logits (the emulator's steps bit for bit; on an H100 the 8B's
/// greedy tokens and log-probabilities, and gpt_oss's teacher-forced differences, the same);
/// the kernels' registers and schedule are the compiler's anew, with fewer spills: on an H100
/// the 8B 4-bit decoded 356.5 tok/s against 337.6 (+5.6%), the 135M bfloat16 1,534.8 against
/// 1,300.7 (+18%), and `mlx serve`'s warm-up took 30.9 s against 69.7 s
/// (`results/gpu/2026-12-07-s50`). Trellis models keep every width. Read once when the decoder
/// is built ([`SourceParams::mv_bits`]).
fn mv_bits_only() -> bool {
    mv_bits_on(std::env::var("MLX_GRAPH_MV_BITS").ok().as_deref())
}

/// `MLX_GRAPH_MV_BITS`: `0` turns the widths' pruning off; unset or any other value, on.
fn mv_bits_on(v: Option<&str>) -> bool {
    v.map(str::trim) != Some("0")
}

/// The step source's define of [`GraphSpec::matvec_bits`] under [`mv_bits_only`] (not for
/// trellis models), empty otherwise (`MV_BITS` then keeps every width).
fn mv_bits_define(spec: &GraphSpec, on: bool) -> String {
    if on && spec.trellis.is_none() {
        format!("#define MV_BITS {:#x}\n", spec.matvec_bits())
    } else {
        String::new()
    }
}

/// The step source's define for [`mma_late_norm`]'s `level` on tensor-core tiles of 4-bit
/// weights in groups of 64, empty at 0 (`MMA_LATE_NORM 0`: the norm before the products).
fn mma_late_norm_define(level: u8) -> &'static str {
    match level {
        1 => "#define MMA_LATE_NORM 1\n",
        2 => "#define MMA_LATE_NORM 2\n",
        _ => "",
    }
}

/// Whether a module's tiles (`mma4`: tensor-core tiles of 4-bit weights in groups of 64) have
/// `matvec_norm` at [`mma_late_norm`]'s `level`, and launch it for their normed products.
fn matvec_norm_in(mma4: bool, level: u8) -> bool {
    mma4 && level >= 2
}

/// Whether the wide tensor-core tiles sum two rows blocks an item (`MMA_PAIR` in the source;
/// on by default since session 46, `MLX_GRAPH_MMA_PAIR=0` turns it off): a warp's item is one
/// group of 64 inputs of a block's rows blocks i and i + 1 (32 rows), the two A fragments
/// multiplying one read of the B fragments and scaled with one read of the chunk sums, in two
/// independent mma.sync chains (`results/gpu/2026-12-07-s43-mmapair`: session 37 found a
/// warp's item latency-bound). Each rows block keeps its groups' order and the warps' order, so
/// the products are bit-equal either way (the H100's `wide_tiles_equal_narrow_tiles` and
/// `batched_equals_single` under it, `results/gpu/2026-12-07-s46`; there the 8B's 16-row step
/// ran 116.7 steps/s against 105.2 without it, the 5-row verify tile 165.5 against 151.9).
/// Read where the step source's defines are chosen, so the decoder, `mlx` and the tests alike
/// take it from their environment.
fn mma_pair() -> bool {
    switch_on("MLX_GRAPH_MMA_PAIR")
}

/// Whether tiles of `nb` rows take [`mma_pair`]'s items (`on`: the switch): `Ok` where they
/// do, else why not. Wide tensor-core tiles (`wide`) of 4-bit weights in groups of 64
/// (`mma4`), every width of them (16 rows: 2 column tiles; 4 to 8: one). Where a block's rows
/// blocks are odd in number, the kernel runs its last alone, as the item of one rows block.
fn mma_pair_in(nb: usize, wide: bool, mma4: bool, on: bool) -> std::result::Result<(), String> {
    if !on {
        return Err("MLX_GRAPH_MMA_PAIR is 0".to_string());
    }
    if !mma4 {
        return Err(format!(
            "tiles of {nb} rows: not tensor-core tiles of 4-bit weights in groups of 64 \
             (the pair item is the wide tensor-core tiles' only)"
        ));
    }
    if !wide {
        return Err(format!(
            "tiles of {nb} rows: not wide tensor-core tiles (MLX_GRAPH_WIDE_TILES, from \
             tensor_cores_from rows): the narrow tiles keep their item"
        ));
    }
    Ok(())
}

/// The step source's define for [`mma_pair_in`] (`on`), empty otherwise (`MMA_PAIR 0`: the
/// tiles' item of one rows block).
fn mma_pair_define(on: bool) -> &'static str {
    if on {
        "#define MMA_PAIR 1\n"
    } else {
        ""
    }
}

/// `MLX_GRAPH_BLOCKS_PER_SM=N` (N >= 1; unset or anything else: ignored), for A/B runs of the
/// product path: [`GraphOptions::blocks_per_sm`] where the options leave it unset. With fewer
/// blocks of a matrix-vector kernel on a multiprocessor than fit, the next kernel's blocks can
/// be resident beside them and load their weights before their wait (programmatic launch).
/// The FFMA kernels' rows keep their bits (a row group is summed whole by one warp whatever
/// the grid); tensor-core tiles may split K differently (tier L3 either way).
fn blocks_per_sm_env() -> Option<u32> {
    env_count("MLX_GRAPH_BLOCKS_PER_SM")
}

/// A count from the environment for an A/B switch: `key`'s value where it is a whole number
/// of at least 1, none otherwise (unset, 0 or not a number: the switch off).
fn env_count(key: &str) -> Option<u32> {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&n| n > 0)
}

/// A default-on switch of the step source: off only where the variable is `0`.
fn switch_on(key: &str) -> bool {
    std::env::var(key).map_or(true, |v| v != "0")
}

/// Whether the FFMA row kernels (graph_decode.cu's `mv_run`: the one-row step, the FFMA tiles
/// and speculative decoding's verify rows) keep each item's scales and biases as loaded and
/// read them where the item is summed (on by default; `MLX_GRAPH_MV_ASYNC=0` turns it off: the
/// H100 ran the 8B's one-row step at 340.7 steps/s with it against 300.3 without,
/// `results/gpu/2026-12-06-s37-h100`). Read where the step source's defines are chosen, so the
/// decoder, `mlx` and the tests alike take it from their environment. Every output is
/// bit-equal either way.
fn mv_async() -> bool {
    switch_on("MLX_GRAPH_MV_ASYNC")
}

/// The step source's define for [`mv_async`] (`on`), empty when off (the source then is
/// the one without the define).
fn mv_async_define(on: bool) -> &'static str {
    if on {
        "#define MV_ASYNC 1\n"
    } else {
        ""
    }
}

/// Whether the FFMA row kernels (`mv_run`) load a normed product's norm weights before the
/// wait for the previous kernel, with their first weights, and `embed` loads its 16 values a
/// thread before storing them (`MLX_GRAPH_EARLY_PROLOGUE=1`; off otherwise): the prologue past
/// the wait then waits for its input alone, and embed for one round trip. Read where the step
/// source's defines are chosen, so the decoder, `mlx` and the tests alike take it from their
/// environment. The same values, normed the same way: every output is bit-equal either way
/// (`results/gpu/2026-12-06-s37-stepgap`).
fn early_prologue() -> bool {
    std::env::var("MLX_GRAPH_EARLY_PROLOGUE").is_ok_and(|v| v == "1")
}

/// The step source's define for [`early_prologue`] (`on`), empty when off (the source then is
/// the one without the define).
fn early_prologue_define(on: bool) -> &'static str {
    if on {
        "#define MV_EARLY_NORM 1\n#define EMBED_BATCH 16\n"
    } else {
        ""
    }
}

/// Whether the FFMA tiles of several sequences (graph_decode.cu's `mv_run` at `NB` > 1: batched
/// rows, speculation's verify rows) stream their items as the one-row kernel does, `MV_BATCH` a
/// trip from constant register slots, instead of one a trip with the slots moved down
/// (`MLX_GRAPH_MV_NB=1`; off otherwise: +0.8% at 5 rows of the 8B on an H100, within noise,
/// `results/gpu/2026-12-06-s39-h100`, `results/gpu/2026-12-06-s39-verify`). Read where the step source's defines are chosen, so the
/// decoder, `mlx` and the tests alike take it from their environment. The same items summed in
/// the same order: every output is bit-equal either way.
fn mv_nb() -> bool {
    std::env::var("MLX_GRAPH_MV_NB").is_ok_and(|v| v == "1")
}

/// The step source's define for [`mv_nb`] (`on`) in tiles of `nb` > 1 rows, empty otherwise (a
/// one-row step's source is the one without the switch).
fn mv_nb_define(nb: usize, on: bool) -> &'static str {
    if on && nb > 1 {
        "#define MV_NB 1\n"
    } else {
        ""
    }
}

/// A trace's file: `path` with `%p` replaced by the process id (one file a process, where
/// several share the variable: `MLX_GRAPH_TRACE`, `MLX_GRAPH_PERSIST_TRACE`).
fn trace_file(path: &std::ffi::OsStr) -> std::path::PathBuf {
    std::path::PathBuf::from(
        path.to_string_lossy()
            .replace("%p", &std::process::id().to_string()),
    )
}

/// Steps replayed for the persistent step's trace ([`GraphDecoder::persist_trace_once`]); the
/// last one's is kept (the earlier ones warm the caches).
const PS_TRACE_STEPS: usize = 4;

/// The phases' names for the trace: `embed`, `qkv`, `attention`, `attn_out`, `argmax_partial`,
/// `argmax_pick`, and the plain products by where they stand: `o` after attention, `gate_up`
/// after the output projection, `down` after gate/up, `head` after the last down projection.
fn persist_phase_labels(kinds: &[i64]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(kinds.len());
    for &k in kinds {
        let prev = out.last().map_or("", |s| s.as_str());
        let label = match k {
            0 => "embed",
            2 => "qkv",
            3 => "attention",
            11 => "attn_out",
            4 => "argmax_partial",
            5 => "argmax_pick",
            1 => match prev {
                "attention" => "o",
                "o" | "attn_out" => "gate_up",
                "gate_up" => "down",
                "down" => "head",
                _ => "matvec",
            },
            _ => "?",
        };
        out.push(label.to_string());
    }
    out
}

/// The summary of one persistent step's trace (`w`: `(kinds.len() + 1) grid PS_TW` words, as
/// graph_decode.cu's `persist_step` writes them given a trace): per phase, from the last
/// departure of its barrier (D) to the last departure of the next (the step's end after the
/// last phase): its span, each block's work (D to the block's next arrival, or its end: min,
/// median, max over the blocks), D to the blocks' entry into the next phase (median: the
/// phase's work and its function's return; the rest of the work, up to the arrival, is the next
/// phase's call, table row and early loads, or with PS_SPLIT, where the block arrives before it
/// returns, negative), the next barrier (its last arrival to its last departure) and the median
/// block's own departure-to-arrival in clock64 cycles; then the sums by kind
/// (`persist_phase_labels`) and the whole step. Times in microseconds.
fn persist_trace_summary(kinds: &[i64], grid: usize, w: &[u64]) -> String {
    let n = kinds.len();
    if grid == 0 || n == 0 || w.len() < (n + 1) * grid * PS_TW {
        return "no trace".into();
    }
    let at = |i: usize, b: usize, j: usize| w[(i * grid + b) * PS_TW + j] as f64;
    let us = |ns: f64| ns / 1000.0;
    let max_of = |i: usize, j: usize| (0..grid).map(|b| at(i, b, j)).fold(f64::MIN, f64::max);
    let min_of = |i: usize, j: usize| (0..grid).map(|b| at(i, b, j)).fold(f64::MAX, f64::min);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let labels = persist_phase_labels(kinds);
    // (label, span, work max, barrier, work median, entry median)
    let mut rows = Vec::with_capacity(n);
    let mut text = String::new();
    for (i, label) in labels.iter().enumerate() {
        let d = max_of(i, 2);
        let entry = |b: usize| at(i + 1, b, 0) - d;
        let (next_end, barrier, first_out, ends, cycles): (f64, f64, f64, Vec<f64>, Vec<f64>) =
            if i + 1 < n {
                let a = max_of(i + 1, 1);
                (
                    max_of(i + 1, 2),
                    max_of(i + 1, 2) - a,
                    min_of(i + 1, 2) - a,
                    (0..grid).map(|b| at(i + 1, b, 1)).collect(),
                    (0..grid).map(|b| at(i + 1, b, 5) - at(i, b, 6)).collect(),
                )
            } else {
                (
                    max_of(n, 0),
                    0.0,
                    0.0,
                    (0..grid).map(|b| at(n, b, 0)).collect(),
                    (0..grid).map(|b| at(n, b, 4) - at(i, b, 6)).collect(),
                )
            };
        let work: Vec<f64> = ends.iter().map(|e| e - d).collect();
        let wmin = work.iter().copied().fold(f64::MAX, f64::min);
        let wmax = work.iter().copied().fold(f64::MIN, f64::max);
        let wmed = median(work);
        let cmed = median(cycles);
        let emed = median((0..grid).map(entry).collect());
        text += &format!(
            "phase {i:3} {:<14} span {:7.2}  work min {:6.2} med {:6.2} max {:6.2}  entry med \
             {:6.2}  barrier {:5.2} (first out {:5.2})  block cycles med {:.0}\n",
            label,
            us(next_end - d),
            us(wmin),
            us(wmed),
            us(wmax),
            us(emed),
            us(barrier),
            us(first_out),
            cmed
        );
        rows.push((
            label.clone(),
            us(next_end - d),
            us(wmax),
            us(barrier),
            us(wmed),
            us(emed),
        ));
    }
    let mut by_kind: Vec<(String, usize, [f64; 5])> = Vec::new();
    for (l, span, wmax, bar, wmed, emed) in &rows {
        let v = [*span, *wmax, *bar, *wmed, *emed];
        match by_kind.iter_mut().find(|k| &k.0 == l) {
            Some(k) => {
                k.1 += 1;
                for (a, b) in k.2.iter_mut().zip(v) {
                    *a += b;
                }
            }
            None => by_kind.push((l.clone(), 1, v)),
        }
    }
    for (l, c, [span, wmax, bar, wmed, emed]) in &by_kind {
        text += &format!(
            "kind {l:<14} x{c:<3} span {span:8.2} us ({:.2} a phase)  work max {wmax:8.2}  \
             work med {wmed:8.2}  entry med {emed:8.2}  barrier {bar:7.2}\n",
            span / *c as f64
        );
    }
    let start = min_of(0, 0);
    let first_d = max_of(0, 2);
    let end = max_of(n, 0);
    let (sum_span, sum_bar) = rows.iter().fold((0.0, 0.0), |(s, b), r| (s + r.1, b + r.3));
    // clock64 against %globaltimer over block 0's step (its SM's clock in GHz).
    let ghz = (at(n, 0, 4) - at(0, 0, 4)) / (at(n, 0, 0) - at(0, 0, 0)).max(1.0);
    text += &format!(
        "step {:.2} us: entry to the first departure {:.2}, phases {sum_span:.2} (barriers \
         {sum_bar:.2}), {n} phases, {grid} blocks, {:.2} us a phase; block 0 clock {ghz:.3} GHz\n",
        us(end - start),
        us(first_d - start),
        sum_span / n as f64
    );
    text
}

/// Whether one-row steps run as one persistent kernel (`MLX_GRAPH_PERSIST=1`, or `2`:
/// [`persist_release_acquire`]; off otherwise):
/// graph_decode.cu's `persist_step` runs the whole step (embed, each layer's row and attention
/// kernels, the head, the greedy sampler's pair) as phases of one grid of co-resident blocks
/// separated by a grid barrier: one launch a step instead of ~5 a layer (the boundaries between them, not the weights, are
/// a small model's step: issue #30's 135M target). Read where the step source's defines are
/// chosen and where the decoder is built, so the decoder, `mlx` and the tests alike take it
/// from their environment. Each phase runs its kernel's own code: every output is bit-equal
/// either way. Where [`persist_spec`] or [`persist_build`] do not allow it, the switch does
/// nothing ([`GraphDecoder::persistent_step`] says which). Off by default: measured slower
/// than the kernels on an H100 (results/gpu/2026-12-06-s40-h100/, call 3).
fn persist() -> bool {
    std::env::var("MLX_GRAPH_PERSIST").is_ok_and(|v| v == "1" || v == "2")
}

/// `MLX_GRAPH_PERSIST=2`: the persistent step's grid barrier orders by a release atomic and
/// acquire polls alone (`PS_BARRIER_RA`) instead of fences around a relaxed atomic (as
/// cooperative groups' grid sync), for A/B on a device. The same bits either way.
fn persist_release_acquire() -> bool {
    std::env::var("MLX_GRAPH_PERSIST").is_ok_and(|v| v == "2")
}

/// Why a step of `spec` (tiles of `nb` rows, `mma`: on the tensor cores) cannot run as the
/// persistent step, or none: the llama family's one-row FFMA steps (bfloat16 or affine
/// weights, tied or untied heads) whose every kernel besides embed and the greedy sampler is a
/// row product or attention.
fn persist_spec(spec: &GraphSpec, nb: usize, mma: bool) -> Option<&'static str> {
    if nb != 1 || mma {
        Some("one row a step on the FFMA kernels only")
    } else if spec.qk_norm || spec.sandwich || spec.post_only {
        Some("not with q/k norms, sandwich or post norms (their own kernels)")
    } else if spec.moe.is_some() || spec.trellis.is_some() {
        Some("not with experts or trellis-coded weights")
    } else if spec.attn_sinks || spec.o_bias {
        Some("not with attention sinks or a biased output projection")
    } else {
        None
    }
}

/// `MLX_GRAPH_PERSIST_TRACE=PATH`: the persistent step records its timeline (each block's entry,
/// barrier arrival and departure a phase, into a buffer its launch is given: no define, the
/// same compiled source as without) and the first run of the process writes one step's to PATH
/// and its summary to stderr ([`GraphDecoder::persist_trace_once`]).
fn persist_trace_path() -> Option<std::ffi::OsString> {
    std::env::var_os("MLX_GRAPH_PERSIST_TRACE").filter(|p| !p.is_empty())
}

/// The persistent step's levers (session 41, issue #30), each a define of its own, each the
/// same bits: `MLX_GRAPH_PERSIST_SPLIT=1` (`PS_SPLIT`: a block arrives at the barrier as soon as
/// its phase's work is done and waits after the next phase's early loads),
/// `MLX_GRAPH_PERSIST_POLL=1` (`PS_POLL_RELAXED`: relaxed polls, then one acquire load with
/// `=2` or the fence with `=1`),
/// `MLX_GRAPH_PERSIST_MIN_BLOCKS=2` (`PS_MIN_BLOCKS 2`: two blocks an SM, 128 registers),
/// `MLX_GRAPH_PERSIST_SMEM=1` ([`persist_smem_table`]), `MLX_GRAPH_PERSIST_LOOP=1`
/// ([`persist_loop`]).
fn persist_levers() -> String {
    let on = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
    let mut d = String::new();
    if on("MLX_GRAPH_PERSIST_SPLIT") {
        d += "#define PS_SPLIT 1\n";
    }
    if on("MLX_GRAPH_PERSIST_POLL") {
        d += "#define PS_POLL_RELAXED 1\n";
    }
    if persist_smem_table() {
        d += "#define PS_SMEM_TABLE 1\n";
    }
    if std::env::var("MLX_GRAPH_PERSIST_MIN_BLOCKS").is_ok_and(|v| v == "2") {
        d += "#define PS_MIN_BLOCKS 2\n";
    }
    if persist_loop() {
        d += "#define PS_LOOP 1\n";
    }
    d
}

/// `MLX_GRAPH_PERSIST_LOOP=1` (`PS_LOOP`, session 42, issue #30): the persistent step as a layer
/// loop with each phase's body inlined in its fixed place (embed; a layer's q/k/v, attention
/// and three row products; the head; the argmax pair) instead of a loop calling each phase
/// through a table of functions (no call a phase: no ABI register saves and restores). Only for
/// a step of that shape ([`persist_loop_shape`]; elsewhere the kernels run and
/// [`GraphDecoder::persistent_step`] says why). The same bits. Off by default: not measured.
fn persist_loop() -> bool {
    std::env::var("MLX_GRAPH_PERSIST_LOOP").is_ok_and(|v| v == "1")
}

/// Why the phases' kernels (`kinds`, `PS_PHASES` numbers in the step's order) are not the
/// layer loop's shape (`PS_LOOP`: embed; per layer q/k/v, attention, the output projection,
/// gate/up and down as `matvec`; the head as `matvec`; argmax_partial, argmax_pick), or none.
fn persist_loop_shape(kinds: &[i64]) -> Option<String> {
    const LAYER: [i64; 5] = [2, 3, 1, 1, 1];
    let n = kinds.len();
    if n < 9 || (n - 4) % 5 != 0 {
        return Some(format!(
            "MLX_GRAPH_PERSIST_LOOP: {n} phases, not 4 + 5 a layer (embed, the layers' five, \
             the head, the argmax pair)"
        ));
    }
    let layers = &kinds[1..n - 3];
    if kinds[0] != 0 || kinds[n - 3..] != [1, 4, 5] {
        return Some(
            "MLX_GRAPH_PERSIST_LOOP: the step does not begin with embed and end with the head \
             and the argmax pair"
                .into(),
        );
    }
    if let Some((l, got)) = layers.chunks(5).enumerate().find(|(_, c)| *c != LAYER) {
        return Some(format!(
            "MLX_GRAPH_PERSIST_LOOP: layer {l}'s phases are {got:?}, not q/k/v, attention and \
             three row products {LAYER:?} (an output projection that combines attention, \
             MLX_GRAPH_ATTN_COMBINE=output, is another kernel)"
        ));
    }
    None
}

/// Bytes the layer loop (`PS_LOOP`) keeps its state in, past the table in the block's shared
/// memory (graph_decode.cu's `PsLoopState`, at most 64).
const PS_LOOP_STATE_BYTES: u32 = 64;

/// `MLX_GRAPH_PERSIST_SMEM=1` (`PS_SMEM_TABLE`): each block of the persistent step copies its
/// table and the phases' functions into shared memory when the step begins (`phases`
/// `(PS_WORDS + 1)` words a block more; where that does not fit, the kernels run).
fn persist_smem_table() -> bool {
    std::env::var("MLX_GRAPH_PERSIST_SMEM").is_ok_and(|v| v == "1")
}

/// `MLX_GRAPH_PERSIST_BLOCKS=N`: the persistent step's grid at most N blocks (fewer arrivals a
/// barrier; the same bits: each row group is summed whole by one warp whatever the grid).
fn persist_blocks_cap() -> Option<u32> {
    env_count("MLX_GRAPH_PERSIST_BLOCKS")
}

/// `MLX_GRAPH_PERSIST_CHUNKS=N` (1 to 8, at most 16 / `rows` rows a warp): with the persistent
/// step on, its source's chunks in flight a lane and chunks loaded before the wait (`MV_BATCH`,
/// `MV_EARLY`) are N (the default 4; its phase functions have 255 registers): at 135M, down's
/// row group (K 1,536: 6 chunks a lane) all loaded before the barrier. The same bits (the loads'
/// order is not the sums'). The kernels of that source take it too (part graphs, traces).
fn persist_chunks(rows: usize) -> Option<u32> {
    env_count("MLX_GRAPH_PERSIST_CHUNKS").filter(|&c| c <= 8 && c as usize * rows <= 16)
}

/// The step source's defines for the persistent step (`on`), empty otherwise (the source then
/// is the one without it: no persistent kernel compiled).
fn persist_define(on: bool) -> String {
    if !on {
        return String::new();
    }
    let mut d = "#define GRAPH_PERSIST 1\n".to_string();
    if persist_release_acquire() {
        d += "#define PS_BARRIER_RA 1\n";
    }
    d + &persist_levers()
}

/// The persistent step's kernels: the step, and the table's writer.
const PERSIST_KERNELS: [(&str, u32); 2] = [("persist_step", 5), ("persist_fill", 33)];
/// Words a phase of the table (`PS_WORDS` in the source): the kernel, its grid's x and y, and
/// up to 29 arguments (matvec_qkv's).
const PS_WORDS: usize = 32;
/// The phases' kernels and their numbers in the source (`PS_MATVEC`, `PS_QKV`, `PS_ATTENTION`,
/// `PS_ATTN_OUT`, `PS_EMBED`, `PS_ARGMAX_PARTIAL`, `PS_ARGMAX_PICK`), in
/// [`Recorder::phase_kernels`]' order. No `matvec_norm`: it is compiled for tensor-core tiles
/// alone, which never run as the persistent step ([`persist_spec`]).
const PS_PHASES: [(&str, i64); 7] = [
    ("matvec", 1),
    ("matvec_qkv", 2),
    ("attention", 3),
    ("matvec_attn_out", 11),
    ("embed", 0),
    ("argmax_partial", 4),
    ("argmax_pick", 5),
];
/// A recorded launch no phase runs ([`persist_build`] then refuses the persistent step).
const NOT_A_PHASE: i64 = -1;
/// A half block's attention shared memory in the persistent step (`PS_ATTN_FLOATS` floats).
const PS_ATTN_BYTES: u32 = (128 + ATTN_CHUNK as u32 + 8 * 128 + 4 + 4) * 4;

/// A phase of the persistent step as the recorder saw its launch: the kernel (`PS_PHASES`), its
/// grid's x and y, its dynamic shared memory and its arguments.
struct Phase {
    kind: i64,
    grid: [u32; 2],
    shared: u32,
    args: Vec<Arg>,
}

/// The persistent step of a set of kernels (`module`, first row `first_row`): its table of
/// `phases` phases and its barrier's counter (zeroed once: it only grows), its grid (the SMs
/// times the blocks of 256 threads an SM holds at `shared` bytes), and where the attention
/// halves' shared memory begins (`attn_at`: past the row phases').
#[derive(Debug, Clone)]
struct PersistStep {
    module: Module,
    first_row: usize,
    table: Buffer,
    phases: usize,
    counter: Buffer,
    grid: u32,
    shared: u32,
    attn_at: u32,
    /// The phases' kernels in order (`PS_PHASES` numbers), for the trace's summary.
    kinds: Vec<i64>,
    /// `MLX_GRAPH_PERSIST_TRACE`: the step's trace (`(phases + 1) grid PS_TW` words), or none.
    trace: Option<Buffer>,
}

/// Words a phase and block of the persistent step's trace (`PS_TW`): entry, arrival, departure
/// (%globaltimer, ns), SM, the same three as clock64, one unused.
const PS_TW: usize = 8;

/// Whether the FFMA tiles of several sequences run `matvec` and `matvec_qkv` in blocks of 512
/// threads at 128 registers a thread (`MLX_GRAPH_MV_WIDE=1`; off otherwise): 16 warps a
/// multiprocessor over one copy of the inputs, 4 a scheduler where the 256-thread blocks'
/// 245 registers leave 2 (`results/gpu/2026-12-06-s40-verify512`). Read once when the decoder is
/// built ([`SourceParams::mv_wide`]), so that its tiles' sources and their launches agree, and
/// `mlx`, `mlx serve` and the test binaries take it from their environment. The same sums in
/// the same order: every output is bit-equal either way.
fn mv_wide() -> bool {
    std::env::var("MLX_GRAPH_MV_WIDE").is_ok_and(|v| v == "1")
}

/// Whether the module of tiles of `nb` rows (`mma`: on the tensor cores) takes [`mv_wide`]
/// (`on`): FFMA tiles of several rows (the source's `MV_WIDE_ON`).
fn mv_wide_in(nb: usize, mma: bool, on: bool) -> bool {
    on && nb > 1 && !mma
}

/// The threads of a `matvec` / `matvec_qkv` block in a module of tiles of `nb` rows: 512 with
/// [`mv_wide_in`] (`on`: the decoder's [`SourceParams::mv_wide`]), [`MV_THREADS`] otherwise.
fn mv_threads(nb: usize, mma: bool, on: bool) -> u32 {
    if mv_wide_in(nb, mma, on) {
        2 * MV_THREADS
    } else {
        MV_THREADS
    }
}

/// The static shared memory bound of a wide tensor-core tile's kernels (`ring`: with the
/// cp.async ring).
fn mma_static_shared(ring: bool) -> u32 {
    MV_STATIC_SHARED + if ring { MMA_RING_SHARED } else { 0 }
}

/// The chunks of K a tensor-core tile stages are multiples of this many inputs (a group of 64
/// for each of a block's 8 warps: `MMA_KC` in the source).
const MMA_KC_STEP: usize = 64 * 8;

fn opt(b: Option<Buffer>, dummy: Buffer) -> Arg {
    Arg::Buf(b.unwrap_or(dummy), 0)
}

/// A matrix-vector product's launch: `out = W x` with `x` (normed by `norm` first when given),
/// `res` added when given, `mode` the kernel's flags.
#[allow(clippy::too_many_arguments)]
fn matvec(
    rec: &mut Recorder,
    rt: &mut GpuRuntime,
    part: Part,
    lin: &Lin,
    x: Buffer,
    norm: Option<Buffer>,
    res: Option<Buffer>,
    out: Buffer,
    mode: i64,
) -> Result<()> {
    for t in 0..rec.tiles {
        matvec_tile(rec, rt, part, lin, x, norm, res, out, mode, t)?;
    }
    Ok(())
}

/// [`matvec`] for tile `t`'s rows.
#[allow(clippy::too_many_arguments)]
fn matvec_tile(
    rec: &mut Recorder,
    rt: &mut GpuRuntime,
    part: Part,
    lin: &Lin,
    x: Buffer,
    norm: Option<Buffer>,
    res: Option<Buffer>,
    out: Buffer,
    mode: i64,
    t: usize,
) -> Result<()> {
    // MLX_GRAPH_MMA_LATE_NORM=2: the tensor-core tiles' normed products (gate/up, the head) in
    // their own kernel, matvec with the 1 / rms at the epilogue.
    let name = if mode & MODE_NORM != 0 && rec.step.matvec_norm(rec.nb) {
        "matvec_norm"
    } else {
        "matvec"
    };
    let k = rec.kernel(rt, name)?;
    let s = &rec.step.shape;
    let (gs, bits) = (lin.gs, lin.bits);
    let shared = mv_tile_shared(lin.k, bits, rec.nb, rec.step.chunk(rec.nb));
    // Tile t's first row of the input, the residual and the output.
    let rows = rec.first_row + t * rec.nb;
    let out_row = if mode & MODE_F32 != 0 {
        lin.n * 4
    } else if mode & MODE_SWIGLU != 0 {
        lin.n / 2 * 2
    } else {
        lin.n * 2
    };
    let (xo, ro, oo) = (rows * lin.k * 2, rows * lin.n * 2, rows * out_row);
    // 512 with MLX_GRAPH_MV_WIDE=1 in FFMA tiles of several rows (the warps of a block of 256
    // count as its rows a warp in mv_blocks).
    let threads = rec.step.mv_threads(rec.nb);
    rec.launch(
        rt,
        part,
        k,
        [
            mv_blocks(
                lin.n,
                rec.step.rows * (threads / MV_THREADS) as usize,
                rt.resident_blocks(k, threads, shared)?.min(rec.step.mv_cap),
            ),
            1,
            1,
        ],
        [threads, 1, 1],
        shared,
        &[
            lin.word(0),
            lin.word(1),
            lin.scale(0, x),
            lin.scale(1, x),
            lin.bias(0, x),
            // A biased output (gpt_oss's o projection and router): the bias in B1's slot.
            lin.out_bias.map_or(lin.bias(1, x), |b| Arg::Buf(b, 0)),
            Arg::Buf(x, xo),
            opt(norm, x),
            res.map_or(Arg::Buf(x, 0), |r| Arg::Buf(r, ro)),
            Arg::Buf(out, oo),
            Arg::I64(lin.n as i64),
            Arg::I64(lin.k as i64),
            Arg::I64(bits as i64),
            Arg::I64(gs as i64),
            Arg::I64(if lin.out_bias.is_some() {
                mode | MODE_BIAS
            } else {
                mode
            }),
            Arg::F64(s.eps as f64),
            rec.trace_arg(),
            // The epilogue's scalar: the logits' soft-cap (> 0) or divisor (< 0); the
            // residual multiplier.
            Arg::F64(if mode & MODE_F32 != 0 {
                if s.final_softcap > 0.0 {
                    s.final_softcap as f64
                } else {
                    -(s.logit_div as f64)
                }
            } else if mode & MODE_RES != 0 {
                s.residual_scale as f64
            } else {
                0.0
            }),
        ],
    )
}

/// The output projection over the attention's partials (`matvec_attn_out`, one sequence a
/// step: [`attn_combine_in_output`]): `out = W attn (+ res)`, `mode` 0 or [`MODE_RES`].
fn attn_out(
    rec: &mut Recorder,
    rt: &mut GpuRuntime,
    lin: &Lin,
    res: Option<Buffer>,
    out: Buffer,
    mode: i64,
) -> Result<()> {
    let k = rec.kernel(rt, "matvec_attn_out")?;
    let step = rec.step;
    let (s, a) = (&step.shape, &step.acts);
    let shared = attn_out_shared_bytes(s, step.capacity, lin.bits);
    let blocks = mv_blocks(
        lin.n,
        step.rows,
        rt.resident_blocks(k, MV_THREADS, shared)?.min(step.mv_cap),
    );
    rec.launch(
        rt,
        Part::Output,
        k,
        [blocks, 1, 1],
        [MV_THREADS, 1, 1],
        shared,
        &[
            lin.word(0),
            lin.scale(0, a.attn),
            lin.bias(0, a.attn),
            Arg::Buf(a.po, 0),
            Arg::Buf(a.pml, 0),
            Arg::Buf(a.state, 0),
            Arg::Buf(res.unwrap_or(a.attn), 0),
            Arg::Buf(out, 0),
            Arg::I64(lin.n as i64),
            Arg::I64(lin.k as i64),
            Arg::I64(lin.bits as i64),
            Arg::I64(lin.gs as i64),
            Arg::I64(mode),
            Arg::I64(s.heads as i64),
            Arg::I64((step.capacity / ATTN_CHUNK) as i64),
            rec.trace_arg(),
            Arg::F64(if mode & MODE_RES != 0 {
                s.residual_scale as f64
            } else {
                0.0
            }),
        ],
    )
}

/// What a step's kernels run over, and how they are launched.
struct Step {
    shape: GraphSpec,
    /// Cached positions.
    capacity: usize,
    acts: Activations,
    layers: Vec<Layer>,
    embed: Lin,
    head: Lin,
    /// A trellis-coded head (`head` then only describes its words for `part_load`).
    trellis_head: Option<TLin>,
    final_norm: Buffer,
    /// Programmatic dependent launch.
    pdl: bool,
    /// Rows a warp computes in the matrix-vector products (`MV_ROWS`).
    rows: usize,
    /// The cap on a matrix-vector kernel's grid besides one wave (blocks_per_sm x SMs).
    mv_cap: u32,
    /// Sequences a launch takes (`NB`), and launches a kernel (tiles of nb rows).
    nb: usize,
    tiles: usize,
    /// Tiles take 4-bit weights in groups of 64 through the tensor cores (`MV_MMA`).
    mma: bool,
    /// The output projection combines the attention's partials (`matvec_attn_out`; the
    /// attention runs without counters) in the layers without trellis-coded weights
    /// ([`attn_combine_in_output`]).
    attn_in_output: bool,
    /// Tiles of at least this many rows run on the tensor cores
    /// ([`GraphOptions::tensor_cores_from`]; `u32::MAX`: never).
    mma_from: u32,
    /// The kernels' compile-time settings besides the rows a tile.
    params: SourceParams,
    /// [`GraphOptions::fit_rows`] (off for one cache slot and for a decoder of one row).
    fit_rows: bool,
    /// Tiles of at least this many rows are wide tensor-core tiles ([`wide_from`]).
    wide_from: Option<usize>,
    /// The persistent step's table (`MLX_GRAPH_PERSIST=1` or `2` where [`persist_spec`] allows
    /// it), or why the step runs its kernels ([`persist_status`]).
    persist: std::result::Result<PersistStep, String>,
}

/// Whether the output projection combines the attention's partials itself
/// ([`GraphOptions::attn_combine_in_output`]): one sequence a step (one tile of one) and a
/// block's threads for the attention's width / 8 pieces; by default also an attention width
/// within [`ATTN_OUT_MAX_WIDTH`] and `MLX_GRAPH_ATTN_COMBINE=output` (opt-in: measured slower
/// on a device).
fn attn_combine_in_output(spec: &GraphSpec, nb: usize, tiles: usize, opt: Option<bool>) -> bool {
    let width = spec.heads * spec.head_dim;
    // A biased output projection runs as matvec (MODE_BIAS): the attention combines.
    let possible = nb == 1 && tiles == 1 && width / 8 <= MV_THREADS as usize && !spec.o_bias;
    possible
        && opt.unwrap_or_else(|| {
            width <= ATTN_OUT_MAX_WIDTH
                && std::env::var("MLX_GRAPH_ATTN_COMBINE").is_ok_and(|v| v == "output")
        })
}

/// `matvec_attn_out`'s dynamic shared memory: the input (`mv_shared_bytes`), then the staged
/// partial outputs (`ATTN_OUT_CHUNKS` chunks of every head) and one tile's (max, sum) pairs of
/// every head (up to 128 chunks: `ATTN_THREADS`).
fn attn_out_shared_bytes(spec: &GraphSpec, capacity: usize, bits: usize) -> u32 {
    let width = spec.heads * spec.head_dim;
    let tile = (capacity / ATTN_CHUNK).min(128);
    mv_shared_bytes(width, bits) + (width * ATTN_OUT_CHUNKS * 4 + spec.heads * tile * 8) as u32
}

impl Step {
    /// The threads of a `matvec` / `matvec_qkv` block in tiles of `nb` rows ([`mv_threads`]
    /// with this decoder's rows a warp, tensor-core widths and [`SourceParams::mv_wide`]).
    fn mv_threads(&self, nb: usize) -> u32 {
        mv_threads(nb, nb as u32 >= self.mma_from, self.params.mv_wide)
    }

    /// Whether tiles of `nb` rows launch `matvec_norm` for their normed products (the module
    /// compiled for them has it: [`matvec_norm_in`]).
    fn matvec_norm(&self, nb: usize) -> bool {
        matvec_norm_in(self.tensor_cores(nb), self.params.late_norm)
    }

    /// Whether tiles of `nb` rows multiply on the tensor cores (from `mma_from` rows, 4-bit
    /// weights in groups of 64).
    fn tensor_cores(&self, nb: usize) -> bool {
        nb as u32 >= self.mma_from && self.shape.tensor_core_weights()
    }

    /// The constructor's kernels over all its tiles.
    fn full_set(&self) -> Set {
        Set {
            nb: self.nb,
            tiles: self.tiles,
            module: Module::FIRST,
            first_row: 0,
        }
    }

    /// The tiles that hold the first `m` rows (1 .. nb x tiles): the fewest tiles of at most
    /// `nb` rows, each of the fewest rows that spread `m` over them.
    fn fit(&self, m: usize) -> (usize, usize) {
        fit_tiles(m, self.nb, self.tiles, self.wide_from)
    }

    /// The tiles a step of rows `lo .. hi` runs: (rows a tile, tiles, first row), from row `lo`
    /// or as far below it as the rows end; `None` where those are the constructor's tiles
    /// from row 0 (its graphs).
    fn fitted_key(&self, lo: usize, hi: usize) -> Option<(usize, usize, usize)> {
        let (nb, tiles) = self.fit(hi.max(lo + 1) - lo);
        let first = lo.min(self.nb * self.tiles - nb * tiles);
        (nb != self.nb || first != 0).then_some((nb, tiles, first))
    }

    /// Whether tiles of `nb` rows are wide tensor-core tiles ([`GraphOptions::wide_tiles`]).
    fn wide(&self, nb: usize) -> bool {
        self.wide_from.is_some_and(|f| nb >= f)
    }

    /// The inputs tiles of `nb` rows stage at once (`MMA_KC`; `None`: all of K).
    fn chunk(&self, nb: usize) -> Option<usize> {
        if self.wide(nb) {
            mma_chunk(&self.shape, nb, self.params.min_blocks)
        } else {
            None
        }
    }
}

/// Tiles of at least this many rows run as wide tensor-core tiles
/// ([`GraphOptions::wide_tiles`]): where the option is on, the tensor cores apply (4-bit
/// weights in groups of 64, from `mma_from` rows), and the model decodes several sequences
/// (no experts, no trellis codes). Only where every narrower width runs on the FFMA tiles
/// (`mma_from` at most one past `ffma_max` and [`TILE_SEQUENCES`]): a step of rows between
/// the FFMA tiles' limit and `mma_from` would otherwise get an FFMA module wider than its
/// kernels take (past 8 rows they trap).
fn wide_from(spec: &GraphSpec, wide_tiles: bool, mma_from: u32, ffma_max: u32) -> Option<usize> {
    (wide_tiles
        && spec.tensor_core_weights()
        && spec.moe.is_none()
        && spec.trellis.is_none()
        && mma_from <= MMA_TILE_SEQUENCES
        && mma_from <= ffma_max.min(TILE_SEQUENCES) + 1)
        .then_some(mma_from as usize)
}

/// A decoder's tiles for `want` rows: (rows a tile, tiles, the most rows a tile may take).
/// Wide tensor-core tiles ([`wide_from`]) take up to [`MMA_TILE_SEQUENCES`] rows, where the
/// rows a tile come to at least `wide_from`; otherwise up to `ffma_max`
/// ([`GraphDecoder::max_sequences`]). `tile_sequences` caps either. As few tiles as that
/// allows, the rows spread evenly.
fn tile_shape(
    want: usize,
    ffma_max: u32,
    tile_sequences: Option<u32>,
    wide_from: Option<usize>,
) -> (usize, usize, usize) {
    let cap = tile_sequences.unwrap_or(u32::MAX);
    let spread = |per: u32| {
        let per = per.min(cap).max(1) as usize;
        let tiles = want.max(1).div_ceil(per);
        (want.max(1).div_ceil(tiles), tiles, per)
    };
    match wide_from {
        Some(f) => {
            let wide = spread(MMA_TILE_SEQUENCES);
            if wide.0 >= f {
                wide
            } else {
                spread(ffma_max)
            }
        }
        None => spread(ffma_max),
    }
}

/// `MV_MIN_BLOCKS` of a wide tensor-core tile of `nb` rows: 2 (128 registers a thread) where
/// two blocks' inputs of the model's hidden width fit a multiprocessor's shared memory, else 1
/// (the registers of one: no spills at 16 rows, `results/gpu/2026-12-06-s34-wide`). Past 8
/// rows always 1: at 128 registers the 16-row loop spills (3 local loads and stores an item).
fn mma_min_blocks(spec: &GraphSpec, nb: usize) -> u32 {
    mma_min_blocks_with(spec, nb, mma_async())
}

/// [`mma_min_blocks`] with the cp.async ring (`ring`) or without.
fn mma_min_blocks_with(spec: &GraphSpec, nb: usize, ring: bool) -> u32 {
    if nb > TILE_SEQUENCES as usize {
        return 1;
    }
    let one = nb as u32 * mv_shared_bytes(spec.hidden, 4) + mma_static_shared(ring) + 1024;
    if 2 * one <= SM_SHARED {
        2
    } else {
        1
    }
}

/// The inputs a wide tensor-core tile of `nb` rows stages at once (`MMA_KC` in the source;
/// `None`: all of K, where the widest product's `nb` inputs fit): the most, a multiple of
/// [`MMA_KC_STEP`], whose `nb` inputs fit the blocks a multiprocessor holds
/// (`MV_MIN_BLOCKS`: `min_blocks`, else [`mma_min_blocks`]). At 8B (down's K 14,336): 6,144
/// at 8 and 16 rows (16 x 13,056 bytes, one block; 8 x 13,056, two).
fn mma_chunk(spec: &GraphSpec, nb: usize, min_blocks: Option<u32>) -> Option<usize> {
    mma_chunk_with(spec, nb, min_blocks, mma_async())
}

/// [`mma_chunk`] with the cp.async ring (`ring`: its 30 KiB of static shared memory leave
/// less for the inputs; at 8B, 5,120 at 16 rows and 4,096 at 8) or without.
fn mma_chunk_with(
    spec: &GraphSpec,
    nb: usize,
    min_blocks: Option<u32>,
    ring: bool,
) -> Option<usize> {
    let blocks = min_blocks
        .unwrap_or_else(|| mma_min_blocks_with(spec, nb, ring))
        .max(1);
    let block = (SM_SHARED / blocks)
        .saturating_sub(1024)
        .min(MV_SHARED_MAX)
        .saturating_sub(mma_static_shared(ring));
    let room = block / nb.max(1) as u32;
    if spec.mv_shared_per_sequence() <= room {
        return None;
    }
    let mut kc = (room as usize * 8 / 17) / MMA_KC_STEP * MMA_KC_STEP;
    while kc > MMA_KC_STEP && mv_shared_bytes(kc, 4) > room {
        kc -= MMA_KC_STEP;
    }
    Some(kc.max(MMA_KC_STEP))
}

/// The most shared memory one sequence's input takes in a matrix-vector launch, with the
/// tensor-core tiles' inputs staged in chunks of `chunk` inputs.
fn mv_staged_per_sequence(spec: &GraphSpec, chunk: Option<usize>) -> u32 {
    match chunk {
        None => spec.mv_shared_per_sequence(),
        Some(kc) => spec
            .mv_inputs()
            .into_iter()
            .map(|(k, bits)| mv_shared_bytes(k.min(kc), bits))
            .max()
            .unwrap_or(0),
    }
}

/// A matrix-vector launch's dynamic shared memory: `nb` inputs of width `k` (or of the
/// tensor-core tiles' `chunk`, where K is wider).
fn mv_tile_shared(k: usize, bits: usize, nb: usize, chunk: Option<usize>) -> u32 {
    let staged = chunk.map_or(k, |c| k.min(c));
    mv_shared_bytes(staged, bits) * nb as u32
}

/// The windows of rows (lo, hi) within the first `rows` that a step may have (its lowest row
/// to its highest): what [`GraphDecoder::prepare_rows`] prepares.
fn windows(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (1..=rows).flat_map(move |m| (0..=rows - m).map(move |lo| (lo, lo + m)))
}

/// The tiles that hold `m` rows (clamped to 1 .. nb x tiles) with tiles of at most `nb`
/// rows: (rows a tile, tiles), the fewest tiles (each reads every weight once), each of the
/// fewest rows that hold `m` (each row's products cost the same whether it steps or idles).
/// A tile of at least `wide_from` rows (wide tensor-core tiles) takes its rows rounded up to
/// a multiple of 8 (at most `nb`): mma.sync multiplies 8 columns whatever the rows, so the
/// widths are few (1, 2, 3, 8 and 16 for a 16-row decoder) and so are the modules and graphs.
fn fit_tiles(m: usize, nb: usize, tiles: usize, wide_from: Option<usize>) -> (usize, usize) {
    let nb = nb.max(1);
    let m = m.clamp(1, nb * tiles.max(1));
    let t = m.div_ceil(nb);
    let w = m.div_ceil(t);
    match wide_from {
        Some(f) if w >= f => (w.next_multiple_of(8).min(nb), t),
        _ => (w, t),
    }
}

/// The kernels' compile-time settings besides `NB` and `MV_MMA`.
#[derive(Debug, Clone, Copy)]
struct SourceParams {
    rows: usize,
    batch: u32,
    early: u32,
    min_blocks: Option<u32>,
    /// The persistent step asked for ([`GraphOptions::persistent_step`], the environment's
    /// `MLX_GRAPH_PERSIST=1` by default).
    persist: bool,
    /// The trellis kernels' switches ([`GraphSpec::trellis_switches`], chosen once when the
    /// decoder is built): their source's defines, and the launches' threads, grids and shared
    /// memory ([`Step::params`]).
    trellis: TrellisSwitches,
    /// [`mv_wide`], read once when the decoder is built: its FFMA tiles' sources and their
    /// launches ([`mv_wide_in`], [`mv_threads`]) take this value.
    mv_wide: bool,
    /// [`mma_late_norm`]'s level, read once when the decoder is built: its tensor-core tiles'
    /// sources and their launches ([`matvec_norm_in`]) take this value.
    late_norm: u8,
    /// [`mv_bits_only`], read once when the decoder is built: every module's source compiles
    /// the mat-vecs for [`GraphSpec::matvec_bits`] only ([`mv_bits_define`]).
    mv_bits: bool,
}

/// Which kernels a step is recorded with: `tiles` launches of the kernels of `module`,
/// compiled for `nb` rows a launch.
#[derive(Debug, Clone, Copy)]
struct Set {
    nb: usize,
    tiles: usize,
    module: Module,
    /// The first tile's first row (the tiles cover `first_row ..` `first_row + nb x tiles`).
    first_row: usize,
}

/// The step's CUDA source for tiles of `nb` rows (`mma`: on the tensor cores), and its
/// kernels with their arities.
fn step_source(
    spec: &GraphSpec,
    p: &SourceParams,
    nb: usize,
    mma: bool,
    wide: bool,
) -> (String, Vec<(&'static str, u32)>) {
    // Tensor-core tiles of a 4-bit model in groups of 64 (every product on mv_run_mma): two
    // blocks a multiprocessor at 128 registers where the inputs fit (graph_decode.cu's
    // MV_MIN_BLOCKS; results/gpu/2026-12-05-s32-rows), unless the options set it; a wide
    // tile whose inputs fill one multiprocessor's shared memory takes one (mma_min_blocks).
    let mma4 = mma && spec.tensor_core_weights();
    let min_blocks = p
        .min_blocks
        .or(mma4.then(|| if wide { mma_min_blocks(spec, nb) } else { 2 }))
        .map(|m| format!("#define MV_MIN_BLOCKS {m}\n"))
        .unwrap_or_default();
    // A wide tile's inputs past the shared memory: staged in chunks of K.
    let chunk = if wide && mma4 {
        mma_chunk(spec, nb, p.min_blocks).unwrap_or(0)
    } else {
        0
    };
    // The wide tiles' cp.async ring (MLX_GRAPH_MMA_ASYNC, on unless 0): the same bits, its own loads.
    let ring = if wide && mma4 && mma_async() {
        "#define MMA_ASYNC 1\n"
    } else {
        ""
    };
    // The FFMA row kernels' deferred scale/bias reads (MLX_GRAPH_MV_ASYNC, on unless 0): the same bits.
    let mv_async = mv_async_define(mv_async());
    // The wide tiles' bank-conflict-free placement (MLX_GRAPH_MMA_BANKS=1): the same bits.
    let banks = mma_banks_define(wide && mma4 && mma_banks());
    // The wide tiles' items of two rows blocks (on unless MLX_GRAPH_MMA_PAIR=0): the same bits.
    let pair = mma_pair_define(mma_pair_in(nb, wide, mma4, mma_pair()).is_ok());
    // The normed products' 1 / rms at the epilogue (level 1 unless MLX_GRAPH_MMA_LATE_NORM
    // says 0 or 2): L3, every width alike.
    let late_norm = mma_late_norm_define(if mma4 { p.late_norm } else { 0 });
    // The mat-vecs for the model's codes' widths only (unless MLX_GRAPH_MV_BITS=0): the same
    // products.
    let bits_only = mv_bits_define(spec, p.mv_bits);
    // The norm weights before the wait (MLX_GRAPH_EARLY_PROLOGUE=1, off otherwise): the same bits.
    let early_norm = early_prologue_define(early_prologue());
    // The FFMA tiles' constant-slot loop (MLX_GRAPH_MV_NB=1, tiles of several rows): the same bits.
    let mv_nb = mv_nb_define(nb, mv_nb());
    // The persistent step (MLX_GRAPH_PERSIST=1, one-row llama steps): the same bits.
    let persist_on = p.persist && persist_spec(spec, nb, mma).is_none();
    let persist = persist_define(persist_on);
    // The FFMA tiles' 512-thread blocks (MLX_GRAPH_MV_WIDE=1, tiles of several rows): one item
    // in flight a lane (128 registers; 16 warps cover its round trip). The same bits.
    let wide_mv = mv_wide_in(nb, mma, p.mv_wide);
    let (batch, early, mv_wide_def) = if wide_mv {
        (1, 1, "#define MV_WIDE 1\n")
    } else if let Some(c) = persist_chunks(p.rows).filter(|_| persist_on) {
        (c, c, "")
    } else {
        (p.batch, p.early, "")
    };
    let mut source = format!(
        "#define MV_ROWS {}\n#define MV_BATCH {}\n#define MV_EARLY {}\n\
         #define NB {nb}\n#define MV_MMA {}\n#define MMA_KC {chunk}\n{min_blocks}{ring}{mv_async}\
         {banks}{pair}{late_norm}{bits_only}{early_norm}{mv_nb}{mv_wide_def}{persist}{SOURCE}",
        p.rows,
        batch,
        early,
        u8::from(mma)
    );
    // OLMo 2's blocks: matvec_qkv without its pre-norm.
    if spec.post_only {
        source = format!("#define MV_QKV_NORM 0\n{source}");
    }
    // gpt_oss's attention sinks.
    if spec.attn_sinks {
        source = format!("#define ATTN_SINKS 1\n{source}");
    }
    // gpt_oss's biased output projection and router (matvec's MODE_BIAS), its experts'
    // biases and clamped SwiGLU (MOE_OAI), its mxfp4 experts (MV_FP4).
    let oai = spec.moe.as_ref().is_some_and(|m| m.oai);
    if spec.o_bias || oai {
        source = format!("#define MV_OUT_BIAS 1\n{source}");
    }
    if oai {
        source = format!("#define MOE_OAI 1\n{source}");
    }
    if spec.moe.as_ref().is_some_and(|m| m.mxfp4) {
        source = format!("#define MV_FP4 1\n{source}");
    }
    let mut kernels = KERNELS.to_vec();
    if matvec_norm_in(mma4, p.late_norm) {
        kernels.push(MATVEC_NORM_KERNEL);
    }
    if persist_on {
        kernels.extend(PERSIST_KERNELS);
    }
    if spec.qk_norm {
        kernels.push(if spec.qk_norm_full {
            QK_NORM_FULL_KERNEL
        } else {
            QK_NORM_KERNEL
        });
        source.push_str(QK_NORM_SOURCE);
    }
    if spec.sandwich {
        kernels.push(GEMMA_KERNEL);
        source.push_str(GEMMA_SOURCE);
    }
    if spec.moe.is_some() {
        kernels.extend(MOE_KERNELS);
        source.push_str(MOE_SOURCE);
    }
    if spec.trellis.is_some() {
        kernels.extend(TRELLIS_KERNELS);
        source.push_str(&p.trellis.source(spec.trellis_v.as_ref()));
    }
    (source, kernels)
}

/// Opts the matrix-vector kernels of `module` (compiled for `nb` rows a tile, `kernels` its
/// kernels: [`step_source`]'s) in to the shared memory their inputs take, where that is past
/// 48 KiB less their static shared memory.
fn mv_shared_opt_in(
    rt: &mut GpuRuntime,
    module: Module,
    spec: &GraphSpec,
    nb: usize,
    chunk: Option<usize>,
    kernels: &[(&str, u32)],
) -> Result<()> {
    let shared = mv_staged_per_sequence(spec, chunk) * nb as u32;
    // With the cp.async ring on, the larger static bound (opting in where a module without
    // the ring would not need it is harmless).
    if shared + mma_static_shared(mma_async()) <= 48 * 1024 {
        return Ok(());
    }
    let products = ["matvec", "matvec_norm", "matvec_qkv", "matvec_experts"];
    for &(k, _) in kernels.iter().filter(|(k, _)| products.contains(k)) {
        let k = rt.kernel_in(module, k)?;
        rt.set_shared_limit(k, shared)?;
    }
    Ok(())
}

/// A layer's mixture-of-experts block (one sequence): the router's logits of the normed input,
/// the choice, the chosen experts' gate/up (SwiGLU) and down products, and the weighted sum
/// added to the residual (`graph_moe.cu`).
fn record_experts(
    rec: &mut Recorder,
    rt: &mut GpuRuntime,
    l: &Layer,
    router: &Lin,
    m: &GraphMoe,
) -> Result<()> {
    let step: &Step = rec.step;
    let (s, a) = (&step.shape, &step.acts);
    let (h, iw, k) = (s.hidden, m.intermediate, m.top_k);
    // The layer's own logits buffer (read back by `router_logits`).
    let gates = l.gates.unwrap_or(a.gates);
    matvec(
        rec,
        rt,
        Part::GateUp,
        router,
        a.h,
        Some(l.post_norm),
        None,
        gates,
        MODE_NORM,
    )?;
    let (kind, norm) = match m.router {
        GraphRouter::SoftmaxTopK { norm } => (0, i64::from(norm)),
        GraphRouter::TopKSoftmax => (1, 0),
    };
    let k_route = rec.kernel(rt, "moe_route")?;
    rec.launch(
        rt,
        Part::GateUp,
        k_route,
        [1, 1, 1],
        [32, 1, 1],
        0,
        &[
            Arg::Buf(gates, 0),
            Arg::Buf(a.sel, 0),
            Arg::Buf(a.wts, 0),
            Arg::I64(m.experts as i64),
            Arg::I64(k as i64),
            Arg::I64(kind),
            Arg::I64(norm),
            // A router bias (gpt_oss) is added by the router's matvec (MODE_BIAS), in the
            // rounding MLX's linear gives it: none here.
            Arg::I64(0),
        ],
    )?;
    let k_exp = rec.kernel(rt, "matvec_experts")?;
    // (part, weights, input, norm, output, rows a slot, mode, per-slot inputs, input width)
    let launches = [
        (
            Part::GateUp,
            &l.gu,
            a.h,
            Some(l.post_norm),
            a.act,
            2 * iw,
            MODE_NORM | MODE_SWIGLU | if m.oai { MODE_OAI } else { 0 },
            false,
            h,
        ),
        (Part::Down, &l.down, a.act, None, a.ey, h, 0, true, k * iw),
    ];
    // gpt_oss's experts' biases: gate's and up's for gate/up, down's for down.
    let eb = |j: usize| l.expert_bias.map_or(Arg::I64(0), |b| Arg::Buf(b[j], 0));
    let ebs = [[eb(0), eb(1)], [eb(2), Arg::I64(0)]];
    for ((part, lin, x, norm, out, rpe, mode, per_slot, kx), [eb0, eb1]) in
        launches.into_iter().zip(ebs)
    {
        let shared = mv_shared_bytes(kx, layout_bits(lin.bits));
        let rows = k * rpe;
        let resident = rt
            .resident_blocks(k_exp, MV_THREADS, shared)?
            .min(rec.step.mv_cap);
        rec.launch(
            rt,
            part,
            k_exp,
            [mv_blocks(rows, rec.step.rows, resident), 1, 1],
            [MV_THREADS, 1, 1],
            shared,
            &[
                lin.word(0),
                lin.word(1),
                lin.scale(0, x),
                lin.scale(1, x),
                lin.bias(0, x),
                lin.bias(1, x),
                Arg::Buf(x, 0),
                opt(norm, x),
                Arg::Buf(out, 0),
                Arg::Buf(a.sel, 0),
                Arg::I64(rows as i64),
                Arg::I64(lin.k as i64),
                Arg::I64(lin.bits as i64),
                Arg::I64(lin.gs as i64),
                Arg::I64(mode),
                Arg::F64(s.eps as f64),
                Arg::I64(rpe as i64),
                Arg::I64(i64::from(per_slot)),
                rec.trace_arg(),
                // The experts' biases (gpt_oss; MOE_OAI), or none.
                eb0,
                eb1,
            ],
        )?;
    }
    let k_comb = rec.kernel(rt, "moe_combine")?;
    rec.launch(
        rt,
        Part::Down,
        k_comb,
        [h.div_ceil(256) as u32, 1, 1],
        [256, 1, 1],
        0,
        &[
            Arg::Buf(a.ey, 0),
            Arg::Buf(a.wts, 0),
            Arg::Buf(a.h, 0),
            Arg::I64(h as i64),
            Arg::I64(k as i64),
        ],
    )?;
    Ok(())
}

/// Records one decode step (while capturing), or only one part's kernels of it; with a
/// timeline buffer, the kernels record their timeline there.
fn record_step(
    rt: &mut GpuRuntime,
    step: &Step,
    set: Set,
    only: Option<Part>,
    trace: Option<Buffer>,
) -> Result<()> {
    record_step_with(rt, step, set, only, trace, None).map(|_| ())
}

/// [`record_step`]; with `collect`, records nothing and returns the phases the persistent step
/// would run ([`persist_build`]).
fn record_step_with(
    rt: &mut GpuRuntime,
    step: &Step,
    set: Set,
    only: Option<Part>,
    trace: Option<Buffer>,
    collect: Option<Vec<Phase>>,
) -> Result<Vec<Phase>> {
    let Step {
        shape: ref s,
        capacity: cap,
        acts: ref a,
        ref layers,
        embed,
        head,
        final_norm,
        rows,
        mv_cap,
        ..
    } = *step;
    // The set's first `tiles` tiles of `nb` rows run (the rest idle): one graph a set.
    let nb = set.nb;
    let tiles = set.tiles.clamp(
        1,
        (step.nb * step.tiles).saturating_sub(set.first_row) / nb.max(1),
    );
    let nbu = nb as u32;
    // Tile t's first row in a buffer of `row` bytes a row.
    let first = set.first_row;
    let at = |t: usize, row: usize| (first + t * nb) * row;
    let h_row = s.hidden * 2;
    let qkv_row = s.qkv_rows() * 2;
    let slot = s.kv_heads * cap * s.head_dim * 2;
    let rope_row = 2 * s.head_dim * 4;
    let am_g = s.vocab.div_ceil(ARGMAX_SLICE);
    // The persistent step replaces the phases where its table was built for this set, and
    // the whole step is recorded untraced.
    let persist = only.is_none()
        && trace.is_none()
        && collect.is_none()
        && step
            .persist
            .as_ref()
            .is_ok_and(|p| p.module == set.module && p.first_row == set.first_row && tiles == 1);
    let phase_kernels = if persist || collect.is_some() {
        let mut ks = [rt.kernel_in(set.module, PS_PHASES[0].0)?; 7];
        for (k, (name, _)) in ks.iter_mut().zip(PS_PHASES).skip(1) {
            *k = rt.kernel_in(set.module, name)?;
        }
        Some(ks)
    } else {
        None
    };
    let mut rec = Recorder {
        step,
        only,
        trace,
        prev_multi_wave: false,
        tiles,
        nb,
        module: set.module,
        first_row: set.first_row,
        phase_kernels,
        collect,
        persist,
    };
    let k_embed = rec.kernel(rt, "embed")?;
    let k_qkv = rec.kernel(rt, "matvec_qkv")?;
    let k_attn = rec.kernel(rt, "attention")?;
    let k_am_partial = rec.kernel(rt, "argmax_partial")?;
    let k_am_pick = rec.kernel(rt, "argmax_pick")?;
    let (gs, bits) = s.group_and_bits();
    let (d, nh, nkv) = (s.head_dim as i64, s.heads as i64, s.kv_heads as i64);
    let ns = cap / ATTN_CHUNK;
    for t in 0..tiles {
        rec.launch(
            rt,
            Part::Embed,
            k_embed,
            [nbu, 1, 1],
            [256, 1, 1],
            0,
            &[
                embed.word(0),
                embed.scale(0, a.h),
                embed.bias(0, a.h),
                Arg::Buf(a.state, at(t, 16)),
                Arg::Buf(a.h, at(t, h_row)),
                Arg::I64(s.hidden as i64),
                Arg::I64(bits as i64),
                Arg::I64(gs as i64),
                Arg::Buf(a.rope, at(t, rope_row)),
                Arg::I64(d / 2),
                Arg::I64(s.rope.pairs() as i64),
                Arg::Buf(a.inv_freq, 0),
                Arg::F64(s.rope.position_scale as f64),
                Arg::F64(s.rope.output_scale as f64),
                Arg::F64(s.embed_scale as f64),
                Arg::I64(s.local_rope.as_ref().map_or(0, |r| r.pairs()) as i64),
                Arg::Buf(a.inv_freq2, 0),
                Arg::F64(
                    s.local_rope
                        .as_ref()
                        .map_or(1.0, |r| r.position_scale as f64),
                ),
                Arg::F64(s.local_rope.as_ref().map_or(1.0, |r| r.output_scale as f64)),
            ],
        )?;
    }
    let scale = s.attn_scale as f64;
    // Every layer's q/k/v product has the same shape.
    let qkv_shared = mv_tile_shared(s.hidden, bits, nb, step.chunk(nb));
    // 512 with MLX_GRAPH_MV_WIDE=1 in FFMA tiles of several rows (as matvec's).
    let qkv_threads = step.mv_threads(nb);
    let qkv_resident = rt
        .resident_blocks(k_qkv, qkv_threads, qkv_shared)?
        .min(mv_cap);
    for l in layers {
        if let Some(tl) = &l.trellis {
            record_trellis_qkv(&mut rec, rt, step, l, tl)?;
        }
        // A trellis layer's q/k/v: above.
        for t in 0..tiles * usize::from(l.trellis.is_none()) {
            rec.launch(
                rt,
                Part::Qkv,
                k_qkv,
                [
                    mv_blocks(
                        l.qkv.n,
                        rows * (qkv_threads / MV_THREADS) as usize,
                        qkv_resident,
                    ),
                    1,
                    1,
                ],
                [qkv_threads, 1, 1],
                qkv_shared,
                &[
                    l.qkv.word(0),
                    l.qkv.word(1),
                    l.qkv.word(2),
                    l.qkv.scale(0, a.h),
                    l.qkv.scale(1, a.h),
                    l.qkv.scale(2, a.h),
                    l.qkv.bias(0, a.h),
                    l.qkv.bias(1, a.h),
                    l.qkv.bias(2, a.h),
                    Arg::Buf(a.h, at(t, h_row)),
                    // No pre-norm (post_only): a null weight, the input as it is.
                    if s.post_only {
                        Arg::I64(0)
                    } else {
                        Arg::Buf(l.in_norm, 0)
                    },
                    Arg::Buf(a.qkv, at(t, qkv_row)),
                    Arg::Buf(l.kc, at(t, slot)),
                    Arg::Buf(l.vc, at(t, slot)),
                    Arg::Buf(a.state, at(t, 16)),
                    Arg::I64(l.qkv.k as i64),
                    Arg::I64(bits as i64),
                    Arg::I64(gs as i64),
                    Arg::I64(nh),
                    Arg::I64(nkv),
                    Arg::I64(d),
                    Arg::I64(cap as i64),
                    Arg::I64(i64::from(s.rope.traditional)),
                    Arg::F64(s.eps as f64),
                    Arg::Buf(a.rope, at(t, rope_row) + l.rope_off),
                    rec.trace_arg(),
                    Arg::I64(if l.qk_norm.is_some() {
                        0
                    } else {
                        l.nrot as i64
                    }),
                    l.qkv_bias.map_or(Arg::I64(0), |b| Arg::Buf(b, 0)),
                    Arg::I64(l.qkv.pairs as i64),
                ],
            )?;
        }
        if let Some((qw, kw)) = l.qk_norm {
            for t in 0..tiles {
                let common = [
                    Arg::Buf(a.qkv, at(t, qkv_row)),
                    Arg::Buf(l.kc, at(t, slot)),
                    Arg::Buf(a.state, at(t, 16)),
                    Arg::Buf(qw, 0),
                    Arg::Buf(kw, 0),
                    Arg::Buf(a.rope, at(t, rope_row) + l.rope_off),
                    Arg::I64(nh),
                ];
                let rest = [
                    Arg::I64(d),
                    Arg::I64(cap as i64),
                    Arg::I64(l.nrot as i64),
                    Arg::I64(i64::from(s.rope.traditional)),
                    Arg::F64(s.eps as f64),
                ];
                // Per head: a block a head; over the whole projections (OLMo 2): a block a
                // projection, which takes the kv heads' count.
                let (k_qkn, blocks, args) = if s.qk_norm_full {
                    let args = [&common[..], &[Arg::I64(nkv)], &rest[..]].concat();
                    (rec.kernel(rt, QK_NORM_FULL_KERNEL.0)?, 2, args)
                } else {
                    let args = [&common[..], &rest[..]].concat();
                    (
                        rec.kernel(rt, QK_NORM_KERNEL.0)?,
                        s.heads + s.kv_heads,
                        args,
                    )
                };
                // qk_norm_full_rope's blocks are 256 threads, qk_norm_rope's 128.
                let threads = if s.qk_norm_full { 256 } else { 128 };
                rec.launch(
                    rt,
                    Part::Qkv,
                    k_qkn,
                    [blocks as u32 * nbu, 1, 1],
                    [threads, 1, 1],
                    0,
                    &args,
                )?;
            }
        }
        let in_output = step.attn_in_output && l.trellis.is_none();
        for t in 0..tiles {
            rec.launch(
                rt,
                Part::Attention,
                k_attn,
                [s.heads as u32 * nbu, ns as u32, 1],
                [128, 1, 1],
                0,
                &[
                    Arg::Buf(a.qkv, at(t, qkv_row)),
                    Arg::Buf(l.kc, at(t, slot)),
                    Arg::Buf(l.vc, at(t, slot)),
                    Arg::Buf(a.state, at(t, 16)),
                    Arg::Buf(a.po, at(t, s.heads * ns * s.head_dim * 4)),
                    Arg::Buf(a.pml, at(t, s.heads * ns * 2 * 4)),
                    // Without counters the output projection combines (matvec_attn_out).
                    if in_output {
                        Arg::I64(0)
                    } else {
                        Arg::Buf(a.counters, at(t, s.heads * 4))
                    },
                    Arg::Buf(a.attn, at(t, s.heads * s.head_dim * 2)),
                    Arg::I64(nh),
                    Arg::I64(nkv),
                    Arg::I64(d),
                    Arg::I64(cap as i64),
                    Arg::I64(ns as i64),
                    Arg::F64(scale),
                    rec.trace_arg(),
                    Arg::I64(l.window as i64),
                    Arg::F64(s.attn_softcap as f64),
                    // Attention sinks (gpt_oss; ATTN_SINKS 1), or none.
                    l.sinks.map_or(Arg::I64(0), |b| Arg::Buf(b, 0)),
                ],
            )?;
        }
        // The output projection with the residual, gate/up with SwiGLU (GeGLU), down with the
        // residual; with sandwich norms the projections write `y`, which norm_add norms and
        // adds to the residual.
        let act = if s.gelu { MODE_GELU } else { 0 };
        let (res_out, res_mode) = match l.post_norms {
            Some(_) => (None, 0),
            None => (Some(a.h), MODE_RES),
        };
        let proj_out = if l.post_norms.is_some() { a.y } else { a.h };
        let mlp = [
            (
                Part::Output,
                &l.o,
                a.attn,
                None,
                res_out,
                proj_out,
                res_mode,
            ),
            (
                Part::GateUp,
                &l.gu,
                a.h,
                (!s.post_only).then_some(l.post_norm),
                None,
                a.act,
                MODE_SWIGLU | act | if s.post_only { 0 } else { MODE_NORM },
            ),
            (
                Part::Down,
                &l.down,
                a.act,
                None,
                res_out,
                proj_out,
                res_mode,
            ),
        ];
        // A layer with experts: the output projection here, its feed-forward block below.
        let dense_parts = if l.trellis.is_some() {
            0
        } else if l.router.is_some() {
            1
        } else {
            3
        };
        for (j, (part, lin, x, norm, res, out, mode)) in
            mlp.into_iter().enumerate().take(dense_parts)
        {
            if j == 0 && in_output {
                attn_out(&mut rec, rt, lin, res, out, mode)?;
            } else {
                matvec(&mut rec, rt, part, lin, x, norm, res, out, mode)?;
            }
            if let (Some((pa, pm)), 0 | 2) = (l.post_norms, j) {
                let k_na = rec.kernel(rt, GEMMA_KERNEL.0)?;
                for t in 0..tiles {
                    rec.launch(
                        rt,
                        part,
                        k_na,
                        [nbu, 1, 1],
                        [256, 1, 1],
                        0,
                        &[
                            Arg::Buf(a.y, at(t, h_row)),
                            Arg::Buf(if j == 0 { pa } else { pm }, 0),
                            Arg::Buf(a.h, at(t, h_row)),
                            Arg::I64(s.hidden as i64),
                            Arg::F64(s.eps as f64),
                        ],
                    )?;
                }
            }
        }
        if let (Some(router), Some(m)) = (&l.router, &s.moe) {
            record_experts(&mut rec, rt, l, router, m)?;
        }
        if let Some(tl) = &l.trellis {
            record_trellis_mlp(&mut rec, rt, step, l, tl)?;
        }
    }
    match (&step.trellis_head, &s.trellis) {
        (Some(th), Some(ts)) => trellis_launch(
            &mut rec,
            rt,
            Part::Head,
            ts,
            th,
            step.layers
                .iter()
                .find_map(|l| l.trellis.map(|t| t.z))
                .unwrap_or(a.logits),
            (a.h, 0),
            Some(final_norm),
            None,
            (a.logits, 0),
            OUT_F32,
        )?,
        _ => matvec(
            &mut rec,
            rt,
            Part::Head,
            &head,
            a.h,
            Some(final_norm),
            None,
            a.logits,
            MODE_NORM | MODE_F32,
        )?,
    }
    let am_blocks = am_g as u32;
    let am_row = (2 * am_g + 2) * 4;
    for t in 0..tiles {
        rec.launch(
            rt,
            Part::Argmax,
            k_am_partial,
            [am_blocks, nbu, 1],
            [ARGMAX_THREADS, 1, 1],
            0,
            &[
                Arg::Buf(a.logits, at(t, s.vocab * 4)),
                Arg::Buf(a.bias, at(t, s.vocab * 4)),
                Arg::Buf(a.am_part, at(t, am_row)),
                Arg::Buf(a.am_ctl, at(t, 16)),
                Arg::I64(s.vocab as i64),
            ],
        )?;
    }
    for t in 0..tiles {
        rec.launch(
            rt,
            Part::Argmax,
            k_am_pick,
            [am_blocks, nbu, 1],
            [ARGMAX_THREADS, 1, 1],
            0,
            &[
                Arg::Buf(a.logits, at(t, s.vocab * 4)),
                Arg::Buf(a.bias, at(t, s.vocab * 4)),
                Arg::Buf(a.am_part, at(t, am_row)),
                Arg::Buf(a.am_ctl, at(t, 16)),
                Arg::Buf(a.state, at(t, 16)),
                Arg::Buf(a.tokens, at(t, cap * 8)),
                Arg::I64(s.vocab as i64),
                Arg::I64(cap as i64),
            ],
        )?;
    }
    if let Some(c) = rec.collect.take() {
        return Ok(c);
    }
    if let (true, Ok(p)) = (rec.persist, &step.persist) {
        let k = rec.kernel(rt, "persist_step")?;
        rec.launch(
            rt,
            Part::Head,
            k,
            [p.grid, 1, 1],
            [MV_THREADS, 1, 1],
            p.shared,
            &[
                Arg::Buf(p.table, 0),
                Arg::I64(p.phases as i64),
                Arg::Buf(p.counter, 0),
                Arg::I64(p.attn_at as i64),
                p.trace.map_or(Arg::I64(0), |b| Arg::Buf(b, 0)),
            ],
        )?;
    }
    Ok(Vec::new())
}

/// The persistent step of `set`, or why the step runs its kernels: not asked for, a step it
/// does not take ([`persist_build`]'s none), or a failure building it (its table, its launch
/// settings), which leaves the kernels running as well.
fn persist_status(
    rt: &mut GpuRuntime,
    step: &Step,
    set: Set,
) -> std::result::Result<PersistStep, String> {
    if !step.params.persist {
        return Err("not asked for (MLX_GRAPH_PERSIST is not 1 or 2)".into());
    }
    let why = match persist_build(rt, step, set) {
        Ok(Some(p)) => return Ok(p),
        Ok(None) => persist_spec(&step.shape, set.nb, step.mma)
            .unwrap_or("one tile of one row a step, and a block that fits a multiprocessor")
            .to_string(),
        Err(e) => e.to_string(),
    };
    Err(format!("MLX_GRAPH_PERSIST does nothing here: {why}"))
}

/// The persistent step of `set` (`MLX_GRAPH_PERSIST=1`), or none where it does not apply (the
/// switch off, a step [`persist_spec`] turns down, more than one tile, a module compiled
/// without it, or no block of it fitting a multiprocessor): the phases `record_step` would
/// launch, collected without launching, written to a table on the device by `persist_fill`
/// (one launch a phase, here, before the step is captured: the launcher resolves their
/// buffers), and the grid sized so that every block is resident at once (the grid barrier
/// waits for all of them).
fn persist_build(rt: &mut GpuRuntime, step: &Step, set: Set) -> Result<Option<PersistStep>> {
    if !step.params.persist
        || persist_spec(&step.shape, set.nb, step.mma).is_some()
        || set.tiles != 1
        || step.tiles != 1
    {
        return Ok(None);
    }
    let (Ok(k_step), Ok(k_fill)) = (
        rt.kernel_in(set.module, "persist_step"),
        rt.kernel_in(set.module, "persist_fill"),
    ) else {
        return Ok(None);
    };
    let phases = record_step_with(rt, step, set, None, None, Some(Vec::new()))?;
    // A kernel of the step that no phase runs would run outside the persistent kernel, out of
    // the step's order: the kernels then, as where the step does not qualify.
    if phases.is_empty() || phases.iter().any(|p| p.kind == NOT_A_PHASE) {
        return Ok(None);
    }
    let looped = persist_loop();
    if looped {
        let kinds: Vec<i64> = phases.iter().map(|p| p.kind).collect();
        if let Some(why) = persist_loop_shape(&kinds) {
            return Err(invalid("graph_decoder", why));
        }
    }
    let table = rt.alloc(phases.len() * PS_WORDS * 8)?;
    let counter = rt.alloc_from(&[0u8; 8])?;
    for (i, ph) in phases.iter().enumerate() {
        if ph.args.len() > PS_WORDS - 3 {
            return Err(invalid(
                "graph_decoder",
                format!(
                    "persistent step: a phase of {} arguments, more than {}",
                    ph.args.len(),
                    PS_WORDS - 3
                ),
            ));
        }
        let mut args = vec![
            Arg::Buf(table, i * PS_WORDS * 8),
            Arg::I64(ph.kind),
            Arg::I64(i64::from(ph.grid[0])),
            Arg::I64(i64::from(ph.grid[1])),
        ];
        args.extend_from_slice(&ph.args);
        args.resize(PS_WORDS + 1, Arg::I64(0));
        rt.launch(k_fill, [1, 1, 1], [32, 1, 1], 0, &args)?;
    }
    rt.synchronize()?;
    let attn_at = phases
        .iter()
        .map(|p| p.shared)
        .max()
        .unwrap_or(0)
        .next_multiple_of(16);
    let table_bytes = if persist_smem_table() {
        u32::try_from(phases.len() * (PS_WORDS + 1) * 8).unwrap_or(u32::MAX)
    } else {
        0
    };
    let loop_bytes = if looped { PS_LOOP_STATE_BYTES } else { 0 };
    let shared = (attn_at + 64 + 2 * PS_ATTN_BYTES)
        .saturating_add(table_bytes)
        .saturating_add(loop_bytes);
    if shared > MV_SHARED_MAX {
        return Err(invalid(
            "graph_decoder",
            format!(
                "persistent step: a block needs {shared} bytes of shared memory (the phase \
                 table's {table_bytes} with MLX_GRAPH_PERSIST_SMEM=1, the layer loop's \
                 {loop_bytes} with MLX_GRAPH_PERSIST_LOOP=1), more than the {MV_SHARED_MAX} a \
                 block may take"
            ),
        ));
    }
    if shared > 48 * 1024 {
        rt.set_shared_limit(k_step, shared)?;
    }
    let grid = rt
        .resident_blocks(k_step, MV_THREADS, shared)?
        .min(step.mv_cap)
        .min(persist_blocks_cap().unwrap_or(u32::MAX));
    if grid == 0 {
        return Ok(None);
    }
    let trace = match persist_trace_path() {
        Some(_) => Some(rt.alloc((phases.len() + 1) * grid as usize * PS_TW * 8)?),
        None => None,
    };
    let kinds = phases.iter().map(|p| p.kind).collect();
    Ok(Some(PersistStep {
        module: set.module,
        first_row: set.first_row,
        table,
        phases: phases.len(),
        counter,
        grid,
        shared,
        attn_at,
        kinds,
        trace,
    }))
}

/// `trellis_linear`'s static shared memory (the output's Hadamard buffer, the reductions and
/// the flag), on top of a plan's dynamic bytes.
const TRELLIS_STATIC_SHARED: u32 = crate::graph_trellis::STATIC_SHARED;

/// Opts `trellis_linear` in to the dynamic shared memory its widest input takes, where that is
/// past the default 48 KiB (with its static buffers).
fn trellis_shared_limit(
    rt: &mut GpuRuntime,
    sw: &TrellisSwitches,
    layers: &[Layer],
    head: Option<TLin>,
) -> Result<()> {
    let widest = layers
        .iter()
        .filter_map(|l| l.trellis.as_ref())
        .flat_map(|t| [t.o, t.down])
        .chain(head)
        .map(|t| tlin_shared(sw, &t))
        .max()
        .unwrap_or(0);
    // trellis_qkv's input is the hidden state, as o's output and gate's input are.
    let qkv = layers
        .iter()
        .filter_map(|l| l.trellis.as_ref())
        .map(|t| tqkv_shared(sw, &t.qkv))
        .max()
        .unwrap_or(0);
    // trellis_gate_up's input is the hidden state too.
    let gate_up = layers
        .iter()
        .filter_map(|l| l.trellis.as_ref())
        .map(|t| tqkv_shared(sw, &t.gu))
        .max()
        .unwrap_or(0);
    for (name, bytes) in [
        ("trellis_linear", widest),
        ("trellis_qkv", qkv),
        ("trellis_gate_up", gate_up),
    ] {
        if bytes + TRELLIS_STATIC_SHARED > 48 * 1024 {
            let k = rt.kernel(name)?;
            rt.set_shared_limit(k, bytes)?;
        }
    }
    Ok(())
}

/// `trellis_linear`'s dynamic shared memory for `w` under the model's switches
/// ([`TrellisSwitches::epilogue_shared_bytes`]: the plan's, and with `TRELLIS_ALIAS` room for
/// the output's Hadamard block).
fn tlin_shared(sw: &TrellisSwitches, w: &TLin) -> u32 {
    sw.epilogue_shared_bytes(w.shared_bytes, w.hb_rows)
}

/// `trellis_qkv`'s or `trellis_gate_up`'s dynamic shared memory for `f` (the launch's plan,
/// and with `TRELLIS_ALIAS` room for the widest of its parts' output Hadamard blocks).
fn tqkv_shared(sw: &TrellisSwitches, f: &TQkv) -> u32 {
    sw.epilogue_shared_bytes(f.q.shared_bytes, f.q.hb_rows.max(f.k.hb_rows))
}

/// Blocks of a fused trellis kernel's launch ([`TrellisSwitches::threads`] a block) over `rows` rows
/// (`lanes` lanes a row, `shared` bytes of shared memory a block), per slice of a grid of
/// `slices` (the matrices one launch covers): enough blocks for the rows, at most the slice's
/// share of the resident ones.
fn trellis_blocks(
    rec: &Recorder,
    rt: &mut GpuRuntime,
    k: Kernel,
    (rows, lanes, shared): (usize, u32, u32),
    slices: u32,
) -> Result<u32> {
    let threads = rec.step.params.trellis.threads;
    let resident = rt.resident_blocks(k, threads, shared)?.min(rec.step.mv_cap) / slices;
    Ok(rows
        .div_ceil(fused_rows_per_block(threads, lanes))
        .min(resident.max(1) as usize) as u32)
}

/// Rows a block of a fused trellis kernel takes at once (`threads` a block, `lanes` a row).
fn fused_rows_per_block(threads: u32, lanes: u32) -> usize {
    (threads as usize / 32) * (32 / lanes as usize)
}

/// One `trellis_linear` launch (one sequence): `out = op(su * H_r (Wt (H_c (sv * x))))`, `x`
/// the bfloat16 input at `x` (normed by `norm` first when given), the output's op `mode`
/// (`graph_trellis::OUT_*`; the bias added where the linear has one) with `res`.
#[allow(clippy::too_many_arguments)]
fn trellis_launch(
    rec: &mut Recorder,
    rt: &mut GpuRuntime,
    part: Part,
    spec: &TrellisSpec,
    w: &TLin,
    z: Buffer,
    x: (Buffer, usize),
    norm: Option<Buffer>,
    res: Option<Buffer>,
    out: (Buffer, usize),
    mode: i64,
) -> Result<()> {
    let k = rt.kernel("trellis_linear")?;
    let sw = rec.step.params.trellis;
    let shared = tlin_shared(&sw, w);
    let blocks = trellis_blocks(rec, rt, k, (w.rows, w.lanes_per_row, shared), 1)?;
    let mode = mode | if w.bias.is_some() { OUT_BIAS } else { 0 };
    rec.launch(
        rt,
        part,
        k,
        [blocks, 1, 1],
        [sw.threads, 1, 1],
        shared,
        &[
            Arg::Buf(w.words, 0),
            Arg::Buf(w.scales, 0),
            Arg::Buf(x.0, x.1),
            Arg::Buf(norm.unwrap_or(x.0), 0),
            Arg::Buf(w.sv, 0),
            Arg::Buf(z, 0),
            Arg::Buf(w.counts, 0),
            Arg::Buf(w.su, 0),
            Arg::Buf(w.bias.unwrap_or(w.su), 0),
            Arg::Buf(res.unwrap_or(out.0), 0),
            Arg::Buf(out.0, out.1),
            Arg::I64(w.rows as i64),
            Arg::I64(w.cols as i64),
            Arg::I64(i64::from(spec.k)),
            Arg::I64(l_arg(spec)),
            Arg::I64(spec.block as i64),
            Arg::I64(i64::from(w.lanes_per_row)),
            Arg::I64(w.hb_cols as i64),
            Arg::F64(f64::from(w.hscale_cols)),
            Arg::I64(i64::from(norm.is_some())),
            Arg::F64(f64::from(rec.step.shape.eps)),
            Arg::I64(w.hb_rows as i64),
            Arg::F64(f64::from(w.hscale_rows)),
            Arg::I64(mode),
        ],
    )
}

/// A trellis layer's q, k and v (one sequence) in one `trellis_qkv` launch: grid slice z of
/// the three matrices, the input norm in its prologue, RoPE and the cache write in its
/// epilogue (bit-equal to three `trellis_linear` launches then `trellis_rope_qkv`: the
/// emulator's check). The attention that follows is the affine step's.
fn record_trellis_qkv(
    rec: &mut Recorder,
    rt: &mut GpuRuntime,
    step: &Step,
    l: &Layer,
    t: &TrellisLayer,
) -> Result<()> {
    let (s, a, f) = (&step.shape, &step.acts, &t.qkv);
    let k = rt.kernel("trellis_qkv")?;
    let sw = step.params.trellis;
    let shared = tqkv_shared(&sw, f);
    let grid = if sw.qkv_flat() {
        // One flat grid, the slices' blocks in proportion to their rows (the kernel splits
        // it with qkv_kv_blocks' formula): enough for every slice's rows, at most the resident
        // blocks, at least one a slice.
        let resident = rt
            .resident_blocks(k, sw.threads, shared)?
            .min(rec.step.mv_cap);
        let need =
            f.q.rows
                .div_ceil(fused_rows_per_block(sw.threads, f.q.lanes_per_row))
                + 2 * f
                    .k
                    .rows
                    .div_ceil(fused_rows_per_block(sw.threads, f.k.lanes_per_row));
        let total = (need.min(resident as usize) as u32).max(3);
        [total, 1, 1]
    } else {
        // Three slices of the grid: a third of the resident blocks each.
        let blocks = trellis_blocks(rec, rt, k, (f.q.rows, f.q.lanes_per_row, shared), 3)?;
        [blocks, 1, 3]
    };
    rec.launch(
        rt,
        Part::Qkv,
        k,
        grid,
        [sw.threads, 1, 1],
        shared,
        &[
            Arg::Buf(f.words, 0),
            Arg::Buf(f.scales, 0),
            Arg::Buf(a.h, 0),
            Arg::Buf(l.in_norm, 0),
            Arg::Buf(f.sv, 0),
            Arg::Buf(t.z, 0),
            Arg::Buf(f.counts, 0),
            Arg::Buf(f.su, 0),
            Arg::Buf(f.bias.unwrap_or(f.su), 0),
            Arg::Buf(a.qkv, 0),
            Arg::Buf(l.kc, 0),
            Arg::Buf(l.vc, 0),
            Arg::Buf(a.state, 0),
            Arg::Buf(a.rope, l.rope_off),
            Arg::I64(s.heads as i64),
            Arg::I64(s.kv_heads as i64),
            Arg::I64(s.head_dim as i64),
            Arg::I64(step.capacity as i64),
            Arg::I64(l.nrot as i64),
            Arg::I64(i64::from(s.rope.traditional)),
            Arg::I64(f.q.cols as i64),
            Arg::I64(i64::from(t.spec.k)),
            Arg::I64(l_arg(&t.spec)),
            Arg::I64(t.spec.block as i64),
            Arg::I64(i64::from(f.q.lanes_per_row)),
            Arg::I64(i64::from(f.k.lanes_per_row)),
            Arg::I64(f.q.hb_cols as i64),
            Arg::F64(f64::from(f.q.hscale_cols)),
            Arg::F64(f64::from(s.eps)),
            Arg::F64(f64::from(f.q.hscale_rows)),
            Arg::F64(f64::from(f.k.hscale_rows)),
            Arg::I64(i64::from(f.bias.is_some())),
        ],
    )
}

/// A trellis layer's output projection (the residual added in its epilogue), gate (to `g`),
/// up (SwiGLU with `g` in its epilogue, to `act`) and down (the residual added): four
/// `trellis_linear` launches, the post-attention norm in gate's and up's prologues.
fn record_trellis_mlp(
    rec: &mut Recorder,
    rt: &mut GpuRuntime,
    step: &Step,
    l: &Layer,
    t: &TrellisLayer,
) -> Result<()> {
    let a = &step.acts;
    let post_norm = l.post_norm;
    let h = (a.h, 0);
    let sp = &t.spec;
    trellis_launch(
        rec,
        rt,
        Part::Output,
        sp,
        &t.o,
        t.z,
        (a.attn, 0),
        None,
        Some(a.h),
        h,
        OUT_RES,
    )?;
    let (f, k) = (&t.gu, rt.kernel("trellis_gate_up")?);
    let sw = step.params.trellis;
    let shared = tqkv_shared(&sw, f);
    // Two slices of the grid: half of the resident blocks each.
    let blocks = trellis_blocks(rec, rt, k, (f.q.rows, f.q.lanes_per_row, shared), 2)?;
    rec.launch(
        rt,
        Part::GateUp,
        k,
        [blocks, 1, 2],
        [sw.threads, 1, 1],
        shared,
        &[
            Arg::Buf(f.words, 0),
            Arg::Buf(f.scales, 0),
            Arg::Buf(a.h, 0),
            Arg::Buf(post_norm, 0),
            Arg::Buf(f.sv, 0),
            Arg::Buf(t.z, 0),
            Arg::Buf(f.counts, 0),
            Arg::Buf(f.su, 0),
            Arg::Buf(t.g, 0),
            Arg::Buf(a.act, 0),
            Arg::I64(f.q.rows as i64),
            Arg::I64(f.q.cols as i64),
            Arg::I64(i64::from(sp.k)),
            Arg::I64(l_arg(sp)),
            Arg::I64(sp.block as i64),
            Arg::I64(i64::from(f.q.lanes_per_row)),
            Arg::I64(f.q.hb_cols as i64),
            Arg::F64(f64::from(f.q.hscale_cols)),
            Arg::F64(f64::from(rec.step.shape.eps)),
            Arg::I64(f.q.hb_rows as i64),
            Arg::F64(f64::from(f.q.hscale_rows)),
        ],
    )?;
    trellis_launch(
        rec,
        rt,
        Part::Down,
        sp,
        &t.down,
        t.z,
        (a.act, 0),
        None,
        Some(a.h),
        h,
        OUT_RES,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` rows of `width` columns, row r holding `base + r` (float32).
    fn rows(n: usize, width: usize, base: f32) -> Array {
        let v: Vec<f32> = (0..n)
            .flat_map(|r| std::iter::repeat_n(base + r as f32, width))
            .collect();
        Array::from_slice(&v, &[n as i32, width as i32]).unwrap()
    }

    fn firsts(a: &Array, width: usize) -> Vec<f32> {
        a.to_vec::<f32>()
            .unwrap()
            .chunks(width)
            .map(|c| c[0])
            .collect()
    }

    /// A tiny llama-shaped spec (2 layers, hidden 64, 4 heads of 16, 2 KV heads).
    /// The step source's parameters the define tests build with: 2 rows a warp, 4 in flight,
    /// the plain trellis switches.
    fn plain_params() -> SourceParams {
        SourceParams {
            rows: 2,
            batch: 4,
            early: 4,
            min_blocks: None,
            persist: false,
            trellis: TrellisSwitches::PLAIN,
            mv_wide: false,
            late_norm: 0,
            mv_bits: false,
        }
    }

    /// `mlx convert`'s 3-bit default hybrid: gauss7s, L 12, blocks of 64, and the value
    /// projections' 1mad twin.
    fn hybrid_trellis() -> (TrellisSpec, TrellisSpec) {
        use mlx_core::cpu::trellis::TrellisCode;
        let t = TrellisSpec {
            k: 3,
            l: 12,
            block: 64,
            code: TrellisCode::Gauss7S,
        };
        let v = TrellisSpec {
            code: TrellisCode::Mad,
            ..t
        };
        (t, v)
    }

    pub(crate) fn tiny_spec() -> GraphSpec {
        GraphSpec {
            model_type: "llama".into(),
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 128,
            vocab: 100,
            eps: 1e-5,
            attn_scale: 0.25,
            rope: GraphRope::from_base(16, false, 10000.0, 1.0),
            rope_layers: vec![true, true],
            tied: true,
            qkv_bias: false,
            qk_norm: false,
            qk_norm_full: false,
            quant: None,
            embed_scale: 1.0,
            sandwich: false,
            post_only: false,
            gelu: false,
            sliding: Vec::new(),
            sliding_window: 0,
            local_rope: None,
            attn_softcap: 0.0,
            attn_sinks: false,
            o_bias: false,
            final_softcap: 0.0,
            residual_scale: 0.0,
            logit_div: 0.0,
            moe: None,
            trellis: None,
            trellis_v: None,
        }
    }

    fn zeros(shape: &[i32]) -> Array {
        ops::zeros(shape, Dtype::Bfloat16, None).unwrap()
    }

    fn dense(n: usize, k: usize) -> GraphLinear {
        GraphLinear {
            weight: zeros(&[n as i32, k as i32]),
            scales: None,
            biases: None,
            bias: None,
            trellis: None,
        }
    }

    pub(crate) fn tiny_weights(s: &GraphSpec) -> GraphWeights {
        let (h, d) = (s.hidden, s.head_dim);
        let (qn, kn) = match s.qk_norm_full {
            true => (s.heads * d, s.kv_heads * d),
            false => (d, d),
        };
        GraphWeights {
            embed: dense(s.vocab, h),
            head: None,
            final_norm: zeros(&[h as i32]),
            layers: (0..s.layers)
                .map(|_| GraphLayer {
                    input_norm: zeros(&[h as i32]),
                    post_norm: zeros(&[h as i32]),
                    q_norm: s.qk_norm.then(|| zeros(&[qn as i32])),
                    k_norm: s.qk_norm.then(|| zeros(&[kn as i32])),
                    post_attn_norm: s.sandwich.then(|| zeros(&[h as i32])),
                    post_mlp_norm: s.sandwich.then(|| zeros(&[h as i32])),
                    q: dense(s.heads * d, h),
                    k: dense(s.kv_heads * d, h),
                    v: dense(s.kv_heads * d, h),
                    o: dense(h, s.heads * d),
                    gate: dense(s.intermediate, h),
                    up: dense(s.intermediate, h),
                    down: dense(h, s.intermediate),
                    router: None,
                    sinks: s.attn_sinks.then(|| zeros(&[s.heads as i32])),
                })
                .collect(),
        }
    }

    /// [`tiny_spec`] with experts: 8 of width 32, 2 a token, layer 1 dense.
    fn tiny_moe_spec() -> GraphSpec {
        GraphSpec {
            model_type: "qwen3_moe".into(),
            moe: Some(GraphMoe {
                experts: 8,
                top_k: 2,
                intermediate: 32,
                router: GraphRouter::SoftmaxTopK { norm: true },
                layers: vec![true, false],
                router_quant: None,
                oai: false,
                mxfp4: false,
            }),
            ..tiny_spec()
        }
    }

    /// [`tiny_weights`] with the experts' stacked arrays and a router in the MoE layers.
    fn tiny_moe_weights(s: &GraphSpec) -> GraphWeights {
        let mut w = tiny_weights(s);
        let m = s.moe.as_ref().unwrap();
        let (e, i, h) = (m.experts as i32, m.intermediate as i32, s.hidden as i32);
        for (l, &moe) in w.layers.iter_mut().zip(&m.layers) {
            if moe {
                let stacked = |n, k| GraphLinear {
                    weight: zeros(&[e, n, k]),
                    scales: None,
                    biases: None,
                    bias: None,
                    trellis: None,
                };
                l.gate = stacked(i, h);
                l.up = stacked(i, h);
                l.down = stacked(h, i);
                l.router = Some(dense(m.experts, s.hidden));
            }
        }
        w
    }

    /// [`super::router_margin`]: the k-th largest logit less the next, over the largest magnitude.
    #[test]
    fn router_margin_is_the_top_k_gap_over_the_largest_magnitude() {
        // Sorted: 3, 2.5, 2, -4; k 2: (2.5 - 2) / 4.
        assert_eq!(super::router_margin(&[2.0, 3.0, -4.0, 2.5], 2), 0.125);
        assert_eq!(super::router_margin(&[1.0, 1.0, 0.5], 1), 0.0);
        // No (k + 1)-th logit, or k 0: no tie to be near.
        assert_eq!(super::router_margin(&[1.0, 2.0], 2), 1.0);
        assert_eq!(super::router_margin(&[1.0, 2.0], 0), 1.0);
    }

    /// gpt_oss's spec: mxfp4 experts with biases, the clamped SwiGLU, a biased router and
    /// output projection, sinks. Its weights' shapes and dtypes are checked (mxfp4: uint32
    /// codes `[E, n, k / 8]`, uint8 scales `[E, n, k / 32]`, no biases; the experts' biases
    /// `[E, n]`), the step source compiles its pieces in (and no other spec's does), and the
    /// output projection does not combine the attention's partials (it adds its bias in
    /// matvec).
    #[test]
    fn gpt_oss_specs_and_weights_name_their_problems() {
        let mut s = tiny_moe_spec();
        s.model_type = "gpt_oss".into();
        s.o_bias = true;
        s.attn_sinks = true;
        let m = s.moe.as_mut().unwrap();
        (m.oai, m.mxfp4, m.router) = (true, true, GraphRouter::TopKSoftmax);
        s.check().unwrap();
        let mut w = tiny_moe_weights(&s);
        let (e, i, h) = (8, 32, s.hidden as i32);
        let bf = |shape: &[i32]| zeros(shape);
        for l in w.layers.iter_mut() {
            l.o.bias = Some(bf(&[h]));
            l.sinks = Some(bf(&[s.heads as i32]));
            if let Some(r) = l.router.as_mut() {
                r.bias = Some(bf(&[e]));
                let fp4 = |n: i32, k: i32| GraphLinear {
                    weight: zeros(&[e, n, k / 8]).astype(Dtype::Uint32).unwrap(),
                    scales: Some(zeros(&[e, n, k / 32]).astype(Dtype::Uint8).unwrap()),
                    biases: None,
                    bias: Some(bf(&[e, n])),
                    trellis: None,
                };
                (l.gate, l.up, l.down) = (fp4(i, h), fp4(i, h), fp4(h, i));
            }
        }
        w.check(&s).unwrap();
        let mut bad = w.clone();
        bad.layers[0].down.scales = Some(zeros(&[e, h, i / 32]));
        bad.layers[0].gate.bias = None;
        bad.layers[0].o.bias = None;
        let err = bad.check(&s).unwrap_err();
        for want in [
            "layers.0.experts.down_proj.scales: [8, 64, 1] bfloat16, expected [8, 64, 1] uint8",
            "layers.0.experts.gate_proj: no bias",
            "layers.0.o_proj: no bias",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        let p = plain_params();
        let (src, _) = step_source(&s, &p, 1, false, false);
        for d in ["MV_FP4 1", "MV_OUT_BIAS 1", "MOE_OAI 1", "ATTN_SINKS 1"] {
            assert!(src.contains(&format!("#define {d}\n")), "{d}");
        }
        let (plain, _) = step_source(&tiny_moe_spec(), &p, 1, false, false);
        for d in ["MV_FP4 1", "MV_OUT_BIAS 1", "MOE_OAI 1", "ATTN_SINKS 1"] {
            assert!(!plain.contains(&format!("#define {d}\n")), "{d}");
        }
        assert!(!attn_combine_in_output(&s, 1, 1, Some(true)));
        assert!(attn_combine_in_output(&tiny_moe_spec(), 1, 1, Some(true)));
        // mxfp4 experts need hidden and the width in groups of 32.
        let mut t = s.clone();
        t.moe.as_mut().unwrap().intermediate = 48;
        assert!(t.check().unwrap_err().contains("expert width 48"));
        // No trellis-coded layers with a biased output projection.
        let mut t = tiny_spec();
        t.o_bias = true;
        t.trellis = Some(TrellisSpec {
            k: 3,
            l: 8,
            block: 32,
            code: mlx_core::cpu::trellis::TrellisCode::Mad,
        });
        assert!(t.check().unwrap_err().contains("an output-projection bias"));
    }

    #[test]
    fn moe_specs_and_weights_name_their_problems() {
        let s = tiny_moe_spec();
        s.check().unwrap();
        tiny_moe_weights(&s).check(&s).unwrap();
        type Edit = fn(&mut GraphMoe);
        for (f, what) in [
            ((|m| m.experts = 0) as Edit, "0 experts"),
            (|m| m.experts = 2000, "2000 experts"),
            (|m| m.top_k = 9, "9 experts a token of 8"),
            (|m| m.top_k = 0, "0 experts a token"),
            (|m| m.layers = vec![true], "1 layer entries"),
            (|m| m.intermediate = 20, "expert width 20"),
            (|m| m.router_quant = Some((64, 3)), "router quantization"),
        ] {
            let mut t = s.clone();
            f(t.moe.as_mut().unwrap());
            let e = t.check().unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        let mut w = tiny_moe_weights(&s);
        w.layers[0].router = None;
        w.layers[1].router = Some(dense(8, 64));
        w.layers[0].down = dense(64, 32);
        let e = w.check(&s).unwrap_err();
        for what in [
            "layers.0.router: missing",
            "layers.1.router: a router in a dense layer",
        ] {
            assert!(e.contains(what), "{what}: {e}");
        }
        let mut w = tiny_moe_weights(&s);
        w.layers[0].down = dense(64, 32);
        let e = w.check(&s).unwrap_err();
        assert!(
            e.contains(
                "layers.0.experts.down_proj.weight: [64, 32] bfloat16, expected [8, 64, 32]"
            ),
            "{e}"
        );
        // A mixture-of-experts model decodes one sequence a step.
        let opts = GraphOptions {
            sequences: 2,
            ..GraphOptions::default()
        };
        let e = GraphDecoder::with_options(s.clone(), &tiny_moe_weights(&s), 64, &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one sequence a step"), "{e}");
        assert_eq!(GraphDecoder::max_sequences(&s), 1);
        // The experts' down product takes the top_k activations side by side as its input.
        assert!(s.mv_inputs().contains(&(64, 16)));
        assert!(s.mv_inputs().contains(&(2 * 32, 16)));
    }

    #[test]
    fn non_finite_logits_never_compare_as_close() {
        let r = [1.0f32, 2.0, 3.0];
        assert_eq!(compare_logits(&r, &r).rel_diff, 0.0);
        for bad in [f32::NAN, f32::INFINITY] {
            let o = [1.0f32, bad, 3.0];
            assert!(compare_logits(&r, &o).rel_diff > 1.0);
            assert!(compare_logits(&o, &r).rel_diff > 1.0);
        }
    }

    #[test]
    fn the_tiny_spec_and_weights_pass_their_checks() {
        let s = tiny_spec();
        s.check().unwrap();
        tiny_weights(&s).check(&s).unwrap();
    }

    #[test]
    fn bad_specs_and_weights_name_the_problem() {
        let s = tiny_spec();
        for (f, what) in [
            (
                (|s: &mut GraphSpec| s.head_dim = 48) as fn(&mut GraphSpec),
                "head_dim 48",
            ),
            (|s| s.kv_heads = 3, "not a multiple"),
            (|s| s.rope.inv_freq = vec![1.0; 9], "9 rotated pairs"),
            (|s| s.rope_layers = vec![true], "rope_layers"),
            (|s| s.quant = Some((16, 4)), "group size 16"),
            (|s| s.eps = f32::NAN, "eps"),
            (|s| s.sliding = vec![true], "sliding: 1 entries"),
            (
                |s| s.local_rope = Some(GraphRope::from_base(16, true, 10.0, 1.0)),
                "local_rope: traditional",
            ),
            (|s| s.final_softcap = f32::INFINITY, "final_softcap"),
            (|s| s.residual_scale = f32::NAN, "residual_scale"),
            (|s| s.logit_div = -1.0, "logit_div"),
            (|s| s.embed_scale = 0.0, "embed_scale 0"),
            (|s| s.post_only = true, "post_only without sandwich norms"),
            (|s| s.qk_norm_full = true, "qk_norm_full without qk_norm"),
        ] {
            let mut t = s.clone();
            f(&mut t);
            let e = t.check().unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        let mut w = tiny_weights(&s);
        w.layers[1].k = dense(8, 64);
        w.layers[0].q.bias = Some(zeros(&[64]));
        w.head = Some(dense(100, 64));
        let e = w.check(&s).unwrap_err();
        assert!(e.starts_with("3 weight problem(s)"), "{e}");
        for what in [
            "layers.1.k_proj.weight: [8, 64] bfloat16, expected [32, 64] bfloat16",
            "layers.0.q_proj: a bias is not supported",
            "lm_head: given for a tied model",
        ] {
            assert!(e.contains(what), "{what}: {e}");
        }
        // Sandwich norms: both post-norms a layer, only with the spec's knob.
        let mut sw = s.clone();
        sw.sandwich = true;
        let mut w = tiny_weights(&sw);
        w.layers[0].post_mlp_norm = None;
        let e = w.check(&sw).unwrap_err();
        assert!(e.contains("layers.0.post_mlp_norm: missing"), "{e}");
        let e = tiny_weights(&sw).check(&s).unwrap_err();
        assert!(e.contains("given, the spec has no sandwich norms"), "{e}");
        // OLMo 2: post norms only, q/k norms over the whole projections (their widths).
        let olmo = GraphSpec {
            sandwich: true,
            post_only: true,
            qk_norm: true,
            qk_norm_full: true,
            ..s.clone()
        };
        assert_eq!(olmo.check(), Ok(()));
        assert_eq!(tiny_weights(&olmo).check(&olmo), Ok(()));
        let per_head = GraphSpec {
            qk_norm_full: false,
            ..olmo.clone()
        };
        let e = tiny_weights(&per_head).check(&olmo).unwrap_err();
        assert!(
            e.contains("layers.0.q_norm: [16] bfloat16, expected [64] bfloat16"),
            "{e}"
        );
        assert!(
            e.contains("layers.0.k_norm: [16] bfloat16, expected [32] bfloat16"),
            "{e}"
        );
        // gpt_oss's attention sinks: a head each, only with the spec's knob.
        let sk = GraphSpec {
            attn_sinks: true,
            ..s.clone()
        };
        let mut w = tiny_weights(&sk);
        assert_eq!(w.check(&sk), Ok(()));
        w.layers[1].sinks = Some(zeros(&[3]));
        w.layers[0].sinks = None;
        let e = w.check(&sk).unwrap_err();
        assert!(
            e.contains("layers.1.sinks: [3] bfloat16, expected [4] bfloat16"),
            "{e}"
        );
        assert!(e.contains("layers.0.sinks: missing"), "{e}");
        let e = tiny_weights(&sk).check(&s).unwrap_err();
        assert!(
            e.contains("layers.0.sinks: given, the spec has none"),
            "{e}"
        );
    }

    #[test]
    fn rope_tables_are_mlx_inverse_frequencies() {
        let r = GraphRope::from_base(8, false, 10000.0, 0.5);
        assert_eq!(r.pairs(), 4);
        assert_eq!(r.inv_freq[0], 1.0);
        assert!((r.inv_freq[2] - 0.01).abs() < 1e-7);
        assert_eq!(r.position_scale, 0.5);
        let f = GraphRope::from_freqs(true, &[1.0, 4.0], 1.25);
        assert_eq!(f.inv_freq, [1.0, 0.25]);
        assert_eq!(f.output_scale, 1.25);
    }

    #[test]
    fn a_step_takes_the_fewest_tiles_of_the_fewest_rows() {
        // The 8B's decoder of 16 sequences: 3 tiles of 6.
        let want = [
            (1, (1, 1)),
            (2, (2, 1)),
            (3, (3, 1)),
            (6, (6, 1)),
            (7, (4, 2)),
            (9, (5, 2)),
            (12, (6, 2)),
            (13, (5, 3)),
            (16, (6, 3)),
            (18, (6, 3)),
            (40, (6, 3)),
            (0, (1, 1)),
        ];
        for (m, w) in want {
            assert_eq!(fit_tiles(m, 6, 3, None), w, "{m} rows");
        }
        for nb in 1..=8 {
            for tiles in 1..=8 {
                for m in 1..=nb * tiles {
                    let (w, t) = fit_tiles(m, nb, tiles, None);
                    assert!(w <= nb && t <= tiles && w * t >= m && w * t <= nb * tiles);
                    assert_eq!(t, m.div_ceil(nb), "the fewest tiles");
                    assert!(w == 1 || (w - 1) * t < m, "the fewest rows a tile");
                }
            }
        }
    }

    /// A Llama-3-8B-shaped spec (4-bit weights in groups of 64): `mlx serve`'s model of
    /// issue #30's serve row.
    fn spec_8b() -> GraphSpec {
        GraphSpec {
            hidden: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            intermediate: 14336,
            vocab: 128256,
            rope: GraphRope::from_base(128, false, 500000.0, 1.0),
            rope_layers: vec![true; 32],
            tied: false,
            quant: Some((64, 4)),
            ..tiny_spec()
        }
    }

    /// (modules, step graphs) a decoder of `want` rows holds after `prepare_rows(want)`: the
    /// constructor's module and graphs (one a tile count), and one module a narrower width
    /// and one graph a distinct (width, tiles, first row) the windows of rows take.
    fn prepared_counts(want: usize, ffma_max: u32, wide: Option<usize>) -> (usize, usize) {
        let (nb, tiles, _) = tile_shape(want, ffma_max, None, wide);
        let step_fit = |m: usize| fit_tiles(m, nb, tiles, wide);
        let (mut widths, mut keys) = (vec![nb], Vec::new());
        for (lo, hi) in windows(want) {
            let (w, t) = step_fit(hi - lo);
            let first = lo.min(nb * tiles - w * t);
            if w == nb && first == 0 {
                continue;
            }
            if !widths.contains(&w) {
                widths.push(w);
            }
            if !keys.contains(&(w, t, first)) {
                keys.push((w, t, first));
            }
        }
        (widths.len(), tiles + keys.len())
    }

    #[test]
    fn the_row_kernels_deferred_scale_reads_are_one_define() {
        // MLX_GRAPH_MV_ASYNC (on unless 0) adds one define; off, the source is the one without
        // it, and the kernel source's own default is off.
        assert_eq!(mv_async_define(true), "#define MV_ASYNC 1\n");
        assert_eq!(mv_async_define(false), "");
        assert!(SOURCE.contains("#ifndef MV_ASYNC\n#define MV_ASYNC 0\n#endif"));
        let p = plain_params();
        let (src, _) = step_source(&tiny_moe_spec(), &p, 1, false, false);
        assert_eq!(
            src.contains("#define MV_ASYNC 1\n"),
            mv_async(),
            "the step source follows MLX_GRAPH_MV_ASYNC (on unless 0)"
        );
    }

    #[test]
    fn the_early_norm_weights_are_one_define() {
        // MLX_GRAPH_EARLY_PROLOGUE=1 adds one define; off (the default), the source is the one
        // without it, and the kernel source's own default is off.
        assert_eq!(
            early_prologue_define(true),
            "#define MV_EARLY_NORM 1\n#define EMBED_BATCH 16\n"
        );
        assert_eq!(early_prologue_define(false), "");
        assert!(SOURCE.contains("#ifndef MV_EARLY_NORM\n#define MV_EARLY_NORM 0\n#endif"));
        assert!(SOURCE.contains("#ifndef EMBED_BATCH\n#define EMBED_BATCH 1\n#endif"));
        let p = plain_params();
        let (src, _) = step_source(&tiny_moe_spec(), &p, 1, false, false);
        assert_eq!(
            src.contains("#define MV_EARLY_NORM 1\n"),
            early_prologue(),
            "the step source follows MLX_GRAPH_EARLY_PROLOGUE (off unless 1)"
        );
    }

    #[test]
    fn the_tiles_constant_slots_are_one_define() {
        // MLX_GRAPH_MV_NB=1 adds one define to the sources of tiles of several rows; a one-row
        // step's source never has it, and the kernel source's own default is off.
        assert_eq!(mv_nb_define(2, true), "#define MV_NB 1\n");
        assert_eq!(mv_nb_define(1, true), "");
        assert_eq!(mv_nb_define(5, false), "");
        assert!(SOURCE.contains("#ifndef MV_NB\n#define MV_NB 0\n#endif"));
        let p = plain_params();
        for nb in [1, 3] {
            let (src, _) = step_source(&tiny_moe_spec(), &p, nb, false, false);
            assert_eq!(
                src.contains("#define MV_NB 1\n"),
                mv_nb() && nb > 1,
                "the step source follows MLX_GRAPH_MV_NB (off unless 1) at several rows"
            );
        }
    }

    #[test]
    fn the_persistent_traces_summary_names_the_phases_and_adds_them_up() {
        // A made-up trace of 9 phases on 2 blocks: phase i's entry at 10 i us, the blocks'
        // arrivals at + 1.0 and + 1.1 us, their departures at + 2 us; the end at 90 us.
        let kinds = [0, 2, 3, 1, 1, 1, 1, 4, 5];
        assert_eq!(
            persist_phase_labels(&kinds),
            [
                "embed",
                "qkv",
                "attention",
                "o",
                "gate_up",
                "down",
                "head",
                "argmax_partial",
                "argmax_pick"
            ]
        );
        assert_eq!(
            persist_phase_labels(&[2, 3, 11, 1, 1]),
            ["qkv", "attention", "attn_out", "gate_up", "down"]
        );
        let (n, grid) = (kinds.len(), 2);
        let mut w = vec![0u64; (n + 1) * grid * PS_TW];
        for i in 0..=n {
            for b in 0..grid {
                let r = &mut w[(i * grid + b) * PS_TW..][..PS_TW];
                let t = 10_000 * i as u64;
                r[0] = t;
                r[1] = t + 1_000 + 100 * b as u64;
                r[2] = t + 2_000;
                r[4] = 2 * r[0];
                r[5] = 2 * r[1];
                r[6] = 2 * r[2];
            }
        }
        let s = persist_trace_summary(&kinds, grid, &w);
        // Each phase spans 10 us; its work ends at the next arrivals (9.0 and 9.1 us after
        // its departure), the barrier 0.9 us; the last phase's ends at the end (8 us).
        assert!(s.contains("phase   3 o              span   10.00  work min   9.00 med   9.10 max   9.10  entry med   8.00  barrier  0.90"), "{s}");
        assert!(s.contains("phase   8 argmax_pick    span    8.00  work min   8.00 med   8.00 max   8.00  entry med   8.00  barrier  0.00"), "{s}");
        assert!(s.contains("block cycles med 18200"), "{s}");
        assert!(
            s.contains("kind o              x1   span    10.00 us"),
            "{s}"
        );
        assert!(s.contains("step 90.00 us: entry to the first departure 2.00, phases 88.00 (barriers 7.20), 9 phases, 2 blocks, 9.78 us a phase; block 0 clock 2.000 GHz"), "{s}");
        assert_eq!(persist_trace_summary(&kinds, 2, &w[..10]), "no trace");
    }

    #[test]
    fn the_persistent_step_is_one_define_for_one_row_llama_steps() {
        // GraphOptions::persistent_step (MLX_GRAPH_PERSIST=1 by default) adds one define and
        // the two persistent kernels to a one-row llama step's source, nothing elsewhere; the
        // kernel source's own default is off (no persistent kernel compiled).
        assert!(SOURCE.contains("#ifndef GRAPH_PERSIST\n#define GRAPH_PERSIST 0\n#endif"));
        assert!(persist_define(true).starts_with("#define GRAPH_PERSIST 1\n"));
        assert_eq!(persist_define(false), "");
        let off = plain_params();
        let on = SourceParams {
            persist: true,
            ..plain_params()
        };
        let s = tiny_spec();
        let (plain, kernels) = step_source(&s, &off, 1, false, false);
        assert!(!plain.contains("#define GRAPH_PERSIST 1\n"));
        assert!(!kernels.iter().any(|k| k.0 == "persist_step"));
        // (MLX_GRAPH_PERSIST_CHUNKS changes the persistent source's chunks: not this check.)
        if std::env::var_os("MLX_GRAPH_PERSIST_CHUNKS").is_none() {
            assert_eq!(persist_spec(&s, 1, false), None);
            let (src, kernels) = step_source(&s, &on, 1, false, false);
            assert!(src.contains(&persist_define(true)));
            assert_eq!(src.replace(&persist_define(true), ""), plain);
            assert!(PERSIST_KERNELS.iter().all(|p| kernels.contains(p)));
        }
        // Several rows, the tensor cores, experts, q/k norms: the kernels, the source unchanged.
        assert!(persist_spec(&s, 2, false).is_some());
        assert!(persist_spec(&s, 1, true).is_some());
        assert!(persist_spec(&tiny_moe_spec(), 1, false).is_some());
        let qk = GraphSpec {
            qk_norm: true,
            ..tiny_spec()
        };
        assert!(persist_spec(&qk, 1, false).is_some());
        for (spec, nb) in [(&s, 3), (&tiny_moe_spec(), 1), (&qk, 1)] {
            let (a, _) = step_source(spec, &on, nb, false, false);
            let (b, _) = step_source(spec, &off, nb, false, false);
            assert_eq!(a, b, "the persistent step's define where it does not apply");
        }
        // A phase's words (PS_WORDS) hold matvec_qkv's arguments, the largest (KERNELS' arity).
        let most = KERNELS
            .iter()
            .filter(|k| PS_PHASES.iter().any(|p| p.0 == k.0))
            .map(|k| k.1 as usize)
            .max();
        assert_eq!(most, Some(PS_WORDS - 3));
        assert!(SOURCE.contains(&format!("#define PS_WORDS {PS_WORDS}\n")));
        assert_eq!(PERSIST_KERNELS[1].1 as usize, PS_WORDS + 1);
    }

    #[test]
    fn the_layer_loop_takes_only_its_shape_of_step() {
        // MLX_GRAPH_PERSIST_LOOP=1 (PS_LOOP): a define of its own, off in the source by
        // default; the same kernel and arguments as the persistent step's (persist_step, 5).
        assert!(SOURCE.contains("#ifndef PS_LOOP\n#define PS_LOOP 0\n#endif"));
        assert!(SOURCE.contains(&format!(
            "static_assert(sizeof(PsLoopState) <= {PS_LOOP_STATE_BYTES},"
        )));
        assert_eq!(PERSIST_KERNELS[0], ("persist_step", 5));
        // Both forms of the step (the loop over the table of functions, the layer loop) are
        // the same kernel with the same five parameters: the launch does not change.
        let head = "__launch_bounds__(256, PS_MIN_BLOCKS) persist_step(const u64* ph, ll n,";
        assert_eq!(SOURCE.matches(head).count(), 2);
        assert!(SOURCE.contains("#if !PS_LOOP\n") && SOURCE.contains("#else  // PS_LOOP\n"));
        // The 135M llama step: embed, 30 layers of five, the head, the argmax pair (154).
        let mut kinds = vec![0];
        for _ in 0..30 {
            kinds.extend([2, 3, 1, 1, 1]);
        }
        kinds.extend([1, 4, 5]);
        assert_eq!(kinds.len(), 154);
        assert_eq!(persist_loop_shape(&kinds), None);
        assert_eq!(persist_loop_shape(&[0, 2, 3, 1, 1, 1, 1, 4, 5]), None);
        // Not its shape: attention combined by the output projection (matvec_attn_out), a
        // phase too few or too many, the head or the sampler missing.
        let mut out = kinds.clone();
        out[3] = 11;
        let why = persist_loop_shape(&out).unwrap();
        assert!(
            why.contains("layer 0's phases are [2, 3, 11, 1, 1]"),
            "{why}"
        );
        assert!(persist_loop_shape(&kinds[..153])
            .unwrap()
            .contains("153 phases"));
        let mut more = kinds.clone();
        more.insert(5, 1);
        assert!(persist_loop_shape(&more).is_some());
        let mut head = kinds.clone();
        head[151] = 4;
        assert!(persist_loop_shape(&head).unwrap().contains("the head"));
        assert!(persist_loop_shape(&[0, 2, 3, 1]).is_some());
        assert!(persist_loop_shape(&[]).is_some());
    }

    #[test]
    fn the_tiles_512_thread_blocks_are_one_define_and_their_launch() {
        // MLX_GRAPH_MV_WIDE=1: FFMA tiles of several rows (not on the tensor cores) get MV_WIDE
        // 1 with one item in flight a lane, and matvec / matvec_qkv launch 512 threads; a
        // one-row step and tensor-core tiles never do, and the kernel source's default is off.
        assert!(mv_wide_in(5, false, true));
        assert!(mv_wide_in(8, false, true));
        assert!(!mv_wide_in(1, false, true), "one row");
        assert!(!mv_wide_in(5, true, true), "tensor cores");
        assert!(!mv_wide_in(5, false, false), "off");
        assert!(SOURCE.contains("#ifndef MV_WIDE\n#define MV_WIDE 0\n#endif"));
        assert!(SOURCE.contains("__launch_bounds__(MV_BOUNDS) matvec("));
        assert!(SOURCE.contains("__launch_bounds__(MV_BOUNDS) matvec_qkv("));
        for wide in [false, true] {
            let p = SourceParams {
                mv_wide: wide,
                ..plain_params()
            };
            for nb in [1, 3] {
                let (src, _) = step_source(&tiny_moe_spec(), &p, nb, false, false);
                let on = mv_wide_in(nb, false, wide);
                assert_eq!(on, wide && nb > 1);
                assert_eq!(
                    src.contains("#define MV_WIDE 1\n"),
                    on,
                    "the step source follows the decoder's MLX_GRAPH_MV_WIDE at several rows"
                );
                assert!(src.contains(&format!(
                    "#define MV_ROWS {}\n#define MV_BATCH {}\n#define MV_EARLY {}\n",
                    p.rows,
                    if on { 1 } else { p.batch },
                    if on { 1 } else { p.early }
                )));
                let t = mv_threads(nb, false, wide);
                assert_eq!(t, if on { 512 } else { MV_THREADS });
            }
        }
        assert_eq!(mv_threads(1, false, true), MV_THREADS);
        assert_eq!(mv_threads(5, true, true), MV_THREADS);
    }

    #[test]
    fn wide_tensor_core_tiles_take_sixteen_rows_in_one_pass() {
        let s = spec_8b();
        let ffma = GraphDecoder::max_sequences(&s);
        assert_eq!(
            ffma, 7,
            "down's inputs (K 14,336) fill the shared memory at 7 rows"
        );
        // Tensor cores from 4 rows (the batch engine's default): one tile of 16, not 3 of 6.
        let wide = wide_from(&s, true, MMA_MIN_SEQUENCES, ffma);
        assert_eq!(wide, Some(4));
        assert_eq!(tile_shape(16, ffma, None, wide), (16, 1, 16));
        assert_eq!(
            tile_shape(16, ffma, None, None),
            (6, 3, 7),
            "session 33's tiles"
        );
        assert_eq!(tile_shape(32, ffma, None, wide), (16, 2, 16));
        assert_eq!(
            tile_shape(3, ffma, None, wide),
            (3, 1, 7),
            "below 4 rows: FFMA"
        );
        assert_eq!(tile_shape(16, ffma, Some(4), wide), (4, 4, 4));
        // Not wide: off, no tensor cores, another quantization, past 16 rows.
        assert_eq!(wide_from(&s, false, 4, ffma), None);
        assert_eq!(wide_from(&s, true, u32::MAX, ffma), None);
        assert_eq!(wide_from(&s, true, 17, ffma), None);
        // Tensor cores from more rows than the FFMA tiles take (MLX_GRAPH_TENSOR_CORES=12 at
        // 8B: FFMA tiles of at most 7 rows): a 9-row step would need an FFMA module of 9
        // rows, so no wide tiles; from 8 rows (one past 7) they apply.
        assert_eq!(wide_from(&s, true, 12, ffma), None);
        assert_eq!(wide_from(&s, true, 8, ffma), Some(8));
        assert_eq!(wide_from(&s, true, 9, 16), Some(9));
        assert_eq!(wide_from(&s, true, 10, 16), None, "past TILE_SEQUENCES + 1");
        let q8 = GraphSpec {
            quant: Some((64, 8)),
            ..spec_8b()
        };
        assert_eq!(wide_from(&q8, true, 4, ffma), None);
        // A step's tile: its rows, rounded up to 8 or 16 from 4 rows.
        let want = [
            (1, 1),
            (2, 2),
            (3, 3),
            (4, 8),
            (7, 8),
            (8, 8),
            (9, 16),
            (16, 16),
        ];
        for (m, w) in want {
            assert_eq!(fit_tiles(m, 16, 1, wide), (w, 1), "{m} rows");
        }
        assert_eq!(fit_tiles(20, 16, 2, wide), (16, 2));
        assert_eq!(fit_tiles(13, 12, 2, wide), (8, 2));
        // The kernels and graphs `mlx serve --max-batch 16` prepares: modules (widths) 6 -> 5,
        // graphs 110 -> 55 (the constructor's tiles included).
        assert_eq!(prepared_counts(16, ffma, None), (6, 110));
        assert_eq!(prepared_counts(16, ffma, wide), (5, 55));
        // Down's inputs of 16 rows (476 KB) staged in chunks of 6,144: 16 x 13,056 bytes, one
        // block a multiprocessor; at 8 rows two blocks of 8 x 13,056. The K 4,096 products
        // stage all of K (16 x 8,704 bytes).
        assert_eq!(mma_min_blocks_with(&s, 16, false), 1);
        assert_eq!(mma_min_blocks_with(&s, 8, false), 2);
        assert_eq!(mma_chunk_with(&s, 16, None, false), Some(6144));
        assert_eq!(mma_chunk_with(&s, 8, None, false), Some(6144));
        assert_eq!(mv_tile_shared(14336, 4, 16, Some(6144)), 16 * 13056);
        assert_eq!(mv_tile_shared(4096, 4, 16, Some(6144)), 16 * 8704);
        assert!(mv_staged_per_sequence(&s, Some(6144)) * 16 + MV_STATIC_SHARED <= MV_SHARED_MAX);
        assert!(
            2 * (mv_tile_shared(14336, 4, 8, Some(6144)) + MV_STATIC_SHARED + 1024) <= SM_SHARED
        );
        // With the cp.async ring (MLX_GRAPH_MMA_ASYNC, on unless 0; 30 KiB more static shared memory
        // a block): 16 rows stage down in chunks of 5,120 (K 4,096 whole), 8 rows keep two
        // blocks a multiprocessor with chunks of 4,096.
        assert_eq!(mma_min_blocks_with(&s, 16, true), 1);
        assert_eq!(mma_min_blocks_with(&s, 8, true), 2);
        assert_eq!(mma_chunk_with(&s, 16, None, true), Some(5120));
        assert_eq!(mma_chunk_with(&s, 8, None, true), Some(4096));
        assert!(
            mv_staged_per_sequence(&s, Some(5120)) * 16 + mma_static_shared(true) <= MV_SHARED_MAX
        );
        assert_eq!(mv_tile_shared(4096, 4, 16, Some(5120)), 16 * 8704);
        // Every chunk a multiple of 8 groups of 64 (the warps' groups stay in order).
        for ring in [false, true] {
            for nb in 4..=16 {
                if let Some(kc) = mma_chunk_with(&s, nb, None, ring) {
                    assert_eq!(kc % MMA_KC_STEP, 0);
                    let blocks = mma_min_blocks_with(&s, nb, ring);
                    assert!(
                        blocks
                            * (nb as u32 * mv_shared_bytes(kc, 4) + mma_static_shared(ring) + 1024)
                            <= SM_SHARED,
                        "{nb} rows, ring {ring}"
                    );
                }
            }
        }
        // A small model's inputs fit whole.
        let small = GraphSpec {
            quant: Some((64, 4)),
            ..tiny_spec()
        };
        assert_eq!(mma_chunk_with(&small, 16, None, false), None);
        assert_eq!(mma_chunk_with(&small, 16, None, true), None);
        // MLX_GRAPH_MMA_BANKS (MMA_BANKS): at 8B a sequence's staged input (17 K / 8 bytes)
        // is a multiple of 128 bytes, every sequence's piece in the same banks, the conflicts
        // MMA_BANKS removes. Its partial sums' padding (a float a lane and sequence column
        // tile: part[8][32][4 x 2 + 1], then sums, invs and redn) stays under the static bound
        // the sizing takes, so no size changes.
        for kc in [4096, 5120] {
            assert_eq!(mv_shared_bytes(kc, 4) % 128, 0);
        }
        let static_16 = (8 * 32 * (4 * 2 + 1) + 16 * 16 + 16 + 16 * 8) * 4;
        assert!(static_16 <= MV_STATIC_SHARED, "{static_16}");
        assert_eq!(mma_banks_define(false), "");
        assert_eq!(mma_banks_define(true), "#define MMA_BANKS 1\n");
    }

    #[test]
    fn the_bits_switch_compiles_the_models_widths_only() {
        // The source keeps every width unless the host defines the mask.
        assert!(SOURCE.contains(
            "#ifndef MV_BITS\n#define MV_BITS ((1 << 4) | (1 << 8) | (1 << 16))\n#endif"
        ));
        assert_eq!(SOURCE.matches("if constexpr ((MV_BITS >> ").count(), 3);
        let q4 = GraphSpec {
            quant: Some((64, 4)),
            ..tiny_spec()
        };
        let q8 = GraphSpec {
            quant: Some((32, 8)),
            ..tiny_spec()
        };
        assert_eq!(q4.matvec_bits(), 1 << 4);
        assert_eq!(q8.matvec_bits(), 1 << 8);
        assert_eq!(tiny_spec().matvec_bits(), 1 << 16);
        // qwen3_moe as mlx-lm's convert writes it: 4-bit experts, 8-bit routers; bfloat16
        // routers; gpt_oss: mxfp4 experts (their own path), the rest bfloat16.
        let mut moe = GraphSpec {
            quant: Some((64, 4)),
            ..tiny_moe_spec()
        };
        assert_eq!(moe.matvec_bits(), (1 << 4) | (1 << 16));
        moe.moe.as_mut().unwrap().router_quant = Some((64, 8));
        assert_eq!(moe.matvec_bits(), (1 << 4) | (1 << 8));
        let mut oss = tiny_moe_spec();
        oss.moe.as_mut().unwrap().mxfp4 = true;
        assert_eq!(oss.matvec_bits(), 1 << 16);
        // The switch: on unless 0; the late norm's level: 1 unless 0 or 2.
        assert!(mv_bits_on(None) && mv_bits_on(Some("1")) && mv_bits_on(Some("yes")));
        assert!(!mv_bits_on(Some("0")) && !mv_bits_on(Some(" 0 ")));
        assert_eq!(late_norm_level(None), 1);
        assert_eq!(late_norm_level(Some("0")), 0);
        assert_eq!(late_norm_level(Some("2")), 2);
        assert_eq!(late_norm_level(Some("3")), 1);
        // The define: only with the switch, never for a trellis model.
        assert_eq!(mv_bits_define(&q4, false), "");
        assert_eq!(mv_bits_define(&q4, true), "#define MV_BITS 0x10\n");
        assert_eq!(mv_bits_define(&moe, true), "#define MV_BITS 0x110\n");
        let (t, v) = hybrid_trellis();
        let trellis = GraphSpec {
            hidden: 576,
            trellis: Some(t),
            trellis_v: Some(v),
            ..tiny_spec()
        };
        assert_eq!(mv_bits_define(&trellis, true), "");
        // Every module's source takes it ahead of SOURCE: the one-row step, FFMA and
        // tensor-core tiles.
        let defines = |src: &str| src[..src.find(SOURCE).unwrap()].to_string();
        for on in [false, true] {
            let p = SourceParams {
                mv_bits: on,
                ..plain_params()
            };
            for (nb, mma, wide) in [(1, false, false), (5, false, false), (16, true, true)] {
                let (src, _) = step_source(&q4, &p, nb, mma, wide);
                assert_eq!(defines(&src).contains("#define MV_BITS 0x10\n"), on, "{nb}");
            }
        }
    }

    #[test]
    fn the_late_norm_switch_reaches_matvec_qkv_then_matvec_norm() {
        assert_eq!(mma_late_norm_define(0), "");
        assert_eq!(mma_late_norm_define(1), "#define MMA_LATE_NORM 1\n");
        assert_eq!(mma_late_norm_define(2), "#define MMA_LATE_NORM 2\n");
        assert!(!matvec_norm_in(true, 0) && !matvec_norm_in(true, 1));
        assert!(matvec_norm_in(true, 2) && !matvec_norm_in(false, 2));
        // The source's switch, read once, and taken by the tiles only where the kernel passes
        // LATE: matvec_qkv and matvec_norm (compiled at level 2 alone), not matvec (nor the
        // persistent step's matvec phase, nor the output projection's or the experts').
        assert!(SOURCE.contains("#ifndef MMA_LATE_NORM\n#define MMA_LATE_NORM 0\n#endif"));
        assert_eq!(SOURCE.matches("<LATE>(wt, xin, normw, norm,").count(), 2);
        assert_eq!(
            SOURCE
                .matches("const bool late = LATE && MMA_LATE_NORM && norm && CH == 1;")
                .count(),
            2
        );
        assert_eq!(SOURCE.matches("matvec_body<false>(").count(), 2);
        assert_eq!(SOURCE.matches("matvec_body<true>(").count(), 1);
        assert!(SOURCE.contains("MV_DISPATCH(bits, LATE, wt,"));
        assert!(SOURCE.contains("MV_DISPATCH_MAP(bits, WMAP_QKV, true, wt,"));
        assert!(SOURCE.contains("MV_DISPATCH_MAP(bits, WMAP_ONE, false, wt,"));
        assert!(MOE_SOURCE.contains("MV_DISPATCH(bits, false, wt,"));
        let norm_kernel = SOURCE.find(") matvec_norm(").unwrap();
        let guard = SOURCE[..norm_kernel]
            .rfind("#if MMA_LATE_NORM >= 2\n")
            .unwrap();
        assert!(!SOURCE[guard..norm_kernel].contains("#endif"));
        // The tensor-core tiles' step source defines the decoder's level ahead of SOURCE; at 2
        // it also has matvec_norm. An FFMA module never has either.
        let defines = |src: &str| src[..src.find(SOURCE).unwrap()].to_string();
        let s = GraphSpec {
            quant: Some((64, 4)),
            ..tiny_spec()
        };
        for level in [0, 1, 2] {
            let p = SourceParams {
                late_norm: level,
                ..plain_params()
            };
            for (nb, wide) in [(16, true), (5, false)] {
                let (src, kernels) = step_source(&s, &p, nb, true, wide);
                let d = defines(&src);
                assert_eq!(
                    d.matches("MMA_LATE_NORM").count(),
                    usize::from(level > 0),
                    "level {level}"
                );
                assert!(level == 0 || d.contains(&format!("#define MMA_LATE_NORM {level}\n")));
                assert_eq!(
                    kernels.contains(&MATVEC_NORM_KERNEL),
                    level == 2,
                    "level {level}"
                );
            }
            let (ffma, kernels) = step_source(&s, &p, 1, false, false);
            assert!(!defines(&ffma).contains("MMA_LATE_NORM"));
            assert!(!kernels.contains(&MATVEC_NORM_KERNEL));
            // Tensor-core tiles of other weights (bfloat16) neither.
            let (bf16, kernels) = step_source(&tiny_spec(), &p, 16, true, false);
            assert!(!defines(&bf16).contains("MMA_LATE_NORM"));
            assert!(!kernels.contains(&MATVEC_NORM_KERNEL));
        }
    }

    #[test]
    fn the_pair_switch_takes_wide_tensor_core_tiles_only() {
        // MMA_PAIR (on unless MLX_GRAPH_MMA_PAIR=0): every width of the wide tensor-core tiles
        // of 4-bit weights in groups of 64, and why not elsewhere.
        for nb in [4, 5, 8, 16] {
            assert_eq!(mma_pair_in(nb, true, true, true), Ok(()), "{nb} rows");
        }
        let off = mma_pair_in(16, true, true, false).unwrap_err();
        assert!(off.contains("MLX_GRAPH_MMA_PAIR"), "{off}");
        let narrow = mma_pair_in(4, false, true, true).unwrap_err();
        assert!(narrow.contains("not wide tensor-core tiles"), "{narrow}");
        let ffma = mma_pair_in(16, true, false, true).unwrap_err();
        assert!(ffma.contains("4-bit weights in groups of 64"), "{ffma}");
        assert_eq!(mma_pair_define(false), "");
        assert_eq!(mma_pair_define(true), "#define MMA_PAIR 1\n");
        // The define is the source's switch, read once (`#ifndef MMA_PAIR`), and the kernel
        // dispatches to the pair item under it.
        assert!(SOURCE.contains("#ifndef MMA_PAIR\n#define MMA_PAIR 0\n#endif"));
        assert!(SOURCE.contains(
            "mv_run_mma_pair<LATE>(wt, xin, normw, norm, N, K, eps, smem, red, tr, pre, epi);"
        ));
        // On (the default), the wide tiles' step source defines MMA_PAIR; off
        // (MLX_GRAPH_MMA_PAIR=0), it has no MMA_PAIR define: the tiles' item of one rows block.
        let s = GraphSpec {
            quant: Some((64, 4)),
            ..tiny_spec()
        };
        let (src, _) = step_source(&s, &plain_params(), 16, true, true);
        assert_eq!(src.contains("#define MMA_PAIR 1"), mma_pair());
        // The pair shares the ring's static shared memory (two 640-byte slots a pair item, 3
        // items: the same 30 KiB), so the tiles' sizing is the same with it.
        assert_eq!(MMA_RING_SHARED, 8 * 3 * 2 * 640);
    }

    #[test]
    fn matrix_vector_grids_and_shared_memory() {
        // One wave at most; a block is 8 warps of `rows` rows.
        assert_eq!(mv_blocks(6144, 2, 264), 264);
        assert_eq!(mv_blocks(576, 2, 264), 36);
        assert_eq!(mv_blocks(1, 4, 264), 1);
        assert_eq!(mv_blocks(4096, 2, 0), 1);
        // bfloat16 inputs rounded up to 64 values, then a float sum per chunk of codes.
        assert_eq!(mv_shared_bytes(576, 16), 1152);
        assert_eq!(mv_shared_bytes(100, 16), 256);
        assert_eq!(mv_shared_bytes(4096, 4), 8192 + 128 * 4);
        assert_eq!(mv_shared_bytes(14336, 8), 28672 + 896 * 4);
    }

    #[test]
    fn trellis_specs_and_weights_name_their_problems() {
        use mlx_core::cpu::trellis::TrellisCode;
        let t = TrellisSpec {
            k: 3,
            l: 8,
            block: 32,
            code: TrellisCode::Mad,
        };
        let spec = GraphSpec {
            trellis: Some(t),
            ..tiny_spec()
        };
        // A trellis linear of the tiny shapes: words, row scales, signs.
        let coded = |n: usize, k: usize| GraphLinear {
            weight: ops::zeros(&[n as i32, (k * 3 / 32) as i32], Dtype::Uint32, None).unwrap(),
            scales: Some(zeros(&[n as i32, 1])),
            biases: None,
            bias: None,
            trellis: Some(GraphTrellis {
                spec: t,
                su: ops::ones(&[n as i32], Dtype::Float32, None).unwrap(),
                sv: ops::ones(&[k as i32], Dtype::Float32, None).unwrap(),
            }),
        };
        let mut w = tiny_weights(&spec);
        let (h, d) = (spec.hidden, spec.head_dim);
        for l in &mut w.layers {
            l.q = coded(spec.heads * d, h);
            l.k = coded(spec.kv_heads * d, h);
            l.v = coded(spec.kv_heads * d, h);
            l.o = coded(h, spec.heads * d);
            l.gate = coded(spec.intermediate, h);
            l.up = coded(spec.intermediate, h);
            l.down = coded(h, spec.intermediate);
        }
        assert_eq!(spec.check(), Ok(()));
        assert_eq!(w.check(&spec), Ok(()));
        // A mix, another spec, a wrong sign vector, each named.
        let mut bad = w.clone();
        bad.layers[1].up = dense(spec.intermediate, h);
        bad.layers[0].o.trellis.as_mut().unwrap().spec.l = 9;
        bad.layers[0].q.trellis.as_mut().unwrap().sv = zeros(&[h as i32]);
        let why = bad.check(&spec).unwrap_err();
        for what in [
            "layers.1.up_proj: not trellis-coded",
            "layers.0.o_proj: trellis spec",
            "layers.0.q_proj.sv: [64] bfloat16, expected [64] float32",
        ] {
            assert!(why.contains(what), "{what}: {why}");
        }
        // Trellis linears in an affine model are a mix too.
        let why = w.check(&tiny_spec()).unwrap_err();
        assert!(why.contains("layers.0.q_proj: trellis-coded"), "{why}");
        // What the trellis step does not run, and several sequences a step.
        let qk = GraphSpec {
            qk_norm: true,
            ..spec.clone()
        };
        assert!(qk
            .check()
            .unwrap_err()
            .contains("trellis-coded linears with q/k norms"));
        let opts = GraphOptions {
            sequences: 2,
            ..GraphOptions::default()
        };
        let e = GraphDecoder::with_options(spec, &w, 64, &opts).unwrap_err();
        assert!(
            e.to_string()
                .contains("trellis-coded linears decodes one sequence"),
            "{e}"
        );
    }

    /// The hybrid (`mlx convert --q-trellis-code gauss7s --q-trellis-v-code 1mad`): the value
    /// projections take their own spec ([`GraphSpec::trellis_v`]) and pass; a value projections'
    /// spec `trellis_qkv` cannot pair with q's and k's, a v_proj unlike the others', another
    /// linear with v's spec, and `trellis_v` without `trellis` are each refused, named.
    #[test]
    fn value_projections_take_their_own_trellis_spec() {
        use mlx_core::cpu::trellis::TrellisCode;
        let (t, v) = hybrid_trellis();
        let spec = GraphSpec {
            trellis: Some(t),
            trellis_v: Some(v),
            ..tiny_spec()
        };
        let coded = |sp: TrellisSpec, n: usize, k: usize| GraphLinear {
            weight: ops::zeros(&[n as i32, (k * 3 / 32) as i32], Dtype::Uint32, None).unwrap(),
            scales: Some(zeros(&[n as i32, 1])),
            biases: None,
            bias: None,
            trellis: Some(GraphTrellis {
                spec: sp,
                su: ops::ones(&[n as i32], Dtype::Float32, None).unwrap(),
                sv: ops::ones(&[k as i32], Dtype::Float32, None).unwrap(),
            }),
        };
        let mut w = tiny_weights(&spec);
        let (h, d) = (spec.hidden, spec.head_dim);
        for l in &mut w.layers {
            l.q = coded(t, spec.heads * d, h);
            l.k = coded(t, spec.kv_heads * d, h);
            l.v = coded(v, spec.kv_heads * d, h);
            l.o = coded(t, h, spec.heads * d);
            l.gate = coded(t, spec.intermediate, h);
            l.up = coded(t, spec.intermediate, h);
            l.down = coded(t, h, spec.intermediate);
        }
        assert_eq!(spec.check(), Ok(()));
        assert_eq!(w.check(&spec), Ok(()));
        // The one-spec reading of the same weights names every value projection.
        let one = GraphSpec {
            trellis_v: None,
            ..spec.clone()
        };
        let why = one.check_weights_err(&w);
        assert!(why.contains("layers.0.v_proj: trellis spec"), "{why}");
        assert!(why.contains("layers.1.v_proj: trellis spec"), "{why}");
        // A v_proj unlike the others' v, and an o_proj with v's spec.
        let mut bad = w.clone();
        bad.layers[1].v.trellis.as_mut().unwrap().spec.code = TrellisCode::Gauss8S;
        bad.layers[0].o.trellis.as_mut().unwrap().spec = v;
        let why = spec.check_weights_err(&bad);
        for what in [
            "layers.1.v_proj: trellis spec",
            "layers.0.o_proj: trellis spec",
        ] {
            assert!(why.contains(what), "{what}: {why}");
        }
        assert!(!why.contains("layers.0.v_proj"), "{why}");
        // Value projections' specs trellis_qkv cannot run beside q's and k's: other bits,
        // other blocks, the general path beside the unrolled one.
        for (vs, what) in [
            (TrellisSpec { k: 4, ..v }, "4 bits, q/k's 3"),
            (TrellisSpec { block: 32, ..v }, "blocks of 32, q/k's 64"),
            (TrellisSpec { l: 9, ..v }, "takes the general path"),
        ] {
            let s2 = GraphSpec {
                trellis_v: Some(vs),
                ..spec.clone()
            };
            let why = s2.check_weights_err(&w);
            assert!(why.contains("layers.0.v_proj: trellis spec"), "{why}");
            assert!(why.contains(what), "{what}: {why}");
        }
        // trellis_v alone.
        let alone = GraphSpec {
            trellis: None,
            ..spec.clone()
        };
        assert!(alone.check().unwrap_err().contains("trellis_v"));
        // The step's source: TRELLIS_V_L (1mad L 12: 12) for the hybrid only; a one-spec
        // model's source has no such line (the same kernels as before).
        let p = plain_params();
        let (hybrid, _) = step_source(&spec, &p, 1, false, false);
        let (plain, _) = step_source(&one, &p, 1, false, false);
        assert_eq!(hybrid.matches("#define TRELLIS_V_L").count(), 1);
        assert!(hybrid.contains("#define TRELLIS_V_L 12\n"));
        assert!(!plain.contains("#define TRELLIS_V_L"));
        assert_eq!(hybrid.replace("#define TRELLIS_V_L 12\n", ""), plain);
    }

    /// Writes the step sources of an affine model and of trellis models (the 135M's and the
    /// 8B's hidden widths, hybrid value projections) to `$MLX_SOURCE_DUMP` where it is set:
    /// the files that show a change leaves the step sources as they were (`cmp` the dumps of
    /// two commits; results/gpu/2026-12-06-s38-trelwidth).
    #[test]
    fn step_sources_dump() {
        let Some(dir) = std::env::var_os("MLX_SOURCE_DUMP") else {
            return;
        };
        let (t, v) = hybrid_trellis();
        let p = plain_params();
        let affine = GraphSpec {
            quant: Some((64, 4)),
            ..tiny_spec()
        };
        let small = GraphSpec {
            hidden: 576,
            trellis: Some(t),
            trellis_v: Some(v),
            ..tiny_spec()
        };
        let large = GraphSpec {
            hidden: 4096,
            ..small.clone()
        };
        let named = [
            ("bf16", &tiny_spec()),
            ("affine", &affine),
            ("trellis576", &small),
            ("trellis4096", &large),
        ];
        for (name, s) in named {
            // The decoder's params: the model's switches, chosen once from its shape and the
            // environment (SourceParams::trellis).
            let p = SourceParams {
                trellis: s.trellis_switches(),
                mv_wide: mv_wide(),
                mv_bits: mv_bits_only(),
                ..p
            };
            let (src, _) = step_source(s, &p, 1, false, false);
            std::fs::write(std::path::Path::new(&dir).join(format!("{name}.cu")), src).unwrap();
            // The trellis defines alone (xtask/gpu/trellis_step_emulate.py's
            // TRELLIS_STEP_DEFINES: the emulator compiles and launches as the host chose).
            let defines = p.trellis.defines();
            let file = format!("defines{}.txt", s.hidden);
            std::fs::write(std::path::Path::new(&dir).join(file), defines).unwrap();
        }
        // The batched steps' sources (tiles of 5 and 16 rows: the verify tile and the
        // server's), on the tensor cores, narrow and wide: what the environment's switches
        // (MLX_GRAPH_MMA_PAIR, MLX_GRAPH_MV_NB, ...) make of them, for an NVRTC compile
        // without a GPU (xtask/gpu/nvrtc_check.py).
        let p = SourceParams {
            mv_wide: mv_wide(),
            late_norm: mma_late_norm(),
            mv_bits: mv_bits_only(),
            ..p
        };
        for nb in [5, 16] {
            for (mma, wide) in [(false, false), (true, false), (true, true)] {
                let (src, _) = step_source(&affine, &p, nb, mma, wide);
                let name = format!(
                    "affine_nb{nb}_mma{}_wide{}.cu",
                    u8::from(mma),
                    u8::from(wide)
                );
                std::fs::write(std::path::Path::new(&dir).join(name), src).unwrap();
            }
        }
    }

    impl GraphSpec {
        /// `weights.check(self)`'s refusal.
        fn check_weights_err(&self, w: &GraphWeights) -> String {
            w.check(self).unwrap_err()
        }
    }

    #[test]
    fn options_are_checked_before_the_gpu_is_touched() {
        let spec = tiny_spec();
        let w = tiny_weights(&spec);
        for (opts, what) in [
            (
                GraphOptions {
                    rows_per_warp: 3,
                    ..GraphOptions::default()
                },
                "rows_per_warp 3",
            ),
            (
                GraphOptions {
                    chunks_in_flight: Some(0),
                    ..GraphOptions::default()
                },
                "chunks_in_flight 0",
            ),
            (
                GraphOptions {
                    chunks_in_flight: Some(2),
                    chunks_before_wait: Some(3),
                    ..GraphOptions::default()
                },
                "chunks_before_wait 3",
            ),
            (
                GraphOptions {
                    chunks_before_wait: Some(0),
                    ..GraphOptions::default()
                },
                "chunks_before_wait 0",
            ),
            (
                GraphOptions {
                    rows_per_warp: 4,
                    chunks_in_flight: Some(8),
                    ..GraphOptions::default()
                },
                "chunks_in_flight 8",
            ),
            (
                GraphOptions {
                    blocks_per_sm: Some(0),
                    ..GraphOptions::default()
                },
                "blocks_per_sm 0",
            ),
            (
                GraphOptions {
                    min_blocks_per_sm: Some(5),
                    ..GraphOptions::default()
                },
                "min_blocks_per_sm 5",
            ),
        ] {
            let e = GraphDecoder::with_options(spec.clone(), &w, 64, &opts)
                .unwrap_err()
                .to_string();
            assert!(e.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn rope_pairs_sit_side_by_side() {
        // Two heads of 4 rows, 3 columns: each head's rows (0, 2, 1, 3).
        let a = rows(8, 3, 0.0);
        let p = pair_rope_rows(&a, 2, 4, 2).unwrap();
        assert_eq!(firsts(&p, 3), [0., 2., 1., 3., 4., 6., 5., 7.]);
        assert!(p
            .to_vec::<f32>()
            .unwrap()
            .chunks(3)
            .all(|c| c[0] == c[1] && c[1] == c[2]));
        // Partial rotary: one pair of a head of 4 rotated, the other two rows as they are.
        let p = pair_rope_rows(&a, 2, 4, 1).unwrap();
        assert_eq!(firsts(&p, 3), [0., 1., 2., 3., 4., 5., 6., 7.]);
        // A head of 6, two pairs rotated (rows 0..4 paired as (0, 2), (1, 3)), 4 and 5 kept.
        let b = rows(6, 1, 0.0);
        let p = pair_rope_rows(&b, 1, 6, 2).unwrap();
        assert_eq!(firsts(&p, 1), [0., 2., 1., 3., 4., 5.]);
    }

    /// A `#define NAME value` of the source: a number, or `(A * B)` of earlier ones.
    fn define(name: &str) -> usize {
        let v = SOURCE
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("#define {name} is not in the source"))
            .trim();
        match v.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
            Some(product) => product.split('*').map(|t| define(t.trim())).product(),
            None => v.parse().unwrap(),
        }
    }

    #[test]
    fn the_samplers_block_shape_is_the_sources() {
        assert_eq!(define("ARGMAX_THREADS"), ARGMAX_THREADS as usize);
        assert_eq!(define("ARGMAX_SLICE"), ARGMAX_SLICE);
    }

    /// `matvec_attn_out`'s staged chunks are the source's, and where the output projection
    /// combines the attention's partials: one sequence a step, small widths by default.
    #[test]
    fn the_attention_combine_goes_where_it_fits() {
        assert_eq!(define("ATTN_OUT_CHUNKS"), ATTN_OUT_CHUNKS);
        assert_eq!(define("ATTN_CHUNK"), ATTN_CHUNK);
        let s = tiny_spec();
        assert!(s.heads * s.head_dim <= ATTN_OUT_MAX_WIDTH);
        assert!(attn_combine_in_output(&s, 1, 1, Some(true)));
        assert!(!attn_combine_in_output(&s, 1, 1, Some(false)));
        assert!(!attn_combine_in_output(&s, 2, 1, Some(true)));
        assert!(!attn_combine_in_output(&s, 1, 3, None));
        let wide = GraphSpec {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ..tiny_spec()
        };
        assert!(!attn_combine_in_output(&wide, 1, 1, None));
        assert!(!attn_combine_in_output(&wide, 1, 1, Some(true)));
        // The stage: 12 chunks of every head's outputs and a tile of (max, sum) pairs.
        let w = s.heads * s.head_dim;
        assert_eq!(
            attn_out_shared_bytes(&s, 64 * 300, 16),
            mv_shared_bytes(w, 16) + (w * 12 * 4 + s.heads * 128 * 8) as u32
        );
    }

    /// bfloat16 rounding (to nearest, ties to even) of a finite float.
    fn rbf(f: f32) -> f32 {
        let b = f.to_bits();
        f32::from_bits((b + 0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
    }

    /// `qk_norm_rope` (graph_qk_norm.cu) for one head, thread for thread on the host: the
    /// norm as MLX's fast.rms_norm rounds it, then the rotation from the step's table.
    fn emulate_qk_norm_rope(x: &[f32], w: &[f32], r: &GraphRope, pos: usize, eps: f32) -> Vec<f32> {
        let d = x.len();
        let nr = r.pairs();
        let tot: f32 = x.iter().map(|v| v * v).sum();
        let inv = 1.0 / (tot / d as f32 + eps).sqrt();
        let xs: Vec<f32> = (0..d).map(|t| rbf(w[t] * rbf(x[t] * inv))).collect();
        let cs = |i: usize| {
            let theta = r.position_scale * pos as f32 * r.inv_freq[i];
            (theta.cos() * r.output_scale, theta.sin() * r.output_scale)
        };
        (0..d)
            .map(|t| {
                let out = if r.traditional {
                    let i = t / 2;
                    if i < nr {
                        let (c, s) = cs(i);
                        let (x1, x2) = (xs[2 * i], xs[2 * i + 1]);
                        if t % 2 == 1 {
                            x1 * s + x2 * c
                        } else {
                            x1 * c - x2 * s
                        }
                    } else {
                        xs[t]
                    }
                } else if t < 2 * nr {
                    let i = if t < nr { t } else { t - nr };
                    let (c, s) = cs(i);
                    let (x1, x2) = (xs[i], xs[i + nr]);
                    if t < nr {
                        x1 * c - x2 * s
                    } else {
                        x1 * s + x2 * c
                    }
                } else {
                    xs[t]
                };
                rbf(out)
            })
            .collect()
    }

    #[test]
    fn qk_norm_then_rope_is_mlx_rms_norm_then_rope() {
        let bf = |v: &[f32]| {
            Array::from_slice(v, &[1, 1, 1, v.len() as i32])
                .unwrap()
                .astype(Dtype::Bfloat16)
                .unwrap()
        };
        let back = |a: &Array| a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        let (mut worst, mut cases) = (0usize, 0usize);
        for (d, dims, traditional) in [
            (16, 16, false),
            (64, 64, false),
            (64, 32, false),
            (32, 32, true),
        ] {
            for seed in 0..8u32 {
                let xv: Vec<f32> = (0..d)
                    .map(|i| (i as f32 * 0.37 + seed as f32 * 1.3).sin() * 3.0)
                    .collect();
                let wv: Vec<f32> = (0..d).map(|i| 1.0 + 0.1 * (i as f32 * 0.7).cos()).collect();
                let (x, w) = (bf(&xv), bf(&wv));
                let wflat = w.reshape(&[d]).unwrap();
                let pos = 5 + 97 * seed as usize;
                let eps = 1e-6;
                let normed = mlx_core::fast::rms_norm(&x, Some(&wflat), eps, None).unwrap();
                // MLX's rotation in float32 (the CPU's rope fallback rounds its cosines and
                // sines to the input's dtype, which MLX's CUDA kernel, the one the decoder
                // matches, does not), rounded to bfloat16 at the end as that kernel does.
                let mlx = mlx_core::fast::rope(
                    &normed.astype(Dtype::Float32).unwrap(),
                    dims,
                    traditional,
                    Some(10000.0),
                    1.0,
                    (pos as i32).into(),
                    None,
                    None,
                )
                .unwrap();
                let mlx: Vec<f32> = back(&mlx).into_iter().map(rbf).collect();
                let r = GraphRope::from_base(dims as usize, traditional, 10000.0, 1.0);
                let ours = emulate_qk_norm_rope(&back(&x), &back(&w), &r, pos, eps);
                // The norm alone (position 0 rotates nothing) is MLX's bit for bit.
                let n0 = emulate_qk_norm_rope(&back(&x), &back(&w), &r, 0, eps);
                assert_eq!(back(&normed), n0, "d {d} seed {seed}");
                // The angles: the decoder's table (the one matvec_qkv's rows use on the device)
                // and the CPU fallback's differ in a float's last bit at large positions, which
                // can move a bfloat16 rounding (more than one step where x1 c - x2 s cancels):
                // a few elements, each within one bfloat16 step of the head's largest value.
                // A misplaced pair or an unnormed value is off by the values themselves.
                let big = ours.iter().fold(0f32, |m, v| m.max(v.abs()));
                let off = mlx
                    .iter()
                    .zip(&ours)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .inspect(|(a, b)| {
                        assert!(
                            (**a - **b).abs() <= big / 128.0,
                            "d {d} seed {seed}: {a} vs {b}"
                        )
                    })
                    .count();
                worst = worst.max(off);
                cases += 1;
            }
        }
        assert!(
            worst <= 2,
            "{worst} elements off in the worst of {cases} heads"
        );
    }

    #[test]
    fn every_kernel_in_the_source_is_declared_with_its_arity() {
        let all = format!("{SOURCE}{QK_NORM_SOURCE}{GEMMA_SOURCE}{MOE_SOURCE}");
        for (k, _) in [QK_NORM_KERNEL, QK_NORM_FULL_KERNEL, GEMMA_KERNEL]
            .iter()
            .chain(&MOE_KERNELS)
        {
            assert!(!SOURCE.contains(k), "{k} is only in its own source");
        }
        for (name, arity) in KERNELS
            .iter()
            .chain([
                &MATVEC_NORM_KERNEL,
                &QK_NORM_KERNEL,
                &QK_NORM_FULL_KERNEL,
                &GEMMA_KERNEL,
            ])
            .chain(&MOE_KERNELS)
            .chain(&PERSIST_KERNELS)
        {
            let source = all.as_str();
            // `extern "C" __global__ void [__launch_bounds__(..)] name(`
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
            assert_eq!(params.matches(',').count() + 1, *arity as usize, "{name}");
        }
    }
}
