#!/bin/bash
# Device call 2 of the mlx-kernels session (after setup.sh; see prepare_kernels.sh): the `cuda`
# test set, the kernel micro-benchmark and the decode-step breakdown, logs under $OUT.
# Each part runs even when an earlier one fails; the exit status is the tests'.
set -x
source .gpu/b/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; command -v nsys ncu
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' || exit 1
set -o pipefail
.gpu/b/cuda_tests --nocapture --test-threads=1 2>&1 | tee "$OUT/cuda_tests.log"
rc=$?
timeout 200 .gpu/b/kernel_bench "$OUT/kernel_bench.md" 2>&1 | tee "$OUT/kernel_bench.log"
timeout 300 python3 .gpu/b/decode_breakdown.py "$OUT/decode_breakdown.json" ${BREAKDOWN_MODELS:-} 2>&1 |
  tee "$OUT/decode_breakdown.log"
exit $rc
