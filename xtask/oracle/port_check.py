"""The oracle half of `cargo xtask port-check DIR`: mlx-lm 0.32.2's intermediate states.

Usage: port_check.py MODEL_DIR OUT.safetensors ID[,ID...]

Loads MODEL_DIR with mlx_lm.utils.load_model, taps every transformer block (its input and
output), its attention module (input = the normed hidden state, output) and its MLP (input,
output), runs one cache-less forward over the ids and writes the taps, named
`layers.<i>.{in, attn_in, attn, mlp_in, mlp, out}` plus `logits`, in execution order
(metadata `order`). The Rust half (`mlx-models/examples/port_check.rs`) records the same names
from the dense decoder and names the first that differs.
"""

import pathlib
import sys

import mlx.core as mx
from mlx_lm.utils import load_model

ATTN_NAMES = ("self_attn", "attn", "attention")
MLP_NAMES = ("mlp", "feed_forward")

taps = {}
order = []


def record(name, a):
    if isinstance(a, mx.array):
        taps[name] = a
        order.append(name)


def tap(module, prefix, io):
    """Swap `module`'s class for a subclass whose __call__ records input and output."""
    base = type(module)
    in_name, out_name = io

    def __call__(self, *args, **kwargs):
        # The hidden state is the first argument, positional or not (gptj passes `inputs=`).
        x = args[0] if args else next(iter(kwargs.values()), None)
        if in_name:
            record(f"{prefix}.{in_name}", x)
        y = base.__call__(self, *args, **kwargs)
        record(f"{prefix}.{out_name}", y)
        return y

    module.__class__ = type(f"Tapped{base.__name__}", (base,), {"__call__": __call__})


def child(layer, names):
    for n in names:
        m = layer.get(n) if isinstance(layer, dict) else getattr(layer, n, None)
        if m is not None:
            # exaone keeps the attention one level down (`attn.attention`).
            inner = getattr(m, "attention", None)
            return inner if callable(inner) else m
    return None


def main():
    model_dir, out, ids = sys.argv[1], sys.argv[2], sys.argv[3]
    ids = [int(x) for x in ids.split(",")]
    model, _ = load_model(pathlib.Path(model_dir))
    for i, layer in enumerate(model.layers):
        attn = child(layer, ATTN_NAMES)
        mlp = child(layer, MLP_NAMES)
        if attn is not None:
            tap(attn, f"layers.{i}", ("attn_in", "attn"))
        if mlp is not None:
            tap(mlp, f"layers.{i}", ("mlp_in", "mlp"))
        tap(layer, f"layers.{i}", ("in", "out"))
    logits = model(mx.array([ids], dtype=mx.int32))
    record("logits", logits)
    mx.eval(list(taps.values()))
    mx.save_safetensors(out, taps, metadata={"order": ",".join(order)})


if __name__ == "__main__":
    main()
