#!/bin/bash
# Session 37 call 3: the new defaults on the device (the trellis kernels' 1,024-thread blocks,
# ALIAS and PIPE: the kernel test and the trellis follow rows, the trellis prompt through the
# decoder by default and the shared Hadamards (trelpeak): the 8B and 135M trellis-3 default
# twins' speed and peak, the 135M's also without the trellis defaults; MV_ASYNC and MMA_ASYNC:
# the product-path 8B bench against mlx-lm with the copy bandwidth).
export MLX_GRAPH_MEMORY=1
PARTS="setup ktest test" MODELS="llama31-8b-q4 llama-135m-q4" \
  KTESTS=trellis_kernels_match_the_cpu_references KTEST_S=100 \
  TESTS=graph_decoder_follows_the_mlx_forward MLX_GRAPH_FOLLOW_ROWS=trellis3_b32,trellis3_gauss7s_b64,trellis3_hybrid_b64,llama3_q4 \
  TEST_S=110 BUDGET_S=330 TAG=v bash .gpu/c/measure.sh
mkdir -p $OUT/v && mv $OUT/*.log $OUT/*.tgz $OUT/v/ 2>/dev/null
export TRELLIS_TWINS=t3hy TRELLIS_DECODERS=graph TRELLIS_ROUNDS=1 P=8 N=1
TRELLIS_MODELS="llama-135m-q4 llama31-8b-q4" PARTS=trellis TRELLIS_BASE=1 BUDGET_S=150 TAG=tr bash .gpu/c/measure.sh
mkdir -p $OUT/tr && mv $OUT/*.log $OUT/*.tgz $OUT/tr/ 2>/dev/null
env MLX_GRAPH_TRELLIS_THREADS=256 MLX_GRAPH_TRELLIS_ALIAS=0 MLX_GRAPH_TRELLIS_PIPE=0 TRELLIS_BASE=0 \
  TRELLIS_MODELS=llama-135m-q4 PARTS=trellis BUDGET_S=125 TAG=tr0 bash .gpu/c/measure.sh
mkdir -p $OUT/tr0 && mv $OUT/*.log $OUT/*.tgz $OUT/tr0/ 2>/dev/null
unset TRELLIS_TWINS TRELLIS_DECODERS TRELLIS_ROUNDS P N MLX_GRAPH_MEMORY
PARTS=bench BENCH_MODELS="llama31-8b-q4" BENCH_SIDES="graph mlxlm" ROUNDS=1 \
  BUDGET_S=$((592 - SECONDS)) TAG=b bash .gpu/c/measure.sh
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
echo s37c-done at $SECONDS
