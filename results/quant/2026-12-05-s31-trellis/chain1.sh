#!/bin/bash
# s31 chain 1: the held-out Hessian (80 Days from token 47,466 on, 16,384 tokens; disjoint from the
# LDLQ Hessian's Genesis + 80 Days tokens 0-32,767), then trellis-3 seeds 3..8 with the s30 36k
# LDLQ Hessian (as t3-s{0,1,2}-g80 of s30), each scored on the 4,096-token eval.
cd $(dirname $0)
source /work/oracle-venv/bin/activate
[ -f /tmp/trellis/hess_ho80d.safetensors ] || (time python /work/wt-trellis/xtask/quant/trellis_hessians_np.py /work/trellis-models/smol-f32 /tmp/trellis/heldout_80days.txt /tmp/trellis/hess_ho80d.safetensors --max-tokens 16384) > hess_ho80d.log 2>&1
echo "hess done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log
for s in ${SEEDS:-3 4 5 6 7 8}; do
  ./conv.sh t3-s$s-g80 /work/trellis-models/smol-f16 -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 --q-hessians /work/trellis-models/s30/hess_gen80d.safetensors --q-seed $s && ./ppl.sh t3-s$s-g80
  echo "seed $s done $(date -u +%H:%M)" >> /tmp/trellis/chain31.log
done
