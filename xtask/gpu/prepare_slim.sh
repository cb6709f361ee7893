#!/bin/bash
# For the calls after the first on one warm machine: once setup.sh and one call-2 script have
# joined libmlx there, later calls need none of its halves. Fills .gpu-c with the training
# bench (from .gpu-train/b), the flash tests (from .gpu-flash/b, prepare_kernels.sh's .gpu/b)
# and the prefill/decode comparison (from .gpu-gpu/b, prepare_ab.sh), less libmlx: ~10 MB next
# to the checkout instead of 36 MB each. On the device, `source .gpu-c/links.sh` first: it
# links the folders where the scripts look for them.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .gpu-c && mkdir -p .gpu-c/train .gpu-c/flash .gpu-c/ab
cp -a .gpu-train/b/. .gpu-c/train/ && cp -a .gpu-flash/b/. .gpu-c/flash/ && cp -a .gpu-gpu/b/. .gpu-c/ab/
rm -f .gpu-c/*/libmlx.so.xz.*
rm -f .gpu-c/ab/*.whl .gpu-c/flash/kernel_bench
cp xtask/gpu/train.sh xtask/gpu/flash.sh xtask/gpu/decode_env.sh .gpu-c/
cat > .gpu-c/links.sh <<'SH'
# Sourced on the device: the bundles where train.sh, flash.sh and ab.sh look for them.
for pair in .gpu-train:train .gpu:flash .gpu-gpu:ab; do
  d=${pair%%:*}; mkdir -p "$d"; rm -rf "$d/b"; ln -s "$PWD/.gpu-c/${pair##*:}" "$d/b"
done
SH
du -sh .gpu-c
