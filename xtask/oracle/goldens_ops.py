"""Goldens for the general op surface of mlx-core (`mlx_core::ops`).

Every family (elementwise unary/binary, weak scalars, where/clip/round/nan_to_num, closeness,
reductions, scans, shape ops, slicing and indexing, products and convolutions, sorting,
creation, type conversion) in f32, f16 and bf16 where it applies, ints and bools where they
apply. Each case is computed through mlx's Python API the way mlx-lm calls it (Python
numbers, indexing, defaults); the Rust test (`mlx-core/tests/goldens_ops.rs`) replays it
through `mlx_core::ops` and requires every output bit for bit.

Writes mlx-core/tests/goldens/ops.safetensors. Run with `cargo xtask goldens ops`.
"""

import mlx.core as mx

from golden import Golden

g = Golden("mlx-core/tests/goldens/ops.safetensors", __file__)
mx.random.seed(42)

FLOATS = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
DT = {
    **FLOATS,
    "i32": mx.int32,
    "u8": mx.uint8,
    "i8": mx.int8,
    "i16": mx.int16,
    "u32": mx.uint32,
    "i64": mx.int64,
    "bool": mx.bool_,
}
TAG = {v: k for k, v in DT.items()}


def normal(shape, scale=1.0):
    return mx.random.normal(shape) * scale


def uniform(shape, lo, hi):
    return mx.random.uniform(lo, hi, shape)


def ints(shape, lo, hi, dt=mx.int32):
    return mx.random.randint(lo, hi, shape).astype(dt)


def sname(v):
    return str(v).replace(".", "p").replace("-", "m")


# ---------------------------------------------------------------- elementwise, one input
SPECIAL = mx.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -2.5, 1e-6, 65504.0, 1e30, float("inf"), -float("inf"), float("nan")])

UNARY_DOMAIN = {
    "abs": (-3, 3), "negative": (-3, 3), "sign": (-3, 3), "exp": (-4, 4), "expm1": (-1, 1),
    "log": (0.01, 10), "log1p": (-0.9, 5), "log2": (0.01, 10), "log10": (0.01, 10),
    "sqrt": (0, 10), "rsqrt": (0.01, 10), "square": (-3, 3), "reciprocal": (0.1, 4),
    "sin": (-6, 6), "cos": (-6, 6), "tan": (-1.4, 1.4), "tanh": (-4, 4), "sinh": (-3, 3),
    "cosh": (-3, 3), "arcsin": (-1, 1), "arccos": (-1, 1), "arctan": (-5, 5),
    "arcsinh": (-5, 5), "arccosh": (1, 5), "arctanh": (-0.99, 0.99), "degrees": (-4, 4),
    "radians": (-200, 200), "sigmoid": (-8, 8), "erf": (-3, 3), "erfinv": (-0.999, 0.999),
    "floor": (-5, 5), "ceil": (-5, 5), "trunc": (-5, 5), "isnan": (-1, 1), "isinf": (-1, 1),
    "isfinite": (-1, 1), "isposinf": (-1, 1), "isneginf": (-1, 1), "stop_gradient": (-1, 1),
    "copy": (-1, 1),
}
PY_UNARY = {"copy": mx.array}
for op, (lo, hi) in UNARY_DOMAIN.items():
    base = uniform((3, 7), lo, hi)
    f = PY_UNARY.get(op) or getattr(mx, op)
    for tag, dt in FLOATS.items():
        x = base.astype(dt)
        g.case(f"u_{op}_{tag}", op, [x], f(x))
    # IEEE corner cases, once per op.
    g.case(f"u_{op}_special_f32", op, [SPECIAL], f(SPECIAL))

xi = mx.array([-7, -2, -1, 0, 1, 3, 100], dtype=mx.int32)
for op in ["abs", "negative", "sign", "square", "floor", "ceil", "bitwise_invert", "exp", "sqrt", "sin", "isnan"]:
    g.case(f"u_{op}_i32", op, [xi], getattr(mx, op)(xi))
xu = mx.array([0, 1, 7, 200, 255], dtype=mx.uint8)
for op in ["abs", "square", "bitwise_invert", "sign"]:
    g.case(f"u_{op}_u8", op, [xu], getattr(mx, op)(xu))
xb = mx.array([True, False, True, False])
for op in ["logical_not", "bitwise_invert", "abs"]:
    g.case(f"u_{op}_bool", op, [xb], getattr(mx, op)(xb))
g.case("u_logical_not_f32", "logical_not", [SPECIAL], mx.logical_not(SPECIAL))

# ---------------------------------------------------------------- elementwise, two inputs
BINARY = ["add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power",
          "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
          "greater_equal", "arctan2", "logaddexp", "logical_and", "logical_or", "logical_xor"]
for op in BINARY:
    a0 = normal((3, 4), 3)
    b0 = normal((3, 4), 3)
    if op in ("divide", "floor_divide", "remainder"):
        b0 = mx.where(mx.abs(b0) < 0.3, 0.7, b0)
    if op == "power":
        a0 = mx.abs(a0) + 0.1
    # Ties, so that equal/less_equal see equal values.
    a0 = mx.concatenate([a0[:, :3], b0[:, 3:]], axis=1)
    for tag, dt in FLOATS.items():
        a, b = a0.astype(dt), b0.astype(dt)
        f = getattr(mx, op)
        g.case(f"b_{op}_{tag}", op, [a, b], f(a, b))
    # Broadcasting (3,1,4) with (5,4) in bf16, and a 0-d array in f16.
    a = (mx.abs(normal((3, 1, 4))) + 0.5).astype(mx.bfloat16)
    b = (mx.abs(normal((5, 4))) + 0.5).astype(mx.bfloat16)
    g.case(f"b_{op}_bcast_bf16", op, [a, b], getattr(mx, op)(a, b))
    z = mx.array(1.25, dtype=mx.float16)
    b = b.astype(mx.float16)
    g.case(f"b_{op}_0d_f16", op, [z, b], getattr(mx, op)(z, b))

# NaN handling in maximum/minimum, special values in the rest.
sp_b = mx.array([1.0, -0.0, 0.0, float("nan"), float("inf"), -1.0, 2.0, float("nan"), 0.0, -float("inf"), 3.0, 1e-30, 5.0])
for op in ["maximum", "minimum", "add", "divide", "remainder", "floor_divide", "power", "equal", "logaddexp", "arctan2"]:
    g.case(f"b_{op}_special_f32", op, [SPECIAL, sp_b], getattr(mx, op)(SPECIAL, sp_b))

ia = mx.array([[-7, -3, 0, 5], [9, 12, -100, 1]], dtype=mx.int32)
ib = mx.array([[2, -3, 4, -2], [5, 7, 3, 1]], dtype=mx.int32)
for op in ["add", "subtract", "multiply", "divide", "floor_divide", "remainder", "maximum",
           "minimum", "equal", "less", "greater_equal", "bitwise_and", "bitwise_or",
           "bitwise_xor", "logaddexp"]:
    g.case(f"b_{op}_i32", op, [ia, ib], getattr(mx, op)(ia, ib))
