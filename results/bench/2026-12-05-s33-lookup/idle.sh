#!/bin/bash
# For an idle machine (the lead's end-of-session run): the #33 headline and, beside it, what a
# verify row costs there, so the closing note's c and its split are idle figures.
# 1. `cargo xtask bench spec` (5 rounds, plain vs --prompt-lookup-ngram 1, through `mlx generate`);
# 2. `spec_bench --cost 6 --threads 2`: a verification pass of 1..6 rows in one-row passes;
# 3. `MLX_CPU_PROFILE=1 spec_bench --profile 5 --threads 2`: the decoder's per-part timings of
#    1..5-row passes.
# usage: [BIN=path/to/release/mlx] [SPEC_BENCH=path/to/spec_bench] idle.sh [OUT_DIR]
set -e
cd "$(dirname "$0")/../../.."
OUT=${1:-results/bench/2026-12-05-s33-lookup}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib}
T=${CARGO_TARGET_DIR:-target}
BIN=${BIN:-$T/release/mlx}
SB=${SPEC_BENCH:-$T/release/examples/spec_bench}
uptime
cargo xtask bench spec --bin "$BIN" --rounds 5 --out "$OUT/spec-cpu-idle.md"
"$SB" --cost 6 --threads 2 --rounds 4 > "$OUT/verify-cost-2t-idle.log" 2>&1
MLX_CPU_PROFILE=1 "$SB" --profile 5 --threads 2 --rounds 4 > "$OUT/profile-rows-2t-idle.log" 2>&1
uptime
