#!/bin/bash
# Run 12 call 3 (fresh machine): setup, batched throughput FFMA vs tensor-core tiles, the Qwen3-8B row.
export PYTHONUNBUFFERED=1
SECONDS=0
echo "== setup at $SECONDS s ($(uptime))" | tee -a $OUT/parts.log
MODELS="llama31-8b-q4" WARM="llama31-8b-q4" timeout 170 bash .gpu/a/product_setup.sh > $OUT/setup.log 2>&1
tail -2 $OUT/setup.log
for mma in 99 4; do
  echo "== thru MLX_GRAPH_BATCH_MMA=$mma at $SECONDS s" | tee -a $OUT/parts.log
  MLX_GRAPH_BATCH_MMA=$mma SKIP_TEST=1 THRU_MODELS=llama31-8b-q4 ROWS="1 4 16" THRU_S=75 SERVE_MODELS=" " \
    timeout 85 bash .gpu/c/batched.sh > $OUT/thru_run_$mma.log 2>&1
  mv $OUT/throughput.log $OUT/thru_$mma.txt; cut -c1-200 $OUT/thru_$mma.txt
done
echo "done at $SECONDS s" | tee -a $OUT/parts.log; (cd $OUT && tar czf logs-call3.tgz --exclude=logs-call3.tgz . )
