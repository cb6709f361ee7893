"""Trace goldens for mlx-cache: mlx-lm 0.32.2's caches driven through seeded random operation
sequences. Every fetched array, offset, trim result and mask is recorded.

Writes mlx-cache/tests/goldens/cache_traces.safetensors (cases `<trace>_s<step>`, replayed in
order by mlx-cache/tests/traces.rs) and mlx-cache/tests/goldens/prompt_cache_mlx_lm.safetensors
(a prompt-cache file written by mlx-lm's save_prompt_cache, loaded by the Rust tests).
Run with `cargo xtask goldens cache`.
"""

import random

import mlx.core as mx
from mlx_lm.models import cache as C

from golden import Golden

g = Golden("mlx-cache/tests/goldens/cache_traces.safetensors", __file__)
DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


def flat(kv):
    """Fetched (keys, values) as a flat list: dense arrays or quantized triples."""
    out = []
    for part in kv:
        if isinstance(part, (list, tuple)):
            out.extend(part)
        else:
            out.append(part)
    return out


class Trace:
    def __init__(self, name, rng, heads, dim, dtype):
        self.name, self.rng, self.heads, self.dim, self.dtype = name, rng, heads, dim, dtype
        self.step = 0

    def case(self, op, inputs, outputs, **params):
        g.case(f"{self.name}_s{self.step:03d}", op, inputs, outputs, trace=self.name, **params)
        self.step += 1

    def new(self, cache, kind, **params):
        self.cache = cache
        self.case("new", [], [], kind=kind, dtype=self.dtype, **params)

    def update(self, n):
        k = mx.random.normal((1, self.heads, n, self.dim)).astype(DTYPES[self.dtype])
        v = mx.random.normal((1, self.heads, n, self.dim)).astype(DTYPES[self.dtype])
        out = flat(self.cache.update_and_fetch(k, v))
        self.case("update", [k, v], out, offset=self.cache.offset)

    def trim(self, n):
        trimmable = self.cache.is_trimmable()
        got = C.trim_prompt_cache([self.cache], n) if trimmable else 0
        self.case("trim", [], [], n=n, trimmable=trimmable, trimmed=got, offset=self.cache.offset)

    def mask(self, n, window=None, return_array=False):
        # As models call it (base.create_attention_mask): window_size always passed.
        m = self.cache.make_mask(n, return_array=return_array, window_size=window)
        if m is None:
            self.case("mask", [], [], n=n, window=window, return_array=return_array, result="none")
        elif isinstance(m, str):
            self.case("mask", [], [], n=n, window=window, return_array=return_array, result=m)
        else:
            self.case("mask", [], [m], n=n, window=window, return_array=return_array, result="array")

    def fetch(self):
        out = flat(self.cache.keys_and_values()) if not self.cache.empty() else []
        self.case("fetch", [], out, offset=self.cache.offset, nbytes=self.cache.nbytes)

    def to_quantized(self, group_size, bits):
        self.cache = self.cache.to_quantized(group_size=group_size, bits=bits)
        self.case("to_quantized", [], [], group_size=group_size, bits=bits, offset=self.cache.offset)


def random_writes(t, steps, sizes, trims=True, masks=True, windows=(None,)):
    for _ in range(steps):
        r = t.rng.random()
        if r < 0.55:
            t.update(t.rng.choice(sizes))
        elif r < 0.7 and trims:
            t.trim(t.rng.randint(1, 40))
        elif r < 0.85 and masks:
            t.mask(t.rng.choice([1, 1, 3, 17]), window=t.rng.choice(windows),
                   return_array=t.rng.random() < 0.3)
        else:
            t.fetch()


mx.random.seed(1234)

# KVCache: growth in steps of 256 (crossing 256 and 512), trims, masks.
for seed, dtype in [(1, "f16"), (2, "bf16"), (3, "f32")]:
    t = Trace(f"kv{seed}", random.Random(seed), 1, 2, dtype)
    t.new(C.KVCache(), "kv")
    t.update(5)
    random_writes(t, 24, [1, 1, 1, 7, 60, 130], windows=(None, 8))
    t.update(250)
    t.update(1)
    t.trim(3)
    t.update(2)

