#!/bin/bash
cd /work/wt-trellis/results/quant/2026-12-05-s30-trellis
# (ran after rows_g12k_part1.sh)
for s in 2 0; do
M=/work/s29-mlx ./run1.sh t3-s$s-g12k -- -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 --q-hessians /tmp/trellis/hess_gen12k.safetensors --q-seed $s
done
echo "chainD done $(date -u +%H:%M)" >> /tmp/trellis/chain.log
