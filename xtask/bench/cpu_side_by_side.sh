#!/usr/bin/env bash
# Side by side on this 2-core machine: llama.cpp's llama-bench, `mlx generate` (default: the
# CPU decoder), `mlx generate --decoder mlx` (exact), same GGUF, 2 threads, prompt ~512 tokens,
# 128 generated. Alternating rounds.
set -u
G=${GGUF:?the SmolLM2-135M-Instruct Q4_1 GGUF (mlx fetches it on first use)}
MLX=${MLX:-target/release/mlx}
LB=${LLAMA_BENCH:-llama-bench}
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
for r in 1 2; do
  echo "== round $r  load $(cut -d' ' -f1-3 /proc/loadavg)"
  LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 512 -n 128 -r 3 2>/dev/null | grep -E "pp512|tg128"
  echo "-- ours (default)  load $(cut -d' ' -f1-3 /proc/loadavg)"
  $MLX generate --model $G --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --verbose true 2>&1 | grep -iE "prompt:|generation:|decoder|peak" | head -5
  echo "-- ours exact (--decoder mlx)  load $(cut -d' ' -f1-3 /proc/loadavg)"
  $MLX generate --model $G --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --decoder mlx 2>&1 | grep -iE "prompt:|generation:|peak" | head -4
done
