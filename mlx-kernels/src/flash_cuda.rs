//! The CUDA path of [`crate::flash_attention`]: three kernels through MLX's `cuda_kernel`.
//!
//! - `mlxk_flash_fwd`: the output and the per-row log-sum-exp. One block of 128 threads per
//!   tile of `BR` queries of one head; each query row is owned by `TPR` adjacent lanes of a
//!   warp (lane `t` holds elements `t, t + TPR, ...` of the row), so a dot product is `D / TPR`
//!   products and a `TPR`-lane shuffle sum. Keys and values come through shared memory in tiles
//!   of `BK` rows (float32), with an online softmax over each tile.
//! - `mlxk_flash_dq`: `dq` over the same query tiles, recomputing each probability from the
//!   stored log-sum-exp (`p = exp(s - lse)`, `ds = p * (dp - delta)`, `delta = rowsum(do * o)`
//!   from plain ops).
//! - `mlxk_flash_dkdv`: `dk` and `dv` over tiles of `BR` keys of one key/value head, looping
//!   over every query head of its group (GQA) and the query tiles that can see the keys
//!   (queries and output cotangents through shared memory). No atomics: each key row has one
//!   owner.
//!
//! Everything is accumulated in float32; inputs are float32, float16 or bfloat16 and rounded
//! once, on the way out. As the plain path (and MLX's SDPA) does, `q * scale` is rounded to the
//! input dtype first. Masks (causal, sliding window, partial tiles) are per element; tiles no
//! query of the block can see are skipped. Row-contiguous inputs (MLX copies others first).
//!
//! Head dims: `D` and `Dv` multiples of `TPR` (4 up to 64, 8 above) and at most 256 ([`check`]).
//!
//! Checked without a GPU: every kernel compiles with NVRTC for every dtype against MLX's own
//! `cuda_kernel` header (`xtask/gpu/nvrtc_check.py`), and the exact sources, run on the CPU with
//! one thread per CUDA thread (`xtask/gpu/flash_emulate.py`), match a dense attention in double
//! within the bounds below. On a CUDA device (`tests/cuda.rs` through `xtask/gpu/flash.sh`,
//! results in `results/gpu/flash/`) the forward and gradients are within those bounds of the
//! float32 materialised attention, and the backward matches finite differences. They are
//! scalar FMA kernels: memory O(L), speed well below MLX's cuDNN SDPA.

use mlx_core::kernels::{CustomKernel, KernelBuilder, Launch, TemplateArg};
use mlx_core::prelude::*;

use crate::flash_spec::FlashSpec;
use crate::{invalid, with_kernel};

const OP: &str = "flash_attention";

/// Threads per block of every flash kernel.
const THREADS: i32 = 128;
/// Largest head dim the CUDA path takes.
pub const MAX_HEAD_DIM: i32 = 256;

const HEADER: &str = r#"
// MLX's cuda_kernel header defines no `inf`; utils.cuh brings cuda::std::numeric_limits.
#define MLXK_INF (cuda::std::numeric_limits<float>::infinity())
namespace mlx::core::cu {
// Sum over the TPR adjacent lanes that own one row (every lane gets the sum).
template <int TPR>
__device__ __forceinline__ float mlxk_row_sum(float x) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, o);
  }
  return x;
}

// Whether the query at position p sees key j of S.
template <bool CAUSAL, int WINDOW>
__device__ __forceinline__ bool mlxk_visible(int p, int j, int S) {
  bool ok = j < S;
  if constexpr (CAUSAL) {
    ok = ok && j <= p;
  }
  if constexpr (WINDOW > 0) {
    ok = ok && p - j < WINDOW;
  }
  return ok;
}

// q * scale in T (the scale rounded to T, the product rounded to T), widened to float.
template <typename T>
__device__ __forceinline__ float mlxk_scaled(T x, float scale) {
  float s = static_cast<float>(static_cast<T>(scale));
  return static_cast<float>(static_cast<T>(static_cast<float>(x) * s));
}