ip = mx.array([[2, 3, 0, 1], [1, 2, 3, 4]], dtype=mx.int32)
for op in ["power", "left_shift", "right_shift"]:
    g.case(f"b_{op}_i32", op, [ia, ip], getattr(mx, op)(ia, ip))
ua = mx.array([0, 1, 7, 200, 255, 16], dtype=mx.uint8)
ub = mx.array([1, 3, 2, 1, 4, 7], dtype=mx.uint8)
for op in ["add", "subtract", "multiply", "floor_divide", "remainder", "bitwise_and", "left_shift", "right_shift"]:
    g.case(f"b_{op}_u8", op, [ua, ub], getattr(mx, op)(ua, ub))
ba = mx.array([True, True, False, False])
bb = mx.array([True, False, True, False])
for op in ["logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "equal", "not_equal", "add", "maximum"]:
    g.case(f"b_{op}_bool", op, [ba, bb], getattr(mx, op)(ba, bb))

# Strong mixed dtypes (both operands arrays): promotion.
m16 = normal((4,)).astype(mx.float16)
mbf = normal((4,)).astype(mx.bfloat16)
m32 = normal((4,))
mi8 = mx.array([1, -2, 3, 4], dtype=mx.int8)
mu8 = mx.array([1, 2, 3, 250], dtype=mx.uint8)
for name, x, y in [("f16_bf16", m16, mbf), ("bf16_f32", mbf, m32), ("i8_f16", mi8, m16),
                   ("u8_i8", mu8, mi8), ("bool_bf16", ba, mbf), ("i32_u8", xi[:4], mu8)]:
    for op in ["add", "multiply", "maximum", "less"]:
        g.case(f"promote_{op}_{name}", op, [x, y], getattr(mx, op)(x, y))

# ---------------------------------------------------------------- weak Python scalars
SCALAR_OPS = ["add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power",
              "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
              "greater_equal", "arctan2", "logaddexp"]
for op in SCALAR_OPS:
    f = getattr(mx, op)
    for tag, dt in FLOATS.items():
        a = (mx.abs(normal((2, 5), 2)) + 0.25).astype(dt)
        # 0.1 is not exact in any float dtype: a strong f32 scalar would round differently.
        for s in {"f32": [0.1], "f16": [3], "bf16": [-1.5]}[tag]:
            g.case(f"ws_{op}_{sname(s)}_{tag}", f"{op}_scalar", [a], f(a, s), scalar=s)
            g.case(f"ws_r{op}_{sname(s)}_{tag}", f"scalar_{op}", [a], f(s, a), scalar=s)
    # Ints: an int scalar keeps the int dtype, a float scalar makes float32.
    x = mx.array([[1, -2, 3, 7], [-9, 10, 4, 5]], dtype=mx.int32)
    xp = mx.abs(x) if op == "power" else x
    g.case(f"ws_{op}_3_i32", f"{op}_scalar", [xp], f(xp, 3), scalar=3)
    g.case(f"ws_{op}_0p5_i32", f"{op}_scalar", [x], f(x, 0.5), scalar=0.5)
    g.case(f"ws_r{op}_3_i32", f"scalar_{op}", [x], f(3, x), scalar=3)
# Narrow ints keep their dtype with an int scalar; bools become int32 / float32.
for op in ["add", "multiply", "maximum", "less", "bitwise_and", "left_shift", "right_shift", "bitwise_xor"]:
    f = getattr(mx, op)
    g.case(f"ws_{op}_3_u8", f"{op}_scalar", [ua], f(ua, 3), scalar=3)
    g.case(f"ws_{op}_1_i8", f"{op}_scalar", [mi8], f(mi8, 1), scalar=1)
for op in ["add", "multiply", "equal", "maximum"]:
    f = getattr(mx, op)
    for s in [2, 1.5, True]:
        g.case(f"ws_{op}_{sname(s)}_bool", f"{op}_scalar", [ba], f(ba, s), scalar=s)
# The operators route through the same weak path: a * 0.5 + 1 on bf16.
for tag, dt in FLOATS.items():
    a = normal((6,)).astype(dt)
    g.case(f"ws_expr_{tag}", "expr_mul_add", [a], a * 0.5 + 1)
    g.case(f"ws_rdiv_{tag}", "scalar_divide", [a], 1 / a, scalar=1)
    g.case(f"ws_pow2_{tag}", "power_scalar", [a], a ** 2, scalar=2)
    g.case(f"ws_mod_{tag}", "remainder_scalar", [a], a % 0.3, scalar=0.3)
    g.case(f"ws_floordiv_{tag}", "floor_divide_scalar", [a], a // 0.3, scalar=0.3)

# ---------------------------------------------------------------- where, clip, round, nan_to_num
for tag, dt in FLOATS.items():
    c = mx.random.uniform(shape=(3, 1, 4)) > 0.5
    x = normal((3, 2, 4)).astype(dt)
    y = normal((2, 4)).astype(dt)
    g.case(f"where_{tag}", "where", [c, x, y], mx.where(c, x, y))
    g.case(f"where_scalar_{tag}", "where_scalar", [c, x], mx.where(c, x, -1e9), scalar=-1e9)
    g.case(f"where_scalar_inf_{tag}", "where_scalar", [c, x], mx.where(c, x, float("-inf")), scalar=float("-inf"))
    lo, hi = mx.array(-0.5, dtype=dt), normal((2, 4)).astype(dt)
    g.case(f"clip_arrays_{tag}", "clip", [x, lo, hi], mx.clip(x, lo, hi), min=True, max=True)
    g.case(f"clip_min_{tag}", "clip", [x, lo], mx.clip(x, lo, None), min=True, max=False)
    g.case(f"clip_max_{tag}", "clip", [x, hi], mx.clip(x, None, hi), min=False, max=True)
    g.case(f"clip_scalar_{tag}", "clip_scalar", [x], mx.clip(x, -0.3, 0.7), lo=-0.3, hi=0.7)
    g.case(f"clip_scalar_lo_{tag}", "clip_scalar", [x], mx.clip(x, 0, None), lo=0, hi=None)
    g.case(f"clip_scalar_hi_{tag}", "clip_scalar", [x], mx.clip(x, None, 0.1), lo=None, hi=0.1)
    r = normal((3, 5), 50).astype(dt)
    for d in [0, 1, 2, -1]:
        g.case(f"round_{sname(d)}_{tag}", "round", [r], mx.round(r, d), decimals=d)
    halves = mx.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.25, 0.35, 1.05]).astype(dt)
    g.case(f"round_halves_{tag}", "round", [halves], mx.round(halves), decimals=0)
    g.case(f"round_halves_1_{tag}", "round", [halves], mx.round(halves, 1), decimals=1)
    sp = SPECIAL.astype(dt)
    g.case(f"nan_to_num_default_{tag}", "nan_to_num", [sp], mx.nan_to_num(sp), nan=0.0, posinf=None, neginf=None)
    g.case(f"nan_to_num_custom_{tag}", "nan_to_num", [sp], mx.nan_to_num(sp, nan=-1.0, posinf=100.0, neginf=-7.5), nan=-1.0, posinf=100.0, neginf=-7.5)
