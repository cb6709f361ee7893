#!/bin/bash
# The 16-row step's A/B sides in one call (#30 serve), on an H100/H200, with .gpu/c from
# prepare_product_c.sh at main (MLX_GRAPH_MMA_PRO in graph_test) and this file copied there:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s49.sh", timeout_s=590)
# Each side: batched_throughput on the tensor-core tiles (MLX_GRAPH_BATCH_MMA=4, the product's),
# parts (5 replays) and one step's timeline (trace_summary.py). Sides, in this order while the
# time lasts (S49_S seconds in all, default 560):
#   main16   the defaults (the pair), 16 rows;
#   pro1_16  MLX_GRAPH_MMA_PRO=1 (the prologue's sequences in flight together, inlined);
#   pro2_16  MLX_GRAPH_MMA_PRO=2 (out of line: session 47's -6.4% on an H200);
#   mb2_16   MLX_GRAPH_MIN_BLOCKS=2 (two blocks an SM at 128 registers, inputs in chunks of K);
#   main5, pro1_5  the 5-row tile (speculation's verify rows, 5 clients).
# Every side's products are bit-equal to main16's (the switches only move work).
# The timelines tell where the pro sides gain or lose: the prologue column per kind
# (session 47, H100, main: qkv 20.1 us, o 7.5, gate_up 20.3, down 9.6) against the stream.
T0=$SECONDS
mkdir -p $OUT/s
OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=150 bash .gpu/c/measure.sh > $OUT/s49.txt 2>&1
echo "== setup done at $((SECONDS - T0)) s" | tee -a $OUT/s49.txt
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache
mkdir -p /opt/bin && xz -dc .gpu/c/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
one() {  # NAME ROWS SECONDS [VAR=VALUE ...]
  local name=$1 rows=$2 s=$3; shift 3
  local left=$((${S49_S:-560} - (SECONDS - T0)))
  [ $left -lt 45 ] && { echo "== $name skipped: $left s left" | tee -a $OUT/s49.txt; return; }
  local lim=$(( s < left ? s : left ))
  mkdir -p $OUT/$name
  env "$@" MLX_GRAPH_BATCH_MMA=4 MLX_GRAPH_BATCH_TRACE=$OUT/$name/trace MLX_GRAPH_BATCH_BREAKDOWN=5 \
    MLX_GRAPH_BATCH_MODEL=/opt/models/llama31-8b-q4 MLX_GRAPH_BATCH_ROWS="$rows" \
    timeout $lim /opt/bin/graph_test --ignored --nocapture --test-threads 1 batched_throughput 2>&1 \
    | grep -v "^running\|^$" > $OUT/$name/throughput.log
  echo "== $name ($*, rows $rows) done at $((SECONDS - T0)) s" | tee -a $OUT/s49.txt
  grep -h "steps/s" $OUT/$name/throughput.log | head -1 | cut -c1-200 | tee -a $OUT/s49.txt
}
one main16 16 80 MLX_GRAPH_MMA_PRO=0
one pro1_16 16 80 MLX_GRAPH_MMA_PRO=1
one pro2_16 16 80 MLX_GRAPH_MMA_PRO=2
one mb2_16 16 80 MLX_GRAPH_MIN_BLOCKS=2
one main5 5 80 MLX_GRAPH_MMA_PRO=0
one pro1_5 5 80 MLX_GRAPH_MMA_PRO=1
for t in $OUT/*/trace-*.txt; do
  [ -f "$t" ] && { echo "== $t"; timeout 15 python3 .gpu/c/trace_summary.py "$t"; } >> $OUT/summaries.txt 2>&1
done
grep -h -A8 "kernels, span" $OUT/summaries.txt | head -70
(cd $OUT && tar czf all.tgz s main16 pro1_16 pro2_16 mb2_16 main5 pro1_5 2>/dev/null
 rm -rf s main16 pro1_16 pro2_16 mb2_16 main5 pro1_5)
echo "== s49 done at $((SECONDS - T0)) s"
