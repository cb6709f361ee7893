#!/bin/bash
# s32: the encodes. SmolLM2-135M f16 (from its GGUF), trellis-3, default blocks (no
# --q-group-size: 64), LDLQ with s30's 36k-token Hessian (Genesis + 80 Days), seeds 0-2:
#   i8l8-sN : --q-trellis-code 1mad8 --q-trellis-l 8    (the fast CPU kernel)
#   m12-sN  : 1mad, L 12 (no --q-trellis-l: today's default)
#   m8-sN   : 1mad, L 8
#   i8g32-sN: --q-trellis-code 1mad8 --q-trellis-l 8 --q-group-size 32 (added after i8l8-s0's
#             4,096-token figure: blocks of 32 are what every near-target 3-bit row used)
# usage: chain_enc.sh NAME...  (run as two chains: the slow L 12 ones, and the rest)
cd $(dirname $0)
H=/work/trellis-models/s30/hess_gen80d.safetensors
F=/work/trellis-models/smol-f16
for n in "$@"; do
  s=${n##*-s}
  case $n in
    i8l8-*) a="--q-trellis-code 1mad8 --q-trellis-l 8";;
    m12-*) a="";;
    m8-*) a="--q-trellis-l 8";;
    i8g32-*) a="--q-trellis-code 1mad8 --q-trellis-l 8 --q-group-size 32";;
  esac
  ./conv.sh $n $F -q --q-mode trellis --q-bits 3 $a --q-hessians $H --q-seed $s
  echo "$n rc $? $(date -u +%H:%M)" >> /tmp/trelcpu/chain_enc.log
done
