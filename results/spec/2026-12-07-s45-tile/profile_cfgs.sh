#!/bin/bash
# A/B/C... of environment settings on one binary in the decoder profile: per round, profile_ab.sh
# (a one-token run, plain and --prompt-lookup-ngram 1 with MLX_CPU_PROFILE=1) once per config,
# the configs' order rotating by round; config i's runs to OUTDIR/cI.log (CFG: NAME=VALUE[,...]
# or `base`). usage: profile_cfgs.sh BIN THREADS ROUNDS OUTDIR CFG...
BIN=$1; T=$2; R=$3; D=$4; shift 4
AB=$(dirname "$0")/../2026-12-06-s38-specpolicy/profile_ab.sh
cfgs=("$@"); n=${#cfgs[@]}
mkdir -p "$D"
for i in $(seq 0 $((n - 1))); do echo "c$i: ${cfgs[$i]}" >> "$D/configs.txt"; done
for r in $(seq 0 $((R - 1))); do
  for j in $(seq 0 $((n - 1))); do
    i=$(( (j + r) % n )); envs=(); [ "${cfgs[$i]}" != base ] && IFS=, read -ra envs <<< "${cfgs[$i]}"
    env "${envs[@]}" bash "$AB" "$BIN" "$T" 1 >> "$D/c$i.log" 2>&1
  done
done
