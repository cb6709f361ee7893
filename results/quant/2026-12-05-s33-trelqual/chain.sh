#!/bin/bash
# s33 (engineer trelqual): one chain, one job at a time (an encode uses both cores), in the order
# given. NAME = encode it (conv.sh) then its 4,096-token perplexity (ppl.sh NAME); NAME:32 = its
# 16,384-token perplexity (ppl.sh NAME 32). SmolLM2-135M f16 (from its GGUF), LDLQ with s30's
# 36k-token Hessian (Genesis + 80 Days), default blocks (64), the seed from the name:
#   h12-sN : trellis-3, --q-trellis-code 1mad8h --q-trellis-l 12   (the new code)
#   m12-sN : trellis-3, --q-trellis-code 1mad   --q-trellis-l 12   (today's default; s32's m12-s0
#            in /tmp/trelcpu was made with no code/L flags: the same parameters)
#   t2h-sN : trellis-2, --q-trellis-code 1mad8h --q-trellis-l 12
#   t2m-sN : trellis-2, --q-trellis-code 1mad   --q-trellis-l 12   (added at 22:55: t2h-s0's like)
# usage: nice -n 5 ./chain.sh NAME[:32]...   (log: /tmp/trelqual/chain.log)
cd $(dirname $0)
H=/work/trellis-models/s30/hess_gen80d.safetensors
F=/work/trellis-models/smol-f16
for n in "$@"; do
  case $n in *:32) ./ppl.sh ${n%:*} 32; echo "$n ppl32 rc $? $(date -u +%H:%M)" >> /tmp/trelqual/chain.log; continue;; esac
  s=${n##*-s}
  case $n in
    h12-*) a="--q-bits 3 --q-trellis-code 1mad8h --q-trellis-l 12";;
    m12-*) a="--q-bits 3 --q-trellis-code 1mad --q-trellis-l 12";;
    t2h-*) a="--q-bits 2 --q-trellis-code 1mad8h --q-trellis-l 12";;
    t2m-*) a="--q-bits 2 --q-trellis-code 1mad --q-trellis-l 12";;
    *) echo "unknown $n" >> /tmp/trelqual/chain.log; continue;;
  esac
  if [ -f /tmp/trelcpu/$n/config.json ]; then echo "$n: /tmp/trelcpu/$n exists" >> /tmp/trelqual/chain.log
  else ./conv.sh $n $F -q --q-mode trellis $a --q-hessians $H --q-seed $s
    echo "$n conv rc $? $(date -u +%H:%M)" >> /tmp/trelqual/chain.log; fi
  ./ppl.sh $n; echo "$n ppl rc $? $(date -u +%H:%M)" >> /tmp/trelqual/chain.log
done
