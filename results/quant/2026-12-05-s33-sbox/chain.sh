#!/bin/bash
# s33 sbox: the 1mad8s conversions and their 4,096-token perplexities, one job at a time, nice -n 5.
D=$(cd $(dirname $0) && pwd)
H="--q-hessians /work/trellis-models/s30/hess_gen80d.safetensors"
S=/work/trellis-models/smol-f16
nice -n 5 $D/conv.sh t2s-s0 $S -q --q-mode trellis --q-bits 2 --q-trellis-code 1mad8s --q-trellis-l 12 $H --q-seed 0 && nice -n 5 $D/ppl.sh t2s-s0
nice -n 5 $D/conv.sh s12-s0 $S -q --q-mode trellis --q-bits 3 --q-trellis-code 1mad8s --q-trellis-l 12 $H --q-seed 0 && nice -n 5 $D/ppl.sh s12-s0
nice -n 5 $D/conv.sh s12-s1 $S -q --q-mode trellis --q-bits 3 --q-trellis-code 1mad8s --q-trellis-l 12 $H --q-seed 1 && nice -n 5 $D/ppl.sh s12-s1
# queued at 23:19 (after s12-s0's result), run by chain2.sh once the above ends:
# nice -n 5 $D/conv.sh s12-s2 $S -q --q-mode trellis --q-bits 3 --q-trellis-code 1mad8s --q-trellis-l 12 $H --q-seed 2 && nice -n 5 $D/ppl.sh s12-s2
