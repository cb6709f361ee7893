#!/bin/bash
# s32: three (then six) more single-seed trellis-3 encodes, exactly s30's t3-s{0,1,2}-g80 recipe
# (/work/s29-mlx, 1mad, L 8, blocks of 32, LDLQ with s30's Genesis + 80 Days Hessian), seeds $@.
cd $(dirname $0)
HL=/work/trellis-models/s30/hess_gen80d.safetensors
for s in "$@"; do
  ./conv.sh t3-s$s-g80 /work/trellis-models/smol-f16 -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 --q-hessians $HL --q-seed $s
done
