#!/bin/bash
# s31 chain 4: the choice among two of the three seeds (from select_sel0.json's errors), each
# scored on the 4,096-token eval, in parallel (load 600-1500).
cd $(dirname $0)
source /work/oracle-venv/bin/activate
for s in 1,2 0,1 0,2; do
  n=t3-sel${s/,/}-g80
  [ -d /tmp/trellis/$n ] || python select_subset.py select_sel0.json /tmp/trellis/$n $s > select_$n.log 2>&1
  (./ppl.sh $n; echo "$n 4k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log) &
done
wait
