#!/bin/bash
# As speed.sh, NEW (this branch's release `mlx`, 131427f: the table path takes blocks of 32) beside
# OLD (/work/s24-mlx-merged) on the L 8 / block-32 model. usage: speed_v2.sh ROUNDS > speed_raw_v2.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trellis-mlx-new}; OLD=/work/s24-mlx-merged
T=/tmp/trellis-work; P="The book of Exodus tells"
for round in $(seq 1 $1); do
  for run in "NEW /work/trellis-models/smol-a4" "NEW /work/trellis-models/smol-t3" "NEW $T/t3-l8-ldlq-g32" "OLD $T/t3-l8-ldlq-g32" "NEW $T/t3-l12-ldlq-g32"; do
    set -- $run; bin=$1; m=$2
    echo "== round $round $bin $m; uptime: $(uptime)"
    /usr/bin/time -f "cpu user %U sys %S wall %e" nice -n 19 ${!bin} generate --model $m --decoder cpu \
      -p "$P" -m 128 --threads 2 --temp 0 2>&1 | grep -E "tokens-per-sec|Peak|cpu user"
  done
done
