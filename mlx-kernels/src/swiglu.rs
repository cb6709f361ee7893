//! SwiGLU: `silu(gate) * up` with `silu(g) = g * sigmoid(g)`, mlx-lm's `swiglu(gate, x)`
//! (`models/activations.py`). Reference: `sigmoid`, `multiply`, `multiply` (three launches
//! uncompiled on CUDA). Fused: one elementwise kernel, 16 bytes per thread.
//!
//! The fused kernel applies MLX's own CUDA functors (`Sigmoid`, `Multiply` from
//! `mlx/backend/cuda/device/{unary,binary}_ops.cuh`, which MLX's JIT bundles) in the
//! reference's order, rounding to the element type after each op as the unfused graph does.
//! So it is meant to be bit-equal with the reference ([`TIER`]).

use mlx_core::kernels::{CustomKernel, KernelBuilder, Launch, TemplateArg};
use mlx_core::prelude::*;

use crate::{check_float, check_same_dtype, invalid, n_reads, with_kernel, Path, Tier};

/// The fused kernel against [`swiglu_reference`] on the same CUDA device: bit-equal (checked
/// by `tests/cuda.rs` over float32, float16 and bfloat16 on a CUDA device, `xtask/gpu/`).
pub const TIER: Tier = Tier::Exact;

const OP: &str = "swiglu";

/// Threads per block of the fused kernel.
const BLOCK: i32 = 256;

const HEADER: &str = r#"
#include "mlx/backend/cuda/device/unary_ops.cuh"
#include "mlx/backend/cuda/device/binary_ops.cuh"
"#;

// Template arguments: T (dtype), NR (elements per 16-byte vector). The element count comes
// from `gate_shape`, so one compiled instance serves every shape of a dtype.
const SOURCE: &str = r#"
  uint32_t N = 1;
  for (int i = 0; i < gate_ndim; ++i) {
    N *= gate_shape[i];
  }
  const uint32_t index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index * NR >= N) {
    return;
  }
  auto g = load_vector<NR>(gate, index, N, T(0));
  auto u = load_vector<NR>(up, index, N, T(0));
  AlignedVector<T, NR> o;
#pragma unroll
  for (int j = 0; j < NR; ++j) {
    T s = Sigmoid{}(g[j]);
    T a = Multiply{}(g[j], s);
    o[j] = Multiply{}(a, u[j]);
  }
  store_vector<NR>(out, index, o, N);
"#;

fn kernel() -> KernelBuilder {
    CustomKernel::builder("mlxk_swiglu")
        .inputs(["gate", "up"])
        .outputs(["out"])
        .header(HEADER)
        .source(SOURCE)
}

fn check(gate: &Array, up: &Array) -> Result<()> {
    check_float(OP, "gate", gate)?;
    check_same_dtype(OP, "up", up, "gate", gate)?;
    if gate.shape() != up.shape() {
        return Err(invalid(
            OP,
            format!(
                "up has {:?}, gate has {:?}; they must be equal",
                up.shape(),
                gate.shape()
            ),
        ));
    }
    Ok(())
}

/// `nn.silu(gate) * up` from plain ops, in mlx-lm's order.
pub fn swiglu_reference(gate: &Array, up: &Array) -> Result<Array> {
    check(gate, up)?;
    let silu = ops::multiply(gate, &ops::sigmoid(gate, None)?, None)?;
    ops::multiply(&silu, up, None)
}

/// `silu(gate) * up` on the chosen [`Path`]. `gate` and `up` have one shape and one floating
/// dtype.
pub fn swiglu(gate: &Array, up: &Array, path: Path) -> Result<Array> {
    match path {
        Path::Reference => swiglu_reference(gate, up),
        Path::Fused => swiglu_fused(gate, up),
    }
}

fn swiglu_fused(gate: &Array, up: &Array) -> Result<Array> {
    check(gate, up)?;
    let n = i32::try_from(gate.size()).map_err(|_| {
        invalid(
            OP,
            format!("gate has {} elements; at most 2^31 - 1", gate.size()),
        )
    })?;
    let shape = gate.shape();
    if n == 0 {
        return ops::zeros(&shape, gate.dtype(), None);
    }
    let dtype = gate.dtype();
    let nr = n_reads(dtype);
    let threads = (n + nr - 1) / nr;
    let launch = Launch::new([threads, 1, 1], [BLOCK, 1, 1])
        .template("T", TemplateArg::Dtype(dtype))
        .template("NR", TemplateArg::Int(nr))
        .output(&shape, dtype);
    // MLX passes `gate_shape` only for arrays with at least one axis.
    let (g, u) = if shape.is_empty() {
        (
            ops::reshape(gate, &[1], None)?,
            ops::reshape(up, &[1], None)?,
        )
    } else {
        (gate.clone(), up.clone())
    };
    let mut outs = with_kernel("swiglu", kernel, |k| k.call(&[g, u], &launch, None))?;
    let out = outs.pop().ok_or_else(|| Error::Mlx {
        op: OP,
        message: "the kernel returned no output".into(),
    })?;
    if shape.is_empty() {
        ops::reshape(&out, &[], None)
    } else {
        Ok(out)
    }
}
