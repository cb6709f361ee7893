#!/bin/bash
# Session 46's check of main with the pair as the wide tiles' default (2ac2eca9 or later), one
# call on an H100/H200 with .gpu/c from prepare_product_c.sh and this file copied into .gpu/c:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s46c.sh", timeout_s=590)
# 1. setup (the 8B 4-bit model);
# 2. `mlx serve` at its defaults (the `graph` side sets no switch: the pair by default), 1 and 16
#    streaming clients, 128 tokens;
# 3. batched_throughput, the 8B at 5 and 16 rows: `pair` (the default now) against `pairbanks`
#    (the same with MLX_GRAPH_MMA_BANKS=1: +2.8% at 16 rows before the pair, s38; its
#    batched_equals_single bits passed there, wide_tiles_equal_narrow_tiles never finished).
T0=$SECONDS
mkdir -p $OUT/s $OUT/sv $OUT/b
OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 BUDGET_S=150 bash .gpu/c/measure.sh > $OUT/s46c.txt 2>&1
echo "== setup done at $((SECONDS - T0)) s" | tee -a $OUT/s46c.txt
OUT=$OUT/sv PARTS=serve SERVE_SIDES=graph SERVE_S=120 BUDGET_S=175 timeout 180 \
  bash .gpu/c/measure.sh >> $OUT/s46c.txt 2>&1
grep -h "== serve\|clients\|decode steps 1[0-9][0-9] " $OUT/sv/serve.log | cut -c1-300 | tee -a $OUT/s46c.txt
echo "== serve done at $((SECONDS - T0)) s" | tee -a $OUT/s46c.txt
L=$((580 - (SECONDS - T0)))
OUT=$OUT/b PARTS=thru THRU_MODELS=llama31-8b-q4 ROWS="5 16" BREAKDOWN=10 THRU_SIDES="pair pairbanks" \
  THRU_S=$(((L - 10) / 2)) BUDGET_S=$L timeout $L bash .gpu/c/measure.sh >> $OUT/s46c.txt 2>&1
grep -h "==\|steps/s" $OUT/b/throughput.log | cut -c1-250 | tee -a $OUT/s46c.txt
(cd $OUT && tar czf all.tgz s sv b && rm -rf s sv b)
echo "== s46c done at $((SECONDS - T0)) s"
