#!/bin/bash
# Session 38 steal: MLX_GRAPH_MV_STEAL=1 (the FFMA row groups past the early loads' from a
# counter) against the defaults, one call on a warm H100 (the bundle packed from the merged
# tree: the `mlx` binary and graph_test carry this graph_decode.cu, and .gpu/c/measure.sh has
# the `steal` side). From the repo root, as the s37/s38 calls:
#   bash results/gpu/2026-12-06-s38-steal/s38s.sh          (OUT set by the device tool)
# Budgets (seconds from the start): thru to B1 (default 200), bench to B2 (390), test the rest
# of 575.
# 1. thru: the 8B one-row step and its parts (20 replays a part), defaults (`on`) then the
#    switch (`steal`), then `on` again (the order's drift), in one process tree.
PARTS="setup thru" MODELS="llama31-8b-q4 llama-135m-bf16" THRU_MODELS=llama31-8b-q4 ROWS="1" \
  BREAKDOWN=20 THRU_SIDES="on steal on" BUDGET_S=${B1:-200} TAG=thru bash .gpu/c/measure.sh
mkdir -p $OUT/thru && mv $OUT/*.log $OUT/*.tgz $OUT/thru/ 2>/dev/null
# 2. `mlx benchmark --decoder auto` on both models, switch off then on, each process writing
#    its first step's timeline (MLX_GRAPH_TRACE), summarised per kernel kind (layer 5's blocks:
#    gate_up's end spread is what the switch is for; steal_cost.py predicts its last end).
mkdir -p /tmp/tr
for e in 0 1; do
  MLX_GRAPH_MV_STEAL=$e MLX_GRAPH_TRACE=/tmp/tr/steal$e-%p.txt PARTS=bench \
    BENCH_MODELS="llama31-8b-q4 llama-135m-bf16" BENCH_SIDES=graph ROUNDS=1 \
    BUDGET_S=$(( (${B2:-390} - SECONDS) / (2 - e) )) TAG=bench$e bash .gpu/c/measure.sh
  mkdir -p $OUT/bench$e && mv $OUT/*.log $OUT/*.tgz $OUT/bench$e/ 2>/dev/null
done
# (steal_cost.py reads a static schedule's trace: the switch-off ones.)
for f in /tmp/tr/*.txt; do
  python3 xtask/gpu/trace_summary.py --blocks 5 "$f"
  case $f in */steal0-*) python3 results/gpu/2026-12-06-s38-steal/steal_cost.py "$f" ;; esac
done > $OUT/trace_summary.txt 2>&1
tar czf $OUT/traces.tgz -C /tmp tr
# 3. the bit tests under the switch: batched rows against the one-row step, the follow rows.
export MLX_GRAPH_MV_STEAL=1
PARTS=test TESTS="batched_equals_single graph_decoder_follows_the_mlx_forward" \
  MLX_GRAPH_FOLLOW_ROWS=llama3_q4,qwen3_q4 MLX_GRAPH_BATCHED_ROWS=llama3_q4 \
  TEST_S=240 BUDGET_S=$((575 - SECONDS)) TAG=t bash .gpu/c/measure.sh
mkdir -p $OUT/t && mv $OUT/*.log $OUT/*.tgz $OUT/t/ 2>/dev/null
echo s38s-done
