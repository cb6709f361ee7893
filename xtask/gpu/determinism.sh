#!/bin/bash
# Device call 2 (instead of run.sh): is each side deterministic on the GPU? three runs of each side on one config, every pair compared.
source .gpu/b/env.sh
python3 xtask/oracle/bench_models.py /tmp/bench-models llama-135m-bf16 2>&1 | tail -1
M=/tmp/bench-models/llama-135m-bf16
for i in 1 2 3; do
  .gpu/b/bench_generate --model $M --dtype keep --prompt-len 512 --gen-len 64 --device gpu --digests > /tmp/o$i.json
  python3 xtask/oracle/bench_mlx_lm.py --model $M --dtype keep --prompt-len 512 --gen-len 64 --device gpu --digests > /tmp/m$i.json
done
python3 - <<'PY'
import json, itertools
runs = {f"{s}{i}": json.load(open(f"/tmp/{s}{i}.json"))["logprob_digests"] for s in "om" for i in (1, 2, 3)}
for a, b in itertools.combinations(runs, 2):
    da, db = runs[a], runs[b]
    first = next((i for i in range(len(da)) if da[i] != db[i]), None)
    print(f"{a} vs {b}: first differing step {first}")
PY
