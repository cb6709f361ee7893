#!/bin/bash
# Real-layer proxy with LDLQ: SmolLM2-135M layer 20's seven linears (f16 weights from
# /work/trellis-models/smol-f16, s30's Hessians hess_gen80d), 3 bits, L 12, blocks of 64, one
# thread: trellis_mse --hessians prints per matrix the weight error and the output error
# tr(dW H dW^T)/tr(W H W^T) for affine g64, plain trellis and trellis with LDLQ (incoherence seed 17).
# The pairs file: /tmp/trelidx/pairs_l20.safetensors (PAIRS=l5: pairs_l5, layer 5's; files
# hess_<PAIRS>_<code>.txt): <path>.weight (f32, from smol-f16's model.safetensors) and
# <path>.hessian (f32, from hess_gen80d.safetensors) of the layer's seven linears, written with
# safetensors.numpy.save_file from /work/oracle-venv. usage: [PAIRS=l5] hess.sh CODE...
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
for c in "$@"; do
  TRELLIS_MSE_CODE=$c nice -n 5 /tmp/trelidx/trellis_mse --l 12 --bits 3 --threads 1 --hessians /tmp/trelidx/pairs_${PAIRS:-l20}.safetensors > hess_${PAIRS:-l20}_$c.txt 2>&1
done
