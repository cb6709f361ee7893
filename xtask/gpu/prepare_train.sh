#!/bin/bash
# Superseded since 2026-12-02 by prepare_thirds.sh: the checkout (33.7 MiB) plus half of libmlx
# no longer fits one call's 64 MiB. Kept for the runs it made (results/).
# Prepares the carry folders for `cargo xtask bench train` on a lent NVIDIA machine (see
# README.md here): .gpu-train/a as prepare.sh's .gpu/a (half one of libmlx.so, headers and
# bundled libraries, the mlx and mlx-lm wheels, setup.sh), .gpu-train/b with half two, the
# `train` example (mlx train) built here against the CUDA wheel, xtask, bench_models.py and
# train.sh. Reuses an existing .gpu/a + .gpu/b half two when GPU_A / GPU_B name them (and the
# unpacked CUDA wheel when MLX_DIR names it). Copy .gpu-train into the checkout the device tool
# carries and pass `carry: [".gpu-train"]`: call 1 `bash .gpu-train/a/setup.sh`, call 2 at once
# `bash .gpu-train/b/train.sh` (LENGTHS=..., OURS=..., MLXLM=... pick the runs).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu-train/a .gpu-train/b
if [ -n "${GPU_A:-}" ]; then
  cp "$GPU_A"/libmlx.so.xz.00 "$GPU_A"/mlx-0.32.4-*.whl "$GPU_A"/mlx_lm-0.32.2-*.whl "$GPU_A"/support.tar.xz .gpu-train/a/
  cp "$GPU_B"/libmlx.so.xz.01 .gpu-train/b/
else
  bash xtask/gpu/prepare.sh
  cp .gpu/a/* .gpu-train/a/ && cp .gpu/b/libmlx.so.xz.01 .gpu-train/b/
fi
# The mlx and mlx-lm wheels travel in b (train.sh installs them): the checkout plus a must stay
# under the 64 MiB a call carries.
mv .gpu-train/a/*.whl .gpu-train/b/
cp xtask/gpu/setup.sh .gpu-train/a/
sed -i -e 's#\.gpu/a/#.gpu-train/a/#g' -e '/pip install/d' .gpu-train/a/setup.sh
CARGO_TARGET_DIR=target/cuda RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo build --release -p mlx-train --features cuda --example train
strip -o .gpu-train/b/train target/cuda/release/examples/train
cargo build -p xtask && strip -o .gpu-train/b/xtask target/debug/xtask
cp xtask/oracle/bench_models.py xtask/oracle/bench_train_mlx_lm.py xtask/gpu/train.sh .gpu-train/b/
sed 's#\.gpu/b/#.gpu-train/b/#g' xtask/gpu/env.sh > .gpu-train/b/env.sh
xz -9 -f .gpu-train/b/train .gpu-train/b/xtask
du -sh .gpu-train/a .gpu-train/b
