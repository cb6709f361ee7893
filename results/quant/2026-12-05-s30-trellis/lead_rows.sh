#!/bin/bash
# Session 30's rows for an idle machine (the s29 protocol: trellis-3, L 8, blocks of 32, 1MAD,
# `mlx convert` then `ppl.sh`: KJV Exodus 1-16, 8 x 512 tokens, /work/s28-mlx as s29's evaluator).
# usage: M=<release mlx with h17-trellis merged> W=/tmp/trellis ./lead_rows.sh
# Idle estimates: Hessian <= 15 CPU-min (~8 min wall), each row ~2.5 min convert + 1 min ppl.
cd $(dirname $0)
export M=${M:?the merged release mlx (MLX_TRELLIS_SCALE needs h17-trellis)} W=${W:-/tmp/trellis}
T3="-q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8"
G=/work/trellis-models/hess_genesis.safetensors
H80=$W/hess_gen80d.safetensors
X=$(cd ../../../xtask/quant && pwd)
# 1. The 36k-token Hessian (Genesis + Around the World in 80 Days; calib_80days.txt = lines
#    21-8047 of esaxx-rs-0.1.10/data/eighty.txt in the cargo registry, as in s29's README), by
#    the numpy forward (trellis_hessians_np.py; the MLX one needs over an hour of CPU).
[ -s $H80 ] || /work/oracle-venv/bin/python $X/trellis_hessians_np.py /work/trellis-models/smol-f32 \
  $X/../../mlx-engine/tests/fixtures/genesis_kjv.txt,$W/calib_80days.txt $H80 \
  --max-tokens 36271 > hess_gen80d_lead.log 2>&1
# 2. Three seeds with it, default encoder (README section 1 predicts the gain is here).
for s in 0 1 2; do ./run1.sh t3-s$s-g80 -- $T3 --q-hessians $H80 --q-seed $s; done
# 3. Unbiased row scales (README section 2: seed 1 set after coding was worse), for completeness.
for s in 0 2; do ./run1.sh t3-s$s-unb MLX_TRELLIS_SCALE=unbiased -- $T3 --q-hessians $G --q-seed $s; done
python3 table.py > table.md
