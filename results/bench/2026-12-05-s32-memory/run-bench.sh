#!/bin/bash
# (Copied from ../2026-12-05-s30-memory-tokenizer/run-bench.sh.) Issue #31's official table (`cargo xtask bench --device cpu`), ours' side only (memory: both
# columns), BASE and NEW `mlx` release binaries alternating: round 1 BASE then NEW, round 2 NEW
# then BASE. Usage: run-bench.sh BASE NEW OUTDIR. Each run writes OUTDIR/official-<side>-<r>.md.
# XTASK: the xtask command (default `cargo xtask`; a built xtask binary runs beside a build).
BASE=$1; NEW=$2; OUT=$3
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib}
cd "$(dirname "$0")/../../.."
one() { # side round
  local bin=${!1}
  ${XTASK:-cargo xtask} bench --device cpu --rounds 1 --threads 2 --sides ours --ours-bin "$bin" \
    --models-dir /work/wt-bench/target/bench-models --out "$OUT/official-$1-$2.md" 2>&1 | tail -3
}
one BASE 1; one NEW 1; one NEW 2; one BASE 2
