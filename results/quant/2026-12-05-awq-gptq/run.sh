#!/bin/bash
# AWQ and GPTQ against plain affine 4-bit on SmolLM2-135M-Instruct (its Q4_1 GGUF dequantized
# to float32), as run for README.md. Calibration text: docs/ARCHITECTURE.md of this repository
# (no overlap with the evaluation text); evaluation: KJV Exodus 1-16 (../exodus_kjv_1-16.txt),
# 8 x 256 tokens, seed 123, every row on the same tokens, each model dequantized (`-d`: the same
# weight values in float32) and scored by the CPU decoder (`--decoder cpu`, L3). Run from an
# empty work directory W; M is a built `mlx`, G the GGUF file.
set -e
M=${M:-mlx}
G=${G:-SmolLM2-135M-Instruct.Q4_1.gguf}
R=$(cd "$(dirname "$0")/../../.." && pwd)
CAL=$R/docs/ARCHITECTURE.md
EVAL=$R/results/quant/exodus_kjv_1-16.txt
Q="--data-path $CAL --num-samples ${NS:-16} --sequence-length 256 --seed 123"
[ -d f32 ] || $M convert --hf-path $G --mlx-path f32 --dtype float32 > conv_f32.log 2>&1
[ -d affine4 ] || { /usr/bin/time -v $M convert --hf-path f32 --mlx-path affine4 -q > conv_affine4.log 2>&1; }
[ -d gptq4 ] || { /usr/bin/time -v $M quant gptq --model f32 --mlx-path gptq4 --bits 4 --group-size 64 $Q > q_gptq4.log 2>&1; }
[ -d awq4 ] || { /usr/bin/time -v $M quant awq --model f32 --mlx-path awq4 --bits 4 --group-size 64 $Q > q_awq4.log 2>&1; }
for r in affine4 gptq4 awq4; do
  [ -d ${r}_d ] || $M convert --hf-path $r --mlx-path ${r}_d -d > conv_${r}_d.log 2>&1
done
PPL="--data-path $EVAL --num-samples 8 --sequence-length 256 --batch-size 8 --seed 123 --decoder cpu --json"
for r in f32 affine4_d gptq4_d awq4_d; do
  echo "load: $(cat /proc/loadavg)" > ppl_$r.err
  $M perplexity --model $r $PPL > ppl_$r.json 2>> ppl_$r.err
done
