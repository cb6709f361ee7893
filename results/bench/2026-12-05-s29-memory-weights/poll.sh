#!/bin/bash
# poll.sh BIN MODEL: RssAnon/RssFile timeline (every 20 ms) of mlx generate in the bench's shape
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
IDS=$(seq -s, 1 512)
$1 generate --model $2 --prompt-ids $IDS --max-tokens 128 --temp 0 --json --threads 2 > /tmp/cpumem/poll.out 2>/dev/null &
p=$!
t0=$(date +%s.%N)
while kill -0 $p 2>/dev/null; do
  echo "$(echo "$(date +%s.%N) - $t0" | bc) $(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} /^VmHWM/{h=$2} END{print a+0, f+0, h+0}' /proc/$p/status 2>/dev/null)"
  sleep 0.02
done
