#!/usr/bin/env python3
"""Issue #30's prefill row: MLX's CUDA quantized matmul against dequantize + matmul.

For each linear of a Llama-3.1-8B-shaped 4-bit model (groups of 64, bfloat16 inputs) and each
prompt length M: the time of `mx.quantized_matmul` (what mlx-lm's prefill runs), of
`mx.dequantize` then `x @ w.T` (a fused-decoder prompt path could run this), and of the matmul
alone on pre-dequantized weights (the floor). Each figure is the median of REPS timed
evaluations after WARM untimed ones. Prints one JSON line per (linear, M), then the 32-layer
sums per M. Usage: prefill_probe.py [M ...]
"""
import json
import sys
import time

import mlx.core as mx

REPS, WARM = 15, 3
SHAPES = [("q", 4096, 4096), ("kv", 1024, 4096), ("kv2", 1024, 4096), ("o", 4096, 4096),
          ("gate", 14336, 4096), ("up", 14336, 4096), ("down", 4096, 14336)]


def timed(f, reps=REPS, warm=WARM):
    """The median of `reps` timed evaluations of `f()` (each `mx.eval`, then `mx.synchronize`)
    after `warm` untimed ones, in microseconds."""
    for _ in range(warm):
        mx.eval(f())
    mx.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(f())
        mx.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e6


def main():
    ms = [int(a) for a in sys.argv[1:]] or [128, 512, 2048]
    print(json.dumps({"device": str(mx.default_device())}))
    sums = {m: {"qmm": 0.0, "deq_mm": 0.0, "mm": 0.0, "deq": 0.0} for m in ms}
    for name, n, k in SHAPES:
        w = (mx.random.normal((n, k), key=mx.random.key(1)) * 0.02).astype(mx.bfloat16)
        q, s, b = mx.quantize(w, group_size=64, bits=4)
        wd = mx.dequantize(q, s, b, group_size=64, bits=4)
        mx.eval(q, s, b, wd)
        del w
        deq = timed(lambda: mx.dequantize(q, s, b, group_size=64, bits=4))
        for m in ms:
            x = (mx.random.normal((1, m, k), key=mx.random.key(2))).astype(mx.bfloat16)
            mx.eval(x)
            t_qmm = timed(lambda: mx.quantized_matmul(x, q, s, b, transpose=True, group_size=64, bits=4))
            t_dm = timed(lambda: x @ mx.dequantize(q, s, b, group_size=64, bits=4).T)
            t_mm = timed(lambda: x @ wd.T)
            y1 = mx.quantized_matmul(x, q, s, b, transpose=True, group_size=64, bits=4).astype(mx.float32)
            y2 = (x @ wd.T).astype(mx.float32)
            rel = (mx.abs(y1 - y2).max() / mx.abs(y1).max()).item()
            r = {"linear": name, "N": n, "K": k, "M": m, "qmm_us": round(t_qmm, 1),
                 "deq_mm_us": round(t_dm, 1), "mm_us": round(t_mm, 1), "deq_us": round(deq, 1),
                 "max_rel_diff": rel}
            print(json.dumps(r), flush=True)
            sums[m]["qmm"] += t_qmm
            sums[m]["deq_mm"] += t_dm
            sums[m]["mm"] += t_mm
            sums[m]["deq"] += deq
        del q, s, b, wd
    for m in ms:
        s = {k: round(v * 32 / 1000, 2) for k, v in sums[m].items()}
        print(json.dumps({"M": m, "layers": 32, "ms_qmm": s["qmm"], "ms_deq_mm": s["deq_mm"],
                          "ms_mm": s["mm"], "ms_deq_only": s["deq"],
                          "qmm_tok_s": round(m / s["qmm"] * 1000, 1),
                          "deq_mm_tok_s": round(m / s["deq_mm"] * 1000, 1)}))


if __name__ == "__main__":
    main()
