#!/bin/bash
# s34 (engineer trelidx): one chain, one job at a time (an encode uses both cores), in the order
# given; s33 trelqual's chain.sh with the new code. NAME = encode it (conv.sh) then its
# 4,096-token perplexity (ppl.sh NAME); NAME:32 = its 16,384-token perplexity (ppl.sh NAME 32).
# SmolLM2-135M f16 (from its GGUF), LDLQ with s30's 36k-token Hessian (Genesis + 80 Days),
# default blocks (64), the seed from the name:
#   g12-sN : trellis-3, --q-trellis-code gauss8s --q-trellis-l 12   (the new code)
#   g7-sN  : trellis-3, --q-trellis-code gauss7s --q-trellis-l 12   (its 128-entry twin, 00:45)
#   t2g-sN : trellis-2, --q-trellis-code gauss8s --q-trellis-l 12
# usage: nice -n 5 ./chain.sh NAME[:32]...   (log: chain.log here)
cd $(dirname $0)
H=/work/trellis-models/s30/hess_gen80d.safetensors
F=/work/trellis-models/smol-f16
L=$(pwd)/chain.log
for n in "$@"; do
  case $n in *:32) ./ppl.sh ${n%:*} 32; echo "$n ppl32 rc $? $(date -u +%H:%M)" >> $L; continue;; esac
  s=${n##*-s}
  case $n in
    g12-*) a="--q-bits 3 --q-trellis-code gauss8s --q-trellis-l 12";;
    g7-*) a="--q-bits 3 --q-trellis-code gauss7s --q-trellis-l 12";;
    t2g-*) a="--q-bits 2 --q-trellis-code gauss8s --q-trellis-l 12";;
    *) echo "unknown $n" >> $L; continue;;
  esac
  ./conv.sh $n $F -q --q-mode trellis $a --q-hessians $H --q-seed $s
  echo "$n conv rc $? $(date -u +%H:%M)" >> $L
  ./ppl.sh $n; echo "$n ppl rc $? $(date -u +%H:%M)" >> $L
done
