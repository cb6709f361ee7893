"""Goldens for autodiff and compile: mx.value_and_grad, mx.vjp, mx.jvp, mx.checkpoint,
mx.custom_function, mx.compile over small functions built from the ops mlx-core has.

Writes mlx-core/tests/goldens/grad.safetensors. Run with `cargo xtask goldens grad`.

Every case names a function (`fn`, defined identically in mlx-core/tests/goldens_grad.rs) and a
transform (`op`):
- value_and_grad: inputs = the function's inputs; outputs = [values..., grads...] with
  `argnums` and `nvalues` (how many outputs the function has);
- vjp: inputs = primals + cotangents (`nprimals`); outputs = [outputs..., vjps...];
- jvp: inputs = primals + tangents (`nprimals`); outputs = [outputs..., jvps...];
- checkpoint / custom_vjp / compile_grad: value_and_grad of the function wrapped that way;
- compile: outputs of mx.compile(fn) (shapeless per `shapeless`);
- value_and_grad_tree: mx.value_and_grad of f(params: dict, *others) w.r.t. the dict;
  inputs = the parameters in sorted name order (`names`), then the others; outputs =
  [values..., grads in the same order].
In the first functions sums are written as products with ones (ones(1, n) @ x @ ones(m, 1));
the later ones (fast ops, quantized matmul, mlx-lm's default_loss) use reductions.
"""

import mlx.core as mx

from golden import Golden

g = Golden("mlx-core/tests/goldens/grad.safetensors", __file__)
mx.random.seed(42)

FLOATS = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


def sum2(x):
    """Sum of a 2-D array as a 0-d array."""
    n, m = x.shape
    l = mx.ones((1, n), dtype=x.dtype)
    r = mx.ones((m, 1), dtype=x.dtype)
    return ((l @ x) @ r).reshape(())


# ---- the functions (each: list of arrays -> list of arrays, the loss first) ----


def sin_mul_sq(a):
    x, y = a
    return [sum2(mx.sin(x) * y + mx.square(x))]


def unary_mix(a):
    (x,) = a
    t = mx.tanh(x) * mx.sigmoid(x) + mx.exp(x * 0.5) - mx.log(mx.abs(x) + 1.0)
    return [sum2(t)]


def sqrt_div(a):
    x, y = a
    t = mx.sqrt(x * x + 1.0) / (mx.rsqrt(y * y + 0.5) + 2.0)
    return [sum2(t)]


def erf_max_min(a):
    x, y = a
    t = mx.erf(x) * mx.maximum(x, y) + mx.minimum(x, y) * mx.cos(-x)
    return [sum2(t)]


def power_fn(a):
    x, y = a
    return [sum2(mx.power(mx.abs(x) + 0.5, y))]


def mlp(a):
    x, w1, b1, w2 = a
    h = mx.tanh(x @ w1 + b1)
    return [sum2(h @ w2)]


def batched_matmul(a):
    x, w = a
    y = mx.sigmoid(x @ w)  # (2, 3, 4) @ (4, 5) -> (2, 3, 5)
    return [sum2(y.reshape(6, 5))]


def softmax_xent(a):
    """Mean softmax cross-entropy of logits z against one-hot targets y, without reductions:
    logsumexp via exp @ ones, the picked logit via (z * y) @ ones."""
    z, y = a
    n, c = z.shape
    ones_c = mx.ones((c, 1), dtype=z.dtype)
    lse = mx.log(mx.exp(z) @ ones_c)
    picked = (z * y) @ ones_c
    ones_n = mx.ones((1, n), dtype=z.dtype)
    return [(ones_n @ (lse - picked)).reshape(()) * (1.0 / n)]


def linear_xent(a):
    """A linear classifier trained with softmax_xent: grads w.r.t. weight and bias."""
    w, b, x, y = a
    return softmax_xent([x @ w + b, y])


def mixed_precision(a):
    """Low-precision weights, float32 loss (as when training bf16 models)."""
    w, x = a
    h = x.astype(mx.float32) @ w.astype(mx.float32)
    return [sum2(mx.tanh(h))]


