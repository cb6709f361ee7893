#!/bin/bash
# Interleaved micro-benchmark of environment settings: micro_env.sh OUTDIR ROUNDS CFG... (CFG:
# `NAME=VALUE[,NAME=VALUE]` or `base`). Per round and config one process of cpu_verify_rows
# (m 1..9, $SHAPES, 3 inner rounds, $CPU_VERIFY_THREADS workers), its lines tagged by config.
out=$1; rounds=$2; shift 2
export LD_LIBRARY_PATH=/work/tgt-verify/release/mlx-runtime/mlx-cpu-0.32.4/wheel/mlx/lib
E=${E:-/work/tgt-verify/release/examples/cpu_verify_rows}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for c in "$@"; do
    envs=(); [ "$c" != base ] && IFS=, read -ra envs <<< "$c"
    env "${envs[@]}" CPU_VERIFY_SHAPES=${SHAPES:-576x576,1536x576} $E 9 8 3 | sed "s/^/cfg=$c /" >> "$out/raw.log"
  done
done
