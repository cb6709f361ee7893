#!/usr/bin/env bash
# Merged build side by side (session 25). From the repository root of the merged checkout.
set -u
OUT=${OUT:?}
MLX=${MLX:?}
LB=/work/llama-cpp/build/bin/llama-bench
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
mkdir -p $OUT
echo "start $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" > $OUT/times.txt
OUT=$OUT MLX=$MLX BASE=/work/s24-mlx-merged ROUNDS=3 bash results/bench/2026-12-04-s25-smollm2-decode/run.sh > $OUT/smollm2.txt 2>&1
echo "smollm2 done $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.txt
NEW=$MLX BASE=/work/s24-mlx-merged LLAMA_BENCH=$LB ROUNDS=3 bash results/bench/2026-12-04-s24-gemma-decode/run.sh > $OUT/gemma3.txt 2>&1
echo "gemma done $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.txt
CARGO_TARGET_DIR=/work/tgt-fresh cargo xtask bench spec --bin $MLX --rounds 5 --out $OUT/spec-cpu.md > $OUT/spec.log 2>&1
echo "spec done $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.txt
