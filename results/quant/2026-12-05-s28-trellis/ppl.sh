#!/bin/bash
# usage: ppl.sh NAME [NUM_SAMPLES]: mlx perplexity --decoder cpu on KJV Exodus 1-16, 8 x 512 tokens
# (the same tokens and protocol as ../2026-12-05-s26-trellis/ppl.sh), logs wall time + uptime to ppl_times.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/tmp/trellis/mlx-new}
W=${W:-/work/trellis-models}
D=$(cd $(dirname $0) && pwd)
n=$1; ns=${2:-8}
m=$W/$n; [ -d $m ] || m=$n
[ -s $D/ppl_$(basename $n).json ] && { echo "ppl $n exists"; exit 0; }
s=$(date +%s); u0=$(uptime)
$M perplexity --model $m --data-path $D/../exodus_kjv_1-16.txt --sequence-length 512 \
    --num-samples $ns --batch-size 8 --seed 123 --json --decoder cpu > $D/ppl_$(basename $n).json 2> $D/ppl_$(basename $n).log
echo "ppl $n ($ns x 512): rc $?, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> $D/ppl_times.txt
