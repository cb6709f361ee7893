#!/bin/bash
# Like prepare.sh, for the mlx-kernels session: fills .gpu/a (setup.sh's wheels and half one of
# libmlx) and .gpu/b (half two, the `cuda` test set (debug profile) and `kernel_bench` (release
# profile; BENCH_PROFILE=dev for a quicker build) built here against the CUDA wheel,
# decode_breakdown.py, env.sh, kernels.sh). The device tool sends the checkout its session
# started in: when that is another worktree, copy .gpu/a and .gpu/b into its ignored .gpu/.
# Then:
#   device call 1, carrying .gpu/a:  bash .gpu/a/setup.sh
#   device call 2, carrying .gpu/b:  bash .gpu/b/kernels.sh      (results under $OUT)
#   (or, for flash attention alone:  bash .gpu/b/flash.sh)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu/a .gpu/b .gpu/tmp
ls .gpu/tmp/mlx_cuda_13-0.32.4-*.whl .gpu/tmp/mlx-0.32.4-*.whl .gpu/tmp/mlx_lm-0.32.2-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 -d .gpu/tmp mlx==0.32.4 mlx-lm==0.32.2 mlx-cuda-13==0.32.4
cp .gpu/tmp/mlx-0.32.4-*.whl .gpu/tmp/mlx_lm-0.32.2-*.whl .gpu/a/
[ -d .gpu/tmp/cuda/mlx ] || { mkdir -p .gpu/tmp/cuda && (cd .gpu/tmp/cuda && unzip -q ../mlx_cuda_13-0.32.4-*.whl); }
(cd .gpu/tmp/cuda && tar cJf ../../a/support.tar.xz mlx/include mlx/share mlx_cuda_13.libs mlx_cuda_13-0.32.4.dist-info)
if [ ! -s .gpu/tmp/libmlx.so.xz.01 ]; then
  strip --strip-unneeded -o .gpu/tmp/libmlx.so .gpu/tmp/cuda/mlx/lib/libmlx.so
  xz -9e -T0 -f .gpu/tmp/libmlx.so
  split -n 2 -d .gpu/tmp/libmlx.so.xz .gpu/tmp/libmlx.so.xz.
fi
cp .gpu/tmp/libmlx.so.xz.00 .gpu/a/ && cp .gpu/tmp/libmlx.so.xz.01 .gpu/b/
# libmlx's CUDA dependencies are not here: let the linker leave them to the machine that runs it.
export CARGO_TARGET_DIR=target/cuda MLX_DIR="$PWD/.gpu/tmp/cuda" \
  RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined"
nice -n 10 cargo build -p mlx-kernels --features cuda --tests
profile=${BENCH_PROFILE:-release}
nice -n 10 cargo build -p mlx-kernels --features cuda --example kernel_bench --example flash_bench --profile "$profile"
test_bin=$(nice -n 10 cargo test -p mlx-kernels --features cuda --test cuda --no-run 2>&1 |
  sed -n 's/.*Executable tests\/cuda.rs (\(.*\))/\1/p')
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
cp "$test_bin" .gpu/b/cuda_tests && cp "target/cuda/$dir/examples/kernel_bench" "target/cuda/$dir/examples/flash_bench" .gpu/b/
strip .gpu/b/cuda_tests .gpu/b/kernel_bench .gpu/b/flash_bench
cp xtask/gpu/setup.sh .gpu/a/
cp xtask/gpu/env.sh xtask/gpu/kernels.sh xtask/gpu/flash.sh xtask/gpu/decode_breakdown.py xtask/gpu/node_costs.py .gpu/b/
du -sh .gpu/a .gpu/b
