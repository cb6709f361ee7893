#!/bin/bash
# usage: run1.sh NAME [VAR=VAL ...] -- CONVERT ARGS: convert then score one model (conv.sh + ppl.sh)
cd $(dirname $0)
n=$1; shift
while [ "$1" != "--" ]; do export "$1"; shift; done; shift
./conv.sh $n /work/trellis-models/smol-f16 "$@" && ./ppl.sh $n
