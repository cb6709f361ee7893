#!/bin/bash
# s31 chain 3 (replaces chain2's tail; the machine ran at load 500-1200): the 16,384-token
# figures in parallel, then the seed choice's 4,096- and 16,384-token figures.
cd $(dirname $0)
for m in /work/trellis-models/smol-a4 t3-s1-g80 t3-s0-g80 t3-s2-g80; do (./ppl.sh $m 32; echo "$m 16k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log) & done
while [ ! -d /tmp/trellis/t3-sel0-g80 ]; do sleep 10; done
./ppl.sh t3-sel0-g80; echo "sel0 4k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log
./ppl.sh t3-sel0-g80 32; echo "sel0 16k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log
wait
