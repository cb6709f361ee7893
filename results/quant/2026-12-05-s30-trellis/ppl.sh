#!/bin/bash
# usage: ppl.sh NAME [NUM_SAMPLES]: mlx perplexity --decoder cpu on KJV Exodus 1-16, 8 x 512 tokens
# (the same tokens and protocol as ../2026-12-05-s26-trellis/ppl.sh and s29's), logs wall time + uptime to times.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
P=${P:-/work/s28-mlx}  # the evaluator of the s29 rows
W=${W:-/tmp/trellis}
D=$(cd $(dirname $0) && pwd)
n=$1; ns=${2:-8}
m=$W/$n; [ -d $m ] || m=$n
grep -q "\"perplexity\"" $D/ppl_$(basename $n).json 2>/dev/null && { echo "ppl $n exists"; exit 0; }
s=$(date +%s); u0=$(uptime)
$P perplexity --model $m --data-path $D/../exodus_kjv_1-16.txt --sequence-length 512 \
    --num-samples $ns --batch-size 8 --seed 123 --json --decoder cpu > $D/ppl_$(basename $n).json 2> $D/ppl_$(basename $n).log
echo "ppl $n ($ns x 512): rc $?, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> $D/times.txt
