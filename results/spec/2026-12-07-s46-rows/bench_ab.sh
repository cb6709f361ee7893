#!/bin/bash
# Interleaved runs of `cargo xtask bench spec --cli --rounds 7` (two threads), each after
# s38's when_idle.sh, per configuration LABEL=BIN[:ENV=VALUE]; tables to OUTDIR/spec-cli-LABEL-N.md,
# times and uptime to OUTDIR/bench-runs.log.
# (s45-tile's bench_ab.sh, copied; run with CARGO_TARGET_DIR set to a warm xtask build.)
# usage: bench_ab.sh RUNS OUTDIR LABEL=BIN[:ENV=VALUE] ...
N=$1; O=$2; shift 2
IDLE=$(dirname "$0")/../2026-12-06-s38-specpolicy/when_idle.sh
for i in $(seq 1 "$N"); do
  for c in "$@"; do
    l=${c%%=*}; rest=${c#*=}; b=${rest%%:*}; e=""; [ "$rest" != "$b" ] && e=${rest#*:}
    echo "$l-$i start $(date -u +%T) $(uptime)" >> "$O/bench-runs.log"
    bash "$IDLE" true >> "$O/idle-gate.log" 2>&1
    env $e cargo xtask bench spec --cli --bin "$b" --rounds 7 --out "$O/spec-cli-$l-$i.md" > "$O/spec-cli-$l-$i.log" 2>&1
    echo "$l-$i rc $? end $(date -u +%T)" >> "$O/bench-runs.log"
  done
done
