#!/bin/bash
# Session 41 (engineer persist2, issue #30): where the persistent step's time goes, and its
# levers. ONE call of <= 280 s on an H100 (cold is fine: the 135M model's setup first), with
# .gpu/c packed from branch h28-persist2 by xtask/gpu/prepare_product_c.sh and this script and
# xtask/gpu/trace_summary.py copied into it:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s41p.sh", timeout_s=290)
# 1. The trace of one persistent step (MLX_GRAPH_PERSIST_TRACE=PATH): `mlx benchmark`'s
#    warm-up replays the step 4 times at its position and prints, per phase and summed by kind,
#    the span, the blocks' work and the barrier (lines `[graph persist trace] ...`; the raw
#    trace, a line a block and phase, in trace_*.txt). First session 40's step as it is
#    (MLX_GRAPH_PERSIST=1), then the levers together (`srs` below).
#    Then the kernels' own timeline (MLX_GRAPH_TRACE, xtask/gpu/trace_summary.py copied into
#    .gpu/c too), for the comparison.
# 2. The 135M bf16 product path (`mlx benchmark --decoder auto -p 512 -g 128 -n 3`): the
#    kernels (MLX_GRAPH_PERSIST=0), session 40's step (=1) and the levers (SIDES), 2 rounds
#    interleaved (a run skipped past 185 s): decode tok/s a run.
# 3. persistent_step_equals_the_kernels (graph_decode_cuda) under the best lever (TEST_ENV,
#    with the trace on): every row's logits and greedy tokens bit-equal to the kernels', on the
#    device.
# Output: $OUT/s41p.txt (the summary) and $OUT/all.tgz (everything).
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
M=llama-135m-bf16
S=$OUT/s41p.txt
[ -d /opt/models/$M ] || PARTS="setup" MODELS="$M" BUDGET_S=90 TAG=setup bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== setup done at $SECONDS s; built from $(cat .gpu/c/built-from 2>/dev/null)" | tee -a $S
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin $OUT/p && xz -dc .gpu/c/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $S
bench() {  # tag, generated tokens, trials, env...
  local tag=$1 g=$2 n=$3; shift 3
  env "$@" timeout 60 /opt/bin/mlx benchmark --model /opt/models/$M -p 512 -g $g -n $n --json \
    --decoder auto > $OUT/p/$tag.json 2> $OUT/p/$tag.err
  echo "rc=$?" >> $OUT/p/$tag.err
  grep -h '"averages"' $OUT/p/$tag.json | cut -c1-130 | tee -a $S
  grep -h '\[graph persist\]\|rc=' $OUT/p/$tag.err | cut -c1-200 | tee -a $S
}
# 1. The traces (16 tokens, 1 trial: the trace is the warm-up's).
for t in p1 srs; do
  case $t in
    p1) X="MLX_GRAPH_PERSIST=1" ;;
    srs) X="MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1" ;;
  esac
  echo "== trace $t ($X) at $SECONDS s" | tee -a $S
  bench trace_$t 16 1 $X MLX_GRAPH_PERSIST_TRACE=$OUT/p/trace_$t.txt
  grep -h '\[graph persist trace\] \(kind\|step\|failed\)' $OUT/p/trace_$t.err | cut -c1-200 | tee -a $S
