#!/bin/bash
# Session 39 (engineer verify): the FFMA tiles' constant-slot loop (MLX_GRAPH_MV_NB=1) on the
# 8B, one call of <= 300 s on a warm H100 whose /opt/models holds llama31-8b-q4 (.gpu/c/measure.sh's
# setup, e.g. a call before: PARTS="setup" MODELS="llama31-8b-q4" bash .gpu/c/measure.sh) and
# .gpu/c packed from this branch (graph_test, fixtures).
# (1) batched_throughput, 8B, rows 1, 5 and 8 with the FFMA tiles at every width
#     (MLX_GRAPH_BATCH_MMA=99: the verify rows' kernels), each part's time a step
#     (BREAKDOWN replays): side ffma = main's loop, nb = MLX_GRAPH_MV_NB=1 (1 row: the same
#     kernels, a control). ~2 x 90 s.
# (2) the device's bits under the switch: verify_equals_single_steps (5-row verify groups and
#     9 rows in two tiles against one-row steps, llama3_q4 / qwen3_q4 / gemma3_text) and
#     batched_equals_single on llama3_q4 (FFMA tiles of 2 and 3 rows against single rows).
#     ~100 s. If the budget cuts it, run part (2) alone in a call of its own (TEST_S=240).
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="1 5 8" BREAKDOWN=${BREAKDOWN:-10} THRU_SIDES="ffma nb" \
  THRU_S=100 BUDGET_S=195 TAG=thru bash .gpu/c/measure.sh
mkdir -p $OUT/a && mv $OUT/*.log $OUT/*.tgz $OUT/a/ 2>/dev/null
MLX_GRAPH_BATCHED_ROWS=llama3_q4 PARTS="test" TEST_ENV="MLX_GRAPH_MV_NB=1" \
  TESTS="verify_equals_single_steps batched_equals_single" \
  TEST_S=$((292 - SECONDS)) BUDGET_S=$((295 - SECONDS)) TAG=test bash .gpu/c/measure.sh
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
echo s39-done at $SECONDS
