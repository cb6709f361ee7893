#!/bin/bash
# Kernel A/B in one binary (mlx-core/examples/trellis_matvec built at the measuring commit,
# which still had the switches TRELCPU_OLD = s29's rows_lut8 and TRELCPU_NOPAIR = the new
# loop without the two-step plan), SmolLM2-135M's shapes, trellis-3 L 8 blocks of 32, 1mad8,
# int16 inputs, one thread; each beside the affine-4 kernel in the same process. Rounds
# interleave the variants in a rotated order. usage: kernel_ab.sh ROUNDS > kernel_ab.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
B=${B:-/tmp/trelcpu/tm_v1}
V=(old nopair pair)
for round in $(seq 1 ${1:-3}); do
  for j in 0 1 2; do
    v=${V[$(( (j + round) % 3 ))]}
    case $v in old) e="TRELCPU_OLD=1";; nopair) e="TRELCPU_NOPAIR=1";; pair) e="X=1";; esac
    echo "== round $round variant $v; $(uptime | sed 's/.*load/load/')"
    env $e $B 8 1 32 int16 1mad8 | grep -E "fused/affine|one token|streamed from"
  done
done
