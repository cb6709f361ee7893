#!/bin/bash
# Session 43 (engineer mmapair), one call of at most 240 s on one H100/H200, from the repository
# root of a bundle built from h30-mmapair (or main once merged): .gpu/a and .gpu/c of
# `cargo xtask gpu pack` with this branch's measure.sh and batched.sh in .gpu/c (graph_test.xz
# and mlx.xz from this tree), run as `bash .gpu/c/s43m.sh` (this file copied into .gpu/c).
# (1) setup of the 8B (skipped where /opt/models holds it; ~130 s on a fresh machine, which
#     leaves the rest too little: then run this again on the warm machine);
# (2) batched_throughput, the 8B, 16 then 5 rows, sides on (main's defaults: the ring, MV_ASYNC,
#     no banks, no pair) and pair (the same with MLX_GRAPH_MMA_PAIR=1), each part's time a step
#     (BREAKDOWN 10 replays): throughput.log, the decoder's `[graph mma pair]` line in it;
# (3) the bit tests with MLX_GRAPH_MMA_PAIR=1 in the environment: batched_equals_single on the
#     4-bit llama3_q4 row (a tile of 4 on the tensor cores: the pair at 4 rows; tiles of 2 on
#     FFMA; ~35 s a tile on an H200) and verify_equals_single_steps (FFMA verify rows: untouched
#     by the switch; must stay ok; it runs second and may be cut by the budget).
T0=$SECONDS
if [ ! -d /opt/models/llama31-8b-q4 ]; then
  PARTS="setup" MODELS="llama31-8b-q4" BUDGET_S=150 TAG=setup bash .gpu/c/measure.sh
  mkdir -p $OUT/a && mv $OUT/*.log $OUT/*.tgz $OUT/a/ 2>/dev/null
fi
# The thru part wants 120 s of its budget; the tests get what is left (at least 60 s).
TB=$((160 - (SECONDS - T0))); [ $TB -lt 120 ] && TB=120
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="16 5" BREAKDOWN=10 THRU_SIDES="on pair" THRU_S=75 \
  BUDGET_S=$TB TAG=thru bash .gpu/c/measure.sh
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
grep -h "graph mma pair" $OUT/b/throughput.log | sort -u | head -3
export MLX_GRAPH_MMA_PAIR=1
PARTS="test" TESTS="batched_equals_single verify_equals_single_steps" \
  MLX_GRAPH_BATCHED_ROWS=llama3_q4 TEST_S=$((232 - (SECONDS - T0))) \
  BUDGET_S=$((235 - (SECONDS - T0))) TAG=test bash .gpu/c/measure.sh
mkdir -p $OUT/c && mv $OUT/*.log $OUT/*.tgz $OUT/c/ 2>/dev/null
grep -h "batched row\|verify group\|test result\|test rc\|graph mma pair" $OUT/c/graph_test.log | sort | uniq -c | head -20
echo s43m-done at $((SECONDS - T0)) s
