#!/bin/bash
# s35 trelq: the hybrid "gauss7s L 12 everywhere, 1mad L 12 at every v_proj" (hv-sN) for seeds
# given: encode g7-sN and m12-sN (conv.sh, as chain.sh names them; no 4,096-token ppl of the parts),
# assemble hv-sN = g7-sN with m12-sN's 30 v_proj (swap.py: their tensors bit for bit and a per-path
# quantization entry with "trellis_code": "1mad"), then its 4,096- and 16,384-token perplexity.
cd $(dirname $0)
H=/work/trelq-data/hess_gen80d.safetensors; F=/work/trelq-data/smol-f16; W=/work/trelq-data/models
for s in "$@"; do
  ./conv.sh g7-s$s $F -q --q-mode trellis --q-bits 3 --q-trellis-code gauss7s --q-trellis-l 12 --q-hessians $H --q-seed $s
  echo "g7-s$s conv rc $? $(date -u +%H:%M)" >> chain.log
  ./conv.sh m12-s$s $F -q --q-mode trellis --q-bits 3 --q-trellis-code 1mad --q-trellis-l 12 --q-hessians $H --q-seed $s
  echo "m12-s$s conv rc $? $(date -u +%H:%M)" >> chain.log
done
for s in "$@"; do ./swaps.sh g7-s$s m12-s$s hv-s$s='*:v'; done
for s in "$@"; do ./ppl.sh hv-s$s 32; echo "hv-s$s ppl32 rc $? $(date -u +%H:%M)" >> chain.log; done
