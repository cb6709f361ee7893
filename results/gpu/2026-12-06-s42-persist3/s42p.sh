#!/bin/bash
# Session 42 (engineer persist3, issue #30): the persistent step as a layer loop
# (MLX_GRAPH_PERSIST_LOOP=1, PS_LOOP: every phase's body inlined in its fixed place, no call a
# phase) against the kernels and session 41's best guess (srs). ONE call of <= 290 s on an H100
# or H200 (cold is fine: the 135M model's setup first), with .gpu/c packed from branch
# h29-persist3 by xtask/gpu/prepare_product_c.sh and this script copied into it:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s42p.sh", timeout_s=290)
# 1. The trace of one step of the layer loop (`srsl`: =2, SPLIT, SMEM, LOOP) and of srs (the
#    same levers, calls through the table of functions): `mlx benchmark`'s warm-up replays the
#    step 4 times and prints, per phase and summed by kind, the span, the blocks' work and the
#    barrier (`[graph persist trace] ...`; the raw trace in p/trace_*.txt).
# 2. The 135M bf16 product path (`mlx benchmark --decoder auto -p 512 -g 128 -n 3`): off (the
#    kernels), srs, srsl, srsl6, 2 rounds interleaved (a run skipped past 190 s): decode tok/s a
#    run. SIDES="..." picks others (srl, p1l, srsl2, srsl1: below).
# 3. persistent_step_equals_the_kernels (graph_decode_cuda) under srsl with the trace on
#    (TEST_ENV): every row's logits and greedy tokens bit-equal to the kernels', on the device
#    (rows not of the loop's shape print why and run the kernels).
# Output: $OUT/s42p.txt (the summary) and $OUT/all.tgz (everything).
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
M=llama-135m-bf16
S=$OUT/s42p.txt
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
# off: the kernels; srs: session 41's levers (=2, SPLIT, SMEM), calls through ps_phases;
# srsl: srs as the layer loop (MLX_GRAPH_PERSIST_LOOP=1); srl: the loop with the table in
# global memory; p1l: the loop with session 40's barrier (=1, no split); srsl6: srsl with 6
# chunks in flight and before the barrier (MLX_GRAPH_PERSIST_CHUNKS=6: down's row group loaded
# before it; spill-free too: README section 3); srsl2, srsl1: 2 and 1 chunks.
side_env() {
  case $1 in
    off) echo "MLX_GRAPH_PERSIST=0" ;;
    srs) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1" ;;
    srsl) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_LOOP=1" ;;
    srl) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_LOOP=1" ;;
    p1l) echo "MLX_GRAPH_PERSIST=1 MLX_GRAPH_PERSIST_LOOP=1" ;;
    srsl6) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_LOOP=1 MLX_GRAPH_PERSIST_CHUNKS=6" ;;
    srsl2) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_LOOP=1 MLX_GRAPH_PERSIST_CHUNKS=2" ;;
    srsl1) echo "MLX_GRAPH_PERSIST=2 MLX_GRAPH_PERSIST_SPLIT=1 MLX_GRAPH_PERSIST_SMEM=1 MLX_GRAPH_PERSIST_LOOP=1 MLX_GRAPH_PERSIST_CHUNKS=1" ;;
  esac
}
# 1. The traces (16 tokens, 1 trial: the trace is the warm-up's). Compiles srsl's and srs's
#    sources (~10-30 s each, then cached; the sides add off's and srsl6's).
for t in ${TRACES:-srsl srs}; do
  X=$(side_env $t)
  echo "== trace $t ($X) at $SECONDS s" | tee -a $S
  bench trace_$t 16 1 $X MLX_GRAPH_PERSIST_TRACE=$OUT/p/trace_$t.txt
  grep -h '\[graph persist trace\] \(kind\|step\|failed\)' $OUT/p/trace_$t.err | cut -c1-200 | tee -a $S
done
# 2. The sides, 2 rounds interleaved; past 190 s the rest are skipped, so that the test runs.
SIDES=${SIDES:-"off srs srsl srsl6"}
for r in 1 2; do
  for side in $SIDES; do
    [ $SECONDS -gt 190 ] && { echo "== round $r $side skipped at $SECONDS s" | tee -a $S; continue; }
    X=$(side_env $side)
    echo "== round $r $side ($X) at $SECONDS s" | tee -a $S
    bench bench_${r}_$side 128 3 $X
  done
done
# 3. The bits on the device under the layer loop, with the trace on (every persistent decoder
#    of the test writes its trace each step, so its bits are also the traced step's).
TEST_ENV=${TEST_ENV:-"$(side_env srsl) MLX_GRAPH_PERSIST_TRACE=/tmp/ptest-trace-%p.txt"}
echo "== test under $TEST_ENV at $SECONDS s" | tee -a $S
PARTS=test TESTS=persistent_step_equals_the_kernels TEST_ENV="$TEST_ENV" TEST_S=$((280 - SECONDS)) \
  BUDGET_S=$((282 - SECONDS)) TAG=ptest bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah 'persist row\|test result\|panicked\|rc=' $OUT/graph_test.log | cut -c1-240 | tee -a $S
# If the budget cut the test (no "test result"), run it alone in a call of its own:
#   PARTS=test TESTS=persistent_step_equals_the_kernels TEST_ENV="..." TEST_S=240 bash .gpu/c/measure.sh
echo "== done at $SECONDS s" | tee -a $S
cp $S /tmp/s42p.txt
cd $OUT && tar czf /tmp/all.tgz . ; mv /tmp/all.tgz $OUT/all.tgz; \
  find . -mindepth 1 ! -name all.tgz ! -name s42p.txt -delete
