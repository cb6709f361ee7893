#!/bin/bash
# Session 37 call 1: the multi-row and one-row switches' A/B on the 8B (thru sides: main, the
# tiles' cp.async ring MLX_GRAPH_MMA_ASYNC, the row kernel's deferred pack MLX_GRAPH_MV_ASYNC),
# then the bit tests under both switches.
PARTS="setup thru" MODELS="llama31-8b-q4" THRU_MODELS=llama31-8b-q4 ROWS="1 4 16" BREAKDOWN=20 \
  THRU_SIDES="1 async mv" BUDGET_S=${B1:-470} TAG=thru bash .gpu/c/measure.sh
mkdir -p $OUT/thru && mv $OUT/*.log $OUT/*.tgz $OUT/thru/ 2>/dev/null
export MLX_GRAPH_MMA_ASYNC=1 MLX_GRAPH_MV_ASYNC=1
PARTS=test TESTS="wide_tiles_equal_narrow_tiles batched_equals_single" \
  MLX_GRAPH_WIDE_ROWS=llama3_q4,qwen3_q4 MLX_GRAPH_BATCHED_ROWS=llama3_q4 TEST_S=200 \
  BUDGET_S=$((575 - SECONDS)) TAG=t bash .gpu/c/measure.sh
mkdir -p $OUT/t && mv $OUT/*.log $OUT/*.tgz $OUT/t/ 2>/dev/null
echo s37a-done
