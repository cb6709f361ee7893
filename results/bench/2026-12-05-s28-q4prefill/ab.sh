#!/usr/bin/env bash
# Prefill A/B side by side, interleaved rounds, rotated order: `mlx generate` (release, default
# CPU decoder, 2 threads, --max-tokens 1) of A (main's binary) and B (this branch), and
# llama-bench pp512 (-t 2 -p 512 -n 0, llama.cpp built without AMX: /work/llama-cpp/build-noamx).
# The prompt is the first 512 token ids of the Genesis fixture (ids512.txt beside this script,
# what bench_cpu.rs feeds). Each line: the load average, then tok/s. With PROFILE=1 B's
# MLX_CPU_PROFILE table of the prompt blocks follows its line.
# Usage: ab.sh A_BIN B_BIN ROUNDS MODEL...
set -u
a=$1; b=$2; rounds=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
lb=/work/llama-cpp/build-noamx/bin
ids=$(cat "$here/ids512.txt")
one() {
  local side=$1 m=$2 bin
  case $side in
    llama) bin=$(LD_LIBRARY_PATH=$lb "$lb/llama-bench" -m "$m" -t 2 -p 512 -n 0 -r 1 -o csv 2>/dev/null | tail -1 | awk -F, '{gsub(/"/,""); print $(NF-1)}')
      echo "$side $(basename "$m") $bin (load $(cut -d' ' -f1 /proc/loadavg))";;
    A|B) [ "$side" = A ] && bin=$a || bin=$b
      out=$(MLX_CPU_PROFILE=${PROFILE:-0} "$bin" generate --model "$m" --prompt-ids "$ids" --max-tokens 1 --temp 0 --threads 2 --json 2>&1)
      tps=$(echo "$out" | grep '^{' | python3 -c "import json,sys; print(round(json.load(sys.stdin)['prompt_tps'],2))")
      echo "$side $(basename "$m") $tps (load $(cut -d' ' -f1 /proc/loadavg))"
      [ "${PROFILE:-0}" = 1 ] && [ "$side" = B ] && echo "$out" | awk '/prompt blocks/{p=1} p' | sed "s/^/    /";;
  esac
}
for r in $(seq 1 "$rounds"); do
  for m in "$@"; do
    case $((r % 3)) in
      1) order="A B llama";; 2) order="B llama A";; 0) order="llama A B";;
    esac
    for s in $order; do echo "round $r $(one "$s" "$m")"; done
  done
done
