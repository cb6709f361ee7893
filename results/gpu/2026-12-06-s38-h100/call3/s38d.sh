#!/bin/bash
# Session 38 call 3 (trimmed to the device time left): setup (8B 4-bit), engineer prefill's
# check (dense prompt linears against MLX's quantized_matmul, bits, time, peak), then
# `mlx benchmark --decoder auto` beside `mlx_lm benchmark` with MLX_PREFILL_DENSE=0 (one step's
# kernel timeline written) and the graph side with MLX_PREFILL_DENSE=1; one round each.
PARTS="setup" MODELS="llama31-8b-q4" BUDGET_S=170 TAG=setup bash .gpu/c/measure.sh
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
LD_LIBRARY_PATH="$SITE/mlx/lib" timeout 70 python3 xtask/gpu/prefill_dense_check.py \
  /opt/models/llama31-8b-q4 > $OUT/check.jsonl 2> $OUT/check.err
echo "check rc=$?" | tee -a $OUT/s38.txt
grep '"part": "model"' $OUT/check.jsonl | tee -a $OUT/s38.txt; tail -3 $OUT/check.err
mkdir -p /tmp/tr
run() {  # NAME BUDGET_S SIDES ENV...
  local name=$1 budget=$2 sides=$3; shift 3
  echo "== $name at ${SECONDS} s: $*" | tee -a $OUT/s38.txt
  mkdir -p $OUT/$name
  env "$@" OUT=$OUT/$name PARTS=bench BENCH_MODELS="llama31-8b-q4" \
    BENCH_SIDES="$sides" ROUNDS=1 BUDGET_S=$budget TAG=$name bash .gpu/c/measure.sh
  tar xzf $OUT/$name/logs-$name.tgz -O ./bench.log 2> /dev/null \
    | grep '^== round\|"averages"\|Averages\|peak' | cut -c1-240 | tee -a $OUT/s38.txt
}
run off 90 "graph mlxlm" MLX_PREFILL_DENSE=0 MLX_GRAPH_TRACE=/tmp/tr/off-%p.txt
run on 60 "graph" MLX_PREFILL_DENSE=1
for f in /tmp/tr/*.txt; do python3 xtask/gpu/trace_summary.py --blocks 5 "$f"; done > $OUT/trace_summary.txt 2>&1
tar czf $OUT/traces.tgz -C /tmp tr 2>/dev/null
cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude=s38.txt --exclude=trace_summary.txt . && \
  find . -mindepth 1 ! -name all.tgz ! -name s38.txt ! -name trace_summary.txt -delete
echo s38d-done at $SECONDS
