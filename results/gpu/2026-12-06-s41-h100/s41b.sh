#!/bin/bash
# Session 41, call 1 (cold, <= 580 s): s41a (MV_WIDE's 5-row verify tile against ffma4 at 60 s a
# side, its tests under the switch) plus the Llama-3.1-8B-shaped 4-bit product row (mlx benchmark
# --decoder auto beside mlx_lm benchmark, one round, with the copy bandwidth) on this card.
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $OUT/s41.txt
[ -d /opt/models/llama31-8b-q4 ] || MODELS="llama31-8b-q4" WARM=" " PARTS="setup" BUDGET_S=150 TAG=setup \
  bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== setup done at $SECONDS" | tee -a $OUT/s41.txt
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
mkdir -p $OUT/a
OUT=$OUT/a PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="5" BREAKDOWN=10 THRU_SIDES="ffma4 w512r4 w512" THRU_S=60 \
  BUDGET_S=$((SECONDS + 215)) TAG=thru bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "==\|batched_throughput" $OUT/a/throughput.log | cut -c1-300 | tee -a $OUT/s41.txt
echo "== bench at $SECONDS" | tee -a $OUT/s41.txt
mkdir -p $OUT/b
OUT=$OUT/b BENCH_SIDES="graph mlxlm" ROUNDS=1 PARTS=bench BENCH_MODELS="llama31-8b-q4" BUDGET_S=$((SECONDS + 130)) TAG=bench \
  bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "averages\|Averages\|== round\|copy bandwidth" $OUT/b/bench.log $OUT/b/copy_bw.log 2>/dev/null | cut -c1-220 | tee -a $OUT/s41.txt
echo "== tests at $SECONDS" | tee -a $OUT/s41.txt
T=$((565 - SECONDS)); [ $T -lt 60 ] && T=60
mkdir -p $OUT/t
OUT=$OUT/t MLX_GRAPH_BATCHED_ROWS=llama3_q4 PARTS="test" TEST_ENV="MLX_GRAPH_MV_WIDE=1" \
  TESTS="verify_equals_single_steps batched_equals_single" \
  TEST_S=$T BUDGET_S=$((T + 5)) TAG=test bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah "verify group\|test result\|panicked\|rc=\|^test \|bit" $OUT/t/graph_test.log | cut -c1-240 | tee -a $OUT/s41.txt
cd $OUT && tar czf /tmp/all.tgz --exclude=s41.txt . && mv /tmp/all.tgz $OUT/all.tgz && \
  find . -mindepth 1 ! -name all.tgz ! -name s41.txt -delete
echo s41-done at $SECONDS | tee -a $OUT/s41.txt