# KVCache -> QuantizedKVCache mid-trace, then quantized writes.
for seed, (gs, bits) in [(4, (32, 4)), (5, (64, 8)), (6, (32, 2))]:
    t = Trace(f"kvq{seed}", random.Random(seed), 1, gs, "f16" if seed != 5 else "bf16")
    t.new(C.KVCache(), "kv")
    random_writes(t, 6, [1, 9, 40], masks=False)
    t.to_quantized(gs, bits)
    t.fetch()
    random_writes(t, 14, [1, 1, 5, 33], windows=(None,))

# QuantizedKVCache from scratch, crossing 256.
for seed, (gs, bits), steps in [(7, (32, 4), 12), (8, (64, 8), 6), (9, (32, 3), 10)]:
    t = Trace(f"q{seed}", random.Random(seed), 1, gs, "f32" if seed == 9 else "f16")
    t.new(C.QuantizedKVCache(group_size=gs, bits=bits), "quantized", group_size=gs, bits=bits)
    t.update(120)
    t.update(130)
    random_writes(t, steps, [1, 1, 2, 9], windows=(None,))

# RotatingKVCache: in-place single-token writes, concatenating multi-token writes, wrapping,
# trims only while trimmable, masks with windows smaller and larger than max_size.
for seed, (max_size, keep) in [(10, (16, 0)), (11, (16, 4)), (12, (40, 4)), (13, (7, 2))]:
    t = Trace(f"rot{seed}", random.Random(seed), 1, 2, "f16")
    t.new(C.RotatingKVCache(max_size=max_size, keep=keep), "rotating", max_size=max_size, keep=keep)
    random_writes(t, 45, [1, 1, 1, 1, 2, 5, 9, 23], windows=(None, 4, max_size, max_size + 8))

# ChunkedKVCache with its front trimming.
for seed in (14, 15):
    t = Trace(f"chunk{seed}", random.Random(seed), 1, 2, "f16")
    t.new(C.ChunkedKVCache(chunk_size=32), "chunked", chunk_size=32)
    for _ in range(20):
        r = t.rng.random()
        if r < 0.5:
            t.update(t.rng.choice([1, 3, 20, 50]))
        elif r < 0.65:
            t.cache.maybe_trim_front()
            t.case("maybe_trim_front", [], [], offset=t.cache.offset,
                   start_position=t.cache.start_position)
        elif r < 0.8:
            t.trim(t.rng.randint(1, 10))
        else:
            t.fetch()

# ConcatenateKVCache.
# (No trims: mlx-lm's ConcatenateKVCache.trim keeps the data, which mlx-cache fixes.)
t = Trace("concat16", random.Random(16), 1, 2, "f32")
t.new(C.ConcatenateKVCache(), "concat")
random_writes(t, 12, [1, 4, 9], trims=False, windows=(None,))

g.save()

# A prompt-cache file written by mlx-lm: one layer of each kind with state.
kv = C.KVCache()
kv.update_and_fetch(mx.random.normal((1, 2, 5, 4)), mx.random.normal((1, 2, 5, 4)))
rot = C.RotatingKVCache(max_size=8, keep=2)
for _ in range(11):
    rot.update_and_fetch(mx.random.normal((1, 2, 1, 4)).astype(mx.float16),
                         mx.random.normal((1, 2, 1, 4)).astype(mx.float16))
q = C.QuantizedKVCache(group_size=32, bits=4)
q.update_and_fetch(mx.random.normal((1, 2, 3, 32)), mx.random.normal((1, 2, 3, 32)))
arr = C.ArraysCache(size=2)
arr[0] = mx.random.normal((1, 3, 8))
arr[1] = mx.random.normal((1, 2, 4, 4))
empty = C.KVCache()
chunk = C.ChunkedKVCache(chunk_size=4)
chunk.update_and_fetch(mx.random.normal((1, 1, 6, 4)), mx.random.normal((1, 1, 6, 4)))
chunk.maybe_trim_front()
lst = C.CacheList(C.KVCache(), C.RotatingKVCache(max_size=4))
lst.caches[0].update_and_fetch(mx.random.normal((1, 1, 2, 4)), mx.random.normal((1, 1, 2, 4)))
lst.caches[1].update_and_fetch(mx.random.normal((1, 1, 2, 4)), mx.random.normal((1, 1, 2, 4)))
C.save_prompt_cache(
    "mlx-cache/tests/goldens/prompt_cache_mlx_lm.safetensors",
    [kv, rot, q, arr, empty, chunk, lst],
    metadata={"model": "tiny", "note": "written by mlx-lm 0.32.2"},
)
print("wrote mlx-cache/tests/goldens/prompt_cache_mlx_lm.safetensors")
