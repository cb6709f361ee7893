#!/bin/bash
# CPU seconds of `mlx generate --decoder cpu` (2 threads, greedy) at 8 and 136 generated tokens:
# the difference / 128 is the decoder's CPU time a decoded token (loading and prompt cancel).
# usage: cpu_per_token.sh MODELS_DIR ROUNDS  (NEW: the binary)
D=$1; N=${2:-2}; NEW=${NEW:-/work/tgt-trellis-rel/release/mlx}
for round in $(seq 1 $N); do
  for m in smol-a4 smol-t3; do
    for g in 8 136; do
      echo "== round $round $m g=$g; uptime: $(uptime)"
      /usr/bin/time -f "cpu user %U sys %S wall %e" $NEW generate --model $D/$m --decoder cpu \
        -p "The book of Exodus tells" -m $g --threads 2 --temp 0 2>&1 | grep -E "Generation|cpu user"
    done
  done
done
