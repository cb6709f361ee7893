#!/bin/bash
# Device call 2 of the product-path bench (after product_setup.sh on the same warm machine):
# first the `cuda` test set of the graph decoder, capped at TEST_S seconds (graph_decode_cuda,
# tests by name: the on-disk kernel cache, then the engine backend with seeded sampling on
# llama3_q4 and llama alone (the quick answer to run 4's seeded mismatch), then every covered
# row teacher-forced against the MLX forward with the engine backend's checks); then
# `mlx benchmark` (the product path: `--decoder auto`, which picks the graph decoder where it
# applies, and `--decoder mlx`) and mlx-lm's own `mlx_lm benchmark` on the same model
# directories, alternating, ROUNDS rounds, with the copy bandwidth; then per model whose
# tokenizer fits (GEN_MODELS) `mlx generate` greedy twice with a fresh kernel cache (the second
# run's kernels come from the on-disk cache; --verbose prints the decoder's build time), sampled
# (--temp/--top-p/--min-p, seeded) on both decoders, and `mlx chat` (two turns, graph and MLX).
# Then, per model of SERVE_MODELS, `mlx serve` and mlx_lm.server under SERVE_CLIENTS streaming
# clients. Logs and JSON under $OUT.
set -x
C=.gpu/c
export PYTHONUNBUFFERED=1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
mkdir -p /opt/bin && for b in mlx graph_test; do xz -dc $C/$b.xz > /opt/bin/$b && chmod +x /opt/bin/$b; done
MLX=/opt/bin/mlx
$MLX --version
if [ -z "$SKIP_TEST" ]; then
  # TESTS: test names to run (default: all of graph_decode_cuda).
  # The mlx-lm-saved fixtures the test reads (not in the sparse checkout).
  if [ -f $C/fixtures.tar.xz ]; then
    mkdir -p mlx-models/tests/models && tar xJf $C/fixtures.tar.xz -C mlx-models/tests/models
  fi
  timeout ${TEST_S:-240} /opt/bin/graph_test --test-threads 1 --nocapture $TESTS 2>&1 | tee $OUT/graph_test.log | tail -30
fi
M=${MODELS:-llama31-8b-q4 llama-135m-bf16}
# The 135M directories carry the Llama 3 tokenizer (ids past their vocabulary): bench only.
GM=${GEN_MODELS:-llama31-8b-q4}
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
python3 - <<'PY' 2>&1 | tee $OUT/copy_bw.log
import mlx.core as mx, time
a = mx.zeros((1 << 29,), dtype=mx.uint16); mx.eval(a)
for _ in range(3):
    b = mx.array(a) + 0; mx.eval(b)
t = time.perf_counter(); n = 10
for _ in range(n):
    b = a + 1; mx.eval(b)
dt = (time.perf_counter() - t) / n
print(f"copy bandwidth (read + write of {a.nbytes / 1e9:.2f} GB): {2 * a.nbytes / dt / 1e9:.0f} GB/s")
PY
for r in $(seq ${ROUNDS:-2}); do
  for m in $M; do
    # BENCH_SIDES: graphcopy is the graph decoder with every weight copied
    # (MLX_GRAPH_COPY_WEIGHTS=1) instead of read in MLX's buffers: an A/B of issue #30's memory.
    for side in ${BENCH_SIDES:-graph mlx mlxlm}; do
      echo "== round $r $m $side" | tee -a $OUT/bench.log
      case $side in
        graph) timeout 150 $MLX benchmark --model /opt/models/$m -p ${P:-512} -g ${G:-128} -n ${N:-3} --json --decoder auto 2>&1 ;;
        # graphold, graphmain: the same with an earlier build's `mlx` (.gpu/c/mlx-old.xz,
        # mlx-main.xz, if the bundle carries them), for an A/B of builds on one machine.
        graphold|graphmain) b=/opt/bin/mlx-${side#graph}
          [ -x $b ] || { xz -dc $C/mlx-${side#graph}.xz > $b && chmod +x $b; }
          timeout 150 $b benchmark --model /opt/models/$m -p ${P:-512} -g ${G:-128} -n ${N:-3} --json --decoder auto 2>&1 ;;
        graphcopy) MLX_GRAPH_COPY_WEIGHTS=1 timeout 150 $MLX benchmark --model /opt/models/$m -p ${P:-512} -g ${G:-128} -n ${N:-3} --json --decoder auto 2>&1 ;;
        mlx) timeout 150 $MLX benchmark --model /opt/models/$m -p ${P:-512} -g ${G:-128} -n ${N:-3} --json --decoder mlx 2>&1 ;;
        mlxlm) timeout 150 python3 -m mlx_lm benchmark --model /opt/models/$m -p ${P:-512} -g ${G:-128} -n ${N:-3} 2>&1 ;;
      esac | tee -a $OUT/bench.log | tail -2
    done
  done
