#!/bin/bash
# MLX_GRAPH_MMA_LATE_NORM levels 0 (off), 1 (matvec_qkv) and 2 (also matvec_norm: gate/up and
# the head) on an H100/H200, with .gpu/c from prepare_product_c.sh at the tree that has level 2
# and this file copied there:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s50.sh", timeout_s=590)
# 1. At once (NVRTC compiles are most of their time; the device has 16 cores): the two tests
#    under levels 1 and 2 (batched_equals_single on llama3_q4 and qwen3_q4,
#    wide_tiles_equal_narrow_tiles), and one batched_throughput run a level and width to compile
#    the 8B tiles into the cache, three at a time (their figures are not used: the GPU is
#    shared then).
# 2. Alone: batched_throughput, tensor-core tiles (MLX_GRAPH_BATCH_MMA=4), the 8B-shaped 4-bit
#    model, 16 and 5 rows, levels 0, 1, 2 in turn three times; a run is stopped once its
#    throughput line is written (the test goes on to its timeline otherwise).
# 3. What time is left: breakdowns (5 replays a part) at 16 rows, levels 0 and 2 (a run stopped
#    at its last part's line).
T0=$SECONDS
S=$OUT/s50.txt
mkdir -p $OUT/s $OUT/t
OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=150 bash .gpu/c/measure.sh > $S 2>&1
echo "== setup done at $((SECONDS - T0)) s" | tee -a $S
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache
mkdir -p /opt/bin && xz -dc .gpu/c/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
M=/opt/models/llama31-8b-q4
# thru LEVEL ROWS CAP_S [BREAKDOWN]: one batched_throughput run, stopped at its line.
thru() {
  local f=$OUT/t/thru-$1-$2-$4-$SECONDS-$RANDOM.log
  env MLX_GRAPH_MMA_LATE_NORM=$1 MLX_GRAPH_BATCH_MMA=4 MLX_GRAPH_BATCH_MODEL=$M \
    MLX_GRAPH_BATCH_ROWS=$2 ${4:+MLX_GRAPH_BATCH_BREAKDOWN=$4} \
    /opt/bin/graph_test --ignored --nocapture --test-threads 1 batched_throughput > $f 2>&1 &
  local p=$! i
  for ((i = 0; i < $3; i++)); do
    sleep 1
    if [ -n "$4" ]; then grep -q 'part Argmax\|breakdown:' $f && break
    else grep -q 'steps/s' $f && break; fi
  done
  kill $p 2>/dev/null; wait $p 2>/dev/null
  echo "late=$1 rows=$2${4:+ breakdown=$4} $(grep -o '[0-9.]* steps/s' $f | head -1)" | tee -a $S
}
for l in 1 2; do
  (env MLX_GRAPH_MMA_LATE_NORM=$l MLX_GRAPH_BATCHED_ROWS=llama3_q4,qwen3_q4 timeout 280 \
     /opt/bin/graph_test --test-threads 1 --nocapture batched_equals_single > $OUT/t/batched-$l.log 2>&1
   echo "== batched level $l rc $? at $((SECONDS - T0)) s" | tee -a $S) &
  (env MLX_GRAPH_MMA_LATE_NORM=$l timeout 280 /opt/bin/graph_test --test-threads 1 --nocapture \
     wide_tiles_equal_narrow_tiles > $OUT/t/wide-$l.log 2>&1
   echo "== wide level $l rc $? at $((SECONDS - T0)) s" | tee -a $S) &
done
echo "== compiling: the runs' figures until the next line are on a shared GPU" | tee -a $S
# The 8B model three times at once at most (GPU memory), while the tests run.
(for r in 16 5; do for l in 0 1 2; do thru $l $r 200 & done; wait; done) &
wait
echo "== compiled and tested at $((SECONDS - T0)) s" | tee -a $S
for l in 1 2; do
  grep -h "test result\|panicked\|batched row\|bit for bit\|bit-equal\|row-steps" \
    $OUT/t/batched-$l.log $OUT/t/wide-$l.log | head -16 | cut -c1-240 | sed "s/^/[$l] /" | tee -a $S
done
for r in 16 5; do for i in 1 2 3; do for l in 0 1 2; do thru $l $r 60; done; done; done
echo "== throughput done at $((SECONDS - T0)) s" | tee -a $S
for l in 0 2; do
  [ $((SECONDS - T0)) -lt 480 ] && thru $l 16 90 5
done
(cd $OUT && tar czf all.tgz s t 2>/dev/null && rm -rf s t)
echo "== s50 done at $((SECONDS - T0)) s" | tee -a $S
