#!/bin/bash
# ab.sh ROUNDS NAME=BIN... -- MODEL...: per run: round model name VmHWM_KiB(time) json_peak_KiB decode_tps prefill_tps text_md5
# Prompt: the bench's 512 Genesis ids (ids.txt), 128 greedy tokens, 2 threads. Order of binaries flips each round.
ROUNDS=$1; shift; BINS=(); while [ "$1" != "--" ]; do BINS+=("$1"); shift; done; shift
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
IDS=$(cat ${IDS_FILE:-/tmp/cpumem/ids.txt}); T=$(mktemp -d)
for r in $(seq 1 $ROUNDS); do for m in "$@"; do
  if [ $((r % 2)) = 1 ]; then L=("${BINS[@]}"); else L=(); for ((i=${#BINS[@]}-1;i>=0;i--)); do L+=("${BINS[$i]}"); done; fi
  for nb in "${L[@]}"; do n=${nb%%=*}; b=${nb#*=}; mn=$(basename $m)
    if [ "$mn" = dense_f32 ]; then P=1; N=1; else P=$IDS; N=128; fi
    /usr/bin/time -f %M -o $T/time $b generate --model $m --prompt-ids $P --max-tokens $N --temp 0 --json --threads 2 >$T/out 2>$T/err || { echo "FAIL $n $mn"; tail -3 $T/err; continue; }
    sp=$(python3 -c "
import json,hashlib
v=json.loads(open('$T/out').read().strip().splitlines()[-1])
print(v.get('process_peak_rss_bytes',0)//1024, round(v['generation_tps'],1),round(v['prompt_tps'],1),hashlib.md5(v['text'].encode()).hexdigest()[:8],hashlib.md5(json.dumps([v['tokens'],v['logprobs']]).encode()).hexdigest()[:8])")
    echo "$r $mn $n $(cat $T/time) $sp (load $(cut -d' ' -f1 /proc/loadavg))"
  done; done; done
rm -rf $T
