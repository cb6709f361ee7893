#!/bin/bash
# Device call 1: install mlx (CUDA) + mlx-lm into the image's venv, stash half of libmlx.
set -ex
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "site: $SITE"; ls "$SITE/nvidia/cu13/lib" | head -3
python3 -m pip install -q --no-index --no-deps --no-compile .gpu/a/mlx-0.32.4-*.whl .gpu/a/mlx_lm-0.32.2-*.whl
tar xJf .gpu/a/support.tar.xz -C "$SITE"
mkdir -p /opt/mlxgpu && cp .gpu/a/libmlx.so.xz.00 /opt/mlxgpu/
python3 -c 'import transformers, numpy; print("transformers", transformers.__version__, "numpy", numpy.__version__)'
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo setup-ok
