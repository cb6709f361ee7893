#!/bin/bash
# As run.sh, with MLX_CPU_PROFILE=1 (the decode step's parts) and a second binary: NEW (this
# branch, int16 table path) on affine-4 and trellis-3, BASE (main, 0c25a37, float32 table path)
# on trellis-3; rounds alternating. usage: run_profile.sh ROUNDS > profile_raw.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trellis-s26/mlx-new}; BASE=${BASE:-/tmp/trellis-s26/mlx-base}
A4=${A4:-/work/trellis-models/smol-a4}; T3=${T3:-/tmp/trellis-work/t3-l8-ldlq-g32}
P="The book of Exodus tells"
for round in $(seq 1 ${1:-5}); do
  for run in "NEW $A4" "NEW $T3" "BASE $T3"; do
    set -- $run; bin=$1; m=$2
    echo "== round $round $bin $m; uptime: $(uptime)"
    MLX_CPU_PROFILE=1 /usr/bin/time -f "cpu user %U sys %S wall %e" nice -n 19 ${!bin} generate --model $m --decoder cpu \
      -p "$P" -m 128 --threads 2 --temp 0 2>&1 | grep -E "tokens-per-sec|cpu user|decode steps|cpu-profile (qkv|o_proj|gate_up|down|lm_head|attention)" | head -9
  done
done
