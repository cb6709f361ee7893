#!/bin/bash
# Interleaved micro-benchmark of the tile shapes: micro_ab.sh OUTDIR ROUNDS CONFIG... (CONFIG an
# MLX_CPU_TILE value; `0` = the kernels before). Per round and config one process of
# cpu_verify_rows (m 1..9, 576x576 and 1536x576, 3 inner rounds), its lines tagged by config.
out=$1; rounds=$2; shift 2
export LD_LIBRARY_PATH=/work/tgt-verify/release/mlx-runtime/mlx-cpu-0.32.4/wheel/mlx/lib
E=${E:-/work/tgt-verify/release/examples/cpu_verify_rows}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for c in "$@"; do
    CPU_VERIFY_SHAPES=${SHAPES:-576x576,1536x576} MLX_CPU_TILE=$c $E 9 8 3 | sed "s/^/cfg=$c /" >> "$out/raw.log"
  done
done
