#!/bin/bash
# The rows this session could not finish (load 200-640 on 2 cores), in priority order, for an idle
# machine: each is `mlx convert` (trellis-3, L 8, blocks of 32, 1MAD, Genesis Hessians, one knob)
# then `mlx perplexity` on the s26-s28 protocol (ppl.sh). Rows already done here are skipped
# (run1.sh skips a model dir that exists and a ppl json that has its figure). ~5 + 8 min a row idle.
# usage: M=<release mlx, default /work/s28-mlx> W=<models dir, default /tmp/trellis> ./lead_rows.sh
cd $(dirname $0)
T3="-q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8"
G=/work/trellis-models/hess_genesis.safetensors
# the default encoder's third seed (seeds 0 and 1 are s27's and s28's rows)
./run1.sh t3-s2-base -- $T3 --q-hessians $G --q-seed 2
# more calibration (README section 4 makes /tmp/trellis/hess_gen80d.safetensors)
H80=/tmp/trellis/hess_gen80d.safetensors
[ -s $H80 ] && for s in 0 1 2; do ./run1.sh t3-s$s-g80 -- $T3 --q-hessians $H80 --q-seed $s; done
for s in 0 2; do
  ./run1.sh t3-s$s-damp001 MLX_TRELLIS_DAMP=0.001 -- $T3 --q-hessians $G --q-seed $s
  ./run1.sh t3-s$s-act MLX_TRELLIS_ORDER=act -- $T3 --q-hessians $G --q-seed $s
done
python3 table.py > table.md
