#!/bin/bash
# s31 chain 2: per-layer seed choice among the s30 seeds 0, 1, 2 (36k LDLQ Hessian) by the
# held-out Hessian, scored on 4,096 and 16,384 eval tokens; then the 16,384-token figures of
# affine-4 and the three single-seed models.
cd $(dirname $0)
source /work/oracle-venv/bin/activate
while [ ! -f /tmp/trellis/hess_ho80d.safetensors ]; do sleep 10; done; sleep 5
[ -d /tmp/trellis/t3-sel0-g80 ] || python select_seeds.py /work/trellis-models/smol-f32 /tmp/trellis/hess_ho80d.safetensors /tmp/trellis/t3-sel0-g80 select_sel0.json /tmp/trellis/t3-s0-g80 /tmp/trellis/t3-s1-g80 /tmp/trellis/t3-s2-g80 > select_sel0.log 2>&1
./ppl.sh t3-sel0-g80
echo "sel0 4k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log
for m in t3-sel0-g80 /work/trellis-models/smol-a4 t3-s1-g80 t3-s0-g80 t3-s2-g80; do ./ppl.sh $m 32; echo "$m 16k done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log; done