done
# The kernels' own timeline at 135M (MLX_GRAPH_TRACE: a traced copy of the step, each block's
# entry, wait, prologue and end; .gpu/c/trace_summary.py: release, prologue and stream a kernel,
# the kernels' side of the comparison).
echo "== kernel trace at $SECONDS s" | tee -a $S
bench ktrace 16 1 MLX_GRAPH_PERSIST=0 MLX_GRAPH_TRACE=$OUT/p/ktrace-%p.txt
for f in $OUT/p/ktrace-*.txt; do python3 .gpu/c/trace_summary.py --blocks 5 "$f"; done > $OUT/p/ktrace_summary.txt 2>&1
head -12 $OUT/p/ktrace_summary.txt | cut -c1-200 | tee -a $S
# 2. The sides: name and environment (each new source is compiled once, ~10-30 s, then cached;
#    the traces' sources are p1's and srs's, the kernel trace's off's: 2 more compiles, srs6's
#    and sr's. The sides are in order of need; past 185 s the rest are skipped, so that the test
#    runs).
# off: the kernels; b1: the kernels at one block of a matrix-vector kernel an SM
# (MLX_GRAPH_BLOCKS_PER_SM=1, added by the lead after the branch: the next kernel's blocks
# resident early, loading their weights before their wait; the same source, no compile); p1: session 40's step; sr: the split barrier (PS_SPLIT) by release/acquire
# (PS_BARRIER_RA); sra: the same with relaxed polls and one acquire load (PS_POLL_RELAXED);
# srs: sr with the table and the phases' functions in shared memory (MLX_GRAPH_PERSIST_SMEM=1);
# srs6: srs with 6 chunks in flight and before the barrier (MLX_GRAPH_PERSIST_CHUNKS=6: down's
# row group all loaded before it); srs66: srs on 66 blocks (MLX_GRAPH_PERSIST_BLOCKS=66).
# Also defined (SIDES="..." to pick): split (=1 SPLIT), sra (sr with relaxed polls and one
# acquire load), sr6, srs2 (srs at 2 blocks an SM: 128 registers), p66, split66, mb2.
SIDES=${SIDES:-"off b1 srs p1 srs66 srs6"}
side_env() {
  case $1 in
    off) echo "MLX_GRAPH_PERSIST=0" ;;
    b1) echo "MLX_GRAPH_PERSIST=0 MLX_GRAPH_BLOCKS_PER_SM=1" ;;
    p1) echo "MLX_GRAPH_PERSIST=1" ;;
    split) echo "MLX_GRAPH_PERSIST=1 MLX_GRAPH_PERSIST_SPLIT=1" ;;
    sr) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1" ;;
    sr66) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_BLOCKS=66" ;;
    sr6) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_CHUNKS=6" ;;
    srs) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1" ;;
    srs6) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_CHUNKS=6" ;;
    srs66) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_BLOCKS=66" ;;
    srs2) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_MIN_BLOCKS=2" ;;
    sra) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_POLL=1" ;;
    sra66) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_POLL=1 MLX_GRAPH_PERSIST_BLOCKS=66" ;;
    split66) echo "MLX_GRAPH_PERSIST=1 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_BLOCKS=66" ;;
    p66) echo "MLX_GRAPH_PERSIST=1 MLX_GRAPH_PERSIST_BLOCKS=66" ;;
    mb2) echo "MLX_GRAPH_PERSIST=1 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_MIN_BLOCKS=2" ;;
  esac
}
for r in 1 2; do
  for side in $SIDES; do
    [ $SECONDS -gt 140 ] && { echo "== round $r $side skipped at $SECONDS s" | tee -a $S; continue; }
    X=$(side_env $side)
    echo "== round $r $side ($X) at $SECONDS s" | tee -a $S
    bench bench_${r}_$side 128 3 $X
  done
done
# 3. The bits on the device under the best lever.
# (With the trace on: every persistent decoder of the test writes its trace each step, so its
# bits are also the traced step's.)
TEST_ENV=${TEST_ENV:-"MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_TRACE=/tmp/ptest-trace-%p.txt"}
echo "== test under $TEST_ENV at $SECONDS s" | tee -a $S
PARTS=test TESTS=persistent_step_equals_the_kernels TEST_ENV="$TEST_ENV" TEST_S=$((222 - SECONDS)) \
  BUDGET_S=$((224 - SECONDS)) TAG=ptest bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah 'persist row\|test result\|panicked\|rc=' $OUT/graph_test.log | cut -c1-240 | tee -a $S
# If the budget cut the test (no "test result"), run it alone in a call of its own:
#   PARTS=test TESTS=persistent_step_equals_the_kernels TEST_ENV="..." TEST_S=240 bash .gpu/c/measure.sh
echo "== done at $SECONDS s" | tee -a $S
cp $S /tmp/s41p.txt
cd $OUT && tar czf /tmp/all.tgz . ; mv /tmp/all.tgz $OUT/all.tgz; \
  find . -mindepth 1 ! -name all.tgz ! -name s41p.txt -delete
