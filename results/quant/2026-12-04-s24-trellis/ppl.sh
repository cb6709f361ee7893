#!/bin/bash
# `mlx perplexity --decoder cpu` (L3 to the exact path) on 4,096 tokens of KJV Exodus 1-16,
# the same tokens for every row (as ../2026-12-04-session20/ppl.sh).
# usage: ppl.sh MODELS_DIR ROW...   (run in this folder; writes ppl_ROW.json, ppl_times.txt)
D=$1; shift
M=${M:-/work/tgt-trellis-rel/release/mlx}
for r in "$@"; do
  s=$(date +%s)
  $M perplexity --model $D/$r --data-path ../exodus_kjv_1-16.txt --sequence-length 512 \
    --num-samples 8 --batch-size 8 --seed 123 --json --decoder cpu > ppl_$r.json 2> ppl_$r.log
  echo "$r: $(( $(date +%s) - s )) s wall; uptime after: $(uptime)" >> ppl_times.txt
done
