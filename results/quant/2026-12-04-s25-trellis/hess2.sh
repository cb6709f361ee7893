#!/bin/bash
cd /tmp/trellis-work
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
s=$(date +%s)
nice -n 19 /work/s24-mlx-merged convert --hf-path /work/trellis-models/smol-f16 --mlx-path /tmp/trellis-work/smol-f32 --dtype float32 > conv_f32.log 2>&1
LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 OPENBLAS_NUM_THREADS=1 nice -n 19 /work/oracle-venv/bin/python /work/wt-trellis/xtask/quant/trellis_hessians.py /tmp/trellis-work/smol-f32 calib_gen_uly.txt hess_gen_uly.safetensors > hess2.log 2>&1
echo "hess_gen_uly: $(( $(date +%s) - s )) s wall; after: $(uptime)" >> conv_times.txt
# after the g32 chain: convert with these Hessians, then score
while kill -0 $1 2>/dev/null; do sleep 10; done
./conv.sh t3-l12-ldlq-uly -q --q-mode trellis --q-bits 3 --q-trellis-l 12 --q-hessians /tmp/trellis-work/hess_gen_uly.safetensors && ./ppl.sh t3-l12-ldlq-uly
