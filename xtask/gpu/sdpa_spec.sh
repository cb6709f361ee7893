#!/bin/bash
# Issue #33 (H200), one call on a bare machine, carrying .gpu/a and .gpu/c (`cargo xtask gpu pack`
# with sdpa_probe.py, spec_gpu.sh and spec_cost.py copied into .gpu/c): installs the mlx CUDA and
# mlx-lm wheels, runs sdpa_probe.py with MLX_CUDA_USE_CUDNN_SDPA unset and =0, writes the echo
# 8B target and echo 135M draft, then spec_gpu.sh (K = 4) with MLX_CUDA_USE_CUDNN_SDPA=0 and, if
# time is left, unset; each part skipped when less than its share of BUDGET_S is left.
# Everything lands in $OUT/logs.tgz, the summary files beside it.
A=.gpu/a; C=.gpu/c
export PYTHONUNBUFFERED=1
B=${BUDGET_S:-320}
left() { echo $((B - SECONDS)); }
log() { echo "== $* at ${SECONDS} s ($(uptime))" | tee -a $OUT/parts.log; }
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
log setup
python3 -m pip install -q --no-index --no-deps --no-compile $A/mlx-0.32.4-*.whl $A/mlx_lm-0.32.2-*.whl
tar xJf $A/support.tar.xz -C "$SITE"
mkdir -p "$SITE/mlx/lib" && xz -dc $A/libmlx-sm90.so.xz > "$SITE/mlx/lib/libmlx.so"
for w in $A/nvidia_cuda_crt-*.whl; do [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile "$w"; done
nvidia-smi --query-gpu=name,memory.used,clocks.max.sm --format=csv | tee -a $OUT/parts.log
for env in unset 0; do
  [ $(left) -lt 60 ] && { log "skip probe $env"; continue; }
  log "probe MLX_CUDA_USE_CUDNN_SDPA=$env"
  if [ $env = unset ]; then
    CALLS=${CALLS:-30} timeout 100 python3 $C/sdpa_probe.py > $OUT/sdpa_cudnn_$env.jsonl 2> $OUT/sdpa_err_$env.log
  else
    MLX_CUDA_USE_CUDNN_SDPA=$env CALLS=${CALLS:-30} timeout 100 python3 $C/sdpa_probe.py > $OUT/sdpa_cudnn_$env.jsonl 2> $OUT/sdpa_err_$env.log
  fi
done
python3 - $OUT/sdpa_cudnn_unset.jsonl $OUT/sdpa_cudnn_0.jsonl > $OUT/sdpa_table.md <<'PY'
import json, sys
rows = []
for f in sys.argv[1:]:
    try:
        rows += [json.loads(l) for l in open(f) if '"q"' in l]
    except OSError:
        pass
print("| MLX_CUDA_USE_CUDNN_SDPA | q | keys | path | first ms | median ms | mean ms |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['cudnn_env']} | {r['q']} | {r['keys']} | {r['path']} | {r['first_ms']} | {r['median_ms']} | {r['mean_ms']} |")
PY
cat $OUT/sdpa_table.md
if [ $(left) -gt 90 ]; then
  log models
  mkdir -p /opt/models /opt/tok && tar xJf $A/tok.tar.xz -C /opt/tok
  timeout 60 python3 $A/bench_models.py /opt/models echo-llama31-8b-q4 echo-llama-135m-v128k-bf16 > $OUT/models.log 2>&1
  for m in /opt/models/*; do cp /opt/tok/tokenizer*.json "$m/"; done
  for env in 0 unset; do
    [ $(left) -lt 45 ] && { log "skip spec $env"; continue; }
    log "spec MLX_CUDA_USE_CUDNN_SDPA=$env"
    if [ $env = 0 ]; then export MLX_CUDA_USE_CUDNN_SDPA=0; else unset MLX_CUDA_USE_CUDNN_SDPA; fi
    SPEC_PAIRS=echo-llama31-8b-q4:echo-llama-135m-v128k-bf16:4 SPEC_ROUNDS=1 SPEC_TOKENS=${SPEC_TOKENS:-128} \
      SPEC_S=40 timeout $(left) bash $C/spec_gpu.sh > $OUT/spec_run_$env.log 2>&1
    for f in spec.jsonl spec_table.md spec_stderr.log; do [ -f $OUT/$f ] && mv $OUT/$f $OUT/${f%%.*}_cudnn_$env.${f#*.}; done
    cat $OUT/spec_table_cudnn_$env.md 2>/dev/null
  done
  unset MLX_CUDA_USE_CUDNN_SDPA
fi
log done
rm -f $OUT/spec_err.tmp
(cd $OUT && tar czf /tmp/logs.tgz . && mv /tmp/logs.tgz logs.tgz && find . -maxdepth 1 -type f ! -name logs.tgz ! -name parts.log ! -name 'sdpa_table.md' ! -name 'spec_table_*' -delete)
