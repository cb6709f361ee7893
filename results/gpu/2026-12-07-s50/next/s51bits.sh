#!/bin/bash
# MLX_GRAPH_MV_BITS=1 on a device (PREPARED in session 50, not run): the mat-vecs compiled for
# the model's codes' widths only. On a warm machine after s50.sh or pick.sh (setup done: the
# 8B 4-bit and the 135M bf16 in /opt/models), .gpu/c from prepare_product_c.sh at a tree with
# the switch and this file copied there:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s51bits.sh", timeout_s=590)
# 1. The NVRTC time: `mlx generate --decoder graph` (8 tokens) on each model with the kernel
#    cache off (MLXS_GPURT_CACHE=off: every module compiled), the switch off then on, the
#    command's wall time (`/usr/bin/time`).
# 2. The same greedy tokens and log-probabilities: `mlx generate --decoder graph --json -m 64`
#    at each setting (cache on), compared.
# 3. Speed: `mlx benchmark --decoder graph` (prompt 512, 128 tokens, 3 trials), off and on
#    alternating, twice a model; then `mlx serve`'s warm-up (its note's "prepared in S s") with
#    the cache off, each setting once.
# Output: $OUT/bits.txt and $OUT/all.tgz.
T0=$SECONDS
S=$OUT/bits.txt
mkdir -p $OUT/b
# The models this needs, where an earlier call did not write them.
for m in llama31-8b-q4 llama-135m-bf16; do
  [ -d /opt/models/$m ] || OUT=$OUT/b PARTS=setup MODELS=$m WARM=" " BUDGET_S=150 \
    bash .gpu/c/measure.sh > $OUT/b/setup-$m.txt 2>&1
done
echo "== setup at $((SECONDS - T0)) s" | tee -a $S
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin && [ -x /opt/bin/mlx ] || { xz -dc .gpu/c/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx; }
MLX=/opt/bin/mlx
P="What is the capital of France? Answer in one long paragraph."
for m in llama31-8b-q4 llama-135m-bf16; do
  for b in 0 1; do
    /usr/bin/time -f "%e s wall" env MLXS_GPURT_CACHE=off MLX_GRAPH_MV_BITS=$b timeout 200 \
      $MLX generate --model /opt/models/$m --decoder graph --prompt "$P" -m 8 > $OUT/b/cold-$m-$b.log 2>&1
    echo "cold $m bits=$b: $(tail -1 $OUT/b/cold-$m-$b.log)" | tee -a $S
  done
  for b in 0 1; do
    env MLXS_GPURT_CACHE=/tmp/gpurt-cache MLX_GRAPH_MV_BITS=$b timeout 120 $MLX generate \
      --model /opt/models/$m --decoder graph --prompt "$P" -m 64 --json > $OUT/b/gen-$m-$b.json 2>$OUT/b/gen-$m-$b.err
  done
  python3 - "$OUT/b/gen-$m-0.json" "$OUT/b/gen-$m-1.json" <<'PY' 2>&1 | tee -a $S
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a.get("tokens") == b.get("tokens") and a.get("logprobs") == b.get("logprobs")
print(f"{sys.argv[1].split('gen-')[1][:-7]}: tokens {len(a.get('tokens') or [])}, same tokens and log-probabilities: {same}")
PY
done
echo "== cold and same at $((SECONDS - T0)) s" | tee -a $S
for i in 1 2; do for m in llama31-8b-q4 llama-135m-bf16; do for b in 0 1; do
  env MLXS_GPURT_CACHE=/tmp/gpurt-cache MLX_GRAPH_MV_BITS=$b timeout 150 $MLX benchmark --model /opt/models/$m \
    -p 512 -g 128 -n 3 --json --decoder graph > $OUT/b/bench-$m-$b-$i.json 2>&1
  echo "bench $m bits=$b round $i: $(grep -o '"generation_tps": *[0-9.]*' $OUT/b/bench-$m-$b-$i.json | tail -1)" | tee -a $S
done; done; done
echo "== bench done at $((SECONDS - T0)) s" | tee -a $S
for b in 0 1; do
  [ $((SECONDS - T0)) -lt 420 ] || break
  env MLXS_GPURT_CACHE=off MLX_GRAPH_MV_BITS=$b setsid $MLX serve --model /opt/models/llama31-8b-q4 --port 8440 \
    --max-batch 16 --decoder graph --log-level info > $OUT/b/serve-$b.err 2>&1 &
  p=$!
  for _ in $(seq 150); do grep -q "prepared in" $OUT/b/serve-$b.err && break; sleep 1; done
  echo "serve warm-up bits=$b: $(grep -o '[0-9]* narrower kernel sets prepared in [0-9.]* s' $OUT/b/serve-$b.err)" | tee -a $S
  kill -- -$p 2>/dev/null; kill $p 2>/dev/null; wait $p 2>/dev/null
done
(cd $OUT && tar czf all.tgz b 2>/dev/null && rm -rf b)
echo "== s51bits done at $((SECONDS - T0)) s" | tee -a $S
