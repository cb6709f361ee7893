"""The seed choice restricted to a subset of select_seeds.py's candidates, from its recorded
errors (no re-scoring): per linear, the subset's candidate with the least held-out error.
Tests whether the choice rides on one lucky seed (e.g. seeds 1 and 2 only, without seed 0).

    python select_subset.py SELECT.json OUT_DIR I,J[,K] [min|max|random]
(I, J: candidate indices; the rule: min = the choice, max = the worst held-out error (a
control: with no signal in the held-out error it would score as the choice does), random = a
seeded random pick per linear (numpy seed 0; the control of mixing alone))
"""
import json
import os
import shutil
import sys

from safetensors.numpy import load_file, save_file

sel, out_dir, idx = json.load(open(sys.argv[1])), sys.argv[2], [int(i) for i in sys.argv[3].split(",")]
rule = sys.argv[4] if len(sys.argv) > 4 else "min"
rng = __import__("numpy").random.default_rng(0)
cands = [sel["candidates"][i] for i in idx]
qs = [json.load(open(f"{c}/config.json"))["quantization"] for c in cands]
ts = [load_file(f"{c}/model.safetensors") for c in cands]
tensors = dict(ts[0])
cfg = json.load(open(f"{cands[0]}/config.json"))
picks = [0] * len(idx)
for path, v in sel["layers"].items():
    if rule == "random":
        b = int(rng.integers(len(idx)))
    else:
        pick = max if rule == "max" else min
        b = pick(range(len(idx)), key=lambda k: v["e"][idx[k]])
    picks[b] += 1
    for s in (".weight", ".scales"):
        tensors[path + s] = ts[b][path + s]
    q = qs[b]
    entry = {"group_size": q["group_size"], "bits": q["bits"], "mode": "trellis",
             "trellis_l": q["trellis_l"], "seed": q["seed"]}
    for blk in ("quantization", "quantization_config"):
        cfg[blk][path] = entry
print("candidates", cands, "linears kept", picks)
tmp = out_dir + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
for f in os.listdir(cands[0]):
    if f not in ("model.safetensors", "config.json"):
        shutil.copy(f"{cands[0]}/{f}", tmp)
save_file(tensors, f"{tmp}/model.safetensors", metadata={"format": "mlx"})
json.dump(cfg, open(f"{tmp}/config.json", "w"), indent=4)
os.rename(tmp, out_dir)
