"""Per-block seed choice by the WHOLE MODEL's loss on held-out text, greedy over the blocks (s32).

Each candidate is a whole-model trellis encode of the same float source under a different
`--q-seed` (same LDLQ Hessian; a linear's code depends only on its seed, weight and Hessian).
Going through the decoder blocks in order, block l takes the candidate whose seven linears,
with blocks < l at their chosen candidates and blocks > l at the float source, give the least
mean next-token cross-entropy on the held-out tokens (never the evaluation text). The forward
is np_llama.py's numpy float32 copy of mlx-lm's llama (checked against mlx-lm's logits:
np_llama_check.txt; MLX's CPU matmul was ~18x slower per CPU-second on this loaded machine),
the trellis weights decoded in numpy by s29's decoder (layer_error.py), the tied embedding = the candidates' affine-4 g64 embedding,
dequantized. The output model copies the chosen candidate's words and scales per linear and
records its seed in the linear's own quantization entry (no format change), as select_seeds.py.

    python greedy_select.py SRC_F32_DIR HELDOUT.txt OUT_DIR OUT.json CAND_DIR... \
        [--tokens 4096] [--seq 512] [--rule greedy|random|first] [--later float|first]
rule random: a seeded random candidate per block (numpy seed 0), the control; first: candidate 0
everywhere (checks the assembly). --later first: blocks > l at candidate 0 instead of float.
"""
import argparse
import json
import os
import shutil
import time

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

here = os.path.dirname(os.path.abspath(__file__))
src_le = open(os.path.join(here, "../2026-12-05-s29-trellis/layer_error.py")).read()
exec(src_le[: src_le.index("def main")])  # signs, layer_seed, hadamard, decode, dequant, affine
from np_llama import LIN, Llama  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("src")
ap.add_argument("text")
ap.add_argument("out_dir")
ap.add_argument("out_json")
ap.add_argument("cands", nargs="+")
ap.add_argument("--tokens", type=int, default=4096)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--rule", default="greedy", choices=["greedy", "random", "first"])
ap.add_argument("--later", default="float", choices=["float", "first"])
ap.add_argument("--groups", type=int, default=0, help="decisions: contiguous groups of blocks (0: one a block)")
a = ap.parse_args()
t0 = time.time()

cfg_src = json.load(open(f"{a.src}/config.json"))
model = Llama(cfg_src, load_file(f"{a.src}/model.safetensors"))
nl = model.nl
tok = Tokenizer.from_file(f"{a.src}/tokenizer.json")
ids = tok.encode(open(a.text).read(), add_special_tokens=False).ids
nseq = a.tokens // a.seq
need = nseq * (a.seq + 1)
assert len(ids) >= need, (len(ids), need)
x = np.array(ids[:need], dtype=np.int64).reshape(nseq, a.seq + 1)
inputs, targets = x[:, :-1], x[:, 1:]

qs = [json.load(open(f"{c}/config.json"))["quantization"] for c in a.cands]
ts = [load_file(f"{c}/model.safetensors") for c in a.cands]
model.embed = affine(ts[0], "model.embed_tokens", {"bits": 4, "group_size": 64}).astype(np.float32)
dq_cache = {}


def cand_weights(l, c):
    if (l, c) not in dq_cache:
        dq_cache[(l, c)] = {n: dequant(ts[c][f"model.layers.{l}.{n}.weight"], ts[c][f"model.layers.{l}.{n}.scales"],
                                       f"model.layers.{l}.{n}", qs[c]) for n in LIN}
    return dq_cache[(l, c)]


def set_block(l, ws):
    for n, w in ws.items():
        model.set_linear(l, n, w)


h = model.embed_ids(inputs)


def loss_from(l, h):
    return model.loss_from(l, h, targets)


if a.later == "first" and a.rule == "greedy":
    for l in range(nl):
        set_block(l, cand_weights(l, 0))
res = {"candidates": a.cands, "seeds": [q["seed"] for q in qs], "text": a.text,
       "tokens": nseq * a.seq, "rule": a.rule, "later": a.later, "blocks": []}
base = float(loss_from(0, h)) if a.rule == "greedy" and a.later == "first" else None
res["loss_start"] = base
print(f"start loss {base} ({a.later} blocks), {time.time() - t0:.0f} s", flush=True)
rng = np.random.default_rng(0)
groups = [list(g) for g in np.array_split(np.arange(nl), a.groups if a.groups else nl)]
res["groups"] = [[int(i) for i in g] for g in groups]
best = base
for g in groups:
    l0 = g[0]
    losses = []
    if a.rule == "greedy":
        for c in range(len(a.cands)):
            if c == 0 and a.later == "first":
                losses.append(best)  # the model as it stands: the previous decision's loss
                continue
            for l in g:
                set_block(l, cand_weights(l, c))
            losses.append(float(loss_from(l0, h)))
        b = int(np.argmin(losses))
        best = losses[b]
    elif a.rule == "random":
        b = int(rng.integers(len(a.cands)))
    else:
        b = 0
    for l in g:
        if a.rule == "greedy":  # the controls only assemble
            set_block(l, cand_weights(l, b))
            h = model.block(l, h)
        res["blocks"].append({"losses": losses, "pick": b})
        for c in range(len(a.cands)):
            dq_cache.pop((l, c), None)
    print(f"blocks {g[0]}-{g[-1]}: " + " ".join(f"{v:.5f}" for v in losses) + f" -> {b} ({qs[b]['seed']}), "
          f"{time.time() - t0:.0f} s", flush=True)
res["loss_end"] = float(loss_from(nl, h)) if a.rule == "greedy" else None
res["picks"] = np.bincount([b["pick"] for b in res["blocks"]], minlength=len(a.cands)).tolist()
res["wall_s"] = round(time.time() - t0)
print("end loss", res["loss_end"], "picks", res["picks"], flush=True)

tensors = dict(ts[0])
cfg = json.load(open(f"{a.cands[0]}/config.json"))
for l, blk in enumerate(res["blocks"]):
    b = blk["pick"]
    q = qs[b]
    for n in LIN:
        path = f"model.layers.{l}.{n}"
        tensors[path + ".weight"] = ts[b][path + ".weight"]
        tensors[path + ".scales"] = ts[b][path + ".scales"]
        if q["seed"] == qs[0]["seed"]:
            continue
        entry = {"group_size": q["group_size"], "bits": q["bits"], "mode": "trellis",
                 "trellis_l": q["trellis_l"], "seed": q["seed"]}
        if "trellis_code" in q:
            entry["trellis_code"] = q["trellis_code"]
        for k in ("quantization", "quantization_config"):
            cfg[k][path] = entry
tmp = a.out_dir + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
for f in os.listdir(a.cands[0]):
    if f not in ("model.safetensors", "config.json"):
        shutil.copy(f"{a.cands[0]}/{f}", tmp)
save_file(tensors, f"{tmp}/model.safetensors", metadata={"format": "mlx"})
json.dump(cfg, open(f"{tmp}/config.json", "w"), indent=4)
os.rename(tmp, a.out_dir)
json.dump(res, open(a.out_json, "w"), indent=1)
