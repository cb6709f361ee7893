#!/bin/bash
# NVRTC 13.5.37 sm_90 (PyPI wheels; s35's copy in /work/gpug7-tmp, read only) on main d713014b's
# kernels, this branch's without TRELLIS_V_L (a one-spec model's source) and with
# TRELLIS_V_L 12 (the hybrid: v_proj 1mad L 12, l_arg 12). Section 4 of the README.
set -eu
export NVRTC_LIB=/work/gpug7-tmp/nvidia/cu13/lib/libnvrtc.so.13 NVDISASM=/work/gpug7-tmp/nvidia/cu13/bin/nvdisasm
R=results/gpu/2026-12-06-s36-trelmix
T=/tmp/trelmix
mkdir -p $T/main-tree
git archive d713014b xtask/gpu mlx-kernels/src | tar -x -C $T/main-tree
python3 $T/main-tree/xtask/gpu/sass.py --trellis --kernel trellis_qkv --dump $T/main.sass > $R/sass-resources-main.txt
python3 xtask/gpu/sass.py --trellis --kernel trellis_qkv --dump $T/branch.sass > $R/sass-resources-onespec.txt
python3 xtask/gpu/sass.py --trellis --trellis-v-l 12 --kernel trellis_qkv --dump $T/hybrid.sass > $R/sass-resources-hybrid.txt
(cd $T && sha256sum main.sass branch.sass hybrid.sass) > $R/sass-dumps.sha256
python3 results/gpu/2026-12-06-s35-gpug7/sass_loops.py $T/main.sass trellis_qkv > $R/sass-loops-qkv-main.txt
python3 results/gpu/2026-12-06-s35-gpug7/sass_loops.py $T/hybrid.sass trellis_qkv > $R/sass-loops-qkv-hybrid.txt
python3 $R/sass_compare.py $T/main.sass $T/hybrid.sass > $R/sass-compare.txt
