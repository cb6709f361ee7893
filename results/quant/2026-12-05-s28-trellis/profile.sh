#!/bin/bash
# The decode step's parts (MLX_CPU_PROFILE=1: q/k/v, attention, o, gate/up, down, head, ms a
# step) through `mlx generate --decoder cpu`, 128 greedy tokens, runs interleaved in rounds
# with the load beside each. usage: THREADS=2 [RUNS="BASE:A4 BASE:T3"] profile.sh ROUNDS
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trellis/mlx-new}; BASE=${BASE:-/tmp/trellis/mlx-base}
A4=${A4:-/work/trellis-models/smol-a4}; T3=${T3:-/work/trellis-models/smol-t3-l8-g32-refit}
T8=${T8:-/work/trellis-models/smol-t3-l8-g32-refit-i8}
TH=${THREADS:-2}
P="The book of Exodus tells"
for round in $(seq 1 ${1:-3}); do
  for run in ${RUNS:-BASE:A4 BASE:T3}; do
    bin=${run%%:*}; mv=${run##*:}; m=${!mv}
    echo "== round $round $bin $mv threads $TH; $(uptime | sed 's/.*load/load/')"
    MLX_CPU_PROFILE=1 ${!bin} generate --model $m --decoder cpu -p "$P" -m 128 --threads $TH --temp 0 2>&1 \
      | grep -E "Generation|decode steps|cpu-profile (qkv|o_proj|gate_up|down|lm_head|attention)"
  done
done
