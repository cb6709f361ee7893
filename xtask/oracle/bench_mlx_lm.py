"""mlx-lm's side of `cargo xtask bench`: greedy generation speed of mlx-lm 0.32.2.

    python bench_mlx_lm.py --model PATH [--dtype float32|float16|bfloat16|keep]
        [--prompt-len 512] [--gen-len 32] [--seed 0] [--warmup 1]
        [--warmup-prompt-len N] [--warmup-gen-len N] [--trials 1]
        [--prefill-step-size 2048] [--device cpu|gpu] [--digests] [--graph]
        [--prompt-ids ID,ID,...]

PATH is an HF-style directory (loaded by `mlx_lm.utils.load_model`) or a llama `.gguf` file
(mapped to mlx-lm's names and loaded into `mlx_lm.models.llama` exactly as
`goldens_smollm2_logits.py` does). `--dtype` casts every floating parameter
(`Module.set_dtype`), `keep` leaves the stored dtypes.

The prompt is `--prompt-len` token ids drawn with splitmix64 from `--seed`, modulo the
vocabulary size; `mlx-engine/examples/bench_generate.rs` draws the same ids. `--prompt-ids`
gives the ids instead (`cargo xtask bench --device cpu` passes those `mlx generate` gets). Generation is
`mlx_lm.generate.generate_step` with the greedy sampler and `max_tokens = --gen-len`, timed the
way `stream_generate` times it (and `mlx_lm.benchmark` reports it):
  prompt_tps     = prompt tokens / time from the call to the first token,
  generation_tps = gen_len / time from the first token to the last one
(stream_generate divides by the number of tokens yielded, not by the gen_len - 1 intervals).
EOS is ignored: exactly gen_len tokens are generated. After each trial the stream is
synchronized (the pipelined step started before the last token is drained, untimed). Warmup
runs (default one, with the warmup lengths, which default to the measured ones) come first and
are not reported.

Besides wall time, each phase's process CPU time (user + system, all threads, `os.times()`,
clock ticks as bench_generate.rs reads them from /proc/self/stat) is reported: on a loaded
machine it is much steadier than wall time.

`--graph` adds `graph`: the primitive counts (`mx.export_to_dot` labels) of the first prefill
chunk's `mx.eval` and the third step's `mx.async_eval` in `generate_step`, from an extra
untimed generation of 3 tokens (bench_generate.rs `--graph` writes the same for ours).

Prints one JSON line on stdout.
"""

import argparse
import json
import os
import sys
import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.sample_utils import make_sampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldens_smollm2_logits as logits_script  # noqa: E402  (GGUF mapping)

MASK = (1 << 64) - 1


def prompt_ids(n, seed, vocab):
    """splitmix64 from `seed`, each output modulo `vocab` (as bench_generate.rs)."""
    state = seed & MASK
    out = []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out.append(z % vocab)
    return out


def load_gguf(path):
    """The GGUF mapped and loaded exactly as goldens_smollm2_logits.py does it."""
    weights, meta = mx.load(path, return_metadata=True)
    config, mapped = logits_script.build(weights, meta)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    nn.quantize(model, class_predicate=logits_script.predicate(mapped))
    model.load_weights(list(mapped.items()), strict=True)
    return model, config


def load(path, dtype):
    if path.endswith(".gguf"):
        model, config = load_gguf(path)
    else:
        from pathlib import Path

        from mlx_lm.utils import load_model

        model, config = load_model(Path(path))
    if dtype != "keep":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    return model, vocab


def cpu_seconds():
    t = os.times()
    return t.user + t.system


def digest(logprobs):
    """The first 16 hex digits of the sha256 of the log-probabilities as little-endian float32
    (bench_generate.rs writes the same)."""
    import hashlib

    import numpy as np

    return hashlib.sha256(np.array(logprobs.astype(mx.float32)).astype("<f4").tobytes()).hexdigest()[:16]


