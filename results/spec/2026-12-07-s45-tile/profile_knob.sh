#!/bin/bash
# A/B of one environment knob on one binary: per round, s38's profile_ab.sh (one round: a
# one-token run, plain and --prompt-lookup-ngram 1 decoding with MLX_CPU_PROFILE=1) with
# KNOB=A and with KNOB=B, the order alternating by round; each run's log to a.log / b.log.
# usage: profile_knob.sh BIN THREADS ROUNDS OUTDIR KNOB A B
BIN=$1; T=$2; R=$3; D=$4; K=$5; A=$6; B=$7
AB=$(dirname "$0")/profile_ab.sh
for r in $(seq 1 "$R"); do
  if [ $((r % 2)) = 1 ]; then order="a b"; else order="b a"; fi
  for p in $order; do
    if [ "$p" = a ]; then env "$K=$A" bash "$AB" "$BIN" "$T" 1 >> "$D/a.log" 2>&1
    else env "$K=$B" bash "$AB" "$BIN" "$T" 1 >> "$D/b.log" 2>&1; fi
  done
done
