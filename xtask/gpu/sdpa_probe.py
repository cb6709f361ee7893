"""Issue #33 (H200): why does a speculative verification round cost ~150 ms on MLX's CUDA backend?

Times mx.fast.scaled_dot_product_attention for Q = 1, 2, 4, 8 query rows on Llama-3.1-8B
attention shapes (32 query heads, 8 KV heads, head_dim 128, bfloat16), keys and values sliced
from a preallocated cache as mlx-lm's KVCache does, over CALLS calls each: the key length
growing by Q every call (as in speculative decoding) against a fixed key length; for the fused
op with mask="causal" (mlx-lm's mask for more than one query), with a boolean array mask, with
the key length padded to a 256 bucket plus a boolean mask (so the shapes repeat within a bucket),
and the same attention through plain ops (matmul, softmax, matmul). MLX decides cuDNN vs its
vector kernel once per process from MLX_CUDA_USE_CUDNN_SDPA, so run this once with it unset and
once with MLX_CUDA_USE_CUDNN_SDPA=0. One JSON line per case: first-call, median, mean ms.
"""

import json
import os
import statistics
import sys
import time

import mlx.core as mx

H, KV, D = 32, 8, 128
DT = mx.bfloat16
SCALE = D**-0.5
CALLS = int(os.environ.get("CALLS", "50"))
L0 = int(os.environ.get("L0", "512"))
CAP = 8192
BUCKET = 256


def plain(q, k, v, mask):
    """Attention through plain ops, GQA by reshaping the queries (mlx's own fallback order)."""
    ql, kl = q.shape[2], k.shape[2]
    qg = (q * SCALE).reshape(1, KV, H // KV, ql, D)
    s = qg @ mx.expand_dims(k, 2).swapaxes(-1, -2)
    if mask is not None:
        s = mx.where(mask, s, mx.array(-float("inf"), s.dtype))
    p = mx.softmax(s, axis=-1, precise=True)
    return (p @ mx.expand_dims(v, 2)).reshape(1, H, ql, D)


def causal_bool(ql, kl, valid):
    """(ql, kl) boolean: row i sees keys j <= valid - ql + i (keys at or past `valid` hidden)."""
    rows = mx.arange(ql)[:, None] + (valid - ql)
    cols = mx.arange(kl)[None, :]
    return cols <= rows


def case(ql, grow, path):
    mx.random.seed(0)
    q = mx.random.normal((1, H, ql, D)).astype(DT)
    kc = mx.random.normal((1, KV, CAP, D)).astype(DT)
    vc = mx.random.normal((1, KV, CAP, D)).astype(DT)
    mx.eval(q, kc, vc)
    times = []
    length = L0
    for _ in range(CALLS):
        if grow:
            length += ql
        t0 = time.perf_counter()
        if path == "padded":
            kl = -(-length // BUCKET) * BUCKET
        else:
            kl = length
        k, v = kc[:, :, :kl], vc[:, :, :kl]
        if path == "fused-causal":
            o = mx.fast.scaled_dot_product_attention(
                q, k, v, scale=SCALE, mask="causal" if ql > 1 else None
            )
        elif path in ("fused-array", "padded"):
            m = causal_bool(ql, kl, length)
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=m)
        else:
            o = plain(q, k, v, causal_bool(ql, kl, length) if ql > 1 else None)
        mx.eval(o)
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "cudnn_env": os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "unset"),
        "q": ql,
        "keys": "grow" if grow else "fixed",
        "path": path,
        "calls": CALLS,
        "first_ms": round(times[0], 3),
        "median_ms": round(statistics.median(times), 3),
        "mean_ms": round(statistics.mean(times), 3),
        "mean_after_first_ms": round(statistics.mean(times[1:]), 3),
    }


def main():
    print(json.dumps({"device": str(mx.default_device()), "mlx": mx.__version__}), flush=True)
    paths = sys.argv[1:] or ["fused-causal", "fused-array", "padded", "plain"]
    for ql in (1, 2, 4, 8):
        for path in paths:
            for grow in (False, True):
                print(json.dumps(case(ql, grow, path)), flush=True)


if __name__ == "__main__":
    main()
