#!/bin/bash
# Session 39 call 4 (cold H100; bundle from main 312a4767 with h26-verify): setup (8B); engineer
# verify's MLX_GRAPH_MV_NB=1 against main's FFMA tiles at 5 and 8 rows (FFMA at every width:
# the verify rows' kernels), and at 4 rows a warp with the switch; then the bit tests under the
# switch (verify groups and batched rows against one-row steps on the device's compiler).
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
PARTS="setup" MODELS="llama31-8b-q4" WARM="llama31-8b-q4" BUDGET_S=170 TAG=setup bash .gpu/c/measure.sh > /dev/null 2>&1
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
echo "== setup done at $SECONDS" | tee -a $OUT/s39.txt
L=$((430 - SECONDS)); [ $L -gt 230 ] && L=230
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="5 8" BREAKDOWN=10 THRU_SIDES="ffma nb nb4" THRU_S=75 \
  BUDGET_S=$L TAG=thru bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "==\|batched_throughput" $OUT/throughput.log | cut -c1-300 | tee -a $OUT/s39.txt
mkdir -p $OUT/a && mv $OUT/*.log $OUT/*.tgz $OUT/a/ 2>/dev/null
echo "== tests at $SECONDS" | tee -a $OUT/s39.txt
T=$((540 - SECONDS))
MLX_GRAPH_BATCHED_ROWS=llama3_q4 PARTS="test" TEST_ENV="MLX_GRAPH_MV_NB=1" \
  TESTS="verify_equals_single_steps batched_equals_single" \
  TEST_S=$T BUDGET_S=$((T + 5)) TAG=test bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah "verify group\|test result\|panicked\|rc=\|^test \|bit" $OUT/graph_test.log | cut -c1-240 | tee -a $OUT/s39.txt
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude=s39.txt . && \
  find . -mindepth 1 ! -name all.tgz ! -name s39.txt -delete
echo s39d-done at $SECONDS | tee -a $OUT/s39.txt
