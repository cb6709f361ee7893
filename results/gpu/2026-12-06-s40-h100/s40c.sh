#!/bin/bash
# Session 40, call 3 (cold, <= 455 s; .gpu/c packed from main after h27-persist and
# h27-verify512 were merged): the two switches built this session, measured and bit-checked.
# 1. MLX_GRAPH_PERSIST (the whole one-row step as one persistent kernel): the 135M bf16
#    product path (`mlx benchmark --decoder auto`, prompt 512, 128 tokens, 3 trials), off / =1
#    / =2 interleaved, 2 rounds; then persistent_step_equals_the_kernels.
# 2. MLX_GRAPH_MV_WIDE (512-thread FFMA tiles of several rows): `thru` at 5 rows (the K 4
#    verify shape), ffma4 (4 rows a warp, the verify default since s40) against w512r4 and w512;
#    then verify_equals_single_steps and batched_equals_single (llama3_q4) under the switch.
# 3. The draft-model speculation row with this build's defaults (4 rows a warp in the verify).
# The 8B-shaped runs use the succ model (the same shapes and bytes as llama31-8b-q4).
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
T8=succ-llama31-8b-q4
MODELS="llama-135m-bf16 $T8 succ5-llama-135m-v128k-bf16" WARM=" " PARTS="setup" BUDGET_S=150 \
  TAG=setup bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== setup done at $SECONDS" | tee -a $OUT/s40.txt
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin $OUT/p && xz -dc .gpu/c/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/s40.txt
for r in 1 2; do
  for side in off on ra; do
    [ $r = 2 ] && [ $side = ra ] && continue
    [ $SECONDS -gt 160 ] && { echo "== persist $r $side skipped at $SECONDS s" | tee -a $OUT/s40.txt; continue; }
    case $side in on) X=MLX_GRAPH_PERSIST=1 ;; ra) X=MLX_GRAPH_PERSIST=2 ;; *) X=MLX_GRAPH_PERSIST=0 ;; esac
    echo "== persist $r $side ($X) at $SECONDS s" | tee -a $OUT/s40.txt
    env $X timeout 45 /opt/bin/mlx benchmark --model /opt/models/llama-135m-bf16 -p 512 -g 128 -n 3 \
      --json --decoder auto > $OUT/p/bench_${r}_$side.json 2> $OUT/p/bench_${r}_$side.err
    echo "rc=$?" >> $OUT/p/bench_${r}_$side.err
    grep -h '"averages"' $OUT/p/bench_${r}_$side.json | cut -c1-160 | tee -a $OUT/s40.txt
    grep -h 'graph persist\|rc=' $OUT/p/bench_${r}_$side.err | cut -c1-200 | tee -a $OUT/s40.txt
  done
done
PARTS=test TESTS=persistent_step_equals_the_kernels TEST_S=$((250 - SECONDS)) \
  BUDGET_S=$((255 - SECONDS)) TAG=ptest bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah 'persist row\|persistent step of\|test result\|panicked\|rc=' $OUT/graph_test.log | cut -c1-240 | tee -a $OUT/s40.txt
mkdir -p $OUT/pt && mv $OUT/*.log $OUT/*.tgz $OUT/pt/ 2>/dev/null
echo "== thru at $SECONDS" | tee -a $OUT/s40.txt
PARTS="thru" THRU_MODELS=$T8 ROWS="5" BREAKDOWN=10 THRU_SIDES="ffma4 w512r4 w512" THRU_S=35 \
  BUDGET_S=$((352 - SECONDS)) TAG=thru bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "==\|steps/s" $OUT/throughput.log | cut -c1-240 | tee -a $OUT/s40.txt
mkdir -p $OUT/a && mv $OUT/*.log $OUT/*.tgz $OUT/a/ 2>/dev/null
echo "== vtest at $SECONDS" | tee -a $OUT/s40.txt
T=$((412 - SECONDS)); [ $T -gt 90 ] && T=90
MLX_GRAPH_BATCHED_ROWS=llama3_q4 PARTS="test" TEST_ENV="MLX_GRAPH_MV_WIDE=1" \
  TESTS="verify_equals_single_steps batched_equals_single" TEST_S=$T BUDGET_S=$((T + 5)) TAG=vtest \
  bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah "verify group\|test result\|panicked\|rc=\|^test " $OUT/graph_test.log | cut -c1-240 | tee -a $OUT/s40.txt
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
echo "== spec at $SECONDS" | tee -a $OUT/s40.txt
mkdir -p $OUT/spec
OUT=$OUT/spec PARTS=spec SPEC_PAIRS="$T8:succ5-llama-135m-v128k-bf16:4" BUDGET_S=$((448 - SECONDS)) \
  TAG=spec bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "succ" $OUT/spec/spec_table.md 2>/dev/null | tee -a $OUT/s40.txt
echo "== done at $SECONDS" | tee -a $OUT/s40.txt
cd $OUT && tar czf /tmp/all.tgz . ; mv /tmp/all.tgz $OUT/all.tgz; \
  find . -mindepth 1 ! -name all.tgz ! -name s40.txt -delete
