#!/bin/bash
# A/B of `mlx generate`'s peak memory in issue #31's bench shape: 512 prompt ids (1..512), 128
# greedy tokens, 2 threads, default decoder. BASE and NEW alternate per row and round (the
# order flips each round). Usage: ab.sh BASE NEW ROUNDS MODEL... (a model named dense_f32 runs
# one token in, one out: the process baseline). Session 29's copy of session 28's ab.sh.
# Prints: round row side VmHWM_KiB maxRssAnon_KiB maxRssFile_KiB decoder generated prefill_tps
# decode_tps md5(text) [process_peak_rss KiB from --json, NEW only]. VmHWM from /usr/bin/time
# -f %M (the kernel's own peak of anon + file); RssAnon / RssFile are the maxima of
# /proc/PID/status polled every 20 ms (anon = heap, arrays, caches; file = the binary's and
# libraries' touched pages).
BASE=$1; NEW=$2; ROUNDS=$3; shift 3
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib}
IDS=$(seq -s, 1 512)
T=$(mktemp -d)
one() { # bin model prompt_ids max_tokens
  /usr/bin/time -f "%M" -o $T/time "$1" generate --model "$2" --prompt-ids "$3" --max-tokens "$4" \
    --temp 0 --json --threads 2 > $T/out 2> $T/err &
  local p=$! a=0 f=0
  sleep 0.05
  local c=$(pgrep -P $p | head -1)
  while kill -0 $p 2>/dev/null; do
    read x y < <(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} END{print a+0, f+0}' /proc/$c/status 2>/dev/null)
    [ "${x:-0}" -gt $a ] && a=$x; [ "${y:-0}" -gt $f ] && f=$y
    sleep 0.02
  done
  wait $p || { echo "FAILED $(tail -2 $T/err)"; return; }
  echo "$(cat $T/time) $a $f $(python3 -c "
import json,hashlib
v=json.loads(open('$T/out').read().strip().splitlines()[-1])
pk=v.get('process_peak_rss_bytes')
print(v['decoder'],v['generation_tokens'],round(v['prompt_tps'],1),round(v['generation_tps'],1),hashlib.md5(v['text'].encode()).hexdigest()[:8], '' if pk is None else pk//1024)")"
}
for r in $(seq 1 $ROUNDS); do
  for m in "$@"; do
    name=$(basename $m)
    if [ $((r % 2)) = 1 ]; then order="BASE NEW"; else order="NEW BASE"; fi
    for side in $order; do
      bin=${!side}
      if [ "$name" = dense_f32 ]; then res=$(one $bin $m 1 1); else res=$(one $bin $m $IDS 128); fi
      echo "$r $name $side $res"
    done
  done
done
rm -rf $T
