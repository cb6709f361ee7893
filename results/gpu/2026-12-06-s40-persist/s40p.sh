#!/bin/bash
# Session 40 (engineer persist): the persistent step (MLX_GRAPH_PERSIST=1) on the device, ONE
# call of <= 300 s on a warm H100 with .gpu/c packed from branch h27-persist (the mlx and
# graph_test binaries, fixtures):
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s40p.sh")   (this script copied in)
# 1. The 135M bfloat16 product path (`mlx benchmark --decoder auto`, prompt 512, 128 tokens,
#    3 trials a run), without and with MLX_GRAPH_PERSIST=1 (and =2: the grid barrier by a
#    release atomic and acquire polls instead of fences), interleaved, 3 rounds (a run skipped
#    past 170 s): decode tok/s a run (the JSON's averages) into $OUT/s40p.txt; each persistent
#    run's stderr says whether the decoder took the persistent step (one `[graph persist]` line).
# 2. persistent_step_equals_the_kernels (graph_decode_cuda): tokens and logits of the
#    persistent step against the kernels', bit for bit, on the small llama rows and a
#    135M-shaped llama (bf16 and 4-bit), 32 steps each way.
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
M=llama-135m-bf16
[ -d /opt/models/$M ] || PARTS="setup" MODELS="$M" BUDGET_S=90 TAG=setup bash .gpu/c/measure.sh > /dev/null 2>&1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin && xz -dc .gpu/c/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $OUT/s40p.txt
for r in 1 2 3; do
  for side in off on ra; do
    [ $SECONDS -gt 170 ] && { echo "== round $r $side skipped at $SECONDS s" | tee -a $OUT/s40p.txt; continue; }
    case $side in on) X=MLX_GRAPH_PERSIST=1 ;; ra) X=MLX_GRAPH_PERSIST=2 ;; *) X=MLX_GRAPH_PERSIST=0 ;; esac
    echo "== round $r $side ($X) at $SECONDS s" | tee -a $OUT/s40p.txt
    env $X timeout 60 /opt/bin/mlx benchmark --model /opt/models/$M -p 512 -g 128 -n 3 --json \
      --decoder auto > $OUT/bench_${r}_$side.json 2> $OUT/bench_${r}_$side.err
    echo "rc=$?" >> $OUT/bench_${r}_$side.err
    grep -h '"averages"' $OUT/bench_${r}_$side.json $OUT/bench_${r}_$side.err | cut -c1-200 | tee -a $OUT/s40p.txt
    grep -h 'persistent step\|MLX_GRAPH_PERSIST\|rc=' $OUT/bench_${r}_$side.err | cut -c1-200 | tee -a $OUT/s40p.txt
  done
done
PARTS=test TESTS=persistent_step_equals_the_kernels TEST_S=$((292 - SECONDS)) \
  BUDGET_S=$((296 - SECONDS)) TAG=test bash .gpu/c/measure.sh > /dev/null 2>&1
grep -ah 'persist row\|persistent step of\|test result\|panicked\|rc=' $OUT/graph_test.log | cut -c1-240 | tee -a $OUT/s40p.txt
# If the budget cut the test (no "test result"), run it alone in a call of its own:
#   PARTS=test TESTS=persistent_step_equals_the_kernels TEST_S=240 bash .gpu/c/measure.sh
echo s40p-done at $SECONDS | tee -a $OUT/s40p.txt
