#!/bin/bash
# Decode CPU time through the user path under load: `mlx generate --decoder cpu --threads 1`,
# greedy, the process's user+system CPU seconds (bash `time`), for 129 tokens less 1 token
# (so load, prompt and first token cancel), / 128 = CPU ms a decoded token. One thread, so
# time-slicing by other jobs adds no CPU time to the process (cache sharing still can).
# Rounds rotate BIN:MODEL. usage: [RUNS=...] cputime.sh ROUNDS > cputime_raw.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trelcpu/mlx-new}; BASE=${BASE:-/work/s29-mlx}
A4=${A4:-/work/trellis-models/smol-a4}; T8=${T8:-/work/trellis-models/smol-t3-l8-g32-refit-i8}
RUNS=(${RUNS:-BASE:A4 BASE:T8 NEW:A4 NEW:T8})
P="The book of Exodus tells"
TIMEFORMAT="%U %S"
cpu() { { time $1 generate --model $2 --decoder cpu -p "$P" -m $3 --threads 1 --temp 0 >/dev/null 2>&1; } 2>&1 | awk '{print $1 + $2}'; }
for round in $(seq 1 ${1:-3}); do
  k=${#RUNS[@]}
  for j in $(seq 0 $((k - 1))); do
    run=${RUNS[$(( (j + round) % k ))]}
    bin=${run%%:*}; mv=${run##*:}; m=${!mv}
    a=$(cpu ${!bin} $m 1); b=$(cpu ${!bin} $m 129)
    echo "round $round $bin $mv: cpu 1 token $a s, 129 tokens $b s, per decoded token $(echo "($b - $a) * 1000 / 128" | bc -l | cut -c1-6) ms; $(uptime | sed 's/.*load/load/')"
  done
done
