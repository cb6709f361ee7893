"""Writes the input second moments H = X^T X / n of every linear of a float32 model's decoder
layers, from the model's forward (mlx-lm's own `load` and model) over calibration text, for
`mlx convert -q --q-mode trellis --q-hessians FILE` (LDLQ rounding):

    python trellis_hessians.py F32_DIR CALIB.txt[,MORE.txt...] OUT.safetensors [--seq 512]
        [--max-tokens N]

Each text is tokenized whole and cut into rows of `--seq` tokens (the last partial row too);
each row is one forward through the decoder layers (the head is not run). `--max-tokens` caps
the tokens of all texts together, in order. Linears that read the same input (q/k/v, gate/up)
share one X^T X. Keys: `<linear path>.hessian`, float32 (in, in).

How many tokens: LDLQ trusts H's small directions, so too few tokens over-fit the calibration
text (results/quant/2026-12-05-s29-trellis/: SmolLM2-135M's 1536-wide down_proj from 3.5k
tokens); use tens of thousands of tokens of text disjoint from what you evaluate on. For that
many, use trellis_hessians_np.py (same arguments, llama family): MLX's CPU matmul runs at
~3 GFLOP/s here (results/quant/2026-12-05-s30-trellis/)."""
import argparse

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import load

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("text")
p.add_argument("out")
p.add_argument("--seq", type=int, default=512)
p.add_argument("--max-tokens", type=int, default=0)
a = p.parse_args()

model, tok = load(a.model)
rows, left = [], a.max_tokens or None
for path in a.text.split(","):
    ids = tok.encode(open(path).read())
    if left is not None:
        ids, left = ids[:left], left - len(ids[:left])
    rows += [ids[s : s + a.seq] for s in range(0, len(ids), a.seq)]
sums, counts, shared = {}, {}, {}


class Tap(nn.Module):
    def __init__(self, lin, key, group):
        super().__init__()
        self.lin, self.key, self.group = lin, key, group

    def __call__(self, x):
        x2 = x.reshape(-1, x.shape[-1]).astype(mx.float32)
        prev = shared.get(self.group)
        if prev is not None and prev[0] is x:
            h = prev[1]
        else:
            h = x2.T @ x2
            shared[self.group] = (x, h)
        sums[self.key] = sums[self.key] + h if self.key in sums else h
        counts[self.key] = counts.get(self.key, 0) + x2.shape[0]
        return self.lin(x)


for i, layer in enumerate(model.model.layers):
    for parent_name, parent in (("self_attn", layer.self_attn), ("mlp", layer.mlp)):
        for attr, mod in list(parent.children().items()):
            if isinstance(mod, nn.Linear):
                key = f"model.layers.{i}.{parent_name}.{attr}"
                setattr(parent, attr, Tap(mod, key, (i, parent_name)))

for r in rows:
    shared.clear()
    model.model(mx.array(r)[None])
    mx.eval(sums)
res = {k + ".hessian": v / counts[k] for k, v in sums.items()}
mx.save_safetensors(a.out, res)
print(f"{sum(map(len, rows))} tokens in {len(rows)} rows, {len(res)} Hessians -> {a.out}")
