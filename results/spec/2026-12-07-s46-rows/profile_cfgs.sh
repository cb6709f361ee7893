#!/bin/bash
# Interleaved A/B/C... of environment settings on one binary in the decoder profile: per round,
# s38's when_idle.sh (the CPUs >= 85% idle for 3 s; its line to OUTDIR/idle.log), then s38's
# profile_ab.sh (a one-token run, plain and --prompt-lookup-ngram 1 with MLX_CPU_PROFILE=1) once
# per config, the configs' order rotating by round; config i's runs to OUTDIR/cI.log (CFG:
# NAME=VALUE[,...] or `base`; BIN=PATH in a config runs that binary instead).
# usage: profile_cfgs.sh BIN THREADS ROUNDS OUTDIR CFG...
BIN=$1; T=$2; R=$3; D=$4; shift 4
H=$(dirname "$0")/..
AB=$H/2026-12-06-s38-specpolicy/profile_ab.sh
IDLE=$H/2026-12-06-s38-specpolicy/when_idle.sh
cfgs=("$@"); n=${#cfgs[@]}
mkdir -p "$D"
for i in $(seq 0 $((n - 1))); do echo "c$i: ${cfgs[$i]}" >> "$D/configs.txt"; done
for r in $(seq 0 $((R - 1))); do
  bash "$IDLE" true >> "$D/idle.log" 2>&1
  for j in $(seq 0 $((n - 1))); do
    i=$(( (j + r) % n )); envs=(); b=$BIN
    [ "${cfgs[$i]}" != base ] && IFS=, read -ra envs <<< "${cfgs[$i]}"
    rest=()
    for e in "${envs[@]}"; do case $e in BIN=*) b=${e#BIN=};; *) rest+=("$e");; esac; done
    env "${rest[@]}" bash "$AB" "$b" "$T" 1 >> "$D/c$i.log" 2>&1
  done
done
