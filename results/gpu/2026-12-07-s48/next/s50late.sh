#!/bin/bash
# MLX_GRAPH_MMA_LATE_NORM=1 in matvec_qkv alone (commit after 21d125a3: matvec's machine code
# instruction for instruction main's, matvec_qkv's the one session 48 measured), on an
# H100/H200, with .gpu/c from prepare_product_c.sh at that tree and this file copied there:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s50late.sh", timeout_s=590)
# 1. batched_throughput, tensor-core tiles (MLX_GRAPH_BATCH_MMA=4), the 8B-shaped 4-bit model,
#    16 and 5 rows, off and on alternating three times (the throughput line only: a run takes
#    8-12 s once the tiles are compiled), then one run a side with 5 replays a part.
# 2. With the switch: batched_equals_single on llama3_q4 and qwen3_q4, then
#    wide_tiles_equal_narrow_tiles (took more than 156 s in session 48: given what is left).
# If 16 and 5 rows both gain and both tests pass, make it the default (graph_decode.rs's
# mma_late_norm: switch_on) and say so in docs/developers.md.
T0=$SECONDS
S=$OUT/late.txt
mkdir -p $OUT/s $OUT/t
OUT=$OUT/s PARTS=setup MODELS=llama31-8b-q4 WARM=" " BUDGET_S=150 bash .gpu/c/measure.sh > $S 2>&1
echo "== setup done at $((SECONDS - T0)) s" | tee -a $S
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache
mkdir -p /opt/bin && xz -dc .gpu/c/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
thru() {  # LATE ROWS SECONDS [BREAKDOWN]
  local f=$OUT/t/thru-$1-$2-$SECONDS.log
  MLX_GRAPH_MMA_LATE_NORM=$1 MLX_GRAPH_BATCH_MMA=4 MLX_GRAPH_BATCH_MODEL=/opt/models/llama31-8b-q4 \
    MLX_GRAPH_BATCH_ROWS=$2 ${4:+MLX_GRAPH_BATCH_BREAKDOWN=$4} \
    timeout $3 /opt/bin/graph_test --ignored --nocapture --test-threads 1 batched_throughput 2>&1 \
    | grep -v "^running\|^$" > $f
  echo "late=$1 rows=$2 $(grep -o '[0-9.]* steps/s' $f | head -1)" | tee -a $S
}
for r in 16 5; do for i in 1 2 3; do thru 0 $r 60; thru 1 $r 60; done; done
for r in 16 5; do thru 0 $r 60 5; thru 1 $r 60 5; done
echo "== throughput done at $((SECONDS - T0)) s" | tee -a $S
left=$((${LATE_END:-560} - (SECONDS - T0)))
MLX_GRAPH_MMA_LATE_NORM=1 MLX_GRAPH_BATCHED_ROWS=llama3_q4,qwen3_q4 timeout $((left * 2 / 5)) \
  /opt/bin/graph_test --test-threads 1 --nocapture batched_equals_single > $OUT/t/batched.log 2>&1
echo "== batched rc $? at $((SECONDS - T0)) s" | tee -a $S
grep -h "test result\|panicked\|batched row\|bit for bit" $OUT/t/batched.log | head -12 | cut -c1-240 | tee -a $S
left=$((${LATE_END:-560} - (SECONDS - T0)))
MLX_GRAPH_MMA_LATE_NORM=1 timeout $left /opt/bin/graph_test --test-threads 1 --nocapture \
  wide_tiles_equal_narrow_tiles > $OUT/t/wide.log 2>&1
echo "== wide rc $? at $((SECONDS - T0)) s" | tee -a $S
grep -h "test result\|panicked\|bit-equal\|row-steps" $OUT/t/wide.log | head -8 | cut -c1-240 | tee -a $S
(cd $OUT && tar czf all.tgz s t 2>/dev/null && rm -rf s t)
echo "== s50late done at $((SECONDS - T0)) s" | tee -a $S
