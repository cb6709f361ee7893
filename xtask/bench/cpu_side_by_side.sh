#!/usr/bin/env bash
# Side by side on this 2-core machine: llama.cpp's llama-bench, `mlx generate` (default: the
# CPU decoder), `mlx generate --decoder mlx` (exact), same GGUF, 2 threads, prompt ~512 tokens,
# 128 generated. Alternating rounds. llama-bench's tg128 decodes from an empty context while
# ours decodes after the prompt, so llama-bench also runs tg128 at depth 512 (`-d 512`: the
# same cache length as ours). ROUNDS (default 2); EXACT=0 skips the slow exact path;
# ALT_ACT=int16 (any MLX_CPU_ACTIVATIONS value) adds a run of ours with those activations.
set -u
G=${GGUF:?the SmolLM2-135M-Instruct Q4_1 GGUF (mlx fetches it on first use)}
MLX=${MLX:-target/release/mlx}
LB=${LLAMA_BENCH:-llama-bench}
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
ours() {
  $MLX generate --model $G --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --verbose true "$@" 2>&1 | grep -iE "prompt:|generation:|decoder|peak" | head -5
}
for r in $(seq 1 ${ROUNDS:-2}); do
  echo "== round $r  load $(cut -d' ' -f1-3 /proc/loadavg)"
  LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 512 -n 128 -r 3 2>/dev/null | grep -E "pp512|tg128"
  echo "-- llama.cpp tg128 at depth 512  load $(cut -d' ' -f1-3 /proc/loadavg)"
  LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 0 -n 128 -d 512 -r 3 2>/dev/null | grep -E "tg128"
  echo "-- ours (default)  load $(cut -d' ' -f1-3 /proc/loadavg)"
  ours
  if [ -n "${ALT_ACT:-}" ]; then
    echo "-- ours (MLX_CPU_ACTIVATIONS=$ALT_ACT)  load $(cut -d' ' -f1-3 /proc/loadavg)"
    MLX_CPU_ACTIVATIONS=$ALT_ACT ours
  fi
  if [ "${EXACT:-1}" != 0 ]; then
    echo "-- ours exact (--decoder mlx)  load $(cut -d' ' -f1-3 /proc/loadavg)"
    $MLX generate --model $G --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template --temp 0 --decoder mlx 2>&1 | grep -iE "prompt:|generation:|peak" | head -4
  fi
done