done
# `mlx serve` and mlx_lm.server, one model each (SERVE_MODELS), C streaming clients
# (SERVE_CLIENTS), every request exactly SERVE_TOKENS greedy tokens (the Llama 3 tokenizer's
# EOS ids suppressed), with bench_serve_client.py (carried in .gpu/c).
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
  timeout ${SERVE_S:-150} python3 $C/bench_serve_client.py http://127.0.0.1:$port \
    --clients ${SERVE_CLIENTS:-1,16} --max-tokens ${SERVE_TOKENS:-128} --rounds ${SERVE_ROUNDS:-2} \
    --eos 128001,128008,128009 2>&1 | tee -a $OUT/serve.log
  kill -- -$pid 2> /dev/null; kill $pid 2> /dev/null; wait $pid 2> /dev/null
  tail -3 $OUT/serve_$name.err >> $OUT/serve.log
}
for m in $SERVE_MODELS; do
  serve_bench "mlx-$m" 8431 $MLX serve --model /opt/models/$m --port 8431 --max-batch 32 --queue-size 256 --log-level warn
  serve_bench "mlxlm-$m" 8432 python3 -m mlx_lm server --model /opt/models/$m --port 8432
done
rm -rf $MLXS_GPURT_CACHE
for m in $GM; do
  for run in nvrtc cached; do
    echo "== generate $m greedy ($run kernels)" | tee -a $OUT/notes.log
    $MLX generate --model /opt/models/$m --prompt "The quick brown fox" --max-tokens 16 --verbose true 2>&1 | tail -12 | tee -a $OUT/notes.log
  done
  echo "== generate $m sampled" | tee -a $OUT/notes.log
  # Twice on the graph decoder with the same seed: the same text (run 4's seeded mismatch).
  for k in 1 2; do
    $MLX generate --model /opt/models/$m --prompt "The quick brown fox" --max-tokens 64 --temp 0.8 --top-p 0.95 --min-p 0.02 --seed 1 --verbose true > $OUT/sampled_$m.$k.txt 2> $OUT/sampled_$m.$k.err
  done
  cat $OUT/sampled_$m.1.err $OUT/sampled_$m.1.txt | tail -14 | tee -a $OUT/notes.log
  if diff <(sed -n '/^==========$/,/^==========$/p' $OUT/sampled_$m.1.txt) <(sed -n '/^==========$/,/^==========$/p' $OUT/sampled_$m.2.txt) > /dev/null; then
    echo "seeded graph runs: the same text" | tee -a $OUT/notes.log
  else
    echo "seeded graph runs: DIFFERENT text" | tee -a $OUT/notes.log
  fi
  $MLX generate --model /opt/models/$m --prompt "The quick brown fox" --max-tokens 64 --temp 0.8 --top-p 0.95 --min-p 0.02 --seed 1 --decoder mlx --verbose true 2>&1 | tail -6 | tee -a $OUT/notes.log
  # `mlx chat` on the graph decoder: two turns (the second continues the first's cache), JSON
  # lines with the decoder's name; the 135M directories' tokenizer has ids past their vocabulary.
  case $m in llama-135m-*) continue ;; esac
  for d in auto mlx; do
    echo "== chat $m --decoder $d (two turns)" | tee -a $OUT/notes.log
    printf 'Hello there\nTell me more\n' | timeout 120 $MLX chat --model /opt/models/$m -m 32 --decoder $d --verbose true --json 2>&1 | tail -8 | tee -a $OUT/notes.log
  done
done
ls -la $MLXS_GPURT_CACHE | tee -a $OUT/notes.log
echo product-done
