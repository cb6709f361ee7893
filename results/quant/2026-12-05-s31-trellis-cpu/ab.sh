#!/bin/bash
# Interleaved A/B through the user path: `mlx generate --decoder cpu`, 128 greedy tokens,
# THREADS threads (default 2), wall tok/s as `mlx generate` prints it. Each entry is
# LABEL=BIN:MODEL[:ENV], BIN and MODEL naming variables (BASE/NEW, A4/T8), ENV one VAR=VALUE
# for that run (the kernel's knobs; several joined by +); every round runs each entry once, in a rotated order.
# usage: [ENTRIES="..."] ab.sh ROUNDS > ab_raw.txt; summarize with ab_summary.py
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trelcpu/mlx-new}; BASE=${BASE:-/work/s30-mlx}
A4=${A4:-/work/trellis-models/smol-a4}; T8=${T8:-/work/trellis-models/smol-t3-l8-g32-refit-i8}
TH=${THREADS:-2}; N=${N:-128}
E=(${ENTRIES:-BA4=BASE:A4 BT8=BASE:T8 NA4=NEW:A4 NT8=NEW:T8 NT8ROW1=NEW:T8:MLX_CPU_TRELLIS_ROWS2=0})
P="The book of Exodus tells"
for round in $(seq 1 ${1:-5}); do
  k=${#E[@]}
  for j in $(seq 0 $((k - 1))); do
    e=${E[$(( (j + round) % k ))]}
    label=${e%%=*}; rest=${e#*=}
    IFS=: read -r bv mv env <<< "$rest"
    u=$(uptime | sed 's/.*load/load/')
    t=$(env ${env//+/ } X_=1 ${!bv} generate --model ${!mv} --decoder cpu -p "$P" -m $N --threads $TH --temp 0 2>&1 | grep Generation | sed 's/.*tokens, //; s/ tokens-per-sec//')
    echo "round $round $label threads $TH: $t tok/s; $u"
  done
done
