#!/bin/bash
# Device call 2: finish libmlx, check mlx on the GPU, run `cargo xtask bench` with our prebuilt driver.
set -x
source .gpu/b/env.sh
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device()); a = mx.ones((256, 256)); print((a @ a).sum())' || exit 1
ldd .gpu/b/bench_generate | grep -E 'mlx|not found'
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
mkdir -p /tmp/ov/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/ov/bin/python && chmod +x /tmp/ov/bin/python
export MLX_ORACLE_VENV=/tmp/ov
set -o pipefail
.gpu/b/xtask bench --ours-bin "$PWD/.gpu/b/bench_generate" --device gpu --models-dir /tmp/bench-models \
  --rounds "${ROUNDS:-3}" --json "$OUT/gpu_bench.json" $CONFIGS 2>&1 | tee "$OUT/gpu_bench.log"
nvidia-smi --query-gpu=name,driver_version --format=csv
