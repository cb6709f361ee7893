"""Issue #33 (H200): where a speculative round's time goes, part by part, on MLX's CUDA backend.

    python3 spec_probe.py TARGET_DIR DRAFT_DIR      # one JSON line a case on stdout

With mlx-lm's own models (TARGET an 8B-shaped 4-bit llama, DRAFT a 135M-shaped bfloat16 one),
each prefilled with a 64-token prompt, times CALLS forwards (eval after each, the cache growing
by the forward's length, as in a speculative run where every draft is accepted):
- the target with 1 query row (plain decode: the ideal model's price of a verification pass),
- the target with K + 1 rows for K = 2, 4, 8, attention through MLX's fused SDPA (cuDNN for
  more than one row, unless MLX_CUDA_USE_CUDNN_SDPA=0) and through plain ops (matmul, softmax,
  matmul: main's fix in speculative.rs) and through the fused kernel over keys padded to 256
  buckets (`bucketed`: what `mlx generate --draft-model` runs on CUDA since run 11),
- the draft with 1 and 2 rows (a draft pass; the first of a round after a full accept has 2),
- a chained round as mlx-lm's speculative_generate_step runs it (K draft steps, each
  async_eval'd, then the target's K + 1 rows, one eval) against the sum of its parts.
First call, median and mean ms a case. The gap between "round" and the ideal model
(one target pass a round plus one draft pass a drafted token) is the next cost to find.
"""

import json
import os
import statistics
import sys
import time

import mlx.core as mx
import mlx_lm.models.llama as llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

CALLS = int(os.environ.get("CALLS", "24"))
FUSED = llama.scaled_dot_product_attention


def plain(queries, keys, values, cache, scale, mask, sinks=None):
    """Attention through plain ops (GQA by reshaping the queries), causal over the new rows."""
    b, h, ql, d = queries.shape
    kv, kl = keys.shape[1], keys.shape[2]
    if ql == 1:
        return FUSED(queries, keys, values, cache=cache, scale=scale, mask=mask)
    qg = (queries * scale).reshape(b, kv, h // kv, ql, d)
    s = qg @ mx.expand_dims(keys, 2).swapaxes(-1, -2)
    rows = mx.arange(ql)[:, None] + (kl - ql)
    s = mx.where(mx.arange(kl)[None, :] <= rows, s, mx.array(-float("inf"), s.dtype))
    p = mx.softmax(s, axis=-1, precise=True)
    return (p @ mx.expand_dims(values, 2)).reshape(b, h, ql, d)


def bucketed(queries, keys, values, cache, scale, mask, sinks=None):
    """MLX's fused attention over keys and values padded to a multiple of 256 positions, the
    padding masked (what `mlx generate --draft-model` runs on CUDA since run 11)."""
    ql, kl = queries.shape[2], keys.shape[2]
    if ql == 1:
        return FUSED(queries, keys, values, cache=cache, scale=scale, mask=mask)
    padded = -(-kl // 256) * 256
    pad = [(0, 0), (0, 0), (0, padded - kl), (0, 0)]
    keys, values = mx.pad(keys, pad), mx.pad(values, pad)
    m = mx.arange(padded)[None, :] <= (mx.arange(ql)[:, None] + (kl - ql))
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=m)


def timed(label, fn, extra=None):
    times = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    row = {"case": label, "first_ms": round(times[0], 3),
           "median_ms": round(statistics.median(times[1:]), 3),
           "mean_ms": round(statistics.mean(times[1:]), 3)}
    row.update(extra or {})
    print(json.dumps(row), flush=True)
    return row


def fresh(model, prompt=64):
    cache = make_prompt_cache(model)
    model((mx.arange(prompt)[None] * 7 + 3) % 100, cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def forward_case(label, model, rows, attention):
    llama.scaled_dot_product_attention = attention
    cache = fresh(model)
    x = mx.full((1, rows), 27, dtype=mx.uint32)

    def one():
        mx.eval(model(x, cache=cache))

    r = timed(label, one, {"rows": rows})
    llama.scaled_dot_product_attention = FUSED
    return r


def round_case(k, target, draft, attention):
    """mlx-lm's round: K chained draft steps (async_eval each), then the target's K + 1 rows."""
    llama.scaled_dot_product_attention = attention
    tc, dc = fresh(target), fresh(draft)
    y = mx.array([27], dtype=mx.uint32)

    def one():
        ys, t = [], y
        for _ in range(k):
            t = mx.argmax(draft(t[None], cache=dc)[:, -1, :], axis=-1)
            mx.async_eval(t)
            ys.append(t)
        tokens = mx.argmax(target(mx.concatenate([y] + ys)[None], cache=tc)[0], axis=-1)
        mx.eval(tokens)

    r = timed(f"round k{k} {attention.__name__}", one, {"rows": k + 1})
    llama.scaled_dot_product_attention = FUSED
    return r


def main():
    target, _ = load_model(__import__("pathlib").Path(sys.argv[1]))
    draft, _ = load_model(__import__("pathlib").Path(sys.argv[2]))
    print(json.dumps({"device": str(mx.default_device()),
                      "cudnn_env": os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "unset")}), flush=True)
    forward_case("warm target", target, 5, plain)
    forward_case("warm draft", draft, 2, plain)
    t1 = forward_case("target 1 row", target, 1, FUSED)
    d1 = forward_case("draft 1 row", draft, 1, FUSED)
    forward_case("draft 2 rows plain", draft, 2, plain)
    for k in (2, 4, 8):
        forward_case(f"target {k + 1} rows plain", target, k + 1, plain)
        forward_case(f"target {k + 1} rows bucketed", target, k + 1, bucketed)
        if os.environ.get("FUSED_ROWS", "1") == "1":
            forward_case(f"target {k + 1} rows fused", target, k + 1, FUSED)
        ideal = t1["median_ms"] + k * d1["median_ms"]
        for attention in (plain, bucketed):
            r = round_case(k, target, draft, attention)
            print(json.dumps({"case": f"ideal round k{k}", "median_ms": round(ideal, 3),
                              "attention": attention.__name__,
                              "round_over_ideal": round(r["median_ms"] / ideal, 3)}), flush=True)


if __name__ == "__main__":
    main()
