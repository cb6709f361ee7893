#!/bin/bash
# usage: conv.sh NAME ARGS...  (converts smol-f16 with the given args; logs time + uptime)
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/work/s24-mlx-merged}
n=$1; shift
s=$(date +%s); u0=$(uptime)
chrt -i 0 nice -n 19 $M convert --hf-path /work/trellis-models/smol-f16 --mlx-path /tmp/trellis-work/$n "$@" > conv_$n.log 2>&1
rc=$?
echo "$n ($*): rc $rc, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> conv_times.txt
