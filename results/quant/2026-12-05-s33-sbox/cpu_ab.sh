#!/bin/bash
# CPU time a decoded token through the user path (s32's cpu_ab.sh, adapted): `mlx generate
# --decoder cpu --threads 1`, greedy; the process's user+system CPU seconds (bash `time`) for
# 1 + N tokens less those for 1 token, / N. One thread, so time-slicing by other jobs adds no
# CPU time (cache sharing and context switches still can). Each line also gives the tokens the
# long run really generated (its "Generation: N tokens" line): a model whose text is garbage
# could stop early at EOS. Entries LABEL=BIN:MODEL[:ENV] (ENV one or more VAR=VALUE joined by
# +); rounds rotate them.
# usage: [ENTRIES=...] cpu_ab.sh ROUNDS > cpu_raw.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/work/tgt-trelcpu/release/mlx}; BASE=${BASE:-/work/s32-mlx}
A4=${A4:-/work/trellis-models/smol-a4}          # affine-4 g64
M12=${M12:-/tmp/trelcpu/m12-s0}                 # trellis-3 1mad, L 12, blocks of 64 (the default)
I8=${I8:-/tmp/trelcpu/i8l8-s0}                  # trellis-3 1mad8, L 8, blocks of 64
H12=${H12:-/tmp/trelhash/m12-as-h}              # trellis-3 1mad8h, L 12, blocks of 64
S12=${S12:-/tmp/sbox/h12-as-s}                  # trellis-3 1mad8s, L 12: h12-s0's words, its config's code renamed 1mad8s (the same kernel work; text differs)
N=${N:-128}
E=(${ENTRIES:-NA4=NEW:A4 NM12=NEW:M12 NI8=NEW:I8 NH12=NEW:H12})
P="The book of Exodus tells"
TIMEFORMAT="%U %S"
LOG=$(mktemp)
cpu() { { time env ${4//+/ } X_=1 $1 generate --model $2 --decoder cpu -p "$P" -m $3 --threads 1 --temp 0 >$LOG 2>&1; } 2>&1 | awk '{print $1 + $2}'; }
for round in $(seq 1 ${1:-3}); do
  k=${#E[@]}
  for j in $(seq 0 $((k - 1))); do
    e=${E[$(( (j + round) % k ))]}
    label=${e%%=*}; rest=${e#*=}
    IFS=: read -r bv mv env <<< "$rest"
    a=$(cpu ${!bv} ${!mv} 1 $env); b=$(cpu ${!bv} ${!mv} $((N + 1)) $env)
    gen=$(grep -o 'Generation: [0-9]* tokens' $LOG | grep -o '[0-9]*')
    echo "round $round $label: cpu 1 token $a s, $((N + 1)) tokens $b s (generated $gen), per decoded token $(echo "($b - $a) * 1000 / ($gen - 1)" | bc -l | cut -c1-6) ms; $(uptime | sed 's/.*load/load/')"
  done
done
rm -f $LOG
