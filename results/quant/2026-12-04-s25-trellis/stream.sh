#!/bin/bash
# usage: stream.sh NAME CONVERT_ARGS... : waits for the Hessians, converts, scores
cd /tmp/trellis-work
while [ ! -s hess_genesis.safetensors ] || pgrep -f "trellis_hessians.py" >/dev/null; do sleep 10; done
n=$1; shift
./conv.sh $n "$@" && ./ppl.sh $n
