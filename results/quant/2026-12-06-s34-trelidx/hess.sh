#!/bin/bash
# Real-layer proxy with LDLQ: SmolLM2-135M layer 20's seven linears (f16 weights from
# /work/trellis-models/smol-f16, s30's Hessians hess_gen80d), 3 bits, L 12, blocks of 64, one
# thread: trellis_mse --hessians prints per matrix the weight error and the output error
# tr(dW H dW^T)/tr(W H W^T) for affine g64, plain trellis and trellis with LDLQ (incoherence seed 17).
# The pairs file: /tmp/trelidx/pairs_l20.safetensors (<path>.weight f32 + <path>.hessian).
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
for c in "$@"; do
  TRELLIS_MSE_CODE=$c nice -n 5 /tmp/trelidx/trellis_mse --l 12 --bits 3 --threads 1 --hessians /tmp/trelidx/pairs_l20.safetensors > hess_l20_$c.txt 2>&1
done
