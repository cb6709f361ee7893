#!/bin/bash
# PREPARED for session 41 (session 40 call 3 gave these runs 35 s: no figure). One call of <= 450 s (a cold machine runs the setup first; <= 300 s on a warm H100 that already holds
# /opt/models/llama31-8b-q4 (measure.sh's setup in an earlier call of the same machine, e.g.
#   PARTS="setup" MODELS="llama31-8b-q4" bash .gpu/c/measure.sh
# )), with .gpu/c packed from main (h27-verify512 merged) by xtask/gpu/prepare_product_c.sh and this script
# copied into it:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s40w.sh", timeout_s=300)
# 1. `thru`, one FFMA tile of 5 rows (the K 4 verify), FFMA tiles at every width
#    (MLX_GRAPH_BATCH_MMA=99), each part's time a step (BREAKDOWN=10), sides:
#      ffma4  = 4 rows a warp, the verify target's default since s40 (6.98 ms in s40 call 1),
#      w512r4 = the same with MLX_GRAPH_MV_WIDE=1 (matvec and matvec_qkv in 512-thread blocks),
#      w512   = 2 rows a warp with MLX_GRAPH_MV_WIDE=1 (against main's ffma: 7.71 / 7.86 ms in
#               s39 / s40 call 1 on other H100s; no ffma side here for device time).
#    Rows 5 only: the switch never reaches one row (the host adds MV_WIDE only at NB > 1, and the
#    one-row kernels' SASS is byte-identical: sass_identity.txt), so a row-1 control is left out
#    for device time: a/throughput.log.
# 2. graph_decode_cuda's verify_equals_single_steps and batched_equals_single (row llama3_q4)
#    under MLX_GRAPH_MV_WIDE=1 (verify groups at the verify target's rows a warp, batched rows at 2):
#    the switch's rows bit-equal to one-row steps on the device's own compiler: b/graph_test.log.
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
[ -d /opt/models/llama31-8b-q4 ] || MODELS="llama31-8b-q4" WARM=" " PARTS="setup" BUDGET_S=120 TAG=setup \
  bash .gpu/c/measure.sh > /dev/null 2>&1  # a cold machine: the setup first (~25-70 s)
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="5" BREAKDOWN=10 THRU_SIDES="ffma4 w512r4 w512" THRU_S=70 \
  BUDGET_S=$((300 - SECONDS)) TAG=thru bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "==\|batched_throughput" $OUT/throughput.log | cut -c1-300 | tee -a $OUT/s40w.txt
mkdir -p $OUT/a && mv $OUT/*.log $OUT/*.tgz $OUT/a/ 2>/dev/null
echo "== tests at $SECONDS" | tee -a $OUT/s40w.txt
T=$((420 - SECONDS)); [ $T -lt 60 ] && T=60
MLX_GRAPH_BATCHED_ROWS=llama3_q4 PARTS="test" TEST_ENV="MLX_GRAPH_MV_WIDE=1" \
  TESTS="verify_equals_single_steps batched_equals_single" \
  TEST_S=$T BUDGET_S=$((T + 5)) TAG=test bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah "verify group\|test result\|panicked\|rc=\|^test \|bit" $OUT/graph_test.log | cut -c1-240 | tee -a $OUT/s40w.txt
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude=s40w.txt . && \
  find . -mindepth 1 ! -name all.tgz ! -name s40w.txt -delete
echo s40w-done at $SECONDS | tee -a $OUT/s40w.txt
