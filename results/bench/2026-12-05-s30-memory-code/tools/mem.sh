#!/bin/bash
# mem.sh ROUNDS NAME=BIN... -- MODEL... : per run VmHWM (time %M), and at exit (dump.so) the binary's
# r-xp / r--p Rss, RssAnon, RssFile, present text pages and touched 64K windows (pm.so).
# prints: round model name VmHWM_KiB text_rss ro_rss rssanon rssfile pm(pages windows) dec_tps pre_tps md5
ROUNDS=$1; shift; BINS=(); while [ "$1" != "--" ]; do BINS+=("$1"); shift; done; shift
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
IDS=$(seq -s, 1 512); T=$(mktemp -d)
for r in $(seq 1 $ROUNDS); do for m in "$@"; do
  if [ $((r % 2)) = 1 ]; then L=("${BINS[@]}"); else L=(); for ((i=${#BINS[@]}-1;i>=0;i--)); do L+=("${BINS[$i]}"); done; fi
  for nb in "${L[@]}"; do n=${nb%%=*}; b=${nb#*=}; mn=$(basename $m)
    if [ "$mn" = dense_f32 ]; then P=1; N=1; else P=$IDS; N=128; fi
    /usr/bin/time -f %M -o $T/time env SMAPS_OUT=$T/d PM_MATCH=$(basename $b) LD_PRELOAD=/tmp/cpuproc/tools/dump.so:/tmp/cpuproc/tools/pm.so $b generate --model $m --prompt-ids $P --max-tokens $N --temp 0 --json --threads 2 >$T/out 2>$T/err || { echo FAIL; tail -3 $T/err; continue; }
    bn=$(basename $(readlink -f $b))
    read tx ro < <(awk -v b="$bn" '/^[0-9a-f]+-[0-9a-f]+ /{cur=""; if(index($0,b)) cur=$2} /^Rss:/{ if(cur=="r-xp")t+=$2; if(cur=="r--p")o+=$2} END{print t+0,o+0}' $T/d.smaps)
    an=$(awk '/^RssAnon/{print $2}' $T/d.status); fi_=$(awk '/^RssFile/{print $2}' $T/d.status)
    pm=$(grep '^PM' $T/err | awk '{print $6"p/"$9"w"}')
    sp=$(python3 -c "
import json,hashlib
v=json.loads(open('$T/out').read().strip().splitlines()[-1])
print(round(v['generation_tps'],1),round(v['prompt_tps'],1),hashlib.md5(v['text'].encode()).hexdigest()[:8])")
    echo "$r $mn $n $(cat $T/time) $tx $ro $an $fi_ $pm $sp"
  done; done; done
rm -rf $T
