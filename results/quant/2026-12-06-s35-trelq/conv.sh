#!/bin/bash
# s35 trelq: s34 trelidx's conv.sh (s33 trelqual's (s32-trellis-cpu's, s31's) with this branch's release binary (a copy: /work/trelq-data/mlx) and models under /work/trelq-data/models. usage: conv.sh NAME SRC ARGS...  (mlx convert SRC -> $W/NAME; logs wall time + uptime to times.txt)
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/work/trelq-data/mlx}
W=${W:-/work/trelq-data/models}
D=$(cd $(dirname $0) && pwd)
n=$1; src=$2; shift 2
[ -d $W/$n ] && { echo "$n exists"; exit 0; }
s=$(date +%s); u0=$(uptime)
$M convert --hf-path $src --mlx-path $W/$n "$@" > $D/conv_$n.log 2>&1
rc=$?
echo "$n ($src $*; env GRID=${MLX_TRELLIS_GRID:-} DAMP=${MLX_TRELLIS_DAMP:-}; $M): rc $rc, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> $D/times.txt
exit $rc
