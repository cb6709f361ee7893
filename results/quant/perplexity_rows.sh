#!/bin/bash
# The perplexity rows, three at a time (same tokens every row: Exodus 1-16, 8 x 256, seed 123).
# Affine rows run dequantized (-d: the same weight values as float32; MLX's CPU quantized matmul
# is ~10x slower than its float32 matmul, too slow for this machine's share of two cores).
cd /tmp/tw
M=/tmp/tw/mlx-bin
export LD_LIBRARY_PATH=/work/tgt-trellis/debug/mlx-runtime/mlx-cpu-0.32.4/wheel/mlx/lib
D=/work/wt-trellis/results/quant/exodus_kjv_1-16.txt
PPL="--data-path $D --num-samples 8 --sequence-length 256 --batch-size 4 --seed 123 --json"
for r in affine4 affine3 mixed_2_6; do
  [ -d ${r}_d ] || $M convert --hf-path $r --mlx-path ${r}_d -d > conv_${r}_d.log 2>&1
done
one() {
  while [ ! -f $1/config.json ]; do sleep 10; done
  s=$(date +%s)
  $M perplexity --model $1 $PPL > y_$1.json 2> y_$1.err
  echo "$1 ppl seconds $(( $(date +%s) - s )) load $(cat /proc/loadavg)" >> ppl_times.txt
}
(one affine4_d; one trellis4) &
(one affine3_d; one trellis3) &
(one mixed_2_6_d; one trellis2) &
wait
