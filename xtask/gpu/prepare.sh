#!/bin/bash
# Prepares the two carry folders for measuring on a lent NVIDIA machine that has Python and the
# CUDA 13 libraries but no Rust toolchain and no network (see README.md here):
#   .gpu/a: half one of libmlx.so (mlx-cuda-13 0.32.4, stripped, xz), the wheel's headers and
#           bundled libraries, the `mlx` cp312 and `mlx-lm` wheels, setup.sh
#   .gpu/b: half two, bench_generate and xtask built here against the CUDA wheel, env.sh, run.sh,
#           diag.sh, determinism.sh
# Both folders must be ignored by git (`echo /.gpu/ >> .git/info/exclude`).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu/a .gpu/b .gpu/tmp
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 -d .gpu/tmp mlx==0.32.4 mlx-lm==0.32.2 mlx-cuda-13==0.32.4
cp .gpu/tmp/mlx-0.32.4-*.whl .gpu/tmp/mlx_lm-0.32.2-*.whl .gpu/a/
rm -rf .gpu/tmp/cuda && mkdir .gpu/tmp/cuda && (cd .gpu/tmp/cuda && unzip -q ../mlx_cuda_13-0.32.4-*.whl)
(cd .gpu/tmp/cuda && tar cJf ../../a/support.tar.xz mlx/include mlx/share mlx_cuda_13.libs mlx_cuda_13-0.32.4.dist-info)
strip --strip-unneeded -o .gpu/tmp/libmlx.so .gpu/tmp/cuda/mlx/lib/libmlx.so
xz -9e -T0 -f .gpu/tmp/libmlx.so
split -n 2 -d .gpu/tmp/libmlx.so.xz .gpu/tmp/libmlx.so.xz.
mv .gpu/tmp/libmlx.so.xz.00 .gpu/a/ && mv .gpu/tmp/libmlx.so.xz.01 .gpu/b/
# libmlx's CUDA dependencies are not here: let the linker leave them to the machine that runs it.
CARGO_TARGET_DIR=target/cuda RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo build --release -p mlx-engine --example bench_generate --features cuda -p xtask
cp target/cuda/release/examples/bench_generate target/cuda/release/xtask .gpu/b/
cp xtask/gpu/setup.sh .gpu/a/ && cp xtask/gpu/env.sh xtask/gpu/run.sh xtask/gpu/diag.sh xtask/gpu/determinism.sh .gpu/b/
du -sh .gpu/a .gpu/b
