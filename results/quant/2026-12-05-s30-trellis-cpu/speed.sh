#!/bin/bash
# Decode speed through the user path (`mlx generate --decoder cpu`, 128 greedy tokens, 2
# threads), interleaved in one script: every round runs each BIN:MODEL pair once, in a
# rotated order. BASE = main's release binary (/work/s29-mlx), NEW = this branch's.
# A4: affine-4 (group 64), T8: trellis-3 1mad8 (L 8, blocks of 32), T3: trellis-3 1mad.
# usage: [RUNS="BASE:A4 BASE:T8 NEW:A4 NEW:T8"] speed.sh ROUNDS > speed_raw.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trelcpu/mlx-new}; BASE=${BASE:-/work/s29-mlx}
A4=${A4:-/work/trellis-models/smol-a4}; T3=${T3:-/work/trellis-models/smol-t3-l8-g32-refit}
T8=${T8:-/work/trellis-models/smol-t3-l8-g32-refit-i8}
TH=${THREADS:-2}; N=${N:-128}
RUNS=(${RUNS:-BASE:A4 BASE:T8 NEW:A4 NEW:T8})
P="The book of Exodus tells"
for round in $(seq 1 ${1:-5}); do
  k=${#RUNS[@]}
  for j in $(seq 0 $((k - 1))); do
    run=${RUNS[$(( (j + round) % k ))]}
    bin=${run%%:*}; mv=${run##*:}; m=${!mv}
    u=$(uptime | sed 's/.*load/load/')
    t=$(${!bin} generate --model $m --decoder cpu -p "$P" -m $N --threads $TH --temp 0 2>&1 | grep Generation | sed 's/.*tokens, //; s/ tokens-per-sec//')
    echo "round $round $bin $mv threads $TH: $t tok/s; $u"
  done
done