// Rows [r0, r0 + BK) of a [n, W] row-major T matrix into float tile[BK][W] (zero past n),
// optionally scaled as mlxk_scaled.
template <typename T, int BK, int W, int THREADS, bool SCALE>
__device__ __forceinline__ void mlxk_load_tile(
    float (*tile)[W], const T* src, int r0, int n, float scale) {
  for (int e = threadIdx.x; e < BK * W; e += THREADS) {
    int r = e / W, c = e % W;
    float x = 0.0f;
    if (r0 + r < n) {
      T t = src[(size_t)(r0 + r) * W + c];
      x = SCALE ? mlxk_scaled<T>(t, scale) : static_cast<float>(t);
    }
    tile[r][c] = x;
  }
}
} // namespace mlx::core::cu
"#;

// Shared by the three sources: the template arguments are T, D, DV, TPR, BK, CAUSAL, WINDOW
// (0: none), SCALE_HI and SCALE_LO (the scale's float32 bits in two non-negative halves: MLX
// names the kernel instance after its template values). Batch, heads and lengths come from
// the inputs' shapes, so one compiled instance serves every length.
const PRELUDE: &str = r#"
  constexpr int THREADS = 128;
  constexpr int BR = THREADS / TPR;
  constexpr int DPT = D / TPR;
  constexpr int DVPT = DV / TPR;
  const float scale = __uint_as_float((unsigned(SCALE_HI) << 16) | unsigned(SCALE_LO));
  const int HQ = q_shape[1], L = q_shape[2];
  const int HKV = k_shape[1], S = k_shape[2];
  const int G = HQ / HKV;
  const int off = S - L;
  const int b = blockIdx.z;
  const int lane = threadIdx.x % TPR;
  const int r = threadIdx.x / TPR;
"#;

// The start of the two query-tile kernels: block (x, y, z) holds queries [q0, q0 + BR) of head
// h = y of batch row z; thread row r the query i (clamped: rows past L compute and write
// nothing); [lo, hi) the keys some query of the block sees.
const QUERY_PRELUDE: &str = r#"
  const int h = blockIdx.y, hk = h / G;
  const int q0 = blockIdx.x * BR;
  const bool active = q0 + r < L;
  const int i = min(q0 + r, L - 1);
  const int p = i + off;
  __shared__ float ks[BK][D];
  __shared__ float vs[BK][DV];
  const size_t row = (size_t)(b * HQ + h) * L + i;
  int lo = 0, hi = S;
  if constexpr (CAUSAL) {
    hi = min(S, min(q0 + BR, L) + off);
  }
  if constexpr (WINDOW > 0) {
    lo = max(0, q0 + off - WINDOW + 1);
  }
  const T* kb = k + (size_t)(b * HKV + hk) * S * D;
  const T* vb = v + (size_t)(b * HKV + hk) * S * DV;
"#;

// After QUERY_PRELUDE. Outputs: out [B, HQ, L, DV], lse [B, HQ, L].
const FWD_SOURCE: &str = r#"
  float qv[DPT];
#pragma unroll
  for (int t = 0; t < DPT; ++t) {
    qv[t] = mlxk_scaled<T>(q[row * D + lane + t * TPR], scale);
  }
  float o[DVPT];