def with_aux(a):
    (x,) = a
    aux = x * 3.0
    return [sum2(mx.square(x)), aux]


# ---- functions over fast ops, quantized matmul and mlx-lm's loss (reductions allowed) ----


def rms_norm_fn(a):
    x, w, c = a
    return [mx.sum(mx.fast.rms_norm(x, w, 1e-5) * c)]


def rope_fn(a):
    x, c = a
    return [mx.sum(mx.fast.rope(x, 8, traditional=False, base=10000.0, scale=1.0, offset=3) * c)]


def rope_trad_fn(a):
    x, c = a
    return [mx.sum(mx.fast.rope(x, 6, traditional=True, base=500.0, scale=0.5, offset=0) * c)]


def sdpa_fn(a):
    q, k, v, c = a
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.35)
    return [mx.sum(o * c)]


def sdpa_causal_fn(a):
    q, k, v, c = a
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.35, mask="causal")
    return [mx.sum(o * c)]


def qmm_fn(a):
    x, wq, scales, biases, c = a
    y = mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=32, bits=4)
    return [mx.sum(y * c)]


def cross_entropy(logits, targets):
    """mlx.nn.losses.cross_entropy(logits, targets) with class-index targets, on the CPU
    (no fused kernel), reduction "none", written out op for op."""
    logits = logits - mx.stop_gradient(mx.max(logits, axis=-1, keepdims=True))
    score = mx.take_along_axis(logits, mx.expand_dims(targets, -1), -1).squeeze(-1)
    return mx.logsumexp(logits, axis=-1) - score


def lm_loss(a):
    """mlx_lm.tuner.trainer.default_loss, with a linear model: logits = x @ w.T."""
    x, w, targets, lengths = a
    logits = x @ w.T
    steps = mx.arange(1, targets.shape[1] + 1)
    mask = mx.logical_and(steps >= lengths[:, 0:1], steps <= lengths[:, 1:])
    ce = cross_entropy(logits, targets) * mask
    ntoks = mask.sum()
    ce = ce.astype(mx.float32).sum() / ntoks
    return [ce, ntoks]


FUNCS = {
    "sin_mul_sq": sin_mul_sq,
    "unary_mix": unary_mix,
    "sqrt_div": sqrt_div,
    "erf_max_min": erf_max_min,
    "power_fn": power_fn,
    "mlp": mlp,
    "batched_matmul": batched_matmul,
    "softmax_xent": softmax_xent,
    "linear_xent": linear_xent,
    "mixed_precision": mixed_precision,
    "with_aux": with_aux,
    "rms_norm": rms_norm_fn,
    "rope": rope_fn,
    "rope_traditional": rope_trad_fn,
    "sdpa": sdpa_fn,
    "sdpa_causal": sdpa_causal_fn,
    "quantized_matmul": qmm_fn,
    "lm_loss": lm_loss,
}


def normal(shape, dt, scale=1.0):
    return (mx.random.normal(shape) * scale).astype(dt)


def onehot(n, c, dt):
    idx = mx.random.randint(0, c, (n,))
    return (mx.arange(c)[None, :] == idx[:, None]).astype(dt)


