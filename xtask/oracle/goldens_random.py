"""Goldens for mx.random: keys, splits, every sampler from fixed keys, and the global PRNG.

Writes mlx-core/tests/goldens/random.safetensors. Run with `cargo xtask goldens random`.

Case layouts (read by mlx-core/tests/goldens_random.rs):
- key: no inputs; params seed
- split: [key]; params num
- uniform: [key, low?, high?]; params low/high (float, int or "array"), shape, dtype
- normal: [key]; params shape, dtype, loc/scale (float or none)
- bernoulli: [key, p?]; params p (float or "array"), shape (list or none)
- categorical: [key, logits]; params axis, num_samples (int or none), shape (list or none)
- randint: [key]; params low, high, shape, dtype
- gumbel: [key]; params shape, dtype
- truncated_normal: [key]; params lower, upper, shape (list or none), dtype
- global_sequence: [logits]; outputs: the draws of the script below, in order, then the state.
"""

import mlx.core as mx

from golden import Golden

g = Golden("mlx-core/tests/goldens/random.safetensors", __file__)

DT = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}

# ---- keys ----
for seed in [0, 1, 42, 2**32 + 5, 2**63 + 11]:
    g.case(f"key_{seed}", "key", [], mx.random.key(seed), seed=seed)
k = mx.random.key(1234)
for num in [2, 3, 7]:
    g.case(f"split_{num}", "split", [k], mx.random.split(k, num), num=num)

keys = iter(mx.random.split(mx.random.key(99), 64))


def nk():
    return next(keys)


# ---- uniform ----
for tag, dt in DT.items():
    key = nk()
    g.case(f"uniform_{tag}", "uniform", [key], mx.random.uniform(shape=(3, 5), dtype=dt, key=key),
           low=0, high=1, shape=[3, 5], dtype=tag)
    key = nk()
    g.case(f"uniform_range_{tag}", "uniform", [key],
           mx.random.uniform(-2.5, 3.25, (7,), dtype=dt, key=key), low=-2.5, high=3.25, shape=[7], dtype=tag)
key = nk()
lo = mx.array([0.0, 1.0, -1.0])
hi = mx.array([1.0, 10.0, 0.5])
g.case("uniform_arrays", "uniform", [key, lo, hi], mx.random.uniform(lo, hi, (2, 3), key=key),
       low="array", high="array", shape=[2, 3], dtype="f32")
key = nk()
g.case("uniform_scalar_shape", "uniform", [key], mx.random.uniform(key=key), low=0, high=1, shape=[], dtype="f32")
key = nk()
g.case("uniform_int_bounds", "uniform", [key], mx.random.uniform(-3, 4, (6,), key=key), low=-3, high=4, shape=[6], dtype="f32")

# ---- normal ----
for tag, dt in DT.items():
    key = nk()
    g.case(f"normal_{tag}", "normal", [key], mx.random.normal((4, 4), dtype=dt, key=key),
           shape=[4, 4], dtype=tag, loc=None, scale=None)
    key = nk()
    g.case(f"normal_locscale_{tag}", "normal", [key],
           mx.random.normal((9,), dtype=dt, loc=1.5, scale=0.1, key=key), shape=[9], dtype=tag, loc=1.5, scale=0.1)
key = nk()
g.case("normal_scale_only", "normal", [key], mx.random.normal((5,), scale=2.0, key=key),
       shape=[5], dtype="f32", loc=None, scale=2.0)

# ---- bernoulli ----
key = nk()
g.case("bernoulli_p03", "bernoulli", [key], mx.random.bernoulli(0.3, (4, 6), key=key), p=0.3, shape=[4, 6])
key = nk()
g.case("bernoulli_default_shape", "bernoulli", [key], mx.random.bernoulli(0.5, key=key), p=0.5, shape=None)
key = nk()
pa = mx.array([0.1, 0.5, 0.9, 0.99])
g.case("bernoulli_array_p", "bernoulli", [key, pa], mx.random.bernoulli(pa, key=key), p="array", shape=None)
key = nk()
g.case("bernoulli_array_p_shape", "bernoulli", [key, pa], mx.random.bernoulli(pa, (3, 4), key=key),
       p="array", shape=[3, 4])

# ---- categorical ----
logits = mx.random.normal((4, 10), key=nk()) * 2
for tag, dt in DT.items():
    key = nk()
    lg = logits.astype(dt)
    g.case(f"categorical_{tag}", "categorical", [key, lg], mx.random.categorical(lg, key=key),
           axis=-1, num_samples=None, shape=None)
key = nk()
g.case("categorical_axis0", "categorical", [key, logits], mx.random.categorical(logits, axis=0, key=key),
       axis=0, num_samples=None, shape=None)
key = nk()
g.case("categorical_num_samples", "categorical", [key, logits],
       mx.random.categorical(logits, num_samples=5, key=key), axis=-1, num_samples=5, shape=None)
key = nk()
g.case("categorical_shape", "categorical", [key, logits],
       mx.random.categorical(logits, shape=(3, 4), key=key), axis=-1, num_samples=None, shape=[3, 4])
key = nk()
masked = mx.where(mx.arange(10) < 3, logits, -mx.inf)
g.case("categorical_masked", "categorical", [key, masked], mx.random.categorical(masked, key=key),
       axis=-1, num_samples=None, shape=None)

# ---- randint ----
for tag, dt in {"i32": mx.int32, "u8": mx.uint8, "i64": mx.int64, "u32": mx.uint32}.items():
    key = nk()
    g.case(f"randint_{tag}", "randint", [key], mx.random.randint(0, 200, (12,), dtype=dt, key=key),
           low=0, high=200, shape=[12], dtype=tag)
key = nk()
g.case("randint_negative", "randint", [key], mx.random.randint(-50, 7, (3, 3), key=key),
       low=-50, high=7, shape=[3, 3], dtype="i32")

# ---- gumbel ----
for tag, dt in DT.items():
    key = nk()
    g.case(f"gumbel_{tag}", "gumbel", [key], mx.random.gumbel((2, 8), dtype=dt, key=key), shape=[2, 8], dtype=tag)

# ---- truncated_normal ----
for tag, dt in DT.items():
    key = nk()
    g.case(f"truncated_normal_{tag}", "truncated_normal", [key],
           mx.random.truncated_normal(-1.0, 2.0, (10,), dtype=dt, key=key),
           lower=-1.0, upper=2.0, shape=[10], dtype=tag)

# ---- the global PRNG, as mlx-lm's samplers use it ----
# Rust replays the same calls without keys after random::seed and must draw the same values.
lg = mx.random.normal((2, 16), key=nk())
mx.random.seed(2024)
draws = []
draws.append(mx.random.uniform(shape=(3,)))
draws.append(mx.random.categorical(lg))
draws.append(mx.random.categorical(lg))
draws.append(mx.random.normal((2,), dtype=mx.bfloat16))
draws.append(mx.random.uniform(shape=(2,), key=mx.random.key(5)))  # an explicit key: no advance
draws.append(mx.random.categorical(lg, num_samples=3))
draws.append(mx.random.randint(0, 10, (4,)))
draws.append(mx.random.bernoulli(0.5, (5,)))
draws.append(mx.random.gumbel((3,)))
draws.append(mx.random.truncated_normal(-1, 1, (3,)))
draws.append(mx.random.state[0])
mx.random.seed(7)
draws.append(mx.random.categorical(lg))
mx.random.seed(2024)
draws.append(mx.random.uniform(shape=(3,)))
draws.append(mx.random.state[0])
g.case("global_sequence", "global_sequence", [lg], draws)

g.save()
