#!/bin/bash
# PREPARED, NOT RUN (session 39 ran out of device time). One cold call of <= 560 s on an H100 or
# H200, .gpu/c packed from main (prepare_product_c.sh) with this script copied into it:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s40a.sh")
# 1. Separate session 39's +9.3% at 5 rows (nb4 = MLX_GRAPH_MV_NB=1 with 4 rows a warp): the
#    `thru` sides ffma, ffma4 (4 rows a warp alone), nb4, rows 5 only, FFMA tiles at every width.
# 2. The draft-model speculation row against the ideal (measure.sh part `spec`: the 8B-shaped
#    target, the 135M-shaped draft, K 4, forced acceptance), defaults then
#    MLX_GRAPH_SPEC_ROWS=4 MLX_GRAPH_MV_NB=1 (the verify target's 4 rows a warp and the
#    constant-slot loop). If ffma4 or nb4 wins by more than the rounds' spread, make it the
#    verify target's default (graph_speculative.rs verify_launch_options; the rows' bits do not
#    depend on it: verify_equals_single_steps under the switches passed on the device in s39).
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
PARTS="setup" MODELS="llama31-8b-q4 llama-135m-bf16" BUDGET_S=200 TAG=setup bash .gpu/c/measure.sh > /dev/null 2>&1
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="5" BREAKDOWN=10 THRU_SIDES="ffma ffma4 nb4" THRU_S=70 \
  BUDGET_S=$((400 - SECONDS)) TAG=thru bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "==\|steps/s" $OUT/throughput.log | cut -c1-240 | tee -a $OUT/s40.txt
mkdir -p $OUT/a && mv $OUT/*.log $OUT/*.tgz $OUT/a/ 2>/dev/null
for e in default rows4; do
  mkdir -p $OUT/spec-$e
  if [ $e = rows4 ]; then X="MLX_GRAPH_SPEC_ROWS=4 MLX_GRAPH_MV_NB=1"; div=1; else X="MLX_GRAPH_X=1"; div=2; fi
  env $X OUT=$OUT/spec-$e PARTS=spec BUDGET_S=$(( (550 - SECONDS) / div )) TAG=spec \
    bash .gpu/c/measure.sh > /dev/null 2>&1
  grep -h "measured / ideal\|worst" $OUT/spec-$e/spec_table.md 2>/dev/null | tee -a $OUT/s40.txt
done
cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude=s40.txt . && \
  find . -mindepth 1 ! -name all.tgz ! -name s40.txt -delete
