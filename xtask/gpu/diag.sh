#!/bin/bash
# Device call 2 (instead of run.sh): where do ours and mlx-lm's log-probabilities part on the GPU? (per-step digests)
source .gpu/b/env.sh
python3 xtask/oracle/bench_models.py /tmp/bench-models llama-135m-bf16 llama-0.5b-bf16 2>&1 | tail -2
cmp() {  # model prompt gen
  .gpu/b/bench_generate --model "$1" --dtype keep --prompt-len $2 --gen-len $3 --device gpu --digests > /tmp/o.json || return
  python3 xtask/oracle/bench_mlx_lm.py --model "$1" --dtype keep --prompt-len $2 --gen-len $3 --device gpu --digests > /tmp/m.json || return
  python3 - "$1 $2/$3" <<'PY'
import json, sys
o = json.load(open("/tmp/o.json")); m = json.load(open("/tmp/m.json"))
do, dm = o["logprob_digests"], m["logprob_digests"]
first = next((i for i in range(len(do)) if do[i] != dm[i]), None)
tok = next((i for i in range(len(do)) if o["tokens"][i] != m["tokens"][i]), None)
print(f"{sys.argv[1]}: first differing logprobs step {first}, first differing token {tok}, of {len(do)}")
PY
}
for m in mlx-models/tests/models/dense_f32 mlx-models/tests/models/dense_bf16_untied mlx-models/tests/models/q4_g64_untied; do cmp $m 16 100; done
cmp /tmp/bench-models/llama-135m-bf16 16 32
cmp /tmp/bench-models/llama-135m-bf16 512 32
cmp /tmp/bench-models/llama-0.5b-bf16 16 32
cmp /tmp/bench-models/llama-0.5b-bf16 512 128
