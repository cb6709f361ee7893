#!/bin/bash
# (s35 trelq: s34 trelidx's cpu_ab.sh, unchanged; here NEW=/work/trelq-data/mlx A4=/work/trelq-data/smol-a4 G7=.../g7-s0 HV=.../sw-v (= hv-s0) M12=.../m12-s0)
# CPU time a decoded token through the user path, for a loaded machine: `mlx generate
# --decoder cpu --threads 1`, greedy; the process's user+system CPU seconds (bash `time`) for
# 1 + N tokens less those for 1 token, / N. One thread, so time-slicing by other jobs adds no
# CPU time (cache sharing and context switches still can). Entries as ab.sh's
# (LABEL=BIN:MODEL[:ENV], ENV one or more VAR=VALUE joined by +); rounds rotate them. PAR=1: a round's entries run at once (on a
# machine loaded far past its cores, so that they meet the same minute of load).
# usage: [ENTRIES=...] [PAR=1] cpu_ab.sh ROUNDS
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/work/tgt-trelcpu/release/mlx}; BASE=${BASE:-/work/s31-mlx}
M12=${M12:-/tmp/trelcpu/m12-s0}; I8=${I8:-/tmp/trelcpu/i8l8-s0}
A4=${A4:-/work/trellis-models/smol-a4}; T8=${T8:-/work/trellis-models/smol-t3-l8-g32-refit-i8}
N=${N:-128}
E=(${ENTRIES:-BA4=BASE:A4 BT8=BASE:T8 NA4=NEW:A4 NT8=NEW:T8 NT8ROW1=NEW:T8:MLX_CPU_TRELLIS_ROWS2=0})
P="The book of Exodus tells"
TIMEFORMAT="%U %S"
cpu() { { time env ${4//+/ } X_=1 $1 generate --model $2 --decoder cpu -p "$P" -m $3 --threads 1 --temp 0 >/dev/null 2>&1; } 2>&1 | awk '{print $1 + $2}'; }
for round in $(seq 1 ${1:-3}); do
  k=${#E[@]}
  for j in $(seq 0 $((k - 1))); do
    e=${E[$(( (j + round) % k ))]}
    label=${e%%=*}; rest=${e#*=}
    IFS=: read -r bv mv env <<< "$rest"
    one() {
      a=$(cpu ${!bv} ${!mv} 1 $env); b=$(cpu ${!bv} ${!mv} $((N + 1)) $env)
      echo "round $round $label: cpu 1 token $a s, $((N + 1)) tokens $b s, per decoded token $(echo "($b - $a) * 1000 / $N" | bc -l | cut -c1-6) ms; $(uptime | sed 's/.*load/load/')"
    }
    if [ -n "$PAR" ]; then one & else one; fi
  done
  wait
done