xw = mx.array([[1, -2, 3, 7], [-9, 10, 4, 5]], dtype=mx.int32)
cw = xw > 2
g.case("where_i32_f32", "where", [cw, xw, m32[:1]], mx.where(cw, xw, m32[:1]))
g.case("where_scalar_i32_float", "where_scalar", [cw, xw], mx.where(cw, xw, 0.5), scalar=0.5)
g.case("where_scalar_i32_int", "where_scalar", [cw, xw], mx.where(cw, xw, 0), scalar=0)
g.case("clip_scalar_i32_int", "clip_scalar", [xw], mx.clip(xw, -3, 4), lo=-3, hi=4)
g.case("clip_scalar_i32_float", "clip_scalar", [xw], mx.clip(xw, -2.5, 4.5), lo=-2.5, hi=4.5)
g.case("round_i32", "round", [xw], mx.round(xw), decimals=0)

# Closeness and equality.
for tag, dt in FLOATS.items():
    a = normal((3, 4)).astype(dt)
    b = (a + mx.array([0.0, 1e-6, 1e-3, 0.1]).astype(dt)).astype(dt)
    an = mx.where(mx.arange(12).reshape(3, 4) % 5 == 0, float("nan"), a).astype(dt)
    g.case(f"isclose_{tag}", "isclose", [a, b], mx.isclose(a, b), rtol=1e-5, atol=1e-8, equal_nan=False)
    g.case(f"isclose_loose_{tag}", "isclose", [a, b], mx.isclose(a, b, rtol=1e-2, atol=1e-3), rtol=1e-2, atol=1e-3, equal_nan=False)
    g.case(f"isclose_nan_{tag}", "isclose", [an, an], mx.isclose(an, an, equal_nan=True), rtol=1e-5, atol=1e-8, equal_nan=True)
    g.case(f"allclose_{tag}", "allclose", [a, b], mx.allclose(a, b), rtol=1e-5, atol=1e-8, equal_nan=False)
    g.case(f"allclose_loose_{tag}", "allclose", [a, b], mx.allclose(a, b, 0.2, 0.2), rtol=0.2, atol=0.2, equal_nan=False)
    g.case(f"array_equal_same_{tag}", "array_equal", [a, a], mx.array_equal(a, a), equal_nan=False)
    g.case(f"array_equal_diff_{tag}", "array_equal", [a, b], mx.array_equal(a, b), equal_nan=False)
    g.case(f"array_equal_nan_{tag}", "array_equal", [an, an], mx.array_equal(an, an), equal_nan=False)
    g.case(f"array_equal_nan_eq_{tag}", "array_equal", [an, an], mx.array_equal(an, an, equal_nan=True), equal_nan=True)
g.case("array_equal_dtypes", "array_equal", [xw, xw.astype(mx.float32)], mx.array_equal(xw, xw.astype(mx.float32)), equal_nan=False)
g.case("array_equal_shapes", "array_equal", [xw, xw.reshape(4, 2)], mx.array_equal(xw, xw.reshape(4, 2)), equal_nan=False)

# ---------------------------------------------------------------- reductions
REDUCE = ["sum", "mean", "max", "min", "prod", "logsumexp"]
AXES = [([1], False), ([-1], True), ([0, 2], False), ([-3, -1], True), ([], False)]
for op in REDUCE:
    f = getattr(mx, op)
    base = normal((2, 3, 5)) if op != "prod" else uniform((2, 3, 5), 0.5, 1.5)
    for tag, dt in FLOATS.items():
        x = base.astype(dt)
        for axes, kd in (AXES if tag != "f16" else AXES[:2]):
            if True:
                name = "_".join(sname(a) for a in axes) or "none"
                g.case(f"r_{op}_{name}_{'k' if kd else 'n'}_{tag}", op, [x], f(x, axis=axes, keepdims=kd), axes=axes, keepdims=kd)
        g.case(f"r_{op}_all_{tag}", f"{op}_all", [x], f(x), keepdims=False)
        g.case(f"r_{op}_all_k_{tag}", f"{op}_all", [x], f(x, keepdims=True), keepdims=True)
    # Long rows exercise the vectorised accumulation.
    xl = normal((2, 300)).astype(mx.bfloat16) if op != "prod" else uniform((2, 300), 0.9, 1.1).astype(mx.bfloat16)
    g.case(f"r_{op}_long_bf16", op, [xl], f(xl, axis=-1), axes=[-1], keepdims=False)
# Strided (transposed) input.
xt = normal((5, 7)).T
g.case("r_sum_transposed_f32", "sum", [xt], mx.sum(xt, axis=0), axes=[0], keepdims=False)
g.case("r_sum_special_f32", "sum", [SPECIAL[:10]], mx.sum(SPECIAL[:10], axis=0), axes=[0], keepdims=False)
g.case("r_max_special_f32", "max", [SPECIAL], mx.max(SPECIAL, axis=0), axes=[0], keepdims=False)
g.case("r_logsumexp_inf_f32", "logsumexp", [mx.array([[-float("inf")] * 3, [1.0, -float("inf"), 2.0]])],
       mx.logsumexp(mx.array([[-float("inf")] * 3, [1.0, -float("inf"), 2.0]]), axis=1), axes=[1], keepdims=False)
# Integer and bool reductions (dtype rules: sum of int32 -> int32, of uint8 -> uint32, of bool
# -> int32, mean of ints -> float32).
xr = mx.array([[1, -2, 3, 7], [-9, 10, 4, 5], [2, 2, 2, 2]], dtype=mx.int32)
for op in ["sum", "mean", "max", "min", "prod"]:
    g.case(f"r_{op}_i32", op, [xr], getattr(mx, op)(xr, axis=[1]), axes=[1], keepdims=False)
    g.case(f"r_{op}_all_i32", f"{op}_all", [xr], getattr(mx, op)(xr), keepdims=False)
xu8 = mx.array([[200, 100, 7], [255, 255, 1]], dtype=mx.uint8)
for op in ["sum", "prod", "max", "mean"]:
    g.case(f"r_{op}_u8", op, [xu8], getattr(mx, op)(xu8, axis=[0]), axes=[0], keepdims=False)
xbb = mx.array([[True, False, True], [True, True, True]])
for op in ["sum", "all", "any", "max", "mean"]:
    g.case(f"r_{op}_bool", op, [xbb], getattr(mx, op)(xbb, axis=[1]), axes=[1], keepdims=False)
    g.case(f"r_{op}_all_bool", f"{op}_all", [xbb], getattr(mx, op)(xbb), keepdims=False)
for tag, dt in FLOATS.items():
    x = (normal((3, 4)) > 0.3).astype(dt)
    for op in ["all", "any"]:
        g.case(f"r_{op}_{tag}", op, [x], getattr(mx, op)(x, axis=[0], keepdims=True), axes=[0], keepdims=True)
        g.case(f"r_{op}_all_{tag}", f"{op}_all", [x], getattr(mx, op)(x), keepdims=False)

