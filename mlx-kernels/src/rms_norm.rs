//! Residual add + RMSNorm: `h = x + residual; out = rms_norm(h, weight, eps)`, returning both
//! (a llama block's `h = x + r` followed by `post_attention_layernorm(h)`, or the next block's
//! input norm). Reference: `ops::add` then `fast::rms_norm` (two launches on CUDA). Fused: one
//! kernel that adds, writes `h`, and normalizes from registers.
//!
//! The fused kernel is MLX 0.32.4's own CUDA RMSNorm (`rms_norm_small` up to `16 / itemsize *
//! 1024` features, the looped `rms_norm` above) with the add in front: the same block sizes
//! and chunking (`dispatch_num_chunks`), the same per-thread float accumulation order, the
//! same cooperative-groups block reduction and `rsqrt`, and the sum in the element type as
//! MLX's `Add` computes it. So it is meant to be bit-equal with the reference ([`TIER`]).

use mlx_core::kernels::{CustomKernel, KernelBuilder, Launch, TemplateArg};
use mlx_core::prelude::*;

use crate::{check_float, check_same_dtype, invalid, n_reads, with_kernel, Path, Tier};

/// The fused kernel against [`add_rms_norm_reference`] on the same CUDA device: `h` and `out`
/// bit-equal (checked by `tests/cuda.rs` over float32, float16 and bfloat16 and several
/// widths on a CUDA device, `xtask/gpu/`).
pub const TIER: Tier = Tier::Exact;

const OP: &str = "add_rms_norm";

/// The threads of one row's block and the chunks each thread holds, as MLX chooses them
/// (`dispatch_num_chunks` in `mlx/backend/cuda/rms_norm.cu`); `None` for the looped kernel.
fn small_launch(dims: i32, n_reads: i32) -> Option<(i32, i32)> {
    if dims > n_reads * 128 * 8 {
        return None;
    }
    let nvec = (dims + n_reads - 1) / n_reads;
    let chunks = |n: i32| n.clamp(1, 8);
    Some(if dims <= n_reads * 64 {
        (64, 1)
    } else if nvec % 128 == 0 && nvec / 128 <= 8 {
        (128, chunks(nvec / 128))
    } else if nvec % 64 == 0 && nvec / 64 <= 8 {
        (64, chunks(nvec / 64))
    } else {
        (128, chunks((nvec + 127) / 128))
    })
}

/// Threads per row of the looped kernel (MLX's `rms_norm<T, 1024, N_READS>`).
const LOOP_BLOCK: i32 = 1024;

const HEADER: &str = r#"
#include "mlx/backend/cuda/device/binary_ops.cuh"
#include <cooperative_groups/reduce.h>

namespace mlx::core::cu {
// MLX's BlockBroadcastReduce<float, BLOCK>::Sum (mlx/backend/cuda/rms_norm.cu).
template <int BLOCK>
__device__ float mlxk_block_sum(
    cooperative_groups::thread_block& block, float* temp, float input) {
  namespace cg = cooperative_groups;
  auto warp = cg::tiled_partition<32>(block);
  float x = cg::reduce(warp, input, cg::plus<float>{});
  if constexpr (BLOCK > 32) {
    if (warp.thread_rank() == 0) {
      temp[warp.meta_group_rank()] = x;
    }
    block.sync();
    x = warp.thread_rank() < warp.meta_group_size() ? temp[warp.thread_rank()] : 0.0f;
    return cg::reduce(warp, x, cg::plus<float>{});
  } else {
    return x;
  }
}
} // namespace mlx::core::cu
"#;

