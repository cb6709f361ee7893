#!/bin/bash
# Rebuilds only .gpu/c of the product-path bundle (prepare_product.sh), reusing an earlier
# .gpu/a (the wheels, libmlx, the tokenizer and product_setup.sh change rarely): release `mlx`
# with `cuda` and the graph_decode_cuda test, stripped and xz-packed, the three mlx-lm-saved
# fixtures that test reads (mlx-models/tests/models is not in the sparse checkout the device
# tool sends; product.sh unpacks them there), and product.sh.
#   DEST=/work/wt-gpu/.gpu A=/work/main/.gpu/a bash xtask/gpu/prepare_product_c.sh
# Device calls, back to back, as prepare_product.sh says.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
: "${DEST:=.gpu}"
mkdir -p "$DEST/c"
if [ -n "${A:-}" ] && [ "$A" != "$DEST/a" ]; then
  rm -rf "$DEST/a" && cp -r "$A" "$DEST/a"
  cp xtask/gpu/product_setup.sh xtask/oracle/bench_models.py "$DEST/a/"
fi
export RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined"
cargo build --release -p mlx-cli --features cuda
cargo test --release -p mlx-engine --features cuda --test graph_decode_cuda --no-run
# mlx-kernels' `cuda` test set (the fused kernels and the trellis kernels against their references).
cargo test --release -p mlx-kernels --features cuda --test cuda --no-run
T=${CARGO_TARGET_DIR:-target}
strip -o "$DEST/c/mlx" "$T/release/mlx"
strip -o "$DEST/c/graph_test" "$(ls -t "$T"/release/deps/graph_decode_cuda-* | grep -v '\.d$' | head -1)"
strip -o "$DEST/c/kernels_test" "$(ls -t "$T"/release/deps/cuda-* | grep -v '\.d$' | head -1)"
xz -9 -T2 -f "$DEST/c/mlx" "$DEST/c/graph_test" "$DEST/c/kernels_test"
tar cJf "$DEST/c/fixtures.tar.xz" -C mlx-models/tests/models dense_bf16_mha dense_bf16_untied q8_g32_bf16
cp xtask/gpu/product.sh xtask/gpu/measure.sh xtask/gpu/batched.sh xtask/gpu/trellis_bench_model.py \
  xtask/gpu/spec_gpu.sh xtask/gpu/spec_cost.py \
  xtask/oracle/bench_serve_client.py "$DEST/c/"
git rev-parse HEAD > "$DEST/c/built-from"
du -sb "$DEST/a" "$DEST/c"
