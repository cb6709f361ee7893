#!/bin/bash
# s32, what ran at 19:16 (after chain.sh / chain2.sh were stopped: at load 450-660 their
# 2,048-token runs with OpenBLAS's 2 threads spent 5.5x the CPU of one thread and could not
# finish by the deadline): the rule on 1,024 held-out tokens (2 x 512), one BLAS thread,
# three starts in parallel (candidate order 0,1,2 / 1,2,0 / 2,0,1: the first candidate is the
# later groups' seed while choosing), then each model's perplexity on 4,096 and 16,384 tokens.
cd $(dirname $0)
source /work/oracle-venv/bin/activate
export OPENBLAS_NUM_THREADS=1
W=/tmp/trellis; F32=/work/trellis-models/smol-f32; HT=/tmp/trellis/heldout_80days.txt
G="--tokens 1024 --groups 6 --later first"
run() {
  n=$1; shift
  [ -d $W/t3-$n-g80 ] || python greedy_select.py $F32 $HT $W/t3-$n-g80 greedy_$n.json $(for s in "$@"; do echo $W/t3-s$s-g80; done) $G > greedy_$n.log 2>&1
  ./ppl.sh t3-$n-g80; ./ppl.sh t3-$n-g80 32
}
run gr012 0 1 2 & run gr120 1 2 0 & run gr201 2 0 1 &
wait
