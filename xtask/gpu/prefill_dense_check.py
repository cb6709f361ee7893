#!/usr/bin/env python3
"""Issue #30's prefill switch (MLX_PREFILL_DENSE) checked on the device with MLX's own ops.

The switch runs a prompt chunk's quantized linears as `x @ dequantize(w).T`, the weight
dequantized in blocks of rows (mlx_models::layers::DensePrompt: at most BLOCK_MB of
dequantized weight a block, whole tiles of 128 rows), instead of `mx.quantized_matmul`. Session
38's probe (prefill_probe.py) found both bit-equal on an H100 at the 8B's shapes, 512 and 2,048
rows. This script says where that holds and what the switch costs in peak memory:

  shapes  each 8B linear, rows M in ROWS_SWEEP, affine 4 bits in groups of 64 (the 8B's), and
          8 bits / groups of 128 / groups of 32 at 128 and 511 rows; bfloat16 inputs: the
          elements that differ (qmm against the blocked dense product, one block and 32 MiB
          blocks), and at M <= 511 the time of each (median of 10, each call synchronised);
  model   MODEL (mlx_lm.load) on a 511-token prompt (the chunk `mlx benchmark -p 512` runs):
          logits and KV cache of the stock forward against the forward with every
          QuantizedLinear patched to the dense product (rows >= 2), bit for bit; each forward's
          time (median of 5) and MLX peak memory, the dense one also under a memory limit of
          the active memory plus HEADROOM_MB (MLX_PREFILL_DENSE_HEADROOM_MB's mechanism).

One JSON line per result. Usage: prefill_dense_check.py [MODEL_DIR]
"""
import json
import os
import sys
import time

import mlx.core as mx
import mlx.nn as nn

BLOCK = 32 << 20
# The widths that matter first: MLX compiles each kernel variant (tile width, bits, group size)
# on first use, which may take the call's time before the narrow widths are reached.
ROWS_SWEEP = [511, 2048, 256, 128, 64, 16, 2]
SHAPES = [("q", 4096, 4096), ("kv", 1024, 4096), ("o", 4096, 4096), ("gate", 14336, 4096),
          ("down", 4096, 14336)]
if os.environ.get("PREFILL_CHECK_SMALL") == "1":  # a dry run off the device (CPU)
    SHAPES = [(name, n // 16, k // 16) for name, n, k in SHAPES]
    ROWS_SWEEP = [511, 64, 2]
HEADROOM_MB = [256, 1024, 1536]


def per_block(k, itemsize, block=BLOCK):
    per = max(1, block // (k * itemsize))
    return per // 128 * 128 if per >= 256 else per


def dense(x, w, s, b, group_size, bits, block=BLOCK):
    n, k = w.shape[0], w.shape[1] * 32 // bits
    per = min(per_block(k, s.dtype.size, block), n)
    outs = []
    for i in range(0, n, per):
        wd = mx.dequantize(w[i:i + per], s[i:i + per], None if b is None else b[i:i + per],
                           group_size=group_size, bits=bits)
        outs.append(x @ wd.T)
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)


def timed(f, reps=10):
    mx.eval(f())
    mx.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(f())
        mx.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return round(ts[len(ts) // 2] * 1e6, 1)


def shapes():
    configs = [(4, 64, ROWS_SWEEP), (8, 64, [128, 511]), (4, 128, [128, 511]), (4, 32, [128, 511])]
    for bits, gs, ms in configs:
        for name, n, k in SHAPES:
            w = (mx.random.normal((n, k), key=mx.random.key(1)) * 0.02).astype(mx.bfloat16)
            q, s, b = mx.quantize(w, group_size=gs, bits=bits)
            mx.eval(q, s, b)
            del w
            for m in ms:
                x = mx.random.normal((1, m, k), key=mx.random.key(2)).astype(mx.bfloat16)
                mx.eval(x)
                y = mx.quantized_matmul(x, q, s, b, transpose=True, group_size=gs, bits=bits)
                r = {"part": "shapes", "linear": name, "N": n, "K": k, "M": m, "bits": bits,
                     "group_size": gs}
                for tag, blk in [("one_block", 1 << 62), ("blocks_32mib", BLOCK)]:
                    d = dense(x, q, s, b, gs, bits, blk)
                    neq = (y != d).sum().item()
                    rel = (mx.abs(y.astype(mx.float32) - d.astype(mx.float32)).max()
                           / mx.abs(y.astype(mx.float32)).max()).item()
                    r[tag] = {"differ": neq, "of": y.size, "max_rel_diff": rel}
                if bits == 4 and gs == 64 and m <= 511:
                    r["qmm_us"] = timed(lambda: mx.quantized_matmul(
                        x, q, s, b, transpose=True, group_size=gs, bits=bits))
                    r["dense_us"] = timed(lambda: dense(x, q, s, b, gs, bits))
                print(json.dumps(r), flush=True)


def model(path):
    from pathlib import Path

    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    m, config = load_model(Path(path))
    vocab = min(config["vocab_size"], 32000)
    ids = mx.array([[(i * 7919 + 13) % vocab for i in range(511)]])
    stock = nn.QuantizedLinear.__call__

    def patched(self, x):
        if x.size // x.shape[-1] < 2:
            return stock(self, x)
        y = dense(x, self["weight"], self["scales"], self.get("biases"), self.group_size,
                  self.bits)
        return y + self["bias"] if "bias" in self else y

    def forward():
        cache = make_prompt_cache(m)
        logits = m(ids, cache=cache)
        kv = [a for c in cache for a in c.state if isinstance(a, mx.array)]
        mx.eval(logits, kv)
        return logits, kv

    def run(tag, limit_mb=None):
        mx.synchronize()
        mx.clear_cache()
        previous = mx.set_memory_limit(mx.get_active_memory() + (limit_mb << 20)) \
            if limit_mb else None
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        out = forward()
        mx.synchronize()
        peak = mx.get_peak_memory()
        t = timed(lambda: forward()[0], reps=5)
        if previous is not None:
            mx.set_memory_limit(previous)
        print(json.dumps({"part": "model", "side": tag, "forward_ms": round(t / 1e3, 2),
                          "tok_s": round(511 / t * 1e6, 1), "active_gb": round(base / 1e9, 3),
                          "peak_gb": round(peak / 1e9, 3),
                          "peak_over_active_mb": round((peak - base) / 2**20, 1)}), flush=True)
        return out

    exact = run("stock")
    nn.QuantizedLinear.__call__ = patched
    try:
        got = run("dense")
        for h in HEADROOM_MB:
            run(f"dense_headroom_{h}mb", h)
    finally:
        nn.QuantizedLinear.__call__ = stock
    same_logits = mx.array_equal(exact[0], got[0]).item()
    kv_differ = sum(int((a != b).sum().item()) for a, b in zip(exact[1], got[1]))
    rel = (mx.abs(exact[0].astype(mx.float32) - got[0].astype(mx.float32)).max()
           / mx.abs(exact[0].astype(mx.float32)).max()).item()
    print(json.dumps({"part": "model", "logits_equal": same_logits, "logits_max_rel_diff": rel,
                      "kv_elements_differ": kv_differ,
                      "kv_elements": sum(a.size for a in exact[1])}), flush=True)


def main():
    print(json.dumps({"device": str(mx.default_device()), "mlx": mx.__version__}), flush=True)
    if len(sys.argv) > 1:
        model(sys.argv[1])
    shapes()


if __name__ == "__main__":
    main()
