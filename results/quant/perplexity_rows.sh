#!/bin/bash
# Perplexity of every row on the same tokens (KJV Exodus 1-16, public domain).
cd /tmp/tw
M=/tmp/tw/mlx-bin
export LD_LIBRARY_PATH=/work/tgt-trellis/debug/mlx-runtime/mlx-cpu-0.32.4/wheel/mlx/lib
D=/work/wt-trellis/results/quant/exodus_kjv_1-16.txt
PPL="--data-path $D --num-samples 8 --sequence-length 256 --batch-size 4 --seed 123 --json"
for row in f32 affine4 affine3 mixed_2_6 trellis3 trellis2 trellis4; do
  while [ ! -f $row/config.json ]; do sleep 20; done
  s=$(date +%s)
  [ -s y_$row.json ] || $M perplexity --model $row $PPL > y_$row.json 2> y_$row.err
  echo "$row ppl seconds $(( $(date +%s) - s )) load $(cat /proc/loadavg)" >> ppl_times.txt
done
