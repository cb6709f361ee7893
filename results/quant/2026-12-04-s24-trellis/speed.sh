#!/bin/bash
# Decode speed of `mlx generate --decoder cpu` (greedy, 128 tokens, 2 threads), affine-4 vs
# trellis-3 side by side, rounds alternating, the new build (NEW) beside the last main's (OLD).
# usage: speed.sh MODELS_DIR ROUNDS > speed_raw.txt  (models: smol-a4, smol-t3; see README.md)
D=$1; N=${2:-3}
NEW=${NEW:-/work/tgt-trellis-rel/release/mlx}; OLD=${OLD:-/work/s23-mlx-merged}
P="The book of Exodus tells"
for round in $(seq 1 $N); do
  for bin in NEW OLD; do
    for m in smol-a4 smol-t3; do
      echo "== round $round $bin $m; uptime: $(uptime)"
      /usr/bin/time -f "cpu user %U sys %S wall %e" ${!bin} generate --model $D/$m --decoder cpu \
        -p "$P" -m 128 --threads 2 --temp 0 2>&1 | grep -E "tokens-per-sec|Peak|cpu user"
    done
  done
done
