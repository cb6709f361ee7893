#!/bin/bash
# (s35 trelq: s34 trelidx's wall_speed.sh; models under /work/trelq-data/models, C = the candidate.) usage here:
#   NEW=/work/trelq-data/mlx C=/work/trelq-data/models/NAME RUNS="NEW:A4 NEW:C NEW:G7 NEW:T3" THREADS=2 wall_speed.sh 5
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
W=/work/trelq-data/models; G7=${G7:-$W/g7-s0}; A4=${A4:-/work/trelq-data/smol-a4}; T3=${T3:-$W/m12-s0}; C=${C:-$W/g7-s0}
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
