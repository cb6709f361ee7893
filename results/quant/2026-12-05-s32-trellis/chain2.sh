#!/bin/bash
# s32: the same rule from other starts (no encodes left in the time): candidates in the order
# 1,2,0 and 2,0,1 (the first candidate = the later groups' seed while choosing), each then
# evaluated on 4,096 and 16,384 Exodus tokens; run beside chain.sh's 0,1,2.
cd $(dirname $0)
source /work/oracle-venv/bin/activate
W=/tmp/trellis; F32=/work/trellis-models/smol-f32; HT=/tmp/trellis/heldout_80days.txt
G="--tokens 2048 --groups 6 --later first"
n=$1; shift
[ -d $W/t3-$n-g80 ] || python greedy_select.py $F32 $HT $W/t3-$n-g80 greedy_$n.json $(for s in "$@"; do echo $W/t3-s$s-g80; done) $G > greedy_$n.log 2>&1
./ppl.sh t3-$n-g80; ./ppl.sh t3-$n-g80 32
