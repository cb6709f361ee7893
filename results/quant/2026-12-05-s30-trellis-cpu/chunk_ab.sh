#!/bin/bash
# Rows a work item of the decoder's trellis products (`matmul_jobs`' CHUNK) A/B in one binary
# (trellis_matvec built with a temporary TRELCPU_CHUNK switch, not committed): the decoder's
# whole product ("decoder's whole product", `matmul_t` on TH threads) at SmolLM2-135M's shapes,
# 1mad8, beside affine-4 in the same process; rounds rotate the order.
# usage: TH=2 chunk_ab.sh ROUNDS > chunk_ab.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
B=${B:-/tmp/trelcpu/tm_chunk}; TH=${TH:-2}
V=(16 32 64)
for round in $(seq 1 ${1:-3}); do
  for j in 0 1 2; do
    c=${V[$(( (j + round) % 3 ))]}
    echo "== round $round chunk $c threads $TH; $(uptime | sed 's/.*load/load/')"
    TRELCPU_CHUNK=$c $B 8 $TH 32 int16 1mad8 | grep -E "one token"
  done
done
