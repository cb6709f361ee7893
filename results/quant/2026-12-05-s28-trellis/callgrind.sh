#!/bin/bash
# Instructions per decoded token (valgrind --tool=callgrind, one thread: `mlx generate --decoder cpu
# --threads 1`): Ir of a 33-token run minus a 1-token run, / 32. Keeps the 33-token profiles
# (/tmp/trellis/cg_<bin>_<model>_33.out) for callgrind_annotate's per-function split.
# usage: [RUNS="BASE:A4 BASE:T3 NEW:A4 NEW:T3"] callgrind.sh > callgrind.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trellis/mlx-new}; BASE=${BASE:-/tmp/trellis/mlx-base}
A4=${A4:-/work/trellis-models/smol-a4}; T3=${T3:-/work/trellis-models/smol-t3-l8-g32-refit}
P="The book of Exodus tells"
ir() { valgrind --tool=callgrind --callgrind-out-file=/tmp/trellis/cg_$4_$3.out $1 generate --model $2 --decoder cpu -p "$P" -m $3 --threads 1 --temp 0 2>&1 | grep -o "Collected : [0-9]*" | awk '{print $3}'; }
for run in ${RUNS:-BASE:A4 BASE:T3 NEW:A4 NEW:T3}; do
  bin=${run%%:*}; mv=${run##*:}; m=${!mv}
  a=$(ir ${!bin} $m 1 ${bin}_$mv); b=$(ir ${!bin} $m 33 ${bin}_$mv)
  echo "$bin $mv: Ir 1 token $a, 33 tokens $b, per decoded token $(( (b - a) / 32 ))"
done
