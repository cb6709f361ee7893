#!/bin/bash
# Session 45, the pair item's throughput and serve for what was left of the budget (<= 400 s) on a fresh
# H100/H200, .gpu/c rebuilt from main 516b9d74 or later, this file copied into .gpu/c:
#   run(carry=[".gpu/a", ".gpu/c"], command="S45_END=380 bash .gpu/c/s45b.sh", timeout_s=390)
# 1. the 8B setup (skipped where /opt/models holds it);
# 2. batched_throughput, the 8B, 16 then 5 rows, with MLX_GRAPH_MMA_PAIR=1 (pair), each part's
#    time a step (10 replays); the defaults' side is call 1's (16 rows: 105.6 steps/s, H100);
# 3. `mlx serve` (8B 4-bit, 1 then 16 streaming clients, 128 tokens), graphpair, if 125 s are
#    left (session 39's graph side: 312.0 / 1,355.3 tok/s, H100).
# Output: $OUT/s45b.txt, $OUT/all.tgz.
T0=$SECONDS
END=${S45_END:-380}
left() { echo $((END - 10 - (SECONDS - T0))); }
mkdir -p $OUT/a $OUT/b $OUT/sv
echo "== s45b start; built from $(cat .gpu/c/built-from)" | tee $OUT/s45b.txt
if [ ! -d /opt/models/llama31-8b-q4 ]; then
  OUT=$OUT/a PARTS="setup" MODELS="llama31-8b-q4" BUDGET_S=160 TAG=setup bash .gpu/c/measure.sh >> $OUT/s45b.txt 2>&1
fi
echo "== setup done at $((SECONDS - T0)) s" | tee -a $OUT/s45b.txt
OUT=$OUT/b PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="16 5" BREAKDOWN=10 THRU_SIDES="pair" \
  THRU_S=115 BUDGET_S=125 TAG=thru timeout 130 bash .gpu/c/measure.sh >> $OUT/s45b.txt 2>&1
grep -h "steps/s\|graph mma pair" $OUT/b/throughput.log | cut -c1-250 | tee -a $OUT/s45b.txt
echo "== thru done at $((SECONDS - T0)) s" | tee -a $OUT/s45b.txt
L=$(left)
if [ $L -gt 125 ]; then
  OUT=$OUT/sv PARTS=serve SERVE_SIDES="graphpair" SERVE_S=$((L - 30)) \
    BUDGET_S=$L timeout $L bash .gpu/c/measure.sh >> $OUT/s45b.txt 2>&1
fi
echo "== serve done at $((SECONDS - T0)) s" | tee -a $OUT/s45b.txt
(cd $OUT && tar czf all.tgz a b sv && rm -rf a b sv)
