#!/bin/bash
# Where the 8B's batched step loses ~1.9 ms of 8.6 between its parts (#30 serve; session 46:
# the 16-row step 8.57 ms, its parts replayed alone 6.62 ms), one call on an H100/H200 with
# .gpu/c from prepare_product_c.sh at main 2f076c75 or later (batched_throughput's
# MLX_GRAPH_BATCH_TRACE) and this file copied into .gpu/c:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s47.sh", timeout_s=590)
# 1. setup: the 8B 4-bit model only, no mlx-lm warm-ups (WARM=" ");
# 2. batched_throughput at 1, 5 and 16 rows with the defaults (the pair), each part's time
#    (10 replays) and one step's block timeline a row count (trace-pair-<rows>.txt);
# 3. the same without the pair (MLX_GRAPH_MMA_PAIR=0: trace-on-<rows>.txt);
# 4. trace_summary.py on each timeline: per kernel kind, the release (launch and dependency),
#    prologue and stream medians, and the step's span against the sum of the parts.
T0=$SECONDS
mkdir -p $OUT/s $OUT/b $OUT/b0
OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=220 bash .gpu/c/measure.sh > $OUT/s47.txt 2>&1
echo "== setup done at $((SECONDS - T0)) s" | tee -a $OUT/s47.txt
L=$(((570 - (SECONDS - T0)) / 2))
MLX_GRAPH_BATCH_TRACE=$OUT/b/trace-pair OUT=$OUT/b PARTS=thru THRU_MODELS=llama31-8b-q4 ROWS="1 5 16" \
  BREAKDOWN=10 THRU_SIDES=pair THRU_S=$((L - 10)) BUDGET_S=$L timeout $L bash .gpu/c/measure.sh >> $OUT/s47.txt 2>&1
L=$((575 - (SECONDS - T0) - 25))
MLX_GRAPH_BATCH_TRACE=$OUT/b0/trace-on OUT=$OUT/b0 PARTS=thru THRU_MODELS=llama31-8b-q4 ROWS="1 5 16" \
  BREAKDOWN=10 THRU_SIDES=on THRU_S=$((L - 10)) BUDGET_S=$L timeout $L bash .gpu/c/measure.sh >> $OUT/s47.txt 2>&1
grep -h "steps/s\|trace records" $OUT/b/throughput.log $OUT/b0/throughput.log | cut -c1-220 | tee -a $OUT/s47.txt
for t in $OUT/b/trace-pair-*.txt $OUT/b0/trace-on-*.txt; do
  [ -f "$t" ] && { echo "== $t"; timeout 20 python3 .gpu/c/trace_summary.py "$t"; } >> $OUT/summaries.txt 2>&1
done
tail -60 $OUT/summaries.txt
(cd $OUT && tar czf all.tgz s b b0 && rm -rf s b b0)
echo "== s47 done at $((SECONDS - T0)) s"
