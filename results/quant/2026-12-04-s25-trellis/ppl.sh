#!/bin/bash
# usage: ppl.sh NAME [NUM_SAMPLES]: mlx perplexity --decoder cpu on KJV Exodus 1-16 (the same tokens as s24), logs time + uptime
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/work/s24-mlx-merged}
n=$1; ns=${2:-8}
s=$(date +%s); u0=$(uptime)
chrt -i 0 nice -n 19 $M perplexity --model /tmp/trellis-work/$n --data-path /work/wt-trellis/results/quant/exodus_kjv_1-16.txt --sequence-length 512 \
    --num-samples $ns --batch-size 8 --seed 123 --json --decoder cpu > ppl_$n.json 2> ppl_$n.log
echo "ppl $n ($ns x 512): rc $?, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> ppl_times.txt
