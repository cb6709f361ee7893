#!/bin/bash
# s36: s35 trelq's conv.sh with /work/s35-mlx (main d713014b's release build) and models under /work/gemma-data. usage: conv.sh NAME SRC ARGS...
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/work/s35-mlx}
W=${W:-/work/gemma-data}
D=$(cd $(dirname $0) && pwd)
n=$1; src=$2; shift 2
[ -d $W/$n ] && { echo "$n exists"; exit 0; }
s=$(date +%s); u0=$(uptime)
$M convert --hf-path $src --mlx-path $W/$n "$@" > $D/conv_$n.log 2>&1
rc=$?
echo "$n ($src $*; env GRID=${MLX_TRELLIS_GRID:-} DAMP=${MLX_TRELLIS_DAMP:-}; $M): rc $rc, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> $D/times.txt
exit $rc
