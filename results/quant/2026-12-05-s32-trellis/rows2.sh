#!/bin/bash
# s32 step 3 (s31's unrun rows), started 19:37 with main's release binary (/work/s31-mlx) for
# the conversions and s29's evaluator (ppl.sh: /work/s28-mlx; DEC=mlx for the affine-2/3
# models, which the CPU decoder refuses): trellis-2 (s30's recipe, seed 0), affine-2
# mixed_2_6 and affine-3 g64 on 4,096 Exodus tokens; 16,384 where time allowed.
cd $(dirname $0)
F16=/work/trellis-models/smol-f16; HL=/work/trellis-models/s30/hess_gen80d.safetensors
export M=/work/s31-mlx
(./conv.sh smol-a2mix $F16 -q --quant-predicate mixed_2_6 && M=/work/s28-mlx DEC=mlx ./ppl.sh smol-a2mix) &
(./conv.sh smol-a3 $F16 -q --q-bits 3 --q-group-size 64 && M=/work/s28-mlx DEC=mlx ./ppl.sh smol-a3) &
(./conv.sh t2-s0-g80 $F16 -q --q-mode trellis --q-bits 2 --q-group-size 32 --q-trellis-l 8 --q-hessians $HL --q-seed 0 && M=/work/s28-mlx ./ppl.sh t2-s0-g80) &
wait
