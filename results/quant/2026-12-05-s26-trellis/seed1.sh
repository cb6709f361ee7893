#!/bin/bash
# The refit row with a second incoherence seed (--q-seed 1): how far the seed alone moves it.
cd $(dirname $0)
export M=${M:-/tmp/trellis-s26/mlx-new}
./conv.sh smol-t3-l8-g32-refit-seed1 /work/trellis-models/smol-f16 -q --q-mode trellis --q-group-size 32 --q-trellis-l 8 --q-bits 3 \
  --q-hessians /tmp/trellis-work/hess_genesis.safetensors --q-seed 1 && ./ppl.sh smol-t3-l8-g32-refit-seed1
