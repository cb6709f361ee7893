#!/bin/bash
# `mlx serve` (the product path) at MLX_GRAPH_MMA_LATE_NORM levels, 16 streaming clients, on the
# warm machine after s50.sh or pick.sh (setup done: /opt/models holds the 8B 4-bit):
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s50serve.sh graphlate0 graphlate2 ...")
# Each side starts its own server (its first warm-up compiles the tile sets), then one client,
# 16 clients and 16 again, 128 tokens each. Output: $OUT/serve.txt and $OUT/all.tgz.
T0=$SECONDS
S=$OUT/serve.txt
mkdir -p $OUT/v
[ -d /opt/models/llama31-8b-q4 ] || OUT=$OUT/v PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=150 \
  bash .gpu/c/measure.sh > $OUT/v/setup.txt 2>&1
echo "== setup at $((SECONDS - T0)) s" | tee -a $S
OUT=$OUT/v PARTS=serve SERVE_SIDES="$*" SERVE_CLIENTS=1,16,16 MAX_BATCH=16 BUDGET_S=${BUDGET_S:-560} \
  bash .gpu/c/measure.sh >> $S 2>&1
echo "== serve done at $((SECONDS - T0)) s" | tee -a $S
(cd $OUT && tar czf all.tgz v 2>/dev/null && rm -rf v)
