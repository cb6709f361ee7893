#!/bin/bash
# MLX_GRAPH_MMA_LATE_NORM=1 on an H100/H200 (#30 serve, #33 verify), with .gpu/c from
# prepare_product_c.sh at the tree that has the switch and this file copied there:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s48late.sh", timeout_s=590)
# 1. batched_throughput on the tensor-core tiles (MLX_GRAPH_BATCH_MMA=4, the product's), the
#    8B-shaped 4-bit model, 16 and 5 rows, main and late in turn (no timeline; 2 replays a part).
# 2. With the switch: wide_tiles_equal_narrow_tiles (wide and narrow tiles bit-equal, both
#    within TEACHER_FORCED_BOUNDS of the sequence alone) and batched_equals_single on the 4-bit
#    rows (llama3_q4, qwen3_q4: the tensor-core tiles against one-row decoding and the MLX
#    forward, within the bounds).
T0=$SECONDS
S=$OUT/late.txt
mkdir -p $OUT/s
OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=150 bash .gpu/c/measure.sh > $S 2>&1
echo "== setup done at $((SECONDS - T0)) s" | tee -a $S
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache
mkdir -p /opt/bin && xz -dc .gpu/c/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
one() {  # NAME ROWS SECONDS [VAR=VALUE ...]
  local name=$1 rows=$2 s=$3; shift 3
  local left=$((${LATE_S:-330} - (SECONDS - T0)))
  [ $left -lt 40 ] && { echo "== $name skipped: $left s left" | tee -a $S; return; }
  local lim=$(( s < left ? s : left ))
  mkdir -p $OUT/$name
  env "$@" MLX_GRAPH_BATCH_MMA=4 MLX_GRAPH_BATCH_BREAKDOWN=2 \
    MLX_GRAPH_BATCH_MODEL=/opt/models/llama31-8b-q4 MLX_GRAPH_BATCH_ROWS="$rows" \
    timeout $lim /opt/bin/graph_test --ignored --nocapture --test-threads 1 batched_throughput 2>&1 \
    | grep -v "^running\|^$" > $OUT/$name/throughput.log
  echo "== $name ($*, rows $rows) done at $((SECONDS - T0)) s" | tee -a $S
  grep -h "steps/s" $OUT/$name/throughput.log | head -1 | cut -c1-200 | tee -a $S
}
one main16 16 70 MLX_GRAPH_MMA_LATE_NORM=0
one late16 16 70 MLX_GRAPH_MMA_LATE_NORM=1
one main5 5 60 MLX_GRAPH_MMA_LATE_NORM=0
one late5 5 60 MLX_GRAPH_MMA_LATE_NORM=1
mkdir -p $OUT/t
left=$((${LATE_END:-560} - (SECONDS - T0)))
echo "== tests at $((SECONDS - T0)) s, $left s left" | tee -a $S
MLX_GRAPH_MMA_LATE_NORM=1 timeout $((left / 2)) /opt/bin/graph_test --test-threads 1 --nocapture \
  wide_tiles_equal_narrow_tiles > $OUT/t/wide.log 2>&1
echo "== wide rc $? at $((SECONDS - T0)) s" | tee -a $S
grep -h "test result\|panicked\|FAILED\|bit-equal\|equal" $OUT/t/wide.log | head -12 | cut -c1-240 | tee -a $S
left=$((${LATE_END:-560} - (SECONDS - T0)))
MLX_GRAPH_MMA_LATE_NORM=1 MLX_GRAPH_BATCHED_ROWS=llama3_q4,qwen3_q4 timeout $left /opt/bin/graph_test \
  --test-threads 1 --nocapture batched_equals_single > $OUT/t/batched.log 2>&1
echo "== batched rc $? at $((SECONDS - T0)) s" | tee -a $S
grep -h "test result\|panicked\|FAILED\|batched row\|bit" $OUT/t/batched.log | head -16 | cut -c1-240 | tee -a $S
(cd $OUT && tar czf all.tgz s main16 late16 main5 late5 t 2>/dev/null && rm -rf s main16 late16 main5 late5 t)
echo "== s48late done at $((SECONDS - T0)) s" | tee -a $S
