#!/bin/bash
# Session 39 call 2 (warm machine, models set up by call 1): MLX_GRAPH_MV_STEAL=1's one-row step
# (thru on/steal/on); the 135M with MLX_GRAPH_ATTN_COMBINE=output against the default
# (graph side, 1 round each, alternating); then s38t's trellis parts (per-width defaults,
# STATES/PAIR at 8B; kernel test; trellis follow rows incl. the seeded first-token check).
mkdir -p $OUT/thru && mv $OUT/*.log $OUT/*.tgz $OUT/thru/ 2>/dev/null
for e in default output; do
  echo "== combine $e at $SECONDS" | tee -a $OUT/s39.txt
  mkdir -p $OUT/c$e
  if [ $e = output ]; then X=MLX_GRAPH_ATTN_COMBINE=output; else X=MLX_GRAPH_ATTN_COMBINE_UNSET=1; fi
  env $X OUT=$OUT/c$e PARTS=bench BENCH_MODELS=llama-135m-bf16 BENCH_SIDES=graph ROUNDS=1 \
    BUDGET_S=45 TAG=c bash .gpu/c/measure.sh > /dev/null 2>&1
  tar xzf $OUT/c$e/logs-c.tgz -O ./bench.log 2> /dev/null | grep '"averages"\|Averages' | cut -c1-200 | tee -a $OUT/s39.txt
  rm -rf $OUT/c$e
done
cp .gpu/c/s38t.sh /tmp/s38t.sh
bash /tmp/s38t.sh
for d in tr k t; do
  for f in $OUT/$d/logs-*.tgz; do tar xzf $f -O 2>/dev/null | grep -a "tok/s\|generation_tps\|trellis switches\|test result\|rc=\|passed\|FAILED\|panicked" | cut -c1-240; done
done >> $OUT/s39.txt
cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude=s39.txt . && \
  find . -mindepth 1 ! -name all.tgz ! -name s39.txt -delete
echo s39b-done at $SECONDS | tee -a $OUT/s39.txt