# Arg-reductions (ties pick the first).
for tag, dt in FLOATS.items():
    x = mx.round(normal((3, 6), 2)).astype(dt)
    for op in ["argmax", "argmin"]:
        f = getattr(mx, op)
        for axis in [0, 1, -1]:
            for kd in [False, True]:
                g.case(f"{op}_{sname(axis)}_{'k' if kd else 'n'}_{tag}", op, [x], f(x, axis=axis, keepdims=kd), axis=axis, keepdims=kd)
        g.case(f"{op}_all_{tag}", f"{op}_all", [x], f(x), keepdims=False)
        g.case(f"{op}_all_k_{tag}", f"{op}_all", [x], f(x, keepdims=True), keepdims=True)
    xn = mx.array([1.0, float("nan"), 3.0, float("nan")]).astype(dt)
    g.case(f"argmax_nan_{tag}", "argmax", [xn], mx.argmax(xn, axis=0), axis=0, keepdims=False)
g.case("argmax_i32", "argmax", [xr], mx.argmax(xr, axis=1), axis=1, keepdims=False)
g.case("argmin_u8", "argmin", [xu8], mx.argmin(xu8, axis=0), axis=0, keepdims=False)

# var / std.
for tag, dt in FLOATS.items():
    x = normal((3, 4, 5), 2).astype(dt)
    for op in ["var", "std"]:
        f = getattr(mx, op)
        for axes, kd, ddof in [([-1], False, 0), ([0, 2], True, 1), ([1], False, 1)]:
            name = "_".join(sname(a) for a in axes)
            g.case(f"{op}_{name}_{ddof}_{tag}", op, [x], f(x, axis=axes, keepdims=kd, ddof=ddof), axes=axes, keepdims=kd, ddof=ddof)
        g.case(f"{op}_all_{tag}", f"{op}_all", [x], f(x), keepdims=False, ddof=0)
        g.case(f"{op}_all_k1_{tag}", f"{op}_all", [x], f(x, keepdims=True, ddof=1), keepdims=True, ddof=1)
g.case("var_i32", "var", [xr], mx.var(xr, axis=[1]), axes=[1], keepdims=False, ddof=0)

# softmax.
for tag, dt in FLOATS.items():
    x = normal((2, 3, 7), 3).astype(dt)
    for axes in ([[-1], [1], [0, 2]] if tag != "f16" else [[-1]]):
        for precise in [False, True]:
            name = "_".join(sname(a) for a in axes)
            g.case(f"softmax_{name}_{'p' if precise else 'n'}_{tag}", "softmax", [x], mx.softmax(x, axis=axes, precise=precise), axes=axes, precise=precise)
    g.case(f"softmax_all_{tag}", "softmax_all", [x], mx.softmax(x), precise=False)
    g.case(f"softmax_all_p_{tag}", "softmax_all", [x], mx.softmax(x, precise=True), precise=True)
    xl = normal((2, 257), 4).astype(dt)
    g.case(f"softmax_long_{tag}", "softmax", [xl], mx.softmax(xl, axis=-1), axes=[-1], precise=False)
    xm = mx.array([[0.0, -float("inf"), 1.0, -float("inf")], [3.0, 3.0, 3.0, 3.0]]).astype(dt)
    g.case(f"softmax_masked_{tag}", "softmax", [xm], mx.softmax(xm, axis=-1), axes=[-1], precise=False)

# Scans.
SCANS = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]
for op in SCANS:
    f = getattr(mx, op)
    base = normal((3, 6)) if op != "cumprod" else uniform((3, 6), 0.5, 1.5)
    for tag, dt in FLOATS.items():
        x = base.astype(dt)
        variants = [(1, False, True), (0, False, True), (-1, True, True), (1, False, False), (-1, True, False)]
        for axis, rev, inc in (variants if tag != "f16" else variants[-1:]):
            g.case(f"scan_{op}_{sname(axis)}_{'r' if rev else 'f'}_{'i' if inc else 'x'}_{tag}", op, [x],
                   f(x, axis=axis, reverse=rev, inclusive=inc), axis=axis, reverse=rev, inclusive=inc)
    xl = base.reshape(-1)
    xl = mx.concatenate([xl] * 5).astype(mx.bfloat16)
    g.case(f"scan_{op}_long_bf16", op, [xl], f(xl, axis=0), axis=0, reverse=False, inclusive=True)
for op in ["cumsum", "cumprod", "cummax", "cummin"]:
    g.case(f"scan_{op}_i32", op, [xr], getattr(mx, op)(xr, axis=1), axis=1, reverse=False, inclusive=True)
g.case("scan_cumsum_bool", "cumsum", [xbb], mx.cumsum(xbb, axis=1), axis=1, reverse=False, inclusive=True)
g.case("scan_cumsum_u8", "cumsum", [xu8], mx.cumsum(xu8, axis=1, reverse=True), axis=1, reverse=True, inclusive=True)

