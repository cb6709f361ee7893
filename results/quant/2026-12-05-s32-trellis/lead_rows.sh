#!/bin/bash
# s32: what this session could not run (load 300-570 all afternoon), for an idle machine.
# NEW = an `mlx` binary (release, or a debug one: the encoder and MLX are optimized in both).
# Skips what exists.
#   1. (only with q-select-text.patch applied: the option was reverted, the rule did not hold)
#      the rule as users would run it: `mlx convert --q-select-text` on SmolLM2-135M, base seeds 0
#      and 3 (candidates 0-2, 3-5), s30's recipe otherwise; each ~3 encodes (~60 s each idle)
#      + 13 float32 forwards of 2,048 tokens (MLX's CPU matmul: slow here, minutes each);
#   2. their perplexity on 4,096 and 16,384 Exodus tokens (s29's evaluator, ppl.sh);
#   3. s31's left rows: trellis-2 against affine-2 mixed_2_6 and affine-3 g64, both texts.
set -x
cd $(dirname $0)
NEW=${NEW:-/work/tgt-trellis/release/mlx}
F16=/work/trellis-models/smol-f16
HL=/work/trellis-models/s30/hess_gen80d.safetensors; HT=/tmp/trellis/heldout_80days.txt
[ -f $HT ] || (source /work/oracle-venv/bin/activate && python ../2026-12-05-s31-trellis/make_heldout.py)
$NEW convert --help | grep -q q-select-text && for b in 0 3; do
  M=$NEW ./conv.sh t3-cvtext$b-g80 $F16 -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 \
      --q-hessians $HL --q-select-text $HT --q-seed $b && ./ppl.sh t3-cvtext$b-g80 && ./ppl.sh t3-cvtext$b-g80 32
done
for n in t3-gr012-g80 t3-gr120-g80 t3-gr201-g80 t3-rnd012-g80; do ./ppl.sh $n 32; done
M=$NEW ./conv.sh smol-a3 $F16 -q --q-bits 3 --q-group-size 64 && DEC=mlx ./ppl.sh smol-a3 && DEC=mlx ./ppl.sh smol-a3 32
M=$NEW ./conv.sh smol-a2mix $F16 -q --quant-predicate mixed_2_6 && DEC=mlx ./ppl.sh smol-a2mix && DEC=mlx ./ppl.sh smol-a2mix 32
M=$NEW ./conv.sh t2-s0-g80 $F16 -q --q-mode trellis --q-bits 2 --q-group-size 32 --q-trellis-l 8 --q-hessians $HL --q-seed 0 \
  && ./ppl.sh t2-s0-g80 && ./ppl.sh t2-s0-g80 32
python3 table.py > table.md
