#!/bin/bash
# Session 44: one start for the two waiting recipes, <= 595 s on one H100 or H200, with .gpu/c
# packed from main (12c4831f tree) by xtask/gpu/prepare_product_c.sh and s42p.sh, s43m.sh,
# trace_summary.py copied into it:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s44.sh", timeout_s=595)
# 1. s42p.sh (session 42's layer loop, #30 135M): trace of srsl, the 135M sides, the bits under
#    srsl (<= 290 s; SIDES puts srsl first so that a cut keeps it).
# 2. s43m.sh (session 43's paired tensor-core item, #30 serve / #33 verify): the 8B setup, the
#    batched throughput at 16 and 5 rows without and with MLX_GRAPH_MMA_PAIR=1, the bit tests.
# Shorter calls: S44_END=<timeout - 5> (s43m then gets what is left).
# Output: $OUT/p42 (s42p.txt, all.tgz), $OUT/m43.txt, $OUT/m43.tgz, $OUT/s44.txt.
T0=$SECONDS
mkdir -p $OUT/p42 $OUT/m43
echo "== s44 start; built from $(cat .gpu/c/built-from)" | tee $OUT/s44.txt
OUT=$OUT/p42 SIDES="off srsl srs srsl6" TRACES="srsl" bash .gpu/c/s42p.sh 2>&1 | tail -60 >> $OUT/s44.txt
echo "== s42p done at $((SECONDS - T0)) s" | tee -a $OUT/s44.txt
# S44_END (default 590): the call's timeout less a margin; s43m is cut 8 s before it so that its
# files are packed (a call brings back at most 8 files).
END=${S44_END:-590}
LEFT=$((END - 8 - (SECONDS - T0)))
[ $LEFT -gt 30 ] && OUT=$OUT/m43 timeout $LEFT bash .gpu/c/s43m.sh > $OUT/m43.txt 2>&1
echo "== s43m done at $((SECONDS - T0)) s" | tee -a $OUT/s44.txt
(cd $OUT && tar czf m43.tgz m43 && rm -rf m43)
