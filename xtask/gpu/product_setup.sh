#!/bin/bash
# Device call 1 of the product-path bench (prepare_product.sh): installs mlx (CUDA, libmlx with
# only its sm_90 kernels kept) and mlx-lm into the image's venv, writes the bench models under
# /opt/models (each with the Llama 3 tokenizer), and warms MLX's JIT (its PTX cache is on disk)
# with short mlx-lm runs, so that call 2 measures instead of compiling.
set -ex
A=.gpu/a
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install -q --no-index --no-deps --no-compile $A/mlx-0.32.4-*.whl $A/mlx_lm-0.32.2-*.whl
tar xJf $A/support.tar.xz -C "$SITE"
mkdir -p "$SITE/mlx/lib" && xz -dc $A/libmlx-sm90.so.xz > "$SITE/mlx/lib/libmlx.so"
# MLX's JIT of its sm90 quantized matmul includes crt/mma.h, which the image's CUDA include
# folder (site-packages/nvidia/cu13/include) lacks: the nvidia-cuda-crt wheel supplies it.
for w in $A/nvidia_cuda_crt-*.whl; do
  if [ -f "$w" ]; then python3 -m pip install -q --no-index --no-deps --no-compile "$w"; fi
done
python3 -c 'import mlx.core as mx; a = mx.ones((512, 512), dtype=mx.bfloat16); print(mx.default_device(), (a @ a).sum().item())'
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv
mkdir -p /opt/models /opt/tok && tar xJf $A/tok.tar.xz -C /opt/tok
export PYTHONUNBUFFERED=1
python3 $A/bench_models.py /opt/models ${MODELS:-llama-135m-bf16 llama-135m-q4 llama31-8b-q4}
for m in /opt/models/*; do cp /opt/tok/tokenizer*.json "$m/"; done
for m in ${WARM:-llama-135m-bf16 llama-135m-q4 llama31-8b-q4}; do
  timeout 200 python3 -m mlx_lm benchmark --model /opt/models/$m -p 64 -g 8 -n 1 2>&1 | tail -3
done
ls -la ~/.cache 2>/dev/null; du -sh ~/.cache/* 2>/dev/null
echo setup-ok
