#!/bin/bash
# Session 37 call 2 (chained on the warm machine): the follow rows under both switches, then
# trellover's switches A/B on the 8B's trellis-3 default (t3hy: gauss7s, V in 1mad) twin.
export MLX_GRAPH_MMA_ASYNC=1 MLX_GRAPH_MV_ASYNC=1
PARTS="setup test" MODELS="llama31-8b-q4" TESTS="graph_decoder_follows_the_mlx_forward" \
  MLX_GRAPH_FOLLOW_ROWS=llama3_q4,qwen3_q4,dense_bf16_mha,mixtral TEST_S=150 \
  BUDGET_S=170 TAG=f bash .gpu/c/measure.sh
mkdir -p $OUT/f && mv $OUT/*.log $OUT/*.tgz $OUT/f/ 2>/dev/null
unset MLX_GRAPH_MMA_ASYNC MLX_GRAPH_MV_ASYNC
export TRELLIS_MODELS=llama31-8b-q4 TRELLIS_TWINS=t3hy TRELLIS_DECODERS=graph TRELLIS_ROUNDS=1 P=8 N=1
MLX_GRAPH_TRELLIS_PROMPT=1 PARTS=trellis BUDGET_S=$((400 - SECONDS)) TAG=off bash .gpu/c/measure.sh
mkdir -p $OUT/off && mv $OUT/*.log $OUT/*.tgz $OUT/off/ 2>/dev/null
env MLX_GRAPH_TRELLIS_THREADS=1024 MLX_GRAPH_TRELLIS_ALIAS=1 MLX_GRAPH_TRELLIS_PIPE=1 MLX_GRAPH_TRELLIS_PROMPT=1 \
  TRELLIS_BASE=0 PARTS=trellis BUDGET_S=$((575 - SECONDS)) TAG=wide bash .gpu/c/measure.sh
mkdir -p $OUT/wide && mv $OUT/*.log $OUT/*.tgz $OUT/wide/ 2>/dev/null
echo s37b-done
