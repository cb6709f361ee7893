#!/bin/bash
# Session 40, call 2 (cold, <= 440 s): the draft-model speculation row (succ 8B target, succ5
# 135M draft, K 4: every draft accepted) with 4 rows a warp in the verify target
# (MLX_GRAPH_SPEC_ROWS=4) against the defaults, then the product row qwen3-8b-q4 (mlx benchmark
# --decoder auto beside mlx_lm benchmark; the MoE row was dropped to save device time).
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
MODELS="succ-llama31-8b-q4 succ5-llama-135m-v128k-bf16 qwen3-8b-q4" WARM=" " \
  PARTS="setup" BUDGET_S=200 TAG=setup bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== setup done at $SECONDS" >> $OUT/s40.txt
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
for e in rows4 default; do
  mkdir -p $OUT/spec-$e
  if [ $e = rows4 ]; then X="MLX_GRAPH_SPEC_ROWS=4"; else X="MLX_GRAPH_X=1"; fi
  env $X OUT=$OUT/spec-$e PARTS=spec SPEC_PAIRS="succ-llama31-8b-q4:succ5-llama-135m-v128k-bf16:4" \
    BUDGET_S=90 TAG=spec bash .gpu/c/measure.sh > /dev/null 2>&1
  echo "== spec $e done at $SECONDS" >> $OUT/s40.txt
  grep -h "succ" $OUT/spec-$e/spec_table.md 2>/dev/null | tee -a $OUT/s40.txt
done
mkdir -p $OUT/b
OUT=$OUT/b BENCH_SIDES="graph mlxlm" ROUNDS=1 PARTS=bench BENCH_MODELS="qwen3-8b-q4" BUDGET_S=$((430 - SECONDS)) TAG=bench \
  bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== bench done at $SECONDS" >> $OUT/s40.txt
grep -h "averages\|Averages\|== round\|copy bandwidth" $OUT/b/bench.log $OUT/b/copy_bw.log 2>/dev/null | cut -c1-220 >> $OUT/s40.txt
cd $OUT && tar czf /tmp/all.tgz . ; mv /tmp/all.tgz $OUT/all.tgz; \
  find . -mindepth 1 ! -name all.tgz ! -name s40.txt -delete
