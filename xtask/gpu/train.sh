#!/bin/bash
# Device call 2 of the training bench (after `bash .gpu-train/a/setup.sh`): joins libmlx, writes
# the Llama-3-8B-shaped 4-bit model (once per machine, in seconds: its 4-bit codes are drawn
# directly; under /dev/shm when it has room), runs `xtask bench train` with our prebuilt `train`
# example against `python -m mlx_lm lora`. LENGTHS, OURS, MLXLM, ITERS, FLASH, SEG, CE, TIMEOUT
# and LIMIT (the GB of the `lim` variant) pick the runs; TAG names the files written under $OUT.
# A later call on the same (warm) machine reuses the unpacked binaries and the model.
set -x
source .gpu-train/b/env.sh
for f in train xtask; do [ -x /tmp/gt/$f ] || { mkdir -p /tmp/gt && xz -dc .gpu-train/b/$f.xz > /tmp/gt/$f && chmod +x /tmp/gt/$f; }; done
python3 -c 'import mlx_lm' 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile .gpu-train/b/*.whl
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' || exit 1
mkdir -p /tmp/ov/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/ov/bin/python && chmod +x /tmp/ov/bin/python
export MLX_ORACLE_VENV=/tmp/ov
# xtask looks for the workspace where it was built.
for d in /work/wt-train /work/main; do [ -e $d ] || { mkdir -p /work && ln -s "$PWD" $d; }; done
# The carried checkout may predate the bench's mlx-lm driver.
cp .gpu-train/b/bench_train_mlx_lm.py xtask/oracle/
MODELS=/tmp/bench-models
shm=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
[ "${shm:-0}" -gt 12000000 ] && MODELS=/dev/shm/bench-models
df -h /dev/shm /tmp
time python3 .gpu-train/b/bench_models.py $MODELS llama-8b-q4 || exit 1
set -o pipefail
TAG=${TAG:-train_bench}
/tmp/gt/xtask bench train --ours-bin /tmp/gt/train --model $MODELS/llama-8b-q4 \
  --lengths "${LENGTHS:-512,2048,8192}" --iters "${ITERS:-3}" --flash-block "${FLASH:-1024}" \
  --segment-length "${SEG:-4096}" --ce-chunk-size "${CE:-1024}" --memory-limit "${LIMIT:-12}" --timeout "${TIMEOUT:-240}" \
  --ours "${OURS:-ckpt+ce,ckpt+seg+ce}" --mlx-lm "${MLXLM:-ckpt}" \
  --models-dir $MODELS --json "$OUT/$TAG.json" 2>&1 | tee "$OUT/$TAG.log"
nvidia-smi --query-gpu=name,driver_version --format=csv
