#!/bin/bash
# Session 45, one call (<= 595 s) on a fresh H100/H200 with .gpu/c rebuilt from main 516b9d74
# or later (the pair item compiles under NVRTC) and this file, s43m.sh copied into .gpu/c:
#   run(carry=[".gpu/a", ".gpu/c"], command="S45_END=585 bash .gpu/c/s45.sh", timeout_s=590)
# 1. s43m.sh: the 8B setup, batched_throughput at 16 and 5 rows, the defaults against
#    MLX_GRAPH_MMA_PAIR=1, then the bit tests under the pair (<= 235 s);
# 2. `mlx serve` (8B 4-bit, 16 streaming clients, 128 tokens) graph then graphpair
#    (batched.sh's sides), what is left.
# Output: $OUT/m43.tgz, $OUT/m43.txt, $OUT/serve.tgz, $OUT/s45.txt.
T0=$SECONDS
END=${S45_END:-585}
mkdir -p $OUT/m43 $OUT/sv
echo "== s45 start; built from $(cat .gpu/c/built-from)" | tee $OUT/s45.txt
OUT=$OUT/m43 timeout $((END - 60 - (SECONDS - T0))) bash .gpu/c/s43m.sh > $OUT/m43.txt 2>&1
echo "== s43m done at $((SECONDS - T0)) s" | tee -a $OUT/s45.txt
(cd $OUT && tar czf m43.tgz m43 && rm -rf m43)
LEFT=$((END - 10 - (SECONDS - T0)))
if [ $LEFT -gt 130 ]; then
  OUT=$OUT/sv PARTS=serve SERVE_SIDES="graph graphpair" SERVE_S=$(((LEFT - 40) / 2)) \
    BUDGET_S=$LEFT timeout $LEFT bash .gpu/c/measure.sh >> $OUT/s45.txt 2>&1
fi
echo "== serve done at $((SECONDS - T0)) s" | tee -a $OUT/s45.txt
(cd $OUT && tar czf serve.tgz sv && rm -rf sv)
