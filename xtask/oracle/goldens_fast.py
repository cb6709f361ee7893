"""Goldens for mx.fast: rms_norm, layer_norm, rope, scaled_dot_product_attention.

Writes mlx-core/tests/goldens/fast.safetensors. Run with `cargo xtask goldens fast`.

Input conventions (read by mlx-core/tests/goldens_fast.rs):
- rms_norm: [x, weight?]              params weight (bool), eps
- layer_norm: [x, weight?, bias?]     params weight, bias (bools), eps
- rope: [x, offset_array?, freqs?]    params dims, traditional, base (float or none), scale,
                                      offset (int, or "array" for an array input), freqs (bool)
- sdpa: [q, k, v, mask?, sinks?]      params scale, mask (none / causal / array), sinks (bool)
"""

import mlx.core as mx

from golden import Golden

g = Golden("mlx-core/tests/goldens/fast.safetensors", __file__)
mx.random.seed(7)

FLOATS = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


def rnd(shape, dt, scale=1.0):
    return (mx.random.normal(shape) * scale).astype(dt)


# ---- rms_norm / layer_norm ----
for tag, dt in FLOATS.items():
    x = rnd((2, 3, 32), dt, 2.0)
    w = rnd((32,), dt) + 1
    b = rnd((32,), dt)
    for eps in [1e-5, 1e-6]:
        e = str(eps).replace("-", "m")
        g.case(f"rms_norm_w_{e}_{tag}", "rms_norm", [x, w], mx.fast.rms_norm(x, w, eps), weight=True, eps=eps)
        g.case(f"rms_norm_now_{e}_{tag}", "rms_norm", [x], mx.fast.rms_norm(x, None, eps), weight=False, eps=eps)
        for hw in [True, False]:
            for hb in [True, False]:
                ins = [x] + ([w] if hw else []) + ([b] if hb else [])
                out = mx.fast.layer_norm(x, w if hw else None, b if hb else None, eps)
                g.case(f"layer_norm_{int(hw)}{int(hb)}_{e}_{tag}", "layer_norm", ins, out, weight=hw, bias=hb, eps=eps)
    # An odd last axis and a single row.
    xo = rnd((5, 7), dt)
    wo = rnd((7,), dt)
    g.case(f"rms_norm_odd_{tag}", "rms_norm", [xo, wo], mx.fast.rms_norm(xo, wo, 1e-5), weight=True, eps=1e-5)
    g.case(f"layer_norm_odd_{tag}", "layer_norm", [xo, wo, wo], mx.fast.layer_norm(xo, wo, wo, 1e-5), weight=True, bias=True, eps=1e-5)

# Mixed dtypes: f32 weight with a half input (the output dtype follows MLX's promotion).
xh = rnd((3, 16), mx.bfloat16)
wf = rnd((16,), mx.float32)
g.case("rms_norm_bf16_x_f32_w", "rms_norm", [xh, wf], mx.fast.rms_norm(xh, wf, 1e-5), weight=True, eps=1e-5)

