"""Goldens for the foundation: arithmetic, weak-scalar promotion, astype, matmul, creation.

Writes mlx-core/tests/goldens/core.safetensors. Run with `cargo xtask goldens core`.
"""

import mlx.core as mx

from golden import Golden

g = Golden("mlx-core/tests/goldens/core.safetensors", __file__)
mx.random.seed(0)

FLOATS = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}

for tag, dt in FLOATS.items():
    a = (mx.random.normal((3, 4)) * 3).astype(dt)
    b = (mx.random.normal((3, 4)) * 3).astype(dt)
    row = mx.random.normal((4,)).astype(dt)
    for op in ["add", "subtract", "multiply", "divide", "maximum", "minimum"]:
        g.case(f"{op}_{tag}", op, [a, b], getattr(mx, op)(a, b))
    g.case(f"add_broadcast_{tag}", "add", [a, row], a + row)
    # Weak Python scalars keep the array's dtype.
    for s in [2.0, 0.1, -1.5, 3]:
        name = str(s).replace(".", "p").replace("-", "m")
        g.case(f"mul_scalar_{name}_{tag}", "multiply_scalar", [a], a * s, scalar=s)
        g.case(f"add_scalar_{name}_{tag}", "add_scalar", [a], a + s, scalar=s)
        g.case(f"rsub_scalar_{name}_{tag}", "rsub_scalar", [a], s - a, scalar=s)
        g.case(f"div_scalar_{name}_{tag}", "div_scalar", [a], a / s, scalar=s)
    for op in ["exp", "log", "sqrt", "rsqrt", "square", "sin", "cos", "tanh", "sigmoid", "erf", "abs", "negative"]:
        x = mx.abs(a) + 0.5 if op in ("log", "sqrt", "rsqrt") else a
        g.case(f"{op}_{tag}", op, [x], getattr(mx, op)(x))
    m = mx.random.normal((5, 7)).astype(dt)
    n = mx.random.normal((7, 3)).astype(dt)
    g.case(f"matmul_{tag}", "matmul", [m, n], m @ n)
    bm = mx.random.normal((2, 1, 4, 8)).astype(dt)
    bn = mx.random.normal((3, 8, 5)).astype(dt)
    g.case(f"matmul_batched_{tag}", "matmul", [bm, bn], bm @ bn)
    p = mx.abs(a) + 0.1
    g.case(f"power_{tag}", "power", [p, b], mx.power(p, b))

# Mixed-dtype promotion between arrays (strong on both sides).
a16 = mx.random.normal((4,)).astype(mx.float16)
abf = mx.random.normal((4,)).astype(mx.bfloat16)
a32 = mx.random.normal((4,))
ai = mx.array([1, -2, 3, 4], dtype=mx.int32)
g.case("promote_f16_bf16", "add", [a16, abf], a16 + abf)
g.case("promote_bf16_f32", "multiply", [abf, a32], abf * a32)
g.case("promote_int_f16", "add", [ai, a16], ai + a16)
g.case("int_times_float_scalar", "multiply_scalar", [ai], ai * 0.5, scalar=0.5)
g.case("int_plus_int_scalar", "add_scalar", [ai], ai + 7, scalar=7)

# astype between every pair of float types and ints.
x = mx.random.normal((16,)) * 1000
for src in ["f32", "f16", "bf16"]:
    xs = x.astype(FLOATS[src])
    for dst, ddt in {**FLOATS, "i32": mx.int32, "u8": mx.uint8, "i8": mx.int8}.items():
        g.case(f"astype_{src}_{dst}", "astype", [xs], xs.astype(ddt), dtype=dst)

# Creation.
g.case("arange_f32", "arange", [], mx.arange(0.5, 7.0, 0.75), start=0.5, stop=7.0, step=0.75, dtype="f32")
g.case("arange_i32", "arange", [], mx.arange(-3, 10, 2), start=-3.0, stop=10.0, step=2.0, dtype="i32")
g.case("full_bf16", "full", [mx.array(0.1)], mx.full((2, 3), 0.1, dtype=mx.bfloat16), shape=[2, 3], dtype="bf16")
g.case("reshape", "reshape", [a32], a32.reshape(2, 2), shape=[2, 2])

g.save()
