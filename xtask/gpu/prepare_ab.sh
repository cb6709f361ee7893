#!/bin/bash
# Superseded since 2026-12-02 by prepare_thirds.sh: the checkout (33.7 MiB) plus half of libmlx
# no longer fits one call's 64 MiB. Kept for the runs it made (results/).
# Prepares the carry folders for `ab.sh` (issue #15's comparison with mlx-lm) on a lent NVIDIA
# machine: .gpu-gpu/a = half one of libmlx.so, the CUDA wheel's headers and bundled libraries
# (support.tar.xz) and setup.sh; .gpu-gpu/b = half two, the mlx and mlx-lm wheels,
# bench_generate (release, CUDA wheel, stripped, xz), the oracle scripts, env.sh and ab.sh.
# The wheels travel with b, not a: the checkout itself (~26 MB) plus a must stay under the
# 64 MiB a call carries. GPU_A / GPU_B reuse an existing .gpu/a and .gpu/b (prepare.sh's);
# MLX_DIR names the unpacked mlx-cuda-13 wheel to build against (else the build fetches it).
# Copy .gpu-gpu into the checkout the device tool carries; call 1 `bash .gpu-gpu/a/setup.sh`
# carrying .gpu-gpu/a, call 2 at once, carrying .gpu-gpu/b:
#   python3 -m pip install -q --no-index --no-deps --no-compile .gpu-gpu/b/*.whl &&
#   MODELS="llama-135m-q4 llama-8b-q4" bash .gpu-gpu/b/ab.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu-gpu/a .gpu-gpu/b
if [ -z "${GPU_A:-}" ]; then
  bash xtask/gpu/prepare.sh
  GPU_A=.gpu/a GPU_B=.gpu/b
fi
cp "$GPU_A"/libmlx.so.xz.00 "$GPU_A"/support.tar.xz .gpu-gpu/a/
cp "$GPU_A"/mlx-0.32.4-*.whl "$GPU_A"/mlx_lm-0.32.2-*.whl "$GPU_B"/libmlx.so.xz.01 .gpu-gpu/b/
grep -v 'pip install' xtask/gpu/setup.sh | sed 's#\.gpu/a/#.gpu-gpu/a/#g' > .gpu-gpu/a/setup.sh
CARGO_TARGET_DIR=target/cuda RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo build --release -p mlx-engine --example bench_generate --features cuda
strip -o .gpu-gpu/b/bench_generate target/cuda/release/examples/bench_generate
xz -9 -f .gpu-gpu/b/bench_generate
cp xtask/gpu/ab.sh xtask/oracle/bench_models.py xtask/oracle/bench_mlx_lm.py \
  xtask/oracle/goldens_smollm2_logits.py .gpu-gpu/b/
sed 's#\.gpu/b/#.gpu-gpu/b/#g' xtask/gpu/env.sh > .gpu-gpu/b/env.sh
du -sb .gpu-gpu/a .gpu-gpu/b
