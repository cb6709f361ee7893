#!/bin/bash
# The kernel micro-bench (mlx-core/examples/trellis_matvec, release, best of 200 runs a shape)
# at SmolLM2-135M's shapes, trellis-3 L 8 blocks of 32, int16 inputs: the 1mad code (its int16
# kernel rows_lut16) and the 1mad8 code (the int8 kernel rows_lut8) interleaved, each beside
# the affine-4 kernel in the same run. usage: [TH=1] kernel.sh ROUNDS > kernel.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
B=${B:-/tmp/trellis/tm_new}; TH=${TH:-1}
for round in $(seq 1 ${1:-3}); do
  for code in 1mad 1mad8; do
    echo "== round $round code $code threads $TH; $(uptime | sed 's/.*load/load/')"
    $B 8 $TH 32 int16 $code
  done
done
