#!/bin/bash
# usage: rerun_ppl.sh ROW... in the directory rerun_rows.sh fills; M: a release mlx. Each row on the same 8 x 512 tokens of KJV Exodus 1-16.
R=$(cd "$(dirname "$0")" && pwd)

PPL="--data-path $R/exodus_kjv_1-16.txt --sequence-length 512 --num-samples 8 --batch-size 8 --seed 123 --json"
for r in "$@"; do
  [ -s ppl_$r.json ] && continue
  s=$(date +%s)
  $M perplexity --model $r $PPL > ppl_$r.json 2> ppl_$r.err
  echo "$r ppl: $(( $(date +%s) - s )) s, load $(cut -d' ' -f1 /proc/loadavg)" >> times.txt
done