#pragma unroll
  for (int t = 0; t < DVPT; ++t) {
    o[t] = 0.0f;
  }
  float m = -MLXK_INF, l = 0.0f;
  for (int k0 = lo; k0 < hi; k0 += BK) {
    __syncthreads();
    mlxk_load_tile<T, BK, D, THREADS, false>(ks, kb, k0, S, scale);
    mlxk_load_tile<T, BK, DV, THREADS, false>(vs, vb, k0, S, scale);
    __syncthreads();
    float s[BK];
    float mt = -MLXK_INF;
#pragma unroll
    for (int jj = 0; jj < BK; ++jj) {
      float acc = 0.0f;
#pragma unroll
      for (int t = 0; t < DPT; ++t) {
        acc += qv[t] * ks[jj][lane + t * TPR];
      }
      acc = mlxk_row_sum<TPR>(acc);
      s[jj] = mlxk_visible<CAUSAL, WINDOW>(p, k0 + jj, S) ? acc : -MLXK_INF;
      mt = fmaxf(mt, s[jj]);
    }
    const float mn = fmaxf(m, mt);
    if (mn == -MLXK_INF) {
      continue;
    }
    const float alpha = expf(m - mn);
    l *= alpha;
#pragma unroll
    for (int t = 0; t < DVPT; ++t) {
      o[t] *= alpha;
    }
#pragma unroll
    for (int jj = 0; jj < BK; ++jj) {
      const float pj = expf(s[jj] - mn);
      l += pj;
#pragma unroll
      for (int t = 0; t < DVPT; ++t) {
        o[t] += pj * vs[jj][lane + t * TPR];
      }
    }
    m = mn;
  }
  if (active) {
#pragma unroll
    for (int t = 0; t < DVPT; ++t) {
      out[row * DV + lane + t * TPR] = static_cast<T>(o[t] / l);
    }
    if (lane == 0) {
      lse[row] = m + logf(l);
    }
  }
"#;

// After QUERY_PRELUDE. Inputs also dout [B, HQ, L, DV], lse and delta [B, HQ, L] (float32).
// Output: dq [B, HQ, L, D].
const DQ_SOURCE: &str = r#"
  float qv[DPT], dq[DPT], dov[DVPT];
#pragma unroll
  for (int t = 0; t < DPT; ++t) {
    qv[t] = mlxk_scaled<T>(q[row * D + lane + t * TPR], scale);
    dq[t] = 0.0f;
  }
#pragma unroll
  for (int t = 0; t < DVPT; ++t) {
    dov[t] = static_cast<float>(dout[row * DV + lane + t * TPR]);
  }
  const float li = lse[row], di = delta[row];
  for (int k0 = lo; k0 < hi; k0 += BK) {
    __syncthreads();
    mlxk_load_tile<T, BK, D, THREADS, false>(ks, kb, k0, S, scale);
    mlxk_load_tile<T, BK, DV, THREADS, false>(vs, vb, k0, S, scale);
    __syncthreads();
#pragma unroll 4
    for (int jj = 0; jj < BK; ++jj) {
      float sc = 0.0f, dp = 0.0f;
#pragma unroll
      for (int t = 0; t < DPT; ++t) {
        sc += qv[t] * ks[jj][lane + t * TPR];
      }
#pragma unroll
      for (int t = 0; t < DVPT; ++t) {
        dp += dov[t] * vs[jj][lane + t * TPR];
      }
      sc = mlxk_row_sum<TPR>(sc);
      dp = mlxk_row_sum<TPR>(dp);
      if (mlxk_visible<CAUSAL, WINDOW>(p, k0 + jj, S)) {
        const float ds = expf(sc - li) * (dp - di);
#pragma unroll
        for (int t = 0; t < DPT; ++t) {
          dq[t] += ds * ks[jj][lane + t * TPR];
        }
      }
    }
  }
  if (active) {
#pragma unroll
    for (int t = 0; t < DPT; ++t) {
      dqo[row * D + lane + t * TPR] = static_cast<T>(dq[t] * scale);
    }
  }
"#;

// One block: keys [j0, j0 + BR) of key/value head hk. Outputs: dk [B, HKV, S, D],
// dv [B, HKV, S, DV].
const DKDV_SOURCE: &str = r#"
  const int hk = blockIdx.y;
  const int j0 = blockIdx.x * BR;
  const bool active = j0 + r < S;
  const int j = min(j0 + r, S - 1);
  __shared__ float qs[BK][D];
  __shared__ float dos[BK][DV];
  __shared__ float ls[BK];
  __shared__ float dls[BK];
  const size_t krow = (size_t)(b * HKV + hk) * S + j;
  float kv[DPT], vv[DVPT], dk[DPT], dv[DVPT];
