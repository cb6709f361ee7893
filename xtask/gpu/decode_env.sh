#!/bin/bash
# After ab.sh on the same machine (bench_generate unpacked, models written): decode under MLX's
# CUDA scheduling settings, both sides alike, one process per setting and side: the defaults,
# MLX_USE_CUDA_GRAPHS=0 (kernels launched one by one), and MLX_MAX_OPS_PER_BUFFER=4000 /
# MLX_MAX_MB_PER_BUFFER=100000 (one CUDA graph per step instead of one per 100 nodes). One JSON
# line per process to $OUT/env.jsonl, with the setting as "env".
set -x
G=${G:-.gpu-gpu/b}
source "$G/env.sh"
COMMON="--dtype keep --prompt-len ${PROMPT:-512} --gen-len ${GEN:-128} --trials ${TRIALS:-3} --device gpu"
for m in ${MODELS:-llama-135m-q4 llama-8b-q4}; do
  M=/tmp/bench-models/$m
  [ -d "$M" ] || python3 "$G/bench_models.py" /tmp/bench-models "$m" || continue
  for e in "DEFAULT=1" "MLX_USE_CUDA_GRAPHS=0" "MLX_MAX_OPS_PER_BUFFER=4000 MLX_MAX_MB_PER_BUFFER=100000"; do
    tag="\"env\": \"$e\", \"name\": \"$m\""
    { env $e timeout 200 python3 "$G/bench_mlx_lm.py" --model "$M" $COMMON | sed "s/^{/{\"side\": \"mlx-lm\", $tag, /"; } >> "$OUT/env.jsonl" 2>> "$OUT/env.err"
    { env $e timeout 200 "$G/bench_generate" --model "$M" $COMMON --compiled auto | sed "s/^{/{\"side\": \"ours-auto\", $tag, /"; } >> "$OUT/env.jsonl" 2>> "$OUT/env.err"
    echo "$m $e done at ${SECONDS}s"
  done
done
tail -5 "$OUT/env.err"
