#!/bin/bash
# (s34 trelidx: s33 trelhash's speed.sh with G7, the gauss7s model, added.) usage here: NEW=/tmp/trelidx/mlx THREADS=2 H12=/tmp/trelqual/h12-s0 RUNS="NEW:A4 NEW:G7 NEW:H12 NEW:T3" wall_speed.sh 5
# Decode speed through the user path (`mlx generate --decoder cpu`, 128 greedy tokens, 2
# threads), interleaved in one script: every round runs each BIN:MODEL pair once, in a
# rotated order (s30's speed.sh with a 1mad8h model, H12, and the tokens each run generated:
# a model whose text is garbage may stop early at EOS, so the rate is over what it generated).
# A4: affine-4 (group 64); T3: trellis-3 1mad, L 12, blocks of 64 (the default conversion);
# I8: trellis-3 1mad8, L 8, blocks of 64; H12: trellis-3 1mad8h, L 12, blocks of 64 (trelqual's
# seed-0 conversion where it exists, else trelhash's m12-s0 relabelled 1mad8h: the same words and
# shapes, so the same speed, garbage text).
# usage: [RUNS="NEW:A4 NEW:T3 NEW:I8 NEW:H12"] speed.sh ROUNDS > speed_raw.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
NEW=${NEW:-/work/tgt-trelcpu/release/mlx}; BASE=${BASE:-/work/s32-mlx}
G7=${G7:-/tmp/trelidx/g7-s0}; A4=${A4:-/work/trellis-models/smol-a4}; T3=${T3:-/tmp/trelcpu/m12-s0}; I8=${I8:-/tmp/trelcpu/i8l8-s0}
if [ -z "$H12" ]; then
  if [ -f /tmp/trelqual/h12-s0/config.json ]; then H12=/tmp/trelqual/h12-s0; else H12=/tmp/trelhash/m12-as-h; fi
fi
TH=${THREADS:-2}; N=${N:-128}
RUNS=(${RUNS:-NEW:A4 NEW:T3 NEW:I8 NEW:H12})
P="The book of Exodus tells"
for round in $(seq 1 ${1:-5}); do
  k=${#RUNS[@]}
  for j in $(seq 0 $((k - 1))); do
    run=${RUNS[$(( (j + round) % k ))]}
    bin=${run%%:*}; mv=${run##*:}; m=${!mv}
    u=$(uptime | sed 's/.*load/load/')
    g=$(${!bin} generate --model $m --decoder cpu -p "$P" -m $N --threads $TH --temp 0 2>&1 | grep Generation)
    t=$(echo "$g" | sed 's/.*tokens, //; s/ tokens-per-sec//')
    n=$(echo "$g" | grep -o 'Generation: [0-9]*' | grep -o '[0-9]*')
    echo "round $round $bin $mv threads $TH: $t tok/s ($n tokens; $m); $u"
  done
done
