#!/bin/bash
# The tensor-core tiles' prologue with its sequences in flight together (#30 serve; lead-pro
# bf10c5d4), against main's (2f076c75's graph_test, .gpu/c/graph_test_old.xz), one call on an
# H100/H200 with .gpu/c from prepare_product_c.sh at bf10c5d4 and this file copied there:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s48.sh", timeout_s=590)
# s47 (H100): the 16-row step's blocks spend 16.5-18.3 us in a normed product's prologue
# (7.3 without the norm), ~2 ms of the 8.6 ms step. Runs (batched_throughput, the defaults:
# the pair; 5 replays a part; one step's timeline), in this order while time lasts:
# old 16, new 16, new 16 with MLX_GRAPH_MIN_BLOCKS=2, old 5, new 5.
T0=$SECONDS
mkdir -p $OUT/s
OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=150 bash .gpu/c/measure.sh > $OUT/s48.txt 2>&1
echo "== setup done at $((SECONDS - T0)) s" | tee -a $OUT/s48.txt
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache
mkdir -p /opt/bin
xz -dc .gpu/c/graph_test.xz > /opt/bin/graph_new && xz -dc .gpu/c/graph_test_old.xz > /opt/bin/graph_old
chmod +x /opt/bin/graph_new /opt/bin/graph_old
one() {  # NAME BINARY MIN_BLOCKS ROWS SECONDS
  local left=$((${S48_S:-470} - (SECONDS - T0)))
  [ $left -lt 40 ] && { echo "== $1 skipped: $left s left" | tee -a $OUT/s48.txt; return; }
  local lim=$(( $5 < left ? $5 : left ))
  mkdir -p $OUT/$1
  MLX_GRAPH_MIN_BLOCKS=$3 MLX_GRAPH_BATCH_TRACE=$OUT/$1/trace MLX_GRAPH_BATCH_BREAKDOWN=5 \
    MLX_GRAPH_BATCH_MODEL=/opt/models/llama31-8b-q4 MLX_GRAPH_BATCH_ROWS="$4" \
    timeout $lim /opt/bin/$2 --ignored --nocapture --test-threads 1 batched_throughput 2>&1 \
    | grep -v "^running\|^$" > $OUT/$1/throughput.log
  echo "== $1 ($2, min blocks '$3', rows $4) done at $((SECONDS - T0)) s" | tee -a $OUT/s48.txt
  grep -h "steps/s" $OUT/$1/throughput.log | cut -c1-200 | tee -a $OUT/s48.txt
}
one old16 graph_old "" 16 110
one new16 graph_new "" 16 110
one mb16 graph_new 2 16 110
one old5 graph_old "" 5 110
one new5 graph_new "" 5 110
for t in $OUT/*/trace-*.txt; do
  [ -f "$t" ] && { echo "== $t"; timeout 15 python3 .gpu/c/trace_summary.py --blocks 5 "$t"; } >> $OUT/summaries.txt 2>&1
done
grep -h -A9 "^== \|kernels, span" $OUT/summaries.txt | grep -v "per block\|entry" | head -80
(cd $OUT && tar czf all.tgz s old16 new16 mb16 old5 new5 2>/dev/null; rm -rf s old16 new16 mb16 old5 new5)
echo "== s48 done at $((SECONDS - T0)) s"