#pragma unroll
  for (int t = 0; t < DPT; ++t) {
    kv[t] = static_cast<float>(k[krow * D + lane + t * TPR]);
    dk[t] = 0.0f;
  }
#pragma unroll
  for (int t = 0; t < DVPT; ++t) {
    vv[t] = static_cast<float>(v[krow * DV + lane + t * TPR]);
    dv[t] = 0.0f;
  }
  // The queries that can see a key of this block: position p = i + off.
  int lo = 0, hi = L;
  if constexpr (CAUSAL) {
    lo = max(0, j0 - off);
  }
  if constexpr (WINDOW > 0) {
    hi = min(L, min(j0 + BR, S) - 1 + WINDOW - off);
  }
  for (int g = 0; g < G; ++g) {
    const size_t qrow0 = (size_t)(b * HQ + hk * G + g) * L;
    for (int i0 = lo; i0 < hi; i0 += BK) {
      __syncthreads();
      mlxk_load_tile<T, BK, D, THREADS, true>(qs, q + qrow0 * D, i0, L, scale);
      mlxk_load_tile<T, BK, DV, THREADS, false>(dos, dout + qrow0 * DV, i0, L, scale);
      for (int e = threadIdx.x; e < BK; e += THREADS) {
        const bool in = i0 + e < L;
        ls[e] = in ? lse[qrow0 + i0 + e] : 0.0f;
        dls[e] = in ? delta[qrow0 + i0 + e] : 0.0f;
      }
      __syncthreads();
#pragma unroll 4
      for (int ii = 0; ii < BK; ++ii) {
        float sc = 0.0f, dp = 0.0f;
#pragma unroll
        for (int t = 0; t < DPT; ++t) {
          sc += qs[ii][lane + t * TPR] * kv[t];
        }
#pragma unroll
        for (int t = 0; t < DVPT; ++t) {
          dp += dos[ii][lane + t * TPR] * vv[t];
        }
        sc = mlxk_row_sum<TPR>(sc);
        dp = mlxk_row_sum<TPR>(dp);
        if (i0 + ii < L && mlxk_visible<CAUSAL, WINDOW>(i0 + ii + off, j, S)) {
          const float pj = expf(sc - ls[ii]);
          const float ds = pj * (dp - dls[ii]);
#pragma unroll
          for (int t = 0; t < DVPT; ++t) {
            dv[t] += pj * dos[ii][lane + t * TPR];
          }
#pragma unroll
          for (int t = 0; t < DPT; ++t) {
            dk[t] += ds * qs[ii][lane + t * TPR];
          }
        }
      }
    }
  }
  if (active) {
#pragma unroll
    for (int t = 0; t < DPT; ++t) {
      dko[krow * D + lane + t * TPR] = static_cast<T>(dk[t]);
    }
#pragma unroll
    for (int t = 0; t < DVPT; ++t) {
      dvo[krow * DV + lane + t * TPR] = static_cast<T>(dv[t]);
    }
  }
"#;

/// One kernel: its name, inputs and outputs, and its source after [`PRELUDE`]: `start` (the
/// query-tile kernels' [`QUERY_PRELUDE`]) then `body`.
struct KernelSource {
    name: &'static str,
    inputs: &'static [&'static str],
    outputs: &'static [&'static str],
    start: &'static str,
    body: &'static str,
}

const BACKWARD_INPUTS: &[&str] = &["q", "k", "v", "dout", "lse", "delta"];

