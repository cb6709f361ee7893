#!/usr/bin/env bash
# Builds a self-contained fuzzing bundle: the release mlx-fuzz binary, the mlx-cpu wheel's
# libmlx.so with its bundled BLAS/LAPACK (wheel layout kept, so libmlx's own RPATH
# $ORIGIN/../../mlx_cpu.libs finds them), the tiny seed model, and run.sh, which shards the
# targets over `nproc` processes. Copy the directory to any x86-64 Linux machine with glibc
# >= 2.35 and run `OUT=/some/dir ./run.sh`.
#
#   xtask/fuzz/bundle.sh [DEST]        (default: target/fuzz-bundle; needs MLX_DIR or the
#                                       wheel that mlx-sys's build unpacked)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/target/fuzz-bundle}
cd "$root"
if [ -z "${SKIP_BUILD:-}" ]; then
    cargo build --release -q -p mlx-fuzz
fi
bin=$root/target/release/mlx-fuzz
# The MLX the binary was linked against: $MLX_DIR, else the wheel mlx-sys unpacked.
mlx=${MLX_DIR:-}
if [ -z "$mlx" ]; then
    lib=$(ldd "$bin" | awk '/libmlx\.so/ {print $3}')
    [ -n "$lib" ] || { echo "bundle: cannot find libmlx.so (set MLX_DIR)" >&2; exit 1; }
    mlx=$(cd "$(dirname "$lib")/../.." && pwd)
fi
[ -f "$mlx/mlx/lib/libmlx.so" ] || { echo "bundle: no mlx/lib/libmlx.so under $mlx" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/mlx/lib" "$dest/models"
cp "$bin" "$dest/bin/mlx-fuzz"
strip "$dest/bin/mlx-fuzz" 2>/dev/null || true
cp "$mlx/mlx/lib/libmlx.so" "$dest/mlx/lib/"
cp -r "$mlx/mlx_cpu.libs" "$dest/"
cp -r "$root/mlx-models/tests/models/dense_f32" "$dest/models/"
cp "$root/xtask/fuzz/run.sh" "$dest/run.sh"
chmod +x "$dest/run.sh"
du -sh "$dest"
size=$(du -sm "$dest" | cut -f1)
if [ "$size" -ge 60 ]; then
    echo "bundle: $dest is ${size} MiB, over the 60 MiB budget" >&2
    exit 1
fi
