"""Where one decode step's time goes, with mlx-lm 0.32.2 on MLX's CUDA back-end.

    python decode_breakdown.py OUT.json [MODEL ...]      (models: 135m-bf16 135m-q4 8b-bf16 8b-q4)

Random llama models of SmolLM2-135M's and Llama-3-8B's shapes, built in memory with mlx-lm's
own `llama.Model`. After a 512-token prefill, each measured decode step is run synchronously
and timed in three phases:
  build  - Python builds the lazy graph: `model(y, cache)`, last-position log-softmax, argmax
           (what mlx-lm's `generate_step` does per token, greedy);
  sched  - `mx.async_eval(y, logprobs)`: MLX walks the graph and encodes/launches every
           kernel on the host, returning before the GPU finishes;
  sync   - `mx.synchronize()`: waiting for the GPU to finish what was launched.
Plus the graph's node count (from `mx.export_to_dot`), and mlx-lm's own pipelined
`generate_step` decode rate over the same prompt for comparison. Medians over 40 steps after
8 warm-up steps, with the 10th and 90th percentiles.
"""

import json
import os
import re
import statistics
import sys
import tempfile
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as cache_mod
from mlx_lm.models import llama

SHAPES = {
    "135m": dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536,
                 num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                 rope_theta=100000.0, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               rope_theta=500000.0, tie_word_embeddings=False),
}
PROMPT, WARM, STEPS, N_GEN = 512, 8, 40, 64
if os.environ.get("BREAKDOWN_QUICK"):  # a smoke test of the script itself (CPU)
    PROMPT, WARM, STEPS, N_GEN = 16, 1, 2, 4


def build(shape):
    cfg = dict(model_type="llama", rms_norm_eps=1e-5, max_position_embeddings=8192, **SHAPES[shape])
    mx.random.seed(7)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    model.update(tree_map(lambda p: (mx.random.normal(p.shape) * 0.02).astype(mx.bfloat16),
                          model.parameters()))
    mx.eval(model.parameters())
    return model


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def node_count(outputs):
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".dot", delete=False) as f:
            path = f.name
        mx.export_to_dot(path, *outputs)
        text = open(path).read()
        os.unlink(path)
        # Primitive nodes are drawn as rectangles; arrays as plain nodes.
        prims = re.findall(r'label ="([^"]+)", shape=rectangle', text)
        hist = {}
        for p in prims:
            hist[p] = hist.get(p, 0) + 1
        top = sorted(hist.items(), key=lambda kv: -kv[1])[:12]
        return {"primitives": len(prims), "top": top}
    except Exception as e:  # noqa: BLE001
        return f"n/a ({type(e).__name__})"


def step_graph(model, y, cache):
    logits = model(y[None], cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.argmax(logprobs, axis=-1), logprobs


def measure(name, model):
    prompt = mx.random.randint(0, 1000, (PROMPT,), key=mx.random.key(1))
    cache = cache_mod.make_prompt_cache(model)
    logits = model(prompt[None], cache=cache)
    y = mx.argmax(logits[0, -1:], axis=-1)
    mx.eval(y)
    mx.synchronize()
    phases = {"build": [], "sched": [], "sync": [], "total": []}
    nodes = None
    for i in range(WARM + STEPS):
        t0 = time.perf_counter()
        y2, lp = step_graph(model, y, cache)
        t1 = time.perf_counter()
        if nodes is None:
            nodes = node_count([y2, lp])
            t1 = time.perf_counter()
            t0 = t1  # keep the count out of the build time of this (warm-up) step
        mx.async_eval(y2, lp)
        t2 = time.perf_counter()
        mx.synchronize()
        t3 = time.perf_counter()
        y = y2
        if i >= WARM:
            phases["build"].append(t1 - t0)
            phases["sched"].append(t2 - t1)
            phases["sync"].append(t3 - t2)
            phases["total"].append(t3 - t0)
    res = {"model": name, "cached_tokens": PROMPT, "graph_nodes": nodes}
    for k, v in phases.items():
        res[k + "_ms"] = [round(1e3 * pct(v, 0.1), 3), round(1e3 * statistics.median(v), 3),
                          round(1e3 * pct(v, 0.9), 3)]
    # mlx-lm's own pipelined loop (async_eval of step n+1 before waiting on step n).
    gen = generate_step(prompt, model, max_tokens=N_GEN)
    next(gen)
    mx.synchronize()
    t = time.perf_counter()
    count = 0
    for _ in gen:
        count += 1
    mx.synchronize()
    res["mlx_lm_generate_step_tok_s"] = round(count / (time.perf_counter() - t), 1)
    res["peak_memory_gb"] = round(mx.get_peak_memory() / 1e9, 2)
    print(json.dumps(res), flush=True)
    return res


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or ["135m-bf16", "135m-q4", "8b-bf16", "8b-q4"]
    results = []
    models = {}
    for name in names:
        shape, kind = name.split("-")
        if shape not in models:
            models[shape] = build(shape)
        model = models[shape]
        if kind == "q4" and not getattr(model, "_q4", False):
            nn.quantize(model, group_size=64, bits=4)
            mx.eval(model.parameters())
            model._q4 = True
        elif kind == "bf16" and getattr(model, "_q4", False):
            sys.exit(f"{name}: list bf16 before q4 for one shape")
        results.append(measure(name, model))
        mx.clear_cache()
    with open(out, "w") as f:
        json.dump({"mlx": mx.__version__, "device": str(mx.default_device()), "results": results}, f, indent=1)
    print("| model | nodes | build ms | sched ms | sync ms | total ms | mlx-lm tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        nodes = r["graph_nodes"]
        nodes = nodes["primitives"] if isinstance(nodes, dict) else nodes
        print(f"| {r['model']} | {nodes} | {r['build_ms'][1]} | {r['sched_ms'][1]} | "
              f"{r['sync_ms'][1]} | {r['total_ms'][1]} | {r['mlx_lm_generate_step_tok_s']} |")


main()