// Template arguments: T (dtype), D (features), NR (elements per 16-byte vector), BLOCK
// (threads per row), CHUNKS (vectors per thread), SMALL (rms_norm_small vs the looped kernel),
// EPS_BITS (eps's float32 bits: a constant rather than an input array, which would cost a
// fresh host-to-device array per call).
const SOURCE: &str = r#"
  auto block = cg::this_thread_block();
  __shared__ float temp[(BLOCK / 32) > 1 ? (BLOCK / 32) : 1];
  const size_t row = blockIdx.x;
  const T* xr = x + row * D;
  const T* rr = residual + row * D;
  T* hr = h + row * D;
  T* outr = out + row * D;
  const uint32_t index = threadIdx.x;
  const uint32_t axis_size = D;
  const float eps = __int_as_float(EPS_BITS);
  float normalizer = 0;
  if constexpr (SMALL) {
    AlignedVector<T, NR> hn[CHUNKS];
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
      int offset = BLOCK * i + index;
      auto xn = load_vector<NR>(xr, offset, axis_size, T(0));
      auto rn = load_vector<NR>(rr, offset, axis_size, T(0));
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        hn[i][j] = Add{}(xn[j], rn[j]);
      }
      store_vector<NR>(hr, offset, hn[i], axis_size);
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        float t = static_cast<float>(hn[i][j]);
        normalizer += t * t;
      }
    }
    normalizer = mlxk_block_sum<BLOCK>(block, temp, normalizer);
    normalizer = rsqrt(normalizer / axis_size + eps);
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
      int offset = BLOCK * i + index;
      auto wn = load_vector<NR>(weight, offset, axis_size, int64_t(1), T(0));
#pragma unroll
      for (int j = 0; j < NR; j++) {
        float y = static_cast<float>(hn[i][j]) * normalizer;
        hn[i][j] = wn[j] * static_cast<T>(y);
      }
      store_vector<NR>(outr, offset, hn[i], axis_size);
    }
  } else {
    const int rounds = (axis_size + BLOCK * NR - 1) / (BLOCK * NR);
    for (int r = 0; r < rounds; ++r) {
      auto idx = r * BLOCK + block.thread_rank();
      auto xn = load_vector<NR>(xr, idx, axis_size, T(0));
      auto rn = load_vector<NR>(rr, idx, axis_size, T(0));
      AlignedVector<T, NR> hn;
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        hn[i] = Add{}(xn[i], rn[i]);
        float t = static_cast<float>(hn[i]);
        normalizer += t * t;
      }
      store_vector<NR>(hr, idx, hn, axis_size);
    }
    normalizer = mlxk_block_sum<BLOCK>(block, temp, normalizer);
    normalizer = rsqrt(normalizer / axis_size + eps);
    for (int r = 0; r < rounds; ++r) {
      auto idx = r * BLOCK + block.thread_rank();
      // Each thread reads back only what it wrote itself above.
      auto hn = load_vector<NR>((const T*)hr, idx, axis_size, T(0));
      auto wn = load_vector<NR>(weight, idx, axis_size, int64_t(1), T(0));
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        float y = static_cast<float>(hn[i]) * normalizer;
        hn[i] = wn[i] * static_cast<T>(y);
      }
      store_vector<NR>(outr, idx, hn, axis_size);
    }
  }
"#;

fn kernel() -> KernelBuilder {
    CustomKernel::builder("mlxk_add_rms_norm")
        .inputs(["x", "residual", "weight"])
        .outputs(["h", "out"])
        .header(HEADER)
        .source(SOURCE)
}

/// Validates the arguments shared by both paths; returns the feature count.
fn check(x: &Array, residual: &Array, weight: &Array, eps: f32) -> Result<i32> {
    check_float(OP, "x", x)?;
    check_same_dtype(OP, "residual", residual, "x", x)?;
    check_same_dtype(OP, "weight", weight, "x", x)?;
    if x.ndim() == 0 {
        return Err(invalid(
            OP,
            "x is a scalar; expected at least one axis (features last)",
        ));
    }
    if residual.shape() != x.shape() {
        return Err(invalid(
            OP,
            format!(
                "residual has shape {:?}, x has {:?}; they must be equal",
                residual.shape(),
                x.shape()
            ),
        ));
    }
    let dims = x.dim(-1)?;
    if dims == 0 {
        return Err(invalid(OP, "x has an empty last axis"));
    }
    if weight.shape() != [dims] {
        return Err(invalid(
            OP,
            format!(
                "weight has shape {:?}; expected [{dims}] (x's last axis)",
                weight.shape()
            ),
        ));
    }
    if !eps.is_finite() || eps < 0.0 {
        return Err(invalid(
            OP,
            format!("eps is {eps}; expected a finite value >= 0"),
        ));
    }
    Ok(dims)
}

