#!/bin/bash
# A/B of the verify rows' pair kernels on one binary: per round, s38's profile_ab.sh (one round:
# a one-token run, plain and --prompt-lookup-ngram 1 decoding with MLX_CPU_PROFILE=1) with
# MLX_CPU_PAIRS=0 (the kernels before this session) and with the pair kernels on (the
# default), the order alternating by round; each run's log to off.log / on.log.
# usage: profile_pairs.sh BIN THREADS ROUNDS [OUTDIR]
BIN=$1; T=$2; R=$3; D=${4:-.}
AB=$(dirname "$0")/../2026-12-06-s38-specpolicy/profile_ab.sh
for r in $(seq 1 "$R"); do
  if [ $((r % 2)) = 1 ]; then order="0 1"; else order="1 0"; fi
  for p in $order; do
    if [ "$p" = 0 ]; then MLX_CPU_PAIRS=0 bash "$AB" "$BIN" "$T" 1 >> "$D/off.log" 2>&1
    else MLX_CPU_PAIRS=1 bash "$AB" "$BIN" "$T" 1 >> "$D/on.log" 2>&1; fi
  done
done
