"""Input second moments H = X^T X / n of every linear of a float32 model's decoder layers
(mlx-lm's own `load` and model), like xtask/quant/trellis_hessians.py, but one x^T x per
distinct input (q/k/v and gate/up share theirs) and a chosen token window:

    python hessians.py F32_DIR TEXT OUT.safetensors [--seq 512] [--skip N] [--max-tokens N]

The text is tokenized whole, tokens [skip, skip + max) cut into rows of `--seq`; one forward a
row. Keys: `<linear path>.hessian`, float32 (in, in)."""
import argparse

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import load

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("text")
p.add_argument("out")
p.add_argument("--seq", type=int, default=512)
p.add_argument("--skip", type=int, default=0)
p.add_argument("--max-tokens", type=int, default=0)
a = p.parse_args()

model, tok = load(a.model)
ids = tok.encode(open(a.text).read())[a.skip :]
if a.max_tokens:
    ids = ids[: a.max_tokens]
sums, counts, last = {}, {}, {}


class Tap(nn.Module):
    def __init__(self, lin, key, group):
        super().__init__()
        self.lin, self.key, self.group = lin, key, group

    def __call__(self, x):
        x2 = x.reshape(-1, x.shape[-1]).astype(mx.float32)
        prev = last.get(self.group)
        if prev is not None and prev[0] is x:
            h = prev[1]
        else:
            h = x2.T @ x2
            last[self.group] = (x, h)
        sums[self.key] = sums[self.key] + h if self.key in sums else h
        counts[self.key] = counts.get(self.key, 0) + x2.shape[0]
        return self.lin(x)


for i, layer in enumerate(model.model.layers):
    for parent_name, parent in (("self_attn", layer.self_attn), ("mlp", layer.mlp)):
        for attr, mod in list(parent.children().items()):
            if isinstance(mod, nn.Linear):
                setattr(parent, attr, Tap(mod, f"model.layers.{i}.{parent_name}.{attr}", (i, parent_name)))

for s in range(0, len(ids), a.seq):
    last.clear()
    model(mx.array(ids[s : s + a.seq])[None])
    mx.eval(sums)
res = {k + ".hessian": v / counts[k] for k, v in sums.items()}
mx.save_safetensors(a.out, res)
print(f"{len(ids)} tokens, {len(res)} Hessians -> {a.out}")
