#!/usr/bin/env bash
# Prefill side by side, interleaved rounds: `mlx generate` (release, default cpu decoder) with AMX
# tiles (default) and without (MLX_CPU_AMX=0: the AVX-512 float kernel that ran before), and
# llama-bench pp512 (-t 2 -p 512 -n 0; --repack 0, since --repack 1, llama.cpp's default, takes
# its AMX path and segfaults on this machine). 512-id prompt, --max-tokens 1, 2 threads.
# Usage: bench.sh MLX_BIN ROUNDS MODEL...
set -u
mlx=$1; rounds=$2; shift 2
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
lb=/work/llama-cpp/build/bin
ids=$(python3 -c "print(','.join(str(100+7*i % 40000) for i in range(512)))")
for r in $(seq 1 "$rounds"); do
  for m in "$@"; do
    for amx in 1 0; do
      out=$(MLX_CPU_AMX=$amx MLX_CPU_PROFILE=1 "$mlx" generate --model "$m" --prompt-ids "$ids" \
        --max-tokens 1 --temp 0 --threads 2 --verbose true 2>&1)
      pf=$(echo "$out" | grep -E "^Prompt:" | head -1)
      echo "round $r model $(basename "$m") amx $amx :: $pf"
      echo "$out" | awk '/prompt blocks/{p=1} /decode steps/{p=0} p' | sed "s/^/    /"
    done
    lbo=$(LD_LIBRARY_PATH=$lb "$lb/llama-bench" -m "$m" -t 2 -p 512 -n 0 -r 1 --repack 0 2>&1 | grep pp512)
    echo "round $r model $(basename "$m") llama.cpp repack0 :: $lbo"
  done
done
