#!/bin/bash
# Session 36's last device call: kvpeak (parked KV: kernel test, engine test, peaks), the 3-bit
# default (hybrid follow row), gpt_oss's per-step differences, trellover's switches A/B on the 8B.
export MLX_GRAPH_MEMORY=1 MLX_GRAPH_GPT_OSS=1
PARTS="setup ktest test bench" MODELS="llama31-8b-q4 llama-135m-q4" WARM="llama31-8b-q4 llama-135m-q4" \
  KTESTS=a_parked_region_comes_back_at_the_same_addresses KTEST_S=60 \
  TESTS="engine_backend_seeded_sampling_first graph_decoder_follows_the_mlx_forward" \
  MLX_GRAPH_FOLLOW_ROWS=trellis3_hybrid_b64,gpt_oss TEST_S=150 \
  BENCH_MODELS="llama31-8b-q4 llama-135m-q4" BENCH_SIDES="graph mlxlm" ROUNDS=1 \
  BUDGET_S=${B1:-335} TAG=d bash .gpu/c/measure.sh
mkdir -p $OUT/d && mv $OUT/*.log $OUT/*.tgz $OUT/d/ 2>/dev/null
export TRELLIS_MODELS=llama31-8b-q4 TRELLIS_TWINS=t3g7 TRELLIS_DECODERS=graph TRELLIS_ROUNDS=1 P=8 N=1
MLX_GRAPH_TRELLIS_PROMPT=1 PARTS=trellis BUDGET_S=${B2:-90} TAG=off bash .gpu/c/measure.sh
env MLX_GRAPH_TRELLIS_THREADS=1024 MLX_GRAPH_TRELLIS_ALIAS=1 MLX_GRAPH_TRELLIS_PIPE=1 MLX_GRAPH_TRELLIS_PROMPT=1 \
  TRELLIS_BASE=0 PARTS=trellis BUDGET_S=${B3:-60} TAG=wide bash .gpu/c/measure.sh
echo s36-done
