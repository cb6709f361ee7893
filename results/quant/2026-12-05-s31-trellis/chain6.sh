#!/bin/bash
# s31 chain 6: the controls of the choice among seeds 0-2 (4,096 tokens): the worst held-out
# error per linear (t3-selmax0-g80) and a seeded random pick (t3-selrnd0-g80).
cd $(dirname $0)
source /work/oracle-venv/bin/activate
for r in max rnd; do
  n=t3-sel${r}0-g80; rule=$r; [ $r = rnd ] && rule=random
  [ -d /tmp/trellis/$n ] || python select_subset.py select_sel0.json /tmp/trellis/$n 0,1,2 $rule > select_$n.log 2>&1
  (./ppl.sh $n; echo "$n 4k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log) &
done
wait