def inputs_for(name, dt):
    if name in ("sin_mul_sq", "sqrt_div", "erf_max_min"):
        return [normal((3, 4), dt), normal((3, 4), dt)]
    if name == "unary_mix":
        return [normal((4, 5), dt, 2.0)]
    if name == "power_fn":
        return [normal((3, 4), dt), normal((3, 4), dt)]
    if name == "mlp":
        return [normal((4, 6), dt), normal((6, 8), dt, 0.5), normal((1, 8), dt), normal((8, 3), dt, 0.5)]
    if name == "batched_matmul":
        return [normal((2, 3, 4), dt), normal((4, 5), dt)]
    if name == "softmax_xent":
        return [normal((4, 7), dt, 2.0), onehot(4, 7, dt)]
    if name == "linear_xent":
        return [normal((5, 6), dt, 0.5), normal((1, 6), dt, 0.1), normal((4, 5), dt), onehot(4, 6, dt)]
    if name == "mixed_precision":
        return [normal((5, 3), dt), normal((4, 5), dt)]
    if name == "with_aux":
        return [normal((2, 3), dt)]
    if name == "rms_norm":
        return [normal((2, 3, 16), dt), normal((16,), dt) + 1.0, normal((2, 3, 16), dt)]
    if name in ("rope", "rope_traditional"):
        return [normal((1, 2, 5, 8), dt), normal((1, 2, 5, 8), dt)]
    if name in ("sdpa", "sdpa_causal"):
        # 4 query heads over 2 key/value heads (grouped-query attention).
        return [normal((1, 4, 3, 8), dt), normal((1, 2, 5, 8), dt), normal((1, 2, 5, 8), dt), normal((1, 4, 3, 8), dt)]
    if name == "quantized_matmul":
        wq, scales, biases = mx.quantize(normal((16, 64), dt), group_size=32, bits=4)
        return [normal((3, 64), dt), wq, scales, biases, normal((3, 16), dt)]
    if name == "lm_loss":
        targets = mx.random.randint(0, 11, (2, 5))
        lengths = mx.array([[1, 4], [2, 5]], dtype=mx.int32)
        return [normal((2, 5, 8), dt), normal((11, 8), dt, 0.5), targets, lengths]
    raise KeyError(name)


ARGNUMS = {
    "sin_mul_sq": [0, 1],
    "unary_mix": [0],
    "sqrt_div": [0, 1],
    "erf_max_min": [0, 1],
    "power_fn": [0, 1],
    "mlp": [0, 1, 2, 3],
    "batched_matmul": [0, 1],
    "softmax_xent": [0],
    "linear_xent": [0, 1],
    "mixed_precision": [0],
    "with_aux": [0],
    "rms_norm": [0, 1],
    "rope": [0],
    "rope_traditional": [0],
    "sdpa": [0, 1, 2],
    "sdpa_causal": [0, 1, 2],
    "quantized_matmul": [0],
    "lm_loss": [0, 1],
}


def as_py(fn):
    """The list -> list function as Python code calls it: positional arrays in, the loss
    alone or a tuple (loss, aux...) out."""

    def f(*a):
        out = fn(list(a))
        return out[0] if len(out) == 1 else tuple(out)

    return f


def as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


for name, fn in FUNCS.items():
    for tag, dt in FLOATS.items():
        ins = inputs_for(name, dt)
        value, grads = mx.value_and_grad(as_py(fn), argnums=ARGNUMS[name])(*ins)
        values, grads = as_list(value), as_list(grads)
        g.case(
            f"vg_{name}_{tag}",
            "value_and_grad",
            ins,
            values + grads,
            fn=name,
            argnums=ARGNUMS[name],
            nvalues=len(values),
        )

# value_and_grad over a parameter tree (a dict), as LoRA training differentiates
# model.trainable_parameters(): LoRA adapters on a frozen linear head, mlx-lm's loss.


def lora_loss(p, x, w, targets, lengths):
    z = (x @ p["lora_a"]) @ p["lora_b"]
    logits = x @ w.T + (20.0 * z).astype(x.dtype)
    return tuple(lm_loss_logits(logits, targets, lengths))


def lm_loss_logits(logits, targets, lengths):
    steps = mx.arange(1, targets.shape[1] + 1)
    mask = mx.logical_and(steps >= lengths[:, 0:1], steps <= lengths[:, 1:])
    ce = cross_entropy(logits, targets) * mask
    ntoks = mask.sum()
    ce = ce.astype(mx.float32).sum() / ntoks
    return [ce, ntoks]


