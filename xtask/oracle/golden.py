"""Shared writer for golden files: one .safetensors file per set.

Layout (read by `mlx_core::testing::Goldens`):
- arrays `<case>.in<i>` and `<case>.out<i>`;
- metadata `case.<case>` = "op=<op>;inputs=<n>;outputs=<m>;<key>=<value>;..." where values
  are ints, floats (repr, round-trips), bools (true/false), strings, or comma-separated lists
  (a list is written "[a,b,c]");
- metadata `__generator__` naming the script and the oracle versions.
Never edit these files by hand: rerun `cargo xtask goldens <set>`.
"""

import os
import sys

import mlx.core as mx


def _fmt(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if v is None:
        return "none"
    s = str(v)
    assert ";" not in s and "=" not in s, s
    return s


class Golden:
    def __init__(self, path, script):
        self.path = path
        self.arrays = {}
        self.meta = {}
        try:
            import mlx_lm

            lm = mlx_lm.__version__
        except Exception:  # noqa: BLE001
            lm = "absent"
        self.meta["__generator__"] = (
            f"{os.path.relpath(script, os.path.dirname(os.path.dirname(__file__)))}"
            f" mlx={mx.__version__} mlx_lm={lm}"
        )

    def case(self, name, op, inputs, outputs, **params):
        assert "." not in name and ";" not in name, name
        key = f"case.{name}"
        assert key not in self.meta, f"duplicate case {name}"
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        # Snapshot: `x[...] = y` later in a script mutates the array object in place
        # (MLX overwrites its descriptor), which would change what was recorded.
        inputs = [mx.array(a) for a in inputs]
        outputs = [mx.array(a) for a in outputs]
        for i, a in enumerate(inputs):
            self.arrays[f"{name}.in{i}"] = a
        for i, a in enumerate(outputs):
            self.arrays[f"{name}.out{i}"] = a
        fields = [f"op={op}", f"inputs={len(inputs)}", f"outputs={len(outputs)}"]
        fields += [f"{k}={_fmt(v)}" for k, v in sorted(params.items())]
        self.meta[key] = ";".join(fields)

    def save(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        mx.eval(list(self.arrays.values()))
        mx.save_safetensors(self.path, self.arrays, metadata=self.meta)
        n = sum(1 for k in self.meta if k.startswith("case."))
        print(f"wrote {self.path}: {n} cases, {len(self.arrays)} arrays", file=sys.stderr)
