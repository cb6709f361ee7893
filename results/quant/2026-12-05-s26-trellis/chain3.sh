#!/bin/bash
# The trellis rows at the chosen setting (L 8, blocks of 32, LDLQ with the row scales refitted: this
# branch's release `mlx`, M), SmolLM2 and Gemma 3 270M, most wanted first; then the float16 rows.
cd $(dirname $0)
export M=${M:-/tmp/trellis-s26/mlx-new}
S=/work/trellis-models/smol-f16; HS=/tmp/trellis-work/hess_genesis.safetensors
G=/tmp/trellis-s26/gemma-f16; HG=/tmp/trellis-s26/hess_gemma_genesis.safetensors
T="-q --q-mode trellis --q-group-size 32 --q-trellis-l 8"
./conv.sh smol-t3-l8-g32-refit $S $T --q-bits 3 --q-hessians $HS && ./ppl.sh smol-t3-l8-g32-refit
./conv.sh gemma-t3-l8-g32-refit $G $T --q-bits 3 --q-hessians $HG && ./ppl.sh gemma-t3-l8-g32-refit
./conv.sh smol-t2-l8-g32-refit $S $T --q-bits 2 --q-hessians $HS && ./ppl.sh smol-t2-l8-g32-refit
./ppl.sh $S
./conv.sh smol-t4-l8-g32-refit $S $T --q-bits 4 --q-hessians $HS && ./ppl.sh smol-t4-l8-g32-refit
./ppl.sh $G
./conv.sh gemma-t2-l8-g32-refit $G $T --q-bits 2 --q-hessians $HG && ./ppl.sh gemma-t2-l8-g32-refit
./conv.sh gemma-t4-l8-g32-refit $G $T --q-bits 4 --q-hessians $HG && ./ppl.sh gemma-t4-l8-g32-refit
