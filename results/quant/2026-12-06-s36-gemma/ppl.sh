#!/bin/bash
# s36 (models under /work/gemma-data, binary /work/s35-mlx): s35 trelq's ppl.sh unchanged otherwise.
# models under /tmp/trelidx (else /tmp/trelcpu), data from ../exodus_kjv_1-16.txt as before.
# usage: ppl.sh NAME [NUM_SAMPLES]: s29's ppl.sh (mlx perplexity --decoder cpu on KJV Exodus 1-16,
# NUM_SAMPLES x 512 tokens, seed 123, /work/s28-mlx) unchanged, except that a run of other than
# 8 samples writes ppl<NUM_SAMPLES>_NAME.json (8 samples = the 4,096-token figures of s26-s30),
# and DEC=mlx runs the exact path (affine-3: the CPU decoder refuses 3-bit affine).
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=${M:-/work/s35-mlx}
W=${W:-/work/gemma-data}
D=$(cd $(dirname $0) && pwd)
n=$1; ns=${2:-8}
m=$W/$n; [ -d $m ] || m=/tmp/trelcpu/$n; [ -d $m ] || m=$n
tag=ppl; [ $ns = 8 ] || tag=ppl$ns
out=$D/${tag}_$(basename $n).json
grep -q "\"perplexity\"" $out 2>/dev/null && { echo "$out exists"; exit 0; }
s=$(date +%s); u0=$(uptime)
$M perplexity --model $m --data-path $D/../exodus_kjv_1-16.txt --sequence-length 512 \
    --num-samples $ns --batch-size 8 --seed 123 --json --decoder ${DEC:-cpu} > $out 2> ${out%.json}.log
echo "ppl $n ($ns x 512): rc $?, $(( $(date +%s) - s )) s wall; uptime before: $u0; after: $(uptime)" >> $D/times.txt