# ---------------------------------------------------------------- shape
for tag, dt in [("f32", mx.float32), ("bf16", mx.bfloat16), ("bool", mx.bool_)]:
    x = (normal((2, 3, 4), 3)).astype(dt)
    g.case(f"s_reshape_{tag}", "reshape", [x], x.reshape(4, -1), shape=[4, -1])
    g.case(f"s_flatten_{tag}", "flatten", [x], mx.flatten(x), start=0, end=-1)
    g.case(f"s_flatten_12_{tag}", "flatten", [x], mx.flatten(x, 1, 2), start=1, end=2)
    g.case(f"s_flatten_neg_{tag}", "flatten", [x], mx.flatten(x, -3, -2), start=-3, end=-2)
    g.case(f"s_unflatten_{tag}", "unflatten", [x], mx.unflatten(x, -1, (2, -1)), axis=-1, shape=[2, -1])
    g.case(f"s_transpose_{tag}", "transpose", [x], mx.transpose(x, (2, 0, 1)), axes=[2, 0, 1])
    g.case(f"s_transpose_neg_{tag}", "transpose", [x], mx.transpose(x, (-1, -3, -2)), axes=[-1, -3, -2])
    g.case(f"s_transpose_all_{tag}", "transpose_all", [x], x.T)
    g.case(f"s_t_{tag}", "t", [x], mx.swapaxes(x, -1, -2))
    g.case(f"s_swapaxes_{tag}", "swapaxes", [x], mx.swapaxes(x, 0, -1), axis1=0, axis2=-1)
    g.case(f"s_moveaxis_{tag}", "moveaxis", [x], mx.moveaxis(x, 0, -1), source=0, destination=-1)
    g.case(f"s_moveaxis2_{tag}", "moveaxis", [x], mx.moveaxis(x, -1, 1), source=-1, destination=1)
    g.case(f"s_expand_dims_{tag}", "expand_dims", [x], mx.expand_dims(x, 1), axes=[1])
    g.case(f"s_expand_dims_many_{tag}", "expand_dims", [x], mx.expand_dims(x, (0, -1, 3)), axes=[0, -1, 3])
    y = x.reshape(2, 1, 3, 1, 4)
    g.case(f"s_squeeze_{tag}", "squeeze", [y], mx.squeeze(y, 1), axes=[1])
    g.case(f"s_squeeze_many_{tag}", "squeeze", [y], mx.squeeze(y, (1, -2)), axes=[1, -2])
    g.case(f"s_squeeze_all_{tag}", "squeeze_all", [y], mx.squeeze(y))
    r = x[:, :1, :]
    g.case(f"s_broadcast_to_{tag}", "broadcast_to", [r], mx.broadcast_to(r, (5, 2, 3, 4)), shape=[5, 2, 3, 4])
    z = x[0, 0]
    g.case(f"s_broadcast_arrays_{tag}", "broadcast_arrays", [r, z, x[:1]], list(mx.broadcast_arrays(r, z, x[:1])))
    x2 = normal((2, 3, 2), 3).astype(dt)
    x3 = normal((2, 3, 1), 3).astype(dt)
    g.case(f"s_concatenate_last_{tag}", "concatenate", [x, x2, x3], mx.concatenate([x, x2, x3], axis=-1), axis=-1)
    g.case(f"s_concatenate_0_{tag}", "concatenate", [x, x], mx.concatenate([x, x], axis=0), axis=0)
    g.case(f"s_concatenate_one_{tag}", "concatenate", [x], mx.concatenate([x], axis=1), axis=1)
    g.case(f"s_stack_0_{tag}", "stack", [x, x[::-1]], mx.stack([x, x[::-1]]), axis=0)
    g.case(f"s_stack_last_{tag}", "stack", [x, x, x], mx.stack([x, x, x], axis=-1), axis=-1)
    g.case(f"s_split_equal_{tag}", "split_equal", [x], list(mx.split(x, 2, axis=-1)), n=2, axis=-1)
    g.case(f"s_split_equal_3_{tag}", "split_equal", [x], list(mx.split(x, 3, axis=1)), n=3, axis=1)
    g.case(f"s_split_at_{tag}", "split_at", [x], list(mx.split(x, [1, 3], axis=-1)), indices=[1, 3], axis=-1)
    g.case(f"s_split_at_edges_{tag}", "split_at", [x], list(mx.split(x, [0, 2, 2, 5], axis=1)), indices=[0, 2, 2, 5], axis=1)
    g.case(f"s_repeat_{tag}", "repeat", [x], mx.repeat(x, 2, axis=1), repeats=2, axis=1)
    g.case(f"s_repeat_neg_{tag}", "repeat", [x], mx.repeat(x, 3, axis=-1), repeats=3, axis=-1)
    g.case(f"s_repeat_flat_{tag}", "repeat_flat", [x], mx.repeat(x, 2), repeats=2)
    g.case(f"s_tile_{tag}", "tile", [x], mx.tile(x, (2, 1, 3)), reps=[2, 1, 3])
    g.case(f"s_tile_short_{tag}", "tile", [x], mx.tile(x, 2), reps=[2])
    g.case(f"s_tile_long_{tag}", "tile", [x], mx.tile(x, (2, 1, 1, 2)), reps=[2, 1, 1, 2])
    g.case(f"s_flip_{tag}", "flip", [x], x[::-1, :, ::-1], axes=[0, 2])
    g.case(f"s_roll_{tag}", "roll", [x], mx.roll(x, (1, -2), axis=(0, 2)), shift=[1, -2], axes=[0, 2])

# Padding.
for tag, dt in FLOATS.items():
    x = normal((2, 3, 4)).astype(dt)
    g.case(f"pad_constant_{tag}", "pad", [x, mx.array(0)], mx.pad(x, [(0, 0), (1, 2), (3, 0)]), axes=[0, 1, 2], low=[0, 1, 3], high=[0, 2, 0], mode="constant")
    g.case(f"pad_value_{tag}", "pad", [x, mx.array(0.1)], mx.pad(x, [(1, 1), (0, 0), (2, 2)], constant_values=0.1), axes=[0, 1, 2], low=[1, 0, 2], high=[1, 0, 2], mode="constant")
    g.case(f"pad_edge_{tag}", "pad", [x, mx.array(0)], mx.pad(x, [(0, 0), (2, 1), (1, 3)], mode="edge"), axes=[0, 1, 2], low=[0, 2, 1], high=[0, 1, 3], mode="edge")
    g.case(f"pad_widths_{tag}", "pad_widths", [x, mx.array(-2.5)], mx.pad(x, [(1, 0), (0, 2), (0, 0)], constant_values=-2.5), low=[1, 0, 0], high=[0, 2, 0], mode="constant")
    g.case(f"pad_widths_one_{tag}", "pad_widths", [x, mx.array(0)], mx.pad(x, [(2, 1)], mode="edge"), low=[2], high=[1], mode="edge")
    g.case(f"pad_int_{tag}", "pad_widths", [x, mx.array(3)], mx.pad(x, 1, constant_values=3), low=[1, 1, 1], high=[1, 1, 1], mode="constant")
xpi = mx.array([[1, 2], [3, 4]], dtype=mx.int32)
g.case("pad_i32_float_value", "pad", [xpi, mx.array(2.7)], mx.pad(xpi, [(1, 1), (0, 1)], constant_values=2.7), axes=[0, 1], low=[1, 0], high=[1, 1], mode="constant")
g.case("pad_i32_edge", "pad", [xpi, mx.array(0)], mx.pad(xpi, [(1, 2), (2, 0)], mode="edge"), axes=[0, 1], low=[1, 2], high=[2, 0], mode="edge")

# ---------------------------------------------------------------- slicing


def cpp_slice(shape, slices):
    """Python slice objects -> MLX C++ (start, stop, strides) giving the same result."""
    start, stop, strides = [], [], []
    for n, sl in zip(shape, slices):
        b, e, st = sl.indices(n)
        if st < 0 and e == -1:
            e = -n - 1
        start.append(b)
        stop.append(e)
        strides.append(st)
    return start, stop, strides


