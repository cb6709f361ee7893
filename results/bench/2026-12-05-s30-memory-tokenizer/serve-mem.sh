#!/bin/bash
# `mlx serve`'s memory, BASE and NEW `mlx` binaries alternating: the server started on MODEL,
# one greedy /v1/completions request (the first 2,000 bytes of the Genesis fixture, 128
# tokens), then its VmHWM / VmRSS / RssAnon from /proc and the reply's text md5.
# Usage: serve-mem.sh BASE NEW MODEL ROUNDS [extra serve flags...]
BASE=$1; NEW=$2; MODEL=$3; ROUNDS=${4:-2}; shift 4; EXTRA=("$@")
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PROMPT=$(head -c 2000 "$ROOT/mlx-engine/tests/fixtures/genesis_kjv.txt" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')
PORT=${PORT:-18431}
one() { # side
  local bin=${!1} log=/tmp/cpumem/serve-$1.log
  "$bin" serve --model "$MODEL" --port $PORT "${EXTRA[@]}" > $log 2>&1 &
  local pid=$!
  for i in $(seq 1 600); do
    curl -s -o /dev/null http://127.0.0.1:$PORT/v1/models && break
    sleep 0.5
  done
  local loaded=$(grep -E 'VmHWM' /proc/$pid/status | awk '{print $2}')
  local reply=$(curl -s http://127.0.0.1:$PORT/v1/completions -H 'content-type: application/json' \
    -d "{\"prompt\": $PROMPT, \"max_tokens\": 128, \"temperature\": 0}")
  local md5=$(echo "$reply" | python3 -c 'import json,sys,hashlib; r=json.load(sys.stdin); print(hashlib.md5(r["choices"][0]["text"].encode()).hexdigest(), r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"])' 2>&1)
  local st=$(grep -E 'VmHWM|VmRSS|RssAnon|RssFile' /proc/$pid/status | awk '{printf "%s %s ", $1, $2}')
  kill $pid; wait $pid 2>/dev/null
  echo "$1 $(basename $MODEL) loaded-VmHWM ${loaded}kB after: $st text-md5/prompt/gen $md5"
}
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then one BASE; one NEW; else one NEW; one BASE; fi
done
