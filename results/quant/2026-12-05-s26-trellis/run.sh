#!/bin/bash
# Decode speed through the user path: `mlx generate --decoder cpu`, affine-4 against trellis-3 (and
# any further models given), rounds alternating, 128 greedy tokens, 2 threads, uptime beside each run.
# usage: run.sh ROUNDS [MODEL...] > speed_raw.txt     (MLX: the release `mlx` binary to time)
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
MLX=${MLX:-/tmp/trellis-s26/mlx-new}
NICE=${NICE:-nice -n 19}
R=${1:-5}; shift
MODELS=${@:-/work/trellis-models/smol-a4 /tmp/trellis-work/t3-l8-ldlq-g32}
P="The book of Exodus tells"
for round in $(seq 1 $R); do
  for m in $MODELS; do
    echo "== round $round $m; uptime: $(uptime)"
    /usr/bin/time -f "cpu user %U sys %S wall %e" $NICE $MLX generate --model $m --decoder cpu \
      -p "$P" -m 128 --threads 2 --temp 0 2>&1 | grep -E "tokens-per-sec|Peak|cpu user"
  done
done
