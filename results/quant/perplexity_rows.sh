#!/bin/bash
# The perplexity rows as run for README.md: every row on the same tokens (KJV Exodus 1-16,
# 3 x 256, seed 123), all rows at once. The affine rows run dequantized (`-d`: the same weight
# values as float32), since MLX's CPU quantized matmul was too slow on this machine's share of
# two cores. Run in the directory convert_rows.sh filled; M is a built `mlx`.
M=${M:-mlx}
D=$(dirname "$0")/exodus_kjv_1-16.txt
PPL="--data-path $D --num-samples 3 --sequence-length 256 --batch-size 3 --seed 123 --json"
for r in affine4 affine3 mixed_2_6; do
  [ -d ${r}_d ] || $M convert --hf-path $r --mlx-path ${r}_d -d > conv_${r}_d.log 2>&1
done
for r in f32 affine4_d affine3_d mixed_2_6_d trellis4 trellis3 trellis2; do
  $M perplexity --model $r $PPL > y_$r.json 2> y_$r.err &
done
wait
