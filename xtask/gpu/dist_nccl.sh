#!/bin/bash
# Device call 2 of the tensor-parallel bench on the 2-GPU kind (`kind: nvidia-h200-x2`), after
# `MODELS="llama-8b-bf16" WARM=llama-8b-bf16 bash .gpu/a/product_setup.sh` on the same warm
# machine (`xtask/gpu/prepare_product.sh` builds .gpu/a and .gpu/c: `mlx` with the `cuda`
# feature, whose libmlx is the mlx-cuda-13 wheel's, linked against the image's NCCL under
# nvidia/nccl/lib). Issue #35's bench: the 8B-shaped bf16 llama tensor-parallel over 2 GPUs
# (`mlx launch -n 2 --backend nccl`: MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT and one
# CUDA_VISIBLE_DEVICES per rank, as `mlx.launch --backend nccl` sets them) against one GPU and
# against mlx-lm's own sharded `mlx_lm benchmark` under `mlx.launch -n 2 --backend nccl`,
# alternating, ROUNDS rounds; prompt P, generation G, N trials. Logs under $OUT.
# Not run yet: the lead owns the device time.
set -x
C=.gpu/c
export PYTHONUNBUFFERED=1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin && xz -dc $C/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx
MLX=/opt/bin/mlx
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv | tee $OUT/gpus.log
ldd "$SITE/mlx/lib/libmlx.so" | grep -i nccl | tee $OUT/nccl.log
# The group forms over NCCL and all-sums the ranks.
timeout 120 $MLX launch -n 2 --backend nccl --check 2>&1 | tee $OUT/check.log
M=${MODEL:-/opt/models/llama-8b-bf16}
B="-p ${P:-512} -g ${G:-128} -n ${N:-3}"
for r in $(seq ${ROUNDS:-3}); do
  for side in one tp2 mlxlm_tp2; do
    echo "== round $r $side" | tee -a $OUT/bench.log
    case $side in
      one) timeout 300 $MLX benchmark --model $M $B --json --decoder mlx 2>&1 ;;
      tp2) timeout 300 $MLX launch -n 2 --backend nccl --timeout 120 -- benchmark --model $M $B --json --decoder mlx 2>&1 ;;
      # mlx.launch (its console script may be absent after `pip --no-deps`): runs the
      # python it is given on each rank.
      mlxlm_tp2) timeout 300 python3 -c 'import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = "mlx.launch"; sys.exit(main())' \
        -n 2 --backend nccl --python "$(command -v python3)" -- -m mlx_lm benchmark --model $M $B 2>&1 ;;
    esac | tee -a $OUT/bench.log | tail -3
  done
done
echo dist-done
