#!/usr/bin/env bash
# Merged build side by side (session 28). From the repository root of the merged checkout (wt-bench).
set -u
OUT=${OUT:?}
MLX=${MLX:?}
BASE=${BASE:-/work/s26-mlx/mlx}
LB=${LB:-/work/llama-cpp/build-noamx/bin/llama-bench}
export LLAMA_BENCH=${LLAMA_BENCH:-$LB}  # the side-by-side reads LLAMA_BENCH
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
mkdir -p $OUT
t() { echo "$1 $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/times.txt; }
t start
OUT=$OUT MLX=$MLX BASE=$BASE ROUNDS=${ROUNDS:-3} bash results/bench/2026-12-05-s26-cpu-decode/run.sh > $OUT/side-by-side.txt 2>&1
t side-by-side-done
CARGO_TARGET_DIR=/work/tgt-rel cargo xtask bench spec --bin $MLX --rounds 5 --out $OUT/spec-cpu.md > $OUT/spec.log 2>&1
t spec-done
NEW=$MLX BASE=$BASE THREADS=2 bash ${TRELLIS_SPEED:-results/quant/2026-12-05-s27-trellis/speed.sh} 4 > $OUT/trellis-speed.txt 2>&1
t trellis-done
CARGO_TARGET_DIR=/work/tgt-rel cargo xtask bench --device cpu --rounds 2 --threads 2 --ours-bin $MLX --llama-bench $LB ${MODELS_DIR:+--models-dir $MODELS_DIR} --out $OUT/official-cpu.md > $OUT/official.log 2>&1
t official-done
