"""s35 trelq: a model whose decoder linears come from two encodes of the same f16 source.

    python swap.py BASE DONOR OUT SELECT

BASE, DONOR: `mlx convert` trellis outputs (same source, same seed); OUT: BASE with every linear
that SELECT picks taken from DONOR (its tensors, and a per-path quantization entry that is
DONOR's entry for it). SELECT: comma-separated terms, each `LAYERS:KINDS` where LAYERS is `a-b`
(inclusive) or `*`, KINDS a '+'-joined subset of q,k,v,o,gate,up,down or `*`; e.g.
`0-9:*`, `*:q+k+v+o`, `29:k+q+v`. Tensors are copied bit for bit (mlx load/save)."""
import json
import os
import re
import shutil
import sys

import mlx.core as mx

base, donor, out, select = sys.argv[1:5]
KIND = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
        "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
cb = json.load(open(os.path.join(base, "config.json")))
cd = json.load(open(os.path.join(donor, "config.json")))
n = cb["num_hidden_layers"]
paths = []
for term in select.split(","):
    ls, ks = term.split(":")
    layers = range(n) if ls == "*" else range(int(ls.split("-")[0]), int(ls.split("-")[-1]) + 1)
    kinds = list(KIND) if ks == "*" else ks.split("+")
    paths += [f"model.layers.{i}.{KIND[k]}" for i in layers for k in kinds]
paths = sorted(set(paths))
if os.path.exists(out):
    shutil.rmtree(out)
shutil.copytree(base, out)
qd = cd["quantization"]
dflt = {k: v for k, v in qd.items() if not isinstance(v, (dict, bool))}
for key in ("quantization", "quantization_config"):
    if key in cb:
        for p in paths:
            cb[key][p] = dict(qd.get(p, dflt)) if isinstance(qd.get(p, dflt), dict) else dict(dflt)
json.dump(cb, open(os.path.join(out, "config.json"), "w"), indent=4)
files = [f for f in os.listdir(base) if f.endswith(".safetensors")]
dw = {}
for f in os.listdir(donor):
    if f.endswith(".safetensors"):
        dw.update(mx.load(os.path.join(donor, f)))
moved = 0
for f in files:
    w = mx.load(os.path.join(base, f))
    for k in list(w):
        if any(k.startswith(p + ".") for p in paths):
            w[k] = dw[k]
            moved += 1
    mx.save_safetensors(os.path.join(out, f), w, metadata={"format": "mlx"})
print(f"{out}: {len(paths)} linears ({moved} tensors) from {donor}")
