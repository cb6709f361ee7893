#!/bin/bash
# Gaussian MSE screen of index/table variants (screen.patch's experimental code), L 12,
# 1024x1024 seeded Gaussian, one thread. Usage: screen.sh [L] [variants...]
B=${B:-/work/tgt-trelcpu/release/examples/trellis_mse}
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
export TRELLIS_MSE_ROWS=${ROWS:-1024}
L=${1:-12}; shift
for v in "$@"; do
  case $v in
    1mad*) echo "== $v L$L: $(TRELLIS_MSE_CODE=$v nice -n 5 $B --l $L --threads 1 --bits ${BITS:-2,3,4} | sed 's/.*bits: affine g64 [0-9.]*, //' | tr '\n' ' ')";;
    *) echo "== $v L$L: $(TRELLIS_MSE_EXP=$v nice -n 5 $B --l $L --threads 1 --bits ${BITS:-2,3,4} | sed 's/.*bits: affine g64 [0-9.]*, //' | tr '\n' ' ')";;
  esac
done
