#!/usr/bin/env python3
"""Issue #30's MoE prefill row (1.07x mlx-lm against >= 1.2x): where a Qwen3-30B-A3B-shaped
layer's prompt time goes on MLX's CUDA backend, and whether a dense expert path would pay.

One MoE block of the shape (hidden 2048, experts' hidden 768, 128 experts, top 8, affine 4-bit
in groups of 64, bfloat16 activations), its tokens routed at random (8 distinct experts a
token, seeded), for each prompt chunk length M:
- `switch`: mlx-lm's `SwitchGLU` as its prompt runs it (`_gather_sort` when 64 or more
  routed rows, `gather_qmm` for up, gate and down with `sorted_indices`, SwiGLU,
  `_scatter_unsort`): what `mlx benchmark`'s prompt runs, ours and mlx-lm's;
- `deq_switch`: the same with the experts' weights dequantized first (`mx.dequantize` of
  all 128 experts' three matrices) and `gather_mm` in place of `gather_qmm`: a dense expert
  path a prompt could take, the dequantization counted;
- `mm_switch`: that `gather_mm` path on weights dequantized beforehand (its floor);
- `deq`: the dequantization alone;
- `router`: the gate's linear, softmax and top-8 (`argpartition`), for scale.
Each figure is the median of REPS timed evaluations (each `mx.eval` then `mx.synchronize`)
after WARM untimed ones, in microseconds. One JSON line a (part, M), then a line a M with the
48-layer sums and `switch / deq_switch`. Usage: moe_prefill_probe.py [M ...] (default 128 512
2048).

Reading it: `deq_switch` below `switch` by 1.2x or more at 512 rows says a dense expert
prompt path (as `MLX_PREFILL_DENSE` does for dense linears) would lift the row; `mm_switch`
near `deq_switch` says the dequantization is cheap beside the products.
"""
import json
import sys

import mlx.core as mx

import prefill_probe  # its timer (this script's folder is on the path when run)

REPS, WARM = 9, 2
HIDDEN, INTER, EXPERTS, TOP_K, LAYERS = 2048, 768, 128, 8, 48
GROUP, BITS = 64, 4


def timed(f):
    return prefill_probe.timed(f, reps=REPS, warm=WARM)


def gather_sort(x, indices):
    # mlx-lm's `_gather_sort`.
    *_, m = indices.shape
    indices = indices.flatten()
    order = mx.argsort(indices)
    inv_order = mx.argsort(order)
    return x.flatten(0, -3)[order // m], indices[order], inv_order


def scatter_unsort(x, inv_order, shape):
    return mx.unflatten(x[inv_order], 0, shape)


def swiglu(up, gate):
    return mx.sigmoid(gate) * gate * up


def quantized(out_dims, in_dims):
    w = mx.random.normal((EXPERTS, out_dims, in_dims)).astype(mx.bfloat16) * (in_dims ** -0.5)
    q, s, b = mx.quantize(w, GROUP, BITS)
    return q, s, b


def main():
    ms = [int(a) for a in sys.argv[1:]] or [128, 512, 2048]
    mx.random.seed(30)
    print(json.dumps({"device": str(mx.default_device()), "mlx": mx.__version__}))
    up, gate, down = quantized(INTER, HIDDEN), quantized(INTER, HIDDEN), quantized(HIDDEN, INTER)
    router = (mx.random.normal((EXPERTS, HIDDEN)) * HIDDEN ** -0.5).astype(mx.bfloat16)
    mx.eval(up, gate, down, router)

    def deq(w):
        return mx.dequantize(*w, group_size=GROUP, bits=BITS)

    dense = [deq(w) for w in (up, gate, down)]
    mx.eval(dense)
    for m in ms:
        x = mx.random.normal((1, m, HIDDEN)).astype(mx.bfloat16)
        # 8 distinct experts a token, as top-k routing gives them.
        scores = mx.random.uniform(shape=(1, m, EXPERTS))
        inds = mx.argpartition(-scores, kth=TOP_K - 1, axis=-1)[..., :TOP_K].astype(mx.uint32)
        mx.eval(x, inds)

        def switch(products):
            xe = mx.expand_dims(x, (-2, -3))
            do_sort = inds.size >= 64
            idx, inv = inds, None
            if do_sort:
                xe, idx, inv = gather_sort(xe, inds)
            y = products(xe, idx, do_sort)
            return scatter_unsort(y, inv, inds.shape) if do_sort else y

        def qmm(xe, idx, s):
            u = mx.gather_qmm(xe, *up, rhs_indices=idx, transpose=True, group_size=GROUP,
                              bits=BITS, sorted_indices=s)
            g = mx.gather_qmm(xe, *gate, rhs_indices=idx, transpose=True, group_size=GROUP,
                              bits=BITS, sorted_indices=s)
            return mx.gather_qmm(swiglu(u, g), *down, rhs_indices=idx, transpose=True,
                                 group_size=GROUP, bits=BITS, sorted_indices=s)

        def mm_with(ws):
            def run(xe, idx, s):
                u = mx.gather_mm(xe, ws[0].swapaxes(-1, -2), rhs_indices=idx, sorted_indices=s)
                g = mx.gather_mm(xe, ws[1].swapaxes(-1, -2), rhs_indices=idx, sorted_indices=s)
                return mx.gather_mm(swiglu(u, g), ws[2].swapaxes(-1, -2), rhs_indices=idx,
                                    sorted_indices=s)
            return run

        def route():
            logits = x @ router.T
            p = mx.softmax(logits.astype(mx.float32), axis=-1)
            return mx.argpartition(-p, kth=TOP_K - 1, axis=-1)[..., :TOP_K]

        parts = {
            "switch": lambda: switch(qmm),
            "deq_switch": lambda: switch(mm_with([deq(w) for w in (up, gate, down)])),
            "mm_switch": lambda: switch(mm_with(dense)),
            "deq": lambda: [deq(w) for w in (up, gate, down)],
            "router": route,
        }
        row = {}
        for name, f in parts.items():
            try:
                row[name] = timed(f)
            except Exception as e:  # an op the backend lacks: say so, go on
                row[name] = None
                print(json.dumps({"part": name, "m": m, "error": str(e)[:300]}))
                continue
            print(json.dumps({"part": name, "m": m, "us": round(row[name], 1)}))
        sums = {k: (round(v * LAYERS / 1e3, 2) if v is not None else None) for k, v in row.items()}
        ratio = (row["switch"] / row["deq_switch"]
                 if row.get("switch") and row.get("deq_switch") else None)
        print(json.dumps({"m": m, "layers_ms": sums,
                          "switch_over_deq_switch": round(ratio, 3) if ratio else None}))


if __name__ == "__main__":
    main()
