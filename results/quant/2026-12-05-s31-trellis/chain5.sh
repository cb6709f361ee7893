#!/bin/bash
# s31 chain 5: the 16,384-token figures (32 x 512 Exodus tokens), two at a time.
cd $(dirname $0)
run() { ./ppl.sh $1 32; echo "$1 16k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log; }
(run /work/trellis-models/smol-a4; run t3-s1-g80; run t3-s2-g80) &
(run t3-sel0-g80; run t3-s0-g80; run t3-sel12-g80) &
wait
