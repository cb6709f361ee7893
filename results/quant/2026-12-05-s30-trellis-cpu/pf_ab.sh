#!/bin/bash
# Prefetch distance A/B in one binary (trellis_matvec built with a temporary TRELCPU_PF switch =
# words ahead of the step, 0 = none; not committed, the kernel now fixes PREFETCH_WORDS = 256):
# the example's "streamed" lines (30 layers' copies of each shape read once a sweep, one
# thread: the words come from memory as in a decode step), trellis-3 1mad8 beside affine-4 in
# the same process. usage: pf_ab.sh > pf_ab.txt
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
for r in 1 2; do for pf in 0 256 0 128; do
  echo "== pf $pf $(uptime | sed 's/.*load/load/')"
  TRELCPU_PF=$pf timeout 200 /tmp/trelcpu/tm_pf 8 1 32 int16 1mad8 | grep -E "streamed"
done; done