S = slice
SLICES = {
    "basic": (S(0, 2), S(1, 3), S(None)),
    "neg": (S(-1, None), S(-3, -1), S(1, -1)),
    "step2": (S(None), S(None, None, 2), S(1, None, 2)),
    "reverse": (S(None, None, -1), S(None), S(None, None, -2)),
    "revpart": (S(1, 0, -1), S(3, 0, -2), S(-1, -4, -1)),
    "clamped": (S(-100, 100), S(2, 100), S(-100, 2)),
    "empty": (S(1, 1), S(None), S(None)),
}
for tag, dt in [("f32", mx.float32), ("bf16", mx.bfloat16), ("i32", mx.int32)]:
    x = normal((2, 4, 5), 3).astype(dt)
    for name, sls in SLICES.items():
        st, sp, sd = cpp_slice(x.shape, sls)
        g.case(f"slice_{name}_{tag}", "slice", [x], x[sls], start=st, stop=sp, strides=sd)
    # Raw MLX rules on negative start/stop.
    g.case(f"slice_raw_{tag}", "slice", [x], x[1:2, 0:3, 1:4], start=[-1, -4, 1], stop=[2, -1, 4], strides=[1, 1, 1])
    g.case(f"slice_axis_{tag}", "slice_axis", [x], x[:, 1:3], axis=1, start=1, stop=3)
    g.case(f"slice_axis_neg_{tag}", "slice_axis", [x], x[..., -3:-1], axis=-1, start=-3, stop=-1)
    g.case(f"slice_axis_clamp_{tag}", "slice_axis", [x], x[:, :, 2:99], axis=2, start=2, stop=99)
    # slice_update through Python's __setitem__ (a copy is updated).
    for name, sls in [("basic", SLICES["basic"]), ("step2", SLICES["step2"]), ("reverse", SLICES["reverse"]), ("neg", SLICES["neg"])]:
        st, sp, sd = cpp_slice(x.shape, sls)
        shape = x[sls].shape
        upd = mx.arange(1, 1 + int(mx.prod(mx.array(shape)).item())).reshape(shape).astype(dt)
        y = mx.array(x)
        y[sls] = upd
        g.case(f"slice_update_{name}_{tag}", "slice_update", [x, upd], y, start=st, stop=sp, strides=sd)
    # A broadcast update.
    y = mx.array(x)
    one = mx.array([7], dtype=dt)
    y[:, 1:3, ::2] = one
    st, sp, sd = cpp_slice(x.shape, (S(None), S(1, 3), S(None, None, 2)))
    g.case(f"slice_update_bcast_{tag}", "slice_update", [x, one], y, start=st, stop=sp, strides=sd)
    # Dynamic slices.
    i1 = mx.array([1])
    g.case(f"slice_dynamic_{tag}", "slice_dynamic", [x, i1], mx.slice(x, i1, [1], [2, 2, 5]), axes=[1], slice_size=[2, 2, 5])
    i2 = mx.array([1, 2])
    g.case(f"slice_dynamic_2_{tag}", "slice_dynamic", [x, i2], mx.slice(x, i2, [0, 2], [1, 4, 3]), axes=[0, 2], slice_size=[1, 4, 3])
    upd = normal((2, 1, 5)).astype(dt)
    i3 = mx.array([2])
    g.case(f"slice_update_dynamic_{tag}", "slice_update_dynamic", [x, upd, i3], mx.slice_update(x, upd, i3, [1]), axes=[1])
    upd2 = normal((1, 2, 2)).astype(dt)
    i4 = mx.array([1, 2, 3])
    g.case(f"slice_update_dynamic_3_{tag}", "slice_update_dynamic", [x, upd2, i4], mx.slice_update(x, upd2, i4, [0, 1, 2]), axes=[0, 1, 2])

# take / take_along_axis / put_along_axis / scatter.
for tag, dt in [("f32", mx.float32), ("bf16", mx.bfloat16), ("i32", mx.int32)]:
    x = normal((3, 4, 5), 3).astype(dt)
    idx = mx.array([2, 0, -1, 2], dtype=mx.int32)
    g.case(f"take_0_{tag}", "take", [x, idx], mx.take(x, idx, axis=0), axis=0)
    g.case(f"take_neg_{tag}", "take", [x, idx], mx.take(x, idx, axis=-1), axis=-1)
    idx2 = mx.array([[1, 3], [0, 0]], dtype=mx.int32)
    g.case(f"take_2d_{tag}", "take", [x, idx2], mx.take(x, idx2, axis=1), axis=1)
    idxu = mx.array([4, 1], dtype=mx.uint32)
    g.case(f"take_u32_{tag}", "take", [x, idxu], mx.take(x, idxu, axis=2), axis=2)
    idxf = mx.array([[0, 59], [17, -1]], dtype=mx.int32)
    g.case(f"take_flat_{tag}", "take_flat", [x, idxf], mx.take(x, idxf))
    g.case(f"take_method_{tag}", "take", [x, idx2], x[:, idx2], axis=1)
    order = mx.argsort(x, axis=-1)
    g.case(f"take_along_axis_{tag}", "take_along_axis", [x, order], mx.take_along_axis(x, order, axis=-1), axis=-1)
    ia1 = mx.array([[[0], [3], [1], [2]]] * 3, dtype=mx.int32)
    g.case(f"take_along_axis_bcast_{tag}", "take_along_axis", [x, ia1], mx.take_along_axis(x, ia1, axis=2), axis=2)
    ia0 = mx.array([[[2, 1, 0, 0, 1]]], dtype=mx.int32)
    g.case(f"take_along_axis_0_{tag}", "take_along_axis", [x, ia0], mx.take_along_axis(x, ia0, axis=0), axis=0)
    vals = normal((3, 4, 1)).astype(dt)
    ip1 = mx.array([[[4], [0], [2], [1]]] * 3, dtype=mx.int32)
    g.case(f"put_along_axis_{tag}", "put_along_axis", [x, ip1, vals], mx.put_along_axis(x, ip1, vals, axis=-1), axis=-1)
    # scatter / scatter_add along axis 0: Python's x.at[i].add(v) and x[i] = v.
    si = mx.array([2, 0], dtype=mx.int32)
    upd = normal((2, 4, 5)).astype(dt)
    y = mx.array(x)
    y[si] = upd
    g.case(f"scatter_{tag}", "scatter", [x, si, upd.reshape(2, 1, 4, 5)], y, axes=[0])
    sa = mx.array([1, 1, 2], dtype=mx.int32)
    upa = mx.round(normal((3, 4, 5), 4)).astype(dt)
    g.case(f"scatter_add_{tag}", "scatter_add", [x, sa, upa.reshape(3, 1, 4, 5)], x.at[sa].add(upa), axes=[0])
    # Two index arrays: x.at[i, j].add(v) scatters into axes 0 and 1.
    sj = mx.array([3, 3, 0], dtype=mx.int32)
    upb = mx.round(normal((3, 5), 4)).astype(dt)
    g.case(f"scatter_add_2_{tag}", "scatter_add", [x, sa, sj, upb.reshape(3, 1, 1, 5)], x.at[sa, sj].add(upb), axes=[0, 1])

