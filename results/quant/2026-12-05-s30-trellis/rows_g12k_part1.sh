#!/bin/bash
cd /work/wt-trellis/results/quant/2026-12-05-s30-trellis
source /work/oracle-venv/bin/activate
(time python /work/wt-trellis/xtask/quant/trellis_hessians_np.py /work/trellis-models/smol-f32 /work/wt-trellis/mlx-engine/tests/fixtures/genesis_kjv.txt,/tmp/trellis/calib_80days.txt /tmp/trellis/hess_gen12k.safetensors --max-tokens 12288) > hess_gen12k.log 2>&1 || exit 1
M=/work/s29-mlx ./run1.sh t3-s1-g12k -- -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 --q-hessians /tmp/trellis/hess_gen12k.safetensors --q-seed 1
echo "chainC done $(date -u +%H:%M)" >> /tmp/trellis/chain.log
