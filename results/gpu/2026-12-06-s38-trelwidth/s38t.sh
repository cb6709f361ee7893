#!/bin/bash
# Session 38 (trelwidth), one device call, PREPARED, NOT RUN: the trellis kernels' switches chosen
# per model by its hidden width (graph_trellis.rs TrellisSwitches: 1,024-thread fused blocks,
# ALIAS and PIPE from hidden 4,096, the kernels' own defaults below), then whether
# MLX_GRAPH_TRELLIS_STATES=1 and MLX_GRAPH_TRELLIS_PAIR=1 should join the 8B's choice.
#
# Needs: a warm H100/H200 whose /opt/models holds llama-135m-q4 and llama31-8b-q4 (measure.sh's
# setup part done), and .gpu/c from a bundle of this branch (prepare_product[_c].sh: mlx.xz,
# kernels_test.xz, graph_test.xz, fixtures.tar.xz, measure.sh and trellis_bench_model.py).
#   run(carry=[".gpu/c"], timeout_s=330, command="bash results/gpu/2026-12-06-s38-trelwidth/s38t.sh")
# Logs: $OUT/tr (speed), $OUT/k (kernel test), $OUT/t (follow test), each measure.sh's
# logs-TAG.tgz and parts.log. Under 300 s: each part is capped (BUDGET_S, KTEST_S, TEST_S) and
# skipped when its share is not left (parts.log says so).
export MLX_GRAPH_MEMORY=1 MLXS_GPURT_CACHE=/tmp/gpurt-cache
# No switch forced from outside: every side below names its own.
unset MLX_GRAPH_TRELLIS_THREADS MLX_GRAPH_TRELLIS_ALIAS MLX_GRAPH_TRELLIS_PIPE MLX_GRAPH_TRELLIS_SPLIT \
  MLX_GRAPH_TRELLIS_STATES MLX_GRAPH_TRELLIS_PAIR MLX_GRAPH_TRELLIS_PREFETCH MLX_GRAPH_TRELLIS_ROWS2

# 1. Speed (<= 125 s): the trellis-3 default twins (t3hy: gauss7s L 12 blocks of 64, value
#    projections 1mad; written by trellis_bench_model.py), `mlx benchmark --decoder graph`,
#    prompt 8, 128 tokens, one trial, four sides each: default (the shape's choice: the 8B
#    wide, the 135M plain; the `[graph memory] ... trellis switches` line records it), states
#    (+STATES=1), pair (+PAIR=1), both. The 8B first: its sides are the question; the 135M's
#    run as far as the budget goes.
export TRELLIS_TWINS=t3hy TRELLIS_DECODERS=graph TRELLIS_ROUNDS=1 P=8 N=1 TRELLIS_BASE=0
TRELLIS_MODELS="llama31-8b-q4 llama-135m-q4" TRELLIS_SIDES="default states pair both" \
  TRELLIS_NEED=60 PARTS=trellis BUDGET_S=125 TAG=tr bash .gpu/c/measure.sh
mkdir -p $OUT/tr && mv $OUT/*.log $OUT/*.tgz $OUT/tr/ 2>/dev/null
unset TRELLIS_TWINS TRELLIS_DECODERS TRELLIS_ROUNDS P N TRELLIS_BASE

# 2. The kernel test under the new defaults (each matrix takes the switches of a model whose
#    hidden width is its narrower side: the 135M's shapes plain, the 8B's wide; ~94 s in s37).
PARTS=ktest KTESTS=trellis_kernels_match_the_cpu_references KTEST_S=97 \
  BUDGET_S=$((228 - SECONDS)) TAG=k bash .gpu/c/measure.sh
mkdir -p $OUT/k && mv $OUT/*.log $OUT/*.tgz $OUT/k/ 2>/dev/null

# 3. The trellis follow rows under the new defaults (~63 s in s37): the test models' hidden
#    widths are small, so this is the plain choice's device check; the 8B's wide choice is
#    checked by the kernel test's 8B shapes and by part 1's generation.
PARTS=test TESTS=graph_decoder_follows_the_mlx_forward \
  MLX_GRAPH_FOLLOW_ROWS=trellis3_b32,trellis3_hybrid_b64 TEST_S=68 \
  BUDGET_S=$((296 - SECONDS)) TAG=t bash .gpu/c/measure.sh
mkdir -p $OUT/t && mv $OUT/*.log $OUT/*.tgz $OUT/t/ 2>/dev/null
echo "s38t-done at $SECONDS s" | tee $OUT/done.txt
