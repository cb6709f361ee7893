#!/bin/bash
# runs after stream 1 (pid $1): the g32 row, then the L8 LDLQ control
cd /tmp/trellis-work
while kill -0 $1 2>/dev/null; do sleep 10; done
./conv.sh t3-l12-ldlq-g32 -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 12 --q-hessians /tmp/trellis-work/hess_genesis.safetensors && ./ppl.sh t3-l12-ldlq-g32
