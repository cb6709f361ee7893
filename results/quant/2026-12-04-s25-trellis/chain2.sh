#!/bin/bash
cd /tmp/trellis-work
while kill -0 $1 2>/dev/null; do sleep 5; done
./conv.sh t3-l12-ldlq-g32-uly -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 12 --q-hessians /tmp/trellis-work/hess_gen_uly.safetensors && ./ppl.sh t3-l12-ldlq-g32-uly
