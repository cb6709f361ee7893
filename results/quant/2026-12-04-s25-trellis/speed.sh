#!/bin/bash
# Decode speed of `mlx generate --decoder cpu` (greedy, 128 tokens, 2 threads): affine-4 and the
# trellis-3 rows side by side, rounds alternating. CPU seconds beside each run (the machine is
# loaded: wall tokens/s move with the load, CPU time much less).
# usage: speed.sh ROUNDS MODEL_DIR... > speed_raw.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/work/s24-mlx-merged}
N=$1; shift
P="The book of Exodus tells"
for round in $(seq 1 $N); do
  for m in "$@"; do
    echo "== round $round $m; uptime: $(uptime)"
    /usr/bin/time -f "cpu user %U sys %S wall %e" nice -n 19 $M generate --model $m --decoder cpu \
      -p "$P" -m 128 --threads 2 --temp 0 2>&1 | grep -E "tokens-per-sec|Peak|cpu user"
  done
done
