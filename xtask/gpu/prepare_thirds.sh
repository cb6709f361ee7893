#!/bin/bash
# The checkout grew past what one call can carry next to half of libmlx (33.7 MiB of tracked
# files + 37.8 MiB for .gpu-train/a > 64 MiB), so this recipe sends libmlx in thirds over
# three calls on one warm machine (each well under the limit), with the training bench and the
# prefill/decode comparison built from the current commit in the third:
#   .gpu-t3/a: third one, support.tar.xz (the CUDA wheel's headers and bundled libraries), setup.sh
#   .gpu-t3/b: third two
#   .gpu-t3/c: third three, env.sh (joins the thirds), train/ (the `train` example, xtask, the
#              wheels, bench_models.py, bench_train_mlx_lm.py, train.sh) and ab/ (bench_generate,
#              bench_mlx_lm.py, ab.sh), links.sh
# Device calls, back to back (a machine stays warm 30 s):
#   1 carry .gpu-t3/a: bash .gpu-t3/a/setup.sh
#   2 carry .gpu-t3/b: mkdir -p /opt/mlxgpu && cp .gpu-t3/b/libmlx.so.xz.01 /opt/mlxgpu/
#   3 carry .gpu-t3/c: source .gpu-t3/c/links.sh && LENGTHS=... bash .gpu-train/b/train.sh
#     (or bash .gpu-gpu/b/ab.sh after installing the wheels, as train.sh does)
# LIBMLX_XZ names the whole xz-packed stripped libmlx.so (prepare.sh makes it in two halves:
# `cat .gpu/a/libmlx.so.xz.00 .gpu/b/libmlx.so.xz.01`); SUPPORT names support.tar.xz; WHEELS a
# folder holding the mlx 0.32.4 cp312 and mlx-lm 0.32.2 wheels.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
: "${LIBMLX_XZ:?the xz-packed libmlx.so}" "${SUPPORT:?support.tar.xz}" "${WHEELS:?the wheels folder}"
rm -rf .gpu-t3 && mkdir -p .gpu-t3/a .gpu-t3/b .gpu-t3/c/train .gpu-t3/c/ab .gpu-t3/tmp
xz -t "$LIBMLX_XZ"
split -n 3 -d "$LIBMLX_XZ" .gpu-t3/tmp/libmlx.so.xz.
mv .gpu-t3/tmp/libmlx.so.xz.00 .gpu-t3/a/ && mv .gpu-t3/tmp/libmlx.so.xz.01 .gpu-t3/b/
mv .gpu-t3/tmp/libmlx.so.xz.02 .gpu-t3/c/ && rmdir .gpu-t3/tmp
cp "$SUPPORT" .gpu-t3/a/support.tar.xz
grep -v 'pip install' xtask/gpu/setup.sh | sed 's#\.gpu/a/#.gpu-t3/a/#g' > .gpu-t3/a/setup.sh
cat > .gpu-t3/c/env.sh <<'SH'
# Sourced on the device: joins libmlx.so (thirds one and two stashed under /opt/mlxgpu by calls
# 1 and 2, three carried here) into the image's venv once, and points the loader at it.
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/mlx/lib"
[ -s "$SITE/mlx/lib/libmlx.so" ] || { cat /opt/mlxgpu/libmlx.so.xz.00 /opt/mlxgpu/libmlx.so.xz.01 .gpu-t3/c/libmlx.so.xz.02 | xz -d > "$SITE/mlx/lib/libmlx.so" || exit 1; }
export LD_LIBRARY_PATH="$SITE/mlx/lib" PYTHONUNBUFFERED=1
SH
cp .gpu-t3/c/env.sh .gpu-t3/c/train/env.sh && cp .gpu-t3/c/env.sh .gpu-t3/c/ab/env.sh
cat > .gpu-t3/c/links.sh <<'SH'
# Sourced on the device: the bundles where train.sh and ab.sh look for them.
for pair in .gpu-train:train .gpu-gpu:ab; do
  d=${pair%%:*}; mkdir -p "$d"; rm -rf "$d/b"; ln -s "$PWD/.gpu-t3/c/${pair##*:}" "$d/b"
done
SH
# libmlx's CUDA dependencies are not here: let the linker leave them to the machine that runs it.
CARGO_TARGET_DIR=target/cuda RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo build --release -p mlx-train --features cuda --example train
CARGO_TARGET_DIR=target/cuda RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined" \
  cargo build --release -p mlx-engine --features cuda --example bench_generate
cargo build -p xtask
strip -o .gpu-t3/c/train/train target/cuda/release/examples/train
strip -o .gpu-t3/c/train/xtask target/debug/xtask
strip -o .gpu-t3/c/ab/bench_generate target/cuda/release/examples/bench_generate
xz -9 -f .gpu-t3/c/train/train .gpu-t3/c/train/xtask .gpu-t3/c/ab/bench_generate
cp "$WHEELS"/mlx-0.32.4-*.whl "$WHEELS"/mlx_lm-0.32.2-*.whl .gpu-t3/c/train/
cp xtask/oracle/bench_models.py xtask/oracle/bench_train_mlx_lm.py xtask/gpu/train.sh .gpu-t3/c/train/
cp xtask/gpu/ab.sh xtask/oracle/bench_models.py xtask/oracle/bench_mlx_lm.py \
  xtask/oracle/goldens_smollm2_logits.py .gpu-t3/c/ab/
git rev-parse HEAD > .gpu-t3/c/built-from
du -sb .gpu-t3/a .gpu-t3/b .gpu-t3/c
echo "tracked: $(git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {print s}') bytes"
