#!/bin/bash
# s33 sbox: seed 2 of trellis-3 1mad8s L 12, after chain.sh (pid $1) ends.
D=$(cd $(dirname $0) && pwd)
H="--q-hessians /work/trellis-models/s30/hess_gen80d.safetensors"
S=/work/trellis-models/smol-f16
while kill -0 $1 2>/dev/null; do sleep 5; done
nice -n 5 $D/conv.sh s12-s2 $S -q --q-mode trellis --q-bits 3 --q-trellis-code 1mad8s --q-trellis-l 12 $H --q-seed 2 && nice -n 5 $D/ppl.sh s12-s2