const KERNELS: [KernelSource; 3] = [
    KernelSource {
        name: "mlxk_flash_fwd",
        inputs: &["q", "k", "v"],
        outputs: &["out", "lse"],
        start: QUERY_PRELUDE,
        body: FWD_SOURCE,
    },
    KernelSource {
        name: "mlxk_flash_dq",
        inputs: BACKWARD_INPUTS,
        outputs: &["dqo"],
        start: QUERY_PRELUDE,
        body: DQ_SOURCE,
    },
    KernelSource {
        name: "mlxk_flash_dkdv",
        inputs: BACKWARD_INPUTS,
        outputs: &["dko", "dvo"],
        start: "",
        body: DKDV_SOURCE,
    },
];

fn builder(which: usize) -> KernelBuilder {
    let k = &KERNELS[which];
    CustomKernel::builder(k.name)
        .inputs(k.inputs.iter().copied())
        .outputs(k.outputs.iter().copied())
        .header(HEADER)
        .source(format!("{PRELUDE}{}{}", k.start, k.body))
}

/// Lanes per row and rows per shared tile for head dims `d`, `dv`: `TPR` 4 up to 64, else 8;
/// `BK` the largest power of two up to 64 with `BK * (d + dv)` float32 in 32 KiB.
fn tiling(d: i32, dv: i32) -> (i32, i32) {
    let tpr = if d.max(dv) <= 64 { 4 } else { 8 };
    let mut bk = 64;
    while bk > 1 && bk * (d + dv) * 4 > 32 * 1024 {
        bk /= 2;
    }
    (tpr, bk)
}

/// Checks what the CUDA path needs beyond [`crate::flash_attention`]'s own validation (head
/// dims, batch and head counts, lengths); `Err` names the limit.
pub fn check(q: &Array, k: &Array, v: &Array) -> Result<()> {
    let (d, dv) = (q.dim(3)?, v.dim(3)?);
    let (tpr, _) = tiling(d, dv);
    for (name, x) in [("queries' and keys' head_dim", d), ("values' head_dim", dv)] {
        if x > MAX_HEAD_DIM || x % tpr != 0 {
            return Err(invalid(
                OP,
                format!(
                    "the CUDA path takes a {name} that is a multiple of {tpr} and at most \
                     {MAX_HEAD_DIM}, got {x}; use Path::Reference"
                ),
            ));
        }
    }
    let (b, hq) = (q.dim(0)?, q.dim(1)?);
    if b > 65_535 || hq > 65_535 {
        return Err(invalid(
            OP,
            format!("the CUDA path takes at most 65535 batch rows and heads, got {b} and {hq}"),
        ));
    }
    let longest = q.dim(2)?.max(k.dim(2)?);
    if i64::from(longest) * i64::from(THREADS) > i64::from(i32::MAX) {
        return Err(invalid(
            OP,
            format!("the CUDA path takes at most 2^24 tokens, got {longest}"),
        ));
    }
    Ok(())
}

fn launch(spec: &FlashSpec, dtype: Dtype, d: i32, dv: i32, grid: [i32; 3]) -> Launch {
    let (tpr, bk) = tiling(d, dv);
    let bits = spec.scale.to_bits();
    Launch::new(grid, [THREADS, 1, 1])
        .template("T", TemplateArg::Dtype(dtype))
        .template("D", TemplateArg::Int(d))
        .template("DV", TemplateArg::Int(dv))
        .template("TPR", TemplateArg::Int(tpr))
        .template("BK", TemplateArg::Int(bk))
        .template("CAUSAL", TemplateArg::Bool(spec.causal))
        .template("WINDOW", TemplateArg::Int(spec.window.unwrap_or(0)))
        .template("SCALE_HI", TemplateArg::Int((bits >> 16) as i32))
        .template("SCALE_LO", TemplateArg::Int((bits & 0xffff) as i32))
}

fn run(which: usize, inputs: &[Array], launch: &Launch) -> Result<Vec<Array>> {
    let names = ["flash_fwd", "flash_dq", "flash_dkdv"];
    with_kernel(
        names[which],
        || builder(which),
        |k| k.call(inputs, launch, None),
    )
}

