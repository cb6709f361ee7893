"""Goldens for mlx-kernels' plain-ops references (the exact path of each fused kernel).

Writes mlx-kernels/tests/goldens/kernels.safetensors. Run with `cargo xtask goldens kernels`.
Read by mlx-kernels/tests/reference.rs.

- add_rms_norm: [x, residual, weight] -> [h, out]; params eps. mlx-lm's llama block computes
  `h = x + r` and then `self.post_attention_layernorm(h)`, an `nn.RMSNorm`.
- swiglu: [gate, up] -> [out]. mlx-lm's own `models.activations.swiglu` (mx.compile'd).
"""

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

from golden import Golden

g = Golden("mlx-kernels/tests/goldens/kernels.safetensors", __file__)
mx.random.seed(15)

FLOATS = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


def rnd(shape, dt, scale=1.0):
    return (mx.random.normal(shape) * scale).astype(dt)


# Widths: SmolLM2's hidden size (576), one that is not a multiple of 8 (100), and one past
# the single-pass CUDA kernel's limit for float32 (4100).
for tag, dt in FLOATS.items():
    for rows, dims, eps in [(1, 576, 1e-5), (3, 100, 1e-6), (2, 4100, 1e-5)]:
        x = rnd((rows, 1, dims), dt, 2.0)
        r = rnd((rows, 1, dims), dt, 0.5)
        norm = nn.RMSNorm(dims, eps=eps)
        norm.weight = (rnd((dims,), dt, 0.1) + 1).astype(dt)
        h = x + r
        out = norm(h)
        g.case(f"add_rms_norm_{tag}_{rows}x{dims}", "add_rms_norm", [x, r, norm.weight], [h, out], eps=eps)

for tag, dt in FLOATS.items():
    for shape in [(1, 1, 1536), (2, 5, 37), ()]:
        gate = rnd(shape, dt, 3.0)
        up = rnd(shape, dt)
        name = "x".join(str(s) for s in shape) or "scalar"
        g.case(f"swiglu_{tag}_{name}", "swiglu", [gate, up], [swiglu(gate, up)])

g.save()