# ---- rope ----
for tag, dt in FLOATS.items():
    x = rnd((2, 3, 5, 16), dt)
    freqs = mx.abs(mx.random.normal((4,))) + 0.1
    for trad in [False, True]:
        t = "trad" if trad else "std"
        for dims in [16, 8]:
            for off in [0, 7]:
                out = mx.fast.rope(x, dims, traditional=trad, base=10000.0, scale=1.0, offset=off)
                g.case(f"rope_{t}_d{dims}_o{off}_{tag}", "rope", [x], out,
                       dims=dims, traditional=trad, base=10000.0, scale=1.0, offset=off, freqs=False)
        out = mx.fast.rope(x, 16, traditional=trad, base=100000.0, scale=0.5, offset=3)
        g.case(f"rope_{t}_scale_{tag}", "rope", [x], out,
               dims=16, traditional=trad, base=100000.0, scale=0.5, offset=3, freqs=False)
        # Array offsets: a scalar and one per batch element.
        for name, off in [("a0", mx.array(4)), ("avec", mx.array([2, 9]))]:
            out = mx.fast.rope(x, 16, traditional=trad, base=10000.0, scale=1.0, offset=off)
            g.case(f"rope_{t}_{name}_{tag}", "rope", [x, off], out,
                   dims=16, traditional=trad, base=10000.0, scale=1.0, offset="array", freqs=False)
        # Custom frequencies instead of a base (dims 8 -> 4 frequencies).
        out = mx.fast.rope(x, 8, traditional=trad, base=None, scale=1.0, offset=2, freqs=freqs)
        g.case(f"rope_{t}_freqs_{tag}", "rope", [x, freqs], out,
               dims=8, traditional=trad, base=None, scale=1.0, offset=2, freqs=True)
    # Decode step: one token at a large offset (3D input).
    x1 = rnd((4, 1, 16), dt)
    out = mx.fast.rope(x1, 16, traditional=False, base=10000.0, scale=1.0, offset=1000)
    g.case(f"rope_decode_{tag}", "rope", [x1], out,
           dims=16, traditional=False, base=10000.0, scale=1.0, offset=1000, freqs=False)

# ---- scaled_dot_product_attention ----
for tag, dt in FLOATS.items():
    for name, (B, Hq, Hk, Tq, Tk, D) in {
        "mha": (1, 2, 2, 4, 4, 8),
        "gqa": (2, 4, 2, 3, 6, 8),
        "mqa": (1, 4, 1, 1, 7, 16),
        "prefill": (1, 3, 1, 5, 5, 16),
    }.items():
        q = rnd((B, Hq, Tq, D), dt)
        k = rnd((B, Hk, Tk, D), dt)
        v = rnd((B, Hk, Tk, D), dt)
        scale = D ** -0.5
        base = dict(scale=scale)
        g.case(f"sdpa_{name}_nomask_{tag}", "sdpa", [q, k, v],
               mx.fast.scaled_dot_product_attention(q, k, v, scale=scale), mask="none", sinks=False, **base)
        g.case(f"sdpa_{name}_causal_{tag}", "sdpa", [q, k, v],
               mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal"),
               mask="causal", sinks=False, **base)
        bmask = mx.random.uniform(shape=(Tq, Tk)) > 0.3
        bmask[:, -1] = True  # no row fully masked
        g.case(f"sdpa_{name}_bool_{tag}", "sdpa", [q, k, v, bmask],
               mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bmask),
               mask="array", sinks=False, **base)
        amask = (mx.random.normal((B, 1, Tq, Tk)) * 2).astype(dt)
        g.case(f"sdpa_{name}_additive_{tag}", "sdpa", [q, k, v, amask],
               mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=amask),
               mask="array", sinks=False, **base)
        sinks = rnd((Hq,), dt)
        g.case(f"sdpa_{name}_sinks_{tag}", "sdpa", [q, k, v, sinks],
               mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, sinks=sinks),
               mask="none", sinks=True, **base)
        g.case(f"sdpa_{name}_causal_sinks_{tag}", "sdpa", [q, k, v, sinks],
               mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal", sinks=sinks),
               mask="causal", sinks=True, **base)
        g.case(f"sdpa_{name}_bool_sinks_{tag}", "sdpa", [q, k, v, bmask, sinks],
               mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bmask, sinks=sinks),
               mask="array", sinks=True, **base)
    # An f32 additive mask with half inputs.
    if dt != mx.float32:
        q = rnd((1, 2, 3, 8), dt)
        k = rnd((1, 2, 3, 8), dt)
        v = rnd((1, 2, 3, 8), dt)
        m32 = mx.random.normal((3, 3))
        try:
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=m32)
            mx.eval(out)
            g.case(f"sdpa_f32mask_{tag}", "sdpa", [q, k, v, m32], out, mask="array", sinks=False, scale=0.3)
        except ValueError:
            pass  # an f32 additive mask does not promote to a half output; covered by the error test

g.save()