fn blocks(rows: i32, d: i32, dv: i32) -> i32 {
    let br = THREADS / tiling(d, dv).0;
    (rows + br - 1) / br * THREADS
}

/// `(out [B, Hq, L, Dv], lse [B, Hq, L] float32)`.
pub(crate) fn forward(q: &Array, k: &Array, v: &Array, spec: &FlashSpec) -> Result<(Array, Array)> {
    let (qs, dv) = (q.shape(), v.dim(3)?);
    let (b, hq, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let launch = launch(spec, q.dtype(), d, dv, [blocks(l, d, dv), hq, b])
        .output(&[b, hq, l, dv], q.dtype())
        .output(&[b, hq, l], Dtype::Float32);
    let mut outs = run(0, &[q.clone(), k.clone(), v.clone()], &launch)?.into_iter();
    match (outs.next(), outs.next()) {
        (Some(o), Some(lse)) => Ok((o, lse)),
        _ => Err(invalid(OP, "the forward kernel returned too few outputs")),
    }
}

/// `[dq, dk, dv]` from the output cotangent.
pub(crate) fn backward(
    q: &Array,
    k: &Array,
    v: &Array,
    out: &Array,
    lse: &Array,
    dout: &Array,
    spec: &FlashSpec,
) -> Result<Vec<Array>> {
    let dt = q.dtype();
    let (qs, ks, dv) = (q.shape(), k.shape(), v.dim(3)?);
    let (b, hq, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let (hkv, s) = (ks[1], ks[2]);
    let dout = dout.astype(dt)?;
    // delta = rowsum(do * o) in float32, as the plain path computes it.
    let delta =
        (&dout.astype(Dtype::Float32)? * &out.astype(Dtype::Float32)?)?.sum(&[-1], false)?;
    let inputs = [q.clone(), k.clone(), v.clone(), dout, lse.clone(), delta];
    let dq_launch = launch(spec, dt, d, dv, [blocks(l, d, dv), hq, b]).output(&[b, hq, l, d], dt);
    let dkdv_launch = launch(spec, dt, d, dv, [blocks(s, d, dv), hkv, b])
        .output(&[b, hkv, s, d], dt)
        .output(&[b, hkv, s, dv], dt);
    let mut grads = run(1, &inputs, &dq_launch)?;
    grads.extend(run(2, &inputs, &dkdv_launch)?);
    if grads.len() != 3 {
        return Err(invalid(OP, "the backward kernels returned too few outputs"));
    }
    Ok(grads)
}

/// Bound of the CUDA path in float32 against the materialised attention in float32 (output and
/// each gradient): `max|fused - ref| <= FUSED_F32_REL_BOUND * max|ref|` (`tests/cuda.rs`, with
/// MLX's TF32 matmuls off so that the reference is float32 throughout). The CPU emulation of
/// the kernels (`xtask/gpu/flash_emulate.py`) measures at most 4.5e-7 against double.
pub const FUSED_F32_REL_BOUND: f32 = 1e-5;
/// Bound of the CUDA path in bfloat16 against the float32 materialised attention of the same
/// (bfloat16-valued) inputs, relative to the largest magnitude. The kernels round twice to
/// bfloat16 (`q * scale`, then the result; 2^-9 relative each) and the probabilities carry the
/// first rounding on: `xtask/gpu/flash_emulate.py` measures at most 4.8e-3 over its shapes.
/// `tests/cuda.rs` also accepts anything no worse than the bfloat16 materialised attention's
/// own error.
pub const FUSED_BF16_REL_BOUND: f32 = 1e-2;
/// As [`FUSED_BF16_REL_BOUND`], for float16 (2^-12 relative per rounding; the emulation
/// measures at most 5.0e-4).
pub const FUSED_F16_REL_BOUND: f32 = 2e-3;
