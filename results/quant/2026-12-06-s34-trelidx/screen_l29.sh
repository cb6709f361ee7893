#!/bin/bash
# Layer 29's attention inputs (k/q/v, the linears where gauss7s's LDLQ output error is above 1mad's):
# screening variants (screen.patch's experimental code, TRELLIS_MSE_EXP=INDEX:TABLE[:MULT[:STRETCH]],
# STRETCH = an extra factor on the outer sixteenths) through trellis_mse --hessians, 3 bits, L 12.
# Binary: screen3_trellis.patch + screen3_example.patch applied to this branch, the example built (/tmp/trelidx/trellis_mse_screen3).
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
for v in "$@"; do
  echo "== $v"
  TRELLIS_MSE_EXP=$v nice -n 5 /tmp/trelidx/trellis_mse_screen3 --l 12 --bits 3 --threads 1 --hessians /tmp/trelidx/pairs_l29att.safetensors 2>&1 | sed 's/(at the rows.*//; s/ (.*3 bits: affine g64 [0-9.\/]*, / /'
done
