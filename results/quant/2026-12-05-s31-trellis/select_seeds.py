"""Per-layer seed selection by held-out error, assembled from whole-model encodes (s31).

Each candidate model is a trellis encode of the same float source under a different `--q-seed`
(the same LDLQ Hessian). For every decoder linear, each candidate's decoded weight is scored
against the float32 source under the HELD-OUT Hessian (text disjoint from the LDLQ calibration
text and from the eval text): e = tr(dW H dW^T) / tr(W H W^T). The output model takes, per linear,
the words and scales of the candidate with the least e and records that candidate's seed in a
per-module quantization entry (the signs are derived from the entry's seed and the path at load,
so no format change). Everything else (embedding, norms) is copied from the first candidate.

    python select_seeds.py SRC_F32_DIR HELDOUT_HESS OUT_DIR OUT.json CAND_DIR...
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

here = os.path.dirname(os.path.abspath(__file__))
src_le = open(os.path.join(here, "../2026-12-05-s29-trellis/layer_error.py")).read()
exec(src_le[: src_le.index("def main")])  # signs, layer_seed, had_block, hadamard, decode, dequant

src, hfile, out_dir, out_json, cands = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
ws = load_file(f"{src}/model.safetensors")
hs = load_file(hfile)
keys = sorted(k for k in hs if k.endswith(".hessian"))
qs = [json.load(open(f"{c}/config.json"))["quantization"] for c in cands]
ts = [load_file(f"{c}/model.safetensors") for c in cands]
tensors = dict(ts[0])
cfg = json.load(open(f"{cands[0]}/config.json"))
res = {"candidates": cands, "seeds": [q["seed"] for q in qs], "heldout": hfile, "layers": {}}
for key in keys:
    path = key[: -len(".hessian")]
    w = ws[path + ".weight"].astype(np.float64)
    h = hs[key].astype(np.float64)
    whw = ((w @ h) * w).sum()
    errs = []
    for q, t in zip(qs, ts):
        d = dequant(t[path + ".weight"], t[path + ".scales"], path, q) - w
        errs.append(float(((d @ h) * d).sum() / whw))
    b = int(np.argmin(errs))
    res["layers"][path] = {"e": errs, "pick": b}
    tensors[path + ".weight"] = ts[b][path + ".weight"]
    tensors[path + ".scales"] = ts[b][path + ".scales"]
    q = qs[b]
    entry = {"group_size": q["group_size"], "bits": q["bits"], "mode": "trellis",
             "trellis_l": q["trellis_l"], "seed": q["seed"]}
    if "trellis_code" in q:
        entry["trellis_code"] = q["trellis_code"]
    for blk in ("quantization", "quantization_config"):
        cfg[blk][path] = entry
    print(path, " ".join(f"{e:.5f}" for e in errs), "->", q["seed"], flush=True)
e = np.array([v["e"] for v in res["layers"].values()])
res["mean_e"] = e.mean(0).tolist()
res["mean_e_picked"] = float(e.min(1).mean())
res["picks"] = np.bincount(e.argmin(1), minlength=len(cands)).tolist()
print("mean e per candidate", res["mean_e"], "picked", res["mean_e_picked"], "picks", res["picks"])
tmp = out_dir + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
for f in os.listdir(cands[0]):
    if f not in ("model.safetensors", "config.json"):
        shutil.copy(f"{cands[0]}/{f}", tmp)
save_file(tensors, f"{tmp}/model.safetensors", metadata={"format": "mlx"})
json.dump(cfg, open(f"{tmp}/config.json", "w"), indent=4)
os.rename(tmp, out_dir)
json.dump(res, open(out_json, "w"), indent=1)
