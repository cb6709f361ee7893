#!/bin/bash
# Device call 2 for the compiled decode step (issue #15): the copy bandwidth, `xtask bench`
# (ours with the compiled step vs mlx-lm, alternating), our uncompiled decode for comparison,
# and our per-step phase timings (graph build, async_eval, sync) compiled and not.
# Results under $OUT. MODELS picks the bench models (default the two 135M-shaped ones).
set -x
source .gpu/b/env.sh
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' || exit 1
MODELS=${MODELS:-"llama-135m-q4 llama-135m-bf16"}
python3 - <<'PY' 2>&1 | tee "$OUT/copy_bandwidth.txt"
import time, mlx.core as mx
x = mx.random.normal((256 * 1024 * 1024,)).astype(mx.bfloat16)  # 512 MB
mx.eval(x)
ts = []
for _ in range(20):
    t = time.perf_counter(); y = mx.array(x * 1); mx.eval(y); ts.append(time.perf_counter() - t)
ts.sort(); t = ts[len(ts) // 2]
print(f"copy (x * 1, bf16, 512 MB read + 512 MB written): median {t * 1e3:.3f} ms = {2 * x.nbytes / t / 1e9:.0f} GB/s")
PY
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
mkdir -p /tmp/ov/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/ov/bin/python && chmod +x /tmp/ov/bin/python
export MLX_ORACLE_VENV=/tmp/ov
CONFIGS=""
for m in $MODELS; do CONFIGS="$CONFIGS --config $m:keep:512:128"; done
set -o pipefail
.gpu/b/xtask bench --ours-bin "$PWD/.gpu/b/bench_generate" --device gpu --models-dir /tmp/bench-models \
  --rounds "${ROUNDS:-3}" --json "$OUT/gpu_bench.json" $CONFIGS 2>&1 | tee "$OUT/gpu_bench.log"
for m in $MODELS; do
  for c in off auto; do
    timeout 120 .gpu/b/bench_generate --model /tmp/bench-models/$m --dtype keep --prompt-len 512 \
      --gen-len 128 --trials 3 --device gpu --compiled $c --step-timing 32 \
      > "$OUT/ours_${m}_$c.json" 2> "$OUT/ours_${m}_$c.err"
    tail -c 1500 "$OUT/ours_${m}_$c.json"; echo
  done
done
nvidia-smi --query-gpu=name,driver_version --format=csv
