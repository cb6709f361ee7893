#!/bin/bash
# s32: evaluates the models of chain_enc.sh as they appear (a finished convert renames its
# temporary sibling, so a directory with config.json is complete), in the order given:
# 4,096 tokens (ppl.sh NAME) of every model first, then 16,384 (ppl.sh NAME 32: NAME:32 in the
# list), as the load left little CPU (usage: chain_ppl.sh NAME[:32]...). Polls until all are done.
cd $(dirname $0)
todo="$*"
while [ -n "$todo" ]; do
  left=""; ran=0
  for n in $todo; do
    if [ $ran = 0 ] && [ -f /tmp/trelcpu/${n%:*}/config.json ]; then
      case $n in *:32) ./ppl.sh ${n%:*} 32;; *) ./ppl.sh $n;; esac
      echo "$n ppl done $(date -u +%H:%M)" >> /tmp/trelcpu/chain_ppl.log; ran=1
    else left="$left $n"; fi
  done
  todo=$left; [ $ran = 0 ] && sleep 30
done