for tag, dt in FLOATS.items():
    x, w, targets, lengths = inputs_for("lm_loss", dt)
    params = {"lora_a": normal((8, 4), dt, 0.1), "lora_b": normal((4, 11), dt, 0.1)}
    (ce, ntoks), grads = mx.value_and_grad(lora_loss)(params, x, w, targets, lengths)
    names = sorted(params)
    g.case(
        f"tree_lora_{tag}",
        "value_and_grad_tree",
        [params[k] for k in names] + [x, w, targets, lengths],
        [ce, ntoks] + [grads[k] for k in names],
        fn="lora_loss",
        names=names,
        nvalues=2,
    )

# vjp and jvp (not only scalar losses).
for tag, dt in FLOATS.items():

    def two_out(a):
        (x,) = a
        return [mx.exp(x) * mx.sin(x), mx.tanh(x) * 2.0]

    x = normal((3, 4), dt)
    c0, c1 = normal((3, 4), dt), normal((3, 4), dt)
    outs, vjps = mx.vjp(lambda *a: two_out(list(a)), [x], [c0, c1])
    g.case(f"vjp_two_out_{tag}", "vjp", [x, c0, c1], list(outs) + list(vjps), fn="two_out", nprimals=1)
    t = normal((3, 4), dt)
    outs, jvps = mx.jvp(lambda *a: two_out(list(a)), [x], [t])
    g.case(f"jvp_two_out_{tag}", "jvp", [x, t], list(outs) + list(jvps), fn="two_out", nprimals=1)

    ins = inputs_for("mlp", dt)
    cot = [normal((), dt)]
    outs, vjps = mx.vjp(lambda *a: mlp(list(a)), ins, cot)
    g.case(f"vjp_mlp_{tag}", "vjp", ins + cot, list(outs) + list(vjps), fn="mlp", nprimals=4)
    tans = [normal(a.shape, dt) for a in ins]
    outs, jvps = mx.jvp(lambda *a: mlp(list(a)), ins, tans)
    g.case(f"jvp_mlp_{tag}", "jvp", ins + tans, list(outs) + list(jvps), fn="mlp", nprimals=4)

# checkpoint, custom_function (vjp = the true derivative, written by hand), compile.
for tag, dt in FLOATS.items():
    ins = inputs_for("mlp", dt)
    ck = mx.checkpoint(lambda *a: mlp(list(a))[0])
    value, grads = mx.value_and_grad(ck, argnums=[0, 1, 2, 3])(*ins)
    g.case(f"checkpoint_mlp_{tag}", "checkpoint", ins, [value] + list(grads), fn="mlp", argnums=[0, 1, 2, 3], nvalues=1)

    @mx.custom_function
    def sin_custom(x):
        return mx.sin(x)

    @sin_custom.vjp
    def sin_custom_vjp(primals, cotangent, output):
        return mx.cos(primals) * cotangent

    x = normal((3, 4), dt)
    value, grad = mx.value_and_grad(lambda x: sum2(sin_custom(x)))(x)
    g.case(f"custom_vjp_sin_{tag}", "custom_vjp", [x], [value, grad], fn="sin_sum", argnums=[0], nvalues=1)

    for name in ("unary_mix", "sin_mul_sq", "softmax_xent"):
        fn = FUNCS[name]
        ins = inputs_for(name, dt)
        compiled = mx.compile(lambda *a, fn=fn: fn(list(a)))
        outs = compiled(*ins)
        g.case(f"compile_{name}_{tag}", "compile", ins, list(outs), fn=name, shapeless=False)
        compiled_s = mx.compile(lambda *a, fn=fn: fn(list(a)), shapeless=True)
        outs = compiled_s(*ins)
        g.case(f"compile_shapeless_{name}_{tag}", "compile", ins, list(outs), fn=name, shapeless=True)
        value, grads = mx.value_and_grad(lambda *a, c=compiled: c(*a)[0], argnums=ARGNUMS[name])(*ins)
        grads = as_list(grads)
        g.case(
            f"compile_grad_{name}_{tag}",
            "compile_grad",
            ins,
            [value] + grads,
            fn=name,
            argnums=ARGNUMS[name],
            nvalues=1,
        )

g.save()
