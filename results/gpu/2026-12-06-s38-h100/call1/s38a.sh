#!/bin/bash
# Session 38 call 1: (1) setup; (2) prefill probe (MLX CUDA qmm vs dequantize+matmul, 8B shapes);
# (3) batched_throughput 8B rows 1 and 16, sides on/banks, without and with MLXS_GPURT_CARVEOUT=100.
PARTS="setup" MODELS="llama31-8b-q4 llama-135m-bf16" BUDGET_S=200 TAG=setup bash .gpu/c/measure.sh
mkdir -p $OUT/a && mv $OUT/*.log $OUT/*.tgz $OUT/a/ 2>/dev/null
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
timeout 90 python3 xtask/gpu/prefill_probe.py 512 2048 > $OUT/a/prefill_probe.jsonl 2> $OUT/a/prefill_probe.err
tail -3 $OUT/a/prefill_probe.jsonl
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="1 16" BREAKDOWN=20 THRU_SIDES="on banks" \
  BUDGET_S=$((560 - SECONDS > 280 ? 280 : 560 - SECONDS)) TAG=thru0 bash .gpu/c/measure.sh
mkdir -p $OUT/b && mv $OUT/*.log $OUT/*.tgz $OUT/b/ 2>/dev/null
export MLXS_GPURT_CARVEOUT=100
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="1 16" BREAKDOWN=20 THRU_SIDES="on banks" \
  BUDGET_S=$((585 - SECONDS)) TAG=thru100 bash .gpu/c/measure.sh
mkdir -p $OUT/c && mv $OUT/*.log $OUT/*.tgz $OUT/c/ 2>/dev/null
echo s38a-done at $SECONDS