def trial(model, prompt, gen_len, prefill_step_size, digests=None):
    """One generation, timed as stream_generate times it; with `digests` (a list), also each
    step's log-probability digest."""
    # Imported late: mlx-lm makes its generation stream on the default device at import.
    from mlx_lm.generate import generate_step, generation_stream

    sampler = make_sampler(0.0)
    tokens = []
    mx.reset_peak_memory()
    cpu0 = cpu_seconds()
    tic = time.perf_counter()
    prompt_time = None
    for n, (token, logprobs) in enumerate(
        generate_step(
            prompt, model, max_tokens=gen_len, sampler=sampler,
            prefill_step_size=prefill_step_size,
        )
    ):
        if n == 0:
            prompt_time = time.perf_counter() - tic
            cpu1 = cpu_seconds()
            tic = time.perf_counter()
        tokens.append(token)
        if digests is not None:
            digests.append(digest(logprobs))
        if n + 1 == gen_len:
            break
    gen_time = time.perf_counter() - tic
    cpu2 = cpu_seconds()
    mx.synchronize(generation_stream)
    return {
        "prompt_tps": prompt.size / prompt_time,
        "generation_tps": len(tokens) / gen_time,
        "prompt_time_s": prompt_time,
        "generation_time_s": gen_time,
        "prompt_cpu_s": cpu1 - cpu0,
        "generation_cpu_s": cpu2 - cpu1,
        "peak_memory_gb": mx.get_peak_memory() / 1e9,
    }, tokens


def graph_counts(model, prompt, prefill_step_size):
    """The graphs generate_step evaluates, seen by wrapping mx.eval / mx.async_eval."""
    import io
    import re

    from mlx.utils import tree_flatten
    from mlx_lm.generate import generate_step

    label = re.compile(r'\[label ="([^"]*)", shape=rectangle\]')
    seen = []

    def counts(args):
        arrays = [a for _, a in tree_flatten(list(args)) if isinstance(a, mx.array)]
        buf = io.StringIO()
        mx.export_to_dot(buf, *arrays)
        c = {}
        for m in label.finditer(buf.getvalue()):
            c[m.group(1)] = c.get(m.group(1), 0) + 1
        return c

    real_eval, real_async = mx.eval, mx.async_eval

    def probe_eval(*args):
        seen.append(("prefill", counts(args)))
        return real_eval(*args)

    def probe_async(*args):
        seen.append(("step", counts(args)))
        return real_async(*args)

    mx.eval, mx.async_eval = probe_eval, probe_async
    try:
        for _ in generate_step(prompt, model, max_tokens=3, sampler=make_sampler(0.0),
                               prefill_step_size=prefill_step_size):
            pass
    finally:
        mx.eval, mx.async_eval = real_eval, real_async

    def pick(what, nth):
        got = [c for w, c in seen if w == what and c]
        if len(got) <= nth:
            return None
        return {"nodes": sum(got[nth].values()), "by_kind": dict(sorted(got[nth].items()))}

    return {"prefill": pick("prefill", 0), "step": pick("step", 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "float16", "bfloat16", "keep"])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-ids", default=None,
                    help="comma-separated prompt token ids (instead of --prompt-len random ones)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--warmup-prompt-len", type=int, default=None)
    ap.add_argument("--warmup-gen-len", type=int, default=None)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--device", choices=["cpu", "gpu"], default=None)
    ap.add_argument("--graph", action="store_true",
                    help="add the primitive counts of the prefill and decode graphs")
    ap.add_argument("--digests", action="store_true",
                    help="add each step's log-probability digest (untimed use only)")
    a = ap.parse_args()
    ids = None
    if a.prompt_ids is not None:
        ids = [int(t) for t in a.prompt_ids.split(",") if t.strip()]
        a.prompt_len = len(ids)
    if a.prompt_len < 1 or a.gen_len < 1:
        ap.error("--prompt-len and --gen-len must be positive")

    if a.device is not None:
        mx.set_default_device(mx.cpu if a.device == "cpu" else mx.gpu)
    t = time.perf_counter()
    model, vocab = load(a.model, a.dtype)
    load_s = time.perf_counter() - t
    if ids is None:
        ids = prompt_ids(a.prompt_len, a.seed, vocab)
    prompt = mx.array(ids, dtype=mx.int32)
    wp = min(a.warmup_prompt_len or a.prompt_len, a.prompt_len)
    wg = max(a.warmup_gen_len or a.gen_len, 1)
    for _ in range(a.warmup):
        trial(model, prompt[:wp], wg, a.prefill_step_size)
    trials = []
    tokens = None
    digests = None
    for _ in range(a.trials):
        digests = [] if a.digests else None
        r, tokens = trial(model, prompt, a.gen_len, a.prefill_step_size, digests)
        trials.append(r)
    extra = {"logprob_digests": digests} if a.digests else {}
    if a.graph:
        extra["graph"] = graph_counts(model, prompt, a.prefill_step_size)
    print(json.dumps({
        "impl": "mlx-lm",
        "version": __import__("mlx_lm").__version__,
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "model": os.path.abspath(a.model),
        "dtype": a.dtype,
        "prompt_len": a.prompt_len,
        "gen_len": a.gen_len,
        "seed": a.seed,
        "load_s": load_s,
        "trials": trials,
        "tokens": tokens,
        **extra,
    }))


main()
