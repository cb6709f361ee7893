#!/bin/bash
# s35 trelq: swap experiments. usage: swaps.sh BASE DONOR NAME=SELECT...
# For each NAME=SELECT: swap.py BASE DONOR -> /work/trelq-data/models/NAME (BASE with the
# linears SELECT picks taken from DONOR, with their own quantization entries), then ppl.sh NAME
# (4,096 Exodus tokens). Log: chain.log.
cd $(dirname $0)
W=/work/trelq-data/models; b=$1; d=$2; shift 2
for nv in "$@"; do
  n=${nv%%=*}; sel=${nv#*=}
  [ -d $W/$n ] || /work/oracle-venv/bin/python swap.py $W/$b $W/$d $W/$n "$sel" >> swap.log 2>&1
  ./ppl.sh $n; echo "$n ($b + $d at $sel) ppl rc $? $(date -u +%H:%M)" >> chain.log
done