# ---------------------------------------------------------------- products
for tag, dt in FLOATS.items():
    a = normal((5, 7)).astype(dt)
    b = normal((7, 3)).astype(dt)
    g.case(f"matmul_{tag}", "matmul", [a, b], a @ b)
    bm = normal((2, 1, 4, 16)).astype(dt)
    bn = normal((3, 16, 5)).astype(dt)
    g.case(f"matmul_batched_{tag}", "matmul", [bm, bn], bm @ bn)
    v = normal((7,)).astype(dt)
    g.case(f"matmul_vec_mat_{tag}", "matmul", [v, b], v @ b)
    g.case(f"matmul_mat_vec_{tag}", "matmul", [a, v], a @ v)
    at = normal((7, 5)).astype(dt).T
    g.case(f"matmul_transposed_{tag}", "matmul", [at, b], at @ b)
    big_a = normal((9, 70)).astype(dt)
    big_b = normal((70, 6)).astype(dt)
    g.case(f"matmul_long_k_{tag}", "matmul", [big_a, big_b], big_a @ big_b)
    c = normal((5, 3)).astype(dt)
    g.case(f"addmm_{tag}", "addmm", [c, a, b], mx.addmm(c, a, b), alpha=1.0, beta=1.0)
    g.case(f"addmm_ab_{tag}", "addmm", [c, a, b], mx.addmm(c, a, b, alpha=0.5, beta=-2.0), alpha=0.5, beta=-2.0)
    cr = normal((3,)).astype(dt)
    g.case(f"addmm_bcast_{tag}", "addmm", [cr, a, b], mx.addmm(cr, a, b, 2.0, 0.1), alpha=2.0, beta=0.1)
    u, w = normal((4,)).astype(dt), normal((3,)).astype(dt)
    g.case(f"outer_{tag}", "outer", [u, w], mx.outer(u, w))
    ia_, ib_ = normal((2, 6)).astype(dt), normal((3, 6)).astype(dt)
    g.case(f"inner_{tag}", "inner", [ia_, ib_], mx.inner(ia_, ib_))
    ta, tb = normal((2, 3, 4)).astype(dt), normal((4, 3, 5)).astype(dt)
    g.case(f"tensordot_{tag}", "tensordot", [ta, tb], mx.tensordot(ta, tb, axes=[[1, 2], [1, 0]]), axes_a=[1, 2], axes_b=[1, 0])
    tc = normal((3, 4, 2)).astype(dt)
    g.case(f"tensordot_n_{tag}", "tensordot_n", [ta, tc], mx.tensordot(ta, tc, axes=2), n=2)
    g.case(f"kron_{tag}", "kron", [a[:2, :3], b[:2]], mx.kron(a[:2, :3], b[:2]))
    # Convolutions: input (N, L, C_in), weight (C_out, K, C_in / groups).
    xc = normal((2, 9, 4)).astype(dt)
    wc = normal((6, 3, 4)).astype(dt)
    g.case(f"conv1d_{tag}", "conv1d", [xc, wc], mx.conv1d(xc, wc), stride=1, padding=0, dilation=1, groups=1)
    g.case(f"conv1d_spd_{tag}", "conv1d", [xc, wc], mx.conv1d(xc, wc, stride=2, padding=2, dilation=2), stride=2, padding=2, dilation=2, groups=1)
    wg = normal((6, 3, 2)).astype(dt)
    g.case(f"conv1d_groups_{tag}", "conv1d", [xc, wg], mx.conv1d(xc, wg, padding=1, groups=2), stride=1, padding=1, dilation=1, groups=2)
    wd = normal((4, 4, 1)).astype(dt)
    g.case(f"conv1d_depthwise_{tag}", "conv1d", [xc, wd], mx.conv1d(xc, wd, padding=3, groups=4), stride=1, padding=3, dilation=1, groups=4)
    x2 = normal((1, 6, 5, 3)).astype(dt)
    w2 = normal((4, 3, 2, 3)).astype(dt)
    g.case(f"conv2d_{tag}", "conv2d", [x2, w2], mx.conv2d(x2, w2), stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
    g.case(f"conv2d_spd_{tag}", "conv2d", [x2, w2], mx.conv2d(x2, w2, stride=(2, 1), padding=(1, 2), dilation=(1, 2)), stride=[2, 1], padding=[1, 2], dilation=[1, 2], groups=1)
    # Triangles.
    m = normal((2, 4, 5)).astype(dt)
    for k in [0, 1, -1]:
        g.case(f"tril_{sname(k)}_{tag}", "tril", [m], mx.tril(m, k), k=k)
        g.case(f"triu_{sname(k)}_{tag}", "triu", [m], mx.triu(m, k), k=k)

# ---------------------------------------------------------------- sorting and selection
for tag, dt in [("f32", mx.float32), ("bf16", mx.bfloat16), ("i32", mx.int32), ("u8", mx.uint8)]:
    x = mx.round(normal((3, 8), 4)).astype(dt) if dt != mx.uint8 else ints((3, 8), 0, 9, mx.uint8)
    for axis in [-1, 0]:
        g.case(f"sort_{sname(axis)}_{tag}", "sort", [x], mx.sort(x, axis=axis), axis=axis)
        g.case(f"argsort_{sname(axis)}_{tag}", "argsort", [x], mx.argsort(x, axis=axis), axis=axis)
    for k in [0, 3, -1]:
        g.case(f"partition_{sname(k)}_{tag}", "partition", [x], mx.partition(x, k, axis=-1), kth=k, axis=-1)
        g.case(f"argpartition_{sname(k)}_{tag}", "argpartition", [x], mx.argpartition(x, k, axis=-1), kth=k, axis=-1)
    g.case(f"argpartition_axis0_{tag}", "argpartition", [x], mx.argpartition(x, 1, axis=0), kth=1, axis=0)
    for k in [1, 3, 8]:
        g.case(f"topk_{k}_{tag}", "topk", [x], mx.topk(x, k), k=k, axis=-1)
    g.case(f"topk_axis0_{tag}", "topk", [x], mx.topk(x, 2, axis=0), k=2, axis=0)
xs = mx.array([3.0, float("nan"), -1.0, float("inf"), 0.0, -0.0, -float("inf"), 2.0])
g.case("sort_special_f32", "sort", [xs], mx.sort(xs), axis=-1)
g.case("argsort_special_f32", "argsort", [xs], mx.argsort(xs), axis=-1)
xlong = normal((2, 300)).astype(mx.bfloat16)
g.case("topk_long_bf16", "topk", [xlong], mx.topk(xlong, 40), k=40, axis=-1)
g.case("argpartition_long_bf16", "argpartition", [xlong], mx.argpartition(xlong, -40), kth=-40, axis=-1)
g.case("argsort_long_bf16", "argsort", [xlong], mx.argsort(xlong), axis=-1)

# ---------------------------------------------------------------- creation
for tag in ["f32", "f16", "bf16", "i32", "bool", "u8"]:
    dt = DT[tag]
    g.case(f"zeros_{tag}", "zeros", [], mx.zeros((2, 3), dtype=dt), shape=[2, 3], dtype=tag)
    g.case(f"ones_{tag}", "ones", [], mx.ones((3,), dtype=dt), shape=[3], dtype=tag)
    g.case(f"full_{tag}", "full", [], mx.full((2, 2), 2.7, dtype=dt), shape=[2, 2], scalar=2.7, dtype=tag)
    g.case(f"full_int_{tag}", "full", [], mx.full((2,), 3, dtype=dt), shape=[2], scalar=3, dtype=tag)
    x = normal((2, 3)).astype(dt)
    g.case(f"zeros_like_{tag}", "zeros_like", [x], mx.zeros_like(x))
    g.case(f"ones_like_{tag}", "ones_like", [x], mx.ones_like(x))
    g.case(f"full_like_{tag}", "full_like", [x], mx.full_like(x, 0.3), scalar=0.3, dtype="none")
    g.case(f"full_like_f16_{tag}", "full_like", [x], mx.full_like(x, 2, dtype=mx.float16), scalar=2, dtype="f16")
    g.case(f"eye_{tag}", "eye", [], mx.eye(3, 4, 1, dtype=dt), n=3, m=4, k=1, dtype=tag)
    g.case(f"eye_neg_{tag}", "eye", [], mx.eye(4, 3, -2, dtype=dt), n=4, m=3, k=-2, dtype=tag)
    g.case(f"identity_{tag}", "identity", [], mx.identity(3, dtype=dt), n=3, dtype=tag)
    g.case(f"tri_{tag}", "tri", [], mx.tri(3, 5, 1, dtype=dt), n=3, m=5, k=1, dtype=tag)
g.case("full_default_float", "full", [], mx.full((2, 2), 2.7), shape=[2, 2], scalar=2.7, dtype=None)
g.case("full_default_int", "full", [], mx.full((3,), 5), shape=[3], scalar=5, dtype=None)
g.case("full_default_bool", "full", [], mx.full((3,), True), shape=[3], scalar=True, dtype=None)
for tag in ["f16", "i8", "bool"]:
    g.case(f"full_bool_{tag}", "full", [], mx.full((3,), True, dtype=DT[tag]), shape=[3], scalar=True, dtype=tag)
    x = mx.zeros((2,), DT[tag])
    g.case(f"full_like_bool_{tag}", "full_like", [x], mx.full_like(x, True), scalar=True, dtype=None)
    g.case(f"where_scalar_bool_{tag}", "where_scalar", [x > 0, x], mx.where(x > 0, x, True), scalar=True)
g.case("full_array", "full_array", [m32], mx.full((3, 4), m32, dtype=mx.bfloat16), shape=[3, 4], dtype="bf16")
g.case("eye_default", "eye", [], mx.eye(3), n=3, m=3, k=0, dtype="f32")
for tag in ["f32", "f16", "bf16", "i32"]:
    dt = DT[tag]
    g.case(f"arange_{tag}", "arange", [], mx.arange(0.5, 7.0, 0.75, dtype=dt), start=0.5, stop=7.0, step=0.75, dtype=tag)
    g.case(f"arange_neg_{tag}", "arange", [], mx.arange(5, -3, -1.5, dtype=dt), start=5.0, stop=-3.0, step=-1.5, dtype=tag)
    g.case(f"arange_long_{tag}", "arange", [], mx.arange(-10.0, 20.0, 0.1, dtype=dt), start=-10.0, stop=20.0, step=0.1, dtype=tag)
    g.case(f"linspace_{tag}", "linspace", [], mx.linspace(-1, 3, 7, dtype=dt), start=-1.0, stop=3.0, num=7, endpoint=True, dtype=tag)
    g.case(f"linspace_noend_{tag}", "linspace", [], mx.linspace(0.1, 2.3, 9, endpoint=False, dtype=dt), start=0.1, stop=2.3, num=9, endpoint=False, dtype=tag)
g.case("arange_default_int", "arange", [], mx.arange(10), start=0.0, stop=10.0, step=1.0, dtype="i32")
g.case("arange_default_float", "arange", [], mx.arange(0, 1, 0.1), start=0.0, stop=1.0, step=0.1, dtype="f32")
g.case("linspace_default", "linspace", [], mx.linspace(0, 1), start=0.0, stop=1.0, num=50, endpoint=True, dtype="f32")
g.case("linspace_one", "linspace", [], mx.linspace(2, 5, 1), start=2.0, stop=5.0, num=1, endpoint=True, dtype="f32")
mg_a, mg_b = mx.arange(3).astype(mx.float16), mx.arange(4, dtype=mx.float16) * 0.5
g.case("meshgrid_xy", "meshgrid", [mg_a, mg_b], list(mx.meshgrid(mg_a, mg_b)), sparse=False, indexing="xy")
g.case("meshgrid_ij", "meshgrid", [mg_a, mg_b], list(mx.meshgrid(mg_a, mg_b, indexing="ij")), sparse=False, indexing="ij")
g.case("meshgrid_sparse", "meshgrid", [mg_a, mg_b], list(mx.meshgrid(mg_a, mg_b, sparse=True)), sparse=True, indexing="xy")

# ---------------------------------------------------------------- type
for src in ["f32", "f16", "bf16"]:
    x = normal((2, 4), 100).astype(DT[src])
    for dst in ["f32", "f16", "bf16", "i32", "u8", "i16", "bool", "u32", "i64"]:
        if DT[dst].size <= x.dtype.size or (x.shape[-1] * x.dtype.size) % DT[dst].size == 0:
            g.case(f"view_{src}_{dst}", "view", [x], x.view(DT[dst]), dtype=dst)
    g.case(f"astype_bool_{src}", "astype", [SPECIAL.astype(DT[src])], SPECIAL.astype(DT[src]).astype(mx.bool_), dtype="bool")
    g.case(f"astype_u8_special_{src}", "astype", [SPECIAL.astype(DT[src])], SPECIAL.astype(DT[src]).astype(mx.uint8), dtype="u8")
xv = mx.array([1, -1, 1065353216, 0x7FC00000], dtype=mx.int32)
g.case("view_i32_f32", "view", [xv], xv.view(mx.float32), dtype="f32")
g.case("view_i32_bf16", "view", [xv], xv.view(mx.bfloat16), dtype="bf16")
xtt = normal((4, 2)).astype(mx.bfloat16).T
g.case("view_transposed_bf16_i16", "view", [xtt], xtt.view(mx.int16), dtype="i16")
g.case("contiguous_transposed", "contiguous", [xtt], mx.contiguous(xtt), allow_col_major=False)
g.case("contiguous_col_major", "contiguous", [xtt], mx.contiguous(xtt, allow_col_major=True), allow_col_major=True)
xbc = mx.broadcast_to(m32[:3], (2, 3))
g.case("contiguous_broadcast", "contiguous", [xbc], mx.contiguous(xbc), allow_col_major=False)
for dst in ["f32", "f16", "bf16", "i8", "u32", "i64", "bool"]:
    g.case(f"astype_i32_{dst}", "astype", [xv], xv.astype(DT[dst]), dtype=dst)

# ---------------------------------------------------------------- Hadamard transform
# The last axis a power of two, or 12, 20 or 28 times one; the default scale is 1 / sqrt(n).
for tag in ["f32", "f16", "bf16"]:
    for n in [8, 128, 12 * 4, 20, 28 * 2]:
        xh = normal((3, n)).astype(FLOATS[tag])
        g.case(f"hadamard_{n}_{tag}", "hadamard_transform", [xh], mx.hadamard_transform(xh), scale=None)
    xh = normal((2, 2, 64)).astype(FLOATS[tag])
    g.case(f"hadamard_scaled_{tag}", "hadamard_transform", [xh], mx.hadamard_transform(xh, scale=0.125), scale=0.125)
g.save()
