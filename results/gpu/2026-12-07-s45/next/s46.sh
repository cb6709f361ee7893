#!/bin/bash
# The pair item's remaining device checks (issue #30 serve, session 45's call 3), two calls on
# one H100/H200 with .gpu/c from main 516b9d74 or later (prepare_product_c.sh) and this file
# copied into .gpu/c:
#   run(carry=[".gpu/a", ".gpu/c"], command="S46=a bash .gpu/c/s46.sh", timeout_s=590)
#   run(carry=[".gpu/a", ".gpu/c"], command="S46=b bash .gpu/c/s46.sh", timeout_s=400)  (warm)
# a: (1) the bit tests under MLX_GRAPH_MMA_PAIR=1 on the test's small rows (no 8B needed):
#        wide_tiles_equal_narrow_tiles (wide 16/8-row tiles with the pair against the narrow
#        4-row tiles, every logit bit-equal: the FMA contraction the emulator cannot see),
#        then batched_equals_single on llama3_q4 (<= 260 s);
#    (2) the 8B setup, then batched_throughput at 5 and 16 rows, the defaults (on) against the
#        pair, in one call (the verify tile's A/B that session 45 could not fit).
# b: `mlx serve` (8B 4-bit, 1 and 16 streaming clients, 128 tokens), graph then graphpair.
# If (1) passes and (2)/(b) keep session 45's gains, the pair can become the default of the
# wide tiles (mma_pair() in graph_decode.rs) with its switch kept for A/B.
T0=$SECONDS
case ${S46:-a} in
  a)
    mkdir -p $OUT/t $OUT/s $OUT/b
    OUT=$OUT/t PARTS=test TEST_ENV="MLX_GRAPH_MMA_PAIR=1" \
      TESTS="wide_tiles_equal_narrow_tiles batched_equals_single" MLX_GRAPH_BATCHED_ROWS=llama3_q4 \
      TEST_S=255 BUDGET_S=260 bash .gpu/c/measure.sh > $OUT/s46a.txt 2>&1
    grep -h "test result\|test rc\|panicked\|bit-equal\|equal" $OUT/t/graph_test.log | sort | uniq -c | head -20 | tee -a $OUT/s46a.txt
    echo "== tests done at $((SECONDS - T0)) s" | tee -a $OUT/s46a.txt
    if [ ! -d /opt/models/llama31-8b-q4 ]; then
      OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 BUDGET_S=150 bash .gpu/c/measure.sh >> $OUT/s46a.txt 2>&1
    fi
    L=$((580 - (SECONDS - T0)))
    OUT=$OUT/b PARTS=thru THRU_MODELS=llama31-8b-q4 ROWS="5 16" BREAKDOWN=10 THRU_SIDES="on pair" \
      THRU_S=$(((L - 10) / 2)) BUDGET_S=$L timeout $L bash .gpu/c/measure.sh >> $OUT/s46a.txt 2>&1
    grep -h "==\|steps/s" $OUT/b/throughput.log | cut -c1-250 | tee -a $OUT/s46a.txt
    (cd $OUT && tar czf all.tgz t s b && rm -rf t s b) ;;
  b)
    mkdir -p $OUT/sv
    OUT=$OUT/sv PARTS=serve SERVE_SIDES="graph graphpair" SERVE_S=170 BUDGET_S=385 \
      bash .gpu/c/measure.sh > $OUT/s46b.txt 2>&1
    (cd $OUT && tar czf all.tgz sv && rm -rf sv) ;;
esac
echo "== s46 ${S46:-a} done at $((SECONDS - T0)) s"
