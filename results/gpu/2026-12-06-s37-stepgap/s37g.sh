#!/bin/bash
# Session 37 stepgap: MLX_GRAPH_EARLY_PROLOGUE=1 (the norm weights before the PDL wait) against
# the defaults, one call on a warm H100 (the bundle packed from the merged tree: the `mlx`
# binary and graph_test carry this graph_decode.cu). From the repo root, as the s37-h100 calls:
#   bash results/gpu/2026-12-06-s37-stepgap/s37g.sh          (OUT set by the device tool)
# Budgets (seconds from the start): thru to B1 (default 200), bench to B2 (390), test the rest
# of 575.
# 1. thru: the 8B one-row step and its parts (20 replays a part), defaults (`on`) then the
#    switch (`early`), in one process tree.
PARTS="setup thru" MODELS="llama31-8b-q4 llama-135m-bf16" THRU_MODELS=llama31-8b-q4 ROWS="1" \
  BREAKDOWN=20 THRU_SIDES="on early" BUDGET_S=${B1:-200} TAG=thru bash .gpu/c/measure.sh
mkdir -p $OUT/thru && mv $OUT/*.log $OUT/*.tgz $OUT/thru/ 2>/dev/null
# 2. `mlx benchmark --decoder auto` on both models, switch off then on, each process writing
#    its first step's timeline (MLX_GRAPH_TRACE), summarised per kernel kind.
mkdir -p /tmp/tr
for e in 0 1; do
  MLX_GRAPH_EARLY_PROLOGUE=$e MLX_GRAPH_TRACE=/tmp/tr/early$e-%p.txt PARTS=bench \
    BENCH_MODELS="llama31-8b-q4 llama-135m-bf16" BENCH_SIDES=graph ROUNDS=1 \
    BUDGET_S=$(( (${B2:-390} - SECONDS) / (2 - e) )) TAG=bench$e bash .gpu/c/measure.sh
  mkdir -p $OUT/bench$e && mv $OUT/*.log $OUT/*.tgz $OUT/bench$e/ 2>/dev/null
done
for f in /tmp/tr/*.txt; do python3 xtask/gpu/trace_summary.py --blocks 5 "$f"; done \
  > $OUT/trace_summary.txt 2>&1
tar czf $OUT/traces.tgz -C /tmp tr
# 3. the bit tests under the switch: batched rows against the one-row step, the follow rows.
export MLX_GRAPH_EARLY_PROLOGUE=1
PARTS=test TESTS="batched_equals_single graph_decoder_follows_the_mlx_forward" \
  MLX_GRAPH_FOLLOW_ROWS=llama3_q4,qwen3_q4,dense_bf16_mha MLX_GRAPH_BATCHED_ROWS=llama3_q4 \
  TEST_S=240 BUDGET_S=$((575 - SECONDS)) TAG=t bash .gpu/c/measure.sh
mkdir -p $OUT/t && mv $OUT/*.log $OUT/*.tgz $OUT/t/ 2>/dev/null
echo s37g-done
