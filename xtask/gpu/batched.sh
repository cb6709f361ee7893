#!/bin/bash
# Device call 2 of the batched-decode run (issue #30, run 8), after `product_setup.sh` on the
# same warm machine, carrying .gpu/c (`cargo xtask gpu pack`, then this script copied there):
# 1. graph_decode_cuda's `batched_equals_single` (3 sequences of different lengths in one
#    decoder of 4 rows, one joining and one leaving, teacher-forced against each sequence
#    decoded alone and against the MLX forward; one tile of 4 and two of 2), then the quick
#    engine-backend test, into graph_test.log;
# 2. `batched_throughput` (ignored test: aggregate greedy tokens a second of the graph decoder
#    for ROWS sequences a step, and half of them stepping) on each of THRU_MODELS, with each
#    THRU_MV_ROWS weight rows a warp (2, 4), into throughput.log;
# 3. `mlx serve --decoder graph` (the batch engine on the graph decoder), `--decoder mlx` and
#    mlx_lm.server (SERVE_SIDES) under SERVE_CLIENTS (1,16) streaming clients on SERVE_MODELS,
#    into serve.log (SERVE_CLIENTS=1,16,16 repeats 16 on the warm server). `mlx serve` runs
#    with MLX_SERVE_PROFILE=1 (unless set otherwise): the engine's time by part, one
#    "[serve profile]" line a round (when it goes idle) and the warm-up's, copied into serve.log.
set -x
C=.gpu/c
export PYTHONUNBUFFERED=1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
export MLX_SERVE_PROFILE=${MLX_SERVE_PROFILE-1}
mkdir -p /opt/bin && for b in mlx graph_test; do xz -dc $C/$b.xz > /opt/bin/$b && chmod +x /opt/bin/$b; done
MLX=/opt/bin/mlx
if [ -f $C/fixtures.tar.xz ]; then
  mkdir -p mlx-models/tests/models && tar xJf $C/fixtures.tar.xz -C mlx-models/tests/models
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
if [ -z "$SKIP_TEST" ]; then
  timeout ${TEST_S:-200} /opt/bin/graph_test --test-threads 1 --nocapture batched_equals_single 2>&1 | tee $OUT/graph_test.log | tail -30
fi
for m in ${THRU_MODELS:-llama-135m-bf16 llama31-8b-q4}; do
  for mv in ${THRU_MV_ROWS:-2}; do
    MLX_GRAPH_BATCH_MODEL=/opt/models/$m MLX_GRAPH_BATCH_ROWS="${ROWS:-1 2 4 8 16}" MLX_GRAPH_BATCH_MV_ROWS=$mv \
      timeout ${THRU_S:-100} /opt/bin/graph_test --ignored --nocapture --test-threads 1 batched_throughput 2>&1 \
      | grep -v "^running\|^$" | tee -a $OUT/throughput.log
  done
done
serve_bench() {  # NAME PORT COMMAND...
  local name=$1 port=$2; shift 2
  setsid "$@" > $OUT/serve_$name.err 2>&1 &
  local pid=$!
  for _ in $(seq 300); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2> /dev/null && break
    kill -0 $pid 2> /dev/null || break
    sleep 1
  done
  echo "== serve $name" | tee -a $OUT/serve.log
  timeout ${SERVE_S:-100} python3 $C/bench_serve_client.py http://127.0.0.1:$port \
    --clients ${SERVE_CLIENTS:-1,16} --max-tokens ${SERVE_TOKENS:-128} --rounds ${SERVE_ROUNDS:-1} \
    --eos 128001,128008,128009 2>&1 | tee -a $OUT/serve.log
  kill -- -$pid 2> /dev/null; kill $pid 2> /dev/null; wait $pid 2> /dev/null
  grep -m2 -i "decoder" $OUT/serve_$name.err >> $OUT/serve.log; tail -3 $OUT/serve_$name.err >> $OUT/serve.log
  grep "serve profile" $OUT/serve_$name.err >> $OUT/serve.log
}
for m in ${SERVE_MODELS:-llama31-8b-q4}; do
  for d in ${SERVE_SIDES:-graph mlx mlxlm}; do
    case $d in
      # graphtc: the graph decoder with tensor-core tiles from 4 rows (MLX_GRAPH_TENSOR_CORES=4).
      graphtc) MLX_GRAPH_TENSOR_CORES=4 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      mlxlm) serve_bench "mlxlm-$m" 8432 python3 -m mlx_lm server --model /opt/models/$m --port 8432 ;;
      # graph sides with settings (A/B in one call): graphwide = every step on the full tiles
      # (MLX_GRAPH_FIT_ROWS=0, session 31's engine), graphmma = tensor-core tiles from 4 rows,
      # graphffma = tensor-core tiles off, graphnarrow = tensor-core tiles no wider than the
      # FFMA ones (MLX_GRAPH_WIDE_TILES=0: 3 x 6 for 16 rows at 8B, session 33's engine).
      graphwide) MLX_GRAPH_FIT_ROWS=0 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      graphmma) MLX_GRAPH_TENSOR_CORES=4 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      # graphasync: the wide tiles with the cp.async ring (MLX_GRAPH_MMA_ASYNC=1, s36 mmatile).
      graphasync) MLX_GRAPH_MMA_ASYNC=1 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      graphnarrow) MLX_GRAPH_WIDE_TILES=0 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      # graphpair: the wide tiles' items of two rows blocks (MLX_GRAPH_MMA_PAIR=1, s43 mmapair;
      # the default since session 46, as `graph`); graphnopair: without them (the default before).
      graphnopair) MLX_GRAPH_MMA_PAIR=0 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      graphpair) MLX_GRAPH_MMA_PAIR=1 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      # graphlate0/1/2: MLX_GRAPH_MMA_LATE_NORM at that level (s48-s50: the tensor-core tiles'
      # normed products with the 1 / rms at the epilogue; 0 names it off).
      graphlate[012]) MLX_GRAPH_MMA_LATE_NORM=${d#graphlate} serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      graphffma) MLX_GRAPH_TENSOR_CORES=0 serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder graph --log-level info ;;
      *) serve_bench "$d-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch ${MAX_BATCH:-16} --queue-size 256 --decoder $d --log-level info ;;
    esac
  done
done
echo batched-done