/// The plain-ops reference: `h = x + residual` (`ops::add`), `out = fast::rms_norm(h, weight,
/// eps)`, as mlx-lm's llama block does it. Returns `(h, out)`.
pub fn add_rms_norm_reference(
    x: &Array,
    residual: &Array,
    weight: &Array,
    eps: f32,
) -> Result<(Array, Array)> {
    check(x, residual, weight, eps)?;
    let h = ops::add(x, residual, None)?;
    let out = fast::rms_norm(&h, Some(weight), eps, None)?;
    Ok((h, out))
}

/// `h = x + residual; out = rms_norm(h, weight, eps)` on the chosen [`Path`]; returns
/// `(h, out)`. `x` and `residual` have one shape `[..., D]`, `weight` is `[D]`, all one
/// floating dtype.
pub fn add_rms_norm(
    x: &Array,
    residual: &Array,
    weight: &Array,
    eps: f32,
    path: Path,
) -> Result<(Array, Array)> {
    match path {
        Path::Reference => add_rms_norm_reference(x, residual, weight, eps),
        Path::Fused => add_rms_norm_fused(x, residual, weight, eps),
    }
}

fn add_rms_norm_fused(
    x: &Array,
    residual: &Array,
    weight: &Array,
    eps: f32,
) -> Result<(Array, Array)> {
    let dims = check(x, residual, weight, eps)?;
    let rows = i32::try_from(x.size() / dims as usize)
        .map_err(|_| invalid(OP, format!("x has {} rows; at most 2^31 - 1", x.size())))?;
    let dtype = x.dtype();
    let nr = n_reads(dtype);
    let (block, chunks, small) = match small_launch(dims, nr) {
        Some((b, c)) => (b, c, true),
        None => (LOOP_BLOCK, 1, false),
    };
    let grid_x = rows.checked_mul(block).ok_or_else(|| {
        invalid(
            OP,
            format!(
                "x has {rows} rows; at most {} fit one launch",
                i32::MAX / block
            ),
        )
    })?;
    let shape = x.shape();
    let launch = Launch::new([grid_x, 1, 1], [block, 1, 1])
        .template("T", TemplateArg::Dtype(dtype))
        .template("D", TemplateArg::Int(dims))
        .template("NR", TemplateArg::Int(nr))
        .template("BLOCK", TemplateArg::Int(block))
        .template("CHUNKS", TemplateArg::Int(chunks))
        .template("SMALL", TemplateArg::Bool(small))
        .template("EPS_BITS", TemplateArg::Int(eps.to_bits() as i32))
        .output(&shape, dtype)
        .output(&shape, dtype);
    let mut outs = with_kernel("add_rms_norm", kernel, |k| {
        k.call(
            &[x.clone(), residual.clone(), weight.clone()],
            &launch,
            None,
        )
    })?
    .into_iter();
    match (outs.next(), outs.next()) {
        (Some(h), Some(out)) => Ok((h, out)),
        _ => Err(Error::Mlx {
            op: OP,
            message: "the kernel returned fewer than two outputs".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::small_launch;

    #[test]
    fn launch_shapes_follow_mlx() {
        // bf16 (8 per vector): SmolLM2's 576 -> 72 vectors -> 128 threads, one chunk.
        assert_eq!(small_launch(576, 8), Some((128, 1)));
        // Llama-3-8B's 4096 -> 512 vectors -> 128 threads x 4 chunks.
        assert_eq!(small_launch(4096, 8), Some((128, 4)));
        assert_eq!(small_launch(512, 8), Some((64, 1)));
        // 960 -> 120 vectors: not a multiple of 64 or 128.
        assert_eq!(small_launch(960, 8), Some((128, 1)));
        // 1600 f32 (4 per vector) -> 400 vectors -> 128 x 4 (ceil).
        assert_eq!(small_launch(1600, 4), Some((128, 4)));
        assert_eq!(small_launch(8192, 8), Some((128, 8)));
        assert_eq!(small_launch(8200, 8), None);
    }
}
