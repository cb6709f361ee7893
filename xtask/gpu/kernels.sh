#!/bin/bash
# Device call 2 of the mlx-kernels session (after setup.sh; see prepare_kernels.sh): the `cuda`
# test set, the kernel micro-benchmark (with MLX's CUDA graphs on, then off), the host cost per
# node (node_costs.py) and the decode-step breakdown, logs under $OUT. Each part runs even
# when an earlier one fails; the exit status is the tests'. BREAKDOWN_MODELS picks models
# (default: all four).
set -x
source .gpu/b/env.sh
# The flash attention tests compare against a float32 materialised attention: no TF32 matmuls.
export MLX_ENABLE_TF32=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; command -v nsys ncu
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' || exit 1
set -o pipefail
.gpu/b/cuda_tests --nocapture --test-threads=1 2>&1 | tee "$OUT/cuda_tests.log"
rc=$?
timeout 150 .gpu/b/kernel_bench "$OUT/kernel_bench.md" 2>&1 | tee "$OUT/kernel_bench.log"
MLX_USE_CUDA_GRAPHS=0 timeout 150 .gpu/b/kernel_bench "$OUT/kernel_bench_nographs.md" 2>&1 |
  tee "$OUT/kernel_bench_nographs.log"
timeout 120 python3 .gpu/b/node_costs.py "$OUT/node_costs.md" 2>&1 | tee "$OUT/node_costs.log"
timeout 300 python3 .gpu/b/decode_breakdown.py "$OUT/decode_breakdown.json" ${BREAKDOWN_MODELS:-} 2>&1 |
  tee "$OUT/decode_breakdown.log"
exit $rc
