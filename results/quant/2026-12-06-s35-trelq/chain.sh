#!/bin/bash
# s35 (engineer trelq): one chain, one job at a time (an encode uses both cores), in the order
# given; s34 trelidx's chain.sh with this session's variants. NAME = encode it (conv.sh) then its
# 4,096-token perplexity (ppl.sh NAME); NAME:32 = its 16,384-token perplexity (ppl.sh NAME 32).
# SmolLM2-135M f16 (from its GGUF), trellis-3, LDLQ with s30's 36k-token Hessian (Genesis + 80
# Days, rebuilt here: hess_gen80d.log), default blocks (64), the seed from the name:
#   m12-sN   : --q-trellis-code 1mad --q-trellis-l 12     (today's default)
#   g7-sN    : --q-trellis-code gauss7s --q-trellis-l 12  (s34's fast table code)
#   g7gX-sN  : g7 with MLX_TRELLIS_GRID (X=a: 0.9,1,1.1; X=b: 0.8,0.9,1; X=c: 1,1.1,1.2)
#   g7l13-sN, g7l14-sN : gauss7s at L 13 / 14
#   g7dX-sN  : g7 with MLX_TRELLIS_DAMP=X (e.g. g7d0.03-s0)
# usage: nice -n 5 ./chain.sh NAME[:32]...   (log: chain.log here)
cd $(dirname $0)
H=/work/trelq-data/hess_gen80d.safetensors
F=/work/trelq-data/smol-f16
L=$(pwd)/chain.log
for n in "$@"; do
  case $n in *:32) ./ppl.sh ${n%:*} 32; echo "$n ppl32 rc $? $(date -u +%H:%M)" >> $L; continue;; esac
  s=${n##*-s}
  unset MLX_TRELLIS_GRID MLX_TRELLIS_DAMP
  case $n in
    m12-*) a="--q-trellis-code 1mad --q-trellis-l 12";;
    g7-*) a="--q-trellis-code gauss7s --q-trellis-l 12";;
    g7ga-*) a="--q-trellis-code gauss7s --q-trellis-l 12"; export MLX_TRELLIS_GRID=0.9,1,1.1;;
    g7gb-*) a="--q-trellis-code gauss7s --q-trellis-l 12"; export MLX_TRELLIS_GRID=0.8,0.9,1;;
    g7gc-*) a="--q-trellis-code gauss7s --q-trellis-l 12"; export MLX_TRELLIS_GRID=1,1.1,1.2;;
    g7l13-*) a="--q-trellis-code gauss7s --q-trellis-l 13";;
    g7l14-*) a="--q-trellis-code gauss7s --q-trellis-l 14";;
    g7d*-*) d=${n#g7d}; export MLX_TRELLIS_DAMP=${d%-s*}; a="--q-trellis-code gauss7s --q-trellis-l 12";;
    *) echo "unknown $n" >> $L; continue;;
  esac
  ./conv.sh $n $F -q --q-mode trellis --q-bits 3 $a --q-hessians $H --q-seed $s
  echo "$n conv rc $? $(date -u +%H:%M)" >> $L
  ./ppl.sh $n; echo "$n ppl rc $? $(date -u +%H:%M)" >> $L
done
