#!/bin/bash
# s31: every row of this folder's table, for an idle machine (skips what exists; ~60-70 min idle).
# NEW=the mlx binary of h18-trellis (release; has --q-select-hessians / --q-seed-candidates).
#   1. the held-out Hessian: 80 Days from token 47,466 on (heldout_80days.txt, made by
#      make_heldout.py), 16,384 tokens; disjoint from the LDLQ Hessian's Genesis + 80 Days
#      tokens 0-32,767 (/work/trellis-models/s30/hess_gen80d.safetensors) and from Exodus.
#   2. the 16,384-token figures of affine-4, affine-3 and the s30 seeds 0-2 (4,096: s30's).
#   3. the seed choice among seeds 0-2 assembled in numpy (select_seeds.py, t3-sel0-g80) and
#      the same rule run by `mlx convert` (t3-cvsel0-g80: must equal it but for near-ties),
#      then base seeds 3 and 6 (candidates 3-5, 6-8) by `mlx convert` only.
set -x
cd $(dirname $0)
source /work/oracle-venv/bin/activate
NEW=${NEW:-/work/tgt-trellis/release/mlx}
F32=/work/trellis-models/smol-f32; F16=/work/trellis-models/smol-f16
HL=/work/trellis-models/s30/hess_gen80d.safetensors; HO=/tmp/trellis/hess_ho80d.safetensors
[ -f /tmp/trellis/heldout_80days.txt ] || python make_heldout.py
[ -f $HO ] || (time python /work/wt-trellis/xtask/quant/trellis_hessians_np.py $F32 /tmp/trellis/heldout_80days.txt $HO --max-tokens 16384) > hess_ho80d.log 2>&1
for m in /work/trellis-models/smol-a4 t3-s0-g80 t3-s1-g80 t3-s2-g80; do ./ppl.sh $m 32; done
M=$NEW ./conv.sh smol-a3 $F16 -q --q-bits 3 --q-group-size 64 && DEC=mlx ./ppl.sh smol-a3 && DEC=mlx ./ppl.sh smol-a3 32
[ -d /tmp/trellis/t3-sel0-g80 ] || python select_seeds.py $F32 $HO /tmp/trellis/t3-sel0-g80 select_sel0.json /tmp/trellis/t3-s0-g80 /tmp/trellis/t3-s1-g80 /tmp/trellis/t3-s2-g80 > select_sel0.log 2>&1
./ppl.sh t3-sel0-g80 && ./ppl.sh t3-sel0-g80 32
for b in 0 3 6; do
  M=$NEW ./conv.sh t3-cvsel$b-g80 $F16 -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 \
      --q-hessians $HL --q-select-hessians $HO --q-seed-candidates 3 --q-seed $b && ./ppl.sh t3-cvsel$b-g80 && ./ppl.sh t3-cvsel$b-g80 32
done
python compare_models.py /tmp/trellis/t3-sel0-g80 /tmp/trellis/t3-cvsel0-g80 > compare_sel0.txt
python table.py > table.md
