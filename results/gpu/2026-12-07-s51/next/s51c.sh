#!/bin/bash
# Session 51's third call (cold machine, <= 330 s; not run: prepared for session 52): why the graph decoder's peak memory moves
# between `mlx benchmark` processes (this session's first call: the 8B 6.367 GB in every
# trial, the second call 6.215, session 50 6.228; the 135M's third trial 0.369 against 0.338;
# the MoE's third trial 19.747 against 19.563), and whether session 51's MLX_GRAPH_PROMPT_SYNC
# (the prompt's chunks wait for MLX's CUDA worker to free their intermediates; on by default)
# steadies it. Per model, four `mlx benchmark --decoder auto` processes (prompt 512, 128
# tokens, 3 trials), MLX_GRAPH_PROMPT_SYNC=0 and on alternating, the first with the NVRTC
# kernel cache empty, with MLX_GRAPH_MEMORY=1 (MLX's live, cached and peak bytes and the
# decoder's at each point of a graph run, on stderr). The bundle must be built from a tree
# with the switch (session 51's final tree).
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s51c.sh", timeout_s=330)
# (CUT=S: no process starts after S seconds; default 290.)
# Then, where time is left (MOE_CUT, default 270 s), xtask/gpu/moe_prefill_probe.py 512 2048.
# Output: $OUT/mem.txt (each process's trials and the points where the run's peak rose, the
# probe's sums), $OUT/moe_probe.jsonl and $OUT/all.tgz (the whole stderr).
T0=$SECONDS
S=$OUT/mem.txt
mkdir -p $OUT/m
MODELS="llama31-8b-q4 llama-135m-bf16" WARM=" " PARTS=setup BUDGET_S=150 TAG=setup OUT=$OUT/m \
  bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== setup at $((SECONDS - T0)) s" | tee -a $S
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-mem
mkdir -p /opt/bin && [ -x /opt/bin/mlx ] || { xz -dc .gpu/c/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx; }
rm -rf $MLXS_GPURT_CACHE
for m in llama-135m-bf16 llama31-8b-q4; do
  for i in 1 2 3 4; do
    [ $((SECONDS - T0)) -gt ${CUT:-290} ] && { echo "== $m $i skipped" | tee -a $S; continue; }
    sync=$((1 - i % 2))
    echo "== $m process $i: MLX_GRAPH_PROMPT_SYNC=$sync" | tee -a $S
    MLX_GRAPH_PROMPT_SYNC=$sync MLX_GRAPH_MEMORY=1 timeout 60 /opt/bin/mlx benchmark --model /opt/models/$m -p 512 -g 128 -n 3 \
      --json --decoder auto > $OUT/m/$m-$i.json 2> $OUT/m/$m-$i.err
    echo "== $m process $i rc $? at $((SECONDS - T0)) s" | tee -a $S
    grep -h '"trial"' $OUT/m/$m-$i.json | sed 's/"prompt_tps[^,]*,//; s/"generation_tps[^,]*,//' | tee -a $S
    # Where the run's peak so far rose (the first line of each new value).
    python3 - $OUT/m/$m-$i.err <<'PY' | tee -a $S
import re, sys
last = None
for line in open(sys.argv[1]):
    m = re.search(r"the run's peak so far (\d+) B", line)
    if m and m.group(1) != last:
        last = m.group(1)
        print("  " + line.strip()[:300])
PY
  done
done
# The MoE prefill row (1.07x against >= 1.2x): gather_qmm against a dense expert path on one
# Qwen3-30B-A3B-shaped layer (xtask/gpu/moe_prefill_probe.py), where time is left.
if [ $((SECONDS - T0)) -lt ${MOE_CUT:-270} ]; then
  timeout 50 python3 xtask/gpu/moe_prefill_probe.py 512 2048 > $OUT/moe_probe.jsonl 2> $OUT/m/moe_probe.err
  echo "== moe probe rc $? at $((SECONDS - T0)) s" | tee -a $S
  grep -h '"layers_ms"\|error' $OUT/moe_probe.jsonl | cut -c1-300 | tee -a $S
fi
echo "== done at $((SECONDS - T0)) s" | tee -a $S
cd $OUT && tar czf /tmp/all.tgz m && mv /tmp/all.tgz $OUT/all.tgz && rm -rf m
