#!/bin/bash
# s32-trellis-cpu conv.sh (s31's) with this branch's release binary (a copy: /tmp/trelqual/mlx) and models under /tmp/trelqual. usage: conv.sh NAME SRC ARGS...  (mlx convert SRC -> $W/NAME; logs wall time + uptime to times.txt)
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/tmp/trelqual/mlx}
W=${W:-/tmp/trelqual}
D=$(cd $(dirname $0) && pwd)
n=$1; src=$2; shift 2
[ -d $W/$n ] && { echo "$n exists"; exit 0; }
s=$(date +%s); u0=$(uptime)
$M convert --hf-path $src --mlx-path $W/$n "$@" > $D/conv_$n.log 2>&1
rc=$?
echo "$n ($src $*; $M): rc $rc, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> $D/times.txt
exit $rc
