#!/bin/bash
# CPU seconds of decoding under load (wall time measures the load): `mlx generate --decoder cpu
# --threads 1`, CPU (user + sys) of an N-token run (default 257) minus that of a 1-token run, per
# decoded token; NEW/BASE as in run_profile.sh; RUNS: BIN:MODEL pairs; rounds alternating.
# usage: [N=513] [RUNS="NEW:A4 NEW:T3"] cpu_per_token.sh ROUNDS
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/tmp/trellis-s26/mlx-new}; BASE=${BASE:-/tmp/trellis-s26/mlx-base}
A4=${A4:-/work/trellis-models/smol-a4}; T3=${T3:-/tmp/trellis-work/t3-l8-ldlq-g32}
P="The book of Exodus tells"; N=${N:-257}; RUNS=${RUNS:-NEW:A4 NEW:T3 BASE:T3}
cpu() { /usr/bin/time -f "%U %S" nice -n 19 $1 generate --model $2 --decoder cpu -p "$P" -m $3 --threads 1 --temp 0 2>&1 >/dev/null | tail -1 | awk '{print $1 + $2}'; }
for round in $(seq 1 ${1:-3}); do
  for run in $RUNS; do
    bin=${run%%:*}; mv=${run##*:}; m=${!mv}
    u=$(uptime | sed 's/.*load/load/'); c1=$(cpu ${!bin} $m 1); c2=$(cpu ${!bin} $m $N)
    echo "round $round $bin $(basename $m): cpu 1 token $c1 s, $N tokens $c2 s, per decoded token $(echo "($c2 - $c1) * 1000 / ($N - 1)" | bc -l | cut -c1-6) ms; $u"
  done
done
