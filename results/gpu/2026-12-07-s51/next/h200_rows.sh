#!/bin/bash
# PREPARED (session 41, not run): issue #30's table on an H200 (the issue's targets are H200
# figures; sessions 39-41 measured on H100s). One call of <= 580 s on a cold nvidia-h200 with
# .gpu/c packed from main by xtask/gpu/prepare_product_c.sh and this script copied into it:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/h200_rows.sh", timeout_s=590,
#       kind="nvidia-h200")
# 1. setup: Llama-3.1-8B-shaped 4-bit, Qwen3-8B-shaped 4-bit, the 135M-shaped llama in bf16.
# 2. bench: `mlx benchmark --decoder auto` beside `mlx_lm benchmark` (prompt 512, 128 tokens,
#    3 trials), one round a model, with the copy bandwidth (decode >= 70% of it, prefill >=
#    1.2x, peak <= 1.05x; 135M >= 1,800 tok/s).
# 3. moe, if >= 150 s are left: the Qwen3-30B-A3B-shaped 4-bit model written, then mlx-lm and
#    the graph decoder (decode >= 3x mlx-lm).
# Output: $OUT/h200.txt (the summary lines) and $OUT/all.tgz.
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
S=$OUT/h200.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
MODELS="llama31-8b-q4 qwen3-8b-q4 llama-135m-bf16" WARM=" " PARTS="setup" BUDGET_S=180 TAG=setup \
  bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== setup done at $SECONDS s" | tee -a $S
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
mkdir -p $OUT/b
OUT=$OUT/b BENCH_SIDES="graph mlxlm" ROUNDS=1 PARTS=bench \
  BENCH_MODELS="llama31-8b-q4 qwen3-8b-q4 llama-135m-bf16" BUDGET_S=$((400 - SECONDS)) TAG=bench \
  bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "averages\|Averages\|== round\|copy bandwidth" $OUT/b/bench.log $OUT/b/copy_bw.log 2>/dev/null \
  | cut -c1-220 | tee -a $S
echo "== moe at $SECONDS s" | tee -a $S
if [ $SECONDS -lt 420 ]; then
  mkdir -p $OUT/m
  OUT=$OUT/m PARTS=moe BUDGET_S=$((570 - SECONDS)) TAG=moe bash .gpu/c/measure.sh > /dev/null 2>&1
  grep -h "== moe\|averages\|Averages" $OUT/m/moe.log 2>/dev/null | cut -c1-220 | tee -a $S
fi
echo "== done at $SECONDS s" | tee -a $S
cp $S /tmp/h200.txt
cd $OUT && tar czf /tmp/all.tgz --exclude=h200.txt . && mv /tmp/all.tgz $OUT/all.tgz && \
  find . -mindepth 1 ! -name all.tgz ! -name h200.txt -delete
