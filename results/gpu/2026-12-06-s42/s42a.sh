#!/bin/bash
# Session 42, call 1 (issue #30): one start for three things, <= 595 s on an H100 or an H200,
# .gpu/c packed from main by xtask/gpu/prepare_product_c.sh with this script, s41p.sh and
# xtask/gpu/trace_summary.py copied into it:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s42a.sh", timeout_s=595)
# 1. setup: the 135M-shaped llama bf16 and the Llama-3.1-8B-shaped 4-bit model.
# 2. 8B: the product path (`mlx benchmark --decoder auto`) beside `mlx_lm benchmark` with the
#    copy bandwidth (measure.sh's bench part), then MLX_GRAPH_BLOCKS_PER_SM=1 against the
#    default twice, alternating (one block of a matrix-vector kernel an SM: room for the next
#    kernel's blocks to start early).
# 3. s41p.sh (session 41's persistent-step recipe, as written; it finds the 135M model here):
#    the traces, the 135M sides (off b1 p1 srs srs66 srs6 sr), the bits under srs.
# Output: $OUT/s41p.txt (both summaries) and $OUT/all.tgz.
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
S=$OUT/s41p.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
MODELS="llama-135m-bf16 llama31-8b-q4" WARM="llama31-8b-q4" PARTS="setup" BUDGET_S=150 TAG=setup \
  bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== setup done at $SECONDS s; built from $(cat .gpu/c/built-from 2>/dev/null)" | tee -a $S
mkdir -p $OUT/s0 && mv $OUT/*.log $OUT/*.tgz $OUT/s0/ 2>/dev/null
mkdir -p $OUT/b8
OUT=$OUT/b8 BENCH_SIDES="graph mlxlm" ROUNDS=1 PARTS=bench BENCH_MODELS="llama31-8b-q4" \
  BUDGET_S=$((200 - SECONDS)) TAG=bench bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "averages\|Averages\|== round\|copy bandwidth\|peak" $OUT/b8/bench.log $OUT/b8/copy_bw.log 2>/dev/null \
  | cut -c1-220 | tee -a $S
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin && xz -dc .gpu/c/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx
for r in 1 2; do
  for side in b1 off; do
    [ $SECONDS -gt 250 ] && { echo "== 8b $r $side skipped at $SECONDS s" | tee -a $S; continue; }
    X="MLX_GRAPH_PERSIST=0"; [ $side = b1 ] && X="$X MLX_GRAPH_BLOCKS_PER_SM=1"
    echo "== 8b round $r $side ($X) at $SECONDS s" | tee -a $S
    env $X timeout 60 /opt/bin/mlx benchmark --model /opt/models/llama31-8b-q4 -p 512 -g 128 -n 3 \
      --json --decoder auto > $OUT/b8/8b_${r}_$side.json 2> $OUT/b8/8b_${r}_$side.err
    grep -h '"averages"' $OUT/b8/8b_${r}_$side.json | cut -c1-130 | tee -a $S
  done
done
echo "== s41p at $SECONDS s" | tee -a $S
T0=$SECONDS
bash .gpu/c/s41p.sh
echo "== all done at $((T0 + SECONDS)) s" >> $OUT/s41p.txt
