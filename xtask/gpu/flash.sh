#!/bin/bash
# Device call 2 for flash attention alone (after setup.sh; see prepare_kernels.sh): the flash
# tests of the `cuda` test set (with MLX's TF32 matmuls off, so that the float32 reference is
# float32 throughout) and flash_bench, logs under $OUT. The exit status is the tests'.
set -x
source .gpu/b/env.sh
export MLX_ENABLE_TF32=0
nvidia-smi --query-gpu=name,driver_version --format=csv
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' || exit 1
set -o pipefail
timeout ${TEST_TIMEOUT:-200} .gpu/b/cuda_tests flash --nocapture --test-threads=1 2>&1 | tee "$OUT/flash_tests.log"
rc=$?
timeout ${BENCH_TIMEOUT:-90} .gpu/b/flash_bench "$OUT/flash_bench.md" ${LENGTHS:-} 2>&1 | tee "$OUT/flash_bench.log"
exit $rc
