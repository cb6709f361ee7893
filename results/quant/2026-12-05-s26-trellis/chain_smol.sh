#!/bin/bash
# The SmolLM2 rows (float16 base /work/trellis-models/smol-f16, the Genesis Hessians of ../2026-12-04-s25-trellis/hess_genesis)
cd $(dirname $0)
F=/work/trellis-models/smol-f16; H=/tmp/trellis-work/hess_genesis.safetensors
./conv.sh smol-t3-l10-g32 $F -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 10 --q-hessians $H && ./ppl.sh smol-t3-l10-g32
./conv.sh smol-a3 $F -q --q-bits 3 && ./ppl.sh smol-a3
./conv.sh smol-t2-l8-g32 $F -q --q-mode trellis --q-bits 2 --q-group-size 32 --q-trellis-l 8 --q-hessians $H && ./ppl.sh smol-t2-l8-g32
./conv.sh smol-mixed_2_6 $F -q --quant-predicate mixed_2_6 && ./ppl.sh smol-mixed_2_6
./conv.sh smol-t4-l8-g32 $F -q --q-mode trellis --q-bits 4 --q-group-size 32 --q-trellis-l 8 --q-hessians $H && ./ppl.sh smol-t4-l8-g32
./ppl.sh $F
